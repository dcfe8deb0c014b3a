#!/usr/bin/env bash
# README's test command: installs the dependencies, configures, builds everything (library
# headers one by one, tests, examples, benchmarks) and runs the test suite through ctest.
# Build directory: $DTF_BUILD_DIR or build/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build=${DTF_BUILD_DIR:-build}
jobs=$(nproc)
# ccache hits across checkouts in different directories (CI clones afresh).
export CCACHE_BASEDIR="$PWD"
export CCACHE_NOHASHDIR=1
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTF_BUILD_TESTS=ON -DDTF_BUILD_EXAMPLES=ON \
  -DDTF_BUILD_BENCHMARKS=ON "$@"
cmake --build "$build" -j "$jobs"
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 900)

# The CUDA build can compile too, without a GPU to run it: nvcc builds every header (all
# in one translation unit; the MPI and NCCL backends' each in its own), dtf_tests, the
# tools and every example, in a build directory of its own under ccache.
# Only with DTF_CI_CUDA=1 (it adds about 12 minutes cold on 2 cores, and the merged tree has not
# been compiled with nvcc yet); skipped where nvcc is absent or when the build above is already
# the CUDA build. Build directory: $DTF_CUDA_BUILD_DIR or build-cuda/.
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
if [[ ${DTF_CI_CUDA:-0} != 1 ]]; then
  echo "test.sh: the CUDA build is not compiled (DTF_CI_CUDA=1 compiles it)"
elif [[ " $* " == *"DTF_CUDA=ON"* ]]; then
  echo "test.sh: the build above is the CUDA build"
elif [[ ! -x "$nvcc" ]]; then
  echo "test.sh: nvcc not found: the CUDA build is not compiled"
else
  cuda_build=${DTF_CUDA_BUILD_DIR:-build-cuda}
  start=$SECONDS
  cmake -S . -B "$cuda_build" -DCMAKE_BUILD_TYPE=Release -DDTF_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DDTF_BUILD_TESTS=ON -DDTF_BUILD_EXAMPLES=ON -DDTF_BUILD_BENCHMARKS=OFF
  cmake --build "$cuda_build" -j "$jobs"
  echo "test.sh: the CUDA build (nvcc) compiled in $((SECONDS - start)) s; its tests need a GPU to run"
fi
