"""Batches onto the GPU, against the fake CUDA runtime (tests/cuda/fake_cudart.cc): its copies and
events complete late (FAKE_CUDA_LATENCY_US) on another thread, it has several devices and records
every call's current device. It is a stand-in, not a GPU: scripts/gpu_check.sh runs the same checks
on a real one.

The consumer (tests/python/fake_cuda_consumer.py) plays a trainer whose CPU runs ahead of its GPU: it
queues its copies of each batch (or, with the device stage, its work on it) and drops the batch at
once, never synchronizing; at the end it reads what the device received. Each figure is checked
against the same batches read in ordinary memory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from reference_fixtures import write_fixture

pytestmark = pytest.mark.timeout(600)

HERE = os.path.dirname(__file__)
BATCH_BYTES = 15360  # one batch of the fixture below: total_seq_len 96, hidden 16, 3+1 layers, bf16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_fixture(str(tmp_path_factory.mktemp("device") / "data"), rows=64, max_len=96).path


def consume(data, fake_cudart, tmp_path, mode, *args, local_rank=3, latency_us=5000, consumer_slowness=1):
    log = tmp_path / f"cuda-{mode}.log"
    env = {**os.environ, "DRAFTFEED_CUDART": fake_cudart, "FAKE_CUDA_DEVICES": "4",
           "FAKE_CUDA_LATENCY_US": str(latency_us), "FAKE_CUDA_LOG": str(log),
           "LOCAL_RANK": str(local_rank), "FAKE_CUDA_CONSUMER_SLOWNESS": str(consumer_slowness)}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "fake_cuda_consumer.py"), data, mode, *map(str, args)],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["log"] = log.read_text().splitlines() if log.exists() else []
    return out


def assert_every_batch_received_intact(out):
    assert out["batches"] > 40
    assert out["received"] == out["batches"]
    assert out["mismatches"] == [], f"{len(out['mismatches'])} tensors differ: {out['mismatches'][:5]}"
    assert out["violations"] == []


def engine_calls_off_device(out, device):
    """The engine's CUDA calls (not the test's own, by=test) made with another device current."""
    bad = []
    for line in out["log"]:
        found = re.search(r"\bdevice=(\d+)", line)
        if line.startswith("call=") and "by=engine" in line and int(found.group(1)) != device:
            bad.append(line)
    return bad


# -- 1. page-locked buffers are not rewritten under a pending copy --

@pytest.mark.parametrize("stream", ["default", "own"])
def test_a_consumer_running_ahead_receives_every_pinned_batch_intact(data, fake_cudart, tmp_path, stream):
    out = consume(data, fake_cudart, tmp_path, "pinned", "--stream", stream)
    assert_every_batch_received_intact(out)
    assert out["metrics"]["pinned"] is True and out["metrics"]["device"] == -1


def test_kept_tensors_of_pinned_batches_stay_intact_too(data, fake_cudart, tmp_path):
    # input_ids of the last 3 batches kept (a trainer that logs them): their slots are replaced in
    # later batches, and the replacements are page-locked and fenced the same way.
    out = consume(data, fake_cudart, tmp_path, "pinned", "--keep", 3, "--prefetch", 2)
    assert out["metrics"]["held_slot_bytes"] >= 0
    assert_every_batch_received_intact(out)


# -- 2. the device stage --

@pytest.mark.parametrize("stream", ["default", "own"])
def test_the_device_stage_delivers_every_batch_intact_in_device_memory(data, fake_cudart, tmp_path, stream):
    out = consume(data, fake_cudart, tmp_path, "device", "--stream", stream)
    assert_every_batch_received_intact(out)
    metrics = out["metrics"]
    assert metrics["device"] == 3 and metrics["device_buffers"] == 2
    assert metrics["device_buffer_bytes"] == BATCH_BYTES
    assert metrics["device_peak_bytes"] == 2 * BATCH_BYTES
    assert metrics["batches"] == out["batches"]
    # Device memory: the stage's buffers, nothing else (the consumer's own is not counted).
    assert out["peak_device_bytes"] <= 2 * BATCH_BYTES + 2 * 256
    # Each batch is copied once per tensor, on the stage's stream, after its assembly.
    copies = [line for line in out["log"] if line.startswith("call=cudaMemcpyAsync") and "kind=1" in line]
    assert len(copies) == out["tensors"]


@pytest.mark.parametrize("stream", ["default", "own"])
def test_a_device_buffer_is_rewritten_only_after_a_slow_consumers_reads(data, fake_cudart, tmp_path, stream):
    # The trainer's stream 16x slower than the engine's copy stream (a GPU busy with the trainer's
    # kernels for several steps): its reads of batch i land after the copy of batch i + 2 into the
    # same device buffer would, unless the copy stream waits for them (order_after_reads).
    out = consume(data, fake_cudart, tmp_path, "device", "--stream", stream, consumer_slowness=16)
    assert_every_batch_received_intact(out)
    # The fence had work to do: buffers were about to be rewritten while their reads were pending.
    assert out["fence_counts"]["rewrites_while_read"] > 0


def test_the_device_stage_takes_its_buffers_from_the_memory_it_is_given(data, fake_cudart, tmp_path):
    # As the Python layer gives it torch's memory: blocks the consumer allocated, handed over once.
    given = consume(data, fake_cudart, tmp_path, "device", "--given-memory")
    assert_every_batch_received_intact(given)
    assert given["given"] == 2 and given["outside_given"] == []
    assert given["metrics"]["device_memory"] == "given"
    assert given["metrics"]["device_memory_fallback_bytes"] == 0
    # Taken and given back without a cudaMalloc, a cudaFree or a device-wide synchronisation.
    assert {k: given["engine_calls"][k] for k in ("cudaMalloc", "cudaFree", "cudaDeviceSynchronize")} == {
        "cudaMalloc": 0, "cudaFree": 0, "cudaDeviceSynchronize": 0}
    # The engine's own allocation (no memory given): a cudaMalloc and a cudaFree per buffer and
    # epoch, as before.
    own = consume(data, fake_cudart, tmp_path, "device")
    assert_every_batch_received_intact(own)
    assert own["metrics"]["device_memory"] == "cudaMalloc"
    assert own["engine_calls"]["cudaMalloc"] == own["engine_calls"]["cudaFree"] == 2 * 2
    assert own["engine_calls"]["cudaDeviceSynchronize"] == 0


@pytest.mark.parametrize("buffers", [2, 3])
def test_device_memory_stays_within_its_bound(data, fake_cudart, tmp_path, buffers):
    out = consume(data, fake_cudart, tmp_path, "device", "--device-buffers", buffers)
    assert_every_batch_received_intact(out)
    assert out["metrics"]["device_buffers"] == buffers
    assert out["peak_device_bytes"] <= buffers * (BATCH_BYTES + 256)


def test_a_consumer_keeping_device_batches_grows_the_pool_instead_of_deadlocking(data, fake_cudart, tmp_path):
    # Whole batches kept (their Batch objects) for 3 steps: the device pool adds buffers, counted.
    out = consume(data, fake_cudart, tmp_path, "device", "--keep", 3)
    assert_every_batch_received_intact(out)
    metrics = out["metrics"]
    assert metrics["device_extra_buffers"] >= 1
    # What the engine allocated at most, as the fake runtime saw it, is what metrics() says.
    assert metrics["device_peak_bytes"] >= (2 + metrics["device_extra_buffers"]) * BATCH_BYTES
    assert out["peak_device_bytes"] <= metrics["device_peak_bytes"] + 256 * 8


# -- 3. every CUDA call on the rank's device --

@pytest.mark.parametrize("mode", ["pinned", "device"])
@pytest.mark.parametrize("consumer", ["trainer thread", "thread that never chose a device"])
def test_no_context_is_opened_on_another_device_than_the_ranks(data, fake_cudart, tmp_path, mode, consumer):
    extra = ["--keep", 2, "--prefetch", 2] if mode == "pinned" else []
    if consumer != "trainer thread":
        extra += ["--no-set-device", "--consumer-thread"]
    out = consume(data, fake_cudart, tmp_path, mode, *extra, local_rank=3)
    assert any("by=engine" in line for line in out["log"])
    assert engine_calls_off_device(out, 3) == []
    assert out["contexts"] == [3]
    assert_every_batch_received_intact(out)


# -- 4. off: as before --

def test_without_pinning_the_engine_makes_no_cuda_call(data, fake_cudart, tmp_path):
    script = (
        "import sys, draftfeed\n"
        "loader = draftfeed.Loader(sys.argv[1], hidden_size=16, total_seq_len=96, train_ratio=0.75,\n"
        "                          num_target_layers=3, pin_memory=False)\n"
        "n = sum(1 for _ in loader)\n"
        "m = loader.metrics()\n"
        "assert n > 0 and m['pinned'] is False and m['device'] == -1 and loader.cuda_device == -1\n"
    )
    log = tmp_path / "calls.log"
    env = {**os.environ, "DRAFTFEED_CUDART": fake_cudart, "FAKE_CUDA_LOG": str(log)}
    proc = subprocess.run([sys.executable, "-c", script, data], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not log.exists() or log.read_text() == ""


def run_script(script, data, env, timeout=120):
    proc = subprocess.run([sys.executable, "-c", script, data], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})
    return proc


def test_the_device_stage_without_a_device_is_a_clear_error(data, fake_cudart):
    script = (
        "import sys, draftfeed\n"
        "try:\n"
        "    draftfeed.Loader(sys.argv[1], hidden_size=16, total_seq_len=96, num_target_layers=3,\n"
        "                     device='cuda:7')\n"
        "except ValueError as e:\n"
        "    print('ERROR', e)\n"
    )
    no_runtime = run_script(script, data, {"DRAFTFEED_CUDART": "/nonexistent/libcudart.so"})
    assert "ERROR the device stage needs CUDA device cuda:7" in no_runtime.stdout, no_runtime.stderr
    # The fake has 4 devices: cuda:7 is refused by the runtime, and the error says so.
    no_device = run_script(script, data, {"DRAFTFEED_CUDART": fake_cudart, "FAKE_CUDA_DEVICES": "4"})
    assert "cuda:7" in no_device.stdout and "invalid device ordinal" in no_device.stdout, no_device.stderr


def test_the_device_stage_refuses_a_python_preprocess(data, fake_cudart):
    script = (
        "import sys, draftfeed\n"
        "try:\n"
        "    draftfeed.Loader(sys.argv[1], hidden_size=16, total_seq_len=96, num_target_layers=3,\n"
        "                     preprocess=lambda s: s, device='cuda:0')\n"
        "except ValueError as e:\n"
        "    print('ERROR', e)\n"
    )
    proc = run_script(script, data, {"DRAFTFEED_CUDART": fake_cudart})
    assert "ERROR the device stage needs the engine to pack its batches" in proc.stdout, proc.stderr


RESUME = r"""
import json, sys, draftfeed
sys.path.insert(0, sys.argv[2])
from fake_cuda_consumer import RawLoader
kw = dict(hidden_size=16, total_seq_len=96, train_ratio=0.75, num_target_layers=3, seed=5,
          in_order=False, device="cuda:0")
first = RawLoader(sys.argv[1], **kw)
first.set_epoch(1)
seen = []
for batch in first:
    seen.append(batch.index)
    if len(seen) == 7:
        break
state = first.state_dict()
del batch, first
second = RawLoader(sys.argv[1], **kw)
second.load_state_dict(json.loads(json.dumps(state)))
rest = [batch.index for batch in second]
total = len(second)
print(json.dumps({"seen": seen, "rest": rest, "total": total}))
"""


def test_the_device_stage_resumes_exactly(data, fake_cudart):
    proc = subprocess.run([sys.executable, "-c", RESUME, data, HERE], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DRAFTFEED_CUDART": fake_cudart})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["seen"]) == 7
    assert sorted(out["seen"] + out["rest"]) == list(range(out["total"]))


def test_the_drop_in_turns_the_device_stage_on_wherever_the_reference_would_pin(monkeypatch):
    # The reference's DataLoader pins whenever CUDA is available; the drop-in then delivers on
    # cuda:$LOCAL_RANK, unless told not to or unless a Python preprocess needs host memory.
    import torch

    from draftfeed import speculators

    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # "cuda": the rank's device, which the engine resolves from LOCAL_RANK (one place).
    assert speculators._device_stage("eagle3") == "cuda"
    assert speculators._device_stage("none") == "cuda"
    assert speculators._device_stage(None) is None  # a callable the engine does not know
    monkeypatch.setenv("DRAFTFEED_DEVICE_STAGE", "0")
    assert speculators._device_stage("eagle3") is None
    monkeypatch.delenv("DRAFTFEED_DEVICE_STAGE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert speculators._device_stage("eagle3") is None
