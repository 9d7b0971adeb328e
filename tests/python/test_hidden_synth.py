"""`draftfeed synth --hidden-size ...`: a cache the reference trainer's data path accepts, with the
token ids of the dataset written beside it and the documented values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import load_from_disk
from hs_connectors.transfer import FileTransfer
from speculators.data_generation.offline import check_hidden_states
from test_hidden_store import synthetic_values

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)])
def test_synth_writes_a_cache_the_reference_accepts(tmp_path, run_cli_json, dtype, torch_dtype):
    out = tmp_path / "data"
    report = run_cli_json("synth", out, "--rows", "9", "--seed", "4", "--min-len", "3", "--max-len", "30",
                          "--hidden-size", "24", "--layers", "3", "--dtype", dtype)
    hidden = report["hidden_states"]
    assert hidden["files"] == 9 and hidden["folder"] == str(out / "hidden_states")
    assert hidden["hidden_size"] == 24 and hidden["layers"] == 3
    dataset = load_from_disk(str(out))
    transfer = FileTransfer(Path(hidden["folder"]))
    for row in range(9):
        ids = list(dataset[row]["input_ids"])
        loaded = transfer.get_cached(row)
        check_hidden_states(loaded, ids)  # raises on any problem
        assert loaded["hidden_states"].dtype == torch_dtype
        t = len(ids)
        positions, layers, hs = np.meshgrid(np.arange(t), np.arange(3), np.arange(24), indexing="ij")
        np.testing.assert_array_equal(loaded["hidden_states"].float().numpy(),
                                      synthetic_values(4, row, positions, layers, hs))
    verified = run_cli_json("verify", out)
    assert verified["ok"] == 9 and verified["rows"] == 9


def test_synth_hidden_flags_are_checked(tmp_path, run_cli):
    proc = run_cli("synth", tmp_path / "d", "--rows", "2", "--hidden-size", "8", "--dtype", "f64", check=False)
    assert proc.returncode == 2 and "--dtype must be bf16, f16 or f32, got 'f64'" in proc.stderr
    proc = run_cli("synth", tmp_path / "e", "--rows", "2", "--layers", "3", check=False)
    assert proc.returncode == 2 and "need --hidden-size H" in proc.stderr
    proc = run_cli("synth", tmp_path / "f", "--rows", "2", "--hidden-size", "0", check=False)
    assert proc.returncode == 2 and "hidden_size > 0" in proc.stderr
