#!/usr/bin/env bash
# mpirun (Debian's OpenMPI) across three "hosts" on this machine: network namespaces with
# their own IPs (10.0.0.1-3), joined by veth pairs on a bridge that sits in a fourth
# namespace (the host's network is untouched; see tests/netns/test_netns_cluster.sh).
# mpirun runs in host 1's namespace and starts its daemons on hosts 2 and 3 through a
# stand-in for ssh (the rsh agent below: `ip netns exec <namespace of that IP>`), one rank
# per host. The ranks of ring_allreduce meet at --rendezvous 10.0.0.1:29500, resolve the
# cluster from mpirun's variables ("source mpi") and train to 0.87 test accuracy; every host
# must have been launched to, and each rank's ring connections must run between its own
# host's address and another host's, inside that host's namespace.
#
# Usage: test_ring_allreduce_mpirun_hosts.sh <dtfrun> <examples dir>. Exits 77 (skipped)
# only when mpirun is absent or the machine refuses network namespaces; always removes the
# namespaces it made.
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
source "$(dirname "$0")/../netns/hosts_lib.sh"

# Replaces lib.sh's cleanup (the EXIT trap calls it by name): also every process in the
# namespaces, and the namespaces.
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  remove_netns_hosts
  rm -rf "$work"
}

skip() {
  echo "SKIP: $*"
  exit 77
}

command -v mpirun >/dev/null || skip "no mpirun"
command -v ss >/dev/null || fail "no 'ss' command (iproute2) to see the ranks' connections"
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

make_netns_hosts

# The "ssh" of these hosts: mpirun calls it as `agent <host> <command...>` (options before the
# host are skipped) and it runs the command in that host's namespace, as ssh would run it on
# the host; each call and where it went are in agent.log.
agent="$work/netns_ssh"
cat >"$agent" <<EOF
#!/usr/bin/env bash
# One write per line: the agent runs once per host at the same time, and lines written in
# pieces interleave.
line="call:\$(printf ' %q' "\$@")"
echo "\$line" >>'$work/agent.log'
while [[ \$1 == -* ]]; do shift; done
case \$1 in
  10.0.0.1) ns=${hosts[0]} ;;
  10.0.0.2) ns=${hosts[1]} ;;
  10.0.0.3) ns=${hosts[2]} ;;
  *) echo "netns_ssh: unknown host \$1" >&2; exit 255 ;;
esac
shift
echo "launch \$ns" >>'$work/agent.log'
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$agent"
fwd=()
[[ $(id -u) -eq 0 ]] && fwd=(-x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)

log="$work/run.log"
: >"$log"
# mpirun starts each daemon itself and every daemon talks to it directly: the "hosts" share one
# hostname (namespaces keep the machine's), and ORTE's tree spawn and radix routing then failed
# now and then to start or reach a daemon.
timeout 200 ip netns exec "${hosts[0]}" mpirun -np 3 --host 10.0.0.1,10.0.0.2,10.0.0.3 --map-by node \
  --oversubscribe --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include 10.0.0.0/24 \
  --mca plm_rsh_no_tree_spawn 1 --mca routed direct \
  --mca btl self,tcp --mca btl_tcp_if_include 10.0.0.0/24 "${fwd[@]}" \
  "$dir/ring_allreduce" --rendezvous 10.0.0.1:29500 --log_every 200 --target_accuracy 0.87 >"$log" 2>&1 &
run=$!
pids+=("$run")
# While the job trains (a step= line: every rank is past the rendezvous, whose connections are
# closed): in each host's namespace, a ring_allreduce process with an established TCP
# connection from that host's address to another host's (its ring neighbours).
ring_seen() {  # ring_seen <i>: prints host i's connections across the bridge; false if none
  ip netns exec "${hosts[$(($1 - 1))]}" ss -tnpH state established 2>/dev/null |
    awk -v me="10.0.0.$1" '/"ring_allreduce"/ { split($3, l, ":"); split($4, p, ":");
      if (l[1] == me && p[1] ~ /^10\.0\.0\.[0-9]+$/ && p[1] != me) { print; found = 1 } } END { exit !found }'
}
deadline=$((SECONDS + 200))
while kill -0 "$run" 2>/dev/null && ((SECONDS < deadline)); do
  if grep -q 'step=' "$log"; then
    for i in 1 2 3; do
      [[ -s "$work/ring.$i" ]] || ring_seen "$i" >"$work/ring.$i"
    done
  fi
  sleep 0.1
done
wait "$run"
status=$?
[[ $status -eq 0 ]] || fail "ring_allreduce under mpirun across the hosts failed (status $status)"
grep -q "source mpi" "$log" || fail "the ranks did not resolve the cluster from mpirun's variables"
grep -q "^RESULT scheme=ring_allreduce workers=3 " "$log" || fail "no RESULT line for 3 workers"
awk '/^RESULT/ { for (f = 1; f <= NF; ++f) if ($f ~ /^accuracy=/) ok = substr($f, 10) + 0 >= 0.87 } END { exit !ok }' \
  "$log" || fail "the accuracy is below 0.87"
for i in 2 3; do
  grep -qx "launch ${hosts[$((i - 1))]}" "$work/agent.log" 2>/dev/null ||
    fail "mpirun did not launch to host $i (10.0.0.$i) through the agent"
done
for i in 1 2 3; do
  [[ -s "$work/ring.$i" ]] || fail "no ring connection of a rank in host $i's namespace from 10.0.0.$i to another host"
  echo "host $i: ring_allreduce $(awk 'NR == 1 { print $3 " <-> " $4 }' "$work/ring.$i")"
done
grep -o 'RESULT.*' "$log"
echo PASS
