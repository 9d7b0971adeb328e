"""The benchmark's reference-with-noise (bench/reference_noise.py): speculators 0.9.0's loader with the
seed's per-sample uniform noise re-implemented. It must change only `hidden_states`, by x + (2u - 1) *
std with u uniform in [0, 1), and leave every other key and the batches' composition as 0.9.0 makes
them, so that the benchmark compares draftfeed's noise with the reference doing the same work."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from dropin_helpers import SPECULATORS_090_CALL, iterate, reference_loaders

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from reference_noise import UniformNoiseDataset, with_uniform_noise

STD = 0.05


def test_reference_with_noise_changes_only_hidden_states_by_at_most_std(tmp_path):
    data = str(tmp_path / "data")
    draftfeed.write_synthetic_dataset(data, 40, seed=3, min_len=8, max_len=48)
    dataset = draftfeed.open_dataset(data)
    ids = [dataset.row(i)["input_ids"].tolist() for i in range(len(dataset))]
    draftfeed.write_synthetic_hidden_states(str(tmp_path / "data" / "hidden_states"), ids, seed=3,
                                            hidden_size=32, layers=4, dtype="BF16")
    args = dict(
        data_path=data, total_seq_len=128, hidden_states_dtype=torch.bfloat16, transfer=None,
        vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip", verifier_name_or_path="unused",
        request_timeout=120.0, max_retries=3, generation_validation_retries=2,
        max_consecutive_generation_failures=20, hidden_size=32, num_target_layers=3, num_workers=0,
        prefetch_factor=4, preprocess=None, train_data_ratio=0.9, seed=42,
    )
    assert set(args) == set(SPECULATORS_090_CALL)
    plain, _ = reference_loaders(args)
    noisy_train, _ = reference_loaders(args)
    noisy = with_uniform_noise(noisy_train, STD)
    assert isinstance(noisy.dataset, UniformNoiseDataset)
    assert noisy.batch_sampler is noisy_train.batch_sampler
    torch.manual_seed(0)
    a, b = iterate(plain), iterate(noisy)
    assert len(a) == len(b) > 2
    diffs = []
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for key in x:
            if key == "hidden_states":
                continue
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key
        hx, hy = x["hidden_states"].float(), y["hidden_states"].float()
        real = x["document_ids"].reshape(-1) >= 0
        assert torch.equal(hx[0, ~real], hy[0, ~real])  # padding stays zero
        d = (hy - hx)[0, real]
        # x + (2u - 1) * std computed in bf16 (the file's dtype): up to bf16 rounding of the noise
        # (relative 2^-8) and of the sum (half an ulp of x: relative 2^-8, 2^-7 for safety).
        assert bool((d.abs() <= STD * (1 + 2**-8) + hx[0, real].abs() * 2**-7).all())
        diffs.append(d.reshape(-1))
    d = torch.cat(diffs)
    assert d.numel() > 10_000
    assert abs(float(d.mean())) < 0.003  # centred
    # uniform in [-std, std): about half the draws lie beyond std / 2
    assert 0.4 < float((d.abs() > STD / 2).float().mean()) < 0.6
