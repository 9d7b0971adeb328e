#!/usr/bin/env bash
# The self-contained wheel as a user without root or a compiler gets it:
#
#   [PYTHON=python3.X] tests/wheel/wheel_test.sh WHEEL RAW_WHEEL
#
# WHEEL is a repaired wheel from scripts/build_wheel.sh, RAW_WHEEL the same build before `auditwheel
# repair` (build/wheel/raw-X.Y/): the control, a program that links the machine's libcurl.
#   1. auditwheel show: the wheel's manylinux tag and what it links.
#   2. A fresh virtual environment (no system site-packages) gets the wheel and its `demo` extra with
#      binaries only (--only-binary=:all:: pip may build nothing) and PATH holding only the
#      environment's bin/ (no gcc, cc, c++ or clang).
#   3. ldd, in an empty environment: every library the installed program and module load is in the
#      wheel (draftfeed.libs/) or is a system library the wheel's manylinux policy guarantees; libcurl
#      is the wheel's (tests/wheel/check_linkage.py).
#   4. In a private mount namespace where this machine's libcurl and libzstd files read as empty, the C and C++
#      headers (/usr/include) are an empty folder and so is the source tree, with an empty environment
#      (no LD_LIBRARY_PATH; PATH = the environment's bin/):
#      - the control: RAW_WHEEL's program must fail to load libcurl (else the hiding hid nothing and
#        the runs below would prove nothing: the test fails);
#      - `draftfeed demo` with its online epoch: the wheel's own simulated server, started by the
#        launcher's Python, answering the program's libcurl;
#      - the drop-in (tests/wheel/dropin_online.py): create_train_val_loaders with on_missing=
#        "generate" against the simulated server, every hidden state checked;
#      - `draftfeed pack --compress` of the demo's cache and `draftfeed verify` of the pack: the
#        codec's libzstd, hidden like libcurl, is the wheel's.
#   Each run is bounded in time. Without the right to make a mount namespace (not root) step 4 runs
#   in the plain environment instead, saying so: only step 3 then stands for the hidden libcurl.
# A wheel that does not bundle libcurl fails step 3 (libcurl resolves to /usr/lib/...) and step 4
# (the program cannot load it).
set -euo pipefail

if [ "${1:-}" = "--isolated" ]; then
  isolated=1
  shift
else
  isolated=0
fi
[ $# -eq 2 ] || { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
wheel=$(realpath "$1")
raw=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
tools=$root/build/wheel/tools  # auditwheel, from scripts/build_wheel.sh
here=$root/tests/wheel

# Seconds since the test began, the namespace's re-run included.
export WHEEL_TEST_START=${WHEEL_TEST_START:-$(date +%s)}
step() { echo "--- $* ($(( $(date +%s) - WHEEL_TEST_START )) s)"; }

# Step 4, run inside the namespace (or not): $work holds the environment and copies of what it needs.
runs() {
  local work=$1 venv=$1/venv
  local -a clean=(env -i HOME="$work/home" TMPDIR="$work" LANG=C.UTF-8 PATH="$venv/bin")
  cd "$work"
  if [ "$isolated" -eq 1 ]; then
    local library folder hidden=()
    # Every copy of libcurl and libzstd the dynamic loader could find, by its cache and the usual
    # folders.
    while read -r library; do
      [ -f "$library" ] || continue
      mount --bind /dev/null "$library"
      hidden+=("$library")
    done < <({ ldconfig -p | awk '/libcurl|libzstd/ {print $NF}'
               for name in libcurl libzstd; do
                 ls /lib*/$name* /usr/lib*/$name* /usr/lib*/*/$name* /usr/local/lib*/$name* 2>/dev/null
               done
             } | xargs -r realpath | sort -u)
    local emptied=(/usr/include)
    case $work/ in
      "$root"/*) echo "NOTE: $work lies in the source tree, which stays visible" ;;
      *) emptied+=("$root") ;;
    esac
    for folder in "${emptied[@]}"; do mount -t tmpfs -o ro tmpfs "$folder"; done
    echo "hidden: ${hidden[*]:-no libcurl or libzstd on this machine}; empty: ${emptied[*]}"
  fi

  step "a compiler on the clean PATH?"
  local compiler
  for compiler in gcc cc c++ g++ clang clang++ cpp; do
    if "${clean[@]}" /bin/sh -c "command -v $compiler"; then
      echo "$compiler is reachable on the clean PATH"
      return 1
    fi
  done
  echo "none of gcc cc c++ g++ clang clang++ cpp"

  step "control: the unrepaired program, which links the machine's libcurl"
  local control
  if control=$("${clean[@]}" "$work/raw/draftfeed/_bin/draftfeed" --help 2>&1); then
    if [ "$isolated" -eq 1 ]; then
      echo "the unrepaired program ran with the machine's libcurl hidden: the hiding does not work"
      return 1
    fi
    echo "ran (libcurl not hidden here)"
  else
    echo "$control" | head -n 3
    if ! grep -Eq 'libcurl|libzstd' <<<"$control"; then
      echo "the unrepaired program failed, but not for libcurl or libzstd"
      return 1
    fi
  fi

  step "draftfeed demo (online epoch through the wheel's simulated server)"
  local demo
  demo=$(timeout 300 "${clean[@]}" "$venv/bin/draftfeed" demo --out "$work/demo" --rows 32 \
         --hidden-size 64 --total-seq-len 1024 --epochs 1 --fetch-threads 4 2>&1) ||
    { echo "$demo"; echo "draftfeed demo failed"; return 1; }
  echo "$demo"
  local generated cached
  generated=$(sed -n 's/^ *online *\([0-9][0-9]*\) generated, 0 failed.*/\1/p' <<<"$demo")
  cached=$(find "$work/demo/online_cache" -name 'hs_*.safetensors' 2>/dev/null | wc -l)
  if grep -q skipped <<<"$demo" || ! grep -Eq 'server +http://127\.0\.0\.1:[0-9]+/v1' <<<"$demo" ||
     [ -z "$generated" ] || [ "$generated" -eq 0 ] || [ "$generated" -ne "$cached" ] ||
     [ "$(grep -c 'samples dropped  none' <<<"$demo")" -ne 3 ]; then
    echo "the demo's online epoch did not run as it should (generated '$generated', cached $cached)"
    return 1
  fi

  step "the drop-in, online, against the simulated server"
  timeout 300 "${clean[@]}" "$venv/bin/python" "$work/tools/dropin_online.py" --tools "$work/tools" \
    --work "$work/dropin"

  step "draftfeed pack --compress of the demo's cache, and verify of the pack (the wheel's libzstd)"
  local rows verified
  rows=$(find "$work/demo/hidden_states" -name 'hs_*.safetensors' | wc -l)
  timeout 120 "${clean[@]}" "$venv/bin/draftfeed" pack "$work/demo" --out "$work/packed" --compress \
    --no-progress
  verified=$(timeout 120 "${clean[@]}" "$venv/bin/draftfeed" verify "$work/demo" \
             --hidden-states "$work/packed" --json)
  "$venv/bin/python" -c 'import json, sys
report, rows = json.load(sys.stdin), int(sys.argv[1])
print("verify of the pack:", report["ok"], "ok of", rows, "rows;", report["packed"])
sys.exit(0 if rows > 0 and report["ok"] == rows and report["packed"]["compressed"] == rows else 1)' \
    "$rows" <<<"$verified" || { echo "the pack of the demo's cache did not verify whole"; return 1; }
}

if [ "$isolated" -eq 1 ]; then  # re-run of this script inside the namespace (below)
  runs "$WHEEL_TEST_WORK"
  exit
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/draftfeed-wheel-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
venv=$work/venv
tag=$(basename "$wheel" .whl | cut -d- -f5 | cut -d. -f1)  # manylinux_2_35_x86_64
policy=${tag%_"$(uname -m)"}                                # manylinux_2_35
# The environment's Python: $PYTHON (default python3), of the wheel's version.
python=${PYTHON:-python3}
abi=$(basename "$wheel" | cut -d- -f3)
[ "$abi" = "$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')" ] ||
  { echo "$python cannot install $(basename "$wheel") ($abi): set PYTHON" >&2; exit 2; }

step "auditwheel show $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
"$tools/bin/auditwheel" show "$wheel"

step "fresh virtual environment: the wheel and its demo extra, binaries only, no compiler on PATH"
"$python" -m venv "$venv"
# torch pinned: the one version this project's machines hold on disk (others download gigabytes).
PATH="$venv/bin" "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
  "$wheel[demo]" torch==2.13.0 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')

step "what the installed program and module load"
"$tools/bin/python" "$here/check_linkage.py" "$site" "$policy"

mkdir -p "$work/home" "$work/tools" "$work/raw"
cp "$root/tools/sim_vllm_process.py" "$root/tools/sim_vllm_server.py" "$here/dropin_online.py" "$work/tools/"
"$tools/bin/python" -m zipfile -e "$raw" "$work/raw"
chmod +x "$work/raw/draftfeed/_bin/draftfeed"
if [ "$(id -u)" -eq 0 ] && unshare -m --propagation private true 2>/dev/null; then
  WHEEL_TEST_WORK=$work unshare -m --propagation private bash "$0" --isolated "$wheel" "$raw"
else
  echo "NOTE: no private mount namespace here (needs root): the machine's libcurl is not hidden"
  runs "$work"
fi
step "wheel test passed"
