#!/usr/bin/env bash
# The device stage on a real GPU, in one command, for whoever has a machine with an NVIDIA GPU and
# torch's CUDA build (CI has neither: it runs the fake CUDA runtime's tests, which are a stand-in).
#   (a) a consumer that never synchronizes, checking every batch on the GPU against the CPU's:
#       >= 1,000 batches, device stage on and off          (tests/python/test_gpu.py)
#   (b) speculators 0.9.0's trainer on the GPU, reference loaders vs the drop-in: equal losses
#   (c) H=4096 and 8192 batches: the trainer's data wait (fetch_ms) and step time with the device
#       stage on, off, and with the reference, as a table  (bench/bench_trainer.py --gpu; its cache
#       of 40 rows of 2-8K tokens takes about 5 GB at H=4096 and 10 GB at H=8192 in build/)
# On a machine without a GPU it says why it skipped and exits 0. Uses the installed draftfeed, or a
# developer build with PYTHONPATH=python DRAFTFEED_DEV_BUILD=build/dev.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

reason=$("$python" - <<'PY'
try:
    import torch
except ImportError:
    print("torch is not installed")
else:
    if torch.version.cuda is None:
        print(f"torch {torch.__version__} is a CPU build (install torch's CUDA build)")
    elif not torch.cuda.is_available():
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")
PY
)
if [ -n "$reason" ]; then
  echo "gpu_check: skipped: $reason"
  exit 0
fi
"$python" -c 'import torch; print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__)'

echo "== (a), (b): the gpu tests =="
"$python" -m pytest -q -rs -p no:cacheprovider -m gpu tests/python/test_gpu.py

echo "== (c): the trainer's data wait and step time, H=4096 and 8192 =="
for hidden in 4096 8192; do
  out=build/gpu_check/trainer-h$hidden
  "$python" bench/bench_trainer.py --gpu --hidden "$hidden" --seq-len 8192 --steps 20 --workers 2 \
    --rows 40 --lengths 2048,3072,4096,6144,8192 --out "$out" >/dev/null
done
"$python" - <<'PY'
import json
rows = []
for hidden in (4096, 8192):
    report = json.load(open(f"build/gpu_check/trainer-h{hidden}/trainer.json"))
    for name, run in report["runs"].items():
        s = run["summary"]
        rows.append((hidden, {"reference": "reference", "draftfeed": "draftfeed, device stage on",
                              "draftfeed-host": "draftfeed, device stage off"}[name],
                     s["median_fetch_ms"], s["median_step_ms"], 100 * s["data_wait_share"]))
print(f"| H | loader | median data wait ms | median step ms | data wait share |")
print(f"|---:|:---|---:|---:|---:|")
for hidden, name, fetch, step, share in rows:
    print(f"| {hidden} | {name} | {fetch:.2f} | {step:.1f} | {share:.1f}% |")
PY
