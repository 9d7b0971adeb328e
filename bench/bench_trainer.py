"""The trainer's view: speculators 0.9.0's own trainer, on CPU, a fixed number of steps with each
loader, and how long it waited for data.

    PYTHONPATH=python DRAFTFEED_DEV_BUILD=build/dev python bench/bench_trainer.py \
        [--steps 40] [--workers 2] [--seq-len 1024] [--hidden 256] [--rows 400] [--out DIR] [--json] \
        [--gpu]

With --gpu (scripts/gpu_check.sh; needs an NVIDIA GPU and torch's CUDA build) the trainer runs on the
GPU unpatched, and draftfeed runs twice: with its device stage (batches copied to the GPU ahead of the
trainer, the drop-in's default with CUDA) and without (`draftfeed-host`: DRAFTFEED_DEVICE_STAGE=0,
batches in page-locked host memory that the trainer's `.to(..., non_blocking=True)` copies).

It drives tests/python/trainer_harness.py (the harness of the drop-in's trainer test, imported and
run, not copied): `prepare` makes a tiny random Llama verifier, a dataset and its bf16 hidden-state
cache (sizes set here through the harness's module constants: --hidden, --rows, --lengths); `train`
runs `speculators train` (speculators.train.cli.main with flags resolved by its TrainConfig), once
with its own loaders and once with the one import swapped for draftfeed's, everything else equal:
the same flags, CPU device patches, one torch intra-op thread for the trainer, --max-steps steps,
num_workers --workers and prefetch_factor 4 for both loaders (the reference's default is 12
workers; 2 is this machine's cores). The loaders run one after the other, never together.

The trainer profiles every step itself (log_freq 1; speculators' _StepTimer): fetch_ms is the time
from the end of the previous step to the batch being in hand (the data wait: the loader's next(),
plus the trainer's own recovery check and device move, both no-ops on one CPU rank), step_ms the
whole step (fetch, forward, backward, optimizer). Reported per loader over the steady steps (the
first step of each epoch, which includes the loader's start-up or epoch change, is reported apart):
median step ms, median data wait ms, and the share of step time spent waiting for data (sum of
fetch_ms over sum of step_ms), also over all steps. Both runs are checked to have trained on the same
batches (the documents the draft model was called with at every step).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS = HERE.parent / "tests" / "python" / "trainer_harness.py"
sys.path.insert(0, str(HARNESS.parent))
import trainer_harness  # noqa: E402

LOADERS = ("reference", "draftfeed")
GPU_LOADERS = ("reference", "draftfeed", "draftfeed-host")


def env(loader: str = "reference") -> dict:
    out = dict(os.environ)
    out.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if loader == "draftfeed-host":
        out["DRAFTFEED_DEVICE_STAGE"] = "0"  # the drop-in's device stage off
    return out


def trainer_flags(prepared: dict, save: Path, args) -> list[str]:
    """The `speculators train` command line, the same for both loaders."""
    return [
        "--verifier-name-or-path", prepared["verifier"],
        "--data-path", prepared["data"],
        "--save-path", str(save),
        "--log-dir", str(save.parent / f"logs-{save.name}"),
        # 0.9.0's --max-steps ends an epoch early but not the run (later epochs still validate and
        # checkpoint), so the run has just enough epochs for the steps.
        "--epochs", str(epochs_for(prepared["data"], args)),
        "--max-steps", str(args.steps),
        "--total-seq-len", str(args.seq_len),
        "--num-workers", str(args.workers),
        "--prefetch-factor", "4",
        # CPU-capable choices the trainer offers: flex attention and the fused losses need a GPU.
        "--draft-attn-impl", "sdpa",
        "--loss-implementation", "eager",
        "--mask-token-id", "0",  # the tiny verifier has no tokenizer
        "--target-layer-ids", "0", "1", "2",
        "--checkpoint-freq", "1",  # no mid-epoch checkpoints
        # 1: the trainer profiles every step (its timer synchronises the device at each mark); the GPU
        # check logs every 10th step and measures the data wait itself (--data-wait), unsynchronised.
        "--log-freq", str(getattr(args, "log_freq", 1)),
        "--lr", "1e-3",
    ]


def epochs_for(data: str, args, seed: int = 42, train_ratio: float = 0.9) -> int:
    """The fewest epochs whose training batches (at world size 1, planned as the trainer plans them:
    its default seed 42, train_data_ratio 0.9) add up to at least --steps."""
    import draftfeed

    lengths = draftfeed.open_dataset(data).seq_lens()
    split = lengths[: int(len(lengths) * train_ratio)]
    total, epoch = 0, 0
    while total < args.steps:
        total += len(draftfeed.plan_batches(split, args.seq_len, 1, 0, epoch=epoch, seed=seed))
        epoch += 1
    return epoch


def prepare(out: Path, args) -> dict:
    """The harness's `prepare` with this benchmark's sizes (its module constants)."""
    trainer_harness.HIDDEN = args.hidden
    trainer_harness.ROWS = args.rows
    trainer_harness.LENGTHS = tuple(args.lengths)
    with contextlib.redirect_stdout(sys.stderr):  # it prints its summary; stdout is for --json
        return trainer_harness.prepare(str(out))


def train(loader: str, prepared: dict, work: Path, args) -> dict:
    metrics = work / f"metrics-{loader}"
    save = work / f"ckpt-{loader}"
    harness_loader = "draftfeed" if loader.startswith("draftfeed") else loader
    cmd = [sys.executable, str(HARNESS), "train", "--loader", harness_loader, "--metrics", str(metrics),
           *(["--gpu"] if args.gpu else []), *(["--data-wait"] if getattr(args, "data_wait", False) else []),
           "--", *trainer_flags(prepared, save, args)]
    start = time.perf_counter()
    with open(work / f"{loader}.log", "w") as log:
        proc = subprocess.run(cmd, env=env(loader), stdout=log, stderr=subprocess.STDOUT,
                              timeout=args.timeout, start_new_session=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((work / f"{loader}.log").read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"trainer with the {loader} loader: exit status {proc.returncode}\n{tail}")
    records = trainer_harness.read_metrics(f"{metrics}.0.jsonl")
    meta = next(r for r in records if r["kind"] == "meta")
    train_records = [r for r in records if r["kind"] == "train" and r.get("profile")]
    summary = trainer_harness.summarize(records)
    steps = [dict(step=r["step"], epoch=r["epoch"], fetch_ms=r["profile"]["fetch_ms"]["f"],
                  step_ms=r["profile"]["step_ms"]["f"], tokens_per_s=r["profile"]["tokens_per_s"]["f"])
             for r in train_records]
    waits = next((r for r in records if r["kind"] == "data_wait"), None)
    if waits is not None:
        summary.update(unsynchronised_data_wait(waits))
    return dict(loader=loader, create_train_val_loaders=meta["create_train_val_loaders"],
                speculators=meta["speculators"], wall_s=wall, summary=summary, steps=steps,
                batches=[r.get("batches") for r in train_records],
                mean_step_ms=sum(s["step_ms"] for s in steps) / max(1, len(steps)))


def unsynchronised_data_wait(record: dict) -> dict:
    """--data-wait's figures: the training loader's next() time and the CPU's step period, median
    over the steps after the first two (start-up), and the share of the period spent waiting."""
    import statistics

    wait, period = record["wait_ms"][2:], record["period_ms"][1:]
    if not wait or not period:
        return {}
    return {"cpu_median_data_wait_ms": round(statistics.median(wait), 3),
            "cpu_median_step_ms": round(statistics.median(period), 3),
            "cpu_data_wait_share": round(sum(wait) / max(1e-9, sum(period)), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="training steps per loader (--max-steps)")
    p.add_argument("--workers", type=int, default=2, help="num_workers for both loaders")
    p.add_argument("--seq-len", type=int, default=1024, help="total_seq_len (tokens per batch)")
    p.add_argument("--hidden", type=int, default=256, help="the tiny verifier's hidden size")
    p.add_argument("--rows", type=int, default=400)
    p.add_argument("--lengths", type=lambda t: [int(x) for x in t.split(",")],
                   default=[64, 96, 128, 128, 192, 256, 256, 384, 512],
                   help="row lengths drawn from (many ties, as real tokenized data)")
    p.add_argument("--timeout", type=float, default=900, help="seconds allowed to each training run")
    p.add_argument("--out", help="write trainer.json here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--log-freq", type=int, default=1,
                   help="the trainer's log_freq (1: it profiles, and synchronises, every step)")
    p.add_argument("--data-wait", action="store_true",
                   help="measure each loader next() on the CPU, unsynchronised (trainer_harness.py)")
    p.add_argument("--gpu", action="store_true",
                   help="train on the GPU; draftfeed with its device stage and without (draftfeed-host)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        work = Path(tmp)
        prepared = prepare(work / "fixture", args)
        runs = {}
        for loader in GPU_LOADERS if args.gpu else LOADERS:
            runs[loader] = train(loader, prepared, work, args)
            s = runs[loader]["summary"]
            print(f"  {loader}: {len(runs[loader]['steps'])} steps, median step {s['median_step_ms']:.1f} ms, "
                  f"median data wait {s['median_fetch_ms']:.2f} ms, data-wait share {100 * s['data_wait_share']:.1f}% "
                  f"(all steps {100 * s['data_wait_share_all_steps']:.1f}%), wall {runs[loader]['wall_s']:.1f} s",
                  file=sys.stderr, flush=True)
    ref = runs["reference"]
    for name, ours in runs.items():
        if len(ref["steps"]) != len(ours["steps"]) or ref["batches"] != ours["batches"]:
            raise SystemExit(f"the {name} run did not train on the reference's batches: the figures would "
                             "compare unlike work")
    for r in runs.values():
        del r["batches"]
    report = dict(args={k: v for k, v in vars(args).items() if k not in ("out", "json")},
                  prepared={k: v for k, v in prepared.items() if k not in ("verifier", "data")},
                  runs=runs, same_batches=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "trainer.json").write_text(json.dumps(report, indent=2))
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
