"""FP8 against the real thing: every one of the 256 float8_e4m3fn codes against torch's own conversion,
our float -> E4M3 rounding against torch's cast around every rounding boundary, the batch copy's
dequantize against hs-connectors' `dequantize_fp8_tensor` (then the collate's cast) over a spread of
scales, and our quantizer and FP8 file writer against hs-connectors' `quantize_tensor_to_fp8` and its
connector's files, byte for byte."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from fp8_fixtures import write_fp8_file
from hs_connectors.fp8_utils import dequantize_fp8_tensor, quantize_tensor_to_fp8
from safetensors.torch import load_file, save_file

from draftfeed import _core

pytestmark = pytest.mark.timeout(300)

CODES = np.arange(256, dtype=np.uint8)


def torch_codes(codes: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn)


def bits(t: torch.Tensor) -> np.ndarray:
    """Raw bit patterns of a bf16/f16/f32 tensor."""
    view = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[t.dtype]
    return t.contiguous().view(view).numpy()


def test_every_code_converts_as_torch_does():
    ours = _core.fp8_to_float(CODES)
    ref = torch_codes(CODES).float().numpy()
    nan = np.isnan(ref)
    assert nan.sum() == 2 and set(CODES[nan]) == {0x7F, 0xFF}
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(ours.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])  # -0.0 included


def rounding_probe() -> np.ndarray:
    """Every float whose upper 16 bits take each of their 65536 values, with low bits around the
    rounding points (ties, one ulp off), plus random floats: NaN, Inf, saturation, subnormals."""
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    grid = (high[:, None] | low[None, :]).ravel()
    random = np.random.default_rng(0).integers(0, 1 << 32, size=1 << 20, dtype=np.uint32)
    return np.concatenate([grid, random]).view(np.float32)


def test_float_to_fp8_rounds_as_torch_does():
    values = rounding_probe()
    ours = _core.float_to_fp8(values)
    ref = torch.from_numpy(values.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    wrong = np.nonzero(ours != ref)[0]
    assert wrong.size == 0, f"{wrong.size} differ, e.g. {values[wrong[:5]]}: {ours[wrong[:5]]} != {ref[wrong[:5]]}"


def test_every_finite_code_round_trips():
    finite = CODES[(CODES & 0x7F) != 0x7F]
    assert np.array_equal(_core.float_to_fp8(_core.fp8_to_float(finite)), finite)


def scale_spread() -> np.ndarray:
    """Scales over the whole float range: what quantizers produce (amax / 448, at least 1e-12),
    subnormal floats, powers of two, values whose rounding to bf16/f16 ties, overflow candidates."""
    rng = np.random.default_rng(1)
    special = np.array([
        1e-12, 1.4e-45, 1e-40, 2.0**-126, 2.0**-24, 6e-5, 1e-8, 1 / 448, 0.5, 1.0, 3.0,
        1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, 65504 / 448, 65504 / 440, 1000.0, 7e35, 7.6e35, 1e36, 3.4e38,
    ], dtype=np.float32)
    spread = (10.0 ** rng.uniform(-14, 8, 3000)).astype(np.float32)
    mantissas = rng.random(500, dtype=np.float32)
    return np.concatenate([special, spread, mantissas])


@pytest.mark.parametrize("dequantize", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_batch_copy_dequantizes_every_code_as_fp8transfer(dequantize, out):
    """Each row: the 256 codes with one scale. The reference: hs-connectors' dequantize (FP8Transfer's)
    into `dequantize`, then the collate's cast to the batch dtype `out`."""
    scales = scale_spread()
    codes = np.tile(CODES, len(scales))
    ref = dequantize_fp8_tensor(
        torch_codes(codes).reshape(len(scales), 1, 256), torch.from_numpy(scales).reshape(-1, 1, 1),
        dtype=dequantize,
    ).to(out).reshape(-1)
    got, nonfinite = _core.fp8_copy_rows(
        codes, scales, str(dequantize).replace("torch.", ""), str(out).replace("torch.", ""))
    got_bits = got.view(np.int16) if out == torch.bfloat16 else got.view(np.int32)
    ref_nan = torch.isnan(ref).numpy()
    got_nan = np.isnan(torch.from_numpy(got.view(np.int16)).view(torch.bfloat16).float().numpy()
                      if out == torch.bfloat16 else got)
    assert np.array_equal(got_nan, ref_nan), "NaN in different places"
    differ = np.nonzero((got_bits != bits(ref)) & ~ref_nan)[0]
    assert differ.size == 0, (
        f"{differ.size} values differ, e.g. code {codes[differ[:4]]} scale {scales[differ[:4] // 256]}")
    # Non-finite values are counted (the sample is then dropped): NaN codes in every row, and the
    # products too large for the dequantize dtype.
    in_dequantize = dequantize_fp8_tensor(
        torch_codes(codes).reshape(len(scales), 1, 256), torch.from_numpy(scales).reshape(-1, 1, 1),
        dtype=dequantize)
    assert nonfinite == int((~torch.isfinite(in_dequantize)).sum())
    assert nonfinite >= 2 * len(scales)


def test_noise_is_added_to_the_dequantized_value():
    """The FP8 copy with noise equals the bf16 copy with noise of FP8Transfer's dequantized values:
    noise comes on top of the dequantize, as in the reference's dataset transform."""
    rng = np.random.default_rng(2)
    rows, width = 64, 96
    codes = rng.integers(0, 256, size=rows * width, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x10
    scales = (10.0 ** rng.uniform(-3, 1, rows)).astype(np.float32)
    for noise in ("uniform", "gaussian"):
        fp8, bad = _core.fp8_copy_rows(codes, scales, "bfloat16", "float32", noise=noise, noise_std=0.05,
                                       noise_key=1234)
        assert bad == 0
        plain, _ = _core.fp8_copy_rows(codes, scales, "bfloat16", "float32")
        # Noise on bf16 values that equal the dequantized ones: the existing bf16 path's formula.
        ref = dequantize_fp8_tensor(torch_codes(codes).reshape(rows, 1, width),
                                    torch.from_numpy(scales).reshape(-1, 1, 1))
        assert np.array_equal(plain, ref.float().numpy().reshape(-1))
        assert not np.array_equal(fp8, plain)
        assert np.abs(fp8 - plain).max() <= (0.05 if noise == "uniform" else 0.5)


def random_hidden_states(rng: np.random.Generator, tokens: int, layers: int, hidden: int) -> torch.Tensor:
    """bf16 states with per-token magnitudes from 1e-30 to 1e30, zero tokens, tiny and huge values,
    and signed zeros."""
    magnitude = 10.0 ** rng.uniform(-30, 30, size=(tokens, 1, 1))
    x = rng.standard_normal((tokens, layers, hidden)) * magnitude
    x[0] = 0.0
    x[1] = -0.0
    x[2, 0, 0] = 1e-38
    x[3] *= 1e-40 / np.abs(x[3]).max()  # a token of bf16 subnormals
    return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantizer_equals_hs_connectors(dtype):
    rng = np.random.default_rng(3)
    hs = random_hidden_states(rng, 64, 4, 48)
    if dtype == torch.float16:
        hs = (hs.float().clamp(-6e4, 6e4) / 1e20).to(torch.float16)  # inside f16's range
    else:
        hs = hs.to(dtype)
    ref_codes, ref_scales = quantize_tensor_to_fp8(hs)
    raw = hs.contiguous().view(torch.uint8).numpy().tobytes()
    codes, scales = _core.quantize_fp8(raw, {torch.bfloat16: "BF16", torch.float16: "F16",
                                             torch.float32: "F32"}[dtype], 64, 4 * 48)
    assert np.array_equal(scales, ref_scales.reshape(-1).numpy())
    assert np.array_equal(codes, ref_codes.view(torch.uint8).reshape(-1).numpy())


def test_fp8_file_is_the_connectors_file_byte_for_byte(tmp_path):
    rng = np.random.default_rng(4)
    for k, (tokens, hidden) in enumerate([(1, 8), (17, 64), (200, 32)]):
        hs = random_hidden_states(rng, max(tokens, 4), 4, hidden)[:tokens].contiguous()
        ids = torch.from_numpy(rng.integers(0, 32000, tokens))
        source = tmp_path / f"bf16_{k}.safetensors"
        save_file({"hidden_states": hs, "token_ids": ids}, str(source))
        ours, theirs = tmp_path / f"ours_{k}.safetensors", tmp_path / f"theirs_{k}.safetensors"
        size = _core.write_fp8_sample(str(source), str(ours))
        write_fp8_file(str(theirs), hs, ids)
        assert ours.read_bytes() == theirs.read_bytes()
        assert size == os.path.getsize(ours)
        loaded = load_file(str(ours))
        assert loaded["hidden_states"].dtype == torch.float8_e4m3fn
        assert loaded["hidden_states_scales"].shape == (tokens, 1, 1)


def test_python_dequantize_helper_equals_fp8transfer():
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 256, size=12 * 40, dtype=np.uint8)
    scales = (10.0 ** rng.uniform(-5, 3, 12)).astype(np.float32)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        raw, name = _core.fp8_dequantize(codes, scales, str(dtype))
        got = torch.frombuffer(bytearray(raw), dtype=getattr(torch, name)).reshape(12, 40)
        ref = dequantize_fp8_tensor(torch_codes(codes).reshape(12, 40), torch.from_numpy(scales).reshape(12, 1),
                                    dtype=dtype)
        assert got.dtype == dtype
        assert torch.equal(torch.isnan(got), torch.isnan(ref))
        finite = torch.isfinite(ref).numpy()
        assert np.array_equal(bits(got)[finite], bits(ref)[finite])
