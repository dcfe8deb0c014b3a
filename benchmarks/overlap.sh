#!/usr/bin/env bash
# benchmarks/overlap.sh — overlap of communication with backprop, in one run: 2-worker
# synchronous ring-allreduce training of the MLP 784-2048-2048-10 (Adam, batch 64 per worker,
# one BLAS thread per worker) with dtf's overlap on (bench_overlap_rank --overlap), off
# (--nooverlap), and PyTorch DDP on the same model (gloo, bucket_cap_mb 25 — DDP's default —
# and 4, dtf's bucket size; overlap_peer_ddp.py).
#
# Two settings, each with the programs interleaved round by round (dtf on, dtf off, DDP 25,
# DDP 4, then again, --rounds times, each pair in the other order every other round) so that
# noise from other work hits all of them alike:
#   loopback  both workers on this machine, 127.0.0.1 (dtf under dtfrun, DDP spawned)
#   netns     two "hosts": network namespaces joined by a veth pair shaped to 1 Gbit/s in both
#             directions (tc netem rate 1gbit; where the kernel lacks netem, a token bucket
#             of the same rate, tc tbf, said so), one worker in each; skipped, saying why, when
#             the machine refuses namespaces, veth pairs or both qdiscs
# Prints the median samples/s and step time of each, the ratios dtf-overlap / dtf-no-overlap
# and dtf-overlap / DDP per setting, and the machine's load (load average before each setting
# and at the end).
#
# Installs its peer itself (never the tests): Debian's python3-torch with apt (needs root).
#
#   benchmarks/overlap.sh [build-dir] [--rounds 3] [--steps 30] [--warmup 5] [--no-netns] [--no-loopback]
#                         [--hidden 2048,2048] [--batch 64] [--bucket_mib 4]
set -u
BUILD=${1:-build}
[[ $# -gt 0 ]] && shift
ROUNDS=3 STEPS=30 WARMUP=5 NETNS=1 LOOPBACK=1 HIDDEN=2048,2048 BATCH=64 BUCKET_MIB=4
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --hidden) HIDDEN=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --bucket_mib) BUCKET_MIB=$2; shift 2 ;;
    --no-netns) NETNS=0; shift ;;
    --no-loopback) LOOPBACK=0; shift ;;
    *) echo "overlap.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=$BUILD/benchmarks/bench_overlap_rank
DTFRUN=$BUILD/tools/dtfrun
for t in bench_overlap_rank:"$BENCH" dtfrun:"$DTFRUN"; do
  [[ -x ${t#*:} ]] || cmake --build "$BUILD" --target "${t%%:*}" -j2 || exit 1
done
BENCH=$(cd "$(dirname "$BENCH")" && pwd)/$(basename "$BENCH")
DTFRUN=$(cd "$(dirname "$DTFRUN")" && pwd)/$(basename "$DTFRUN")

# The peer: Debian's torch lives in the system interpreter (python3 on PATH may be another one).
TORCH_PY=/usr/bin/python3
if ! $TORCH_PY -c 'import torch' 2>/dev/null; then
  if pgrep -x apt-get >/dev/null || pgrep -x apt >/dev/null; then echo "overlap.sh: apt is running; try again later" >&2; exit 1; fi
  echo "overlap.sh: installing python3-torch (apt)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >/dev/null || exit 1
fi
PEER="$TORCH_PY $HERE/overlap_peer_ddp.py"

COMMON=(--hidden "$HIDDEN" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP")
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_overlap.XXXXXX")
OUT=$work/results.txt
id="dov$$"
NS=("${id}a" "${id}b")
pids=()
cleanup() {
  local pid ns
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for ns in "${NS[@]}"; do
    if ip netns list 2>/dev/null | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
      ip netns del "$ns" 2>/dev/null
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

load() { cut -d' ' -f1-3 /proc/loadavg; }
# record SETTING NAME LOGFILE: appends the rank-0 RESULT line of LOGFILE, tagged; says so when there is none.
record() {
  local line
  line=$(grep -o 'RESULT overlap=.*' "$3" | head -n1)
  if [[ -z $line ]]; then
    echo "overlap.sh: $1 $2 printed no RESULT; its output:" >&2
    tail -n 20 "$3" >&2
    return 1
  fi
  echo "setting=$1 run=$2 round=$r load1=$(cut -d' ' -f1 /proc/loadavg) ${line#RESULT }" >>"$OUT"
  echo "  $1 $2: ${line#RESULT }"
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(load)"
echo "# torch $($TORCH_PY -c 'import torch; print(torch.__version__)'), MLP 784-${HIDDEN//,/-}-10, batch $BATCH per worker, 2 workers, $WARMUP warm-up + $STEPS timed steps, $ROUNDS rounds"
: >"$OUT"
echo "start load=\"$(load)\"" >>"$OUT.load"

# --- loopback: dtfrun starts both dtf ranks (ports picked and handed over by dtfrun); the DDP
# peer spawns its ranks on a free port of 127.0.0.1.
# order A B: "A B" in odd rounds, "B A" in even ones (so that neither of a pair always runs first).
order() { if ((r % 2)); then echo "$1 $2"; else echo "$2 $1"; fi; }
# alone SETTING ROUND: one dtf rank with no cluster (no communication at all): the compute of a
# step, for reference (not a contestant).
alone() {
  local log=$work/${1}_alone_$2.log
  timeout 600 "$BENCH" "${COMMON[@]}" --bucket_mib "$BUCKET_MIB" --threads 1 >"$log" 2>&1
  record "$1" dtf_alone "$log"
}
for ((r = 1; r <= ROUNDS * LOOPBACK; r++)); do
  echo "loopback, round $r/$ROUNDS (load $(load))"
  alone loopback "$r"
  for mode in $(order overlap nooverlap); do
    log=$work/lo_${mode}_$r.log
    timeout 600 "$DTFRUN" --workers 2 --no-live -- "$BENCH" "${COMMON[@]}" --"$mode" --bucket_mib "$BUCKET_MIB" \
      --threads 1 >"$log" 2>&1
    record loopback "dtf_$mode" "$log"
  done
  for cap in $(order 25 "$BUCKET_MIB"); do
    log=$work/lo_ddp${cap}_$r.log
    GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 timeout 600 $PEER "${COMMON[@]}" --bucket_mib "$cap" --threads 1 \
      --workers 2 >"$log" 2>&1
    record loopback "ddp_$cap" "$log"
  done
done

# --- netns: two namespaces, a veth pair between them (eth0 in each, 10.77.0.1 and .2), each
# end shaped to 1 Gbit/s. Each rank is started in its namespace with its own cluster config.
netns_ok=0
netns_why=""
shaper=""
if [[ $NETNS == 0 ]]; then
  netns_why="--no-netns given"
elif ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  netns_why="no 'ip' or 'tc' command (iproute2)"
elif ! ip netns add "${NS[0]}" 2>"$work/netns.err"; then
  netns_why="this machine refuses network namespaces: ip netns add: $(head -n1 "$work/netns.err")"
elif ! ip netns add "${NS[1]}" 2>"$work/netns.err" || ! ip netns exec "${NS[0]}" true 2>"$work/netns.err"; then
  netns_why="this machine refuses network namespaces: $(head -n1 "$work/netns.err")"
elif ! ip link add "${id}x" netns "${NS[0]}" type veth peer name "${id}y" netns "${NS[1]}" 2>"$work/netns.err"; then
  netns_why="this machine refuses veth pairs: $(head -n1 "$work/netns.err")"
else
  netns_ok=1
  for i in 0 1; do
    ns=${NS[$i]}
    dev=$([[ $i == 0 ]] && echo "${id}x" || echo "${id}y")
    ip -n "$ns" link set "$dev" name eth0 && ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0 &&
      ip -n "$ns" link set lo up && ip -n "$ns" link set eth0 up || { netns_ok=0; netns_why="cannot configure $ns"; }
    # netem as asked; a kernel without sch_netem gets a token bucket of the same rate (tbf:
    # 1 Gbit/s, a burst of 256 KiB, at most 50 ms queued), said so in the output.
    if [[ $netns_ok == 1 ]]; then
      if ip netns exec "$ns" tc qdisc add dev eth0 root netem rate 1gbit 2>"$work/netns.err"; then
        shaper="tc netem rate 1gbit"
      elif ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1gbit burst 256kb latency 50ms 2>>"$work/netns.err"; then
        shaper="tc tbf rate 1gbit burst 256kb latency 50ms (netem refused: $(head -n1 "$work/netns.err"))"
      else
        netns_ok=0
        netns_why="this machine refuses tc netem and tbf: $(head -n1 "$work/netns.err")"
      fi
    fi
  done
  if [[ $netns_ok == 1 ]] && command -v ping >/dev/null && ! ip netns exec "${NS[0]}" ping -c1 -W2 10.77.0.2 >/dev/null 2>&1; then
    netns_ok=0
    netns_why="the namespaces cannot reach each other over the veth pair"
  fi
fi

if [[ $netns_ok == 1 ]]; then
  echo "netns: ${NS[0]} (10.77.0.1) <-> ${NS[1]} (10.77.0.2), each end shaped by $shaper"
  echo "netns: $(ip netns exec "${NS[0]}" tc qdisc show dev eth0 | head -n1)"
  echo "$shaper" >"$OUT.shaper"
  # What TCP gets through the shaped pair: 200 MiB from b to a, one connection.
  ip netns exec "${NS[0]}" "$TORCH_PY" -c '
import socket, time
s = socket.socket(); s.bind(("10.77.0.1", 22999)); s.listen(1)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    t0 = t0 or time.perf_counter(); n += len(b)
print(f"netns: TCP goodput a<-b {n * 8 / (time.perf_counter() - t0) / 1e9:.3f} Gbit/s ({n >> 20} MiB, one connection)")
' &
  gp=$!
  sleep 1
  ip netns exec "${NS[1]}" "$TORCH_PY" -c '
import socket
c = socket.create_connection(("10.77.0.1", 22999)); buf = bytes(1 << 20)
for _ in range(200): c.sendall(buf)
c.close()
' || echo "netns: the goodput probe failed"
  wait "$gp"
  echo "netns start load=\"$(load)\"" >>"$OUT.load"
  # Fresh namespaces hold no other listener, so fixed ports are free there; each run takes new
  # ones all the same, so that no socket of the previous run (TIME_WAIT) can be in the way.
  port=23000
  # both NAME LOG0 LOG1 CMD0... -- CMD1...: runs the two commands (rank 0 in namespace a,
  # rank 1 in b) and waits for both.
  both() {
    local name=$1 log0=$2 log1=$3 cmd0=() cmd1=() rc=0 p
    shift 3
    while [[ $1 != -- ]]; do cmd0+=("$1"); shift; done
    shift
    cmd1=("$@")
    timeout 600 ip netns exec "${NS[0]}" "${cmd0[@]}" >"$log0" 2>&1 &
    p0=$!
    timeout 600 ip netns exec "${NS[1]}" "${cmd1[@]}" >"$log1" 2>&1 &
    p1=$!
    pids=("$p0" "$p1")
    wait "$p0" || rc=$?
    wait "$p1" || rc=$?
    pids=()
    [[ $rc == 0 ]] || { echo "overlap.sh: netns $name exited with status $rc" >&2; tail -n 20 "$log1" >&2; }
  }
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "netns, round $r/$ROUNDS (load $(load))"
    alone netns "$r"
    for mode in $(order overlap nooverlap); do
      port=$((port + 2))
      c0=$("$DTFRUN" --print-tf-config --workers 2 --hosts 10.77.0.1,10.77.0.2 --port-base "$port" --task worker.0)
      c1=$("$DTFRUN" --print-tf-config --workers 2 --hosts 10.77.0.1,10.77.0.2 --port-base "$port" --task worker.1)
      log0=$work/ns_${mode}_${r}_0.log
      both "dtf_$mode" "$log0" "$work/ns_${mode}_${r}_1.log" \
        env TF_CONFIG="$c0" "$BENCH" "${COMMON[@]}" --"$mode" --bucket_mib "$BUCKET_MIB" --threads 1 -- \
        env TF_CONFIG="$c1" "$BENCH" "${COMMON[@]}" --"$mode" --bucket_mib "$BUCKET_MIB" --threads 1
      record netns "dtf_$mode" "$log0"
    done
    for cap in $(order 25 "$BUCKET_MIB"); do
      port=$((port + 2))
      log0=$work/ns_ddp${cap}_${r}_0.log
      both "ddp_$cap" "$log0" "$work/ns_ddp${cap}_${r}_1.log" \
        env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 $PEER "${COMMON[@]}" --bucket_mib "$cap" --threads 1 --workers 2 \
        --rank 0 --master "10.77.0.1:$port" -- \
        env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 $PEER "${COMMON[@]}" --bucket_mib "$cap" --threads 1 --workers 2 \
        --rank 1 --master "10.77.0.1:$port"
      record netns "ddp_$cap" "$log0"
    done
  done
else
  echo "netns: SKIPPED — $netns_why"
fi
echo "end load=\"$(load)\"" >>"$OUT.load"

echo
[[ -f $OUT.shaper ]] || echo "" >"$OUT.shaper"
$TORCH_PY - "$OUT" "$OUT.load" "$BUCKET_MIB" "$OUT.shaper" <<'PY'
import re, statistics, sys
runs, losses = {}, {}
for line in open(sys.argv[1]):
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    runs.setdefault(kv["setting"], {}).setdefault(kv["run"], []).append(
        (float(kv["samples_per_s"]), float(kv["step_ms"]), float(kv["load1"]), kv["round"]))
    if "loss" in kv:
        losses.setdefault(kv["setting"], {}).setdefault(kv["run"], set()).add(kv["loss"])
loads = [l.strip() for l in open(sys.argv[2])]
bucket = sys.argv[3]
names = [("dtf_alone", "(dtf, 1 worker, no comm.)"), ("dtf_overlap", "dtf, overlap on"), ("dtf_nooverlap", "dtf, overlap off"),
         ("ddp_25", "PyTorch DDP, bucket 25 MiB"), (f"ddp_{bucket}", f"PyTorch DDP, bucket {bucket} MiB")]
med = lambda xs: statistics.median(xs)
for setting, title in [("loopback", "2 workers on loopback (127.0.0.1)"),
                       ("netns", "2 namespaces, veth shaped to 1 Gbit/s (" + open(sys.argv[4]).read().strip() + ")")]:
    if setting not in runs:
        continue
    r = runs[setting]
    print(f"{title}:")
    print(f"  {'':30} {'samples/s':>10} {'step ms':>9} {'runs':>5} {'load1':>6}")
    m = {}
    for key, label in names:
        if key not in r:
            continue
        m[key] = med(x[0] for x in r[key])
        print(f"  {label:30} {m[key]:>10.1f} {med(x[1] for x in r[key]):>9.1f} {len(r[key]):>5} "
              f"{med(x[2] for x in r[key]):>6.2f}")
    # The ratio of the medians, and the median of the rounds' own ratios (the programs of a
    # round ran back to back, so a round's ratio sees the same machine load on both sides).
    def ratio(a, b):
        if a not in r or b not in r:
            return "n/a"
        by_round = {x[3]: x[0] for x in r[b]}
        paired = [x[0] / by_round[x[3]] for x in r[a] if by_round.get(x[3], 0) > 0]
        if not paired:
            return f"{m[a] / m[b]:.2f}"
        return f"{m[a] / m[b]:.2f} (rounds: median {med(paired):.2f}, {min(paired):.2f}-{max(paired):.2f})"
    print(f"  ratio dtf-overlap / dtf-no-overlap: {ratio('dtf_overlap', 'dtf_nooverlap')}")
    print(f"  ratio dtf-overlap / DDP 25 MiB:     {ratio('dtf_overlap', 'ddp_25')}")
    print(f"  ratio dtf-overlap / DDP {bucket} MiB:      {ratio('dtf_overlap', f'ddp_{bucket}')}")
    lo = losses.get(setting, {})
    on, off = lo.get("dtf_overlap", set()), lo.get("dtf_nooverlap", set())
    if on and off:
        same = on == off and len(on) == 1
        print(f"  dtf's last loss, overlap on / off: {','.join(sorted(on))} / {','.join(sorted(off))}"
              f" ({'identical' if same else 'DIFFERENT'})")
print("load averages (1, 5, 15 min):", "; ".join(loads))
print("(samples/s: both workers' examples per second, median of the rounds (the 1-worker row: its own); step ms: median;")
print(" load1: 1-minute load average when each run ended; ratios: of the median samples/s, then the median and range of each round's own ratio)")
PY
