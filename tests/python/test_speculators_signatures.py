"""Every `create_train_val_loaders` call in circulation reaches the drop-in unchanged.

The trainers differ in what they pass (see dropin_helpers): speculators 0.9.0's passes `seed` and
none of noise_std / on_generate / fetch_threads / ...; the newest passes every parameter but `seed`;
the repository's older scripts/train.py has no retry arguments. Each call is made with exactly its
own keywords (never filtered) and must give the reference's batches, on every rank, with many ties
in the lengths (which the reference orders by numpy's unstable argsort).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from dropin_helpers import (
    REPOSITORY_SCRIPT_CALL,
    SEED_CALL,
    SPECULATORS_090_CALL,
    assert_same,
    installed_trainer_call,
    iterate,
    our_loaders,
    reference_loaders,
)
from reference_fixtures import write_fixture

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("both_paths")]

MAX_LEN = 64
CALLS = {"speculators 0.9.0": SPECULATORS_090_CALL, "seed": SEED_CALL,
         "scripts/train.py": REPOSITORY_SCRIPT_CALL}


@pytest.fixture(scope="module")
def ties(tmp_path_factory):
    """Five distinct lengths over 90 rows: almost every batch has ties."""
    path = str(tmp_path_factory.mktemp("ties") / "data")
    return write_fixture(path, rows=90, max_len=MAX_LEN, distinct=False, missing=(3,), seed=11)


def values(fx, call, **overrides):
    """One value per keyword of `call` (a trainer's exact argument set); the same values whatever the
    call, so calls that share meaning give the same batches."""
    every = dict(
        data_path=fx.path, total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16, noise_std=0.0,
        transfer=None, vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip",
        on_generate="delete", verifier_name_or_path="unused", request_timeout=5.0, max_retries=0,
        generation_validation_retries=2, max_consecutive_generation_failures=20,
        hidden_size=fx.hidden_size, num_target_layers=fx.layers - 1, num_workers=0,
        prefetch_factor=4, preprocess=None, train_data_ratio=0.8, fail_on_hidden_state_error=False,
        fetch_threads=1, dataloader_in_order=True, vllm_http_keepalive=True, max_train_batches=None,
        seed=42,
    )
    every.update(overrides)
    return {key: every[key] for key in call}


def test_the_installed_trainer_makes_the_090_call():
    assert installed_trainer_call() == set(SPECULATORS_090_CALL)


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_each_real_call_gives_the_reference_batches_on_every_rank(ties, topology, name, world_size):
    call = CALLS[name]
    # The reference (0.9.0) with its own trainer's call; a call without `seed` plans with seed 0.
    seed = 42 if "seed" in call else 0
    for rank in range(world_size):
        topology(rank, world_size, via_env=False)
        ref_train, ref_val = reference_loaders(values(ties, SPECULATORS_090_CALL, seed=seed))
        train, val = our_loaders(values(ties, call))
        for epoch in range(3):
            for ref, ours, split in ((ref_train, train, "train"), (ref_val, val, "val")):
                ref.batch_sampler.set_epoch(epoch)
                ours.batch_sampler.set_epoch(epoch)
                assert len(ours) == len(ref)
                for k, (a, b) in enumerate(zip(iterate(ours), iterate(ref), strict=True)):
                    assert_same(a, b, f"{name} R={world_size} r={rank} {split} epoch {epoch} batch {k}")


def test_seed_orders_the_training_split_and_validation_keeps_seed_0(ties, topology):
    topology(0, 1, via_env=False)
    plans = {}
    for seed in (0, 7):
        ref_train, ref_val = reference_loaders(values(ties, SPECULATORS_090_CALL, seed=seed))
        train, val = our_loaders(values(ties, SPECULATORS_090_CALL, seed=seed))
        for ref, ours in ((ref_train, train), (ref_val, val)):
            assert [b.tolist() for b in ours.batch_sampler._generate_batches(1)] == [
                b.tolist() for b in ref.batch_sampler._generate_batches(1)]
        plans[seed] = ([b.tolist() for b in train.batch_sampler._generate_batches(1)],
                       [b.tolist() for b in val.batch_sampler._generate_batches(1)])
    assert plans[0][0] != plans[7][0], "seed orders the training split"
    assert plans[0][1] == plans[7][1], "validation is planned with seed 0 whatever the seed"


def test_an_unknown_argument_is_a_type_error_naming_it(ties):
    with pytest.raises(TypeError, match="shuffle_buffer"):
        our_loaders(dict(values(ties, SEED_CALL), shuffle_buffer=3))


def test_arguments_a_call_leaves_out_take_the_references_defaults():
    from speculators.train.data import ArrowDataset
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    from draftfeed.speculators import create_train_val_loaders

    ours = {k: p.default for k, p in inspect.signature(create_train_val_loaders).parameters.items()}
    dataset = {k: p.default for k, p in inspect.signature(ArrowDataset.__init__).parameters.items()}
    sampler = inspect.signature(MultipackDistributedBatchSamplerV2.__init__).parameters
    # Where the installed reference has the parameter, its default.
    for name in ("generation_validation_retries", "max_consecutive_generation_failures"):
        assert ours[name] == dataset[name], name
    assert ours["seed"] == sampler["seed"].default == 0
    # Parameters 0.9.0 does not have: what 0.9.0 does without them (no noise, generated files
    # deleted after loading, one request per worker, in-order delivery, keep-alive connections).
    assert ours["noise_std"] == 0.0 and ours["on_generate"] == "delete"
    assert ours["fetch_threads"] == 1 and ours["dataloader_in_order"] is True
    assert ours["vllm_http_keepalive"] is True and ours["fail_on_hidden_state_error"] is False
    assert ours["max_train_batches"] is None and ours["train_data_ratio"] == 0.9
    # Every keyword any trainer passes is accepted, and only keywords are.
    union = set(SPECULATORS_090_CALL) | set(SEED_CALL) | set(REPOSITORY_SCRIPT_CALL)
    params = inspect.signature(create_train_val_loaders).parameters
    assert set(params) == union
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())


def test_sequence_parallel_ranks_get_their_groups_batches(ties):
    """With sequence parallelism (sp=2 over 4 ranks) the reference's loaders plan by data-parallel
    rank on every rank: both ranks of a group get the group's batches, and so do ours."""
    from speculators.train import distributed as dist_state

    names = ("_rank", "_world_size", "_sp_size", "_sp_rank", "_dp_size", "_dp_rank")
    saved = {name: getattr(dist_state, name) for name in names}
    try:
        for rank in range(4):
            dist_state._rank, dist_state._world_size = rank, 4
            dist_state._sp_size, dist_state._sp_rank = 2, rank % 2
            dist_state._dp_size, dist_state._dp_rank = 2, rank // 2
            ref_train, _ = reference_loaders(values(ties, SPECULATORS_090_CALL))
            train, _ = our_loaders(values(ties, SPECULATORS_090_CALL))
            got, expected = iterate(train), iterate(ref_train)
            assert len(got) == len(expected) > 0
            for k, (a, b) in enumerate(zip(got, expected)):
                assert_same(a, b, f"sp rank {rank} batch {k}")
    finally:
        for name, value in saved.items():
            setattr(dist_state, name, value)
