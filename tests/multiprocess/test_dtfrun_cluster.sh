#!/usr/bin/env bash
# dtfrun starts ps and workers of distributed_setup; training runs through the ps; the chief
# shuts the ps down and the ps exits by itself (status 0); dtfrun exits with the chief's 0.
source "$(dirname "$0")/lib.sh"

run() {  # run <name> <dtfrun args...> -- <example args...>
  local name=$1
  shift
  "$dtfrun" "$@" >"$work/$name.log" 2>&1
}

# 1 ps, 1 worker.
run one --ps 1 --workers 1 --grace_ms 20000 -- "$example" "${small[@]}" --target_accuracy 0.70 ||
  fail "1 ps / 1 worker run failed (status $?)"
grep -q "ps.0 .*shut down by the chief" "$work/one.log" || fail "ps.0 did not exit by itself"
grep -q "final test accuracy .* global_step [0-9]" "$work/one.log" || fail "no final evaluation"
grep -q "SIGTERM\|SIGKILL\|killed" "$work/one.log" && fail "dtfrun had to terminate a task"

# 2 ps, 2 workers, sharded variables, an authenticated cluster.
DTF_CLUSTER_SECRET=correct-horse-battery-staple run two --ps 2 --workers 2 --grace_ms 20000 -- "$example" "${small[@]}" \
  --partitioner fixed_size --num_shards 3 --target_accuracy 0.65 || fail "2 ps / 2 workers run failed (status $?)"
for t in ps.0 ps.1; do
  grep -q "^$t .*shut down by the chief" "$work/two.log" || fail "$t did not exit by itself"
done
grep -q "worker.1 .*done after" "$work/two.log" || fail "worker.1 did not finish"
# Both workers' steps reached the ps: the final global step counts them all.
steps=$(grep -o "final test accuracy .* global_step [0-9]*" "$work/two.log" | grep -o "global_step [0-9]*" | awk '{print $2}')
[[ "$steps" == 94 ]] || fail "final global step $steps, expected 94 (2 workers x 47 batches of 32)"
echo "PASS"
