"""Shared pieces of the benchmarks: synthetic data, a process-tree memory sampler, the reference's
loaders, and result printing."""

from __future__ import annotations

import json
import os
import platform
import threading
import time
import warnings
from pathlib import Path

import draftfeed


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
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
        stack.extend(children.get(p, []))
    return total


class TreeMemory:
    """Samples the RSS of this process tree every 50 ms; `peak` is the largest sum seen."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss_bytes(os.getpid()))
            self._stop.wait(0.05)

    def __enter__(self) -> TreeMemory:
        self.peak = _tree_rss_bytes(os.getpid())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def time_epoch(loader, *, hidden_keys=("hidden_states", "verifier_last_hidden_states")) -> dict:
    """Iterates one epoch; returns seconds, time to first batch, tokens, hidden-state bytes, CPU s."""
    cpu0 = os.times()
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
                batches=batches, cpu_seconds=cpu)


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
