"""End-to-end copy rate of the drop-in against what the machine allows, at several hidden sizes.

    python bench/bench_copy_bound.py [--hidden-sizes 1024,2048,4096] [--rows 500] [--workers 2] [--out DIR]

For each H: 500 rows of the synthetic data (256-2048 tokens, 3 captured layers + the last, bf16),
the cache in page cache, the drop-in `create_train_val_loaders` with num_workers = 2 and
total_seq_len 8192, without noise and with uniform noise (std 0.05). In one process, in turns (so
load on the machine falls on every figure alike), repeated `--repeat` times after a warm-up:
  - a warm epoch of each loader (GB/s of hidden states delivered);
  - the **plain resident memcpy**: a torch copy of 1 GiB of resident bf16 with torch's threads set
    to the worker count (what the machine's memory allows when nothing but a copy runs);
  - the **file-read bound**: `draftfeed verify --baseline pread --threads W`, every cache file read
    through its descriptor into a 64 MiB ring of destinations (the kernel's copy out of the page
    cache: the most a reader through read() reaches);
  - the same drop-in reading the rows through each file's descriptor ("(read)": DRAFTFEED_CACHE_COPY=read)
    instead of copying them from the file's mapping (its default). Which is faster depends on the
    machine: a read scatters a token's layers with one small iovec each and pays the kernel's
    per-folio work; a mapping pays page faults (one per 2 MiB where the page cache holds the file in
    2 MiB folios: a file written, or read, in large pieces) and TLB shootdowns.
Medians over the repeats. The ratios say how close the loader comes to each bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_common import make_cached_dataset, time_epoch, warm_page_cache

NOISE_STD = 0.05


def loader_args(path: str, hidden: int, workers: int, noise_std: float) -> dict:
    return dict(
        data_path=path, total_seq_len=8192, hidden_states_dtype=torch.bfloat16, noise_std=noise_std,
        transfer=None, vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip", verifier_name_or_path=None,
        request_timeout=1.0, max_retries=0, hidden_size=hidden, num_target_layers=3, num_workers=workers,
        prefetch_factor=4, preprocess=None, train_data_ratio=0.9,
    )


def torch_copy_gbps(src: torch.Tensor, dst: torch.Tensor) -> float:
    start = time.perf_counter()
    dst.copy_(src)
    return src.numel() * src.element_size() / (time.perf_counter() - start) / 1e9


def pread_bound_gbps(cli: str, data: str, threads: int) -> float:
    out = subprocess.run([cli, "verify", data, "--threads", str(threads), "--baseline", "pread", "--json"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    result = json.loads(out)
    if result["ok"] != result["rows"]:
        raise SystemExit(f"draftfeed verify --baseline pread {data}: {result['ok']} of {result['rows']} files read")
    return result["gb_per_s"]


def measure(path: str, hidden: int, workers: int, repeat: int, cli: str) -> dict:
    from draftfeed.speculators import create_train_val_loaders

    torch.set_num_threads(workers)
    src = torch.ones(1 << 29, dtype=torch.bfloat16)  # 1 GiB, resident
    dst = torch.zeros_like(src)
    loaders = {}
    # The loader's own choice (the rows copied from each file's mapping), and the same loader reading
    # them through the file's descriptor instead (DRAFTFEED_CACHE_COPY=read; see --help).
    for suffix, copy in (("", None), (" (read)", "read")):
        before = os.environ.pop("DRAFTFEED_CACHE_COPY", None)
        if copy is not None:
            os.environ["DRAFTFEED_CACHE_COPY"] = copy
        try:
            loaders["draftfeed" + suffix] = create_train_val_loaders(**loader_args(path, hidden, workers, 0.0))[0]
            loaders["draftfeed+noise" + suffix] = create_train_val_loaders(
                **loader_args(path, hidden, workers, NOISE_STD))[0]
        finally:
            os.environ.pop("DRAFTFEED_CACHE_COPY", None)
            if before is not None:
                os.environ["DRAFTFEED_CACHE_COPY"] = before
    runs: dict[str, list[float]] = {"memcpy": [], "pread": [], **{name: [] for name in loaders}}
    epochs: dict[str, list[dict]] = {name: [] for name in loaders}
    for turn in range(repeat + 1):  # turn 0 warms up every path
        runs["memcpy"].append(statistics.median(torch_copy_gbps(src, dst) for _ in range(3)))
        runs["pread"].append(pread_bound_gbps(cli, path, workers))
        for name, loader in loaders.items():
            loader.batch_sampler.set_epoch(turn)
            r = time_epoch(loader)
            runs[name].append(r["hidden_bytes"] / r["seconds"] / 1e9)
            epochs[name].append(r)
    return dict(
        hidden_size=hidden, workers=workers,
        gb_per_s={name: statistics.median(values[1:]) for name, values in runs.items()},
        runs=runs, batches=epochs["draftfeed"][-1]["batches"],
        hidden_bytes=epochs["draftfeed"][-1]["hidden_bytes"],
    )


def main() -> None:
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden-sizes", type=ints, default=[1024, 2048, 4096])
    p.add_argument("--rows", type=int, default=500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "draftfeed_bench_copy_bound"))
    p.add_argument("--cli", default=os.environ.get("DRAFTFEED_CLI", "draftfeed"))
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--hidden", type=int, help=argparse.SUPPRESS)  # one H, in its own process
    args = p.parse_args()

    if args.hidden:
        path = os.path.join(args.data, f"h{args.hidden}")
        print(json.dumps(measure(path, args.hidden, args.workers, args.repeat, args.cli)))
        return
    results = []
    for hidden in args.hidden_sizes:
        path = os.path.join(args.data, f"h{hidden}")
        make_cached_dataset(path, rows=args.rows, hidden_size=hidden)
        warm_page_cache(path)
        # Each H in its own process: the loaders' threads and buffers of one do not weigh on the next.
        out = subprocess.run([sys.executable, __file__, "--hidden", str(hidden), "--workers", str(args.workers),
                              "--repeat", str(args.repeat), "--data", args.data, "--cli", args.cli],
                             capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise SystemExit(f"H={hidden}: exit status {out.returncode}\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        g = r["gb_per_s"]
        print(f"H={hidden}: draftfeed {g['draftfeed']:.2f} GB/s, +noise {g['draftfeed+noise']:.2f}, "
              f"memcpy {g['memcpy']:.2f}, file-read bound {g['pread']:.2f}: "
              f"{g['draftfeed'] / g['memcpy']:.0%} / {g['draftfeed+noise'] / g['memcpy']:.0%} of memcpy, "
              f"{g['draftfeed'] / g['pread']:.0%} / {g['draftfeed+noise'] / g['pread']:.0%} of the read bound; "
              f"read copy {g['draftfeed (read)'] / g['memcpy']:.0%} / {g['draftfeed+noise (read)'] / g['memcpy']:.0%}"
              " of memcpy",
              flush=True)
        results.append(r)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "copy_bound.json"), "w") as f:
        json.dump(dict(rows=args.rows, workers=args.workers, repeat=args.repeat, results=results), f, indent=2)


if __name__ == "__main__":
    main()
