#!/usr/bin/env bash
# TLS end to end (--tls, DTF_TLS=1): a ps with TLS refuses a worker without it, naming the
# cause on both sides, and keeps serving; a worker with --tls trains to the end; and dtfrun runs
# a whole cluster with TLS from the environment (DTF_CLUSTER_SECRET, DTF_TLS), as the tasks
# inherit it. --tls without a secret is a configuration error naming the secret.
source "$(dirname "$0")/lib.sh"

"$example" --job_name worker --task_index 0 --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 "${small[@]}" \
  --tls >"$work/nosecret.log" 2>&1 && fail "--tls without a secret was accepted"
grep -q "TLS needs a cluster secret" "$work/nosecret.log" || fail "--tls without a secret: the error does not say why"

DTF_CLUSTER_SECRET=right-secret-0123456789 DTF_TLS=1 start_ps "$work/ps.log"
DTF_CLUSTER_SECRET=right-secret-0123456789 "$example" --job_name worker --task_index 0 "${cluster[@]}" "${small[@]}" >"$work/plain.log" 2>&1 &&
  fail "a worker without TLS connected to a ps with TLS"
grep -q "this task requires TLS" "$work/plain.log" || fail "the plain worker's error does not say why"
kill -0 "$ps_pid" 2>/dev/null || fail "the ps died after refusing a plain worker"
DTF_CLUSTER_SECRET=right-secret-0123456789 "$example" --job_name worker --task_index 0 "${cluster[@]}" "${small[@]}" --tls \
  --target_accuracy 0.70 >"$work/worker.log" 2>&1 || fail "the TLS worker failed"
wait_until 20 bash -c "! kill -0 $ps_pid 2>/dev/null" || fail "the ps did not exit after the chief's shutdown"
wait_until 5 test -e "$work/ps/status.0" || fail "no exit status of the ps"
[[ $(cat "$work/ps/status.0") == 0 ]] || fail "the ps exited with status $(cat "$work/ps/status.0")"
grep -q "refused: a peer without TLS" "$work/ps.log" || fail "the ps did not log the refusal of the plain worker"

DTF_CLUSTER_SECRET=s3cret-0123456789abcdef DTF_TLS=1 "$dtfrun" --ps 2 --workers 2 --grace_ms 20000 -- "$example" "${small[@]}" \
  --target_accuracy 0.65 >"$work/dtfrun.log" 2>&1 || fail "dtfrun with TLS failed (status $?)"
grep -q "worker.1 .*done after" "$work/dtfrun.log" || fail "worker.1 did not finish under TLS"
grep -q "disconnected\|refused" "$work/dtfrun.log" && fail "a connection was refused or dropped under TLS"
echo "PASS"
