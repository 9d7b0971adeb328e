"""A hidden-state cache on a network file system, through tools/slowfs (every open, lookup, listing and
first read a round trip): the loader keeps enough files in flight that an epoch costs about one
round trip, not one per file; it opens each file once, lists no folder; and a file whose open takes
seconds holds back only its own batch. Skipped, saying why, where FUSE cannot mount."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from conftest import cli_path
from page_cache_hold import pages_held
from slowfs_process import SlowFs, slowfs_unavailable

pytestmark = [pytest.mark.timeout(180)]

ROWS, HIDDEN, MAX_LEN = 240, 64, 512


@pytest.fixture(scope="module", autouse=True)
def needs_fuse():
    reason = slowfs_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A synthetic dataset and its cache: 240 rows of 8-64 tokens, H=64, 4 layers (2-16 KB files)."""
    path = tmp_path_factory.mktemp("netfs") / "data"
    subprocess.run([cli_path(), "synth", str(path), "--rows", str(ROWS), "--min-len", "8", "--max-len", "64",
                    "--hidden-size", str(HIDDEN), "--layers", "4"], check=True, capture_output=True, timeout=120)
    return path


def loader(data: Path, hidden_states: Path, **options) -> draftfeed.Loader:
    return draftfeed.Loader(data, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=hidden_states,
                            num_threads=2, prefetch=4, pin_memory=False, **options)


def epoch(load: draftfeed.Loader, number: int = 0, on_batch=None) -> tuple[float, list[dict], list[float]]:
    """Seconds, the batches (copied), and when each arrived; `on_batch(n)` is called once the n-th
    batch has arrived (n from 1)."""
    load.set_epoch(number)
    start = time.perf_counter()
    batches, times = [], []
    for batch in load:
        assert batch is not None
        times.append(time.perf_counter() - start)
        batches.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        if on_batch is not None:
            on_batch(len(batches))
    return time.perf_counter() - start, batches, times


def cache_files(fs: SlowFs) -> list[Path]:
    """The cache's files as the loader sees them: through the mount."""
    return sorted(Path(fs.mountpoint).glob("hs_*.safetensors"))


def test_an_epoch_costs_a_few_round_trips_not_one_per_file(data, tmp_path):
    local = loader(data, data / "hidden_states")
    _, expected, _ = epoch(local)
    local.close()
    files = sum(len(b) for b in local.batch_sampler._generate_batches(0))
    with SlowFs(data / "hidden_states", tmp_path / "mnt", latency_ms=20, sigma=0) as fs:
        remote = loader(data, Path(fs.mountpoint))
        fs.reset_stats()
        _, batches, _ = epoch(remote)
        cold = fs.stats()
        cold_hedged = remote.metrics()["read_ahead_memory"]["hedges"]
        with pages_held(cache_files(fs)):  # the machine's own reclaim is not the loader's doing
            fs.reset_stats()
            _, warm, _ = epoch(remote)
            warm_stats = fs.stats()
        warm_hedged = remote.metrics()["read_ahead_memory"]["hedges"] - cold_hedged
        remote.close()
    assert len(batches) == len(expected) == len(warm)
    for ours, ref, again in zip(batches, expected, warm):
        for key in ref:
            assert torch.equal(ours[key], ref[key]) and torch.equal(again[key], ref[key]), key
    # Each file: its lookup (paid by its open), its open and its first read, 60 ms in a row; 216
    # files one after another would take 13 s, two at a time 6.5 s. In flight by the dozen: about
    # the round trips of one file. Counted where they wait (slowfs's replies held back at once), not
    # timed: a loaded machine stretches the epoch, not the count.
    assert cold["max_waiting"] >= 16, cold
    assert warm_stats["max_waiting"] >= 16, warm_stats
    for stats, hedged in ((cold, cold_hedged), (warm_stats, warm_hedged)):
        calls = stats["calls"]
        # Each file opened once, not again to read it; an open that looked stalled (a loaded
        # machine delays slowfs's replies too) may have been asked again (hedged), no more.
        assert files <= calls["open"] <= files + hedged, f"{calls}, {hedged} hedged"
        assert calls.get("opendir", 0) == 0 and calls.get("readdir", 0) == 0, f"a folder was listed: {calls}"
        # The lock protocol's check of each file: one lookup of its lock file per ask, nothing more,
        # and the epoch start's one look for a pack's manifest (a pack written since is followed).
        assert calls.get("missing_lookup", 0) <= files + hedged + 1, f"{calls}, {hedged} hedged"
    assert cold["read_bytes"] >= sum(os.path.getsize(data / "hidden_states" / f"hs_{r}.safetensors")
                                     for b in remote.batch_sampler._generate_batches(0) for r in b)
    assert warm_stats["read_bytes"] == 0, "the warm epoch read its files from the page cache"


@pytest.mark.parametrize("where, in_order", [("last", False), ("first", True)])
def test_a_file_stuck_for_seconds_holds_back_only_its_batch(data, tmp_path, where, in_order):
    plan = loader(data, data / "hidden_states").batch_sampler._generate_batches(0)
    stuck_batch = len(plan) - 1 if where == "last" else 0
    stuck_row = int(plan[stuck_batch][0])  # the train split begins at row 0
    stall = 2.0
    files = sum(len(b) for b in plan)
    # slowfs's counters when the first batch came, and when every batch but the stuck one had.
    at: dict[int, dict] = {}
    watched = (1, len(plan) - 1)
    with SlowFs(data / "hidden_states", tmp_path / "mnt", latency_ms=10, sigma=0,
                slow={f"hs_{stuck_row}.safetensors": stall}) as fs:
        load = loader(data, Path(fs.mountpoint), in_order=in_order)
        seconds, batches, times = epoch(
            load, on_batch=lambda n: at.update({n: fs.stats()}) if n in watched else None)
        load.close()
    assert len(batches) == len(plan)
    assert seconds >= stall
    assert seconds < stall + 30, f"epoch {seconds:.2f} s with one open of {stall} s"  # hang guard
    if where == "last":
        # As ready: every other batch came while the stuck file was still opening (its open's
        # reply still held back by slowfs, counted, not timed).
        assert at[len(plan) - 1]["waiting"] >= 1, at[len(plan) - 1]
    else:
        # In order: the first batch waited for it; meanwhile every other file of the epoch was
        # opened (counted by slowfs when the first batch came, not timed), so the stall is paid
        # once, not after the other batches' work.
        assert times[0] >= stall, times
        assert at[1]["calls"]["open"] >= files, at[1]["calls"]


def test_fetches_waiting_for_stuck_opens_do_not_stop_the_other_batches(data, tmp_path):
    """Two batches' files stuck (as many as the loader's threads): the fetches waiting for them have
    threads of their own on a network file system, so every other batch still comes meanwhile
    (were the pipeline's two threads to wait, nothing would come until the stall ended)."""
    plan = loader(data, data / "hidden_states").batch_sampler._generate_batches(0)
    stuck = [int(plan[0][0]), int(plan[1][0])]
    stall = 3.0
    others: dict = {}  # slowfs's counters once every batch but the two stuck ones came
    with SlowFs(data / "hidden_states", tmp_path / "mnt", latency_ms=5, sigma=0,
                slow={f"hs_{row}.safetensors": stall for row in stuck}) as fs:
        load = loader(data, Path(fs.mountpoint), in_order=False)
        seconds, batches, times = epoch(
            load, on_batch=lambda n: others.update(fs.stats()) if n == len(plan) - 2 else None)
        load.close()
    assert len(batches) == len(plan)
    assert seconds >= stall
    # Both stuck opens were still held back by slowfs then (counted, not timed).
    assert others["waiting"] >= 2, f"batches came only after the stall: {others}, {times}"


def getattr_round_trips(stats: dict, latency_ms: float) -> int:
    """slowfs's attribute reads answered late (sigma=0: each waits exactly `latency_ms`)."""
    return round(stats["delayed_seconds"].get("getattr", 0.0) / (latency_ms / 1000))


@pytest.mark.parametrize("copy", ["auto", "read"])
def test_the_copy_asks_the_server_nothing(data, tmp_path, monkeypatch, copy):
    """On NFS (and FUSE with auto_inval_data) a read() of a file whose cached attributes are older than
    the attribute timeout asks the server for them first, even when its bytes are in the page cache;
    a page fault on a mapping of them does not. On a network file system the loader copies the rows
    from the mapping (CacheCopy auto: statfs says FUSE), so the only attribute reads of a warm epoch
    are the open's, one per file. Here the timeout is 0 (NFS's noac): every attribute read is a round
    trip. Reading the rows (`read`, as on a local disk) asks once more per read."""
    monkeypatch.setenv("DRAFTFEED_CACHE_COPY", copy)
    local = loader(data, data / "hidden_states")
    _, expected, _ = epoch(local)
    local.close()
    files = sum(len(b) for b in local.batch_sampler._generate_batches(0))
    latency = 5
    with SlowFs(data / "hidden_states", tmp_path / "mnt", latency_ms=latency, sigma=0, attr_timeout=0) as fs:
        remote = loader(data, Path(fs.mountpoint))
        epoch(remote)  # cold: the files come into the page cache
        cold_hedged = remote.metrics()["read_ahead_memory"]["hedges"]
        with pages_held(cache_files(fs)):  # and stay there (see page_cache_hold)
            fs.reset_stats()
            _, warm, _ = epoch(remote)
            stats = fs.stats()
        hedged = remote.metrics()["read_ahead_memory"]["hedges"] - cold_hedged
        remote.close()
    assert len(warm) == len(expected)
    for ours, ref in zip(warm, expected):
        for key in ref:
            assert torch.equal(ours[key], ref[key]), key
    # One open per file, and one more per open asked again (a loaded machine delays slowfs's replies
    # too, so some opens look stalled and are hedged).
    assert files <= stats["calls"]["open"] <= files + hedged and stats["read_bytes"] == 0, (hedged, stats)
    trips = getattr_round_trips(stats, latency)
    if copy == "auto":
        assert files <= trips <= files + hedged, f"{trips} attribute round trips for {files} files (one an open), " \
                                                 f"{hedged} opens hedged: {stats}"
    else:
        # Each file's rows (2-16 KB) in one read: one attribute round trip more per file.
        assert trips >= 2 * files, f"{trips} attribute round trips for {files} files: {stats}"
