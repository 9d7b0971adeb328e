"""Cold reads: an epoch with every cache file evicted from the page cache first, bf16 and FP8, the
reference and draftfeed side by side in one run, against the disk bound measured in the same run.

    python bench/bench_cold.py [--hidden-size 2048] [--row-sizes small,medium,large] [--workers 2]
                               [--repeat 2] [--out DIR] [--json]

A terabyte cache is never in the page cache, so the epoch that matters is the cold one. For each row
size (small rows 64-256 tokens, medium 256-2048, large 2048-8192; H = --hidden-size, 4 layers,
total_seq_len 8192) the data is a synthetic dataset with its bf16 cache, and the FP8 cache of the same
values written by `draftfeed quantize` (byte for byte what hs-connectors' FP8 connector writes).

Per configuration, in this order:
  * disk bound: every file of the training split evicted (posix_fadvise DONTNEED; mincore checks that
    nothing stayed), then a parallel sequential read of exactly those bytes (1 MB reads, 1, 2, 4 and 8
    threads): what the disk gives to any reader. The disk is shared and its speed drifts, so each cold
    epoch below is preceded by its own bound (max(2, workers) threads), and draftfeed's cold GB/s is
    compared with the bound measured just before it;
  * four sides, each in its own process, through their `create_train_val_loaders` called with
    speculators 0.9.0's trainer's arguments (num_workers = --workers, prefetch_factor 4, noise off):
    the reference with FileTransfer (bf16) and with FP8Transfer (FP8), draftfeed with the same two
    transfers (draftfeed reads both natively). Each runs epoch 0 (start-up: the reference spawns its
    workers), then evicts every cache file and runs epoch 1 cold, then epoch 2 warm (the files epoch 1
    read are in the page cache). Both cold and warm epochs are timed (tokens/s, and file GB/s: the
    bytes of the files the epoch read over its seconds).
The cold epochs are repeated --repeat times (best taken, both sides alike: the disk is shared).
If the page cache cannot be dropped on this machine's file system, the table says so.

Printed: tokens/s per side, draftfeed / reference, FP8 / bf16, and draftfeed's cold file GB/s as a
percentage of the disk bound; per side, the block device's mean read request and busy time during its
best cold epoch (where /sys/dev/block has the device), and the CPU cores the side's process tree kept
busy on average (near the machine's cores, the epoch is CPU-bound). Written to OUT/cold.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_common import cli_path, machine, make_cached_dataset, parallel_read, print_table, tree_cpu_seconds  # noqa: E402
from page_cache import evict, evict_checked, resident_bytes  # noqa: E402

ROW_SIZES = {"small": (64, 256, 640), "medium": (256, 2048, 96), "large": (2048, 8192, 24)}
SIDES = ("reference bf16", "reference fp8", "draftfeed bf16", "draftfeed fp8")
MAX_LEN = 8192




def prepare(root: str, size: str, hidden: int, scale: float = 1.0) -> dict:
    """The dataset, its bf16 cache and its FP8 cache (written once, reused). `scale` scales the
    number of rows (--quick)."""
    min_len, max_len, rows = ROW_SIZES[size]
    rows = max(8, round(rows * scale))
    data = os.path.join(root, f"{size}_h{hidden}_{rows}", "data")
    spec = make_cached_dataset(data, rows=rows, hidden_size=hidden, min_len=min_len, max_len=max_len)
    fp8 = os.path.join(data, "hidden_states_fp8")
    done = os.path.join(fp8, ".complete")
    if not os.path.exists(done):
        subprocess.run([cli_path(), "quantize", data, "--out", fp8, "--no-progress"], check=True,
                       capture_output=True, text=True, timeout=3600)
        Path(done).write_text("")
    return dict(spec, size=size, data=data, bf16=os.path.join(data, "hidden_states"), fp8=fp8)


def split_files(data: str, folder: str, train_ratio: float = 0.9) -> list[str]:
    """The cache files of the training split: exactly what a training epoch reads."""
    import draftfeed

    n = len(draftfeed.open_dataset(data))
    split = int(n * train_ratio)
    paths = [os.path.join(folder, f"hs_{i}.safetensors") for i in range(split)]
    return [p for p in paths if os.path.exists(p)]


def disk_bound(paths: list[str], threads: int, chunk: int = 1 << 20) -> float:
    """GB/s of a parallel sequential read of `paths` (evicted first) with `threads` threads."""
    evict(paths)
    return parallel_read(paths, threads, chunk)["gbps"]


def device_stat(path: str) -> tuple[int, int, int] | None:
    """(reads completed, sectors read, ms busy) of the block device holding `path`, from
    /sys/dev/block (None where there is none, e.g. tmpfs or overlay)."""
    dev = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[2]), int(fields[9])
    except (OSError, IndexError, ValueError):
        return None


def device_figures(before, after, seconds: float) -> dict:
    """The device's side of a cold epoch: its mean read request and how busy it was. The kernel's
    readahead decides both (WILLNEED requests of single pages are < 1 MiB; sequential reads reach
    3-4 MiB): the first thing to look at when an epoch is far from the disk bound."""
    if before is None or after is None or after[0] <= before[0]:
        return {}
    return dict(request_kib=(after[1] - before[1]) * 512 / (after[0] - before[0]) / 1024,
                device_busy=(after[2] - before[2]) / 1000 / seconds)


# ---------------------------------------------------------------- one side, in its own process
def loader_args(data: str, transfer, hidden: int, workers: int) -> dict:
    """speculators 0.9.0's trainer's call, exactly (tests/python/dropin_helpers.py)."""
    import torch

    return dict(
        data_path=data, total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16, transfer=transfer,
        vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip", verifier_name_or_path="unused",
        request_timeout=120.0, max_retries=3, generation_validation_retries=2,
        max_consecutive_generation_failures=20, hidden_size=hidden, num_target_layers=3,
        num_workers=workers, prefetch_factor=4, preprocess=None, train_data_ratio=0.9, seed=42,
    )


def timed_epoch(loader, epoch: int) -> dict:
    import warnings

    loader.batch_sampler.set_epoch(epoch)
    cpu_before = tree_cpu_seconds()
    start = time.perf_counter()
    tokens = batches = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in loader:
            tokens += int((batch["document_ids"] >= 0).sum())
            batches += 1
    seconds = time.perf_counter() - start
    # CPU cores busy on average (the process tree: the engine's threads, the reference's workers):
    # near the machine's cores, an epoch is CPU-bound, not disk-bound.
    return dict(seconds=seconds, tokens=tokens, batches=batches, cores=(tree_cpu_seconds() - cpu_before) / seconds)


def run_side(side: str, config: dict, workers: int, repeat: int) -> dict:
    import speculators.train.dataloader as reference
    from hs_connectors import FileTransfer, FP8Transfer

    fp8 = side.endswith("fp8")
    folder = config["fp8"] if fp8 else config["bf16"]
    transfer = FP8Transfer(Path(folder)) if fp8 else FileTransfer(Path(folder))
    if side.startswith("reference"):
        make = reference.create_train_val_loaders
    else:
        from draftfeed.speculators import create_train_val_loaders as make
    paths = split_files(config["data"], folder)
    train, _ = make(**loader_args(config["data"], transfer, config["hidden_size"], workers))
    out = dict(side=side, file_bytes=sum(os.path.getsize(p) for p in paths), cold=[], warm=[])
    out["startup"] = timed_epoch(train, 0)
    for k in range(repeat):
        # The disk bound right before this cold epoch (the disk is shared: it drifts over minutes).
        bound = disk_bound(paths, max(2, workers))
        _size, left = evict_checked(paths)
        device_before = device_stat(folder)
        cold = timed_epoch(train, 1 + 2 * k)
        cold.update(device_figures(device_before, device_stat(folder), cold["seconds"]))
        cold["resident_before"] = left
        cold["disk_bound"] = bound
        out["cold"].append(cold)
        warm_before = resident_bytes(paths)
        warm = timed_epoch(train, 2 + 2 * k)
        warm["resident_before"] = warm_before
        out["warm"].append(warm)
    del train
    return out


# ---------------------------------------------------------------- the table
def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["seconds"])


def tok_s(run: dict) -> float:
    return run["tokens"] / run["seconds"]


def summarize(results: dict) -> list[tuple]:
    rows = []
    for c in results["configs"]:
        s = c["sides"]
        for state in ("warm", "cold"):
            for fmt in ("bf16", "fp8"):
                ref, ours = s.get(f"reference {fmt}"), s.get(f"draftfeed {fmt}")
                if not ours:
                    continue
                o = best(ours[state])
                r = best(ref[state]) if ref else None
                gbps = ours["file_bytes"] / o["seconds"] / 1e9
                bound = o["disk_bound"] if state == "cold" else None
                rows.append((
                    c["size"], f"{fmt} {'page cache' if state == 'warm' else 'evicted'}",
                    f"{tok_s(r):,.0f}" if r else "-", f"{tok_s(o):,.0f}",
                    f"{tok_s(o) / tok_s(r):.1f}x" if r else "-",
                    f"{gbps:.2f}", f"{bound:.2f}" if bound else "-",
                    f"{100 * gbps / bound:.0f}%" if bound else "-",
                ))
    return rows


HEADERS = ("rows", "cache", "ref tok/s", "draftfeed tok/s", "speed-up", "draftfeed file GB/s",
           "disk bound GB/s (just before)", "% of disk bound")


def criteria(results: dict) -> list[str]:
    """The issue's targets, from the measured figures."""
    lines = []
    for c in results["configs"]:
        s = c["sides"]
        if not all(k in s for k in SIDES):
            continue
        t = {k: {state: tok_s(best(s[k][state])) for state in ("warm", "cold")} for k in SIDES}
        ref_fp8 = min(t["reference fp8"]["warm"], t["reference fp8"]["cold"])
        lines.append(
            f"{c['size']} rows: FP8/bf16 draftfeed in page cache {t['draftfeed fp8']['warm'] / t['draftfeed bf16']['warm']:.2f}x, "
            f"evicted {t['draftfeed fp8']['cold'] / t['draftfeed bf16']['cold']:.2f}x; "
            f"draftfeed / reference FP8: bf16 page cache {t['draftfeed bf16']['warm'] / t['reference fp8']['warm']:.1f}x, "
            f"FP8 page cache {t['draftfeed fp8']['warm'] / t['reference fp8']['warm']:.1f}x, "
            f"FP8 evicted {t['draftfeed fp8']['cold'] / t['reference fp8']['cold']:.1f}x, "
            f"bf16 evicted {t['draftfeed bf16']['cold'] / ref_fp8:.1f}x of the reference FP8's slower epoch")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--row-sizes", default="small,medium,large")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--repeat", type=int, default=2, help="cold/warm epoch pairs per side (best kept)")
    p.add_argument("--scale", type=float, default=1.0, help="scale the rows of every dataset (0.1: a quick check)")
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "draftfeed_bench_cold"))
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.side:
        print(json.dumps(run_side(args.side, json.loads(args.config), args.workers, args.repeat)))
        return

    sides = [s for s in args.sides.split(",") if s]
    results = dict(machine=machine(), command="python bench/bench_cold.py " + " ".join(sys.argv[1:]),
                   hidden_size=args.hidden_size, workers=args.workers, configs=[], notes=[])
    started = time.perf_counter()
    for size in [s for s in args.row_sizes.split(",") if s]:
        config = prepare(args.data, size, args.hidden_size, args.scale)
        paths = split_files(config["data"], config["bf16"])
        total, left = evict_checked(paths)
        if left > 0.01 * total:
            results["notes"].append(f"{size}: {left / 1e9:.2f} of {total / 1e9:.2f} GB stayed in the page cache "
                                    "after posix_fadvise(DONTNEED): this file system does not drop them, so the "
                                    "'evicted' rows are not cold reads")
        bound = {str(t): disk_bound(paths, t) for t in (1, 2, 4, 8)}
        bound["best"] = max(bound.values())
        config.update(disk_bound=bound, sides={})
        print(f"[{size}] {config['rows']} rows, {total / 1e9:.2f} GB bf16 read per epoch; disk bound "
              + ", ".join(f"{t} threads {g:.2f}" for t, g in bound.items() if t != "best") + " GB/s", flush=True)
        for side in sides:
            proc = subprocess.run(
                [sys.executable, __file__, "--side", side, "--config", json.dumps(config),
                 "--workers", str(args.workers), "--repeat", str(args.repeat)],
                capture_output=True, text=True, timeout=args.timeout)
            if proc.returncode != 0:
                sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            config["sides"][side] = r
            c, w = best(r["cold"]), best(r["warm"])
            device = (f" (device: {c['request_kib']:,.0f} KiB reads, busy {100 * c['device_busy']:.0f}%; "
                      f"CPU {c['cores']:.2f} cores)" if "request_kib" in c else f" (CPU {c['cores']:.2f} cores)")
            print(f"  {side:15s} cold {tok_s(c):>10,.0f} tok/s {r['file_bytes'] / c['seconds'] / 1e9:5.2f} GB/s{device}   "
                  f"warm {tok_s(w):>10,.0f} tok/s", flush=True)
        tokens = {(side, k): best(v[k])["tokens"] for side, v in config["sides"].items() for k in ("cold", "warm")}
        if len(set(tokens.values())) > 1:
            results["notes"].append(f"{size}: sides delivered different token counts: {tokens}")
        results["configs"].append(config)
    results["seconds"] = time.perf_counter() - started

    print()
    print(f"Cold reads (H={args.hidden_size}, 4 layers, total_seq_len {MAX_LEN}, {args.workers} workers/threads; "
          f"{machine()})")
    print_table(summarize(results), HEADERS)
    for line in criteria(results) + results["notes"]:
        print(line)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cold.json"), "w") as f:
        json.dump(results, f, indent=2)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
