"""The device stage's copy on a real GPU (scripts/gpu_check.sh; needs torch's CUDA build and a GPU).

    python bench/bench_device_copy.py --hidden 4096 [--seq-len 2048] [--rows 24] [--json]

For one hidden size, on batches of --seq-len tokens (3 target layers and the last, bf16):
  bound        a plain cudaMemcpyAsync of the same bytes from page-locked memory (torch's
               `copy_(non_blocking=True)` of a pinned tensor on a stream of its own), GB/s;
  stage        the device stage's delivery with a consumer that does nothing else: batch bytes over
               the time between batches in hand (this includes assembling them on the host: when
               that is the slower side, the figure is the assembly's), GB/s;
  hidden share the share of the copy's time hidden under compute: a consumer whose kernels on each
               batch take about the copy's time (matmuls, the first reading a byte of the batch, so
               its stream waits for the copy) runs N steps with the stage, against the same kernels
               with no data; hidden = 1 - (extra time per step) / (the copy's time at the bound),
               clamped to [0, 1]. The same for host batches copied by the consumer on its own stream
               (`.to(device, non_blocking=True)`, the reference's way: the copy and compute serialise);
  data wait    the consumer's median time in next() (CPU, unsynchronised) in those runs.
The GPU is synchronised only around the timed runs, never per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from reference_fixtures import write_fixture

import draftfeed


def bound_gbps(nbytes: int, device: torch.device, repeats: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)  # warm
        start.record(stream)
        for _ in range(repeats):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    return nbytes * repeats / (start.elapsed_time(end) / 1000) / 1e9


def compute_step(busy: torch.Tensor, steps: int) -> torch.Tensor:
    for _ in range(steps):
        busy = busy @ busy
        busy = busy / busy.norm()
    return busy


def calibrate(device: torch.device, target_ms: float) -> tuple[torch.Tensor, int]:
    busy = torch.randn(2048, 2048, device=device)
    compute_step(busy, 4)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    compute_step(busy, 40)
    torch.cuda.synchronize(device)
    per = (time.perf_counter() - start) / 40 * 1000
    return busy, max(1, round(target_ms / per))


def run(loader, device, busy, matmuls, on_host: bool, steps: int | None) -> dict:
    """Steps of compute on each batch; returns seconds per step (synchronised at the ends only)."""
    waits, count = [], 0
    iterator = iter(loader)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    while steps is None or count < steps:
        t = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t)
        if batch is not None:
            if on_host:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            seed = batch["hidden_states"].reshape(-1)[:1].float().sum()  # waits for the batch
            busy = compute_step(busy + 0 * seed, matmuls) if matmuls else busy + 0 * seed
        del batch
        count += 1
    torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    return {"steps": count, "s_per_step": elapsed / max(1, count),
            "median_wait_ms": 1000 * statistics.median(waits[2:] or waits or [0])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--rows", type=int, default=24)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    with tempfile.TemporaryDirectory(prefix="bench_device_copy_") as tmp:
        # Rows of about a batch each (lengths up to seq_len).
        data = write_fixture(os.path.join(tmp, "data"), rows=args.rows, hidden_size=args.hidden,
                             max_len=args.seq_len).path
        options = dict(hidden_size=args.hidden, total_seq_len=args.seq_len, train_ratio=0.99,
                       num_target_layers=3, prefetch=3, num_threads=4, seed=1)
        stage = draftfeed.Loader(data, device=device, **options)
        nbytes = stage.metrics()["batch_bytes_each"]
        bound = bound_gbps(nbytes, device)
        copy_ms = nbytes / (bound * 1e9) * 1000
        busy, matmuls = calibrate(device, copy_ms)
        run(stage, device, busy, 0, False, None)  # warm: the cache's pages, the stage's buffers
        alone = run(stage, device, busy, 0, False, None)
        stage_gbps = nbytes / alone["s_per_step"] / 1e9
        compute = {"s_per_step": 0.0}
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(alone["steps"]):
            busy = compute_step(busy, matmuls)
        torch.cuda.synchronize(device)
        compute["s_per_step"] = (time.perf_counter() - start) / max(1, alone["steps"])
        with_stage = run(stage, device, busy, matmuls, False, None)
        host = draftfeed.Loader(data, pin_memory=True, **options)
        run(host, device, busy, matmuls, True, None)
        with_host = run(host, device, busy, matmuls, True, None)

        def hidden(r: dict) -> float:
            extra = max(0.0, r["s_per_step"] - compute["s_per_step"]) * 1000
            return max(0.0, min(1.0, 1 - extra / copy_ms))

        out = {"hidden": args.hidden, "seq_len": args.seq_len, "batch_mb": nbytes / 1e6,
               "bound_gbps": round(bound, 2), "stage_gbps": round(stage_gbps, 2),
               "copy_ms_at_bound": round(copy_ms, 3),
               "compute_ms": round(compute["s_per_step"] * 1000, 3),
               "stage_step_ms": round(with_stage["s_per_step"] * 1000, 3),
               "host_step_ms": round(with_host["s_per_step"] * 1000, 3),
               "stage_hidden_share": round(hidden(with_stage), 3),
               "host_hidden_share": round(hidden(with_host), 3),
               "stage_wait_ms": round(with_stage["median_wait_ms"], 3),
               "host_wait_ms": round(with_host["median_wait_ms"], 3),
               "device_memory": stage.metrics().get("device_memory"),
               "fence_counts": draftfeed._core.fence_counts()}
        stage.close()
        host.close()
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
