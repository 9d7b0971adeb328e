#!/usr/bin/env bash
# Checks that a shared file system forwards draftfeed's writer lock (docs/protocol.md, "The writer
# lock") between two hosts that mount the same cache folder: the check the tests cannot make on one
# machine (their two "hosts" share a kernel).
#
#   scripts/writer_lock_check.sh DIR --ssh HOST   this host holds DIR's writer lock; HOST (where
#                                                 `draftfeed` is on PATH and DIR is the same folder)
#                                                 must see it held by this host and fail to take it;
#                                                 once released, HOST must take it
#   scripts/writer_lock_check.sh DIR              prints the command to run on the other host while
#                                                 this one holds the lock for 120 s
#
# Exit status 0 when the lock is seen across the hosts, 1 when it is not (two rewrites on the two
# hosts could interleave there: keep rewrites on one host, DRAFTFEED_WRITER_LOCK=local), 2 for bad
# arguments.
set -uo pipefail
dir=${1:-}
[ -n "$dir" ] && [ -d "$dir" ] || { sed -n '2,16p' "$0"; exit 2; }
peer=""
if [ "${2:-}" = "--ssh" ]; then peer=${3:?--ssh needs a host}; fi
me=$(hostname)
hold_seconds=120
coproc HOLD { exec draftfeed lock "$dir" --hold "$hold_seconds"; }
read -r -t 60 line <&"${HOLD[0]}" || { echo "draftfeed lock --hold did not start" >&2; exit 1; }
case "$line" in held*) ;; *) echo "draftfeed lock --hold: $line" >&2; exit 1 ;; esac
if [ -z "$peer" ]; then
  echo "$me holds the writer lock of $dir for ${hold_seconds} s. On the other host, run:"
  echo "  draftfeed lock '$dir' --hold 1   # must fail: 'is being rewritten by host $me, ...'"
  wait "$HOLD_PID"
  exit 0
fi
status=0
seen=$(ssh "$peer" draftfeed lock "'$dir'" 2>&1)
echo "$peer: $seen"
case "$seen" in *"held by host $me,"*) ;; *) echo "FAIL: $peer does not see the lock held by $me"; status=1 ;; esac
if ssh "$peer" draftfeed lock "'$dir'" --hold 0 >/dev/null 2>&1; then
  echo "FAIL: $peer took the writer lock while $me held it"
  status=1
fi
kill "$HOLD_PID" 2>/dev/null
wait "$HOLD_PID" 2>/dev/null
if ! ssh "$peer" draftfeed lock "'$dir'" --hold 0 --wait 30 >/dev/null 2>&1; then
  echo "FAIL: $peer could not take the writer lock once $me let it go"
  status=1
fi
[ $status -eq 0 ] && echo "ok: $dir's writer lock is seen and honoured across $me and $peer"
exit $status
