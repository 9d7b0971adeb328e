"""FP8 hidden-state files written by hs-connectors itself: its FP8HiddenStatesConnector's own
`_write_tensors` (quantize_tensor_to_fp8 + safetensors' save_file), not by our writer.

The connector module imports vLLM (its base class) at import time; vLLM is not installed in the test
environment, so `fp8_connector()` imports it with a stand-in for that one base-class module. Only the
base class is replaced; `_write_tensors` is hs-connectors' code as installed.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

import torch

_VLLM_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"


def fp8_connector():
    """hs_connectors.fp8_hidden_states_connector.FP8HiddenStatesConnector."""
    name = "hs_connectors.fp8_hidden_states_connector"
    if name in sys.modules:
        return sys.modules[name].FP8HiddenStatesConnector
    parts = _VLLM_BASE.split(".")
    added = []
    for i in range(1, len(parts) + 1):
        module = ".".join(parts[:i])
        if module not in sys.modules:
            sys.modules[module] = types.ModuleType(module)
            added.append(module)
    if not hasattr(sys.modules[_VLLM_BASE], "ExampleHiddenStatesConnector"):
        sys.modules[_VLLM_BASE].ExampleHiddenStatesConnector = type("ExampleHiddenStatesConnector", (), {})
    for i in range(1, len(parts)):
        setattr(sys.modules[".".join(parts[:i])], parts[i], sys.modules[".".join(parts[: i + 1])])
    try:
        return importlib.import_module(name).FP8HiddenStatesConnector
    finally:
        for module in added:  # leave no fake vLLM behind for other tests
            sys.modules.pop(module, None)


class _DoneEvent:
    """The CUDA event the connector waits on before writing (already complete on CPU)."""

    def synchronize(self) -> None:
        pass


def write_fp8_file(path: str, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> None:
    """The file FP8HiddenStatesConnector writes for these tensors."""
    fp8_connector()._write_tensors(
        {"hidden_states": hidden_states, "token_ids": token_ids}, _DoneEvent(), os.fspath(path), None
    )


def convert_cache_with_connector(hidden_dir: str, rows, out_dir: str | None = None) -> None:
    """Rewrites the rows' bf16 files (in place, or into `out_dir`) as the FP8 connector would have
    written them from the same hidden states."""
    from safetensors.torch import load_file

    out_dir = out_dir or hidden_dir
    os.makedirs(out_dir, exist_ok=True)
    for row in rows:
        source = os.path.join(hidden_dir, f"hs_{row}.safetensors")
        if not os.path.exists(source):
            continue
        tensors = load_file(source)
        write_fp8_file(os.path.join(out_dir, f"hs_{row}.safetensors"), tensors["hidden_states"], tensors["token_ids"])
