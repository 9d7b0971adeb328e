"""Running the reference entry point and ours on the same arguments, and comparing their batches."""

from __future__ import annotations

import inspect
import warnings

import torch


def reference_loaders(args):
    from speculators.train.dataloader import create_train_val_loaders

    accepted = inspect.signature(create_train_val_loaders).parameters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_train_val_loaders(**{k: v for k, v in args.items() if k in accepted})


def our_loaders(args):
    from draftfeed.speculators import create_train_val_loaders

    return create_train_val_loaders(**args)


def assert_same(ours: dict, ref: dict, context: str):
    assert list(ours) == list(ref), f"{context}: keys {list(ours)} != {list(ref)}"
    for key, expected in ref.items():
        got = ours[key]
        if isinstance(expected, torch.Tensor):
            assert got.shape == expected.shape and got.dtype == expected.dtype, (context, key)
            assert torch.equal(got, expected), f"{context}: {key} differs"
        else:
            assert got == expected, f"{context}: {key}: {got!r} != {expected!r}"


def iterate(loader):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(loader)
