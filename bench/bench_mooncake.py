"""Online epochs through a real Mooncake Store: the reference loader, draftfeed's drop-in with
hs-connectors' Python transfer called back per sample, and the drop-in with its native transfer,
side by side in one run on the same data, each against its ideal.

    PYTHONPATH=python DRAFTFEED_DEV_BUILD=build/dev python bench/bench_mooncake.py \
        [--rows 128] [--hidden-size 2048] [--in-flight 12 8] [--epochs 2] [--out DIR --name NAME]

Mooncake's store clients listen on every interface, so the benchmark runs inside a private network
namespace holding only the loopback: started outside one, it re-runs itself inside a new one
(`unshare`; root, or a user namespace where allowed). There:
  * a real `mooncake_master` on 127.0.0.1 (tools/mooncake_master_process.py);
  * the simulated vLLM server in mooncake mode (tools/sim_vllm_server.py): each request's sample is
    put into the store by hs-connectors' own `MooncakeHiddenStatesConnector` code, after the
    answer (as with vLLM: the consumer polls), with a service time keyed by the prompt
    (lognormal, --median / --p99: every run does the same work);
  * every side calls `create_train_val_loaders` exactly as speculators 0.9.0's trainer does, with
    `transfer = HiddenStatesBackend.registry["mooncake"].from_train_args(args, data_path)` (the
    backend's default arguments but --mooncake-master) and on_missing="generate": every sample of
    every epoch is generated, put into the store, read back and deleted. "python" is the drop-in
    with DRAFTFEED_MOONCAKE=python (hs-connectors' MooncakeTransfer.get_generated called per
    sample under the GIL), "native" the drop-in as it is (draftfeed.mooncake: batch_get_into into
    registered memory);
  * --in-flight: the requests in flight, num_workers on every side (0.9.0 passes no fetch_threads:
    the drop-in keeps num_workers x 1 requests in flight, as the reference): 12 is the reference's
    default, prefetch_factor its default 4;
  * the ideal of an epoch is the longer of two bounds: the requests' (the server's service times
    of the epoch's requests, as its timeline says, served with unbounded concurrency by the
    server: their sum over the requests in flight, or the longest one if that is longer) and the
    store's (the epoch's hidden-state bytes at the rate of the store's own batch_get_into,
    measured on the same objects in a loop that does nothing else, the keys in groups of the
    requests in flight);
  * every batch is fingerprinted (its token ids, document ids and a strided sum of the verifier's
    last hidden states, which no noise touches) and compared with the reference's;
  * the master's key count after each epoch (waited for up to 10 s: a hedged request's loser may
    still be putting its sample) must be 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))
from mooncake_master_process import (  # noqa: E402
    IN_PRIVATE_NETWORK,
    MooncakeMasterProcess,
    enter_private_network,
    private_network_command,
    private_network_unavailable,
)

SIDES = ("reference", "python", "native")
LAYERS = 4


def trainer_transfer(master: MooncakeMasterProcess, data_path: str):
    """What speculators 0.9.0's trainer builds for `--hidden-states-backend mooncake
    --mooncake-master ADDRESS` (every other backend argument at its default)."""
    from hs_connectors import HiddenStatesBackend

    backend = HiddenStatesBackend.registry["mooncake"]
    parser = argparse.ArgumentParser()
    backend.add_train_args(parser)
    return backend.from_train_args(parser.parse_args(["--mooncake-master", master.address]),
                                   data_path)


def call_090(args, data: str, url: str, transfer, workers: int) -> dict:
    """The keywords speculators 0.9.0's trainer passes (speculators/train/cli.py), nothing else."""
    import torch

    return dict(
        data_path=data, total_seq_len=args.max_len, hidden_states_dtype=torch.bfloat16,
        transfer=transfer, vllm_endpoint=url, on_missing="generate", verifier_name_or_path=None,
        request_timeout=120.0, max_retries=3, generation_validation_retries=2,
        max_consecutive_generation_failures=20, hidden_size=args.hidden_size,
        num_target_layers=LAYERS - 1, num_workers=workers, prefetch_factor=4, preprocess=None,
        train_data_ratio=0.9, seed=42,
    )


def fingerprint(batch) -> tuple:
    last = batch["verifier_last_hidden_states"]
    return (int(batch["input_ids"].sum()), int(batch["document_ids"].sum()),
            round(float(last[..., ::97].float().sum()), 3))


def timed_epoch(loader) -> dict:
    """One epoch: seconds, first batch, tokens, hidden-state bytes, fingerprints."""
    start = time.perf_counter()
    first, tokens, hidden_bytes, prints = None, 0, 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            rows = int((batch["document_ids"] >= 0).sum())
            tokens += rows
            for key in ("hidden_states", "verifier_last_hidden_states"):
                hidden_bytes += rows * batch[key].shape[-1] * batch[key].element_size()
            prints.append(fingerprint(batch))
    seconds = time.perf_counter() - start
    return dict(seconds=seconds, first_batch=first or seconds, tokens=tokens,
                hidden_bytes=hidden_bytes, batches=len(prints), fingerprints=prints)


def requests_ideal(timeline: list[dict], in_flight: int) -> float:
    service = [r["service"] for r in timeline]
    return max(sum(service) / in_flight, max(service, default=0.0))


def keys_after(master: MooncakeMasterProcess, within: float = 10.0) -> int:
    deadline = time.monotonic() + within
    while master.key_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    return master.key_count()


def run_side(side: str, in_flight: int, args, data: str, sim, master, store_rate: float) -> list:
    from bench_common import tree_cpu_seconds

    os.environ["DRAFTFEED_MOONCAKE"] = "python" if side == "python" else "native"
    if side == "reference":
        from speculators.train.dataloader import create_train_val_loaders
    else:
        from draftfeed.speculators import create_train_val_loaders
    transfer = trainer_transfer(master, data)
    train, val = create_train_val_loaders(**call_090(args, data, sim.url, transfer, in_flight))
    results = []
    for epoch in range(args.epochs):
        train.batch_sampler.set_epoch(epoch)
        sim.reset()
        sim_cpu0, cpu0 = tree_cpu_seconds(sim.process.pid), tree_cpu_seconds()
        result = timed_epoch(train)
        stats = sim.stats()
        result.update(
            cpu_seconds=tree_cpu_seconds() - cpu0,
            server_cpu_seconds=tree_cpu_seconds(sim.process.pid) - sim_cpu0,
            requests=stats["completions"],
            requests_ideal=requests_ideal(stats["timeline"], in_flight),
            store_ideal=result["hidden_bytes"] / store_rate,
            keys_left=keys_after(master))
        if result["keys_left"]:
            result["keys"] = master.keys()[:20]  # what was left, to tell a leak from a late put
        result["ideal"] = max(result["requests_ideal"], result["store_ideal"])
        if side != "reference":
            metrics = train.metrics()
            result["lookahead"] = {k: metrics["read_ahead_memory"][k] for k in
                                   ("hedges", "hedges_won", "hedges_lost")}
            result["mooncake"] = metrics.get("online", {}).get("mooncake")
        results.append(result)
        print(f"  {side}, {in_flight} in flight, epoch {epoch}: {result['seconds']:.2f} s "
              f"(ideal {result['ideal']:.2f} s), {result['tokens']} tokens, "
              f"{result['keys_left']} keys left" + (f" {result['keys']}" if result["keys_left"] else ""),
              flush=True)
    # Leave the store while the master is up (workers and clients unmount their segments).
    if hasattr(train, "close"):
        train.close()
    del train, val, transfer
    gc.collect()
    return results


def ask_every_row(sim, prompts: list[list[int]]) -> list[str]:
    def ask(ids):
        body = {"model": sim.model, "prompt": ids, "max_tokens": 1, "return_token_ids": True}
        request = urllib.request.Request(sim.url + "/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())["kv_transfer_params"]

    with ThreadPoolExecutor(8) as pool:
        manifests = list(pool.map(ask, prompts))
    deadline = time.monotonic() + 120
    while sim.stats()["pending_writes"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return manifests


def store_rate(sim, master, prompts: list[list[int]], group: int, repeats: int = 3) -> dict:
    """The store's own batch_get_into rate of the epoch's objects: every row put once by the
    server, then read back `repeats` times with the trainer's store settings, `group` keys per
    call into one registered buffer, in a loop that does nothing else; the best pass. Then the
    keys are deleted."""
    import numpy as np
    from mooncake.store import MooncakeDistributedStore

    manifests = ask_every_row(sim, prompts)
    config = trainer_transfer(master, "").store.config
    client = MooncakeDistributedStore()
    assert client.setup(config.local_hostname, config.metadata_server, config.global_segment_size,
                        config.local_buffer_size, config.protocol, config.device_name,
                        config.master_server_address) == 0
    keys = [m["handle"] for m in manifests]
    sizes = [m["metadata"]["total_aligned_bytes"] for m in manifests]
    capacity = sum(sorted(sizes)[-group:])
    buffer = np.empty(capacity, dtype=np.uint8)
    assert client.register_buffer(buffer.ctypes.data, capacity) == 0
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(0, len(keys), group):
            chunk = keys[i:i + group]
            lengths = sizes[i:i + group]
            offsets = np.cumsum([0, *lengths[:-1]])
            got = client.batch_get_into(chunk, [buffer.ctypes.data + int(o) for o in offsets],
                                        lengths)
            assert got == lengths, (got, lengths)
        passes.append(time.perf_counter() - start)
    for key in keys:
        client.remove(key, force=True)
    client.unregister_buffer(buffer.ctypes.data)
    client.close()
    total = sum(sizes)
    best = min(passes)
    return dict(bytes=total, seconds=best, passes=passes, rate=total / best, group=group)


def inside(args) -> None:
    from bench_common import machine
    from sim_vllm_process import SimServerProcess

    import draftfeed

    enter_private_network()
    os.environ["MOONCAKE_LOCAL_HOSTNAME"] = "127.0.0.1"  # the one address in the namespace
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_mooncake_") as tmp:
        data = os.path.join(tmp, "data")
        draftfeed.write_synthetic_dataset(data, args.rows, seed=0, min_len=args.min_len,
                                          max_len=args.max_len_row)
        dataset = draftfeed.open_dataset(data)
        prompts = [dataset.row(i)["input_ids"].tolist() for i in range(len(dataset))]
        with MooncakeMasterProcess() as master, SimServerProcess(
                os.path.join(tmp, "server"), hidden=args.hidden_size, layers=LAYERS,
                write=args.write, mooncake_master=master.address,
                mooncake_segment_mib=args.segment_mib, memo_mib=args.memo_mib,
                startup_timeout=120) as sim:
            # The server computes each row once (it keeps the hidden states); no service time yet.
            rates = {c: store_rate(sim, master, prompts, c) for c in args.in_flight}
            print("store batch_get_into: " + ", ".join(
                f"{r['rate'] / 1e9:.2f} GB/s ({c} keys a call)" for c, r in rates.items()) +
                f"; keys left {master.key_count()}", flush=True)
            if args.median:
                sim.set_faults({"latency": {"median": args.median, "p99": args.p99 or args.median,
                                            "keyed": True}})
            runs: dict = {}
            for in_flight in args.in_flight:
                for side in SIDES:
                    runs[f"{side}/{in_flight}"] = run_side(side, in_flight, args, data, sim, master,
                                                           rates[in_flight]["rate"])
    load_after = os.getloadavg()
    summary = summarize(args, runs)
    for line in report(args, runs, rates, summary, machine(), (load_before, load_after)):
        print(line)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for r in runs.values():
            for e in r:
                e.pop("fingerprints", None)
        results = dict(args=vars(args), runs=runs, store=rates, goals=summary, machine=machine(),
                       load_average={"before": load_before, "after": load_after})
        (out / f"{args.name}.json").write_text(json.dumps(results, indent=2))
        (out / f"{args.name}.md").write_text(
            "\n".join(report(args, runs, rates, summary, machine(), (load_before, load_after)))
            + "\n")


def summarize(args, runs: dict) -> dict:
    """The issue's goals from the runs, and whether every side delivered the reference's batches
    and left the store empty."""
    defaults, eight = max(args.in_flight), min(args.in_flight)
    out: dict = {"same_batches": True, "store_empty": True}
    for key, epochs in runs.items():
        side, in_flight = key.split("/")
        ref = runs[f"reference/{in_flight}"]
        for e, r in enumerate(epochs):
            out["store_empty"] &= r["keys_left"] == 0
            if side != "reference":
                same = r["fingerprints"] == ref[e]["fingerprints"]
                r["same_batches"] = same
                out["same_batches"] &= same
    native_d, ref_d = runs[f"native/{defaults}"], runs[f"reference/{defaults}"]
    out["native_vs_reference_at_defaults"] = [r["seconds"] / n["seconds"]
                                              for n, r in zip(native_d, ref_d)]
    out["native_x_ideal"] = {c: [n["seconds"] / n["ideal"] for n in runs[f"native/{c}"]]
                             for c in args.in_flight}
    out["defaults"], out["eight"] = defaults, eight
    out["met_5x"] = min(out["native_vs_reference_at_defaults"]) >= 5
    out["met_1_1x_ideal"] = max(out["native_x_ideal"][eight]) <= 1.1
    return out


def report(args, runs, rates, summary, machine: str, loads) -> list[str]:
    per_token = LAYERS * args.hidden_size * 2
    lines = [
        f"**Mooncake Store: the reference, the drop-in with hs-connectors' Python transfer and the "
        f"drop-in native ({args.rows} rows of {args.min_len}-{args.max_len_row} tokens, H="
        f"{args.hidden_size}, {LAYERS} layers bf16 ({per_token // 1024} KiB per token through the "
        f"store), total_seq_len {args.max_len}; service time lognormal keyed by prompt, median "
        f"{args.median} s, p99 {args.p99 or args.median} s; the server puts {args.write})**",
        "",
        "| in flight | run | epoch | epoch s | first batch s | tokens/s | ideal s (requests / store) "
        "| x ideal | vs reference | same batches | keys left |",
        "|---:|:---|---:|---:|---:|---:|---:|---:|---:|:---|---:|",
    ]
    for key, epochs in runs.items():
        side, in_flight = key.split("/")
        ref = runs[f"reference/{in_flight}"]
        for e, r in enumerate(epochs):
            lines.append(
                f"| {in_flight} | {side} | {e} | {r['seconds']:.2f} | {r['first_batch']:.2f} | "
                f"{r['tokens'] / r['seconds']:,.0f} | {r['ideal']:.2f} ({r['requests_ideal']:.2f} / "
                f"{r['store_ideal']:.2f}) | {r['seconds'] / r['ideal']:.2f} | "
                f"{ref[e]['seconds'] / r['seconds']:.2f}x | {r.get('same_batches', '-')} | "
                f"{r['keys_left']} |")
    lines += [
        "",
        "Store rate (batch_get_into of the epoch's objects, nothing else running but the idle "
        "server): " + ", ".join(f"{r['rate'] / 1e9:.2f} GB/s with {c} keys a call"
                                for c, r in rates.items()) + ".",
        f"Goals: native >= 5x the reference at its defaults ({summary['defaults']} in flight): "
        + ", ".join(f"{x:.2f}x" for x in summary["native_vs_reference_at_defaults"])
        + (" (met)" if summary["met_5x"] else " (NOT met)")
        + f"; native within 1.1x of the ideal with {summary['eight']} in flight: "
        + ", ".join(f"{x:.2f}x" for x in summary["native_x_ideal"][summary["eight"]])
        + (" (met)" if summary["met_1_1x_ideal"] else " (NOT met)")
        + f"; every side's batches the reference's: {summary['same_batches']}; the store empty "
        f"after every epoch: {summary['store_empty']}.",
        f"{machine}; load average before {loads[0][0]:.2f}, after {loads[1][0]:.2f} (1 min). "
        "Epoch 0 includes start-up (the reference spawns its workers, each importing torch and "
        "setting up its own store client); the server and the loader share the machine's cores.",
    ]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len-row", type=int, default=1024, help="longest row")
    p.add_argument("--max-len", type=int, default=4096, help="tokens per batch (total_seq_len)")
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--in-flight", type=int, nargs="+", default=[12, 8],
                   help="requests in flight (num_workers on every side); the largest is taken as "
                        "the reference's defaults")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--write", default="async", choices=["sync", "async"],
                   help="the server puts each sample after answering (async) or before")
    p.add_argument("--median", type=float, default=0.25, help="service time median, s (0: none)")
    p.add_argument("--p99", type=float, default=1.0)
    p.add_argument("--segment-mib", type=int, default=2048,
                   help="memory the server's store client mounts into the store")
    p.add_argument("--memo-mib", type=int, default=4096,
                   help="hidden states the server keeps to answer each prompt again")
    p.add_argument("--timeout", type=float, default=3000.0,
                   help="seconds the whole benchmark may take inside the namespace")
    p.add_argument("--out", help="write the results here, as NAME.json and NAME.md")
    p.add_argument("--name", default="mooncake")
    args = p.parse_args()
    if os.environ.get(IN_PRIVATE_NETWORK) == "1":
        inside(args)
        return
    reason = private_network_unavailable()
    if reason is not None:
        raise SystemExit(f"cannot make a private network namespace (Mooncake's store clients listen "
                         f"on every interface, so the benchmark runs only inside one): {reason}")
    command = private_network_command([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]])
    process = subprocess.Popen(command, start_new_session=True)
    try:
        sys.exit(process.wait(timeout=args.timeout))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        raise SystemExit(f"the benchmark did not end in {args.timeout} s") from None


if __name__ == "__main__":
    main()
