#!/usr/bin/env bash
# The suite under load: the C++ tests of the three builds scripts/test.sh makes (Release,
# ASan+UBSan, TSan's concurrent tests) and pytest, ROUNDS times in a row, with BUSY busy loops
# spinning on the CPUs beside them. What it checks: no test depends on the machine being idle (a
# test waits on an event or holds a margin, never a bare time bound).
#
#   scripts/soak.sh [--rounds N] [--busy N] [--no-pytest] [-- PYTEST ARGS...]
#
# Defaults: 3 rounds, 2 busy loops, the whole Python suite. It runs what scripts/test.sh built
# (build/tests, build/asan, build/tsan) against the installed package: run that first. Exits
# non-zero when any run failed; prints each run's result and time, then a summary.
set -uo pipefail
cd "$(dirname "$0")/.."

rounds=3 busy=2 pytest=1
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --busy) busy=$2; shift 2 ;;
    --no-pytest) pytest=0; shift ;;
    --) shift; break ;;
    *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
for dir in build/tests build/asan build/tsan; do
  [ -f "$dir/CTestTestfile.cmake" ] || { echo "$dir is not built: run scripts/test.sh first" >&2; exit 2; }
done

loops=()
stop_loops() { [ ${#loops[@]} -eq 0 ] || kill "${loops[@]}" 2>/dev/null; }
trap stop_loops EXIT
for _ in $(seq "$busy"); do
  bash -c 'while :; do :; done' &
  loops+=($!)
done
echo "soak: $rounds rounds beside $busy busy loops (pids ${loops[*]:-none}), $(nproc) CPUs"

jobs=$(nproc)
results=()
failed=0
run() {  # run NAME COMMAND...
  local name=$1 start=$SECONDS result
  shift
  if "$@" >"build/soak.log" 2>&1; then result=ok; else result=FAILED; failed=1; fi
  results+=("$(printf '%-8s %4d s  %s' "$result" $((SECONDS - start)) "$name")")
  echo "${results[-1]}"
  grep -E "tests passed|tests failed|passed|failed" build/soak.log | tail -n 2 | sed 's/^/    /'
  [ "$result" = ok ] || { grep -E "FAILED|Failed|\*\*\*" build/soak.log | head -n 20; cp build/soak.log "build/soak-failed-$round-${name// /_}.log"; }
}

for round in $(seq "$rounds"); do
  run "round $round: ctest Release" ctest --test-dir build/tests --output-on-failure -j "$jobs"
  run "round $round: ctest ASan+UBSan" ctest --test-dir build/asan --output-on-failure -j "$jobs"
  run "round $round: ctest TSan" ctest --test-dir build/tsan --output-on-failure -j "$jobs" \
    -R "Pipeline|Concurrent|Lookahead|ReadAhead" --no-tests=ignore
  if [ "$pytest" -eq 1 ]; then
    run "round $round: pytest" python3 -m pytest -q -p no:cacheprovider "$@"
  fi
done

echo
echo "soak summary ($rounds rounds, $busy busy loops, $SECONDS s):"
printf '  %s\n' "${results[@]}"
exit "$failed"
