"""The slower path for a `preprocess` callable the engine does not know: samples are built as the
reference builds them (torch tensors per sample), the callable runs on each in Python, and a collate of
our own packs them into the reference's batch layout. Samples are loaded in a thread pool through the
native cache store, or through the given source (a Python transfer object, the online source); noise uses the engine's counter-based formula, so a batch is
the same here as on the native path.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _core
from .loader import Loader

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _splitmix64_array(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniform_noise(seed: int, epoch: int, row: int, tokens: int, width: int) -> np.ndarray:
    """The signed uniform draw s in (-1, 1) of every (token, element), float32 [tokens, width]: the
    engine's formula (src/draftfeed/batch/noise.h), so x + s * std equals the native path bit for bit."""
    key = _splitmix64(_splitmix64(_splitmix64(seed) ^ epoch) ^ row)
    with np.errstate(over="ignore"):
        t = np.arange(tokens, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        token_keys = _splitmix64_array(np.uint64(key) ^ t).astype(np.uint32)
        j = np.arange(width, dtype=np.uint32)
        y = token_keys[:, None] ^ ((j[None, :] // np.uint32(2)) * np.uint32(0x9E3779B9))
        x = (y ^ (y >> np.uint32(16))) * np.uint32(0x7FEB352D)
        bits = x ^ (x >> np.uint32(15))
    half = np.where((j % 2 == 0)[None, :], bits & np.uint32(0xFFFF), bits >> np.uint32(16))
    return (half.astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 32768.0) - np.float32(1.0)


def collate(samples: list[dict], max_len: int, dtype, planned: int, empty_sample: Callable[[], dict]):
    """Packs preprocessed samples into one row of `max_len` (the reference's batch layout, SPEC §5)."""
    import torch

    locally_empty = not samples
    if locally_empty:
        samples = [empty_sample()]
    out: dict[str, Any] = {}
    for key in samples[0]:
        if key == "lengths":
            continue
        first = samples[0][key]
        buffer_dtype = dtype if "hidden_states" in key else first.dtype
        buf = torch.zeros((max_len, *first.shape[1:]), dtype=buffer_dtype)
        offset = 0
        for sample in samples:
            rows = min(sample[key].shape[0], max_len - offset)
            buf[offset : offset + rows] = sample[key][:rows]
            offset += rows
            if offset == max_len:
                break
        out[key] = buf.unsqueeze(0)
    documents, used = [], 0
    for sample in samples:
        length = int(sample["lengths"][0])
        if length + used >= max_len:
            documents.append(max_len - used)
            break
        documents.append(length)
        used += length
    doc_ids = torch.full((max_len,), -1, dtype=torch.long)
    position = 0
    for k, length in enumerate(documents):
        doc_ids[position : position + length] = k
        position += length
    out["document_ids"] = doc_ids.unsqueeze(0)
    out["error_records"] = planned - (0 if locally_empty else len(samples))
    return out, locally_empty


@dataclass(frozen=True)
class _GenerationFailed:
    """A sample the online source could not generate (counted in the batch's recovery metadata)."""

    message: str
    fatal: bool = False


class PythonPreprocessLoader(Loader):
    """A Loader that runs an arbitrary per-sample `preprocess` callable in Python (slower)."""

    def __init__(self, data_path: str, *, preprocess: Callable[[dict], dict], source=None, **kwargs):
        super().__init__(data_path, preprocess="none", source=source, **kwargs)
        self._fp8_dequantize = str(kwargs.get("fp8_dequantize_dtype", "bfloat16")).replace("torch.", "")
        self._preprocess = preprocess
        self._store = _core.HiddenStateStore(self.hidden_states_path)
        self._dataset = _core.open_dataset(data_path)

    def _load(self, row: int):
        import torch

        if self._source is not None:
            return self._load_from_source(row)
        found = self._store.lookup(row)
        if found is None:
            if self.on_missing == "raise":
                raise RuntimeError(f"row {row}: no cached hidden states at {self._store.path_for(row)}")
            return None
        ids = np.asarray(found["token_ids"])
        if not np.array_equal(ids, self._dataset.row(row)["input_ids"]):
            return None
        hs = np.asarray(found["hidden_states"])
        if "hidden_states_scales" in found or found.get("hidden_states_dtype") == "F8_E4M3":
            # hs-connectors' FP8 file: checked (scales, shape) and dequantized as FP8Transfer does.
            check = _core.validate_hidden_states(found["path"], np.ascontiguousarray(ids, dtype=np.int64), row)
            if not check["ok"]:
                return None
            raw, name = _core.fp8_dequantize(
                np.ascontiguousarray(hs).reshape(-1), np.asarray(found["hidden_states_scales"]).reshape(-1),
                self._fp8_dequantize)
            tensor = torch.frombuffer(bytearray(raw), dtype=getattr(torch, name)).reshape(hs.shape)
            return torch.from_numpy(ids.copy()), tensor
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the mapping is read-only; we never write through it
            tensor = torch.from_numpy(hs)
        name = str(found.get("hidden_states_dtype", "")).upper()
        if name == "BF16":
            tensor = tensor.view(torch.bfloat16)
        return torch.from_numpy(ids.copy()), tensor

    def _load_from_source(self, row: int):
        """Through the given source (a Python transfer, the online source): its own checks and policy."""
        import torch

        ids = np.ascontiguousarray(self._dataset.row(row)["input_ids"], dtype=np.int64)
        got = self._source.fetch_native(row, ids)
        if not got["ok"]:
            if got["reason"] == "generation_failed":
                # Fatal or not, as on the native path: the batch's recovery metadata says so.
                return _GenerationFailed(got["message"], got["fatal"])
            if got["fatal"]:
                raise RuntimeError(got["message"])
            return None
        dtype = getattr(torch, got["dtype"])
        hs = torch.frombuffer(bytearray(got["hidden_bytes"]), dtype=dtype).reshape(got["shape"])
        return torch.from_numpy(ids.copy()), hs

    def _sample(self, epoch: int, row: int):
        import torch

        loaded = self._load(row)
        if loaded is None or isinstance(loaded, _GenerationFailed):
            return loaded
        ids, hs = loaded
        target = hs[:, :-1].flatten(1)
        if self.noise_std > 0:
            u = uniform_noise(self.seed, epoch, row, target.shape[0], target.shape[1])
            noisy = target.to(torch.float32).numpy() + u * np.float32(self.noise_std)
            target = torch.from_numpy(noisy)
        mask = torch.from_numpy(np.asarray(self._dataset.row(row)["loss_mask"]).astype(np.int64))
        sample = {
            "hidden_states": target,
            "input_ids": ids,
            "verifier_last_hidden_states": hs[:, -1],
            "loss_mask": mask,
            "lengths": torch.tensor([ids.shape[0]], dtype=torch.long),
            "position_ids": torch.arange(ids.shape[0], dtype=torch.long),
        }
        return self._preprocess(sample)

    def _empty_sample(self):
        import torch

        dtype = getattr(torch, self.hidden_states_dtype)
        sample = {
            "hidden_states": torch.empty(0, self.num_target_layers * self.hidden_size, dtype=dtype),
            "input_ids": torch.empty(0, dtype=torch.long),
            "verifier_last_hidden_states": torch.empty(0, self.hidden_size, dtype=dtype),
            "loss_mask": torch.empty(0, dtype=torch.bool),
            "lengths": torch.tensor([0], dtype=torch.long),
            "position_ids": torch.arange(0, dtype=torch.long),
        }
        return self._preprocess(sample)

    def _deliver(self, epoch: int, batches: list[np.ndarray], todo: list[int]) -> Iterator[dict[str, Any]]:
        import torch

        from .speculators import _recovery_key, _recovery_metadata

        dtype = getattr(torch, self.hidden_states_dtype)
        with ThreadPoolExecutor(max_workers=max(1, self.num_threads)) as pool:
            for index in todo:
                rows = [int(r) + self.split_begin for r in batches[index]]
                results = list(pool.map(lambda r: self._sample(epoch, r), rows))
                failed = [s for s in results if isinstance(s, _GenerationFailed)]
                fatal = next((s.message for s in failed if s.fatal), None)
                samples = [s for s in results if s is not None and not isinstance(s, _GenerationFailed)]
                out, empty = collate(samples, self.total_seq_len, dtype, len(rows), self._empty_sample)
                if failed or empty:
                    # As the native path: the trainer's recovery logic sees generation failures.
                    out[_recovery_key()] = _recovery_metadata(
                        len(failed), empty, fatal is not None, fatal or ""
                    )
                self._delivered.add(index)
                yield out
