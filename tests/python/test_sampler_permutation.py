"""draftfeed.permutation against numpy itself: default_rng(seed).permutation(x), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import draftfeed

SEEDS = [0, 1, 42, 2**32 - 1, 2**32, 2**40 + 7, 2**63 + 5, 2**64 - 1, 2**64, 2**127 + 9, 2**200 + 3]
SIZES = [0, 1, 2, 3, 10, 1000, 65537]


def numpy_permutation(seed, x):
    return np.random.default_rng(seed).permutation(x)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", SIZES)
def test_permutation_of_a_size_equals_numpy(seed, n):
    ours = draftfeed.permutation(seed, n)
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, numpy_permutation(seed, n))


@pytest.mark.parametrize("seed", [0, 1, 42, 2**40 + 7, 2**63 + 5])
def test_permutation_of_a_million_equals_numpy(seed):
    np.testing.assert_array_equal(draftfeed.permutation(seed, 10**6), numpy_permutation(seed, 10**6))


def test_many_random_seeds_and_sizes_equal_numpy():
    gen = np.random.default_rng(2024)
    for _ in range(300):
        bits = int(gen.integers(0, 160))
        seed = int.from_bytes(gen.bytes(20), "little") % (2**bits) if bits else 0
        n = int(gen.integers(0, 5000))
        np.testing.assert_array_equal(
            draftfeed.permutation(seed, n), numpy_permutation(seed, n), err_msg=f"seed={seed} n={n}"
        )


def test_numpy_integer_seed_and_size_are_accepted():
    np.testing.assert_array_equal(
        draftfeed.permutation(np.uint64(2**63 + 5), np.int32(77)), numpy_permutation(2**63 + 5, 77)
    )


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.int8])
def test_permutation_of_an_array_equals_numpy(dtype):
    items = (np.arange(500) * 7 % 113).astype(dtype)
    for seed in (0, 3, 2**40 + 7):
        ours = draftfeed.permutation(seed, items)
        np.testing.assert_array_equal(ours, numpy_permutation(seed, items).astype(np.int64))
    np.testing.assert_array_equal(items, (np.arange(500) * 7 % 113).astype(dtype))  # input untouched


def test_permutation_of_valid_indices_like_the_sampler():
    # The reference shuffles np.nonzero(lengths <= max_len)[0], a subset of indices.
    lengths = np.random.default_rng(5).integers(1, 10000, size=3000)
    valid = np.nonzero(lengths <= 4096)[0]
    for seed in range(4):
        np.testing.assert_array_equal(draftfeed.permutation(seed, valid), numpy_permutation(seed, valid))


def test_permutation_of_a_list_and_of_a_strided_view():
    values = [9, 3, 7, 1, 5, 8]
    np.testing.assert_array_equal(draftfeed.permutation(4, values), numpy_permutation(4, values))
    view = np.arange(40)[::3]
    np.testing.assert_array_equal(draftfeed.permutation(4, view), numpy_permutation(4, view))


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: draftfeed.permutation(-1, 3), ValueError, "non-negative"),
        (lambda: draftfeed.permutation(0, -2), ValueError, "-2"),
        (lambda: draftfeed.permutation(1.5, 3), TypeError, "float"),
        (lambda: draftfeed.permutation(0, np.zeros((2, 2), np.int64)), ValueError, "2 dimensions"),
        (lambda: draftfeed.permutation(0, np.zeros(3)), ValueError, "float64"),
    ],
)
def test_bad_arguments_are_refused_clearly(call, error, text):
    with pytest.raises(error, match=text):
        call()


def legacy_masked_draws(seed, maxima):
    """numpy's own masked-rejection bounded integers on default_rng(seed)'s PCG64 stream: legacy
    RandomState.randint draws `next & mask` until <= max, with 32-bit draws (sharing the bit
    generator's 32-bit buffer) while max < 2^32 and 64-bit draws beyond, like random_interval."""
    state = np.random.RandomState(np.random.PCG64(seed))
    return np.array(
        [state.randint(0, int(m) + 1, dtype=np.uint64) for m in maxima], dtype=np.uint64
    ).astype(np.int64)


@pytest.mark.parametrize("seed", [0, 5, 2**63 + 5])
def test_bounded_draws_equal_numpy_on_both_sides_of_2_to_the_32(seed):
    # A shuffle of more than 2^32 items starts with 64-bit draws then switches to 32-bit ones; a
    # real one would need a 4 GiB array, so the draws are compared directly.
    maxima = [2**32 + 7, 2**40 + 3, 2**32, 2**32 - 1, 2**32 - 2, 1000, 9, 2**63 - 1, 2**62, 1, 0,
              2**31, 3, 2**33 + 1, 17] * 20
    np.testing.assert_array_equal(
        draftfeed._core._numpy_interval_draws(seed, maxima), legacy_masked_draws(seed, maxima)
    )


def test_bounded_draws_on_a_shuffle_like_descending_run():
    maxima = list(range(2**32 + 40, 2**32 - 40, -1))
    np.testing.assert_array_equal(
        draftfeed._core._numpy_interval_draws(9, maxima), legacy_masked_draws(9, maxima)
    )
