"""The native collate for a user's preprocess callable (`_core.pack_samples`) against speculators'
own CollateFn on the same samples: keys, order, dtypes, shapes and values equal, whatever the callable
returned (other keys, dtypes to convert, rows past max_len, a sample longer than the batch)."""

from __future__ import annotations

import pytest
import torch
from speculators.train.data import CollateFn, create_empty_sample

from draftfeed import _core

H, LAYERS = 8, 3


def sample(n, gen, *, dtype=torch.bfloat16):
    return {
        "hidden_states": torch.randn(n, LAYERS * H, generator=gen).to(dtype),
        "input_ids": torch.randint(0, 1000, (n,), generator=gen),
        "verifier_last_hidden_states": torch.randn(n, H, generator=gen).to(dtype),
        "loss_mask": torch.randint(0, 2, (n,), generator=gen),
        "lengths": torch.tensor([n]),
        "position_ids": torch.arange(n),
    }


def reference(samples, max_len, dtype):
    out = CollateFn(max_len, H, num_target_layers=LAYERS, dtype=dtype)(samples)
    out.pop("error_records")
    return out


def assert_equal(ours, ref):
    assert list(ours) == list(ref)
    for key, expected in ref.items():
        got = ours[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape, key
        assert torch.equal(got, expected), key


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("lengths", [[5, 9, 30, 7], [50, 3], [64], [10, 54, 9], [1]])
def test_packs_as_the_reference_collate(dtype, lengths):
    gen = torch.Generator().manual_seed(sum(lengths))
    samples = [sample(n, gen, dtype=torch.float32 if n % 2 else torch.bfloat16) for n in lengths]
    name = str(dtype).removeprefix("torch.")
    assert_equal(_core.pack_samples(samples, 64, name), reference(samples, 64, dtype))


def test_what_a_callable_made_of_the_samples():
    """Keys renamed, dropped and added, int32 ids, a bool mask, a float64 hidden state, a shifted
    sample (fewer rows than its length says): the reference's rules apply to whatever came back."""
    gen = torch.Generator().manual_seed(3)
    samples = []
    for n in (12, 7, 20):
        s = sample(n, gen)
        samples.append({
            "input_ids": s["input_ids"][1:].to(torch.int32),
            "extra_hidden_states": s["hidden_states"][:-1].to(torch.float64),
            "loss_mask": s["loss_mask"][1:].bool(),
            "lengths": torch.tensor([n - 1]),
            "position_ids": s["position_ids"][1:],
            "weights": torch.rand(n - 1, 2, generator=gen),
        })
    assert_equal(_core.pack_samples(samples, 32, "bfloat16"),
                 reference(samples, 32, torch.bfloat16))


def test_the_empty_sample_of_an_all_failed_batch():
    empty = create_empty_sample(H, LAYERS, dtype=torch.bfloat16)
    assert_equal(_core.pack_samples([empty], 16, "bfloat16"), reference([empty], 16, torch.bfloat16))


def test_strided_rows_are_read_where_they_are():
    gen = torch.Generator().manual_seed(5)
    s = sample(10, gen)
    s["hidden_states"] = torch.randn(20, LAYERS * H, generator=gen).to(torch.bfloat16)[::2]
    assert not s["hidden_states"].is_contiguous()
    assert_equal(_core.pack_samples([s], 16, "bfloat16"), reference([s], 16, torch.bfloat16))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("lengths"), "without 'lengths'"),
        (lambda s: s.update(input_ids=torch.zeros(4, 2)), "trailing dimensions differ"),
        (lambda s: s.update(input_ids=[1, 2]), "not a CPU tensor"),
        (lambda s: s.update(lengths=torch.tensor([-3])), "negative length"),
        (lambda s: s.update(position_ids=torch.tensor(3)), "0-d"),
    ],
)
def test_what_the_collate_cannot_pack_is_a_clear_error(change, message):
    gen = torch.Generator().manual_seed(1)
    first, second = sample(4, gen), sample(4, gen)
    change(second)
    with pytest.raises(ValueError, match=message):
        _core.pack_samples([first, second], 16, "bfloat16")
    with pytest.raises(ValueError, match="no samples"):
        _core.pack_samples([], 16, "bfloat16")
