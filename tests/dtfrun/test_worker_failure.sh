# A non-chief task that fails before the chief ends tears the whole cluster down: one line
# names it, dtfrun exits 1, nothing is left running. A task that ends with status 0 early
# is no failure.
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
echo PASS
