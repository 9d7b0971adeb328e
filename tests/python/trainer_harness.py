#!/usr/bin/env python3
"""Runs speculators 0.9.0's own training entry point on CPU (or, with --gpu, on the GPU it was written
for), with its loaders or with draftfeed's.

Used by `test_speculators_trainer.py` as a subprocess (plain `python`, or `torchrun` for world size 2) and
by `test_two_hosts.py` (`torchrun --nnodes 2` across two network namespaces).

    trainer_harness.py prepare OUT          a tiny random Llama verifier (OUT/verifier) and a small
                                            dataset with its hidden-state cache (OUT/data)
    trainer_harness.py train --loader {reference,draftfeed} --metrics FILE [--kill-after-mid-epoch-checkpoint]
                             [--gpu] [--hold-after-step N --hold-dir DIR] [--pg-timeout SECONDS]
                             -- TRAINER FLAGS...
                                            `speculators train` with TRAINER FLAGS (the same flags for both
                                            loaders), the per-step metric records written to FILE.<rank>.jsonl
    trainer_harness.py summary FILE...      median fetch_ms / step_ms and the data-wait share of metric files

What `train` does, and nothing else:
- The loader swap is what a user does by changing one import line in `speculators/train/cli.py`:
  `speculators.train.cli.create_train_val_loaders = draftfeed.speculators.create_train_val_loaders`.
  The trainer calls it exactly as it calls the reference: no argument is wrapped, filtered or adapted,
  and the returned loaders are handed to the trainer untouched.
- The trainer has no CPU path. `_cpu_patches` below changes device selection only, identically for both
  loaders; every patch says why it is needed. With --gpu nothing is patched: the trainer runs on
  cuda:<LOCAL_RANK> as written (scripts/gpu_check.sh), with torch's deterministic algorithms so that
  two runs on the same batches can be compared bit for bit.
- Metrics: a logging handler on the root logger receives the trainer's `speculators.metrics` records
  (they propagate) and writes each one as a JSON line, every float also as `float.hex()`. With each
  record go the batches the draft model was called with since the previous record (seen by a global
  forward hook, read only): per document its length and first token ids, to tell which rows they are.
- `--kill-after-mid-epoch-checkpoint`: when the trainer logs "Checkpoint saved to ..." for a checkpoint
  whose training_state.json has local_step > 0 (a mid-epoch checkpoint), the process SIGKILLs itself:
  a crash right after the first mid-epoch checkpoint, at the same step for both loaders.
- `--hold-after-step N --hold-dir DIR` (the two-host tests' lost host): once this rank has logged the
  metrics of training step N it creates DIR/held.<rank> and waits, inside the trainer's step, while
  DIR/hold exists (at most 600 s, then it goes on): the other ranks wait for it in their next
  collective, at a step the test chose, until the test kills this host or cuts its network and
  removes DIR/hold.
- `--data-wait`: the trainer's data wait as its CPU sees it, per step, without synchronising the
  device (its own step timer, log_freq 1, synchronises at every mark): the time each `next()` on the
  training loader's iterator takes (torch's DataLoader iterator, or draftfeed's), and the time from
  one batch in hand to the next (the CPU's step period), written as one `data_wait` record at the end.
  Observation only: the loaders and their batches are untouched.
- `--pg-timeout SECONDS`: the process group's timeout (`init_process_group(timeout=...)`). speculators
  0.9.0 passes none, so gloo's default (30 minutes) bounds a collective whose peer went silent; the
  line a user adds to `maybe_setup_distributed` to bound it sooner. The same for both loaders.

Nothing from speculators is copied here: it is imported and patched at run time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path

# Sizes of the tiny verifier and of the data (small enough for a few dozen CPU steps a second).
VOCAB = 512
HIDDEN = 64
VERIFIER_LAYERS = 2
CAPTURED_LAYERS = 4  # three target layers, then the last layer (docs/formats.md)
ROWS = 160
# Few distinct lengths: many ties, as real tokenized data has. The reference orders ties with numpy's
# unstable argsort, so which rank gets which row depends on it.
LENGTHS = (12, 16, 16, 20, 24, 24, 32, 40, 48, 64)


# ---------------------------------------------------------------------------------------------- prepare


def prepare(out: str, seed: int = 1234) -> dict:
    import numpy as np
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    out_path = Path(out).resolve()
    verifier = out_path / "verifier"
    data = out_path / "data"

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=VERIFIER_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HIDDEN // 4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(verifier)  # safetensors; no tokenizer (--mask-token-id given)

    rng = np.random.default_rng(seed)
    lengths = [int(x) for x in rng.choice(LENGTHS, size=ROWS)]
    input_ids = [rng.integers(1, VOCAB, size=n).tolist() for n in lengths]
    loss_mask = [(rng.random(n) < 0.7).astype(np.int64).tolist() for n in lengths]
    ds = Dataset.from_dict({"input_ids": input_ids, "loss_mask": loss_mask, "seq_len": lengths})
    ds.set_format(type="torch")  # as speculators' preprocessing saves it
    ds.save_to_disk(str(data))

    hs_dir = data / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for i, n in enumerate(lengths):
        hs = torch.randn(n, CAPTURED_LAYERS, HIDDEN, generator=gen).to(torch.bfloat16)
        ids = torch.tensor(input_ids[i], dtype=torch.int64)
        save_file({"hidden_states": hs, "token_ids": ids}, str(hs_dir / f"hs_{i}.safetensors"))

    distinct = len(set(lengths))
    info = {"verifier": str(verifier), "data": str(data), "rows": ROWS, "distinct_lengths": distinct,
            "hidden_size": HIDDEN, "vocab": VOCAB}
    print(json.dumps(info))
    return info


# ------------------------------------------------------------------------------------------------ train


def _cpu_patches() -> None:
    """Device selection for a CPU-only machine. Applied before the trainer runs, identical for both
    loaders, and none of it touches the loaders or their arguments."""
    import speculators.train.trainer as trainer_mod
    import torch

    real_current_accelerator = torch.accelerator.current_accelerator

    def current_accelerator(check_available: bool = False):
        # Trainer.__init__ takes `device_type` from here for torch.autocast (None -> "cuda", and
        # autocast("cuda") on a CPU machine is disabled, so the bf16 batches would meet fp32 weights);
        # maybe_setup_distributed picks its backend from it (cpu -> gloo) and raises on None.
        # With check_available=True (cli.main's final empty_cache) keep the real answer (None here):
        # torch.cpu has no empty_cache.
        if check_available:
            return real_current_accelerator(check_available=True)
        return torch.device("cpu")

    available = torch.accelerator.is_available()  # False on this machine
    torch.accelerator.current_accelerator = current_accelerator
    # torch's own is_available() asks current_accelerator() and then torch.cpu.is_available() (True):
    # keep its real answer, so that the DataLoader does not pin memory and the recovery coordinator
    # and _StepTimer take their no-accelerator paths.
    torch.accelerator.is_available = lambda: available
    # maybe_setup_distributed calls set_device_index(LOCAL_RANK); there is no device to select on CPU.
    torch.accelerator.set_device_index = lambda index: None
    # _StepTimer.mark()/now() synchronize the accelerator before each timestamp (log_freq=1 profiles
    # every step); CPU work is synchronous, so there is nothing to wait for.
    torch.accelerator.synchronize = lambda device=None: None

    # Trainer.__init__ keeps get_local_rank() (an int) and moves the model and every batch with
    # `.to(self.local_rank)`, i.e. to cuda:<local_rank>. On CPU the target is the CPU device.
    # (DistributedDataParallel is built without device_ids, which is the CPU/gloo form already.)
    trainer_mod.get_local_rank = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]

    # The single-process checkpointer loads a checkpoint (resume) onto get_current_device(), which is
    # "cuda:0" without an accelerator (safe_open / torch.load map_location): load onto the CPU.
    import speculators.train.checkpointer as checkpointer_mod

    checkpointer_mod.get_current_device = lambda: "cpu"

    # init_process_group(backend, device_id=local_rank) binds the process group to an accelerator
    # device; gloo on CPU has none, so device_id is dropped (the backend is gloo from the patch above).
    import torch.distributed as dist

    real_init = dist.init_process_group

    def init_process_group(*args, **kwargs):
        kwargs.pop("device_id", None)
        return real_init(*args, **kwargs)

    dist.init_process_group = init_process_group


def _process_group_timeout(seconds: float) -> None:
    """--pg-timeout: the line a user adds to speculators' `maybe_setup_distributed` (which passes no
    timeout, so torch's default bounds a collective whose peer went silent: 30 minutes for gloo)."""
    from datetime import timedelta

    import torch.distributed as dist

    real_init = dist.init_process_group

    def init_process_group(*args, **kwargs):
        kwargs["timeout"] = timedelta(seconds=seconds)
        return real_init(*args, **kwargs)

    dist.init_process_group = init_process_group


class _MetricRecorder(logging.Handler):
    """Writes the trainer's metric records (dict messages of `speculators.metrics`) as JSON lines.
    Optionally SIGKILLs the process right after the first mid-epoch checkpoint has been written."""

    def __init__(self, path: str, kill_after_mid_epoch_checkpoint: bool, rank: int,
                 hold_after_step: int | None = None, hold_dir: str | None = None):
        super().__init__(logging.INFO)
        self.rank = rank
        self.file = open(path, "w", buffering=1)
        self.kill = kill_after_mid_epoch_checkpoint
        self.hold_after_step, self.hold_dir = hold_after_step, hold_dir
        self.pending_batches: list[list] = []  # what the model saw since the last metric record

    def observe_batch(self, kwargs: dict) -> None:
        """Called by a forward hook with the keyword arguments the trainer passed to the draft model:
        records each document of the packed row as [length, its first 8 token ids] (enough to tell
        which dataset row it is, and in which order the rows were packed)."""
        ids, docs = kwargs.get("input_ids"), kwargs.get("document_ids")
        if ids is None or docs is None:
            return
        ids, docs = ids.reshape(-1).tolist(), docs.reshape(-1).tolist()
        out: list = []
        start = 0
        for pos in range(1, len(docs) + 1):
            if pos == len(docs) or docs[pos] != docs[start]:
                if docs[start] != -1:
                    out.append([pos - start, ids[start:min(pos, start + 8)]])
                start = pos
        self.pending_batches.append(out)

    @staticmethod
    def _encode(value):
        if isinstance(value, Mapping):
            return {k: _MetricRecorder._encode(v) for k, v in value.items()}
        if isinstance(value, float):
            return {"f": value, "hex": value.hex()}
        return value

    def _hold(self) -> None:
        """--hold-after-step: waits while HOLD_DIR/hold exists (bounded), having said so."""
        import time

        assert self.hold_dir is not None
        hold = Path(self.hold_dir) / "hold"
        os.fsync(self.file.fileno())
        (Path(self.hold_dir) / f"held.{self.rank}").write_text(str(os.getpid()))
        deadline = time.monotonic() + 600
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "speculators.metrics" and isinstance(record.msg, Mapping):
            if getattr(record, "hparams", False):
                return
            msg = dict(record.msg)
            kind = "train" if "train" in msg else "val" if "val" in msg else "other"
            out = {"kind": kind, "step": getattr(record, "step", None), **self._encode(msg)}
            out["batches"], self.pending_batches = self.pending_batches, []
            self.file.write(json.dumps(out) + "\n")
            self.file.flush()
            if kind == "train" and out["step"] == self.hold_after_step:
                self._hold()
            return
        text = record.getMessage()
        # training_state.json is written by rank 0 only (other ranks may log before it exists).
        if record.name == "speculators" and text.startswith("Checkpoint saved to ") and self.rank == 0:
            ckpt = Path(text[len("Checkpoint saved to "):])
            state_file = ckpt / "training_state.json"
            state = json.loads(state_file.read_text()) if state_file.exists() else {}
            self.file.write(json.dumps({"kind": "checkpoint", "path": str(ckpt), **state}) + "\n")
            self.file.flush()
            if self.kill and state.get("local_step", 0) > 0:
                os.fsync(self.file.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
        elif record.levelno >= logging.WARNING or record.name == "speculators":
            sys.stderr.write(f"[{record.name}] {text}\n")


def _time_loader_waits(recorder: _MetricRecorder) -> None:
    """--data-wait: the time spent in each `next()` of a loader's iterator, for both loaders."""
    import time

    from torch.utils.data import dataloader

    # Per loader (training and validation apart), keyed by its dataset or draftfeed loader.
    waits: dict[int, list[float]] = {}
    in_hand: dict[int, list[float]] = {}
    recorder.data_waits, recorder.in_hand = waits, in_hand  # type: ignore[attr-defined]

    def note(key: int, start: float, end: float) -> None:
        waits.setdefault(key, []).append(end - start)
        in_hand.setdefault(key, []).append(end)

    def timed(next_fn):
        def wrapper(self):
            start = time.perf_counter()
            batch = next_fn(self)
            note(id(self._dataset), start, time.perf_counter())
            return batch
        return wrapper

    dataloader._BaseDataLoaderIter.__next__ = timed(  # type: ignore[method-assign]
        dataloader._BaseDataLoaderIter.__next__)
    import draftfeed.loader

    original_iter = draftfeed.loader.Loader.__iter__

    def timed_iter(self):
        iterator = original_iter(self)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            note(id(self), start, time.perf_counter())
            yield batch

    draftfeed.loader.Loader.__iter__ = timed_iter  # type: ignore[method-assign]


def train(args: argparse.Namespace, trainer_flags: list[str]) -> None:
    import torch

    # One intra-op thread: reductions in a fixed order, and two runs can share the 2 cores.
    torch.set_num_threads(1)
    if args.gpu:
        # The same batches must give the same losses: cuBLAS and cuDNN in their deterministic modes.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    else:
        _cpu_patches()
    if args.pg_timeout is not None:
        _process_group_timeout(args.pg_timeout)

    import speculators.train.cli as cli
    from speculators.train.config import TrainConfig

    rank = int(os.environ.get("RANK", "0"))
    recorder = _MetricRecorder(f"{args.metrics}.{rank}.jsonl", args.kill_after_mid_epoch_checkpoint, rank,
                               args.hold_after_step, args.hold_dir)
    # On the root logger: speculators' setup_metric_logger (dictConfig) replaces the handlers of
    # `speculators.metrics` and `speculators` but leaves the root's alone; their records propagate here.
    # (A root handler also makes setup_root_logger's basicConfig a no-op: no rich console output.)
    logging.getLogger().addHandler(recorder)

    # Observation only: a global forward hook (torch's debugging/profiling hook) sees the keyword
    # arguments the trainer passes to the draft model, i.e. the batch it got from the loader, after
    # the trainer's own handling. Nothing is changed.
    from speculators.model import SpeculatorModel

    def see_batch(module, _args, kwargs, _output):
        if isinstance(module, SpeculatorModel):
            recorder.observe_batch(kwargs)

    torch.nn.modules.module.register_module_forward_hook(see_batch, with_kwargs=True)

    if args.loader == "draftfeed":
        import draftfeed.speculators

        # The one-line change a user makes in speculators/train/cli.py.
        cli.create_train_val_loaders = draftfeed.speculators.create_train_val_loaders  # type: ignore[assignment]
    elif args.loader != "reference":
        raise SystemExit(f"unknown loader {args.loader}")

    from importlib.metadata import version

    fn = cli.create_train_val_loaders
    meta = {"kind": "meta", "create_train_val_loaders": f"{fn.__module__}.{fn.__qualname__}",
            "speculators": version("speculators"), "torch": torch.__version__}
    if args.loader == "draftfeed":
        meta["draftfeed"] = os.path.dirname(draftfeed.speculators.__file__)
    recorder.file.write(json.dumps(meta) + "\n")

    if args.data_wait:
        _time_loader_waits(recorder)
    cfg = TrainConfig.resolve(trainer_flags)
    cli.main(cfg)
    if args.data_wait:
        if args.gpu:
            torch.cuda.synchronize()  # once, at the end: the run's wall time includes the device's
        waits, in_hand = recorder.data_waits, recorder.in_hand  # type: ignore[attr-defined]
        # The training loader: the one that delivered the most batches.
        key = max(waits, key=lambda k: len(waits[k]), default=None)
        train_waits = waits.get(key, []) if key is not None else []
        times = in_hand.get(key, []) if key is not None else []
        recorder.file.write(json.dumps({
            "kind": "data_wait", "wait_ms": [1000 * w for w in train_waits],
            "period_ms": [1000 * (b - a) for a, b in itertools.pairwise(times)]}) + "\n")


# ---------------------------------------------------------------------------------------------- summary


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(records: list[dict]) -> dict:
    """Median fetch_ms and step_ms over the training steps, and the data-wait share (sum of fetch_ms
    over sum of step_ms), all over the steady state: the first step of each epoch (worker start-up,
    first batch) is reported apart, and in data_wait_share_all_steps (every step)."""
    train = [r for r in records if r["kind"] == "train" and r.get("profile")]
    steady = [r for i, r in enumerate(train) if i > 0 and r["epoch"] == train[i - 1]["epoch"]]
    firsts = [r for r in train if r not in steady]
    if not steady:
        return {}
    def ms(rs, key):
        return [r["profile"][key]["f"] for r in rs]

    fetch, step = ms(steady, "fetch_ms"), ms(steady, "step_ms")
    return {
        "steps": len(train),
        "median_fetch_ms": round(statistics.median(fetch), 3),
        "median_step_ms": round(statistics.median(step), 3),
        "data_wait_share": round(sum(fetch) / sum(step), 4),
        "first_step_of_epoch_fetch_ms": [round(x, 1) for x in ms(firsts, "fetch_ms")],
        "data_wait_share_all_steps": round(sum(ms(train, "fetch_ms")) / sum(ms(train, "step_ms")), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out")
    t = sub.add_parser("train")
    t.add_argument("--loader", required=True, choices=("reference", "draftfeed"))
    t.add_argument("--metrics", required=True, help="metric records go to METRICS.<rank>.jsonl")
    t.add_argument("--kill-after-mid-epoch-checkpoint", action="store_true")
    t.add_argument("--gpu", action="store_true", help="train on the GPU (no CPU patches)")
    t.add_argument("--hold-after-step", type=int, help="wait after this training step (see above)")
    t.add_argument("--hold-dir", help="where --hold-after-step's files are")
    t.add_argument("--data-wait", action="store_true",
                   help="record each loader next()'s time, unsynchronised (see above)")
    t.add_argument("--pg-timeout", type=float, help="the process group's timeout, seconds")
    s = sub.add_parser("summary")
    s.add_argument("files", nargs="+")

    argv = sys.argv[1:]
    trainer_flags: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, trainer_flags = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.out)
    elif args.command == "train":
        train(args, trainer_flags)
    else:
        print(json.dumps({f: summarize(read_metrics(f)) for f in args.files}, indent=2))


if __name__ == "__main__":
    main()
