"""Which Mooncake transfer the online source uses (docs/multi_host.md, "Which Mooncake transfer").

hs-connectors' own `MooncakeTransfer` (exactly that class: a subclass may read differently) is
replaced by draftfeed's native one, `_core.MooncakeTransfer`, with the same store settings (its
`store.config`: master, metadata server, segment and buffer sizes, protocol, device, local
hostname) and the same wait for a key (hs-connectors' `get_sample` defaults in force: timeout and
poll interval). It speaks the same key, manifest and error-marker format, and reads every row due
with `batch_get_into` into memory registered once, the GIL taken once per batch of keys.

Any other transfer object is called back per sample (python/bindings/python_transfer.h), and so is
hs-connectors' when `DRAFTFEED_MOONCAKE=python` is set (for comparisons: bench/bench_mooncake.py).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from . import _core

# hs-connectors' MooncakeStoreConfig fields that MooncakeDistributedStore.setup takes.
STORE_SETTINGS = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "device_name",
    "master_server_address",
)


def is_hs_connectors_mooncake(transfer: Any) -> bool:
    """`transfer` is exactly hs-connectors' MooncakeTransfer over its MooncakeHiddenStatesStore."""
    cls = type(transfer)
    store = getattr(transfer, "store", None)
    return (
        cls.__name__ == "MooncakeTransfer"
        and cls.__module__.split(".")[0] == "hs_connectors"
        and type(store).__name__ == "MooncakeHiddenStatesStore"
        and hasattr(store, "config")
    )


def key_wait(store: Any) -> tuple[float, float]:
    """(timeout, poll_interval) hs-connectors' get_sample would wait with: its defaults in force."""
    parameters = inspect.signature(type(store).get_sample).parameters
    return float(parameters["timeout"].default), float(parameters["poll_interval"].default)


def online_transfer(transfer: Any) -> Any:
    """The transfer the online source is given for `transfer`: the native Mooncake transfer for
    hs-connectors' MooncakeTransfer (unless DRAFTFEED_MOONCAKE=python), else `transfer` itself."""
    if transfer is None or not is_hs_connectors_mooncake(transfer):
        return transfer
    choice = os.environ.get("DRAFTFEED_MOONCAKE", "native")
    if choice == "python":
        return transfer
    if choice != "native":
        raise ValueError(f"DRAFTFEED_MOONCAKE must be 'native' or 'python', got {choice!r}")
    config = transfer.store.config
    timeout, poll = key_wait(transfer.store)
    return _core.MooncakeTransfer(
        **{name: getattr(config, name) for name in STORE_SETTINGS}, key_wait=timeout, poll_interval=poll
    )


__all__ = ["is_hs_connectors_mooncake", "key_wait", "online_transfer"]
