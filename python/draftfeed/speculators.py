"""A drop-in for `speculators.train.dataloader.create_train_val_loaders`.

Replace

    from speculators.train.dataloader import create_train_val_loaders

with

    from draftfeed.speculators import create_train_val_loaders

and the trainer gets loaders that yield the same batches (keys, shapes, dtypes, values; see
docs/formats.md, "One batch"), with
the same sampler surface (`batch_sampler.set_epoch`, `_generate_batches`, `_cached_generated_batches`
for the mid-epoch fast-skip), from one process with threads instead of worker processes.

How the reference's arguments map:
- `num_workers` -> engine threads (at least 1); `prefetch_factor` -> batch buffers in the pool
  (at least 2). The reference keeps num_workers x prefetch_factor batches in flight; the engine
  parallelises inside a batch, so it needs far fewer buffers.
- `dataloader_in_order` -> delivery order (`False` needs `num_workers > 0`, as in the reference).
- `preprocess`: speculators' own `shift_batch` (EAGLE-3, P-EAGLE) and `shift_batch_mtp` run natively in
  the copy; any other callable runs in Python on each sample the engine fetched, validated, cast and
  noised (views of the engine's buffer), and the engine packs what it returns (`_core.pack_samples`).
- `transfer`: None, an hs-connectors `FileTransfer` or `FP8Transfer` use the native cache store (its
  folder): FP8 files (F8_E4M3 + per-token scales, alone or mixed with bf16 files) are dequantized inside
  the batch copy exactly as `FP8Transfer` does, in its `dequantize_dtype` (bf16, f16 or f32).
  hs-connectors' `MooncakeTransfer` with `on_missing="generate"` is read natively (`draftfeed.mooncake`:
  its store settings, batched reads into registered memory; docs/multi_host.md). Any other
  object with the transfer interface (a custom one) is called back
  from C++ per sample (slower: it holds the GIL per call): `get_cached` offline, and with
  `on_missing="generate"` also `setup`, `get_generated` after each request, then `cache` (when it has one
  and on_generate="cache") or `delete`.
- every argument is checked before anything runs, the error naming it as the caller wrote it (the
  reference's names: `_reference_arguments.py` for those the engine knows by another name), the
  online ones whether or not rows are generated; `on_missing="generate"` builds the online source.
- `pin_memory` (the reference's DataLoader pins whenever CUDA is available): with CUDA the batches are
  CUDA tensors on cuda:$LOCAL_RANK, copied ahead of the trainer by the device stage (its `.to()` is then
  a no-op); `DRAFTFEED_DEVICE_STAGE=0` keeps them in page-locked host memory (docs/device_stage.md).
- `DRAFTFEED_SERVER_DIR` (environment; the reference's signature has no room for it): the folder the
  vLLM servers write into. Handles resolving outside it are refused, and generated files in it are
  deleted (or moved into the cache) as the reference does. Without it handles are read from anywhere,
  but a file outside the cache folder is never deleted or moved: it stays where the server wrote it.
- `DRAFTFEED_PACK_BUDGET` (environment): with `on_generate="cache"`, the generated rows are kept,
  compressed, in the cache folder's pack within this many bytes ("500GB", "1.5TiB", or "unlimited")
  instead of one file per row; the rows beyond the budget are generated again every epoch
  (docs/protocol.md, "Generated rows kept in a pack"). `on_generate="delete"` keeps its meaning.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, Literal, cast

from . import _core
from ._reference_arguments import check_reference_arguments
from .loader import Loader, Topology
from .mooncake import online_transfer

logger = logging.getLogger(__name__)

BatchType = dict[str, Any]


def _recovery_metadata(failure_count: int, locally_empty: bool, fatal: bool, error: str):
    """The reference's `RecoveryMetadata` when speculators is importable (the trainer checks its type),
    else an equivalent frozen dataclass of ours."""
    try:
        from speculators.train.recovery import RecoveryMetadata
    except ImportError:  # pragma: no cover - exercised only without speculators installed
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class RecoveryMetadata:  # type: ignore[no-redef]
            failure_count: int = 0
            locally_empty: bool = False
            fatal: bool = False
            error: str = ""

    return RecoveryMetadata(
        failure_count=failure_count, locally_empty=locally_empty, fatal=fatal, error=error
    )


def _recovery_key() -> str:
    try:
        from speculators.train.recovery import RECOVERY_METADATA_KEY

        return RECOVERY_METADATA_KEY
    except ImportError:  # pragma: no cover
        return "__recovery__"


def _native_preprocess(preprocess: Callable | None) -> str | None:
    """The engine's name for one of speculators' own preprocess functions, or None for any other."""
    if preprocess is None:
        return "none"
    for module, name, native in (
        ("speculators.models.eagle3.data", "shift_batch", "eagle3"),
        ("speculators.models.mtp.data", "shift_batch_mtp", "mtp"),
    ):
        if getattr(preprocess, "__module__", None) == module and getattr(preprocess, "__name__", None) == name:
            return native
    return None


def _topology() -> Topology:
    """The reference's DP/SP placement: speculators' distributed state when it was set up, else the
    torchrun environment (RANK, WORLD_SIZE, and SP_SIZE if set)."""
    try:
        from speculators.train import distributed as dist_state

        sp, dp_size = dist_state.get_sp_size(), dist_state.get_dp_size()
        if sp * dp_size > 1:
            rank = dist_state.get_dp_rank() * sp + dist_state.get_sp_rank()
            return Topology(rank, dp_size * sp, sp)
    except ImportError:
        pass
    return Topology.resolve(None, None, int(os.environ.get("SP_SIZE", "1")))


# The dtypes FP8Transfer's dequantize can take that the native copy reproduces bit for bit.
_NATIVE_DEQUANTIZE = ("bfloat16", "float16", "float32")


def _is_hs_connectors(transfer: Any, name: str) -> bool:
    """`transfer` is exactly hs-connectors' class `name` (a subclass may override get_cached)."""
    cls = type(transfer)
    return cls.__name__ == name and cls.__module__.split(".")[0] == "hs_connectors"


def _hidden_states_path(data_path: str, transfer: Any) -> tuple[str, Any, str]:
    """(cache folder, transfer to call back or None, dtype FP8 files are dequantized in).

    None, a `FileTransfer` and an `FP8Transfer` (whose dequantize dtype the native copy reproduces)
    read the cache natively; FP8 files in it (alone or mixed with bf16 ones) are dequantized in the
    batch copy exactly as `FP8Transfer.get_cached` does. Without an FP8Transfer the reference would
    not dequantize FP8 files at all (their values would reach the batch unscaled); the native store
    always applies the scales, in bf16 as FP8Transfer's default."""
    if transfer is None:
        return _core.default_hidden_states_path(data_path), None, "bfloat16"
    if type(transfer).__name__ == "FileTransfer" and hasattr(transfer, "hidden_states_path"):
        return str(transfer.hidden_states_path), None, "bfloat16"
    if _is_hs_connectors(transfer, "FP8Transfer") and hasattr(transfer, "hidden_states_path"):
        dequantize = str(getattr(transfer, "dequantize_dtype", "bfloat16")).replace("torch.", "")
        if dequantize in _NATIVE_DEQUANTIZE:
            return str(transfer.hidden_states_path), None, dequantize
    for method in ("get_cached",):
        if not callable(getattr(transfer, method, None)):
            raise TypeError(f"transfer {type(transfer).__name__} has no {method}() method")
    return _core.default_hidden_states_path(data_path), transfer, "bfloat16"


class SpeculatorsLoader(Loader):
    """A `Loader` whose batches carry the reference's extra keys: `error_records` (samples dropped from
    the batch) and, when a sample failed generation or every sample failed, the recovery metadata,
    with `fatal=True` once the online source has failed for good (too many rows failed in a row,
    or fail_on_hidden_state_error): the trainer's recovery coordinator then stops every rank
    together, as with the reference. Drops and failed attempts are reported as the reference
    reports them: sample drops through `warnings`, generation failures on the "speculators"
    logger (both rate-limited)."""

    # load_state_dict names the reference's arguments.
    _state_key_names: ClassVar[dict[str, str]] = {"train_ratio": "train_data_ratio"}

    def _make_batch(self, batch: _core.Batch) -> BatchType:
        out = self._tensors(batch)
        # The reference counts the samples that failed, not valid ones cut off at total_seq_len.
        out["error_records"] = int(sum(batch.dropped.values()))
        if batch.failure_count or batch.locally_empty or batch.fatal:
            out[_recovery_key()] = _recovery_metadata(
                batch.failure_count, batch.locally_empty, batch.fatal, batch.fatal_message
            )
        return out

    def _emit_report(self, kind: str, message: str) -> None:
        if kind == "generation":
            logging.getLogger("speculators").warning("%s", message)
        else:
            warnings.warn(message, stacklevel=2)


def _device_stage(native_preprocess: str | None) -> str | None:
    """The device the drop-in delivers batches on, or None for host memory.

    The reference's DataLoader pins its batches whenever CUDA is available (`pin_memory=True`) and
    its trainer moves them with `.to(local_rank, non_blocking=True)`. The drop-in then copies each
    batch to that device itself, ahead of the trainer, on a stream of its own (the device stage), and
    the trainer's `.to()` does nothing. `DRAFTFEED_DEVICE_STAGE=0` keeps batches in (page-locked) host
    memory instead; a preprocess callable the engine does not know runs in Python on host memory, so
    its batches stay there too."""
    if os.environ.get("DRAFTFEED_DEVICE_STAGE", "1") == "0" or native_preprocess is None:
        return None
    try:
        import torch
    except ImportError:  # pragma: no cover - the drop-in is used from a torch trainer
        return None
    if not torch.cuda.is_available():
        return None
    return "cuda"  # the rank's device: the engine reads LOCAL_RANK (draftfeed/cuda.py)


PACK_BUDGET_ENV = "DRAFTFEED_PACK_BUDGET"


def _kept_in_a_pack(on_generate: str, python_transfer: Any) -> tuple[str, dict[str, Any]]:
    """The engine's on_generate and its pack options: DRAFTFEED_PACK_BUDGET turns the reference's
    on_generate="cache" into the engine's "pack" within that budget (the module docstring)."""
    budget = os.environ.get(PACK_BUDGET_ENV, "").strip()
    if not budget or on_generate != "cache":
        return on_generate, {}
    if python_transfer is not None:
        raise ValueError(
            f"{PACK_BUDGET_ENV}={budget} keeps generated rows in the cache folder's pack, but "
            f"transfer={type(python_transfer).__name__} keeps its samples itself: unset "
            f"{PACK_BUDGET_ENV}, or use on_generate='cache' without it")
    unlimited = budget.lower() in ("unlimited", "none", "0")
    return "pack", {"cache_budget_bytes": None if unlimited else budget}


def create_train_val_loaders(
    *,
    data_path: str,
    total_seq_len: int,
    hidden_states_dtype: Any,
    noise_std: float = 0.0,
    transfer: Any = None,
    vllm_endpoint: str,
    on_missing: Literal["generate", "skip", "warn", "raise"],
    on_generate: Literal["cache", "delete"] = "delete",
    verifier_name_or_path: str | None,
    request_timeout: float | None,
    max_retries: int,
    generation_validation_retries: int = 2,
    max_consecutive_generation_failures: int = 20,
    hidden_size: int,
    num_target_layers: int,
    num_workers: int,
    prefetch_factor: int,
    preprocess: Callable[[BatchType], BatchType] | None,
    train_data_ratio: float = 0.9,
    fail_on_hidden_state_error: bool = False,
    fetch_threads: int = 1,
    dataloader_in_order: bool = True,
    vllm_http_keepalive: bool = True,
    max_train_batches: int | None = None,
    seed: int = 0,
) -> tuple[SpeculatorsLoader, SpeculatorsLoader]:
    """Create the training and validation loaders (see the module docstring)."""
    # The arguments the engine knows under other names or values are checked here, the message
    # naming the argument as the user wrote it; the others by the engine's options (a ValueError
    # naming the argument, whose name it shares).
    check_reference_arguments(
        train_data_ratio=train_data_ratio, num_workers=num_workers, prefetch_factor=prefetch_factor,
        dataloader_in_order=dataloader_in_order, fetch_threads=fetch_threads,
        max_train_batches=max_train_batches, seed=seed, request_timeout=request_timeout,
        vllm_endpoint=vllm_endpoint, on_missing=on_missing, preprocess=preprocess)

    hidden_states_path, python_transfer, fp8_dequantize = _hidden_states_path(data_path, transfer)
    engine_on_generate, keep = _kept_in_a_pack(on_generate, python_transfer)
    native = _native_preprocess(preprocess)
    topology = _topology()

    # The one mapping of the reference's arguments onto the engine's options: the online source's,
    # checked whether or not rows are generated (as the reference checks them), then the loader's.
    online = _core.OnlineSourceOptions(
        vllm_endpoint=vllm_endpoint,
        hidden_states_path=hidden_states_path,
        on_missing=on_missing,
        on_generate=engine_on_generate,
        verifier_name_or_path=verifier_name_or_path,
        request_timeout=request_timeout,
        max_retries=max_retries,
        generation_validation_retries=generation_validation_retries,
        max_consecutive_generation_failures=max_consecutive_generation_failures,
        fail_on_hidden_state_error=fail_on_hidden_state_error,
        # Each of the reference's workers holds its own copy of the dataset and of its
        # fetch_threads pool: num_workers x fetch_threads requests are in flight.
        fetch_threads=max(1, num_workers) * fetch_threads,
        vllm_http_keepalive=vllm_http_keepalive,
        # Not in the reference's signature: where the servers write, as a stricter confinement
        # (handles elsewhere are refused).
        server_dir=os.environ.get("DRAFTFEED_SERVER_DIR") or None,
        fp8_dequantize_dtype=fp8_dequantize,
        **keep,
    )
    online.validate()
    source: _core.SampleSource | None = None
    if on_missing == "generate":
        # data_path enables the lookahead: the epoch's rows are fetched ahead of the buffers.
        # hs-connectors' MooncakeTransfer is read natively (draftfeed.mooncake), any other
        # transfer called back per sample.
        source = _core.OnlineSource(online, data_path=data_path,
                                    transfer=online_transfer(python_transfer))
    elif python_transfer is not None:
        source = _core.python_transfer_source(python_transfer, on_missing)

    train = SpeculatorsLoader(
        data_path,
        # speculators' own preprocess functions run natively inside the copy; any other callable
        # runs in Python on each sample the engine prepared, and the engine packs its results.
        preprocess=native if native is not None else cast("Callable[[BatchType], BatchType]", preprocess),
        hidden_size=hidden_size,
        total_seq_len=total_seq_len,
        split="train",
        train_ratio=train_data_ratio,
        hidden_states_path=hidden_states_path,
        num_target_layers=num_target_layers,
        hidden_states_dtype=hidden_states_dtype,
        noise_std=noise_std,
        seed=seed,
        # The seed's loaders plan by data-parallel rank and every rank of a sequence-parallel
        # group loads its group's batches itself: so does every rank here.
        rank=topology.dp_rank,
        world_size=topology.dp_size,
        sp_size=1,
        num_threads=max(1, num_workers),  # the engine adds one per request in flight if online
        prefetch=max(2, prefetch_factor or 2),
        in_order=dataloader_in_order,
        max_batches=max_train_batches,
        on_missing="skip" if on_missing == "generate" else on_missing,
        source=source,
        fatal_failures_in_batch=True,
        fp8_dequantize_dtype=fp8_dequantize,
        device=_device_stage(native),
    )
    # As speculators 0.9.0, by the engine's one rule: validation has no noise, every batch, and
    # seed 0 whatever `seed` (runs with different seeds are validated on the same batches).
    return train, train.validation()


__all__ = ["SpeculatorsLoader", "create_train_val_loaders"]
