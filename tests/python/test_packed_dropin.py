"""The drop-in `create_train_val_loaders` reading a packed cache (compressed and not) gives, on every
rank of world size 1 and 2, the batches speculators 0.9.0's `create_train_val_loaders` makes from the
per-sample cache it was packed from; both called with 0.9.0's trainer's arguments.

The fixture has rows without a file, rows whose file holds other token ids (left per-sample by the
pack) and rows longer than the batch."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import cli_path
from dropin_helpers import assert_loaders_equal, our_loaders, reference_loaders, trainer_args
from reference_fixtures import Fixture, write_fixture

pytestmark = pytest.mark.timeout(600)

MAX_LEN = 96


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("packed_dropin") / "data")
    return write_fixture(path, rows=60, max_len=MAX_LEN, missing=(4, 17, 50), mismatched=(9, 33), long_rows=(12, 40))


@pytest.fixture(scope="module", params=[False, True], ids=["packed", "packed+compressed"])
def packed(fixture, tmp_path_factory, request) -> Fixture:
    """A copy of the fixture whose cache is packed in place, in shards of a few samples each; the
    mismatched rows are left per-sample (pack exits 1 for them), as the reader falls back to files."""
    path = tmp_path_factory.mktemp("packed") / "data"
    shutil.copytree(fixture.path, path)
    proc = subprocess.run([cli_path(), "pack", str(path), "--in-place", "--shard-bytes", "40000", "--json",
                           *(["--compress"] if request.param else [])], capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    assert report["packed"] == fixture.rows - len(fixture.missing) - len(fixture.mismatched), proc.stderr
    assert report["missing"] == len(fixture.missing) and report["skipped"]["mismatched"] == len(fixture.mismatched)
    left = {p.name for p in (path / "hidden_states").glob("hs_*.safetensors")}
    assert left == {f"hs_{row}.safetensors" for row in fixture.mismatched}
    return Fixture(str(path), fixture.rows, fixture.hidden_size, fixture.layers)


def shards(fx: Fixture) -> list[Path]:
    return sorted((Path(fx.path) / "hidden_states").glob("shard-*.safetensors"))


@pytest.mark.parametrize("world_size", [1, 2])
def test_every_rank_reads_the_reference_batches_from_a_pack(fixture, packed, topology, world_size):
    assert len(shards(packed)) > 3, "several shards, so that ranks read from different ones"
    for rank in range(world_size):
        topology(rank, world_size, via_env=False)
        ref = reference_loaders(trainer_args(fixture, MAX_LEN))
        ours = our_loaders(trainer_args(packed, MAX_LEN, num_workers=2))
        assert_loaders_equal(ours, ref, f"R={world_size} r={rank}")
