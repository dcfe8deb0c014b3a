#!/usr/bin/env bash
# dtfrun --workers 2 -- ring_allreduce: the full run reaches 0.87 test accuracy, both workers
# report the same (allreduced) losses, and the chief writes its metrics file.
# Usage: test_ring_allreduce_dtfrun.sh <dtfrun> <examples dir>
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
log="$work/run.log"
"$dtfrun" --workers 2 --timeout_s 200 -- "$dir/ring_allreduce" --log_every 200 --target_accuracy 0.87 \
  --metrics_file "$work/metrics.json" >"$log" 2>&1 || fail "ring_allreduce under dtfrun failed (status $?)"
grep -q "^RESULT scheme=ring_allreduce workers=2" <(sed 's/^worker.0 *| //' "$log") || fail "no RESULT line"
python3 - "$work/metrics.json" <<'PY' || fail "bad metrics file"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["accuracy"] >= 0.87 and m["global_step"] > 0 and m["wall_s"] > 0 and "loss" in m, m
PY
# Replicas see the same averaged loss at the same step.
diff <(grep -o 'worker.0: step=.*loss=[0-9.]*' "$log" | sed 's/worker.0: //') \
     <(grep -o 'worker.1: step=.*loss=[0-9.]*' "$log" | sed 's/worker.1: //') >/dev/null \
  || fail "the workers' averaged losses differ"
grep -o 'RESULT.*' "$log"
echo "PASS"
