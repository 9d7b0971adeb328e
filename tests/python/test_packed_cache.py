"""Packed caches (issue 41): `draftfeed pack` writes shards of many samples and a manifest,
`draftfeed unpack` gives the per-sample files back byte for byte, and the loader reads a pack (or a
pack that lacks some rows) with the batches the reference makes from the per-sample files.

The shards are read here with the real `safetensors` package (safe_open, load_file); the reference
batches are speculators 0.9.0's, through hs-connectors' FP8Transfer over the per-sample files."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from fp8_fixtures import write_fp8_file
from hs_connectors import FP8Transfer
from reference_fixtures import assert_same_batch, write_fixture
from reference_fixtures import reference_batches as speculators_batches
from safetensors import safe_open
from safetensors.torch import load_file

import draftfeed

pytestmark = pytest.mark.timeout(300)

ROWS, MAX_LEN, HIDDEN = 300, 512, 8
BATCHES = 8


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    path = tmp_path_factory.mktemp("packed") / "data"
    return write_fixture(str(path), rows=ROWS, hidden_size=HIDDEN, max_len=MAX_LEN, distinct=False)


def mixed_cache(fixture, folder: Path) -> Path:
    """The fixture's files, every fifth row an FP8 file (hs-connectors' own), rows 100-199 in the
    sharded layout."""
    source = Path(fixture.path) / "hidden_states"
    folder.mkdir()
    for row in range(fixture.rows):
        name = f"hs_{row}.safetensors"
        target = folder / name
        if 100 <= row < 200:
            (folder / f"{row // 1000:04d}").mkdir(exist_ok=True)
            target = folder / f"{row // 1000:04d}" / name
        if row % 5 == 0:
            tensors = load_file(str(source / name))
            write_fp8_file(str(target), tensors["hidden_states"], tensors["token_ids"])
        else:
            shutil.copyfile(source / name, target)
    return folder


WRITER_LOCK = ".draftfeed-writer.lock"  # a rewrite's lock file stays in the folder it wrote


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != WRITER_LOCK}


def reference_batches(fixture, flat: Path) -> list[dict]:
    return speculators_batches(fixture, max_len=MAX_LEN, train_ratio=0.9, transfer=FP8Transfer(flat),
                               max_batches=BATCHES)


def our_batches(fixture, cache: Path, batches: int = BATCHES, passes: int = 1) -> list:
    """The loader's batches of epoch 0, from its last of `passes` passes over it (a compressed sample is
    decoded whole on its first read, inside the batch copy after)."""
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=cache,
                              num_target_layers=fixture.layers - 1, train_ratio=0.9, max_batches=batches,
                              pin_memory=False)
    try:
        for _ in range(passes):
            loader.set_epoch(0)
            batches_seen = list(loader)
        return batches_seen
    finally:
        loader.close()


def flat_copy(folder: Path, out: Path) -> Path:
    out.mkdir()
    for p in folder.rglob("hs_*.safetensors"):
        shutil.copyfile(p, out / p.name)
    return out


@pytest.mark.parametrize("compress", [False, True])
def test_pack_is_read_by_safetensors_and_unpacks_byte_for_byte(fixture, tmp_path, run_cli_json, compress):
    cache = mixed_cache(fixture, tmp_path / "cache")
    before = files_of(cache)
    args = ["pack", fixture.path, "--hidden-states", cache, "--out", tmp_path / "pack", "--shard-bytes", 20000]
    report = run_cli_json(*args, *(["--compress"] if compress else []))
    assert report["packed"] == ROWS and report["shards"] > 3 and report["missing"] == 0
    assert (report["hidden_ratio"] < 0.9) == compress, report  # (tiny samples: headers weigh)
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    assert manifest["format"] == "draftfeed-pack" and manifest["num_samples"] == ROWS
    seen = set()
    compressed = 0
    for shard in manifest["shards"]:
        path = tmp_path / "pack" / shard["file"]
        assert path.stat().st_size == shard["bytes"]
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            rows = {int(k.split("/")[0]) for k in f.keys()}
            for row in rows:
                original = load_file(str(next(cache.rglob(f"hs_{row}.safetensors"))))
                assert torch.equal(f.get_tensor(f"{row}/token_ids"), original["token_ids"])
                if original["hidden_states"].dtype == torch.float8_e4m3fn:
                    assert torch.equal(f.get_tensor(f"{row}/hidden_states_scales"),
                                       original["hidden_states_scales"])
                stored = f.get_tensor(f"{row}/hidden_states")
                if f"{row}/hidden_states" in metadata:
                    compressed += 1
                    assert stored.dtype == torch.uint8
                    info = json.loads(metadata[f"{row}/hidden_states"])
                    assert info["codec"] == "planes-zstd"
                    assert info["shape"] == list(original["hidden_states"].shape)
                else:
                    assert torch.equal(stored.view(torch.int8), original["hidden_states"].view(torch.int8))
            seen |= rows
    assert seen == set(range(ROWS))
    # Tiny FP8 samples may not shrink (then they are stored as they are); bf16 ones do.
    assert (compressed >= 0.8 * (ROWS - ROWS // 5)) == compress, compressed
    report = run_cli_json("unpack", fixture.path, "--hidden-states", tmp_path / "pack", "--out", tmp_path / "back")
    assert report["written"] == ROWS and report["failed"] == 0
    assert files_of(tmp_path / "back") == before


@pytest.mark.parametrize("compress", [False, True])
def test_a_pack_gives_the_reference_batches(fixture, tmp_path, run_cli_json, compress):
    cache = mixed_cache(fixture, tmp_path / "cache")
    expected = reference_batches(fixture, flat_copy(cache, tmp_path / "flat"))
    run_cli_json("pack", fixture.path, "--hidden-states", cache, "--in-place", "--shard-bytes", 50000,
                 *(["--compress"] if compress else []))
    assert not list(cache.rglob("hs_*.safetensors")), "the packed files are gone"
    assert not [p for p in cache.iterdir() if p.is_dir()], "and their shard folders"
    for passes in (1, 2):
        ours = our_batches(fixture, cache, passes=passes)
        assert len(ours) == len(expected) == BATCHES
        for k, (a, b) in enumerate(zip(ours, expected)):
            assert_same_batch(a, b, f"pass {passes}, batch {k}")


def test_a_packs_samples_are_read_ahead_by_range(fixture, tmp_path, run_cli_json):
    """The loader's read-ahead reads a pack's planned samples by their ranges in their shards (or
    finds them in the page cache), and looks for no per-sample file of theirs
    (tests/cpp/source_packed_read_ahead_test.cc checks the pages and the budget)."""
    cache = mixed_cache(fixture, tmp_path / "cache")
    run_cli_json("pack", fixture.path, "--hidden-states", cache, "--in-place", "--shard-bytes", 50000)
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=cache,
                              num_target_layers=fixture.layers - 1, train_ratio=0.9, max_batches=BATCHES,
                              pin_memory=False)
    try:
        loader.set_epoch(0)
        assert len(list(loader)) == BATCHES
        read_ahead = loader.metrics()["read_ahead"]
    finally:
        loader.close()
    assert read_ahead["ranges"] + read_ahead["ranges_cached"] > 0
    assert read_ahead["opened"] == 0


def test_a_partial_pack_reads_whole_and_resumes(fixture, tmp_path, run_cli_json):
    """A pack stopped part way (here: told to stop at row 150) leaves a cache that reads as before;
    running it again packs the rest; unpacking in place leaves the folder as it was."""
    cache = mixed_cache(fixture, tmp_path / "cache")
    before = files_of(cache)
    expected = reference_batches(fixture, flat_copy(cache, tmp_path / "flat"))
    first = run_cli_json("pack", fixture.path, "--hidden-states", cache, "--in-place", "--rows", ":150",
                         "--shard-bytes", 30000, "--compress")
    assert first["packed"] == 150
    assert len(list(cache.rglob("hs_*.safetensors"))) == ROWS - 150
    for k, (a, b) in enumerate(zip(our_batches(fixture, cache), expected)):
        assert_same_batch(a, b, f"batch {k} (partial pack)")
    second = run_cli_json("pack", fixture.path, "--hidden-states", cache, "--in-place", "--shard-bytes", 30000,
                          "--compress")
    assert second["already_packed"] == 150 and second["packed"] == ROWS - 150
    assert not list(cache.rglob("hs_*.safetensors"))
    back = run_cli_json("unpack", fixture.path, "--hidden-states", cache, "--in-place")
    assert back["removed_pack"] and back["written"] == ROWS
    assert files_of(cache) == before, "nothing else is left, every file as it was"


def test_a_corrupt_sample_is_dropped_naming_shard_offset_and_row(fixture, tmp_path, run_cli_json, caplog):
    cache = mixed_cache(fixture, tmp_path / "cache")
    run_cli_json("pack", fixture.path, "--hidden-states", cache, "--in-place", "--shard-bytes", 50000)
    manifest = json.loads((cache / "manifest.json").read_text())
    loader = draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=cache,
                              num_target_layers=fixture.layers - 1, train_ratio=0.9, max_batches=1,
                              pin_memory=False)
    rows = [int(r) for r in loader.batch_sampler._generate_batches(0)[0]]
    loader.close()
    entry = next(e for e in manifest["samples"] if e[0] == rows[0])
    row, shard, offset, length = entry[:4]
    path = cache / manifest["shards"][shard]["file"]
    data = bytearray(path.read_bytes())
    data[offset + length - 9] ^= 0x40  # a bit of the sample's last tensor
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="draftfeed"):
        batches = our_batches(fixture, cache, batches=1)
    messages = [r.getMessage() for r in caplog.records]
    assert any(manifest["shards"][shard]["file"] in m and f"offset {offset}" in m and f"row {row}" in m
               for m in messages), messages
    assert batches[0]["document_ids"].max().item() + 1 == len(rows) - 1, "the row was dropped"


def test_a_bad_manifest_is_refused_by_name(fixture, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    manifest = {"format": "draftfeed-pack", "format_version": 1, "codec": "none", "num_samples": 0,
                "sample_fields": ["row", "shard", "offset", "length", "checksum", "file_bytes", "layout"],
                "shards": [{"file": "../shard-000000.safetensors", "bytes": 1}], "samples": []}
    (cache / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match=r"manifest.json.*shards\[0\].file"):
        draftfeed.Loader(fixture.path, hidden_size=HIDDEN, total_seq_len=MAX_LEN, hidden_states_path=cache,
                         pin_memory=False)
    assert os.path.exists(cache / "manifest.json")


def test_verify_checks_a_pack(fixture, tmp_path, run_cli, run_cli_json):
    """Rows in the pack are read back (checksums, decoding) and checked; rows outside it are looked
    for as files; a changed byte is a corrupt row named by shard, offset and row."""
    cache = mixed_cache(fixture, tmp_path / "cache")
    run_cli_json("pack", fixture.path, "--hidden-states", cache, "--in-place", "--rows", "50:", "--compress",
                 "--shard-bytes", 40000)
    report = run_cli_json("verify", fixture.path, "--hidden-states", cache)
    assert report["ok"] == ROWS and report["missing"] == 0, report
    assert report["packed"]["samples"] == ROWS - 50 and report["packed"]["compressed"] > 0
    manifest = json.loads((cache / "manifest.json").read_text())
    row, shard, offset, length = manifest["samples"][7][:4]
    path = cache / manifest["shards"][shard]["file"]
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    proc = run_cli("verify", fixture.path, "--hidden-states", cache, "--json", check=False)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["corrupt"] == 1 and report["ok"] == ROWS - 1
    reason = report["examples"]["corrupt"][0]["reason"]
    assert manifest["shards"][shard]["file"] in reason and f"offset {offset}" in reason and f"row {row}" in reason


# 3 MB shards: the manifest is written after every shard; 1 byte: a shard per sample, and the
# manifest only once the shards since its last write hold 16x its bytes (kManifestRewriteFactor).
@pytest.mark.parametrize("shard_bytes", [3000000, 1])
def test_a_pack_killed_anywhere_leaves_a_readable_cache(tmp_path, run_cli, run_cli_json, shard_bytes):
    """`pack --in-place` killed (SIGKILL) at random moments: after each kill every row verifies (in
    a shard the manifest names, or still in its file), and the next run goes on from there."""
    import random
    import signal
    import subprocess
    import time

    from conftest import cli_path

    data = tmp_path / "data"
    run_cli("synth", data, "--rows", 400, "--min-len", 16, "--max-len", 256, "--hidden-size", 256, "--layers", 4)
    rng = random.Random(41)
    kills = 0
    for attempt in range(8):
        proc = subprocess.Popen([cli_path(), "pack", str(data), "--in-place", "--compress", "--shard-bytes", str(shard_bytes),
                                 "--no-progress", "--threads", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
        report = run_cli_json("verify", data)
        assert report["ok"] == 400 and report["missing"] == 0 and report["corrupt"] == 0, (attempt, report)
    final = run_cli_json("pack", data, "--in-place", "--compress", "--shard-bytes", shard_bytes)
    assert final["already_packed"] + final["packed"] == 400
    assert not list((data / "hidden_states").glob("hs_*")) and not list((data / "hidden_states").glob(".*tmp*"))
    assert run_cli_json("verify", data)["ok"] == 400
    assert kills > 0, "no run was killed: the test tested nothing"


def test_the_manifest_of_many_shards_is_not_rewritten_after_each(fixture, tmp_path, run_cli_json):
    """A shard per sample: the manifest (which names every sample) is rewritten only once the shards
    since its last write hold 16x its bytes, not after each shard; the pack reads whole."""
    report = run_cli_json("pack", fixture.path, "--out", tmp_path / "pack", "--shard-bytes", 1)
    assert report["shards"] == ROWS and report["packed"] == ROWS
    # Written after each shard, it would be 300 writes of up to 28 KB each (more than the shards'
    # 0.48 MB in all); here about 8.
    assert 1 <= report["manifest_writes"] < ROWS // 10, report
    assert run_cli_json("verify", fixture.path, "--hidden-states", tmp_path / "pack")["ok"] == ROWS
