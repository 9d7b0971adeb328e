"""Running the reference entry point and ours on the same arguments, and comparing their batches.

The reference is called exactly as a real trainer calls it, never with arguments filtered or adapted
to what it accepts (that is how a drop-in that crashed on first contact passed every test once). The
installed reference is speculators 0.9.0, so `reference_loaders` takes exactly the keywords 0.9.0's
trainer passes; a test that needs an argument of another version gives it to draftfeed only.
"""

from __future__ import annotations

import ast
import inspect
import warnings

import torch

# The keyword arguments each trainer in circulation passes to create_train_val_loaders, exactly.
# speculators 0.9.0 (PyPI), speculators/train/cli.py; test_speculators_signatures.py checks this
# list against the installed trainer's source.
SPECULATORS_090_CALL = (
    "data_path", "total_seq_len", "hidden_states_dtype", "transfer", "vllm_endpoint", "on_missing",
    "verifier_name_or_path", "request_timeout", "max_retries", "generation_validation_retries",
    "max_consecutive_generation_failures", "hidden_size", "num_target_layers", "num_workers",
    "prefetch_factor", "preprocess", "train_data_ratio", "seed",
)
# The newest entry point (speculators' main branch, src/speculators/train/dataloader.py): its
# trainer passes every parameter.
SEED_CALL = (
    "data_path", "total_seq_len", "hidden_states_dtype", "noise_std", "transfer", "vllm_endpoint",
    "on_missing", "on_generate", "verifier_name_or_path", "request_timeout", "max_retries",
    "generation_validation_retries", "max_consecutive_generation_failures", "hidden_size",
    "num_target_layers", "num_workers", "prefetch_factor", "preprocess", "train_data_ratio",
    "fail_on_hidden_state_error", "fetch_threads", "dataloader_in_order", "vllm_http_keepalive",
    "max_train_batches",
)
# The speculators repository's older scripts/train.py (no retries or failure-breaker arguments).
REPOSITORY_SCRIPT_CALL = (
    "data_path", "total_seq_len", "hidden_states_dtype", "noise_std", "transfer", "vllm_endpoint",
    "on_missing", "on_generate", "verifier_name_or_path", "request_timeout", "max_retries",
    "hidden_size", "num_target_layers", "num_workers", "prefetch_factor", "preprocess",
    "train_data_ratio",
)


def installed_trainer_call() -> set[str]:
    """The keywords of the create_train_val_loaders call in the installed speculators trainer."""
    import speculators.train.cli as cli

    tree = ast.parse(inspect.getsource(cli))
    calls = [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "create_train_val_loaders"
    ]
    assert len(calls) == 1, f"expected one create_train_val_loaders call, found {len(calls)}"
    return {keyword.arg for keyword in calls[0].keywords if keyword.arg is not None}


def reference_loaders(args):
    """The installed reference's loaders, called with `args` as speculators 0.9.0's trainer would."""
    from speculators.train.dataloader import create_train_val_loaders

    assert set(args) == set(SPECULATORS_090_CALL), (
        "the reference takes exactly its trainer's arguments: "
        f"extra {sorted(set(args) - set(SPECULATORS_090_CALL))}, "
        f"missing {sorted(set(SPECULATORS_090_CALL) - set(args))}"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_train_val_loaders(**args)


def trainer_args(fx, total_seq_len: int, **overrides) -> dict:
    """speculators 0.9.0's trainer's arguments for the fixture `fx` (offline: no server is asked; the
    trainer's default seed, the reference's num_workers 0), with `overrides`."""
    args = dict(
        data_path=fx.path,
        total_seq_len=total_seq_len,
        hidden_states_dtype=torch.bfloat16,
        transfer=None,
        vllm_endpoint="http://127.0.0.1:9/v1",
        on_missing="skip",
        verifier_name_or_path="unused",
        request_timeout=5.0,
        max_retries=0,
        generation_validation_retries=0,
        max_consecutive_generation_failures=3,
        hidden_size=fx.hidden_size,
        num_target_layers=fx.layers - 1,
        num_workers=0,
        prefetch_factor=4,
        preprocess=None,
        train_data_ratio=0.8,
        seed=42,  # the trainer's default
    )
    args.update(overrides)
    return args


# Which of the drop-in's two paths our_loaders takes (set by the `both_paths` fixture): "native"
# (speculators' own preprocess functions, or none, run inside the engine's copy) or "python" (the
# same preprocess wrapped in a callable the engine does not know: it runs in Python on each sample
# the engine prepared, and the engine packs the results). Both must give the same batches.
PATH = {"mode": "native"}


def _as_python_callable(preprocess):
    if preprocess is None:
        return lambda sample: sample
    return lambda sample: preprocess(sample)


def our_loaders(args):
    from draftfeed.speculators import create_train_val_loaders

    if PATH["mode"] == "python":
        args = dict(args, preprocess=_as_python_callable(args.get("preprocess")))
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


def assert_loaders_equal(ours: tuple, ref: tuple, context: str, epochs=(0, 1)) -> None:
    """The train loaders give the same batches in each of `epochs`, the val loaders in epoch 0."""
    (train, val), (ref_train, ref_val) = ours, ref
    for epoch in epochs:
        ref_train.batch_sampler.set_epoch(epoch)
        train.batch_sampler.set_epoch(epoch)
        assert len(train) == len(ref_train)
        for k, (a, b) in enumerate(zip(iterate(train), iterate(ref_train), strict=True)):
            assert_same(a, b, f"{context} train epoch {epoch} batch {k}")
    ref_val.batch_sampler.set_epoch(0)
    val.batch_sampler.set_epoch(0)
    for k, (a, b) in enumerate(zip(iterate(val), iterate(ref_val), strict=True)):
        assert_same(a, b, f"{context} val batch {k}")
