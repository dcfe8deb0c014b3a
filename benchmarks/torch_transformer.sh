#!/usr/bin/env bash
# benchmarks/torch_transformer.sh — the LibTorch Transformer of examples/torch_transformer
# (word and position embeddings of 64, 2 post-norm encoder layers of 2 heads and feed-forward
# 128, a linear head over the vocabulary; 583,456 parameters with 4,000 words) predicting the
# next word of the King James text from the previous 8 (next_word's corpus: every tenth verse
# held out), trained four ways on the same examples, one after the other:
#   ring      dtf ring-allreduce, 2 processes (Adam 1e-3 on the averaged gradient of 2 x 64)
#   downpour  dtf DOWNPOUR through 1 ps, 2 workers (a push and a pull every step, Adam 1e-3 on
#             the ps, each worker's batch of 64)
#   alone     LibTorch alone, one process (bench_torch_transformer_alone: torch::optim::Adam
#             1e-3, batch 64), from the dtf jobs' starting weights
#   alone128  the same at batch 128: the ring's step (2 x 64), so half the updates of batch 64
# each over the same --train_examples first training examples of the first --max_verses verses
# (the dtf jobs: each worker its half), one epoch, one thread per process. Reports the test
# perplexity (exp of the mean test cross-entropy over the held-out verses of those verses) and
# examples/s = examples / wall_s of the RESULT line (wall_s: from the start of training,
# connections included, to the end of the final test evaluation; the same for all four),
# beside the untrained model's perplexity and the uniform distribution's (the vocabulary's
# size). With --rounds N the four run N times, the order rotated each round, and the medians
# are reported. The output goes also to benchmarks/results/torch_transformer_<date>.txt.
#
# Builds what it needs in the build directory (configured with LibTorch, i.e. dtf::torch
# defined; turns DTF_BUILD_BENCHMARKS on there if it is off). Installs the text itself if it is
# missing (never the tests): Debian's bible-kjv with apt (needs root).
#
#   benchmarks/torch_transformer.sh [build-dir] [--rounds 1] [--train_examples 64000] [--max_verses 10000]
#   e.g. benchmarks/torch_transformer.sh build-torch
set -u
BUILD=${1:-build-torch}
[[ $# -gt 0 ]] && shift
ROUNDS=1 EXAMPLES=64000 VERSES=10000
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --train_examples) EXAMPLES=$2; shift 2 ;;
    --max_verses) VERSES=$2; shift 2 ;;
    *) echo "torch_transformer.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd) NAME=torch_transformer
source "$HERE/torch_common.sh"
torch_build "$BUILD" torch_transformer dtfrun bench_torch_transformer_alone
MODEL=$(abs "$BUILD/examples/torch_transformer") DTFRUN=$(abs "$BUILD/tools/dtfrun")
ALONE=$(abs "$BUILD/benchmarks/bench_torch_transformer_alone")

# The text: Debian's King James Bible and its reader (examples/next_word/corpus.hpp).
if ! command -v bible >/dev/null || [[ $(bible -l100000 Gen1:1-Gen1:2 2>/dev/null | wc -l) -lt 2 ]]; then
  if pgrep -x apt-get >/dev/null || pgrep -x apt >/dev/null; then echo "torch_transformer.sh: apt is running; try again later" >&2; exit 1; fi
  echo "torch_transformer.sh: installing bible-kjv bible-kjv-text (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bible-kjv bible-kjv-text >/dev/null || exit 1
fi

torch_output
echo "# benchmarks/torch_transformer.sh $BUILD --rounds $ROUNDS --train_examples $EXAMPLES --max_verses $VERSES"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores"
echo "# Transformer next-word model, KJV first $VERSES verses, $EXAMPLES training examples, 1 epoch, 1 thread per process"
echo "uptime before: $(uptime)"
DATA=(--max_verses "$VERSES" --train_examples "$EXAMPLES" --epochs 1)

# run NAME: one training run of NAME; appends its RESULT line (tagged) to $OUT.
run() {
  local name=$1 log=$work/$1_$r.log cmd
  case $name in
    ring) cmd=("$DTFRUN" --workers 2 --no-live -- "$MODEL" --strategy ring_allreduce --blas_threads 1) ;;
    downpour) cmd=("$DTFRUN" --ps 1 --workers 2 --no-live -- "$MODEL" --strategy downpour --blas_threads 1) ;;
    alone) cmd=("$ALONE" --threads 1) ;;
    alone128) cmd=("$ALONE" --threads 1 --batch 128) ;;
  esac
  OMP_NUM_THREADS=1 timeout 1800 "${cmd[@]}" "${DATA[@]}" >"$log" 2>&1
  local rc=$? line
  line=$(result_line "$log" $rc "$name") || return 1
  # The dtf chief's last line: the untrained model's and the uniform perplexity.
  local against
  against=$(grep -o "[0-9.]* untrained, [0-9]* uniform" "$log" | head -n1 | awk '{print "untrained=" $1, "uniform=" $3}')
  echo "run=$name round=$r load1=$(cut -d' ' -f1 /proc/loadavg) $line $against" >>"$OUT"
  echo "  $name: $line"
}

rounds "$ROUNDS" ring downpour alone alone128
END_LOAD=$(load)

echo
python3 - "$OUT" "$EXAMPLES" "$START_LOAD" "$END_LOAD" <<'PY'
import re, statistics, sys
out, examples, start_load, end_load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs, reference = {}, {}
for line in open(out):
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    runs.setdefault(kv["run"], []).append(
        (examples / float(kv["wall_s"]), float(kv["perplexity"]), float(kv["accuracy"]), float(kv["load1"])))
    for k in ("uniform", "untrained"):
        if k in kv: reference[k] = float(kv[k])
med = statistics.median
labels = [("ring", "dtf ring-allreduce, 2 processes"), ("downpour", "dtf DOWNPOUR, 1 ps + 2 workers"),
          ("alone", "LibTorch alone, 1 process"), ("alone128", "LibTorch alone, batch 128")]
print(f"{examples} training examples, 1 epoch; examples/s = {examples} / wall_s")
print(f"  {'':34} {'perplexity':>10} {'accuracy':>9} {'examples/s':>11} {'runs':>5} {'load1':>6}")
for key, label in labels:
    if key in runs:
        r = runs[key]
        print(f"  {label:34} {med(x[1] for x in r):>10.1f} {med(x[2] for x in r):>9.4f} {med(x[0] for x in r):>11.0f} "
              f"{len(r):>5} {med(x[3] for x in r):>6.2f}")
    else:
        print(f"  {label:34} {'(no result)':>10}")
if reference:
    print(f"  untrained model's test perplexity {reference.get('untrained', float('nan')):.1f}, "
          f"uniform over the vocabulary {reference.get('uniform', float('nan')):.0f}")
print(f"load averages (1, 5, 15 min): start {start_load}; end {end_load}")
PY
torch_finish
