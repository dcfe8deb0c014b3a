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

# The CUDA build compiles too (nvcc), without a GPU to run it, on by default where nvcc is
# found; DTF_CI_CUDA=0 skips it, DTF_CI_CUDA=all compiles every CUDA target (every example and
# test source, the MPI tests: long on 2 cores, see README). By default it compiles, in a build
# directory of its own under ccache, for one GPU architecture (compute capability 8.0):
#   - every public header in one nvcc translation unit (the ps client's pinned staging and its
#     CUDA copy engine included), and the MPI and NCCL backends' headers each in its own;
#   - the NCCL backend instantiated (dtf_nccl_backend_check);
#   - the examples that instantiate each family of strategies on device memory: mirrored
#     (linked with NCCL: the in-process reduction across GPUs), ring_allreduce, sync_sgd,
#     downpour, next_word (embedding tables) and custom_model, in one unit (dtf_cuda_examples).
# Skipped when the build above is already the CUDA build. Build directory: $DTF_CUDA_BUILD_DIR
# or build-cuda/.
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
ci_cuda=${DTF_CI_CUDA:-1}
if [[ $ci_cuda == 0 ]]; then
  echo "test.sh: the CUDA build is not compiled (DTF_CI_CUDA=0)"
elif [[ " $* " == *"DTF_CUDA=ON"* ]]; then
  echo "test.sh: the build above is the CUDA build"
elif [[ ! -x "$nvcc" ]]; then
  echo "test.sh: nvcc not found: the CUDA build is not compiled"
else
  cuda_build=${DTF_CUDA_BUILD_DIR:-build-cuda}
  start=$SECONDS
  if [[ $ci_cuda == all ]]; then
    archs="80;90"
    target=all
  else
    archs=80
    target=dtf_cuda_ci  # CMakeLists.txt: the units listed above
  fi
  cmake -S . -B "$cuda_build" -DCMAKE_BUILD_TYPE=Release -DDTF_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" -DDTF_BUILD_TESTS=ON -DDTF_BUILD_EXAMPLES=ON -DDTF_BUILD_BENCHMARKS=OFF
  cmake --build "$cuda_build" -j "$jobs" --target "$target"
  echo "test.sh: the CUDA build (nvcc) compiled $target in $((SECONDS - start)) s; it needs a GPU to run"
fi
