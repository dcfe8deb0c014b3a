#!/usr/bin/env bash
# SIGKILL the parameter server while a worker trains: the worker fails with an error that
# names ps.0, within its request timeout, instead of hanging.
source "$(dirname "$0")/lib.sh"
start_ps "$work/ps.log"
"$example" --job_name worker --task_index 0 "${cluster[@]}" --epochs 100 --train_examples 3000 --log_every 10 \
  --timeout_ms 3000 >"$work/worker.log" 2>&1 &
worker_pid=$!
pids+=("$worker_pid")
wait_until 60 grep -q " step=[0-9]" "$work/worker.log" || fail "the worker never trained"
kill -KILL "$ps_pid"
start=$SECONDS
wait_until 15 bash -c "! kill -0 $worker_pid 2>/dev/null" || fail "the worker still runs 15 s after the ps died"
wait "$worker_pid"
status=$?
((status != 0)) || fail "the worker exited 0 after losing its ps"
grep -q "ps.0" "$work/worker.log" || fail "the worker's error does not name ps.0"
echo "worker exited with status $status after $((SECONDS - start)) s: $(grep -m1 'distributed_setup:' "$work/worker.log")"
echo "PASS"
