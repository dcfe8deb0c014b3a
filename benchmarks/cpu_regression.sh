#!/usr/bin/env bash
# benchmarks/cpu_regression.sh — the CPU build of the working tree against the CPU build of an
# earlier commit (default ab01b24, the last commit before the GPU path was made native), side by
# side on this machine. Both are built the same way (Release, ccache, each program in its own
# translation unit); the base in a temporary `git worktree`, removed at exit. The programs then
# run interleaved, base and new alternately, the order swapped every round, so that noise from
# other work on the machine hits both alike; what counts is the ratio new/base round by round.
#
# Measured, one BLAS thread each:
#   tp      bench_train_throughput (MLP 784-256-128-10, Adam, Fashion-MNIST): samples/s at batch
#           32, 64 and 256, the whole pipeline ("full") and the step alone ("step"), and the wall
#           and CPU time of the whole program (a fixed amount of work: its batches 32 to 256 and
#           its GEMM table)
#   nd      examples/non_distributed, --epochs E: wall and CPU (user+system) time of the process,
#           and the training's own wall_s (its --metrics_file: no start-up, no data loading)
#   ring    examples/ring_allreduce, 2 workers under dtfrun, --epochs E: wall and CPU time of the
#           job (dtfrun and both workers)
#
# Prints per configuration the median of each build and the ratio new/base taken pair by pair
# (median, min, max); for samples/s above 1 is faster, for seconds below 1 is faster. On a
# machine shared with other work the CPU times (user + system) are the steadier figures: a
# process waiting for a core counts in its wall time, not in its CPU time. The raw
# measurements and the table go to benchmarks/results/cpu_regression_<date>.txt.
#
#   benchmarks/cpu_regression.sh [--base COMMIT] [--rounds 7] [--epochs 3] [--steps 300]
#       [--repeats 5] [--only tp,nd,ring] [--workdir DIR]
#
# --workdir DIR keeps the base's worktree and both builds there (reused by the next run with the
# same DIR) instead of a temporary folder. Needs cmake, a C++20 compiler, OpenBLAS, python3 and
# the Fashion-MNIST files (Debian: dataset-fashion-mnist). About 10 minutes on 2 cores with the
# defaults once the builds are in ccache.
set -euo pipefail

BASE=ab01b24 ROUNDS=7 EPOCHS=3 STEPS=300 REPEATS=5 ONLY=tp,nd,ring WORKDIR=
while [[ $# -gt 0 ]]; do
  case $1 in
    --base) BASE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "cpu_regression.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "cpu_regression.sh: --rounds must be a positive integer" >&2; exit 2; }
for part in ${ONLY//,/ }; do
  case $part in tp|nd|ring) ;; *) echo "cpu_regression.sh: --only takes tp, nd and ring, not $part" >&2; exit 2 ;; esac
done
want() { [[ ,$ONLY, == *,$1,* ]]; }

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(git -C "$HERE" rev-parse --show-toplevel)
BASE_SHA=$(git -C "$ROOT" rev-parse --quiet --verify "$BASE^{commit}") ||
  { echo "cpu_regression.sh: $BASE is not a commit of $ROOT" >&2; exit 2; }
DATA=/usr/share/datasets/fashion-mnist
[[ -f $DATA/train-images-idx3-ubyte.gz ]] ||
  { echo "cpu_regression.sh: no Fashion-MNIST in $DATA (Debian: apt-get install dataset-fashion-mnist)" >&2; exit 2; }

if [[ -n $WORKDIR ]]; then
  mkdir -p "$WORKDIR"; work=$(cd "$WORKDIR" && pwd); keep=1
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_cpu_regression.XXXXXX"); keep=0
fi
cleanup() {
  if [[ $keep == 0 ]]; then
    git -C "$ROOT" worktree remove --force "$work/base-src" 2>/dev/null || true
    rm -rf "$work"
    git -C "$ROOT" worktree prune 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The base's sources: a detached worktree at BASE_SHA (an old one in --workdir is moved there).
if [[ -e $work/base-src/.git ]]; then
  git -C "$work/base-src" checkout -q --detach "$BASE_SHA"
else
  git -C "$ROOT" worktree add -q --detach "$work/base-src" "$BASE_SHA"
fi

TARGETS=(bench_train_throughput non_distributed ring_allreduce dtfrun)
# build SIDE SOURCE: configures and builds the targets in $work/SIDE-build. CCACHE_BASEDIR makes
# the base's paths relative, so that a later run in another temporary folder hits the cache.
build() {
  local side=$1 src=$2 dir=$work/$1-build log=$work/$1-build.log
  echo "building $side ($src) in $dir"
  if ! { CCACHE_BASEDIR=$work cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDTF_BUILD_TESTS=OFF \
           -DDTF_BUILD_EXAMPLES=ON -DDTF_BUILD_BENCHMARKS=ON -DDTF_PROGRAMS_IN_UNITS=OFF -DDTF_CUDA=OFF &&
         CCACHE_BASEDIR=$work nice cmake --build "$dir" -j "$(nproc)" --target "${TARGETS[@]}"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "cpu_regression.sh: cannot build $side (log: $log)" >&2
    exit 1
  fi
}
build base "$work/base-src"
build new "$ROOT"

mkdir -p "$HERE/results"
RESULTS=$HERE/results/cpu_regression_$(date -u +%Y-%m-%d_%H%M).txt
exec > >(tee "$RESULTS") 2>&1
RAW=$work/raw.txt
: >"$RAW"
new_desc="working tree at $(git -C "$ROOT" rev-parse --short HEAD)"
[[ -z $(git -C "$ROOT" status --porcelain --untracked-files=no) ]] || new_desc+=" (with uncommitted changes)"
echo "# cpu_regression: base $(git -C "$ROOT" log -1 --format='%h %cs' "$BASE_SHA") against $new_desc"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -n1)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# rounds $ROUNDS, epochs $EPOCHS, bench_train_throughput --steps $STEPS --repeats $REPEATS, BLAS threads 1"

# timed SIDE ROUND KEY LOG COMMAND...: runs COMMAND (output to LOG) under /usr/bin/time and
# records KEY_s (wall) and KEY_cpu_s (user+system, its waited-for children included).
timed() {
  local side=$1 rnd=$2 key=$3 log=$4 times=$work/times.txt
  shift 4
  /usr/bin/time -f '%e %U %S' -o "$times" "$@" >"$log" 2>&1 || { tail -n 30 "$log" >&2; exit 1; }
  read -r wall user sys <"$times"
  record "$side" "$rnd" "${key}_s" "$wall"
  record "$side" "$rnd" "${key}_cpu_s" "$(python3 -c "print($user + $sys)")"
}
# record SIDE ROUND KEY VALUE
record() { echo "$1 $2 $3 $4" >>"$RAW"; }

# run_tp SIDE ROUND: bench_train_throughput's throughput table, rows of batch 32, 64 and 256.
run_tp() {
  local log=$work/tp.log
  timed "$1" "$2" tp_run "$log" "$work/$1-build/benchmarks/bench_train_throughput" --steps "$STEPS" \
    --repeats "$REPEATS" --blas_threads 1 --data "$DATA"
  while read -r batch full _ step; do
    case $batch in 32|64|256) record "$1" "$2" "tp_b${batch}_full_samples/s" "$full"
                              record "$1" "$2" "tp_b${batch}_step_samples/s" "$step" ;; esac
  done < <(sed -n '/training throughput/,/^$/p' "$log")
}
# run_nd SIDE ROUND: non_distributed for EPOCHS, wall time of the process and its wall_s.
run_nd() {
  local metrics=$work/nd.json
  rm -f "$metrics"
  timed "$1" "$2" nd_process "$work/nd.log" "$work/$1-build/examples/non_distributed" --epochs "$EPOCHS" \
    --blas_threads 1 --log_every 100000 --data "$DATA" --metrics_file "$metrics"
  record "$1" "$2" nd_train_wall_s "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'])" "$metrics")"
}
# run_ring SIDE ROUND: ring_allreduce, 2 workers under the same build's dtfrun, wall time.
run_ring() {
  local b=$work/$1-build
  timed "$1" "$2" ring_2workers "$work/ring.log" "$b/tools/dtfrun" --workers 2 --timeout_s 600 -- \
    "$b/examples/ring_allreduce" --epochs "$EPOCHS" --blas_threads 1 --log_every 100000 --data "$DATA"
}

for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then order=(base new); else order=(new base); fi
  echo "round $r/$ROUNDS: ${order[*]} (load $(cut -d' ' -f1-3 /proc/loadavg))"
  for part in tp nd ring; do
    want "$part" || continue
    for side in "${order[@]}"; do "run_$part" "$side" "$r"; done
  done
done

echo
python3 - "$RAW" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    side, rnd, key, value = line.split()
    runs.setdefault(key, {}).setdefault(side, {})[int(rnd)] = float(value)
print(f"{'configuration':<26} {'base':>10} {'new':>10} {'new/base':>9} {'min':>6} {'max':>6}  better")
for key, sides in runs.items():
    base, new = sides.get("base", {}), sides.get("new", {})
    ratios = [new[r] / base[r] for r in sorted(base) if r in new and base[r] > 0]
    if not ratios:
        continue
    better = "higher" if key.endswith("samples/s") else "lower"
    fmt = "{:>10.0f}" if better == "higher" else "{:>10.2f}"
    print(f"{key:<26} " + fmt.format(statistics.median(base.values())) + " " + fmt.format(statistics.median(new.values()))
          + f" {statistics.median(ratios):>9.3f} {min(ratios):>6.3f} {max(ratios):>6.3f}  {better}")
print("(base, new: medians over the rounds; new/base: the ratio round by round, its median, min and max)")
PY
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); raw measurements:"
sed 's/^/#   /' "$RAW"
echo "(written to $RESULTS)"
