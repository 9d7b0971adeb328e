"""The Mooncake side of the simulated vLLM server (tools/sim_vllm_server.py --mooncake-master).

Each generation request is published into a real Mooncake Store by hs-connectors' own producer code,
`MooncakeHiddenStatesConnector` (imported with tools/vllm_stand_in.py when vLLM is absent):

  * `request_finished` (scheduler side) gives the Mooncake key (`sanitize_key` of the request id)
    and the versioned transfer manifest (tensor shapes, dtypes, 64-byte aligned offsets, total
    bytes), which vLLM returns to the client as `kv_transfer_params`;
  * `_write_sample` (worker side) gathers the sample from the KV cache by its block ids, refuses
    non-finite values (`assert_finite`), puts the packed tensors with `put_from`
    (`MooncakeHiddenStatesStore.put_sample`) and, when any of that fails, publishes the
    `<key>:error` marker (`put_error`) so the consumer fails fast instead of waiting.

Only the KV cache is ours: a CPU tensor [blocks, block_size, layers, hidden] per request holding the
sample's hidden states (tools/sim_vllm_server.py's formula) in its blocks, which are handed out in
reverse order so the connector's gather is exercised. Writes run on a pool of `writer_threads`
(the connector's `num_writer_threads`, default 4); the answer is sent after the put (`sync`) or
before it (`async`: vLLM may answer before its connector's put completes, and the consumer polls).

Faults (the producer errors the connector can produce; names as in sim_vllm_server.py):
  nan / inf         a non-finite value in the sample: the connector's assert_finite refuses it and
                    publishes the error marker
  put_fail          the store refuses the put (`put_from` returns "status", default -600, what a
                    full store answers): the connector publishes the error marker
  missing_key       the manifest is answered but nothing is ever put (a worker that died before its
                    put): the consumer waits for the key until its timeout
  corrupt_manifest  the sample is put, but the answered manifest is damaged ("mode": "size"
                    (default: total_aligned_bytes + 64), "offset" (a tensor's offset past the
                    object), "version" (an unknown manifest version) or "dtype" (an unknown dtype))
  corrupt_object    the manifest is right, but the object put is not what it says ("mode":
                    "short" (default: its last 64 bytes missing), "token_ids" (the first token id
                    + 1) or "nan" (a NaN as the first hidden-state value, after the connector's
                    finiteness check: damage in transit or in the store))
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import types
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import vllm_stand_in

FAULTS = ("nan", "inf", "put_fail", "missing_key", "corrupt_manifest", "corrupt_object")
CORRUPTIONS = ("size", "offset", "version", "dtype")
OBJECT_CORRUPTIONS = ("short", "token_ids", "nan")
# A quiet NaN's bits per hidden-state dtype.
_NAN_BITS = {"torch.bfloat16": (0x7FC0, 2), "torch.float16": (0x7E00, 2),
             "torch.float32": (0x7FC00000, 4)}
BLOCK_SIZE = 16

logger = logging.getLogger("sim_mooncake")


class _RefusingClient:
    """The Mooncake client with `put_from` refused (status); everything else goes to the client."""

    def __init__(self, client: Any, status: int):
        self._client = client
        self._status = status

    def put_from(self, key: str, address: int, size: int) -> int:
        return self._status

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _CorruptingClient:
    """The Mooncake client with `put_from` putting damaged bytes (corrupt_object's modes): the
    staging buffer is changed in place before the put, or fewer bytes are put."""

    def __init__(self, client: Any, manifest: dict, mode: str):
        if mode not in OBJECT_CORRUPTIONS:
            raise ValueError(f"unknown corrupt_object mode {mode!r}; known: "
                             f"{', '.join(OBJECT_CORRUPTIONS)}")
        self._client, self._manifest, self._mode = client, manifest, mode

    def put_from(self, key: str, address: int, size: int) -> int:
        import ctypes

        tensors = self._manifest["tensors"]
        if self._mode == "short":
            return self._client.put_from(key, address, size - 64)
        if self._mode == "token_ids":
            where = address + tensors["token_ids"]["offset"]
            value = ctypes.c_int64.from_address(where)
            value.value += 1
        else:
            bits, width = _NAN_BITS[tensors["hidden_states"]["dtype"]]
            ctypes.memmove(address + tensors["hidden_states"]["offset"],
                           bits.to_bytes(width, "little"), width)
        return self._client.put_from(key, address, size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class MooncakeProducer:
    def __init__(self, *, master: str, local_hostname: str, segment_mib: int, buffer_mib: int,
                 layers: int, hidden: int, dtype: str, writer_threads: int = 4):
        import torch

        self.stand_in = vllm_stand_in.install()
        from hs_connectors import mooncake_hidden_states_connector as connector_module
        from hs_connectors.mooncake_store import MooncakeHiddenStatesStore, MooncakeStoreConfig

        self.connector_class = connector_module.MooncakeHiddenStatesConnector
        self.layers, self.hidden = layers, hidden
        self.dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                      "float32": torch.float32}[dtype]
        # The connector's own configuration object (kv_connector_extra_config["mooncake"]).
        config = MooncakeStoreConfig(
            local_hostname=local_hostname, metadata_server="P2PHANDSHAKE",
            master_server_address=master, global_segment_size=segment_mib << 20,
            local_buffer_size=buffer_mib << 20, protocol="tcp", device_name="",
            num_writer_threads=writer_threads)
        self.store = MooncakeHiddenStatesStore(config).setup()
        self.executor = ThreadPoolExecutor(config.num_writer_threads,
                                           thread_name_prefix="vllm-mooncake-hs")
        self.lock = threading.Lock()
        self.counts = {"writes": 0, "writes_failed": 0, "not_written": 0}

    def connector(self) -> Any:
        """A connector object with the state its scheduler and worker methods read (its __init__
        needs a vLLM configuration); one per request, so concurrent writes share nothing but the
        store, as the connector's writer threads do."""
        c = object.__new__(self.connector_class)
        c._request_keys = {}
        c._pending_saves = {}
        c._num_hidden_states, c._hidden_size = self.layers, self.hidden
        c._hidden_state_dtype = self.dtype
        c._block_size = BLOCK_SIZE
        c._store = self.store
        c._copy_stream = vllm_stand_in.HostStream()
        c._device_module = vllm_stand_in.HostStream
        return c

    def finish(self, ids: list[int], kv_transfer_params: dict | None) -> tuple[Any, Any, dict]:
        """`request_finished` for a new request: (connector, its pending save, manifest)."""
        request_id = f"cmpl-{uuid.uuid4().hex}-0"
        blocks = max(1, math.ceil(len(ids) / BLOCK_SIZE))
        request = types.SimpleNamespace(
            request_id=request_id, kv_transfer_params=kv_transfer_params,
            prompt_token_ids=list(ids), all_token_ids=[*ids, 0])
        connector = self.connector()
        _, manifest = self.connector_class.request_finished(
            connector, request, list(reversed(range(blocks))))
        return connector, connector._pending_saves.pop(request_id), manifest

    def write(self, connector: Any, pending: Any, values: Any, fault: Any) -> bool:
        """The connector's `_write_sample` over a KV cache holding `values` [T, L, H] (a tensor or
        an array; blocking)."""
        import torch

        if isinstance(values, np.ndarray):
            values = torch.from_numpy(values)

        blocks = len(pending.block_ids)
        kv = torch.zeros(blocks, BLOCK_SIZE, self.layers, self.hidden, dtype=self.dtype)
        if len(values):
            block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
            positions = torch.arange(len(values))
            slots = block_ids[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
            kv.view(-1, self.layers, self.hidden)[slots] = values.to(self.dtype)
        connector._kv_cache = kv
        if fault is not None and fault.name == "put_fail":
            store = copy.copy(self.store)
            store._store = _RefusingClient(self.store._store, int(fault.params.get("status", -600)))
            connector._store = store
        elif fault is not None and fault.name == "corrupt_object":
            store = copy.copy(self.store)
            store._store = _CorruptingClient(self.store._store, pending.transfer_manifest,
                                             fault.params.get("mode", "short"))
            connector._store = store
        try:
            connector._write_sample(pending, None)
        except Exception as error:  # the connector logged it and published the error marker
            logger.info("write of %s failed: %r", pending.mooncake_key, error)
            with self.lock:
                self.counts["writes_failed"] += 1
            return False
        with self.lock:
            self.counts["writes"] += 1
        return True

    async def produce(self, loop: Any, ids: list[int], values: Any, fault: Any,
                      kv_transfer_params: dict | None, write_async: bool,
                      pending_writes: set) -> dict:
        """Publishes one sample (now, or after answering) and returns the kv_transfer_params."""
        connector, pending, manifest = self.finish(ids, kv_transfer_params)
        name = fault.name if fault is not None else None
        if name == "missing_key":
            with self.lock:
                self.counts["not_written"] += 1
        elif write_async:
            future = loop.run_in_executor(self.executor, self.write, connector, pending, values,
                                          fault)
            pending_writes.add(future)
            future.add_done_callback(pending_writes.discard)
        else:
            await loop.run_in_executor(self.executor, self.write, connector, pending, values, fault)
        if name == "corrupt_manifest":
            manifest = corrupt(manifest, fault.params.get("mode", "size"))
        return manifest

    def stats(self) -> dict:
        with self.lock:
            return dict(self.counts)

    def reset(self) -> None:
        with self.lock:
            for key in self.counts:
                self.counts[key] = 0


def corrupt(manifest: dict, mode: str) -> dict:
    damaged = copy.deepcopy(manifest)
    if mode == "size":
        damaged["metadata"]["total_aligned_bytes"] += 64
    elif mode == "offset":
        damaged["tensors"]["hidden_states"]["offset"] = damaged["metadata"]["total_aligned_bytes"]
    elif mode == "version":
        damaged["version"] = manifest.get("version", 0) + 1
    elif mode == "dtype":
        damaged["tensors"]["hidden_states"]["dtype"] = "torch.float99"
    else:
        raise ValueError(f"unknown corrupt_manifest mode {mode!r}; known: {', '.join(CORRUPTIONS)}")
    return damaged
