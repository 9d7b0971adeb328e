"""What the tests against a real Mooncake Store share (tests/python/test_mooncake_*.py): running a
module's tests inside a private network namespace (Mooncake's store clients listen on every
interface), the trainer's transfer as speculators 0.9.0 builds it, its call, and one epoch of a
side's loaders with the store's key count.

A test module defines

    @pytest.fixture(scope="module")
    def private_run(request, tmp_path_factory):
        return run_module_in_private_network(request, tmp_path_factory, Path(__file__).resolve(),
                                             OUTER_TIMEOUT)

and each test starts with `if ran_in_private_network(request): return`: outside the namespace it
reports the outcome its run inside had; inside, the test body runs.

hs-connectors' store waits 120 s for a key that never comes; `short_key_wait` makes it KEY_WAIT
seconds (its get_sample default, patched in the one process where every side runs; draftfeed's
native transfer waits what that default says), so a missing key costs seconds.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dropin_helpers import iterate

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
from mooncake_master_process import (  # noqa: E402
    IN_PRIVATE_NETWORK,
    MooncakeMasterProcess,
    enter_private_network,
    listening_sockets,
    private_network_command,
    private_network_unavailable,
)

INSIDE = os.environ.get(IN_PRIVATE_NETWORK) == "1"
KEY_WAIT = 3.0
MAX_LEN, LAYERS, HIDDEN = 96, 4, 16


def mooncake_sim(folder: Path, master: MooncakeMasterProcess, write: str = "async"):
    """The simulated vLLM server putting each sample into `master`'s store with hs-connectors' own
    connector code (tools/sim_mooncake.py): after answering (write="async", as vLLM may) or before."""
    from sim_vllm_process import SimServerProcess

    return SimServerProcess(folder, layers=LAYERS, hidden=HIDDEN, seed=5, write=write,
                            mooncake_master=master.address, mooncake_segment_mib=64,
                            mooncake_buffer_mib=16, startup_timeout=90)


def run_module_in_private_network(request, tmp_path_factory, here: Path, timeout: float) -> dict:
    """Outside the namespace: the selected tests of the module `here`, run once inside a new
    private network namespace (bounded in time), with their outcomes from pytest's JUnit report.
    A test module's module-scoped `private_run` fixture returns this."""
    from xml.etree import ElementTree

    reason = private_network_unavailable()
    if reason is not None:
        if "not permitted" in reason or "Permission denied" in reason:
            pytest.skip(
                f"network namespaces are not allowed here, and Mooncake's store clients "
                f"listen on every interface: {reason}"
            )
        pytest.fail(f"could not make a private network namespace: {reason}")
    selected = [item.name for item in request.session.items if Path(item.path) == here]
    report = tmp_path_factory.mktemp("mooncake_inside") / "report.xml"
    # Logging goes to stderr, not to pytest's capture: a captured record keeps the exception it
    # formats alive, and with it the store client it came from (past its master's lifetime).
    command = private_network_command(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:logging",
            f"--junitxml={report}",
            *(f"{here}::{name}" for name in selected),
        ]
    )
    start = time.monotonic()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=here.parents[2],
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the tests and what they started
        output, _ = process.communicate(timeout=30)
        pytest.fail(f"the tests did not end in {timeout} s inside the namespace:\n{output}")
    outcomes = {}
    if report.exists():
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            problems = [child for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[case.get("name")] = (
                problems[0].tag if problems else "passed",
                (problems[0].get("message", "") + "\n" + (problems[0].text or "")) if problems else "",
                float(case.get("time", 0)),
            )
    return dict(outcomes=outcomes, output=output, code=process.returncode, seconds=time.monotonic() - start)


def ran_in_private_network(request) -> bool:
    """Outside the namespace: True once this test passed inside it (else fails with its report).
    Inside: False, and the test body runs."""
    if INSIDE:
        return False
    run = request.getfixturevalue("private_run")
    outcome, detail, seconds = run["outcomes"].get(request.node.name, ("not run", "", 0.0))
    if outcome != "passed":
        pytest.fail(
            f"inside the private network namespace: {outcome} (pytest exited "
            f"{run['code']}):\n{detail}\n--- output ---\n{run['output'][-20000:]}"
        )
    print(
        f"passed inside a private network namespace in {seconds:.1f} s (all selected: {run['seconds']:.1f} s)"
    )
    return True


# -- fixtures (inside the namespace) --


@pytest.fixture(scope="module")
def network():
    enter_private_network()
    # from_train_args announces this address to the master (else the host name's address, which
    # does not exist in the namespace): what a user sets on a one-machine setup.
    os.environ["MOONCAKE_LOCAL_HOSTNAME"] = "127.0.0.1"


@pytest.fixture
def short_key_wait(monkeypatch):
    from hs_connectors.mooncake_store import MooncakeHiddenStatesStore

    timeout, poll = MooncakeHiddenStatesStore.get_sample.__defaults__
    assert (timeout, poll) == (120.0, 0.05), "hs-connectors' get_sample defaults changed"
    monkeypatch.setattr(MooncakeHiddenStatesStore.get_sample, "__defaults__", (KEY_WAIT, poll))


def trainer_transfer(master: MooncakeMasterProcess, data_path: str):
    """The transfer speculators 0.9.0's trainer builds for `--hidden-states-backend mooncake`."""
    from hs_connectors import HiddenStatesBackend

    backend = HiddenStatesBackend.registry["mooncake"]
    parser = argparse.ArgumentParser()
    backend.add_train_args(parser)
    args = parser.parse_args(
        [
            "--mooncake-master",
            master.address,
            "--mooncake-global-segment-gib",
            "0.125",
            "--mooncake-local-buffer-gib",
            "0.0625",
        ]
    )
    return backend.from_train_args(args, data_path)


def online_args(data_path: str, sim, transfer, **overrides):
    """The keywords speculators 0.9.0's trainer passes (dropin_helpers.SPECULATORS_090_CALL)."""
    args = dict(
        data_path=data_path,
        total_seq_len=MAX_LEN,
        hidden_states_dtype=torch.bfloat16,
        transfer=transfer,
        vllm_endpoint=sim.url,
        on_missing="generate",
        verifier_name_or_path=None,
        request_timeout=30.0,
        max_retries=1,
        generation_validation_retries=1,
        max_consecutive_generation_failures=20,
        hidden_size=HIDDEN,
        num_target_layers=LAYERS - 1,
        num_workers=0,
        prefetch_factor=4,
        preprocess=None,
        train_data_ratio=0.8,
        seed=42,
    )
    args.update(overrides)
    return args


def post_completion(sim, ids: list[int]) -> dict:
    import json
    import urllib.request

    body = {"model": sim.model, "prompt": ids, "max_tokens": 1, "return_token_ids": True}
    request = urllib.request.Request(
        sim.url + "/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def assert_only_loopback_listeners():
    """Every listening socket here (master, server, store clients on 0.0.0.0 / ::) is in this
    namespace, whose only interface is the loopback."""
    import socket

    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    assert listening_sockets(), "nothing listens: not the namespace the servers run in"


def one_epoch(make, data_path: str, sim, master: MooncakeMasterProcess, **overrides) -> dict:
    """Epoch 0 of the training and the validation loader of `make` (the reference's or ours) with a
    new trainer-built transfer; the store's keys are counted while every client is still up (a
    client that leaves takes the objects in its segment with it)."""
    start = time.monotonic()
    transfer = trainer_transfer(master, data_path)
    train, val = make(online_args(data_path, sim, transfer, **overrides))
    train.batch_sampler.set_epoch(0)
    batches = iterate(train)
    val.batch_sampler.set_epoch(0)
    batches += iterate(val)
    result = dict(
        batches=batches,
        stats=sim.stats(),
        seconds=time.monotonic() - start,
        keys=master.key_count(),
        left=master.keys(),
        planned=sum(len(b) for b in train.batch_sampler._generate_batches(0))
        + sum(len(b) for b in val.batch_sampler._generate_batches(0)),
        # draftfeed's: the source's counts (shared by both loaders), the transfer's too
        metrics=train.metrics() if hasattr(train, "metrics") else None,
    )
    # Leave the store now, while its master is up (a client left to the garbage collector after
    # the master stopped retries its unmount for seconds).
    del train, val, transfer
    gc.collect()
    return result


def keys_left_after(master: MooncakeMasterProcess, within: float) -> list[str]:
    """The store's keys once it is empty or `within` seconds have passed (a hang guard): a read
    that was cancelled (a hedged fetch's loser) removes its key when the producer's put lands."""
    deadline = time.monotonic() + within
    while master.key_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    return master.keys()
