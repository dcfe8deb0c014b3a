#!/usr/bin/env bash
# TLS on the ring (--tls, DTF_TLS=1; collective_options::tls) with real processes:
# --tls without a secret is a configuration error naming the secret; dtfrun runs ring_allreduce
# to completion with TLS from the environment (2 workers) and from the flags (3 workers: an
# odd ring), and mirrored across 2 processes; a worker with TLS and one without refuse each
# other, each naming the cause, and exit promptly; and, where mpirun and a private network
# namespace are at hand, the MPI rendezvous runs inside TLS too.
# Usage: test_ring_allreduce_tls.sh <dtfrun> <examples dir>
source "$(dirname "$0")/../multiprocess/lib.sh"
dir=$example
ring=(--epochs 1 --train_examples 3000 --log_every 20 --batch 32 --timeout_ms 20000)

"$dir/ring_allreduce" --job_name worker --task_index 0 --worker_hosts 127.0.0.1:1,127.0.0.1:2 "${ring[@]}" --tls \
  >"$work/nosecret.log" 2>&1 && fail "--tls without a secret was accepted"
grep -q "TLS needs a cluster secret" "$work/nosecret.log" || fail "--tls without a secret: the error does not say why"

DTF_CLUSTER_SECRET=s3cret-0123456789abcdef DTF_TLS=1 "$dtfrun" --workers 2 --timeout_s 200 -- "$dir/ring_allreduce" "${ring[@]}" \
  >"$work/env.log" 2>&1 || fail "dtfrun ring_allreduce with DTF_TLS=1 failed (status $?)"
grep -q "RESULT scheme=ring_allreduce workers=2" "$work/env.log" || fail "no RESULT line with DTF_TLS=1"
grep -q "ring inside TLS 1.3" "$work/env.log" || fail "DTF_TLS=1 did not turn TLS on for the ring"
grep -q "refused\|closed the connection" "$work/env.log" && fail "a ring connection was refused or dropped under TLS"

(umask 077 && echo s3cret-0123456789abcdef >"$work/secret")
"$dtfrun" --workers 3 --timeout_s 200 -- "$dir/ring_allreduce" "${ring[@]}" --secret_file "$work/secret" --tls \
  >"$work/flags.log" 2>&1 || fail "dtfrun ring_allreduce --tls (3 workers) failed (status $?)"
grep -q "RESULT scheme=ring_allreduce workers=3" "$work/flags.log" || fail "no RESULT line with --tls"
grep -q "ring inside TLS 1.3" "$work/flags.log" || fail "--tls did not turn TLS on for the ring"

DTF_CLUSTER_SECRET=s3cret-0123456789abcdef DTF_TLS=1 "$dtfrun" --workers 2 --timeout_s 200 -- "$dir/mirrored" --replicas 2 \
  "${ring[@]}" >"$work/mirrored.log" 2>&1 || fail "dtfrun mirrored (2 processes x 2 replicas) with TLS failed (status $?)"
grep -q "RESULT scheme=mirrored workers=2 replicas=2" "$work/mirrored.log" || fail "no RESULT line from mirrored with TLS"
grep -q "ring inside TLS 1.3" "$work/mirrored.log" || fail "DTF_TLS=1 did not turn TLS on for mirrored's ring"

# worker.0 without TLS (--tls=0), worker.1 with it (--tls=1); their ports are bound and listening
# before they start and handed down (tests/launch_with_ports.py).
start=$SECONDS
DTF_CLUSTER_SECRET=s3cret-0123456789abcdef timeout 60 python3 "$(dirname "$0")/../launch_with_ports.py" "$work" 2 --log "$work/mixed.{i}.log" \
  "$dir/ring_allreduce" --job_name worker --task_index "{i}" --worker_hosts "{hosts}" "${ring[@]}" --tls="{i}" || fail "the mixed-mode workers did not end within 60 s"
for i in 0 1; do
  read -r status <"$work/status.$i"
  ((status != 0)) || fail "worker.$i exited 0 in a ring where only one worker has TLS"
done
grep -q "requires TLS" "$work/mixed.0.log" || fail "the worker without TLS does not say that its peer requires TLS"
grep -q "without TLS" "$work/mixed.1.log" || fail "the worker with TLS does not say that its peer runs without TLS"
echo "mixed modes refused each other within $((SECONDS - start)) s"

if command -v mpirun >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  # The rendezvous port is fixed: the run gets a network namespace of its own.
  netns=()
  if unshare -n true 2>/dev/null; then netns=(unshare -n)
  elif unshare -rn true 2>/dev/null; then netns=(unshare -rn); fi
  if ((${#netns[@]})); then
    timeout 200 "${netns[@]}" bash -c 'ip link set lo up && exec "$@"' netns mpirun -np 2 --oversubscribe \
      --mca btl self,tcp -x DTF_TLS=1 -x DTF_CLUSTER_SECRET=s3cret-0123456789abcdef-0123456789abcdef "$dir/ring_allreduce" \
      --rendezvous 127.0.0.1:29500 "${ring[@]}" >"$work/mpi.log" 2>&1 || fail "ring_allreduce under mpirun with TLS failed"
    grep -q "source mpi" "$work/mpi.log" || fail "the ranks did not resolve the cluster from mpirun's variables"
    grep -q "RESULT scheme=ring_allreduce workers=2" "$work/mpi.log" || fail "no RESULT line under mpirun with TLS"
    grep -q "source mpi, ring inside TLS 1.3" "$work/mpi.log" || fail "TLS was not on under mpirun"
  else
    echo "mpirun part skipped: no private network namespace"
  fi
else
  echo "mpirun part skipped: no mpirun"
fi
grep -ho 'RESULT.*' "$work"/*.log
echo "PASS"
