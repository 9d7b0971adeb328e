"""The FP8 commands: `draftfeed quantize` (a bf16 cache to hs-connectors' FP8 files) against the FP8
connector's own files and hs-connectors' FP8Transfer; `draftfeed verify` on FP8 files (scales,
shapes, NaN codes); `draftfeed generate --fp8` with the simulated vLLM server."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from fp8_fixtures import write_fp8_file
from hs_connectors import FP8Transfer
from hs_connectors.fp8_utils import quantize_tensor_to_fp8
from reference_fixtures import write_fixture
from safetensors.torch import load_file, save_file

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cache(tmp_path):
    """A datasets-written dataset and its bf16 cache (safetensors' save_file): 30 rows, two missing,
    one with token ids that differ from its row."""
    path = str(tmp_path / "data")
    fx = write_fixture(path, rows=30, max_len=80, hidden_size=32, missing=(3, 20), mismatched=(7,))
    return fx, Path(path) / "hidden_states"


def rows_with_files(fx):
    return [r for r in range(fx.rows) if r not in fx.missing]


def test_quantize_into_a_folder_writes_the_connectors_files(cache, tmp_path, run_cli, run_cli_json):
    fx, hidden = cache
    out = tmp_path / "fp8"
    proc = run_cli("quantize", fx.path, "--out", out, "--json", check=False)
    assert proc.returncode == 1, proc.stderr  # the mismatched file is left unconverted
    report = json.loads(proc.stdout)
    assert report["converted"] == fx.rows - 3 and report["missing"] == 2
    assert report["skipped"]["mismatched"] == 1
    assert report["examples"]["mismatched"][0]["row"] == 7
    before = sum(os.path.getsize(hidden / f"hs_{r}.safetensors") for r in rows_with_files(fx) if r != 7)
    after = sum(os.path.getsize(out / f"hs_{r}.safetensors") for r in rows_with_files(fx) if r != 7)
    assert report["bytes_before"] == before and report["bytes_after"] == after
    assert 0.45 < after / before < 0.6
    for row in rows_with_files(fx):
        if row == 7:
            assert not (out / f"hs_{row}.safetensors").exists()
            continue
        bf16 = load_file(str(hidden / f"hs_{row}.safetensors"))
        theirs = tmp_path / "theirs.safetensors"
        write_fp8_file(str(theirs), bf16["hidden_states"], bf16["token_ids"])
        assert (out / f"hs_{row}.safetensors").read_bytes() == theirs.read_bytes(), row
        # FP8Transfer reads our file back exactly as it reads the connector's.
        connector_dir = tmp_path / "connector"
        connector_dir.mkdir(exist_ok=True)
        theirs.replace(connector_dir / f"hs_{row}.safetensors")
        ours = FP8Transfer(out).get_cached(row)
        ref = FP8Transfer(connector_dir).get_cached(row)
        assert sorted(ours) == sorted(ref) == ["hidden_states", "token_ids"]
        assert torch.equal(ours["hidden_states"], ref["hidden_states"])
        assert torch.equal(ours["token_ids"], bf16["token_ids"])
    # No temporary file left behind: only the writer lock the conversion held (it stays).
    assert [p.name for p in out.glob(".*")] == [".draftfeed-writer.lock"]
    # The source cache is untouched, and the new one verifies (the mismatched row is absent there).
    assert load_file(str(hidden / "hs_0.safetensors"))["hidden_states"].dtype == torch.bfloat16
    verify = run_cli_json("verify", fx.path, "--hidden-states", out)
    assert verify["ok"] == fx.rows - 3 and verify["missing"] == 3 and verify["corrupt"] == 0


def test_quantize_resumes_and_replaces_what_is_not_a_valid_fp8_file(cache, tmp_path, run_cli, run_cli_json):
    fx, hidden = cache
    os.remove(hidden / "hs_7.safetensors")
    out = tmp_path / "fp8"
    first = run_cli_json("quantize", fx.path, "--out", out, "--rows", "0:10")
    assert first["converted"] == 8 and first["rows"] == 10
    kept = (out / "hs_1.safetensors").stat().st_mtime_ns
    (out / "hs_2.safetensors").write_bytes(b"truncated")  # a crash mid-write elsewhere
    shutil.copy(hidden / "hs_4.safetensors", out / "hs_4.safetensors")  # bf16 where FP8 belongs
    second = run_cli_json("quantize", fx.path, "--out", out)
    assert second["already_fp8"] == 6 and second["converted"] == fx.rows - 3 - 6
    assert (out / "hs_1.safetensors").stat().st_mtime_ns == kept
    for row in (2, 4):
        assert load_file(str(out / f"hs_{row}.safetensors"))["hidden_states"].dtype == torch.float8_e4m3fn
    third = run_cli_json("quantize", fx.path, "--out", out)
    assert third["converted"] == 0 and third["already_fp8"] == fx.rows - 3
    assert third["bytes_after"] == second["bytes_after"]


def test_quantize_in_place_then_again(cache, run_cli_json):
    fx, hidden = cache
    os.remove(hidden / "hs_7.safetensors")
    originals = {r: load_file(str(hidden / f"hs_{r}.safetensors")) for r in rows_with_files(fx) if r != 7}
    first = run_cli_json("quantize", fx.path, "--in-place", "--threads", "2")
    assert first["converted"] == len(originals)
    assert first["bytes_after"] == sum(os.path.getsize(hidden / f"hs_{r}.safetensors") for r in originals)
    for row, bf16 in originals.items():
        q, s = quantize_tensor_to_fp8(bf16["hidden_states"])
        got = load_file(str(hidden / f"hs_{row}.safetensors"))
        assert torch.equal(got["hidden_states"].view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(got["hidden_states_scales"], s)
    again = run_cli_json("quantize", fx.path, "--in-place")
    assert again["converted"] == 0 and again["already_fp8"] == len(originals)
    assert again["bytes_before"] == again["bytes_after"] == first["bytes_after"]


def test_quantize_needs_one_destination_and_a_readable_source(cache, tmp_path, run_cli):
    fx, hidden = cache
    for args in ([], ["--in-place", "--out", str(tmp_path / "x")]):
        proc = run_cli("quantize", fx.path, *args, check=False)
        assert proc.returncode == 2 and "exactly one of --out DIR" in proc.stderr
    (hidden / "hs_5.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}")
    proc = run_cli("quantize", fx.path, "--in-place", check=False)
    assert proc.returncode == 1
    assert "skipped (corrupt) 1" in proc.stdout and "hs_5.safetensors" in proc.stdout


@pytest.fixture
def fp8_cache(cache):
    """The same cache as the FP8 connector writes it."""
    fx, hidden = cache
    for row in rows_with_files(fx):
        t = load_file(str(hidden / f"hs_{row}.safetensors"))
        write_fp8_file(str(hidden / f"hs_{row}.safetensors"), t["hidden_states"], t["token_ids"])
    return fx, hidden


def rewrite(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_verify_checks_fp8_files(fp8_cache, run_cli):
    fx, hidden = fp8_cache
    clean = json.loads(run_cli("verify", fx.path, "--json", check=False).stdout)
    assert clean["ok"] == fx.rows - 3 and clean["mismatched"] == 1 and clean["corrupt"] == 0

    def scale(row, value):
        def edit(t):
            t["hidden_states_scales"][-1] = value
        rewrite(hidden / f"hs_{row}.safetensors", edit)

    scale(0, -0.5)
    scale(1, float("nan"))
    scale(2, float("inf"))
    scale(4, 0.0)
    rewrite(hidden / "hs_5.safetensors", lambda t: t.pop("hidden_states_scales"))
    rewrite(hidden / "hs_6.safetensors", lambda t: t.update(
        hidden_states_scales=t["hidden_states_scales"].to(torch.bfloat16)))
    rewrite(hidden / "hs_8.safetensors", lambda t: t.update(
        hidden_states_scales=t["hidden_states_scales"][:-1]))

    def nan_code(t):
        codes = t["hidden_states"].view(torch.uint8).clone()
        codes[1, 2, 3] = 0xFF
        t["hidden_states"] = codes.view(torch.float8_e4m3fn)

    rewrite(hidden / "hs_9.safetensors", nan_code)
    bf16 = hidden / "hs_10.safetensors"
    rewrite(bf16, lambda t: t.update(hidden_states=FP8Transfer(hidden).get_cached(10)["hidden_states"]))
    proc = run_cli("verify", fx.path, "--json", "--examples", "20", check=False)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["corrupt"] == 8 and report["nonfinite"] == 1
    reasons = {e["row"]: e["reason"] for e in report["examples"]["corrupt"]}
    for row in (0, 1, 2, 4):
        assert "not finite and positive" in reasons[row] and f"hs_{row}.safetensors" in reasons[row]
    assert "(first: token" in reasons[0] and "-0.5" in reasons[0]
    assert "no hidden_states_scales" in reasons[5]
    assert "BF16 [" in reasons[6] and "expected F32" in reasons[6]
    assert "expected F32 [" in reasons[8]
    assert "only used with F8_E4M3" in reasons[10]
    nonfinite = report["examples"]["nonfinite"][0]
    assert nonfinite["row"] == 9 and "1 NaN" in nonfinite["reason"]


def test_generate_fp8_caches_what_the_connector_would_write(tmp_path, run_cli):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), 12, seed=5, min_len=4, max_len=24, vocab=5000)
    with SimServerProcess(tmp_path / "server", layers=4, hidden=16, seed=3) as sim:
        proc = run_cli("generate", data, "--endpoint", sim.url, "--server-dir", tmp_path / "server",
                       "--fp8", "--no-progress", "--fetch-threads", "3")
        assert "12 generated" in proc.stdout, proc.stdout
        # The same rows generated as bf16, for the comparison.
        run_cli("generate", data, "--endpoint", sim.url, "--server-dir", tmp_path / "server",
                "--hidden-states", tmp_path / "bf16", "--no-progress")
    assert not [p for p in (tmp_path / "server").iterdir() if p.name.endswith(".safetensors")]
    for row in range(12):
        ours = (data / "hidden_states" / f"hs_{row}.safetensors")
        bf16 = load_file(str(tmp_path / "bf16" / f"hs_{row}.safetensors"))
        theirs = tmp_path / "theirs.safetensors"
        write_fp8_file(str(theirs), bf16["hidden_states"], bf16["token_ids"])
        assert ours.read_bytes() == theirs.read_bytes(), row
    again = run_cli("generate", data, "--endpoint", "http://127.0.0.1:9/v1", "--no-progress")
    assert "12 already valid" in again.stdout
