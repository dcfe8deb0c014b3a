#!/bin/sh
# benchmarks/sparse_peer_tf.sh — TensorFlow peer for the sparse-embedding benchmark: one
# embedding table (default 10,000,000 x 20 float32) sharded over 3 parameter servers with
# ParameterServerStrategy, trained with Zipf(1.1) id batches and sparse SGD; see
# sparse_peer_tf.py. Prints one line:
#   peer=tf-ps rows=... dim=... ps=3 workers=... batch=4096 init_s=... steps_per_s=...
#   unique_rows_per_step=... rows_per_s=...
#
# Installs the peer itself (never the tests), as train_peers.sh does: tensorflow-cpu from
# PyPI into a venv made by Debian's python3, here ${DTF_BENCH_VENV:-$HOME/.cache/dtf-bench-venv}
# (DTF_BENCH_VENV=build/peers-venv reuses train_peers.sh's). The whole cluster runs in one
# process on 127.0.0.1, so nothing but the loopback is used.
#
#   benchmarks/sparse_peer_tf.sh [--rows 10000000] [--dim 20] [--batch 4096] [--seconds 20]
#                                [--warmup 20] [--workers 2] [--ps 3] ...
# Quick check: benchmarks/sparse_peer_tf.sh --rows 1000000 --seconds 10
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${DTF_BENCH_VENV:-$HOME/.cache/dtf-bench-venv}
if ! "$VENV/bin/python" -c 'import tensorflow' 2>/dev/null; then
  PY=/usr/bin/python3
  [ -x "$PY" ] || PY=python3
  echo "# installing tensorflow-cpu into $VENV" >&2
  $PY -m venv "$VENV"
  "$VENV/bin/pip" install -q tensorflow-cpu
fi
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exec "$VENV/bin/python" "$HERE/sparse_peer_tf.py" "$@"
