"""Cold epochs of packed caches through tools/slowfs (10 ms per operation, a bandwidth cap), against
the mount's bound (the bytes the epoch read at the cap): what reading packed samples ahead by their
byte ranges buys (issue 41, "Reading").

    python3 bench/bench_pack_cold.py --work DIR [--rows N] [--mbps M] [--repeat K]

The dataset and its packs are made in DIR on the first run and reused after, so that two builds
(the draftfeed on PYTHONPATH) are measured on the same bytes, one after the other. Prints JSON: per
cache, each epoch's seconds, the bytes read through the mount and their bound at M MB/s."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pack import cold_epoch, run

import draftfeed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, help="folder of the dataset and its packs (made once)")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--mbps", type=float, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    work = Path(args.work)
    data = work / "data"
    caches = {"packed": work / "packed", "packed+compressed": work / "packed_zstd"}
    if not (caches["packed+compressed"] / "manifest.json").exists():
        run("synth", data, "--rows", args.rows, "--min-len", 64, "--max-len", 1024, "--hidden-size",
            args.hidden, "--layers", 4)
        run("pack", data, "--out", caches["packed"], "--no-progress")
        run("pack", data, "--out", caches["packed+compressed"], "--compress", "--no-progress")
    results: dict = {"draftfeed": draftfeed.__file__, "rows": args.rows, "mbps": args.mbps, "sides": {}}
    for name, cache in caches.items():
        results["sides"][name] = [
            cold_epoch(data, cache, args.hidden, work / f"mnt_{name.replace('+', '_')}_{k}", args.mbps)
            for k in range(args.repeat)]
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
