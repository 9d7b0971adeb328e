"""`draftfeed demo` and `draftfeed bench`: the README's first command, on a small size."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(300)


def test_demo_streams_an_epoch_and_summarises(run_cli, tmp_path):
    out = tmp_path / "demo"
    proc = run_cli("demo", "--out", out, "--rows", "24", "--hidden-size", "64", "--total-seq-len", "512",
                   "--no-online")
    text = proc.stdout
    assert "1. dataset   24 rows" in text
    assert re.search(r"2\. cache     24 hidden-state files", text)
    assert re.search(r"train 0: \d+ batches, \d+ tokens", text)
    assert re.search(r"throughput\s+\d+ tokens/s, [0-9.]+ GB/s of hidden states", text)
    assert "first batch" in text and "consumer waited" in text and "peak memory" in text
    assert "samples dropped  none" in text
    assert (out / "hidden_states" / "hs_0.safetensors").exists()  # --out keeps the data


def test_demo_runs_an_online_epoch_through_the_simulated_server(run_cli, tmp_path):
    out = tmp_path / "demo"
    proc = run_cli("demo", "--out", out, "--rows", "20", "--hidden-size", "32", "--total-seq-len", "512",
                   "--epochs", "1", "--python", sys.executable, "--fetch-threads", "4", timeout=240)
    text = proc.stdout
    assert "5. online" in text and "skipped" not in text, text
    assert re.search(r"server    http://127\.0\.0\.1:\d+/v1", text)
    from safetensors.torch import load_file

    import draftfeed

    dataset = draftfeed.open_dataset(str(out))
    train_rows = dataset.split(0.9)[0].num_rows
    match = re.search(r"online    (\d+) generated, 0 failed, \d+ requests, max (\d+) in flight", text)
    assert match and int(match.group(1)) == train_rows and 1 <= int(match.group(2)) <= 4
    assert text.count("samples dropped  none") == 3  # train, val, the online epoch
    # The online epoch keeps what it generated as the cache of a later run (on_generate=cache).
    cached = sorted((out / "online_cache").glob("hs_*.safetensors"))
    assert len(cached) == train_rows
    assert not list((out / "server").glob("*.safetensors")), "nothing is left in the server folder"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from sim_vllm_server import hidden_states_for

    for row in (0, train_rows - 1):
        loaded = load_file(str(out / "online_cache" / f"hs_{row}.safetensors"))
        ids = list(dataset.input_ids(row))
        assert loaded["token_ids"].tolist() == ids
        expected = torch.from_numpy(hidden_states_for(ids, 4, 32, 0)).to(torch.bfloat16)
        assert torch.equal(loaded["hidden_states"], expected)


def test_demo_online_step_is_skipped_with_a_note_when_the_server_cannot_start(run_cli, tmp_path):
    proc = run_cli("demo", "--rows", "12", "--hidden-size", "16", "--total-seq-len", "256", "--epochs", "1",
                   "--python", str(tmp_path / "no-such-python"))
    assert "5. online" in proc.stdout and "skipped: the simulated server did not start" in proc.stdout


def test_bench_json_counts_every_token_of_the_plan(run_cli, tmp_path):
    out = tmp_path / "demo"
    run_cli("demo", "--out", out, "--rows", "30", "--hidden-size", "32", "--total-seq-len", "1024",
            "--no-online")
    report = json.loads(
        run_cli("bench", out, "--max-len", "1024", "--json", "--noise-std", "0").stdout
    )
    import draftfeed

    dataset = draftfeed.open_dataset(str(out))
    train, _val = dataset.split(0.9)
    lengths = train.seq_lens()
    plan = draftfeed.plan_batches(lengths, 1024, 1, 0)
    expected_tokens = sum(min(int(sum(lengths[b])), 1024) for b in plan)
    train_pass = report["passes"][0]
    assert train_pass["batches"] == len(plan)
    assert train_pass["tokens"] == expected_tokens
    assert train_pass["hidden_bytes"] == expected_tokens * 4 * 32 * 2  # 3 target layers + last, bf16
    assert report["passes"][1]["label"] == "val 0"


def test_bench_without_a_cache_is_a_clear_error(run_cli, tmp_path):
    run_cli("synth", tmp_path / "d", "--rows", "10")
    proc = run_cli("bench", tmp_path / "d", check=False)
    assert proc.returncode != 0
    assert "no readable hidden-state file" in proc.stderr and "--hidden-size" in proc.stderr
