"""Planner benchmark: draftfeed against the reference, side by side in one run.

1. numpy.random.default_rng(seed).permutation(n) against draftfeed.permutation(seed, n).
2. One epoch's plan of N samples (lognormal lengths) for R ranks: speculators'
   MultipackDistributedBatchSamplerV2 plans one rank per call (each training process plans its own),
   so the reference's all-ranks time is R calls; draftfeed.plan_all_ranks plans every rank in one
   call. The reference is slow (seconds per rank at 10^6 samples), so by default only --ref-ranks
   ranks are timed and the all-ranks figure is extrapolated (printed as such); --ref-ranks R times
   them all. Timed ranks are also checked: same batch count, same lengths per batch.

usage: DRAFTFEED_DEV_BUILD=build PYTHONPATH=python python bench/bench_planner.py [--samples N]
       [--world-size R] [--max-len L] [--ref-ranks K] [--repeat K] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import numpy as np
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

import draftfeed


def best_and_median(fn, repeat):
    times = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def reference_rank(lengths, max_len, world_size, rank, epoch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = MultipackDistributedBatchSamplerV2(max_len, lengths, world_size, rank)
    sampler.set_epoch(epoch)
    start = time.perf_counter()
    batches = sampler._generate_batches(epoch)  # what iter() and len() run once per epoch
    return time.perf_counter() - start, batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--ref-ranks", type=int, default=4, help="reference ranks to time")
    parser.add_argument("--repeat", type=int, default=5, help="draftfeed / numpy repetitions")
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n, world, max_len = args.samples, args.world_size, args.max_len
    ref_ranks = max(1, min(args.ref_ranks, world))

    # Lengths: lognormal token counts (median e^7 = 1097, mean about 1800), a few above max_len.
    lengths = np.maximum(1, np.random.default_rng(0).lognormal(7.0, 1.0, size=n).astype(np.int64))
    report = {"samples": n, "world_size": world, "max_len": max_len, "epoch": args.epoch,
              "long_samples": int((lengths > max_len).sum()), "mean_length": float(lengths.mean())}

    # 1. permutation
    _np_best, np_med, np_perm = best_and_median(
        lambda: np.random.default_rng(args.epoch).permutation(n), args.repeat)
    _df_best, df_med, df_perm = best_and_median(
        lambda: draftfeed.permutation(args.epoch, n), args.repeat)
    assert np.array_equal(np_perm, df_perm), "permutation differs from numpy"
    report["permutation"] = {"numpy_s": np_med, "draftfeed_s": df_med, "speedup": np_med / df_med}

    # 2. plan: draftfeed, all ranks in one call, and one rank per call for the per-rank figure.
    _all_best, all_med, everyone = best_and_median(
        lambda: draftfeed.plan_all_ranks(lengths, max_len, world, epoch=args.epoch), args.repeat)
    _one_best, one_med, _ = best_and_median(
        lambda: draftfeed.plan_batches(lengths, max_len, world, 0, epoch=args.epoch), args.repeat)

    # The reference, rank by rank.
    ref_times = []
    clipped = np.minimum(lengths, max_len)
    for rank in range(ref_ranks):
        seconds, ref = reference_rank(lengths, max_len, world, rank, args.epoch)
        ref_times.append(seconds)
        ours = everyone[rank]
        assert len(ours) == len(ref), f"rank {rank}: {len(ours)} batches, reference {len(ref)}"
        for b, (x, y) in enumerate(zip(ours, ref)):  # integer lognormal lengths tie: multisets
            assert sorted(clipped[x]) == sorted(clipped[y]), f"rank {rank} batch {b} differs"
        if not args.json:
            print(f"  reference rank {rank}: {seconds:.2f} s, {len(ref)} batches (checked)",
                  flush=True)
    ref_per_rank = statistics.mean(ref_times)
    ref_all = ref_per_rank * world
    report["plan"] = {
        "batches_per_rank": len(everyone[0]),
        "reference_per_rank_s": ref_per_rank,
        "reference_ranks_timed": ref_ranks,
        "reference_all_ranks_s": ref_all,
        "reference_all_ranks_extrapolated": ref_ranks < world,
        "draftfeed_one_rank_s": one_med,
        "draftfeed_all_ranks_s": all_med,
        "speedup_one_rank": ref_per_rank / one_med,
        "speedup_all_ranks": ref_all / all_med,
    }

    if args.json:
        print(json.dumps(report, indent=2))
        return
    p = report["plan"]
    print(f"{n} samples (mean length {report['mean_length']:.0f}, {report['long_samples']} longer "
          f"than max_len {max_len}), {world} ranks, epoch {args.epoch}")
    print(f"permutation({n}): numpy {np_med * 1e3:.2f} ms, draftfeed {df_med * 1e3:.2f} ms "
          f"-> {report['permutation']['speedup']:.2f}x (medians of {args.repeat}; identical)")
    print(f"plan one rank:  reference {ref_per_rank:.2f} s (mean of {ref_ranks} ranks), "
          f"draftfeed {one_med * 1e3:.1f} ms -> {p['speedup_one_rank']:.0f}x")
    note = (f"extrapolated from {ref_ranks} of {world} ranks" if ref_ranks < world
            else "all ranks timed")
    print(f"plan all {world} ranks: reference {ref_all:.1f} s ({note}), draftfeed plan_all_ranks "
          f"{all_med * 1e3:.1f} ms -> {p['speedup_all_ranks']:.0f}x; "
          f"{p['batches_per_rank']} batches per rank")


if __name__ == "__main__":
    main()
