"""A dataset shard truncated under its reader (another process cutting the mapped file): a running
Loader counts the rows it can no longer read as drops naming the shard and the row, the Python
dataset API raises OSError naming them, a `messages` value is an error, and `draftfeed inspect` and
`plan` end with an error naming the shard: never a SIGBUS. Each reader runs in its own process, so
that a SIGBUS (what the unguarded reads did) ends only it and the test sees how it ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from slowfs_process import SlowFs, slowfs_unavailable

ROWS = 3000
PAGE = os.sysconf("SC_PAGE_SIZE")
SHRANK = "could not be read: the shard shrank under the reader (truncated or rewritten by another process)"


def run_python(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode >= 0, f"killed by {signal.Signals(-proc.returncode).name}:\n{proc.stderr}"
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def one_shard(tmp_path) -> tuple[str, str]:
    data = str(tmp_path / "data")
    summary = draftfeed.write_synthetic_dataset(data, ROWS, seed=3, min_len=8, max_len=40, num_shards=1)
    return data, summary["shards"][0]


LOADER = """
import json, os, sys, draftfeed
data, shard, page = sys.argv[1], sys.argv[2], int(sys.argv[3])
loader = draftfeed.Loader(data, hidden_size=8, num_target_layers=1, total_seq_len=256, split="all",
                          num_threads=2, prefetch=2, pin_memory=False)
batches, invalid, messages = 0, 0, []
for batch in loader:
    if batches == 0:
        os.truncate(shard, page)  # the schema is left, every row is cut
    batches += 1
    invalid += loader.last_batch.dropped.get("invalid", 0)
    messages += [m for _, m in loader.last_batch.drop_messages]
print(json.dumps({"batches": batches, "planned": len(loader), "invalid": invalid, "messages": messages}))
"""


def test_a_running_loader_counts_the_rows_of_a_shard_cut_under_it(one_shard):
    data, shard = one_shard
    dataset = draftfeed.open_dataset(data)
    ids = [dataset.input_ids(row).tolist() for row in range(ROWS)]
    draftfeed.write_synthetic_hidden_states(os.path.join(data, "hidden_states"), ids, hidden_size=8, layers=2)
    out = json.loads(run_python(LOADER, data, shard, str(PAGE)).stdout)
    assert out["batches"] == out["planned"]
    assert out["invalid"] > 0
    assert out["messages"]
    for message in out["messages"]:
        assert message.startswith(f"{shard}: row "), message
        assert SHRANK in message, message


ROWS_API = """
import json, os, sys, draftfeed
data, shard, page = sys.argv[1], sys.argv[2], int(sys.argv[3])
dataset = draftfeed.open_dataset(data)
lengths = dataset.seq_lens().tolist()
last = len(dataset) - 1
os.truncate(shard, page)
out = {"lengths_kept": dataset.seq_lens().tolist() == lengths}
for name, read in (("row", lambda: dataset.row(last)), ("input_ids", lambda: dataset.input_ids(last)),
                   ("loss_mask", lambda: dataset.loss_mask(-1)), ("getitem", lambda: dataset[last])):
    try:
        read()
        out[name] = "read"
    except OSError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def test_the_dataset_api_raises_naming_the_shard_and_row(one_shard):
    data, shard = one_shard
    out = json.loads(run_python(ROWS_API, data, shard, str(PAGE)).stdout)
    assert out["lengths_kept"]
    last = ROWS - 1
    assert out["row"] == f"{shard}: row {last}: its input_ids {SHRANK}"
    assert out["input_ids"] == f"{shard}: row {last}: its input_ids {SHRANK}"
    assert out["loss_mask"] == f"{shard}: row {last}: its loss_mask {SHRANK}"
    assert out["getitem"] == out["row"]


MESSAGES = """
import os, sys, draftfeed
data, shard = sys.argv[1], sys.argv[2]
dataset = draftfeed.open_dataset(data)
first = dataset.messages_json(len(dataset) - 1)
os.truncate(shard, 4096)
try:
    dataset.messages_json(len(dataset) - 1)
    print("read")
except Exception as e:
    print(type(e).__name__, e)
"""


def test_a_messages_value_cut_under_the_walk_is_an_error(tmp_path):
    rows = 200
    turn = [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "y" * 200}]
    data = tmp_path / "chat"
    datasets.Dataset.from_dict(
        {"input_ids": [[1, 2, 3]] * rows, "loss_mask": [[0, 1, 1]] * rows, "messages": [turn] * rows}
    ).save_to_disk(str(data))
    (shard,) = draftfeed.open_dataset(str(data)).shards
    out = run_python(MESSAGES, str(data), shard).stdout.strip()
    assert out.startswith(f"OSError {shard}: row {rows - 1}: column 'messages'"), out
    assert out.endswith(
        "the shard shrank while the value was read (truncated or rewritten by another process)"
    )


# -- a shard cut while `draftfeed inspect` / `plan` open it --


@pytest.fixture
def slow_dataset(tmp_path):
    """A one-shard dataset of many record batches seen through slowfs, every read of it 20 ms late:
    opening it (the parse reads every record batch's offsets) takes seconds, and the test cuts the
    shard in the middle of that."""
    reason = slowfs_unavailable()
    if reason is not None:
        pytest.skip(reason)
    source = tmp_path / "source"
    summary = draftfeed.write_synthetic_dataset(
        str(source / "data"), 60_000, seed=1, min_len=8, max_len=40, num_shards=1
    )
    with SlowFs(source, tmp_path / "mount", read_ms=20, every_read=True, attr_timeout=0) as fs:
        yield fs, tmp_path / "mount" / "data", summary["shards"][0]


def mapped(pid: int, name: str) -> bool:
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_a_shard_cut_while_it_is_opened_is_a_named_error(slow_dataset, command):
    from conftest import cli_path

    _fs, data, source_shard = slow_dataset
    args = [cli_path(), command, str(data)] + (
        ["--world-size", "1", "--max-len", "256"] if command == "plan" else []
    )
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not mapped(proc.pid, os.path.basename(source_shard)) and proc.poll() is None:
            assert time.monotonic() < deadline, "the shard was never mapped"
            time.sleep(0.002)
        os.truncate(source_shard, PAGE)  # behind the mount: another host's writer, say
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode >= 0, f"killed by {signal.Signals(-proc.returncode).name}:\n{stderr}"
    assert proc.returncode != 0, "the cut went unnoticed"
    assert f"{data}/{os.path.basename(source_shard)}" in stderr, stderr
    assert "shrank while" in stderr, stderr
