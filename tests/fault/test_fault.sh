#!/usr/bin/env bash
# The fault test: one ps and two workers (worker 0 is the chief), each training 13 epochs of its
# half of Fashion-MNIST, under `dtfrun --max-restarts 2`. While the run goes on, this script
# SIGKILLs
#   1. the ps        when the chief's log shows step >= 25% of the run; the restarted ps then
#                    SIGKILLs itself part-way through writing its shard of the next checkpoint
#                    (--ps_crash_at_restart 1), and the chief must restore the previous one,
#   2. worker 1      once the chief has restored the restarted ps and shows step >= 45%,
#   3. the chief     once worker 1 is back and the chief shows step >= 65%.
# The run must complete (dtfrun exit 0 and a RESULT line), its test accuracy must be within
# one point of an undisturbed run with the same seed and flags, restarts must redo no work (the
# examples every process trained on, killed ones included, add up to the undisturbed run's
# within one checkpoint interval's worth, and the restarted worker resumes its shard where it
# was), every checkpoint on disk must verify with dtf-ckpt (list and export work on the latest),
# and no process may be left. It prints examples, accuracy and wall time of both runs.
# Usage: test_fault.sh <dtfrun> <fault_trainer> <dtf-ckpt>
set -u
dtfrun=${1:?usage: $0 <dtfrun> <fault_trainer> <dtf-ckpt>}
trainer=${2:?usage: $0 <dtfrun> <fault_trainer> <dtf-ckpt>}
ckpt=${3:?usage: $0 <dtfrun> <fault_trainer> <dtf-ckpt>}
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_fault.XXXXXX")
run_pid=
cleanup() {
  [[ -n "$run_pid" ]] && kill -KILL "$run_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

source "$(dirname "$0")/../script_lib.sh"

epochs=13 batch=256 save_every=150
# 60000 examples over 2 training tasks: 118 batches an epoch each (the last one short).
per_epoch=$(( (30000 + batch - 1) / batch ))
last_step=$((epochs * 2 * per_epoch))  # the undisturbed run's final global step
flags=(--train_examples 0 --batch "$batch" --lr 0.03 --log_every 25 --epochs "$epochs" --save_every "$save_every"
       --keep 4 --seed 7 --timeout_ms 30000)
crash=(--ps_crash_at_restart 1 --ps_crash_save_bytes 100000)

# The latest step the chief printed, and the pid a task printed last (its latest start).
chief_step() { grep -E '^worker\.0 +\| ' "$work/faulty.log" | grep -oE ' step=[0-9]+' | tail -n 1 | cut -d= -f2; }
task_pid() { grep -E "^$1 +\| $1: pid=" "$work/faulty.log" | tail -n 1 | sed -E 's/.*pid=([0-9]+).*/\1/'; }
chief_past() { local s; s=$(chief_step); [[ -n "$s" ]] && ((s >= $1)); }
log_has() { grep -qE "$1" "$work/faulty.log"; }
restores_at_least() { (($(grep -cE '^ps\.0 +\| .*restored [0-9]+ shards from checkpoint' "$work/faulty.log") >= $1)); }
accuracy_of() { grep -E '^worker\.0 +\| RESULT ' "$1" | tail -n 1 | grep -oE 'accuracy=[0-9.]+' | cut -d= -f2; }
# Examples trained on by every start of task $2 in run $1 (each start kept its count in a file).
examples_of() { local n=0 f; for f in "$work/$1.examples.$2".*; do [[ -e "$f" ]] && n=$((n + $(tr -d ' \n' <"$f"))); done; echo "$n"; }
now() { date +%s.%N; }
seconds() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }
kill_task() {
  local pid
  pid=$(task_pid "$1")
  [[ -n "$pid" ]] || fail "no pid printed by $1"
  kill -0 "$pid" 2>/dev/null || fail "$1 (pid $pid) is not running"
  echo "killing $1 (pid $pid) at chief step $(chief_step)"
  kill -KILL "$pid"
}

# 1. The undisturbed run.
t0=$(now)
timeout 240 "$dtfrun" --ps 1 --workers 2 -- "$trainer" --checkpoint_dir "$work/clean" "${flags[@]}" \
  --examples_file "$work/clean.examples" >"$work/clean.log" 2>&1 || fail "the undisturbed run failed (exit $?)"
clean_wall=$(seconds "$t0" "$(now)")
clean=$(accuracy_of "$work/clean.log")
[[ -n "$clean" ]] || fail "no RESULT line in the undisturbed run"
clean_w0=$(examples_of clean worker.0) clean_w1=$(examples_of clean worker.1)
clean_examples=$((clean_w0 + clean_w1))
((clean_examples == epochs * 60000)) || fail "the undisturbed run trained $clean_examples examples, not $((epochs * 60000))"
echo "undisturbed: accuracy $clean, examples $clean_examples (worker.0 $clean_w0, worker.1 $clean_w1), wall ${clean_wall} s"

# 2. The same run with three SIGKILLs.
t0=$(now)
timeout 240 "$dtfrun" --ps 1 --workers 2 --max-restarts 2 --restart_delay_ms 200 -- "$trainer" \
  --checkpoint_dir "$work/faulty" "${flags[@]}" "${crash[@]}" --examples_file "$work/faulty.examples" \
  >"$work/faulty.log" 2>&1 &
run_pid=$!
wait_until 120 chief_past $((last_step / 4)) || fail "the chief never reached step $((last_step / 4))"
kill_task ps.0
wait_until 60 log_has 're-initialising from the latest checkpoint' || fail "the chief did not re-initialise the ps"
wait_until 60 log_has '^ps\.0 +\| .*restored [0-9]+ shards from checkpoint' || fail "the ps was not restored"
wait_until 60 log_has '^ps\.0 +\| ps\.0: pid=[0-9]+ restart=2' || fail "the ps did not crash during a save"
wait_until 60 restores_at_least 2 ||
  fail "the ps was not restored after crashing during a save"
wait_until 120 chief_past $((last_step * 45 / 100)) || fail "no progress after the ps restart"
kill_task worker.1
wait_until 60 log_has '^worker\.1 +\| worker\.1: pid=[0-9]+ restart=1' || fail "worker 1 was not restarted"
wait_until 60 log_has '^worker\.1 +\| worker\.1: session created' || fail "the restarted worker 1 did not rejoin"
wait_until 120 chief_past $((last_step * 65 / 100)) || fail "no progress after the worker restart"
kill_task worker.0
wait_until 60 log_has '^worker\.0 +\| worker\.0: pid=[0-9]+ restart=1' || fail "the chief was not restarted"
wait "$run_pid"
status=$?
run_pid=
faulty_wall=$(seconds "$t0" "$(now)")
((status == 0)) || fail "the disturbed run ended with exit status $status"
faulty=$(accuracy_of "$work/faulty.log")
[[ -n "$faulty" ]] || fail "no RESULT line in the disturbed run"
faulty_w0=$(examples_of faulty worker.0) faulty_w1=$(examples_of faulty worker.1)
faulty_examples=$((faulty_w0 + faulty_w1))
echo "disturbed: accuracy $faulty, examples $faulty_examples (worker.0 $faulty_w0, worker.1 $faulty_w1), wall ${faulty_wall} s"
# Restarts redo no work: every process's examples (killed ones included) add up to the
# undisturbed run's within one checkpoint interval's worth (save_every global steps of a batch).
interval=$((save_every * batch))
diff=$((faulty_examples - clean_examples))
((diff <= interval && diff >= -interval)) ||
  fail "the disturbed run trained $faulty_examples examples, $diff more than the undisturbed $clean_examples (one checkpoint interval: $interval)"
# The restarted worker 1 and chief resumed their shards where they were, not at the start.
for task in worker.1 worker.0; do
  grep -E "^$task +\| $task: data position epoch=[0-9]+ batch=[0-9]+ examples_before=[1-9][0-9]* " "$work/faulty.log" |
    tail -n 1 | grep -q . || fail "the restarted $task did not resume its data position"
done
python3 - "$clean" "$faulty" <<'PY' || fail "accuracy $faulty is not within one point of the undisturbed $clean"
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if abs(a - b) <= 0.01 else 1)
PY
restores=$(grep -cE '^ps\.0 +\| .*restored [0-9]+ shards from checkpoint' "$work/faulty.log")
((restores >= 3)) || fail "expected restores after both ps restarts and the chief restart, saw $restores"
# The save the ps died in never became a checkpoint: the restore after that crash used one
# that was complete (saved) before it.
python3 - "$work/faulty.log" <<'PY' || fail "the restore after the crash during a save did not use the previous checkpoint"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
crash = next(i for i, l in enumerate(lines) if re.match(r"ps\.0 +\| ps\.0: pid=\d+ restart=2", l))
restored = next(re.search(r"from checkpoint (\S+)", l).group(1) for l in lines[crash:]
                if re.match(r"ps\.0 +\| .*restored \d+ shards from checkpoint", l))
saved_before = {m.group(1) for l in lines[:crash] for m in [re.search(r"saved checkpoint (\S+)", l)] if m}
print("restored", restored, "after the crash during a save")
sys.exit(0 if restored in saved_before else 1)
PY
# The restarted chief resumed from the latest checkpoint: a restore sent by worker.0 after it came back.
python3 - "$work/faulty.log" <<'PY' || fail "the restarted chief did not restore the ps from the latest checkpoint"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
back = next(i for i, l in enumerate(lines) if re.match(r"worker\.0 +\| worker\.0: pid=\d+ restart=1", l))
restored = next(re.search(r"from checkpoint (\S+)", l).group(1) for l in lines[back:]
                if re.match(r"ps\.0 +\| .*restored \d+ shards from checkpoint .* sent by worker\.0", l))
saved = [m.group(1) for l in lines[:back] for m in [re.search(r"saved checkpoint (\S+)", l)] if m]
print("the restarted chief restored", restored)
# The latest one it announced (or a later one, committed just before the kill and not yet announced).
step = lambda name: int(name.rsplit("-", 1)[1])
sys.exit(0 if saved and step(restored) >= step(saved[-1]) else 1)
PY

# 3. Every checkpoint on disk verifies (every manifest, kept or not, and the state file's list).
for dir in "$work/clean" "$work/faulty"; do
  "$ckpt" verify "$dir" --all >"$work/verify.log" 2>&1 || fail "dtf-ckpt verify --all failed in $dir: $(cat "$work/verify.log")"
  n=0
  for m in "$dir"/*.manifest.json; do
    [[ -e "$m" ]] || continue
    name=$(basename "$m" .manifest.json)
    "$ckpt" verify "$dir" "$name" >>"$work/verify.log" 2>&1 || fail "checkpoint $name in $dir fails verification"
    n=$((n + 1))
  done
  ((n >= 1)) || fail "no checkpoint in $dir"
  echo "$dir: $n checkpoints verify"
done
"$ckpt" list "$work/faulty" >"$work/list.log" 2>&1 || fail "dtf-ckpt list failed"
grep -qE '^dense_0/kernel +\[784, 256\] +float32 +200704 ' "$work/list.log" || fail "dtf-ckpt list: $(cat "$work/list.log")"
"$ckpt" export "$work/faulty" dense_2/bias "$work/bias.npy" >/dev/null 2>&1 || fail "dtf-ckpt export failed"
python3 - "$work/bias.npy" <<'PY' || fail "the exported .npy is malformed"
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x93NUMPY\x01\x00", data[:8]
hlen = struct.unpack("<H", data[8:10])[0]
header = data[10:10 + hlen].decode()
assert "'descr': '<f4'" in header and "'shape': (10,)" in header, header
values = struct.unpack("<10f", data[10 + hlen:])
assert all(abs(v) < 100 for v in values) and any(v != 0 for v in values), values
PY

# dtf-ckpt refuses a damaged copy, naming the file (exit status 1).
cp -r "$work/faulty" "$work/damaged"
shard=$(ls "$work"/damaged/*.shard | tail -n 1)
printf '\x7f' | dd of="$shard" bs=1 seek=100 conv=notrunc status=none
name=$(basename "$shard" | sed -E 's/\.ps-.*//')
"$ckpt" verify "$work/damaged" "$name" >"$work/damaged.out" 2>&1
[[ $? == 1 ]] && grep -q "$(basename "$shard"): SHA-256" "$work/damaged.out" || fail "damaged checkpoint: $(cat "$work/damaged.out")"

# dtf-ckpt's own errors: an unknown variable names the ones there are (exit 1); bad usage exits 2.
"$ckpt" export "$work/faulty" dense_9/kernel "$work/x.npy" >"$work/ckpt_err.out" 2>&1
[[ $? == 1 ]] && grep -q "has no variable 'dense_9/kernel' (it has: dense_0/kernel" "$work/ckpt_err.out" ||
  fail "dtf-ckpt export of an unknown variable: $(cat "$work/ckpt_err.out")"
"$ckpt" frobnicate >"$work/ckpt_err.out" 2>&1
[[ $? == 2 ]] && grep -q "unknown command 'frobnicate'" "$work/ckpt_err.out" || fail "dtf-ckpt usage: $(cat "$work/ckpt_err.out")"

# 4. No process left behind.
no_leftovers() { ! pgrep -f -- "$work/" >/dev/null; }  # pgrep never lists itself; this script's command line does not name $work
wait_until 10 no_leftovers || fail "processes left behind: $(pgrep -af -- "$work/")"
echo "PASS: undisturbed accuracy $clean, $clean_examples examples, ${clean_wall} s;" \
  "disturbed accuracy $faulty, $faulty_examples examples ($diff more), ${faulty_wall} s"
