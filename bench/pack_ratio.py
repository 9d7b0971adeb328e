"""What `draftfeed pack --compress` saves (issue 41): bytes of the packed cache against the
per-sample cache, bf16 and FP8 (`draftfeed quantize`), on four kinds of hidden states:

  synth     `draftfeed synth`'s states (the benchmarks' synthetic cache: hidden/synthetic_cache.h)
  residual  bench/residual_states.py: Gaussian with 4 channels 100-1000x larger, a log-normal
            per-token scale, an attention-sink token 50x, a norm growing with depth
  harness   the trainer tests' files (tests/python/trainer_harness.py prepare: torch.randn, bf16)
  llama     the trainer tests' tiny random-init Llama (hidden 64, 2 layers) run on the same rows:
            its embeddings and layer outputs (output_hidden_states), bf16

For each, the whole cache's bytes (files -> shards, headers and all) and the hidden states' alone
(the codec's own ratio), at zstd level 1 (the default) and 3, and the exponent plane's ratio.

    python3 bench/pack_ratio.py [--out bench/results/pack_ratio] [--work DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "python"))

from bench_common import cli_path  # noqa: E402


def run(*args) -> str:
    return subprocess.run([cli_path(), *map(str, args)], check=True, capture_output=True, text=True).stdout


def make_synth(folder: Path, quick: bool) -> Path:
    run("synth", folder, "--rows", 8 if quick else 24, "--min-len", 128, "--max-len", 512,
        "--hidden-size", 2048 if quick else 4096, "--layers", 4)
    return folder


def make_residual(folder: Path, quick: bool) -> Path:
    subprocess.run([sys.executable, str(ROOT / "bench" / "residual_states.py"), str(folder), "--rows",
                    str(8 if quick else 24), "--hidden", str(2048 if quick else 4096)], check=True)
    return folder


def make_harness(folder: Path, quick: bool) -> Path:
    import trainer_harness

    info = trainer_harness.prepare(str(folder))
    return Path(info["data"])


def make_llama(harness_data: Path, folder: Path) -> Path:
    """The harness's rows through its verifier: real (random-init) Llama hidden states."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaForCausalLM

    shutil.copytree(harness_data, folder, ignore=shutil.ignore_patterns("hidden_states"))
    model = LlamaForCausalLM.from_pretrained(str(harness_data.parent / "verifier")).eval()
    out = folder / "hidden_states"
    out.mkdir()
    with torch.no_grad():
        for path in sorted((harness_data / "hidden_states").glob("hs_*.safetensors")):
            ids = load_file(str(path))["token_ids"]
            states = model(ids[None], output_hidden_states=True).hidden_states  # embeddings, layers
            picked = [states[0], states[1], states[-1], states[-1]]  # 3 target layers, the last
            hs = torch.stack([s[0] for s in picked], dim=1).to(torch.bfloat16).contiguous()
            save_file({"hidden_states": hs, "token_ids": ids}, str(out / path.name))
    return folder


def measure(data: Path, work: Path, name: str, levels: tuple[int, ...] = (1, 3),
            entropy: str = "zstd") -> list[dict]:
    """Per dtype (bf16, FP8) and zstd level: the per-sample files' bytes, the packed and the packed and
    compressed cache's (the plain pack at the first level only). `entropy`: pack's --entropy (with
    huffman, the levels are only repeats: huffman has none)."""
    rows = []
    fp8 = work / f"{name}_fp8"
    run("quantize", data, "--out", fp8, "--no-progress")
    for dtype, cache in (("bf16", data / "hidden_states"), ("fp8", fp8)):
        for level in levels:
            out = work / f"{name}_{dtype}_pack{level}"
            start = time.perf_counter()
            report = json.loads(run("pack", data, "--hidden-states", cache, "--out", out, "--compress",
                                    "--entropy", entropy, "--level", level, "--json"))
            seconds = time.perf_counter() - start
            plain = json.loads(run("pack", data, "--hidden-states", cache, "--out", work / f"{name}_{dtype}_plain",
                                   "--json")) if level == levels[0] else None
            rows.append({
                "states": name, "dtype": dtype, "entropy": entropy,
                "zstd_level": level if entropy == "zstd" else None, "samples": report["packed"],
                "bytes_per_sample_file": report["bytes_before"],
                "packed_plain_bytes": plain["bytes_after"] if plain else None,
                "packed_compressed_bytes": report["bytes_after"],
                "ratio_whole": round(report["ratio"], 4),
                "ratio_hidden_states": round(report["hidden_ratio"], 4),
                "pack_seconds": round(seconds, 2),
            })
            shutil.rmtree(out)
            if plain:
                shutil.rmtree(work / f"{name}_{dtype}_plain")
    shutil.rmtree(fp8)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "pack_ratio"))
    parser.add_argument("--work", help="scratch folder (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="smaller caches")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="pack_ratio_"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    results += measure(make_synth(work / "synth", args.quick), work, "synth")
    results += measure(make_residual(work / "residual", args.quick), work, "residual")
    harness = make_harness(work / "harness", args.quick)
    results += measure(harness, work, "harness")
    results += measure(make_llama(harness, work / "llama"), work, "llama")
    if not args.work:
        shutil.rmtree(work)
    Path(args.out + ".json").write_text(json.dumps({"results": results}, indent=1) + "\n")
    lines = ["| states | dtype | zstd level | samples | per-sample bytes | packed | packed + compressed | "
             "ratio (whole) | ratio (hidden states) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['states']} | {r['dtype']} | {r['zstd_level']} | {r['samples']} | "
                     f"{r['bytes_per_sample_file']} | {r['packed_plain_bytes'] or ''} | "
                     f"{r['packed_compressed_bytes']} | {r['ratio_whole']:.3f} | {r['ratio_hidden_states']:.3f} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
