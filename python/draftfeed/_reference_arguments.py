"""The drop-in's checks of the reference's own arguments, in the reference's names and words.

`create_train_val_loaders` maps several of its arguments onto engine options of other names and
values (`train_data_ratio` -> `train_ratio`, `num_workers` -> threads and requests in flight,
`max_train_batches` -> `max_batches`, ...). A value the engine would refuse under its own name is
refused here first, naming the argument the user wrote: the reference's wording where the reference
(or the torch DataLoader under it) has one, e.g. "train_data_ratio must be in (0, 1), got 1.5".
Arguments that reach the engine under the same name (`total_seq_len`, `hidden_size`, `noise_std`,
`max_retries`, `on_missing`, ...) are checked by the engine's options, whose messages name them.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

# The most requests in flight the vLLM client takes (src/draftfeed/online/vllm_client.cc).
MAX_REQUESTS_IN_FLIGHT = 4096


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_reference_arguments(
    *,
    train_data_ratio: float,
    num_workers: int,
    prefetch_factor: int | None,
    dataloader_in_order: bool,
    fetch_threads: int,
    max_train_batches: int | None,
    seed: int,
    request_timeout: float | None,
    vllm_endpoint: str,
    on_missing: str,
    preprocess: Callable | None,
) -> None:
    """Raises ValueError (TypeError for a wrong type) naming the first bad argument."""
    if not (_is_number(train_data_ratio) and 0.0 < train_data_ratio < 1.0):
        # speculators 0.9.0's create_train_val_loaders, word for word.
        raise ValueError(f"train_data_ratio must be in (0, 1), got {train_data_ratio}")
    if not _is_int(num_workers):
        raise TypeError(f"num_workers must be an integer, got {num_workers!r}")
    if num_workers < 0:
        # torch's DataLoader, which the reference hands num_workers to.
        raise ValueError(
            "num_workers option should be non-negative; use num_workers=0 to disable "
            f"multiprocessing (got {num_workers})"
        )
    if prefetch_factor is not None and not _is_int(prefetch_factor):
        raise TypeError(f"prefetch_factor must be None or an integer, got {prefetch_factor!r}")
    if prefetch_factor is not None and prefetch_factor < 0:
        raise ValueError(f"prefetch_factor must be >= 0, got {prefetch_factor}")
    if not dataloader_in_order and num_workers <= 0:
        raise ValueError("dataloader_in_order=False requires num_workers > 0")
    if not _is_int(fetch_threads):
        raise TypeError(f"fetch_threads must be an integer, got {fetch_threads!r}")
    if fetch_threads < 1:
        raise ValueError(f"fetch_threads must be >= 1, got {fetch_threads}")
    if max(1, num_workers) * fetch_threads > MAX_REQUESTS_IN_FLIGHT:
        raise ValueError(
            f"num_workers x fetch_threads ({num_workers} x {fetch_threads}: the requests in "
            f"flight, one fetch_threads pool per worker as in the reference) must be at most "
            f"{MAX_REQUESTS_IN_FLIGHT}"
        )
    if max_train_batches is not None and (not _is_int(max_train_batches) or max_train_batches < 0):
        raise ValueError(f"max_train_batches must be None or >= 0, got {max_train_batches!r}")
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2^64), got {seed!r}")
    if request_timeout is not None and not (_is_number(request_timeout) and request_timeout >= 0):
        raise ValueError(f"request_timeout must be None or >= 0 seconds, got {request_timeout}")
    if on_missing == "generate" and not str(vllm_endpoint).startswith(("http://", "https://")):
        raise ValueError(
            "vllm_endpoint must start with http:// or https:// (e.g. http://host:8000/v1), "
            f"got {vllm_endpoint!r}"
        )
    if preprocess is not None and not callable(preprocess):
        raise TypeError(f"preprocess must be None or a callable, got {type(preprocess).__name__}")
