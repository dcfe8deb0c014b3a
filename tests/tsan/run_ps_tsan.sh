#!/bin/sh
# Builds the ps concurrency (a checkpoint saved while lock-free pushes run included),
# hostile-peer, multi-ps synchronous, sparse (rows of synchronous steps included) and
# push-pieces (a push applied as it arrives) tests with ThreadSanitizer (a
# separate small build, not part of CI: it takes minutes on a small machine) and runs them.
#   tests/tsan/run_ps_tsan.sh [build dir, default build-tsan]
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$src/build-tsan}
mkdir -p "$out"
flags="-std=gnu++20 -O1 -g -fsanitize=thread -fopenmp -DASIO_NO_DEPRECATED -DASIO_STANDALONE -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -I$src/include -isystem /usr/local/cuda/include/cccl"
tests="main test_ps_concurrency test_ps_hostile test_sync test_sparse test_push_pieces"
objs=
pids=
for f in $tests; do
  o="$out/$f.o"
  objs="$objs $o"
  # Up to date when newer than its source and than every header of the library and the tests.
  if [ "$o" -nt "$src/tests/$f.cpp" ] && [ -z "$(find "$src/include" "$src/tests" -name '*.hpp' -newer "$o" | head -n 1)" ]; then
    continue
  fi
  rm -f "$o"
  ${CXX:-c++} $flags -c "$src/tests/$f.cpp" -o "$o" &
  pids="$pids $!"
done
for p in $pids; do wait "$p"; done  # each one: a failed compile stops the script
${CXX:-c++} -fsanitize=thread $objs -o "$out/ps_tsan" -lopenblas -lssl -lcrypto -lz -lpthread -fopenmp
TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" "$out/ps_tsan" "[concurrency],[hostile],[multi_ps],[sparse],[pieces]"
