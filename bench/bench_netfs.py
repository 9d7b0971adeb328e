"""Caches on network file systems: cold and warm epochs through a slow file system (tools/slowfs: every
open, lookup, listing and first read of a file answered late, with a heavy tail, and a bandwidth cap),
the reference and draftfeed side by side, against the file system's own bandwidth bound.

    python bench/bench_netfs.py [--latencies 2,10,50] [--rows 1500] [--bandwidth-mbps 200]
                                [--tail 0.01:2:3] [--tail-pairs 20] [--workers 2] [--ref-batches 2:4,10:2,50:1]
                                [--out DIR] [--json] [--quick]

The data: a synthetic dataset of --rows rows (32-128 tokens) and its bf16 cache, H = --hidden-size
(1024), 4 layers: files of 0.25-1 MB, so that the round trips, not the bytes, are what a reader waits
for. The cache folder is mounted through slowfs; the dataset itself stays on the local disk (a
trainer maps it once). slowfs's latencies are lognormal around the median of the latency being
measured (open, lookup, first read of a file), with --tail (1% of opens at 2-3 s by default), and
reads share --bandwidth-mbps.

For each median latency:
  * bound: a fresh mount (a cold client), then a parallel read of every file of the training split
    through it (512 threads, each opening and reading whole files): what the file system gives any
    reader (cold); then the same again (warm: the data in the client's page cache, the opens still
    round trips). Measured right before draftfeed's epochs, on the same mount settings;
  * draftfeed, the whole epoch, and both sides on the first K batches of the same epoch (--ref-batches:
    the reference at 50 ms would need minutes for the whole split), each in its own process through
    their `create_train_val_loaders` with speculators 0.9.0's trainer's arguments (num_workers =
    --workers, prefetch_factor 4, transfer FileTransfer(the mount)). Each side runs its start-up epoch
    on a mount without latency (worker processes spawned, imports done), then the mount is replaced by
    a fresh slow one (a cold client: nothing cached) and the side runs epoch 1 (cold), then epoch 1
    again (warm: the same batches, its files in the client's page cache; opens still round trips),
    --warm-repeats times (the median epoch is reported).
  * at --tail-latency (10 ms) only: what the tail costs draftfeed: its whole epoch with and without
    the tail, delivered in order and as ready (dataloader_in_order=False), at --tail-bandwidth-mbps
    (60): a cold epoch long enough (15 s) to compare with a 3 s tail, on a fresh mount each; warm
    epochs on one mount (one warm client), the tail switched on and off between them (tail_run). No epoch can end before its slowest
    open returns; what the tail costs is what part of that wait the rest of the epoch cannot cover
    (the read-ahead keeps the file system streaming while a batch waits for a stuck file).
GB/s: bytes of the files an epoch reads over its seconds (the whole split's for the bound and the whole
epoch); the K-batch comparison is in tokens/s (both sides deliver the same batches: checked).
Written to OUT/netfs.json. Needs FUSE (/dev/fuse, libfuse3-dev); where it cannot mount, says why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))
from bench_common import cli_path, machine, parallel_read, print_table, save_results  # noqa: E402
from slowfs_process import SlowFs, slowfs_unavailable  # noqa: E402

MAX_LEN = 8192
MARK = "NETFS "


# ---------------------------------------------------------------- data
def prepare(root: str, rows: int, hidden: int) -> dict:
    data = os.path.join(root, f"netfs_{rows}_h{hidden}", "data")
    marker = Path(data) / ".bench_done"
    spec = dict(rows=rows, hidden_size=hidden, layers=4, min_len=32, max_len=128)
    if not (marker.exists() and json.loads(marker.read_text()) == spec):
        subprocess.run([cli_path(), "synth", data, "--rows", str(rows), "--min-len", "32", "--max-len", "128",
                        "--hidden-size", str(hidden), "--layers", "4"], check=True, capture_output=True,
                       timeout=3600)
        marker.write_text(json.dumps(spec))
    cache = os.path.join(data, "hidden_states")
    names = [f"hs_{i}.safetensors" for i in range(int(rows * 0.9))]  # the training split
    sizes = [os.path.getsize(os.path.join(cache, n)) for n in names]
    # The backing files in the local page cache: slowfs's own reads cost nothing, only its model.
    for name in names:
        with open(os.path.join(cache, name), "rb") as f:
            while f.read(1 << 24):
                pass
    return dict(spec, data=data, cache=cache, names=names, file_bytes=sum(sizes))


# ---------------------------------------------------------------- the mount
class Mount:
    """slowfs at one folder, replaced by a fresh one (a cold client) on demand."""

    def __init__(self, cache: str, mountpoint: str, slow: dict):
        self.cache, self.mountpoint, self.slow = cache, mountpoint, slow
        self.fs: SlowFs | None = None

    def fresh(self, slow: dict | None = None) -> SlowFs:
        self.close()
        self.fs = SlowFs(self.cache, self.mountpoint, **(self.slow if slow is None else slow))
        return self.fs

    def close(self) -> None:
        if self.fs is not None:
            self.fs.stop()
            self.fs = None


def bound(mount: Mount, config: dict, threads: int) -> dict:
    fs = mount.fresh()
    paths = [os.path.join(mount.mountpoint, n) for n in config["names"]]
    cold = parallel_read(paths, threads)
    warm = parallel_read(paths, threads)
    return dict(cold=cold, warm=warm, slowfs=fs.stats())


# ---------------------------------------------------------------- one side, in its own process
def loader_args(config: dict, mountpoint: str, workers: int) -> dict:
    """speculators 0.9.0's trainer's call (tests/python/dropin_helpers.py), the cache on the mount."""
    import torch
    from hs_connectors import FileTransfer

    return dict(
        data_path=config["data"], total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16,
        transfer=FileTransfer(Path(mountpoint)), vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip",
        verifier_name_or_path="unused", request_timeout=120.0, max_retries=3, generation_validation_retries=2,
        max_consecutive_generation_failures=20, hidden_size=config["hidden_size"], num_target_layers=3,
        num_workers=workers, prefetch_factor=4, preprocess=None, train_data_ratio=0.9, seed=42,
    )


def timed_epoch(loader, epoch: int) -> dict:
    import warnings

    loader.batch_sampler.set_epoch(epoch)
    start = time.perf_counter()
    first = None
    tokens = batches = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            tokens += int((batch["document_ids"] >= 0).sum())
            batches += 1
    return dict(seconds=time.perf_counter() - start, first_batch=first, tokens=tokens, batches=batches)


def median_run(runs: list[dict]) -> dict:
    """The run of median seconds, with every run's seconds (a warm epoch of 0.25 s varies by tens of
    percent between runs of one process on a loaded 2-core machine: one run cannot show a 5% cost)."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    return dict(ordered[len(ordered) // 2], runs=[r["seconds"] for r in runs])


def run_side(side: str, config: dict, mountpoint: str, workers: int, batches: int | None, in_order: bool,
             warm_repeats: int = 1, commands: bool = False) -> None:
    args = loader_args(config, mountpoint, workers)
    if batches:
        args["max_train_batches"] = batches
    if side == "reference":
        import speculators.train.dataloader as reference

        make = reference.create_train_val_loaders
    else:
        from draftfeed.speculators import create_train_val_loaders as make

        args["dataloader_in_order"] = in_order
    train, _ = make(**args)
    startup = timed_epoch(train, 0)  # on a mount without latency: spawns the workers
    print(MARK + json.dumps({"startup": startup}), flush=True)
    if commands:
        # Epoch 1 (the same batches) each time the parent asks, on whatever mount it set up.
        while sys.stdin.readline().strip() == "epoch":
            print(MARK + json.dumps(timed_epoch(train, 1)), flush=True)
        return
    if sys.stdin.readline().strip() != "go":  # the parent has mounted a fresh, slow client
        return
    cold = timed_epoch(train, 1)
    # The same batches: their files are in the client's page cache (the opens still round trips).
    warm = median_run([timed_epoch(train, 1) for _ in range(warm_repeats)])
    print(MARK + json.dumps({"cold": cold, "warm": warm}), flush=True)


def read_marked(proc: subprocess.Popen, deadline: float, what: str) -> dict:
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
    finally:
        selector.close()
    proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    raise SystemExit(f"{what}: no result (exit status {proc.poll()}):\n{err[-3000:]}")


@contextlib.contextmanager
def side_process(mount: Mount, config: dict, side: str, *flags: str, workers: int, in_order: bool):
    """One side in its own process, started on a mount without latency (its start-up epoch spawns
    workers and imports, nothing measured); killed on the way out if it has not ended."""
    mount.fresh({})
    proc = subprocess.Popen(
        [sys.executable, __file__, "--side", side, "--config", json.dumps(config), "--mountpoint",
         mount.mountpoint, "--workers", str(workers), *flags, *([] if in_order else ["--as-ready"])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def side_run(mount: Mount, config: dict, side: str, *, workers: int, batches: int | None, in_order: bool,
             slow: dict, timeout: float, warm_repeats: int = 1) -> dict:
    """One side: start-up on a fast mount, then a cold and a warm epoch on a fresh slow one."""
    with side_process(mount, config, side, "--side-batches", str(batches or 0), "--warm-repeats",
                      str(warm_repeats), workers=workers, in_order=in_order) as proc:
        deadline = time.monotonic() + timeout
        startup = read_marked(proc, deadline, f"{side} start-up")
        fs = mount.fresh(slow)  # a cold client
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = read_marked(proc, deadline, f"{side} epochs")
        result.update(startup, slowfs=fs.stats())
        proc.wait(timeout=60)
        return result


def tail_run(mount: Mount, config: dict, *, workers: int, in_order: bool, slow: dict, tail: tuple,
             timeout: float, warm_pairs: int) -> dict:
    """What the tail costs draftfeed, in one process: a cold epoch on a fresh mount without the tail and
    one on a fresh mount with it; then, on that mount (a warm client), one warm epoch not counted, and
    `warm_pairs` pairs of warm epochs, one with the tail and one without, in an order drawn per pair
    (seeded), each started with no reply held back; the median of each side is reported, and the mean
    of the pairs' differences with its standard error. One client for both warm sides: two mounts'
    warm epochs differed by more (0.24 vs 0.29 s without any tail) than the 5% compared. Drawn orders:
    warm epochs here run in a cycle of about four (slowfs's 1 s attribute timeout: every fourth or so
    pays the lookups again), which a fixed ABBA order turned into a +5-7% "cost" with the tail off on
    both sides."""
    with side_process(mount, config, "draftfeed", "--commands", workers=workers, in_order=in_order) as proc:
        assert proc.stdin is not None
        deadline = time.monotonic() + timeout

        def epoch() -> dict:
            proc.stdin.write("epoch\n")
            proc.stdin.flush()
            return read_marked(proc, deadline, "draftfeed tail epoch")

        startup = read_marked(proc, deadline, "draftfeed start-up")
        result: dict = {"without": {"startup": startup}, "with": {"startup": startup}}
        fs = mount.fresh(slow)
        result["without"]["cold"] = epoch()
        result["without"]["slowfs_cold"] = fs.stats()
        fs = mount.fresh(dict(slow, tail=tail))
        result["with"]["cold"] = epoch()
        result["with"]["slowfs_cold"] = fs.stats()
        fs.set_tail(False)
        fs.wait_idle()
        epoch()  # the first warm epoch: the hedges' timing still the cold epoch's
        warm: dict = {"with": [], "without": []}
        draw = random.Random(42)
        for _ in range(warm_pairs):
            for key in (("with", "without") if draw.random() < 0.5 else ("without", "with")):
                fs.set_tail(key == "with")
                fs.wait_idle()
                warm[key].append(epoch())
        for key in ("with", "without"):
            result[key]["warm"] = median_run(warm[key])
        differences = [w["seconds"] - o["seconds"] for w, o in zip(warm["with"], warm["without"])]
        result["warm_paired"] = dict(
            pairs=warm_pairs, mean_difference=statistics.mean(differences),
            standard_error=statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0.0,
            mean_without=statistics.mean(o["seconds"] for o in warm["without"]))
        result["with"]["slowfs"] = fs.stats()
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
        return result


# ---------------------------------------------------------------- the tables
def gbps(config: dict, run: dict) -> float:
    return config["file_bytes"] / run["seconds"] / 1e9


def summarize(results: dict) -> list[tuple]:
    config = results["config"]
    rows = []
    for lat in results["latencies"]:
        for state in ("cold", "warm"):
            b = lat["bound"][state]["gbps"]
            ours = gbps(config, lat["draftfeed"][state])
            ref, same = lat["reference_k"][state], lat["draftfeed_k"][state]
            rows.append((
                f"{lat['latency_ms']:g} ms", state, f"{b:.3f}", f"{ours:.3f}", f"{100 * ours / b:.0f}%",
                f"{lat['batches']}", f"{ref['tokens'] / ref['seconds']:,.0f}",
                f"{same['tokens'] / same['seconds']:,.0f}",
                f"{(same['tokens'] / same['seconds']) / (ref['tokens'] / ref['seconds']):.1f}x",
            ))
    return rows


HEADERS = ("median latency", "epoch", "bound GB/s (just before)", "draftfeed GB/s (whole epoch)",
           "% of bound", "first K batches", "ref tok/s (K)", "draftfeed tok/s (K)", "speed-up")


def tail_rows(results: dict) -> list[tuple]:
    tail = results.get("tail")
    if not tail:
        return []
    rows = []
    for order in ("in order", "as ready"):
        for state in ("cold", "warm"):
            without, with_ = tail[order]["without"][state]["seconds"], tail[order]["with"][state]["seconds"]
            rows.append((f"{tail['latency_ms']:g} ms", f"{tail['bandwidth_mbps']:g}", order, state, f"{without:.2f}",
                         f"{with_:.2f}", f"{100 * (with_ - without) / without:+.0f}%"))
    return rows


TAIL_HEADERS = ("median latency", "MB/s", "delivery", "epoch", "epoch s without tail", "epoch s with tail",
                "tail's cost")


def criteria(results: dict) -> list[str]:
    config = results["config"]
    lines = []
    worst = min((gbps(config, lat["draftfeed"][s]) / lat["bound"][s]["gbps"], f"{lat['latency_ms']:g} ms {s}")
                for lat in results["latencies"] for s in ("cold", "warm"))
    lines.append(f"draftfeed >= 90% of the bound at every latency: lowest {100 * worst[0]:.0f}% ({worst[1]}): "
                 + ("met" if worst[0] >= 0.9 else "NOT met"))
    for lat in results["latencies"]:
        if lat["latency_ms"] == 10:
            speed = [(lat["draftfeed_k"][s]["tokens"] / lat["draftfeed_k"][s]["seconds"])
                     / (lat["reference_k"][s]["tokens"] / lat["reference_k"][s]["seconds"]) for s in ("cold", "warm")]
            lines.append(f">= 5x the reference at 10 ms: cold {speed[0]:.1f}x, warm {speed[1]:.1f}x: "
                         + ("met" if min(speed) >= 5 else "NOT met"))
    tail = results.get("tail")
    if tail:
        for order in ("in order", "as ready"):
            costs = [(tail[order]["with"][s]["seconds"] - tail[order]["without"][s]["seconds"])
                     / tail[order]["without"][s]["seconds"] for s in ("cold", "warm")]
            paired = tail[order].get("warm_paired")
            mean = (f" (warm, mean of {paired['pairs']} pairs' differences: "
                    f"{100 * paired['mean_difference'] / paired['mean_without']:+.1f}% +- "
                    f"{100 * paired['standard_error'] / paired['mean_without']:.1f}% standard error)") if paired else ""
            lines.append(f"a {tail['tail']} tail costs < 5% of the epoch ({order}): cold {100 * costs[0]:+.0f}%, "
                         f"warm {100 * costs[1]:+.0f}% (medians){mean}: " + ("met" if max(costs) < 0.05 else "NOT met"))
    return lines


# ---------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latencies", default="2,10,50", help="median latencies, ms")
    p.add_argument("--rows", type=int, default=1500)
    p.add_argument("--hidden-size", type=int, default=1024)
    p.add_argument("--bandwidth-mbps", type=float, default=200)
    p.add_argument("--tail", default="0.01:2:3", help="P:LOW:HIGH: a share P of opens takes LOW-HIGH seconds")
    p.add_argument("--tail-latency", type=float, default=10, help="median at which the tail's cost is measured")
    p.add_argument("--tail-bandwidth-mbps", type=float, default=60, help="bandwidth of the tail's runs")
    p.add_argument("--tail-pairs", type=int, default=20,
                   help="pairs of warm epochs (with and without the tail) in the tail's runs")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--warm-repeats", type=int, default=5,
                   help="draftfeed's warm epochs per run, the median reported (cold epochs and the reference's once)")
    p.add_argument("--ref-batches", default="2:4,10:2,50:1", help="LATENCY:K: batches of the K-batch comparison")
    p.add_argument("--threads", type=int, default=512, help="threads of the bound's parallel read")
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check that everything runs")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "draftfeed_bench_netfs"))
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--mountpoint", help=argparse.SUPPRESS)
    p.add_argument("--side-batches", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--as-ready", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--commands", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.side:
        run_side(args.side, json.loads(args.config), args.mountpoint, args.workers, args.side_batches or None,
                 not args.as_ready, args.warm_repeats, args.commands)
        return

    reason = slowfs_unavailable()
    if reason is not None:
        result = {"status": "skipped", "reason": reason}
        print(f"netfs: skipped: {reason}")
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "netfs.json").write_text(json.dumps(result, indent=2))
        if args.json:
            print(json.dumps(result))
        return
    if args.quick:
        args.rows, args.latencies, args.ref_batches, args.tail_bandwidth_mbps = 300, "10", "10:1", 200
        args.tail_pairs = 2
    latencies = [float(x) for x in args.latencies.split(",") if x]
    ref_batches = {float(k): int(v) for k, v in (item.split(":") for item in args.ref_batches.split(","))}
    probability, low, high = (float(x) for x in args.tail.split(":"))
    config = prepare(args.data, args.rows, args.hidden_size)
    mountpoint = os.path.join(args.data, "mnt")
    started = time.perf_counter()
    results: dict = dict(status="done", machine=machine(), command="python bench/bench_netfs.py " + " ".join(sys.argv[1:]),
                         config={k: v for k, v in config.items() if k != "names"}, workers=args.workers,
                         bandwidth_mbps=args.bandwidth_mbps, tail=args.tail, tail_latency=args.tail_latency,
                         latencies=[])
    print(f"netfs: {len(config['names'])} files, {config['file_bytes'] / 1e9:.2f} GB per epoch, "
          f"{args.bandwidth_mbps:g} MB/s, tail {args.tail}, {args.workers} workers", flush=True)

    def slow(latency: float, tail: bool = True, bandwidth: float | None = None) -> dict:
        s = dict(latency_ms=latency, bandwidth_mbps=bandwidth or args.bandwidth_mbps)
        if tail:
            s["tail"] = (probability, low, high)
        return s

    mount = Mount(config["cache"], mountpoint, {})
    try:
        for latency in latencies:
            batches = ref_batches.get(latency, min(ref_batches.values()))
            mount.slow = slow(latency)
            lat: dict = dict(latency_ms=latency, batches=batches)
            lat["bound"] = bound(mount, config, args.threads)
            common = dict(workers=args.workers, slow=slow(latency), timeout=args.timeout,
                          warm_repeats=args.warm_repeats)
            lat["draftfeed"] = side_run(mount, config, "draftfeed", batches=None, in_order=True, **common)
            lat["draftfeed_k"] = side_run(mount, config, "draftfeed", batches=batches, in_order=True, **common)
            # The reference's warm epoch once: seconds long, with workers (its noise is not what is compared).
            lat["reference_k"] = side_run(mount, config, "reference", batches=batches, in_order=True,
                                          **dict(common, warm_repeats=1))
            if {lat["draftfeed_k"][s]["tokens"] for s in ("cold", "warm")} != {
                    lat["reference_k"][s]["tokens"] for s in ("cold", "warm")}:
                raise SystemExit(f"{latency} ms: the sides delivered different tokens")
            results["latencies"].append(lat)
            print(f"[{latency:g} ms] bound cold {lat['bound']['cold']['gbps']:.3f} GB/s warm "
                  f"{lat['bound']['warm']['gbps']:.3f}; draftfeed cold {gbps(config, lat['draftfeed']['cold']):.3f} "
                  f"warm {gbps(config, lat['draftfeed']['warm']):.3f}; first {batches} batches: reference "
                  f"{lat['reference_k']['cold']['seconds']:.1f} s / draftfeed {lat['draftfeed_k']['cold']['seconds']:.2f} s "
                  f"cold", flush=True)
            if latency == args.tail_latency:
                tail: dict = dict(latency_ms=latency, tail=args.tail, bandwidth_mbps=args.tail_bandwidth_mbps,
                                  **{"in order": {}, "as ready": {}})
                for order, in_order in (("in order", True), ("as ready", False)):
                    tail[order] = tail_run(mount, config, workers=args.workers, in_order=in_order,
                                           slow=slow(latency, False, args.tail_bandwidth_mbps),
                                           tail=(probability, low, high), timeout=args.timeout,
                                           warm_pairs=args.tail_pairs)
                results["tail"] = tail
                print("[tail] " + "; ".join(
                    f"{order}: {tail[order]['without']['cold']['seconds']:.1f} s without, "
                    f"{tail[order]['with']['cold']['seconds']:.1f} s with" for order in ("in order", "as ready")),
                    flush=True)
    finally:
        mount.close()
    results["seconds"] = time.perf_counter() - started

    print()
    print(f"Caches on a slow file system ({args.bandwidth_mbps:g} MB/s, tail {args.tail}, {args.workers} workers; "
          f"{machine()})")
    print_table(summarize(results), HEADERS)
    if results.get("tail"):
        print()
        print_table(tail_rows(results), TAIL_HEADERS)
    for line in criteria(results):
        print(line)
    print(f"{results['seconds']:.0f} s")
    save_results(args.out, "netfs.json", results, args.json)


if __name__ == "__main__":
    main()
