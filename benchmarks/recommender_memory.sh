#!/usr/bin/env bash
# Worker memory against table size (issue 43's target "worker memory independent of table size"):
# the hybrid job of examples/recommender (1 ps, 2 workers, worker 0 the chief) trained twice on
# synthetic logs of the same size, once with a small table (vocabulary 100 per column, at most
# 2^16 rows) and once with a large one (vocabulary 2^20 per column, at most 50M rows), and the
# peak resident memory (max RSS, GNU time's %M) of every task printed side by side. The ps holds
# the rows, so its memory grows with the rows the logs create; a worker holds its logs, the dense
# MLP and one batch's rows, so its memory should not. A benchmark, not a test.
#
#   benchmarks/recommender_memory.sh [BUILD_DIR] [OUT_DIR]
# Environment: EXAMPLES [100000], EPOCHS [1], BATCH [256].
set -euo pipefail
build=${1:-build}
out=${2:-$build/recommender_memory}
examples=${EXAMPLES:-100000}
epochs=${EPOCHS:-1}
batch=${BATCH:-256}
example="$build/examples/recommender"
[ -x "$example" ] || { echo "recommender_memory.sh: $example is not built" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "recommender_memory.sh: needs GNU time (apt-get install time)" >&2; exit 1; }
mkdir -p "$out"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $examples examples, $epochs epoch(s), batch $batch"
echo "| table | vocabulary | max_rows | ps max RSS MiB | worker 0 (chief) max RSS MiB | worker 1 max RSS MiB | AUC |"
echo "|---|---|---|---|---|---|---|"
run() {
  local name=$1 vocabulary=$2 max_rows=$3 log="$out/$1.log"
  # each task reports its own peak RSS on exit (GNU time writes it to the task's stderr)
  "$build/tools/dtfrun" --grace_ms 30000 --ps 1 --workers 2 -- /usr/bin/time -f "maxrss_kb=%M" \
    "$example" --synthetic "$examples" --vocabulary "$vocabulary" --max_rows "$max_rows" --data_seed 1 \
    --strategy hybrid --epochs "$epochs" --batch "$batch" --log_every 1000000 --summary_every 0 \
    --save_checkpoints_secs 0 >"$log" 2>&1 || { echo "| $name | failed: see $log | | | | | |"; return; }
  rss() { awk -v t="$1" '$1 == t && /maxrss_kb=/ { sub(/.*maxrss_kb=/, ""); printf "%.1f", $1 / 1024 }' "$log" | tail -n 1; }
  local auc
  auc=$(grep -o 'RESULT .*' "$log" | sed -n 's/.* auc=\([^ ]*\).*/\1/p' | tail -n 1)
  echo "| $name | $vocabulary | $max_rows | $(rss ps.0) | $(rss worker.0) | $(rss worker.1) | ${auc:-?} |"
}
run small 100 65536
run large 1048576 50000000
