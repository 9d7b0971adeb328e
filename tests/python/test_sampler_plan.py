"""draftfeed.plan_batches / plan_all_ranks against speculators' MultipackDistributedBatchSamplerV2.

The batches must be identical (indices and order), with distinct lengths and with many ties (which
the reference orders by numpy's unstable argsort; draftfeed asks numpy too). Properties (capacity,
disjointness, coverage, balance) are checked on lognormal lengths.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

import draftfeed

MAX_LEN = 4096


def reference_batches(lengths, max_len, world_size, rank, *, epoch=0, seed=0, truncate=True,
                      max_batches=None):
    kwargs = {"truncate_long_samples": truncate, "seed": seed}
    if max_batches is not None:
        kwargs["max_batches"] = max_batches
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = MultipackDistributedBatchSamplerV2(max_len, lengths, world_size, rank, **kwargs)
    sampler.set_epoch(epoch)
    batches = list(sampler)
    assert len(sampler) == len(batches)
    return batches


def assert_same_batches(ours, ref, context):
    assert len(ours) == len(ref), f"{context}: {len(ours)} batches, reference {len(ref)}"
    for b, (x, y) in enumerate(zip(ours, ref)):
        assert x.dtype == np.int64
        np.testing.assert_array_equal(x, y, err_msg=f"{context}: batch {b}")


def distinct_lengths(n, high, seed):
    return np.random.default_rng(seed).choice(np.arange(1, high), size=n, replace=False)


@pytest.mark.parametrize("n", [100, 4000])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("truncate", [True, False])
def test_distinct_lengths_give_identical_batches(n, world_size, truncate):
    if truncate:
        # Distinct after clipping: all below max_len but one, which is clipped to max_len.
        lengths = distinct_lengths(n, MAX_LEN, seed=n + world_size)
        lengths[n // 2] = 3 * MAX_LEN
    else:
        lengths = distinct_lengths(n, 3 * MAX_LEN, seed=n + world_size)  # about 2/3 dropped
        assert (lengths > MAX_LEN).sum() > 0
    for epoch in range(3):
        everyone = draftfeed.plan_all_ranks(lengths, MAX_LEN, world_size, epoch=epoch, seed=5,
                                            truncate=truncate)
        assert len(everyone) == world_size
        for rank in range(world_size):
            context = f"n={n} R={world_size} truncate={truncate} epoch={epoch} rank={rank}"
            ref = reference_batches(lengths, MAX_LEN, world_size, rank, epoch=epoch, seed=5,
                                    truncate=truncate)
            ours = draftfeed.plan_batches(lengths, MAX_LEN, world_size, rank, epoch=epoch, seed=5,
                                          truncate=truncate)
            assert_same_batches(ours, ref, context)
            assert_same_batches(everyone[rank], ref, context + " (plan_all_ranks)")


@pytest.mark.parametrize("seed", [0, 2**40 + 7])
def test_seed_and_default_arguments_match(seed):
    lengths = distinct_lengths(1500, MAX_LEN, seed=11)
    for rank in range(3):
        assert_same_batches(
            draftfeed.plan_batches(lengths, MAX_LEN, 3, rank, seed=seed, epoch=1),
            reference_batches(lengths, MAX_LEN, 3, rank, seed=seed, epoch=1),
            f"seed={seed} rank={rank}",
        )
    assert_same_batches(draftfeed.plan_batches(lengths, MAX_LEN, 2, 1),
                        reference_batches(lengths, MAX_LEN, 2, 1), "defaults")


@pytest.mark.skipif(
    "max_batches" not in inspect.signature(MultipackDistributedBatchSamplerV2).parameters,
    reason="the installed speculators has no max_batches",
)
@pytest.mark.parametrize("max_batches", [0, 1, 5, 10**6])
def test_max_batches_matches(max_batches):
    lengths = distinct_lengths(2000, MAX_LEN, seed=3)
    for rank in range(4):
        ref = reference_batches(lengths, MAX_LEN, 4, rank, epoch=2, max_batches=max_batches)
        ours = draftfeed.plan_batches(lengths, MAX_LEN, 4, rank, epoch=2, max_batches=max_batches)
        assert_same_batches(ours, ref, f"max_batches={max_batches} rank={rank}")


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_repeated_lengths_give_identical_batches(truncate, world_size):
    """Ties everywhere (as in real tokenized data): the reference orders them with numpy's unstable
    argsort, whose order depends on numpy's build and this CPU; draftfeed asks numpy for each batch's
    final window, so every rank gets exactly the reference's samples, in the reference's order."""
    gen = np.random.default_rng(world_size)
    lengths = gen.integers(1, 300, size=3000) * 20  # many ties, some longer than max_len
    for epoch in range(3):
        everyone = draftfeed.plan_all_ranks(lengths, MAX_LEN, world_size, epoch=epoch,
                                            truncate=truncate, seed=42)
        for rank in range(world_size):
            context = f"R={world_size} truncate={truncate} epoch={epoch} rank={rank}"
            ref = reference_batches(lengths, MAX_LEN, world_size, rank, epoch=epoch,
                                    truncate=truncate, seed=42)
            assert_same_batches(draftfeed.plan_batches(lengths, MAX_LEN, world_size, rank,
                                                       epoch=epoch, truncate=truncate, seed=42),
                                ref, context)
            assert_same_batches(everyone[rank], ref, context + " (plan_all_ranks)")


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_native_tie_order_differs_but_packs_the_same_lengths(world_size):
    """window_order='native' (no Python calls, what the CLI uses) keeps the batch count and every
    batch's multiset of lengths; only which of several equal-length samples a rank gets may differ.
    That it does differ here shows the numpy test above can fail."""
    gen = np.random.default_rng(world_size)
    lengths = gen.integers(1, 30, size=2000) * 64
    differ = 0
    for rank in range(world_size):
        ref = reference_batches(lengths, MAX_LEN, world_size, rank, epoch=1)
        ours = draftfeed.plan_batches(lengths, MAX_LEN, world_size, rank, epoch=1,
                                      window_order="native")
        assert len(ours) == len(ref)
        for b, (x, y) in enumerate(zip(ours, ref)):
            assert sorted(lengths[x]) == sorted(lengths[y]), f"rank {rank} batch {b}"
            differ += not np.array_equal(x, y)
    assert differ > 0


def test_window_order_is_called_once_per_batch_with_ties_and_checked():
    lengths = np.random.default_rng(0).integers(1, 10, size=600) * 100
    calls = []

    def argsort(window):
        calls.append(window.copy())
        assert window.dtype == np.int64
        return np.argsort(window)

    batches = draftfeed.plan_batches(lengths, MAX_LEN, 2, 0, window_order=argsort)
    assert 0 < len(calls) <= len(batches)
    distinct = distinct_lengths(600, MAX_LEN, seed=3)
    calls.clear()
    draftfeed.plan_batches(distinct, MAX_LEN, 2, 0, window_order=argsort)
    assert calls == []  # no ties, nothing to ask
    with pytest.raises(RuntimeError, match="ascending"):
        draftfeed.plan_batches(lengths, MAX_LEN, 2, 0, window_order=lambda w: np.argsort(-w))
    with pytest.raises(RuntimeError, match="positions for"):
        draftfeed.plan_batches(lengths, MAX_LEN, 2, 0, window_order=lambda w: np.argsort(w)[1:])
    with pytest.raises(ZeroDivisionError):
        draftfeed.plan_batches(lengths, MAX_LEN, 2, 0, window_order=lambda w: 1 / 0)
    with pytest.raises(ValueError, match="window_order"):
        draftfeed.plan_batches(lengths, MAX_LEN, 2, 0, window_order="stable")


def lognormal_lengths(n, seed):
    gen = np.random.default_rng(seed)
    return np.maximum(1, gen.lognormal(mean=7.0, sigma=1.0, size=n).astype(np.int64))


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("world_size", [2, 8, 64])
def test_lognormal_plan_properties(truncate, world_size):
    max_len = 8192
    lengths = lognormal_lengths(50000, seed=world_size)
    everyone, counts = draftfeed.plan_all_ranks(lengths, max_len, world_size, epoch=1,
                                                truncate=truncate, with_counts=True)
    clipped = np.minimum(lengths, max_len)
    num_batches = len(everyone[0])
    assert all(len(rank) == num_batches for rank in everyone)
    seen = np.concatenate([b for rank in everyone for b in rank])
    assert len(np.unique(seen)) == len(seen), "a sample is planned twice"
    for rank in everyone:
        for batch in rank:
            assert clipped[batch].sum() <= max_len
    long_count = int((lengths > max_len).sum())
    assert long_count > 0
    if not truncate:
        assert (lengths[seen] <= max_len).all()
    dropped_long = 0 if truncate else long_count
    assert counts == {
        "num_samples": len(lengths),
        "num_long": long_count,
        "dropped_long": dropped_long,
        "dropped_tail": len(lengths) - dropped_long - len(seen),
        "cut_by_max_batches": 0,
        "planned": len(seen),
    }
    assert counts["dropped_tail"] < world_size
    samples = [sum(len(b) for b in rank) for rank in everyone]
    tokens = [sum(int(clipped[b].sum()) for b in rank) for rank in everyone]
    assert max(samples) / min(samples) < 1.15, samples
    assert max(tokens) / min(tokens) < 1.15, tokens


def test_lengths_in_any_integer_form_match():
    lengths = distinct_lengths(600, MAX_LEN, seed=8)
    ref = reference_batches(lengths, MAX_LEN, 2, 1)
    for form in (lengths.tolist(), lengths.astype(np.int32), lengths.astype(np.uint16)):
        assert_same_batches(draftfeed.plan_batches(form, MAX_LEN, 2, 1), ref, str(type(form)))
    strided = np.repeat(lengths, 2)[::2]
    assert_same_batches(draftfeed.plan_batches(strided, MAX_LEN, 2, 1), ref, "strided")


def test_edge_sizes_match():
    for lengths in ([], [5], [5, 6, 7], [MAX_LEN] * 1 + [1]):
        for world_size in (1, 2, 4):
            for rank in range(world_size):
                ours = draftfeed.plan_batches(np.array(lengths, np.int64), MAX_LEN, world_size, rank)
                ref = reference_batches(np.array(lengths, np.int64), MAX_LEN, world_size, rank)
                assert_same_batches(ours, ref, f"lengths={lengths} R={world_size} rank={rank}")


def test_batches_outlive_the_plan_and_are_independent():
    lengths = distinct_lengths(500, MAX_LEN, seed=1)
    batches = draftfeed.plan_all_ranks(lengths, MAX_LEN, 2)[1]
    expected = [b.copy() for b in batches]
    del lengths
    batches[0][:] = -1  # a view of the rank's buffer: must not spill into its neighbours
    for got, want in zip(batches[1:], expected[1:]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"rank": 2}, "rank 2"),
        ({"world_size": 0, "rank": 0}, "world_size"),
        ({"max_len": 0}, "max_len"),
        ({"epoch": -1}, "epoch"),
        ({"max_batches": -1}, "max_batches"),
        ({"seed": -3}, "non-negative"),
        ({"lengths": [1, -5, 2]}, "sample 1 has a negative length -5"),
        ({"lengths": [1.0, 2.0]}, "integers"),
    ],
)
def test_bad_arguments_are_value_errors_that_name_the_value(kwargs, text):
    args = {"lengths": [1, 2, 3], "max_len": 10, "world_size": 2, "rank": 0} | kwargs
    with pytest.raises(ValueError, match=text):
        draftfeed.plan_batches(args.pop("lengths"), args.pop("max_len"), args.pop("world_size"),
                               args.pop("rank"), **args)
