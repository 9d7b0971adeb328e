"""On a real GPU (marked `gpu`; skipped, saying why, where torch sees no CUDA device). Run them with
scripts/gpu_check.sh on a machine with an NVIDIA GPU and torch's CUDA build; the fake CUDA runtime's
tests (test_device_stage.py) are the stand-in that runs everywhere, and are not GPU results.

(a) a consumer that never synchronizes and runs ahead of its GPU (its kernels keep the GPU several steps
    behind the CPU) checks every batch it got, on the GPU, against the same batch built on the CPU: at
    least 1,000 batches, with the device stage and without (page-locked host batches moved by
    `.to(device, non_blocking=True)`, as speculators' trainer does). It counts the buffers the engine
    was about to rewrite while the GPU's reads of them were still pending (the fences' work): a count
    of 0 means the GPU was never behind, so the run tested nothing, and fails;
(b) speculators 0.9.0's own trainer on the GPU, once with its loaders and once with the drop-in (the
    device stage on, and off): per-step losses equal bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from reference_fixtures import write_fixture

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason=f"no CUDA device (torch {torch.__version__}: "
                              f"{'a CPU build' if torch.version.cuda is None else 'CUDA ' + torch.version.cuda + ', no device visible'})"),
]

import draftfeed  # noqa: E402

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # total_seq_len 96 and rows of 2-94 tokens: about one batch per row.
    return write_fixture(str(tmp_path_factory.mktemp("gpu") / "data"), rows=1300, max_len=96).path


def loader_options() -> dict:
    return dict(hidden_size=16, total_seq_len=96, train_ratio=0.99, num_target_layers=3, prefetch=3,
                num_threads=2, noise_std=0.05, seed=11)


def cpu_checksums(data) -> dict[int, dict[str, int]]:
    """Each batch's tensors summed as int64 over their 16-bit (or 64-bit) words, built on the CPU."""
    loader = draftfeed.Loader(data, pin_memory=False, **loader_options())
    out: dict = {}
    for batch in loader:
        assert batch is not None and loader.last_batch is not None
        out[loader.last_batch.index] = {k: int(words(v).sum()) for k, v in batch.items()}
    return out


def words(tensor):
    """The tensor's bytes as integers (so that NaN or -0.0 compare too)."""
    flat = tensor.reshape(-1)
    if flat.element_size() == 2:
        return flat.view(torch.int16).to(torch.int64)
    if flat.element_size() == 1:
        return flat.view(torch.uint8).to(torch.int64)
    return flat.view(torch.int64) if flat.element_size() == 8 else flat.view(torch.int32).to(torch.int64)


@pytest.mark.parametrize("stage", ["device stage", "pinned host batches"])
def test_a_consumer_running_ahead_of_its_gpu_gets_every_batch_intact(data, stage):
    expected = cpu_checksums(data)
    assert len(expected) >= 1000
    device = torch.device("cuda", torch.cuda.current_device())
    kwargs = dict(device=device) if stage == "device stage" else dict(pin_memory=True)
    loader = draftfeed.Loader(data, **loader_options(), **kwargs)
    assert loader.metrics()["pinned"] is True
    # About a millisecond of matmuls per batch (a 4096 x 4096 product), queued and never waited for:
    # the CPU runs many steps ahead of the GPU, as a trainer that does not synchronise.
    busy = torch.randn(4096, 4096, device=device)
    before = draftfeed._core.fence_counts()["rewrites_while_read"]
    behind = 0
    sums: dict[int, dict[str, torch.Tensor]] = {}
    for batch in loader:
        index = loader.last_batch.index
        on_gpu = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        # The batch's first use, then work that keeps the GPU behind.
        sums[index] = {k: words(v).sum() for k, v in on_gpu.items()}
        busy = busy @ busy
        busy = busy / busy.norm()
        mark = torch.cuda.Event()
        mark.record()
        behind += 0 if mark.query() else 1  # the GPU had not reached this batch's work yet
        del batch, on_gpu
    torch.cuda.synchronize()
    pending = draftfeed._core.fence_counts()["rewrites_while_read"] - before
    mismatches = [(i, k) for i, tensors in sums.items() for k, v in tensors.items()
                  if int(v.item()) != expected[i][k]]
    assert sorted(sums) == sorted(expected)
    assert mismatches == [], f"{len(mismatches)} tensors differ, first {mismatches[:5]}"
    print(f"\nrace ({stage}): {len(sums)} batches, GPU behind the CPU at {behind} of them; buffers "
          f"rewritten while their fence was pending: {pending}; mismatches: {len(mismatches)}")
    assert behind > len(sums) // 2, "the GPU kept up with the CPU: the consumer did not run ahead"
    assert pending > 0, "no buffer was rewritten while the GPU still read it: the fences were not tested"
    if stage == "device stage":
        assert loader.metrics()["device"] == device.index
        # Its device memory came from torch's caching allocator, which counts it.
        assert loader.metrics()["device_memory"] == "given"


def test_the_device_stage_memory_is_torchs(data):
    device = torch.device("cuda", torch.cuda.current_device())
    before = torch.cuda.memory_allocated(device)
    loader = draftfeed.Loader(data, device=device, **loader_options())
    held = torch.cuda.memory_allocated(device) - before
    assert held >= loader.options.device_buffers * loader.metrics()["batch_bytes_each"]
    for batch in loader:
        del batch
    assert loader.metrics()["device_memory_fallback_bytes"] == 0
    print(f"\ndevice memory: {held} bytes in torch.cuda.memory_allocated() for "
          f"{loader.options.device_buffers} buffers of {loader.metrics()['batch_bytes_each']} bytes")


def run_trainer(tmp_path, prepared, loader, device_stage=True):
    sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
    import bench_trainer

    class Args:
        # log_freq 5: the trainer's step timer (which synchronises the device at each mark) runs on
        # one step in five; the others run ahead as training does.
        steps, workers, seq_len, timeout, gpu, log_freq = 30, 2, 1024, 1500, True, 5
    env = bench_trainer.env("draftfeed-host" if not device_stage else loader)
    metrics = tmp_path / f"metrics-{loader}-{device_stage}"
    cmd = [sys.executable, os.path.join(HERE, "trainer_harness.py"), "train", "--loader", loader,
           "--metrics", str(metrics), "--gpu", "--",
           *bench_trainer.trainer_flags(prepared, tmp_path / f"ckpt-{loader}-{device_stage}", Args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(f"{metrics}.0.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    # Per step: the loss (as float.hex) and the batches the draft model was called with.
    return [(r["kind"], r.get("step"), r[r["kind"]]["loss" if r["kind"] == "train" else "loss_epoch"]["hex"],
             r.get("batches")) for r in records if r["kind"] in ("train", "val")]


def test_speculators_trainer_on_the_gpu_has_the_reference_losses(tmp_path):
    import trainer_harness

    prepared = trainer_harness.prepare(str(tmp_path / "fixture"))
    reference = run_trainer(tmp_path, prepared, "reference")
    assert len(reference) >= 6
    stage_on = run_trainer(tmp_path, prepared, "draftfeed", device_stage=True)
    stage_off = run_trainer(tmp_path, prepared, "draftfeed", device_stage=False)
    print(f"\ntrainer: {len(reference)} logged losses (train every 5th step, and val); reference "
          f"{[r[2] for r in reference[:3]]}...; device stage on equal: {stage_on == reference}, off equal: "
          f"{stage_off == reference}")
    assert stage_on == reference
    assert stage_off == reference


def test_device_batches_are_cuda_tensors_and_refuse_numpy(data):
    loader = draftfeed.Loader(data, device="cuda", **loader_options())
    batch = next(iter(loader))
    assert all(v.is_cuda and v.device.index == loader.cuda_device for v in batch.values())
    # The trainer's own move is a no-op: the same tensor.
    assert all(v.to(loader.cuda_device, non_blocking=True) is v for v in batch.values())
    with pytest.raises(ValueError, match="device memory"):
        loader.last_batch.numpy()
