"""tools/slowfs, the slow file system the network-file-system tests and benchmarks read through: its
latencies (lookups paid by the next stat or open, opens, listings, first reads), a named file's slow
open, the bandwidth cap, and that it is always unmounted, even when the process that mounted it is
killed. Skipped, saying why, where FUSE cannot mount."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from slowfs_process import SlowFs, cleanup_stale_mounts, slowfs_mounts, slowfs_unavailable

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module", autouse=True)
def needs_fuse():
    reason = slowfs_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    for i in range(8):
        (folder / f"f{i}").write_bytes(bytes([i]) * 100_000)
    (folder / "big").write_bytes(os.urandom(8 << 20))
    return folder


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def wait_until(condition, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def delayed(fs: SlowFs, fn):
    """fn's value and the seconds slowfs held its replies back, by operation (from zero: the counters
    are reset first). What slowfs injected, not the wall time: a loaded machine adds to the latter."""
    fs.reset_stats()
    value = fn()
    return value, fs.stats()["delayed_seconds"]


def test_round_trips_are_answered_late_and_counted(source, tmp_path):
    with SlowFs(source, tmp_path / "mnt", latency_ms=100, sigma=0, attr_timeout=30) as fs:
        mnt = Path(fs.mountpoint)
        # A file never seen: its lookup (answered at once, paid by the stat), one round trip. The
        # wall time is at least the delay (a lower bound holds on a loaded machine); what was
        # delayed, by how much, is slowfs's count.
        seconds, (st, delays) = timed(lambda: delayed(fs, lambda: os.stat(mnt / "f1")))
        assert st.st_size == 100_000 and seconds >= 0.1
        assert delays["lookup_paid"] == pytest.approx(0.1, abs=1e-3), delays
        # Its attributes known now: a second stat is free.
        _, delays = delayed(fs, lambda: os.stat(mnt / "f1"))
        assert sum(delays.values()) == 0, delays
        # An open is always a round trip; the first read of the open file another one.
        seconds, (data, delays) = timed(lambda: delayed(fs, lambda: (mnt / "f1").read_bytes()))
        assert data == bytes([1]) * 100_000 and seconds >= 0.2
        assert delays["open"] == pytest.approx(0.1, abs=1e-3), delays
        assert delays["read"] == pytest.approx(0.1, abs=1e-3), delays
        assert delays.get("lookup_paid", 0) == 0, delays
        # A file never seen and opened: its lookup, its open and its first read.
        seconds, (_, delays) = timed(lambda: delayed(fs, lambda: (mnt / "f2").read_bytes()))
        assert seconds >= 0.3
        for op in ("lookup_paid", "open", "read"):
            assert delays[op] == pytest.approx(0.1, abs=1e-3), (op, delays)
        # A listing: the open of the folder, then each batch of names.
        seconds, (names, delays) = timed(lambda: delayed(fs, lambda: sorted(os.listdir(mnt))))
        assert names == sorted(["big", *(f"f{i}" for i in range(8))]) and seconds >= 0.2
        assert delays.get("opendir", 0) >= 0.1 and delays.get("readdir", 0) >= 0.1, delays
        # A name that does not exist: answered at once (as NFS's cache of negative lookups does).
        (exists, delays) = delayed(fs, lambda: (mnt / "nothing").exists())
        assert not exists and sum(delays.values()) == 0, delays
        stats = fs.stats()
    assert stats["calls"]["missing_lookup"] == 1


def test_lookups_of_one_folder_wait_in_parallel(source, tmp_path):
    """The kernel sends a folder's lookups one at a time: slowfs must not make them queue. Counted
    where they wait (slowfs's replies held back at once), not timed."""
    from concurrent.futures import ThreadPoolExecutor

    with SlowFs(source, tmp_path / "mnt", latency_ms=200, sigma=0) as fs:
        mnt = Path(fs.mountpoint)
        with ThreadPoolExecutor(8) as pool:
            sizes = list(pool.map(lambda i: os.stat(mnt / f"f{i}").st_size, range(8)))
        assert sizes == [100_000] * 8
        assert fs.stats()["max_waiting"] >= 4, "8 lookups of 0.2 s queued"


def test_a_named_file_opens_slowly_and_the_others_do_not(source, tmp_path):
    with SlowFs(source, tmp_path / "mnt", latency_ms=1, sigma=0, slow={"f3": 1.5}) as fs:
        mnt = Path(fs.mountpoint)
        seconds, (_, delays) = timed(lambda: delayed(fs, lambda: (mnt / "f3").read_bytes()))
        assert seconds >= 1.5 and delays["open"] == pytest.approx(1.5, abs=1e-3)
        _, delays = delayed(fs, lambda: (mnt / "f4").read_bytes())
        assert delays["open"] == pytest.approx(0.001, abs=1e-3)


def test_a_tail_slows_the_given_share_of_opens(source, tmp_path):
    with SlowFs(source, tmp_path / "mnt", latency_ms=1, sigma=0, tail=(0.5, 0.3, 0.3), seed=3) as fs:
        mnt = Path(fs.mountpoint)
        fs.reset_stats()
        for _ in range(3):
            for i in range(8):
                (mnt / f"f{i}").read_bytes()
        stats = fs.stats()
    # Each open waits 1 ms, or 0.3 s in the tail: how many were in the tail, from what slowfs held
    # back (a loaded machine would make a timed open look slow).
    assert stats["calls"]["open"] == 24
    slow = round((stats["delayed_seconds"]["open"] - 24 * 0.001) / (0.3 - 0.001))
    assert 4 <= slow <= 20, f"{slow} of 24 opens in the tail (half expected)"


def test_the_tail_is_switched_off_and_on_without_a_new_mount(source, tmp_path):
    """What bench_netfs compares warm epochs with and without the tail by (one client)."""
    with SlowFs(source, tmp_path / "mnt", latency_ms=1, sigma=0, tail=(1.0, 0.3, 0.3)) as fs:
        mnt = Path(fs.mountpoint)
        seconds, _ = timed((mnt / "f0").read_bytes)
        assert seconds >= 0.3, "every open in the tail"
        fs.set_tail(False)
        assert fs.stats()["tail"] is False
        _, delays = delayed(fs, lambda: [(mnt / f"f{i}").read_bytes() for i in range(8)])
        assert delays["open"] == pytest.approx(8 * 0.001, abs=1e-3), "8 opens with the tail off"
        fs.set_tail(True)
        seconds, _ = timed((mnt / "f1").read_bytes)
        assert seconds >= 0.3, "the tail on again"
        fs.wait_idle()
        assert fs.stats()["waiting"] == 0


def test_reads_share_the_bandwidth_cap(source, tmp_path):
    with SlowFs(source, tmp_path / "mnt", bandwidth_mbps=20) as fs:
        seconds, data = timed(lambda: (Path(fs.mountpoint) / "big").read_bytes())
        assert len(data) == 8 << 20
        # The cap holds the read to at least 0.4 s; above, only a hang guard (a loaded machine).
        assert 0.35 <= seconds < 30, f"8 MB at 20 MB/s in {seconds:.2f} s"


def test_unmounted_when_the_process_that_mounted_it_is_killed(source, tmp_path):
    mountpoint = tmp_path / "mnt"
    tools = Path(__file__).resolve().parents[2] / "tools"
    code = (f"import sys, time; sys.path.insert(0, {str(tools)!r}); from slowfs_process import SlowFs; "
            f"fs = SlowFs({str(source)!r}, {str(mountpoint)!r}); print('mounted', flush=True); time.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "mounted"
        assert any(m == str(mountpoint) for m, _ in slowfs_mounts())
        owner.send_signal(signal.SIGKILL)  # no teardown runs: slowfs dies with its parent
        owner.wait(timeout=10)
        assert wait_until(lambda: all(m != str(mountpoint) for m, _ in slowfs_mounts())), "still mounted"
    finally:
        if owner.poll() is None:
            owner.kill()


def test_a_mount_left_by_a_killed_slowfs_is_cleaned_up(source, tmp_path):
    mountpoint = tmp_path / "mnt"
    fs = SlowFs(source, mountpoint)
    try:
        fs.process.send_signal(signal.SIGKILL)  # slowfs itself killed outright: its mount stays
        fs.process.wait(timeout=10)
        assert any(m == str(mountpoint) for m, _ in slowfs_mounts())
        with pytest.raises(OSError):  # "Transport endpoint is not connected"
            os.listdir(mountpoint)
        assert str(mountpoint) in cleanup_stale_mounts()
        assert all(m != str(mountpoint) for m, _ in slowfs_mounts())
        assert os.listdir(mountpoint) == []
    finally:
        fs.stop()
