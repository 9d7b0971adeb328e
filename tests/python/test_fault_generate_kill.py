"""Fault campaign: `draftfeed generate` killed with SIGKILL at random points, against the simulated
vLLM server (tools/sim_vllm_process.py).

After every kill, each `hs_<row>.safetensors` in the cache must be a complete sample (read back with
`safetensors`, values equal to the server's formula): no half-written file is ever readable as a
sample; a copy cut short may only leave an `.hs_*.adopt-*` temporary, which no reader takes for a
sample. No valid file may disappear (nothing lost). Half the runs use a server folder on another
file system (/dev/shm), so files enter the cache by copy, fsync and rename, where a kill can land
mid-copy. Then a rerun, with a stale lock and a half-written file left as a killed writer would
leave them, must complete the cache: the stale lock does not block it, the orphaned temporaries are
removed, and `draftfeed verify` finds every row valid.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_path
from fault_helpers import SimServerProcess, cache_problem, other_file_system

import draftfeed

pytestmark = pytest.mark.timeout(420)

LAYERS, HIDDEN, SEED = 4, 256, 3
ROWS = 500
RUNS = 20
SAMPLE = re.compile(r"hs_(\d+)\.safetensors")
TEMPORARY = re.compile(r"\.hs_\d+\.safetensors\.adopt-.+")


class CacheWatch:
    """Checks the cache after each run: complete samples only, and none lost since last time."""

    def __init__(self, cache: Path, ids: list[np.ndarray]):
        self.cache, self.ids = cache, ids
        self.valid: dict[int, tuple] = {}  # row -> (inode, size, mtime) of its checked file
        self.temporaries_seen: set[str] = set()
        self.lost = 0

    def check(self) -> None:
        names = os.listdir(self.cache) if self.cache.exists() else []
        present: set[int] = set()
        for name in names:
            if TEMPORARY.fullmatch(name):
                self.temporaries_seen.add(name)
                continue
            match = SAMPLE.fullmatch(name)
            assert match, f"unexpected file in the cache: {name}"
            row = int(match.group(1))
            present.add(row)
            st = os.stat(self.cache / name)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self.valid.get(row) == key:
                continue
            problem = cache_problem(self.cache / name, self.ids[row], LAYERS, HIDDEN, SEED)
            assert problem is None, f"{name} is readable as a sample but is not one: {problem}"
            self.valid[row] = key
        gone = set(self.valid) - present
        self.lost += len(gone)
        assert not gone, f"valid cached files disappeared: {sorted(gone)}"


def test_generate_killed_at_random_points_loses_nothing_and_reruns_complete(tmp_path, run_cli,
                                                                             fault_campaign):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), ROWS, seed=11, min_len=8, max_len=64, vocab=5000)
    dataset = draftfeed.open_dataset(str(data))
    ids = [np.ascontiguousarray(dataset.input_ids(r), dtype=np.int64) for r in range(ROWS)]
    cache = tmp_path / "cache"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.safetensors").write_bytes(b"not yours")
    far_dir = other_file_system(tmp_path)
    watch = CacheWatch(cache, ids)
    rng = random.Random(20261203)
    killed_running, hangs, runs = 0, 0, 0
    try:
        with SimServerProcess(tmp_path / "server", layers=LAYERS, hidden=HIDDEN, seed=SEED,
                              latency_median=0.1) as near, \
             SimServerProcess(far_dir or tmp_path / "server2", layers=LAYERS, hidden=HIDDEN,
                              seed=SEED, latency_median=0.1) as far:

            def generate(sim: SimServerProcess) -> list[str]:
                return [cli_path(), "generate", str(data), "--endpoint", sim.url,
                        "--hidden-states", str(cache), "--server-dir", str(sim.server_dir),
                        "--fetch-threads", "2", "--request-timeout", "20", "--retry-backoff", "0.05",
                        "--lock-timeout", "5", "--json"]

            for run in range(RUNS):
                sim = far if run % 2 else near
                process = subprocess.Popen(generate(sim), stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
                time.sleep(rng.uniform(0.05, 1.5))
                if process.poll() is None:
                    process.kill()  # SIGKILL: no handler runs, nothing is cleaned up
                    killed_running += 1
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    hangs += 1
                    process.kill()
                    process.wait()
                runs += 1
                watch.check()

            # What a writer killed mid-write leaves: a half-written file and its lock file, no
            # longer held by anyone. (Here on a row that was cached, or the first row if none was.)
            row = min(watch.valid) if watch.valid else 0
            victim = cache / f"hs_{row}.safetensors"
            cache.mkdir(exist_ok=True)
            half = victim.read_bytes()[: max(1, victim.stat().st_size // 2)] if victim.exists() else b"\0" * 9
            victim.write_bytes(half)
            Path(str(victim) + ".lock").write_bytes(b"")
            watch.valid.pop(row, None)
            # And a copy orphaned mid-way by a process of this host that is gone (its pid no longer
            # runs), beside one of a live process (this test's), which must be left alone.
            dead = subprocess.Popen(["true"])
            dead.wait()
            host = socket.gethostname()
            orphan = cache / f".hs_{row}.safetensors.adopt-{host}-{dead.pid}-0"
            orphan.write_bytes(half)
            alive = cache / f".hs_{row}.safetensors.adopt-{host}-{os.getpid()}-0"
            alive.write_bytes(half)

            start = time.monotonic()
            rerun = run_cli(*generate(near)[1:], timeout=240)
            runs += 1
            seconds = time.monotonic() - start
    finally:
        if far_dir is not None:
            shutil.rmtree(far_dir, ignore_errors=True)

    report = json.loads(rerun.stdout)
    assert report["unfilled"] == 0 and report["failed"] == 0, report
    # The stale lock did not hold the rerun (a held one fails the row after --lock-timeout 5).
    assert not Path(str(victim) + ".lock").exists()
    assert report["stale_temporaries_removed"] >= 1, report
    assert not orphan.exists()
    assert [n for n in os.listdir(cache) if TEMPORARY.fullmatch(n)] == [alive.name]
    alive.unlink()
    watch.check()
    assert sorted(watch.valid) == list(range(ROWS))
    verify = run_cli("verify", str(data), "--hidden-states", str(cache), "--json")
    assert json.loads(verify.stdout)["ok"] == ROWS, verify.stdout
    assert os.listdir(foreign) == ["precious.safetensors"]
    assert (foreign / "precious.safetensors").read_bytes() == b"not yours"
    assert hangs == 0
    # Most kills must have hit a running process, or the test tests nothing.
    assert killed_running >= RUNS * 3 // 4, f"only {killed_running} of {RUNS} kills hit a running generate"
    fault_campaign(runs=runs, faults=killed_running + 2, lost=watch.lost, hangs=hangs,
                   note=f"{killed_running} SIGKILLs mid-run, then a stale lock + half-written file "
                        f"and an orphaned copy; {len(watch.temporaries_seen)} copies orphaned by the "
                        f"kills, each removed by the next run; rerun {seconds:.1f} s; "
                        f"cross-file-system runs: {far_dir is not None}")
