# A non-chief task that fails before the chief ends tears the whole cluster down: one line
# names it, dtfrun exits 1, nothing is left running. A task that ends with status 0 early
# is no failure. With --worker-failures-allowed K, up to K workers may fail for good (after
# their restarts) while the job goes on to the chief's end; the next failure tears it down.
source "$(dirname "$0")/lib.sh"

run() {  # run <name> <dtfrun flags...>: runs $work/task.sh under dtfrun, sets rc
  local name=$1
  shift
  "$dtfrun" "$@" -- bash "$work/task.sh" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
}

expect_one_failure_line() {  # <err file> <exact line>
  expect_line "$1" "$2"
  [[ $(grep -c 'failed' "$1") -eq 1 ]] || fail "expected exactly one failure line in $1"
}

# worker.2 exits 7 while the others (chief included) would run forever.
cat >"$work/task.sh" <<TASK
[[ "\$DTF_TASK" == worker.2 ]] && exit 7
$forever
TASK
run exit_code --ps 1 --workers 3
expect_rc 1 "$rc" "worker.2 exits 7"
expect_one_failure_line "$work/exit_code.err" "dtfrun: worker.2 failed (exit status 7); tearing down the cluster"
expect_no_tasks_left

# Killed by a signal counts as a failure too, and so does a failing ps.
cat >"$work/task.sh" <<TASK
[[ "\$DTF_TASK" == worker.1 ]] && kill -USR2 \$\$
$forever
TASK
run signalled --ps 1 --workers 2
expect_rc 1 "$rc" "worker.1 killed by SIGUSR2"
expect_one_failure_line "$work/signalled.err" "dtfrun: worker.1 failed (killed by signal SIGUSR2); tearing down the cluster"
expect_no_tasks_left

cat >"$work/task.sh" <<TASK
[[ "\$DTF_TASK" == ps.1 ]] && exit 2
$forever
TASK
run ps_fails --ps 2 --workers 1 --chief
expect_rc 1 "$rc" "ps.1 exits 2"
expect_one_failure_line "$work/ps_fails.err" "dtfrun: ps.1 failed (exit status 2); tearing down the cluster"
expect_no_tasks_left

# worker.1 finishes with status 0 first; the chief waits until it has ended (a zombie held
# by dtfrun), then exits 6: the job's status is the chief's.
cat >"$work/task.sh" <<'TASK'
case "$DTF_TASK" in
  worker.1) exec "$py" "$events" fire "$work/worker1" --message $$ ;;
  worker.0) pid=$("$py" "$events" wait "$work/worker1" --print) || exit 1
            "$py" "$events" wait-exit "$pid" || exit 1
            exit 6 ;;
esac
TASK
new_event worker1
run early_success --workers 2
expect_rc 6 "$rc" "worker.1 exits 0 early"
grep -q failed "$work/early_success.err" && fail "an early exit with status 0 was reported as a failure"

# --worker-failures-allowed 1: worker.1 prints its address and kills itself, again after its
# one restart; then the job goes on (the chief, worker.0 and the ps still run), the state file
# shows worker.1 failed, and its port refuses connections. The chief ends the job on "go"
# with status 0, which is dtfrun's.
cat >"$work/task.sh" <<TASK
case "\$DTF_TASK" in
  worker.1) "\$py" -c 'import json, os; print("addr=" + json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][1])'
            kill -KILL \$\$ ;;
  chief.0) exec "\$py" "\$events" wait "\$work/go" "\$tok.\$DTF_TASK" ;;
esac
$forever
TASK
new_event go
"$dtfrun" --ps 1 --chief --workers 2 --worker-failures-allowed 1 --max-restarts worker=1 \
  --restart_delay_ms 0 --grace_ms 100 -- bash "$work/task.sh" >"$work/allowed.out" 2>"$work/allowed.err" &
bg_pid=$!
went_on_line="dtfrun: worker.1 failed (killed by signal SIGKILL) after 1 restart; 1 of 1 allowed worker failures: the job goes on without it"
went_on() { grep -qsxF -- "$went_on_line" "$work/allowed.err" && tasks_running 3; }
wait_until 20 went_on || fail "the job did not go on without worker.1"
shown_failed() {
  "$py" - "$XDG_RUNTIME_DIR/dtfrun/$bg_pid.json" <<'PY' 2>/dev/null
import json, sys
tasks = {t["name"]: t["state"] for t in json.load(open(sys.argv[1]))["tasks"]}
sys.exit(0 if tasks["worker.1"] == "failed (killed by signal SIGKILL)" and tasks["chief.0"] == "running"
         and tasks["worker.0"] == "running" else 1)
PY
}
wait_until 20 shown_failed || fail "the state file does not show worker.1 failed and the others running"
address=$(sed -n 's/^worker\.1 *| addr=//p' "$work/allowed.out" | sort -u)
[[ $(wc -l <<<"$address") -eq 1 ]] || fail "worker.1 did not print one address: [$address]"
refused() {
  "$py" -c 'import socket, sys; h, p = sys.argv[1].rsplit(":", 1)
try: socket.create_connection((h, int(p)), timeout=5).close()
except ConnectionRefusedError: sys.exit(0)
sys.exit(1)' "$address"
}
wait_until 20 refused || fail "worker.1's port $address still accepts connections"
fire_event go
wait "$bg_pid"
expect_rc 0 $? "worker.1 failing within --worker-failures-allowed 1"
bg_pid=""
expect_line "$work/allowed.err" "dtfrun: chief.0 (chief) ended (exit status 0)"
grep -q 'tearing down' "$work/allowed.err" && fail "an allowed worker failure tore the job down"
expect_no_tasks_left

# Two workers fail with one failure allowed: the first is let go, the second tears the job
# down (which one comes first is up to the scheduler).
cat >"$work/task.sh" <<TASK
[[ "\$DTF_TASK" == worker.* ]] && exit 3
$forever
TASK
run over_allowance --ps 1 --chief --workers 2 --worker_failures_allowed=1
expect_rc 1 "$rc" "two workers failing with --worker-failures-allowed 1"
err="$work/over_allowance.err"
grep -qxE 'dtfrun: worker\.[01] failed \(exit status 3\); 1 of 1 allowed worker failures: the job goes on without it' "$err" ||
  fail "no line letting the first failed worker go"
grep -qxE 'dtfrun: worker\.[01] failed \(exit status 3\); the 1 allowed worker failure is used up; tearing down the cluster' "$err" ||
  fail "no line tearing the job down at the second worker failure"
[[ $(grep -c 'failed' "$err") -eq 2 ]] || fail "expected exactly two failure lines in $err"
expect_no_tasks_left
echo PASS
