#!/usr/bin/env bash
# Issue 31's first scenario: synchronous training over 2 ps with 3 workers and N = 2 (one
# backup) under dtfrun; worker.1 is SIGKILLed while it trains, twice:
#   1. --max-restarts worker=2: dtfrun restarts it and the job completes. Before the stage /
#      commit / forward protocol (docs/design/sync-protocol.md) it failed with "pull: ps.1 did
#      not reach step ... within ...".
#   2. no restarts, --worker-failures-allowed 1: dtfrun lets the job go on without it, the ps
#      count it as finished (it left without its done report, and 2 of the 3 are the N each step
#      needs), and the job completes (TensorFlow's SyncReplicasOptimizer with backups). Before,
#      dtfrun tore the job down.
# Each time the chief evaluates, every ps is shut down by the chief, and no pull waited for a ps
# behind the others.
# Usage: test_sync_backup_kill.sh <dtfrun> <examples dir>
source "$(dirname "$0")/lib.sh"

# worker.1's process, as dtfrun's log $1 names it ("started worker.1 (pid N)"; the last start).
# Not read from /proc/PID/environ, which shows nothing once a process has exited and dtfrun's
# environment before its exec: what it shows depends on when it is read.
worker1() {
  sed -n 's/^dtfrun: \(re\)\{0,1\}started worker\.1 (pid \([0-9]*\)).*/\2/p' "$1" | tail -n 1 | grep .
}

# run_job NAME DTFRUN-OPTIONS...: the job, worker.1 killed once it trains; checks the end.
run_job() {
  local name=$1 log="$work/$1.log" job victim status t
  shift
  "$dtfrun" --ps 2 --workers 3 "$@" --grace_ms 20000 -- "$example/sync_sgd" \
    --replicas_to_aggregate 2 --epochs 4 --train_examples 12000 --log_every 5 --timeout_ms 20000 >"$log" 2>&1 &
  job=$!
  pids+=("$job")
  wait_until 120 grep -q "^worker.1 .*step=[0-9]" "$log" || fail "$name: worker.1 never trained: $(tail -5 "$log")"
  victim=$(worker1 "$log") || fail "$name: worker.1's process not found"
  kill -KILL "$victim"
  wait "$job"
  status=$?
  ((status == 0)) || fail "$name: the job failed (status $status): $(grep -m3 -i 'error\|did not reach\|timed out\|tearing' "$log")"
  grep -q "did not reach step" "$log" && fail "$name: a pull waited for a ps behind the others"
  grep -q "final test accuracy" "$log" || fail "$name: no final evaluation"
  for t in ps.0 ps.1; do
    grep -q "^$t .*shut down by the chief" "$log" || fail "$name: $t did not exit by itself"
  done
  echo "$name: killed worker.1 (pid $victim); the job completed: $(grep -m1 -o 'final test accuracy.*' "$log")"
}

run_job restarts --max-restarts worker=2
grep -q "worker.1 .*restart" "$work/restarts.log" || grep -qi "restarting worker.1" "$work/restarts.log" ||
  fail "restarts: dtfrun did not restart worker.1"
grep "dtfrun:.*worker.1\|^worker.1 .*\(resum\|done at\)" "$work/restarts.log"

run_job allowed --worker-failures-allowed 1
grep -q "^worker.1 .*done at" "$work/allowed.log" &&
  fail "allowed: worker.1 finished before it was killed (the job is too short for this test)"
grep -q "worker.1 failed .*the job goes on without it" "$work/allowed.log" ||
  fail "allowed: dtfrun did not let the job go on: $(grep -m2 'dtfrun:' "$work/allowed.log")"
# The chief learns the done tasks from every ps: one that saw worker.1 leave is enough (a ps
# may see the connection end only after the job ended, e.g. one whose request it was answering).
grep -q "^ps\.[01] .*worker.1 left without its done report" "$work/allowed.log" ||
  fail "allowed: no ps counted worker.1 as finished"
grep "dtfrun:.*worker.1\|worker.1 left" "$work/allowed.log"
echo "PASS"
