"""Fault campaign: the disk fills up while `draftfeed generate` moves generated files into the cache.

The cache folder is a small tmpfs the test mounts itself (CI runs as root); where mounting is
refused, the test falls back to RLIMIT_FSIZE on the generate process (each file then has a size
limit instead of the folder: the write fails with EFBIG instead of ENOSPC), and says which ran. The
server writes on another file system (the ordinary disk, or /dev/shm for the fallback), so every
file enters the cache by copy, fsync and rename: the copy is what fails. Expected: a clear error naming the file, exit status 1 with the rows not cached
counted, no partial file (no hs_* that is not a complete sample, no temporary left), the files
cached before untouched; once there is room, a rerun completes the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_path
from fault_helpers import SimServerProcess, cache_problem, other_file_system

import draftfeed

pytestmark = pytest.mark.timeout(240)

LAYERS, HIDDEN, SEED = 4, 256, 3
ROWS = 60
SMALL = 1 << 20  # bytes of cache: about a dozen of these rows' files


def _mount_tmpfs(folder: Path, size: int, remount: bool = False) -> bool:
    # DRAFTFEED_TEST_NO_MOUNT=1 runs the RLIMIT_FSIZE fallback where mounting would work.
    if os.geteuid() != 0 or os.environ.get("DRAFTFEED_TEST_NO_MOUNT"):
        return False
    options = f"{'remount,' if remount else ''}size={size}"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                            capture_output=True, text=True)
    return result.returncode == 0


def _file_size_limit(limit: int):
    def apply() -> None:
        # Past the limit a write fails with EFBIG, once SIGXFSZ (which would kill) is ignored.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_disk_full_while_caching_names_the_file_and_leaves_no_partial_file(tmp_path, fault_campaign):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), ROWS, seed=21, min_len=16, max_len=64, vocab=5000)
    dataset = draftfeed.open_dataset(str(data))
    ids = [np.ascontiguousarray(dataset.input_ids(r), dtype=np.int64) for r in range(ROWS)]
    cache = tmp_path / "cache"
    cache.mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.safetensors").write_bytes(b"not yours")
    mounted = _mount_tmpfs(cache, SMALL)
    limit = None if mounted else 40_000  # RLIMIT_FSIZE fallback: rows of over ~20 tokens fail
    mode = "tmpfs of 1 MiB" if mounted else f"RLIMIT_FSIZE {limit} bytes (no tmpfs mount)"
    print(f"disk full via {mode}")
    server_dir = tmp_path / "server" if mounted else other_file_system(tmp_path)
    if server_dir is None:
        pytest.skip("cannot mount a tmpfs and /dev/shm is not another file system: no copy to fail")
    try:
        with SimServerProcess(server_dir, layers=LAYERS, hidden=HIDDEN, seed=SEED) as sim:

            def generate(rows: str, preexec=None) -> subprocess.CompletedProcess:
                return subprocess.run(
                    [cli_path(), "generate", str(data), "--endpoint", sim.url, "--hidden-states",
                     str(cache), "--server-dir", str(sim.server_dir), "--rows", rows,
                     "--fetch-threads", "2", "--retry-backoff", "0.05", "--json"],
                    capture_output=True, text=True, timeout=120, preexec_fn=preexec)

            first = generate("0:4")
            assert first.returncode == 0, first.stdout + first.stderr
            before = _digests(cache)
            assert len(before) == 4

            full = generate("0:", _file_size_limit(limit) if limit else None)
            report = json.loads(full.stdout)
            assert full.returncode == 1, full.stdout + full.stderr
            assert report["uncached"] > 0 and report["unfilled"] == report["uncached"], report
            # The error names the file (the cache entry it was to become) and the cause.
            cause = "No space left on device" if mounted else "File too large"
            errors = [line for line in full.stderr.splitlines() if cause in line]
            assert len(errors) == report["uncached"], full.stderr
            for line in errors:
                assert re.search(r"into \S*/cache/hs_\d+\.safetensors", line), line
            # No partial file: every hs_* is a complete sample; no temporary is left.
            names = sorted(os.listdir(cache))
            assert all(re.fullmatch(r"hs_\d+\.safetensors", n) for n in names), names
            for name in names:
                row = int(name[3:].split(".")[0])
                assert cache_problem(cache / name, ids[row], LAYERS, HIDDEN, SEED) is None, name
            # The rest of the cache intact.
            after = _digests(cache)
            assert {k: after[k] for k in before} == before
            cached_when_full = len(names)

            if mounted:
                assert _mount_tmpfs(cache, 64 << 20, remount=True)
            rerun = generate("0:")
            assert rerun.returncode == 0, rerun.stdout + rerun.stderr
            assert sorted(os.listdir(cache)) == sorted(f"hs_{r}.safetensors" for r in range(ROWS))
            assert {k: _digests(cache)[k] for k in before} == before
    finally:
        if mounted:
            subprocess.run(["umount", str(cache)], check=False)
        else:
            shutil.rmtree(server_dir, ignore_errors=True)
    assert os.listdir(foreign) == ["precious.safetensors"]
    fault_campaign(runs=3, faults=report["uncached"], lost=0, hangs=0,
                   note=f"{mode}: {report['uncached']} writes refused, {cached_when_full} of {ROWS} "
                        "rows cached when full, all after the rerun")
