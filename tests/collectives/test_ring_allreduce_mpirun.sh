#!/usr/bin/env bash
# mpirun -np 2 (Debian's OpenMPI) -- ring_allreduce --rendezvous: the ranks meet at the
# rendezvous address and the full run reaches 0.87 test accuracy. Skipped without mpirun.
# Usage: test_ring_allreduce_mpirun.sh <dtfrun> <examples dir>
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
log="$work/run.log"
ok=0
for _ in 1 2 3; do  # a port picked by free_ports may be taken before rank 0 binds it: retry
  read -r port < <(free_ports 1)
  if timeout 200 mpirun -np 2 --oversubscribe --mca btl self,tcp "$dir/ring_allreduce" --rendezvous "127.0.0.1:$port" \
      --log_every 200 --target_accuracy 0.87 >"$log" 2>&1; then
    ok=1
    break
  fi
  grep -q "cannot listen" "$log" || break
done
((ok)) || fail "ring_allreduce under mpirun failed"
grep -q "source mpi" "$log" || fail "the ranks did not resolve the cluster from mpirun's variables"
grep -q "^RESULT scheme=ring_allreduce workers=2" "$log" || fail "no RESULT line"
grep -o 'RESULT.*' "$log"
echo "PASS"
