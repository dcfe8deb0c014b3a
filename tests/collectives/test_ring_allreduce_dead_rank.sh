#!/usr/bin/env bash
# Three ring_allreduce workers started by hand; worker.1 is killed (SIGKILL) mid-training.
# The two others must fail promptly (well within --timeout_ms) with an error naming a rank,
# never hang. Usage: test_ring_allreduce_dead_rank.sh <dtfrun> <examples dir>
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
read -r -a ports < <(free_ports 3)
hosts="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
for i in 0 1 2; do
  "$dir/ring_allreduce" --job_name worker --task_index $i --worker_hosts "$hosts" --epochs 50 \
    --train_examples 6000 --log_every 10 --timeout_ms 5000 >"$work/w$i.log" 2>&1 &
  pids+=($!)
done
wait_until 60 grep -q "step=20 " "$work/w1.log" || fail "worker.1 did not start training"
kill -KILL "${pids[1]}"
start=$SECONDS
for i in 0 2; do
  status=0
  wait_until 20 bash -c "! kill -0 ${pids[$i]} 2>/dev/null" || fail "worker.$i still runs 20 s after worker.1 died"
  wait "${pids[$i]}" || status=$?
  ((status != 0)) || fail "worker.$i exited 0 although worker.1 died"
  grep -q "rank [0-9]" "$work/w$i.log" || fail "worker.$i's error names no rank"
  echo "worker.$i: $(grep -m1 'ring_allreduce:' "$work/w$i.log")"
done
echo "both survivors failed within $((SECONDS - start)) s"
echo "PASS"
