"""A trainer's use of batches on a GPU, played against the fake CUDA runtime (tests/cuda/fake_cudart.cc).

Run as a script in its own process (the runtime is loaded once per process, from DRAFTFEED_CUDART):

    python fake_cuda_consumer.py DATA MODE [--ahead N] [--epochs E] [--keep K] [--no-set-device]
                                 [--given-memory]

MODE is `pinned` (batches in page-locked host memory: the consumer copies each tensor to device
memory with cudaMemcpyAsync on its stream, as `tensor.to("cuda", non_blocking=True)` does) or
`device` (the device stage: batches arrive in device memory; the consumer uses each tensor on its
stream, here a device-to-device copy into memory of its own). Either way the consumer never
synchronizes: it drops each batch right after queuing its work and runs ahead, as a trainer whose CPU
runs ahead of its GPU does (FAKE_CUDA_CONSUMER_SLOWNESS makes its stream slower than the engine's);
`--keep K` keeps each batch's input_ids for K more batches (a trainer that logs them: it reads them
once more, after the batch was released, when it lets them go). At the end it synchronizes, reads
what "the device" received, and prints one JSON line: for every batch, each tensor's checksum as the device received it, and the fake runtime's record
(contexts per device, violations, peak device memory, the engine's calls to cudaMalloc, cudaFree and
the synchronising calls). With `--given-memory` the device stage's buffers are blocks the consumer
allocated itself (as the Python layer does with torch) and handed to the loader. The expected checksums come from the same
batches read in ordinary memory (pin_memory=False) before the runtime is touched.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import json
import os
import sys
import threading
from typing import Any

import draftfeed

# The torch views of the host batch whose addresses a caller is using (alive until it drops them).
_ALIVE: dict[str, Any] = {}

H2D, D2D = 1, 3


def checksum(address: int, size: int) -> str:
    return hashlib.blake2b(ctypes.string_at(address, size), digest_size=12).hexdigest()


def tensor_memory(batch: Any) -> list:
    """(name, address, bytes) of each tensor: for a host batch from its torch views, as a trainer
    copies them (the views are alive while the caller uses the addresses); for a device batch from
    the engine (a CPU build of torch cannot hold CUDA tensors)."""
    if getattr(batch, "device", -1) >= 0:
        return batch.tensor_memory()
    views = batch.torch()
    _ALIVE["views"] = views  # the caller queues its copies while these views exist
    return [(name, t.data_ptr(), t.numel() * t.element_size()) for name, t in views.items()]


class RawLoader(draftfeed.Loader):
    """Yields the engine's batch objects themselves (their memory, not torch tensors: a CPU build of
    torch cannot hold CUDA tensors)."""

    # Set by main() with --given-memory: makes `count` blocks of `nbytes`, as torch.empty would.
    given_memory: Any = None

    def _make_batch(self, batch):
        return batch

    def _device_memory_blocks(self, nbytes, count, device):
        if RawLoader.given_memory is None:
            return super()._device_memory_blocks(nbytes, count, device)
        return RawLoader.given_memory(nbytes, count, device)


def loader_options(args) -> dict:
    return dict(hidden_size=16, total_seq_len=96, train_ratio=0.75, num_target_layers=3,
                prefetch=args.prefetch, num_threads=2, noise_std=0.05, seed=3)


def expected_batches(args) -> dict:
    """{epoch: {batch index: {tensor: checksum}}} read in pageable memory (no CUDA call)."""
    loader = RawLoader(args.data, pin_memory=False, **loader_options(args))
    out: dict = {}
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        batch: Any
        for batch in loader:
            out.setdefault(epoch, {})[batch.index] = {
                name: checksum(address, size) for name, address, size in tensor_memory(batch)}
    loader.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("mode", choices=["pinned", "device"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=3)
    parser.add_argument("--device-buffers", type=int, default=2)
    parser.add_argument("--keep", type=int, default=0)
    parser.add_argument("--stream", choices=["default", "own"], default="default")
    parser.add_argument("--no-set-device", action="store_true")
    parser.add_argument("--given-memory", action="store_true",
                        help="the device stage's buffers from blocks the consumer allocated")
    parser.add_argument("--consumer-thread", action="store_true",
                        help="consume on a thread that never set a device")
    args = parser.parse_args()

    expected = expected_batches(args)
    cuda = ctypes.CDLL(os.environ["DRAFTFEED_CUDART"])
    cuda.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_void_p]
    cuda.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    cuda.fake_cuda_contexts.restype = ctypes.c_ulonglong
    cuda.fake_cuda_peak_device_bytes.restype = ctypes.c_ulonglong
    cuda.fake_cuda_engine_calls.restype = ctypes.c_ulonglong
    cuda.fake_cuda_engine_calls.argtypes = [ctypes.c_char_p]
    rank_device = int(os.environ.get("LOCAL_RANK", "0"))
    result: dict = {}

    def consume() -> None:
        cuda.fake_cuda_mark_test_thread()  # contexts and the peak count the engine's calls only
        if not args.no_set_device:
            assert cuda.cudaSetDevice(rank_device) == 0  # as the trainer's torch.cuda.set_device

        def on_rank_device(call, *call_args):
            # torch's device guard: work on cuda:N tensors runs with cuda:N current, on its stream.
            if args.no_set_device:
                assert cuda.cudaSetDevice(rank_device) == 0
            result = call(*call_args)
            if args.no_set_device:
                assert cuda.cudaSetDevice(0) == 0
            return result

        stream = ctypes.c_void_p(None)
        if args.stream == "own":
            assert on_rank_device(cuda.cudaStreamCreateWithFlags, ctypes.byref(stream), 1) == 0
            draftfeed.cuda.consumer_stream = lambda device: stream.value or 0
        given: list[tuple[int, int]] = []
        if args.given_memory:
            def make_blocks(nbytes, count, device):
                for _ in range(count):
                    block = ctypes.c_void_p()
                    assert on_rank_device(cuda.cudaMalloc, ctypes.byref(block), nbytes) == 0
                    given.append((int(block.value or 0), nbytes))
                return list(given), None
            RawLoader.given_memory = make_blocks
        options = loader_options(args)
        if args.mode == "device":
            loader = RawLoader(args.data, device="cuda",
                               device_buffers=args.device_buffers, **options)
        else:
            loader = RawLoader(args.data, pin_memory=True, **options)
        received: list[tuple[int, int, str, int, int]] = []  # (epoch, index, name, address, size)
        batch: Any
        kept: list = []
        outside: list = []  # device tensors outside the given blocks
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                on_device = getattr(batch, "device", -1) >= 0
                for name, address, size in tensor_memory(batch):
                    if on_device and given and not any(b <= address < b + n for b, n in given):
                        outside.append((epoch, batch.index, name))
                    target = ctypes.c_void_p()
                    assert on_rank_device(cuda.cudaMalloc, ctypes.byref(target), size) == 0
                    kind = D2D if on_device else H2D
                    assert on_rank_device(cuda.cudaMemcpyAsync, target, address, size, kind, stream) == 0
                    received.append((epoch, batch.index, name, int(target.value or 0), size))
                if args.keep:
                    kept.append((epoch, batch.index, batch if on_device else batch.torch()["input_ids"]))
                    if len(kept) > args.keep:
                        # A trainer that logs what it kept: it reads the kept input_ids once more,
                        # after the batch was released, then lets them go (the slot's own fence).
                        e, index, held = kept.pop(0)
                        if on_device:
                            address, size = next((a, n) for name, a, n in held.tensor_memory()
                                                 if name == "input_ids")
                        else:
                            address, size = held.data_ptr(), held.numel() * held.element_size()
                        target = ctypes.c_void_p()
                        assert on_rank_device(cuda.cudaMalloc, ctypes.byref(target), size) == 0
                        kind = D2D if on_device else H2D
                        assert on_rank_device(cuda.cudaMemcpyAsync, target, address, size, kind, stream) == 0
                        received.append((e, index, "input_ids", int(target.value or 0), size))
                        del held
                _ALIVE.clear()
                del batch  # the consumer runs on; its queued work has not run yet
        metrics = loader.metrics()
        kept.clear()
        loader.close()
        del loader
        gc.collect()  # the loader is in a reference cycle (its reporter): the engine goes now
        # The engine's own calls, before the test's synchronisation below (which is not counted).
        engine_calls = {name: cuda.fake_cuda_engine_calls(name.encode()) for name in (
            "cudaMalloc", "cudaFree", "cudaDeviceSynchronize", "cudaStreamSynchronize",
            "cudaEventSynchronize", "cudaStreamWaitEvent")}
        on_rank_device(cuda.cudaDeviceSynchronize)
        mismatches = []
        for epoch, index, name, address, size in received:
            if checksum(address, size) != expected[epoch][index][name]:
                mismatches.append(f"epoch {epoch} batch {index} {name}")
        violations = ctypes.create_string_buffer(1 << 16)
        count = cuda.fake_cuda_violations(violations, len(violations))
        result.update(
            batches=sum(len(v) for v in expected.values()),
            received=len({(e, i) for e, i, *_ in received}),
            tensors=len(received),
            mismatches=mismatches,
            contexts=[d for d in range(64) if cuda.fake_cuda_contexts() >> d & 1],
            violations=violations.value.decode().splitlines()[:count],
            peak_device_bytes=cuda.fake_cuda_peak_device_bytes(),
            metrics={k: v for k, v in metrics.items() if k != "dropped"},
            engine_calls=engine_calls,
            fence_counts=draftfeed._core.fence_counts(),
            given=len(given),
            outside_given=outside,
        )

    if args.consumer_thread:
        thread = threading.Thread(target=consume)
        thread.start()
        thread.join()
    else:
        consume()
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
