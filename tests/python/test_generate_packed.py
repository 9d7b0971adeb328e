"""`draftfeed generate` over a cache folder that holds a pack (`draftfeed pack`): rows whose packed
sample is valid are not asked of a server again; a packed sample that fails its checksum is
generated into a per-sample file beside the pack, which the loader then reads in its place."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import draftfeed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sim_vllm_process import SimServerProcess

pytestmark = pytest.mark.timeout(300)

ROWS = 12
# Nothing listens on the discard port of 127.0.0.1: a row asked of it fails at once.
DEAD_ENDPOINT = "http://127.0.0.1:9/v1"


def generate_json(run_cli, data: Path, endpoint: str, *extra) -> dict:
    proc = run_cli("generate", data, "--endpoint", endpoint, "--no-progress", "--json", *extra, check=False)
    return json.loads(proc.stdout)


def drops_in_an_epoch(data: Path) -> dict:
    """The loader's dropped samples by reason over one training epoch (its default split holds row
    3), each after the loader's own check of every row."""
    loader = draftfeed.Loader(data, hidden_size=16, total_seq_len=64, pin_memory=False)
    try:
        loader.set_epoch(0)
        assert sum(1 for _ in loader) > 0
        return {reason: count for reason, count in loader.metrics()["dropped"].items() if count}
    finally:
        loader.close()


def test_generate_skips_packed_rows_and_refills_a_corrupt_one(tmp_path, run_cli):
    data = tmp_path / "data"
    draftfeed.write_synthetic_dataset(str(data), ROWS, seed=5, min_len=4, max_len=24, vocab=5000)
    with SimServerProcess(tmp_path / "server", layers=4, hidden=16, seed=3) as sim:
        first = generate_json(run_cli, data, sim.url, "--server-dir", tmp_path / "server")
        assert first["generated"] == ROWS, first
        # Rows 0-7 into a pack (their files removed), 8-11 stay per-sample files.
        run_cli("pack", data, "--in-place", "--rows", "0:8", "--no-progress")
        cache = data / "hidden_states"
        assert sorted(p.name for p in cache.glob("hs_*.safetensors")) == sorted(
            f"hs_{row}.safetensors" for row in range(8, ROWS))

        # Every row is filled: nothing is asked of a server (the dead endpoint would fail it).
        again = generate_json(run_cli, data, DEAD_ENDPOINT)
        assert again["existing"] == ROWS and again["failed"] == 0, again

        # One packed sample's bytes flipped: its checksum fails, so it is generated again into a
        # per-sample file, and the pack is left as it was.
        manifest = json.loads((cache / "manifest.json").read_text())
        fields = manifest["sample_fields"]
        sample = dict(zip(fields, next(s for s in manifest["samples"] if s[fields.index("row")] == 3)))
        shard = cache / manifest["shards"][sample["shard"]]["file"]
        blob = bytearray(shard.read_bytes())
        blob[sample["offset"] + sample["length"] // 2] ^= 0xFF
        shard.write_bytes(bytes(blob))
        refill = generate_json(run_cli, data, sim.url, "--server-dir", tmp_path / "server")
        assert refill["existing"] == ROWS - 1 and refill["generated"] == 1, refill
        assert (cache / "hs_3.safetensors").is_file()
        assert shard.read_bytes() == bytes(blob)
        # The loader reads row 3 from its new file, not the pack's corrupt sample.
        assert drops_in_an_epoch(data) == {}
