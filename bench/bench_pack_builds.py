"""Two (or more) builds of draftfeed read the same packed caches, side by side in one run: warm
epochs (per-sample, packed, packed and compressed), the memcpy bound of the same bytes, and cold
epochs through tools/slowfs (10 ms per operation, a bandwidth cap), the builds taking turns round
after round so that the machine's load falls on both alike.

    python3 bench/bench_pack_builds.py --work DIR --build base=/venvs/base/bin/python \\
        --build head=python3 [--rows N] [--hidden H] [--rounds K] [--warm-epochs E] [--cold-mbps M] \\
        [--out bench/results/NAME]                  # writes NAME.json and NAME.md

Each build is a Python interpreter that imports its draftfeed (a virtual environment): its worker
runs there, with that environment's `draftfeed` program first on PATH. The data and the packs are
made once, by the first build, in DIR; every build reads the same bytes. Per build and cache: the
median over the rounds of each round's median warm epoch; each cold epoch's seconds against the
mount's bound (the bytes it read at the cap). Ratios are against the first build."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHES = {"per-sample": "data/hidden_states", "packed": "packed", "packed+compressed": "packed_zstd"}


def worker(args) -> None:
    """Runs in a build's interpreter: one round of that build's figures, as JSON on stdout."""
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_pack import cold_epoch, run, warm_epochs
    from slowfs_process import slowfs_unavailable

    import draftfeed

    work = Path(args.work)
    data = work / "data"
    out: dict = {"draftfeed": draftfeed.__file__, "caches": {}}
    out["memcpy_gb_per_s"] = json.loads(run("verify", data, "--baseline", "memcpy", "--json"))["gb_per_s"]
    for name, relative in CACHES.items():
        side = warm_epochs(data, work / relative, args.hidden, args.warm_epochs)
        if args.cold_mbps and not slowfs_unavailable():
            mount = work / f"mnt_{args.tag}_{name.replace('+', '_')}"
            side["cold"] = cold_epoch(data, work / relative, args.hidden, mount, args.cold_mbps)
        out["caches"][name] = side
    print(json.dumps(out))


def build_env(python: str) -> dict:
    env = dict(os.environ)
    bindir = str(Path(python).parent) if os.sep in python else ""
    if bindir:
        env["PATH"] = bindir + os.pathsep + env["PATH"]
        env.pop("DRAFTFEED_CLI", None)
    return env


def make_data(python: str, work: Path, rows: int, hidden: int) -> None:
    if (work / "packed_zstd" / "manifest.json").exists():
        return
    env = build_env(python)
    cli = subprocess.run([python, "-c", "import shutil; print(shutil.which('draftfeed'))"], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    data = work / "data"
    subprocess.run([cli, "synth", str(data), "--rows", str(rows), "--min-len", "64", "--max-len", "1024",
                    "--hidden-size", str(hidden), "--layers", "4"], check=True, capture_output=True)
    subprocess.run([cli, "pack", str(data), "--out", str(work / "packed"), "--no-progress"], check=True)
    subprocess.run([cli, "pack", str(data), "--out", str(work / "packed_zstd"), "--compress", "--no-progress"],
                   check=True)


def summarize(rounds: dict[str, list[dict]]) -> dict:
    builds = list(rounds)
    out: dict = {"builds": {}, "ratios": {}}
    for build, results in rounds.items():
        entry: dict = {"draftfeed": results[0]["draftfeed"],
                       "memcpy_gb_per_s": statistics.median(r["memcpy_gb_per_s"] for r in results), "caches": {}}
        for name in CACHES:
            sides = [r["caches"][name] for r in results]
            cache: dict = {"warm_gb_per_s": statistics.median(s["warm_gb_per_s_of_bf16"] for s in sides),
                           # Each round's warm figure as a share of that round's memcpy bound: what
                           # the load of the moment does to both cancels out.
                           "warm_share_of_memcpy": statistics.median(
                               r["caches"][name]["warm_gb_per_s_of_bf16"] / r["memcpy_gb_per_s"] for r in results)}
            if "cold" in sides[0]:
                cache["cold_seconds"] = statistics.median(s["cold"]["seconds"] for s in sides)
                cache["cold_bound_seconds"] = statistics.median(s["cold"]["bound_seconds"] for s in sides)
            entry["caches"][name] = cache
        out["builds"][build] = entry
    first = out["builds"][builds[0]]
    for build in builds[1:]:
        other = out["builds"][build]
        ratio = {"memcpy": other["memcpy_gb_per_s"] / first["memcpy_gb_per_s"]}
        for name in CACHES:
            a, b = first["caches"][name], other["caches"][name]
            ratio[f"{name} warm"] = b["warm_gb_per_s"] / a["warm_gb_per_s"]
            ratio[f"{name} warm / memcpy"] = b["warm_share_of_memcpy"] / a["warm_share_of_memcpy"]
            if "cold_seconds" in a:
                ratio[f"{name} cold (speed)"] = a["cold_seconds"] / b["cold_seconds"]
        out["ratios"][f"{build} / {builds[0]}"] = ratio
    return out


def markdown(summary: dict, args, load: list[float]) -> str:
    builds = list(summary["builds"])
    lines = [f"{args.rows} rows of 64-1024 tokens, 4 layers x {args.hidden}, bf16; {args.rounds} rounds, builds "
             f"taking turns, {args.warm_epochs} warm epochs a round; cold through slowfs at {args.cold_mbps:g} MB/s, "
             f"10 ms per operation; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end.", "",
             "| build | cache | warm GB/s (bf16 bytes) | memcpy bound GB/s | warm / memcpy (per round) | "
             "cold epoch (s) | its bound (s) |",
             "|---|---|---|---|---|---|---|"]
    for build in builds:
        entry = summary["builds"][build]
        for name, cache in entry["caches"].items():
            lines.append(f"| {build} | {name} | {cache['warm_gb_per_s']:.2f} | {entry['memcpy_gb_per_s']:.2f} | "
                         f"{cache['warm_share_of_memcpy']:.0%} | {cache.get('cold_seconds', '')} | "
                         f"{cache.get('cold_bound_seconds', '')} |")
    lines += ["", "| ratio | " + " | ".join(next(iter(summary["ratios"].values()), {})) + " |",
              "|---|" + "---|" * len(next(iter(summary["ratios"].values()), {}))]
    for name, ratio in summary["ratios"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in ratio.values()) + " |")
    lines += ["", "Builds: " + "; ".join(f"{b} = `{summary['builds'][b]['draftfeed']}`" for b in builds)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="folder of the dataset and its packs (made once)")
    parser.add_argument("--build", action="append", default=[], help="NAME=PYTHON, the first is the baseline")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-epochs", type=int, default=3)
    parser.add_argument("--cold-mbps", type=float, default=0)
    parser.add_argument("--out", help="writes OUT.json and OUT.md")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if len(args.build) < 2:
        parser.error("give at least two --build NAME=PYTHON")
    builds = dict(b.split("=", 1) for b in args.build)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    make_data(next(iter(builds.values())), work, args.rows, args.hidden)
    load_start = os.getloadavg()[0]
    rounds: dict[str, list[dict]] = {name: [] for name in builds}
    for k in range(args.rounds):
        for name, python in builds.items():
            proc = subprocess.run([python, __file__, "--worker", "--work", str(work), "--hidden", str(args.hidden),
                                   "--warm-epochs", str(args.warm_epochs), "--cold-mbps", str(args.cold_mbps),
                                   "--tag", f"{name}{k}"], env=build_env(python), capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{name}'s worker failed:\n{proc.stderr}")
            rounds[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {k} {name}: " + ", ".join(
                f"{c} {s['warm_gb_per_s_of_bf16']} GB/s" for c, s in rounds[name][-1]["caches"].items()), flush=True)
    summary = summarize(rounds) | {"rounds": rounds, "rows": args.rows, "hidden": args.hidden,
                                   "load": [load_start, os.getloadavg()[0]]}
    text = markdown(summary, args, summary["load"])
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(summary, indent=1) + "\n")
        Path(args.out + ".md").write_text(text)


if __name__ == "__main__":
    main()
