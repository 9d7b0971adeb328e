"""draftfeed's sharded cache layout, `<cache>/<row // 1000, 4 digits>/hs_<row>.safetensors`, beside
the flat one, `<cache>/hs_<row>.safetensors`: read file by file in either (a cache half migrated, bf16
and FP8 files mixed) with the same batches the reference makes from the same files laid out flat;
written by `draftfeed quantize` and `draftfeed generate` with `--layout sharded`; counted by `verify`.

The flat rule is hs-connectors 0.9.0's own (the path its FileTransfer.get_cached reads, asked of the
installed package); the sharded rule is draftfeed's own (hs-connectors 0.9.0 has none), as issue 27
states it: f"{row // 1000:04d}/hs_{row}.safetensors" under the cache folder."""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from fp8_fixtures import write_fp8_file
from hs_connectors import FP8Transfer
from reference_fixtures import assert_same_batch, write_fixture
from safetensors.torch import load_file

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = pytest.mark.timeout(300)

ROWS, MAX_LEN, HIDDEN = 1200, 512, 8
BATCHES = 10  # the epoch's first batches: rows from all over both shard folders (the reference is slow)


def flat_path(root, row: int) -> str:
    """Where hs-connectors 0.9.0's FileTransfer looks for `row`: asked of the installed package."""
    import hs_connectors.transfer as transfer

    asked: list[str] = []
    original = transfer._load_hs_file
    transfer._load_hs_file = lambda path: asked.append(os.fspath(path))  # type: ignore[assignment]
    try:
        transfer.FileTransfer(Path(root)).get_cached(row)
    finally:
        transfer._load_hs_file = original
    return asked[0]


def sharded_path(root, row: int) -> str:
    """draftfeed's sharded rule (issue 27): a folder per thousand rows."""
    return os.path.join(os.fspath(root), f"{row // 1000:04d}", f"hs_{row}.safetensors")


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    """1200 rows (two shard folders) written by `datasets`, their bf16 files by `safetensors`."""
    path = tmp_path_factory.mktemp("sharded") / "data"
    return write_fixture(str(path), rows=ROWS, hidden_size=HIDDEN, max_len=MAX_LEN, distinct=False)


def mixed_copies(fixture, tmp_path) -> tuple[Path, Path]:
    """The same files twice: all flat (for the reference), and half of them moved to the sharded
    layout; a fifth of the rows FP8 files written by hs-connectors' own FP8 connector."""
    rng = np.random.default_rng(5)
    source = Path(fixture.path) / "hidden_states"
    flat, mixed = tmp_path / "flat", tmp_path / "mixed"
    flat.mkdir()
    mixed.mkdir()
    for row in range(fixture.rows):
        name = Path(flat_path(source, row)).name
        target_flat = flat_path(flat, row)
        if rng.random() < 0.2:
            tensors = load_file(str(source / name))
            write_fp8_file(target_flat, tensors["hidden_states"], tensors["token_ids"])
        else:
            shutil.copyfile(source / name, target_flat)
        target = sharded_path(mixed, row) if rng.random() < 0.5 else flat_path(mixed, row)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(target_flat, target)
    return flat, mixed


def reference_batches(fixture, transfer, epoch: int = 0) -> list[dict]:
    """speculators 0.9.0's dataset, sampler and collate reading through `transfer`."""
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = ArrowDataset(max_len=MAX_LEN, datapath=fixture.path, transfer=transfer, on_missing="skip",
                               train_ratio=0.9, split="train", hidden_states_dtype=torch.bfloat16)
        sampler = MultipackDistributedBatchSamplerV2(batch_max_length=MAX_LEN, lengths=dataset.approx_lengths,
                                                     num_replicas=1, rank=0, max_batches=BATCHES)
        sampler.set_epoch(epoch)
        collate = CollateFn(MAX_LEN, HIDDEN, num_target_layers=fixture.layers - 1, dtype=torch.bfloat16)
        return [collate([dataset[int(i)] for i in batch]) for batch in sampler]


def test_a_half_sharded_cache_gives_the_reference_batches_of_the_flat_one(fixture, tmp_path, run_cli_json):
    flat, mixed = mixed_copies(fixture, tmp_path)
    expected = reference_batches(fixture, FP8Transfer(flat))
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=mixed,
                              num_target_layers=fixture.layers - 1, train_ratio=0.9, max_batches=BATCHES,
                              pin_memory=False)
    ours = list(loader)
    loader.close()
    assert len(ours) == len(expected) == BATCHES
    rows = [int(r) for batch in loader.batch_sampler._generate_batches(0) for r in batch]
    assert min(rows) < 1000 <= max(rows), "the batches read both shard folders"
    for k, (a, b) in enumerate(zip(ours, expected)):
        assert_same_batch(a, b, f"batch {k}")
    sharded = sum(1 for _ in mixed.glob("[0-9][0-9][0-9][0-9]/hs_*.safetensors"))
    assert 0.4 * ROWS < sharded < 0.6 * ROWS
    report = run_cli_json("verify", fixture.path, "--hidden-states", mixed)
    assert report["ok"] == ROWS and report["missing"] == 0
    assert report["layouts"] == {"flat": ROWS - sharded, "sharded": sharded}


def test_a_missing_file_is_reported_at_both_paths(fixture, tmp_path):
    store = draftfeed.HiddenStateStore(str(tmp_path / "empty"))
    assert store.lookup(1234) is None
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN,
                              hidden_states_path=tmp_path / "empty", on_missing="raise", pin_memory=False)
    with pytest.raises(Exception) as raised:
        next(iter(loader))
    loader.close()
    message = str(raised.value)
    row = int(message.split("row ")[1].split(":")[0])
    assert flat_path(tmp_path / "empty", row) in message and sharded_path(tmp_path / "empty", row) in message


def test_quantize_writes_the_sharded_layout(fixture, tmp_path, run_cli_json):
    source = Path(fixture.path) / "hidden_states"
    rows = range(990, 1010)  # across a shard boundary
    # Into another folder, sharded: the connector's own bytes at the sharded rule's paths.
    out = tmp_path / "fp8"
    report = run_cli_json("quantize", fixture.path, "--out", out, "--layout", "sharded", "--rows", "990:1010")
    assert report["converted"] == len(rows)
    theirs = tmp_path / "theirs.safetensors"
    for row in rows:
        tensors = load_file(flat_path(source, row))
        write_fp8_file(str(theirs), tensors["hidden_states"], tensors["token_ids"])
        assert Path(sharded_path(out, row)).read_bytes() == theirs.read_bytes(), row
        assert not os.path.exists(flat_path(out, row))
    # In place with --layout sharded: a flat cache ends sharded, its FP8 files moved too.
    cache = tmp_path / "cache"
    cache.mkdir()
    for row in rows:
        shutil.copyfile(flat_path(source, row), flat_path(cache, row))
    tensors = load_file(flat_path(source, 995))
    write_fp8_file(flat_path(cache, 995), tensors["hidden_states"], tensors["token_ids"])  # already FP8
    report = run_cli_json("quantize", fixture.path, "--in-place", "--hidden-states", cache, "--layout", "sharded",
                          "--rows", "990:1010")
    assert report["converted"] == len(rows) - 1 and report["already_fp8"] == 1 and report["moved"] == 1
    assert not list(cache.glob("hs_*")), "no flat file is left"
    for row in rows:
        assert load_file(sharded_path(cache, row))["hidden_states"].dtype == torch.float8_e4m3fn
    verify = run_cli_json("verify", fixture.path, "--hidden-states", cache)
    assert verify["ok"] == len(rows) and verify["layouts"] == {"flat": 0, "sharded": len(rows)}


def test_generate_writes_the_sharded_layout(tmp_path, run_cli):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), 1006, seed=5, min_len=4, max_len=24, vocab=5000)
    with SimServerProcess(tmp_path / "server", layers=4, hidden=16, seed=3) as sim:
        proc = run_cli("generate", data, "--endpoint", sim.url, "--server-dir", tmp_path / "server",
                       "--layout", "sharded", "--rows", "996:1006", "--no-progress", "--fetch-threads", "3")
        assert "10 generated" in proc.stdout, proc.stdout
    cache = data / "hidden_states"
    for row in range(996, 1006):
        assert os.path.exists(sharded_path(cache, row)), row
        assert not os.path.exists(flat_path(cache, row)), row
    assert {p.name for p in cache.iterdir()} == {"0000", "0001"}
    again = run_cli("generate", data, "--endpoint", "http://127.0.0.1:9/v1", "--rows", "996:1006",
                    "--no-progress")
    assert "10 already valid" in again.stdout
