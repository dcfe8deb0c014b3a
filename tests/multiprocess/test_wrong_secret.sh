#!/usr/bin/env bash
# A worker with the wrong cluster secret is refused by the ps with a clear error; the ps
# keeps running and then serves the right cluster to the end.
source "$(dirname "$0")/lib.sh"
DTF_CLUSTER_SECRET=right-secret-0123456789 start_ps "$work/ps.log"
DTF_CLUSTER_SECRET=wrong-secret-0123456789 "$example" --job_name worker --task_index 0 "${cluster[@]}" "${small[@]}" >"$work/intruder.log" 2>&1 &&
  fail "the worker with the wrong secret succeeded"
grep -q "wrong cluster secret" "$work/intruder.log" || fail "the refusal does not say why"
kill -0 "$ps_pid" 2>/dev/null || fail "the ps died after refusing a stranger"
DTF_CLUSTER_SECRET=right-secret-0123456789 "$example" --job_name worker --task_index 0 "${cluster[@]}" "${small[@]}" >"$work/worker.log" 2>&1 ||
  fail "the legitimate worker failed"
wait_until 20 bash -c "! kill -0 $ps_pid 2>/dev/null" || fail "the ps did not exit after the chief's shutdown"
wait_until 5 test -e "$work/ps/status.0" || fail "no exit status of the ps"
[[ $(cat "$work/ps/status.0") == 0 ]] || fail "the ps exited with status $(cat "$work/ps/status.0")"
grep -q "wrong cluster secret" "$work/ps.log" || fail "the ps did not log the refusal"
echo "PASS"
