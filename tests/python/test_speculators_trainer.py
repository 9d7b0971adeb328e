"""speculators 0.9.0's own trainer as the oracle for the drop-in.

The code behind `speculators train` (`speculators.train.cli.main` with a `TrainConfig` resolved from
command-line flags) trains a tiny EAGLE-3 draft on CPU, once with its own loaders and once with the one
import swapped for `draftfeed.speculators.create_train_val_loaders`, nothing else changed (see
`trainer_harness.py`: the swap, the CPU device patches, the metric capture). Per-step training metrics
and per-epoch validation metrics must be equal bit for bit:
  - world size 1;
  - world size 2 (`torchrun --nproc-per-node 2`, gloo on 127.0.0.1);
  - a run SIGKILLed right after its first mid-epoch checkpoint, then restarted (the trainer's resume
    with the sampler fast-skip), against the reference's run killed and restarted the same way.
After the restart the losses are compared with the reference's restarted run, not with the
uninterrupted run: the trainer saves checkpoints in bf16, so a resumed run continues from rounded
weights with either loader (the test checks instead that the restarted runs see exactly the
uninterrupted run's batches, and prints how many metric records still match: none).
Loader arguments: num_workers=1 at world size 1 (the reference's spawned, persistent DataLoader workers,
as a real trainer has them; the timing comparison comes from these runs), num_workers=0 for world size 2
and the resume (worker start-up costs ~7 s per loader and process on 2 cores); the same values for both
loaders, since both go through the same trainer flags. Runs go two at a time (two cores, one torch
thread each), except the world-size-1 pair, which runs one after the other for undisturbed timings.
The data has many equal lengths, as real tokenized data has. When losses differ, the message says at
which step, and classifies every batch that differs (the batches the model was called with are
recorded): "tie order" (the same rows, equal lengths in the same places, tied rows in another order or
on another rank) or "different rows".

The world-size-1 runs also give the trainer's own profile (fetch_ms = data wait, step_ms) with each
loader; the summary is printed and written to trainer_summary.json in the test's temporary folder (and
to $DRAFTFEED_TRAINER_SUMMARY when set).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

# Not skipped when missing: the trainer's dependencies are in requirements-test.txt.
import speculators.train.cli  # noqa: F401

pytestmark = pytest.mark.timeout(900)

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "trainer_harness.py"
EPOCHS = 2
TOTAL_SEQ_LEN = 256
LOADERS = ("reference", "draftfeed")


def trainer_flags(prepared: dict, save_path: Path, *, num_workers: int, checkpoint_freq: float = 0.25) -> list[str]:
    """The `speculators train` command line, the same for both loaders."""
    return [
        "--verifier-name-or-path", prepared["verifier"],
        "--data-path", prepared["data"],
        "--save-path", str(save_path),
        "--log-dir", str(save_path.parent / "logs"),
        "--epochs", str(EPOCHS),
        "--total-seq-len", str(TOTAL_SEQ_LEN),
        "--num-workers", str(num_workers),
        "--prefetch-factor", "2",
        # CPU-capable choices the trainer offers: flex attention and the fused (Triton) losses need a GPU.
        "--draft-attn-impl", "sdpa",
        "--loss-implementation", "eager",
        # No tokenizer for the tiny verifier: the mask token is given.
        "--mask-token-id", "0",
        "--target-layer-ids", "0", "1", "2",
        # Mid-epoch checkpoints (every quarter epoch): the resume case restarts from the first one.
        "--checkpoint-freq", str(checkpoint_freq),
        "--log-freq", "1",
        "--lr", "1e-3",
    ]


def _env() -> dict:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        # One intra-op thread per process (the harness sets it too): a fixed reduction order, and the
        # runs that go in parallel share the two cores without oversubscription.
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        MASTER_ADDR="127.0.0.1",
        GLOO_SOCKET_IFNAME="lo",
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """One bounded training subprocess (in its own process group, so that the reference's DataLoader
    workers and torchrun's children go with it). `host`: started there (two_hosts.Host), with `env`."""

    def __init__(self, name: str, workdir: Path, cmd: list[str], timeout: float, loader: str,
                 env: dict | None = None, host: Any = None):
        self.name, self.workdir, self.timeout, self.loader = name, workdir, timeout, loader
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.start = time.monotonic()
        popen = host.popen if host is not None else subprocess.Popen
        self.proc = popen(
            cmd, cwd=workdir, env=env or _env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait(self) -> int:
        remaining = max(1.0, self.timeout - (time.monotonic() - self.start))
        try:
            rc = self.proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            self._kill_group()
            self.proc.wait()
            self.log.close()
            pytest.fail(f"{self.name}: no result within {self.timeout:.0f} s (a hang is a failure)\n{self.tail()}")
        self._kill_group()  # leftovers (a killed trainer's DataLoader workers)
        self.log.close()
        self.seconds = time.monotonic() - self.start
        return rc

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_training(
    name: str, workdir: Path, prepared: dict, loader: str, *, world_size: int = 1, num_workers: int,
    save_path: Path | None = None, kill: bool = False, timeout: float = 240,
) -> Run:
    save_path = save_path or workdir / f"ckpt-{name}"
    harness = [
        str(HARNESS), "train", "--loader", loader, "--metrics", str(workdir / f"metrics-{name}"),
        *(["--kill-after-mid-epoch-checkpoint"] if kill else []),
        "--", *trainer_flags(prepared, save_path, num_workers=num_workers),
    ]
    if world_size == 1:
        cmd = [sys.executable, *harness]
    else:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world_size),
            "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *harness,
        ]
    return Run(name, workdir, cmd, timeout, loader)


EXPECTED_FUNCTION = {
    "reference": "speculators.train.dataloader.create_train_val_loaders",
    "draftfeed": "draftfeed.speculators.create_train_val_loaders",
}


def finish(run: Run, expect_rc: int = 0) -> None:
    rc = run.wait()
    if rc != expect_rc:
        pytest.fail(f"{run.name}: exit status {rc}, expected {expect_rc}\n{run.tail()}")
    meta = [r for r in metrics(run.workdir, run.name) if r["kind"] == "meta"]
    assert meta and meta[0]["create_train_val_loaders"] == EXPECTED_FUNCTION[run.loader], (run.name, meta)
    assert meta[0]["speculators"] == "0.9.0", f"this test targets speculators 0.9.0's trainer: {meta[0]}"


def metrics(workdir: Path, name: str, rank: int = 0) -> list[dict]:
    path = workdir / f"metrics-{name}.{rank}.jsonl"
    assert path.exists(), f"{name}: no metric records at {path}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ comparison


class Rows:
    """Tells which dataset row a recorded document is (its first token ids after EAGLE-3's shift)."""

    def __init__(self, data_path: str):
        from datasets import load_from_disk

        ds = load_from_disk(data_path).with_format(None)  # plain lists, not the saved torch format
        self.lengths = [int(x) for x in ds["seq_len"]]
        self.by_prefix = {tuple(ids[1:9]): i for i, ids in enumerate(ds["input_ids"])}
        assert len(self.by_prefix) == len(self.lengths), "row prefixes must be distinct"

    def rows(self, batch: list) -> list:
        return [self.by_prefix.get(tuple(prefix), f"?len{n}") for n, prefix in batch]


def _numbers(record: dict, kind: str) -> dict:
    """The record's metric values as float hex strings (bit-exact comparison)."""
    return {k: v["hex"] for k, v in record[kind].items()}


def _classify(ref_batches: list, our_batches: list, rows: Rows) -> str | None:
    """None when identical; else 'tie order' or 'different rows'. Each argument is a list over ranks of
    the batches (lists of documents) the model saw at one step."""
    if ref_batches == our_batches:
        return None
    ref_rows = [r for b in ref_batches for r in rows.rows(b)]
    our_rows = [r for b in our_batches for r in rows.rows(b)]
    same_lengths = [[n for n, _ in b] for b in ref_batches] == [[n for n, _ in b] for b in our_batches]
    if Counter(map(str, ref_rows)) == Counter(map(str, our_rows)) and same_lengths:
        return "tie order"
    return "different rows"


def compare(ref: list[list[dict]], ours: list[list[dict]], rows: Rows, label: str) -> list[str]:
    """Problems found comparing two runs (each a list over ranks of metric records); [] when equal."""
    problems: list[str] = []
    by_kind = {}
    for side, runs in (("ref", ref), ("ours", ours)):
        by_kind[side] = {
            kind: [[r for r in rank_records if r["kind"] == kind] for rank_records in runs]
            for kind in ("train", "val")
        }
    for kind in ("train", "val"):
        r0, o0 = by_kind["ref"][kind][0], by_kind["ours"][kind][0]
        if len(r0) != len(o0):
            problems.append(f"{label}: {len(r0)} {kind} records with the reference, {len(o0)} with draftfeed")
        first = None
        for i, (a, b) in enumerate(zip(r0, o0)):
            if (a.get("step"), a.get("epoch")) != (b.get("step"), b.get("epoch")):
                problems.append(f"{label}: {kind} record {i}: step/epoch {a.get('step')}/{a.get('epoch')} "
                                f"vs {b.get('step')}/{b.get('epoch')}")
                break
            # Every rank logs the all-reduced values; compare every rank's.
            for rank in range(len(ref)):
                ra, ob = by_kind["ref"][kind][rank][i], by_kind["ours"][kind][rank][i]
                if _numbers(ra, kind) != _numbers(ob, kind):
                    key = "loss" if kind == "train" else "loss_epoch"
                    first = first or (
                        f"{label}: first {kind} difference at step {a['step']} (epoch {a['epoch']}, rank {rank}): "
                        f"{key} reference {ra[kind][key]['hex']} ({ra[kind][key]['f']!r}) vs draftfeed "
                        f"{ob[kind][key]['hex']} ({ob[kind][key]['f']!r})"
                    )
        if first:
            problems.append(first)
    if problems:
        problems.extend(batch_differences(by_kind["ref"], by_kind["ours"], rows, label))
    return problems


def batch_differences(ref: dict, ours: dict, rows: Rows, label: str) -> list[str]:
    """Which batches the model saw differ between the runs, and how (independent of the weights)."""
    out: list[str] = []
    kinds: Counter[tuple[str, str]] = Counter()
    examples: list[str] = []
    for kind in ("train", "val"):
        for i in range(min(len(ref[kind][0]), len(ours[kind][0]))):
            ranks = range(len(ref[kind]))
            ref_step = [ref[kind][r][i].get("batches", []) for r in ranks]
            our_step = [ours[kind][r][i].get("batches", []) for r in ranks]
            # per validation record: all validation batches of the epoch; compare batch by batch
            for j in range(max(len(b) for b in ref_step + our_step)):
                ra = [b[j] if j < len(b) else [] for b in ref_step]
                ob = [b[j] if j < len(b) else [] for b in our_step]
                verdict = _classify(ra, ob, rows)
                if verdict:
                    kinds[(kind, verdict)] += 1
                    if len(examples) < 3:
                        step = ref[kind][0][i].get("step")
                        where = f"{kind} step {step}" + (f" batch {j}" if kind == "val" else "")
                        examples.append(
                            f"  {where}: {verdict}; reference rows per rank "
                            f"{[rows.rows(b) for b in ra]} lengths {[[n for n, _ in b] for b in ra]}; "
                            f"draftfeed rows per rank {[rows.rows(b) for b in ob]}"
                        )
    total_train = len(ref["train"][0])
    summary = ", ".join(f"{n} {kind} batch(es): {verdict}" for (kind, verdict), n in sorted(kinds.items()))
    if kinds:
        out.append(f"{label}: batches the draft model was called with differ: {summary} "
                   f"(of {total_train} training steps)")
    else:
        out.append(f"{label}: the draft model was called with the same rows in the same order at every step: "
                   "the difference is in the batches' values (hidden states, masks, positions) or elsewhere")
    out.extend(examples)
    if kinds and all(verdict == "tie order" for _, verdict in kinds):
        out.append(f"{label}: every differing batch differs only in the order of rows of equal length "
                   "(the planner's tie order; numpy's unstable argsort decides it in the reference)")
    return out


# -------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trainer")


@pytest.fixture(scope="module")
def rows(prepared) -> Rows:
    return Rows(prepared["data"])


def prepare(folder: Path) -> dict:
    """The harness's tiny verifier and dataset with its cache, in `folder`; returns their description.
    (The `prepared` fixture, made once per session, is in conftest.py.)"""
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "prepare", str(folder)],
        env=_env(), capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["distinct_lengths"] < info["rows"] // 10, "the data must have many equal lengths"
    return info


@pytest.fixture(scope="module")
def ws1(workdir, prepared) -> dict:
    """World size 1, both loaders, one after the other (so the timings are not disturbed), with the
    reference's DataLoader workers (num_workers=1) as a real trainer has them."""
    out: dict[str, Any] = {}
    for loader in LOADERS:
        run = start_training(f"ws1-{loader}", workdir, prepared, loader, num_workers=1)
        finish(run)
        out[loader] = [metrics(workdir, f"ws1-{loader}")]
        out[f"{loader}-seconds"] = run.seconds
    return out


# ---------------------------------------------------------------------------------------------- tests


def test_world_size_1_losses_bit_for_bit(ws1, rows, workdir):
    ref, ours = ws1["reference"], ws1["draftfeed"]
    n_train = sum(r["kind"] == "train" for r in ref[0])
    n_val = sum(r["kind"] == "val" for r in ref[0])
    assert n_train >= 30 and n_val == EPOCHS, (n_train, n_val)

    from trainer_harness import summarize

    summary = {
        loader: {**summarize(ws1[loader][0]), "wall_s": round(ws1[f"{loader}-seconds"], 1)} for loader in LOADERS
    }
    text = json.dumps(summary, indent=2)
    print(f"\ntrainer profile, world size 1, num_workers=1 (the same run as the comparison):\n{text}")
    (workdir / "trainer_summary.json").write_text(text)
    if os.environ.get("DRAFTFEED_TRAINER_SUMMARY"):
        Path(os.environ["DRAFTFEED_TRAINER_SUMMARY"]).write_text(text)

    problems = compare(ref, ours, rows, "world size 1")
    assert not problems, "\n".join(problems)


def test_world_size_1_losses_bit_for_bit_from_a_pack(ws1, rows, workdir, prepared):
    """The same training, draftfeed reading the cache packed and compressed (`draftfeed pack
    --in-place --compress`, several shards): the reference's losses, bit for bit."""
    import shutil

    from conftest import cli_path

    data = workdir / "packed-data"
    shutil.copytree(prepared["data"], data)
    subprocess.run([cli_path(), "pack", str(data), "--in-place", "--compress", "--shard-bytes", "200000",
                    "--no-progress"], check=True, capture_output=True, timeout=300)
    assert (data / "hidden_states" / "manifest.json").exists()
    assert not list((data / "hidden_states").glob("hs_*.safetensors"))
    run = start_training("ws1-packed", workdir, dict(prepared, data=str(data)), "draftfeed", num_workers=1)
    finish(run)
    problems = compare(ws1["reference"], [metrics(workdir, "ws1-packed")], rows, "world size 1, packed")
    assert not problems, "\n".join(problems)


def test_world_size_2_losses_bit_for_bit(workdir, prepared, rows):
    runs = {
        loader: start_training(f"ws2-{loader}", workdir, prepared, loader, world_size=2, num_workers=0)
        for loader in LOADERS
    }
    for run in runs.values():
        finish(run)
    ref = [metrics(workdir, "ws2-reference", rank) for rank in (0, 1)]
    ours = [metrics(workdir, "ws2-draftfeed", rank) for rank in (0, 1)]
    assert sum(r["kind"] == "train" for r in ref[0]) >= 15
    problems = compare(ref, ours, rows, "world size 2")
    assert not problems, "\n".join(problems)


def test_resume_after_sigkill_bit_for_bit(ws1, workdir, prepared, rows):
    """Killed (SIGKILL) right after the first mid-epoch checkpoint, then restarted with the same command:
    the trainer resumes mid-epoch and skips the done batches through the sampler's fast-skip."""
    killed = {
        loader: start_training(f"kill-{loader}", workdir, prepared, loader, num_workers=0,
                               save_path=workdir / f"ckpt-resume-{loader}", kill=True)
        for loader in LOADERS
    }
    for run in killed.values():
        finish(run, expect_rc=-signal.SIGKILL)
    restarted = {
        loader: start_training(f"restart-{loader}", workdir, prepared, loader, num_workers=0,
                               save_path=workdir / f"ckpt-resume-{loader}")
        for loader in LOADERS
    }
    for run in restarted.values():
        finish(run)

    resume_step = {}
    for loader in LOADERS:
        before = metrics(workdir, f"kill-{loader}")
        ckpts = [r for r in before if r["kind"] == "checkpoint"]
        assert ckpts and ckpts[-1]["local_step"] > 0, f"{loader}: killed before a mid-epoch checkpoint"
        resume_step[loader] = ckpts[-1]["global_step"]
        log = restarted[loader].log_path.read_text(errors="replace")
        assert f"Fast-skipping {ckpts[-1]['local_step']} batches via sampler slice" in log, (
            f"{loader}: the restarted trainer did not fast-skip through the sampler\n{restarted[loader].tail()}"
        )
        after = [r for r in metrics(workdir, f"restart-{loader}") if r["kind"] == "train"]
        assert after and after[0]["step"] == resume_step[loader], (loader, after[:1], resume_step[loader])
    assert resume_step["reference"] == resume_step["draftfeed"]

    problems = []
    problems += compare([metrics(workdir, "kill-reference")], [metrics(workdir, "kill-draftfeed")], rows,
                        "resume, before the kill")
    problems += compare([metrics(workdir, "restart-reference")], [metrics(workdir, "restart-draftfeed")], rows,
                        "resume, after the restart")

    # Against the uninterrupted world-size-1 run of the same loader. Before the kill: the same metrics.
    # After the restart: the same batches at every step (the fast-skip resumes the epoch exactly), but
    # not the same losses, for either loader: speculators saves checkpoints in bf16 (model and
    # optimizer state), so the restarted run continues from rounded weights.
    for loader in LOADERS:
        whole = _by_step(ws1[loader][0])
        for part in ("kill", "restart"):
            for key, record in _by_step(metrics(workdir, f"{part}-{loader}")).items():
                if record["batches"] != whole[key]["batches"]:
                    problems.append(f"{loader}, {part} run: {key[0]} step {key[1]}: the model saw other batches "
                                    "than in the uninterrupted run")
                    break
        before = _by_step(metrics(workdir, f"kill-{loader}"))
        if any(_numbers(r, k[0]) != _numbers(whole[k], k[0]) for k, r in before.items()):
            problems.append(f"{loader}: metrics before the kill differ from the uninterrupted run's")
        after = _by_step(metrics(workdir, f"restart-{loader}"))
        same = sum(_numbers(r, k[0]) == _numbers(whole[k], k[0]) for k, r in after.items())
        print(f"\n{loader}: after the restart, {same} of {len(after)} metric records equal the uninterrupted "
              "run's (the trainer's checkpoints are bf16; the batches are the same)")
    assert not problems, "\n".join(problems)


def _by_step(records: list[dict]) -> dict:
    return {(r["kind"], r["step"], r["epoch"]): r for r in records if r["kind"] in ("train", "val")}
