#!/usr/bin/env bash
# The standard session of the ps examples (dtf::train, dtf/train.hpp) end to end, under dtfrun
# with one ps and two workers on a small subset:
#   1. sync_sgd with --model_dir: progress lines carry dtfrun's tokens, checkpoints are written,
#      and TensorBoard's reader finds loss, learning rate, steps/s, contributions and dropped
#      gradients as scalars and the variables as histograms;
#   2. the same command with --num_steps 12 resumes from the latest checkpoint and trains 12
#      more global steps;
#   3. agn and sync_sgd stopped with Ctrl-C (dtfrun: SIGTERM to the chief): the chief saves a
#      checkpoint and ends the job at once (exit 0, RESULT line); agn's summaries carry the
#      staleness;
#   4. agn under dtfrun --max-restarts ps=1 with --max_recoveries: the ps is SIGKILLed mid-run,
#      restarted, restored from the latest checkpoint by the chief; both workers recover and
#      train on; stopped with Ctrl-C, the chief ends the job normally.
#
#   test_example_session.sh <dtfrun> <examples dir> <venv_dir>
set -u
dtfrun=$1 examples=$2 venv=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_session.XXXXXX")
bg=()
trap 'for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$work"' EXIT

source "$here/../script_lib.sh"

bash "$here/ensure_venv.sh" "$venv" || fail "no TensorBoard virtual environment"
py="$venv/bin/python"
small=(--train_examples 4000 --batch 32 --log_every 10)

# 1. A fresh run.
dir="$work/sync"
timeout 120 "$dtfrun" --ps 1 --workers 2 -- "$examples/sync_sgd" --epochs 1 "${small[@]}" --model_dir "$dir" \
  --summary_every 5 --save_checkpoints_steps 20 >"$work/sync1.log" 2>&1 || fail "sync_sgd failed"
grep -q "^worker.0 *| worker.0: step=[0-9]* last_step=[0-9]* loss=[0-9.]* steps_per_sec=" "$work/sync1.log" ||
  fail "no progress line with step=, last_step=, loss=, steps_per_sec="
first_end=$(sed -n 's/.*worker.0: done at global step \([0-9]*\);.*/\1/p' "$work/sync1.log")
[[ -n "$first_end" && -f "$dir/checkpoint" ]] || fail "no final step or no checkpoint state file"
ls "$dir"/ckpt-"$first_end".manifest.json >/dev/null 2>&1 || fail "no checkpoint at the final step $first_end: $(ls "$dir")"
"$py" "$here/check_logdir.py" "$dir" 1 loss learning_rate global_step/sec examples/sec contributions \
  dropped_gradients 2>/dev/null || fail "TensorBoard does not see the sync run's summaries"

# 2. Resume: 12 more global steps from the latest checkpoint.
timeout 120 "$dtfrun" --ps 1 --workers 2 -- "$examples/sync_sgd" --epochs 1 "${small[@]}" --model_dir "$dir" \
  --summary_every 5 --num_steps 12 >"$work/sync2.log" 2>&1 || fail "the resumed sync_sgd failed"
grep -q "restored .* (global step $first_end)" "$work/sync2.log" || fail "the ps was not restored from step $first_end"
grep -q "worker.1: training to global step $((first_end + 12)) (from $first_end)" "$work/sync2.log" ||
  fail "worker.1 did not resume at $first_end towards $((first_end + 12))"
grep -q "worker.0: done at global step $((first_end + 12));" "$work/sync2.log" || fail "the resumed run did not stop at $((first_end + 12))"
[[ -f "$dir/ckpt-$((first_end + 12)).manifest.json" ]] || fail "no checkpoint at the resumed run's end"
"$py" "$here/check_logdir.py" "$dir" $((first_end + 1)) loss learning_rate 2>/dev/null ||
  fail "TensorBoard does not see the resumed summaries"

# 3. Ctrl-C: dtfrun's first SIGINT sends SIGTERM to the chief, which stops after its step,
#    saves a checkpoint and ends the job at once (RESULT line, ps shut down); the job ends
#    within a bounded time even though the other workers were still training.
stop_run() {  # stop_run <name> <example> <args...>: trains until global step 5, then Ctrl-C
  local name=$1 example=$2
  shift 2
  dir="$work/$name"
  "$dtfrun" --ps 1 --workers 2 --grace_ms 1000 -- "$examples/$example" --epochs 200 "${small[@]}" --model_dir "$dir" \
    --summary_every 5 "$@" >"$work/$name.log" 2>&1 &
  bg+=($!)
  local pid=$!
  wait_until 60 grep -q "worker.1: step=" "$work/$name.log" || fail "$name never trained"
  # Until the chief has seen global step 5 or more (so that summaries past step 0 exist).
  wait_until 60 grep -Eq "worker.0: step=([5-9]|[1-9][0-9]+) " "$work/$name.log" || fail "$name's chief never trained"
  kill -INT "$pid"
  wait_until 60 bash -c "! kill -0 $pid 2>/dev/null" || fail "$name did not end within 60 s of Ctrl-C"
  wait "$pid"
  local status=$?
  ((status == 130)) || fail "dtfrun exited with $status after Ctrl-C (expected 130)"
  grep -q "worker.0 (chief) ended (exit status 0) after the stop request" "$work/$name.log" ||
    fail "$name's chief did not end normally after the stop request"
  grep -q "^worker.0 *| RESULT scheme=$example" "$work/$name.log" || fail "no RESULT line after the stop"
  saved=$(ls "$dir"/ckpt-*.manifest.json | sed 's/.*ckpt-\([0-9]*\)\.manifest.json/\1/' | sort -n | tail -n 1)
  ((saved > 0)) || fail "$name's chief saved no checkpoint after step 0"
}
stop_run agn agn
agn_saved=$saved
"$py" "$here/check_logdir.py" "$dir" 1 loss learning_rate staleness_mean staleness_max 2>/dev/null ||
  fail "TensorBoard does not see the agn run's summaries"
stop_run sync_stop sync_sgd
sync_saved=$saved

# 4. A lost ps, restarted by dtfrun, restored by the chief; the workers carry on.
dir="$work/recover"
"$dtfrun" --ps 1 --workers 2 --max-restarts ps=1 --grace_ms 1000 -- "$examples/agn" --epochs 200 "${small[@]}" \
  --model_dir "$dir" --save_checkpoints_steps 5 --max_recoveries 3 >"$work/recover.log" 2>&1 &
bg+=($!)
dtfrun_pid=$!
wait_until 60 grep -q "worker.1: step=" "$work/recover.log" || fail "agn never trained"
has_checkpoint() { ls "$dir" 2>/dev/null | grep -q "^ckpt-[1-9][0-9]*\.manifest\.json$"; }
wait_until 60 has_checkpoint || fail "no checkpoint after step 0"
ps_pid=$(sed -n "s/^dtfrun: started ps.0 (pid \([0-9]*\)).*/\1/p" "$work/recover.log")
kill -KILL "$ps_pid"
for t in worker.0 worker.1; do
  # A reconnect that meets the ps still restarting fails and counts as a recovery of its own
  # (a loaded machine), so any count within --max_recoveries is a recovery.
  wait_until 60 grep -qE "$t: recovered \(recovery [1-3]\)" "$work/recover.log" || fail "$t did not recover"
done
grep -q "restored 6 shards from checkpoint" "$work/recover.log" || fail "the restarted ps was not restored"
n=$(grep -c "worker.1: step=" "$work/recover.log")
wait_until 60 bash -c "(( \$(grep -c 'worker.1: step=' '$work/recover.log') > $n ))" || fail "worker.1 did not train on"
kill -INT "$dtfrun_pid"
wait_until 60 bash -c "! kill -0 $dtfrun_pid 2>/dev/null" || fail "the recovered job did not end within 60 s of Ctrl-C"
wait "$dtfrun_pid"
status=$?
((status == 130)) || fail "dtfrun exited with $status after Ctrl-C (expected 130)"
grep -q "worker.0 (chief) ended (exit status 0) after the stop request" "$work/recover.log" ||
  fail "the recovered chief did not end normally"
grep -q "^worker.0 *| RESULT scheme=agn" "$work/recover.log" || fail "no RESULT line after the recovery"

echo "PASS: resumed at $first_end; Ctrl-C saved agn at $agn_saved and sync_sgd at $sync_saved; recovered from a lost ps"
