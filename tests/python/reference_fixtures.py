"""Fixtures shared by the engine and drop-in tests: datasets written by the real `datasets` package and
hidden-state caches written by the real `safetensors` package, plus the reference's own batches."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch


@dataclass
class Fixture:
    path: str
    rows: int
    hidden_size: int
    layers: int
    missing: set[int] = field(default_factory=set)
    mismatched: set[int] = field(default_factory=set)


def write_fixture(
    path: str,
    *,
    rows: int = 48,
    hidden_size: int = 16,
    layers: int = 4,
    max_len: int = 96,
    file_dtype: torch.dtype = torch.bfloat16,
    missing: tuple[int, ...] = (),
    mismatched: tuple[int, ...] = (),
    long_rows: tuple[int, ...] = (),
    seed: int = 7,
    distinct: bool = True,
) -> Fixture:
    """A torch-format dataset (as speculators' preprocessing saves it) and its hidden-state cache.

    Lengths are distinct, or with `distinct=False` drawn from a few values so that most rows tie (as
    in real tokenized data; the reference orders ties with numpy's unstable argsort). `long_rows` are
    longer than `max_len`, `missing` rows have no file, `mismatched` rows have a file whose token
    ids differ."""
    from datasets import Dataset
    from safetensors.torch import save_file

    rng = np.random.default_rng(seed)
    pool = rng.permutation(np.arange(2, max_len - 1))
    lengths = [int(pool[i % len(pool)]) + (i // len(pool)) * max_len for i in range(rows)]
    if not distinct:
        lengths = [int(x) for x in rng.choice([5, 9, 12, 20, 31], size=rows)]
    for k, row in enumerate(long_rows):
        lengths[row] = max_len + 5 + k
    lengths = [int(x) for x in lengths]
    assert not distinct or len(set(lengths)) == len(lengths), "lengths must be distinct"
    input_ids = [rng.integers(0, 32000, size=n).tolist() for n in lengths]
    loss_mask = [(rng.random(n) < 0.7).astype(np.int64).tolist() for n in lengths]
    ds = Dataset.from_dict({"input_ids": input_ids, "loss_mask": loss_mask, "seq_len": lengths})
    ds.set_format(type="torch")
    ds.save_to_disk(path)

    hs_dir = os.path.join(path, "hidden_states")
    os.makedirs(hs_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for i, n in enumerate(lengths):
        if i in missing:
            continue
        ids = torch.tensor(input_ids[i], dtype=torch.long)
        if i in mismatched:
            ids = ids.clone()
            ids[0] += 1
        hs = torch.randn(n, layers, hidden_size, generator=gen).to(file_dtype)
        save_file({"hidden_states": hs, "token_ids": ids}, os.path.join(hs_dir, f"hs_{i}.safetensors"))
    return Fixture(path, rows, hidden_size, layers, set(missing), set(mismatched))


def reference_batches(
    fixture: Fixture,
    *,
    max_len: int,
    split: Literal["train", "val"] = "train",
    train_ratio: float = 0.75,
    world_size: int = 1,
    rank: int = 0,
    epoch: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    preprocess=None,
    on_missing: Literal["generate", "skip", "warn", "raise"] = "skip",
    transfer=None,
    max_batches: int | None = None,
) -> list[dict]:
    """The batches the real speculators dataset + sampler + collate produce (single process);
    `transfer` (hs-connectors' FileTransfer, FP8Transfer, ...) reads another cache folder."""
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = ArrowDataset(
            max_len=max_len,
            datapath=fixture.path,
            on_missing=on_missing,
            train_ratio=train_ratio,
            split=split,
            hidden_states_dtype=dtype,
            **({} if transfer is None else {"transfer": transfer}),
        )
        sampler_args: dict[str, Any] = {} if max_batches is None else {"max_batches": max_batches}
        sampler = MultipackDistributedBatchSamplerV2(
            batch_max_length=max_len,
            lengths=dataset.approx_lengths,
            num_replicas=world_size,
            rank=rank,
            **sampler_args,
        )
        sampler.set_epoch(epoch)
        collate = CollateFn(
            max_len, fixture.hidden_size, num_target_layers=fixture.layers - 1, dtype=dtype,
            preprocess=preprocess,
        )
        return [collate([dataset[int(i)] for i in batch]) for batch in sampler]


def assert_same_batch(ours: dict, ref: dict, context: str = "") -> None:
    """Keys (tensor keys, in order), shapes, dtypes and values equal."""
    ref_tensors = [k for k, v in ref.items() if isinstance(v, torch.Tensor)]
    our_tensors = [k for k, v in ours.items() if isinstance(v, torch.Tensor)]
    assert our_tensors == ref_tensors, f"{context}: keys {our_tensors} != {ref_tensors}"
    for key in ref_tensors:
        a, b = ours[key], ref[key]
        assert a.shape == b.shape, f"{context}: {key} shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.dtype == b.dtype, f"{context}: {key} dtype {a.dtype} != {b.dtype}"
        assert torch.equal(a, b), f"{context}: {key} values differ"
