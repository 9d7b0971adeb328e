"""Pinned batch memory through a CUDA runtime loaded at run time. No GPU here: the fake runtime
(tests/cuda/fake_cudart.cc, the `fake_cudart` fixture) records the calls, and the real absence of a
usable GPU must leave batches in ordinary memory without any error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import cli_path
from reference_fixtures import write_fixture

pytestmark = pytest.mark.timeout(300)

SCRIPT = textwrap.dedent(
    """
    import json, sys, draftfeed
    path, pin = sys.argv[1], sys.argv[2] == "1"
    loader = draftfeed.Loader(path, hidden_size=16, total_seq_len=96, train_ratio=0.75,
                              num_target_layers=3, prefetch=3, pin_memory=pin)
    batches = sum(1 for _ in loader)
    m = loader.metrics()
    print(json.dumps({"batches": batches, "pinned": m["pinned"], "buffers": m["buffers"],
                      "bytes": m["batch_bytes_each"], "support": draftfeed._core.pinning_support()}))
    """
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_fixture(str(tmp_path_factory.mktemp("pinned") / "data"), rows=24, max_len=96).path


def run(data, pin, env):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, data, "1" if pin else "0"],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_buffers_are_registered_and_released_through_the_runtime(data, fake_cudart, tmp_path):
    log = tmp_path / "calls.log"
    out = run(data, True, {"DRAFTFEED_CUDART": fake_cudart, "FAKE_CUDA_LOG": str(log)})
    assert out["pinned"] is True and out["batches"] > 0
    calls = [dict(field.split("=", 1) for field in line.split()) for line in log.read_text().splitlines()]
    registered = [c for c in calls if c.get("call") == "cudaHostRegister"]
    unregistered = [c for c in calls if c.get("call") == "cudaHostUnregister"]
    assert len(registered) == out["buffers"] >= 3
    assert all(int(c["bytes"]) == out["bytes"] for c in registered)
    # Every pinned buffer is unregistered before it is freed (at exit at the latest).
    assert sorted(c["ptr"] for c in unregistered) == sorted(c["ptr"] for c in registered)


def test_pin_memory_false_never_touches_the_runtime(data, fake_cudart, tmp_path):
    log = tmp_path / "calls.log"
    out = run(data, False, {"DRAFTFEED_CUDART": fake_cudart, "FAKE_CUDA_LOG": str(log)})
    assert out["pinned"] is False
    assert not log.exists()


def test_without_a_usable_gpu_batches_stay_in_ordinary_memory(data):
    out = run(data, True, {"DRAFTFEED_CUDART": "/nonexistent/libcudart.so"})
    assert out["pinned"] is False and out["batches"] > 0


def test_a_runtime_that_sees_no_device_is_said_in_one_short_line(data, fake_cudart, run_cli):
    """torch's CUDA build on a CPU machine: the runtime loads, and every call fails (error 35, the
    driver is too old or absent). The engine line says there is no CUDA device and that batches stay
    in host memory, not the failed call's long message."""
    env = {**os.environ, "DRAFTFEED_CUDART": fake_cudart, "FAKE_CUDA_DEVICES": "0"}
    proc = subprocess.run([cli_path(), "bench", data, "--epochs", "1", "--no-progress"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    engine = next(line for line in proc.stdout.splitlines() if line.startswith("engine"))
    assert engine.endswith("pageable memory (no CUDA device: batches stay in host memory)"), engine
    # A device that is there but not this one is still named with the runtime's reason.
    proc = subprocess.run([cli_path(), "bench", data, "--epochs", "1", "--no-progress"], capture_output=True,
                          text=True, timeout=120, env={**env, "FAKE_CUDA_DEVICES": "1", "LOCAL_RANK": "3"})
    engine = next(line for line in proc.stdout.splitlines() if line.startswith("engine"))
    assert "cuda:3" in engine and "invalid device ordinal" in engine, engine
