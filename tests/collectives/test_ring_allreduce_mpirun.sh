#!/usr/bin/env bash
# mpirun -np 2 (Debian's OpenMPI) -- ring_allreduce --rendezvous: the ranks meet at the
# rendezvous address and the full run reaches 0.87 test accuracy, while a stranger holds a
# silent connection to the rendezvous port. Skipped without mpirun or without a private network
# namespace.
# Usage: test_ring_allreduce_mpirun.sh <dtfrun> <examples dir>
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
log="$work/run.log"
# The rendezvous port is fixed, so the run goes in a network namespace of its own (nobody else
# can hold the port there): a user namespace makes it unprivileged where root is not at hand.
if unshare -n true 2>/dev/null; then netns=(unshare -n)
elif unshare -rn true 2>/dev/null; then netns=(unshare -rn)
else echo "SKIP: no private network namespace (a fixed rendezvous port could be taken)"; exit 77; fi
# A stranger holds a silent connection to the rendezvous port (it connects as soon as rank 0
# listens and never sends a byte): rank 0 handshakes every arriving connection at once, so the
# silent one must not stall the ranks' set-up. The connect is a wait on "rank 0 listens", bounded
# at 100 s, retried every 5 ms (no event says a port started listening); after it, the holder
# blocks until rank 0 drops the connection (its handshake timeout, or the end of set-up).
holder='import socket, sys, time
end = time.time() + 100
while True:
    try:
        s = socket.create_connection(("127.0.0.1", 29500)); break
    except OSError:
        if time.time() > end: sys.exit(1)
        time.sleep(0.005)
open(sys.argv[1], "w").write("connected\n")
s.settimeout(150)
try:
    s.recv(1)
except OSError:
    pass'
ok=0
timeout 200 "${netns[@]}" bash -c 'ip link set lo up || exit 1
  python3 -c "$1" "$2" & holder=$!
  shift 2
  "$@"; rc=$?
  kill "$holder" 2>/dev/null
  exit $rc' netns "$holder" "$work/holder" mpirun -np 2 --oversubscribe \
  --mca btl self,tcp "$dir/ring_allreduce" --rendezvous 127.0.0.1:29500 --log_every 200 --target_accuracy 0.87 \
  >"$log" 2>&1 && ok=1
((ok)) || fail "ring_allreduce under mpirun failed (with a silent connection held open at the rendezvous)"
grep -q connected "$work/holder" 2>/dev/null || fail "the silent client never connected to the rendezvous"
grep -q "source mpi" "$log" || fail "the ranks did not resolve the cluster from mpirun's variables"
grep -q "^RESULT scheme=ring_allreduce workers=2" "$log" || fail "no RESULT line"
grep -o 'RESULT.*' "$log"
echo "PASS"
