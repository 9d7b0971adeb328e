"""Sample validation against the reference's check_hidden_states, and NaN/Inf counts per layer slot
against torch's own isnan/isinf on the loaded tensor."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.torch
import torch
from speculators.data_generation.offline import check_hidden_states

import draftfeed

pytestmark = pytest.mark.timeout(120)


def write(tmp_path, name, tensors):
    path = tmp_path / f"{name}.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    return str(path)


def good(tokens=6, layers=4, hidden=32, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "token_ids": torch.arange(tokens, dtype=torch.int64) + 50,
        "hidden_states": torch.randn(tokens, layers, hidden, generator=g).to(dtype),
    }


def reference_accepts(tensors, ids) -> bool:
    try:
        check_hidden_states(tensors, list(ids))
    except ValueError:
        return False
    return True


def cases():
    ids = list(range(50, 56))
    base = good()
    nan = good()
    nan["hidden_states"][2, 1, 5] = float("nan")
    inf = good(dtype=torch.float16)
    inf["hidden_states"][0, 3, 0] = float("-inf")
    f32 = good(dtype=torch.float32)
    f32["hidden_states"][5, 0, 31] = float("inf")
    short = good(tokens=5)
    long_hidden = {"token_ids": base["token_ids"], "hidden_states": good(tokens=7)["hidden_states"]}
    wrong_id = good()
    wrong_id["token_ids"][3] = 7
    int32_ids = {"token_ids": base["token_ids"].to(torch.int32), "hidden_states": base["hidden_states"]}
    return [
        ("ok bf16", base, ids, "ok"),
        ("ok f16", good(dtype=torch.float16), ids, "ok"),
        ("ok f32", good(dtype=torch.float32), ids, "ok"),
        ("ok int32 ids", int32_ids, ids, "ok"),
        ("nan", nan, ids, "non-finite"),
        ("inf f16", inf, ids, "non-finite"),
        ("inf f32", f32, ids, "non-finite"),
        ("fewer ids", short, ids, "token mismatch"),
        ("wrong T", long_hidden, ids, "length mismatch"),
        ("wrong id", wrong_id, ids, "token mismatch"),
    ]


@pytest.mark.parametrize("name,tensors,ids,problem", cases(), ids=[c[0] for c in cases()])
def test_same_decision_as_check_hidden_states(tmp_path, name, tensors, ids, problem):
    path = write(tmp_path, "s", tensors)
    result = draftfeed.validate_hidden_states(path, np.asarray(ids, dtype=np.int64), row=8)
    assert result["problem"] == problem, result["message"]
    assert result["ok"] == (problem == "ok")
    assert result["ok"] == reference_accepts(safetensors.torch.load_file(path), ids)
    if not result["ok"]:
        assert path in result["message"] and "(row 8)" in result["message"]


def test_missing_key_matches_the_reference(tmp_path):
    path = write(tmp_path, "k", {"token_ids": torch.arange(3)})
    result = draftfeed.validate_hidden_states(path, np.arange(3))
    assert result["problem"] == "missing key"
    assert "no tensor `hidden_states`" in result["message"]
    assert not reference_accepts(safetensors.torch.load_file(path), [0, 1, 2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_nan_and_inf_counts_per_layer_slot_match_torch(tmp_path, dtype):
    rng = np.random.default_rng(3)
    tensors = good(tokens=40, layers=4, hidden=100, dtype=dtype, seed=1)
    hidden = tensors["hidden_states"]
    flat = hidden.view(-1)
    for index in rng.choice(flat.numel(), size=60, replace=False):
        flat[index] = float(rng.choice([np.nan, np.inf, -np.inf]))
    path = write(tmp_path, "n", tensors)
    result = draftfeed.validate_hidden_states(path, np.arange(50, 90))
    assert result["problem"] == "non-finite"
    loaded = safetensors.torch.load_file(path)["hidden_states"].float()
    nan_per_layer = torch.isnan(loaded).sum(dim=(0, 2)).tolist()
    inf_per_layer = torch.isinf(loaded).sum(dim=(0, 2)).tolist()
    assert result["per_layer"] == list(zip(nan_per_layer, inf_per_layer))
    assert result["nan_count"] == sum(nan_per_layer)
    assert result["inf_count"] == sum(inf_per_layer)
    assert result["nonfinite_layers"] == [k for k in range(4) if nan_per_layer[k] + inf_per_layer[k]]
    assert f"{result['nan_count']} NaN and {result['inf_count']} Inf values" in result["message"]


def test_kernels_agree_with_numpy_on_random_buffers():
    rng = np.random.default_rng(0)
    for trial in range(200):
        count = int(rng.integers(0, 3000))
        values = rng.standard_normal(count + 3).astype(np.float32)
        if trial % 2 and count:
            values[rng.integers(0, count)] = rng.choice([np.nan, np.inf, -np.inf])
        for dtype, np_values in (("F32", values), ("F16", values.astype(np.float16)),
                                 ("BF16", torch.from_numpy(values).to(torch.bfloat16).float().numpy())):
            raw = (torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
                   if dtype == "BF16" else np_values.tobytes())
            offset = int(rng.integers(0, 3))
            width = 4 if dtype == "F32" else 2
            buffer = np.frombuffer(b"\0" * offset + raw, dtype=np.uint8)
            expected = bool(np.isfinite(np_values[:count]).all())
            assert draftfeed._core.hidden_all_finite(buffer, offset, count, dtype) == expected
            assert len(raw) >= count * width


def test_f16_conversions_match_numpy_for_every_pattern():
    bits = np.arange(0x10000, dtype=np.uint32)
    ours = np.asarray(draftfeed._core.hidden_convert_bits(bits, "f16_to_f32"), dtype=np.uint32).view(np.float32)
    theirs = bits.astype(np.uint16).view(np.float16).astype(np.float32)
    finite = np.isfinite(theirs)
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    rng = np.random.default_rng(5)
    floats = np.concatenate([rng.standard_normal(100000).astype(np.float32) * 10.0 ** rng.integers(-8, 6, 100000),
                             np.float32([65504, 65519.99, 65520, 6e-8, 3e-8, 2.98e-8, -0.0, np.inf])]).astype(np.float32)
    ours16 = np.asarray(draftfeed._core.hidden_convert_bits(floats.view(np.uint32), "f32_to_f16"), dtype=np.uint32)
    with np.errstate(over="ignore"):
        theirs16 = floats.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(ours16.astype(np.uint16), theirs16)
    ours_bf16 = np.asarray(draftfeed._core.hidden_convert_bits(floats.view(np.uint32), "f32_to_bf16"), dtype=np.uint32)
    theirs_bf16 = torch.from_numpy(floats).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours_bf16.astype(np.uint16), theirs_bf16)
