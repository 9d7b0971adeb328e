"""Packed caches against the per-sample cache, side by side in one run (issue 41):

  * metadata operations per epoch and rank, counted by tools/slowfs (no latency added): opens,
    lookups and attribute asks of one epoch read through the mount;
  * warm epochs from the page cache (no mount): per-sample, packed, packed and compressed, and the
    memcpy of the cache's bytes (`draftfeed verify --baseline memcpy` of the per-sample files);
  * bytes on disk, each way.

    python3 bench/bench_pack.py [--rows N] [--hidden H] [--out bench/results/pack_side_by_side]

One rank, the loader's defaults; each warm figure the median of 3 epochs of one loader after one
not counted (which warms the page cache and checks each packed sample's checksum once).
With --cold-mbps M, one cold epoch per cache through a fresh slowfs mount (10 ms per operation, M
MB/s), against its bound: the bytes it read at M MB/s."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import cli_path  # noqa: E402
from slowfs_process import SlowFs, slowfs_unavailable  # noqa: E402

import draftfeed  # noqa: E402

MAX_LEN = 2048


def run(*args) -> str:
    return subprocess.run([cli_path(), *map(str, args)], check=True, capture_output=True, text=True).stdout


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def make_loader(data: Path, cache: Path, hidden: int):
    return draftfeed.Loader(str(data), hidden_size=hidden, total_seq_len=MAX_LEN, hidden_states_path=str(cache),
                            pin_memory=False)


def epoch(loader, epoch_index: int) -> tuple[float, int]:
    loader.set_epoch(epoch_index)
    start = time.perf_counter()
    tokens = 0
    for batch in loader:
        tokens += int((batch["document_ids"] >= 0).sum())
    return time.perf_counter() - start, tokens


def metadata_ops(data: Path, cache: Path, hidden: int, mount: Path) -> dict:
    mount.mkdir(exist_ok=True)
    with SlowFs(cache, mount, latency_ms=0) as fs:
        loader = make_loader(data, Path(fs.mountpoint), hidden)
        try:
            fs.reset_stats()
            epoch(loader, 0)
            calls = fs.stats()["calls"]
        finally:
            loader.close()
    kinds = ("open", "lookup", "getattr", "readdir", "opendir")
    return {k: int(calls.get(k, 0)) for k in kinds if k in calls} | {
        "total": int(sum(calls.get(k, 0) for k in kinds))}


def cold_epoch(data: Path, cache: Path, hidden: int, mount: Path, bandwidth_mbps: float) -> dict:
    """One epoch through a fresh mount (nothing in its page cache): 10 ms per operation, the
    bandwidth capped."""
    mount.mkdir(exist_ok=True)
    with SlowFs(cache, mount, latency_ms=10, bandwidth_mbps=bandwidth_mbps) as fs:
        loader = make_loader(data, Path(fs.mountpoint), hidden)
        try:
            seconds, _ = epoch(loader, 0)
        finally:
            loader.close()
        read = int(fs.stats().get("read_bytes", 0))
    return {"seconds": round(seconds, 2), "read_bytes": read,
            "bound_seconds": round(read / (bandwidth_mbps * 1e6), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--cold-mbps", type=float, default=0,
                        help="also a cold epoch through slowfs (10 ms per operation) capped at this MB/s")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "pack_side_by_side"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_pack_"))
    try:
        data = work / "data"
        run("synth", data, "--rows", args.rows, "--min-len", 64, "--max-len", 1024, "--hidden-size", args.hidden,
            "--layers", 4)
        caches = {"per-sample": data / "hidden_states", "packed": work / "packed",
                  "packed+compressed": work / "packed_zstd"}
        run("pack", data, "--out", caches["packed"], "--no-progress")
        run("pack", data, "--out", caches["packed+compressed"], "--compress", "--no-progress")
        memcpy = json.loads(run("verify", data, "--baseline", "memcpy", "--json"))
        results: dict = {"rows": args.rows, "hidden": args.hidden, "layers": 4, "memcpy_gb_per_s": memcpy["gb_per_s"],
                         "sides": {}}
        for name, cache in caches.items():
            side: dict = {"bytes_on_disk": folder_bytes(cache)}
            if slowfs_unavailable() is None:
                side["metadata_ops_per_epoch"] = metadata_ops(data, cache, args.hidden, work / f"mnt_{len(name)}")
            if args.cold_mbps and slowfs_unavailable() is None:
                side["cold_epoch"] = cold_epoch(data, cache, args.hidden, work / f"cold_{len(name)}", args.cold_mbps)
            loader = make_loader(data, cache, args.hidden)
            try:
                epoch(loader, 0)  # the page cache warmed, the checksums checked: not counted
                times = []
                for e in range(3):
                    seconds, tokens = epoch(loader, e + 1)
                    times.append(seconds)
            finally:
                loader.close()
            side["warm_epoch_seconds"] = round(statistics.median(times), 3)
            side["warm_tokens_per_s"] = round(tokens / statistics.median(times))
            side["warm_gb_per_s_of_bf16"] = round(
                tokens * 4 * args.hidden * 2 / statistics.median(times) / 1e9, 2)
            results["sides"][name] = side
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out + ".json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"{args.rows} rows of 64-1024 tokens, 4 layers x {args.hidden}, bf16; memcpy of the per-sample files: "
             f"{results['memcpy_gb_per_s']:.2f} GB/s", "",
             "| cache | bytes on disk | metadata ops / epoch | warm epoch (s) | warm GB/s (bf16 bytes) | "
             f"cold epoch (s), {args.cold_mbps:g} MB/s, 10 ms/op | its bound (s) |",
             "|---|---|---|---|---|---|---|"]
    for name, side in results["sides"].items():
        ops = side.get("metadata_ops_per_epoch", {}).get("total", "n/a")
        cold = side.get("cold_epoch", {})
        lines.append(f"| {name} | {side['bytes_on_disk']} | {ops} | {side['warm_epoch_seconds']} | "
                     f"{side['warm_gb_per_s_of_bf16']} | {cold.get('seconds', '')} | {cold.get('bound_seconds', '')} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
