#!/usr/bin/env bash
# mirrored: 2 replicas alone in one process reach 0.87 on the full run; 2 processes x 2
# replicas under dtfrun train a subset, print RESULT and agree on the averaged losses.
# Usage: test_mirrored.sh <dtfrun> <examples dir>
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
"$dir/mirrored" --replicas 2 --log_every 500 --target_accuracy 0.87 >"$work/single.log" 2>&1 \
  || fail "mirrored with 2 replicas in one process failed (status $?)"
grep -q "^RESULT scheme=mirrored workers=1 replicas=2" "$work/single.log" || fail "no RESULT line (one process)"
grep -o 'RESULT.*' "$work/single.log"
log="$work/cluster.log"
"$dtfrun" --workers 2 --timeout_s 120 -- "$dir/mirrored" --replicas 2 --epochs 1 --train_examples 8000 --log_every 10 \
  --target_accuracy 0.6 --metrics_file "$work/metrics.json" >"$log" 2>&1 || fail "mirrored under dtfrun failed (status $?)"
grep -q "RESULT scheme=mirrored workers=2 replicas=2" "$log" || fail "no RESULT line (dtfrun)"
[[ -s "$work/metrics.json" ]] || fail "no metrics file"
diff <(grep -o 'worker.0: step=.*loss=[0-9.]*' "$log" | sed 's/worker.0: //') \
     <(grep -o 'worker.1: step=.*loss=[0-9.]*' "$log" | sed 's/worker.1: //') >/dev/null \
  || fail "the processes' averaged losses differ"
grep -o 'RESULT.*' "$log"
echo "PASS"
