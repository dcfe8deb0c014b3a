# Shared by the dtfrun tests: sourced with the path of dtfrun as $1.
#
# Every task process a test starts carries "$tok" in its argv (tasks exec python with
# "$tok.$DTF_TASK" as an argument), so `pgrep -f "$tok"` finds exactly this test's tasks.
set -u

dtfrun=${1:?usage: $0 <path to dtfrun>}
# The interpreter itself, not a version-manager shim, so the task is one process.
py=$("${DTF_TEST_PYTHON3:-python3}" -c 'import sys; print(sys.executable)')
work=$(mktemp -d "${TMPDIR:-/tmp}/dtfrun_test.XXXXXX")
tok="dtfrunmark${$}x${RANDOM}${RANDOM}"
# Events and task bodies without sleeps (see events.py); importable from tasks' python -c.
events="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/events.py"
export PYTHONPATH="$(dirname "$events")${PYTHONPATH:+:$PYTHONPATH}"
export py tok work events
# dtfrun's state files (dtfrun status) stay inside this test's directory, also those a
# dtfrun killed with SIGKILL leaves behind.
export XDG_RUNTIME_DIR="$work/xdg"
mkdir -m 700 "$XDG_RUNTIME_DIR"
bg_pid=""
ulimit -c 0  # tasks killed by signals in these tests must leave no core files behind

cleanup() {
  # Tasks die with dtfrun (PR_SET_PDEATHSIG), so stopping a dtfrun left running by a failed
  # check is enough.
  if [[ -n "$bg_pid" ]]; then kill -KILL "$bg_pid" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT

# wait_until from the shared helpers; fail here shows whole .out/.err files instead of logs.
source "$(dirname "${BASH_SOURCE[0]}")/../script_lib.sh"
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.out "$work"/*.err; do
    [[ -f "$f" ]] || continue
    echo "---- $f" >&2
    cat "$f" >&2
  done
  exit 1
}

task_count() { pgrep -f -- "$tok" | wc -l; }
no_tasks_left() { ! pgrep -f -- "$tok" >/dev/null; }
tasks_running() { [[ $(task_count) -eq $1 ]]; }

# Fails the test unless every task process is gone within a few seconds.
expect_no_tasks_left() {
  wait_until 5 no_tasks_left || fail "processes outlived dtfrun: $(pgrep -af -- "$tok")"
}

# A task body that runs until it is signalled, as one process marked for pgrep.
forever='exec "$py" "$events" park --ready "$tok.$DTF_TASK"'

# new_event NAME: the FIFO $work/NAME, for one fire and one wait (events.py).
new_event() { rm -f "$work/$1"; mkfifo "$work/$1"; }
# fire_event NAME: fires it from the test (bounded).
fire_event() { "$py" "$events" fire "$work/$1"; }

# expect_rc <expected> <actual> <what>
expect_rc() { [[ "$2" -eq "$1" ]] || fail "$3: exit status $2, expected $1"; }

# expect_line <file> <exact line>
expect_line() { grep -qxF -- "$2" "$1" || fail "no line '$2' in $1"; }
