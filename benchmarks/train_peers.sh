#!/bin/sh
# benchmarks/train_peers.sh — single-process training throughput of dtf beside PyTorch and
# TensorFlow, in one run: MLP 784-256-128-10 and 784-2048-2048-10, Adam, batch sizes 32, 64
# and 256, one BLAS/intra-op thread and two. The programs are interleaved (dtf, torch, tf,
# then again, --rounds times) so that noise from other work on the machine hits all three
# alike; the median of the rounds is reported, with dtf's ratio to the faster peer.
# Also prints the core's single-precision GEMM peak (OpenBLAS sgemm 2048^3, one thread) and
# the fraction of it dtf's step reaches.
#
# Installs the peers itself (never the tests): Debian's python3-torch with apt (needs root)
# and tensorflow-cpu from PyPI into a venv under the build directory.
#
#   benchmarks/train_peers.sh [build-dir] [--rounds 3] [--seconds 3] [--quick]
set -eu
BUILD=${1:-build}
[ $# -gt 0 ] && shift
ROUNDS=3 SECONDS_PER=3 QUICK=0
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
DTF=$BUILD/benchmarks/bench_train_peers_dtf
[ -x "$DTF" ] || cmake --build "$BUILD" --target bench_train_peers_dtf

# Peers.
# Debian's torch lives in the system interpreter (python3 on PATH may be another one).
TORCH_PY=/usr/bin/python3
if ! $TORCH_PY -c 'import torch' 2>/dev/null; then
  if pgrep -x apt-get >/dev/null || pgrep -x apt >/dev/null; then echo "apt is running; try again later" >&2; exit 1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >/dev/null
fi
VENV=$BUILD/peers-venv
if ! "$VENV/bin/python" -c 'import tensorflow' 2>/dev/null; then
  $TORCH_PY -m venv "$VENV"
  "$VENV/bin/pip" install -q tensorflow-cpu
fi
TF_PY=$VENV/bin/python

OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# torch $($TORCH_PY -c 'import torch; print(torch.__version__)'), tensorflow $($TF_PY -c 'import os; os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"; import tensorflow as tf; print(tf.__version__)' 2>/dev/null)"
"$DTF" --gemm_peak 2048 --threads 1 | tee -a "$OUT"

if [ "$QUICK" = 1 ]; then CONFIGS="256,128:64:1"; else
  CONFIGS="256,128:32:1 256,128:64:1 256,128:256:1 256,128:32:2 256,128:64:2 256,128:256:2
           2048,2048:32:1 2048,2048:64:1 2048,2048:256:1 2048,2048:64:2 2048,2048:256:2"
fi
for cfg in $CONFIGS; do
  hidden=${cfg%%:*}; rest=${cfg#*:}; batch=${rest%%:*}; threads=${rest#*:}
  r=0
  while [ "$r" -lt "$ROUNDS" ]; do
    "$DTF" --hidden "$hidden" --batch "$batch" --threads "$threads" --seconds "$SECONDS_PER" >>"$OUT"
    OMP_NUM_THREADS=$threads $TORCH_PY "$HERE/train_peers.py" --framework torch --hidden "$hidden" --batch "$batch" \
      --threads "$threads" --seconds "$SECONDS_PER" >>"$OUT"
    OMP_NUM_THREADS=$threads $TF_PY "$HERE/train_peers.py" --framework tf --hidden "$hidden" --batch "$batch" \
      --threads "$threads" --seconds "$SECONDS_PER" 2>/dev/null >>"$OUT"
    r=$((r + 1))
  done
done

python3 - "$OUT" <<'PY'
import re, sys, statistics
rows, peak = {}, None
for line in open(sys.argv[1]):
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    if "gemm_peak" in line:
        peak = float(kv["gflops"]); print(f"single-precision GEMM peak (sgemm 2048^3, 1 thread): {peak:.1f} GFLOP/s"); continue
    if "framework" not in kv: continue
    key = (kv["model"], int(kv["batch"]), int(kv["threads"]))
    rows.setdefault(key, {}).setdefault(kv["framework"], []).append((float(kv["samples_per_s"]), float(kv.get("gflops", 0))))
print(f"{'model':>12} {'batch':>6} {'thr':>4} {'dtf/s':>10} {'torch/s':>10} {'tf/s':>10} {'dtf/best':>9} {'dtf GF/s':>9} {'of peak':>8}")
for (model, batch, thr), fw in rows.items():
    med = {k: statistics.median(s for s, _ in v) for k, v in fw.items()}
    gf = statistics.median(g for _, g in fw.get("dtf", [(0, 0)]))
    best = max(med.get("torch", 0), med.get("tf", 0))
    ratio = med.get("dtf", 0) / best if best else float("nan")
    frac = gf / (peak * thr) if peak else float("nan")
    print(f"{'784-'+model.replace(',', '-')+'-10':>12} {batch:>6} {thr:>4} {med.get('dtf', 0):>10.0f} {med.get('torch', 0):>10.0f} "
          f"{med.get('tf', 0):>10.0f} {ratio:>9.2f} {gf:>9.1f} {frac:>8.2f}")
print("(medians of the interleaved rounds; 'of peak' = dtf's step GFLOP/s / (one-thread peak x threads))")
PY
