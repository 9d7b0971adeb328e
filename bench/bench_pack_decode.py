"""Compressed packs at memory speed (issue 51), side by side in one run:

  * warm epochs, the loader's defaults (2 copy threads here), at each --hidden (default 1024, 2048,
    4096): packed plain against packed and compressed with each coder (huffman, format version 2,
    and zstd, version 1, the only coder before issue 51; pack's default takes huffman for bf16 and
    zstd for FP8), bf16 and FP8 (`draftfeed quantize`); the caches' epochs interleaved round by round (each cache one epoch, then again),
    so that a change in the machine's load falls on all of them alike; each figure the median
    over --rounds rounds, and the share compressed / plain the median of the rounds' own shares;
  * the entropy stage alone (`draftfeed codecs`): each coder's exponent-plane decode in GB/s per
    core of exponent bytes, beside memcpy of the same bytes, on bench/residual_states.py's
    residual-stream-like states (bf16, and FP8 from them), with each coder's size;
  * the compression ratio of whole packs of the same residual states, pack's default coder, huffman
    and zstd (bench/pack_ratio.py's measure);
  * with --cold-mbps M, one cold epoch through a fresh capped slowfs mount (10 ms per operation, M
    MB/s), per-sample against packed and compressed, bf16 at the first --hidden (bench_pack.py's
    cold_epoch).

    python3 bench/bench_pack_decode.py [--hidden 1024,2048,4096] [--rows N] [--rounds R]
        [--residual-rows N] [--cold-mbps M] [--out bench/results/i51_pack_decode]

The warm data are `draftfeed synth`'s states (as bench_pack.py's), 64-1024 tokens, 4 layers; the
GB/s are of the batches' bf16 bytes (tokens x 4 x H x 2 per second)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import cli_path  # noqa: E402
from bench_pack import epoch  # noqa: E402

MAX_LEN = 2048
GOAL_SHARE = 0.60
GOAL_RATIO = {"bf16": 0.70, "fp8": 0.82}
GOAL_ENTROPY_GB_PER_S = 2.0
# What `pack --compress` (--entropy auto) codes each dtype's exponent planes with.
DEFAULT_CODER = {"bf16": "huffman", "fp8": "zstd"}
OTHER_CODER = {"bf16": "zstd", "fp8": "huffman"}


def run(*args) -> str:
    return subprocess.run([cli_path(), *map(str, args)], check=True, capture_output=True, text=True).stdout


def make_caches(work: Path, hidden: int, rows: int) -> tuple[Path, dict[str, Path]]:
    data = work / f"data_{hidden}"
    run("synth", data, "--rows", rows, "--min-len", 64, "--max-len", 1024, "--hidden-size", hidden, "--layers", 4)
    fp8 = work / f"fp8_{hidden}"
    run("quantize", data, "--out", fp8, "--no-progress")
    caches = {}
    for dtype, source in (("bf16", data / "hidden_states"), ("fp8", fp8)):
        for suffix, flags in (("", []), ("+huffman", ["--compress", "--entropy", "huffman"]),
                              ("+zstd", ["--compress", "--entropy", "zstd"])):
            name = f"{dtype} packed{suffix}"
            out = work / f"{dtype}_{suffix.strip('+') or 'plain'}_{hidden}"
            run("pack", data, "--hidden-states", source, "--out", out, "--no-progress", *flags)
            caches[name] = out
    shutil.rmtree(fp8)
    return data, caches


def warm_rounds(data: Path, caches: dict[str, Path], hidden: int, rounds: int) -> dict:
    import draftfeed

    loaders = {name: draftfeed.Loader(str(data), hidden_size=hidden, total_seq_len=MAX_LEN,
                                      hidden_states_path=str(cache), pin_memory=False)
               for name, cache in caches.items()}
    seconds: dict[str, list[float]] = {name: [] for name in caches}
    tokens = 0
    try:
        for loader in loaders.values():  # warms the page cache, checks each sample's checksum once
            epoch(loader, 0)
        for r in range(rounds):
            for name, loader in loaders.items():
                s, tokens = epoch(loader, r + 1)
                seconds[name].append(s)
    finally:
        for loader in loaders.values():
            loader.close()
    out: dict = {"tokens_per_epoch": tokens, "caches": {}}
    for name, runs in seconds.items():
        s = statistics.median(runs)
        out["caches"][name] = {"bytes_on_disk": sum(p.stat().st_size for p in caches[name].rglob("*") if p.is_file()),
                               "warm_epoch_seconds": round(s, 4), "epoch_seconds": [round(x, 4) for x in runs],
                               "warm_gb_per_s_of_bf16": round(tokens * 4 * hidden * 2 / s / 1e9, 2)}
    for dtype in ("bf16", "fp8"):
        plain = seconds[f"{dtype} packed"]
        for coder in ("huffman", "zstd"):
            packed = seconds[f"{dtype} packed+{coder}"]
            out[f"{dtype}_{coder}_share"] = round(statistics.median(p / c for p, c in zip(plain, packed)), 3)
    return out


def entropy_stage(work: Path, rows: int) -> dict:
    folder = work / "residual"
    subprocess.run([sys.executable, str(ROOT / "bench" / "residual_states.py"), str(folder), "--rows", str(rows),
                    "--hidden", "4096"], check=True, capture_output=True)
    fp8 = work / "residual_fp8"
    run("quantize", folder, "--out", fp8, "--no-progress")
    out = {}
    for dtype, cache in (("bf16", folder / "hidden_states"), ("fp8", fp8)):
        files = sorted(str(p) for p in cache.rglob("*.safetensors"))
        out[dtype] = json.loads(run("codecs", *files, "--json"))
    return out


def ratios(work: Path) -> list[dict]:
    import pack_ratio

    folder = work / "residual"
    return [row for entropy in ("auto", "huffman", "zstd")
            for row in pack_ratio.measure(folder, work, f"residual_{entropy}", levels=(1,), entropy=entropy)]


def cold(work: Path, data: Path, caches: dict[str, Path], hidden: int, mbps: float) -> dict:
    import bench_pack
    from slowfs_process import slowfs_unavailable

    skipped = slowfs_unavailable()
    if skipped:
        return {"skipped": skipped}
    return {name: bench_pack.cold_epoch(data, cache, hidden, work / f"cold_{i}", mbps)
            for i, (name, cache) in enumerate((("per-sample", data / "hidden_states"),
                                                ("bf16 packed+huffman", caches["bf16 packed+huffman"])))}


def targets(results: dict) -> list[tuple[str, str, str]]:
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    out = []
    for hidden, warm in results["warm"].items():
        for dtype in ("bf16", "fp8"):
            c = warm["caches"]
            coder, other = DEFAULT_CODER[dtype], OTHER_CODER[dtype]
            share = warm[f"{dtype}_{coder}_share"]
            out.append((f"H = {hidden}, {dtype}: warm compressed (pack's default, {coder}) >= {GOAL_SHARE:.0%} of "
                        "packed plain",
                        f"{share:.0%} ({c[f'{dtype} packed+{coder}']['warm_gb_per_s_of_bf16']} / "
                        f"{c[f'{dtype} packed']['warm_gb_per_s_of_bf16']} GB/s; with {other} "
                        f"{warm[f'{dtype}_{other}_share']:.0%})", met(share >= GOAL_SHARE)))
    for dtype, stage in results.get("entropy_stage", {}).items():
        coders = {c["name"]: c for c in stage["coders"]}
        h, z = coders["huffman"], coders["zstd"]
        chosen = coders[DEFAULT_CODER[dtype]]
        out.append((f"{dtype}: entropy stage of pack's default ({DEFAULT_CODER[dtype]}) >= "
                    f"{GOAL_ENTROPY_GB_PER_S:g} GB/s per core of exponent bytes",
                    f"huffman {h['entropy_gb_per_s_of_exponents']:.2f}, zstd {z['entropy_gb_per_s_of_exponents']:.2f}, "
                    f"memcpy {stage['memcpy_gb_per_s']:.1f} GB/s",
                    met(chosen["entropy_gb_per_s_of_exponents"] >= GOAL_ENTROPY_GB_PER_S)))
        out.append((f"{dtype}: exponent planes of pack's default within 2% of zstd's (today's) size",
                    f"{chosen['stored_share_of_plane']:.4f} / {z['stored_share_of_plane']:.4f} of the plane",
                    met(chosen["stored_share_of_plane"] <= 1.02 * z["stored_share_of_plane"])))
    for row in results.get("ratio", []):
        if row["entropy"] == "auto":
            bound = GOAL_RATIO[row["dtype"]]
            out.append((f"{row['dtype']}: compressed pack <= {bound:.2f}x the per-sample cache (residual states)",
                        f"{row['ratio_whole']:.3f}x", met(row["ratio_whole"] <= bound)))
    c = results.get("cold", {})
    if "per-sample" in c:
        a, b = c["per-sample"], c["bf16 packed+huffman"]
        out.append((f"cold, capped mount ({results['cold_mbps']:g} MB/s): compressed >= 1.3x per-sample",
                    f"{a['seconds'] / b['seconds']:.2f}x ({a['seconds']} / {b['seconds']} s)",
                    met(a["seconds"] >= 1.3 * b["seconds"])))
    elif c:
        out.append(("cold, capped mount", "-", f"not measured: {c.get('skipped')}"))
    return out


def markdown(results: dict) -> str:
    lines = [f"{results['rows']} rows x 2048 / H of 64-1024 tokens, 4 layers, `draftfeed synth`'s states; {results['rounds']} "
             f"interleaved rounds per H, medians; load average at start {results['load_average']}", "",
             "| H | cache | bytes on disk | warm epoch (s) | warm GB/s (bf16 bytes) |", "|---|---|---|---|---|"]
    for hidden, warm in results["warm"].items():
        for name, c in warm["caches"].items():
            lines.append(f"| {hidden} | {name} | {c['bytes_on_disk']} | {c['warm_epoch_seconds']} | "
                         f"{c['warm_gb_per_s_of_bf16']} |")
    for dtype, stage in results.get("entropy_stage", {}).items():
        lines += ["", f"Entropy stage, {dtype} residual-like states ({stage['files']} files, "
                  f"{stage['exponent_bytes'] / 1e6:.1f} MB of exponent bytes), one thread: memcpy "
                  f"{stage['memcpy_gb_per_s']:.2f} GB/s", "",
                  "| coder | stored / plane | blob / tensor | entropy GB/s (exponents) | chunk GB/s (values) |",
                  "|---|---|---|---|---|"]
        for c in stage["coders"]:
            lines.append(f"| {c['name']} | {c['stored_share_of_plane']:.4f} | {c['blob_share_of_tensor']:.4f} | "
                         f"{c['entropy_gb_per_s_of_exponents']:.2f} | {c['chunk_gb_per_s_of_values']:.2f} |")
    lines += ["", "| issue 51 target | measured | met |", "|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in targets(results)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", default="1024,2048,4096", help="comma-separated hidden sizes")
    parser.add_argument("--rows", type=int, default=300, help="rows at H = 2048; at another H, rows x 2048 / H "
                        "(the same bytes at every H)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved warm rounds per H")
    parser.add_argument("--residual-rows", type=int, default=24, help="residual-like samples (H = 4096) for "
                        "the entropy stage and the ratio; 0 leaves both out")
    parser.add_argument("--cold-mbps", type=float, default=0)
    parser.add_argument("--work", help="folder for the scratch folder (default: the system's temporary folder)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "i51_pack_decode"),
                        help="OUT.json and OUT.md (a folder: FOLDER/pack_decode.json and .md)")
    args = parser.parse_args()
    import os

    results: dict = {"rows": args.rows, "rounds": args.rounds, "cold_mbps": args.cold_mbps,
                     "load_average": round(os.getloadavg()[0], 2), "commit": subprocess.run(
                         ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip(), "warm": {}}
    if args.work:
        os.makedirs(args.work, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        hiddens = [int(h) for h in args.hidden.split(",")]
        for hidden in hiddens:
            data, caches = make_caches(work, hidden, args.rows * 2048 // hidden)
            results["warm"][str(hidden)] = warm_rounds(data, caches, hidden, args.rounds)
            if args.cold_mbps and hidden == hiddens[0]:
                results["cold"] = cold(work, data, caches, hidden, args.cold_mbps)
            shutil.rmtree(data)
            for cache in caches.values():
                shutil.rmtree(cache)
            print(f"H = {hidden}: done", flush=True)
        if args.residual_rows:
            results["entropy_stage"] = entropy_stage(work, args.residual_rows)
            results["ratio"] = ratios(work)
    out = Path(args.out)
    if out.is_dir():  # bench/run.py's section: a folder of its own
        out = out / "pack_decode"
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
