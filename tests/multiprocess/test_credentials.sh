#!/usr/bin/env bash
# Credentials under dtfrun (docs/design/identity.md): the master secret is on no command line,
# only the ps tasks get it, every other task gets its own key and the ring key instead, and a
# secret under 16 bytes is refused before anything starts.
source "$(dirname "$0")/lib.sh"

DTF_CLUSTER_SECRET=short "$dtfrun" --ps 1 --workers 1 -- "$example" "${small[@]}" >"$work/short.log" 2>&1 &&
  fail "dtfrun accepted a 5-byte secret"
grep -q "at least 16" "$work/short.log" || fail "the refusal of a short secret does not say why"

secret=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
# What dtfrun gives each task is checked on what the task received, recorded by a wrapper before
# it execs the example (which takes its keys out of its environment as it starts). Reading
# /proc/PID/environ of a running task instead raced the task: before its exec it shows dtfrun's
# environment, once it has exited nothing, and the check failed under load.
mkdir -m 700 "$work/env"
cat >"$work/record_env" <<EOF
#!/usr/bin/env bash
env >"$work/env/\${DTF_TASK:?}.env"
printf '%s\n' "\$@" >"$work/env/\${DTF_TASK}.argv"
exec "\$@"
EOF
chmod 700 "$work/record_env"
DTF_CLUSTER_SECRET=$secret "$dtfrun" --ps 1 --workers 2 --grace_ms 20000 -- "$work/record_env" "$example" "${small[@]}" \
  >"$work/job.log" 2>&1 &
job=$!
pids+=("$job")
# The keys as docs/design/identity.md defines them, computed here independently of dtf's code:
# K(id) = HMAC-SHA256(M, "dtf task key v1" len(id) ":" id), R = HMAC-SHA256(M, "dtf ring key v1").
key_of() {
  python3 -c 'import hashlib, hmac, sys
m, label, name = (a.encode() for a in sys.argv[1:4])
print(hmac.new(m, label + (str(len(name)).encode() + b":" + name if name else b""), hashlib.sha256).hexdigest())' "$@"
}
ring_key=$(key_of "$secret" "dtf ring key v1" "")
for name in ps.0 worker.0 worker.1; do
  wait_until 60 test -s "$work/env/$name.argv" || fail "$name did not start"
done
for f in "$work/env/"*.env; do
  name=$(basename "$f" .env)
  grep -qF "$secret" "$work/env/$name.argv" && fail "the secret is on $name's command line"
  if [[ $name == ps.* ]]; then
    grep -qx "DTF_CLUSTER_SECRET=$secret" "$f" || fail "$name did not get the master secret"
    grep -q "^DTF_TASK_KEY=\|^DTF_RING_KEY=" "$f" && fail "$name got a task key or the ring key"
  else
    grep -q "^DTF_CLUSTER_SECRET=" "$f" && fail "$name got the master secret"
    grep -qx "DTF_TASK_KEY=$(key_of "$secret" "dtf task key v1" "$name")" "$f" || fail "$name did not get its own task key"
    grep -qx "DTF_RING_KEY=$ring_key" "$f" || fail "$name did not get the ring key"
  fi
done
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
