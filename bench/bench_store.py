"""Hidden-state store benchmark: read + validate a cache in the page cache, side by side in one run.

Three ways over the same files (a synthetic cache written by `draftfeed synth`, then read once so
every file is in the page cache):
  * reference: hs_connectors.FileTransfer(...).get_cached(i) + speculators'
    check_hidden_states(loaded, ids), one row after another (what each reference worker does);
  * draftfeed: `draftfeed verify --json` (mmap, layout checks, token ids, shape, vectorised
    finiteness scan), with 1 thread and with every core;
  * memcpy baseline: `draftfeed verify --baseline memcpy` (mmap each file and memcpy all of it),
    same thread counts: the floor for anything that touches every byte once.
GB/s counts file bytes. Ratios: draftfeed / reference and draftfeed / memcpy at equal threads.

usage: DRAFTFEED_DEV_BUILD=build PYTHONPATH=python DRAFTFEED_CLI=build/draftfeed \
       python bench/bench_store.py [--rows N] [--min-len A] [--max-len B] [--hidden-size H]
       [--layers L] [--dtype bf16] [--repeat K] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def cli() -> str:
    path = os.environ.get("DRAFTFEED_CLI") or shutil.which("draftfeed")
    if not path:
        raise SystemExit("set DRAFTFEED_CLI or put draftfeed on PATH")
    return path


def run_json(*args) -> dict:
    proc = subprocess.run([cli(), *map(str, args), "--json"], capture_output=True, text=True,
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


def reference_pass(folder: Path, rows: list[list[int]]) -> tuple[float, int]:
    import torch  # noqa: F401 - imported before timing
    from hs_connectors.transfer import FileTransfer
    from speculators.data_generation.offline import check_hidden_states

    transfer = FileTransfer(folder)
    total = 0
    start = time.perf_counter()
    for i, ids in enumerate(rows):
        loaded = transfer.get_cached(i)
        check_hidden_states(loaded, ids)
        total += os.path.getsize(folder / f"hs_{i}.safetensors")
    return time.perf_counter() - start, total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--min-len", type=int, default=400)
    parser.add_argument("--max-len", type=int, default=600)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per method (median)")
    parser.add_argument("--keep", help="write the cache here and keep it (default: a temp folder)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="draftfeed_bench_store_"))
    data = base / "data"
    try:
        if not (data / "hidden_states").is_dir():
            run_json("synth", data, "--rows", args.rows, "--min-len", args.min_len, "--max-len",
                     args.max_len, "--hidden-size", args.hidden_size, "--layers", args.layers,
                     "--dtype", args.dtype)
        folder = data / "hidden_states"
        from datasets import load_from_disk

        rows = [list(r) for r in load_from_disk(str(data)).with_format(None)["input_ids"]]
        cache_bytes = warm(folder)
        cores = os.cpu_count() or 1

        results = {}

        def median_of(fn):
            runs = [fn() for _ in range(args.repeat)]
            seconds = statistics.median(r[0] for r in runs)
            return seconds, runs[0][1]

        def verify(threads, baseline):
            extra = ["--baseline", "memcpy"] if baseline else []
            report = run_json("verify", data, "--threads", threads, *extra)
            assert report["ok"] == len(rows), report
            return report["seconds"], report["bytes"]

        seconds, total = median_of(lambda: reference_pass(folder, rows))
        results["reference (1 process)"] = (seconds, total, 1)
        for threads in sorted({1, cores}):
            results[f"draftfeed verify, {threads} thread(s)"] = (*median_of(lambda t=threads: verify(t, False)), threads)
            results[f"memcpy baseline, {threads} thread(s)"] = (*median_of(lambda t=threads: verify(t, True)), threads)

        gbps = {name: total / seconds / 1e9 for name, (seconds, total, _) in results.items()}
        ref = gbps["reference (1 process)"]
        summary = {
            "rows": len(rows),
            "cache_bytes": cache_bytes,
            "hidden_size": args.hidden_size,
            "layers": args.layers,
            "dtype": args.dtype,
            "cores": cores,
            "gb_per_s": gbps,
            "ratios": {},
        }
        for threads in sorted({1, cores}):
            ours = gbps[f"draftfeed verify, {threads} thread(s)"]
            summary["ratios"][f"draftfeed/reference, {threads} thread(s)"] = ours / ref
            summary["ratios"][f"draftfeed/memcpy, {threads} thread(s)"] = ours / gbps[f"memcpy baseline, {threads} thread(s)"]
        if args.json:
            print(json.dumps(summary, indent=2))
            return
        print(f"cache: {len(rows)} rows, {cache_bytes / 1e9:.2f} GB, H={args.hidden_size} "
              f"L={args.layers} {args.dtype}, in the page cache; median of {args.repeat} passes")
        for name, (seconds, _total, _) in results.items():
            print(f"  {name:32s} {seconds:8.3f} s  {gbps[name]:7.2f} GB/s")
        for name, ratio in summary["ratios"].items():
            print(f"  {name:40s} {ratio:7.2f}x")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
