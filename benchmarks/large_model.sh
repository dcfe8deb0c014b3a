#!/usr/bin/env bash
# A large model (default 6 GiB of float32) on 2 ps with momentum, every task a process of its
# own (bench_large_model; benchmarks/large_model.cpp says what each phase measures):
#   run train           2 ps + the chief: init, --steps steps (pull, gradient, push), save;
#                       the chief exits, both ps are killed (SIGKILL)
#   run restore_chief   2 fresh ps + a fresh chief: restore through the chief, pull, check a
#                       sample against momentum SGD recomputed, one more step checked; killed
#   run restore_files   the same with each ps reading its own files (ps_reads_files)
# Peak resident memory is VmHWM of /proc/PID/status: the chief reads its own after each phase,
# this script reads each ps's just before it kills it.
#
#   benchmarks/large_model.sh [--gib 6] [--steps 3] [--shard_mib 64] [--build build]
#                             [--dir /tmp/dtf_large_model] [--samples 1024] [--keep] [--estimate_only]
#                             [--netns]
#
# Link: by default every task on 127.0.0.1. --netns puts the tasks on two "hosts", as
# benchmarks/overlap.sh does: both ps in one network namespace (10.78.0.1), the chief in another
# (10.78.0.2), joined by a veth pair whose two ends are each shaped to 1 Gbit/s by a token bucket
# (tc tbf rate 1gbit burst 256kb latency 50ms; this kernel has no netem). Where the machine
# refuses namespaces, a veth pair or the shaper, the script says why and exits 1; the
# namespaces are deleted on every exit. The calibration runs go over the same link.
#
# Memory: above 0.5 GiB the same three runs first run at 0.25 and 0.5 GiB (calibration, some
# 30 s); each task's peak is fitted as a + b * GiB and extrapolated to --gib; the run needs 2 ps
# and the chief at once (the sum of their peaks, an upper bound). It is printed, and the run is
# refused when MemAvailable is below it, or when the disk of --dir cannot hold the checkpoint
# (values and momentum). --estimate_only stops after printing it. The checkpoint directory is
# deleted at the end unless --keep.
set -euo pipefail
gib=6 steps=3 shard_mib=64 build=build dir=/tmp/dtf_large_model samples=1024 keep=0 estimate_only=0 netns=0
while (($#)); do
  case $1 in
    --gib | --steps | --shard_mib | --build | --dir | --samples)
      (($# >= 2)) || { echo "$1 needs a value" >&2; exit 2; }
      declare "${1#--}=$2"
      shift 2
      ;;
    --keep) keep=1 && shift ;;
    --estimate_only) estimate_only=1 && shift ;;
    --netns) netns=1 && shift ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2 && exit 2 ;;
  esac
done
bench=$build/benchmarks/bench_large_model
[[ -x $bench ]] || { echo "no $bench: build it first (ninja -C $build bench_large_model)" >&2; exit 1; }
mkdir -p "$dir"
rm -rf "$dir/ckpt" "$dir"/*.port "$dir"/*.log "$dir"/*.results
secret=$dir/secret
(umask 077 && head -c 32 /dev/urandom | base64 >"$secret")

# --netns. host: the ps's address; in_ps, in_chief: the command prefixes that run a task on its
# host (empty on loopback); namespaces: those to delete at exit.
host=127.0.0.1 in_ps=() in_chief=() namespaces=()
remove_netns() {
  local ns pid
  for ns in "${namespaces[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
refuse_netns() { echo "--netns refused: $*" >&2 && exit 1; }
# make_netns: the two namespaces, the veth pair (eth0 in each) and the shapers; sets host,
# in_ps and in_chief, or exits 1 saying what the machine refused.
make_netns() {
  local err=$dir/netns.err i ns ends=("dlm$$a" "dlm$$b")
  command -v ip >/dev/null || refuse_netns "no 'ip' command (iproute2)"
  command -v tc >/dev/null || refuse_netns "no 'tc' command (iproute2)"
  namespaces=("dlm$$ps" "dlm$$chief")
  for ns in "${namespaces[@]}"; do
    ip netns add "$ns" 2>"$err" || refuse_netns "this machine refuses network namespaces: $(head -n1 "$err")"
    ip netns exec "$ns" true 2>"$err" || refuse_netns "cannot run a program in a namespace: $(head -n1 "$err")"
  done
  ip link add "${ends[0]}" netns "${namespaces[0]}" type veth peer name "${ends[1]}" netns "${namespaces[1]}" \
    2>"$err" || refuse_netns "this machine refuses veth pairs: $(head -n1 "$err")"
  for i in 0 1; do
    ns=${namespaces[i]}
    { ip -n "$ns" link set "${ends[i]}" name eth0 &&
      ip -n "$ns" addr add "10.78.0.$((i + 1))/24" dev eth0 && ip -n "$ns" link set lo up &&
      ip -n "$ns" link set eth0 up; } 2>"$err" || refuse_netns "cannot configure $ns: $(head -n1 "$err")"
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 256kb latency 50ms 2>"$err" ||
      refuse_netns "this machine refuses tc tbf: $(head -n1 "$err")"
  done
  if command -v ping >/dev/null && ! ip netns exec "${namespaces[1]}" ping -c1 -W2 10.78.0.1 >/dev/null 2>&1; then
    refuse_netns "the namespaces cannot reach each other over the veth pair"
  fi
  host=10.78.0.1 in_ps=(ip netns exec "${namespaces[0]}") in_chief=(ip netns exec "${namespaces[1]}")
  echo "netns: ps in ${namespaces[0]} (10.78.0.1), the chief in ${namespaces[1]} (10.78.0.2); each end:" \
    "$(ip netns exec "$ns" tc qdisc show dev eth0 | head -n1)"
}

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  remove_netns
  if ((keep)); then echo "kept $dir"; else rm -rf "$dir/ckpt" "$secret"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

source "$(dirname "$0")/../tests/script_lib.sh"  # wait_until: a bounded poll

# start_ps LOG INDEX: a ps in the background; sets ps_pid[INDEX] and ps_port[INDEX] once it listens.
ps_pid=() ps_port=()
start_ps() {
  local log=$1 i=$2 port_file="$dir/ps$2.port" pid
  rm -f "$port_file"
  "${in_ps[@]}" "$bench" --role ps --index "$i" --host "$host" --port_file "$port_file" --dir "$dir/ckpt" \
    --secret_file "$secret" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_until 60 bash -c "test -s '$port_file' || ! kill -0 $pid 2>/dev/null" || true
  [[ -s $port_file ]] || { echo "ps.$i did not start:" >&2 && cat "$log" >&2 && exit 1; }
  read -r "ps_port[i]" _ <"$port_file"
  ps_pid[i]=$pid  # the ps itself under --netns too: ip netns exec execs it
}

# all_runs GIB TAG: the three runs at GIB GiB; results in $dir/TAG.results, logs in $dir/TAG.*.log;
# prints the chief's lines when TAG is "run". Returns 1 if a run failed.
all_runs() {
  local g=$1 tag=$2 results="$dir/$2.results" run i kib status failed=0 log
  : >"$results"
  rm -rf "$dir/ckpt" && mkdir -p "$dir/ckpt"
  for run in train restore_chief restore_files; do
    [[ $tag == run ]] && echo "== run $run =="
    start_ps "$dir/$tag.$run.ps0.log" 0
    start_ps "$dir/$tag.$run.ps1.log" 1
    log=$dir/$tag.$run.chief.log status=0
    # In the background, so that a signal to this script ends the run at once (the trap).
    "${in_chief[@]}" "$bench" --role chief --run "$run" --ps "$host:${ps_port[0]},$host:${ps_port[1]}" --gib "$g" \
      --steps "$steps" --shard_mib "$shard_mib" --samples "$samples" --dir "$dir/ckpt" --secret_file "$secret" \
      >"$log" 2>&1 &
    pids+=($!)
    wait $! || status=$?
    [[ $tag == run ]] && { grep -v '^result ' "$log" || true; }
    grep '^result ' "$log" >>"$results" || true
    kib=$(awk '/^chief: VmHWM/ { print $3 }' "$log")
    echo "rss $run chief ${kib:--1}" >>"$results"
    for i in 0 1; do  # each ps's peak, then SIGKILL
      kib=$(awk '/^VmHWM:/ { print $2 }' "/proc/${ps_pid[i]}/status" 2>/dev/null || true)
      echo "rss $run ps.$i ${kib:--1}" >>"$results"
      kill -KILL "${ps_pid[i]}" 2>/dev/null || true
      wait "${ps_pid[i]}" 2>/dev/null || true
    done
    if ((status != 0)); then
      echo "run $run FAILED (exit $status): $(tail -n 1 "$log")"
      echo "failed $run" >>"$results"
      failed=1
      [[ $run == train ]] && break  # nothing to restore
    fi
  done
  return "$failed"
}

# peak TAG KIND: the largest VmHWM (KiB) of the tasks of KIND (ps or chief) over TAG's runs.
peak() { awk -v k="$2" '$1 == "rss" && index($3, k) == 1 && $4 > m { m = $4 } END { print m + 0 }' "$dir/$1.results"; }

avail_mib=$(awk '/^MemAvailable:/ { printf "%.0f", $2 / 1024 }' /proc/meminfo)
echo "machine: $(nproc) cores, MemAvailable $avail_mib MiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
link="loopback (127.0.0.1)"
if ((netns)); then
  make_netns
  link="netns, veth shaped to 1 Gbit/s (tc tbf) each way"
fi
if awk -v g="$gib" 'BEGIN { exit !(g > 0.5) }'; then
  for g in 0.25 0.5; do
    all_runs "$g" "calib$g" >/dev/null || { echo "the calibration run at $g GiB failed (logs: $dir/calib$g.*.log)" >&2 && exit 1; }
    echo "calibration at $g GiB: peak ps $(($(peak "calib$g" ps) / 1024)) MiB, chief $(($(peak "calib$g" chief) / 1024)) MiB"
  done
  # a + b * GiB through the two points, in MiB.
  fit() { awk -v p="$1" -v q="$2" -v g="$gib" 'BEGIN { b = (q - p) / 0.25; printf "%.0f", (p - 0.25 * b + b * g) / 1024 }'; }
  ps_mib=$(fit "$(peak calib0.25 ps)" "$(peak calib0.5 ps)")
  chief_mib=$(fit "$(peak calib0.25 chief)" "$(peak calib0.5 chief)")
  need_mib=$((2 * ps_mib + chief_mib))
  echo "estimate for a $gib GiB model: each ps $ps_mib MiB, the chief $chief_mib MiB; the three at once $need_mib MiB"
  if ((avail_mib < need_mib)); then
    echo "refused: MemAvailable is $avail_mib MiB, below the $need_mib MiB this run needs (try a smaller --gib)" >&2
    exit 1
  fi
else
  echo "no memory estimate at $gib GiB (made above 0.5 GiB only)"
fi
ckpt_mib=$(awk -v g="$gib" 'BEGIN { printf "%.0f", 2048 * g }')  # values and momentum
free_mib=$(df -Pm "$dir" | awk 'NR == 2 { print $4 }')
if ((free_mib < ckpt_mib + 1024)); then
  echo "refused: $dir has $free_mib MiB free, the checkpoint needs $ckpt_mib MiB (and 1 GiB to spare)" >&2
  exit 1
fi
((estimate_only)) && exit 0

failed=0
all_runs "$gib" run || failed=1
echo
echo "== large model: $gib GiB of float32, momentum, 2 ps, $steps steps; $link; GB = 1e9 bytes =="
awk '
  $1 == "result" { printf "%-14s %-9s %9.3f s %8.3f GB/s   %8.0f MiB\n", $2, $3, $4, $5 / $4 / 1e9, $6 / 1024 }
' "$dir/run.results" | sed '1i run            phase       seconds       rate   chief VmHWM after it'
echo
echo "peak RSS (VmHWM) per task, MiB:"
awk '
  $1 == "rss" { rss[$2, $3] = $4; if (!($2 in seen)) { seen[$2] = 1; order[n++] = $2 } }
  $1 == "failed" { bad[$2] = 1 }
  END {
    printf "%-14s %9s %9s %9s\n", "run", "ps.0", "ps.1", "chief"
    split("ps.0 ps.1 chief", tasks, " ")
    for (k = 0; k < n; ++k) {
      r = order[k]
      printf "%-14s", r
      for (t = 1; t <= 3; ++t) { v = rss[r, tasks[t]]; if (v < 0) printf " %9s", "-"; else printf " %9.0f", v / 1024 }
      printf "%s\n", (r in bad) ? "   FAILED" : ""
    }
  }' "$dir/run.results"
exit "$failed"
