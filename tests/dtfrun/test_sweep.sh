# dtfrun sweep: every combination of the grid runs once, in its own directory with its log,
# with --KEY VALUE flags and --metrics_file appended, at most --parallel at a time; the table
# (printed and saved as results.csv) is sorted by the chosen metric; failed runs are rows
# with their status and the sweep goes on. A sweep of clusters (CMD = dtfrun ...) passes the
# flags to the program. SIGINT and SIGKILL leave no run behind.
source "$(dirname "$0")/lib.sh"

# The "training program": records its arguments, how many runs are active at once, and
# writes accuracy/loss from the flags; lr=0.3 with batch=64 fails; lr=0.3 with batch=32
# writes no metrics file.
mkdir "$work/active"
cat >"$work/prog.sh" <<'PROG'
#!/bin/bash
echo "args: $*"
echo "run dir: $DTF_RUN_DIR"
while [[ $# -gt 0 ]]; do
  case $1 in
    --lr) lr=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --metrics_file) metrics=$2; shift 2 ;;
    *) shift ;;
  esac
done
me="$work/active/$$"
touch "$me"
# Parallel runs overlap for sure: the first run to find itself alone waits (bounded) for the
# event "overlap", which the first run to find two active fires.
role=$( (
  flock 9
  n=$(ls "$work/active" | wc -l)
  echo "$n" >>"$work/concurrency"
  if ((n >= 2)); then
    [[ -e "$work/overlapped" ]] || { touch "$work/overlapped"; [[ -e "$work/waiting" ]] && echo fire; }
  elif [[ ! -e "$work/overlapped" && ! -e "$work/waiting" ]]; then
    touch "$work/waiting"
    echo wait
  fi
) 9>"$work/lock")
case $role in
  fire) "$py" "$events" fire "$work/overlap" ;;
  wait) "$py" "$events" wait "$work/overlap" --timeout 10 ;;
esac
rm -f "$me"
[[ "$lr" == 0.3 && "$batch" == 64 ]] && { echo "diverged" >&2; exit 3; }
[[ "$lr" == 0.3 ]] && exit 0
accuracy=$("$py" -c "print(round(0.9 - abs($lr - 0.03) - $batch / 1000, 4))")
loss=$("$py" -c "print(round(0.1 + abs($lr - 0.03) + $batch / 1000, 4))")
printf '{"accuracy": %s, "loss": %s, "global_step": 100, "wall_s": 0.5, "note": "text is ignored"}\n' \
  "$accuracy" "$loss" >"$metrics.tmp" && mv "$metrics.tmp" "$metrics"
PROG
chmod +x "$work/prog.sh"
new_event overlap

out="$work/sweep1"
"$dtfrun" sweep --grid lr=0.1,0.03,0.3 --grid batch=32,64 --parallel 2 --out "$out" -- "$work/prog.sh" --fixed x \
  >"$work/sweep1.out" 2>"$work/sweep1.err"
expect_rc 1 $? "a sweep with a failed run"
# Six runs, each in its own directory, with the flags appended after the command's own.
for lr in 0.1 0.03 0.3; do
  for batch in 32 64; do
    dir=$(ls -d "$out"/*_lr=${lr}_batch=$batch 2>/dev/null)
    [[ -d "$dir" ]] || fail "no run directory for lr=$lr batch=$batch"
    expect_line "$dir/log.txt" "args: --fixed x --lr $lr --batch $batch --metrics_file $dir/metrics.json"
    expect_line "$dir/log.txt" "run dir: $dir"
  done
done
[[ $(ls -d "$out"/*_lr=* | wc -l) -eq 6 ]] || fail "expected 6 run directories"
grep -qx diverged "$out"/*_lr=0.3_batch=64/log.txt || fail "stderr of a run is not in its log"
# At most two at a time, and two did run together.
max=$(sort -n "$work/concurrency" | tail -n 1)
[[ "$max" -eq 2 ]] || fail "at most 2 runs at a time expected, and 2 at some point; saw up to $max"
# The table: sorted by accuracy (descending by default), the failures last in run order;
# elapsed_s is measured, so only its form is checked.
cat >"$work/expected.csv" <<CSV
run,lr,batch,status,elapsed_s,accuracy,loss,global_step,wall_s,dir
3,0.03,32,ok,S,0.868,0.132,100,0.5,$out/003_lr=0.03_batch=32
4,0.03,64,ok,S,0.836,0.164,100,0.5,$out/004_lr=0.03_batch=64
1,0.1,32,ok,S,0.798,0.202,100,0.5,$out/001_lr=0.1_batch=32
2,0.1,64,ok,S,0.766,0.234,100,0.5,$out/002_lr=0.1_batch=64
5,0.3,32,no metrics file,S,,,,,$out/005_lr=0.3_batch=32
6,0.3,64,exit 3,S,,,,,$out/006_lr=0.3_batch=64
CSV
sed -E 's/^([^,]*,[^,]*,[^,]*,[^,]*),[0-9]+\.[0-9],/\1,S,/' "$out/results.csv" >"$work/got.csv"
diff "$work/expected.csv" "$work/got.csv" >"$work/csv.diff" || fail "results.csv differs: $(cat "$work/csv.diff")"
# The same table is printed, aligned.
grep -qE '^run +lr +batch +status +elapsed_s +accuracy +loss +global_step +wall_s$' "$work/sweep1.out" ||
  fail "no table header printed"
[[ $(sed -n 2p "$work/sweep1.out" | awk '{print $1, $2, $3, $4}') == "3 0.03 32 ok" ]] || fail "the best run is not first"
expect_line "$work/sweep1.err" "dtfrun: sweep: 4 of 6 runs succeeded; table saved as $out/results.csv"
grep -q '^dtfrun: sweep: \[6/6\] lr=0.3 batch=64: exit status 3 after ' "$work/sweep1.err" || fail "no line for the failed run"

# --sort loss:asc; all runs succeed: exit 0. A sweep over clusters: the flags reach the
# program through the inner dtfrun, whose chief (worker.0) writes the metrics.
cat >"$work/chief_only.sh" <<'PROG'
#!/bin/bash
[[ "$DTF_TASK" == worker.0 ]] || exit 0
exec "$work/prog.sh" "$@"
PROG
chmod +x "$work/chief_only.sh"
rm -f "$work/concurrency" "$work/overlapped" "$work/waiting"
new_event overlap
out="$work/sweep2"
"$dtfrun" sweep --grid lr=0.1,0.03 --grid=batch=32 --sort loss:asc --parallel=2 --out "$out" -- \
  "$dtfrun" --ps 1 --workers 2 -- "$work/chief_only.sh" >"$work/sweep2.out" 2>"$work/sweep2.err"
expect_rc 0 $? "a sweep of clusters"
[[ $(sed -n 2p "$work/sweep2.out" | awk '{print $1, $4, $6}') == "2 ok 0.132" ]] || fail "sweep 2: lowest loss not first"
[[ $(sed -n 3p "$work/sweep2.out" | awk '{print $1, $4, $6}') == "1 ok 0.202" ]] || fail "sweep 2: second row wrong"
grep -q '^worker.0 | args: --lr 0.1 --batch 32 --metrics_file ' "$out"/001_*/log.txt || fail "the inner dtfrun's output is not in the run's log"
expect_line "$work/sweep2.err" "dtfrun: sweep: 2 of 2 runs succeeded; table saved as $out/results.csv"

# A malformed metrics file and a run over --timeout_s are rows with their status too.
cat >"$work/odd.sh" <<'PROG'
#!/bin/bash
case "$2" in
  bad) echo '{"accuracy": 0.5,' >"$4" ;;
  slow) exec "$py" "$events" park "$tok.slow" ;;
esac
PROG
chmod +x "$work/odd.sh"
out="$work/sweep5"
"$dtfrun" sweep --grid case=bad,slow --parallel 2 --timeout_s 1 --out "$out" -- "$work/odd.sh" \
  >"$work/sweep5.out" 2>"$work/sweep5.err"
expect_rc 1 $? "a sweep with a bad metrics file and a timeout"
grep -q '^1,bad,bad metrics file,' "$out/results.csv" || fail "the malformed metrics file is not reported"
grep -q '^2,slow,timed out,' "$out/results.csv" || fail "the run over its time limit is not reported"
grep -q "sweep: \[1/2\] case=bad: $out/001_case=bad/metrics.json: invalid JSON at offset" "$work/sweep5.err" ||
  fail "no message for the malformed metrics file"
expect_line "$work/sweep5.err" "dtfrun: sweep: [2/2] case=slow: time limit of 1 s reached; sending SIGTERM"
expect_no_tasks_left

# Numbers JSON does not allow ('+1', '01', '.5') make a metrics file malformed as well: a "bad
# metrics file" row, and a message naming the file and where it goes wrong; 0.5 is read.
cat >"$work/lax.sh" <<'PROG'
#!/bin/bash
printf '{"accuracy": %s}\n' "$2" >"$4"
PROG
chmod +x "$work/lax.sh"
out="$work/sweep6"
"$dtfrun" sweep --grid accuracy=+1,01,.5,0.5 --out "$out" -- "$work/lax.sh" >"$work/sweep6.out" 2>"$work/sweep6.err"
expect_rc 1 $? "a sweep with metrics that are not JSON numbers"
grep -q '^4,0.5,ok,[0-9.]*,0.5,' "$out/results.csv" || fail "the well-formed metrics file is not read: $(cat "$out/results.csv")"
k=0
for value in +1 01 .5; do
  k=$((k + 1))
  grep -qF "$k,$value,bad metrics file," "$out/results.csv" || fail "'accuracy: $value' is not a bad metrics file"
  grep -qE "^dtfrun: sweep: \[$k/4\] accuracy=[^ ]*: $out/00${k}_[^ ]*/metrics.json: invalid JSON at offset [0-9]+ \(line 1, column [0-9]+\): syntax error" \
    "$work/sweep6.err" || fail "no message naming the metrics file and the error for 'accuracy: $value'"
done

# SIGINT: passed on to the running runs, no new run starts, the table lists what happened,
# exit 130, nothing left running.
set -m
cat >"$work/forever.sh" <<TASK
#!/bin/bash
$forever
TASK
chmod +x "$work/forever.sh"
out="$work/sweep3"
"$dtfrun" sweep --grid a=1,2,3 --parallel 2 --out "$out" -- "$work/forever.sh" >"$work/sweep3.out" 2>"$work/sweep3.err" &
bg_pid=$!
ready2() { [[ $(grep -c '^ready$' "$out"/*/log.txt 2>/dev/null | grep -c ':1$') -eq 2 ]]; }
wait_until 20 ready2 || fail "two runs did not start"
kill -INT "$bg_pid"
wait "$bg_pid"
expect_rc 130 $? "SIGINT to a sweep"
bg_pid=""
expect_line "$work/sweep3.err" "dtfrun: sweep: received SIGINT; passing it on to the running runs and starting no more (SIGINT again kills them)"
[[ $(grep -c ',killed by SIGINT,' "$out/results.csv") -eq 2 ]] || fail "the interrupted runs are not in the table"
grep -q '^3,3,not run,' "$out/results.csv" || fail "the run never started is not in the table"
expect_no_tasks_left

# SIGKILL to the sweep: its runs die with it.
out="$work/sweep4"
"$dtfrun" sweep --grid a=1,2 --parallel 2 --out "$out" -- "$work/forever.sh" >"$work/sweep4.out" 2>"$work/sweep4.err" &
bg_pid=$!
wait_until 20 tasks_running 2 || fail "two runs did not start"
kill -KILL "$bg_pid"
wait "$bg_pid" 2>/dev/null
bg_pid=""
expect_no_tasks_left
echo PASS
