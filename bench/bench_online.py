"""Online generation: an epoch whose hidden states all come from a (simulated) vLLM server with a
heavy-tailed service time, draftfeed against the reference loader, side by side in one run.

    DRAFTFEED_DEV_BUILD=build PYTHONPATH=python python bench/bench_online.py \
        [--rows 320] [--concurrency 16] [--median 0.5] [--p99 10] [--out DIR]

The server (tools/sim_vllm_server.py) sleeps a lognormal time per request (median 0.5 s, p99 10 s by
default) keyed by the prompt, so every run does exactly the same work; nothing is cached (each run
starts from an empty cache and deletes what it generated, as the reference does). Runs:
  * reference: speculators' create_train_val_loaders(on_missing="generate") with num_workers =
    concurrency (each worker fetches its batch's samples one after another), prefetch_factor 4,
    in order, and the same loader's parts in a DataLoader(in_order=False) (as ready);
  * draftfeed in order: Loader(source=OnlineSource(fetch_threads = concurrency)), the samples of
    the batches holding a buffer (--prefetch) in flight at once up to the bound;
  * draftfeed +lookahead, in order and as ready (in_order=False): the same with the source told the
    epoch's rows (the Loader does it each epoch), so it fetches up to --lookahead rows ahead of the buffers;
  * ideal: the total service time of the epoch's requests / concurrency (no scheduling loss), or
    the epoch's longest request when that is longer (no schedule that asks once per row ends before
    it does); each row's first request of the epoch, with the service time the server drew for it.
    draftfeed's lookahead may hedge: ask again for a row whose request ran far past its prediction
    and close the slower connection; the server stops serving it (as vLLM aborts a request whose
    client went away). Such "abandoned" requests are counted (with the server time they took), and
    a hedged epoch may end before the ideal (x ideal < 1).
--service prefill replaces the keyed lognormal by a vLLM-prefill-like model: the time grows with the
prompt's tokens, times a heavy tail drawn anew at each request (tools/sim_vllm_server.py).
With --dropin, the runs are instead both `create_train_val_loaders` called exactly as speculators
0.9.0's trainer calls them (the same keywords and values on both sides; num_workers = --concurrency,
prefetch_factor 4, in order): the reference (each of its num_workers workers fetches its batch's
samples one after another: fetch_threads 1, which 0.9.0 has no argument for) against draftfeed's
drop-in (num_workers x fetch_threads = --concurrency requests in flight, as the reference's).
run.py runs this with the reference's default arguments: num_workers 12, fetch_threads 1.
Each loader runs --epochs epochs (default 2): epoch 0 includes start-up (the reference spawns its
workers and re-imports torch in each), epoch 1 reuses the persistent workers. Prints each epoch's
wall time, the time to its first batch and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))
from bench_common import machine, print_table, time_epoch  # noqa: E402
from sim_vllm_process import SimServerProcess  # noqa: E402

import draftfeed  # noqa: E402


def call_090(args, data: str, url: str, cache: str) -> dict:
    """The keywords speculators 0.9.0's trainer passes (speculators/train/cli.py), nothing else."""
    from hs_connectors import FileTransfer

    return dict(
        data_path=data, total_seq_len=args.max_len, hidden_states_dtype=torch.bfloat16,
        transfer=FileTransfer(Path(cache)), vllm_endpoint=url, on_missing="generate",
        verifier_name_or_path=None, request_timeout=120.0, max_retries=3,
        generation_validation_retries=2, max_consecutive_generation_failures=20,
        hidden_size=args.hidden_size, num_target_layers=3, num_workers=args.concurrency,
        prefetch_factor=4, preprocess=None, train_data_ratio=0.9, seed=42,
    )


def dropin_epochs(args, side: str, data: str, url: str, cache: str) -> list[dict]:
    """Both entry points called as 0.9.0's trainer calls them, the same call on both sides."""
    if side == "ref":
        from speculators.train.dataloader import create_train_val_loaders
    else:
        from draftfeed.speculators import create_train_val_loaders
    train, val = create_train_val_loaders(**call_090(args, data, url, cache))
    results = []
    for epoch in range(args.epochs):
        set_at = time.monotonic()
        train.batch_sampler.set_epoch(epoch)
        results.append(dict(time_epoch(train), set_at=set_at))
    del train, val
    return results


def reference_epoch(args, data: str, url: str, cache: str, in_order: bool = True) -> dict:
    import inspect

    from hs_connectors import FileTransfer
    from speculators.train.dataloader import create_train_val_loaders

    options = dict(
        data_path=data, total_seq_len=args.max_len, hidden_states_dtype=torch.bfloat16,
        transfer=FileTransfer(Path(cache)), vllm_endpoint=url, on_missing="generate",
        verifier_name_or_path=None, request_timeout=120.0, max_retries=3,
        generation_validation_retries=2, max_consecutive_generation_failures=20,
        hidden_size=args.hidden_size, num_target_layers=3, num_workers=args.concurrency,
        prefetch_factor=4, preprocess=None, train_data_ratio=0.9, noise_std=0.0,
    )
    accepted = inspect.signature(create_train_val_loaders).parameters
    train, _ = create_train_val_loaders(**{k: v for k, v in options.items() if k in accepted})
    if not in_order:
        # The same dataset, sampler, collate function and worker set-up, delivered as ready
        # (torch's DataLoader(in_order=False), which suits heavy-tailed fetches).
        from torch.utils.data import DataLoader

        train = DataLoader(
            train.dataset, batch_sampler=train.batch_sampler, num_workers=train.num_workers,
            prefetch_factor=train.prefetch_factor, pin_memory=train.pin_memory,
            collate_fn=train.collate_fn, persistent_workers=True,
            multiprocessing_context=train.multiprocessing_context,
            worker_init_fn=train.worker_init_fn, in_order=False)
    results = []
    for epoch in range(args.epochs):
        set_at = time.monotonic()
        train.batch_sampler.set_epoch(epoch)
        results.append(dict(time_epoch(train), set_at=set_at))
    del train
    return results


def draftfeed_epoch(args, data: str, url: str, cache: str, server_dir: str, in_order: bool,
                    lookahead: bool) -> dict:
    source = draftfeed.online.OnlineSource(
        url, hidden_states_path=cache, server_dir=server_dir, on_generate="delete",
        fetch_threads=args.concurrency, data_path=data,
        lookahead=args.lookahead if lookahead else 0)
    loader = draftfeed.Loader(
        data, hidden_size=args.hidden_size, total_seq_len=args.max_len, split="train",
        train_ratio=0.9, num_target_layers=3, noise_std=0.0, in_order=in_order,
        prefetch=args.prefetch, num_threads=2,
        pin_memory=False, source=source)
    results = []
    for epoch in range(args.epochs):
        set_at = time.monotonic()
        loader.set_epoch(epoch)  # the Loader hands a lookahead source the epoch's rows itself
        results.append(dict(time_epoch(loader), set_at=set_at))
        lookahead_stats = source.stats().get("lookahead")
        if lookahead_stats:
            memory = lookahead_stats["memory"]
            results[-1]["hedges"] = memory["hedges"]  # so far, over the run's epochs
            results[-1]["hedges_won"] = memory["hedges_won"]
            results[-1]["hedges_lost"] = memory["hedges_lost"]
        if results[-1]["tokens"] == 0:
            raise SystemExit(f"draftfeed generated nothing: {source.stats()}")
    loader.close()
    return results


def requests_by_epoch(timeline: list[dict], boundaries: list[float]) -> dict[int, list[dict]]:
    """The server's requests by epoch: those started from `boundaries[e]` (time.monotonic() when
    epoch e was set, before a lookahead may ask for its rows) until the next epoch's. A request the
    client hung up on (a hedge that lost, or the request a hedge beat) counts in the epoch it
    started in, as an abandoned one."""
    out: dict[int, list[dict]] = {}
    for t in timeline:
        epoch = sum(1 for b in boundaries[1:] if t["start"] >= b)
        out.setdefault(epoch, []).append(t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=320)
    p.add_argument("--min-len", type=int, default=32)
    p.add_argument("--max-len-row", type=int, default=256, help="longest row")
    p.add_argument("--max-len", type=int, default=1024, help="tokens per batch (total_seq_len)")
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prefetch", type=int, default=16, help="draftfeed batch buffers")
    p.add_argument("--lookahead", type=int, default=64,
                   help="rows the +lookahead runs fetch ahead of the buffers at most")
    p.add_argument("--median", type=float, default=0.5)
    p.add_argument("--p99", type=float, default=10.0)
    p.add_argument("--service", choices=("latency", "prefill"), default="latency",
                   help="latency: lognormal keyed by the prompt; prefill: grows with the prompt's"
                   " tokens (the median-length prompt takes --median), times a tail drawn anew at"
                   " each request (p99 / median = --p99 / --median)")
    p.add_argument("--epochs", type=int, default=2,
                   help="epochs per loader: the first includes start-up (the reference spawns its"
                   " workers), later ones reuse the persistent workers")
    p.add_argument("--skip-reference", action="store_true")
    p.add_argument("--dropin", action="store_true",
                   help="both sides through create_train_val_loaders, called as 0.9.0's trainer does")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench_online_") as tmp:
        data = os.path.join(tmp, "data")
        draftfeed.write_synthetic_dataset(data, args.rows, seed=0, min_len=args.min_len,
                                          max_len=args.max_len_row)
        server_dir = os.path.join(tmp, "server")
        if args.service == "latency":
            service_model = {"latency": {"median": args.median, "p99": args.p99, "keyed": True}}
        else:
            middle = (args.min_len + args.max_len_row) / 2
            service_model = {"prefill": {"base": 0.1 * args.median,
                                         "per_token": 0.9 * args.median / middle,
                                         "tail_p99": args.p99 / args.median}}
        with SimServerProcess(server_dir, hidden=args.hidden_size, layers=4) as sim:
            sim.set_faults(service_model)
            runs = []
            plan = [("draftfeed in order", "draftfeed", True),
                    ("draftfeed in order +lookahead", "lookahead", True),
                    ("draftfeed as ready +lookahead", "lookahead", False)]
            if not args.skip_reference:
                plan[:0] = [("reference in order", "ref", True), ("reference as ready", "ref", False)]
            if args.dropin:
                plan = [(f"reference, {args.concurrency} workers", "ref", True),
                        (f"draftfeed drop-in, {args.concurrency} workers", "dropin", True)]
            for name, side, in_order in plan:
                sim.reset(connections=True)
                cache = os.path.join(tmp, "cache_" + name.replace(" ", "_"))
                start = time.perf_counter()
                if args.dropin:
                    epochs = dropin_epochs(args, side, data, sim.url, cache)
                elif side == "ref":
                    epochs = reference_epoch(args, data, sim.url, cache, in_order)
                else:
                    epochs = draftfeed_epoch(args, data, sim.url, cache, server_dir, in_order,
                                             side == "lookahead")
                stats = sim.stats()
                by_epoch = requests_by_epoch(stats["timeline"], [r["set_at"] for r in epochs])
                for epoch, result in enumerate(epochs):
                    requests = by_epoch.get(epoch, [])
                    # Each row's first request of the epoch, as drawn: what a schedule that asks
                    # once per row has to serve (a hedge asks a second time; see the docstring).
                    first: dict[int, dict] = {}
                    for t in sorted(requests, key=lambda t: t["start"]):
                        first.setdefault(t["prompt"], t)
                    own = [t["service"] for t in first.values()]
                    lost = [t["served"] for t in requests if t["abandoned"]]
                    result.update(name=f"{name}, epoch {epoch}", epoch=epoch,
                                  ideal_seconds=max(sum(own) / args.concurrency, max(own)),
                                  epoch_service_seconds=sum(own), epoch_longest=max(own),
                                  abandoned=len(lost), abandoned_seconds=sum(lost))
                    runs.append(result)
                summary = dict(requests=stats["completions"], service_seconds=stats["service_seconds"],
                               longest_request=stats["max_service_seconds"],
                               max_in_flight=stats["max_in_flight"], connections=stats["connections"],
                               wall=time.perf_counter() - start)
                for result in runs[-len(epochs):]:
                    result.update(summary)
                times = " + ".join(f"{r['seconds']:.1f}" for r in epochs)
                print(f"{name}: {times} s, "
                      f"{summary['requests']} requests, max {summary['max_in_flight']} in flight, "
                      f"{summary['connections']} connections", flush=True)

    # Every run makes the same requests (nothing is cached); each epoch's ideal is its own
    # requests' service over the concurrency, or its longest request if that is longer.
    service = runs[-1]["epoch_service_seconds"]
    ideal = runs[-1]["ideal_seconds"]
    print()
    print(machine())
    print(f"{args.rows} rows ({args.min_len}-{args.max_len_row} tokens), H={args.hidden_size}, L=4 bf16, "
          f"total_seq_len {args.max_len}; service {args.service}: {service_model[args.service]}; concurrency {args.concurrency}; draftfeed prefetch {args.prefetch} "
          f"buffers, lookahead {args.lookahead} rows")
    longest = runs[-1]["longest_request"]
    print(f"ideal: {service:.1f} s of service / {args.concurrency} = {ideal:.1f} s; longest request "
          f"{longest:.1f} s, so no schedule ends before {max(ideal, longest):.1f} s, and list scheduling "
          f"in plan order (durations unknown) guarantees {ideal + longest:.1f} s")
    rows = []
    # Each run against the reference with the same delivery order, same epoch.
    def order(name: str) -> str:
        return "as ready" if "as ready" in name else "in order"

    reference = {(order(r["name"]), r["epoch"]): r for r in runs if r["name"].startswith("reference")}
    for r in runs:
        ref = reference.get((order(r["name"]), r["epoch"]))
        rows.append((r["name"], f"{r['seconds']:.1f}", f"{r['first_batch']:.1f}", r["batches"],
                     f"{r['seconds'] / r['ideal_seconds']:.2f}",
                     f"{r['abandoned']} ({r['abandoned_seconds']:.1f} s)",
                     f"{ref['seconds'] / r['seconds']:.2f}" if ref else "-"))
    print_table(rows, ("run", "epoch s", "first batch s", "batches", "x ideal",
                       "abandoned requests (server s)",
                       "reference / this (same order, same epoch)"))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "online.json", "w") as f:
            json.dump(dict(args=vars(args), ideal_seconds=ideal, service_model=service_model, runs=runs,
                           machine=machine()), f,
                      indent=2)


if __name__ == "__main__":
    main()
