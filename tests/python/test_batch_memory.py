"""What a loader holds in memory beyond its batch buffers: the cache files' pages it maps to copy them.

A page of the page cache mapped by this process counts in its memory (RSS, PSS) until unmapped. The
engine maps each sample's file and copies its rows into the batch; it lets go of the rows' pages as
soon as they are copied (MADV_DONTNEED on the mapping: they stay in the page cache), so at any time it
holds about one copy chunk of file pages per engine thread, not the batches in assembly. Measured in a
child process from /proc/self/smaps (the PSS of every mapping of a cache file) at each batch, while
the consumer drains two epochs as fast as it can.
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
cache = os.path.join(data, "hidden_states") + "/"

def cache_pss():
    total, in_cache = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's first line
            in_cache = len(fields) >= 6 and fields[5].startswith(cache)
        elif in_cache and fields[0] == "Pss:":
            total += int(fields[1]) * 1024
    return total

loader = draftfeed.Loader(data, hidden_size=512, total_seq_len=4096, split="all", num_target_layers=3,
                          num_threads=2, prefetch=4, chunk_bytes=chunk, pin_memory=False)
peak, batches = 0, 0
for epoch in range(2):
    loader.set_epoch(epoch)
    for batch in loader:
        batches += 1
        peak = max(peak, cache_pss())
print(json.dumps({"peak_file_bytes": peak, "batches": batches}))
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


def test_copied_rows_leave_the_loaders_memory(data):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, data, str(CHUNK)], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["batches"] > 20
    # Each batch reads about 16 MiB of files (4096 tokens x 4 KiB), and up to 4 batches are in
    # assembly; the engine's 2 threads hold about a chunk each, plus, per sample in assembly (a dozen
    # at most), its header page and the pages the kernel maps around a fault (fault-around: 64 KiB)
    # at chunk edges. Without the release this was 15.9 MiB.
    bound = 2 * CHUNK + 16 * (128 << 10) + (1 << 20)
    assert out["peak_file_bytes"] <= bound, (
        f"{out['peak_file_bytes'] / 2**20:.1f} MiB of cache files mapped at once, bound {bound / 2**20:.1f} MiB")
