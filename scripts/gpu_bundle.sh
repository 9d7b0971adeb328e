#!/usr/bin/env bash
# Makes the folder of wheels scripts/gpu_check.sh installs from on a GPU machine that has a driver,
# Python and torch's CUDA build and nothing else (no compiler, no network):
#
#   scripts/gpu_bundle.sh DIR [--python VERSION] [--wheel FILE]
#
#   DIR/wheels/   a manylinux wheel of draftfeed for cpVERSION (scripts/build_wheel.sh --python
#                 VERSION, or FILE), speculators 0.9.0 and hs-connectors 0.9.0, and the pure-Python
#                 test dependencies with everything they import, for cpVERSION manylinux x86_64;
#                 torch is not in it (the machine has torch's CUDA build), nor what only torch needs
#   DIR/requirements.txt   every wheel in it but the two reference packages, pinned (they are
#                 installed with --no-deps: their declared torch, torchvision, torchaudio are not)
#   DIR/libfakecudart.so   the stand-in CUDA runtime (tests/cuda/fake_cudart.cc), built here, so the
#                 stand-in's tests run there without a compiler
#
# VERSION defaults to 3.12. Needs what scripts/build_wheel.sh needs and PyPI (pip download, binaries
# only). Then copy DIR and the repository to the GPU machine and run scripts/gpu_check.sh --bundle DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
dir=$(mkdir -p "$1" && cd "$1" && pwd)
shift
version=3.12
wheel=
while [ $# -gt 0 ]; do
  case $1 in
    --python) version=$2; shift 2 ;;
    --wheel) wheel=$(realpath "$2"); shift 2 ;;
    *) echo "gpu_bundle.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
tag=cp${version/./}
mkdir -p "$dir/wheels"
rm -f "$dir"/wheels/*.whl

# 1. draftfeed, a self-contained manylinux wheel (no compiler or libcurl needed to install it).
if [ -z "$wheel" ]; then
  scripts/build_wheel.sh --python "$version" --out "$dir/build"
  wheel=$(ls -t "$dir"/build/draftfeed-*-"$tag"-"$tag"-manylinux*.whl | head -n 1)
fi
case $(basename "$wheel") in
  draftfeed-*-"$tag"-"$tag"-manylinux*.whl) ;;
  *) echo "gpu_bundle.sh: $wheel is not a $tag manylinux wheel of draftfeed" >&2; exit 2 ;;
esac
cp "$wheel" "$dir/wheels/"
rm -rf "$dir/build"

# 2. The test dependencies for cpVERSION manylinux, without torch: speculators 0.9.0's declared
#    requirements less torch, torchvision and torchaudio (what its trainer imports), hs-connectors'
#    less torch, the test runner, and what they need, resolved by pip for the target interpreter.
requirements=(
  aiohttp click "datasets>=4.0.0,<=5.1.0" httpx huggingface-hub "loguru>=0.7.2,<=0.7.3"
  "numpy>=2.0.0,<=2.5.4" "openai>=2.0.0" protobuf psutil "pydantic>=2.0.0" "pydantic-settings>=2.0.0"
  rich safetensors "tqdm>=4.66.3,<=4.70.1" "transformers>=5.0.0,<=5.19.0" "typer>=0.12.0"
  pytest pytest-timeout
)
target=(--only-binary=:all: --python-version "$version" --implementation cp --abi "$tag"
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python=${PYTHON:-python3}
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"$python" -m pip install -q --disable-pip-version-check --dry-run --ignore-installed --target "$dir/.resolve" \
  "${target[@]}" --report "$report" "${requirements[@]}" 2> >(grep -v 'is ignored: it is neither' >&2)
rm -rf "$dir/.resolve"
"$python" - "$report" "$dir/requirements.txt" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
# torch and what only torch needs are on the GPU machine already.
torch_side = {"torch", "triton", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "setuptools"}
pins = []
for item in report["install"]:
    name = item["metadata"]["name"].lower().replace("_", "-")
    if name in torch_side or name.startswith(("nvidia-", "cuda-")):
        continue
    pins.append(f"{name}=={item['metadata']['version']}")
open(sys.argv[2], "w").write("\n".join(sorted(pins)) + "\n")
PY
"$python" -m pip download -q --disable-pip-version-check --no-deps "${target[@]}" -d "$dir/wheels" \
  -r "$dir/requirements.txt" 2> >(grep -v 'is ignored: it is neither' >&2)
"$python" -m pip download -q --disable-pip-version-check --no-deps "${target[@]}" -d "$dir/wheels" \
  speculators==0.9.0 hs-connectors==0.9.0 2> >(grep -v 'is ignored: it is neither' >&2)

# 3. The stand-in CUDA runtime, for the stand-in's tests on a machine without a compiler.
c++ -std=c++20 -O2 -shared -fPIC -pthread -o "$dir/libfakecudart.so" "$root/tests/cuda/fake_cudart.cc"

echo "gpu_bundle: $dir: $(ls "$dir/wheels" | wc -l) wheels, $(du -sh "$dir" | cut -f1)" \
     "(the repository: $(git -C "$root" archive HEAD | wc -c | awk '{printf "%.1f MB", $1 / 1e6}') as git archive)"
