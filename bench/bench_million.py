"""A million files: what grows with the dataset's rows and the cache's files, measured.

    python bench/bench_million.py [--rows 10000000] [--files 1000000] [--data DIR] [--keep] [--json]

Each measurement runs in a fresh process (its memory is its own), on data written once under --data:
  * a dataset of --rows rows (1-8 tokens each: the rows, not the tokens, are what is counted) written
    by `draftfeed synth`:
      - open: `draftfeed.open_dataset` and every row's length (what a loader needs to plan);
      - plan: one rank's plan of every row (8 ranks, total_seq_len 8192): `draftfeed.plan_batches`,
        the planner the drop-in's batch sampler runs each epoch;
  * a dataset of --files rows and its cache, one tiny file per row (1-4 tokens, H=8, 2 layers: about
    200 bytes each, 4 KB on disk), flat (`hs_<row>.safetensors` in one folder), then the same files
    moved into draftfeed's sharded layout (`<row // 1000>/hs_<row>.safetensors`):
      - first batch: a `draftfeed.Loader` (2 threads) created, its epoch started, the first batch in
        hand; then the rest of the epoch, for scale;
      - verify: `draftfeed verify --threads 2` over every file.
The files stay in the page cache (just written): this measures what grows with their number (the
plan, the prefetch's bookkeeping, per-file system calls), not the disk. Memory: the process's peak
anonymous memory above an idle process that imported draftfeed (VmHWM minus file-backed pages is not
available after the fact, so RssAnon is sampled every 20 ms), per row or per file. Files are removed
at the end unless --keep (they take about 8 GB for 10^6 files in both layouts at 4 KB a file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_common import cli_path, machine, print_table, save_results  # noqa: E402


def rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


class PeakAnon:
    """Samples RssAnon every 20 ms; `peak` is the largest seen."""

    def __init__(self) -> None:
        self.peak = rss_anon_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon_mb())
            self._stop.wait(0.02)

    def __enter__(self) -> PeakAnon:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon_mb())


# ---------------------------------------------------------------- measurements (each in its own process)
def measure(what: str, args: dict) -> dict:
    import draftfeed

    base = rss_anon_mb()
    out: dict = {}
    with PeakAnon() as memory:
        start = time.perf_counter()
        if what == "open":
            dataset = draftfeed.open_dataset(args["data"])
            lengths = dataset.seq_lens()
            out["rows"] = len(lengths)
        elif what == "plan":
            lengths = draftfeed.open_dataset(args["data"]).seq_lens()
            opened = time.perf_counter()
            out["open_seconds"] = opened - start
            start = opened
            batches = draftfeed.plan_batches(lengths, 8192, 8, 0, epoch=0, seed=0)
            out["rows"] = int(sum(len(b) for b in batches))
            out["batches"] = len(batches)
        elif what == "first_batch":
            loader = draftfeed.Loader(args["data"], hidden_size=8, num_target_layers=1, total_seq_len=8192,
                                      hidden_states_path=args["cache"], num_threads=2, split="all",
                                      pin_memory=False)
            iterator = iter(loader)
            batch = next(iterator)
            out["first_batch_seconds"] = time.perf_counter() - start
            tokens = int((batch["document_ids"] >= 0).sum())
            for batch in iterator:
                tokens += int((batch["document_ids"] >= 0).sum())
            out["tokens"] = tokens
            out["rows"] = int(loader.split_end - loader.split_begin)
            loader.close()
        out["seconds"] = time.perf_counter() - start
    out["anon_mb"] = memory.peak - base
    return out


def run_measure(what: str, args: dict, timeout: float) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--measure", what, "--args", json.dumps(args)],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_verify(data: str, cache: str, timeout: float) -> dict:
    # The peak RSS of this child alone (wait4's rusage; RUSAGE_CHILDREN is the largest of all the
    # children so far, here the Python measurements before it).
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([cli_path(), "verify", data, "--hidden-states", cache, "--threads", "2", "--json"],
                                stdout=out, stderr=subprocess.DEVNULL)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        seconds = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"verify of {cache} failed (status {status})")
        out.seek(0)
        report = json.loads(out.read())
    return dict(seconds=seconds, ok=report["ok"], missing=report["missing"], layouts=report["layouts"],
                peak_rss_mb=usage.ru_maxrss / 1024)


# ---------------------------------------------------------------- data
def synth(out: str, rows: int, *extra: str) -> None:
    if (Path(out) / ".done").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([cli_path(), "synth", out, "--rows", str(rows), *extra], check=True, capture_output=True,
                   timeout=7200)
    (Path(out) / ".done").write_text("")


def to_sharded(flat: str, sharded: str) -> None:
    """Moves the flat cache's files into the sharded layout (renames: no data copied)."""
    if (Path(sharded) / ".done").exists():
        return
    os.makedirs(sharded, exist_ok=True)
    made = set()
    with os.scandir(flat) as entries:
        names = [e.name for e in entries if e.name.startswith("hs_")]
    for name in names:
        row = int(name[3:-len(".safetensors")])
        folder = os.path.join(sharded, f"{row // 1000:04d}")
        if folder not in made:
            os.makedirs(folder, exist_ok=True)
            made.add(folder)
        os.rename(os.path.join(flat, name), os.path.join(folder, name))
    (Path(sharded) / ".done").write_text("")


# ---------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--files", type=int, default=1_000_000)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "draftfeed_bench_million"))
    p.add_argument("--keep", action="store_true", help="keep the data (else removed at the end)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--measure", help=argparse.SUPPRESS)
    p.add_argument("--args", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, json.loads(args.args))))
        return

    results: dict = dict(machine=machine(), command="python bench/bench_million.py " + " ".join(sys.argv[1:]),
                         rows=args.rows, files=args.files)
    started = time.perf_counter()
    big = os.path.join(args.data, f"rows_{args.rows}")
    synth(big, args.rows, "--min-len", "1", "--max-len", "8")
    results["open"] = run_measure("open", {"data": big}, args.timeout)
    results["plan"] = run_measure("plan", {"data": big}, args.timeout)
    print(f"{args.rows:,} rows: open {results['open']['seconds']:.2f} s, plan {results['plan']['seconds']:.2f} s",
          flush=True)

    data = os.path.join(args.data, f"files_{args.files}")
    flat, sharded = os.path.join(data, "hidden_states"), os.path.join(data, "sharded")
    made = time.perf_counter()
    synth(data, args.files, "--min-len", "1", "--max-len", "4", "--hidden-size", "8", "--layers", "2")
    results["write_seconds"] = time.perf_counter() - made
    for layout, cache in (("flat", flat), ("sharded", sharded)):
        if layout == "sharded":
            moved = time.perf_counter()
            to_sharded(flat, sharded)
            results["move_seconds"] = time.perf_counter() - moved
        results[f"first_batch_{layout}"] = run_measure("first_batch", {"data": data, "cache": cache}, args.timeout)
        results[f"verify_{layout}"] = run_verify(data, cache, args.timeout)
        fb, v = results[f"first_batch_{layout}"], results[f"verify_{layout}"]
        print(f"{args.files:,} files, {layout}: first batch {fb['first_batch_seconds']:.2f} s, epoch "
              f"{fb['seconds']:.1f} s, verify {v['seconds']:.1f} s ({v['ok']:,} ok)", flush=True)
    results["seconds"] = time.perf_counter() - started
    if not args.keep:
        shutil.rmtree(args.data, ignore_errors=True)

    rows = [
        (f"open a dataset of {args.rows:,} rows and its lengths", f"{results['open']['seconds']:.2f}",
         f"{results['open']['anon_mb']:.0f}", f"{results['open']['anon_mb'] * 1e6 / args.rows:.1f} B/row"),
        (f"one rank's plan of {args.rows:,} rows (8 ranks; open excluded)", f"{results['plan']['seconds']:.2f}",
         f"{results['plan']['anon_mb']:.0f}", f"{results['plan']['anon_mb'] * 1e6 / args.rows:.1f} B/row"),
    ]
    for layout in ("flat", "sharded"):
        fb, v = results[f"first_batch_{layout}"], results[f"verify_{layout}"]
        rows.append((f"first batch, cache of {args.files:,} files, {layout} (Loader created, epoch started)",
                     f"{fb['first_batch_seconds']:.2f}", f"{fb['anon_mb']:.0f}",
                     f"{fb['anon_mb'] * 1e6 / args.files:.1f} B/file"))
        rows.append((f"  the whole epoch of {args.files:,} files, {layout}", f"{fb['seconds']:.1f}", "", ""))
        rows.append((f"verify of {args.files:,} files, {layout} (2 threads)", f"{v['seconds']:.1f}",
                     f"{v['peak_rss_mb']:.0f}",
                     f"{v['peak_rss_mb'] * 2**20 / args.files:.1f} B/file (whole RSS)"))
    results["table"] = rows
    print()
    print(f"A million files ({machine()})")
    print_table(rows, ("what", "seconds", "peak memory MB (anonymous; verify: RSS)", "per row / file"))
    print(f"{results['seconds']:.0f} s (writing {results['write_seconds']:.0f} s of it)")
    save_results(args.out, "million.json", results, args.json)


if __name__ == "__main__":
    main()
