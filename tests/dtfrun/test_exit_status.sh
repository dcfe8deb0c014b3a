# dtfrun exits with the chief's status; after the chief ends, the other tasks get the grace
# period to end by themselves, then SIGTERM, then SIGKILL.
source "$(dirname "$0")/lib.sh"

run() {  # run <name> <dtfrun flags...>: runs $work/task.sh under dtfrun, sets rc
  local name=$1
  shift
  "$dtfrun" "$@" -- bash "$work/task.sh" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
}

# The chief is worker 0 without --chief: its exit status 3 is dtfrun's.
cat >"$work/task.sh" <<'TASK'
[[ "$DTF_TASK" == worker.0 ]] && exit 3
exit 0
TASK
run worker_chief --workers 3
expect_rc 3 "$rc" "chief worker.0 exits 3"
expect_line "$work/worker_chief.err" "dtfrun: worker.0 (chief) ended (exit status 3)"

# With --chief the chief task decides, not worker 0.
cat >"$work/task.sh" <<'TASK'
[[ "$DTF_TASK" == chief.0 ]] && exit 4
exit 0
TASK
run chief_task --chief --workers 2
expect_rc 4 "$rc" "chief.0 exits 4"

# A chief killed by a signal: 128 + the signal number.
cat >"$work/task.sh" <<'TASK'
[[ "$DTF_TASK" == worker.0 ]] && kill -USR1 $$
exit 0
TASK
run chief_signalled --workers 1
expect_rc $((128 + 10)) "$rc" "chief killed by SIGUSR1"
expect_line "$work/chief_signalled.err" "dtfrun: worker.0 (chief) ended (killed by signal SIGUSR1)"

# A ps that never ends is terminated once the grace period after the chief's exit is over.
cat >"$work/task.sh" <<TASK
[[ "\$DTF_TASK" == ps.* ]] && $forever
exit 0
TASK
run ps_forever --ps 2 --workers 1 --grace_ms 300
expect_rc 0 "$rc" "ps running forever"
expect_line "$work/ps_forever.err" "dtfrun: ps.0, ps.1 still running 300 ms after the chief ended; sending SIGTERM"
expect_no_tasks_left

# A ps that ends by itself when the chief is done (as a dtf ps does) ends the job well
# inside the grace period: no SIGTERM.
cat >"$work/task.sh" <<'TASK'
case "$DTF_TASK" in
  worker.0) exec "$py" "$events" fire "$work/chief_done" ;;
  ps.0) "$py" "$events" wait "$work/chief_done" || exit 9; echo "chief is done" ;;
esac
TASK
new_event chief_done
start=$SECONDS
run ps_ends --ps 1 --workers 1 --grace_ms 40000
expect_rc 0 "$rc" "ps ending by itself"
expect_line "$work/ps_ends.out" "ps.0     | chief is done"
grep -q SIGTERM "$work/ps_ends.err" && fail "a task was sent SIGTERM"
((SECONDS - start < 30)) || fail "dtfrun waited out the grace period"

# A ps that ignores SIGTERM gets SIGKILL after the bounded wait; the status is still the chief's.
# The chief ends only once the ps has set SIGTERM to be ignored.
cat >"$work/task.sh" <<'TASK'
if [[ "$DTF_TASK" == worker.0 ]]; then
  "$py" "$events" wait "$work/ps_ready" && exit 5
  exit 1
fi
exec "$py" "$events" park --ignore-term --fire "$work/ps_ready" "$tok.$DTF_TASK"
TASK
new_event ps_ready
run stubborn --ps 1 --workers 1 --grace_ms 200
expect_rc 5 "$rc" "ps ignoring SIGTERM"
expect_line "$work/stubborn.err" "dtfrun: ps.0 still running 3000 ms after SIGTERM; sending SIGKILL"
expect_no_tasks_left
echo PASS
