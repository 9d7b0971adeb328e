"""`draftfeed.speculators.create_train_val_loaders` against the real speculators entry point (PyPI,
num_workers=0 on its side), both called with speculators 0.9.0's trainer's arguments: same batches
on every rank, the same sampler surface and fast-skip."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from dropin_helpers import (
    assert_loaders_equal,
    assert_same,
    iterate,
    our_loaders,
    reference_loaders,
    trainer_args,
)
from reference_fixtures import write_fixture

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("both_paths")]

MAX_LEN = 96


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dropin") / "data")
    return write_fixture(
        path, rows=60, max_len=MAX_LEN, missing=(4, 17, 50), mismatched=(9, 33), long_rows=(12, 40)
    )


def base_args(fx, **overrides):
    return trainer_args(fx, MAX_LEN, **overrides)


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("via_env", [False, True])
def test_every_batch_of_every_rank_equals_the_reference(fixture, topology, world_size, via_env):
    for rank in range(world_size):
        topology(rank, world_size, via_env=via_env)
        args = base_args(fixture)
        ref_train, ref_val = reference_loaders(args)
        if via_env:
            from speculators.train import distributed as dist_state

            dist_state._dp_rank, dist_state._dp_size = 0, 1  # draftfeed must read the environment
        ours = our_loaders(dict(args, num_workers=2))
        assert_loaders_equal(ours, (ref_train, ref_val), f"R={world_size} r={rank}")


def test_native_and_python_preprocess_equal_the_reference(fixture, topology):
    from speculators.models.eagle3.data import shift_batch

    topology(0, 1, via_env=False)
    ref_train, _ = reference_loaders(base_args(fixture, preprocess=shift_batch))
    native, _ = our_loaders(base_args(fixture, preprocess=shift_batch))
    python_path, _ = our_loaders(base_args(fixture, preprocess=lambda sample: shift_batch(sample)))
    ref = iterate(ref_train)
    for name, loader in (("native", native), ("python", python_path)):
        got = iterate(loader)
        assert len(got) == len(ref)
        for k, (a, b) in enumerate(zip(got, ref)):
            assert_same(a, b, f"{name} eagle3 batch {k}")


def test_python_preprocess_path_has_the_native_noise(fixture, topology):
    topology(0, 1, via_env=False)
    native, _ = our_loaders(base_args(fixture, noise_std=0.05))
    python_path, _ = our_loaders(base_args(fixture, noise_std=0.05, preprocess=lambda sample: sample))
    for a, b in zip(iterate(native), iterate(python_path), strict=True):
        assert torch.equal(a["hidden_states"], b["hidden_states"])


def test_fast_skip_matches_the_reference(fixture, topology):
    topology(0, 1, via_env=False)
    ref_train, _ = reference_loaders(base_args(fixture))
    train, _ = our_loaders(base_args(fixture, num_workers=2))
    epoch, skip = 1, 3
    for loader in (ref_train, train):
        loader.batch_sampler.set_epoch(epoch)
    ours_all = train.batch_sampler._generate_batches(epoch)
    ref_all = ref_train.batch_sampler._generate_batches(epoch)
    assert len(ours_all) == len(ref_all)
    for a, b in zip(ours_all, ref_all):
        np.testing.assert_array_equal(a, b)
    for loader, batches in ((ref_train, ref_all), (train, ours_all)):
        loader.batch_sampler._cached_generated_batches = (epoch, batches[skip:])
    assert len(train) == len(ref_train) == len(ref_all) - skip
    for k, (a, b) in enumerate(zip(iterate(train), iterate(ref_train), strict=True)):
        assert_same(a, b, f"fast-skip batch {k}")


def test_trainer_epoch_loop_with_resume_by_fast_skip(fixture, topology):
    """Drives the loaders as the reference trainer's epoch loop does: set_epoch, len, iterate; then a
    mid-epoch resume through the sampler slice; validation each epoch."""
    topology(0, 1, via_env=False)
    train, val = our_loaders(base_args(fixture, num_workers=2, max_train_batches=6))
    seen = {}
    for epoch in range(2):
        train.batch_sampler.set_epoch(epoch)
        num_steps = len(train)
        assert num_steps == min(6, len(train.batch_sampler._generate_batches(epoch)))
        seen[epoch] = [b["input_ids"].clone() for b in train]
        assert len(seen[epoch]) == num_steps
        val.batch_sampler.set_epoch(epoch)
        assert sum(1 for _ in val) == len(val)
    # A fresh process resumes epoch 1 after 4 steps.
    train2, _ = our_loaders(base_args(fixture, num_workers=2, max_train_batches=6))
    train2.batch_sampler.set_epoch(1)
    all_batches = train2.batch_sampler._generate_batches(1)
    train2.batch_sampler._cached_generated_batches = (1, all_batches[4:])
    resumed = [b["input_ids"].clone() for b in train2]
    assert len(resumed) == 2
    for a, b in zip(resumed, seen[1][4:]):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "override, error, match",
    [
        (dict(train_data_ratio=1.0), ValueError, r"\(0, 1\)"),
        (dict(train_data_ratio=0.0), ValueError, r"\(0, 1\)"),
        (dict(on_missing="often"), ValueError, "on_missing"),
        (dict(on_generate="keep"), ValueError, "on_generate"),
        (dict(dataloader_in_order=False, num_workers=0), ValueError, "num_workers > 0"),
        (dict(hidden_states_dtype=torch.float16), ValueError, "float16"),
        (dict(max_consecutive_generation_failures=0), ValueError, "max_consecutive"),
    ],
)
def test_wrong_values_fail_like_the_reference(fixture, override, error, match):
    with pytest.raises(error, match=match):
        our_loaders(base_args(fixture, **override))


def test_generate_without_a_server_stops_the_trainer_naming_the_server(fixture):
    """Rows 4 and 17 of the training split have no file; 127.0.0.1:9 refuses connections. Two
    exhausted samples in a row reach max_consecutive_generation_failures: as with the reference, the
    batch carries fatal recovery metadata (the loader does not raise on this rank alone), and the
    trainer's own recovery coordinator stops the run with the server named."""
    from speculators.train.recovery import RECOVERY_METADATA_KEY, BatchRecoveryCoordinator

    train, _ = our_loaders(base_args(fixture, on_missing="generate", max_consecutive_generation_failures=2))
    coordinator = BatchRecoveryCoordinator("training", device="cpu")
    fatal_seen = False
    with pytest.raises(RuntimeError, match=r"circuit breaker.*127\.0\.0\.1:9"):
        for batch in iterate(train):
            metadata = batch.get(RECOVERY_METADATA_KEY)
            fatal_seen = fatal_seen or bool(metadata and metadata.fatal)
            coordinator.consume(batch)  # not distributed: synchronises at every batch
    assert fatal_seen


class CountingTransfer:
    """A custom transfer with the hs-connectors interface (not a FileTransfer): draftfeed must call it."""

    def __init__(self, root):
        from pathlib import Path

        from hs_connectors import FileTransfer

        self.inner = FileTransfer(Path(root))
        self.calls = 0

    def setup(self):
        pass

    def get_cached(self, file_idx):
        self.calls += 1
        return self.inner.get_cached(file_idx)

    def get_generated(self, params):
        return self.inner.get_generated(params)

    def cache(self, *args):
        raise AssertionError("offline runs never cache")

    def delete(self, handle):
        raise AssertionError("offline runs never delete")


@pytest.mark.parametrize("python_preprocess", [False, True])
def test_custom_transfer_is_called_back_and_gives_the_reference_batches(fixture, topology,
                                                                        python_preprocess):
    topology(0, 1, via_env=False)
    root = os.path.join(fixture.path, "hidden_states")
    # A callable the engine does not know takes the per-sample Python path: it reads through the
    # transfer too.
    preprocess = (lambda sample: sample) if python_preprocess else None
    ref_train, _ = reference_loaders(base_args(fixture, transfer=CountingTransfer(root),
                                               preprocess=preprocess))
    transfer = CountingTransfer(root)
    train, _ = our_loaders(base_args(fixture, transfer=transfer, num_workers=2,
                                     preprocess=preprocess))
    ref = iterate(ref_train)
    got = iterate(train)
    assert transfer.calls == sum(len(b) for b in train.batch_sampler._generate_batches(0))
    assert len(got) == len(ref)
    for k, (a, b) in enumerate(zip(got, ref)):
        assert_same(a, b, f"custom transfer batch {k}")


def test_overfull_batch_cut_at_total_seq_len_counts_only_failed_samples(fixture, topology):
    """A batch list given through the sampler cache may hold more tokens than total_seq_len: samples
    after the cut are not error records; the missing one is."""
    topology(0, 1, via_env=False)
    ref_train, _ = reference_loaders(base_args(fixture))
    train, _ = our_loaders(base_args(fixture, num_workers=2))
    lengths = np.asarray(train.batch_sampler.lengths)
    order = [4, *[int(i) for i in np.argsort(-lengths) if int(i) not in fixture.missing][:5]]
    assert lengths[order[1:]].sum() > MAX_LEN and 4 in fixture.missing
    for loader in (ref_train, train):
        loader.batch_sampler._cached_generated_batches = (0, [np.array(order)])
    (ours,), (ref,) = iterate(train), iterate(ref_train)
    assert ref["error_records"] == 1
    assert_same(ours, ref, "overfull batch")


class RaisingTransfer(CountingTransfer):
    """get_cached raises for one row, as a store that lost its connection would."""

    def __init__(self, root, row):
        super().__init__(root)
        self.row = row

    def get_cached(self, file_idx):
        if file_idx == self.row:
            raise KeyError(f"the store has no entry {file_idx}")
        return super().get_cached(file_idx)


def test_an_exception_from_a_transfer_reaches_the_trainer_as_with_the_reference(fixture, topology):
    topology(0, 1, via_env=False)
    root = os.path.join(fixture.path, "hidden_states")
    ref_train, _ = reference_loaders(base_args(fixture, transfer=RaisingTransfer(root, 7)))
    train, _ = our_loaders(base_args(fixture, transfer=RaisingTransfer(root, 7), num_workers=2))
    planned = {int(r) for b in train.batch_sampler._generate_batches(0) for r in b}
    assert 7 in planned
    errors = []
    for loader in (ref_train, train):
        with pytest.raises(KeyError) as caught:
            iterate(loader)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] == "'the store has no entry 7'"
    # The loader is still usable: a later epoch runs to the same error, not a hang.
    with pytest.raises(KeyError):
        iterate(train)


def test_batches_whose_samples_all_failed_are_the_references(tmp_path, topology):
    """No row has a file: every batch is the reference's all-padding batch (its empty sample, put
    through the preprocess on the Python path), with the recovery metadata saying so."""
    fx = write_fixture(str(tmp_path / "data"), rows=20, max_len=MAX_LEN, missing=tuple(range(20)))
    topology(0, 1, via_env=False)
    ref_train, _ = reference_loaders(base_args(fx))
    train, _ = our_loaders(base_args(fx, num_workers=2))
    got, expected = iterate(train), iterate(ref_train)
    assert len(got) == len(expected) > 0
    for k, (a, b) in enumerate(zip(got, expected)):
        assert_same(a, b, f"all-failed batch {k}")


def test_a_resume_state_of_another_split_is_refused_in_the_references_names(fixture, topology):
    topology(0, 1, via_env=False)
    train, _ = our_loaders(base_args(fixture, train_data_ratio=0.8))
    train.batch_sampler.set_epoch(0)
    next(iter(train))
    state = json.loads(json.dumps(train.state_dict()))  # as a trainer saves it
    train.close()
    assert (state["split"], state["train_ratio"], state["dataset_rows"]) == ("train", 0.8, 60)

    other, _ = our_loaders(base_args(fixture, train_data_ratio=0.75))
    with pytest.raises(ValueError) as refused:
        other.load_state_dict(state)
    assert str(refused.value) == (
        "state_dict was saved with train_data_ratio=0.8, this loader has train_data_ratio=0.75: its "
        "batch positions are another plan's (a state resumes only the plan it was saved from)"
    )
    reseeded, _ = our_loaders(base_args(fixture, seed=7))
    with pytest.raises(ValueError, match=r"saved with seed=42, this loader has seed=7: "):
        reseeded.load_state_dict(state)
    same, _ = our_loaders(base_args(fixture, train_data_ratio=0.8))
    same.load_state_dict(state)  # the same arguments: accepted
