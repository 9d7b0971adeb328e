"""Opening a token dataset and reading every row's length: draftfeed against `datasets`.

The reference trainer (speculators) does `load_from_disk(path)` and then
`list(dataset.with_format(None)["seq_len"])` to give its sampler the lengths; draftfeed does
`open_dataset(path).seq_lens()`. Both run here on the same 1,000,000-row dataset (written by
draftfeed's writer, and checked to load with `datasets`), in one process, warm page cache; the
script prints the medians and the ratios.

    PYTHONPATH=python DRAFTFEED_DEV_BUILD=build-release python bench/bench_dataset.py
    # options: --rows N --min-len A --max-len B --repeats K --data DIR (reused if it matches)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        seconds, result = timed(fn)
        times.append(seconds)
    return statistics.median(times), result


def ensure_dataset(draftfeed, path: str, rows: int, min_len: int, max_len: int) -> None:
    marker = os.path.join(path, "bench.json")
    wanted = {"rows": rows, "min_len": min_len, "max_len": max_len, "seed": 0}
    if os.path.exists(marker) and json.load(open(marker)) == wanted:
        return
    seconds, summary = timed(
        lambda: draftfeed.write_synthetic_dataset(path, rows, seed=0, min_len=min_len, max_len=max_len)
    )
    print(
        f"wrote {rows:,} rows ({summary['tokens']:,} tokens, {summary['bytes'] / 1e6:.0f} MB, "
        f"{len(summary['shards'])} shards) in {seconds:.2f} s ({rows / seconds:,.0f} rows/s)"
    )
    json.dump(wanted, open(marker, "w"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", default=None, help="dataset folder (default /tmp/draftfeed-bench-dataset-<rows>)")
    args = parser.parse_args()

    import datasets

    import draftfeed

    path = args.data or f"/tmp/draftfeed-bench-dataset-{args.rows}"
    ensure_dataset(draftfeed, path, args.rows, args.min_len, args.max_len)

    # The real `datasets` loads what draftfeed wrote, with the same rows and lengths.
    reference = datasets.load_from_disk(path)
    assert len(reference) == args.rows, (len(reference), args.rows)
    for row in (0, args.rows // 2, args.rows - 1):
        ids, mask = draftfeed.synthetic_row(row, seed=0, min_len=args.min_len, max_len=args.max_len)
        plain = reference.with_format(None)[row]
        assert plain["input_ids"] == ids.tolist() and plain["loss_mask"] == mask.tolist(), row
    ours = draftfeed.open_dataset(path)
    reference_lengths = np.asarray(reference.with_format(None)["seq_len"][:], dtype=np.int64)
    assert np.array_equal(ours.seq_lens(), reference_lengths)
    del ours, reference

    def draftfeed_open():
        return draftfeed.open_dataset(path)

    def draftfeed_open_and_lengths():
        lengths = draftfeed.open_dataset(path).seq_lens()
        return int(lengths.sum())

    def datasets_open():
        return datasets.load_from_disk(path)

    def datasets_lengths_torch():  # the dataset's saved format (torch): one tensor
        return int(datasets.load_from_disk(path)["seq_len"][:].sum())

    def datasets_lengths_python():  # what speculators' ArrowDataset does
        return sum(list(datasets.load_from_disk(path).with_format(None)["seq_len"]))

    # One untimed pass of each so both read from a warm page cache.
    for fn in (draftfeed_open_and_lengths, datasets_lengths_torch):
        fn()

    results = {}
    results["draftfeed open"], _ = median_time(draftfeed_open, args.repeats)
    results["draftfeed open + seq_lens"], ours_sum = median_time(draftfeed_open_and_lengths, args.repeats)
    results["datasets load_from_disk"], _ = median_time(datasets_open, args.repeats)
    results['datasets load + ["seq_len"][:] (torch)'], torch_sum = median_time(datasets_lengths_torch, args.repeats)
    results['datasets list(with_format(None)["seq_len"])'], python_sum = median_time(
        datasets_lengths_python, max(1, args.repeats // 2)
    )
    assert ours_sum == torch_sum == python_sum, (ours_sum, torch_sum, python_sum)

    print(f"\n{args.rows:,} rows, lengths {args.min_len}..{args.max_len}, median of {args.repeats} runs, warm cache")
    for name, seconds in results.items():
        print(f"  {name:46s} {seconds * 1e3:10.2f} ms")
    base = results["draftfeed open + seq_lens"]
    print("\nratios (reference / draftfeed open + seq_lens):")
    for name in ('datasets load + ["seq_len"][:] (torch)', 'datasets list(with_format(None)["seq_len"])'):
        print(f"  {name:46s} {results[name] / base:10.1f}x")
    print(f"  {'open only: load_from_disk / open_dataset':46s} {results['datasets load_from_disk'] / results['draftfeed open']:10.1f}x")


if __name__ == "__main__":
    main()
