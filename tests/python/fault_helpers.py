"""Shared pieces of the fault campaign (tests/python/test_fault_*.py): the simulated server, what a
cached file must hold, and running a process as root without its power to ignore permissions."""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
from sim_vllm_process import SimServerProcess  # noqa: E402
from sim_vllm_server import hidden_states_for  # noqa: E402

__all__ = ["SimServerProcess", "cache_problem", "hidden_states_for", "other_file_system",
           "without_permission_bypass"]


def other_file_system(than: Path) -> Path | None:
    """A fresh folder on another file system than `than` (under /dev/shm), or None. The caller
    removes it."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(than).st_dev:
        return None
    try:
        return Path(tempfile.mkdtemp(prefix="draftfeed_test_", dir=shm))
    except OSError:
        return None


def cache_problem(path: Path, ids: np.ndarray, layers: int, hidden: int, seed: int) -> str | None:
    """Why `path` is not the complete cached sample of a row with `ids` (read with `safetensors`,
    values compared with the simulated server's formula), or None when it is."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        return f"unreadable: {error}"
    if set(tensors) != {"token_ids", "hidden_states"}:
        return f"keys {sorted(tensors)}"
    if not np.array_equal(tensors["token_ids"].numpy(), ids):
        return "token ids differ"
    expected = hidden_states_for(ids, layers, hidden, seed)
    if tuple(tensors["hidden_states"].shape) != expected.shape:
        return f"shape {tuple(tensors['hidden_states'].shape)}"
    if not np.array_equal(tensors["hidden_states"].float().numpy(), expected):
        return "values differ"
    return None


_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _PR_CAPBSET_DROP = 1, 2, 24


def without_permission_bypass() -> Callable[[], None] | None:
    """A preexec_fn that makes a child process obey file permissions: as root (CI), the child keeps
    uid 0 (so Python and the installed package stay readable) but loses CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH from its bounding set, so a mode-000 file or folder refuses it as it would
    refuse any user. Not root: None (permissions already apply)."""
    if os.geteuid() != 0:
        return None

    def drop() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) refused")

    return drop
