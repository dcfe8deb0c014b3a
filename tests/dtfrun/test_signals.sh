# SIGTERM to dtfrun tears the cluster down; the first SIGINT asks the chief to stop, a second
# one kills every task at once. dtfrun exits 128+signal.
source "$(dirname "$0")/lib.sh"
# Job control: without it bash starts background commands with SIGINT ignored, and a
# process that starts with SIGINT ignored (like dtfrun here) keeps ignoring it.
set -m

cat >"$work/task.sh" <<TASK
$forever
TASK

# SIGTERM (and SIGHUP) to dtfrun tears the whole cluster down at once.
"$dtfrun" --ps 1 --workers 2 -- bash "$work/task.sh" >"$work/TERM.out" 2>"$work/TERM.err" &
bg_pid=$!
wait_until 20 tasks_running 3 || fail "expected 3 tasks running, found $(task_count)"
kill -TERM "$bg_pid"
wait "$bg_pid"
rc=$?
bg_pid=""
expect_rc 143 "$rc" "SIGTERM to dtfrun"
expect_line "$work/TERM.err" "dtfrun: received SIGTERM; tearing down the cluster"
expect_no_tasks_left

# The first SIGINT is a stop request: SIGTERM reaches the chief only, which saves and ends
# normally; the ps (which never ends by itself here) and the workers then get the grace
# period and SIGTERM. dtfrun exits 130.
cat >"$work/task.sh" <<'TASK'
exec "$py" "$events" park --ready --term-message "got SIGTERM; saved" "$tok.$DTF_TASK"
TASK
"$dtfrun" --ps 1 --workers 2 --grace_ms 300 -- bash "$work/task.sh" >"$work/INT.out" 2>"$work/INT.err" &
bg_pid=$!
ready3() { [[ $(grep -sc '| ready$' "$work/INT.out") -eq 3 ]]; }
wait_until 20 ready3 || fail "tasks did not get ready"
kill -INT "$bg_pid"
wait "$bg_pid"
rc=$?
bg_pid=""
expect_rc 130 "$rc" "SIGINT to dtfrun"
expect_line "$work/INT.err" "dtfrun: received SIGINT; asking worker.0 (chief) to stop with SIGTERM (SIGINT again kills every task)"
expect_line "$work/INT.err" "dtfrun: worker.0 (chief) ended (exit status 0) after the stop request"
expect_line "$work/INT.out" "worker.0 | got SIGTERM; saved"
# The others were not asked to stop before the chief had ended: they got SIGTERM only
# after the grace period.
grep -q '^dtfrun: ps.0, worker.1 still running 300 ms after the chief ended; sending SIGTERM$' "$work/INT.err" ||
  fail "the other tasks were not left to the grace period"
[[ $(grep -c 'got SIGTERM' "$work/INT.out") -eq 3 ]] || fail "expected every task to get SIGTERM in the end"
order=$(grep -n -e 'worker.0 | got SIGTERM' -e 'ps.0     | got SIGTERM' "$work/INT.out" | cut -d'|' -f1 | tr -d ' ')
[[ $(head -1 <<<"$order" | cut -d: -f2) == worker.0 ]] || fail "the chief was not the first to get SIGTERM"
expect_no_tasks_left

# Tasks that ignore SIGTERM (the chief too): a second SIGINT sends SIGKILL at once.
cat >"$work/task.sh" <<'TASK'
exec "$py" "$events" park --ready --ignore-term "$tok.$DTF_TASK"
TASK
"$dtfrun" --ps 1 --workers 1 -- bash "$work/task.sh" >"$work/twice.out" 2>"$work/twice.err" &
bg_pid=$!
ready() { [[ $(grep -sc '| ready$' "$work/twice.out") -eq 2 ]]; }
wait_until 20 ready || fail "tasks did not get ready"
kill -INT "$bg_pid"
first_seen() { grep -qs 'received SIGINT; asking worker.0 (chief) to stop' "$work/twice.err"; }
wait_until 10 first_seen || fail "dtfrun did not react to SIGINT"
kill -INT "$bg_pid"
wait "$bg_pid"
rc=$?
bg_pid=""
expect_rc 130 "$rc" "two SIGINTs"
expect_line "$work/twice.err" "dtfrun: received SIGINT again; killing the cluster"
grep -q 'ms after SIGTERM' "$work/twice.err" && fail "dtfrun waited although told twice"
expect_no_tasks_left
echo PASS
