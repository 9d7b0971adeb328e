#!/usr/bin/env bash
# The device stage on a real GPU, in one command, on a machine that has an NVIDIA driver, Python
# and torch's CUDA build and nothing else (no compiler, no network):
#
#   scripts/gpu_check.sh [--bundle DIR]        (DIR: made beforehand by scripts/gpu_bundle.sh DIR;
#                                               default $GPU_BUNDLE, else build/gpu_bundle)
#
# PYTHON (default: python3.12 if found, else python3) is the interpreter that has torch.
#   0. A fresh virtual environment (build/gpu_check/env) that sees that interpreter's torch (a .pth
#      naming torch's site-packages folder) gets draftfeed's wheel and the test dependencies from the
#      bundle (pip --no-index --find-links: nothing from the network); draftfeed is imported from it.
#   1. The stand-in's tests (tests/python/test_device_stage.py, the bundle's prebuilt fake runtime).
#   Then, without a CUDA device: "gpu_check: skipped: <why>" and exit 0. With one:
#   (a) the race: a consumer that never synchronizes, its matmuls keeping the GPU several steps behind
#       the CPU, checks >= 1,000 batches on the GPU against the CPU's, device stage on and off, and
#       counts the buffers rewritten while their fence was still pending (0 fails: nothing was tested);
#       the stage's device memory is torch's (torch.cuda.memory_allocated)      (tests/python/test_gpu.py)
#   (b) speculators 0.9.0's trainer on the GPU, reference loaders and the drop-in (stage on and off):
#       equal losses, logging every 5th step (its step timer synchronises only those)
#   (c) a table at H = 4096 and 8192: the stage's copy rate against a plain cudaMemcpyAsync from
#       page-locked memory of the same bytes (the bound), the share of the copy hidden under compute
#       (bench/bench_device_copy.py), and the trainer's data wait, stage on, off and the reference,
#       measured on the CPU without synchronising (bench/bench_trainer.py --data-wait --log-freq 10).
# Everything it writes goes under build/gpu_check/; the table also to build/gpu_check/table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$SECONDS
bundle=${GPU_BUNDLE:-build/gpu_bundle}
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
bundle=$(cd "$bundle" && pwd) || { echo "gpu_check: no bundle at $bundle (scripts/gpu_bundle.sh DIR)" >&2; exit 2; }
python=${PYTHON:-$(command -v python3.12 || command -v python3)}
say() { echo "gpu_check [$((SECONDS - start)) s]: $*"; }

out=$root/build/gpu_check
env_dir=$out/env
rm -rf "$env_dir"
mkdir -p "$out"
say "environment from $python ($("$python" --version 2>&1)), bundle $bundle"
"$python" -m venv "$env_dir"
venv_python=$env_dir/bin/python
# torch is the machine's: the environment sees the folder it is installed in (and what it needs).
torch_site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
if [ -n "$torch_site" ]; then
  site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "$torch_site" > "$site/_gpu_check_torch.pth"
fi
pip_offline=(-m pip install -q --disable-pip-version-check --no-index --find-links "$bundle/wheels")
"$venv_python" "${pip_offline[@]}" -r "$bundle/requirements.txt" draftfeed
"$venv_python" "${pip_offline[@]}" --no-deps speculators==0.9.0 hs-connectors==0.9.0
"$venv_python" -c 'import draftfeed, draftfeed._core, os, sys
assert draftfeed.__file__.startswith(sys.prefix), draftfeed.__file__
print("gpu_check: draftfeed", draftfeed.__version__ if hasattr(draftfeed, "__version__") else "",
      "from", os.path.dirname(draftfeed.__file__))'
export PATH=$env_dir/bin:$PATH
pytest_run=("$venv_python" -m pytest -q -p no:cacheprovider -rs)

say "1. the stand-in's tests (fake CUDA runtime: not a GPU)"
DRAFTFEED_FAKE_CUDART=$bundle/libfakecudart.so "${pytest_run[@]}" tests/python/test_device_stage.py

reason=$("$venv_python" - <<'PY'
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
  say "skipped: $reason"
  echo "gpu_check: skipped: $reason"
  exit 0
fi
machine=$("$venv_python" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}")')
say "GPU: $machine"

say "(a) the race, and the stage's memory in torch's allocator"
"${pytest_run[@]}" -s -m gpu tests/python/test_gpu.py -k "running_ahead or memory_is_torchs or refuse_numpy" 2>&1 |
  tee "$out/race.log" | grep -E "^race|^device memory|passed|failed|error" || true
grep -q " passed" "$out/race.log" && ! grep -qE "[0-9]+ (failed|error)" "$out/race.log" ||
  { tail -n 40 "$out/race.log"; say "(a) FAILED"; exit 1; }

say "(b) the trainer, each loader: equal losses"
"${pytest_run[@]}" -s -m gpu tests/python/test_gpu.py -k trainer 2>&1 | tee "$out/trainer.log" |
  grep -E "^trainer|passed|failed|error" || true
grep -q " passed" "$out/trainer.log" && ! grep -qE "[0-9]+ (failed|error)" "$out/trainer.log" ||
  { tail -n 40 "$out/trainer.log"; say "(b) FAILED"; exit 1; }

say "(c) copy rate, overlap, data wait at H = 4096 and 8192"
for hidden in 4096 8192; do
  "$venv_python" bench/bench_device_copy.py --hidden "$hidden" --json > "$out/copy-h$hidden.json"
  "$venv_python" bench/bench_trainer.py --gpu --data-wait --log-freq 10 --hidden "$hidden" \
    --seq-len 4096 --steps 20 --workers 2 --rows 24 --lengths 1024,2048,3072,4096 \
    --out "$out/trainer-h$hidden" >/dev/null 2> "$out/trainer-h$hidden.log" ||
    { tail -n 20 "$out/trainer-h$hidden.log"; say "(c) trainer at H=$hidden FAILED"; exit 1; }
done
MACHINE=$machine OUT=$out "$venv_python" - <<'PY' | tee "$out/table.md"
import json, os
out = os.environ["OUT"]
print(f"GPU: {os.environ['MACHINE']}\n")
print("| H | batch MB | bound GB/s (pinned cudaMemcpyAsync) | stage GB/s | copy hidden, stage | copy hidden, host batches | "
      "trainer data wait ms: stage on / off / reference | trainer step ms: on / off / reference |")
print("|---:|---:|---:|---:|---:|---:|:---|:---|")
for hidden in (4096, 8192):
    c = json.load(open(f"{out}/copy-h{hidden}.json"))
    runs = json.load(open(f"{out}/trainer-h{hidden}/trainer.json"))["runs"]
    order = ("draftfeed", "draftfeed-host", "reference")
    wait = " / ".join(f"{runs[n]['summary'].get('cpu_median_data_wait_ms', float('nan')):.2f}" for n in order)
    step = " / ".join(f"{runs[n]['summary'].get('cpu_median_step_ms', float('nan')):.1f}" for n in order)
    print(f"| {hidden} | {c['batch_mb']:.0f} | {c['bound_gbps']:.1f} | {c['stage_gbps']:.1f} | "
          f"{100 * c['stage_hidden_share']:.0f}% | {100 * c['host_hidden_share']:.0f}% | {wait} | {step} |")
PY
say "done"
