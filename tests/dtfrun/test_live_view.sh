# On a terminal dtfrun keeps a table at the bottom of the screen (a line per task, the
# chief's progress bar), redrawn in place while the tasks' lines scroll above it; each log
# line reaches the screen once, in order, and the last table stays. Not on a terminal (or
# with --no-live) the output holds no escape sequences. The run is made on a pty by term.py,
# which also renders what a terminal would show.
source "$(dirname "$0")/lib.sh"
term="$(dirname "$0")/term.py"
export TERM=xterm

# Every task prints 12 progress lines (the chief's reach last_step) and ends; worker.1
# fails once first and is restarted; the chief ends after worker.1's second start is done.
cat >"$work/task.sh" <<'TASK'
if [[ "$DTF_TASK" == worker.1 && "$DTF_RESTART_COUNT" == 0 ]]; then echo "failing once"; exit 3; fi
for ((i = 1; i <= 12; ++i)); do
  echo "$DTF_TASK: step=$i last_step=12 loss=0.$((500 - i)) steps_per_sec=$((40 + i)).5 lr=0.1"
done
if [[ "$DTF_TASK" == worker.1 ]]; then exec "$py" "$events" fire "$work/worker1_done"; fi
if [[ "$DTF_TASK" == worker.0 ]]; then exec "$py" "$events" wait "$work/worker1_done"; fi
exit 0
TASK
new_event worker1_done
"$py" "$term" 100 "$work/live.raw" "$work/live.screen" -- \
  "$dtfrun" --ps 1 --workers 2 --max-restarts worker=1 --restart_delay_ms 0 --grace_ms 2000 -- bash "$work/task.sh"
expect_rc 0 $? "live run"
grep -q $'\x1b\\[[0-9]*A' "$work/live.raw" || fail "the table was not redrawn in place"
screen="$work/live.screen"
# No screen line is wider than the terminal.
awk 'length($0) > 100 { exit 1 }' "$screen" || fail "a line is wider than the terminal"
# Every log line exactly once, in order, above the table.
for name in ps.0 worker.0 worker.1; do
  p=$(printf '%-8s | ' "$name")
  got=$(grep -F -- "$p$name: step=" "$screen")
  want=$(for ((i = 1; i <= 12; ++i)); do echo "$p$name: step=$i last_step=12 loss=0.$((500 - i)) steps_per_sec=$((40 + i)).5 lr=0.1"; done)
  [[ "$got" == "$want" ]] || fail "log lines of $name on the screen: got [$got]"
done
expect_line "$screen" "worker.1 | failing once"
expect_line "$screen" "dtfrun: worker.1 failed (exit status 3); restarting it (restart 1 of 1)"
# One table, at the bottom: title, header, a row per task, the chief's bar.
[[ $(grep -c '^task  *state  *restarts  *step  *steps/s  *loss  *CPU %  *RSS$' "$screen") -eq 1 ]] ||
  fail "expected exactly one table header on the screen"
tail -n 6 "$screen" >"$work/table.txt"
grep -qE '^dtfrun [0-9]+ \| done \| [0-9]{2}:[0-9]{2} \| bash ' "$work/table.txt" || fail "no title line"
grep -qE '^ps\.0 +done +0 +12 +52\.5 +0\.4880 +- +-$' "$work/table.txt" || fail "no row for ps.0"
grep -qE '^worker\.0 +done +0 +12 +52\.5 +0\.4880 +- +-$' "$work/table.txt" || fail "no row for worker.0"
grep -qE '^worker\.1 +done +1 +12 +52\.5 +0\.4880 +- +-$' "$work/table.txt" || fail "no row for worker.1 with its restart"
grep -qE '^chief worker\.0: \[#{10,}\] 12/12 100%$' "$work/table.txt" || fail "no full progress bar"

# More tasks than the terminal (40 rows) has rows: the table keeps to the screen and says
# how many rows it leaves out; it is still drawn once.
echo 'echo "step=3 last_step=10"' >"$work/short.sh"
"$py" "$term" 100 "$work/many.raw" "$work/many.screen" -- "$dtfrun" --workers 45 -- bash "$work/short.sh"
expect_rc 0 $? "live run of 45 tasks"
[[ $(grep -c '^task  *state ' "$work/many.screen") -eq 1 ]] || fail "45 tasks: the table was not redrawn cleanly"
tail -n 2 "$work/many.screen" | head -n 1 | grep -qx '\.\.\. 11 more tasks (dtfrun status shows all)' ||
  fail "45 tasks: no line for the rows left out"
tail -n 1 "$work/many.screen" | grep -q '^chief worker.0: \[#*\.*\] 3/10 30%$' || fail "45 tasks: no progress bar"

# Not a terminal: plain prefixed lines, no escape sequences, no table. Without a worker.1 the
# test fires the chief's event itself.
fire_event worker1_done &
"$dtfrun" --ps 1 --workers 1 -- bash "$work/task.sh" >"$work/plain.out" 2>&1
expect_rc 0 $? "plain run"
grep -q $'\x1b' "$work/plain.out" && fail "escape sequences in output that is not a terminal"
grep -q '^task ' "$work/plain.out" && fail "a table in output that is not a terminal"
# --no-live on a terminal: plain too.
fire_event worker1_done &
"$py" "$term" 100 "$work/nolive.raw" "$work/nolive.screen" -- "$dtfrun" --no-live --workers 1 -- bash "$work/task.sh"
expect_rc 0 $? "--no-live run"
grep -q $'\x1b' "$work/nolive.raw" && fail "escape sequences with --no-live"
echo PASS
