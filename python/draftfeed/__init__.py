"""draftfeed: a C++ data engine that feeds the training of speculative-decoding draft models."""

from __future__ import annotations

import os as _os

# A developer build (cmake -DDRAFTFEED_PYTHON=ON) leaves `_core*.so` in its build folder; pointing
# DRAFTFEED_DEV_BUILD at that folder lets `PYTHONPATH=python` use it without `pip install`.
if _os.environ.get("DRAFTFEED_DEV_BUILD"):
    __path__.append(_os.path.abspath(_os.environ["DRAFTFEED_DEV_BUILD"]))  # noqa: F821

from . import _core  # noqa: E402
from ._core import FormatError  # noqa: E402

__version__ = "0.1.0"
__all__ = ["FormatError", "__version__"]


def _export(*names: str) -> None:
    """Re-export names of the compiled module."""
    for name in names:
        globals()[name] = getattr(_core, name)
        __all__.append(name)
_export("permutation", "plan_batches", "plan_all_ranks")
from .loader import Loader, Topology  # noqa: E402

__all__ += ["Loader", "Topology"]
_export("load_safetensors", "safetensors_metadata", "write_safetensors", "HiddenStateStore", "validate_hidden_states", "write_synthetic_hidden_states", "synthetic_hidden_value")
_export("open_dataset", "TokenDataset", "DatasetSplit", "DatasetWriter", "write_synthetic_dataset", "synthetic_row")
from . import online  # noqa: E402,F401  (draftfeed.online: OnlineSource, sync_failure)
