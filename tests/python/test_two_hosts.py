"""speculators 0.9.0's trainer across two hosts: `torchrun --nnodes 2 --nproc-per-node 2`.

Two hosts on one machine (two_hosts.py): network namespaces A (10.201.0.1) and B (10.201.0.2) joined
by a veth pair, nothing else reachable. One torchrun per host (static rendezvous on host A's address,
gloo over the pair: GLOO_SOCKET_IFNAME=eth0), ranks 0-1 on A and 2-3 on B, each running
speculators 0.9.0's training entry point through the single-host trainer test's harness
(trainer_harness.py: the one import swapped for draftfeed's, CPU device patches, per-step metrics
and the batches the draft model saw, per rank). Both hosts read one folder (the shared file system).

  * offline, from one cache folder: per-step training and per-epoch validation metrics equal bit for
    bit on every rank, and every rank's batches equal the reference's, step by step;
  * online, through a real Mooncake Store whose master runs on host A, with the simulated vLLM server
    on host A putting every sample with hs-connectors' connector code, and every rank (two of them on
    host B, across the link) fetching it with hs-connectors' MooncakeTransfer as the trainer builds
    it: the same equalities; the trainers mount no store memory of their own, so every object lives in
    the server's segment, and the master's key count is 0 after each run (every sample deleted);
  * a host lost mid-epoch, right after a mid-epoch checkpoint (host B's ranks wait after the next
    step, harness --hold-after-step, so the loss comes at the same place every run):
      - every process on host B SIGKILLed: host A's ranks end within KILL_BOUND seconds, naming the
        peer that closed the connection;
      - host B's link cut (down: silence, no reset): host A's ranks end when the process group's
        timeout strikes (PG_TIMEOUT, set by the harness: speculators 0.9.0 sets none, and gloo's
        default is 30 minutes), naming the timed-out collective;
    after each, `draftfeed verify` finds every cache file intact and none locked (the cache carries
    a vLLM connector's leftover lock files, which readers remove), the files are byte for byte what
    they were, and the run, restarted on both hosts, resumes from its last checkpoint with the metrics
    and batches of the reference's run resumed from that same checkpoint (one reference run is the
    oracle for both: the two checkpoints are checked to be the same bytes). Before the loss every
    rank trained as in the uninterrupted offline run (metrics and batches), and after the restart it
    sees the uninterrupted run's batches (not its metrics: the trainer's checkpoints are bf16).

Runs go one at a time (timings undisturbed), except the killed case's two resumed runs, which go
together while the cut case (on a second pair of hosts) waits out its timeout. Each test prints its
figures; the summary (seconds per run, time to first batch per host, the first step of each epoch's
wait, how long the survivors took to end) is shown after the module and written to
$DRAFTFEED_TWO_HOST_SUMMARY when set. Where network namespaces cannot be made the module is skipped,
saying why.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import two_hosts
from conftest import cli_path
from test_speculators_trainer import (
    EXPECTED_FUNCTION,
    HARNESS,
    LOADERS,
    Rows,
    Run,
    _env,
    compare,
    metrics,
    trainer_flags,
)

pytestmark = pytest.mark.timeout(900)

HERE = Path(__file__).resolve().parent
SERVICES = HERE / "two_host_services.py"
RANKS = {"A": (0, 1), "B": (2, 3)}
WORLD = 4
# One mid-epoch checkpoint per epoch: a step after it has none, so a host lost there leaves the last
# checkpoint whole (speculators writes a checkpoint over the previous one, across two barriers).
CHECKPOINT_FREQ = 0.5
RUN_TIMEOUT = 300.0  # seconds for any one training run (a hang is a failure)
KILL_BOUND = 60.0  # seconds from host B's death to host A's torchrun ended
PG_TIMEOUT = 30.0  # the process group's timeout in the cut run
CUT_BOUND = PG_TIMEOUT + 60.0
_PORTS = itertools.count(29400)  # rendezvous ports on host A: a fresh namespace, nothing else there
SUMMARY: dict[str, Any] = {"runs": {}}


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    """The runs' figures, shown after the module's tests (outside pytest's capture) and written to
    $DRAFTFEED_TWO_HOST_SUMMARY when set."""
    yield SUMMARY
    if not SUMMARY["runs"]:
        return
    text = json.dumps(SUMMARY, indent=1)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("-", "two hosts: figures")
        reporter.write_line(text)
    if os.environ.get("DRAFTFEED_TWO_HOST_SUMMARY"):
        Path(os.environ["DRAFTFEED_TWO_HOST_SUMMARY"]).write_text(text)


# ------------------------------------------------------------------------------------- the two hosts


@pytest.fixture(scope="module")
def pair():
    reason = two_hosts.unavailable()
    if reason is not None:
        pytest.skip(f"two hosts on one machine need network namespaces: {reason}")
    made = two_hosts.TwoHosts.create()
    yield made
    made.destroy()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("two_hosts")


@pytest.fixture(scope="module")
def rows(prepared) -> Rows:
    return Rows(prepared["data"])


def host_env(host: two_hosts.Host, pair: two_hosts.TwoHosts) -> dict:
    env = _env()
    env.update(
        MASTER_ADDR=pair.a.address,
        GLOO_SOCKET_IFNAME=two_hosts.LINK,  # the interface the hosts share
        MOONCAKE_LOCAL_HOSTNAME=host.address,  # what this host's store clients announce
    )
    return env


class TwoHostRun:
    """One training run: a torchrun on each host, each a bounded `Run` (host A's log holds ranks 0-1,
    host B's ranks 2-3); metrics of rank r in WORKDIR/metrics-NAME.r.jsonl."""

    def __init__(self, name: str, pair: two_hosts.TwoHosts, workdir: Path, loader: str, flags: list[str],
                 *, host_b_options: tuple[str, ...] = (), pg_timeout: float | None = None):
        self.name, self.loader, self.workdir = name, loader, workdir
        port = next(_PORTS)
        self.runs: dict[str, Run] = {}
        for node_rank, host in enumerate((pair.a, pair.b)):
            harness = [
                str(HARNESS), "train", "--loader", loader, "--metrics", str(workdir / f"metrics-{name}"),
                *(["--pg-timeout", str(pg_timeout)] if pg_timeout is not None else []),
                *(host_b_options if host is pair.b else ()), "--", *flags,
            ]
            cmd = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                "--node-rank", str(node_rank), "--master-addr", pair.a.address, "--master-port", str(port),
                *harness,
            ]
            self.runs[host.label] = Run(f"{name}-host{host.label}", workdir, cmd, RUN_TIMEOUT, loader,
                                        env=host_env(host, pair), host=host)

    def finish(self) -> dict:
        """Waits for both hosts (bounded), checks they succeeded with the expected loader; returns
        the run's metric records per rank. A host that fails ends the other at once (its ranks would
        wait for the lost ones in a collective)."""
        deadline = time.monotonic() + RUN_TIMEOUT
        while any(run.proc.poll() is None for run in self.runs.values()) and time.monotonic() < deadline:
            if any(run.proc.poll() not in (None, 0) for run in self.runs.values()):
                break
            time.sleep(0.1)
        failed = [label for label, run in self.runs.items() if run.proc.poll() not in (None, 0)]
        if failed:
            for run in self.runs.values():
                run._kill_group()
        for label, run in self.runs.items():
            rc = run.wait()
            if rc != 0:
                pytest.fail(f"{self.name}: host {label} exit status {rc} (failed first: {failed})\n{self.tails()}")
        self.seconds = max(run.seconds for run in self.runs.values())
        out = {rank: metrics(self.workdir, self.name, rank) for rank in range(WORLD)}
        for rank in (0, 2):  # one rank per host says which loader its trainer called
            meta = [r for r in out[rank] if r["kind"] == "meta"]
            assert meta and meta[0]["create_train_val_loaders"] == EXPECTED_FUNCTION[self.loader], meta
            assert meta[0]["speculators"] == "0.9.0", meta
        record_run(self.name, self.seconds, out)
        return out

    def tails(self) -> str:
        return "\n".join(f"--- host {label} ---\n{run.tail()}" for label, run in self.runs.items())


def ranks(records: dict) -> list[list[dict]]:
    return [records[rank] for rank in range(WORLD)]


def first_steps(records: dict) -> dict:
    """Per host: the trainer's own fetch_ms of the first step of each epoch (time to first batch:
    from the start of the epoch's loop to the batch in hand; the slowest rank of the host), and the
    median fetch_ms over the other steps (all the host's ranks)."""
    out = {}
    for host, host_ranks in RANKS.items():
        per_epoch: dict[int, float] = {}
        steady = []
        for rank in host_ranks:
            train = [r for r in records[rank] if r["kind"] == "train" and r.get("profile")]
            for i, r in enumerate(train):
                ms = r["profile"]["fetch_ms"]["f"]
                if i == 0 or r["epoch"] != train[i - 1]["epoch"]:
                    per_epoch[r["epoch"]] = max(per_epoch.get(r["epoch"], 0.0), ms)
                else:
                    steady.append(ms)
        out[host] = {"first_batch_ms_per_epoch": {e: round(v, 1) for e, v in sorted(per_epoch.items())},
                     "steady_fetch_ms_median": round(statistics.median(steady), 2) if steady else None}
    return out


def record_run(name: str, seconds: float, records: dict) -> None:
    SUMMARY["runs"][name] = {"seconds": round(seconds, 1), "per_host": first_steps(records)}


def batch_problems(ref: dict, ours: dict, label: str) -> list[str]:
    """Every rank's batches, step by step (training) and epoch by epoch (validation), must be the
    reference's: the documents the draft model was called with, in order."""
    problems = []
    for rank in range(WORLD):
        a = [(r["kind"], r["step"], r["batches"]) for r in ref[rank] if r["kind"] in ("train", "val")]
        b = [(r["kind"], r["step"], r["batches"]) for r in ours[rank] if r["kind"] in ("train", "val")]
        if len(a) != len(b):
            problems.append(f"{label}: rank {rank}: {len(a)} metric records with the reference, {len(b)} ours")
        for x, y in zip(a, b):
            if x != y:
                problems.append(f"{label}: rank {rank}: {x[0]} step {x[1]}: other batches than the reference's")
                break
    return problems


def assert_same_training(ref: dict, ours: dict, rows: Rows, label: str) -> None:
    problems = compare(ranks(ref), ranks(ours), rows, label) + batch_problems(ref, ours, label)
    assert not problems, "\n".join(problems)


def steps_seen(records: dict) -> int:
    return sum(r["kind"] == "train" for r in records[0])


# ------------------------------------------------------------------------------------------- offline


@pytest.fixture(scope="module")
def offline(pair, workdir, prepared) -> dict:
    """Both loaders across the two hosts, one run after the other, from the one cache folder."""
    out = {}
    for loader in LOADERS:
        flags = trainer_flags(prepared, workdir / f"ckpt-offline-{loader}", num_workers=0,
                              checkpoint_freq=CHECKPOINT_FREQ)
        out[loader] = TwoHostRun(f"offline-{loader}", pair, workdir, loader, flags).finish()
    return out


def test_offline_two_hosts_losses_and_batches_bit_for_bit(offline, rows, pair):
    ref, ours = offline["reference"], offline["draftfeed"]
    n_train, n_val = steps_seen(ref), sum(r["kind"] == "val" for r in ref[0])
    assert n_train >= 6 and n_val == 2, (n_train, n_val)
    assert_same_training(ref, ours, rows, "two hosts, offline")
    print(f"\n{pair.describe()}\noffline: {n_train} steps, 4 ranks; per host (ms): "
          f"reference {first_steps(ref)}, draftfeed {first_steps(ours)}")


# -------------------------------------------------------------------------------------------- online


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError(f"no answer from host A's services within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"host A's services exited ({proc.poll()})")
    return line


class Services:
    """two_host_services.py on host A: a Mooncake master and the simulated vLLM server."""

    def __init__(self, pair: two_hosts.TwoHosts, workdir: Path, prepared: dict):
        self.log = open(workdir / "services.log", "w")
        self.proc = pair.a.popen(
            [sys.executable, str(SERVICES), "--host", pair.a.address, "--server-dir", str(workdir / "server"),
             "--model", prepared["verifier"], "--layers", "4", "--hidden", str(prepared["hidden_size"])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=host_env(pair.a, pair))
        try:
            self.info = json.loads(_read_line(self.proc, 180))
        except (TimeoutError, RuntimeError) as error:
            self.close()
            pytest.fail(f"{error}:\n{(workdir / 'services.log').read_text()[-4000:]}")

    def ask(self, command: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(_read_line(self.proc, 30))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def online(pair, workdir, prepared) -> dict:
    """Both loaders across the two hosts, every sample generated on host A and passed through the
    Mooncake Store; the dataset without its cache."""
    data = workdir / "online-data"
    shutil.copytree(prepared["data"], data, ignore=shutil.ignore_patterns("hidden_states"))
    services = Services(pair, workdir, prepared)
    out: dict[str, Any] = {"services": services.info}
    try:
        for loader in LOADERS:
            services.ask("reset")
            flags = [
                *trainer_flags({**prepared, "data": str(data)}, workdir / f"ckpt-online-{loader}",
                               num_workers=0, checkpoint_freq=CHECKPOINT_FREQ),
                "--on-missing", "generate", "--vllm-endpoint", services.info["vllm"],
                "--hidden-states-backend", "mooncake", "--mooncake-master", services.info["master"],
                # The trainers are pure consumers: every object lives in the server's segment on
                # host A, and stays there until deleted (a trainer's own segment would leave with it).
                "--mooncake-global-segment-gib", "0", "--mooncake-local-buffer-gib", "0.0625",
            ]
            out[loader] = TwoHostRun(f"online-{loader}", pair, workdir, loader, flags).finish()
            out[f"{loader}-store"] = services.ask("stats")
    finally:
        services.close()
    return out


def test_online_two_hosts_through_mooncake_losses_and_batches_bit_for_bit(online, rows, prepared):
    ref, ours = online["reference"], online["draftfeed"]
    assert steps_seen(ref) >= 6
    assert_same_training(ref, ours, rows, "two hosts, online through Mooncake")
    for loader in LOADERS:
        store = online[f"{loader}-store"]
        sim = store["sim"]
        assert store["keys"] == 0, f"{loader}: keys left in the store after the run: {store['left']}"
        assert sim["mooncake"]["writes"] == sim["completions"] > 0, sim["mooncake"]
        assert sim["mooncake"]["writes_failed"] == 0 and sim["mooncake"]["not_written"] == 0
    # One request per row and epoch (every rank's rows: two epochs of training and validation), on
    # both sides: every sample went through the store, host B's ranks' share across the link.
    assert online["draftfeed-store"]["sim"]["completions"] == online["reference-store"]["sim"]["completions"] \
        == 2 * prepared["rows"]
    print(f"\nonline: master {online['services']['master']}, server {online['services']['vllm']}; "
          f"{online['reference-store']['sim']['completions']} samples put and fetched per run; per host (ms): "
          f"reference {first_steps(ref)}, draftfeed {first_steps(ours)}")


# ------------------------------------------------------------------------------------- a host lost


def cache_digest(hidden: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(hidden.glob("*.safetensors"))}


class LostData:
    """A lost-host scenario's own copy of the dataset and cache, with a lock file beside every cache
    file (as vLLM's connector leaves them, for the reader to remove), and the files' digests."""

    def __init__(self, workdir: Path, prepared: dict, name: str):
        self.path = workdir / f"data-{name}"
        shutil.copytree(prepared["data"], self.path)
        self.hidden = self.path / "hidden_states"
        for f in self.hidden.glob("*.safetensors"):
            (self.hidden / (f.name + ".lock")).touch()
        self.digest = cache_digest(self.hidden)

    def assert_intact(self, label: str) -> dict:
        """`draftfeed verify`: every file ok, none locked; and every file's bytes unchanged."""
        proc = subprocess.run([cli_path(), "verify", str(self.path), "--json"], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"{label}: {proc.stdout}{proc.stderr}"
        report = json.loads(proc.stdout)
        assert report["ok"] == report["rows"] == len(self.digest), f"{label}: {report}"
        assert report["locked"] == report["corrupt"] == report["missing"] == 0, f"{label}: {report}"
        assert cache_digest(self.hidden) == self.digest, f"{label}: cache files changed"
        report["locks_left_unheld"] = len(list(self.hidden.glob("*.lock")))
        return report


@pytest.fixture(scope="module")
def hold_step(offline) -> int:
    """The training step right after the first mid-epoch checkpoint that skips at least two batches
    on resume (from the uninterrupted reference run): host B waits after it. No checkpoint follows
    that step, so the last checkpoint is whole when host B is lost."""
    ckpts = [r for r in offline["reference"][0] if r["kind"] == "checkpoint"]
    mid = [c for c in ckpts if c["epoch"] == 0 and c["local_step"] >= 2]
    assert mid, f"no mid-epoch checkpoint in epoch 0: {ckpts}"
    step = mid[0]["global_step"]  # the steps done at the checkpoint: the index of the next step
    assert all(c["global_step"] != step + 1 for c in ckpts), "a checkpoint right after the hold step"
    return step


class LostHost:
    """A draftfeed run whose host B waits after `hold_step`, right after a mid-epoch checkpoint
    (harness --hold-after-step); the caller then kills host B or cuts it off."""

    def __init__(self, name: str, pair: two_hosts.TwoHosts, workdir: Path, prepared: dict, data: LostData,
                 hold_step: int, pg_timeout: float | None = None):
        self.name, self.pair, self.data = name, pair, data
        self.save_path = workdir / f"ckpt-{name}"
        self.hold_dir = workdir / f"hold-{name}"
        self.hold_dir.mkdir()
        (self.hold_dir / "hold").touch()
        flags = trainer_flags({**prepared, "data": str(data.path)}, self.save_path, num_workers=0,
                              checkpoint_freq=CHECKPOINT_FREQ)
        self.run = TwoHostRun(name, pair, workdir, "draftfeed", flags, pg_timeout=pg_timeout,
                              host_b_options=("--hold-after-step", str(hold_step), "--hold-dir", str(self.hold_dir)))
        started = time.monotonic()
        held = [self.hold_dir / f"held.{rank}" for rank in RANKS["B"]]
        while not all(p.exists() for p in held):
            if any(run.proc.poll() is not None for run in self.run.runs.values()) or \
                    time.monotonic() > started + RUN_TIMEOUT:
                self.close()
                pytest.fail(f"{name}: host B never reached step {hold_step}\n{self.run.tails()}")
            time.sleep(0.05)
        self.seconds_to_hold = time.monotonic() - started
        ckpts = [r for r in metrics(workdir, name, 0) if r["kind"] == "checkpoint"]
        assert ckpts and ckpts[-1]["global_step"] == hold_step and ckpts[-1]["local_step"] > 0, ckpts
        self.checkpoint = {k: v for k, v in ckpts[-1].items() if k != "path"}

    def wait_hosts(self, since: float, bound: float) -> dict[str, tuple[int | None, float]]:
        """Each host's torchrun: its exit status (None: still running `bound` seconds after `since`)
        and the seconds from `since` to its end."""
        ended: dict[str, tuple[int | None, float]] = {}
        while len(ended) < len(self.run.runs):
            for label, run in self.run.runs.items():
                if label not in ended and run.proc.poll() is not None:
                    ended[label] = (run.proc.returncode, time.monotonic() - since)
            if time.monotonic() > since + bound:
                for label in self.run.runs:
                    ended.setdefault(label, (None, bound))
            time.sleep(0.05)
        return ended

    def log(self, label: str) -> str:
        return self.run.runs[label].log_path.read_text(errors="replace")

    def close(self) -> None:
        for run in self.run.runs.values():
            run._kill_group()
            if not run.log.closed:
                run.log.close()


def checkpoint_files(save_path: Path) -> dict[str, bytes]:
    """The last checkpoint's files (the epoch-0 folder), but the command's record (a timestamp)."""
    folder = save_path / "0"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != "train_command.txt"}


@pytest.fixture(scope="module")
def cut_pair():
    """The network-cut case's own two hosts: while host B there is cut off and host A's ranks wait
    out their timeout, the killed case's resumed runs use the module's pair."""
    if two_hosts.unavailable() is not None:
        pytest.skip(f"two hosts on one machine need network namespaces: {two_hosts.unavailable()}")
    made = two_hosts.TwoHosts.create("cut")
    yield made
    made.destroy()


@pytest.fixture(scope="module")
def lost_hosts(pair, cut_pair, workdir, prepared, hold_step, offline) -> dict:
    """Both cases, in this order:
    1. killed: host B's every process SIGKILLed while it waits after `hold_step`; host A's ranks must
       end within KILL_BOUND; the cache is checked; the checkpoint is copied for the oracle;
    2. cut: the same run on `cut_pair`, host B's link cut, host B let go on; host A's ranks must end
       within CUT_BOUND (process group timeout PG_TIMEOUT); meanwhile, on `pair`, the killed run
       restarts (draftfeed) and the reference resumes from the copy (the oracle), together;
    3. the cut run restarts on both hosts of `cut_pair`, its link up again."""
    out: dict[str, Any] = {"uninterrupted": offline["reference"]}

    killed_data = LostData(workdir, prepared, "killed")
    killed = LostHost("killed", pair, workdir, prepared, killed_data, hold_step)
    try:
        since = time.monotonic()
        pids = pair.b.kill_everything()
        ended = killed.wait_hosts(since, KILL_BOUND)
    finally:
        killed.close()
    (rc, seconds), (b_rc, _) = ended["A"], ended["B"]
    out["killed"] = dict(rc=rc, seconds=seconds, log=killed.log("A"), b_rc=b_rc, pids=pids, lost=killed,
                         report=killed_data.assert_intact("after host B was killed"),
                         records={rank: metrics(workdir, "killed", rank) for rank in range(WORLD)})
    oracle_save = workdir / "ckpt-oracle"
    shutil.copytree(killed.save_path, oracle_save, symlinks=True)
    out["oracle_save"] = oracle_save
    SUMMARY["host_killed"] = {"seconds_to_the_loss": round(killed.seconds_to_hold, 1),
                              "survivors_end_s": round(seconds, 2), "host_b_processes_killed": len(pids),
                              "lock_files_left_unheld": out["killed"]["report"]["locks_left_unheld"]}

    cut_data = LostData(workdir, prepared, "cut")
    cut = LostHost("cut", cut_pair, workdir, prepared, cut_data, hold_step, pg_timeout=PG_TIMEOUT)
    try:
        since = time.monotonic()
        cut_pair.b.cut()
        (cut.hold_dir / "hold").unlink()  # host B goes on, alone
        resumed = {
            loader: TwoHostRun(name, pair, workdir, loader, trainer_flags(
                {**prepared, "data": str(killed_data.path)}, save, num_workers=0, checkpoint_freq=CHECKPOINT_FREQ))
            for loader, name, save in (("draftfeed", "resumed-killed", killed.save_path),
                                       ("reference", "resumed-oracle", oracle_save))
        }
        ended = cut.wait_hosts(since, CUT_BOUND)
    finally:
        cut.close()
        cut_pair.b.kill_everything()
        cut_pair.b.restore()
    (rc, seconds), (b_rc, b_seconds) = ended["A"], ended["B"]
    out["cut"] = dict(rc=rc, seconds=seconds, log=cut.log("A"), b_rc=b_rc, b_seconds=b_seconds, b_log=cut.log("B"),
                      lost=cut, report=cut_data.assert_intact("after host B was cut off"),
                      records={rank: metrics(workdir, "cut", rank) for rank in range(WORLD)})
    SUMMARY["network_cut"] = {"seconds_to_the_loss": round(cut.seconds_to_hold, 1), "pg_timeout_s": PG_TIMEOUT,
                              "survivors_end_s": round(seconds, 2), "host_b_end_s": round(b_seconds, 2)}

    out["resumed-killed"] = {loader: run.finish() for loader, run in resumed.items()}
    out["resumed-killed-logs"] = [run.runs["A"].log_path.read_text(errors="replace") for run in resumed.values()]
    out["resumed-killed-data"] = killed_data

    after_cut = TwoHostRun("resumed-cut", cut_pair, workdir, "draftfeed", trainer_flags(
        {**prepared, "data": str(cut_data.path)}, cut.save_path, num_workers=0, checkpoint_freq=CHECKPOINT_FREQ))
    out["resumed-cut"] = after_cut.finish()
    out["resumed-cut-log"] = after_cut.runs["A"].log_path.read_text(errors="replace")
    out["resumed-cut-data"] = cut_data
    return out


def unlike_uninterrupted(part: dict, whole: dict, label: str, *, metrics_too: bool) -> list[str]:
    """Every training and validation record of `part` (every rank) against the uninterrupted run's at
    the same step: the same batches, and with `metrics_too` the same metrics bit for bit."""
    problems = []
    for rank in range(WORLD):
        full = {(r["kind"], r["step"], r["epoch"]): r for r in whole[rank] if r["kind"] in ("train", "val")}
        for record in part[rank]:
            kind = record["kind"]
            if kind not in ("train", "val"):
                continue
            other = full.get((kind, record["step"], record["epoch"]))
            if other is None or other["batches"] != record["batches"]:
                problems.append(f"{label}: rank {rank}, {kind} step {record['step']}: other batches than the "
                                "uninterrupted run's")
                break
            if metrics_too and other[kind] != record[kind]:
                problems.append(f"{label}: rank {rank}, {kind} step {record['step']}: other metrics than the "
                                "uninterrupted run's")
                break
    return problems


def assert_resumed_like_oracle(resumed: dict, oracle: dict, checkpoint: dict, rows: Rows, label: str,
                               logs: list[str]) -> None:
    for log in logs:
        assert f"Fast-skipping {checkpoint['local_step']} batches via sampler slice" in log, (
            f"{label}: the restarted trainer did not resume mid-epoch from its checkpoint\n{log[-3000:]}")
    for records in (resumed, oracle):
        first = next(r for r in records[0] if r["kind"] == "train")
        assert first["step"] == checkpoint["global_step"], (label, first["step"], checkpoint)
    assert_same_training(oracle, resumed, rows, label)


def test_host_killed_mid_epoch_ends_the_survivors_bounded_and_resumes(lost_hosts, rows):
    killed, whole = lost_hosts["killed"], lost_hosts["uninterrupted"]
    assert killed["pids"], "nothing ran on host B"
    assert killed["rc"] is not None, f"host A's ranks still ran {KILL_BOUND:.0f} s after host B died (a hang)"
    assert killed["rc"] != 0, "host A's torchrun succeeded without host B"
    assert killed["b_rc"] == -9
    # What happened, named: gloo's error on host A's ranks names host B's address.
    assert f"Connection closed by peer [{two_hosts.ADDRESS_B}]" in killed["log"], killed["log"][-4000:]
    assert "ChildFailedError" in killed["log"]
    assert_resumed_like_oracle(lost_hosts["resumed-killed"]["draftfeed"], lost_hosts["resumed-killed"]["reference"],
                               killed["lost"].checkpoint, rows, "resumed after host B was killed",
                               lost_hosts["resumed-killed-logs"])
    # Before the loss the run trained as the uninterrupted one; after the restart both runs see the
    # uninterrupted run's batches (not its metrics: speculators' checkpoints are bf16, so a resumed run
    # goes on from rounded weights, with either loader).
    problems = unlike_uninterrupted(killed["records"], whole, "before host B was killed", metrics_too=True)
    for loader, records in lost_hosts["resumed-killed"].items():
        problems += unlike_uninterrupted(records, whole, f"{loader} resumed after the kill", metrics_too=False)
    assert not problems, "\n".join(problems)
    lost_hosts["resumed-killed-data"].assert_intact("after the resumed runs")
    print(f"\nhost B killed ({len(killed['pids'])} processes) after step {killed['lost'].checkpoint['global_step']}: "
          f"host A's ranks ended in {killed['seconds']:.1f} s; cache: {killed['report']}")


def test_network_cut_mid_epoch_ends_the_survivors_bounded_and_resumes(lost_hosts, rows):
    cut = lost_hosts["cut"]
    assert cut["rc"] is not None, (
        f"host A's ranks still ran {CUT_BOUND:.0f} s after host B was cut off (a hang)\n{cut['log'][-4000:]}")
    assert cut["rc"] != 0, "host A's torchrun succeeded without host B"
    # What happened, named: a collective that timed out after the process group's timeout.
    assert f"Timed out waiting {int(PG_TIMEOUT * 1000)}ms" in cut["log"], cut["log"][-4000:]
    assert "ChildFailedError" in cut["log"]
    assert cut["seconds"] >= PG_TIMEOUT, cut["seconds"]
    assert cut["b_rc"] is not None, f"host B's ranks, cut off, still ran after {CUT_BOUND:.0f} s:\n{cut['b_log'][-4000:]}"
    # The same checkpoint as the killed run's (the same step, the same bytes): the same oracle.
    assert cut["lost"].checkpoint == lost_hosts["killed"]["lost"].checkpoint
    assert checkpoint_files(lost_hosts["oracle_save"]) == checkpoint_files(cut["lost"].save_path)
    assert_resumed_like_oracle(lost_hosts["resumed-cut"], lost_hosts["resumed-killed"]["reference"],
                               cut["lost"].checkpoint, rows, "resumed after host B was cut off",
                               [lost_hosts["resumed-cut-log"]])
    whole = lost_hosts["uninterrupted"]
    problems = unlike_uninterrupted(cut["records"], whole, "before host B was cut off", metrics_too=True)
    problems += unlike_uninterrupted(lost_hosts["resumed-cut"], whole, "resumed after the cut", metrics_too=False)
    assert not problems, "\n".join(problems)
    lost_hosts["resumed-cut-data"].assert_intact("after the resumed run")
    print(f"\nhost B cut off after step {cut['lost'].checkpoint['global_step']}: host A's ranks ended in "
          f"{cut['seconds']:.1f} s (process group timeout {PG_TIMEOUT:.0f} s), host B's in "
          f"{cut['b_seconds']:.1f} s; cache: {cut['report']}")
