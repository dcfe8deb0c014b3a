#!/usr/bin/env bash
# ring_allreduce under dtfrun --workers 2 in the standard session (dtf::train, dtf/train.hpp,
# and dtf/hooks/collective_restore.hpp): rank 0 writes checkpoints that dtf-ckpt verifies and TensorBoard event
# files under --model_dir; a second run with the same --model_dir restores every rank from the
# latest checkpoint and trains --num_steps more steps.
# Usage: test_ring_allreduce_resume.sh <dtfrun> <examples dir> <dtf-ckpt>
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
ckpt=${3:?usage: $0 <dtfrun> <examples dir> <dtf-ckpt>}
model="$work/model"
common=(--train_examples 6000 --log_every 10 --model_dir "$model" --timeout_ms 20000)

"$dtfrun" --workers 2 --timeout_s 60 -- "$dir/ring_allreduce" "${common[@]}" --epochs 1 \
  --save_checkpoints_steps 20 --summary_every 10 >"$work/first.log" 2>&1 || fail "first run failed (status $?)"
grep -q "RESULT scheme=ring_allreduce workers=2" "$work/first.log" || fail "first run: no RESULT line"
"$ckpt" verify "$model" --all >"$work/verify.log" 2>&1 || fail "dtf-ckpt verify failed"
cat "$work/verify.log"
first=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["latest"])' "$model/checkpoint") \
  || fail "no state file"
step=${first#ckpt-}
[[ "$step" =~ ^[0-9]+$ && "$step" -gt 20 ]] || fail "latest checkpoint '$first' is not the final step"
grep -q "global_step $step " "$work/first.log" || fail "the final checkpoint $first is not the final global step"
(($(grep -c ": OK" "$work/verify.log") >= 3)) || fail "expected checkpoints at the start, every 20 steps and the end"
"$ckpt" list "$model" | grep -q "rule adam (2 slots)" || fail "the checkpoint lacks Adam's slots"
"$ckpt" export "$model" dense_2/bias "$work/bias.npy" --slot 1 >/dev/null || fail "dtf-ckpt export failed"
events=("$model"/events.out.tfevents.*)
[[ -s "${events[0]}" ]] || fail "no TensorBoard event file under --model_dir"
((${#events[@]} == 1)) || fail "event files from more than rank 0: ${events[*]}"

"$dtfrun" --workers 2 --timeout_s 60 -- "$dir/ring_allreduce" "${common[@]}" --epochs 1 --num_steps 10 \
  >"$work/resume.log" 2>&1 || fail "resumed run failed (status $?)"
for w in 0 1; do
  grep -q "worker.$w: restored $first from $model (global step $step)" "$work/resume.log" \
    || fail "worker.$w did not restore $first"
done
end=$((step + 10))
grep -q "worker.0: final test accuracy .* global_step $end " "$work/resume.log" || fail "resumed run did not end at step $end"
grep -q "last_step=$end " "$work/resume.log" || fail "progress lines lack last_step=$end"
"$ckpt" verify "$model" "ckpt-$end" || fail "the resumed run's final checkpoint does not verify"
diff <(grep -o 'worker.0: step=.*loss=[0-9.]*' "$work/resume.log" | sed 's/worker.0: //') \
     <(grep -o 'worker.1: step=.*loss=[0-9.]*' "$work/resume.log" | sed 's/worker.1: //') >/dev/null \
  || fail "the resumed workers' averaged losses differ"
grep -o 'RESULT.*' "$work/resume.log"
echo "PASS"
