#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each from its seed corpus
# (tests/fuzz/corpus/<target>/, made by tests/fuzz/make_corpus.py with the real packages).
#
#   scripts/fuzz.sh                 every target at once for FUZZ_SECONDS (default 60): what CI runs
#   scripts/fuzz.sh --long          each target until FUZZ_RUNS executions (default 10,000,000),
#                                   at most FUZZ_LONG_SECONDS (default 3600) each: the nightly run
#   scripts/fuzz.sh [--long] NAME   only the targets whose name contains NAME
#
# The run corpus (build/fuzz/corpus/<target>) keeps what the fuzzer found between runs; the seeds
# are copied into it first. A crash leaves its input in build/fuzz/ (crash-*, leak-*, timeout-*)
# and makes the script exit 1; the summary prints the executions of each target.
set -uo pipefail
cd "$(dirname "$0")/.."
long=0
filter=""
for arg in "$@"; do
  case "$arg" in
    --long) long=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) filter=$arg ;;
  esac
done
dir=build/fuzz
jobs=${JOBS:-$(nproc)}

CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DDRAFTFEED_TESTS=OFF -DDRAFTFEED_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDRAFTFEED_SANITIZE=address,undefined >"$dir.configure.log" 2>&1 ||
  { cat "$dir.configure.log"; exit 1; }
targets=$(for f in tests/fuzz/*_fuzz.cc; do basename "$f" .cc; done)
# shellcheck disable=SC2086  # one argument per target
cmake --build "$dir" -j "$jobs" --target $targets || exit 1

# Inputs longer than the largest plausible seed only slow a target down: a cap per target.
max_len() {
  case "$1" in
    arrow_ipc_fuzz) echo 65536 ;;    # shards of a few record batches
    safetensors_fuzz) echo 16384 ;;  # a header and small tensors
    pack_folder_fuzz) echo 16384 ;;  # a manifest and a shard of a few samples
    *) echo 8192 ;;                  # response bodies
  esac
}

# The targets run at the same time (CI's fuzz stage then takes FUZZ_SECONDS, not one per target):
# each is a separate process with its own corpus and log, and the machine's cores are shared.
run_target() {  # run_target NAME: fuzz one target; its summary line goes to $dir/NAME.summary
  local name=$1 corpus="$dir/corpus/$1" log="$dir/$1.log" start runs rate crashes status=0
  start=$(date +%s)
  if ! (cd "$dir" && "./$name" "${limits[@]}" -rss_limit_mb=2048 -max_len="$(max_len "$name")" \
        -print_final_stats=1 "corpus/$name") >"$log" 2>&1; then
    status=1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  crashes=$(grep -c -E "^==[0-9]+==ERROR|deadly signal|^SUMMARY: (Address|Undefined)" "$log")
  echo "$name: ${runs:-?} executions in $(($(date +%s) - start)) s (${rate:-?}/s), corpus $(find "$corpus" -type f | wc -l) files, crashes $crashes" >"$dir/$name.summary"
  return $status
}

if [ "$long" = 1 ]; then
  limits=(-runs="${FUZZ_RUNS:-10000000}" -max_total_time="${FUZZ_LONG_SECONDS:-3600}")
  how_long="until ${FUZZ_RUNS:-10000000} executions"
else
  limits=(-max_total_time="${FUZZ_SECONDS:-60}")
  how_long="for ${FUZZ_SECONDS:-60}s"
fi
names=()
pids=()
for fuzzer in "$dir"/*_fuzz; do
  [ -x "$fuzzer" ] || continue
  name=$(basename "$fuzzer")
  [[ "$name" == *"$filter"* ]] || continue
  mkdir -p "$dir/corpus/$name"
  [ -d "tests/fuzz/corpus/$name" ] && cp -n tests/fuzz/corpus/"$name"/* "$dir/corpus/$name"/ 2>/dev/null
  echo "--- $name $how_long"
  rm -f "$dir/$name.summary"
  run_target "$name" &
  names+=("$name")
  pids+=($!)
done

status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "=== ${names[$i]} failed; the end of its log ($dir/${names[$i]}.log):"
    tail -n 60 "$dir/${names[$i]}.log"
    status=1
  fi
done
echo
for name in "${names[@]}"; do cat "$dir/$name.summary" 2>/dev/null || echo "$name: no summary"; done
exit $status
