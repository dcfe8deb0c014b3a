# `dtfrun status` prints the running job's table from another shell: the state file dtfrun
# keeps (about once a second) holds each task's state, step, loss, steps/s, and CPU % and
# resident memory of its process group. The file goes away when dtfrun ends; stale files of
# a killed dtfrun are ignored.
source "$(dirname "$0")/lib.sh"
state_dir="$XDG_RUNTIME_DIR/dtfrun"

# worker.0 (the chief) reports step 5 of 50 and waits for the event "go"; worker.1 keeps a
# CPU busy and the ps runs until the teardown after the chief's end.
cat >"$work/task.sh" <<'TASK'
case "$DTF_TASK" in
  worker.0) echo "step=5 last_step=50 loss=0.25 steps_per_sec=12.5"
            exec "$py" "$events" wait "$work/go" --timeout 60 ;;
  ps.0) echo "ps.0: step=3 (a ps line)" ;;
  worker.1) exec "$py" -c 'while True: pass' "$tok.$DTF_TASK" ;;
esac
exec "$py" "$events" park "$tok.$DTF_TASK"
TASK
new_event go
"$dtfrun" --ps 1 --workers 2 --grace_ms 100 -- bash "$work/task.sh" >"$work/run.out" 2>"$work/run.err" &
bg_pid=$!
state="$state_dir/$bg_pid.json"
# Ready once the chief's step is in and worker.1 has a CPU figure (two samples apart).
ready() {
  "$py" - "$state" <<'PY' 2>/dev/null
import json, sys
tasks = {t["name"]: t for t in json.load(open(sys.argv[1]))["tasks"]}
sys.exit(0 if tasks["worker.0"]["step"] == 5 and tasks["worker.1"]["cpu_percent"] is not None else 1)
PY
}
wait_until 20 ready || fail "the state file $state did not get the job's figures"
[[ $(stat -c %a "$state_dir") == 700 ]] || fail "the state directory is not private"

"$dtfrun" status >"$work/status.out" 2>"$work/status.err"
expect_rc 0 $? "dtfrun status"
[[ ! -s "$work/status.err" ]] || fail "dtfrun status wrote to stderr"
out="$work/status.out"
grep -qE "^dtfrun $bg_pid \| running \| [0-9]{2}:[0-9]{2} \| bash $work/task.sh$" "$out" || fail "no title line"
grep -qE '^task +state +restarts +step +steps/s +loss +CPU % +RSS$' "$out" || fail "no header"
grep -qE '^ps\.0 +running +0 +3 +- +- +[0-9.]+ +[0-9.]+ MiB$' "$out" || fail "no row for ps.0"
grep -qE '^worker\.0 +running +0 +5 +12\.5 +0\.2500 +[0-9.]+ +[0-9.]+ MiB$' "$out" || fail "no row for worker.0"
# worker.1 spins: it used some CPU between two samples, at most all cores' worth (how much
# depends on what else this machine runs).
cpu=$(awk '$1 == "worker.1" { print $(NF-2) }' "$out")
"$py" -c "import os, sys; sys.exit(0 if 0 < float('$cpu') <= 100 * os.cpu_count() + 5 else 1)" ||
  fail "worker.1 is busy but shows CPU $cpu %"
grep -qE '^chief worker\.0: \[#+\.+\] 5/50 10%' "$out" || fail "no progress bar"

# With the pid: the same job; a pid without a job: one line, status 1.
"$dtfrun" status "$bg_pid" >"$work/status_pid.out" 2>&1
expect_rc 0 $? "dtfrun status PID"
grep -q "^dtfrun $bg_pid | running" "$work/status_pid.out" || fail "dtfrun status PID printed another job"
true & dead=$!
wait "$dead"
"$dtfrun" status "$dead" >"$work/none.out" 2>"$work/none.err"
expect_rc 1 $? "dtfrun status of a pid without a job"
[[ $(wc -l <"$work/none.err") -eq 1 && ! -s "$work/none.out" ]] || fail "expected one line on stderr"
grep -q "no running dtfrun job with pid $dead" "$work/none.err" || fail "the message does not name the pid"
"$dtfrun" status 12x >/dev/null 2>&1
expect_rc 2 $? "dtfrun status with a malformed pid"

# A corrupt state file of a live process: one line naming the file, status 1.
printf '{"pid": 1, "tasks": [' >"$state_dir/$$.json"
"$dtfrun" status "$$" >"$work/corrupt.out" 2>"$work/corrupt.err"
expect_rc 1 $? "dtfrun status with a corrupt state file"
[[ $(wc -l <"$work/corrupt.err") -eq 1 ]] || fail "corrupt state file: expected one line on stderr"
grep -q "cannot read $state_dir/$$.json: invalid JSON at offset" "$work/corrupt.err" ||
  fail "corrupt state file: the message does not say why"
rm "$state_dir/$$.json"

# A state file left by a dtfrun killed with SIGKILL is ignored and removed.
cp "$state" "$state_dir/$dead.json"
"$dtfrun" status >"$work/status2.out" 2>&1
expect_rc 0 $? "dtfrun status with a stale file"
[[ $(grep -c '^dtfrun [0-9]* |' "$work/status2.out") -eq 1 ]] || fail "the stale job was listed"
[[ ! -e "$state_dir/$dead.json" ]] || fail "the stale state file was not removed"

fire_event go
wait "$bg_pid"
expect_rc 0 $? "the job"
bg_pid=""
[[ ! -e "$state" ]] || fail "the state file outlived dtfrun"
"$dtfrun" status >"$work/after.out" 2>"$work/after.err"
expect_rc 1 $? "dtfrun status without a job"
grep -q 'no running dtfrun job found' "$work/after.err" || fail "no message when no job runs"
expect_no_tasks_left
echo PASS
