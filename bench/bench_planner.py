"""Planner benchmark: draftfeed against the reference, side by side in one run, timed alike.

Every figure is the median of --repeat timed calls after one untimed warm-up call, the same on
both sides:
1. numpy.random.default_rng(epoch).permutation(n) against draftfeed.permutation(epoch, n).
2. Per rank, what each training process runs once per epoch (N samples, lognormal lengths, R
   ranks): the reference's MultipackDistributedBatchSamplerV2._generate_batches(epoch) (its
   per-epoch cache emptied before each call; the sampler built outside the timing) against
   draftfeed.plan_batches(..., rank) (the planner the drop-in's batch sampler runs, with numpy's
   argsort for ties as the reference). Ranks plan in parallel in a real run, each its own, so this
   per-rank time is what a trainer waits for at each epoch start, on either side.
   --ref-ranks ranks are timed (each rank's plan does the same packing; timing a few shows the
   spread) and each timed rank's batches are checked equal to draftfeed's, index for index.
3. Every rank's plan in one process (what `draftfeed plan` prints; no trainer needs it): draftfeed's
   plan_all_ranks in one call, against R calls of the reference's per-rank planner (it has no
   all-ranks call; each of its calls packs every rank and keeps one). The reference's figure is R x
   its median per-rank time, extrapolated unless --ref-ranks = R; marked so.

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


def timed(fn, repeat: int) -> tuple[float, list[float], object]:
    """One untimed warm-up call, then `repeat` timed calls: (median s, every time, last result)."""
    result = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, result


def reference_planner(lengths, max_len: int, world_size: int, rank: int, epoch: int):
    """A callable that runs the reference's per-epoch planning for one rank, uncached."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = MultipackDistributedBatchSamplerV2(max_len, lengths, world_size, rank)
    sampler.set_epoch(epoch)

    def plan():
        sampler._cached_generated_batches = (-1, [])  # what a new epoch finds: nothing cached
        return sampler._generate_batches(epoch)  # what iter() and len() run once per epoch

    return plan


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--ref-ranks", type=int, default=2, help="ranks timed on both sides")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per figure (after one warm-up)")
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n, world, max_len = args.samples, args.world_size, args.max_len
    ranks = list(range(max(1, min(args.ref_ranks, world))))

    # Lengths: lognormal token counts (median e^7 = 1097, mean about 1800), a few above max_len.
    lengths = np.maximum(1, np.random.default_rng(0).lognormal(7.0, 1.0, size=n).astype(np.int64))
    report = {"samples": n, "world_size": world, "max_len": max_len, "epoch": args.epoch,
              "repeat": args.repeat, "warmup": 1, "long_samples": int((lengths > max_len).sum()),
              "mean_length": float(lengths.mean())}

    # 1. permutation
    np_med, np_times, np_perm = timed(lambda: np.random.default_rng(args.epoch).permutation(n), args.repeat)
    perm_med, perm_times, df_perm = timed(lambda: draftfeed.permutation(args.epoch, n), args.repeat)
    assert np.array_equal(np_perm, df_perm), "permutation differs from numpy"
    report["permutation"] = {"numpy_s": np_med, "draftfeed_s": perm_med, "speedup": np_med / perm_med,
                             "numpy_runs": np_times, "draftfeed_runs": perm_times}

    # 2. per rank, both sides alike
    per_rank = []
    for rank in ranks:
        ref_med, ref_times, ref = timed(reference_planner(lengths, max_len, world, rank, args.epoch), args.repeat)
        df_med, df_times, ours = timed(
            lambda r=rank: draftfeed.plan_batches(lengths, max_len, world, r, epoch=args.epoch), args.repeat)
        assert len(ours) == len(ref), f"rank {rank}: {len(ours)} batches, reference {len(ref)}"
        for b, (x, y) in enumerate(zip(ours, ref)):
            assert np.array_equal(np.asarray(x), np.asarray(y)), f"rank {rank} batch {b} differs"
        per_rank.append({"rank": rank, "reference_s": ref_med, "draftfeed_s": df_med,
                         "reference_runs": ref_times, "draftfeed_runs": df_times, "batches": len(ref)})
        if not args.json:
            print(f"  rank {rank}: reference {ref_med:.3f} s, draftfeed {df_med * 1e3:.1f} ms, "
                  f"{len(ref)} batches (identical)", flush=True)
    ref_rank = statistics.median(r["reference_s"] for r in per_rank)
    df_rank = statistics.median(r["draftfeed_s"] for r in per_rank)

    # 3. every rank in one process
    all_med, all_times, everyone = timed(
        lambda: draftfeed.plan_all_ranks(lengths, max_len, world, epoch=args.epoch), args.repeat)
    for r in per_rank:  # plan_all_ranks gives every rank the same batches as plan_batches
        assert len(everyone[r["rank"]]) == r["batches"]
    report["plan"] = {
        "batches_per_rank": per_rank[0]["batches"],
        "ranks_timed": len(ranks),
        "per_rank": per_rank,
        "reference_per_rank_s": ref_rank,
        "draftfeed_per_rank_s": df_rank,
        "speedup_per_rank": ref_rank / df_rank,
        "reference_all_ranks_s": ref_rank * world,
        "reference_all_ranks_extrapolated": len(ranks) < world,
        "draftfeed_all_ranks_s": all_med,
        "draftfeed_all_ranks_runs": all_times,
        "speedup_all_ranks_one_process": ref_rank * world / all_med,
    }

    if args.json:
        print(json.dumps(report, indent=2))
        return
    p = report["plan"]
    print(f"{n} samples (mean length {report['mean_length']:.0f}, {report['long_samples']} longer "
          f"than max_len {max_len}), {world} ranks, epoch {args.epoch}; medians of {args.repeat} "
          "calls after one warm-up, both sides")
    print(f"permutation({n}): numpy {np_med * 1e3:.2f} ms, draftfeed {perm_med * 1e3:.2f} ms "
          f"-> {report['permutation']['speedup']:.2f}x (identical)")
    print(f"plan, per rank (each training process, every epoch): reference {ref_rank:.3f} s, "
          f"draftfeed {df_rank * 1e3:.1f} ms -> {p['speedup_per_rank']:.0f}x")
    note = f"extrapolated from {len(ranks)} ranks" if len(ranks) < world else "all ranks timed"
    print(f"every rank's plan in one process: reference {world} x per rank = {p['reference_all_ranks_s']:.1f} s "
          f"({note}), draftfeed plan_all_ranks {all_med * 1e3:.1f} ms -> "
          f"{p['speedup_all_ranks_one_process']:.0f}x; {p['batches_per_rank']} batches per rank")


if __name__ == "__main__":
    main()
