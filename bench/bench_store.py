"""Hidden-state store benchmark: read + validate a cache in the page cache, at equal parallelism.

Over the same files (a synthetic cache, read once beforehand so every file is in the page cache),
at each parallelism N in --parallel (default 1 and the machine's cores):
  * reference, N processes: each runs hs_connectors.FileTransfer(...).get_cached(i) + speculators'
    check_hidden_states(loaded, ids) over its share of the rows (rows i with i % N == k), with one
    torch thread, as each of the reference's DataLoader workers does (its worker_init_fn sets one);
    the processes are started and have imported everything before the clock starts; the time is
    from the common start (a barrier) to the last process's end;
  * draftfeed, N threads: `draftfeed verify --threads N` (mmap, layout checks, token ids, shape,
    vectorised finiteness scan);
  * read-only bound, N threads: `draftfeed verify --baseline read --threads N`: every file mapped
    and every byte read once, nothing else. This bounds a scan (which reads each byte and copies
    nothing); a copy (memcpy) is slower than a read, so it bounds a loader, not a scan;
  * copy bound, N threads: `draftfeed verify --baseline memcpy --threads N`, for comparison.
Every method gets one untimed warm-up pass, then --repeat timed passes (median). GB/s counts file
bytes. Ratios are taken at equal N only.

usage: DRAFTFEED_DEV_BUILD=build PYTHONPATH=python DRAFTFEED_CLI=build/draftfeed \
       python bench/bench_store.py [--rows N] [--min-len A] [--max-len B] [--hidden-size H]
       [--layers L] [--dtype bf16] [--parallel 1,2] [--repeat K] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_common import cli_path


def run_json(*args) -> dict:
    proc = subprocess.run([cli_path(), *map(str, args), "--json"], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"draftfeed {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def warm(folder: Path) -> int:
    total = 0
    for path in sorted(folder.iterdir()):
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total


def row_ids(data: Path) -> list[list[int]]:
    from datasets import load_from_disk

    return [list(r) for r in load_from_disk(str(data)).with_format(None)["input_ids"]]


def reference_worker(k: int, n: int, data: str, passes: int, barrier, results) -> None:
    """One reference worker process: its share of the rows, `passes` times, each pass started at a
    barrier shared with the other workers; reports (pass, start, end, bytes) per pass."""
    import torch

    torch.set_num_threads(1)  # as speculators' DataLoader worker_init_fn
    from hs_connectors.transfer import FileTransfer
    from speculators.data_generation.offline import check_hidden_states

    folder = Path(data) / "hidden_states"
    rows = row_ids(Path(data))
    mine = [i for i in range(len(rows)) if i % n == k]
    transfer = FileTransfer(folder)
    for p in range(passes):
        barrier.wait()
        start = time.perf_counter()
        total = 0
        for i in mine:
            loaded = transfer.get_cached(i)
            check_hidden_states(loaded, rows[i])
            total += os.path.getsize(folder / f"hs_{i}.safetensors")
        results.put((p, start, time.perf_counter(), total))


def reference_scan(data: Path, n: int, passes: int) -> list[tuple[float, int]]:
    """(seconds, bytes) of each pass of N reference processes (perf_counter is the system's
    monotonic clock, the same in every process)."""
    ctx = mp.get_context("spawn")  # as the reference's DataLoader
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=reference_worker, args=(k, n, str(data), passes, barrier, results))
             for k in range(n)]
    for p in procs:
        p.start()
    got: dict[int, list[tuple[float, float, int]]] = {}
    try:
        for _ in range(n * passes):
            p, start, end, total = results.get(timeout=3600)
            got.setdefault(p, []).append((start, end, total))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return [(max(e for _, e, _ in runs) - min(s for s, _, _ in runs), sum(b for _, _, b in runs))
            for _, runs in sorted(got.items())]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--min-len", type=int, default=400)
    parser.add_argument("--max-len", type=int, default=600)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--parallel", default=None,
                        help="processes (reference) and threads (draftfeed), comma-separated; "
                        "default 1 and the machine's cores")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per method (median), after one warm-up")
    parser.add_argument("--keep", help="write the cache here and keep it (default: a temp folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    parallel = sorted({int(x) for x in args.parallel.split(",") if x} if args.parallel else {1, cores})

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="draftfeed_bench_store_"))
    data = base / "data"
    try:
        if not (data / "hidden_states").is_dir():
            run_json("synth", data, "--rows", args.rows, "--min-len", args.min_len, "--max-len",
                     args.max_len, "--hidden-size", args.hidden_size, "--layers", args.layers,
                     "--dtype", args.dtype)
        folder = data / "hidden_states"
        rows = len(row_ids(data))
        cache_bytes = warm(folder)

        def verify(threads: int, baseline: str | None) -> tuple[float, int]:
            extra = ["--baseline", baseline] if baseline else []
            report = run_json("verify", data, "--threads", threads, *extra)
            assert report["ok"] == rows, report
            return report["seconds"], report["bytes"]

        def median_of(fn) -> dict:
            fn()  # warm-up, untimed
            runs = [fn() for _ in range(args.repeat)]
            seconds = statistics.median(r[0] for r in runs)
            return dict(seconds=seconds, bytes=runs[0][1], gb_per_s=runs[0][1] / seconds / 1e9,
                        runs=[r[0] for r in runs])

        results: dict[str, dict[str, dict]] = {}
        for n in parallel:
            passes = reference_scan(data, n, 1 + args.repeat)[1:]  # the first pass is the warm-up
            seconds = statistics.median(s for s, _ in passes)
            results[str(n)] = {
                "reference": dict(seconds=seconds, bytes=passes[0][1], gb_per_s=passes[0][1] / seconds / 1e9,
                                  runs=[s for s, _ in passes]),
                "draftfeed": median_of(lambda t=n: verify(t, None)),
                "read_bound": median_of(lambda t=n: verify(t, "read")),
                "copy_bound": median_of(lambda t=n: verify(t, "memcpy")),
            }
        summary = {
            "rows": rows, "cache_bytes": cache_bytes, "hidden_size": args.hidden_size, "layers": args.layers,
            "dtype": args.dtype, "cores": cores, "repeat": args.repeat, "warmup": 1,
            "parallel": parallel, "results": results,
        }
        if args.json:
            print(json.dumps(summary, indent=2))
            return
        print(f"cache: {rows} rows, {cache_bytes / 1e9:.2f} GB, H={args.hidden_size} L={args.layers} "
              f"{args.dtype}, in the page cache; median of {args.repeat} passes after one warm-up")
        for n, r in results.items():
            print(f"  N={n}: reference ({n} processes) {r['reference']['gb_per_s']:.2f} GB/s, draftfeed verify "
                  f"({n} threads) {r['draftfeed']['gb_per_s']:.2f} GB/s "
                  f"({r['draftfeed']['gb_per_s'] / r['reference']['gb_per_s']:.1f}x); read-only bound "
                  f"{r['read_bound']['gb_per_s']:.2f} GB/s "
                  f"(verify at {100 * r['draftfeed']['gb_per_s'] / r['read_bound']['gb_per_s']:.0f}%), "
                  f"copy bound {r['copy_bound']['gb_per_s']:.2f} GB/s")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
