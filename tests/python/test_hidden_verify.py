"""`draftfeed verify` on a dataset written by `datasets` and a cache with one of each defect."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import safetensors.torch
import torch
from datasets import Dataset

import draftfeed

pytestmark = pytest.mark.timeout(120)

HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    """
)


def make_dataset(folder, rows):
    Dataset.from_dict(
        {
            "input_ids": rows,
            "loss_mask": [[1] * len(r) for r in rows],
            "seq_len": [len(r) for r in rows],
        }
    ).save_to_disk(str(folder))


@pytest.fixture
def rows():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 50000, size=int(rng.integers(3, 40))).tolist() for _ in range(12)]


def test_clean_cache_exits_zero(tmp_path, rows, run_cli, run_cli_json):
    make_dataset(tmp_path / "data", rows)
    draftfeed.write_synthetic_hidden_states(str(tmp_path / "data" / "hidden_states"), rows, seed=2,
                                            hidden_size=16, layers=4, dtype="BF16")
    (tmp_path / "data" / "hidden_states" / "hs_11.safetensors").unlink()  # missing is not an error
    start = time.monotonic()
    report = run_cli_json("verify", tmp_path / "data")
    wall = time.monotonic() - start
    assert {k: report[k] for k in ("rows", "ok", "missing", "corrupt", "mismatched", "nonfinite", "locked")} == {
        "rows": 12, "ok": 11, "missing": 1, "corrupt": 0, "mismatched": 0, "nonfinite": 0, "locked": 0}
    # The throughput figures: the bytes of the 11 files read, a scan time inside the command's own
    # wall time, and the rate those two give.
    files = sorted((tmp_path / "data" / "hidden_states").glob("hs_*.safetensors"))
    assert len(files) == 11
    assert report["bytes"] == sum(f.stat().st_size for f in files)
    assert 0 < report["seconds"] < wall
    assert report["gb_per_s"] == pytest.approx(report["bytes"] / 1e9 / report["seconds"], rel=1e-9)
    text = run_cli("verify", tmp_path / "data", "--threads", "1").stdout
    assert "ok         11" in text and "GB/s" in text


def test_one_of_each_defect_is_counted_exactly(tmp_path, rows, run_cli):
    data = tmp_path / "data"
    cache = tmp_path / "cache"
    make_dataset(data, rows)
    draftfeed.write_synthetic_hidden_states(str(cache), rows, seed=2, hidden_size=16, layers=4,
                                            dtype="BF16")

    def path(row):
        return cache / f"hs_{row}.safetensors"

    path(1).unlink()  # missing
    raw = path(2).read_bytes()
    path(2).write_bytes(raw[:-10])  # corrupt: truncated
    ids = torch.tensor(rows[3]) + 1
    safetensors.torch.save_file({"token_ids": ids, "hidden_states": torch.zeros(len(ids), 4, 16, dtype=torch.bfloat16)},
                                str(path(3)))  # mismatched
    bad = torch.zeros(len(rows[4]), 4, 16, dtype=torch.bfloat16)
    bad[0, 2, 3] = float("nan")
    safetensors.torch.save_file({"token_ids": torch.tensor(rows[4]), "hidden_states": bad}, str(path(4)))
    (cache / "hs_6.safetensors.lock").touch()  # stale: no holder, the data file is fine
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path(5)) + ".lock", "30"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for threads in ("1", "3"):
            start = time.monotonic()
            proc = run_cli("verify", data, "--hidden-states", cache, "--json", "--threads", threads,
                           check=False, timeout=60)
            assert time.monotonic() - start < 10, "verify must not wait for locks"
            assert proc.returncode == 1, proc.stderr
            report = json.loads(proc.stdout)
            counts = {k: report[k] for k in ("rows", "ok", "missing", "corrupt", "mismatched", "nonfinite", "locked")}
            assert counts == {"rows": 12, "ok": 7, "missing": 1, "corrupt": 1, "mismatched": 1,
                              "nonfinite": 1, "locked": 1}, report
            examples = report["examples"]
            assert [e["row"] for e in examples["corrupt"]] == [2]
            assert "truncated" in examples["corrupt"][0]["reason"]
            assert [e["row"] for e in examples["mismatched"]] == [3]
            assert "token_ids differ" in examples["mismatched"][0]["reason"]
            assert [e["row"] for e in examples["nonfinite"]] == [4]
            assert "1 NaN and 0 Inf values in layer slot 2 (of 4)" in examples["nonfinite"][0]["reason"]
            assert [e["row"] for e in examples["locked"]] == [5]
            assert "locked by a writer" in examples["locked"][0]["reason"]
        # verify never removes a lock file, held or stale.
        assert (cache / "hs_5.safetensors.lock").exists()
        assert (cache / "hs_6.safetensors.lock").exists()
        text = run_cli("verify", data, "--hidden-states", cache, "--examples", "1", check=False)
        assert text.returncode == 1
        assert "row 4:" in text.stdout and "nonfinite  1" in text.stdout
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_memcpy_baseline_and_bad_arguments(tmp_path, rows, run_cli, run_cli_json):
    make_dataset(tmp_path / "data", rows)
    draftfeed.write_synthetic_hidden_states(str(tmp_path / "data" / "hidden_states"), rows, seed=2,
                                            hidden_size=16, layers=4, dtype="F32")
    report = run_cli_json("verify", tmp_path / "data", "--baseline", "memcpy")
    assert report["mode"] == "memcpy" and report["ok"] == 12
    # The read-only baseline: every byte of every file read once (XOR of the files' 8-byte words).
    expected, total = 0, 0
    for path in sorted((tmp_path / "data" / "hidden_states").glob("hs_*.safetensors")):
        data = path.read_bytes()
        total += len(data)
        padded = data + bytes(-len(data) % 8)
        for i in range(0, len(padded), 8):
            expected ^= int.from_bytes(padded[i:i + 8], "little")
    for threads in ("1", "3"):
        report = run_cli_json("verify", tmp_path / "data", "--baseline", "read", "--threads", threads)
        assert report["mode"] == "read" and report["ok"] == 12 and report["bytes"] == total
        assert report["read_checksum"] == expected
    # The file-read baseline: every file read whole through its descriptor, as the loader reads them.
    for threads in ("1", "3"):
        report = run_cli_json("verify", tmp_path / "data", "--baseline", "pread", "--threads", threads)
        assert report["mode"] == "pread" and report["ok"] == 12 and report["bytes"] == total
    proc = run_cli("verify", tmp_path / "data", "--baseline", "copy", check=False)
    assert proc.returncode == 2 and "--baseline must be 'memcpy', 'read' or 'pread', got 'copy'" in proc.stderr
    proc = run_cli("verify", tmp_path / "data", "--threads", "-1", check=False)
    assert proc.returncode == 2 and "--threads must be between 0 and 4096, got -1" in proc.stderr
    proc = run_cli("verify", tmp_path / "nope", check=False)
    assert proc.returncode != 0 and "nope" in proc.stderr
