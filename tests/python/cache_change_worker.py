"""The trainer of tests/python/test_fault_cache_changes.py: runs epochs of draftfeed.Loader over a
cache that the test truncates, rewrites and deletes files of meanwhile, and checks every sample it
receives. Its own process, so that a SIGBUS (the classic failure of mmap readers) ends only it, and
the test sees how it ended.

Reads the original files first (`safetensors`), prints "ready", then runs epochs until the file
STOP exists. Each delivered document (of every 4th epoch: checking is slow in Python) must equal,
whole, either its file's original hidden states or the test's rewrite of them (every value negated):
anything else is a torn read that slipped through.
Prints one JSON line: epochs, samples, original, rewritten, torn, dropped (by reason), kinds (the
drops by what their message says happened) and up to 50 drop messages.

usage: cache_change_worker.py DATA CACHE HIDDEN LAYERS STOP
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import torch
from safetensors.torch import load

import draftfeed

# Why samples were dropped, by a phrase of their message.
KINDS = {
    "SIGBUS during the copy": "shrank while being copied",
    "SIGBUS during a check": "shrank while its",
    "size changed during the copy": "changed size from",
    "modified during the copy": "was modified while being read",
    "short at open": "shorter than the 8-byte header",
    "truncated at open": "truncated: tensor",
    "missing": "no cached hidden states",
}


def main() -> int:
    data, cache, hidden, layers, stop = sys.argv[1:6]
    hidden_size, n_layers = int(hidden), int(layers)
    dataset = draftfeed.open_dataset(data)
    by_ids: dict[tuple[int, ...], int] = {}
    # Per row, the batch rows its file should give (target layers, last layer) as raw bf16 bits
    # (numpy comparing bits is exact, and much faster than torch comparing bf16), and their negation.
    expected: dict[int, tuple[np.ndarray, ...]] = {}
    for row in range(len(dataset)):
        ids = dataset.input_ids(row)
        by_ids[tuple(int(i) for i in ids)] = row
        # From bytes, not load_file: that maps the file, and this test truncates it.
        with open(os.path.join(cache, f"hs_{row}.safetensors"), "rb") as f:
            hs = load(f.read())["hidden_states"]
        target = hs[:, : n_layers - 1, :].reshape(hs.shape[0], -1).contiguous()
        last = hs[:, n_layers - 1, :].contiguous()
        expected[row] = tuple(t.view(torch.int16).numpy() for t in (target, last, -target, -last))
    loader = draftfeed.Loader(data, hidden_size=hidden_size, num_target_layers=n_layers - 1,
                              total_seq_len=512, split="all", hidden_states_path=cache,
                              num_threads=2, prefetch=2, on_missing="warn", lock_timeout=1.0,
                              pin_memory=False, chunk_bytes=16384)
    print("ready", flush=True)
    counts = {"epochs": 0, "samples": 0, "original": 0, "rewritten": 0, "torn": 0}
    dropped: dict[str, int] = {}
    kinds: dict[str, int] = {}
    messages: list[str] = []
    epoch = 0
    warnings.simplefilter("ignore")  # missing files are said through warnings: counted below
    while not os.path.exists(stop):
        loader.set_epoch(epoch)
        for batch in loader:
            assert batch is not None
            delivered = loader.last_batch
            assert delivered is not None
            for reason, count in delivered.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + count
            for _, message in delivered.drop_messages:
                kind = next((k for k, text in KINDS.items() if text in message), "other")
                kinds[kind] = kinds.get(kind, 0) + 1
                if len(messages) < 50:
                    messages.append(message)
            if epoch % 4 != 0:
                continue  # checking in Python is slow: every 4th epoch, so the engine reads more
            docs = batch["document_ids"][0]
            input_ids = batch["input_ids"][0]
            target = batch["hidden_states"][0].view(torch.int16).numpy()
            last_layer = batch["verifier_last_hidden_states"][0].view(torch.int16).numpy()
            for d in range(int(docs.max().item()) + 1 if docs.numel() else 0):
                span = (docs == d).nonzero().flatten()
                if span.numel() == 0:
                    continue
                first, end = int(span[0]), int(span[-1]) + 1
                row = by_ids[tuple(input_ids[first:end].tolist())]
                t = end - first
                want_target, want_last, negated_target, negated_last = expected[row]
                got_target, got_last = target[first:end], last_layer[first:end]
                counts["samples"] += 1
                if (np.array_equal(got_target, want_target[:t])
                        and np.array_equal(got_last, want_last[:t])):
                    counts["original"] += 1
                elif (np.array_equal(got_target, negated_target[:t])
                      and np.array_equal(got_last, negated_last[:t])):
                    counts["rewritten"] += 1
                else:
                    counts["torn"] += 1
                    if len(messages) < 50:
                        messages.append(f"TORN: row {row}")
        counts["epochs"] += 1
        epoch += 1
    print(json.dumps({**counts, "dropped": dropped, "kinds": kinds, "messages": messages}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
