#!/usr/bin/env bash
# A late rank and a dead rank on dtf's MPI backend, 3 processes under mpirun.
#  stalled: the last rank stays alive but never enters the allreduce; ranks 0 and 1 fail with
#    errc::timeout after the 2000 ms timeout_ms (and before 2000 ms + 5 s) — the first to do so
#    aborts the job, which may end the other before it reports — and MPI_Abort ends the job (the
#    stalled rank included) with a non-zero status.
#  dead: the last rank exits without MPI_Finalize; OpenMPI's mpirun must end ranks 0 and 1
#    (stuck in the allreduce) with a non-zero status; no rank completes. (dtf's timeout never
#    comes into play: OpenMPI ends the job first.)
# Usage: test_mpi_backend_failures.sh <mpi_failure_scenario> <mpirun>
set -euo pipefail
prog=$1
mpirun=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_mpi_fail.XXXXXX")
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../../script_lib.sh"
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
flags=(-np 3 --oversubscribe --mca btl self,tcp)

rc=0
start=$SECONDS
timeout 90 "$mpirun" "${flags[@]}" "$prog" stalled 2000 >"$work/stalled.log" 2>&1 || rc=$?
((rc != 0 && rc != 124)) || fail "stalled: mpirun exited $rc (0: a rank completed; 124: the job hung)"
# The first of ranks 0 and 1 to reach its deadline reports and aborts the job, which may end the
# other before it reports: at least one TIMEOUT line, and every line reported must be right.
reported=0
for r in 0 1; do
  line=$(grep "^TIMEOUT $r " "$work/stalled.log") || continue
  reported=$((reported + 1))
  ms=$(awk '{print $3}' <<<"$line")
  ((ms >= 2000 && ms < 7000)) || fail "stalled: rank $r timed out after $ms ms (timeout_ms 2000)"
  grep -q "did not complete within 2000 ms" <<<"$line" || fail "stalled: rank $r's message: $line"
  grep -q "'grads'" <<<"$line" || fail "stalled: rank $r's message does not name the tensor: $line"
  echo "stalled: $line"
done
((reported >= 1)) || fail "stalled: neither rank 0 nor rank 1 reported a timeout"
! grep -q "^ERROR" "$work/stalled.log" || fail "stalled: a rank failed with another error: $(grep '^ERROR' "$work/stalled.log")"
! grep -q "^COMPLETED" "$work/stalled.log" || fail "stalled: a rank completed the allreduce"
echo "stalled: mpirun exited $rc after $((SECONDS - start)) s"

rc=0
start=$SECONDS
timeout 90 "$mpirun" "${flags[@]}" "$prog" dead >"$work/dead.log" 2>&1 || rc=$?
((rc != 0 && rc != 124)) || fail "dead: mpirun exited $rc (0: a rank completed; 124: the job hung)"
! grep -q "^COMPLETED" "$work/dead.log" || fail "dead: a rank completed the allreduce"
echo "dead: mpirun exited $rc after $((SECONDS - start)) s; OpenMPI said:"
grep -m3 -i "exit\|abort\|terminat" "$work/dead.log" || true
echo PASS
