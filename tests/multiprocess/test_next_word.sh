#!/usr/bin/env bash
# The next_word example (an embedding table sharded over the ps) trains under dtfrun with 2 ps
# and 2 workers on the first 3,000 verses: both ps hold a shard of the table, each worker
# gathers and pushes rows, the held-out perplexity is reported beside the n-gram baselines and
# is below the unigram's (the full run, README's table, is measured against the bigram).
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
line=$(grep -o "held-out perplexity: model [0-9.]*, bigram [0-9.]*, unigram [0-9.]*" "$log") ||
  fail "no perplexity line"
read -r model bigram unigram < <(echo "$line" | sed 's/[^0-9. ]//g' | awk '{print $1, $2, $3}')
echo "model $model bigram $bigram unigram $unigram"
awk -v m="$model" -v u="$unigram" 'BEGIN { exit !(m > 1 && m < u) }' ||
  fail "the model's perplexity $model is not below the unigram's $unigram"
echo "PASS"
