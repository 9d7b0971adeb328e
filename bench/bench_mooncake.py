"""Online epochs through a real Mooncake Store: the reference loader and draftfeed's drop-in, side by
side in one run, on the same data.

    PYTHONPATH=python DRAFTFEED_DEV_BUILD=build/dev python bench/bench_mooncake.py \
        [--rows 128] [--hidden-size 2048] [--workers 2] [--epochs 2] [--out DIR]

Mooncake's store clients listen on every interface, so the benchmark runs inside a private network
namespace holding only the loopback: started outside one, it re-runs itself inside a new one
(`unshare`; root, or a user namespace where allowed). There:
  * a real `mooncake_master` on 127.0.0.1 (tools/mooncake_master_process.py);
  * the simulated vLLM server in mooncake mode (tools/sim_vllm_server.py): each request's sample is
    put into the store by hs-connectors' own `MooncakeHiddenStatesConnector` code, the answer
    carries its transfer manifest (--write async: the answer may come before the put, as with
    vLLM); no service time unless --median is given, so the data path is what is measured;
  * both sides call `create_train_val_loaders` exactly as speculators 0.9.0's trainer does, with
    `transfer = HiddenStatesBackend.registry["mooncake"].from_train_args(args, data_path)` (the
    backend's default arguments but --mooncake-master) and on_missing="generate": every sample of
    every epoch is generated, put into the store, read back by `MooncakeTransfer.get_generated`
    and deleted;
  * the reference with its defaults scaled to the 2 cores: num_workers 2 (default 12; --workers),
    prefetch_factor 4 (its default); draftfeed with the same arguments (2 engine threads, 2
    requests in flight: num_workers x fetch_threads, as the reference);
  * before the timed runs, one untimed pass asks the server for every row once, so it has every
    sample's hidden states at hand (--memo-mib) and no run pays for computing them;
  * each loader runs --epochs epochs of its training split: epoch 0 includes start-up (the
    reference spawns its workers, each re-importing torch and setting up its own store client);
    tokens/s counts the tokens delivered (padding excluded); both sides deliver the same number;
  * the master's key count is checked to be 0 after each run (every key deleted).
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


def trainer_transfer(master: MooncakeMasterProcess, data_path: str):
    """What speculators 0.9.0's trainer builds for `--hidden-states-backend mooncake
    --mooncake-master ADDRESS` (every other backend argument at its default)."""
    from hs_connectors import HiddenStatesBackend

    backend = HiddenStatesBackend.registry["mooncake"]
    parser = argparse.ArgumentParser()
    backend.add_train_args(parser)
    return backend.from_train_args(parser.parse_args(["--mooncake-master", master.address]),
                                   data_path)


def call_090(args, data: str, url: str, transfer) -> dict:
    """The keywords speculators 0.9.0's trainer passes (speculators/train/cli.py), nothing else."""
    import torch

    return dict(
        data_path=data, total_seq_len=args.max_len, hidden_states_dtype=torch.bfloat16,
        transfer=transfer, vllm_endpoint=url, on_missing="generate", verifier_name_or_path=None,
        request_timeout=120.0, max_retries=3, generation_validation_retries=2,
        max_consecutive_generation_failures=20, hidden_size=args.hidden_size,
        num_target_layers=3, num_workers=args.workers, prefetch_factor=4, preprocess=None,
        train_data_ratio=0.9, seed=42,
    )


def run_side(side: str, args, data: str, sim, master) -> list[dict]:
    from bench_common import time_epoch, tree_cpu_seconds

    if side == "reference":
        from speculators.train.dataloader import create_train_val_loaders
    else:
        from draftfeed.speculators import create_train_val_loaders
    transfer = trainer_transfer(master, data)
    train, val = create_train_val_loaders(**call_090(args, data, sim.url, transfer))
    results = []
    for epoch in range(args.epochs):
        train.batch_sampler.set_epoch(epoch)
        sim_cpu0, cpu0 = tree_cpu_seconds(sim.process.pid), tree_cpu_seconds()
        result = time_epoch(train)
        result.update(cpu_seconds=tree_cpu_seconds() - cpu0,
                      server_cpu_seconds=tree_cpu_seconds(sim.process.pid) - sim_cpu0)
        results.append(result)
        print(f"  {side} epoch {epoch}: {result['seconds']:.2f} s, {result['tokens']} tokens, "
              f"{result['tokens'] / result['seconds']:,.0f} tokens/s", flush=True)
    keys = master.key_count()
    for result in results:
        result["keys_left"] = keys
    # Leave the store while the master is up (workers and clients unmount their segments).
    del train, val, transfer
    gc.collect()
    return results


def warm_server(sim, data: str, master) -> float:
    """Asks the server for every row once (it keeps the hidden states), then deletes the keys."""
    import draftfeed

    dataset = draftfeed.open_dataset(data)
    prompts = [dataset.row(i)["input_ids"].tolist() for i in range(len(dataset))]

    def ask(ids):
        body = {"model": sim.model, "prompt": ids, "max_tokens": 1, "return_token_ids": True}
        request = urllib.request.Request(sim.url + "/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())["kv_transfer_params"]["handle"]

    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        handles = list(pool.map(ask, prompts))
    transfer = trainer_transfer(master, data)
    transfer.setup()
    deadline = time.monotonic() + 60
    while sim.stats()["pending_writes"] and time.monotonic() < deadline:
        time.sleep(0.05)
    for handle in handles:
        transfer.delete(handle)
    del transfer
    gc.collect()
    return time.perf_counter() - start


def inside(args) -> None:
    from bench_common import machine, print_table
    from sim_vllm_process import SimServerProcess

    import draftfeed

    enter_private_network()
    os.environ["MOONCAKE_LOCAL_HOSTNAME"] = "127.0.0.1"  # the one address in the namespace
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="bench_mooncake_") as tmp:
        data = os.path.join(tmp, "data")
        draftfeed.write_synthetic_dataset(data, args.rows, seed=0, min_len=args.min_len,
                                          max_len=args.max_len_row)
        with MooncakeMasterProcess() as master, SimServerProcess(
                os.path.join(tmp, "server"), hidden=args.hidden_size, layers=4, write=args.write,
                mooncake_master=master.address, mooncake_segment_mib=args.segment_mib,
                memo_mib=args.memo_mib, startup_timeout=120) as sim:
            if args.median:
                sim.set_faults({"latency": {"median": args.median, "p99": args.p99 or args.median,
                                            "keyed": True}})
            warm = warm_server(sim, data, master)
            print(f"server warmed in {warm:.1f} s (every row once, keys deleted: "
                  f"{master.key_count()} left)", flush=True)
            runs = {}
            for side in ("reference", "draftfeed"):
                sim.reset()
                runs[side] = run_side(side, args, data, sim, master)
                runs[side + "_requests"] = sim.stats()["completions"]
            mooncake = sim.stats().get("mooncake", {})

    ref, ours = runs["reference"], runs["draftfeed"]
    for a, b in zip(ref, ours):
        if a["tokens"] != b["tokens"] or a["batches"] != b["batches"]:
            raise SystemExit(f"the sides delivered different epochs: {a} vs {b}")
    per_token = 4 * args.hidden_size * 2
    print()
    print(machine())
    print(f"{args.rows} rows ({args.min_len}-{args.max_len_row} tokens), H={args.hidden_size}, "
          f"L=4 bf16 ({per_token // 1024} KiB per token through the store), total_seq_len "
          f"{args.max_len}; num_workers {args.workers}, prefetch_factor 4 (both); server writes "
          f"{args.write}; requests: reference {runs['reference_requests']}, draftfeed "
          f"{runs['draftfeed_requests']}; keys left: reference {ref[-1]['keys_left']}, "
          f"draftfeed {ours[-1]['keys_left']}")
    rows = []
    for epoch, (a, b) in enumerate(zip(ref, ours)):
        for name, r in (("reference", a), ("draftfeed", b)):
            rows.append((f"{name}, epoch {epoch}", f"{r['seconds']:.2f}", f"{r['first_batch']:.2f}",
                         r["tokens"], f"{r['tokens'] / r['seconds']:,.0f}",
                         f"{r['hidden_bytes'] / r['seconds'] / 1e9:.2f}",
                         f"{r['cpu_seconds']:.1f}", f"{r['server_cpu_seconds']:.1f}",
                         f"{(b['tokens'] / b['seconds']) / (a['tokens'] / a['seconds']):.2f}x"
                         if name == "draftfeed" else "1.00x"))
    print_table(rows, ("run", "epoch s", "first batch s", "tokens", "tokens/s", "GB/s",
                       "loader CPU s", "server CPU s", "vs reference"))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "mooncake.json", "w") as f:
            json.dump(dict(args=vars(args), runs=runs, machine=machine(), server=mooncake), f,
                      indent=2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len-row", type=int, default=1024, help="longest row")
    p.add_argument("--max-len", type=int, default=4096, help="tokens per batch (total_seq_len)")
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--workers", type=int, default=2,
                   help="num_workers on both sides (the reference's default 12, scaled to 2 cores)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--write", default="async", choices=["sync", "async"],
                   help="the server puts each sample after answering (async) or before")
    p.add_argument("--median", type=float, default=0.0, help="service time median, s (0: none)")
    p.add_argument("--p99", type=float, default=0.0)
    p.add_argument("--segment-mib", type=int, default=1024,
                   help="memory the server's store client mounts into the store")
    p.add_argument("--memo-mib", type=int, default=4096,
                   help="hidden states the server keeps to answer each prompt again")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds the whole benchmark may take inside the namespace")
    p.add_argument("--out", help="write the results as JSON here")
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
