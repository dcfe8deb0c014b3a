#!/usr/bin/env bash
# Recommendation-model benchmark (issue 43): samples/s, held-out AUC and log loss of the DLRM-style
# click model of examples/recommender on the same synthetic Criteo logs, at each worker count over
# 2 ps, for
#   hybrid    the tables on the ps, the dense MLP by ring-allreduce (--strategy hybrid): run only
#             when the example accepts it (its --help lists hybrid); otherwise the column says so
#   sync_sgd  the same model with the dense part through the ps too, SyncSGD over every worker
#   hogwild   the same, asynchronous (Hogwild)
#   tf_pss    TensorFlow's ParameterServerStrategy with the same model, data, split, batch and
#             epochs (benchmarks/recommender_peer_tf.py; the table sharded over the ps)
# Every job trains EPOCHS passes over the same training examples (split between the workers),
# so all see the same number of samples; samples/s = EPOCHS x training examples / the chief's
# wall time (dtf: the RESULT line's wall_s, from dtf::train's start, connection included; TF:
# from the first scheduled step to the end, tracing included). The planted model's held-out
# AUC (best_auc) is the bound a model of these logs approaches with unbounded data.
# A benchmark, not a test: it passes or fails nothing.
#
#   benchmarks/recommender.sh [BUILD_DIR] [OUT_DIR]
# Environment (defaults in brackets): WORKERS ["2 4 8"], PS [2], EXAMPLES [200000],
#   EPOCHS [2], BATCH [256], VOCABULARY [100], SCHEMES ["hybrid sync_sgd hogwild tf_pss"].
# TensorFlow: tensorflow-cpu from PyPI in a venv made by Debian's python3, here
# ${DTF_BENCH_VENV:-$HOME/.cache/dtf-bench-venv} (as sparse_peer_tf.sh; never by the tests).
# Writes OUT_DIR/recommender.csv (a row per job) and OUT_DIR/recommender.md (the table);
# logs in OUT_DIR/logs. Everything runs on this machine: the processes share its cores.
set -euo pipefail
build=${1:-build}
out=${2:-$build/recommender_bench}
workers_list=${WORKERS:-"2 4 8"}
num_ps=${PS:-2}
examples=${EXAMPLES:-200000}
epochs=${EPOCHS:-2}
batch=${BATCH:-256}
vocabulary=${VOCABULARY:-100}
schemes=${SCHEMES:-"hybrid sync_sgd hogwild tf_pss"}
here=$(cd "$(dirname "$0")" && pwd)
example="$build/examples/recommender"
dtfrun=("$build/tools/dtfrun" --grace_ms 30000)
[ -x "$example" ] || { echo "recommender.sh: $example is not built" >&2; exit 1; }
mkdir -p "$out/logs"
csv="$out/recommender.csv"
echo "scheme,workers,ps,examples,epochs,batch,wall_s,samples_per_s,auc,log_loss,best_auc,status" >"$csv"
header="# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "$header"

# Whether the example takes --strategy hybrid: its --help lists the strategies it accepts.
hybrid_ok=0
if "$example" --help 2>&1 | grep -A1 -- '--strategy' | grep -q hybrid; then hybrid_ok=1; fi

# The logs for the TensorFlow peer: the same generator, seed and size as the dtf jobs' --synthetic.
data="$out/synthetic-$examples.tsv"
common=(--synthetic "$examples" --vocabulary "$vocabulary" --data_seed 1)
if [[ " $schemes " == *" tf_pss "* && ! -s "$data" ]]; then
  "$example" "${common[@]}" --save_synthetic "$data" >/dev/null
fi
train_examples=$((examples - examples / 10))  # the example's and the peer's --test_fraction 0.1

# record SCHEME WORKERS LOG STATUS: the job's CSV row from its RESULT line.
record() {
  local scheme=$1 w=$2 log=$3 status=$4 line
  line=$(grep -o 'RESULT .*' "$log" | tail -n 1 || true)
  [ -n "$line" ] || status=failed
  get() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$line"; }
  local wall auc ll best sps=""
  wall=$(get wall_s) auc=$(get auc) ll=$(get log_loss) best=$(get best_auc)
  [ -n "$wall" ] && sps=$(awk -v e="$epochs" -v n="$train_examples" -v t="$wall" 'BEGIN { if (t > 0) printf "%.0f", e * n / t }')
  echo "$scheme,$w,$num_ps,$examples,$epochs,$batch,$wall,$sps,$auc,$ll,$best,$status" >>"$csv"
  echo "$scheme workers=$w ps=$num_ps: samples_per_s=${sps:-?} auc=${auc:-?} log_loss=${ll:-?} best_auc=${best:--} ($status)"
}

for w in $workers_list; do
  for scheme in $schemes; do
    log="$out/logs/$scheme-w$w-p$num_ps.log"
    status=ok
    case $scheme in
      hybrid)
        if [ "$hybrid_ok" = 0 ]; then
          echo "hybrid,$w,$num_ps,$examples,$epochs,$batch,,,,,,not run: the example does not accept --strategy hybrid" >>"$csv"
          echo "hybrid workers=$w: not run (the example does not accept --strategy hybrid yet)"
          continue
        fi
        "${dtfrun[@]}" --ps "$num_ps" --workers "$w" -- "$example" "${common[@]}" --strategy hybrid \
          --epochs "$epochs" --batch "$batch" --log_every 1000000 --summary_every 0 --save_checkpoints_secs 0 \
          >"$log" 2>&1 || status=failed ;;
      sync_sgd | hogwild | downpour)
        "${dtfrun[@]}" --ps "$num_ps" --workers "$w" -- "$example" "${common[@]}" --strategy "$scheme" \
          --epochs "$epochs" --batch "$batch" --log_every 1000000 --summary_every 0 --save_checkpoints_secs 0 \
          >"$log" 2>&1 || status=failed ;;
      tf_pss)
        venv=${DTF_BENCH_VENV:-$HOME/.cache/dtf-bench-venv}
        if ! "$venv/bin/python" -c 'import tensorflow' 2>/dev/null; then
          echo "# installing tensorflow-cpu into $venv" >&2
          /usr/bin/python3 -m venv "$venv"
          "$venv/bin/pip" install -q tensorflow-cpu
        fi
        "$venv/bin/python" "$here/recommender_peer_tf.py" --data "$data" --workers "$w" --ps "$num_ps" \
          --epochs "$epochs" --batch "$batch" >"$log" 2>&1 || status=failed ;;
      *) echo "recommender.sh: unknown scheme '$scheme'" >&2; exit 2 ;;
    esac
    record "$scheme" "$w" "$log" "$status"
  done
done

# The table: one row per worker count, samples/s / AUC / log loss per scheme.
{
  echo "$header"
  echo
  echo "$examples synthetic lines (vocabulary $vocabulary, seed 1; the last 10% held out), $epochs epochs, batch $batch, $num_ps ps."
  echo
  printf '| workers |'
  for s in $schemes; do printf ' %s samples/s | %s AUC | %s log loss |' "$s" "$s" "$s"; done
  echo " planted AUC |"
  printf '|---|'
  for s in $schemes; do printf -- '---|---|---|'; done
  echo "---|"
  for w in $workers_list; do
    printf '| %s |' "$w"
    best=""
    for s in $schemes; do
      row=$(awk -F, -v s="$s" -v w="$w" '$1 == s && $2 == w' "$csv" | tail -n 1)
      IFS=, read -r _ _ _ _ _ _ _ sps auc ll b status <<<"$row"
      [ -n "$b" ] && best=$b
      if [ "$status" = ok ]; then printf ' %s | %s | %s |' "$sps" "$auc" "$ll"
      elif [[ "$status" == "not run"* ]]; then printf ' not run | | |'
      else printf ' failed | | |'; fi
    done
    echo " ${best:--} |"
  done
} >"$out/recommender.md"
cat "$out/recommender.md"
