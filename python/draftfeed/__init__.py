"""draftfeed: a C++ data engine that feeds the training of speculative-decoding draft models."""

from __future__ import annotations

import os as _os

# A developer build (cmake -DDRAFTFEED_PYTHON=ON) leaves `_core*.so` in its build folder; pointing
# DRAFTFEED_DEV_BUILD at that folder lets `PYTHONPATH=python` use it without `pip install`.
if _os.environ.get("DRAFTFEED_DEV_BUILD"):
    __path__.append(_os.path.abspath(_os.environ["DRAFTFEED_DEV_BUILD"]))

from . import _core, online  # noqa: F401  (draftfeed._core, draftfeed.online)
from ._core import (
    DatasetSplit,
    DatasetWriter,
    FormatError,
    HiddenStateStore,
    TokenDataset,
    load_safetensors,
    open_dataset,
    permutation,
    plan_all_ranks,
    plan_batches,
    safetensors_metadata,
    synthetic_hidden_value,
    synthetic_row,
    validate_hidden_states,
    write_safetensors,
    write_synthetic_dataset,
    write_synthetic_hidden_states,
)
from .loader import Loader, Topology

__version__ = "0.1.0"
__all__ = [
    "DatasetSplit",
    "DatasetWriter",
    "FormatError",
    "HiddenStateStore",
    "Loader",
    "TokenDataset",
    "Topology",
    "__version__",
    "load_safetensors",
    "online",
    "open_dataset",
    "permutation",
    "plan_all_ranks",
    "plan_batches",
    "safetensors_metadata",
    "synthetic_hidden_value",
    "synthetic_row",
    "validate_hidden_states",
    "write_safetensors",
    "write_synthetic_dataset",
    "write_synthetic_hidden_states",
]
