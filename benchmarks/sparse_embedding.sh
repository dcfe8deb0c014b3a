#!/bin/sh
# benchmarks/sparse_embedding.sh — dtf's embedding tables beside TensorFlow's
# ParameterServerStrategy with a sharded embedding, in one run, interleaved:
#   the 10M x 20 table over 3 ps, Zipf(1.1) ids in batches of 4096 (REPS pairs of runs), then
#   dtf's hashed table over 100M ids x 32 (memory grows with the rows touched).
# Needs bench_sparse_embedding built (./scripts/test.sh or cmake --build build); installs the
# TensorFlow peer itself (sparse_peer_tf.sh). Prints each run's key=value line.
#
#   BUILD=build REPS=3 SECONDS_PER_RUN=20 WORKERS=2 benchmarks/sparse_embedding.sh
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${BUILD:-build}
REPS=${REPS:-3}
SECS=${SECONDS_PER_RUN:-20}
WORKERS=${WORKERS:-2}
BENCH="$BUILD/benchmarks/bench_sparse_embedding"
[ -x "$BENCH" ] || { echo "sparse_embedding.sh: $BENCH not built" >&2; exit 1; }
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  "$BENCH" --rows 10000000 --dim 20 --ps 3 --batch 4096 --seconds "$SECS" --workers "$WORKERS"
  "$HERE/sparse_peer_tf.sh" --rows 10000000 --dim 20 --ps 3 --batch 4096 --seconds "$SECS" --workers "$WORKERS"
done
# Hashed ids: 100M x 32, rows created on first touch; two lengths show memory following the rows.
for secs in 5 "$SECS"; do
  "$BENCH" --hashed_ids 100000000 --dim 32 --ps 3 --batch 4096 --seconds "$secs" --workers "$WORKERS" \
    --max_rows 100000000
done
