#!/usr/bin/env bash
# A one-node Slurm cluster, brought up by this test from Debian's packages (slurm-wlm, munge)
# in a temporary directory and torn down after: munged with its own key and socket, slurmctld
# and slurmd with their own configuration, state, spool, pid and log files, on free ports.
# Then `srun -n 4` runs the downpour example as 1 ps + 3 workers, each task resolving the
# cluster from Slurm's variables (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST),
# on the full run (five epochs of the 60,000 training examples, about 12 s here) that must
# reach 0.80 test accuracy (it reaches about 0.85; asynchronous updates make it vary).
# Skipped (exit 77) with the reason where it cannot start: not root, no slurmctld/slurmd/srun/
# munged, or the daemons do not come up.
# Usage: test_slurm_srun.sh <downpour example>
set -uo pipefail
example=${1:?usage: $0 <downpour example>}
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root (munged and slurmd run as root here)"
for tool in munged slurmctld slurmd srun scontrol; do
  command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null ||
    skip "$tool not found (apt-get install slurm-wlm munge; scripts/install-deps.sh does)"
done
export PATH=$PATH:/usr/sbin
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_slurm.XXXXXX")
chmod 755 "$work"
daemons=()
cleanup() {
  local p
  for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${daemons[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
source "$(dirname "$0")/../script_lib.sh"

free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

node=$(hostname -s)
getent hosts "$node" >/dev/null || skip "this host's name '$node' does not resolve (the tasks address each other by it)"
read -r ctld_port slurmd_port < <(free_ports 2)
# The node's 4 tasks listen on base_port .. base_port+3: a run of 4 free ports.
base_port=$(python3 - <<'PY'
import socket
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p + 3 > 65535: continue
    socks = []
    try:
        for q in range(p, p + 4):
            t = socket.socket(); t.bind(("127.0.0.1", q)); socks.append(t)
        print(p); break
    except OSError:
        pass
    finally:
        for t in socks: t.close()
PY
)
[[ -n $base_port ]] || skip "no run of 4 free ports for the tasks"
mkdir -p "$work"/{state,spool,munge}
chmod 700 "$work/munge"

# munge: a fresh key and a private socket.
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --force --key-file="$work/munge/munge.key" --socket="$work/munge/munge.sock" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" --seed-file="$work/munge/seed" \
  >"$work/munged.out" 2>&1 || skip "munged did not start: $(cat "$work/munged.out" "$work/munge/munged.log" 2>/dev/null | tail -3)"
wait_until 10 test -s "$work/munge/munged.pid" || skip "munged wrote no pid file"
daemons+=("$(cat "$work/munge/munged.pid")")

cat >"$work/slurm.conf" <<CONF
ClusterName=dtftest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/munge.sock
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$work/slurm.conf
unset TF_CONFIG

slurmctld -f "$SLURM_CONF" -i >"$work/slurmctld.out" 2>&1 || skip "slurmctld did not start: $(tail -3 "$work/slurmctld.log" 2>/dev/null)"
wait_until 15 test -s "$work/slurmctld.pid" || skip "slurmctld wrote no pid file: $(tail -3 "$work/slurmctld.log" 2>/dev/null)"
daemons+=("$(cat "$work/slurmctld.pid")")
slurmd -f "$SLURM_CONF" >"$work/slurmd.out" 2>&1 || skip "slurmd did not start: $(tail -3 "$work/slurmd.log" 2>/dev/null)"
wait_until 15 test -s "$work/slurmd.pid" || skip "slurmd wrote no pid file: $(tail -3 "$work/slurmd.log" 2>/dev/null)"
daemons+=("$(cat "$work/slurmd.pid")")
node_idle() { scontrol show node "$node" 2>/dev/null | grep -q "State=IDLE"; }
wait_until 30 node_idle || skip "the Slurm node did not become idle: $(scontrol show node "$node" 2>&1 | grep -m1 State; tail -3 "$work/slurmd.log")"
echo "slurm: one-node cluster '$node' up (slurmctld :$ctld_port, slurmd :$slurmd_port)"

cmd=(srun -n 4 --time=5 "$example" --num_ps 1 --base_port "$base_port" --epochs 5
     --log_every 100 --target_accuracy 0.80)
echo "running: ${cmd[*]}"
start=$SECONDS
timeout 240 "${cmd[@]}" >"$work/srun.log" 2>&1
rc=$?
echo "srun exited $rc after $((SECONDS - start)) s"
((rc == 0)) || fail "srun -n 4 failed (exit $rc): $(tail -20 "$work/srun.log")"
# No flags and no TF_CONFIG name the cluster: the tasks found it in Slurm's variables.
grep -q "^ps.0: serving" "$work/srun.log" || fail "rank 0 did not serve as ps.0: $(head -20 "$work/srun.log")"
grep -q "^RESULT scheme=downpour workers=3 " "$work/srun.log" || fail "no RESULT line for 3 workers: $(tail -20 "$work/srun.log")"
grep -q "^ps.0: shut down by the chief" "$work/srun.log" || fail "the ps was not shut down by the chief"
grep -o 'RESULT.*' "$work/srun.log"
echo PASS
