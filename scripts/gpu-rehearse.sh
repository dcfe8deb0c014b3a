#!/usr/bin/env bash
# scripts/gpu-rehearse.sh [--cuda-build] — the GPU check's rehearsal on a CPU machine: proves
# that the bundle of scripts/gpu-bundle.sh is complete. Inside a private mount namespace, the
# machine's own copy of every bundled package is hidden (its headers, CMake packages, development
# libraries and the data: emptied directories, files bound to /dev/null), then
#   1. scripts/gpu-check.sh --configure-only   unpack, probe and the CUDA configure (nvcc)
#   2. scripts/gpu-check.sh --dry-run          the CPU configuration from the bundle alone, built
#                                              and trained briefly on the bundle's data
#   3. with --cuda-build: the GPU check's CUDA targets built with nvcc, timed
# Needs root (or unprivileged user namespaces) and an installed copy of the packages to hide
# (scripts/install-deps.sh). Results: gpu-results-rehearsal/ (SUMMARY.md of each step).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cuda_build=0
[[ ${1:-} == --cuda-build ]] && cuda_build=1
[[ -f .gpu-bundle/MANIFEST ]] || { echo "gpu-rehearse: no .gpu-bundle/: run scripts/gpu-bundle.sh first" >&2; exit 1; }

if [[ ${DTF_REHEARSAL_NAMESPACE:-} != 1 ]]; then
  flags=(--mount --propagation private)
  [[ $(id -u) -eq 0 ]] || flags+=(--map-root-user)
  exec unshare "${flags[@]}" env DTF_REHEARSAL_NAMESPACE=1 "$0" "$@"
fi

# ---- hide the machine's copies ---------------------------------------------------------------
# A file of a bundled package directly in one of these directories is bound to /dev/null; one
# deeper hides the whole directory below the root that holds it (asio/, openssl/, cmake/Catch2/).
# Links directly in a root stay (see below).
roots=(/usr/include /usr/include/x86_64-linux-gnu /usr/lib/cmake /usr/lib/x86_64-linux-gnu/cmake /usr/share/cmake
       /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/pkgconfig /usr/share/pkgconfig /usr/share/datasets)
runtime_only=(libssl3 zlib1g libopenblas0-pthread)  # what the system itself runs on stays
declare -A dirs=() files=()
while read -r pkg _; do
  [[ $pkg == \#* ]] && continue
  [[ " ${runtime_only[*]} " == *" $pkg "* ]] && continue
  dpkg-query -W "$pkg" >/dev/null 2>&1 || { echo "gpu-rehearse: $pkg is not installed here: nothing to hide" >&2; continue; }
  while read -r path; do
    [[ -f $path || -L $path ]] || continue
    best=""
    for r in "${roots[@]}"; do
      [[ $path == "$r"/* && ${#r} -gt ${#best} ]] && best=$r
    done
    [[ -z $best ]] && continue
    rest=${path#"$best"/}
    if [[ $rest == */* ]]; then dirs["$best/${rest%%/*}"]=1; else files["$path"]=1; fi
  done < <(dpkg -L "$pkg")
done <.gpu-bundle/MANIFEST
for d in "${!dirs[@]}"; do mount -t tmpfs -o size=64k,mode=755 dtf-hidden "$d"; done
for f in "${!files[@]}"; do
  # A link (libz.so -> libz.so.1.2.13) cannot be covered: a bind mount would land on the runtime
  # library it names, which the machine itself needs. gpu-check's deps_from_bundle step shows
  # the build linked the bundle's.
  [[ -f $f && ! -L $f ]] && mount --bind /dev/null "$f"
done
echo "gpu-rehearse: hid ${#dirs[@]} directories and ${#files[@]} files of the bundled packages"
# Proof that they are gone: each is absent (an emptied directory) or empty (bound to /dev/null).
for h in asio.hpp asio/io_context.hpp cereal/cereal.hpp xtensor/xtensor.hpp xtl/xtl_config.hpp nlohmann/json.hpp \
         openssl/ssl.h x86_64-linux-gnu/openssl/configuration.h zlib.h catch2/catch.hpp; do
  [[ ! -s /usr/include/$h ]] || { echo "gpu-rehearse: /usr/include/$h is still visible: hiding failed" >&2; exit 1; }
done
[[ ! -e /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ]] || { echo "gpu-rehearse: the data is still visible" >&2; exit 1; }

# ---- the steps ---------------------------------------------------------------------------------
results=$root/gpu-results-rehearsal
rm -rf "$results"
mkdir -p "$results"
status=0
OUT=$results/configure DTF_GPU_BUILD=$root/build-gpu-rehearsal scripts/gpu-check.sh --configure-only || status=1
OUT=$results/dry-run scripts/gpu-check.sh --dry-run --budget 3000 || status=1
if ((cuda_build)); then
  start=$SECONDS
  targets=(dtf_tests non_distributed ring_allreduce sync_sgd dtfrun bench_gpu dtf_nccl_backend_check)
  if cmake --build "$root/build-gpu-rehearsal" -j "$(nproc)" --target "${targets[@]}" -- -k 0 \
      >"$results/cuda-build.log" 2>&1; then
    echo "gpu-rehearse: the CUDA targets built from the bundle in $((SECONDS - start)) s on $(nproc) cores" |
      tee -a "$results/cuda-build.log"
  else
    echo "gpu-rehearse: the CUDA build failed after $((SECONDS - start)) s: $results/cuda-build.log" >&2
    status=1
  fi
fi
cat "$results"/*/SUMMARY.md
exit $status
