"""The seed's per-sample uniform noise on speculators 0.9.0's loaders: a re-implementation, for
benchmarking only.

speculators 0.9.0 (PyPI, the installed reference) has no noise. The seed's data path (the
`speculators` repository's main branch) has it: `create_train_val_loaders(noise_std=...)` gives the
training `ArrowDataset` the transform `AddUniformNoise(std=noise_std)`
(`speculators/train/noise_transforms.py`), which `BaseDataset.__getitem__` applies to every sample
in the DataLoader worker that loads it, after the sample is read and sliced (`hidden_states` is the
three target layers flattened, in the file's dtype, bf16 here) and before the collate function packs
and casts the batch. Its documented behaviour: `hidden_states` (not `verifier_last_hidden_states`)
becomes x + (2u - 1) * std, u uniform in [0, 1) drawn by torch (`rand_like`, in x's dtype).

0.9.0 lacks that code, so this module writes the same behaviour from that description (it is not
the seed's code) and applies it the same way: `with_uniform_noise(loader, std)` rebuilds 0.9.0's
training DataLoader around the same dataset, wrapped so that each sample gets the noise inside the
worker's `__getitem__`, with the same batch sampler, collate function, workers (spawned,
persistent, one torch thread each), prefetch factor and pinning. Only the per-sample transform is
added; everything else is the installed reference's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


class UniformNoiseDataset(Dataset):
    """`dataset[i]` with x + (2u - 1) * std added to its `hidden_states` (samples that are not a
    dict, such as 0.9.0's SampleUnavailable for a missing file, pass through unchanged)."""

    def __init__(self, dataset: Any, std: float) -> None:
        self.dataset = dataset
        self.std = float(std)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        data = self.dataset[index]
        if isinstance(data, dict):
            x = data["hidden_states"]
            data["hidden_states"] = x + (2 * torch.rand_like(x) - 1) * self.std
        return data


def with_uniform_noise(loader: DataLoader, std: float) -> DataLoader:
    """0.9.0's training DataLoader `loader` rebuilt with the seed's per-sample noise in its workers."""
    return DataLoader(
        UniformNoiseDataset(loader.dataset, std),
        batch_sampler=loader.batch_sampler,
        num_workers=loader.num_workers,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        pin_memory=loader.pin_memory,
        collate_fn=loader.collate_fn,
        persistent_workers=loader.persistent_workers,
        multiprocessing_context=loader.multiprocessing_context,
        worker_init_fn=loader.worker_init_fn,
    )
