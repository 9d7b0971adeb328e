"""What a loader holds in memory beyond its batch buffers: pages of the cache files it maps.

A page of the page cache mapped by this process counts in its memory (RSS, PSS) until unmapped. The
engine maps each sample's file to check its header, token ids and scales, and lets go of those pages
at once (MADV_DONTNEED: they stay in the page cache); the copy takes the rows from the mapping one
copy chunk at a time and lets go of each chunk's pages after it (source/cache_source.h's CacheCopy;
with DRAFTFEED_CACHE_COPY=read the rows are read through the descriptor and nothing stays mapped).
Measured in a child process from /proc/self/smaps (the PSS of every mapping of a cache file) at each
batch, while the consumer drains two epochs as fast as it can. History: mapping the files for the
copy without releasing held 15.9 MiB at peak; releasing rows after each copy chunk, 2.0-4.0 MiB at
peak and 0.05-1.6 MiB on average (2 threads, 256 KiB chunks); read, 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import draftfeed

pytestmark = pytest.mark.timeout(300)

HIDDEN, LAYERS = 512, 4  # 4 KiB of bf16 hidden states per token
CHUNK = 256 << 10

SCRIPT = r"""
import json, os, sys, draftfeed

data, chunk = sys.argv[1], int(sys.argv[2])
pack = sys.argv[3] if len(sys.argv) > 3 else None  # a packed cache to read instead
cache = (pack or os.path.join(data, "hidden_states")) + "/"

def cache_pss():
    total, in_cache = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's first line
            in_cache = len(fields) >= 6 and fields[5].startswith(cache)
        elif in_cache and fields[0] == "Pss:":
            total += int(fields[1]) * 1024
    return total

extra = {"hidden_states_path": pack} if pack else {}
loader = draftfeed.Loader(data, hidden_size=512, total_seq_len=4096, split="all", num_target_layers=3,
                          num_threads=2, prefetch=4, chunk_bytes=chunk, pin_memory=False, **extra)
peak, total, batches = 0, 0, 0
for epoch in range(2):
    loader.set_epoch(epoch)
    for batch in loader:
        batches += 1
        now = cache_pss()
        peak, total = max(peak, now), total + now
print(json.dumps({"peak_file_bytes": peak, "mean_file_bytes": total / batches, "batches": batches}))
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("memory") / "data")
    draftfeed.write_synthetic_dataset(path, 48, seed=3, min_len=1024, max_len=4000)
    dataset = draftfeed.open_dataset(path)
    ids = [dataset.row(i)["input_ids"].tolist() for i in range(len(dataset))]
    draftfeed.write_synthetic_hidden_states(os.path.join(path, "hidden_states"), ids, seed=3,
                                            hidden_size=HIDDEN, layers=LAYERS, dtype="BF16")
    # Every file in the page cache, as in a warm epoch.
    for name in os.listdir(os.path.join(path, "hidden_states")):
        with open(os.path.join(path, "hidden_states", name), "rb") as f:
            while f.read(1 << 22):
                pass
    return path


def run_two_epochs(data: str, copy: str, pack: str | None = None) -> dict:
    env = dict(os.environ, DRAFTFEED_CACHE_COPY=copy)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, data, str(CHUNK), *([pack] if pack else [])],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["batches"] > 20
    return out


def test_cache_pages_are_mapped_only_while_a_chunk_is_copied(data):
    out = run_two_epochs(data, "auto")
    # Each batch reads about 16 MiB of files (4096 tokens x 4 KiB), and up to 4 batches are in
    # assembly; a loader that kept what it copied would hold tens of MiB. Pages are mapped only
    # between a check or a copy chunk and their release, on one of 2 threads: a chunk's rows, and on
    # a file system with large folios a whole 2 MiB folio at each end of it (a release splits the
    # folio's mapping and lets go of the chunk's pages; the rest waits for the next chunk).
    mean, peak = out["mean_file_bytes"], out["peak_file_bytes"]
    # Measured 0.05-1.6 MiB on average and 2-4 MiB at peak; without the release after each chunk,
    # 3.7 MiB on average and 10-23 MiB at peak (the files of the batches in assembly stay mapped).
    threads = 2
    assert mean <= threads * (CHUNK + (1 << 20)), f"{mean / 2**20:.2f} MiB of cache files mapped on average"
    assert peak <= threads * (CHUNK + (2 << 20)) + (2 << 20), (
        f"{peak / 2**20:.1f} MiB of cache files mapped at once")


def test_read_rows_leave_no_hidden_state_page_mapped(data):
    # DRAFTFEED_CACHE_COPY=read: only a sample's header, token ids and scales are mapped, between its
    # checks and their release (a fault there may map a whole 2 MiB folio, one per fetch thread).
    out = run_two_epochs(data, "read")
    mean, peak = out["mean_file_bytes"], out["peak_file_bytes"]
    assert mean <= 256 << 10, f"{mean / 2**20:.2f} MiB of cache files mapped on average"
    assert peak <= 2 * (2 << 20) + (256 << 10), f"{peak / 2**20:.1f} MiB of cache files mapped at once"


def test_a_compressed_pack_is_mapped_only_while_its_samples_are_copied(data, tmp_path, run_cli):
    # A compressed sample's first read checks its bytes and decodes it whole from a copy of its
    # blob, and lets go of the blob's pages; later reads decode it inside the batch copy, from the
    # mapping, and let go of them once the sample is copied (one release a sample: each interrupts
    # the other copy threads). A first read that kept its pages would leave the whole pack mapped
    # after an epoch (about 340 MiB here).
    pack = str(tmp_path / "packed")
    run_cli("pack", data, "--out", pack, "--compress", "--no-progress", timeout=240)
    out = run_two_epochs(data, "auto", pack)
    mean, peak = out["mean_file_bytes"], out["peak_file_bytes"]
    # Up to 4 batches in assembly of about 11 MiB of blobs each, and a sample's blob mapped until it
    # is copied whole.
    assert mean <= 16 << 20, f"{mean / 2**20:.2f} MiB of the pack mapped on average"
    assert peak <= 64 << 20, f"{peak / 2**20:.1f} MiB of the pack mapped at once"
