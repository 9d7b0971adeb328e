"""torch's side of CUDA for the loaders: which device a `device` argument names, torch imported
before the engine looks for a runtime, device memory from torch's caching allocator (kept until the
engine gave every block back) and the consumer's stream.

The rank's device ("cuda" with no index, or no `device` at all) is resolved in one place, by the
engine (src/draftfeed/cuda/cuda_runtime.cc, resolve_cuda_device: LOCAL_RANK as torchrun sets it,
else 0): Python hands it -1.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from typing import Any

from . import _core

# -1: the rank's device, as the engine resolves it.
RANK_DEVICE = -1


def device_index(device: Any) -> int:
    """The CUDA device index a `device` argument names: "cuda:N", an int, a torch.device of type
    cuda; "cuda" (or a torch.device without an index) is RANK_DEVICE."""
    if isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        kind, _, number = str(device).partition(":")
        if kind != "cuda":
            raise ValueError(f"device must be a CUDA device ('cuda:N'), got {device!r}")
        if not number:
            return RANK_DEVICE
        index = int(number)
    if index < 0:
        raise ValueError(f"device index must be >= 0, got {device!r}")
    return index


def _torch_cuda() -> Any:
    """torch.cuda when torch is imported and has a device; else None."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    return cuda if cuda is not None and cuda.is_available() else None


def current_torch_device() -> int:
    """The device torch made current in this process when it has initialised CUDA; else
    RANK_DEVICE."""
    cuda = _torch_cuda()
    if cuda is None or not cuda.is_initialized():
        return RANK_DEVICE
    return int(cuda.current_device())


def import_torch_first() -> None:
    """Imports torch (when installed) before the engine looks for the CUDA runtime, so that the
    runtime it finds is the one torch loaded (one runtime in the process, torch's allocator for the
    device stage's memory), not one from the library path beside it."""
    if "torch" in sys.modules or os.environ.get("DRAFTFEED_CUDART"):
        return
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401


def consumer_stream(device: int) -> int:
    """The CUDA stream this thread's work on `device` goes to (torch's current stream), as the
    runtime's handle; 0 (the default stream) when torch has not initialised CUDA here. Copies the
    consumer makes of a batch (`.to(device, non_blocking=True)`) are queued there: the engine marks
    their reads on it when the batch is released, and makes it wait for a device batch's copy."""
    cuda = _torch_cuda()
    if device < 0 or cuda is None or not cuda.is_initialized():
        return 0
    return int(cuda.current_stream(device).cuda_stream)


def warn_if_pageable(core: _core.Loader) -> None:
    """pin_memory asked, torch sees a GPU, but the engine found no runtime to page-lock with."""
    torch = sys.modules.get("torch")
    if _torch_cuda() is not None and getattr(getattr(torch, "version", None), "cuda", None):
        logging.getLogger("draftfeed").warning(
            "pin_memory: batch buffers are pageable although torch sees a CUDA device: %s",
            core.pinning)


def torch_device_blocks(nbytes: int, count: int, device: int) -> tuple[list[tuple[int, int]], Any] | None:
    """`count` blocks of `nbytes` on cuda:`device` from torch's caching allocator, as [(address,
    bytes)] and the tensors that own them; None without torch's CUDA, or when the engine drives
    another runtime than torch's (DRAFTFEED_CUDART: the tests' stand-in)."""
    torch: Any = sys.modules.get("torch")
    if _torch_cuda() is None or os.environ.get("DRAFTFEED_CUDART"):
        return None
    tensors = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}") for _ in range(count)]
    return [(int(t.data_ptr()), nbytes) for t in tensors], tensors


# Device memory given to the engine by loaders that are gone, with the tensors that own it: kept
# until the engine gave every block back (a batch may outlive its loader, and the device may still
# read a block when the loader goes).
_RETIRED: list[tuple[Any, Any]] = []


def _retire(memory: Any, owners: Any) -> None:
    _RETIRED.append((memory, owners))
    _sweep()


def _sweep() -> None:
    _RETIRED[:] = [(m, o) for m, o in _RETIRED if m.outstanding]


def give_device_memory(owner: object, core: _core.Loader,
                       made: tuple[list[tuple[int, int]], Any] | None) -> Any:
    """Hands the blocks `made` (torch_device_blocks' result, or None for the engine's own
    cudaMalloc) to the engine for the device stage; they are kept while `owner` lives, and after,
    while the engine still holds a block. Returns the engine's DeviceMemory, or None."""
    _sweep()
    if made is None:
        return None
    blocks, owners = made
    memory = _core.DeviceMemory(blocks)
    core.set_device_memory(memory)
    weakref.finalize(owner, _retire, memory, owners)
    return memory
