#!/bin/sh
# Builds the collective tests (ring, mirrored, the overlap of gradient buckets with backprop)
# with ThreadSanitizer (a separate small build, not part of CI) and runs the overlap tests.
# OpenMP's worker threads synchronise inside libgomp, which TSan does not see: the element-wise
# kernels run on one thread here (OMP_NUM_THREADS=1), as dtf's examples run them.
#   tests/tsan/run_collectives_tsan.sh [build dir, default build-tsan]
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$src/build-tsan}
mkdir -p "$out"
flags="-std=gnu++20 -O1 -g -fsanitize=thread -fopenmp -DASIO_NO_DEPRECATED -DASIO_STANDALONE -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -I$src/include -isystem /usr/local/cuda/include/cccl"
for f in main test_collectives; do
  [ "$out/$f.o" -nt "$src/tests/$f.cpp" ] || ${CXX:-c++} $flags -c "$src/tests/$f.cpp" -o "$out/$f.o" &
done
wait
${CXX:-c++} -fsanitize=thread "$out/main.o" "$out/test_collectives.o" -o "$out/collectives_tsan" -lopenblas -lssl -lcrypto -lz -lpthread -fopenmp
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" "$out/collectives_tsan" "[overlap]"
