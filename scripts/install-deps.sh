#!/usr/bin/env bash
# Installs every dependency of dtf from Debian packages. Idempotent: a package that is
# already installed is not fetched again, and apt-get update runs only when something is
# missing. Used by README's two commands and by .ci/run; a fresh machine needs nothing else.
set -euo pipefail

pkgs=(
  build-essential cmake ccache pkg-config
  libasio-dev                                   # transport (standalone Asio)
  libcereal-dev                                 # control messages, checkpoint metadata
  libxtensor-dev xtl-dev libxtensor-blas-dev    # host tensors
  libopenblas-dev                               # GEMM on CPU builds
  nlohmann-json3-dev                            # TF_CONFIG and other JSON
  libssl-dev                                    # HMAC in the cluster handshake; TLS 1.3 (--tls)
  libtorch-dev                                  # the optional LibTorch adapter (dtf::torch), its tests and torch_cnn
  zlib1g-dev                                    # gzip-compressed IDX files
  dataset-fashion-mnist                         # the real learning problem
  bible-kjv bible-kjv-text                      # the text of the next_word example (an embedding table on the ps)
  catch2                                        # tests (Catch2 v2)
  clang-14 libclang-rt-14-dev                   # libFuzzer for the frame-decoder fuzz target
  libbenchmark-dev                              # benchmarks
  libgloo-dev openmpi-bin libopenmpi-dev iperf3 # peers measured beside dtf; MPI backend and its tests
  slurm-wlm munge                               # the one-node Slurm cluster test (tests/slurm)
  python3-venv                                  # the TensorBoard reader test (tensorboard from PyPI)
  gnuplot-nox                                   # allreduce benchmark plot
  doxygen                                       # the API reference (dtf_docs; test api_reference_builds)
)

# Thrust comes from the CUDA toolkit's CCCL when there is one; Debian's copy otherwise.
cuda_root=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -d "$cuda_root/include/cccl/thrust" && ! -d "$cuda_root/include/thrust" ]]; then
  pkgs+=(libthrust-dev libcub-dev)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all dependencies present"
