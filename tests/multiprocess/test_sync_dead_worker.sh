#!/usr/bin/env bash
# Synchronous training with N = 2 of 2 workers: SIGKILL one worker mid-training; the other
# fails with an error saying a replica disconnected, within its timeout, instead of hanging.
# Usage: test_sync_dead_worker.sh <dtfrun> <examples dir>
source "$(dirname "$0")/lib.sh"
example="$example/sync_sgd"
num_workers=2 start_ps "$work/ps.log"
for k in 0 1; do
  "$example" --job_name worker --task_index "$k" "${cluster[@]}" --epochs 100 --train_examples 3000 \
    --log_every 10 --timeout_ms 5000 >"$work/worker$k.log" 2>&1 &
  eval "w${k}_pid=$!"
  pids+=("$!")
done
wait_until 60 grep -q " step=[0-9]" "$work/worker0.log" || fail "training never started"
kill -KILL "$w1_pid"
start=$SECONDS
wait_until 20 bash -c "! kill -0 $w0_pid 2>/dev/null" || fail "worker.0 still waits 20 s after worker.1 died"
wait "$w0_pid"
status=$?
((status != 0)) || fail "worker.0 exited 0 after losing its peer"
grep -q "worker.1 disconnected, leaving 1 of the 2 replicas" "$work/worker0.log" || fail "the error does not say why"
grep -q "synchronous training cannot continue" "$work/ps.log" || fail "the ps did not log the failure"
echo "worker.0 failed after $((SECONDS - start)) s: $(grep -m1 'sync_sgd:' "$work/worker0.log")"
echo "PASS"
