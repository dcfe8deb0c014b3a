#!/usr/bin/env bash
# Scaling study of the training schemes: for each scheme, worker count, ps count and seed, one
# job under dtfrun on this machine (Fashion-MNIST MLP, a fixed number of epochs over the training
# set split between the workers, batch 64), its test accuracy, wall time, samples/s and the
# chief's mean/max push staleness. A benchmark, not a test: it passes or fails nothing.
#
#   benchmarks/async_scaling.sh [BUILD_DIR] [OUT_DIR]
# The grid comes from the environment (defaults: the full study):
#   EPOCHS=5  SEEDS="1 2 3"  WORKERS="1 2 4 8 16 32 64"  PS="1 2 4"
#   SCHEMES="hogwild downpour downpour_easy agn dyn_sgd aeasgd eamsgd adam_ps sync_sgd
#            sync_sgd_backup ring_allreduce"
# A scheme name ending in ":plain" runs with --nostaleness_aware (the scheme without its
# staleness-aware rule), one ending in ":aware" with --staleness_aware; a bare name runs with
# the scheme's defaults (the rule on, except for hogwild). adam_ps is examples/distributed_setup (Adam applied by the ps);
# sync_sgd_backup aggregates workers - 1 gradients per step (one backup worker); ring_allreduce
# and the single-process baseline (non_distributed, one row per seed) use no ps.
# Writes OUT_DIR/async_scaling.csv (one row per run, appended as runs finish), and then, with
# matplotlib from PyPI in a venv under BUILD_DIR (made here, never by the tests),
# OUT_DIR/async_scaling.png (median accuracy against workers per scheme) and
# OUT_DIR/async_scaling.md (medians and spreads). Logs go to OUT_DIR/logs.
#
# On a 2-core machine many workers share the cores: the wall times measure contention, and the
# staleness columns show what the workers experienced.
set -euo pipefail
build=${1:-build}
out=${2:-$build/async_scaling}
epochs=${EPOCHS:-5}
seeds=${SEEDS:-"1 2 3"}
counts=${WORKERS:-"1 2 4 8 16 32 64"}
ps_counts=${PS:-"1 2 4"}
schemes=${SCHEMES:-"hogwild downpour downpour_easy agn dyn_sgd aeasgd eamsgd adam_ps sync_sgd sync_sgd_backup ring_allreduce"}
here=$(cd "$(dirname "$0")" && pwd)
train_examples=60000
mkdir -p "$out/logs"
csv="$out/async_scaling.csv"
[ -s "$csv" ] || echo "scheme,workers,ps,seed,epochs,accuracy,wall_s,samples_per_s,staleness_mean,staleness_max,status" >"$csv"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"

common=(--epochs "$epochs" --log_every 1000000 --summary_every 0 --save_checkpoints_secs 0 --blas_threads 1)

# run NAME WORKERS PS SEED -- COMMAND...: runs one job, appends its CSV row.
run() {
  local name=$1 w=$2 p=$3 seed=$4
  shift 5
  local log="$out/logs/${name//:/_}-w$w-p$p-s$seed.log" status=ok line
  if ! "$@" >"$log" 2>&1; then status=failed; fi
  line=$(grep -o 'RESULT .*' "$log" | tail -n 1 || true)
  [ -n "$line" ] || status=failed
  get() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$line"; }
  local acc wall sps sm sx
  acc=$(get accuracy) wall=$(get wall_s) sm=$(get staleness_mean) sx=$(get staleness_max)
  sps=""
  [ -n "$wall" ] && sps=$(awk -v e="$epochs" -v n="$train_examples" -v t="$wall" 'BEGIN { if (t > 0) printf "%.0f", e * n / t }')
  echo "$name,$w,$p,$seed,$epochs,$acc,$wall,$sps,$sm,$sx,$status" >>"$csv"
  echo "$name workers=$w ps=$p seed=$seed: accuracy=${acc:-?} wall_s=${wall:-?} staleness_mean=${sm:--} max=${sx:--} ($status)"
}

dtfrun=("$build/tools/dtfrun" --grace_ms 30000)
for seed in $seeds; do
  run non_distributed 1 0 "$seed" -- "$build/examples/non_distributed" --seed "$seed" "${common[@]}"
done
for scheme in $schemes; do
  base=${scheme%:*}
  extra=()
  case $scheme in
    *:plain) extra=(--nostaleness_aware) ;;
    *:aware) extra=(--staleness_aware) ;;
  esac
  for w in $counts; do
    for seed in $seeds; do
      case $base in
        ring_allreduce)
          run "$scheme" "$w" 0 "$seed" -- "${dtfrun[@]}" --workers "$w" -- "$build/examples/ring_allreduce" \
            --seed "$seed" "${common[@]}"
          continue ;;
      esac
      for p in $ps_counts; do
        case $base in
          adam_ps) prog=distributed_setup args=() ;;
          sync_sgd) prog=sync_sgd args=(--replicas_to_aggregate "$w") ;;
          sync_sgd_backup)
            [ "$w" -ge 2 ] || continue
            prog=sync_sgd args=(--replicas_to_aggregate $((w - 1))) ;;
          *) prog=$base args=() ;;
        esac
        run "$scheme" "$w" "$p" "$seed" -- "${dtfrun[@]}" --ps "$p" --workers "$w" -- "$build/examples/$prog" \
          --seed "$seed" "${common[@]}" "${args[@]}" "${extra[@]}"
      done
    done
  done
done
echo "# done $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"

venv="$build/async-scaling-venv"
if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  echo "# installing matplotlib into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q matplotlib
fi
"$venv/bin/python" "$here/async_scaling_plot.py" "$csv" "$out/async_scaling.png" "$out/async_scaling.md"
cat "$out/async_scaling.md"
