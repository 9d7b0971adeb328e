"""Just enough of vLLM's module surface to import hs-connectors' `MooncakeHiddenStatesConnector`
without vLLM (which needs a GPU build and is not installed for the tests).

The simulated vLLM server (tools/sim_vllm_server.py, mooncake mode) runs the connector's own code on
the producer side: `request_finished` builds the key and the transfer manifest returned in
`kv_transfer_params`, and `_write_sample` extracts the sample from a (CPU) KV cache, refuses
non-finite values, puts it into the Mooncake store and publishes the error marker when that fails.
What the connector imports from vLLM is replaced here by empty base classes and three small
functions; none of them is vLLM's code:

  extract_from_kv_cache(kv, slots, n)   rows `slots[:n]` of kv viewed as [blocks * block_size, ...]:
                                        the KV-cache layout the connector reads ([blocks, block_size,
                                        layers, hidden]), gathered by flat slot index
  get_tensor_model_parallel_rank()      0 (one worker, tensor-parallel rank 0)
  init_logger(name)                     logging.getLogger(name)

If vLLM itself is importable, nothing is replaced and its own modules are used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import types

_PACKAGES = (
    "vllm",
    "vllm.distributed",
    "vllm.distributed.kv_transfer",
    "vllm.distributed.kv_transfer.kv_connector",
    "vllm.distributed.kv_transfer.kv_connector.v1",
    "vllm.v1",
    "vllm.v1.attention",
    "vllm.v1.core",
    "vllm.v1.core.sched",
)


class _Base:
    """Stands for vLLM's connector base classes: the connector only subclasses them."""


def _extract_from_kv_cache(kv_cache, slot_mapping, num_tokens):
    return kv_cache.flatten(0, 1)[slot_mapping[:num_tokens]]


def install() -> bool:
    """Registers the stand-in modules unless vLLM is importable; returns True if it did."""
    if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
        return False
    modules: dict[str, dict] = {name: {} for name in _PACKAGES}
    modules["vllm.config"] = {"VllmConfig": object, "get_layers_from_vllm_config": None}
    modules["vllm.distributed.kv_transfer.kv_connector.v1.base"] = {
        "KVConnectorBase_V1": _Base,
        "KVConnectorMetadata": type("KVConnectorMetadata", (), {}),
        "KVConnectorRole": object,
        "SupportsHMA": type("SupportsHMA", (), {}),
    }
    modules["vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"] = {
        "ExampleHiddenStatesConnector": _Base,
        "extract_from_kv_cache": _extract_from_kv_cache,
    }
    modules["vllm.distributed.parallel_state"] = {"get_tensor_model_parallel_rank": lambda: 0}
    modules["vllm.logger"] = {"init_logger": logging.getLogger}
    modules["vllm.v1.attention.backend"] = {"AttentionMetadata": object}
    modules["vllm.v1.core.sched.output"] = {"SchedulerOutput": object}
    for name, attributes in modules.items():
        module = types.ModuleType(name, "stand-in (tools/vllm_stand_in.py)")
        module.__dict__.update(attributes)
        if name in _PACKAGES:
            module.__path__ = []
        sys.modules[name] = module
    return True


class HostStream:
    """The accelerator stream and device module the connector's `_write_sample` uses, on the host:
    copies are synchronous, so waiting on an event and entering a stream do nothing."""

    def wait_event(self, event) -> None:
        pass

    @staticmethod
    def stream(stream):
        return contextlib.nullcontext()
