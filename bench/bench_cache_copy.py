"""The batch copy of a cache file's rows from its mapping against the same copy reading them through
the file's descriptor (pread), side by side in one run on the same data: does any user gain from the
read copy?

    python bench/bench_cache_copy.py [--hidden-sizes 1024,4096] [--gb 2.5] [--repeat 3]
                                     [--netfs-rows 800] [--latency-ms 10] [--name NAME] [--out DIR]

Every figure is the drop-in `create_train_val_loaders` (num_workers --workers, total_seq_len 8192, 3
layers + the last, bf16), one loader per copy, built before the first epoch and run in turns (so the
load on the machine falls on both copies alike); "map" is the loader's own copy (the rows from each
file's mapping), "read" the same loader with DRAFTFEED_CACHE_COPY=read, where the engine has it. The
cases:
  warm    the cache in the page cache, rows of 256-2048 tokens (files of 2-16 MB at H=1024), without
          noise and with uniform noise (std 0.05), at each H of --hidden-sizes (--gb of files each);
          with the machine's bounds measured in the same turns: `draftfeed verify --baseline memcpy`
          (every file's mapping copied with memcpy) and `--baseline pread` (every file read through
          its descriptor into a ring): what a mapped and a read copy could reach at most;
  cold    the same files (the first H) evicted from the page cache before an epoch (posix_fadvise
          DONTNEED, checked with mincore): the rows come from the local disk; then a warm epoch of
          the same loader, the files in the page cache as its own reads left them (a page cache
          filled by reads may hold smaller folios than one filled by the writer: more faults for a
          mapped copy); with the disk's bound (every file read whole, 4 threads) before each turn;
  netfs   the cache through tools/slowfs (FUSE; --latency-ms on every open, lookup and first read of a
          file, no tail), rows of 32-128 tokens (files of 0.25-1 MB), --netfs-rows rows: a cold epoch
          on a fresh mount (a cold client), then a warm one on the same mount, for each copy; with
          slowfs's count of attribute reads (GETATTR, a round trip each on a network file system).
GB/s: hidden-state bytes delivered over the epoch's seconds; medians over --repeat turns (a warm-up
turn first for the warm case). Each "read / map" ratio compares the two copies in the same turns.
Writes OUT/NAME.json and OUT/NAME.md (the commit, the command, the machine, the tables).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tools"))
from bench_common import (  # noqa: E402
    cli_path,
    make_cached_dataset,
    parallel_read,
    print_table,
    time_epoch,
    warm_page_cache,
)
from page_cache import evict_checked, files_under  # noqa: E402

NOISE_STD = 0.05
MAX_LEN = 8192
COPIES = ("map", "read")


def loader_args(data: str, hidden: int, workers: int, noise_std: float, transfer=None) -> dict:
    import torch

    return dict(
        data_path=data, total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16, noise_std=noise_std,
        transfer=transfer, vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip", verifier_name_or_path=None,
        request_timeout=1.0, max_retries=0, hidden_size=hidden, num_target_layers=3, num_workers=workers,
        prefetch_factor=4, preprocess=None, train_data_ratio=0.9, seed=42,
    )


def make_loader(copy: str, args: dict):
    """A training loader whose copy is `copy` (the environment is read as its source is built)."""
    from draftfeed.speculators import create_train_val_loaders

    before = os.environ.pop("DRAFTFEED_CACHE_COPY", None)
    if copy == "read":
        os.environ["DRAFTFEED_CACHE_COPY"] = "read"
    try:
        return create_train_val_loaders(**args)[0]
    finally:
        os.environ.pop("DRAFTFEED_CACHE_COPY", None)
        if before is not None:
            os.environ["DRAFTFEED_CACHE_COPY"] = before


def epoch_gbps(loader, epoch: int) -> dict:
    loader.batch_sampler.set_epoch(epoch)
    r = time_epoch(loader)
    return dict(gbps=r["hidden_bytes"] / r["seconds"] / 1e9, seconds=r["seconds"], batches=r["batches"],
                cpu_seconds=r["cpu_seconds"])


def verify_gbps(cli: str, data: str, baseline: str, threads: int) -> float:
    out = subprocess.run([cli, "verify", data, "--threads", str(threads), "--baseline", baseline, "--json"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out)["gb_per_s"]


def median(runs: list[dict], key: str = "gbps") -> float:
    return statistics.median(r[key] for r in runs)


def training_files(data: str, rows: int) -> list[str]:
    cache = os.path.join(data, "hidden_states")
    names = {f"hs_{i}.safetensors" for i in range(int(rows * 0.9))}
    return [p for p in files_under(cache) if os.path.basename(p) in names]


# ---------------------------------------------------------------- the cases
def warm_case(data: str, hidden: int, workers: int, repeat: int, cli: str) -> dict:
    warm_page_cache(data)
    loaders = {(copy, noise): make_loader(copy, loader_args(data, hidden, workers, noise))
               for noise in (0.0, NOISE_STD) for copy in COPIES}
    runs: dict[str, list[dict]] = {f"{copy}{'+noise' if noise else ''}": [] for copy, noise in loaders}
    bounds: dict[str, list[float]] = {"memcpy": [], "pread": []}
    for turn in range(repeat + 1):  # turn 0 warms every path up
        for baseline in bounds:
            bounds[baseline].append(verify_gbps(cli, data, baseline, workers))
        for (copy, noise), loader in loaders.items():
            runs[f"{copy}{'+noise' if noise else ''}"].append(epoch_gbps(loader, turn))
    return dict(hidden_size=hidden, runs={k: v[1:] for k, v in runs.items()},
                bounds={k: statistics.median(v[1:]) for k, v in bounds.items()})


def cold_case(data: str, rows: int, hidden: int, workers: int, repeat: int) -> dict:
    paths = training_files(data, rows)
    loaders = {copy: make_loader(copy, loader_args(data, hidden, workers, 0.0)) for copy in COPIES}
    runs: dict[str, list[dict]] = {f"{copy} {kind}": [] for copy in COPIES for kind in ("cold", "warm")}
    disk: list[float] = []
    for turn in range(repeat):
        # The disk's own bound right before the turn (a parallel read of the evicted files).
        evict_checked(paths)
        disk.append(parallel_read(paths, 4)["gbps"])
        for copy, loader in loaders.items():
            size, left = evict_checked(paths)
            r = epoch_gbps(loader, 2 * turn)
            r["resident_before"] = left / size
            runs[f"{copy} cold"].append(r)
            # Then warm: the files in the page cache as the loader's own reads left them.
            runs[f"{copy} warm"].append(epoch_gbps(loader, 2 * turn + 1))
    return dict(hidden_size=hidden, runs=runs, disk_gbps=statistics.median(disk))


def netfs_case(data: str, hidden: int, workers: int, repeat: int, latency_ms: float, mountpoint: str) -> dict:
    from hs_connectors import FileTransfer
    from slowfs_process import SlowFs

    cache = os.path.join(data, "hidden_states")
    warm_page_cache(cache)  # slowfs's own reads of the backing files cost nothing: only its model
    runs: dict[str, list[dict]] = {f"{copy} {kind}": [] for copy in COPIES for kind in ("cold", "warm")}
    # The loaders are built over a mount without latency; each epoch pair gets a fresh slow mount.
    with SlowFs(cache, mountpoint):
        loaders = {copy: make_loader(copy, loader_args(data, hidden, workers, 0.0, FileTransfer(Path(mountpoint))))
                   for copy in COPIES}
    for turn in range(repeat):
        for copy, loader in loaders.items():
            with SlowFs(cache, mountpoint, latency_ms=latency_ms, sigma=0.3) as fs:
                for kind in ("cold", "warm"):
                    fs.reset_stats()
                    r = epoch_gbps(loader, turn)
                    r["getattr"] = fs.stats()["calls"].get("getattr", 0)
                    runs[f"{copy} {kind}"].append(r)
    return dict(hidden_size=hidden, latency_ms=latency_ms, runs=runs)


# ---------------------------------------------------------------- the report
def tables(results: dict) -> list[tuple[str, tuple, list[tuple]]]:
    out = []
    rows = []
    for w in results["warm"]:
        r, b = w["runs"], w["bounds"]
        rows.append((w["hidden_size"], f"{median(r['map']):.2f}", f"{median(r['read']):.2f}",
                     f"{median(r['read']) / median(r['map']):.2f}", f"{median(r['map+noise']):.2f}",
                     f"{median(r['read+noise']):.2f}", f"{median(r['read+noise']) / median(r['map+noise']):.2f}",
                     f"{b['memcpy']:.2f}", f"{b['pread']:.2f}"))
    out.append(("Warm page cache (GB/s)", ("H", "map", "read", "read / map", "map+noise", "read+noise",
                                           "read / map (noise)", "verify memcpy", "verify pread"), rows))
    c = results["cold"]
    rows = []
    for kind in ("cold", "warm"):
        m, r = c["runs"][f"map {kind}"], c["runs"][f"read {kind}"]
        rows.append((kind, c["hidden_size"], f"{median(m):.2f}", f"{median(r):.2f}", f"{median(r) / median(m):.2f}",
                     f"{median(m, 'cpu_seconds') / median(m, 'seconds'):.2f}",
                     f"{median(r, 'cpu_seconds') / median(r, 'seconds'):.2f}"))
    out.append((f"Local disk: an epoch with the files evicted before it, then a warm one (GB/s; the disk's own "
                f"bound {c['disk_gbps']:.2f} GB/s, at most "
                f"{max(r['resident_before'] for k, v in c['runs'].items() if 'cold' in k for r in v):.1%} "
                "resident before a cold epoch)",
                ("epoch", "H", "map", "read", "read / map", "cores map", "cores read"), rows))
    n = results.get("netfs")
    if n:
        rows = []
        for kind in ("cold", "warm"):
            m, r = n["runs"][f"map {kind}"], n["runs"][f"read {kind}"]
            rows.append((kind, f"{median(m):.3f}", f"{median(r):.3f}", f"{median(r) / median(m):.2f}",
                         int(median(m, "getattr")), int(median(r, "getattr"))))
        out.append((f"slowfs, {n['latency_ms']} ms per open, lookup and first read (GB/s)",
                    ("epoch", "map", "read", "read / map", "GETATTR map", "GETATTR read"), rows))
    return out


def markdown(results: dict, tabs: list) -> str:
    lines = [f"Measured at commit `{results['commit']}`{' (with uncommitted changes)' if results['dirty'] else ''}.  ",
             f"Command: `{results['command']}` ({results['minutes']:.1f} minutes).  ",
             f"Machine: {results['machine']}; load average {results['load'][0]:.2f} at the start, "
             f"{results['load'][1]:.2f} at the end.  ",
             f"Date: {results['date']}.", "",
             "`bench/bench_cache_copy.py` (its docstring says what each case measures). \"map\": the drop-in's rows "
             "copied from each cache file's mapping; \"read\": the same drop-in with DRAFTFEED_CACHE_COPY=read, "
             "the rows read through the file's descriptor. Medians over the turns; ratios above 1 favour the read.",
             ""]
    for title, headers, rows in tabs:
        lines += [f"**{title}**", "", "| " + " | ".join(headers) + " |",
                  "|" + "|".join([":---"] + ["---:"] * (len(headers) - 1)) + "|"]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        lines.append("")
    return "\n".join(lines)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def main() -> None:
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden-sizes", type=ints, default=[1024, 4096])
    p.add_argument("--gb", type=float, default=2.5, help="GB of cache files per H (warm and cold cases)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--netfs-rows", type=int, default=800, help="0: no netfs case")
    p.add_argument("--latency-ms", type=float, default=10.0)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "draftfeed_bench_cache_copy"))
    p.add_argument("--name", default="cache_copy")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args()
    cli = cli_path()
    start = time.time()
    load_start = os.getloadavg()[0]
    results: dict = dict(warm=[])
    for hidden in args.hidden_sizes:
        # Rows of 256-2048 tokens, 4 layers of bf16: about 1150 x 8 x H bytes a file on average.
        rows = max(20, int(args.gb * 1e9 / (1150 * 8 * hidden)))
        data = os.path.join(args.data, f"h{hidden}_r{rows}")
        make_cached_dataset(data, rows=rows, hidden_size=hidden)
        results["warm"].append(warm_case(data, hidden, args.workers, args.repeat, cli))
        if hidden == args.hidden_sizes[0]:
            results["cold"] = cold_case(data, rows, hidden, args.workers, args.repeat)
    if args.netfs_rows:
        from slowfs_process import slowfs_unavailable

        reason = slowfs_unavailable()
        if reason:
            print(f"netfs: skipped ({reason})")
        else:
            data = os.path.join(args.data, f"netfs_r{args.netfs_rows}")
            make_cached_dataset(data, rows=args.netfs_rows, hidden_size=1024, min_len=32, max_len=128)
            with tempfile.TemporaryDirectory(prefix="cache_copy_mnt_") as mnt:
                results["netfs"] = netfs_case(data, 1024, args.workers, args.repeat, args.latency_ms, mnt)
    import torch

    results.update(
        commit=git("rev-parse", "--short", "HEAD"), dirty=bool(git("status", "--porcelain", "--untracked-files=no")),
        command="python bench/bench_cache_copy.py " + " ".join(sys.argv[1:]),
        minutes=(time.time() - start) / 60, load=(load_start, os.getloadavg()[0]),
        machine=f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, Linux {platform.release()}, "
                f"Python {platform.python_version()}, torch {torch.__version__}",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), workers=args.workers,
        repeat=args.repeat)
    tabs = tables(results)
    for title, headers, rows in tabs:
        print(f"\n{title}")
        print_table(rows, headers)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"{args.name}.json").write_text(json.dumps(results, indent=2))
    Path(args.out, f"{args.name}.md").write_text(markdown(results, tabs))


if __name__ == "__main__":
    main()
