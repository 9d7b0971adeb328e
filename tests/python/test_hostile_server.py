"""A hostile (or buggy) vLLM server against the online source: whatever handle it answers with, it
cannot make draftfeed delete, move or hang on a file that is not its request's output
(docs/protocol.md, "Generated files"). Every server listens on 127.0.0.1 (hostile_vllm.py), every
fetch is bounded in time. Also: the API key, a nested state.json, the dataset writer's temporaries.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hostile_vllm import HostileServer
from safetensors.torch import save_file

import draftfeed

pytestmark = pytest.mark.timeout(180)

LAYERS, HIDDEN = 2, 8
ROWS = 8


def write_sample(path: Path, ids: np.ndarray, value: float = 0.5) -> None:
    """A valid hidden-state file for `ids`, written by the real safetensors package."""
    path.parent.mkdir(parents=True, exist_ok=True)
    hidden = torch.full((len(ids), LAYERS, HIDDEN), value, dtype=torch.float32)
    save_file({"hidden_states": hidden, "token_ids": torch.from_numpy(np.asarray(ids, dtype=np.int64))},
              str(path))


@pytest.fixture(scope="module")
def ids(tmp_path_factory) -> list[np.ndarray]:
    path = tmp_path_factory.mktemp("hostile_ds") / "data"
    draftfeed.write_synthetic_dataset(str(path), ROWS, seed=11, min_len=4, max_len=12, vocab=3000)
    ds = draftfeed.open_dataset(str(path))
    return [np.ascontiguousarray(ds.input_ids(r), dtype=np.int64) for r in range(ROWS)]


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in sorted(folder.rglob("*"))}


def source_for(server: HostileServer, cache: Path, **options):
    settings: dict[str, Any] = dict(
        hidden_states_path=cache, request_timeout=10.0, retry_backoff=0.01, lock_timeout=0.5,
        lock_poll=0.01, fetch_threads=2, log_failures=False, max_consecutive_generation_failures=1000)
    settings.update(options)
    return draftfeed.online.OnlineSource(server.url, **settings)


def fetch_within(source, row: int, ids: np.ndarray, seconds: float = 30.0) -> dict:
    """The fetch's result, or a failure if it has not returned within `seconds`."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(source.fetch(row, ids)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"row {row}: the fetch still hangs after {seconds} s"
    return out


@pytest.fixture
def cache(tmp_path: Path, ids) -> Path:
    """A cache holding rows 0-5 (written by safetensors); rows 6 and 7 are missing."""
    folder = tmp_path / "cache"
    for row in range(6):
        write_sample(folder / f"hs_{row}.safetensors", ids[row])
    return folder


# -- the handle names a cache file under another spelling (the default: no server_dir) --

SPELLINGS = {
    "trailing slash": "{cache}/hs_{k}.safetensors/",
    "trailing dot": "{cache}/hs_{k}.safetensors/.",
    "double slash": "{cache}//hs_{k}.safetensors",
    "dot component": "{cache}/./hs_{k}.safetensors",
    "dot-dot component": "{cache}/sub/../hs_{k}.safetensors",
}


@pytest.mark.parametrize("on_generate", ["delete", "cache"])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_a_cache_file_under_another_spelling_is_never_removed(ids, cache, spelling, on_generate):
    (cache / "sub").mkdir()
    before = listing(cache)
    pattern = SPELLINGS[spelling]
    with HostileServer(lambda _ids, n: pattern.format(cache=cache, k=n % 6)) as server:
        source = source_for(server, cache, on_generate=on_generate, generation_validation_retries=2)
        for row in (6, 7):
            result = fetch_within(source, row, ids[row])
            assert not result["ok"], result
    assert listing(cache) == before, "a cache file was removed, moved or changed"
    stats = source.stats()
    assert stats["deleted"] == 0 and stats["adopted"] == 0, stats
    assert server.requests == 6


# -- a file set aside for a later sweep, swapped before the sweep --


@pytest.mark.parametrize("swap", ["symlink to a cache file", "another file"])
def test_a_file_swapped_before_the_sweep_of_abandoned_files_is_left(tmp_path, ids, cache, swap):
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    junk = server_dir / "junk.safetensors"
    held: dict[str, int] = {}

    def choose(row_ids, n):
        if n == 0:
            # A junk answer whose writer holds its lock past the reader's lock_timeout.
            junk.write_bytes(b"not a sample")
            fd = os.open(str(junk) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            held["fd"] = fd
            return str(junk)
        path = server_dir / f"req_{n}.safetensors"
        write_sample(path, np.array(row_ids))
        return str(path)

    with HostileServer(choose) as server:
        source = source_for(server, cache, server_dir=server_dir, generation_validation_retries=0)
        assert not fetch_within(source, 6, ids[6])["ok"]
        assert source.stats()["abandoned"] == 1
        # The server swaps the file it named, then lets go of the lock.
        junk.unlink()
        if swap == "symlink to a cache file":
            junk.symlink_to(cache / "hs_3.safetensors")
        else:
            write_sample(junk, ids[3])
        swapped = listing(server_dir)
        os.close(held["fd"])
        # The next round trip sweeps the abandoned file first.
        before = listing(cache)
        assert fetch_within(source, 7, ids[7])["ok"]
    assert source.stats()["abandoned"] == 0
    assert (cache / "hs_3.safetensors").is_file() and not (cache / "hs_3.safetensors").is_symlink()
    assert listing(cache) == before
    assert junk.is_symlink() or junk.is_file(), "the swapped-in file was removed"
    remaining = listing(server_dir)
    assert remaining["junk.safetensors"] == swapped["junk.safetensors"]


# -- files that are not the request's output, without a server folder --


@pytest.mark.parametrize("on_generate", ["delete", "cache"])
def test_another_runs_cache_file_is_read_but_never_removed_or_moved(tmp_path, ids, cache, on_generate):
    other = tmp_path / "other_run_cache"
    for row in range(ROWS):
        write_sample(other / f"hs_{row}.safetensors", ids[row], value=0.25)
    before_other, before_cache = listing(other), listing(cache)
    with HostileServer(lambda _ids, n: str(other / f"hs_{6 + n}.safetensors")) as server:
        source = source_for(server, cache, on_generate=on_generate)
        for row in (6, 7):
            result = fetch_within(source, row, ids[row])
            assert result["ok"], result  # a valid sample for the row: used...
    assert listing(other) == before_other  # ...but never removed, nor moved into this cache
    assert listing(cache) == before_cache
    stats = source.stats()
    assert stats["left_in_place"] == 2 and stats["deleted"] == 0 and stats["adopted"] == 0, stats


def test_a_file_older_than_the_request_is_never_removed(tmp_path, ids, cache):
    keep = tmp_path / "mine" / "precious.safetensors"
    write_sample(keep, ids[6])
    # The file is more than the allowed clock skew (1 s here) older than the request: wait until so.
    deadline = time.monotonic() + 30
    while time.time() < os.stat(keep).st_mtime + 1.5:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = listing(keep.parent)
    with HostileServer(lambda _ids, n: str(keep)) as server:
        source = source_for(server, cache, on_generate="delete", generated_file_clock_skew=1.0)
        assert fetch_within(source, 6, ids[6])["ok"]
    assert listing(keep.parent) == before
    assert source.stats()["left_in_place"] == 1
    said = "\n".join(source.take_messages()[0])
    assert "before the request was sent" in said and str(keep) in said


def test_a_hard_link_to_a_file_is_never_removed(tmp_path, ids, cache):
    server_dir = tmp_path / "server"
    victim = tmp_path / "mine" / "precious.safetensors"
    write_sample(victim, ids[6])

    def choose(_ids, n):
        link = server_dir / f"h{n}.safetensors"
        server_dir.mkdir(exist_ok=True)
        os.link(victim, link)
        return str(link)

    with HostileServer(choose) as server:
        source = source_for(server, cache, server_dir=server_dir, on_generate="cache")
        assert fetch_within(source, 6, ids[6])["ok"]
    assert victim.is_file() and os.stat(victim).st_nlink == 2
    assert not (cache / "hs_6.safetensors").exists()
    assert source.stats()["left_in_place"] == 1


@pytest.mark.parametrize("name", ["notes/keep.txt", "req.safetensors"])
def test_a_file_under_the_cache_folder_is_never_removed(ids, cache, name):
    target = cache / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if name.endswith(".txt"):
        target.write_text("my notes")
    else:
        write_sample(target, ids[6])
    before = listing(cache)
    with HostileServer(lambda _ids, n: str(target)) as server:
        source = source_for(server, cache, on_generate="delete", generation_validation_retries=1)
        fetch_within(source, 6, ids[6])
    assert listing(cache) == before
    assert source.stats()["deleted"] == 0


def test_the_servers_own_outputs_are_still_removed(tmp_path, ids, cache):
    """The rules take nothing from the reference's clean-up: fresh, single-link outputs in the
    server's folder go (moved into the cache, or deleted when invalid), with their lock files."""
    server_dir = tmp_path / "server"
    server_dir.mkdir()

    def choose(row_ids, n):
        path = server_dir / f"req_{n}.safetensors"
        write_sample(path, np.array(row_ids), value=float("nan") if n == 0 else 0.5)
        (server_dir / f"req_{n}.safetensors.lock").touch()
        return str(path)

    with HostileServer(choose) as server:
        source = source_for(server, cache, server_dir=server_dir, on_generate="cache")
        assert fetch_within(source, 6, ids[6])["ok"]  # the first answer (NaN) fails, the next works
    assert sorted(os.listdir(server_dir)) == []
    assert (cache / "hs_6.safetensors").is_file()
    stats = source.stats()
    assert stats["deleted"] == 1 and stats["adopted"] == 1 and stats["left_in_place"] == 0, stats


# -- nothing that can hang --


def test_a_fifo_under_a_cache_files_name_is_refused_not_waited_on(ids, cache):
    fifo = cache / "hs_6.safetensors"
    os.mkfifo(fifo)
    try:
        with HostileServer(lambda _ids, n: "/nonexistent") as server:
            source = source_for(server, cache, on_missing="skip")
            result = fetch_within(source, 6, ids[6], seconds=20)
        assert not result["ok"] and "not a regular file" in result["message"], result
    finally:
        _release_readers(fifo)


def _release_readers(fifo: Path) -> None:
    """Lets go of a reader stuck opening the FIFO (the code before the fix): a writer's open."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader: nothing is stuck


def test_a_handle_that_is_a_fifo_is_refused_at_once(tmp_path, ids, cache):
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    os.mkfifo(server_dir / "f.safetensors")
    os.mkfifo(server_dir / "g.safetensors")
    (server_dir / "g.safetensors.lock").symlink_to(server_dir / "f.safetensors")
    handles = [str(server_dir / "f.safetensors"), str(server_dir / "g.safetensors")]
    with HostileServer(lambda _ids, n: handles[n % 2]) as server:
        source = source_for(server, cache, server_dir=server_dir, generation_validation_retries=1)
        result = fetch_within(source, 6, ids[6], seconds=20)
    assert not result["ok"]
    failures = source.stats()["file_failures"]
    assert failures["not a regular file"] + failures["unreadable"] == 2, failures


# -- the API key --


def test_the_api_key_is_sent_from_the_environment_and_never_said(tmp_path, ids, cache, monkeypatch):
    server_dir = tmp_path / "server"

    def choose(row_ids, n):
        path = server_dir / f"req_{n}.safetensors"
        write_sample(path, np.array(row_ids))
        return str(path)

    with HostileServer(choose, require_key="sk-test-4711") as server:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-4711")
        source = source_for(server, cache, server_dir=server_dir)
        assert fetch_within(source, 6, ids[6])["ok"]
        assert set(server.authorizations) == {"Bearer sk-test-4711"}
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-0815")
        wrong = source_for(server, cache, server_dir=server_dir, max_retries=0,
                           generation_validation_retries=0, log_failures=True)
        result = fetch_within(wrong, 7, ids[7])
        assert not result["ok"] and "401" in result["message"], result
        assert "sk-wrong-0815" not in result["message"]
        assert not any("sk-wrong-0815" in m for m in wrong.take_messages()[0])
        # Given as an option, it wins over the environment.
        explicit = source_for(server, cache, server_dir=server_dir, api_key="sk-test-4711")
        assert fetch_within(explicit, 7, ids[7])["ok"]


# -- files a dataset names, and the dataset writer's temporaries --


def test_a_deeply_nested_state_json_is_an_error_not_a_crash(tmp_path):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), 4, seed=1)
    depth = 300_000
    (data / "state.json").write_text('{"_data_files": [' + "[" * depth + "]" * depth + "]}")
    # In a child: the code before the fix died of a stack overflow (exit -11).
    code = ("import draftfeed, sys\n"
            "try:\n    draftfeed.open_dataset(sys.argv[1])\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "state.json" in done.stdout and "nested deeper" in done.stdout, done.stdout


def test_the_dataset_writer_follows_no_planted_link(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    # A link at the name the writer's first temporary shard had (a fixed name before the fix),
    # which the writer takes for a leftover of its own and so accepts in the folder.
    (data / ".draftfeed-writing-0.arrow").symlink_to(victim)
    draftfeed.write_synthetic_dataset(str(data), 8, seed=2)
    assert victim.read_text() == "precious"
    assert len(draftfeed.open_dataset(str(data))) == 8


# -- a server that never lets go of its writer locks --


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(("limit", "requests"), [(None, 80), (4, 40)])
def test_the_files_of_a_server_that_never_releases_its_locks_hold_bounded_descriptors(
    tmp_path, ids, cache, limit, requests
):
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    locks: list[int] = []

    def choose(_row_ids, n):
        # Every answer's writer takes its lock and never lets go.
        path = server_dir / f"req_{n}.safetensors"
        path.write_bytes(b"never finished")
        fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        locks.append(fd)
        return str(path)

    options = {} if limit is None else {"max_abandoned_files": limit}
    limit = limit or 64  # the default
    try:
        with HostileServer(choose) as server:
            source = source_for(server, cache, server_dir=server_dir, generation_validation_retries=0,
                                lock_timeout=0.0, **options)
            before = open_descriptors()
            for n in range(requests):
                assert not fetch_within(source, 6 + n % 2, ids[6 + n % 2])["ok"]
            stats = source.stats()
            # The test's own lock descriptors are `requests` of the growth; the source's are bounded.
            grown = open_descriptors() - before - len(locks)
        assert stats["abandoned"] == limit, stats
        assert stats["left_in_place"] == requests - limit, stats
        assert grown <= 3 * limit + 8, f"{grown} descriptors more for {limit} files held"
        messages = [m for m in source.take_messages()[0] if "max_abandoned_files" in m]
        assert messages, "the files let go of are said"
        assert messages[0] == (
            f"{server_dir}/req_0.safetensors: generated file left in place, not deleted: its writer "
            f"still holds its lock, and {limit} failed files held so are the most kept open "
            "(max_abandoned_files)"
        )
    finally:
        for fd in locks:
            os.close(fd)
    assert sorted(p.name for p in server_dir.iterdir() if p.suffix == ".safetensors")[:1] == ["req_0.safetensors"]


# -- a handle that would forge log lines --


def test_a_handle_with_control_characters_is_logged_escaped(tmp_path, ids, cache):
    """The server's handle goes into the warnings a person reads: a newline in it would forge a log
    line, an escape sequence would clear their terminal, a right-to-left override would show the name
    reversed. Each is written as \\xNN; UTF-8 text stays as it is."""
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    forged = "req\ndraftfeed: warning: all good\x1b[2J\u202e\u4e2d.safetensors"

    def choose(_row_ids, _n):
        return str(server_dir / forged)

    with HostileServer(choose) as server:
        source = source_for(server, cache, server_dir=server_dir, generation_validation_retries=0)
        assert not fetch_within(source, 6, ids[6])["ok"]
        messages = source.take_messages()[0]
    named = [m for m in messages if "req" in m]
    assert named, messages
    for message in messages:
        assert "\n" not in message and "\x1b" not in message and "\u202e" not in message, message
    assert any("req\\x0adraftfeed: warning: all good\\x1b[2J\\xe2\\x80\\xae\u4e2d.safetensors" in m
               for m in named), named
