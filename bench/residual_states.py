"""A residual-stream-like hidden-state generator, for measuring the packed cache's codec (issue 41).

What a decoder's residual stream looks like, in the features that decide how its bf16 exponents
compress (the mantissas are near uniform whatever the source):
  * a few channels ("massive activations") orders of magnitude larger than the rest, of a steady
    sign: here 4 channels of H at 100x to 1000x, the same channels in every token and layer;
  * a per-token scale that varies: log-normal (sigma 0.5), and the first token (the attention sink)
    50x larger;
  * a norm that grows with depth: layer l of L at (1 + 2 l / L) times the first;
  * otherwise Gaussian values.

    python3 bench/residual_states.py OUT --rows N [--hidden H] [--layers L] [--min-len A]
        [--max-len B] [--seed S]

writes a token dataset at OUT (draftfeed's synthetic ids) and OUT/hidden_states/hs_<row>.safetensors
(token_ids I64 [T], hidden_states BF16 [T, L, H], written by `safetensors`)."""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from safetensors.torch import save_file

import draftfeed


def residual_sample(rng: np.random.Generator, tokens: int, layers: int, hidden: int,
                    massive: np.ndarray, massive_scale: np.ndarray) -> torch.Tensor:
    values = rng.standard_normal((tokens, layers, hidden), dtype=np.float32)
    channel = np.ones(hidden, dtype=np.float32)
    values[:, :, massive] = np.abs(values[:, :, massive]) + 2.0  # a steady sign
    channel[massive] = massive_scale
    token = np.exp(rng.normal(0.0, 0.5, size=tokens)).astype(np.float32)
    token[0] *= 50.0  # the attention sink
    layer = (1.0 + 2.0 * np.arange(layers, dtype=np.float32) / layers)
    values *= channel[None, None, :] * token[:, None, None] * layer[None, :, None]
    return torch.from_numpy(values).to(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--min-len", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    draftfeed.write_synthetic_dataset(args.out, args.rows, seed=args.seed, min_len=args.min_len,
                                      max_len=args.max_len)
    dataset = draftfeed.open_dataset(args.out)
    rng = np.random.default_rng(args.seed)
    massive = rng.choice(args.hidden, size=4, replace=False)
    massive_scale = np.array([100.0, 300.0, 600.0, 1000.0], dtype=np.float32)
    folder = os.path.join(args.out, "hidden_states")
    os.makedirs(folder, exist_ok=True)
    for row in range(len(dataset)):
        ids = torch.tensor(np.asarray(dataset.row(row)["input_ids"]), dtype=torch.int64)
        hs = residual_sample(rng, len(ids), args.layers, args.hidden, massive, massive_scale)
        save_file({"hidden_states": hs, "token_ids": ids}, os.path.join(folder, f"hs_{row}.safetensors"))


if __name__ == "__main__":
    main()
