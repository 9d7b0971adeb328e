"""Fault campaign: cache files truncated, rewritten or deleted while an epoch reads them.

The engine maps cache files and copies from the mapping; a file cut short under a mapping makes
the next read of a lost page raise SIGBUS, which kills a process that does not expect it. The
trainer (tests/python/cache_change_worker.py, its own process) runs epochs while this test, as
another process would, truncates files (to nothing, or to half), rewrites them in place (every
value negated) and deletes them, each time putting the original back shortly after. Expected: the
trainer never dies; every sample it receives is whole (its file's original values, or all of the
rewrite's); samples read while their file changed are dropped with the reason named; at the end
every file is back as it was (nothing lost).
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import draftfeed

pytestmark = pytest.mark.timeout(180)

HIDDEN, LAYERS = 512, 4
ROWS = 40
SECONDS = 8.0
WORKER = Path(__file__).with_name("cache_change_worker.py")


def _negated(data: bytes) -> bytes:
    """The same safetensors file with every hidden-state value negated (bf16: the sign bit)."""
    header_size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_size])
    begin, end = header["hidden_states"]["data_offsets"]
    start = 8 + header_size
    values = bytearray(data[start + begin:start + end])
    values[1::2] = bytes(b ^ 0x80 for b in values[1::2])  # little-endian: the high byte of each
    return data[:start + begin] + bytes(values) + data[start + end:]


def _write_in_place(path: Path, data: bytes) -> None:
    """Same file (inode), new contents: what a writer reusing the name without a rename does."""
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate(len(data))


def test_files_changing_under_an_epoch_never_crash_the_trainer(tmp_path, fault_campaign):
    data, cache = tmp_path / "data", tmp_path / "cache"
    draftfeed.write_synthetic_dataset(str(data), ROWS, seed=31, min_len=32, max_len=160, vocab=50000)
    dataset = draftfeed.open_dataset(str(data))
    draftfeed.write_synthetic_hidden_states(
        str(cache), [dataset.input_ids(r).tolist() for r in range(ROWS)], seed=4,
        hidden_size=HIDDEN, layers=LAYERS)
    originals = {r: (cache / f"hs_{r}.safetensors").read_bytes() for r in range(ROWS)}
    rewritten = {r: _negated(b) for r, b in originals.items()}
    stop = tmp_path / "STOP"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), str(data), str(cache), str(HIDDEN), str(LAYERS), str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready", worker.communicate(timeout=60)

    rng = random.Random(7)
    done = {"truncate to 0": 0, "truncate to half": 0, "rewrite in place": 0, "delete": 0}
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline and worker.poll() is None:
        row = rng.randrange(ROWS)
        path = cache / f"hs_{row}.safetensors"
        kind = rng.choice(sorted(done))
        if kind == "truncate to 0":
            os.truncate(path, 0)
        elif kind == "truncate to half":
            os.truncate(path, len(originals[row]) // 2)
        elif kind == "rewrite in place":
            _write_in_place(path, rewritten[row])
        else:
            path.unlink()
        done[kind] += 1
        time.sleep(rng.uniform(0.005, 0.04))
        # Back as it was: in place, or (after a delete) as a new file renamed into place.
        if kind == "delete":
            temporary = cache / f".restore_{row}"
            temporary.write_bytes(originals[row])
            os.replace(temporary, path)
        else:
            _write_in_place(path, originals[row])
        # Two changes of one file within one tick of the file system's clock would look like one
        # to a reader comparing modification times: keep changes a clock tick apart.
        time.sleep(0.02)
    stop.write_text("")
    try:
        out, err = worker.communicate(timeout=60)
        hangs = 0
    except subprocess.TimeoutExpired:
        worker.kill()
        out, err = worker.communicate()
        hangs = 1
    assert hangs == 0, "the trainer did not finish its epoch after the stop file appeared"
    assert worker.returncode == 0, (
        f"the trainer died ({'SIGBUS' if worker.returncode == -7 else worker.returncode}):\n{err[-3000:]}")
    report = json.loads(out.strip().splitlines()[-1])
    assert report["torn"] == 0, report["messages"]
    assert report["epochs"] > 0 and report["original"] > 0, report
    # The faults met the reads: some samples were dropped (a file cut short or gone under a read),
    # each saying why, naming the file. (None dropped would mean the campaign tested nothing.)
    dropped = {reason: n for reason, n in report["dropped"].items() if n}
    assert dropped, f"no sample was dropped: the faults never met a read ({done}, {report['kinds']})"
    assert set(dropped) <= {"invalid", "missing"}, dropped
    for message in report["messages"]:
        assert "hs_" in message and (".safetensors" in message), message
    lost = sum((cache / f"hs_{r}.safetensors").read_bytes() != originals[r] for r in range(ROWS))
    assert lost == 0
    assert sorted(os.listdir(cache)) == sorted(f"hs_{r}.safetensors" for r in range(ROWS))
    faults = sum(done.values())
    fault_campaign(runs=report["epochs"], faults=faults, lost=lost, hangs=hangs,
                   note=f"{done}; trainer saw {report['samples']} samples: {report['original']} "
                        f"original, {report['rewritten']} rewritten whole, 0 torn; dropped "
                        f"{dropped}: {report['kinds']}")
    print(json.dumps({"done": done, **report}, indent=1)[:4000])
