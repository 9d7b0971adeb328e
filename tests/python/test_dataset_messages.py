"""TokenDataset.messages_json against the real thing: for every row, the JSON text draftfeed builds
from the mapped shard must parse to exactly `load_from_disk(folder)[i]["messages"]` (the value the
reference hands the openai client)."""

from __future__ import annotations

import json
import math
from typing import Any

import datasets
import pyarrow as pa
import pytest
from test_dataset import write_stream_folder

import draftfeed

datasets.disable_progress_bars()


def same(ours, ref, path="messages") -> None:
    """Strict equality: same types (a float stays a float, a bool a bool), NaN equal to NaN."""
    if isinstance(ref, float):
        assert isinstance(ours, float), f"{path}: {ours!r} vs {ref!r}"
        assert (math.isnan(ours) and math.isnan(ref)) or ours == ref, f"{path}: {ours!r} vs {ref!r}"
    elif isinstance(ref, dict):
        assert isinstance(ours, dict) and list(ours) == list(ref), f"{path}: {ours!r} vs {ref!r}"
        for key in ref:
            same(ours[key], ref[key], f"{path}.{key}")
    elif isinstance(ref, list):
        assert isinstance(ours, list) and len(ours) == len(ref), f"{path}: {ours!r} vs {ref!r}"
        for k, (a, b) in enumerate(zip(ours, ref)):
            same(a, b, f"{path}[{k}]")
    else:
        assert type(ours) is type(ref) and ours == ref, f"{path}: {ours!r} vs {ref!r}"


def check_every_row(folder: str, column: list | None = None) -> draftfeed.TokenDataset:
    """`column` is the reference's messages column; by default `load_from_disk(folder)`'s."""
    if column is None:
        column = datasets.load_from_disk(folder)["messages"]
    ours = draftfeed.open_dataset(folder)
    assert ours.has_messages
    assert len(ours) == len(column)
    for i in range(len(column)):
        same(json.loads(ours.messages_json(i)), column[i], f"row {i}: messages")
    return ours


TRICKY_TEXT = [
    'quotes " and \\ backslash / slash',
    "controls \x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f end",
    "emoji 😀🎉, CJK 中文字, accents éü, RTL שלום, zero-width \u200b, BOM \ufeff",
    "",
    "surrogate-range neighbours \ud7ff \ue000 \U0010ffff",
]


def multimodal_row(i: int):
    """Conversations whose content parts have differing fields, so struct nulls appear."""
    if i % 11 == 3:
        return None  # a null row
    if i % 13 == 5:
        return []
    parts: list[dict[str, Any]] = [{"type": "text", "text": TRICKY_TEXT[i % len(TRICKY_TEXT)] + f" #{i}"}]
    if i % 2 == 0:
        parts.append({"type": "image_url", "image_url": {"url": f"https://example.com/{i}.png"}})
    if i % 3 == 0:
        parts.append({"type": "image", "image": f"file:///img/{i}.jpg", "detail": None})
    if i % 7 == 0:
        parts = []  # empty content list
    turns = [{"role": "user", "content": parts}]
    if i % 4 != 1:
        turns.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]})
    return turns


@pytest.fixture(scope="module")
def multimodal_dataset():
    rows = 2600  # several record batches of 1000 rows in each shard
    return datasets.Dataset.from_dict(
        {
            "input_ids": [[i, i + 1] for i in range(rows)],
            "loss_mask": [[0, 1] for _ in range(rows)],
            "messages": [multimodal_row(i) for i in range(rows)],
        }
    )


def test_multimodal_messages_in_several_shards(tmp_path, multimodal_dataset):
    folder = str(tmp_path / "mm")
    multimodal_dataset.save_to_disk(folder, num_shards=3)
    ours = check_every_row(folder)
    assert len(ours.shards) == 3
    # Negative indices count from the end, as everywhere in TokenDataset.
    assert ours.messages_json(-1) == ours.messages_json(len(ours) - 1)
    with pytest.raises(IndexError):
        ours.messages_json(len(ours))


def test_max_shard_size(tmp_path, multimodal_dataset):
    folder = str(tmp_path / "small_shards")
    multimodal_dataset.select(range(600)).save_to_disk(folder, max_shard_size="20KB")
    assert len(check_every_row(folder).shards) > 2


@pytest.mark.parametrize("how", ["select", "shuffle", "slice"])
def test_selected_and_shuffled_rows(tmp_path, multimodal_dataset, how):
    # Selections and shuffles are written from sliced / gathered tables, so list offsets need not
    # start at 0 in every batch.
    if how == "select":
        subset = multimodal_dataset.select(range(37, 2411))
    elif how == "shuffle":
        subset = multimodal_dataset.shuffle(seed=3).flatten_indices()
    else:
        subset = multimodal_dataset.select(range(1333, 1900)).flatten_indices()
    folder = str(tmp_path / how)
    subset.save_to_disk(folder, num_shards=2)
    check_every_row(folder)


def int32s(*values: int) -> bytes:
    return b"".join(v.to_bytes(4, "little", signed=True) for v in values)


@pytest.mark.parametrize(
    "old,new,first_row",
    [
        (int32s(0, 1, 3, 5), int32s(1, 2, 3, 5), '["b"]'),  # list offsets
        (int32s(0, 2, 3, 5, 8, 9), int32s(1, 2, 3, 5, 8, 9), '["a"]'),  # string offsets
    ],
    ids=["list", "string"],
)
def test_offsets_not_starting_at_zero(tmp_path, old, new, first_row):
    # pyarrow always writes offsets from 0, so a shard it wrote is patched (pyarrow still reads
    # the patched file, and is the oracle through load_from_disk).
    messages = pa.array([["aa"], ["b", "cc"], ["ddd", "e"]], pa.list_(pa.string()))
    table = pa.table({"input_ids": pa.array([[1]] * 3, pa.list_(pa.int64())), "messages": messages})
    (shard,) = write_stream_folder(str(tmp_path / "offsets"), [table])
    data = open(shard, "rb").read()
    assert data.count(old) == 1
    with open(shard, "wb") as f:
        f.write(data.replace(old, new))
    # No dataset_info.json here, so pyarrow (which load_from_disk reads through) is the oracle.
    reference = pa.ipc.open_stream(pa.memory_map(shard)).read_all()
    reference.validate(full=True)
    ours = check_every_row(str(tmp_path / "offsets"), reference.column("messages").to_pylist())
    assert ours.messages_json(0) == first_row


def test_text_only_messages(tmp_path):
    rows = [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": t}]
        for t in TRICKY_TEXT
    ]
    rows.append([{"role": "user", "content": None}])
    folder = str(tmp_path / "text")
    datasets.Dataset.from_dict(
        {"input_ids": [[1]] * len(rows), "messages": rows}
    ).save_to_disk(folder)
    ours = check_every_row(folder)
    assert ours.messages_json(0) == '[{"role":"system","content":"be brief"},{"role":"user",' \
        '"content":"quotes \\" and \\\\ backslash / slash"}]'


def test_numbers_bools_nested_lists(tmp_path):
    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int64")),
            "messages": {
                "i8": datasets.Value("int8"),
                "u8": datasets.Value("uint8"),
                "i16": datasets.Value("int16"),
                "u32": datasets.Value("uint32"),
                "i64": datasets.Value("int64"),
                "u64": datasets.Value("uint64"),
                "f16": datasets.Value("float16"),
                "f32": datasets.Value("float32"),
                "f64": datasets.Value("float64"),
                "flag": datasets.Value("bool"),
                "nested": datasets.List(datasets.List(datasets.Value("int32"))),
                "large": datasets.LargeList(datasets.Value("string")),
                "fixed": datasets.List(datasets.Value("float64"), length=3),
                "nothing": datasets.Value("null"),
            },
        }
    )
    floats = [0.0, -0.0, 1.0, 0.1, 1e16, 1e15, 1e-4, 1e-5, 123.456, 5e-324, 1.7976931348623157e308,
              float("nan"), float("inf"), float("-inf"), 2.5, -3.0, 65504.0, 1 / 3]
    rows = []
    for k, f in enumerate(floats):
        rows.append(
            {
                "i8": [-128, 127, None][k % 3],
                "u8": 255 - k,
                "i16": -32768 + k,
                "u32": 4294967295 - k,
                "i64": [-(2**63), 2**63 - 1, 0, None][k % 4],
                "u64": 2**64 - 1 - k,
                "f16": f if k % 5 else None,
                "f32": f,
                "f64": f,
                "flag": [True, False, None][k % 3],
                "nested": [[1, 2], [], None, [k]] if k % 2 else [],
                "large": ["a", None, "ü"][: k % 4],
                "fixed": [f, k, None] if k % 6 else None,
                "nothing": None,
            }
        )
    rows.append(None)
    folder = str(tmp_path / "numbers")
    # Built through pyarrow with the features' schema: from_dict would infer int64 for uint64 first.
    table = pa.Table.from_pydict(
        {"input_ids": [[1]] * len(rows), "messages": rows}, schema=features.arrow_schema
    )
    datasets.Dataset(table).save_to_disk(folder)
    ours = check_every_row(folder)
    text = ours.messages_json(0)
    assert '"f64":0.0' in text and '"u64":18446744073709551615' in text
    assert '"f64":NaN' in ours.messages_json(11)
    assert '"f64":-Infinity' in ours.messages_json(13)
    assert '"f64":1e+16' in ours.messages_json(4)


def test_without_messages_column(tmp_path):
    folder = str(tmp_path / "plain")
    datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]]}).save_to_disk(folder)
    ours = draftfeed.open_dataset(folder)
    assert not ours.has_messages
    with pytest.raises(ValueError, match="no 'messages' column"):
        ours.messages_json(0)


def test_unsupported_type_names_column_and_row(tmp_path):
    folder = str(tmp_path / "binary")
    datasets.Dataset.from_dict(
        {"input_ids": [[1], [2]], "messages": [b"\x00\x01", b"xyz"]}
    ).save_to_disk(folder)
    ours = draftfeed.open_dataset(folder)  # opening never looks at the column
    assert ours.has_messages
    with pytest.raises(draftfeed.FormatError) as error:
        ours.messages_json(1)
    message = str(error.value)
    assert "'messages'" in message and "binary" in message and "row 1" in message


def test_nested_unsupported_type(tmp_path):
    table = pa.table(
        {
            "input_ids": pa.array([[1]], pa.list_(pa.int64())),
            "messages": pa.array(
                [[{"role": "user", "when": None}]],
                pa.list_(pa.struct([("role", pa.string()), ("when", pa.timestamp("s"))])),
            ),
        }
    )
    write_stream_folder(str(tmp_path / "ts"), [table])
    ours = draftfeed.open_dataset(str(tmp_path / "ts"))
    with pytest.raises(draftfeed.FormatError, match=r"timestamp\[s\].*no JSON form"):
        ours.messages_json(0)


def test_invalid_utf8_is_an_error(tmp_path):
    good = pa.array(["fine", "also fine"], pa.string())
    offsets, data = good.buffers()[1], pa.py_buffer(b"fine\xc3\x28lso fine")
    # pyarrow does not validate strings built from buffers; the reader must.
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, data])
    table = pa.table({"input_ids": pa.array([[1], [2]], pa.list_(pa.int64())), "messages": bad})
    write_stream_folder(str(tmp_path / "utf8"), [table])
    ours = draftfeed.open_dataset(str(tmp_path / "utf8"))
    assert json.loads(ours.messages_json(0)) == "fine"
    with pytest.raises(draftfeed.FormatError, match=r"row 1.*not valid UTF-8"):
        ours.messages_json(1)


def test_open_does_not_read_messages(tmp_path):
    # A corrupt messages string must not stop open (offline training never reads it). pyarrow
    # refuses to build one, so a valid shard's string offset is patched in the file.
    length = 0x4142  # its offset bytes are easy to find
    table = pa.table(
        {"input_ids": pa.array([[7]], pa.list_(pa.int64())), "messages": pa.array(["x" * length])}
    )
    (shard,) = write_stream_folder(str(tmp_path / "corrupt"), [table])
    data = open(shard, "rb").read()
    marker = b"\x00\x00\x00\x00" + length.to_bytes(4, "little") + b"xxxx"  # offsets, then data
    assert data.count(marker) == 1
    with open(shard, "wb") as f:
        f.write(data.replace(marker, b"\x00\x00\x00\x00" + (length + 1000).to_bytes(4, "little") + b"xxxx"))
    ours = draftfeed.open_dataset(str(tmp_path / "corrupt"))
    assert ours.input_ids(0).tolist() == [7]
    with pytest.raises(draftfeed.FormatError, match=r"row 0.*string offsets"):
        ours.messages_json(0)
