"""Fault campaign: permission denied on a cache file, on the cache folder, on the server's folder.

The process under test (a trainer's epoch through draftfeed.Loader, or `draftfeed generate`) runs
without the power to ignore permissions (as root in CI: fault_helpers.without_permission_bypass).
Expected each time: the run ends on its own, in bounded time; what was refused is said with the
file's path and the OS's reason; nothing is lost (the cache's files, the server's files are all
still there, unchanged) and nothing else is touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_path
from fault_helpers import SimServerProcess, cache_problem, without_permission_bypass

import draftfeed

pytestmark = pytest.mark.timeout(180)

LAYERS, HIDDEN, SEED = 4, 64, 3
ROWS = 12
DENIED = "Permission denied"

EPOCH = r"""
import json, sys, warnings
import draftfeed
warnings.simplefilter("ignore")
loader = draftfeed.Loader(sys.argv[1], hidden_size=int(sys.argv[3]), total_seq_len=256, split="all",
                          hidden_states_path=sys.argv[2], num_threads=2, prefetch=2,
                          on_missing="warn", pin_memory=False)
dropped, messages, batches = {}, [], 0
for batch in loader:
    batches += 1
    for reason, count in loader.last_batch.dropped.items():
        dropped[reason] = dropped.get(reason, 0) + count
    messages += [m for _, m in loader.last_batch.drop_messages]
print(json.dumps({"batches": batches, "dropped": {k: v for k, v in dropped.items() if v},
                  "messages": messages}))
"""


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def offline(tmp_path):
    """A dataset and its complete cache (synthetic), and a foreign folder."""
    data, cache = tmp_path / "data", tmp_path / "cache"
    draftfeed.write_synthetic_dataset(str(data), ROWS, seed=41, min_len=8, max_len=40, vocab=5000)
    dataset = draftfeed.open_dataset(str(data))
    draftfeed.write_synthetic_hidden_states(
        str(cache), [dataset.input_ids(r).tolist() for r in range(ROWS)], seed=4, hidden_size=HIDDEN,
        layers=LAYERS)
    return data, cache


def _epoch(data: Path, cache: Path) -> tuple[dict, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", EPOCH, str(data), str(cache), str(HIDDEN)],
                          capture_output=True, text=True, timeout=120, env=env,
                          preexec_fn=without_permission_bypass())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), time.monotonic() - start


def test_an_unreadable_cache_file_is_dropped_naming_it(offline, fault_campaign):
    data, cache = offline
    before = _digests(cache)
    locked = [cache / "hs_3.safetensors", cache / "hs_8.safetensors"]
    for path in locked:
        path.chmod(0)
    try:
        report, seconds = _epoch(data, cache)
    finally:
        for path in locked:
            path.chmod(0o644)
    assert report["dropped"] == {"invalid": 2}, report
    for path in locked:
        assert any(str(path) in m and DENIED in m for m in report["messages"]), report["messages"]
    assert _digests(cache) == before
    fault_campaign(runs=1, faults=2, lost=0, hangs=0,
                   note=f"2 of {ROWS} files mode 000: both dropped as invalid, named ({seconds:.1f} s)")


def test_an_unsearchable_cache_folder_drops_every_sample_naming_the_files(offline, fault_campaign):
    data, cache = offline
    before = _digests(cache)
    cache.chmod(0)
    try:
        report, seconds = _epoch(data, cache)
    finally:
        cache.chmod(0o755)
    assert report["dropped"] == {"invalid": ROWS}, report
    assert report["messages"] and all(str(cache) in m and DENIED in m for m in report["messages"])
    assert report["batches"] >= 1  # the epoch ran to its end: empty batches, not an error
    assert _digests(cache) == before
    fault_campaign(runs=1, faults=1, lost=0, hangs=0,
                   note=f"cache folder mode 000: {ROWS} samples dropped as invalid, named "
                        f"({seconds:.1f} s)")


def test_a_read_only_cache_with_leftover_lock_files_stays_readable(offline, fault_campaign):
    """A writer's lock file left behind (its writer gone) is removed by the reader, as the protocol
    says; where the folder is read-only it cannot be, and the read goes on (the lock is free)."""
    data, cache = offline
    for row in (2, 5, 9):
        (cache / f"hs_{row}.safetensors.lock").write_bytes(b"")
    before = _digests(cache)
    cache.chmod(0o555)
    try:
        report, seconds = _epoch(data, cache)
    finally:
        cache.chmod(0o755)
    assert report["dropped"] == {}, report
    assert _digests(cache) == before  # the lock files stay: nothing could be removed
    fault_campaign(runs=1, faults=3, lost=0, hangs=0,
                   note=f"read-only cache with 3 stale lock files: every sample read ({seconds:.1f} s)")


@pytest.fixture
def online(tmp_path):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), ROWS, seed=42, min_len=8, max_len=40, vocab=5000)
    dataset = draftfeed.open_dataset(str(data))
    ids = [np.ascontiguousarray(dataset.input_ids(r), dtype=np.int64) for r in range(ROWS)]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.safetensors").write_bytes(b"not yours")
    with SimServerProcess(tmp_path / "server", layers=LAYERS, hidden=HIDDEN, seed=SEED) as sim:
        yield data, ids, tmp_path / "cache", sim, foreign


def _generate(data: Path, cache: Path, sim, rows: str = "0:") -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [cli_path(), "generate", str(data), "--endpoint", sim.url, "--hidden-states", str(cache),
         "--server-dir", str(sim.server_dir), "--rows", rows, "--fetch-threads", "2",
         "--retry-backoff", "0.01", "--max-retries", "1", "--generation-validation-retries", "1",
         "--lock-timeout", "2", "--request-timeout", "10", "--json"],
        capture_output=True, text=True, timeout=120, preexec_fn=without_permission_bypass())
    return done, time.monotonic() - start


def test_a_read_only_cache_folder_refuses_new_files_and_says_so(online, fault_campaign):
    data, ids, cache, sim, foreign = online
    first, _ = _generate(data, cache, sim, rows="0:4")
    assert first.returncode == 0, first.stdout + first.stderr
    before = _digests(cache)
    cache.chmod(0o555)
    try:
        done, seconds = _generate(data, cache, sim)
    finally:
        cache.chmod(0o755)
    report = json.loads(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert report["existing"] == 4 and report["uncached"] == ROWS - 4, report
    refusals = [line for line in done.stderr.splitlines() if DENIED in line]
    assert len(refusals) == ROWS - 4, done.stderr
    assert all(f"{cache}/hs_" in line for line in refusals), refusals
    assert _digests(cache) == before
    # The generated files stay where the server wrote them (not moved, not deleted): nothing lost.
    left = sorted(p.name for p in sim.server_dir.glob("*.safetensors"))
    assert len(left) == ROWS - 4, left
    for name in left:
        assert cache_problem(sim.server_dir / name, ids[_row_of(sim, name)], LAYERS, HIDDEN, SEED) is None
    assert _digests(foreign) == {"precious.safetensors": hashlib.sha256(b"not yours").hexdigest()}
    fault_campaign(runs=2, faults=ROWS - 4, lost=0, hangs=0,
                   note=f"cache folder mode 555: {ROWS - 4} moves refused, named; the generated files "
                        f"stay in the server folder ({seconds:.1f} s)")


def _row_of(sim, name: str) -> int:
    """The row a server file was generated for (its token ids)."""
    from safetensors.torch import load_file

    ids = load_file(str(sim.server_dir / name))["token_ids"].numpy()
    for row in range(ROWS):
        candidate = draftfeed.synthetic_row(row, seed=42, min_len=8, max_len=40, vocab=5000)[0]
        if np.array_equal(candidate, ids):
            return row
    raise AssertionError(f"{name} is no row's file")


def test_an_unreadable_server_folder_fails_the_rows_in_bounded_time(online, fault_campaign):
    data, _, cache, sim, foreign = online
    sim.server_dir.chmod(0)
    try:
        done, seconds = _generate(data, cache, sim)
        server_files = sorted(os.listdir(sim.server_dir))  # as root, with the bypass
    finally:
        sim.server_dir.chmod(0o755)
    report = json.loads(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert report["generated"] == 0 and report["unfilled"] == ROWS, report
    assert report["failed_round_trips"].get("unreadable", 0) > 0, report
    assert DENIED in done.stderr and str(sim.server_dir) in done.stderr
    # Every file the server wrote is still there: the loader could not, and did not, remove any.
    assert len([n for n in server_files if n.endswith(".safetensors")]) == sim.stats()["files_written"]
    assert not cache.exists() or os.listdir(cache) == []
    assert seconds < 60
    assert os.listdir(foreign) == ["precious.safetensors"]
    fault_campaign(runs=1, faults=report["failed_round_trips"]["unreadable"], lost=0, hangs=0,
                   note=f"server folder mode 000: every round trip refused reading, named; run "
                        f"ended after {seconds:.1f} s ({report['fatal'] or 'rows failed'})"[:300])


def test_a_read_only_server_folder_keeps_its_files_and_says_so(online, fault_campaign):
    data, ids, cache, sim, foreign = online
    sim.server_dir.chmod(0o555)
    try:
        done, seconds = _generate(data, cache, sim)
    finally:
        sim.server_dir.chmod(0o755)
    report = json.loads(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert report["uncached"] == ROWS, report
    refusals = [line for line in done.stderr.splitlines() if DENIED in line]
    assert len(refusals) == ROWS and all(str(sim.server_dir) in line for line in refusals), refusals
    left = sorted(p.name for p in sim.server_dir.glob("*.safetensors"))
    assert len(left) == ROWS
    for name in left:
        assert cache_problem(sim.server_dir / name, ids[_row_of(sim, name)], LAYERS, HIDDEN, SEED) is None
    assert os.listdir(foreign) == ["precious.safetensors"]
    fault_campaign(runs=1, faults=ROWS, lost=0, hangs=0,
                   note=f"server folder mode 555: {ROWS} moves out of it refused, named; files kept "
                        f"({seconds:.1f} s)")
