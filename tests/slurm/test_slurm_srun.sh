#!/usr/bin/env bash
# A one-node Slurm cluster, brought up by this test from Debian's packages (slurm-wlm, munge)
# in a temporary directory and torn down after: munged with its own key and socket, slurmctld
# and slurmd with their own configuration, state, spool, pid and log files.
# Then `srun -n 4` runs the downpour example as 1 ps + 3 workers, each task resolving the
# cluster from Slurm's variables (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST),
# on the full run (five epochs of the 60,000 training examples, about 12 s here) that must
# reach 0.80 test accuracy (it reaches about 0.85; asynchronous updates make it vary).
# The ports are fixed (slurmctld 6817, slurmd 6818, the tasks 2222..2225), so the script runs
# in a network namespace of its own, where nobody else can hold them: it re-executes itself
# under `unshare -n`, and everything that talks (munged, slurmctld, slurmd, srun, the tasks)
# runs there. The tasks address each other by this host's name (Slurm's node list): each
# address it resolves to that is not local in the namespace is added to its `lo` (and so is
# 127.0.0.2, for slurmd: see below).
# Skipped (exit 77) with the reason where it cannot start: not root, no slurmctld/slurmd/srun/
# munged, no private network namespace, or the daemons do not come up.
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
for tool in unshare ip; do
  command -v "$tool" >/dev/null || skip "$tool not found (util-linux, iproute2): it makes the test's network namespace"
done
# Re-executed in a network namespace of its own (see above): DTF_SLURM_TEST_NETNS, the outer
# namespace's inode, marks the inner run, which checks that its namespace is another one.
outer_netns=${DTF_SLURM_TEST_NETNS:-}
unset DTF_SLURM_TEST_NETNS
netns=$(stat -L -c %i /proc/$$/ns/net) || skip "cannot read this process's network namespace"
if [[ -z $outer_netns ]]; then
  why=$(unshare -n true 2>&1) || skip "no private network namespace (unshare -n: ${why:-refused}); the fixed ports could be taken"
  DTF_SLURM_TEST_NETNS=$netns exec unshare -n "$BASH" "$0" "$@"
fi
[[ $netns != "$outer_netns" ]] || skip "not in a network namespace of its own (DTF_SLURM_TEST_NETNS set by the caller?)"
why=$(ip link set lo up 2>&1) || skip "cannot bring lo up in the test's network namespace: $why"
# An IPv4 address besides 127.0.0.1: glibc's getaddrinfo with AI_ADDRCONFIG and AF_INET (as
# slurmd resolves its listening address) fails where 127.0.0.1 is the only IPv4 address.
why=$(ip addr add 127.0.0.2/32 dev lo 2>&1) || skip "cannot add 127.0.0.2 to lo in the test's network namespace: $why"
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_slurm.XXXXXX")
chmod 755 "$work"
daemons=()
alive() {  # alive PID: the process exists and is not a zombie
  local key value
  while read -r key value; do
    [[ $key == State: ]] && { [[ $value != Z* ]]; return; }
  done 2>/dev/null <"/proc/$1/status"
  return 1
}
stop() {  # stop PID...: SIGTERM, up to 5 s for all to end, then SIGKILL
  local p left
  (($#)) || return 0
  for p; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 100); do
    left=0
    for p; do alive "$p" && left=1; done
    ((left)) || return 0
    sleep 0.05
  done
  for p; do kill -KILL "$p" 2>/dev/null; done
}
cleanup() {
  local d others=()
  stop "${daemons[@]}"
  # What the daemons leave behind (srun, slurmstepd, tasks, where the test was interrupted): every
  # other process in this test's own network namespace is one the test started.
  for d in /proc/[0-9]*; do
    [[ ${d#/proc/} != "$$" && $d/ns/net -ef /proc/$$/ns/net ]] && alive "${d#/proc/}" && others+=("${d#/proc/}")
  done
  stop "${others[@]}"
  rm -rf "$work"
}
trap cleanup EXIT
source "$(dirname "$0")/../script_lib.sh"

node=$(hostname -s)
addresses=$(getent ahosts "$node" | awk '!seen[$1]++ { printf "%s%s", sep, $1; sep = " " }')
[[ -n $addresses ]] || skip "this host's name '$node' does not resolve (the tasks address each other by it)"
# The name must lead to this namespace's lo: 127.0.0.0/8 and ::1 do once lo is up, any other
# address (a LAN one from /etc/hosts or DNS) is added to lo here (it leaves the host's untouched).
for address in $addresses; do
  ip route get "$address" 2>/dev/null | grep -q '^local ' && continue
  if [[ $address == *:* ]]; then prefix=(/128 nodad); else prefix=(/32); fi
  why=$(ip addr add "$address${prefix[0]}" dev lo "${prefix[@]:1}" 2>&1) ||
    skip "cannot add $node's address $address to lo in the test's network namespace: $why"
done
# Fixed ports: nobody but this test can hold them in its own network namespace.
ctld_port=6817 slurmd_port=6818 base_port=2222
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
echo "slurm: one-node cluster '$node' ($addresses) up in a private network namespace (slurmctld :$ctld_port, slurmd :$slurmd_port)"

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
