"""Bad input to the token-dataset reader: every case is one clear error naming the file and the
problem, never a crash. Where pyarrow can judge the same bytes, it must refuse them too."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys

import datasets
import numpy as np
import pyarrow as pa
import pytest
from test_dataset import random_columns, save_dataset, table_of, write_state, write_stream_folder

import draftfeed

LIST64 = pa.list_(pa.int64())
TYPES = {"input_ids": LIST64, "loss_mask": LIST64, "seq_len": pa.int64()}


def token_table(rows: int = 30, seed: int = 0) -> pa.Table:
    return table_of(random_columns(rows, seed=seed, max_len=12), TYPES)


def open_error(path, kind=draftfeed.FormatError) -> str:
    with pytest.raises(kind) as info:
        draftfeed.open_dataset(str(path))
    return str(info.value)


def test_missing_folder(tmp_path):
    message = open_error(tmp_path / "nope", FileNotFoundError)
    assert message == f"dataset folder {tmp_path / 'nope'} does not exist"


def test_a_file_instead_of_a_folder(tmp_path):
    (tmp_path / "x.arrow").write_bytes(b"")
    assert "is a file; pass the folder that Dataset.save_to_disk wrote" in open_error(tmp_path / "x.arrow", ValueError)


def test_folder_that_is_not_a_dataset(tmp_path):
    message = open_error(tmp_path, FileNotFoundError)
    assert message == f"{tmp_path} holds neither state.json nor dataset.arrow: not a folder written by Dataset.save_to_disk"


def test_dataset_dict_names_its_splits(tmp_path):
    columns = random_columns(20, seed=1)
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(columns), "test": datasets.Dataset.from_dict(columns)}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    splits = json.load(open(tmp_path / "dd" / "dataset_dict.json"))["splits"]
    message = open_error(tmp_path / "dd", ValueError)
    assert f"is a DatasetDict with splits [{', '.join(splits)}]" in message
    assert f"pass one split's folder, e.g. {tmp_path / 'dd' / splits[0]}" in message
    assert len(draftfeed.open_dataset(str(tmp_path / "dd" / splits[0]))) == 20


def test_missing_input_ids_column(tmp_path):
    table = token_table().drop_columns(["input_ids"])
    (shard,) = write_stream_folder(str(tmp_path), [table])
    message = open_error(tmp_path)
    assert message == f"{shard}: no 'input_ids' column (columns: loss_mask, seq_len); a training dataset needs token ids"


def test_missing_shard_named_in_state_json(tmp_path):
    write_stream_folder(str(tmp_path), [token_table()])
    write_state(str(tmp_path), ["data-00000-of-00001.arrow", "data-gone.arrow"])
    message = open_error(tmp_path, FileNotFoundError)
    assert message.startswith(f"{tmp_path / 'data-gone.arrow'}: cannot open")


@pytest.mark.parametrize(
    "state, problem",
    [
        ("{not json", "not valid JSON"),
        ('{"_data_files": 3}', "no '_data_files' list"),
        ('{"_data_files": [{"name": "x"}]}', "a '_data_files' entry has no 'filename' string"),
        ('{"_data_files": [{"filename": "../escape.arrow"}]}', "shard name '../escape.arrow' is not a plain file name"),
    ],
)
def test_bad_state_json(tmp_path, state, problem):
    (tmp_path / "state.json").write_text(state)
    message = open_error(tmp_path)
    assert message.startswith(str(tmp_path / "state.json") + ": ") and problem in message


def test_shards_with_different_columns(tmp_path):
    table = token_table()
    first, second = write_stream_folder(str(tmp_path), [table, table.drop_columns(["loss_mask"])])
    message = open_error(tmp_path)
    assert message == (
        f"{second} has columns {{input_ids: list<int64>, seq_len: int64}} but {first} has "
        "{input_ids: list<int64>, loss_mask: list<int64>, seq_len: int64}"
    )


def test_truncated_shard_at_every_cut_point(tmp_path):
    (shard,) = write_stream_folder(str(tmp_path / "whole"), [token_table(rows=40)])
    data = open(shard, "rb").read()
    folder = tmp_path / "cut"
    folder.mkdir()
    write_state(str(folder), ["data.arrow"])
    target = folder / "data.arrow"
    for cut in range(len(data)):
        target.write_bytes(data[:cut])
        with pytest.raises(draftfeed.FormatError) as info:
            draftfeed.open_dataset(str(folder))
        message = str(info.value)
        assert message.startswith(f"{target}: "), (cut, message)
        assert re.search(r"truncated|is empty|corrupt flatbuffer|bad schema|buffer \d+ .* spans|fewer than", message), (cut, message)
        try:  # pyarrow refuses too, or at least misses rows (it accepts a stream without its end marker)
            complete = pa.ipc.open_stream(data[:cut]).read_all().num_rows == 40
        except (pa.ArrowInvalid, OSError):
            complete = False
        assert not complete or cut >= len(data) - 8, cut
    target.write_bytes(data)
    assert len(draftfeed.open_dataset(str(folder))) == 40


def test_truncated_shard_message_text(tmp_path):
    (shard,) = write_stream_folder(str(tmp_path), [token_table(rows=40)])
    data = open(shard, "rb").read()
    open(shard, "wb").write(data[:-8])  # drop the end-of-stream marker
    assert open_error(tmp_path) == f"{shard}: ends after 1 record batches without the end-of-stream marker (the file is truncated)"
    open(shard, "wb").write(data[: len(data) // 2])
    message = open_error(tmp_path)
    assert message.startswith(f"{shard}: message 1 at byte ") and "bytes remain in the file (truncated?)" in message


def raw_stream(path, rows: int = 5) -> tuple[bytes, dict]:
    """A stream written from raw buffers (our writer lays the body out in order at 8-byte padded
    offsets), with the positions needed to corrupt it precisely."""
    ids = [list(range(i)) for i in range(rows)]
    offsets = np.cumsum([0] + [len(x) for x in ids]).astype(np.int32)
    values = np.concatenate([np.array(x, dtype=np.int64) for x in ids])
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    buffers = [b"", offsets.tobytes(), b"", values.tobytes(), b"", lengths.tobytes()]
    draftfeed._core._write_arrow_stream(
        str(path),
        [("input_ids", True, False, 64, True), ("seq_len", False, False, 64, True)],
        [(rows, [(rows, 0), (len(values), 0), (rows, 0)], buffers)],
    )
    body, layout = 0, []
    for b in buffers:
        layout.append((body, len(b)))
        body += (len(b) + 7) // 8 * 8
    return open(path, "rb").read(), {"buffers": layout, "body": body}


def patch_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, "the pattern to corrupt must be unique"
    return data.replace(old, new)


def test_buffer_pointing_outside_the_body(tmp_path):
    shard = tmp_path / "data.arrow"
    data, layout = raw_stream(shard)
    write_state(str(tmp_path), ["data.arrow"])
    assert len(draftfeed.open_dataset(str(tmp_path))) == 5
    offset, length = layout["buffers"][-1]
    bad = patch_once(data, struct.pack("<qq", offset, length), struct.pack("<qq", 1 << 40, length))
    shard.write_bytes(bad)
    message = open_error(tmp_path)
    assert message.startswith(f"{shard}: record batch 0 (message at byte ")
    assert f"buffer 5 (field 'seq_len') spans bytes [{1 << 40}, {1 << 40} + {length}) of a {layout['body']}-byte body" in message
    with pytest.raises((pa.ArrowInvalid, OSError)):
        pa.ipc.open_stream(bad).read_all()


def test_body_length_pointing_outside_the_file(tmp_path):
    shard = tmp_path / "data.arrow"
    data, layout = raw_stream(shard)
    write_state(str(tmp_path), ["data.arrow"])
    bad = patch_once(data, struct.pack("<q", layout["body"]), struct.pack("<q", 1 << 50))
    shard.write_bytes(bad)
    message = open_error(tmp_path)
    assert message.startswith(f"{shard}: message 1 at byte ")
    assert f"has a {1 << 50}-byte body but only" in message and "(truncated?)" in message
    with pytest.raises((pa.ArrowInvalid, OSError)):
        pa.ipc.open_stream(bad).read_all()


def test_metadata_length_pointing_outside_the_file(tmp_path):
    shard = tmp_path / "data.arrow"
    data, _ = raw_stream(shard)
    write_state(str(tmp_path), ["data.arrow"])
    schema_length = struct.unpack_from("<i", data, 4)[0]
    second = 8 + schema_length
    bad = data[: second + 4] + struct.pack("<i", 1 << 30) + data[second + 8 :]
    shard.write_bytes(bad)
    assert open_error(tmp_path) == (
        f"{shard}: is truncated: the message at byte {second} needs {1 << 30} bytes of metadata but only "
        f"{len(data) - second - 8} remain"
    )


def test_list_offsets_decreasing_or_past_the_values(tmp_path):
    shard = tmp_path / "data.arrow"
    data, layout = raw_stream(shard)
    write_state(str(tmp_path), ["data.arrow"])
    _offset, _length = layout["buffers"][1]
    # body starts right after the record batch's metadata; the offsets are [0, 0, 1, 3, 6, 10]
    good = np.array([0, 0, 1, 3, 6, 10], dtype=np.int32).tobytes()
    shard.write_bytes(patch_once(data, good, np.array([0, 0, 4, 3, 6, 10], dtype=np.int32).tobytes()))
    assert open_error(tmp_path) == f"{shard}: record batch 0, column 'input_ids': offsets decrease at row 2 (4 then 3)"
    shard.write_bytes(patch_once(data, good, np.array([0, 0, 1, 3, 6, 11], dtype=np.int32).tobytes()))
    assert open_error(tmp_path) == f"{shard}: record batch 0, column 'input_ids': the last offset 11 is past the 10 values of the list"
    shard.write_bytes(patch_once(data, good, np.array([-1, 0, 1, 3, 6, 10], dtype=np.int32).tobytes()))
    assert open_error(tmp_path) == f"{shard}: record batch 0, column 'input_ids': the first offset is -1, negative"


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_batches(tmp_path, codec):
    (shard,) = write_stream_folder(str(tmp_path), [token_table()], options=pa.ipc.IpcWriteOptions(compression=codec))
    name = {"lz4": "lz4_frame", "zstd": "zstd"}[codec]
    message = open_error(tmp_path)
    assert message.startswith(f"{shard}: record batch 0 (message at byte ")
    assert f"is compressed ({name}); draftfeed reads uncompressed shards only" in message


def test_dictionary_encoded_column_that_is_read(tmp_path):
    table = token_table()
    table = table.set_column(2, "seq_len", table.column("seq_len").dictionary_encode())
    (shard,) = write_stream_folder(str(tmp_path), [table])
    assert open_error(tmp_path) == (
        f"{shard}: column 'seq_len' has type dictionary<values=int64, indices=int32>; draftfeed reads an "
        "integer column (int8..int64, uint8..uint64)"
    )


@pytest.mark.parametrize(
    "column, arrow_type, text",
    [
        ("input_ids", pa.list_(pa.float32()), "list<float>"),
        ("input_ids", pa.list_(pa.string()), "list<string>"),
        ("input_ids", pa.int64(), "int64"),
        ("loss_mask", pa.list_(pa.bool_()), "list<bool>"),
    ],
)
def test_unsupported_types(tmp_path, column, arrow_type, text):
    table = token_table()
    values = table.column(column).to_pylist()
    if arrow_type == pa.int64():
        values = [len(v) for v in values]
    elif pa.types.is_string(arrow_type.value_type):
        values = [[str(x) for x in v] for v in values]
    elif pa.types.is_boolean(arrow_type.value_type):
        values = [[bool(x) for x in v] for v in values]
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, type=arrow_type))
    (shard,) = write_stream_folder(str(tmp_path), [table])
    assert open_error(tmp_path) == (
        f"{shard}: column '{column}' has type {text}; draftfeed reads list<intN> or large_list<intN> (not dictionary-encoded)"
    )


def test_null_row_and_null_token(tmp_path):
    table = table_of(
        {"input_ids": [[1, 2], None, [3]], "seq_len": [2, 0, 1]}, {"input_ids": LIST64, "seq_len": pa.int64()}
    )
    _, shard = write_stream_folder(str(tmp_path / "a"), [token_table(1500).drop_columns(["loss_mask"]), table])
    assert open_error(tmp_path / "a") == (
        f"{shard}: record batch 0, column 'input_ids': row 1501 is null; draftfeed needs a value in every row"
    )
    table = table_of({"input_ids": [[1, 2], [5, None, 7]]}, {"input_ids": LIST64})
    (shard,) = write_stream_folder(str(tmp_path / "b"), [table])
    assert open_error(tmp_path / "b") == (
        f"{shard}: record batch 0, column 'input_ids': row 1 holds a null at position 1; draftfeed needs integer values"
    )


def test_negative_seq_len(tmp_path):
    table = table_of({"input_ids": [[1], [2]], "seq_len": [1, -4]}, {"input_ids": LIST64, "seq_len": pa.int64()})
    (shard,) = write_stream_folder(str(tmp_path), [table])
    assert open_error(tmp_path) == f"{shard}: record batch 0, column 'seq_len': row 1 has length -4, negative"


def test_big_endian_and_garbage(tmp_path):
    (shard,) = write_stream_folder(str(tmp_path), [token_table()])
    for garbage in (b"\x00" * 3, b"\xff\xff\xff\xff" + b"\x10\x00\x00\x00" + b"\x00" * 16, os.urandom(4096)):
        open(shard, "wb").write(garbage)
        assert open_error(tmp_path).startswith(f"{shard}: ")


def test_copied_dataset_folder_with_stray_junk_still_opens(tmp_path):
    save_dataset(tmp_path / "ok", random_columns(50, seed=3))
    shutil.copy(tmp_path / "ok" / "state.json", tmp_path / "ok" / "notes.txt")
    assert len(draftfeed.open_dataset(str(tmp_path / "ok"))) == 50


# -- control files: state.json and its siblings are read as a regular file of bounded size --

LOADER_SCRIPT = (
    "import sys, draftfeed\n"
    "try:\n"
    "    draftfeed.Loader(sys.argv[1], hidden_size=16, total_seq_len=96, num_target_layers=3)\n"
    "except Exception as e:\n"
    "    print(type(e).__name__, e)\n"
)


def refusals(run_cli, folder) -> tuple[str, str]:
    """What `draftfeed inspect` and the Loader say about `folder`; each bounded in time (a FIFO's
    blocking open would hang them)."""
    inspect = run_cli("inspect", folder, timeout=60, check=False)
    assert inspect.returncode != 0
    loader = subprocess.run(
        [sys.executable, "-c", LOADER_SCRIPT, str(folder)], capture_output=True, text=True, timeout=60
    )
    assert loader.returncode == 0, loader.stderr
    return inspect.stderr, loader.stdout


@pytest.fixture
def synthetic_folder(tmp_path):
    folder = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(folder), 40, seed=1)
    return folder


def test_a_fifo_named_state_json_hangs_nothing(run_cli, synthetic_folder):
    state = synthetic_folder / "state.json"
    state.unlink()
    os.mkfifo(state)
    inspect, loader = refusals(run_cli, synthetic_folder)
    assert f"{state}: is a FIFO, not a regular file" in inspect
    assert loader.strip() == f"FormatError {state}: is a FIFO, not a regular file"


def test_a_link_to_dev_zero_is_refused(run_cli, synthetic_folder):
    state = synthetic_folder / "state.json"
    state.unlink()
    state.symlink_to("/dev/zero")
    inspect, loader = refusals(run_cli, synthetic_folder)
    assert f"{state}: is a character device, not a regular file" in inspect
    assert loader.strip() == f"FormatError {state}: is a character device, not a regular file"


def test_an_oversized_state_json_is_refused_before_it_is_read(run_cli, synthetic_folder):
    state = synthetic_folder / "state.json"
    with open(state, "r+b") as f:
        f.truncate(3 << 30)  # sparse: nothing is written, and nothing may be read
    message = f"{state}: is 3 GiB (3221225472 bytes), more than the 64 MiB a dataset's state.json may be"
    inspect, loader = refusals(run_cli, synthetic_folder)
    assert message in inspect
    assert loader.strip() == f"FormatError {message}"


def test_a_state_json_linked_into_a_blob_store_is_read(synthetic_folder, tmp_path):
    # A Hugging Face hub snapshot: every file a link into the blob store.
    blob = tmp_path / "blob-state"
    shutil.move(synthetic_folder / "state.json", blob)
    (synthetic_folder / "state.json").symlink_to(blob)
    assert len(draftfeed.open_dataset(str(synthetic_folder))) == 40
