#!/usr/bin/env bash
# The GPU check's install path end to end on this machine, as on a bare GPU machine: no compiler on
# PATH, no network, an interpreter that has torch and nothing else.
#
#   tests/wheel/gpu_bundle_check.sh [--python VERSION] [--bundle DIR] [--wheel FILE]
#
#   1. scripts/gpu_bundle.sh DIR --python VERSION (default 3.11: the torch this project's machines
#      hold on disk, torch-2.13.0+cpu, is for Python 3.11 only; the GPU machines get 3.12) unless
#      --bundle names one already made (--wheel: a draftfeed wheel built beforehand);
#   2. "the GPU machine": a fresh virtual environment with torch==2.13.0 alone (from the local wheel);
#   3. scripts/gpu_check.sh --bundle DIR run with that interpreter, PATH = a folder of the few tools
#      it uses (checked: no gcc, cc, c++, g++, clang, clang++), an empty environment, no pip
#      configuration (so pip sees the bundle and nothing else) and, where this runs as root, in a
#      private network namespace (no network at all; otherwise pip's --no-index is the only guard);
#   4. passes when gpu_check installed, imported, ran the stand-in's tests and then said
#      "gpu_check: skipped: torch ... is a CPU build" (this machine has no GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
version=3.11
bundle=
wheel_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --python) version=$2; shift 2 ;;
    --bundle) bundle=$(realpath "$2"); shift 2 ;;
    --wheel) wheel_args=(--wheel "$(realpath "$2")"); shift 2 ;;
    *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
start=$SECONDS
step() { echo "--- $* ($((SECONDS - start)) s)"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/draftfeed-gpu-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ -z "$bundle" ]; then
  step "scripts/gpu_bundle.sh (Python $version)"
  bundle=$work/bundle
  scripts/gpu_bundle.sh "$bundle" --python "$version" "${wheel_args[@]}"
fi
echo "bundle: $(ls "$bundle/wheels" | wc -l) wheels, $(du -sh "$bundle" | cut -f1)"

step "the GPU machine's interpreter: Python $version with torch 2.13.0 and nothing else"
python=$(command -v "python$version" || ls "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/python"$version" | head -n 1)
"$python" -m venv "$work/machine"
"$work/machine/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: torch==2.13.0 \
  2> >(grep -v 'is ignored: it is neither' >&2)

step "a PATH without a compiler"
mkdir -p "$work/bin" "$work/home"
for tool in bash sh env dirname basename rm mkdir sed grep tee tail head cat ls cut wc du date \
            mktemp realpath uname find sort tr xargs sleep id cp mv chmod ln touch; do
  ln -s "$(command -v "$tool")" "$work/bin/$tool"
done
for compiler in gcc cc c++ g++ clang clang++; do
  if PATH=$work/bin command -v "$compiler" >/dev/null; then echo "$compiler is on the PATH"; exit 1; fi
done
echo "none of gcc cc c++ g++ clang clang++"

run=(env -i HOME="$work/home" TMPDIR="$work" LANG=C.UTF-8 PATH="$work/bin" PIP_CONFIG_FILE=/dev/null
     PYTHON="$work/machine/bin/python" bash scripts/gpu_check.sh --bundle "$bundle")
if [ "$(id -u)" -eq 0 ] && unshare -n true 2>/dev/null; then
  step "scripts/gpu_check.sh in a private network namespace (no network)"
  run=(unshare -n "${run[@]}")
else
  step "scripts/gpu_check.sh (NOTE: not root: the network is not cut, pip --no-index is the guard)"
fi
"${run[@]}" 2>&1 | tee "$work/check.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || { echo "gpu_check.sh failed ($status)"; exit 1; }
grep -q "^gpu_check: draftfeed .* from $root/build/gpu_check/env/" "$work/check.log" ||
  { echo "draftfeed was not imported from the check's environment"; exit 1; }
grep -Eq "^[0-9]+ passed" "$work/check.log" || { echo "the stand-in's tests did not pass"; exit 1; }
grep -q "^gpu_check: skipped: torch 2.13.0+cpu is a CPU build" "$work/check.log" ||
  { echo "no skip line for torch's CPU build"; exit 1; }
step "gpu bundle check passed"
