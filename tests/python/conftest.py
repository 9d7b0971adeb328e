"""Shared fixtures: where the `draftfeed` program is, and bounded subprocess runs of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest


def cli_path() -> str:
    path = os.environ.get("DRAFTFEED_CLI") or shutil.which("draftfeed")
    if not path:
        pytest.fail("the draftfeed program is not on PATH (pip install . or set DRAFTFEED_CLI)")
    return path


@pytest.fixture
def run_cli():
    """Runs `draftfeed ARGS...` with a time bound; returns the CompletedProcess."""

    def run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [cli_path(), *map(str, args)], capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"draftfeed {' '.join(map(str, args))} exited {proc.returncode}:\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        return proc

    return run


@pytest.fixture
def run_cli_json(run_cli):
    """Runs `draftfeed ARGS... --json` and parses its standard output."""

    def run(*args: str, timeout: float = 120) -> dict:
        return json.loads(run_cli(*args, "--json", timeout=timeout).stdout)

    return run


@pytest.fixture
def topology():
    """Sets the data-parallel placement for both sides: speculators' distributed state (read by the
    reference) and the torchrun environment (read by draftfeed when speculators' state is unset)."""
    from speculators.train import distributed as dist_state

    saved = (dist_state._dp_rank, dist_state._dp_size, os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))

    def set_placement(rank: int, world_size: int, *, via_env: bool):
        dist_state._dp_rank, dist_state._dp_size = rank, world_size
        if via_env:
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)

    yield set_placement
    dist_state._dp_rank, dist_state._dp_size = saved[0], saved[1]
    for key, value in (("RANK", saved[2]), ("WORLD_SIZE", saved[3])):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> dict:
    """The tiny random Llama verifier and the dataset with its cache that speculators' trainer runs on
    (trainer_harness.py prepare), made once for every trainer test of the session."""
    from test_speculators_trainer import prepare

    return prepare(tmp_path_factory.mktemp("trainer_fixture"))


@pytest.fixture(params=["native", "python"])
def both_paths(request):
    """Runs a drop-in test on the native path and on the Python-preprocess path (dropin_helpers)."""
    import dropin_helpers

    dropin_helpers.PATH["mode"] = request.param
    yield request.param
    dropin_helpers.PATH["mode"] = "native"


# -- the fault campaign's counts (tests/python/test_fault_*.py) --
# Each fault test records how many runs it made, how many faults it injected, how many files were
# lost (must be 0) and how many runs hung (must be 0); the totals are printed at the end of the
# session so they can be quoted.

_CAMPAIGN: list[dict] = []


@pytest.fixture
def fault_campaign(request):
    """record(runs=, faults=, lost=, hangs=, note=""): this test's counts, for the summary."""

    def record(*, runs: int, faults: int, lost: int, hangs: int, note: str = "") -> None:
        _CAMPAIGN.append({"test": request.node.name, "runs": runs, "faults": faults, "lost": lost,
                          "hangs": hangs, "note": note})

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _CAMPAIGN:
        return
    terminalreporter.section("fault campaign")
    for entry in _CAMPAIGN:
        terminalreporter.line(
            f"{entry['test']}: runs {entry['runs']}, faults injected {entry['faults']}, files lost "
            f"{entry['lost']}, hangs {entry['hangs']}" + (f" ({entry['note']})" if entry["note"] else ""))
    totals = {key: sum(e[key] for e in _CAMPAIGN) for key in ("runs", "faults", "lost", "hangs")}
    terminalreporter.line(
        f"TOTAL ({len(_CAMPAIGN)} tests): runs {totals['runs']}, faults injected {totals['faults']}, "
        f"files lost {totals['lost']}, hangs {totals['hangs']}")
    report = os.environ.get("DRAFTFEED_FAULT_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"tests": _CAMPAIGN, "totals": totals}, f, indent=1)


# -- the fake CUDA runtime (tests/cuda/fake_cudart.cc): a stand-in, not a GPU --
@pytest.fixture(scope="session")
def fake_cudart(tmp_path_factory) -> str:
    """Builds the fake CUDA runtime, which the engine loads through DRAFTFEED_CUDART; or takes it
    from DRAFTFEED_FAKE_CUDART, built beforehand (scripts/gpu_bundle.sh puts one in its bundle, for
    machines without a compiler)."""
    prebuilt = os.environ.get("DRAFTFEED_FAKE_CUDART")
    if prebuilt:
        return os.path.abspath(prebuilt)
    if shutil.which("c++") is None:
        pytest.skip("the fake CUDA runtime needs c++ to build, or DRAFTFEED_FAKE_CUDART naming a build")
    source = os.path.join(os.path.dirname(__file__), "..", "cuda", "fake_cudart.cc")
    library = str(tmp_path_factory.mktemp("fake_cudart") / "libfakecudart.so")
    subprocess.run(["c++", "-std=c++20", "-O2", "-shared", "-fPIC", "-pthread", "-o", library, source],
                   check=True, timeout=120)
    return library
