#!/usr/bin/env bash
# benchmarks/torch_cnn.sh — the LibTorch CNN of examples/torch_cnn (conv 32 / BN / ReLU / pool,
# conv 64 / BN / ReLU / pool, dropout, linear 128, linear 10; Adam 1e-3, batch 64 per worker) on
# Fashion-MNIST, 2 workers on this machine with one thread each, trained side by side in one run:
#   ring_overlap    dtf ring-allreduce, gradients reduced while backprop runs (--overlap)
#   ring_nooverlap  dtf ring-allreduce, reduced after backprop (--nooverlap)
#   downpour        dtf DOWNPOUR through 1 ps (local SGD 1e-2, Adam 1e-3 on the ps)
#   sync_sgd        dtf SyncSGD through 1 ps (both workers' gradients aggregated, Adam 1e-3)
#   ddp             PyTorch DDP over gloo, the same network and training (torch_cnn_ddp.py;
#                   Debian's python3-torch, the same LibTorch 1.13 kernels)
# Each run trains --epochs epochs over the 60,000 training images (each worker its half) and
# reports the chief's test accuracy on the 10,000 test images; samples/s is
# epochs * 60000 / wall_s of the RESULT line, the same formula for all five (wall_s: from the
# start of training, connections included, to the end of the last evaluation).
# The five are interleaved round by round (--rounds times, the order rotated each round) so that
# noise from other work hits all of them alike. Then bench_torch_overhead: the adapter's
# per-step cost against plain LibTorch in one process.
# Prints, per contestant, the median samples/s and accuracy of the rounds; the ratio
# dtf-ring(overlap) / DDP (of the medians, and each round's own); the adapter overhead; the
# machine's load (uptime) before and after. The output goes also to
# benchmarks/results/torch_cnn_<date>.txt.
#
# Builds what it needs in the build directory (configured with LibTorch, i.e. dtf::torch
# defined; turns DTF_BUILD_BENCHMARKS on there if it is off). Installs its peer itself (never
# the tests): Debian's python3-torch with apt (needs root).
#
#   benchmarks/torch_cnn.sh [build-dir] [--rounds 1] [--epochs 1]
#   e.g. benchmarks/torch_cnn.sh build-torch --epochs 2
set -u
BUILD=${1:-build-torch}
[[ $# -gt 0 ]] && shift
ROUNDS=1 EPOCHS=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    *) echo "torch_cnn.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd) NAME=torch_cnn
source "$HERE/torch_common.sh"
torch_build "$BUILD" torch_cnn dtfrun bench_torch_overhead
CNN=$(abs "$BUILD/examples/torch_cnn") DTFRUN=$(abs "$BUILD/tools/dtfrun")
OVERHEAD=$(abs "$BUILD/benchmarks/bench_torch_overhead")

# The peer: Debian's torch lives in the system interpreter (python3 on PATH may be another one).
TORCH_PY=/usr/bin/python3
if ! $TORCH_PY -c 'import torch' 2>/dev/null; then
  if pgrep -x apt-get >/dev/null || pgrep -x apt >/dev/null; then echo "torch_cnn.sh: apt is running; try again later" >&2; exit 1; fi
  echo "torch_cnn.sh: installing python3-torch (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch >/dev/null || exit 1
fi

torch_output
echo "# benchmarks/torch_cnn.sh $BUILD --rounds $ROUNDS --epochs $EPOCHS"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, torch $($TORCH_PY -c 'import torch; print(torch.__version__)')"
echo "# CNN on Fashion-MNIST, Adam 1e-3, batch 64 per worker, 2 workers x 1 thread, $EPOCHS epoch(s), $ROUNDS round(s)"
echo "uptime before: $(uptime)"

# run NAME: one training run of NAME; appends its RESULT line (tagged) to $OUT.
run() {
  local name=$1 log=$work/$1_$r.log cmd
  case $name in
    ring_overlap) cmd=("$DTFRUN" --workers 2 --no-live -- "$CNN" --strategy ring_allreduce --overlap) ;;
    ring_nooverlap) cmd=("$DTFRUN" --workers 2 --no-live -- "$CNN" --strategy ring_allreduce --nooverlap) ;;
    downpour) cmd=("$DTFRUN" --ps 1 --workers 2 --no-live -- "$CNN" --strategy downpour) ;;
    sync_sgd) cmd=("$DTFRUN" --ps 1 --workers 2 --no-live -- "$CNN" --strategy sync_sgd) ;;
    ddp) cmd=(env GLOO_SOCKET_IFNAME=lo "$TORCH_PY" "$HERE/torch_cnn_ddp.py" --workers 2 --threads 1) ;;
  esac
  [[ $name == ddp ]] || cmd+=(--blas_threads 1)
  OMP_NUM_THREADS=1 timeout $((600 * EPOCHS + 300)) "${cmd[@]}" --epochs "$EPOCHS" >"$log" 2>&1
  local rc=$? line
  line=$(result_line "$log" $rc "$name") || return 1
  echo "run=$name round=$r load1=$(cut -d' ' -f1 /proc/loadavg) $line" >>"$OUT"
  echo "  $name: $line"
}

rounds "$ROUNDS" ring_overlap ring_nooverlap downpour sync_sgd ddp

echo "adapter overhead (bench_torch_overhead, load $(load)):"
"$OVERHEAD" >"$work/overhead.log" 2>&1 || { echo "  bench_torch_overhead FAILED:"; tail -n 20 "$work/overhead.log"; }
sed 's/^/  /' "$work/overhead.log"
END_LOAD=$(load)

echo
$TORCH_PY - "$OUT" "$EPOCHS" "$work/overhead.log" "$START_LOAD" "$END_LOAD" <<'PY'
import re, statistics, sys
out, epochs, overhead_log, start_load, end_load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
runs = {}
for line in open(out):
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    sps = epochs * 60000 / float(kv["wall_s"])
    runs.setdefault(kv["run"], []).append((sps, float(kv["accuracy"]), float(kv["load1"]), kv["round"]))
med = statistics.median
labels = [("ring_overlap", "dtf ring-allreduce, overlap on"), ("ring_nooverlap", "dtf ring-allreduce, overlap off"),
          ("downpour", "dtf DOWNPOUR, 1 ps"), ("sync_sgd", "dtf SyncSGD, 1 ps"), ("ddp", "PyTorch DDP (gloo)")]
print(f"2 workers x 1 thread, {epochs} epoch(s); samples/s = {epochs} * 60000 / wall_s")
print(f"  {'':32} {'samples/s':>10} {'accuracy':>9} {'runs':>5} {'load1':>6}")
for key, label in labels:
    if key in runs:
        r = runs[key]
        print(f"  {label:32} {med(x[0] for x in r):>10.1f} {med(x[1] for x in r):>9.4f} {len(r):>5} "
              f"{med(x[2] for x in r):>6.2f}")
    else:
        print(f"  {label:32} {'(no result)':>10}")
if "ring_overlap" in runs and "ddp" in runs:
    a, b = runs["ring_overlap"], runs["ddp"]
    ratio = med(x[0] for x in a) / med(x[0] for x in b)
    by_round = {x[3]: x[0] for x in b}
    paired = [x[0] / by_round[x[3]] for x in a if x[3] in by_round]
    extra = f" (rounds: median {med(paired):.2f}, {min(paired):.2f}-{max(paired):.2f})" if len(paired) > 1 else ""
    dacc = med(x[1] for x in a) - med(x[1] for x in b)
    print(f"  ratio dtf-ring(overlap) / DDP samples/s: {ratio:.2f}{extra}; accuracy ring - DDP: {dacc:+.4f}")
    equal = dacc >= -0.005  # equal accuracy: the ring's no more than half a point below DDP's
    print(f"  target ring >= 1.15x DDP at equal accuracy (ring's within 0.005 of DDP's, or above): "
          f"{'met' if ratio >= 1.15 and equal else 'NOT met'}")
m = re.search(r"overhead_pct=(\S+)", open(overhead_log).read())
if m:
    pct = float(m.group(1))
    print(f"  adapter overhead against plain LibTorch: {pct:+.2f}% per step (target <= 3%: {'met' if pct <= 3 else 'NOT met'})")
print(f"load averages (1, 5, 15 min): start {start_load}; end {end_load}")
PY
torch_finish
