"""The dataset writer and the synthetic generator: their output must load with the real
`datasets.load_from_disk` (and pyarrow's full validation) and give identical rows."""

from __future__ import annotations

import json
import os

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch
from test_dataset import arrow_type_text, assert_rows_equal, random_columns

import draftfeed


def load(path) -> datasets.Dataset:
    return datasets.load_from_disk(str(path))


def validate_shards(path) -> list[int]:
    """pyarrow's full validation of every shard; returns the record batch sizes."""
    sizes = []
    for entry in json.load(open(os.path.join(path, "state.json")))["_data_files"]:
        reader = pa.ipc.open_stream(pa.memory_map(os.path.join(path, entry["filename"])))
        for batch in reader:
            batch.validate(full=True)
            sizes.append(batch.num_rows)
    return sizes


def write_rows(path, columns, **options) -> dict:
    writer = draftfeed.DatasetWriter(str(path), **options)
    for ids, mask in zip(columns["input_ids"], columns["loss_mask"]):
        writer.add_row(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.int64))
    return writer.finish()


@pytest.mark.parametrize("int32", [False, True])
def test_written_rows_load_identically_with_datasets_in_torch_format(tmp_path, int32):
    columns = random_columns(2345, seed=11, max_len=60)
    summary = write_rows(tmp_path, columns, input_ids_int32=int32)
    assert summary["rows"] == 2345 and summary["tokens"] == sum(columns["seq_len"])
    reference = load(tmp_path)
    assert reference.format["type"] == "torch"  # as speculators' preprocessing saves it
    assert len(reference) == 2345
    plain = reference.with_format(None)[:]
    assert plain["input_ids"] == columns["input_ids"]
    assert plain["loss_mask"] == columns["loss_mask"]
    assert plain["seq_len"] == columns["seq_len"]
    assert reference.with_format(None)["seq_len"] == columns["seq_len"]  # the reference's lengths
    row = reference[2000]
    assert row["input_ids"].dtype == torch.int64  # datasets' torch formatter widens int32
    assert torch.equal(row["loss_mask"], torch.tensor(columns["loss_mask"][2000]))
    ids_type = "int32" if int32 else "int64"
    assert reference.features["input_ids"] == datasets.List(datasets.Value(ids_type))
    assert validate_shards(str(tmp_path)) == [1000, 1000, 345]
    ours = draftfeed.open_dataset(str(tmp_path))
    assert ours.columns == {f.name: arrow_type_text(f.type) for f in reference.data.table.schema}
    assert_rows_equal(ours, plain)


def test_shard_count_and_batch_size(tmp_path):
    columns = random_columns(2500, seed=12)
    summary = write_rows(tmp_path, columns, num_shards=3, total_rows=2500, rows_per_batch=300)
    names = [os.path.basename(p) for p in summary["shards"]]
    assert names == [f"data-{k:05d}-of-00003.arrow" for k in range(3)]
    reference = load(tmp_path)
    # datasets' own contiguous sharding of 2500 rows into 3
    expected = [datasets.Dataset.from_dict({"x": list(range(2500))}).shard(3, k, contiguous=True).num_rows for k in range(3)]
    assert [len(pa.ipc.open_stream(pa.memory_map(p)).read_all()) for p in summary["shards"]] == expected
    assert validate_shards(str(tmp_path)) == [b for n in expected for b in [300] * (n // 300) + [n % 300]]
    assert reference.with_format(None)["input_ids"] == columns["input_ids"]


def test_shards_cut_by_size(tmp_path):
    columns = random_columns(3000, seed=13)
    summary = write_rows(tmp_path, columns, max_shard_bytes=100_000)
    assert len(summary["shards"]) > 2
    assert sum(os.path.getsize(p) for p in summary["shards"]) == summary["bytes"]
    assert load(tmp_path).with_format(None)["loss_mask"] == columns["loss_mask"]


def test_empty_rows_big_ids_and_an_empty_dataset(tmp_path):
    columns = {"input_ids": [[], [2**62, -5], [], [7]], "loss_mask": [[], [1, 0], [], [1]]}
    write_rows(tmp_path / "edge", columns)
    assert load(tmp_path / "edge").with_format(None)["input_ids"] == columns["input_ids"]
    write_rows(tmp_path / "empty", {"input_ids": [], "loss_mask": []})
    assert len(load(tmp_path / "empty")) == 0
    assert len(draftfeed.open_dataset(str(tmp_path / "empty"))) == 0


def test_writer_refuses_bad_rows_and_foreign_folders(tmp_path):
    writer = draftfeed.DatasetWriter(str(tmp_path / "a"), input_ids_int32=True)
    with pytest.raises(ValueError, match="row 0 has 2 input_ids but 1 loss_mask values"):
        writer.add_row([1, 2], [1])
    with pytest.raises(ValueError, match=f"row 0 has token id {2**40}, which does not fit the int32 column"):
        writer.add_row([2**40], [1])
    with pytest.raises(ValueError, match="num_shards=2 needs total_rows"):
        draftfeed.DatasetWriter(str(tmp_path / "b"), num_shards=2)
    writer = draftfeed.DatasetWriter(str(tmp_path / "c"), total_rows=2)
    writer.add_row([1], [1])
    with pytest.raises(ValueError, match="1 rows were added but total_rows=2"):
        writer.finish()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(ValueError, match=r"already holds 'thesis\.tex', which is not part of a dataset"):
        draftfeed.DatasetWriter(str(tmp_path / "mine"))


def test_rewriting_a_folder_replaces_the_old_dataset(tmp_path):
    write_rows(tmp_path, random_columns(50, seed=14), num_shards=4, total_rows=50)
    (tmp_path / "hidden_states").mkdir()  # another stage's folder stays
    columns = random_columns(20, seed=15)
    write_rows(tmp_path, columns)
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".arrow")) == ["data-00000-of-00001.arrow"]
    assert load(tmp_path).with_format(None)["input_ids"] == columns["input_ids"]
    assert (tmp_path / "hidden_states").is_dir()


def test_unfinished_writer_leaves_no_shards(tmp_path):
    writer = draftfeed.DatasetWriter(str(tmp_path))
    writer.add_row([1, 2, 3], [0, 1, 1])
    del writer
    assert os.listdir(tmp_path) == []


def synthetic_reference(rows, seed, min_len, max_len, vocab):
    return [draftfeed.synthetic_row(r, seed=seed, min_len=min_len, max_len=max_len, vocab=vocab) for r in range(rows)]


def test_synthetic_dataset_is_a_function_of_seed_and_row(tmp_path):
    summary = draftfeed.write_synthetic_dataset(str(tmp_path), 1500, seed=5, min_len=3, max_len=40, vocab=1000)
    rows = synthetic_reference(1500, 5, 3, 40, 1000)
    reference = load(tmp_path).with_format(None)[:]
    assert reference["input_ids"] == [ids.tolist() for ids, _ in rows]
    assert reference["loss_mask"] == [mask.tolist() for _, mask in rows]
    assert summary["tokens"] == sum(len(ids) for ids, _ in rows)
    lengths = np.array(reference["seq_len"])
    assert lengths.min() >= 3 and lengths.max() <= 40 and len(set(lengths)) > 30
    ids = np.concatenate([ids for ids, _ in rows])
    assert ids.min() >= 0 and ids.max() < 1000
    for _, mask in rows:  # a prompt of zeros then ones, at most half the row
        assert np.all(np.diff(mask) >= 0) and (mask == 0).sum() <= len(mask) // 2
    other = draftfeed.synthetic_row(7, seed=6, min_len=3, max_len=40, vocab=1000)[0]
    assert other.tolist() != rows[7][0].tolist()


def test_synthetic_row_formula_documented_in_synthetic_h():
    """The functions in synthetic.h, recomputed in Python, give the same rows."""
    mask64 = (1 << 64) - 1

    def mix64(z):
        z = (z + 0x9E3779B97F4A7C15) & mask64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask64
        return z ^ (z >> 31)

    def h(seed, stream, row, position):
        return mix64(mix64(mix64(seed ^ ((stream * 0xD1B54A32D192ED03) & mask64)) ^ row) ^ position)

    seed, min_len, max_len, vocab = 123456789, 5, 50, 32000
    for row in (0, 1, 77, 10**6):
        length = min_len + h(seed, 1, row, 0) % (max_len - min_len + 1)
        prompt = h(seed, 3, row, 0) % (length // 2 + 1)
        ids, mask = draftfeed.synthetic_row(row, seed=seed, min_len=min_len, max_len=max_len, vocab=vocab)
        assert ids.tolist() == [h(seed, 2, row, t) % vocab for t in range(length)]
        assert mask.tolist() == [1 if t >= prompt else 0 for t in range(length)]


def test_cli_synth_then_inspect(run_cli, run_cli_json, tmp_path):
    out = tmp_path / "synth"
    report = run_cli_json("synth", out, "--rows", "2100", "--seed", "3", "--min-len", "1", "--max-len", "30", "--shards", "2", "--int32")
    reference = load(out)
    assert report["rows"] == len(reference) == 2100 and report["shards"] == 2
    assert report["tokens"] == sum(reference.with_format(None)["seq_len"])
    assert reference.features["input_ids"] == datasets.List(datasets.Value("int32"))
    ids = reference.with_format(None)["input_ids"]
    assert ids[1234] == draftfeed.synthetic_row(1234, seed=3, min_len=1, max_len=30)[0].tolist()
    inspected = run_cli_json("inspect", out)
    assert inspected["rows"] == 2100 and inspected["columns"]["input_ids"] == "list<int32>"
    text = run_cli("synth", tmp_path / "t", "--rows", "10").stdout
    assert text.startswith("wrote 10 rows (") and "in 1 shard(s)" in text
    bad = run_cli("synth", tmp_path / "u", "--rows", "5", "--min-len", "9", "--max-len", "3", check=False)
    assert bad.returncode == 2 and "--min-len 9 is above --max-len 3" in bad.stderr
    bad = run_cli("synth", tmp_path / "u", check=False)
    assert bad.returncode == 2 and "--rows N is required" in bad.stderr
