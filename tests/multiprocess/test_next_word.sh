#!/usr/bin/env bash
# The next_word example (an embedding table sharded over the ps) trains under dtfrun with 2 ps
# and 2 workers on the first 3,000 verses: both ps hold a shard of the table, each worker
# gathers and pushes rows, the held-out perplexity is reported beside the n-gram baselines and
# is below the unigram's (the full run, docs/benchmarks.md's table, is measured against the bigram); the
# same with SyncSGD (rows averaged over both workers each step).
# Then the table's checkpoint: a run of 2 ps and 1 worker saves into --model_dir, and a run of
# 3 ps restores it (the rows re-routed to 3 shards) and, stopped at the saved step, evaluates to
# exactly the saved run's perplexity and accuracy; dtf-ckpt lists the table.
# Usage: test_next_word.sh <dtfrun> <next_word>
source "$(dirname "$0")/lib.sh"
log="$work/next_word.log"
"$dtfrun" --ps 2 --workers 2 --grace_ms 20000 -- "$example" --max_verses 3000 --epochs 2 --log_every 100 \
  >"$log" 2>&1 || { cat "$log"; fail "next_word failed (status $?)"; }
for t in ps.0 ps.1; do
  grep -q "^$t .*embedding 'words' ([0-9]* rows x 48, 2 shards) created by worker.0" "$log" ||
    fail "$t holds no shard of the table"
  grep -q "^$t .*shut down by the chief" "$log" || fail "$t did not exit by itself"
done
grep -q "worker.1 .*done after .* pushes" "$log" || fail "worker.1 did not train"
# The run's held-out perplexity (log $1, named $2) is printed and below the unigram's.
below_unigram() {
  local line model bigram unigram
  line=$(grep -o "held-out perplexity: model [0-9.]*, bigram [0-9.]*, unigram [0-9.]*" "$1") ||
    fail "$2: no perplexity line"
  read -r model bigram unigram < <(echo "$line" | sed 's/[^0-9. ]//g' | awk '{print $1, $2, $3}')
  echo "$2: model $model bigram $bigram unigram $unigram"
  awk -v m="$model" -v u="$unigram" 'BEGIN { exit !(m > 1 && m < u) }' ||
    fail "$2: the model's perplexity $model is not below the unigram's $unigram"
}
below_unigram "$log" hogwild

# SyncSGD (--sync_replicas 2): both workers' rows averaged and applied with each step, no
# contribution dropped, every step counted once per worker.
"$dtfrun" --ps 2 --workers 2 --grace_ms 20000 -- "$example" --max_verses 3000 --epochs 2 --log_every 100 \
  --sync_replicas 2 >"$work/sync.log" 2>&1 || { cat "$work/sync.log"; fail "next_word --sync_replicas 2 failed"; }
result=$(grep "RESULT scheme=next_word" "$work/sync.log") || fail "no RESULT line from the synchronous run"
steps=$(grep -o "training to global step [0-9]*" "$work/sync.log" | head -n 1 | grep -o "[0-9]*$")
[[ "$result" == *"contributions=$steps dropped=0"* ]] || fail "synchronous run: '$result' (expected $steps contributions)"
below_unigram "$work/sync.log" sync_sgd

ckpt="$work/ckpt"
"$dtfrun" --ps 2 --workers 1 --grace_ms 20000 -- "$example" --max_verses 1000 --epochs 1 --log_every 100 \
  --model_dir "$ckpt" >"$work/save.log" 2>&1 || { cat "$work/save.log"; fail "the saving run failed"; }
final=$(grep -o "final test accuracy [0-9.]*  test_loss [0-9.]*  global_step [0-9]*" "$work/save.log") ||
  fail "the saving run printed no final evaluation"
step=${final##* }
"$(dirname "$dtfrun")/dtf-ckpt" list "$ckpt" >"$work/list.log" 2>&1 || { cat "$work/list.log"; fail "dtf-ckpt list failed"; }
grep -q "words" "$work/list.log" || fail "dtf-ckpt list does not show the table"
"$dtfrun" --ps 3 --workers 1 --grace_ms 20000 -- "$example" --max_verses 1000 --epochs 1 --log_every 100 \
  --model_dir "$ckpt" --last_step "$step" >"$work/restore.log" 2>&1 ||
  { cat "$work/restore.log"; fail "the restoring run failed"; }
grep -q "resumed from the checkpoint at global step $step" "$work/restore.log" || fail "no resume at step $step"
again=$(grep -o "final test accuracy [0-9.]*  test_loss [0-9.]*  global_step [0-9]*" "$work/restore.log")
[[ "$again" == "$final" ]] || fail "restored into 3 ps: '$again', saved: '$final'"
echo "restored into 3 ps: $again"
echo "PASS"
