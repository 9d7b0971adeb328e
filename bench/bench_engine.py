"""The engine against the reference loader, side by side in one run on the same data in page cache.

    python bench/bench_engine.py [--rows 160] [--hidden-size 4096] [--workers 2] [--epochs 1] [--out DIR]

Both sides go through their `create_train_val_loaders` with the reference's default arguments, scaled
to this machine (num_workers = cores), H = 4096, 4 layers, bf16, total_seq_len 8192, noise off on both
(the installed reference 0.9.0 has none); then both with uniform noise (std 0.05) on the training
split's hidden_states: draftfeed's own, and the reference with the seed's per-sample AddUniformNoise
re-implemented on 0.9.0's loaders (bench/reference_noise.py: applied in the workers, per sample, as
the seed does). Prints tokens/s, GB/s of hidden states, time to first batch, peak memory of the
process tree and CPU seconds per GB, and the ratios draftfeed / reference.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_common import (
    TreeMemory,
    machine,
    make_cached_dataset,
    print_table,
    reference_train_loader,
    time_epoch,
    tree_cpu_seconds,
    warm_page_cache,
)

SIDES = ("reference", "draftfeed", "reference+noise", "draftfeed+noise")
NOISE_STD = 0.05  # the seed's default noise_std


def loader_args(path: str, hidden_size: int, workers: int, noise_std: float) -> dict:
    return dict(
        data_path=path, total_seq_len=8192, hidden_states_dtype=torch.bfloat16, noise_std=noise_std,
        transfer=None, vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip", on_generate="cache",
        verifier_name_or_path="unused", request_timeout=120.0, max_retries=3,
        generation_validation_retries=2, max_consecutive_generation_failures=20,
        hidden_size=hidden_size, num_target_layers=3, num_workers=workers, prefetch_factor=4,
        preprocess=None, train_data_ratio=0.9,
    )


def run_side(name: str, make, epochs: int = 1) -> dict:
    """Creates the loaders and iterates `epochs` training epochs (set_epoch(e) before each, as the
    trainer does). The top-level keys are epoch 0's (time to first batch includes creating the
    loaders, so the reference's worker start-up is in it); `epochs` lists every epoch: later ones
    reuse the reference's persistent workers, so they show the steady rate. CPU seconds are the
    whole process tree's (workers included)."""
    gc.collect()
    cpu_start = tree_cpu_seconds()
    per_epoch = []
    with TreeMemory() as memory:
        start = time.perf_counter()
        loaders = make()
        startup = time.perf_counter() - start
        for epoch in range(epochs):
            loaders[0].batch_sampler.set_epoch(epoch)
            cpu0 = tree_cpu_seconds()
            result = time_epoch(loaders[0])
            result["cpu_seconds"] = tree_cpu_seconds() - cpu0
            per_epoch.append(result)
        cpu_total = tree_cpu_seconds() - cpu_start  # before `del`: the workers are still alive
        del loaders  # joins the reference's worker processes
        gc.collect()
    result = dict(per_epoch[0])
    result["first_batch"] += startup
    result["startup_seconds"] = startup
    result["cpu_seconds"] = cpu_total
    result["peak_tree_rss"] = memory.peak
    result["peak_tree_pss"] = memory.peak_pss
    result["start_tree_pss"] = memory.start_pss
    result["epochs"] = per_epoch
    result["name"] = name
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=160)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "draftfeed_bench_engine"))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--epochs", type=int, default=1,
                        help="training epochs per loader (later epochs reuse the reference's workers)")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.side:
        # One side in its own process, so peak memory is its own process tree's.
        # A trainer has imported speculators before it makes its loaders (both sides touch it:
        # draftfeed's drop-in checks `preprocess` against speculators' own functions), so the
        # seconds of that import are not loader start-up and stay out of the time to first batch.
        import speculators.train.dataloader  # noqa: F401
        from reference_noise import with_uniform_noise

        from draftfeed.speculators import create_train_val_loaders as ours

        def reference_with_noise():
            train, val = reference_train_loader(loader_args(args.data, args.hidden_size, args.workers, 0.0))
            return with_uniform_noise(train, NOISE_STD), val

        sides = {
            "reference": lambda: reference_train_loader(loader_args(args.data, args.hidden_size, args.workers, 0.0)),
            "reference+noise": reference_with_noise,
            "draftfeed": lambda: ours(**loader_args(args.data, args.hidden_size, args.workers, 0.0)),
            "draftfeed+noise": lambda: ours(**loader_args(args.data, args.hidden_size, args.workers, NOISE_STD)),
        }
        print(json.dumps(run_side(args.side, sides[args.side], args.epochs)))
        return

    spec = make_cached_dataset(args.data, rows=args.rows, hidden_size=args.hidden_size)
    size = warm_page_cache(args.data)
    print(f"machine: {machine()}")
    print(f"data: {args.data}: {spec}, {size / 1e9:.2f} GB in page cache")
    results = []
    for side in SIDES:
        proc = subprocess.run(
            [sys.executable, __file__, "--side", side, "--data", args.data, "--hidden-size", str(args.hidden_size),
             "--workers", str(args.workers), "--epochs", str(args.epochs)],
            capture_output=True, text=True, timeout=3600,
        )
        if proc.returncode != 0:
            sys.exit(f"{side} failed:\n{proc.stderr}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    ref = results[0]
    assert all(r["batches"] == ref["batches"] and r["tokens"] == ref["tokens"] for r in results), results
    rows = []
    for r in results:
        gbps = r["hidden_bytes"] / r["seconds"] / 1e9
        rows.append((
            r["name"], r["batches"], f"{r['tokens'] / r['seconds']:.0f}", f"{gbps:.2f}",
            f"{r['first_batch']:.2f}", f"{r['peak_tree_rss'] / 1e9:.2f}",
            f"{r['cpu_seconds'] / (r['hidden_bytes'] / 1e9):.2f}",
            f"{ref['seconds'] / r['seconds']:.2f}x",
        ))
    print()
    print_table(rows, ("loader", "batches", "tokens/s", "GB/s", "first batch s", "peak RSS GB", "CPU s/GB", "speed vs ref"))
    dfr = results[1]
    print()
    print(f"draftfeed / reference: throughput {ref['seconds'] / dfr['seconds']:.2f}x, "
          f"time to first batch {ref['first_batch'] / dfr['first_batch']:.1f}x sooner, "
          f"peak memory {dfr['peak_tree_rss'] / ref['peak_tree_rss']:.2f}x of the reference's")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "engine.json"), "w") as f:
        json.dump({"machine": machine(), "data": spec, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
