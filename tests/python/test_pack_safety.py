"""Packed caches that nothing can break (issue 49): one writer per cache folder (the writer lock),
a per-sample file removed only once its row is safe in the pack, every field a reader uses checked
against checksummed bytes or the file's size, and a running loader that follows a rewrite.

Each defect the issue names has a test here that failed on the code before the change (said in the
test's docstring); the variants add kills of the lock holder, two hosts sharing a folder (network
namespaces with their own host names, the same kernel: two_hosts.py), a rewrite during an epoch,
and every header field lying. The oracles: the loader over the per-sample cache the pack came from
(itself compared with speculators' batches in test_packed_cache.py), and speculators 0.9.0's own
batches where the cache is a per-sample one."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_path
from hs_connectors import FP8Transfer
from pack_edit import (
    edit_shard_header,
    flip_sample_byte,
    manifest_of,
    sample_of,
    samples_of,
    set_sample_field,
)
from reference_fixtures import assert_same_batch, write_fixture
from reference_fixtures import reference_batches as speculators_batches

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = pytest.mark.timeout(600)

ROWS, MAX_LEN, HIDDEN = 120, 256, 16
LOCK = ".draftfeed-writer.lock"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    path = tmp_path_factory.mktemp("safety") / "data"
    return write_fixture(str(path), rows=ROWS, hidden_size=HIDDEN, max_len=MAX_LEN, distinct=False)


def copy_cache(fixture, folder: Path) -> Path:
    shutil.copytree(Path(fixture.path) / "hidden_states", folder)
    return folder


def run(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([cli_path(), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def run_json(*args, timeout: float = 120) -> tuple[int, dict]:
    proc = run(*args, "--json", timeout=timeout)
    assert proc.stdout.strip(), f"draftfeed {args} printed nothing: {proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def verify(data, cache: Path) -> dict:
    return run_json("verify", data, "--hidden-states", cache)[1]


def epoch(fixture, cache: Path, loader=None, epoch_number: int = 0) -> tuple[list, dict]:
    """The loader's batches of one epoch over `cache` and its drops by reason (a loader given is
    kept open: a running loader's next epoch)."""
    own = loader is None
    if own:
        loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN,
                                  hidden_states_path=cache, num_target_layers=fixture.layers - 1,
                                  train_ratio=0.9, pin_memory=False)
    try:
        before = dict(loader.metrics()["dropped"])
        loader.set_epoch(epoch_number)
        batches = [{k: v.clone() for k, v in b.items()} for b in loader]
        after = loader.metrics()["dropped"]
        return batches, {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    finally:
        if own:
            loader.close()


def reference_batches(fixture, flat: Path, epoch_number: int = 0) -> list[dict]:
    """speculators 0.9.0's batches over the per-sample cache `flat` (a missing file skipped)."""
    return speculators_batches(fixture, max_len=MAX_LEN, train_ratio=0.9, epoch=epoch_number,
                               transfer=FP8Transfer(flat))


def assert_batches(ours: list, expected: list, what: str) -> None:
    assert len(ours) == len(expected), what
    for k, (a, b) in enumerate(zip(ours, expected)):
        assert_same_batch(a, b, f"{what}, batch {k}")


def holder(folder: Path, *extra: str, wait: float = 0.0) -> subprocess.Popen:
    """`draftfeed lock FOLDER --hold 600` once it holds the lock (its "held" line read, bounded)."""
    proc = subprocess.Popen([cli_path(), "lock", str(folder), "--hold", "600", "--wait", str(wait), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    assert ready, "draftfeed lock --hold did not say it held the lock within 60 s"
    line = proc.stdout.readline()
    assert line.startswith("held"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


# ---- one writer per cache folder ----------------------------------------------------------------


@pytest.mark.parametrize("lock_wait", [None, 120])
def test_two_in_place_packs_at_once_lose_no_row(tmp_path, lock_wait):
    """Two `pack --in-place` of one cache started together. Before the writer lock both exited 0 and
    verify found hundreds of rows missing (shards renamed over each other, their rows' files gone).
    Now the second waits (--lock-wait) or refuses naming the first's host and pid; every row reads
    and the batches are those of the per-sample cache."""
    data = tmp_path / "data"
    assert run("synth", data, "--rows", 1500, "--min-len", 16, "--max-len", 128, "--hidden-size", 64,
               "--layers", 4).returncode == 0
    cache = data / "hidden_states"
    flat = tmp_path / "flat"
    shutil.copytree(cache, flat)
    args = [cli_path(), "pack", str(data), "--in-place", "--shard-bytes", "40000", "--no-progress",
            "--threads", "1", *([] if lock_wait is None else ["--lock-wait", str(lock_wait)])]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for code, stderr in results:
        if code != 0:
            assert lock_wait is None, stderr
            assert "is being rewritten by host " in stderr and "draftfeed pack" in stderr, stderr
            assert "--lock-wait SECONDS" in stderr, stderr
    report = verify(data, cache)
    assert report["ok"] == 1500 and report["missing"] == 0 and report["corrupt"] == 0, report
    run("pack", data, "--in-place", "--shard-bytes", 40000)  # what a refused pack left
    assert not list(cache.glob("hs_*"))
    loader = dict(hidden_size=64, total_seq_len=512, pin_memory=False)
    a = draftfeed.Loader(data, **loader)
    b = draftfeed.Loader(data, hidden_states_path=flat, **loader)
    try:
        a.set_epoch(0)
        b.set_epoch(0)
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_batch(x, y, f"batch {k}")
        assert sum(a.metrics()["dropped"].values()) == 0
    finally:
        a.close()
        b.close()


def test_the_holder_is_named_waited_for_and_released_when_it_dies(fixture, tmp_path):
    """`draftfeed lock --hold` holds a cache's writer lock: pack, unpack and quantize refuse naming its
    host and pid, `draftfeed lock` says who holds it, a rewrite with --lock-wait waits and goes on
    once the holder ends, and a holder killed (SIGKILL) releases it at once."""
    cache = copy_cache(fixture, tmp_path / "cache")
    hold = holder(cache)
    try:
        for command in (["pack", "--in-place"], ["unpack", "--in-place"], ["quantize", "--in-place"]):
            proc = run(command[0], fixture.path, "--hidden-states", cache, *command[1:], "--no-progress")
            assert proc.returncode == 1, proc
            assert f"is being rewritten by host {os.uname().nodename}, pid {hold.pid} (draftfeed lock --hold" \
                in proc.stderr, proc.stderr
        code, status = run_json("lock", cache)
        assert code == 1 and status["held"] and status["pid"] == hold.pid, status
        assert list(cache.glob("hs_*.safetensors")) and not (cache / "manifest.json").exists()
        waiting = subprocess.Popen([cli_path(), "pack", fixture.path, "--hidden-states", str(cache), "--in-place",
                                    "--lock-wait", "300", "--json"], stdout=subprocess.PIPE, text=True)
        assert waiting.poll() is None
        hold.send_signal(signal.SIGTERM)
        hold.wait(timeout=60)
        out, _ = waiting.communicate(timeout=300)
        assert waiting.returncode == 0 and json.loads(out)["packed"] == ROWS
        # A holder killed while it holds the lock: the next writer goes on at once.
        hold = holder(cache)
        hold.kill()
        hold.wait(timeout=60)
        back = run("unpack", fixture.path, "--hidden-states", cache, "--in-place", "--lock-wait", "0")
        assert back.returncode == 0, back.stderr
        assert run_json("lock", cache) == (0, {"folder": str(cache), "held": False})
    finally:
        hold.kill()


def test_generate_into_a_pack_holds_the_lock(tmp_path):
    """`draftfeed generate` into a folder that holds a pack is a rewrite of it: a pack meanwhile is
    refused naming it (before, nothing stopped a pack from removing a row's repaired file)."""
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), 16, seed=5, min_len=4, max_len=24, vocab=5000)
    with SimServerProcess(tmp_path / "server", layers=4, hidden=16, seed=3) as sim:
        first = run_json("generate", data, "--endpoint", sim.url, "--server-dir", tmp_path / "server",
                         "--no-progress")
        assert first[0] == 0, first
        assert run("pack", data, "--in-place", "--rows", "0:8").returncode == 0
        for row in range(8, 16):
            (data / "hidden_states" / f"hs_{row}.safetensors").unlink()
        sim.set_faults({"latency": {"median": 2.0, "p99": 2.0}})
        gen = subprocess.Popen([cli_path(), "generate", str(data), "--endpoint", sim.url, "--server-dir",
                                str(tmp_path / "server"), "--no-progress", "--fetch-threads", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not run_json("lock", data / "hidden_states")[1]["held"]:
                assert time.monotonic() < deadline and gen.poll() is None, "generate never took the lock"
                time.sleep(0.05)
            proc = run("pack", data, "--in-place")
            assert proc.returncode == 1 and f"pid {gen.pid} (draftfeed generate" in proc.stderr, proc.stderr
        finally:
            gen.wait(timeout=120)
        assert gen.returncode == 0, gen.stderr.read()
    assert verify(data, data / "hidden_states")["ok"] == 16


def _rewrite_command(kind: str, data: Path, sim_url: str, server: Path, compress: bool, wait: int) -> list[str]:
    base = [cli_path(), kind, str(data)]
    if kind == "pack":
        return base + ["--in-place", "--shard-bytes", "3000", "--no-progress", "--lock-wait", str(wait)] + (
            ["--compress"] if compress else [])
    if kind in ("unpack", "quantize"):
        return [*base, "--in-place", "--no-progress", "--lock-wait", str(wait)]
    return [*base, "--endpoint", sim_url, "--server-dir", str(server), "--no-progress", "--lock-wait", str(wait)]


def test_concurrent_rewrites_in_a_loop_keep_every_row(tmp_path):
    """20 rounds, each two in-place rewrites of one cache started together (every pair of pack,
    unpack, quantize and generate, twice; half the rounds the second refuses instead of waiting,
    then runs after). After each round every row reads (verify), each row's bytes as the loader
    reads them are its generated file or that file's FP8 conversion (nothing lost, nothing else),
    and the loader's batches over the folder are those of the same rows as per-sample files."""
    import itertools

    rows = 40
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), rows, seed=5, min_len=4, max_len=24, vocab=5000)
    cache = data / "hidden_states"
    server = tmp_path / "server"
    kinds = ["pack", "unpack", "quantize", "generate"]
    pairs = list(itertools.combinations_with_replacement(kinds, 2)) * 2
    assert len(pairs) == 20
    with SimServerProcess(server, layers=4, hidden=16, seed=3) as sim:
        assert run_json("generate", data, "--endpoint", sim.url, "--server-dir", server, "--no-progress")[0] == 0
        generated = {r: (cache / f"hs_{r}.safetensors").read_bytes() for r in range(rows)}
        assert run("quantize", data, "--out", tmp_path / "fp8").returncode == 0
        quantized = {r: (tmp_path / "fp8" / f"hs_{r}.safetensors").read_bytes() for r in range(rows)}
        for round_number, pair in enumerate(pairs):
            wait = 120 if round_number % 2 == 0 else 0
            damaged = round_number % rows
            if "generate" in pair:
                # Work for generate: a packed sample corrupted, or a file removed.
                if (cache / "manifest.json").exists() and any(s["row"] == damaged for s in samples_of(manifest_of(cache))):
                    flip_sample_byte(cache, damaged)
                else:
                    (cache / f"hs_{damaged}.safetensors").unlink(missing_ok=True)
            compress = round_number % 4 < 2
            commands = [_rewrite_command(k, data, sim.url, server, compress, wait) for k in pair]
            procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                     for c in commands]
            for kind, proc in zip(pair, procs):
                code = proc.wait(timeout=300)
                stderr = proc.stderr.read()
                if code != 0:
                    # Refused (the other held the lock), or unpack keeping a pack with a corrupt sample.
                    assert wait == 0 or kind == "unpack", (round_number, pair, stderr)
                    again = subprocess.run(_rewrite_command(kind, data, sim.url, server, compress, 120),
                                           capture_output=True, text=True, timeout=300)
                    assert again.returncode == 0 or kind == "unpack", (round_number, again.stderr)
            what = f"round {round_number} {pair}"
            report = verify(data, cache)
            assert report["ok"] == rows and report["missing"] == 0, (what, report)
            # The rows as the loader reads them, as per-sample files: the valid packed samples
            # unpacked, the other rows' own files.
            flat = tmp_path / f"flat{round_number}"
            if (cache / "manifest.json").exists():
                run("unpack", data, "--out", flat)
            flat.mkdir(exist_ok=True)
            for r in range(rows):
                if not (flat / f"hs_{r}.safetensors").exists():
                    found = list(cache.glob(f"hs_{r}.safetensors")) + list(cache.glob(f"*/hs_{r}.safetensors"))
                    assert found, (what, r)
                    shutil.copyfile(found[0], flat / f"hs_{r}.safetensors")
                content = (flat / f"hs_{r}.safetensors").read_bytes()
                assert content in (generated[r], quantized[r]), (what, r)
            ours = _loader_epoch(data, cache)
            expected = _loader_epoch(data, flat)
            assert len(ours[0]) == len(expected[0]) and not ours[1], (what, ours[1])
            for k, (a, b) in enumerate(zip(ours[0], expected[0])):
                assert_same_batch(a, b, f"{what}, batch {k}")
            shutil.rmtree(flat)


def _loader_epoch(data: Path, cache: Path) -> tuple[list, dict]:
    loader = draftfeed.Loader(data, hidden_size=16, total_seq_len=64, hidden_states_path=cache, pin_memory=False)
    try:
        loader.set_epoch(0)
        batches = []
        for batch in loader:
            assert batch is not None
            batches.append({k: v.clone() for k, v in batch.items()})
        return batches, {k: v for k, v in loader.metrics()["dropped"].items() if v}
    finally:
        loader.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="two hosts need network namespaces (root)")
def test_two_hosts_sharing_a_folder_take_turns(fixture, tmp_path):
    """Two hosts (network namespaces, each with its own host name: `unshare --uts`) sharing one cache
    folder: a pack on host B is refused naming host A's holder; packs started on both hosts together
    lose no row. On one machine the hosts share a kernel, so this shows the lock between processes
    that see one folder, not that a shared file system forwards it between real hosts:
    scripts/writer_lock_check.sh checks that on a real mount."""
    import two_hosts

    reason = two_hosts.unavailable()
    if reason is not None or shutil.which("unshare") is None:
        pytest.skip(f"two hosts on one machine: {reason or 'no unshare'}")
    pair = two_hosts.TwoHosts.create("lock")
    try:
        def on(host, name: str, argv: list[str]) -> list[str]:
            script = 'hostname "$0" && exec "$@"'
            return ["unshare", "--uts", "sh", "-c", script, name, *argv]

        cache = copy_cache(fixture, tmp_path / "cache")
        hold = pair.a.popen(on(pair.a, "host-a", [cli_path(), "lock", str(cache), "--hold", "600"]),
                            stdout=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([hold.stdout], [], [], 60)
            assert ready and hold.stdout.readline().startswith("held")
            refused = pair.b.run(on(pair.b, "host-b", [cli_path(), "pack", fixture.path, "--hidden-states",
                                                        str(cache), "--in-place", "--no-progress"]), timeout=120)
            assert refused.returncode == 1 and "is being rewritten by host host-a, pid " in refused.stderr, refused
        finally:
            os.killpg(hold.pid, signal.SIGKILL)
            hold.wait(timeout=60)
        args = ["pack", fixture.path, "--hidden-states", str(cache), "--in-place", "--shard-bytes", "3000",
                "--lock-wait", "120", "--no-progress"]
        procs = [host.popen(on(host, name, [cli_path(), *args]), stderr=subprocess.PIPE, text=True)
                 for host, name in ((pair.a, "host-a"), (pair.b, "host-b"))]
        for proc in procs:
            assert proc.wait(timeout=300) == 0, proc.stderr.read()
        report = verify(fixture.path, cache)
        assert report["ok"] == ROWS and report["missing"] == 0 and report["corrupt"] == 0, report
        assert not list(cache.glob("hs_*"))
        expected = reference_batches(fixture, Path(fixture.path) / "hidden_states")
        assert_batches(epoch(fixture, cache)[0], expected, "packed by two hosts")
    finally:
        pair.destroy()


# ---- a file goes only when its row is safe ------------------------------------------------------


def test_a_repaired_row_survives_the_next_pack_and_verify_counts_its_fallback(tmp_path):
    """A packed sample corrupted, then repaired by `generate` (a per-sample file beside the pack).
    Before: verify called the row corrupt, and the next `pack --in-place` deleted the repair (the
    "already packed" branch removed the file unchecked), so the row was lost. Now verify counts the
    row by what the loader reads (its file: a fallback, with why), and pack packs the row again from
    its file before removing it."""
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), 12, seed=5, min_len=4, max_len=24, vocab=5000)
    cache = data / "hidden_states"
    with SimServerProcess(tmp_path / "server", layers=4, hidden=16, seed=3) as sim:
        assert run_json("generate", data, "--endpoint", sim.url, "--server-dir", tmp_path / "server",
                        "--no-progress")[0] == 0
        original = (cache / "hs_3.safetensors").read_bytes()
        assert run("pack", data, "--in-place").returncode == 0
        flip_sample_byte(cache, 3)
        assert run_json("generate", data, "--endpoint", sim.url, "--server-dir", tmp_path / "server",
                        "--no-progress")[1]["generated"] == 1
    assert (cache / "hs_3.safetensors").read_bytes() == original
    code, report = run_json("verify", data)
    assert code == 0 and report["ok"] == 12 and report["corrupt"] == 0, report
    assert report["packed"]["fallbacks"] == 1 and report["packed"]["packed_ok"] == 11, report
    fallback = report["packed"]["fallback_examples"][0]
    assert fallback["row"] == 3 and "hash to" in fallback["reason"], fallback

    code, packed = run_json("pack", data, "--in-place")
    assert code == 0 and packed["repacked"] == 1 and packed["packed"] == 1, packed
    assert packed["already_packed"] == 11 and packed["removed"] == 1, packed
    assert not (cache / "hs_3.safetensors").exists()
    code, after = run_json("verify", data)
    assert after["ok"] == 12 and after["packed"]["fallbacks"] == 0 and after["packed"]["packed_ok"] == 12
    assert _loader_epoch(data, cache)[1] == {}
    back = run("unpack", data, "--out", tmp_path / "back")
    assert back.returncode == 0 and (tmp_path / "back" / "hs_3.safetensors").read_bytes() == original


def test_a_file_whose_packed_sample_does_not_read_back_stays(fixture, tmp_path):
    """In place, a row the manifest names whose per-sample file is still there (a run killed before
    it removed it): the file goes only if the packed sample reads back valid. With the sample
    corrupt and the file corrupt too, both stay and the row is counted (kept, with the reasons)."""
    cache = copy_cache(fixture, tmp_path / "cache")
    keep = {r: (cache / f"hs_{r}.safetensors").read_bytes() for r in (5, 6)}
    assert run("pack", fixture.path, "--hidden-states", cache, "--in-place").returncode == 0
    for r, content in keep.items():
        (cache / f"hs_{r}.safetensors").write_bytes(content)
    flip_sample_byte(cache, 6)
    (cache / "hs_6.safetensors").write_bytes(keep[6][:100])
    code, report = run_json("pack", fixture.path, "--hidden-states", cache, "--in-place")
    assert code == 1 and report["kept"] == 1 and report["skipped"]["corrupt"] == 1, report
    assert report["removed"] == 1 and report["repacked"] == 0, report
    assert not (cache / "hs_5.safetensors").exists() and (cache / "hs_6.safetensors").exists()
    reason = report["examples"]["corrupt"][0]["reason"]
    assert "its packed sample does not read" in reason and "hash to" in reason, reason


# ---- every field a reader uses is checked --------------------------------------------------------


def _relabel_dtype(header: dict, row: int) -> None:
    header[f"{row}/hidden_states"]["dtype"] = "F16"


def _relabel_shape(header: dict, row: int) -> None:
    t, layers, hidden = header[f"{row}/hidden_states"]["shape"]
    header[f"{row}/hidden_states"]["shape"] = [t, hidden, layers]


def _relabel_ids(header: dict, row: int) -> None:
    header[f"{row}/token_ids"]["dtype"] = "U64"


@pytest.mark.parametrize("relabel", [_relabel_dtype, _relabel_shape, _relabel_ids], ids=["dtype", "shape", "ids"])
def test_a_shard_header_that_relabels_a_part_drops_the_row(fixture, tmp_path, relabel):
    """A shard's safetensors header (not checksummed) that calls a sample's bf16 bytes F16, or its
    [T, L, H] shape [T, H, L], or its int64 ids uint64: before, the loader gave other hidden states
    with 0 drops and verify said ok. Now the parts are checked against the sample's own header
    (checksummed): the row is one counted drop, verify names it, the other rows read as before."""
    row = 7
    cache = copy_cache(fixture, tmp_path / "cache")
    assert run("pack", fixture.path, "--hidden-states", cache, "--in-place").returncode == 0
    edit_shard_header(cache, row, lambda header: relabel(header, row))
    ours, drops = epoch(fixture, cache)
    assert drops == {"invalid": 1}, drops
    flat = copy_cache(fixture, tmp_path / "flat")
    (flat / f"hs_{row}.safetensors").unlink()
    assert_batches(ours, reference_batches(fixture, flat), "a relabelled part")
    report = verify(fixture.path, cache)
    assert report["corrupt"] == 1 and report["ok"] == ROWS - 1, report
    reason = report["examples"]["corrupt"][0]["reason"]
    assert f"row {row}" in reason and "the sample's own header" in reason, reason
    assert run("unpack", fixture.path, "--hidden-states", cache, "--out", tmp_path / "back").returncode == 1


def _huge_codec_shape(cache: Path, row: int) -> None:
    def edit(header: dict) -> None:
        info = json.loads(header["__metadata__"][f"{row}/hidden_states"])
        info["shape"] = [3_000_000_000, 4, HIDDEN]
        header["__metadata__"][f"{row}/hidden_states"] = json.dumps(info)
    edit_shard_header(cache, row, edit)


def _wrong_codec_dtype(cache: Path, row: int) -> None:
    def edit(header: dict) -> None:
        info = json.loads(header["__metadata__"][f"{row}/hidden_states"])
        info["dtype"] = "F32"
        header["__metadata__"][f"{row}/hidden_states"] = json.dumps(info)
    edit_shard_header(cache, row, edit)


def _huge_file_bytes(cache: Path, row: int) -> None:
    set_sample_field(cache, row, "file_bytes", 1 << 50)


def _short_file_bytes(cache: Path, row: int) -> None:
    set_sample_field(cache, row, "file_bytes", sample_of(cache, row)["file_bytes"] - 2)


def _short_length(cache: Path, row: int) -> None:
    set_sample_field(cache, row, "length", sample_of(cache, row)["length"] - 8)


def _wrong_checksum(cache: Path, row: int) -> None:
    set_sample_field(cache, row, "checksum", "0123456789abcdef")


def _other_layout(cache: Path, row: int) -> None:
    set_sample_field(cache, row, "layout", 1)  # only where unpack writes it: no read may change


LIES = [_huge_codec_shape, _wrong_codec_dtype, _huge_file_bytes, _short_file_bytes, _short_length,
        _wrong_checksum]


@pytest.mark.parametrize("lie", LIES, ids=[f.__name__.strip("_") for f in LIES])
def test_a_lying_field_costs_one_named_row(fixture, tmp_path, lie):
    """A compressed pack with one field about one sample lying (a codec shape of 3e9 tokens, a codec
    dtype, a manifest file_bytes of 2^50 or 2 short, a length, a checksum). Before, a shape or a
    file_bytes far beyond the file made the loader raise MemoryError (std::bad_alloc), verify print
    `error: std::bad_alloc` and unpack abort. Now each costs the one row: dropped and counted by the
    loader, named by verify, and unpack writes the others and exits 1. (A manifest that contradicts
    itself, samples overlapping or past their shard's end, is refused whole at the loader's start,
    naming the manifest: test_packed_cache.py.)"""
    row = 11
    cache = copy_cache(fixture, tmp_path / "cache")
    assert run("pack", fixture.path, "--hidden-states", cache, "--in-place", "--compress").returncode == 0
    lie(cache, row)
    ours, drops = epoch(fixture, cache)
    assert drops == {"invalid": 1}, drops
    flat = copy_cache(fixture, tmp_path / "flat")
    (flat / f"hs_{row}.safetensors").unlink()
    assert_batches(ours, reference_batches(fixture, flat), lie.__name__)
    report = verify(fixture.path, cache)
    assert report["corrupt"] == 1 and report["ok"] == ROWS - 1, report
    assert f"row {row}" in report["examples"]["corrupt"][0]["reason"], report
    code, back = run_json("unpack", fixture.path, "--hidden-states", cache, "--out", tmp_path / "back")
    assert code == 1 and back["written"] == ROWS - 1 and back["failed"] == 1, back


def test_a_layout_field_changes_no_read(fixture, tmp_path):
    """The one manifest field a reader does not use (where unpack puts the file back) changes
    nothing read."""
    cache = copy_cache(fixture, tmp_path / "cache")
    assert run("pack", fixture.path, "--hidden-states", cache, "--in-place").returncode == 0
    _other_layout(cache, 3)
    ours, drops = epoch(fixture, cache)
    assert drops == {}
    assert_batches(ours, reference_batches(fixture, Path(fixture.path) / "hidden_states"), "layout 1")


# ---- a live loader follows rewrites -------------------------------------------------------------


def test_a_running_loader_reads_a_pack_made_since_at_its_next_epoch(fixture, tmp_path):
    """A Loader reading a per-sample cache; `pack --in-place` runs between its epochs. Before, the
    pack was opened once when the source was built: the next epochs dropped every packed row as
    missing. Now the next epoch reads the pack (and its batches are the reference's); then an
    `unpack --in-place` between epochs is followed back to the files."""
    cache = copy_cache(fixture, tmp_path / "cache")
    expected = {e: reference_batches(fixture, Path(fixture.path) / "hidden_states", e) for e in (0, 1, 2)}
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=cache,
                              num_target_layers=fixture.layers - 1, train_ratio=0.9, pin_memory=False)
    try:
        ours, drops = epoch(fixture, cache, loader, 0)
        assert drops == {}
        assert_batches(ours, expected[0], "epoch 0, per-sample files")
        assert run("pack", fixture.path, "--hidden-states", cache, "--in-place", "--compress").returncode == 0
        assert not list(cache.glob("hs_*"))
        ours, drops = epoch(fixture, cache, loader, 1)
        assert drops == {}, drops
        assert_batches(ours, expected[1], "epoch 1, packed since epoch 0")
        assert run("unpack", fixture.path, "--hidden-states", cache, "--in-place").returncode == 0
        assert not (cache / "manifest.json").exists()
        ours, drops = epoch(fixture, cache, loader, 2)
        assert drops == {}, drops
        assert_batches(ours, expected[2], "epoch 2, unpacked since epoch 1")
    finally:
        loader.close()


def test_a_pack_that_finishes_during_an_epoch_loses_no_row(fixture, tmp_path):
    """`pack --in-place` run to its end while an epoch is under way (two batches taken, the loader
    waiting on its buffers): the epoch's rows whose files went meanwhile are read from the new pack
    (the source looks at the manifest again when a row is found nowhere), the rows it had open from
    their files; the epoch's batches are the reference's."""
    cache = copy_cache(fixture, tmp_path / "cache")
    expected = reference_batches(fixture, Path(fixture.path) / "hidden_states")
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=cache,
                              num_target_layers=fixture.layers - 1, train_ratio=0.9, pin_memory=False,
                              num_threads=1, prefetch=2)
    try:
        loader.set_epoch(0)
        it = iter(loader)
        ours = [{k: v.clone() for k, v in next(it).items()} for _ in range(2)]
        assert run("pack", fixture.path, "--hidden-states", cache, "--in-place").returncode == 0
        ours += [{k: v.clone() for k, v in b.items()} for b in it]
        assert sum(loader.metrics()["dropped"].values()) == 0, loader.metrics()["dropped"]
        assert_batches(ours, expected, "packed during epoch 0")
    finally:
        loader.close()


def test_a_manifest_that_stops_reading_between_epochs_is_a_clear_error(fixture, tmp_path):
    """A manifest replaced by one that does not parse while a loader runs: its next epoch raises,
    naming the manifest and saying it changed while the loader ran (no epoch silently misses the
    pack's rows)."""
    cache = copy_cache(fixture, tmp_path / "cache")
    assert run("pack", fixture.path, "--hidden-states", cache, "--in-place").returncode == 0
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=cache,
                              num_target_layers=fixture.layers - 1, train_ratio=0.9, pin_memory=False)
    try:
        assert epoch(fixture, cache, loader, 0)[1] == {}
        broken = tmp_path / "manifest.json"
        broken.write_text("{not json")
        os.replace(broken, cache / "manifest.json")
        with pytest.raises(Exception, match=r"manifest\.json.*(changed while this reader ran)"):
            epoch(fixture, cache, loader, 1)
    finally:
        loader.close()


# ---- names and folders of others --------------------------------------------------------------


def test_pack_removes_only_its_own_hosts_dead_temporaries(fixture, tmp_path):
    """Temporaries in the target folder: before, `pack --out` removed any `.x.tmp-<digits>` whose pid
    was not running here, another host's included (a pid alone says nothing on a shared file
    system). Now only this host's temporaries (`.shard-*.tmp-<host>-<pid>-<n>`) of dead pids go."""
    out = tmp_path / "pack"
    out.mkdir()
    dead = 4_000_000  # above any pid this kernel hands out (pid_max is at most 2^22)
    host = os.uname().nodename
    others = [f".shard-000000.safetensors.tmp-{dead}", f".shard-000000.safetensors.tmp-otherhost-{dead}-0",
              f".manifest.json.tmp-{host}-{os.getpid()}-0"]
    own_dead = f".shard-000001.safetensors.tmp-{host}-{dead}-3"
    for name in [*others, own_dead]:
        (out / name).write_bytes(b"x")
    assert run("pack", fixture.path, "--out", out).returncode == 0
    for name in others:
        assert (out / name).exists(), name
    assert not (out / own_dead).exists()


def test_quantize_refuses_a_shard_folder_that_is_a_link(fixture, tmp_path):
    """A shard folder of the cache (`0000/`) that is a link to another folder: before, `quantize
    --in-place --layout sharded` wrote the cache's files through it, outside the cache. Now it is
    refused, naming the link, and nothing is written there."""
    cache = copy_cache(fixture, tmp_path / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (cache / "0000").symlink_to(elsewhere)
    proc = run("quantize", fixture.path, "--hidden-states", cache, "--in-place", "--layout", "sharded",
               "--no-progress")
    assert proc.returncode != 0 and "0000 is a symbolic link" in proc.stderr, proc.stderr
    assert not list(elsewhere.iterdir())
    assert len(list(cache.glob("hs_*.safetensors"))) >= ROWS - 2  # the bf16 files stay
