#!/usr/bin/env bash
# Load study (issue 31, deliver 7): many workers on few parameter servers, every process on this
# machine, under dtfrun. For each job: its exit status and wall time, whether every worker's
# done report arrived, the error lines of any task, and per ps the CPU time it used, the
# requests it served, the CPU per request and the most TCP connections it held at once.
# A benchmark, not a test: it passes or fails nothing, and reports a failed job as a row.
#
#   benchmarks/load_jobs.sh [BUILD_DIR] [OUT_DIR]        (BUILD_DIR default: $DTF_BUILD_DIR, else build)
# Needs BUILD_DIR/tools/dtfrun and BUILD_DIR/examples/PROG for the programs the jobs run only
# (e.g. JOBS="sync_sgd:4:1 sync_sgd_backup:48:1" needs no hogwild).
# Environment:
#   JOBS="hogwild:4:1 sync_sgd:4:1 hogwild:4:4 sync_sgd:4:4 hogwild:64:4 sync_sgd:64:4
#        sync_sgd_backup:64:4 hogwild:48:1 sync_sgd:48:1 sync_sgd_backup:48:1"
#        each SCHEME:WORKERS:PS; SCHEME is an example program (build/examples/SCHEME), or
#        sync_sgd_backup (sync_sgd with N = workers - BACKUPS); sync_sgd runs with N = workers.
#        The 4-worker jobs are the reference: the same ps code under light load, in the same run
#   EPOCHS=10  BACKUPS=2  SEED=1  JOB_TIMEOUT_S=600  SAMPLE_S=0.5
#   ROUNDS=1: the job list runs ROUNDS times, round after round (jobs interleaved)
# Model: the examples' Fashion-MNIST MLP (784-256-128-10, 235,146 parameters, 940,584 bytes in
# 6 shards), batch 64, EPOCHS passes over the training set split between the workers.
#
# How each figure is taken:
# - requests, done reports at the ps, CPU: every ps task runs with the LD_PRELOAD shim
#   benchmarks/ps_request_count.c (compiled here into OUT_DIR), which parses the dtf frames the
#   ps reads from its accepted connections (frame kinds, include/dtf/detail/frame.hpp: 18 pull,
#   19 push, 23 sync push = the commit on ps 0, 22 done, 26 done tasks, 32 positions, 33 sync
#   stage = a part staged on ps 1.., 34 sync apply = ps 0's decision forwarded to ps 1.., 35 sync
#   decision = a pull asking ps 0 for a step's decision, 36 sync hold = the chief's hold of ps 0
#   for a checkpoint, ...) and writes them with getrusage's CPU time at exit. CPU per
#   request = the ps's CPU since its first request / its requests (the start-up, which loads the
#   data set, left out; the total is in the CSV too). As a check, /proc/PID/stat is also sampled
#   every SAMPLE_S (its last sample before the exit, proc_cpu_s).
# - connections: `ss -tn state established` every SAMPLE_S, counting the sockets whose local
#   port is the ps's (peak_estab); the shim's peak_open counts the connections the ps accepted
#   and had not closed.
# - threads (the most /proc/PID/stat showed) and context switches per request (voluntary +
#   involuntary, getrusage at exit): a lock-free ps (Hogwild) runs one I/O thread per worker
#   (include/dtf/train/through_ps.hpp).
# - done reports: the workers' "done after" (asynchronous) or "done at global step"
#   (synchronous) lines, the chief's RESULT line (printed only after its wait for every
#   worker's done report, finish_ps_job in include/dtf/train/ps_job.hpp), and each ps's done requests
#   (kind 22, one per worker per ps).
# - global steps (synchronous): the highest "done at global step" of the workers (global_step in
#   the CSV), so that a ps's CPU per training step compares protocols that send different
#   numbers of requests per step.
# - errors: lines of the job's log matching error|fail|timed out|refused|exception|terminat|abort
#   (saved as OUT_DIR/logs/NAME.errors).
# Writes OUT_DIR/load_jobs.csv (one row per ps of each job, appended as jobs finish), OUT_DIR/
# runs_<date>.txt (the lines printed here) and the logs under OUT_DIR/logs. Installs nothing.
set -uo pipefail
build=${1:-${DTF_BUILD_DIR:-build}}
out=${2:-$build/load_jobs}
jobs_list=${JOBS:-"hogwild:4:1 sync_sgd:4:1 hogwild:4:4 sync_sgd:4:4 hogwild:64:4 sync_sgd:64:4 sync_sgd_backup:64:4 hogwild:48:1 sync_sgd:48:1 sync_sgd_backup:48:1"}
epochs=${EPOCHS:-10}
backups=${BACKUPS:-2}
seed=${SEED:-1}
job_timeout=${JOB_TIMEOUT_S:-600}
sample_s=${SAMPLE_S:-0.5}
rounds=${ROUNDS:-1}
here=$(cd "$(dirname "$0")" && pwd)
dtfrun=$build/tools/dtfrun
progs=$(for spec in $jobs_list; do s=${spec%%:*}; [ "$s" = sync_sgd_backup ] && s=sync_sgd; echo "$s"; done | sort -u)
for f in "$dtfrun" $(for s in $progs; do echo "$build/examples/$s"; done); do
  [ -x "$f" ] || { echo "load_jobs.sh: $f not found (build dir: $build)" >&2; exit 2; }
done
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
shim=$out/ps_request_count.so
cc -O2 -shared -fPIC -o "$shim" "$here/ps_request_count.c" -ldl -lpthread || exit 2
csv=$out/load_jobs.csv
runs=$out/runs_$(date -u +%Y-%m-%d_%H%M).txt
[ -s "$csv" ] || echo "round,job,scheme,workers,ps,replicas,epochs,status,exit,wall_s,chief_wall_s,done_lines,result,error_lines,ps_index,ps_bytes,ps_done_reports,cpu_s,serve_cpu_s,proc_cpu_s,requests,pulls,pushes,sync_pushes,positions,done_tasks,other,us_per_request,peak_estab,peak_open,accepted,threads,csw_per_request,stages,applies,decisions,holds,global_step" >"$csv"
say() { echo "$*" | tee -a "$runs"; }
tck=$(getconf CLK_TCK)
say "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown), build $build"
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
[ -n "$src" ] && say "# build configured from $src (HEAD $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown), $(git -C "$src" status --porcelain 2>/dev/null | wc -l) changed files there now); dtfrun built $(date -u -r "$dtfrun" '+%Y-%m-%d %H:%M UTC')"
say "# jobs: $jobs_list; rounds $rounds; epochs $epochs; seed $seed; timeout ${job_timeout}s per job"

# kv FILE KEY: the value of KEY= in the shim's one-line report.
kv() { sed -n "s/.*[ ^]$2=\([^ ]*\).*/\1/p; s/^$2=\([^ ]*\).*/\1/p" "$1" | head -n 1; }

run_job() {
  local scheme=$1 w=$2 p=$3 prog args=() replicas=0
  case $scheme in
    sync_sgd) prog=sync_sgd replicas=$w args=(--replicas_to_aggregate "$w") ;;
    sync_sgd_backup) prog=sync_sgd replicas=$((w - backups)) args=(--replicas_to_aggregate "$replicas") ;;
    *) prog=$scheme ;;
  esac
  local name=$scheme-w$w-p$p log stats round=$4
  [ "$rounds" -eq 1 ] || name=$name-r$round
  log=$out/logs/$name.log stats=$out/logs/$name.stats
  rm -rf "$stats" && mkdir -p "$stats"
  local t0 t1
  t0=$(date +%s.%N)
  # Every ps task gets the shim; the other tasks run the program as it is.
  DTF_LOAD_STATS_DIR=$stats timeout -k 10 $((job_timeout + 60)) "$dtfrun" --no-live --grace_ms 30000 \
    --timeout_s "$job_timeout" --ps "$p" --workers "$w" -- \
    bash -c 'case $DTF_TASK in ps.*) export LD_PRELOAD=$0 ;; *) unset DTF_LOAD_STATS_DIR ;; esac; exec "$@"' "$shim" \
    "$build/examples/$prog" --epochs "$epochs" --seed "$seed" --log_every 1000000 --summary_every 0 \
    --save_checkpoints_secs 0 --blas_threads 1 "${args[@]}" >"$log" 2>&1 &
  local job=$!
  # Sample until the job ends: each ps's established connections (local port = its port) and
  # its CPU ticks from /proc.
  local -a port pid peak ticks threads
  local i
  for ((i = 0; i < p; i++)); do port[i]="" pid[i]="" peak[i]=0 ticks[i]="" threads[i]=0; done
  local peak_total=0
  while kill -0 "$job" 2>/dev/null; do
    for ((i = 0; i < p; i++)); do
      if [ -z "${port[i]}" ]; then
        local line
        line=$(grep -m1 "^dtfrun: started ps\.$i (pid" "$log" 2>/dev/null)
        [ -n "$line" ] && port[i]=${line##*:} pid[i]=$(sed 's/.*(pid \([0-9]*\)).*/\1/' <<<"$line")
      fi
    done
    local ssout
    ssout=$(ss -tnH state established 2>/dev/null)
    for ((i = 0; i < p; i++)); do
      [ -n "${port[i]}" ] || continue
      local n
      n=$(awk -v p=":${port[i]}" '{ if (substr($3, length($3) - length(p) + 1) == p) c++ } END { print c + 0 }' <<<"$ssout")
      [ "$n" -gt "${peak[i]}" ] && peak[i]=$n
      local st
      if st=$(cat "/proc/${pid[i]}/stat" 2>/dev/null); then
        local tt nt
        read -r tt nt < <(awk '{ sub(/.*\) /, ""); print $12 + $13, $18 }' <<<"$st")
        ticks[i]=$tt
        [ "$nt" -gt "${threads[i]}" ] && threads[i]=$nt
      fi
    done
    local tot
    tot=$(wc -l <<<"$ssout")
    [ "$tot" -gt "$peak_total" ] && peak_total=$tot
    sleep "$sample_s"
  done
  wait "$job"
  local rc=$?
  t1=$(date +%s.%N)
  local wall
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  local result chief_wall done_lines errors status=ok gstep
  result=$(grep -c 'RESULT scheme=' "$log")
  gstep=$(grep -oE '\| worker\.[0-9]+: done at global step [0-9]+' "$log" | awk '{ print $NF }' | sort -n | tail -n 1)
  chief_wall=$(grep -o 'RESULT .*' "$log" | sed -n 's/.* wall_s=\([^ ]*\).*/\1/p' | tail -n 1)
  done_lines=$(grep -oE '\| worker\.[0-9]+: done (after|at global step)' "$log" | sort -u | wc -l)
  grep -inE 'error|fail|timed out|refused|exception|terminat|abort' "$log" >"$out/logs/$name.errors"
  errors=$(wc -l <"$out/logs/$name.errors")
  [ "$rc" -eq 0 ] && [ "$result" -ge 1 ] && [ "$done_lines" -eq "$w" ] && [ "$errors" -eq 0 ] || status=failed
  say "$name: exit $rc, wall ${wall}s (chief ${chief_wall:-?}s), global step ${gstep:-?}, done reports $done_lines/$w, RESULT lines $result, error lines $errors, peak ESTAB sockets on the machine $peak_total ($status)"
  [ "$errors" -eq 0 ] || sed 's/^/    /' "$out/logs/$name.errors" | head -n 20 | tee -a "$runs"
  grep -o 'RESULT .*' "$log" | sed 's/^/    /' | tee -a "$runs"
  for ((i = 0; i < p; i++)); do
    local f
    f=$(ls "$stats"/ps."$i".*.txt 2>/dev/null | head -n 1)
    local cpu="" serve="" req="" pulls="" pushes="" spush="" pos="" dt="" other="" dn="" upr="" popen="" acc="" thr="" cpr=""
    local stage="" apply="" decision="" hold=""
    if [ -n "$f" ]; then
      cpu=$(awk -v u="$(kv "$f" utime_s)" -v s="$(kv "$f" stime_s)" 'BEGIN { printf "%.2f", u + s }')
      serve=$(kv "$f" serve_cpu_s) req=$(kv "$f" requests)
      pulls=$(kv "$f" kind_18) pushes=$(kv "$f" kind_19) spush=$(kv "$f" kind_23) pos=$(kv "$f" kind_32)
      dt=$(kv "$f" kind_26) dn=$(kv "$f" kind_22) popen=$(kv "$f" peak_open) acc=$(kv "$f" accepted)
      stage=$(kv "$f" kind_33) apply=$(kv "$f" kind_34) decision=$(kv "$f" kind_35) hold=$(kv "$f" kind_36)
      other=$((req - ${pulls:-0} - ${pushes:-0} - ${spush:-0} - ${pos:-0} - ${dt:-0} - ${stage:-0} - ${apply:-0} - ${decision:-0} - ${hold:-0}))
      upr=$(awk -v c="$serve" -v r="$req" 'BEGIN { if (r > 0) printf "%.1f", c / r * 1e6 }')
      cpr=$(awk -v a="$(kv "$f" vcsw)" -v b="$(kv "$f" ivcsw)" -v r="$req" 'BEGIN { if (r > 0) printf "%.2f", (a + b) / r }')
      [ "$(kv "$f" unparsed)" = 0 ] || say "    ps.$i: $(kv "$f" unparsed) bytes did not parse as dtf frames"
    else
      say "    ps.$i: no report from the shim (the ps did not exit normally)"
    fi
    local bytes
    bytes=$(sed -n "s/^ps\.$i *| ps\.$i: serving [0-9]* shards (\([0-9]*\) bytes).*/\1/p" "$log" | head -n 1)
    thr=${threads[i]}
    local pcpu=""
    [ -n "${ticks[i]}" ] && pcpu=$(awk -v t="${ticks[i]}" -v h="$tck" 'BEGIN { printf "%.2f", t / h }')
    echo "$round,$name,$scheme,$w,$p,$replicas,$epochs,$status,$rc,$wall,$chief_wall,$done_lines,$result,$errors,$i,$bytes,$dn,$cpu,$serve,$pcpu,$req,$pulls,$pushes,$spush,$pos,$dt,$other,$upr,${peak[i]},$popen,$acc,$thr,$cpr,$stage,$apply,$decision,$hold,$gstep" >>"$csv"
    say "    ps.$i (${bytes:-?} bytes): cpu ${cpu:-?}s (serving ${serve:-?}s, /proc ${pcpu:-?}s), requests ${req:-?} (pull ${pulls:-0}, push ${pushes:-0}, sync push ${spush:-0}, positions ${pos:-0}, done tasks ${dt:-0}, stage ${stage:-0}, apply ${apply:-0}, decision ${decision:-0}, hold ${hold:-0}, other $other), ${upr:-?} us/request, done reports ${dn:-?}/$w, peak ESTAB ${peak[i]}, peak open ${popen:-?} of ${acc:-?} accepted, ${thr:-?} threads, ${cpr:-?} context switches/request"
  done
}

for ((round = 1; round <= rounds; round++)); do
  for spec in $jobs_list; do
    IFS=: read -r scheme w p <<<"$spec"
    run_job "$scheme" "$w" "$p" "$round"
  done
done
say "# done $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
