#!/usr/bin/env bash
# examples/torch_transformer under dtfrun, briefly: the LibTorch Transformer next-word model on
# the first 3,000 verses of the King James text, 6,400 training examples (100 batches of 64
# over the job), trained by ring_allreduce over 2 processes or by DOWNPOUR through 1 ps with 2
# workers. It must train: the chief's test perplexity after training (also perplexity= on its
# RESULT line) below the uniform distribution's over the vocabulary and below the untrained
# model's (the parameters before the first step), all three on the chief's last line. The full figures
# are in docs/benchmarks.md.
# Usage: test_torch_transformer.sh <dtfrun> <torch_transformer> ring_allreduce|downpour
set -u
dtfrun=${1:?usage: $0 <dtfrun> <torch_transformer> ring_allreduce|downpour}
example=${2:?usage: $0 <dtfrun> <torch_transformer> ring_allreduce|downpour}
strategy=${3:?usage: $0 <dtfrun> <torch_transformer> ring_allreduce|downpour}
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_torch_transformer.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../script_lib.sh"
case $strategy in
  ring_allreduce) cluster=(--workers 2) ;;
  downpour) cluster=(--ps 1 --workers 2) ;;
  *) echo "test_torch_transformer.sh: unknown strategy '$strategy'" >&2; exit 2 ;;
esac
log=$work/$strategy.log
OMP_NUM_THREADS=1 "$dtfrun" "${cluster[@]}" --no-live --timeout_s 240 -- "$example" --strategy "$strategy" \
  --max_verses 3000 --train_examples 6400 --log_every 50 >"$log" 2>&1 || fail "$strategy: status $?"
grep -q "RESULT scheme=torch_transformer_$strategy .* perplexity=[0-9.]*$" "$log" || fail "$strategy: no perplexity on the RESULT line"
line=$(grep -o "test perplexity [0-9.]* trained, [0-9.]* untrained, [0-9]* uniform" "$log") ||
  fail "$strategy: no perplexity line"
read -r trained untrained uniform < <(echo "$line" | sed 's/[^0-9. ]//g' | awk '{print $1, $2, $3}')
awk -v t="$trained" -v u="$uniform" -v i="$untrained" 'BEGIN { exit !(t >= 1 && t < u && t < i) }' ||
  fail "$strategy: test perplexity $trained is not below the uniform $uniform and the untrained $untrained"
echo "PASS: $strategy: test perplexity $trained (uniform $uniform, untrained $untrained)"
