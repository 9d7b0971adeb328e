"""`draftfeed demo` and `draftfeed bench`: the README's first command, on a small size."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.timeout(300)


def test_demo_streams_an_epoch_and_summarises(run_cli, tmp_path):
    out = tmp_path / "demo"
    proc = run_cli("demo", "--out", out, "--rows", "24", "--hidden-size", "64", "--total-seq-len", "512")
    text = proc.stdout
    assert "1. dataset   24 rows" in text
    assert re.search(r"2\. cache     24 hidden-state files", text)
    assert re.search(r"train 0: \d+ batches, \d+ tokens", text)
    assert re.search(r"throughput\s+\d+ tokens/s, [0-9.]+ GB/s of hidden states", text)
    assert "first batch" in text and "consumer waited" in text and "peak memory" in text
    assert "samples dropped  none" in text
    assert (out / "hidden_states" / "hs_0.safetensors").exists()  # --out keeps the data


def test_bench_json_counts_every_token_of_the_plan(run_cli, tmp_path):
    out = tmp_path / "demo"
    run_cli("demo", "--out", out, "--rows", "30", "--hidden-size", "32", "--total-seq-len", "1024")
    report = json.loads(
        run_cli("bench", out, "--max-len", "1024", "--json", "--noise-std", "0").stdout
    )
    import draftfeed

    dataset = draftfeed.open_dataset(str(out))
    train, val = dataset.split(0.9)
    lengths = train.seq_lens()
    plan = draftfeed.plan_batches(lengths, 1024, 1, 0)
    expected_tokens = sum(min(int(sum(lengths[b])), 1024) for b in plan)
    train_pass = report["passes"][0]
    assert train_pass["batches"] == len(plan)
    assert train_pass["tokens"] == expected_tokens
    assert train_pass["hidden_bytes"] == expected_tokens * 4 * 32 * 2  # 3 target layers + last, bf16
    assert report["passes"][1]["label"] == "val"


def test_bench_without_a_cache_is_a_clear_error(run_cli, tmp_path):
    run_cli("synth", tmp_path / "d", "--rows", "10")
    proc = run_cli("bench", tmp_path / "d", check=False)
    assert proc.returncode != 0
    assert "no readable hidden-state file" in proc.stderr and "--hidden-size" in proc.stderr
