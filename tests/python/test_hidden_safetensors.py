"""draftfeed's safetensors reader and writer against the real `safetensors` package.

Files the package writes (numpy and torch APIs, bf16/f16/f32, 2-D and 3-D, with metadata) are read
bit-exact; files draftfeed writes are loaded by the package and are byte-identical to its own;
every corruption gets a clear message and is also refused by the package; a seeded differential
run over mutated files checks that both accept the same inputs.
"""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import draftfeed
from draftfeed import _core

pytestmark = pytest.mark.timeout(120)


def torch_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(7, 4, 33, generator=gen).to(torch.bfloat16),
        "f16_2d": torch.randn(5, 3, generator=gen).to(torch.float16),
        "f32_3d": torch.randn(2, 3, 4, generator=gen),
        "token_ids": torch.arange(7, dtype=torch.int64) * 1000,
        "empty": torch.zeros(0, 3),
    }


def raw_bits(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bits as numpy (bf16 as uint16, like draftfeed returns it)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def test_reads_files_written_by_the_torch_api_bit_exact(tmp_path):
    tensors = torch_tensors()
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt", "note": "é\n"})
    loaded = draftfeed.load_safetensors(str(path))
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        expected = raw_bits(tensor)
        assert loaded[name].dtype == expected.dtype, name
        assert loaded[name].shape == expected.shape, name
        np.testing.assert_array_equal(loaded[name], expected, err_msg=name)
        assert not loaded[name].flags.writeable
    assert draftfeed.safetensors_metadata(str(path)) == {"format": "pt", "note": "é\n"}


def test_reads_files_written_by_the_numpy_api_bit_exact(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {
        "a": rng.standard_normal((3, 5)).astype(np.float16),
        "b": rng.standard_normal((2, 2, 2)).astype(np.float32),
        "c": rng.integers(-5, 5, size=(9,)).astype(np.int32),
        "d": rng.integers(0, 2, size=(4,)).astype(bool),
        "e": rng.standard_normal((3,)).astype(np.float64),
        "f": rng.integers(0, 255, size=(2, 3)).astype(np.uint8),
    }
    path = tmp_path / "n.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    loaded = draftfeed.load_safetensors(str(path))
    for name, array in tensors.items():
        assert loaded[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded[name], array)
    assert draftfeed.safetensors_metadata(str(path)) is None


def test_arrays_keep_their_file_mapped_after_the_file_is_gone(tmp_path):
    path = tmp_path / "k.safetensors"
    safetensors.numpy.save_file({"x": np.arange(10, dtype=np.int64)}, str(path))
    array = draftfeed.load_safetensors(str(path))["x"]
    path.unlink()
    del path
    np.testing.assert_array_equal(array, np.arange(10))


def to_write(tensors: dict[str, torch.Tensor]) -> list[tuple[str, str, list[int], bytes]]:
    names = {
        torch.bfloat16: "BF16",
        torch.float16: "F16",
        torch.float32: "F32",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.uint8: "U8",
        torch.bool: "BOOL",
        torch.float64: "F64",
    }
    out = []
    for name, tensor in tensors.items():
        raw = raw_bits(tensor)
        out.append((name, names[tensor.dtype], list(tensor.shape), raw.tobytes()))
    return out


def test_our_files_load_in_the_real_package_and_match_its_bytes(tmp_path):
    tensors = torch_tensors()
    tensors["flags"] = torch.tensor([True, False, True])
    tensors["i32"] = torch.arange(-3, 3, dtype=torch.int32)
    for metadata in (None, {}, {"format": "pt"}, {"k": 'quote " backslash \\ tab \t ctl \x01 é'}):
        path = tmp_path / "ours.safetensors"
        draftfeed.write_safetensors(str(path), to_write(tensors), metadata)
        loaded = safetensors.torch.load_file(str(path))
        assert set(loaded) == set(tensors)
        for name, tensor in tensors.items():
            assert loaded[name].dtype == tensor.dtype
            assert torch.equal(loaded[name], tensor), name
        with safetensors.safe_open(str(path), framework="pt") as handle:
            assert handle.metadata() == metadata or (metadata == {} and handle.metadata() == {})
        # The package's own serialisation of the same tensors: identical bytes (at most one
        # metadata key, since the package orders several keys arbitrarily).
        assert path.read_bytes() == safetensors.torch.save(tensors, metadata=metadata)


def test_many_metadata_keys_round_trip(tmp_path):
    metadata = {f"key{i}": f"value {i}" for i in range(20)}
    path = tmp_path / "m.safetensors"
    draftfeed.write_safetensors(str(path), [("x", "U8", [2], b"\x01\x02")], metadata)
    with safetensors.safe_open(str(path), framework="np") as handle:
        assert handle.metadata() == metadata


def test_writer_refuses_inconsistent_tensors(tmp_path):
    with pytest.raises(ValueError, match=r"tensor `a`: shape \[2\] of F32 needs 64 bits but 7 bytes"):
        draftfeed.write_safetensors(str(tmp_path / "x"), [("a", "F32", [2], b"\0" * 7)])
    with pytest.raises(ValueError, match="unknown safetensors dtype 'X32'"):
        draftfeed.write_safetensors(str(tmp_path / "x"), [("a", "X32", [2], b"\0" * 8)])
    assert not (tmp_path / "x").exists()


def header_file(header: dict | str | bytes, buffer: bytes = b"", size: int | None = None) -> bytes:
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header) if size is None else size) + header + buffer


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}

# (name, file bytes, a fragment of draftfeed's message)
CORRUPTIONS = [
    ("truncated buffer", header_file({"a": F32x2}, b"\0" * 5),
     "truncated: tensor `a` ends at byte 8 of the data buffer, which has 5 bytes"),
    ("header longer than the file", header_file("{}", size=500),
     "header size 500 runs past the end of the file (2 bytes after the size field)"),
    ("short file", b"\x01\x02", "file is 2 bytes, shorter than the 8-byte header size"),
    ("overlapping offsets",
     header_file({"a": F32x2, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
     "tensor `b` has data_offsets [4, 8] but the previous tensor ends at 8 (an overlap)"),
    ("gapped offsets",
     header_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                  "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12),
     "tensor `b` has data_offsets [8, 12] but the previous tensor ends at 4 (a gap)"),
    ("unknown dtype", header_file({"a": {"dtype": "F31", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
     "tensor `a` has the unknown dtype 'F31'"),
    ("huge header size", header_file("{}", size=100_000_001),
     "header size 100000001 exceeds the limit of 100000000 bytes"),
    ("non-JSON header", header_file("not json"), "header is not valid JSON"),
    ("JSON array header", header_file("[1, 2]"), "header is an array, not a JSON object"),
    ("trailing bytes", header_file({"a": F32x2}, b"\0" * 11),
     "the data buffer has 11 bytes but the tensors cover 8 (3 trailing bytes)"),
    ("shape/bytes mismatch", header_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
     "tensor `a`: shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8"),
    ("shape overflow", header_file({"a": {"dtype": "F32", "shape": [2**62, 8], "data_offsets": [0, 8]}}, b"\0" * 8),
     "overflows a 64-bit byte count"),
    ("metadata not strings", header_file({"__metadata__": {"k": 1}}), "metadata value of `k` is a number, not a string"),
    ("missing field", header_file({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "tensor `a` has no `data_offsets`"),
    ("reversed offsets", header_file({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, b"\0" * 8),
     "data_offsets [8, 0] that end before they begin"),
    ("trailing NUL after the JSON", header_file(b"{}\0"), "a NUL byte at offset 2"),
]


@pytest.mark.parametrize("name,data,message", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_every_corruption_is_refused_with_a_clear_message(tmp_path, name, data, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(draftfeed.FormatError) as raised:
        draftfeed.load_safetensors(str(path))
    assert str(raised.value).startswith(str(path) + ": ")
    assert message in str(raised.value)
    # The real package refuses the same file.
    with pytest.raises(Exception):  # noqa: B017 - whatever the package raises: it refuses
        safetensors.deserialize(data)


def test_duplicate_tensor_names_are_refused_though_the_package_keeps_the_last(tmp_path):
    data = header_file('{"a":' + json.dumps(F32x2) + ',"a":' + json.dumps(F32x2) + "}", b"\0" * 8)
    safetensors.deserialize(data)  # the package accepts it (documented difference)
    path = tmp_path / "dup.safetensors"
    path.write_bytes(data)
    with pytest.raises(draftfeed.FormatError, match="the tensor name `a` appears twice"):
        draftfeed.load_safetensors(str(path))


def mutate(original: bytes, rng: random.Random) -> bytes:
    data = bytearray(original)
    if len(data) < 8:
        return bytes(data + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9))))
    header_len = min(struct.unpack("<Q", bytes(data[:8]))[0], len(data) - 8)
    choice = rng.randrange(7)
    if choice == 0 and data:  # flip a byte anywhere
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif choice == 1:  # truncate
        del data[rng.randrange(len(data) + 1):]
    elif choice == 2:  # append bytes
        data += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    elif choice == 3:  # change a digit in the header
        digits = [i for i in range(8, 8 + header_len) if chr(data[i]).isdigit()]
        if digits:
            data[rng.choice(digits)] = ord(str(rng.randrange(10)))
    elif choice == 4:  # change the header size
        struct.pack_into("<Q", data, 0, max(0, header_len + rng.randrange(-4, 5)))
    elif choice == 5:  # replace a header character by JSON punctuation
        if header_len:
            data[8 + rng.randrange(header_len)] = ord(rng.choice('{}[]:," 0'))
    else:  # change a dtype name
        text = bytes(data[8 : 8 + header_len])
        for old, new in ((b"BF16", b"F16 "), (b"F32", b"I32"), (b"I64", b"U64"), (b"F16", b"F8_")):
            if old in text and rng.random() < 0.5:
                text = text.replace(old, new, 1)
        data[8 : 8 + header_len] = text
    return bytes(data)


def package_view(data: bytes):
    """The package's reading of the bytes: {name: (dtype, shape, data)}, or None if refused."""
    try:
        return {name: (info["dtype"], list(info["shape"]), bytes(info["data"]))
                for name, info in safetensors.deserialize(data)}
    except Exception:
        return None


def test_differential_with_the_package_on_mutated_files(tmp_path):
    seeds = [
        safetensors.torch.save(torch_tensors(), metadata={"format": "pt"}),
        safetensors.numpy.save({"x": np.arange(6, dtype=np.int16).reshape(2, 3), "y": np.zeros(0, np.float32)}),
        header_file("{}"),
    ]
    rng = random.Random(1234)
    path = tmp_path / "m.safetensors"
    accepted = refused = 0
    for trial in range(3000):
        data = rng.choice(seeds)
        for _ in range(rng.randrange(1, 3)):
            data = mutate(data, rng)
        path.write_bytes(data)
        expected = package_view(data)
        try:
            ours = {name: (dtype, shape, bytes(memoryview(array).cast("B")) if array.size else b"")
                    for (name, dtype, shape, _, _), array in zip(
                        _core.safetensors_layout(str(path)), draftfeed.load_safetensors(str(path)).values())}
        except draftfeed.FormatError as error:
            refused += 1
            message = str(error)
            if expected is not None:
                # Our only stricter rules: duplicate keys and nesting depth.
                assert "twice" in message or "nested deeper" in message, (trial, message, data[:200])
            continue
        accepted += 1
        assert expected is not None, (trial, data[:200])
        assert ours == expected, trial
    assert accepted > 100 and refused > 1000, (accepted, refused)
