#!/usr/bin/env python3
"""(Re)generates the fuzzers' seed corpora in tests/fuzz/corpus/<fuzzer>/ with the real packages.

A fuzzer that starts from nothing spends its time discovering the framing (the 8-byte size of a
safetensors header, Arrow's continuation markers and flatbuffers); seeded with real files it starts
inside the parsers' interesting paths. Every seed here is written by the package that writes such
files in practice:

  arrow_ipc_fuzz/      shards written by `datasets` (save_to_disk) and by `pyarrow` (streams): every
                       column type the reader accepts (list / large_list of every integer width,
                       seq_len of every width, loss_mask narrow or wide), a `messages` column
                       (text and multimodal, which the JSON conversion walks), columns the reader
                       skips (strings, structs, maps, fixed-size lists, dictionaries), several
                       record batches, an empty shard, legacy framing, metadata V4, the file format
  safetensors_fuzz/    files written by `safetensors` (numpy and torch) of every dtype (BOOL, U8, I8,
                       I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64, F8_E4M3, F8_E5M2), a
                       hidden-state sample (token_ids I64 [T] + hidden_states BF16 [T, L, H]), the
                       FP8 sample hs-connectors writes (hidden_states F8_E4M3 [T, L, H] +
                       hidden_states_scales F32 [T, 1, 1] + token_ids I64), metadata, empty and
                       scalar tensors
  dataset_state_fuzz/  the JSON files `datasets` writes beside its shards (state.json of one and of
                       several shards, dataset_info.json, a DatasetDict's dataset_dict.json), and
                       hostile ones (nested deep, a non-object entry, a path as a shard name)
  pack_manifest_fuzz/  manifest.json files `draftfeed pack` writes (bf16 and FP8 caches, plain and
                       --compress, one shard and several), and hostile ones (nested deep, a path as
                       a shard name, overlapping samples, a row twice)
  pack_folder_fuzz/    a manifest and its one shard together (u32 manifest length, manifest, shard)
  pack_shard_fuzz/     the shard files of the same packs (samples of bf16 and FP8 files, plain and
                       planes-zstd with either coder: Huffman, version 2, and zstd, version 1)
  pack_huffman_fuzz/   the Huffman-coded exponent planes of those packs' shards (u16 size, then the
                       stored plane), and exponent-like planes to code
  mooncake_manifest_fuzz/  transfer manifests as hs-connectors' MooncakeHiddenStatesConnector makes them
                       (its packed_layout; bf16, f16 and f32 hidden states, an empty prompt), the
                       damaged ones tools/sim_mooncake.py answers (corrupt_manifest's modes), and
                       error markers as its put_error writes them
  vllm_response_fuzz/  bodies tools/sim_vllm_server.py answers (completions, chat, /models, its
                       error bodies and injected faults), for the prompt [1, 2, 3] the fuzz target
                       checks against, plus `messages` arrays (has_multimodal_content)

Seeds are small (rows of a few tokens, hidden size 8) so the fuzzer's mutations stay cheap.
Run from the repository root:   python3 tests/fuzz/make_corpus.py [--out DIR] [--only FUZZER]
Outputs are deterministic for given package versions; the script replaces each fuzzer's folder.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 2, 3]  # the ids tests/fuzz/vllm_response_fuzz.cc checks responses against


# ---------------------------------------------------------------------------------------------
# Arrow shards


def _datasets_shard(columns: dict, features) -> bytes:
    """The single shard `datasets.Dataset.save_to_disk` writes for these columns."""
    import datasets

    ds = datasets.Dataset.from_dict(columns, features=features)
    with tempfile.TemporaryDirectory() as tmp:
        ds.save_to_disk(tmp, num_shards=1)
        return (Path(tmp) / "data-00000-of-00001.arrow").read_bytes()


def _pyarrow_stream(table, *, chunk: int | None = None, options=None) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=chunk)
    return sink.getvalue().to_pybytes()


def _pyarrow_file(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _token_rows(rows: int, seed: int, max_len: int = 6) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len + 1, rows)
    return {
        "input_ids": [rng.integers(0, 120, n).tolist() for n in lengths],
        "loss_mask": [rng.integers(0, 2, n).tolist() for n in lengths],
        "seq_len": [int(n) for n in lengths],
    }


def arrow_seeds() -> dict[str, bytes]:
    import datasets
    import pyarrow as pa

    datasets.disable_progress_bars()

    seeds: dict[str, bytes] = {}
    ints = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]

    # What `datasets` writes: every integer width of input_ids (list<...>), masks narrow and wide.
    for k, width in enumerate(ints):
        cols = _token_rows(4, seed=k)
        features = datasets.Features({
            "input_ids": datasets.List(datasets.Value(width)),
            "loss_mask": datasets.List(datasets.Value("int8" if k % 2 else "int64")),
            "seq_len": datasets.Value(ints[(k + 3) % len(ints)]),
        })
        seeds[f"datasets_ids_{width}.arrow"] = _datasets_shard(cols, features)
    # large_list (datasets.LargeList), without seq_len and without loss_mask.
    cols = _token_rows(3, seed=20)
    seeds["datasets_large_list.arrow"] = _datasets_shard(cols, datasets.Features({
        "input_ids": datasets.LargeList(datasets.Value("int64")),
        "loss_mask": datasets.LargeList(datasets.Value("int32")),
        "seq_len": datasets.Value("int64"),
    }))
    seeds["datasets_ids_only.arrow"] = _datasets_shard(
        {"input_ids": cols["input_ids"]},
        datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))}))
    # `messages`: plain chat turns, and multimodal turns whose content is a list of parts (the
    # chat request path converts these to JSON).
    cols = _token_rows(3, seed=21)
    cols["messages"] = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        [{"role": "user", "content": ""}],
        [{"role": "system", "content": "s\u00e9"}, {"role": "user", "content": "q"}],
    ]
    seeds["datasets_messages_text.arrow"] = _datasets_shard(cols, None)
    cols = _token_rows(2, seed=22)
    cols["messages"] = [
        [{"role": "user", "content": [{"type": "text", "text": "what", "image": None},
                                      {"type": "image", "text": None, "image": "img://1"}]}],
        [{"role": "user", "content": [{"type": "text", "text": "x", "image": None}]}],
    ]
    seeds["datasets_messages_multimodal.arrow"] = _datasets_shard(cols, None)
    # Empty dataset.
    seeds["datasets_empty.arrow"] = _datasets_shard(
        {"input_ids": [], "loss_mask": [], "seq_len": []},
        datasets.Features({"input_ids": datasets.List(datasets.Value("int64")),
                           "loss_mask": datasets.List(datasets.Value("int64")),
                           "seq_len": datasets.Value("int64")}))

    # pyarrow streams: several record batches, nulls in skipped columns, every skipped layout.
    cols = _token_rows(7, seed=30)
    table = pa.table({
        "input_ids": pa.array(cols["input_ids"], pa.list_(pa.int32())),
        "loss_mask": pa.array(cols["loss_mask"], pa.list_(pa.int64())),
        "seq_len": pa.array(cols["seq_len"], pa.int64()),
    })
    seeds["pyarrow_batches_of_2.arrow"] = _pyarrow_stream(table, chunk=2)
    seeds["pyarrow_legacy_framing.arrow"] = _pyarrow_stream(
        table, chunk=3, options=pa.ipc.IpcWriteOptions(use_legacy_format=True))
    seeds["pyarrow_metadata_v4.arrow"] = _pyarrow_stream(
        table, options=pa.ipc.IpcWriteOptions(metadata_version=pa.ipc.MetadataVersion.V4))
    seeds["pyarrow_file_format.arrow"] = _pyarrow_file(table)
    # A slice: pyarrow writes sliced list arrays rebased, but the values buffer keeps its padding.
    seeds["pyarrow_sliced.arrow"] = _pyarrow_stream(table.slice(2, 3))
    n = 3
    extra = table.slice(0, n)
    extra_columns = {
        "text": pa.array(["a", None, "ccc"], pa.string()),
        "large_text": pa.array(["x", "yy", None], pa.large_string()),
        "flag": pa.array([True, None, False], pa.bool_()),
        "score": pa.array([0.5, float("nan"), None], pa.float64()),
        "half": pa.array(np.array([1.0, -2.0, 0.25], dtype=np.float16), pa.float16()),
        "fixed": pa.array([[1, 2], [3, 4], None], pa.list_(pa.int8(), 2)),
        "struct": pa.array([{"a": 1, "b": "x"}, None, {"a": 3, "b": None}]),
        "map": pa.array([[("k", 1)], [], None], pa.map_(pa.string(), pa.int64())),
        "dict": pa.array(["u", "v", "u"]).dictionary_encode(),
        "nested": pa.array([[[1], [2, 3]], [], [[None]]], pa.list_(pa.list_(pa.int16()))),
        "nothing": pa.nulls(n),
    }
    for name, array in extra_columns.items():
        extra = extra.append_column(name, array)
    seeds["pyarrow_skipped_columns.arrow"] = _pyarrow_stream(extra)
    widths = pa.table({
        "input_ids": pa.array(cols["input_ids"][:3], pa.large_list(pa.uint16())),
        "loss_mask": pa.array(cols["loss_mask"][:3], pa.large_list(pa.uint8())),
        "seq_len": pa.array(cols["seq_len"][:3], pa.int32()),
    })
    seeds["pyarrow_large_list_uint16.arrow"] = _pyarrow_stream(widths)
    # draftfeed's own writer (`draftfeed synth`).
    import draftfeed

    with tempfile.TemporaryDirectory() as tmp:
        draftfeed._core.write_synthetic_dataset(tmp, rows=3, seed=1, min_len=1, max_len=5)
        seeds["draftfeed_synth.arrow"] = (Path(tmp) / "data-00000-of-00001.arrow").read_bytes()
    return seeds


# ---------------------------------------------------------------------------------------------
# safetensors files


def safetensors_seeds() -> dict[str, bytes]:
    import torch
    from safetensors.numpy import save as save_numpy
    from safetensors.torch import save as save_torch

    seeds: dict[str, bytes] = {}
    rng = np.random.default_rng(5)
    shape = (2, 3)
    numpy_dtypes = {
        "bool": np.bool_, "u8": np.uint8, "i8": np.int8, "i16": np.int16, "u16": np.uint16,
        "f16": np.float16, "i32": np.int32, "u32": np.uint32, "f32": np.float32, "i64": np.int64,
        "u64": np.uint64, "f64": np.float64,
    }
    for name, dtype in numpy_dtypes.items():
        values = (rng.integers(0, 2, shape) if dtype is np.bool_ else rng.integers(-3, 100, shape))
        seeds[f"numpy_{name}.safetensors"] = save_numpy({"x": values.astype(dtype)})
    torch_dtypes = {
        "bf16": torch.bfloat16, "f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2,
        "f16": torch.float16, "f32": torch.float32,
    }
    for name, dtype in torch_dtypes.items():
        seeds[f"torch_{name}.safetensors"] = save_torch(
            {"x": torch.linspace(-2, 2, 6).reshape(shape).to(dtype)})
    # Every dtype in one file, with metadata: the tiling of many tensors of different widths.
    everything = {f"t_{name}": torch.arange(3).to(dtype) for name, dtype in torch_dtypes.items()}
    everything["t_bool"] = torch.tensor([True, False])
    everything["t_i64"] = torch.tensor([7, -7], dtype=torch.int64)
    everything["t_u8"] = torch.tensor([255], dtype=torch.uint8)
    seeds["torch_every_dtype_metadata.safetensors"] = save_torch(
        everything, metadata={"format": "pt", "producer": "make_corpus"})
    seeds["torch_empty_and_scalar.safetensors"] = save_torch(
        {"empty": torch.zeros(0, 4), "scalar": torch.tensor(3.5), "none": torch.zeros(2, 0, 3)})

    # A hidden-state sample as the cache holds it (docs/formats.md) and as a vLLM server writes it.
    tokens, layers, hidden = 3, 4, 8
    ids = torch.tensor([11, 12, 13], dtype=torch.int64)
    states = torch.randn(tokens, layers, hidden, generator=torch.Generator().manual_seed(1))
    seeds["sample_bf16.safetensors"] = save_torch(
        {"token_ids": ids, "hidden_states": states.to(torch.bfloat16)})
    seeds["sample_f32_i32_ids.safetensors"] = save_torch(
        {"token_ids": ids.to(torch.int32), "hidden_states": states})
    bad = states.clone()
    bad[0, 1, 2] = float("nan")
    bad[2, 3, 0] = float("inf")
    seeds["sample_f16_nonfinite.safetensors"] = save_torch(
        {"token_ids": ids, "hidden_states": bad.to(torch.float16)})
    # hs-connectors' FP8 format: per-token scales, as its FP8 connector quantizes and saves.
    from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8

    fp8, scales = quantize_tensor_to_fp8(states)
    seeds["sample_fp8_e4m3_hs_connectors.safetensors"] = save_torch(
        {"hidden_states": fp8, SCALES_KEY: scales, "token_ids": ids})
    # draftfeed's own writer (the synthetic cache writes through it).
    import draftfeed

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hs_0.safetensors")
        draftfeed._core.write_safetensors(
            path, [("token_ids", "I64", [2], np.array([5, 6], np.int64).tobytes()),
                   ("hidden_states", "BF16", [2, 2, 2], bytes(16))], {"writer": "draftfeed"})
        seeds["draftfeed_writer.safetensors"] = Path(path).read_bytes()
    return seeds


# ---------------------------------------------------------------------------------------------
# vLLM responses


def mooncake_manifest_seeds() -> dict[str, bytes]:
    import torch
    from hs_connectors.mooncake_store import VERSION, packed_layout

    sys.path.insert(0, str(ROOT / "tools"))
    import sim_mooncake

    seeds: dict[str, bytes] = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for tokens in (0, 3):
            specs, total = packed_layout({"hidden_states": ([tokens, 4, 8], dtype),
                                          "token_ids": ([tokens], torch.int64)})
            manifest = {"handle": "cmpl-1-0", "version": VERSION, "tensors": specs,
                        "metadata": {"num_tokens": tokens, "total_aligned_bytes": total,
                                     "extract_mode": "prompt_only"}}
            name = f"{str(dtype).removeprefix('torch.')}_{tokens}"
            seeds[f"manifest_{name}.json"] = json.dumps(manifest).encode()
            if tokens and dtype == torch.bfloat16:
                for mode in sim_mooncake.CORRUPTIONS:
                    damaged = sim_mooncake.corrupt(manifest, mode)
                    seeds[f"corrupt_{mode}.json"] = json.dumps(damaged).encode()
    # The producer's error marker (MooncakeHiddenStatesStore.put_error's JSON).
    seeds["error_marker.json"] = json.dumps({"error": "Non-finite producer tensor"}).encode()
    return seeds


def vllm_seeds() -> dict[str, bytes]:
    sys.path.insert(0, str(ROOT / "tools"))
    from sim_vllm_process import SimServerProcess

    seeds: dict[str, bytes] = {}

    def request(sim, method: str, path: str, body: object | None = None) -> bytes:
        connection = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
        try:
            data = None if body is None else json.dumps(body)
            connection.request(method, "/v1" + path, body=data,
                               headers={"Content-Type": "application/json"})
            answer = connection.getresponse().read()
        finally:
            connection.close()
        # Handles name the temporary server folder and the server's pid: fixed names instead, so
        # that regenerating gives the same bytes.
        answer = answer.replace(str(sim.server_dir).encode(), b"/tmp/hidden_states")
        return re.sub(rb"req_[0-9]+_", b"req_1_", answer)

    completion = {"model": "sim/verifier-model", "prompt": PROMPT, "max_tokens": 1,
                  "return_token_ids": True}
    chat = {"model": "sim/verifier-model", "max_tokens": 1, "return_token_ids": True,
            "add_generation_prompt": False, "continue_final_message": False,
            # The simulator's tokenizer is one id per character: chr(1) chr(2) chr(3) -> [1, 2, 3].
            "messages": [{"role": "user", "content": [{"type": "text", "text": "\x01\x02"}]},
                         {"role": "assistant", "content": "\x03"}]}
    with tempfile.TemporaryDirectory() as tmp:
        for handle_key in ("hidden_states_path", "handle"):
            with SimServerProcess(Path(tmp) / handle_key, hidden=8, handle_key=handle_key) as sim:
                seeds[f"completions_{handle_key}.json"] = request(sim, "POST", "/completions", completion)
                seeds[f"chat_{handle_key}.json"] = request(sim, "POST", "/chat/completions", chat)
                if handle_key == "handle":
                    continue
                seeds["models.json"] = request(sim, "GET", "/models")
                seeds["error_wrong_model.json"] = request(
                    sim, "POST", "/completions", {**completion, "model": "other"})
                seeds["error_bad_prompt.json"] = request(
                    sim, "POST", "/completions", {**completion, "prompt": "text"})
                faults: dict[str, dict] = {
                    "http_500": {}, "malformed": {}, "wrong_ids": {}, "no_handle": {},
                    "oversize": {"bytes": 64}, "missing_file": {},
                }
                for name, params in faults.items():
                    sim.set_faults({name: {"first": 2, **params}})
                    seeds[f"fault_{name}_completions.json"] = request(
                        sim, "POST", "/completions", completion)
                    seeds[f"fault_{name}_chat.json"] = request(sim, "POST", "/chat/completions", chat)
                sim.set_faults({})
    # The messages column as the chat request sends it (has_multimodal_content's input).
    seeds["messages_text.json"] = json.dumps(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]).encode()
    seeds["messages_multimodal.json"] = json.dumps(
        [{"role": "user", "content": [{"type": "text", "text": "what", "image": None},
                                      {"type": "image", "text": None, "image": "img://1"}]}]).encode()
    return seeds


# ---------------------------------------------------------------------------------------------


def dataset_state_seeds() -> dict[str, bytes]:
    """The JSON files a `datasets` folder holds, written by `datasets` itself, and hostile ones."""
    import datasets

    seeds: dict[str, bytes] = {}
    columns = _token_rows(6, seed=3)
    with tempfile.TemporaryDirectory() as tmp:
        for shards in (1, 3):
            folder = Path(tmp) / f"ds{shards}"
            datasets.Dataset.from_dict(columns).save_to_disk(str(folder), num_shards=shards)
            seeds[f"state_{shards}_shards.json"] = (folder / "state.json").read_bytes()
            seeds[f"dataset_info_{shards}_shards.json"] = (folder / "dataset_info.json").read_bytes()
        folder = Path(tmp) / "dict"
        datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns)}).save_to_disk(str(folder))
        seeds["dataset_dict.json"] = (folder / "dataset_dict.json").read_bytes()
    seeds["nested_deep.json"] = b'{"_data_files": [' + b"[" * 200 + b"]" * 200 + b"]}"
    seeds["entry_not_object.json"] = b'{"_data_files": [{"filename": "data-00000-of-00001.arrow"}, 7]}'
    seeds["shard_name_path.json"] = b'{"_data_files": [{"filename": "../x.arrow"}]}'
    return seeds


def _draftfeed() -> str:
    """The draftfeed program: DRAFTFEED_CLI, a dev build, or the one on PATH."""
    for candidate in (os.environ.get("DRAFTFEED_CLI"), str(ROOT / "build" / "dev" / "draftfeed"),
                      shutil.which("draftfeed")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("make_corpus: no draftfeed program (build it, or set DRAFTFEED_CLI)")


def _packs() -> dict[str, dict[str, bytes]]:
    """Small packs written by `draftfeed pack`: name -> {file name: bytes}."""
    import subprocess

    program = _draftfeed()
    packs: dict[str, dict[str, bytes]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([program, "synth", str(data), "--rows", "6", "--min-len", "2", "--max-len", "5",
                        "--hidden-size", "64", "--layers", "2"], check=True, capture_output=True)
        subprocess.run([program, "quantize", str(data), "--out", str(Path(tmp) / "fp8"), "--no-progress"],
                       check=True, capture_output=True)
        # plain; compressed with each coder: huffman (format version 2) and zstd (version 1, what
        # earlier builds wrote)
        coders = {"plain": [], "huffman": ["--compress", "--entropy", "huffman"],
                  "zstd": ["--compress", "--entropy", "zstd"]}
        for source in ("hidden_states", "fp8"):
            for coder, flags in coders.items():
                for shard_bytes in ("100000", "2000"):
                    name = f"{'bf16' if source == 'hidden_states' else 'fp8'}_{coder}" \
                           f"_{'one' if shard_bytes == '100000' else 'many'}"
                    out = Path(tmp) / name
                    subprocess.run([program, "pack", str(data), "--hidden-states",
                                    str(data / source if source == "hidden_states" else Path(tmp) / source),
                                    "--out", str(out), "--shard-bytes", shard_bytes, "--no-progress",
                                    *flags], check=True, capture_output=True)
                    packs[name] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    return packs


def pack_manifest_seeds() -> dict[str, bytes]:
    seeds = {f"{name}.json": files["manifest.json"] for name, files in _packs().items()}
    base = json.loads(seeds["bf16_plain_many.json"])
    seeds["nested_deep.json"] = b'{"samples": ' + b"[" * 200 + b"]" * 200 + b"}"
    hostile = dict(base, shards=[{"file": "../shard-000000.safetensors", "bytes": 10}])
    seeds["shard_name_path.json"] = json.dumps(hostile).encode()
    overlap = dict(base, samples=[base["samples"][0], [99, *base["samples"][0][1:]]], num_samples=2)
    seeds["overlap.json"] = json.dumps(overlap).encode()
    twice = dict(base, samples=[base["samples"][0], base["samples"][0]], num_samples=2)
    seeds["row_twice.json"] = json.dumps(twice).encode()
    return seeds


def pack_shard_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    for name, files in _packs().items():
        for file, data in files.items():
            if file.endswith(".safetensors") and (name.endswith("_one") or file.endswith("000001.safetensors")):
                seeds[f"{name}_{file}"] = data
    return seeds


def pack_folder_seeds() -> dict[str, bytes]:
    """A manifest and its one shard, as pack_folder_fuzz takes them (u32 manifest length, manifest,
    shard): packs of one shard, bf16 and FP8, plain and compressed."""
    import struct

    seeds: dict[str, bytes] = {}
    for name, files in _packs().items():
        if name.endswith("_one"):
            manifest = files["manifest.json"]
            seeds[f"{name}.bin"] = struct.pack("<I", len(manifest)) + manifest + files["shard-000000.safetensors"]
    return seeds


def _huffman_planes(shard: bytes) -> list[tuple[int, bytes]]:
    """The Huffman-coded exponent planes (mode 2) of a pack shard's compressed tensors: (the plane's
    bytes decoded, its stored form), read from the planes-zstd blobs' chunk tables
    (docs/formats.md)."""
    import struct

    header_len = struct.unpack_from("<Q", shard)[0]
    header = json.loads(shard[8:8 + header_len])
    planes = []
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "U8":
            continue
        begin, end = info["data_offsets"]
        blob = shard[8 + header_len + begin:8 + header_len + end]
        if blob[:4] != b"DFPZ" or blob[4] != 2:
            continue
        kind, values, chunk, chunks = blob[5], *struct.unpack_from("<QII", blob, 8)
        at = 32 + 8 * chunks
        for c in range(chunks):
            stored, mode = struct.unpack_from("<II", blob, 32 + 8 * c)
            n = min(chunk, values - c * chunk)
            plane = n if kind == 1 else (n + 1) // 2
            if mode == 2:
                planes.append((plane, blob[at:at + stored]))
            at += stored + plane
    return planes


def pack_huffman_seeds() -> dict[str, bytes]:
    """Inputs of pack_huffman_fuzz (u16 plane size, then a stored plane; also read from byte 4 on
    as a plane to code): the Huffman planes of bf16 and FP8 packs, and planes of exponent-like
    bytes."""
    import struct

    seeds: dict[str, bytes] = {}
    for name, files in _packs().items():
        if "huffman" in name and name.endswith("_one"):
            for i, (size, stored) in enumerate(_huffman_planes(files["shard-000000.safetensors"])[:4]):
                seeds[f"{name}_{i}.bin"] = struct.pack("<H", size & 0xFFFF) + stored
    rng = random.Random(7)
    for size in (1, 5, 64, 1000):
        plane = bytes(max(0, min(255, 120 + int(rng.gauss(0, 3)))) for _ in range(size))
        seeds[f"exponents_{size}.bin"] = struct.pack("<H", size) + b"\x00\x00" + plane
    return seeds


def write(out: Path, fuzzer: str, seeds: dict[str, bytes]) -> None:
    folder = out / fuzzer
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, data in sorted(seeds.items()):
        (folder / name).write_bytes(data)
    total = sum(len(d) for d in seeds.values())
    print(f"{fuzzer}: {len(seeds)} seeds, {total} bytes (largest {max(len(d) for d in seeds.values())})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "fuzz" / "corpus"),
                        help="corpus root (default tests/fuzz/corpus)")
    parser.add_argument("--only", help="one fuzzer's corpus (e.g. dataset_state_fuzz)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    makers: dict[str, Callable[[], dict[str, bytes]]] = {
        "arrow_ipc_fuzz": arrow_seeds,
        "safetensors_fuzz": safetensors_seeds,
        "vllm_response_fuzz": vllm_seeds,
        "mooncake_manifest_fuzz": mooncake_manifest_seeds,
        "dataset_state_fuzz": dataset_state_seeds,
        "pack_manifest_fuzz": pack_manifest_seeds,
        "pack_shard_fuzz": pack_shard_seeds,
        "pack_folder_fuzz": pack_folder_seeds,
        "pack_huffman_fuzz": pack_huffman_seeds,
    }
    for fuzzer, make in makers.items():
        if args.only is None or args.only == fuzzer:
            write(out, fuzzer, make())
    return 0


if __name__ == "__main__":
    sys.exit(main())
