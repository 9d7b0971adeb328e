"""Shared pieces of the benchmarks: synthetic data, a process-tree memory sampler, the reference's
loaders, and result printing."""

from __future__ import annotations

import json
import os
import platform
import shutil
import threading
import time
import warnings
from pathlib import Path

import draftfeed


def cli_path() -> str:
    """The draftfeed program: DRAFTFEED_CLI, else `draftfeed` on PATH, else the dev build's."""
    path = os.environ.get("DRAFTFEED_CLI") or shutil.which("draftfeed")
    if not path and os.environ.get("DRAFTFEED_DEV_BUILD"):
        path = os.path.join(os.environ["DRAFTFEED_DEV_BUILD"], "draftfeed")
    if not path or not os.path.exists(path):
        raise SystemExit("no draftfeed program: set DRAFTFEED_CLI or put draftfeed on PATH")
    return path


def make_cached_dataset(path: str, *, rows: int, hidden_size: int, layers: int = 4, min_len: int = 256,
                        max_len: int = 2048, seed: int = 0) -> dict:
    """A synthetic dataset and its bf16 hidden-state cache (written once; reused if present)."""
    marker = Path(path) / ".bench_done"
    spec = dict(rows=rows, hidden_size=hidden_size, layers=layers, min_len=min_len, max_len=max_len, seed=seed)
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return spec
    draftfeed.write_synthetic_dataset(path, rows, seed=seed, min_len=min_len, max_len=max_len)
    dataset = draftfeed.open_dataset(path)
    ids = [dataset.row(i)["input_ids"].tolist() for i in range(len(dataset))]
    draftfeed.write_synthetic_hidden_states(
        os.path.join(path, "hidden_states"), ids, seed=seed, hidden_size=hidden_size, layers=layers, dtype="BF16"
    )
    marker.write_text(json.dumps(spec))
    return spec


def warm_page_cache(path: str) -> int:
    """Reads every file once so both sides start with the data in page cache."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while chunk := f.read(1 << 24):
                    total += len(chunk)
    return total


def _tree_rss_bytes(pid: int) -> int:
    """RSS of a process and all its descendants, from /proc."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by this process tree: the process itself, its reaped
    children (os.times), and every live descendant with the children it reaped, from /proc.

    The difference of two calls counts a worker that lived through both, one born in between, and
    one that ended and was reaped in between alike. Spawned DataLoader workers are not reaped until
    the loader is destroyed, so os.times() alone misses all of their work."""
    pid = os.getpid() if pid is None else pid
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    if pid == os.getpid():
        t = os.times()
        total += t.user + t.system + t.children_user + t.children_system
    else:
        total += _proc_cpu_seconds(pid, tick)
    for child in _descendants(pid):
        total += _proc_cpu_seconds(child, tick)
    return total


def _proc_cpu_seconds(pid: int, tick: int) -> float:
    """utime + stime + cutime + cstime of one process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is fields[0], so utime..cstime (stat fields 14-17) are [11:15].
    return sum(int(x) for x in fields[11:15]) / tick


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except OSError:
            continue
    found, stack = [], list(children.get(pid, []))
    while stack:
        p = stack.pop()
        found.append(p)
        stack.extend(children.get(p, []))
    return found


def _tree_pss_bytes(pid: int) -> int:
    """PSS of a process and all its descendants: pages shared between them (torch's libraries in
    every worker, shared-memory batches) are counted once in total, not once per process."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


class TreeMemory:
    """Samples the memory of this process tree every 50 ms: `peak` is the largest RSS sum seen (the
    lead's original figure), `peak_pss` the largest PSS sum (shared pages counted once), `start_pss` the
    PSS when entered (what the process held before: what a loader adds is peak_pss - start_pss)."""

    def __init__(self) -> None:
        self.peak = 0
        self.peak_pss = 0
        self.start_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, _tree_rss_bytes(os.getpid()))
        self.peak_pss = max(self.peak_pss, _tree_pss_bytes(os.getpid()))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.05)

    def __enter__(self) -> TreeMemory:
        self.start_pss = _tree_pss_bytes(os.getpid())
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def time_epoch(loader, *, hidden_keys=("hidden_states", "verifier_last_hidden_states")) -> dict:
    """Iterates one epoch; returns seconds, time to first batch, tokens, hidden-state bytes, CPU s."""
    cpu0 = os.times()
    started_at = time.monotonic()  # CLOCK_MONOTONIC: comparable with a server's timeline
    start = time.perf_counter()
    first = None
    tokens = hidden_bytes = batches = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            batches += 1
            rows = int((batch["document_ids"] >= 0).sum())
            tokens += rows
            for key in hidden_keys:
                if key in batch:
                    t = batch[key]
                    hidden_bytes += rows * t.shape[-1] * t.element_size()
    seconds = time.perf_counter() - start
    cpu1 = os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    cpu += (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    return dict(seconds=seconds, first_batch=first or seconds, tokens=tokens, hidden_bytes=hidden_bytes,
                batches=batches, cpu_seconds=cpu, started_at=started_at)


def reference_train_loader(args: dict):
    """The real speculators entry point (its installed signature) with `args` it accepts."""
    import inspect

    from speculators.train.dataloader import create_train_val_loaders

    accepted = inspect.signature(create_train_val_loaders).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_train_val_loaders(**{k: v for k, v in args.items() if k in accepted})


def machine() -> str:
    return f"{platform.node()}: {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def print_table(rows: list[tuple], headers: tuple) -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))


def parallel_read(paths: list[str], threads: int, chunk: int = 1 << 20) -> dict:
    """Every file of `paths` opened and read whole, sequentially, by `threads` threads (each takes
    the next file): seconds, bytes and GB/s. The bound of a reader that reads each file once."""
    lock, state = threading.Lock(), {"next": 0, "bytes": 0}

    def work() -> None:
        buf, n = bytearray(chunk), 0
        while True:
            with lock:
                i = state["next"]
                state["next"] += 1
            if i >= len(paths):
                break
            with open(paths[i], "rb", buffering=0) as f:
                while k := f.readinto(buf):
                    n += k
        with lock:
            state["bytes"] += n

    start = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(max(1, min(threads, len(paths))))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - start
    return dict(seconds=seconds, bytes=state["bytes"], gbps=state["bytes"] / seconds / 1e9)


def save_results(out: str, name: str, results: dict, print_json: bool) -> None:
    """Writes `results` to OUT/NAME (made if needed) and, with `print_json`, prints it as one line."""
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, name).write_text(json.dumps(results, indent=2))
    if print_json:
        print(json.dumps(results))


METADATA_CALLS = ("open", "lookup", "getattr", "readdir", "opendir")


def metadata_calls(calls: dict) -> dict:
    """slowfs's count of each metadata operation an epoch made (those it made), and their total."""
    return {k: int(calls.get(k, 0)) for k in METADATA_CALLS if k in calls} | {
        "total": int(sum(calls.get(k, 0) for k in METADATA_CALLS))}
