"""The hidden-state cache store against the reference reader, hs_connectors.FileTransfer.

Both directions: FileTransfer reads what draftfeed caches (adopt, the synthetic writer), and
draftfeed reads what the producer's lock protocol produces, with a real writer *process* that
holds flock(LOCK_EX) on `<file>.lock` while it writes (as vLLM's hidden-states connector does).
Each lock scenario runs against both readers and their outcomes are compared. Adoption (rename and
cross-file-system copy) and confinement to the allowed folders are checked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import safetensors.torch
import torch
from hs_connectors.transfer import FileTransfer, wait_for_lock

import draftfeed

pytestmark = pytest.mark.timeout(120)

# A producer process: takes the lock, signals, writes a partial file, waits, writes the complete
# file in place (non-atomically, like the connector's save_file), then releases the lock by
# closing it and leaves the lock file for the reader to remove.
WRITER = textwrap.dedent(
    """
    import fcntl, os, sys, time, torch
    from safetensors.torch import save_file
    data, hold, tokens = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    fd = os.open(data + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with open(data, "wb") as f:
        f.write(b"partial")
    print("locked", flush=True)
    time.sleep(hold)
    g = torch.Generator().manual_seed(tokens)
    save_file({"token_ids": torch.arange(tokens) + 100,
               "hidden_states": torch.randn(tokens, 4, 16, generator=g).to(torch.bfloat16)}, data)
    os.close(fd)
    """
)


def start_writer(data: Path, hold: float, tokens: int = 6) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data), str(hold), str(tokens)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def expected_tensors(tokens: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(tokens)
    return {
        "token_ids": torch.arange(tokens) + 100,
        "hidden_states": torch.randn(tokens, 4, 16, generator=g).to(torch.bfloat16),
    }


def as_torch(sample: dict) -> dict[str, torch.Tensor]:
    hidden = torch.from_numpy(sample["hidden_states"].copy())
    if sample["hidden_states_dtype"] == "BF16":
        hidden = hidden.view(torch.bfloat16)
    return {"token_ids": torch.from_numpy(sample["token_ids"].copy()), "hidden_states": hidden}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


def lookup_with_draftfeed(root: Path, row: int, timeout: float):
    store = draftfeed.HiddenStateStore(str(root), lock_timeout=timeout, lock_poll=0.02)
    sample = store.lookup(row)
    return None if sample is None else as_torch(cast(dict, sample))


def lookup_with_reference(root: Path, row: int, timeout: float):
    # FileTransfer's lookup with the timeout made small: the same function it calls.
    path = root / f"hs_{row}.safetensors"
    lock = str(path) + ".lock"
    if Path(lock).exists():
        wait_for_lock(lock, timeout=timeout, poll_interval=0.02)
    return safetensors.torch.load_file(path) if path.exists() else None


READERS = {"draftfeed": lookup_with_draftfeed, "reference": lookup_with_reference}


@pytest.mark.parametrize("reader", READERS)
def test_reader_waits_for_the_writer_process_and_reads_the_complete_file(tmp_path, reader):
    data = tmp_path / "hs_3.safetensors"
    writer = start_writer(data, hold=0.5)
    start = time.monotonic()
    loaded = READERS[reader](tmp_path, 3, timeout=10.0)
    waited = time.monotonic() - start
    assert writer.wait(timeout=30) == 0
    assert waited >= 0.3
    assert_same(loaded, expected_tensors(6))
    assert not Path(str(data) + ".lock").exists(), "the reader removes the lock file"


@pytest.mark.parametrize("reader", READERS)
def test_lock_held_past_the_timeout_is_a_timeout_error(tmp_path, reader):
    data = tmp_path / "hs_4.safetensors"
    writer = start_writer(data, hold=60.0)  # killed below
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError) as raised:
            READERS[reader](tmp_path, 4, timeout=0.3)
        # At the timeout, not when the writer lets go (a minute): a margin a loaded machine keeps.
        assert 0.25 <= time.monotonic() - start < 30
        assert str(data) + ".lock" in str(raised.value)
        assert Path(str(data) + ".lock").exists()
    finally:
        writer.kill()
        writer.wait(timeout=30)


@pytest.mark.parametrize("reader", READERS)
def test_stale_lock_without_a_holder_is_removed(tmp_path, reader):
    tensors = expected_tensors(5)
    safetensors.torch.save_file(tensors, str(tmp_path / "hs_5.safetensors"))
    (tmp_path / "hs_5.safetensors.lock").touch()
    assert_same(READERS[reader](tmp_path, 5, timeout=2.0), tensors)
    assert not (tmp_path / "hs_5.safetensors.lock").exists()


@pytest.mark.parametrize("reader", READERS)
def test_missing_file_is_none(tmp_path, reader):
    assert READERS[reader](tmp_path, 9, timeout=1.0) is None


def test_timeout_message_names_the_lock_and_the_wait(tmp_path):
    data = tmp_path / "hs_1.safetensors"
    writer = start_writer(data, hold=3.0)
    try:
        store = draftfeed.HiddenStateStore(str(tmp_path), lock_timeout=0.2, lock_poll=0.05)
        with pytest.raises(TimeoutError, match=r"hs_1\.safetensors\.lock: timed out after 0\.2 s waiting"):
            store.lookup(1)
    finally:
        writer.kill()
        writer.wait(timeout=30)


def test_probe_mode_reports_a_held_lock_at_once_and_leaves_it(tmp_path):
    data = tmp_path / "hs_2.safetensors"
    writer = start_writer(data, hold=100.0)  # killed below
    try:
        store = draftfeed.HiddenStateStore(str(tmp_path), lock_timeout=60.0, probe_locks=True)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="locked by a writer"):
            store.lookup(2)
        # Not waited for: a wait would last the lock timeout (a minute).
        assert time.monotonic() - start < 30
        assert Path(str(data) + ".lock").exists()
    finally:
        writer.kill()
        writer.wait(timeout=30)


def test_file_transfer_reads_what_draftfeed_adopts(tmp_path):
    server = tmp_path / "server"
    root = tmp_path / "cache"
    server.mkdir()
    tensors = expected_tensors(7)
    generated = server / "req-1.safetensors"
    safetensors.torch.save_file(tensors, str(generated))
    store = draftfeed.HiddenStateStore(str(root), allowed_folders=[str(server)])
    sample = store.load(str(generated))
    assert_same(as_torch(sample), tensors)
    store.adopt(12, str(generated))
    assert not generated.exists()
    assert_same(FileTransfer(root).get_cached(12), tensors)


def test_file_transfer_reads_the_synthetic_cache(tmp_path):
    rows = [[5, 6, 7], [1, 2, 3, 4], [9]]
    files, _ = draftfeed.write_synthetic_hidden_states(str(tmp_path), rows, seed=11, hidden_size=8,
                                                       layers=3, dtype="BF16", threads=2)
    assert files == 3
    transfer = FileTransfer(tmp_path)
    for row, ids in enumerate(rows):
        loaded = transfer.get_cached(row)
        assert loaded["token_ids"].tolist() == ids
        assert loaded["hidden_states"].dtype == torch.bfloat16
        assert list(loaded["hidden_states"].shape) == [len(ids), 3, 8]
        # Every value is the documented formula's, recomputed here with numpy.
        positions, layers, hs = np.meshgrid(np.arange(len(ids)), np.arange(3), np.arange(8), indexing="ij")
        expected = synthetic_values(11, row, positions, layers, hs)
        np.testing.assert_array_equal(loaded["hidden_states"].float().numpy(), expected)


MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix(z: Any) -> np.ndarray:
    z = z.astype(np.uint64)
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def synthetic_values(seed, row, positions, layers, hs) -> np.ndarray:
    """The formula documented in src/draftfeed/hidden/synthetic_cache.h."""
    with np.errstate(over="ignore"):
        base = mix(mix(mix(mix(np.uint64(seed)) ^ np.uint64(row)) ^ positions.astype(np.uint64))
                   ^ layers.astype(np.uint64))
        k = (mix(base ^ hs.astype(np.uint64)) >> np.uint64(57)).astype(np.int64)
    return ((k - 64) / 16).astype(np.float32)


@pytest.mark.parametrize("dtype,torch_dtype", [("BF16", torch.bfloat16), ("F16", torch.float16), ("F32", torch.float32)])
def test_synthetic_values_are_exact_in_every_dtype(tmp_path, dtype, torch_dtype):
    draftfeed.write_synthetic_hidden_states(str(tmp_path), [[1, 2]], seed=5, hidden_size=64, layers=2,
                                            dtype=dtype)
    loaded = safetensors.torch.load_file(str(tmp_path / "hs_0.safetensors"))
    assert loaded["hidden_states"].dtype == torch_dtype
    positions, layers, hs = np.meshgrid(np.arange(2), np.arange(2), np.arange(64), indexing="ij")
    values = loaded["hidden_states"].float().numpy()
    np.testing.assert_array_equal(values, synthetic_values(5, 0, positions, layers, hs))
    assert values.min() >= -4 and values.max() <= 3.9375
    assert draftfeed.synthetic_hidden_value(5, 0, 1, 1, 63) == values[1, 1, 63]


def test_adopt_across_file_systems(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the temporary folder")
    server = shm / f"draftfeed_test_{os.getpid()}"
    server.mkdir()
    try:
        tensors = expected_tensors(4)
        generated = server / "gen.safetensors"
        safetensors.torch.save_file(tensors, str(generated))
        store = draftfeed.HiddenStateStore(str(tmp_path / "cache"), allowed_folders=[str(server)])
        store.adopt(3, str(generated))
        assert not generated.exists()
        assert_same(FileTransfer(tmp_path / "cache").get_cached(3), tensors)
        assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["hs_3.safetensors"]
    finally:
        for p in server.iterdir():
            p.unlink()
        server.rmdir()


def test_adopt_with_the_forced_copy_path_replaces_atomically(tmp_path):
    server = tmp_path / "server"
    server.mkdir()
    root = tmp_path / "cache"
    old, new = expected_tensors(2), expected_tensors(9)
    store = draftfeed.HiddenStateStore(str(root), allowed_folders=[str(server)],
                                       force_copy_on_adopt=True)
    safetensors.torch.save_file(old, str(server / "a.safetensors"))
    store.adopt(1, str(server / "a.safetensors"))
    safetensors.torch.save_file(new, str(server / "b.safetensors"))
    store.adopt(1, str(server / "b.safetensors"))
    assert_same(FileTransfer(root).get_cached(1), new)
    assert sorted(p.name for p in root.iterdir()) == ["hs_1.safetensors"]
    assert list(server.iterdir()) == []


def test_paths_outside_the_allowed_folders_are_refused(tmp_path):
    server, outside, root = tmp_path / "server", tmp_path / "outside", tmp_path / "cache"
    server.mkdir()
    outside.mkdir()
    victim = outside / "victim.safetensors"
    safetensors.torch.save_file(expected_tensors(2), str(victim))
    (server / "dir_link").symlink_to(outside)
    (server / "file_link.safetensors").symlink_to(victim)
    store = draftfeed.HiddenStateStore(str(root), allowed_folders=[str(server)])
    attempts = [
        str(victim),
        str(server / ".." / "outside" / "victim.safetensors"),
        str(server / "dir_link" / "victim.safetensors"),
        str(server / "file_link.safetensors"),
        str(root / ".." / "outside" / "victim.safetensors"),
        "/etc/passwd",
    ]
    for path in attempts:
        for call in (lambda p: store.adopt(0, p), store.remove, store.load):
            with pytest.raises(ValueError, match="outside the folders this store may change"):
                call(path)
    assert victim.exists()
    assert not (root / "hs_0.safetensors").exists()
