#!/usr/bin/env python3
"""A simulated vLLM server for hidden-state generation (tests, demos, benchmarks).

It speaks the part of vLLM's OpenAI API that speculators' online training uses (docs/protocol.md):

  GET  /v1/models             {"object": "list", "data": [{"id": MODEL, ...}]}
  POST /v1/completions        {"model", "prompt": [ids], "max_tokens": 1, "return_token_ids": true}
  POST /v1/chat/completions   {"model", "messages", ...}; the "tokenizer" is one id per character
                              of the turns' text (ord(c)), joined in order
and answers as vLLM with the hidden-states connector does: `choices[0].prompt_token_ids` (top-level
`prompt_token_ids` for chat) echo the prompt, and `kv_transfer_params.hidden_states_path` (or
`.handle` with --handle-key handle) names a safetensors file it wrote into --server-dir with the real
`safetensors` package: `token_ids` int64 [T] and `hidden_states` [T, L, H] (--layers, --hidden,
--dtype).

Hidden states are a pure function of (seed, token id, position, layer, h), so tests recompute every
value (the same mixing as draftfeed's synthetic cache, with the token id in place of the row):

  mix(z)  = splitmix64's finaliser on uint64 (wrapping): z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
            z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
  base    = mix(mix(mix(mix(seed) ^ token_id) ^ position) ^ layer)
  value   = (int64(mix(base ^ h) >> 57) - 64) / 16          (exact in bf16, f16 and f32)

so `draftfeed.synthetic_hidden_value(seed, token_id, position, layer, h)` gives the same number.

Files are written under the lock protocol of vLLM's connector: create `<file>.lock`, hold
fcntl.flock(LOCK_EX) on it while writing, release; the lock file is left for the reader to remove
(--remove-lock removes it after writing). With --write async (or the lock_hold fault) the response
is sent first and the file is written afterwards while the lock is held, as a slow connector would.

Fault injection, from --faults JSON or at run time through `POST /admin/faults` (the body replaces
the fault set and resets its counters): a map from fault name to {"prob": p, "first": k, ...}: the
fault hits the first k generation requests that reach it, then each later one with probability p.
With "match": [token id, ...] it hits instead the requests whose prompt starts with one of those ids
(each such prompt on its first "times" requests, or always): the same rows in every run, whatever
the order of requests.
Faults are tried in the order below; a request gets at most one.
  drop          close the connection mid-answer: the status line, headers promising 1000 bytes
                and one byte; "mode": "reset" closes it without a byte instead (libcurl silently
                resends a request whose reused connection died before any byte came back, so
                "reset" is only counted exactly by clients that do not reuse connections)
  stall         wait "seconds" (default 60) before answering 503: past any client timeout; a
                client that hangs up first (its timeout, a cancel) ends it, as a real server would
  http_500      answer HTTP 500          http_503   answer HTTP 503
  malformed     answer truncated JSON
  oversize      answer a valid response padded past 2 MiB ("bytes" to choose the size)
  wrong_ids     echo prompt ids with the first id changed
  no_handle     kv_transfer_params without a path or handle
  outside       a valid file outside --server-dir: "mode" dotdot (DIR/../DIR.outside/f, default),
                symlink (a link in DIR to DIR.outside/f) or absolute (DIR.outside/f)
  missing_file  a handle to a file that is never written
  fixed_handle  a handle naming "path" as it is, writing nothing: a file the request did not produce
                (another sample, the cache's own file, a link: whatever the test put there)
  nan / inf     a file with NaN / +Inf at [position 0, "layer" (default 0), h 0]
  lock_hold     answer at once, hold the file's lock "seconds" (default 30), then write it
  trickle       a valid answer (file written) sent byte by byte, status line and headers included,
                one byte every "interval" seconds (default 0.05): a server that answers slowly
  huge          a 200 answer whose chunked body never ends ('{"padding": "xxxx...'): "bytes" (default
                1 GiB) are offered, stopping as soon as the client hangs up
  no_close      a valid answer (file written) whose body is delimited by the end of the connection
                (no Content-Length, not chunked), and then the connection is held open "seconds"
                (default 3600): a server that never closes the connection
In mooncake mode (below) the file faults (outside, missing_file, fixed_handle, lock_hold) are refused
and these producer errors are added (tools/sim_mooncake.py describes them): put_fail, missing_key,
corrupt_manifest, corrupt_object; nan and inf go through the connector's own non-finite check.
The service time, slept before each generation answer, follows one of two models:
  "latency" ({"median": s, "p99": s}): lognormal with that median and 99th percentile (constant
      when p99 <= median). With "keyed": true the draw is a function of (seed, prompt ids), so a
      prompt takes the same time in every run and every epoch (benchmarks compare runs on equal
      work); whether a request is slow has nothing to do with its length.
  "prefill" ({"base": s, "per_token": s, "tail_p99": x}): as a vLLM server's prefill, the time grows
      with the prompt: (base + per_token x tokens) x tail, the tail lognormal with median 1 and
      99th percentile tail_p99 (1: no tail). The tail is drawn from (seed, prompt ids, n), n the
      number of earlier requests for the same prompt since the last reset: the same in every run,
      but a new draw each time a prompt comes back (a slow request is not a property of the
      prompt, only its length is).

`GET /admin/stats`: requests (HTTP requests of any kind), completions, chat, models, connections
(TCP connections accepted), huge_bytes (bytes of `huge` bodies sent), in_flight, max_in_flight (generation requests being served at once),
injected (per fault), ok (generation answers with a file), files_written, service_seconds (latency
slept in total), max_service_seconds (the longest one), timeline (the first 100000 generation
requests: prompt (crc32 of the int64 ids, seeded), tokens, occurrence (earlier requests for the same prompt since the reset), start
(time.monotonic(), the machine's CLOCK_MONOTONIC), service seconds (drawn), served seconds (until the
answer, or until the client hung up: then abandoned is true; the request's rest is not slept, as vLLM
aborts a request whose connection closed)), abandoned (requests whose client hung up during the service time), handles (every handle answered, in order),
chat_requests (the first 1000 chat requests: messages, add_generation_prompt, continue_final_message), pending_writes (files still to be
written after their answer). `POST /admin/reset` zeroes them.

Mooncake mode (--mooncake-master HOST:PORT): instead of files, each sample is put into a real Mooncake
Store (a running `mooncake_master`) by hs-connectors' own `MooncakeHiddenStatesConnector` code, and
`kv_transfer_params` is the connector's transfer manifest ({"handle": key, "version", "tensors",
"metadata"}), as vLLM with that connector answers (tools/sim_mooncake.py). The store's client
listens on every interface: run it inside a private network namespace (tools/mooncake_master_process.py).
`/admin/stats` then also has "mooncake": {"writes", "writes_failed", "not_written"}.

Listens on 127.0.0.1 only, unless --host names another of this machine's addresses (a test's own
network namespace: tests/python/two_hosts.py). --port 0 picks a free port; the port is printed
("listening on http://HOST:PORT/v1") and written to --port-file if given.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import math
import os
import random
import signal
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

FAULT_ORDER = [
    "drop",
    "stall",
    "http_500",
    "http_503",
    "malformed",
    "oversize",
    "wrong_ids",
    "no_handle",
    "outside",
    "missing_file",
    "fixed_handle",
    "nan",
    "inf",
    "lock_hold",
    "trickle",
    "huge",
    "no_close",
    "put_fail",
    "missing_key",
    "corrupt_manifest",
    "corrupt_object",
]
FILE_FAULTS = ("outside", "missing_file", "fixed_handle", "lock_hold")
MOONCAKE_FAULTS = ("put_fail", "missing_key", "corrupt_manifest", "corrupt_object")
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> np.uint64(30))
    z = z * _M1
    z = z ^ (z >> np.uint64(27))
    z = z * _M2
    return z ^ (z >> np.uint64(31))


def hidden_states_for(ids: list[int] | np.ndarray, layers: int, hidden: int, seed: int) -> np.ndarray:
    """[T, layers, hidden] float32: the documented formula (see the module docstring)."""
    with np.errstate(over="ignore"):
        tok = np.asarray(ids, dtype=np.int64).astype(np.uint64)
        pos = np.arange(tok.shape[0], dtype=np.uint64)
        first = _mix(np.array([seed], dtype=np.uint64))
        per_token = _mix(_mix(first ^ tok) ^ pos)  # [T]
        base = _mix(per_token[:, None] ^ np.arange(layers, dtype=np.uint64)[None, :])  # [T, L]
        bits = _mix(base[:, :, None] ^ np.arange(hidden, dtype=np.uint64)[None, None, :])
        return ((bits >> np.uint64(57)).astype(np.int64) - 64).astype(np.float32) / np.float32(16)


class Fault:
    def __init__(self, name: str, spec: dict[str, Any]):
        if name not in FAULT_ORDER:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULT_ORDER)}")
        self.name = name
        self.prob = float(spec.get("prob", 0.0))
        self.first = int(spec.get("first", 0))
        self.params = spec
        self.seen = 0
        self.match = {int(i) for i in spec["match"]} if "match" in spec else None
        self.times = int(spec["times"]) if "times" in spec else None
        self.hits_by_prompt: dict[bytes, int] = {}

    def hits(self, rng: random.Random, ids: list[int]) -> bool:
        if self.match is not None:
            # Keyed by the prompt, whatever the order of requests: the same rows fail in every run.
            if not ids or ids[0] not in self.match:
                return False
            key = np.asarray(ids, dtype=np.int64).tobytes()
            done = self.hits_by_prompt.get(key, 0)
            if self.times is not None and done >= self.times:
                return False
            self.hits_by_prompt[key] = done + 1
            return True
        self.seen += 1
        if self.seen <= self.first:
            return True
        return self.prob > 0 and rng.random() < self.prob


class ServiceModel:
    """The service time of a generation request: "latency" (lognormal, optionally keyed by the
    prompt) or "prefill" (grows with the prompt's tokens, times a lognormal tail drawn anew at each
    repeat of a prompt); see the module docstring. No key: no wait."""

    KEYS = ("latency", "prefill")

    def __init__(self, spec: dict[str, Any], seed: int):
        if len(spec) > 1:
            raise ValueError("give one service model: 'latency' or 'prefill', not both")
        self.spec = spec
        self.seed = seed
        self.kind = next(iter(spec), None)
        params = spec.get(self.kind, {}) if self.kind else {}
        if not isinstance(params, dict):
            raise ValueError(f"{self.kind} must be an object, got {params!r}")
        if self.kind == "latency":
            self.median = float(params.get("median", 0.0))
            self.p99 = float(params.get("p99", self.median))
            self.keyed = bool(params.get("keyed", False))
        elif self.kind == "prefill":
            self.base = float(params.get("base", 0.0))
            self.per_token = float(params.get("per_token", 0.0))
            self.tail_p99 = float(params.get("tail_p99", 1.0))
            if self.base < 0 or self.per_token < 0 or self.tail_p99 < 1:
                raise ValueError("prefill needs base >= 0, per_token >= 0 and tail_p99 >= 1")
        self.seen: dict[int, int] = {}  # prompt key -> requests so far

    def forget_prompts(self) -> None:
        self.seen = {}

    @staticmethod
    def _lognormal(rng: random.Random, median: float, p99: float) -> float:
        if p99 <= median:
            return median
        sigma = math.log(p99 / median) / 2.3263478740408408
        return median * math.exp(sigma * rng.gauss(0.0, 1.0))

    def prompt_key(self, ids: list[int]) -> int:
        return zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes(), self.seed)

    def draw(self, ids: list[int], rng: random.Random) -> tuple[float, int]:
        """(seconds, how many earlier requests had this prompt)."""
        key = self.prompt_key(ids)
        occurrence = self.seen.get(key, 0)
        self.seen[key] = occurrence + 1
        if self.kind == "latency" and self.median > 0:
            keyed = random.Random(key) if self.keyed else rng
            return self._lognormal(keyed, self.median, self.p99), occurrence
        if self.kind == "prefill":
            tail = self._lognormal(random.Random(key * 1_000_003 + occurrence), 1.0, self.tail_p99)
            return (self.base + self.per_token * len(ids)) * tail, occurrence
        return 0.0, occurrence


class SimServer:
    def __init__(self, args: argparse.Namespace):
        self.server_dir = Path(args.server_dir).resolve()
        self.server_dir.mkdir(parents=True, exist_ok=True)
        self.outside_dir = self.server_dir.parent / (self.server_dir.name + ".outside")
        self.model = args.model
        self.layers = args.layers
        self.hidden = args.hidden
        self.dtype = args.dtype
        self.seed = args.seed
        self.handle_key = args.handle_key
        self.write_async = args.write == "async"
        self.remove_lock = args.remove_lock
        self.rng = random.Random(args.seed)
        self.counter = 0
        self.producer = None
        if args.mooncake_master:
            from sim_mooncake import MooncakeProducer

            self.producer = MooncakeProducer(
                master=args.mooncake_master, local_hostname=args.mooncake_local_hostname,
                segment_mib=args.mooncake_segment_mib, buffer_mib=args.mooncake_buffer_mib,
                layers=self.layers, hidden=self.hidden, dtype=self.dtype,
                writer_threads=args.mooncake_writer_threads)
        self.faults: dict[str, Fault] = {}
        self.service = ServiceModel({}, args.seed)
        self.set_faults(json.loads(args.faults) if args.faults else {})
        if args.latency_median is not None:
            self.service = ServiceModel({"latency": {
                "median": args.latency_median, "p99": args.latency_p99 or args.latency_median,
                "keyed": args.latency_keyed}}, args.seed)
        self.reset_stats()
        self.pending_writes: set[asyncio.Future] = set()
        self.write_lock = threading.Lock()
        self.memo: dict[bytes, Any] = {}
        self.memo_bytes = 0
        self.memo_limit = args.memo_mib << 20

    # -- configuration and statistics --
    def set_faults(self, spec: dict[str, Any]) -> None:
        faults = {}
        service = ServiceModel({k: v for k, v in spec.items() if k in ServiceModel.KEYS}, self.seed)
        for name, value in spec.items():
            if name in ServiceModel.KEYS:
                continue
            if name in (FILE_FAULTS if self.producer is not None else MOONCAKE_FAULTS):
                mode = "mooncake" if self.producer is not None else "file"
                raise ValueError(f"fault {name!r} does not apply in {mode} mode")
            faults[name] = Fault(name, value)
        self.faults = faults
        self.service = service

    def reset_stats(self) -> None:
        self.service.forget_prompts()
        self.stats: dict[str, Any] = {
            "requests": 0,
            "completions": 0,
            "chat": 0,
            "models": 0,
            "connections": 0,
            "huge_bytes": 0,
            "in_flight": 0,
            "max_in_flight": 0,
            "injected": {name: 0 for name in FAULT_ORDER},
            "ok": 0,
            "files_written": 0,
            "service_seconds": 0.0,
            "max_service_seconds": 0.0,
            "timeline": [],
            "abandoned": 0,
            "handles": [],
            "chat_requests": [],
        }
        if self.producer is not None:
            self.producer.reset()

    def pick_fault(self, ids: list[int]) -> Fault | None:
        for name in FAULT_ORDER:
            fault = self.faults.get(name)
            if fault is not None and fault.hits(self.rng, ids):
                self.stats["injected"][name] += 1
                return fault
        return None

    # -- files --
    def new_name(self) -> str:
        self.counter += 1
        return f"req_{os.getpid()}_{self.counter}.safetensors"

    def values(self, ids: list[int], fault: Fault | None) -> np.ndarray:
        """[T, L, H] float32: the formula's values, with the nan / inf fault applied."""
        values = hidden_states_for(ids, self.layers, self.hidden, self.seed)
        if fault is not None and fault.name in ("nan", "inf") and len(ids) > 0:
            layer = int(fault.params.get("layer", 0))
            values[0, layer, 0] = np.nan if fault.name == "nan" else np.inf
        return values

    def hidden_tensor(self, ids: list[int], fault: Fault | None) -> Any:
        """The sample's hidden states as a tensor of --dtype, kept (--memo-mib) for the next request
        with the same prompt: the formula costs far more than the rest of a request."""
        import torch

        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
            self.dtype
        ]
        key = None
        if self.memo_limit and (fault is None or fault.name not in ("nan", "inf")):
            key = np.asarray(ids, dtype=np.int64).tobytes()
            with self.write_lock:
                found = self.memo.get(key)
            if found is not None:
                return found
        tensor = torch.from_numpy(self.values(ids, fault)).to(dtype)
        if key is not None:
            size = tensor.numel() * tensor.element_size()
            with self.write_lock:
                if self.memo_bytes + size <= self.memo_limit and key not in self.memo:
                    self.memo[key] = tensor
                    self.memo_bytes += size
        return tensor

    def tensors(self, ids: list[int], fault: Fault | None) -> dict[str, Any]:
        import torch

        values = self.values(ids, fault)
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
            self.dtype
        ]
        return {
            "token_ids": torch.tensor(ids, dtype=torch.int64),
            "hidden_states": torch.from_numpy(values).to(dtype),
        }

    def write_locked(self, path: Path, ids: list[int], fault: Fault | None, hold: float,
                     lock_fd: int | None = None) -> None:
        """Writes `path` under the lock protocol (blocking; run in a thread)."""
        from safetensors.torch import save_file

        lock_path = str(path) + ".lock"
        if lock_fd is None:
            lock_fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            if hold > 0:
                threading.Event().wait(hold)
            save_file(self.tensors(ids, fault), str(path))
            with self.write_lock:
                self.stats["files_written"] += 1
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)
            if self.remove_lock:
                try:
                    os.remove(lock_path)
                except FileNotFoundError:
                    pass

    async def produce_file(self, ids: list[int], fault: Fault | None) -> str:
        """Writes the hidden-state file (now, or after answering) and returns the handle."""
        loop = asyncio.get_running_loop()
        name = self.new_name()
        if fault is not None and fault.name == "missing_file":
            return str(self.server_dir / ("missing_" + name))
        if fault is not None and fault.name == "fixed_handle":
            return str(fault.params["path"])
        if fault is not None and fault.name == "outside":
            self.outside_dir.mkdir(parents=True, exist_ok=True)
            target = self.outside_dir / name
            await loop.run_in_executor(None, self.write_locked, target, ids, None, 0.0)
            mode = fault.params.get("mode", "dotdot")
            if mode == "symlink":
                link = self.server_dir / ("link_" + name)
                os.symlink(target, link)
                return str(link)
            if mode == "absolute":
                return str(target)
            return str(self.server_dir / ".." / self.outside_dir.name / name)
        path = self.server_dir / name
        hold = float(fault.params.get("seconds", 30.0)) if fault and fault.name == "lock_hold" else 0
        if hold > 0 or self.write_async:
            # Take the lock before answering, so a reader that comes at once waits for the file.
            lock_fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            future = loop.run_in_executor(None, self.write_locked, path, ids, fault, hold, lock_fd)
            self.pending_writes.add(future)
            future.add_done_callback(self.pending_writes.discard)
        else:
            await loop.run_in_executor(None, self.write_locked, path, ids, fault, 0.0)
        return str(path)

    # -- HTTP --
    def count_request(self) -> None:
        self.stats["requests"] += 1

    async def models(self, request: web.Request) -> web.Response:
        self.count_request()
        self.stats["models"] += 1
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "sim"}]}
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.count_request()
        self.stats["completions"] += 1
        return await self.generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.count_request()
        self.stats["chat"] += 1
        return await self.generate(request, chat=True)

    def bad_request(self, message: str, status: int = 400) -> web.Response:
        return web.json_response(
            {"object": "error", "message": message, "type": "BadRequestError", "code": status},
            status=status,
        )

    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self.stats["in_flight"] += 1
        self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.stats["in_flight"])
        try:
            return await self.generate_inner(request, chat)
        finally:
            self.stats["in_flight"] -= 1

    async def generate_inner(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self.bad_request("the body is not JSON")
        if not isinstance(body, dict):
            return self.bad_request("the body is not a JSON object")
        if body.get("model") != self.model:
            return self.bad_request(f"The model `{body.get('model')}` does not exist.", 404)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return self.bad_request("messages must be a list")
            ids = [ord(c) for turn in messages for c in _turn_text(turn)]
            # What a chat request carried, for tests comparing clients (bounded).
            if len(self.stats["chat_requests"]) < 1000:
                self.stats["chat_requests"].append(
                    {k: body.get(k) for k in ("messages", "add_generation_prompt",
                                              "continue_final_message")})
        else:
            ids = body.get("prompt")
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                return self.bad_request("prompt must be a list of token ids")
        if body.get("max_tokens") != 1 or body.get("return_token_ids") is not True:
            return self.bad_request("expected max_tokens=1 and return_token_ids=true")

        fault = self.pick_fault(ids)
        latency, occurrence = self.service.draw(ids, self.rng)
        entry = {"prompt": self.service.prompt_key(ids), "tokens": len(ids),
                 "occurrence": occurrence, "start": time.monotonic(), "service": latency,
                 "served": latency, "abandoned": False}
        if len(self.stats["timeline"]) < 100_000:
            self.stats["timeline"].append(entry)
        self.stats["service_seconds"] += latency
        self.stats["max_service_seconds"] = max(self.stats["max_service_seconds"], latency)
        if latency > 0 and not await self.wait_unless_hung_up(request, latency):
            # As vLLM aborts a request whose client went away (a hedged request that lost, a
            # timeout): the rest of its service time is not spent.
            entry["served"] = time.monotonic() - entry["start"]
            entry["abandoned"] = True
            self.stats["abandoned"] += 1
            raise asyncio.CancelledError()
        name = fault.name if fault is not None else None
        if name == "drop":
            transport = request.transport
            assert transport is not None
            if fault.params.get("mode", "partial") != "reset":
                transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 1000\r\n\r\n{")
            transport.abort() if fault.params.get("mode") == "reset" else transport.close()
            raise asyncio.CancelledError()
        if name == "stall":
            # A client that gives up (its timeout, a cancel) ends the stall, as a real server aborts
            # a request whose connection closed: a stalled handler must not outlive its client and
            # hold the next test's "in_flight" for "seconds".
            if not await self.wait_unless_hung_up(request, float(fault.params.get("seconds", 60.0))):
                raise asyncio.CancelledError()  # nobody to answer
            return self.bad_request("stalled", 503)
        if name in ("http_500", "http_503"):
            return self.bad_request(f"injected {name}", int(name[-3:]))
        if name == "malformed":
            return web.Response(text='{"id": "cmpl-x", "choices": [{"prompt_token_ids": [1, 2',
                                content_type="application/json")
        if name == "oversize":
            padding = "x" * int(fault.params.get("bytes", 2 << 20))
            return web.json_response({"padding": padding, "choices": [{"prompt_token_ids": ids}]})
        if name == "huge":
            return await self.send_huge(request, int(fault.params.get("bytes", 1 << 30)))
        echoed = list(ids)
        if name == "wrong_ids" and echoed:
            echoed[0] += 1
        params: dict[str, Any] = {}
        if name != "no_handle" and self.producer is not None:
            loop = asyncio.get_running_loop()
            values = await loop.run_in_executor(None, self.hidden_tensor, ids, fault)
            params = await self.producer.produce(
                loop, ids, values, fault, body.get("kv_transfer_params"), self.write_async,
                self.pending_writes)
            self.stats["handles"].append(params["handle"])
        elif name != "no_handle":
            handle = await self.produce_file(ids, fault)
            params[self.handle_key] = handle
            self.stats["handles"].append(handle)
        self.stats["ok"] += 1
        choice = {"index": 0, "text": " ", "logprobs": None, "finish_reason": "length",
                  "token_ids": [0]}
        response: dict[str, Any] = {
            "id": f"cmpl-{self.counter}",
            "model": self.model,
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1,
                      "total_tokens": len(ids) + 1},
            "kv_transfer_params": params,
        }
        if chat:
            response["object"] = "chat.completion"
            response["prompt_token_ids"] = echoed
            response["choices"] = [{"index": 0, "message": {"role": "assistant", "content": " "},
                                    "finish_reason": "length", "token_ids": [0]}]
        else:
            response["object"] = "text_completion"
            choice["prompt_token_ids"] = echoed
            response["choices"] = [choice]
        if name == "trickle":
            await self.send_trickle(request, json.dumps(response).encode(),
                                    float(fault.params.get("interval", 0.05)))
        if name == "no_close":
            await self.send_without_close(request, json.dumps(response).encode(),
                                          float(fault.params.get("seconds", 3600.0)))
        return web.json_response(response)

    # -- answers that misbehave on the wire (the handler never returns a response for these) --
    @staticmethod
    async def send_trickle(request: web.Request, body: bytes, interval: float) -> None:
        transport = request.transport
        assert transport is not None
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        for i, byte in enumerate(head + body):
            if transport.is_closing():
                break
            transport.write(bytes([byte]))
            if i + 1 < len(head) + len(body):
                await asyncio.sleep(interval)
        # The answer was written by hand: end the exchange without aiohttp answering again.
        transport.close()
        raise asyncio.CancelledError()

    @staticmethod
    async def send_without_close(request: web.Request, body: bytes, seconds: float) -> None:
        transport = request.transport
        assert transport is not None
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\n\r\n" + body)
        await SimServer.wait_unless_hung_up(request, seconds)
        transport.close()
        raise asyncio.CancelledError()

    @staticmethod
    async def wait_unless_hung_up(request: web.Request, seconds: float) -> bool:
        """Waits `seconds`; False as soon as the client has closed the connection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                return False
            await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))
        return True

    async def send_huge(self, request: web.Request, total: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b"x" * (64 << 10)
        try:
            await response.write(b'{"padding": "')
            sent = 0
            while sent < total:
                await response.write(chunk)
                sent += len(chunk)
                self.stats["huge_bytes"] += len(chunk)
            await response.write(b'"}')
            await response.write_eof()
        except (ConnectionResetError, ConnectionError, RuntimeError):
            pass  # the client hung up, as it should long before the end
        return response

    async def get_faults(self, request: web.Request) -> web.Response:
        out: dict[str, Any] = {name: f.params for name, f in self.faults.items()}
        out.update(self.service.spec)
        return web.json_response(out)

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            self.set_faults(await request.json())
        except (ValueError, AttributeError, TypeError) as error:
            return self.bad_request(str(error))
        return await self.get_faults(request)

    async def get_stats(self, request: web.Request) -> web.Response:
        self.stats["pending_writes"] = len(self.pending_writes)
        if self.producer is not None:
            self.stats["mooncake"] = self.producer.stats()
        return web.json_response(self.stats)

    async def post_reset(self, request: web.Request) -> web.Response:
        connections, in_flight = self.stats["connections"], self.stats["in_flight"]
        self.reset_stats()
        self.stats["in_flight"] = in_flight
        self.stats["connections"] = 0 if request.query.get("connections") else connections
        return web.json_response(self.stats)


def _turn_text(turn: Any) -> str:
    if not isinstance(turn, dict):
        return ""
    content = turn.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Parts of other kinds carry "text": null when read from an Arrow struct column.
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return ""


def make_app(sim: SimServer) -> web.Application:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_get("/admin/faults", sim.get_faults)
    app.router.add_post("/admin/faults", sim.post_faults)
    app.router.add_get("/admin/stats", sim.get_stats)
    app.router.add_post("/admin/reset", sim.post_reset)
    return app


async def serve(args: argparse.Namespace) -> None:
    # What writing a file needs is imported before the port is announced: importing torch takes
    # seconds on a busy machine, and inside the first request it would hold every request on this
    # server past a client's timeout (retried requests, endpoints rested: tests that fail under load).
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401

    sim = SimServer(args)
    runner = web.AppRunner(make_app(sim), handle_signals=False, access_log=None)
    await runner.setup()
    loop = asyncio.get_running_loop()
    handler_factory = runner.server
    assert handler_factory is not None

    def protocol():  # one per TCP connection accepted
        sim.stats["connections"] += 1
        return handler_factory()

    server = await loop.create_server(protocol, args.host, args.port, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    print(f"listening on http://{args.host}:{port}/v1", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    # Stalled handlers would hold a graceful shutdown for a minute: give them a moment only.
    try:
        await asyncio.wait_for(runner.cleanup(), timeout=2.0)
    except asyncio.TimeoutError:
        pass


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server-dir", required=True, help="folder the hidden-state files go to")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (another than the loopback only inside a test's"
                   " own network namespace)")
    p.add_argument("--port", type=int, default=0, help="0: pick a free port")
    p.add_argument("--port-file", help="write the port here once listening")
    p.add_argument("--model", default="sim/verifier-model")
    p.add_argument("--layers", type=int, default=4, help="L: captured layers")
    p.add_argument("--hidden", type=int, default=64, help="H: hidden size")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seed", type=int, default=0, help="of the hidden-state formula and faults")
    p.add_argument("--handle-key", default="hidden_states_path",
                   choices=["hidden_states_path", "handle"])
    p.add_argument("--write", default="sync", choices=["sync", "async"],
                   help="write the file (mooncake mode: put the sample) before answering, or after"
                   " (a file under its lock)")
    p.add_argument("--remove-lock", action="store_true",
                   help="remove the lock file after writing (default: leave it to the reader)")
    p.add_argument("--latency-median", type=float, help="median service time, seconds")
    p.add_argument("--latency-p99", type=float, help="99th percentile service time, seconds")
    p.add_argument("--latency-keyed", action="store_true",
                   help="draw each prompt's latency from (seed, prompt ids): equal across runs")
    p.add_argument("--faults", help='JSON, e.g. \'{"http_503": {"first": 2}, "nan": {"prob": 0.1}}\'')
    p.add_argument("--memo-mib", type=int, default=0,
                   help="mooncake mode: keep up to this many MiB of generated hidden states to answer"
                   " the same prompt again without recomputing them (benchmarks)")
    p.add_argument("--mooncake-master", metavar="HOST:PORT",
                   help="mooncake mode: put each sample into this master's store (see above)")
    p.add_argument("--mooncake-local-hostname", default="127.0.0.1",
                   help="the address the store client announces to the master and its peers")
    p.add_argument("--mooncake-segment-mib", type=int, default=256,
                   help="memory this client mounts into the store (global_segment_size), MiB")
    p.add_argument("--mooncake-buffer-mib", type=int, default=64,
                   help="the client's local buffer (local_buffer_size), MiB")
    p.add_argument("--mooncake-writer-threads", type=int, default=4,
                   help="the connector's num_writer_threads")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.port_file and os.path.exists(args.port_file):
        os.remove(args.port_file)
    asyncio.run(serve(args))
    if args.mooncake_master:
        # The store client's destructor unmounts its segment from the master, retrying for many
        # seconds if the master is gone: nothing is left to save, so leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
