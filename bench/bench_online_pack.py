"""Generate once, keep what fits (issue 50): three epochs of an online run per way of keeping what
was generated, side by side in one run, against the simulated vLLM server with its service-time
model (lognormal, keyed by the prompt: every run does the same work).

    python3 bench/bench_online_pack.py [--rows 240] [--hidden 256] [--concurrency 8] [--median 0.1]
        [--p99 1.0] [--out DIR]            # writes DIR/online_pack.json

Runs, each from an empty cache folder, 3 epochs each, the requests of each epoch counted by the
server and the bytes the folder holds after epoch 0:
  * reference delete: speculators 0.9.0's create_train_val_loaders(on_missing="generate"), called as
    its trainer calls it (0.9.0 always deletes what it generated);
  * reference cache: 0.9.0 has no on_generate (the newer entry point's "cache" keeps each generated
    file in the cache folder): its epoch 0 is the delete run's (the same requests), and its epochs 1-2
    are 0.9.0 reading offline the per-sample folder that "cache" keeps (the one draftfeed's cache mode
    kept, the servers' files moved as they were);
  * draftfeed delete, cache, and pack at budgets of 25%, 50% and 100% of the dataset's bf16 bytes;
  * the bounds of the 100% budget's epochs: the same pack read offline from the page cache (the cache
    source), its first epoch (each sample read for the first time, as in the online run's epoch 1:
    checksums checked) and its later ones.
The metadata operations of an epoch 1 (tools/slowfs's counters, no latency added) for draftfeed's
cache and pack modes: the folder read through a mount. Goals (issue 50): with a 100% budget, epoch
1+ requests 0 and epoch 1 within 1.1x of the warm packed epoch; with 50%, epoch 1+ requests at most
the rows not kept and the pack at most the budget; the kept bytes at most 0.72x of the reference's
cache folder for the same rows."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))
from bench_common import machine, metadata_calls, time_epoch  # noqa: E402
from sim_vllm_process import SimServerProcess  # noqa: E402
from slowfs_process import SlowFs, slowfs_unavailable  # noqa: E402

import draftfeed  # noqa: E402

EPOCHS = 3
WRITER_LOCK = ".draftfeed-writer.lock"


def folder_bytes(folder: Path) -> int:
    if not folder.exists():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != WRITER_LOCK)


def reference_call(args, data: Path, url: str, cache: Path, on_missing: str) -> dict:
    from hs_connectors import FileTransfer

    return dict(
        data_path=str(data), total_seq_len=args.max_len, hidden_states_dtype=torch.bfloat16,
        transfer=FileTransfer(cache), vllm_endpoint=url, on_missing=on_missing, verifier_name_or_path=None,
        request_timeout=120.0, max_retries=3, generation_validation_retries=2,
        max_consecutive_generation_failures=20, hidden_size=args.hidden, num_target_layers=3,
        num_workers=args.concurrency, prefetch_factor=4, preprocess=None, train_data_ratio=0.9, seed=42)


def reference_epochs(args, sim, data: Path, cache: Path, on_missing: str, epochs: range) -> list[dict]:
    from speculators.train.dataloader import create_train_val_loaders

    train, val = create_train_val_loaders(**reference_call(args, data, sim.url, cache, on_missing))
    if epochs.start > 0:
        # Epochs of a run that began before: the persistent workers started by one epoch not counted.
        train.batch_sampler.set_epoch(0)
        time_epoch(train)
    out = []
    for epoch in epochs:
        sim.reset()
        train.batch_sampler.set_epoch(epoch)
        out.append(dict(time_epoch(train), epoch=epoch, requests=sim.stats()["completions"]))
    del train, val
    return out


def draftfeed_epochs(args, sim, data: Path, cache: Path, mode: str, budget: int | None = None) -> tuple[list, dict]:
    source = draftfeed.online.OnlineSource(
        sim.url, hidden_states_path=cache, server_dir=sim.server_dir, on_generate=mode, data_path=data,
        fetch_threads=args.concurrency, cache_budget_bytes=budget)
    loader = draftfeed.Loader(str(data), hidden_size=args.hidden, total_seq_len=args.max_len, split="train",
                              train_ratio=0.9, num_target_layers=3, pin_memory=False, prefetch=8, source=source)
    out = []
    try:
        for epoch in range(EPOCHS):
            sim.reset()
            loader.set_epoch(epoch)
            run = dict(time_epoch(loader), epoch=epoch, requests=sim.stats()["completions"])
            if epoch == 0 and mode == "pack":
                source.flush_kept()  # the bytes below are the pack's once epoch 0's rows are in
            run["bytes_on_disk"] = folder_bytes(cache)
            out.append(run)
        kept = source.stats().get("kept", {})
    finally:
        loader.close()
    return out, kept


def warm_pack_epochs(args, data: Path, cache: Path) -> tuple[float, float]:
    """A loader reading the pack (in the page cache) offline: its first epoch (which, as the online
    run's epoch 1, reads each packed sample for the first time in the process: its checksum and its
    blob's hash checked) and the median of three epochs after."""
    loader = draftfeed.Loader(str(data), hidden_size=args.hidden, total_seq_len=args.max_len, split="train",
                              train_ratio=0.9, num_target_layers=3, pin_memory=False, prefetch=8,
                              hidden_states_path=str(cache))
    try:
        loader.set_epoch(1)
        first = time_epoch(loader)["seconds"]
        times = []
        for epoch in (2, 3, 4):
            loader.set_epoch(epoch)
            times.append(time_epoch(loader)["seconds"])
    finally:
        loader.close()
    return first, sorted(times)[1]


def metadata_ops(args, sim, data: Path, cache: Path, mode: str, mount: Path) -> dict:
    """Epoch 1's metadata operations on the folder, read (and, for the rows not kept, looked for)
    through a slowfs mount of it."""
    mount.mkdir(exist_ok=True)
    with SlowFs(cache, mount, latency_ms=0) as fs:
        source = draftfeed.online.OnlineSource(
            sim.url, hidden_states_path=fs.mountpoint, server_dir=sim.server_dir, on_generate=mode,
            data_path=data, fetch_threads=args.concurrency)
        loader = draftfeed.Loader(str(data), hidden_size=args.hidden, total_seq_len=args.max_len, split="train",
                                  train_ratio=0.9, num_target_layers=3, pin_memory=False, prefetch=8, source=source)
        try:
            fs.reset_stats()
            loader.set_epoch(1)
            time_epoch(loader)
            calls = fs.stats()["calls"]
        finally:
            loader.close()
    return metadata_calls(calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=240)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--median", type=float, default=0.1)
    p.add_argument("--p99", type=float, default=1.0)
    p.add_argument("--out", help="folder for online_pack.json")
    args = p.parse_args()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="draftfeed_online_pack_") as tmp:
        work = Path(tmp)
        data = work / "data"
        draftfeed.write_synthetic_dataset(str(data), args.rows, seed=3, min_len=32, max_len=256, vocab=5000)
        bf16 = int(draftfeed.open_dataset(str(data)).total_tokens) * 4 * args.hidden * 2
        with SimServerProcess(work / "server", layers=4, hidden=args.hidden, seed=11,
                              faults={"latency": {"median": args.median, "p99": args.p99, "keyed": True}}) as sim:
            runs: dict[str, dict] = {}
            runs["reference delete"] = {"epochs": reference_epochs(args, sim, data, work / "ref_delete", "generate",
                                                                   range(EPOCHS))}
            epochs, _ = draftfeed_epochs(args, sim, data, work / "df_delete", "delete")
            runs["draftfeed delete"] = {"epochs": epochs}
            epochs, _ = draftfeed_epochs(args, sim, data, work / "df_cache", "cache")
            runs["draftfeed cache"] = {"epochs": epochs}
            # The reference's cache mode, composed (see the docstring): its generation epoch, then
            # its offline epochs over the per-sample folder cache mode keeps.
            ref_cache = work / "ref_cache"
            shutil.copytree(work / "df_cache", ref_cache)
            offline = reference_epochs(args, sim, data, ref_cache, "skip", range(1, EPOCHS))
            runs["reference cache"] = {"epochs": [dict(runs["reference delete"]["epochs"][0]), *offline],
                                       "composed": True}
            for e in runs["reference cache"]["epochs"]:
                e["bytes_on_disk"] = folder_bytes(ref_cache)
            for share in (0.25, 0.5, 1.0):
                cache = work / f"df_pack_{int(share * 100)}"
                epochs, kept = draftfeed_epochs(args, sim, data, cache, "pack", int(share * bf16))
                runs[f"draftfeed pack {int(share * 100)}%"] = {"epochs": epochs, "kept": kept,
                                                              "budget_bytes": int(share * bf16)}
            first_read, bound = warm_pack_epochs(args, data, work / "df_pack_100")
            metadata: dict = {}
            skipped = slowfs_unavailable()
            if not skipped:
                for name, folder, mode in (("draftfeed cache", "df_cache", "cache"),
                                           ("draftfeed pack 100%", "df_pack_100", "pack"),
                                           ("draftfeed pack 50%", "df_pack_50", "pack")):
                    metadata[name] = metadata_ops(args, sim, data, work / folder, mode,
                                                  work / f"mnt_{folder}")
        load.append(os.getloadavg()[0])
        train_rows = int(args.rows * 0.9)
        full = runs["draftfeed pack 100%"]
        half = runs["draftfeed pack 50%"]
        kept_bytes = full["epochs"][0]["bytes_on_disk"]
        per_sample = runs["reference cache"]["epochs"][0]["bytes_on_disk"]
        goals = [
            ("100% budget: epoch 1+ requests 0",
             f"{[e['requests'] for e in full['epochs'][1:]]}", all(e["requests"] == 0 for e in full["epochs"][1:])),
            ("100% budget: epoch 1 within 1.1x of a warm packed cache's epoch (its first, which also reads "
             "each sample for the first time)",
             f"{full['epochs'][1]['seconds'] / first_read:.2f}x ({full['epochs'][1]['seconds']:.3f} s / "
             f"{first_read:.3f} s)", full["epochs"][1]["seconds"] <= 1.1 * first_read),
            ("100% budget: epoch 2 within 1.1x of a warm packed cache's later epochs",
             f"{full['epochs'][2]['seconds'] / bound:.2f}x ({full['epochs'][2]['seconds']:.3f} s / {bound:.3f} s)",
             full["epochs"][2]["seconds"] <= 1.1 * bound),
            ("50% budget: epoch 1+ requests at most the rows not kept",
             f"{[e['requests'] for e in half['epochs'][1:]]} of {train_rows - half['kept'].get('kept', 0)} not kept",
             all(e["requests"] <= train_rows - half["kept"].get("kept", 0) for e in half["epochs"][1:])),
            ("50% budget: bytes on disk at most the budget",
             f"{half['epochs'][0]['bytes_on_disk']} <= {half['budget_bytes']}",
             half["epochs"][0]["bytes_on_disk"] <= half["budget_bytes"]),
            ("kept bytes at most 0.72x of the reference's cache folder (the same rows)",
             f"{kept_bytes / per_sample:.3f}x ({kept_bytes} / {per_sample})", kept_bytes <= 0.72 * per_sample),
        ]
        result = {"status": "done", "rows": args.rows, "train_rows": train_rows, "hidden": args.hidden,
                  "bf16_bytes": bf16, "concurrency": args.concurrency, "median": args.median, "p99": args.p99,
                  "runs": runs, "warm_pack_epoch_seconds": bound,
                  "warm_pack_first_epoch_seconds": first_read, "metadata_ops_epoch1": metadata,
                  "slowfs_skipped": skipped, "goals": [{"goal": g, "measured": m, "met": bool(ok)}
                                                        for g, m, ok in goals],
                  "load": load, "machine": machine()}
    print(render(result))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "online_pack.json").write_text(json.dumps(result, indent=1) + "\n")


def render(result: dict) -> str:
    lines = [f"{result['rows']} rows ({result['train_rows']} trained), 4 layers x {result['hidden']}, "
             f"{result['concurrency']} requests in flight, service time lognormal median {result['median']} s, "
             f"p99 {result['p99']} s (keyed); load {result['load'][0]:.1f} -> {result['load'][1]:.1f}", "",
             "| run | epoch 0 (s, requests) | epoch 1 | epoch 2 | bytes on disk | metadata ops, epoch 1 |",
             "|---|---|---|---|---|---|"]
    for name, run in result["runs"].items():
        cells = [f"{e['seconds']:.2f} s, {e['requests']}" for e in run["epochs"]]
        ops = result["metadata_ops_epoch1"].get(name, {}).get("total", "")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {run['epochs'][0].get('bytes_on_disk', 0)} | {ops} |")
    lines += ["", f"Warm packed cache, read offline: first epoch {result['warm_pack_first_epoch_seconds']:.3f} s, "
              f"later epochs {result['warm_pack_epoch_seconds']:.3f} s (the 100% budget's bounds)", "",
              "| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['measured']} | {'met' if g['met'] else 'NOT met'} |" for g in result["goals"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
