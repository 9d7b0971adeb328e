"""The token-dataset reader against the real thing: folders written by `datasets` (save_to_disk) and
Arrow IPC streams written by `pyarrow`; every row draftfeed reads must equal what they return."""

from __future__ import annotations

import json
import os
import shutil

import datasets
import numpy as np
import pyarrow as pa
import pytest

import draftfeed

# ---------------------------------------------------------------------------------------------
# helpers shared with the other test_dataset*.py files


def arrow_type_text(t: pa.DataType) -> str:
    """draftfeed's type text for a pyarrow type (element names dropped), derived from pyarrow."""
    if pa.types.is_large_list(t):
        return f"large_list<{arrow_type_text(t.value_type)}>"
    if pa.types.is_list(t):
        return f"list<{arrow_type_text(t.value_type)}>"
    if pa.types.is_fixed_size_list(t):
        return f"fixed_size_list<{arrow_type_text(t.value_type)}>[{t.list_size}]"
    if pa.types.is_struct(t):
        inner = ", ".join(f"{t.field(i).name}: {arrow_type_text(t.field(i).type)}" for i in range(t.num_fields))
        return f"struct<{inner}>"
    if pa.types.is_dictionary(t):
        return f"dictionary<values={arrow_type_text(t.value_type)}, indices={arrow_type_text(t.index_type)}>"
    return str(t)


def write_state(folder: str, shard_names: list[str], format_type: str | None = None) -> None:
    """A state.json like datasets writes, listing `shard_names` in row order."""
    state: dict[str, object] = {
        "_data_files": [{"filename": name} for name in shard_names],
        "_fingerprint": "0123456789abcdef",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": format_type,
        "_output_all_columns": False,
        "_split": None,
    }
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump(state, f)


def write_stream_folder(folder: str, tables: list[pa.Table], options: pa.ipc.IpcWriteOptions | None = None) -> list[str]:
    """One Arrow IPC stream shard per table (written by pyarrow) plus a state.json."""
    os.makedirs(folder, exist_ok=True)
    names = []
    for k, table in enumerate(tables):
        name = f"data-{k:05d}-of-{len(tables):05d}.arrow"
        with pa.OSFile(os.path.join(folder, name), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
                writer.write_table(table, max_chunksize=1000)
        names.append(name)
    write_state(folder, names)
    return [os.path.join(folder, n) for n in names]


def expected_rows(table: pa.Table) -> dict[str, list]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


def assert_rows_equal(ours, reference: dict[str, list]) -> None:
    """Every row of `ours` (a draftfeed TokenDataset) equals the reference columns."""
    ids = reference["input_ids"]
    assert len(ours) == len(ids)
    has_mask = "loss_mask" in reference
    for i in range(len(ids)):
        row = ours.row(i)
        assert row["input_ids"].tolist() == list(ids[i]), f"row {i}"
        if has_mask:
            assert row["loss_mask"].tolist() == list(reference["loss_mask"][i]), f"row {i}"
    if "seq_len" in reference:
        assert ours.seq_lens().tolist() == list(reference["seq_len"])
    else:
        assert ours.seq_lens().tolist() == [len(x) for x in ids]


def random_columns(rows: int, seed: int, max_len: int = 40, vocab: int = 150_000, messages: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len + 1, rows)
    columns = {
        "input_ids": [rng.integers(0, vocab, n).tolist() for n in lengths],
        "loss_mask": [rng.integers(0, 2, n).tolist() for n in lengths],
        "seq_len": [int(n) for n in lengths],
    }
    if messages:
        columns["messages"] = [
            [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer " * (i % 5)}]
            for i in range(rows)
        ]
    return columns


def list_feature(dtype: str):
    return datasets.List(datasets.Value(dtype))


def save_dataset(path, columns: dict, *, ids_dtype: str = "int64", num_shards: int | None = None, torch_format=False):
    features = {
        "input_ids": list_feature(ids_dtype),
        "loss_mask": list_feature("int64"),
        "seq_len": datasets.Value("int64"),
    }
    features = {k: v for k, v in features.items() if k in columns}
    ds = datasets.Dataset.from_dict(columns, features=datasets.Features(features) if "messages" not in columns else None)
    if "messages" in columns:
        ds = ds.cast(datasets.Features({**features, "messages": ds.features["messages"]}))
    if torch_format:
        ds.set_format("torch")
    ds.save_to_disk(str(path), num_shards=num_shards)
    return ds


# ---------------------------------------------------------------------------------------------
# folders written by `datasets`


@pytest.fixture(scope="module")
def int64_three_shards(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "int64_three_shards"
    save_dataset(path, random_columns(2500, seed=1, messages=True), num_shards=3)
    return str(path)


@pytest.fixture(scope="module")
def int32_one_shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "int32_one_shard"
    save_dataset(path, random_columns(2500, seed=2), ids_dtype="int32", num_shards=1)
    return str(path)


def reference_columns(path: str) -> dict[str, list]:
    return datasets.load_from_disk(path).with_format(None)[:]


def test_three_shards_rows_equal_datasets(int64_three_shards):
    ours = draftfeed.open_dataset(int64_three_shards)
    reference = datasets.load_from_disk(int64_three_shards)
    assert len(ours) == len(reference) == 2500
    assert len(ours.shards) == 3
    assert [os.path.basename(p) for p in ours.shards] == [
        f["filename"] for f in json.load(open(os.path.join(int64_three_shards, "state.json")))["_data_files"]
    ]
    assert_rows_equal(ours, reference.with_format(None)[:])
    assert ours.row(0)["input_ids"].dtype == np.int64
    assert ours.total_tokens == sum(len(x) for x in reference["input_ids"])


def test_int32_rows_keep_their_dtype_across_record_batches(int32_one_shard):
    ours = draftfeed.open_dataset(int32_one_shard)
    table = datasets.load_from_disk(int32_one_shard).data.table
    assert [b.num_rows for b in table.to_batches()] == [1000, 1000, 500]  # batches + remainder
    assert ours.columns["input_ids"] == arrow_type_text(table.schema.field("input_ids").type) == "list<int32>"
    assert ours.row(1999)["input_ids"].dtype == np.int32
    assert_rows_equal(ours, reference_columns(int32_one_shard))


def test_columns_report_every_type_including_skipped_ones(int64_three_shards):
    ours = draftfeed.open_dataset(int64_three_shards)
    schema = datasets.load_from_disk(int64_three_shards).data.table.schema
    assert ours.columns == {f.name: arrow_type_text(f.type) for f in schema}
    assert "struct<" in ours.columns["messages"]


def test_negative_and_out_of_range_indices(int64_three_shards):
    ours = draftfeed.open_dataset(int64_three_shards)
    reference = reference_columns(int64_three_shards)
    assert ours.row(-1)["input_ids"].tolist() == reference["input_ids"][-1]
    assert ours[-2500]["input_ids"].tolist() == reference["input_ids"][0]
    for bad in (2500, -2501, 10**12):
        with pytest.raises(IndexError, match="out of range for 2500 rows"):
            ours.row(bad)


def test_arrays_are_read_only_views_that_keep_the_dataset_alive(int64_three_shards):
    ours = draftfeed.open_dataset(int64_three_shards)
    row = ours.row(1234)
    lens = ours.seq_lens()
    expected_ids = reference_columns(int64_three_shards)["input_ids"][1234]
    del ours
    import gc

    gc.collect()
    assert row["input_ids"].tolist() == expected_ids
    assert not row["input_ids"].flags.writeable and not lens.flags.writeable
    assert lens.dtype == np.int64 and len(lens) == 2500
    with pytest.raises(ValueError):
        row["input_ids"][0] = 1


def test_seq_lens_is_one_array_not_a_copy_per_call(int64_three_shards):
    ours = draftfeed.open_dataset(int64_three_shards)
    a, b = ours.seq_lens(), ours.seq_lens()
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def test_empty_dataset(tmp_path):
    """datasets 5 saves 0 rows as an empty `_data_files` list (and cannot load it back itself); the
    columns then come from dataset_info.json."""
    path = tmp_path / "empty"
    reference = save_dataset(path, {"input_ids": [], "loss_mask": [], "seq_len": []})
    assert len(reference) == 0
    ours = draftfeed.open_dataset(str(path))
    assert len(ours) == 0 and ours.total_tokens == 0 and ours.seq_lens().tolist() == []
    assert ours.columns == {f.name: arrow_type_text(f.type) for f in reference.features.arrow_schema}
    assert ours.has_loss_mask
    with pytest.raises(IndexError):
        ours.row(0)
    assert ours.split  # a split of nothing is refused, below
    with pytest.raises(ValueError, match=r"0 rows with train_ratio 0\.5 give split index 0"):
        ours.split(0.5)


def test_empty_shard_written_by_pyarrow(tmp_path):
    table = table_of({"input_ids": [], "seq_len": []}, {"input_ids": pa.list_(pa.int32()), "seq_len": pa.int64()})
    write_stream_folder(str(tmp_path), [table])
    ours = draftfeed.open_dataset(str(tmp_path))
    assert len(ours) == 0 and ours.columns == {"input_ids": "list<int32>", "seq_len": "int64"}
    assert not ours.has_loss_mask


def test_torch_format_dataset(tmp_path):
    path = tmp_path / "torch"
    save_dataset(path, random_columns(300, seed=3), torch_format=True)
    reference = datasets.load_from_disk(str(path))
    assert reference.format["type"] == "torch"
    ours = draftfeed.open_dataset(str(path))
    for i in (0, 150, 299):
        assert np.array_equal(ours.row(i)["loss_mask"], reference[i]["loss_mask"].numpy())
        assert np.array_equal(ours.row(i)["input_ids"], reference[i]["input_ids"].numpy())


def test_stray_cache_files_are_ignored(tmp_path, int64_three_shards):
    path = tmp_path / "with_cache"
    shutil.copytree(int64_three_shards, path)
    # A cache file of different rows, and one that is not Arrow at all.
    save_dataset(tmp_path / "other", random_columns(10, seed=9))
    shutil.copy(tmp_path / "other" / "data-00000-of-00001.arrow", path / "cache-0123456789abcdef.arrow")
    (path / "cache-deadbeef.arrow").write_bytes(b"not arrow")
    ours = draftfeed.open_dataset(str(path))
    assert len(ours) == 2500 and len(ours.shards) == 3
    assert_rows_equal(ours, reference_columns(str(path)))


def test_split_matches_speculators(int64_three_shards):
    from speculators.train.data import ArrowDataset

    ours = draftfeed.open_dataset(int64_three_shards)
    for ratio in (0.9, 0.5, 0.123):
        train, val = ours.split(ratio)
        reference_val = ArrowDataset(8192, int64_three_shards, train_ratio=ratio, split="val", on_missing="skip")
        reference_train = ArrowDataset(8192, int64_three_shards, train_ratio=ratio, split="train", on_missing="skip")
        assert (train.begin, train.end) == (0, reference_train.start_file_idx + len(reference_train))
        assert (val.begin, val.end) == (reference_val.start_file_idx, 2500)
        assert val.seq_lens().tolist() == reference_val.approx_lengths
        assert train.seq_lens().tolist() == reference_train.approx_lengths
        assert val.global_row(0) == reference_val.start_file_idx
        assert val.global_row(-1) == 2499
        assert val.row(3)["loss_mask"].tolist() == list(reference_val.data[3]["loss_mask"])
        assert len(val) == len(reference_val)


def test_split_refuses_empty_parts_naming_the_numbers(tmp_path):
    path = tmp_path / "three"
    save_dataset(path, random_columns(3, seed=4))
    ours = draftfeed.open_dataset(str(path))
    with pytest.raises(ValueError, match=r"3 rows with train_ratio 0.1 give split index 0, so the train split is empty"):
        ours.split(0.1)
    for bad in (0.0, 1.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="train_ratio must be in"):
            ours.split(bad)


def test_single_dataset_arrow_file_of_old_datasets(tmp_path, int32_one_shard):
    path = tmp_path / "old"
    path.mkdir()
    shutil.copy(os.path.join(int32_one_shard, "data-00000-of-00001.arrow"), path / "dataset.arrow")
    ours = draftfeed.open_dataset(str(path))
    assert_rows_equal(ours, reference_columns(int32_one_shard))


# ---------------------------------------------------------------------------------------------
# streams written by pyarrow


def table_of(columns: dict, types: dict) -> pa.Table:
    return pa.table({name: pa.array(values, type=types[name]) for name, values in columns.items()})


@pytest.mark.parametrize(
    "ids_type, mask_type, len_type",
    [
        (pa.large_list(pa.int64()), pa.large_list(pa.int64()), pa.int64()),
        (pa.list_(pa.uint16()), pa.list_(pa.int8()), pa.int32()),
        (pa.list_(pa.uint8()), pa.list_(pa.uint8()), pa.uint8()),
        (pa.list_(pa.int16()), pa.large_list(pa.int32()), pa.int16()),
        (pa.list_(pa.uint32()), pa.list_(pa.uint64()), pa.uint64()),
    ],
)
def test_integer_widths_and_large_lists(tmp_path, ids_type, mask_type, len_type):
    columns = random_columns(2100, seed=5, vocab=int(min(np.iinfo(ids_type.value_type.to_pandas_dtype()).max, 150_000)))
    columns["seq_len"] = [min(n, 255) for n in columns["seq_len"]]
    table = table_of(columns, {"input_ids": ids_type, "loss_mask": mask_type, "seq_len": len_type})
    write_stream_folder(str(tmp_path), [table])
    ours = draftfeed.open_dataset(str(tmp_path))
    assert ours.columns == {f.name: arrow_type_text(f.type) for f in table.schema}
    assert ours.row(7)["input_ids"].dtype == np.dtype(ids_type.value_type.to_pandas_dtype())
    assert ours.row(7)["loss_mask"].dtype == np.dtype(mask_type.value_type.to_pandas_dtype())
    assert_rows_equal(ours, expected_rows(table))


def test_sliced_tables_and_absent_seq_len(tmp_path):
    columns = random_columns(3000, seed=6)
    del columns["seq_len"]
    table = table_of(columns, {"input_ids": pa.list_(pa.int64()), "loss_mask": pa.list_(pa.int64())})
    parts = [table.slice(0, 1234), table.slice(1234, 1), table.slice(1235)]
    write_stream_folder(str(tmp_path), parts)
    ours = draftfeed.open_dataset(str(tmp_path))
    assert_rows_equal(ours, expected_rows(table))  # lengths come from input_ids without seq_len


def test_list_offsets_that_do_not_start_at_zero(tmp_path):
    """pyarrow rebases offsets when it writes, so this layout is built from raw buffers; pyarrow's
    reader is the oracle."""
    offsets = np.array([3, 5, 9, 9, 12], dtype=np.int32)
    values = np.arange(100, 112, dtype=np.int64)  # elements 0..2 belong to no row
    lengths = np.diff(offsets).astype(np.int64)
    validity = np.packbits(np.ones(4, dtype=bool), bitorder="little").tobytes()  # present, no nulls
    path = tmp_path / "data-00000-of-00001.arrow"
    draftfeed._core._write_arrow_stream(
        str(path),
        [("input_ids", True, False, 64, True), ("seq_len", False, False, 64, True)],
        [(4, [(4, 0), (12, 0), (4, 0)], [validity, offsets.tobytes(), b"", values.tobytes(), b"", lengths.tobytes()])],
    )
    write_state(str(tmp_path), [path.name])
    table = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
    table.validate(full=True)
    ours = draftfeed.open_dataset(str(tmp_path))
    assert_rows_equal(ours, expected_rows(table))
    assert ours.total_tokens == 9


@pytest.mark.parametrize("variant", ["legacy_framing", "metadata_v4", "file_format"])
def test_older_framings_and_the_file_format(tmp_path, variant):
    columns = random_columns(1500, seed=7)
    table = table_of(columns, {"input_ids": pa.list_(pa.int32()), "loss_mask": pa.list_(pa.int64()), "seq_len": pa.int64()})
    tmp_path.mkdir(exist_ok=True)
    if variant == "file_format":
        with pa.OSFile(str(tmp_path / "data.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=1000)
        write_state(str(tmp_path), ["data.arrow"])
    else:
        options = (
            pa.ipc.IpcWriteOptions(use_legacy_format=True)
            if variant == "legacy_framing"
            else pa.ipc.IpcWriteOptions(metadata_version=pa.ipc.MetadataVersion.V4)
        )
        write_stream_folder(str(tmp_path), [table], options=options)
    assert_rows_equal(draftfeed.open_dataset(str(tmp_path)), expected_rows(table))


def test_dictionary_encoded_column_that_is_not_read_is_skipped(tmp_path):
    columns = random_columns(1200, seed=8)
    table = table_of(columns, {"input_ids": pa.list_(pa.int64()), "loss_mask": pa.list_(pa.int64()), "seq_len": pa.int64()})
    source = pa.array([f"source-{i % 7}" for i in range(1200)]).dictionary_encode()
    table = table.append_column("source", source)
    write_stream_folder(str(tmp_path), [table])
    ours = draftfeed.open_dataset(str(tmp_path))
    assert ours.columns["source"] == arrow_type_text(table.schema.field("source").type)
    assert ours.columns["source"] == "dictionary<values=string, indices=int32>"
    assert_rows_equal(ours, expected_rows(table))


def test_columns_of_every_layout_are_skipped(tmp_path):
    """Columns draftfeed does not read are stepped over whatever their buffer layout: structs, maps,
    unions, run-end encoding, list views, string views (variadic buffers), fixed-size lists."""
    n = 2100
    columns = random_columns(n, seed=9)
    table = table_of(columns, {"input_ids": pa.list_(pa.int32()), "loss_mask": pa.list_(pa.int64()), "seq_len": pa.int64()})
    extra = {
        "messages": pa.array([[{"role": "user", "content": f"q{i}"}] for i in range(n)]),
        "map": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
        "union": pa.UnionArray.from_sparse(
            pa.array([i % 2 for i in range(n)], pa.int8()), [pa.array(range(n)), pa.array(["a"] * n)]
        ),
        "ree": pa.RunEndEncodedArray.from_arrays(pa.array([1000, n], pa.int32()), pa.array([7, 8])),
        "list_view": pa.array([[i] for i in range(n)], pa.list_view(pa.int32())),
        "string_view": pa.array([f"text number {i} that is longer than twelve bytes" for i in range(n)], pa.string_view()),
        "fixed": pa.array([[1, 2]] * n, pa.list_(pa.int8(), 2)),
        "time": pa.array(range(n), pa.timestamp("us", tz="UTC")),
        "nothing": pa.nulls(n),
        "text": pa.array([None if i % 3 else "x" for i in range(n)], pa.large_string()),
    }
    for name, array in extra.items():
        table = table.append_column(name, array)
    write_stream_folder(str(tmp_path), [table])
    ours = draftfeed.open_dataset(str(tmp_path))
    assert list(ours.columns) == table.column_names
    for name in ("messages", "map", "fixed", "time", "text"):
        assert ours.columns[name] == arrow_type_text(table.schema.field(name).type), name
    assert ours.columns["ree"] == "run_end_encoded<run_ends: int32, values: int64>"
    assert_rows_equal(ours, expected_rows(table.select(["input_ids", "loss_mask", "seq_len"])))


# ---------------------------------------------------------------------------------------------
# the CLI


def test_inspect_json_equals_numbers_from_datasets(run_cli_json, int64_three_shards):
    report = run_cli_json("inspect", int64_three_shards)
    reference = datasets.load_from_disk(int64_three_shards)
    lens = np.array(reference.with_format(None)["seq_len"])
    assert report["rows"] == len(reference)
    assert report["shards"] == len(reference.cache_files)
    assert report["columns"] == {f.name: arrow_type_text(f.type) for f in reference.data.table.schema}
    assert report["tokens"] == sum(len(x) for x in reference.with_format(None)["input_ids"])
    assert report["seq_len"]["min"] == lens.min() and report["seq_len"]["max"] == lens.max()
    assert report["seq_len"]["mean"] == pytest.approx(lens.mean(), rel=1e-12)
    assert sum(report["histogram"]["counts"]) == len(reference)
    counts, _ = np.histogram(lens, bins=np.array(report["histogram"]["edges"]))
    assert report["histogram"]["counts"] == counts.tolist()


def test_inspect_text_and_empty_dataset(run_cli, run_cli_json, tmp_path):
    path = tmp_path / "empty"
    save_dataset(path, {"input_ids": [], "loss_mask": [], "seq_len": []})
    report = run_cli_json("inspect", path)
    assert report["rows"] == 0 and report["tokens"] == 0 and report["seq_len"]["min"] is None
    text = run_cli("inspect", path).stdout
    shards = len(json.load(open(path / "state.json"))["_data_files"])
    assert f"rows     0 in {shards} shard(s)" in text and "input_ids: list<int64>" in text
    assert report["shards"] == shards
