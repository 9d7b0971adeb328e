"""Every error a user can cause names the argument as the user wrote it: the reference's argument
names through the speculators drop-in, `Loader`'s own names through `draftfeed.Loader`, the flag
through the command line (never the engine's name for the option it sets)."""

from __future__ import annotations

import re

import pytest
import torch
from reference_fixtures import write_fixture

import draftfeed
from draftfeed.speculators import create_train_val_loaders

pytestmark = pytest.mark.timeout(300)

MAX_LEN = 96


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    return write_fixture(str(tmp_path_factory.mktemp("messages") / "data"), rows=24, max_len=MAX_LEN)


def reference_args(fx, **overrides):
    """speculators 0.9.0's trainer's call, with valid values."""
    args = dict(
        data_path=fx.path, total_seq_len=MAX_LEN, hidden_states_dtype=torch.bfloat16, transfer=None,
        vllm_endpoint="http://127.0.0.1:9/v1", on_missing="skip", verifier_name_or_path="unused",
        request_timeout=5.0, max_retries=0, generation_validation_retries=0,
        max_consecutive_generation_failures=3, hidden_size=fx.hidden_size,
        num_target_layers=fx.layers - 1, num_workers=0, prefetch_factor=4, preprocess=None,
        train_data_ratio=0.8, seed=42,
    )
    args.update(overrides)
    return args


def names(name: str) -> str:
    """A pattern for `name` as a whole word (train_ratio is not inside train_data_ratio)."""
    return rf"(?<![\w-]){re.escape(name)}(?![\w-])"


# (the reference's argument, a bad call's overrides, the engine's name for it, which must not show)
DROPIN_CASES = [
    ("train_data_ratio", dict(train_data_ratio=1.5), "train_ratio"),
    ("train_data_ratio", dict(train_data_ratio=0.0), "train_ratio"),
    ("num_workers", dict(num_workers=-1), "num_threads"),
    ("prefetch_factor", dict(prefetch_factor=-1), "prefetch"),
    ("dataloader_in_order", dict(dataloader_in_order=False, num_workers=0), "in_order"),
    ("fetch_threads", dict(fetch_threads=0), None),
    # 12 x 400 requests in flight: the message gives both, not the product as if it were fetch_threads.
    ("num_workers x fetch_threads", dict(num_workers=12, fetch_threads=400), None),
    ("max_train_batches", dict(max_train_batches=-1), "max_batches"),
    ("seed", dict(seed=-1), None),
    ("request_timeout", dict(request_timeout=-1.0), "retry_backoff"),
    ("vllm_endpoint", dict(vllm_endpoint="localhost:8000/v1", on_missing="generate"), None),
    ("preprocess", dict(preprocess="eagle3"), None),
    ("total_seq_len", dict(total_seq_len=0), "max_len"),
    ("hidden_size", dict(hidden_size=0), None),
    ("num_target_layers", dict(num_target_layers=0), None),
    ("hidden_states_dtype", dict(hidden_states_dtype=torch.float16), None),
    ("noise_std", dict(noise_std=-0.1), None),
    ("on_missing", dict(on_missing="often"), None),
    ("on_generate", dict(on_generate="keep"), None),
    ("max_retries", dict(max_retries=-1), None),
    ("generation_validation_retries", dict(generation_validation_retries=-1), None),
    ("max_consecutive_generation_failures", dict(max_consecutive_generation_failures=0), None),
    ("transfer", dict(transfer=object()), None),
    # Values of the wrong type, and the planner's bound.
    ("hidden_states_dtype", dict(hidden_states_dtype=None), None),
    ("total_seq_len", dict(total_seq_len=2**41), "max_len"),
    ("num_workers", dict(num_workers=2.0), None),
    ("fetch_threads", dict(fetch_threads=2.5), None),
    ("prefetch_factor", dict(prefetch_factor="4"), None),
    ("train_data_ratio", dict(train_data_ratio="0.9"), None),
    ("request_timeout", dict(request_timeout="5"), None),
]


@pytest.mark.parametrize("argument, overrides, internal", DROPIN_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(DROPIN_CASES)])
def test_dropin_errors_name_the_reference_argument(fixture, argument, overrides, internal):
    with pytest.raises((ValueError, TypeError)) as caught:
        create_train_val_loaders(**reference_args(fixture, **overrides))
    message = str(caught.value)
    assert re.search(names(argument), message), message
    if internal is not None:
        assert not re.search(names(internal), message), message


def test_dropin_train_data_ratio_reads_as_the_reference(fixture):
    """speculators 0.9.0's own message, word for word (its create_train_val_loaders)."""
    from speculators.train.dataloader import create_train_val_loaders as reference

    for ratio in (1.5, 0.0, 1.0, -0.2):
        with pytest.raises(ValueError) as ours:
            create_train_val_loaders(**reference_args(fixture, train_data_ratio=ratio))
        with pytest.raises(ValueError) as theirs:
            reference(**reference_args(fixture, train_data_ratio=ratio))
        assert str(ours.value) == str(theirs.value)


LOADER_CASES = [
    ("train_ratio", dict(train_ratio=1.5)),
    ("num_threads", dict(num_threads=0)),
    ("total_seq_len", dict(total_seq_len=0)),
    ("hidden_size", dict(hidden_size=0)),
    ("num_target_layers", dict(num_target_layers=0)),
    ("noise_std", dict(noise_std=-1.0)),
    ("max_batches", dict(max_batches=-1)),
    ("chunk_bytes", dict(chunk_bytes=0)),
    ("hidden_states_dtype", dict(hidden_states_dtype="int8")),
    ("split", dict(split="test")),
    ("on_missing", dict(on_missing="often")),
    ("preprocess", dict(preprocess="shift_batch")),
    ("world_size", dict(rank=2, world_size=2)),
    ("sp_size", dict(world_size=2, rank=0, sp_size=3)),
    ("device", dict(device="cpu")),
    ("hidden_states_dtype", dict(hidden_states_dtype=None)),
    ("total_seq_len", dict(total_seq_len=2**41)),
    ("num_threads", dict(num_threads="2")),
    ("in_order", dict(in_order=None)),
    ("seed", dict(seed=-1)),
]


@pytest.mark.parametrize("argument, overrides", LOADER_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LOADER_CASES)])
def test_loader_errors_name_its_argument(fixture, argument, overrides):
    args = dict(hidden_size=fixture.hidden_size, total_seq_len=MAX_LEN, split="train", train_ratio=0.8)
    args.update(overrides)
    with pytest.raises((ValueError, TypeError)) as caught:
        draftfeed.Loader(fixture.path, **args)
    message = str(caught.value)
    assert re.search(names(argument), message), message


# (command line after `draftfeed`, the flag the message must name, a name that must not show)
CLI_CASES = [
    (["bench", "{data}", "--train-ratio", "1.5"], "--train-ratio", "train_ratio"),
    (["bench", "{data}", "--threads", "0"], "--threads", "num_threads"),
    (["bench", "{data}", "--max-len", "0"], "--max-len", "total_seq_len"),
    (["bench", "{data}", "--noise-std", "-1"], "--noise-std", "noise_std"),
    (["bench", "{data}", "--seed", "-1"], "--seed", None),
    (["bench", "{data}", "--world-size", "0"], "--world-size", "world_size"),
    (["bench", "{data}", "--rank", "2"], "--rank", None),
    (["bench", "{data}", "--max-batches", "-1"], "--max-batches", "max_batches"),
    (["bench", "{data}", "--hidden-size", "0", "--layers", "4"], "--hidden-size", "hidden_size"),
    (["bench", "{data}", "--layers", "1", "--hidden-size", "16"], "--layers", "num_target_layers"),
    (["bench", "{data}", "--prefetch", "0"], "--prefetch", None),
    (["bench", "{data}", "--epochs", "-1"], "--epochs", None),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--fetch-threads", "0"], "--fetch-threads", "fetch_threads"),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--request-timeout", "-1"], "--request-timeout", "request_timeout"),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--retry-backoff", "-1"], "--retry-backoff", "retry_backoff"),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--max-retries", "-1"], "--max-retries", "max_retries"),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--generation-validation-retries", "-1"], "--generation-validation-retries",
     "generation_validation_retries"),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--max-consecutive-failures", "0"], "--max-consecutive-failures", "max_consecutive_generation_failures"),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--lock-timeout", "-1"], "--lock-timeout", "lock_timeout"),
    (["bench", "{data}", "--preprocess", "shift_batch"], "--preprocess", None),
    (["bench", "{data}", "--on-missing", "often"], "--on-missing", None),
    (["bench", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--hidden-size", "16", "--layers", "4",
      "--on-generate", "keep"], "--on-generate", None),
    (["bench", "{data}", "--endpoint", "localhost:8000/v1", "--hidden-size", "16", "--layers", "4"],
     "--endpoint", None),
    (["generate", "{data}", "--endpoint", "http://127.0.0.1:9/v1", "--layout", "wide"], "--layout", None),
    (["quantize", "{data}", "--out", "{tmp}/fp8", "--layout", "wide"], "--layout", None),
    (["plan", "{data}", "--world-size", "1", "--max-len", "0"], "--max-len", "max_len"),
    (["plan", "{data}", "--world-size", "1", "--max-len", "96", "--train-ratio", "1.5"], "--train-ratio",
     "train_ratio"),
    (["plan", "{data}", "--world-size", "1", "--max-len", "96", "--max-batches", "-1"], "--max-batches",
     "max_batches"),
    (["demo", "--out", "{tmp}/demo", "--rows", "4", "--hidden-size", "16", "--no-online", "--total-seq-len", "0"], "--total-seq-len", "total_seq_len"),
    (["demo", "--out", "{tmp}/demo", "--rows", "4", "--hidden-size", "16", "--no-online", "--threads", "0"], "--threads", "num_threads"),
    (["demo", "--out", "{tmp}/demo", "--rows", "4", "--hidden-size", "16", "--no-online", "--min-len", "64", "--max-len", "32"], "--min-len", "min_len"),
    (["synth", "{tmp}/synth", "--rows", "4", "--min-len", "64", "--max-len", "32"], "--min-len", "min_len"),
    (["synth", "{tmp}/synth", "--rows", "-1"], "--rows", None),
]


@pytest.mark.parametrize("argv, flag, internal", CLI_CASES,
                         ids=[f"{c[0][0]}{c[1]}-{i}" for i, c in enumerate(CLI_CASES)])
def test_cli_errors_name_the_flag(run_cli, fixture, tmp_path, argv, flag, internal):
    words = [word.format(data=fixture.path, tmp=tmp_path) for word in argv]
    proc = run_cli(*words, check=False, timeout=60)
    assert proc.returncode == 2, f"{words}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert re.search(names(flag), proc.stderr), proc.stderr
    if internal is not None:
        assert not re.search(names(internal), proc.stderr), proc.stderr
