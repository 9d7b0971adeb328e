#!/usr/bin/env bash
# The README's second command (and what CI runs): installs what the tests need, then runs every suite:
#   0. clang-format on every C++ file; clang-tidy (.clang-tidy's checks) on src/ and python/bindings/
#   1. the C++ unit tests (ctest, Release build)
#   2. the same tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. the pipeline tests under ThreadSanitizer
#   4. every libFuzzer target from its seed corpus for a bounded time (FUZZ_SECONDS, default 60
#      each; scripts/fuzz.sh --long runs each to 10^7 executions)
#   5. the self-contained wheel (scripts/build_wheel.sh, this interpreter's) installed into a fresh
#      virtual environment and run with no toolchain and the machine's libcurl hidden
#      (tests/wheel/wheel_test.sh)
#   6. the type stubs of draftfeed._core (up to date), mypy on the package and its tests, ruff
#   7. the Python suite (pytest) against the installed package and the reference packages
# Every stage runs even when an earlier one fails; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
# pip installs the `draftfeed` program into Python's scripts folder, which may not be on PATH yet.
PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH
jobs=${JOBS:-$(nproc)}
fuzz_seconds=${FUZZ_SECONDS:-60}
failed=()

timings=()

stage() {  # stage NAME COMMAND...
  local name=$1 start=$SECONDS result
  shift
  echo
  echo "=== $name ==="
  if "$@"; then result=ok; else result=FAILED; failed+=("$name"); fi
  echo "=== $name: $result ($((SECONDS - start)) s) ==="
  # Kept for the end: the suite's budget (about 20 minutes on 2 cores) is watched stage by stage.
  timings+=("$(printf '%5d s  %s' $((SECONDS - start)) "$name")")
}

with_ccache() {  # with_ccache COMMAND...
  # `pip install .`, the Release test build and the wheel build compile the core library and the
  # program with the same flags: through ccache (build/ccache) they compile once.
  (
    if command -v ccache >/dev/null; then
      export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
      export CCACHE_DIR=$PWD/build/ccache
      # ccache keys on the compiler's name: scikit-build-core would otherwise name Python's own
      # (sysconfig's CXX, e.g. g++) and CMake c++, one compiler.
      export CC=${CC:-cc} CXX=${CXX:-c++}
    fi
    "$@"
  )
}

configure_and_build() {  # configure_and_build DIR [CMAKE ARGS...]
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DDRAFTFEED_TESTS=ON "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$jobs"
}

cpp_tests() {  # cpp_tests DIR [CTEST ARGS...]
  local dir=$1
  shift
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" "$@"
}

run_fuzzers() {
  # Seeded from tests/fuzz/corpus (real files); `scripts/fuzz.sh --long` is the 10^7-run version.
  FUZZ_SECONDS=$fuzz_seconds scripts/fuzz.sh
}

format_check() {
  # Style is the tool's, not the reviewer's: every C++ file must be clang-formatted.
  local bad
  bad=$(git ls-files '*.cc' '*.h' | while read -r f; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
  [ -z "$bad" ] || { echo "not clang-formatted (run clang-format -i):"; echo "$bad"; return 1; }
}

tidy_check() {
  # .clang-tidy says which checks and why; any finding fails (WarningsAsErrors). It needs only the
  # compile commands of a configured tree (with the bindings), not a build: build/tidy is never built.
  local dir=build/tidy root
  cmake -S . -B "$dir" -G Ninja -DDRAFTFEED_PYTHON=ON -DDRAFTFEED_TESTS=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  root=$(pwd | sed 's/[][\.*^$+?(){}|]/\\&/g')  # the tree's path as a regex
  # Our sources only: not tests/, not nanobind's own sources (also in the compile commands).
  run-clang-tidy -quiet -j "$jobs" -p "$dir" "^$root/(src|python/bindings)/" 2>&1 |
    { grep -Ev '[0-9]+ warnings? generated\.$' || true; }  # counts of system headers' warnings
  return "${PIPESTATUS[0]}"
}

wheel_test() {
  # Only this interpreter's wheel (scripts/build_wheel.sh alone builds every supported version).
  local version out=build/wheel/ci
  version=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  rm -rf "$out"
  scripts/build_wheel.sh --python "$version" --out "$out" &&
    PYTHON=python3 tests/wheel/wheel_test.sh "$out"/draftfeed-*.whl build/wheel/raw-"$version"/draftfeed-*.whl
}

python_tests() {
  # -rs: every skip with its reason; --durations: the slowest tests, for the suite's time budget.
  # -n: one worker per core (pytest-xdist), each file's tests in one worker (--dist loadfile: a
  # file's fixtures, servers and scratch folders stay its own); the suite's tests are bounded by
  # events, not by wall-clock, so they hold with both cores busy.
  python3 -m pytest -q -p no:cacheprovider -rs --durations=15 -n "$jobs" --dist loadfile "$@"
}

types_check() {
  # The checked-in stubs of draftfeed._core must be what nanobind's stubgen makes of the installed
  # module (regenerate with the command below), and the package and its tests must type-check.
  local stub=build/_core.pyi
  mkdir -p build
  python3 -m nanobind.stubgen -q -P -m draftfeed._core -o "$stub" || return 1
  diff -u python/draftfeed/_core.pyi "$stub" ||
    { echo "python/draftfeed/_core.pyi is stale: python3 -m nanobind.stubgen -P -m draftfeed._core -o python/draftfeed/_core.pyi"; return 1; }
  PYTHONPATH=tests/python python3 -m mypy --ignore-missing-imports python/draftfeed tests/python &&
    python3 -m ruff check python tests tools bench
}

stage "install: system packages" scripts/install-system.sh
stage "install: python packages and draftfeed" with_ccache scripts/install-python.sh --test
stage "style: clang-format" format_check
stage "static: clang-tidy" tidy_check
stage "build: C++ tests (Release)" with_ccache configure_and_build build/tests -DCMAKE_BUILD_TYPE=Release
stage "ctest: C++ tests" cpp_tests build/tests
stage "build: C++ tests (ASan+UBSan)" configure_and_build build/asan -DCMAKE_BUILD_TYPE=Debug \
  -DDRAFTFEED_SANITIZE=address,undefined
stage "ctest: C++ tests under ASan+UBSan" cpp_tests build/asan
# TSan in a Debug build: it compiles in 153 s instead of RelWithDebInfo's 190 (2 cores) and its tests
# still take seconds; the races it finds are in the code's order of events, not its optimisation.
stage "build: C++ tests (TSan)" configure_and_build build/tsan -DCMAKE_BUILD_TYPE=Debug \
  -DDRAFTFEED_SANITIZE=thread
stage "ctest: concurrent tests under TSan" cpp_tests build/tsan -R "Pipeline|Concurrent|Lookahead|ReadAhead|MooncakeTransfer" --no-tests=ignore
stage "fuzz: every parser for ${fuzz_seconds}s" run_fuzzers
stage "wheel: build, install without a toolchain, run" with_ccache wheel_test
stage "static: stubs, mypy, ruff" types_check
stage "pytest: Python suite" python_tests

echo
echo "stage times (total $SECONDS s):"
printf '  %s\n' "${timings[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
