#!/usr/bin/env bash
# Credentials under dtfrun (docs/design/identity.md): the master secret is on no command line,
# only the ps tasks get it, every other task gets its own key and the ring key instead, and a
# secret under 16 bytes is refused before anything starts.
source "$(dirname "$0")/lib.sh"

DTF_CLUSTER_SECRET=short "$dtfrun" --ps 1 --workers 1 -- "$example" "${small[@]}" >"$work/short.log" 2>&1 &&
  fail "dtfrun accepted a 5-byte secret"
grep -q "at least 16" "$work/short.log" || fail "the refusal of a short secret does not say why"

secret=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
DTF_CLUSTER_SECRET=$secret "$dtfrun" --ps 1 --workers 2 --grace_ms 20000 -- "$example" --epochs 2 \
  --train_examples 6000 --log_every 10 --batch 32 >"$work/job.log" 2>&1 &
job=$!
pids+=("$job")
wait_until 60 bash -c "[[ \$(grep -c 'started .* (pid' '$work/job.log') -ge 3 ]]" || fail "the tasks did not start"
declare -A pid_of
while read -r name pid; do pid_of[$name]=$pid; done < <(sed -n 's/.*started \([a-z]*\.[0-9]*\) (pid \([0-9]*\)).*/\1 \2/p' "$work/job.log")
checked=0
for name in "${!pid_of[@]}"; do
  pid=${pid_of[$name]}
  [[ -r /proc/$pid/environ ]] || continue  # (ended already)
  tr '\0' '\n' </proc/"$pid"/cmdline | grep -qF "$secret" && fail "the secret is on $name's command line"
  env=$(tr '\0' '\n' </proc/"$pid"/environ) || continue
  if [[ $name == ps.* ]]; then
    grep -qx "DTF_CLUSTER_SECRET=$secret" <<<"$env" || fail "$name did not get the master secret"
  else
    grep -q "^DTF_CLUSTER_SECRET=" <<<"$env" && fail "$name got the master secret"
    grep -q "^DTF_TASK_KEY=[0-9a-f]\{64\}$" <<<"$env" || fail "$name did not get its task key"
    grep -q "^DTF_RING_KEY=[0-9a-f]\{64\}$" <<<"$env" || fail "$name did not get the ring key"
    ((++checked))
  fi
done
((checked >= 1)) || fail "no worker was still running to be checked"
for pid in $job $(pgrep -P "$job"); do
  [[ -r /proc/$pid/cmdline ]] && tr '\0' '\n' </proc/"$pid"/cmdline | grep -qF "$secret" && fail "the secret is on a command line (pid $pid)"
done
wait "$job" || fail "the job with per-task keys failed (status $?)"
grep -q "worker.1 .*done after" "$work/job.log" || fail "worker.1 did not finish with its task key"
grep -q "refused\|disconnected" "$work/job.log" && fail "a connection was refused under per-task keys"

# The view, the state file and `dtfrun status` mask a secret-bearing argument; `dtfrun status`
# believes only a state directory of this user's that no one else may write.
mkdir -m 700 "$work/run"
XDG_RUNTIME_DIR=$work/run "$dtfrun" --workers 1 -- bash -c 'sleep 5' prog --secret hunter2-hunter2-hunter2 \
  --api_token=tok-tok-tok-tok >"$work/masked.log" 2>&1 &
masked=$!
pids+=("$masked")
wait_until 20 bash -c "ls '$work/run/dtfrun/'*.json >/dev/null 2>&1" || fail "no state file"
XDG_RUNTIME_DIR=$work/run "$dtfrun" status >"$work/status.txt" 2>&1 || fail "dtfrun status failed"
grep -q -- "--secret \*\*\* --api_token=\*\*\*" "$work/status.txt" || fail "dtfrun status does not mask the secrets"
grep -q "hunter2\|tok-tok" "$work/status.txt" "$work/run/dtfrun/"*.json && fail "a secret is in the state file or status"
chmod 755 "$work/run/dtfrun"
XDG_RUNTIME_DIR=$work/run "$dtfrun" status >"$work/status2.txt" 2>&1 && fail "dtfrun status trusted a directory open to others"
grep -q "mode must be 0700" "$work/status2.txt" || fail "the refusal of the state directory does not say why"
chmod 700 "$work/run/dtfrun"
wait "$masked" || fail "the masked job failed"
echo "PASS"
