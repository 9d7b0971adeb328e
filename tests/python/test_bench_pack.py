"""bench/run.py's pack section at --quick sizes: it runs, records bench_pack.py's figures, and renders
one table with each of issue 41's targets measured and met or not; without slowfs the targets that
need it say why they were not measured. Its pack_decode section (bench_pack_decode.py, issue 51) at
--quick sizes: every pack measured, each target met or not, the README's headline rows built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import bench_pack  # noqa: E402
import bench_pack_decode  # noqa: E402
import headline  # noqa: E402
import report  # noqa: E402

pytestmark = pytest.mark.timeout(300)
TITLE = "Packed caches: issue 41's targets"


def test_quick_pack_section_runs_and_renders_the_targets(tmp_path):
    env = dict(os.environ, DRAFTFEED_CLI=cli_path())
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "pack", "--out",
                           str(tmp_path / "out"), "--data", str(tmp_path / "data"), "--allow-stale", "--no-readme"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "out" / "quick.json").read_text())
    pack = results["pack"]
    assert pack["status"] == "done" and set(pack["sides"]) == set(bench_pack.SIDES)
    assert pack["sides"]["packed"]["shards"] > 1, "several shards, so that opens <= shards says something"
    rows = bench_pack.targets(pack)
    assert len(rows) == 6 and all(met in ("met", "NOT met") or met.startswith("not measured") for _, _, met in rows)
    if not pack.get("slowfs_skipped"):
        assert all(not met.startswith("not measured") for _, _, met in rows), rows
    markdown = (tmp_path / "out" / "quick.md").read_text()
    assert TITLE in markdown and all(target in markdown for target, _, _ in rows)
    assert not list((tmp_path / "data").iterdir()), "the section's scratch folder is removed"


def test_targets_without_slowfs_say_why():
    side = {"bytes_on_disk": 1000, "warm_epoch_seconds": 1.0, "warm_tokens_per_s": 100, "warm_gb_per_s_of_bf16": 1.0}
    pack = {"status": "done", "rows": 10, "hidden": 64, "cold_mbps": 200, "memcpy_gb_per_s": 2.0,
            "slowfs_skipped": "no /dev/fuse on this machine", "sides": {name: dict(side) for name in bench_pack.SIDES},
            "residual_ratio": [{"dtype": "bf16", "ratio_whole": 0.7, "samples": 2},
                               {"dtype": "fp8", "ratio_whole": 0.95, "samples": 2}]}
    met = {target.split(" (")[0]: verdict for target, _, verdict in bench_pack.targets(pack)}
    assert met["opens per epoch and rank <= shards"] == "not measured: no /dev/fuse on this machine"
    assert met["cold epoch, packed+compressed >= 1.3x faster than per-sample"].startswith("not measured: no /dev")
    assert met["compressed pack <= 0.72x the bytes of the bf16 cache"] == "met"
    assert met["compressed pack <= 0.90x the bytes of the fp8 cache"] == "NOT met"
    assert met["warm epoch, packed+compressed >= 60% of packed"] == "met"
    [rendered] = report.pack_table({"pack": pack})
    assert "no /dev/fuse" in rendered["note"]


def test_quick_pack_decode_section_runs_and_checks_issue_51s_targets(tmp_path):
    env = dict(os.environ, DRAFTFEED_CLI=cli_path())
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "pack_decode",
                           "--out", str(tmp_path / "out"), "--data", str(tmp_path / "data"), "--allow-stale",
                           "--no-readme"], capture_output=True, text=True, timeout=280, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "out" / "quick.json").read_text())
    r = results["pack_decode"]
    assert r["status"] == "done", r
    [warm] = r["warm"].values()
    names = {f"{dtype} packed{suffix}" for dtype in ("bf16", "fp8") for suffix in ("", "+huffman", "+zstd")}
    assert set(warm["caches"]) == names
    # Each pack its own: the compressed ones smaller than the plain one.
    sizes = {name: c["bytes_on_disk"] for name, c in warm["caches"].items()}
    for dtype in ("bf16", "fp8"):
        assert sizes[f"{dtype} packed+huffman"] < sizes[f"{dtype} packed"]
        assert sizes[f"{dtype} packed+zstd"] < sizes[f"{dtype} packed"]
    assert {c["name"] for c in r["entropy_stage"]["bf16"]["coders"]} == {"huffman", "zstd"}
    rows = bench_pack_decode.targets(r)
    assert len(rows) >= 8 and all(met in ("met", "NOT met") or met.startswith("not measured") for _, _, met in rows)
    assert len(headline.pack_decode(results)) == 2
    assert not list((tmp_path / "data").iterdir()), "the section's scratch folder is removed"
