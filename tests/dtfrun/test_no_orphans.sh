# No task process outlives dtfrun: not after a normal end (processes the tasks started in
# their process group included), and not when dtfrun itself is killed with SIGKILL.
source "$(dirname "$0")/lib.sh"

# Every task starts a child of its own (marked "$tok.<task>.child", writing to the task's
# stdout), then the ps runs forever and the workers end. The grace period runs out because
# the ps and the children keep running; teardown reaches all of them through the groups.
cat >"$work/task.sh" <<TASK
"\$py" "\$events" park "\$tok.\$DTF_TASK.child" &
[[ "\$DTF_TASK" == ps.* ]] && $forever
exit 0
TASK
"$dtfrun" --ps 1 --workers 2 --grace_ms 200 -- bash "$work/task.sh" >"$work/normal.out" 2>"$work/normal.err"
expect_rc 0 $? "normal end"
expect_no_tasks_left

# dtfrun killed with SIGKILL: the tasks get SIGKILL from the kernel (PR_SET_PDEATHSIG).
cat >"$work/task.sh" <<TASK
$forever
TASK
"$dtfrun" --ps 2 --workers 2 --chief --evaluator -- bash "$work/task.sh" >"$work/killed.out" 2>"$work/killed.err" &
bg_pid=$!
wait_until 20 tasks_running 6 || fail "expected 6 tasks running, found $(task_count)"
kill -KILL "$bg_pid"
wait "$bg_pid"
expect_rc $((128 + 9)) $? "dtfrun killed with SIGKILL"
bg_pid=""
expect_no_tasks_left
echo PASS
