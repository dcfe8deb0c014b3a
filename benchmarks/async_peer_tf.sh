#!/usr/bin/env bash
# benchmarks/async_peer_tf.sh — TensorFlow peer for the asynchronous scaling study
# (benchmarks/async_scaling.sh): the same Fashion-MNIST MLP, epochs and batch, trained with
# TensorFlow's ParameterServerStrategy and Adam(1e-3) applied on the ps (see async_peer_tf.py),
# for each worker count, ps count and seed of the grid. A benchmark, not a test: it passes or
# fails nothing.
#
# Installs the peer itself (never the tests), as sparse_peer_tf.sh does: tensorflow-cpu from
# PyPI into a venv made by Debian's python3, here ${DTF_BENCH_VENV:-$HOME/.cache/dtf-bench-venv},
# only when `import tensorflow` fails there. Each run's cluster lives in one process on
# 127.0.0.1, so nothing but the loopback is used.
#
#   benchmarks/async_peer_tf.sh [OUT_DIR]        (default build/async_scaling)
# The grid comes from the environment (defaults: the issue's peer grid):
#   WORKERS="2 8 16"  SEEDS="1 2 3"  PS="2"  EPOCHS=5
# Appends one row per run to OUT_DIR/async_scaling.csv in async_scaling.sh's format (scheme
# tf_pss_adam; samples_per_s = epochs x 60000 / wall_s; the staleness columns empty, as
# TensorFlow does not report it), so both schemes' rows can share one file and one plot.
# Each run is its own python process, killed after 30 minutes; its log is
# OUT_DIR/logs/tf_pss_adam-wN-pP-sS.log.
set -euo pipefail
out=${1:-build/async_scaling}
epochs=${EPOCHS:-5}
seeds=${SEEDS:-"1 2 3"}
counts=${WORKERS:-"2 8 16"}
ps_counts=${PS:-"2"}
here=$(cd "$(dirname "$0")" && pwd)
train_examples=60000
scheme=tf_pss_adam

venv=${DTF_BENCH_VENV:-$HOME/.cache/dtf-bench-venv}
if ! "$venv/bin/python" -c 'import tensorflow' 2>/dev/null; then
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  echo "# installing tensorflow-cpu into $venv" >&2
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q tensorflow-cpu
fi

mkdir -p "$out/logs"
csv="$out/async_scaling.csv"
[ -s "$csv" ] || echo "scheme,workers,ps,seed,epochs,accuracy,wall_s,samples_per_s,staleness_mean,staleness_max,status" >"$csv"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown), tensorflow $("$venv/bin/python" -c 'import os; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"; import tensorflow as tf; print(tf.__version__)' 2>/dev/null || echo unknown)"

# run WORKERS PS SEED: one training run, its CSV row and its summary line.
run() {
  local w=$1 p=$2 seed=$3
  local log="$out/logs/$scheme-w$w-p$p-s$seed.log" status=ok line
  if ! timeout 1800 "$venv/bin/python" "$here/async_peer_tf.py" --workers "$w" --ps "$p" --seed "$seed" \
      --epochs "$epochs" --batch 64 --lr 1e-3 --threads 1 >"$log" 2>&1; then
    status=failed
  fi
  line=$(grep -o 'RESULT .*' "$log" | tail -n 1 || true)
  [ -n "$line" ] || status=failed
  get() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$line"; }
  local acc wall sps
  acc=$(get accuracy) wall=$(get wall_s)
  sps=""
  [ -n "$wall" ] && sps=$(awk -v e="$epochs" -v n="$train_examples" -v t="$wall" 'BEGIN { if (t > 0) printf "%.0f", e * n / t }')
  echo "$scheme,$w,$p,$seed,$epochs,$acc,$wall,$sps,,,$status" >>"$csv"
  echo "$scheme workers=$w ps=$p seed=$seed: accuracy=${acc:-?} wall_s=${wall:-?} staleness_mean=- max=- ($status)"
}

for w in $counts; do
  for seed in $seeds; do
    for p in $ps_counts; do
      run "$w" "$p" "$seed"
    done
  done
done
echo "# done $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
