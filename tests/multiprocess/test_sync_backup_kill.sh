#!/usr/bin/env bash
# Issue 31's first scenario: synchronous training over 2 ps with 3 workers and N = 2 (one
# backup) under dtfrun --max-restarts; worker.1 is SIGKILLed while it trains. dtfrun restarts
# it and the job completes: the chief evaluates, every ps is shut down by the chief, and no pull
# waits for a ps behind the others. Before the stage / commit / forward protocol
# (docs/design/sync-protocol.md) it failed with "pull: ps.1 did not reach step ... within ...".
# Usage: test_sync_backup_kill.sh <dtfrun> <examples dir>
source "$(dirname "$0")/lib.sh"
log="$work/job.log"
"$dtfrun" --ps 2 --workers 3 --max-restarts worker=2 --grace_ms 20000 -- "$example/sync_sgd" \
  --replicas_to_aggregate 2 --epochs 4 --train_examples 3000 --log_every 5 --timeout_ms 20000 >"$log" 2>&1 &
job=$!
pids+=("$job")
# worker.1's process: the child of this dtfrun whose environment names it (dtfrun sets DTF_TASK).
worker1() {
  local p
  for p in $(pgrep -P "$job"); do
    if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "DTF_TASK=worker.1"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}
wait_until 120 grep -q "^worker.1 .*step=[0-9]" "$log" || fail "worker.1 never trained: $(tail -5 "$log")"
victim=$(worker1) || fail "worker.1's process not found"
kill -KILL "$victim"
wait "$job"
status=$?
((status == 0)) || fail "the job failed (status $status): $(grep -m3 -i 'error\|did not reach\|timed out' "$log")"
grep -q "did not reach step" "$log" && fail "a pull waited for a ps behind the others"
grep -q "worker.1 .*restart" "$log" || grep -qi "restarting worker.1" "$log" || fail "dtfrun did not restart worker.1"
grep -q "final test accuracy" "$log" || fail "no final evaluation"
for t in ps.0 ps.1; do
  grep -q "^$t .*shut down by the chief" "$log" || fail "$t did not exit by itself"
done
echo "killed worker.1 (pid $victim); the job completed: $(grep -m1 -o 'final test accuracy.*' "$log")"
grep "dtfrun:.*worker.1\|^worker.1 .*\(resum\|done at\)" "$log"
echo "PASS"
