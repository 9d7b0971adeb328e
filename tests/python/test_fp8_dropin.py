"""FP8 caches through the drop-in against the reference: the cache written by hs-connectors' own FP8
connector, read by the reference with `FP8Transfer` (its dequantize, then the collate's cast) and by
draftfeed natively (the dequantize fused into the batch copy). Both called with speculators 0.9.0's
trainer's arguments. Also a folder mixing bf16 and FP8 files, the EAGLE-3 shift, the per-sample Python
path, noise on top of the dequantize, and files with bad scales dropped with their reason."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from dropin_helpers import assert_same, iterate, our_loaders, reference_loaders
from fp8_fixtures import convert_cache_with_connector
from hs_connectors import FP8Transfer
from reference_fixtures import write_fixture
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.timeout(600)

MAX_LEN = 96


def make(tmp_path_factory, name: str, fp8_rows) -> tuple:
    path = str(tmp_path_factory.mktemp(name) / "data")
    fx = write_fixture(path, rows=48, max_len=MAX_LEN, hidden_size=24, missing=(5, 30),
                       mismatched=(11,), long_rows=(14, 40))
    hidden = os.path.join(path, "hidden_states")
    convert_cache_with_connector(hidden, [r for r in range(fx.rows) if fp8_rows(r)])
    return fx, hidden


@pytest.fixture(scope="module")
def fp8_cache(tmp_path_factory):
    return make(tmp_path_factory, "fp8", lambda r: True)


@pytest.fixture(scope="module")
def mixed_cache(tmp_path_factory):
    return make(tmp_path_factory, "mixed", lambda r: r % 2 == 0)


def base_args(fx, transfer, **overrides):
    args = dict(
        data_path=fx.path, total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16, transfer=transfer,
        vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip", verifier_name_or_path="unused",
        request_timeout=5.0, max_retries=0, generation_validation_retries=0,
        max_consecutive_generation_failures=3, hidden_size=fx.hidden_size, num_target_layers=fx.layers - 1,
        num_workers=0, prefetch_factor=4, preprocess=None, train_data_ratio=0.75, seed=42,
    )
    args.update(overrides)
    return args


def compare_all(ours, ref, context: str, epochs=(0, 1)) -> int:
    """Every train batch of `epochs` and every val batch equal; returns the batches compared."""
    (train, val), (ref_train, ref_val) = ours, ref
    n = 0
    for epoch in epochs:
        train.batch_sampler.set_epoch(epoch)
        ref_train.batch_sampler.set_epoch(epoch)
        for k, (a, b) in enumerate(zip(iterate(train), iterate(ref_train), strict=True)):
            assert_same(a, b, f"{context} train epoch {epoch} batch {k}")
            n += 1
    for k, (a, b) in enumerate(zip(iterate(val), iterate(ref_val), strict=True)):
        assert_same(a, b, f"{context} val batch {k}")
        n += 1
    return n


def test_the_fixture_is_hs_connectors_fp8(fp8_cache, mixed_cache):
    _, hidden = fp8_cache
    loaded = load_file(os.path.join(hidden, "hs_0.safetensors"))
    assert loaded["hidden_states"].dtype == torch.float8_e4m3fn
    assert loaded["hidden_states_scales"].dtype == torch.float32
    _, mixed = mixed_cache
    assert load_file(os.path.join(mixed, "hs_1.safetensors"))["hidden_states"].dtype == torch.bfloat16
    assert load_file(os.path.join(mixed, "hs_2.safetensors"))["hidden_states"].dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("cache", ["fp8_cache", "mixed_cache"])
@pytest.mark.parametrize("dequantize", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("batch_dtype", [torch.bfloat16, torch.float32])
def test_fp8transfer_batches_equal_the_reference(request, topology, cache, dequantize, batch_dtype):
    fx, hidden = request.getfixturevalue(cache)
    topology(0, 1, via_env=False)
    transfer = FP8Transfer(Path(hidden), dequantize_dtype=dequantize)
    ref = reference_loaders(base_args(fx, transfer, hidden_states_dtype=batch_dtype))
    ours = our_loaders(base_args(fx, transfer, hidden_states_dtype=batch_dtype, num_workers=2))
    assert ours[0]._source is None, "an FP8Transfer must take the native path, not the Python callback"
    assert compare_all(ours, ref, f"{cache} dequantize {dequantize} batch {batch_dtype}") > 10


def test_native_path_never_calls_fp8transfer(fp8_cache, topology, monkeypatch):
    fx, hidden = fp8_cache
    topology(0, 1, via_env=False)
    transfer = FP8Transfer(Path(hidden))
    ref = reference_loaders(base_args(fx, transfer))
    expected = [b["hidden_states"].clone() for b in iterate(ref[0])]

    def fail(*args, **kwargs):
        raise AssertionError("FP8Transfer called back")

    monkeypatch.setattr(FP8Transfer, "get_cached", fail)
    train, _ = our_loaders(base_args(fx, transfer, num_workers=2))
    got = [b["hidden_states"] for b in iterate(train)]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_eagle3_shift_and_python_preprocess_equal_the_reference(mixed_cache, topology):
    from speculators.models.eagle3.data import shift_batch

    fx, hidden = mixed_cache
    topology(0, 1, via_env=False)
    transfer = FP8Transfer(Path(hidden))
    for name, preprocess in (("native eagle3", shift_batch), ("python", lambda s: shift_batch(s))):
        ref = reference_loaders(base_args(fx, transfer, preprocess=shift_batch))
        ours = our_loaders(base_args(fx, transfer, preprocess=preprocess, num_workers=2))
        assert compare_all(ours, ref, name, epochs=(0,)) > 5


def test_fp8_with_noise_equals_the_dequantized_bf16_cache_with_noise(fp8_cache, tmp_path, topology):
    """Noise comes on top of the dequantized values: an FP8 cache with noise gives exactly what a bf16
    cache holding FP8Transfer's dequantized values gives with the same noise."""
    fx, hidden = fp8_cache
    topology(0, 1, via_env=False)
    data = tmp_path / "data"
    shutil.copytree(fx.path, data, ignore=shutil.ignore_patterns("hidden_states"))
    (data / "hidden_states").mkdir()
    transfer = FP8Transfer(Path(hidden))
    for row in range(fx.rows):
        sample = transfer.get_cached(row)
        if sample is not None:
            save_file(sample, str(data / "hidden_states" / f"hs_{row}.safetensors"))
    fx2 = type(fx)(str(data), fx.rows, fx.hidden_size, fx.layers)
    fp8_train, _ = our_loaders(base_args(fx, transfer, noise_std=0.05, num_workers=2))
    bf16_train, _ = our_loaders(base_args(fx2, None, noise_std=0.05, num_workers=2))
    clean, _ = our_loaders(base_args(fx2, None, num_workers=2))
    for a, b, c in zip(iterate(fp8_train), iterate(bf16_train), iterate(clean), strict=True):
        assert torch.equal(a["hidden_states"], b["hidden_states"])
        assert torch.equal(a["verifier_last_hidden_states"], c["verifier_last_hidden_states"])
        assert not torch.equal(a["hidden_states"], c["hidden_states"])


def corrupt(path: str, how: str) -> None:
    tensors = load_file(path)
    if how == "negative scale":
        tensors["hidden_states_scales"][1] = -tensors["hidden_states_scales"][1]
    elif how == "nan scale":
        tensors["hidden_states_scales"][0] = float("nan")
    elif how == "zero scale":
        tensors["hidden_states_scales"][2] = 0.0
    elif how == "no scales":
        del tensors["hidden_states_scales"]
    elif how == "flat scales":
        tensors["hidden_states_scales"] = tensors["hidden_states_scales"].reshape(-1)
    elif how == "nan code":
        codes = tensors["hidden_states"].view(torch.uint8).clone()
        codes[0, 0, 0] = 0x7F
        tensors["hidden_states"] = codes.view(torch.float8_e4m3fn)
    save_file(tensors, path)


BAD = {0: "negative scale", 2: "nan scale", 3: "zero scale", 6: "no scales", 7: "flat scales", 8: "nan code"}
REASONS = {"negative scale": "not finite and positive", "nan scale": "not finite and positive",
           "zero scale": "not finite and positive", "no scales": "no hidden_states_scales",
           "flat scales": "expected F32 [", "nan code": "non-finite"}


def test_bad_fp8_files_are_dropped_with_their_reason(fp8_cache, tmp_path, topology):
    """Our batches with the bad files equal the reference's with those files absent (dropped under
    on_missing=skip); each drop is reported naming the file (or row) and the reason."""
    fx, _hidden = fp8_cache
    topology(0, 1, via_env=False)
    bad_data, absent_data = tmp_path / "bad" / "data", tmp_path / "absent" / "data"
    for target in (bad_data, absent_data):
        shutil.copytree(fx.path, target)
    for row, how in BAD.items():
        corrupt(str(bad_data / "hidden_states" / f"hs_{row}.safetensors"), how)
        os.remove(absent_data / "hidden_states" / f"hs_{row}.safetensors")
    bad_fx = type(fx)(str(bad_data), fx.rows, fx.hidden_size, fx.layers)
    absent_fx = type(fx)(str(absent_data), fx.rows, fx.hidden_size, fx.layers)
    ref = reference_loaders(base_args(absent_fx, FP8Transfer(absent_data / "hidden_states")))
    ours = our_loaders(base_args(bad_fx, FP8Transfer(bad_data / "hidden_states"), num_workers=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train, ref_train = ours[0], ref[0]
        for k, (a, b) in enumerate(zip(list(train), iterate(ref_train), strict=True)):
            assert_same(a, b, f"bad-file batch {k}")
        val = list(ours[1])
    assert len(val) > 0
    text = "\n".join(str(w.message) for w in caught)
    train_rows = set(np.concatenate(train.batch_sampler._generate_batches(0)).tolist())
    for row, how in BAD.items():
        if row not in train_rows:
            continue
        assert f"hs_{row}.safetensors" in text or f"row {row}:" in text, (how, text)
        assert REASONS[how] in text, (how, text)


@pytest.mark.parametrize(
    "make_transfer, native",
    [
        (lambda p: FP8Transfer(p), True),
        (lambda p: FP8Transfer(p, dequantize_dtype=torch.float32), True),
        (lambda p: FP8Transfer(p, dequantize_dtype=torch.float64), False),
        (lambda p: type("MyFP8", (FP8Transfer,), {})(p), False),
    ],
)
def test_which_fp8_transfers_take_the_native_path(fp8_cache, make_transfer, native):
    from draftfeed.speculators import _hidden_states_path

    fx, hidden = fp8_cache
    folder, python_transfer, _ = _hidden_states_path(fx.path, make_transfer(Path(hidden)))
    assert (python_transfer is None) == native
    if native:
        assert folder == hidden
