"""PyTorch-facing loaders over the C++ engine.

`Loader` yields `dict[str, torch.Tensor]` whose tensors view the engine's batch buffers without
copying (threads fetch and assemble the batches into a fixed pool of buffers). A buffer goes back
to the pool only when every tensor viewing it is gone.

The engine's loader (`_core.Loader`, src/draftfeed/loader/) is the epoch driver: it plans, tells
the source what to read ahead, with the multipack planner (identical to the reference sampler),
and keeps the resume state (`state_dict()` records which batches of
the epoch were delivered, whatever the delivery order; `load_state_dict()` makes the next iteration
yield exactly the others). This module is the iterator over it (torch's side of CUDA: cuda.py).
"""

from __future__ import annotations

import atexit
import logging
import os
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from . import _core, cuda
from .reporting import Reporter, report_drops, report_source_messages

_LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()
_L = TypeVar("_L", bound="Loader")


@atexit.register
def _stop_all_engines() -> None:
    # Interpreter exit mid-epoch: stop the worker threads before Python tears down.
    for engine in list(_LIVE_ENGINES):
        engine.stop()


@dataclass(frozen=True)
class Topology:
    """Data-parallel placement of this process (the reference's DP rank = rank // sp_size)."""

    rank: int
    world_size: int
    sp_size: int = 1

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.sp_size

    @property
    def is_data_rank(self) -> bool:
        """Only the first rank of a sequence-parallel group fetches data."""
        return self.rank % self.sp_size == 0

    @classmethod
    def resolve(cls, rank: int | None, world_size: int | None, sp_size: int = 1) -> Topology:
        """Arguments first, then the torchrun environment (RANK, WORLD_SIZE), then a single process."""
        if rank is None:
            rank = int(os.environ.get("RANK", "0"))
        if world_size is None:
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if sp_size < 1 or world_size % sp_size != 0:
            raise ValueError(f"world_size ({world_size}) must be divisible by sp_size ({sp_size})")
        return cls(rank, world_size, sp_size)


class BatchPlanner:
    """This rank's batches per epoch; the same attributes as the reference's batch sampler.

    `_generate_batches(epoch)` returns the epoch's batches (arrays of split-local sample indices,
    planned by the engine's loader with numpy's own argsort for ties, as the reference) and caches
    them in `_cached_generated_batches = (epoch, batches)`; a trainer may replace that cache with a
    slice to fast-skip batches on resume, exactly as with the reference. The epoch is the engine's.
    """

    def __init__(self, loader: _core.Loader, topology: Topology) -> None:
        options = loader.options
        self._loader = loader
        self.lengths = loader.lengths
        self.batch_max_length = options.total_seq_len
        self.num_replicas = topology.dp_size
        self.rank = topology.dp_rank
        self.seed = options.seed
        self.truncate = options.truncate
        self.max_batches = options.max_batches
        self._cached_generated_batches: tuple[int, list[np.ndarray]] = (-1, [])
        self._planned: list[np.ndarray] | None = None  # the engine's plan last cached

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(int(epoch))

    def _generate_batches(self, epoch: int) -> list[np.ndarray]:
        if self._cached_generated_batches[0] == epoch:
            return self._cached_generated_batches[1]
        batches = self._loader.plan(epoch)
        self._cached_generated_batches = (epoch, batches)
        self._planned = batches
        return batches

    def _replaced(self, epoch: int) -> list[np.ndarray] | None:
        """The epoch's batches when the trainer replaced the engine's plan in the cache, else None."""
        batches = self._generate_batches(epoch)
        return None if batches is self._planned else batches

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self._generate_batches(self.epoch))

    def __len__(self) -> int:
        return len(self._generate_batches(self.epoch))


class Loader:
    """Batches of one split of a dataset, packed, assembled and delivered by the C++ engine.

    Iterating yields `dict[str, torch.Tensor]` with the reference's keys, shapes and dtypes
    (docs/formats.md, "One batch").

    The cache may hold bf16, f16 or f32 files and hs-connectors' FP8 files (F8_E4M3 hidden states with
    per-token `hidden_states_scales`), mixed: FP8 values are dequantized in the batch copy exactly as
    `FP8Transfer(dequantize_dtype=fp8_dequantize_dtype)` does, then cast to `hidden_states_dtype`.
    """

    def __init__(
        self,
        data_path: str | os.PathLike,
        *,
        hidden_size: int,
        preprocess: str | Callable[[dict[str, Any]], dict[str, Any]] = "none",
        rank: int | None = None,
        world_size: int | None = None,
        sp_size: int = 1,
        source: _core.SampleSource | None = None,
        device: Any = None,
        **options: Any,
    ) -> None:
        """`options` are `_core.LoaderOptions`' fields by name: its properties say each one's
        meaning, and its C++ defaults apply to the others. An unknown name is a TypeError. `rank`
        and `world_size` are global (default: the torchrun environment); the loader plans by
        data-parallel rank.

        `device` ("cuda:N", "cuda" for the rank's LOCAL_RANK device, an int or a torch.device):
        the device stage. Batches are then CUDA tensors on that device, copied from the page-locked
        buffers on a stream of the engine's own ahead of the consumer (at most `device_buffers`
        batches in device memory); the consumer's stream waits for each batch's copy on the device.
        None (default): batches in host memory, page-locked when `pin_memory` and CUDA is present."""
        topology = Topology.resolve(rank, world_size, sp_size)
        if device is not None or options.get("pin_memory") is True:
            cuda.import_torch_first()
        for name in ("data_path", "source", "device_stage", "cuda_device"):
            if name in options:  # set from the arguments above
                raise TypeError(f"Loader() got an unexpected keyword argument {name!r}")
        core = _core.LoaderOptions(
            data_path=data_path, hidden_size=hidden_size,
            preprocess="custom" if callable(preprocess) else preprocess,
            rank=topology.dp_rank, world_size=topology.dp_size, source=source,
            device_stage=device is not None,
            cuda_device=cuda.current_torch_device() if device is None else cuda.device_index(device),
            **options)
        self._setup(core, topology, source, preprocess if callable(preprocess) else None)
        if source is not None and getattr(source, "reads_messages", True) is False and (
            "messages" in self._core.columns
        ):
            warnings.warn(
                f"{data_path} has a messages column but the online source was built without "
                "data_path: multimodal rows will be generated from their token ids alone (no "
                "images). Pass OnlineSource(..., data_path=...) to send them as chat requests.",
                stacklevel=2,
            )

    def _setup(self, options: _core.LoaderOptions, topology: Topology, source: Any,
               preprocess_fn: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        self._core = _core.Loader(options)
        _LIVE_ENGINES.add(self._core)
        # The options as the engine completed them (the cache folder's default; no noise outside
        # the training split): the one place Python reads settings from.
        self.options = options = self._core.options
        self.topology = topology
        self._source = source
        # A callable the engine does not know runs in Python on each sample the engine validated,
        # cast and noised; the engine packs what it returns (see _tensors).
        self._preprocess_fn = preprocess_fn
        self.split_begin, self.split_end = self._core.split_begin, self._core.split_end
        # The CUDA device the engine's buffers are pinned on or copied to (-1: no CUDA in use):
        # the consumer's stream on it is asked for at each batch.
        self.cuda_device = self._core.cuda_device
        self.device = f"cuda:{self.cuda_device}" if options.device_stage else "cpu"
        self._device_memory: Any = None
        if options.device_stage:
            self._give_device_memory()
        elif options.pin_memory and self.cuda_device < 0:
            cuda.warn_if_pageable(self._core)
        self.batch_sampler = BatchPlanner(self._core, topology)
        self.last_batch: _core.Batch | None = None
        self._reporter = Reporter(self._emit_report)

    def _device_memory_blocks(self, nbytes: int, count: int, device: int) -> tuple[list[tuple[int, int]], Any] | None:
        """The device stage's buffers: `count` blocks of `nbytes` on cuda:`device` and what owns
        them, or None for the engine's own cudaMalloc. Default: torch's caching allocator when
        torch has CUDA (a test's subclass gives its own)."""
        return cuda.torch_device_blocks(nbytes, count, device)

    def _give_device_memory(self) -> None:
        """Allocated once per loader, kept while the loader lives (and after, while the engine
        still holds a block: cuda.give_device_memory)."""
        made = self._device_memory_blocks(self._core.batch_bytes, self.options.device_buffers,
                                          self.cuda_device)
        self._device_memory = cuda.give_device_memory(self, self._core, made)

    def validation(self: _L) -> _L:
        """The validation loader of this training loader, by the engine's rule (one place for the
        command line and Python): the val split, no noise, every batch, planned with seed 0 so that
        runs with different seeds are validated on the same batches (speculators 0.9.0)."""
        val = object.__new__(type(self))
        val._setup(self.options.validation(), self.topology, self._source, self._preprocess_fn)
        return val

    # -- the DataLoader surface the reference trainer uses --
    def __len__(self) -> int:
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        epoch = self.batch_sampler.epoch
        replaced = self.batch_sampler._replaced(epoch)
        if not self.topology.is_data_rank:
            # Sequence-parallel ranks other than their group's data rank fetch nothing: the trainer
            # scatters the data rank's batch to them. They still take one step per batch.
            for position in self._core.begin_epoch(replaced, fetch=False):
                self._core.mark_delivered(position)
                yield None
            return
        self._core.begin_epoch(replaced)
        try:
            while True:
                try:
                    batch = self._core.next(cuda.consumer_stream(self.cuda_device))
                finally:
                    self._report_source()  # what went wrong reaches the log before any error
                if batch is None:
                    # The epoch is over: the loader holds none of its batches (their buffers, device
                    # memory with the device stage, go once the consumer's are gone).
                    self.last_batch = None
                    break
                self.last_batch = batch
                self._report_drops(batch)
                yield self._make_batch(batch)
        finally:
            self._core.stop()
            self._report_source()
            self._reporter.flush()

    def _make_batch(self, batch: _core.Batch) -> dict[str, Any]:
        return self._tensors(batch)

    def _tensors(self, batch: _core.Batch) -> dict[str, Any]:
        """The batch's tensors: views of the engine's buffer, or, with a preprocess callable, what
        the callable made of each sample, packed by the engine as the reference's collate packs."""
        if self._preprocess_fn is None:
            return batch.torch()
        samples = [self._preprocess_fn(sample) for sample in batch.samples()]
        if not samples:  # every sample failed: the reference's empty sample, preprocessed too
            samples = [self._preprocess_fn(batch.empty_sample())]
        samples = [
            {k: v.contiguous() if hasattr(v, "contiguous") else v for k, v in s.items()}
            if isinstance(s, dict) else s
            for s in samples
        ]
        return _core.pack_samples(samples, self.options.total_seq_len,
                                  self.options.hidden_states_dtype, self.options.pin_memory,
                                  cuda.consumer_stream(self.cuda_device), self.cuda_device)

    # -- what went wrong, said once (rate-limited: see reporting.py) --
    def _report_drops(self, batch: _core.Batch) -> None:
        """The batch's dropped samples, each with its reason. Missing files under on_missing="skip"
        are silent (as in the reference), and generation failures are said by the source."""
        report_drops(self._reporter, batch, self._silent_drops())

    def _silent_drops(self) -> tuple[str, ...]:
        silent: tuple[str, ...] = ("missing",) if self.options.on_missing == "skip" else ()
        if hasattr(self._source, "take_messages"):
            silent += ("generation_failed",)
        return silent

    def _report_source(self) -> None:
        report_source_messages(self._reporter, self._source)

    def _emit_report(self, kind: str, message: str) -> None:
        logging.getLogger("draftfeed").warning("%s", message)

    # -- exact resume (the engine's state) --
    def state_dict(self) -> dict[str, Any]:
        """Which batches of the current epoch were delivered; plain keys, JSON-serialisable."""
        return self._core.state()

    # The names the user wrote for the state's keys where they differ from the engine's (the
    # drop-in's reference arguments), for load_state_dict's refusals.
    _state_key_names: ClassVar[dict[str, str]] = {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration of `state['epoch']` yields exactly the batches not yet delivered.
        ValueError naming both values when `state` was saved by a loader of another plan (another
        split or train_ratio, dataset, world size or rank, total_seq_len, seed or truncate rule)."""
        self._core.restore(state, self._state_key_names)

    # -- what happened --
    def metrics(self) -> dict[str, Any]:
        m = self._core.metrics()
        if self.options.device_stage:
            memory = self._device_memory
            m["device_memory"] = "cudaMalloc" if memory is None else "given"
            m["device_memory_given_bytes"] = 0 if memory is None else memory.given_bytes
            m["device_memory_fallback_bytes"] = 0 if memory is None else memory.fallback_bytes
        m["pool_bytes"] = self._core.pool_bytes
        m["batch_bytes_each"] = self._core.batch_bytes
        return m

    @property
    def peak_memory_bytes(self) -> int:
        """Batch memory this loader can hold: prefetch depth x batch size (plus any extra buffers)."""
        return self._core.pool_bytes

    def close(self) -> None:
        self._core.close()  # what the source read ahead for this loader alone goes too
