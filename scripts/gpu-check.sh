#!/usr/bin/env bash
# scripts/gpu-check.sh — verifies dtf on an NVIDIA GPU in one call, on a machine that reaches no
# package registry. Run from the repository root with the bundle of scripts/gpu-bundle.sh beside
# it (.gpu-bundle/). It unpacks the bundle into a private prefix (never over /), probes the
# machine, configures the CUDA build for the card's architecture, builds the tests, examples and
# benchmarks, and runs each part under its own time limit, going on after a part fails:
#
#   device      first, the cases of the GPU execution contract (docs/design/gpu-execution.md):
#               dtf_tests "[device],[step],[loss],[fused],[optim],[nan],[graph],[nccl_graph]" in
#               one process (the context's pool, the kernels, the loss ring, the steady step
#               captured in a CUDA graph, the fused loss and optimizer, the dense layers' cuBLASLt
#               epilogues against the cuBLAS path, a diverged run stopped at its step, the step
#               graphs of ring_allreduce against its eager step and their pool, host batches
#               through pinned slots; with 2+ GPUs the NCCL step captured on 2 ranks), then
#               ring_allreduce with 2 and 3 ranks on the TCP ring (threads sharing the GPU: the
#               buckets through pinned memory on the communication stream, section 6.0),
#               dtf_tests "[staging]" under compute-sanitizer's racecheck and synccheck
#   tests       dtf_tests (the whole unit suite on the GPU), each case in a process of its own
#   ctest       the other ctest entries that make sense on one GPU (the launcher's; the NCCL
#               check skips itself below 2 GPUs)
#   sanitizer   compute-sanitizer memcheck over the tensor and nn tests
#   examples    non_distributed, ring_allreduce (2 processes on the one GPU, TCP ring) and
#               sync_sgd (1 ps, 2 workers) under dtfrun, with test accuracy
#   bench       bench_gpu (MLP step, nn::dense against cublasSgemm, ps staging against a pageable
#               copy) beside PyTorch's step (benchmarks/gpu_step_time_torch.py)
#   e2e         end to end, 2 epochs of Fashion-MNIST: non_distributed at batch 64 and 512 (64
#               also with --nocuda_graph) and ring_allreduce with 2 processes sharing the GPU,
#               beside PyTorch on the same GPU (eager, fused Adam, the whole step in a CUDA graph, DDP over gloo;
#               benchmarks/gpu_e2e_torch.py); ring_allreduce's exchange backends side by side
#               (--backend tcp, then --backend nccl: with 2+ GPUs a GPU per process; with one,
#               NCCL takes one rank per GPU and the run must stop at once naming the shared GPU)
#   torch       not in the default parts (a CUDA build of its own, a few minutes): dtf's LibTorch
#               adapter on the GPU. Configures $DTF_GPU_BUILD-torch with PyTorch's LibTorch (with
#               CUDA: -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch.utils;
#               print(torch.utils.cmake_prefix_path)')), builds examples/torch_cnn, runs it one
#               epoch non-distributed and by ring_allreduce with 2 processes (dtfrun, the GPU
#               shared), beside the same CNN in PyTorch on the GPU, eager and DDP over gloo
#               (benchmarks/torch_cnn_ddp.py --device cuda), and prints a table (wall s, accuracy)
#
# Every log and SUMMARY.md go to $OUT when it is set, else gpu-results/ (logs packed into
# logs.tar.gz: a device call brings back at most 8 files). One summary line per part.
#
#   scripts/gpu-check.sh [--budget SECONDS] [--dry-run] [--configure-only] [--parts LIST]
#     --budget S        the whole run's limit (default 510): parts get what is left, the build
#                       first; a part with no time left is reported as skipped
#     --dry-run         no GPU: the CPU configuration from the bundle alone (DTF_CUDA=OFF), built
#                       (non_distributed, dtfrun, or $DTF_GPU_TARGETS) and one short run
#     --configure-only  stop after the configure step (scripts/gpu-rehearse.sh)
#     --no-build        run the parts on the build already there (a second call on the same machine)
#     --parts LIST      comma-separated subset of device,tests,ctest,sanitizer,examples,bench,e2e,
#                       torch (e.g. --parts torch --budget 540)
# Environment: DTF_GPU_BUNDLE (default .gpu-bundle), DTF_GPU_PREFIX (default
# /tmp/dtf-gpu-prefix-UID, emptied first), DTF_GPU_BUILD (default build-gpu, or build-gpu-dry), DTF_GPU_JOBS (default nproc).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
budget=510
mode=gpu
configure_only=0
no_build=0
parts=device,tests,ctest,sanitizer,examples,bench,e2e
while (($#)); do
  case $1 in
    --budget) budget=$2; shift 2 ;;
    --dry-run) mode=dry; shift ;;
    --configure-only) configure_only=1; shift ;;
    --no-build) no_build=1; shift ;;
    --parts) parts=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo pipefail$/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
deadline=$((SECONDS + budget))
bundle=${DTF_GPU_BUNDLE:-$root/.gpu-bundle}
prefix=${DTF_GPU_PREFIX:-${TMPDIR:-/tmp}/dtf-gpu-prefix-$(id -u)}
if [[ $mode == dry ]]; then build=${DTF_GPU_BUILD:-$root/build-gpu-dry}; else build=${DTF_GPU_BUILD:-$root/build-gpu}; fi
jobs=${DTF_GPU_JOBS:-$(nproc)}
out=${OUT:-$root/gpu-results}
mkdir -p "$out"
logs=$(mktemp -d /tmp/dtf-gpu-logs.XXXXXX)
export bundle prefix build logs  # read by the functions part() runs in a child bash
summary=$logs/summary-body.md  # SUMMARY.md is assembled by finish(): title, machine, parts
: >"$summary"
failures=0

say() { echo "$*" | tee -a "$summary"; }
want() { [[ ",$parts," == *",$1,"* ]]; }
want_any_tests() { want device || want tests || want ctest || want sanitizer; }
# part NAME LIMIT CMD...: runs CMD under min(LIMIT, time left) seconds, its output in
# logs/NAME.log; prints and records "| NAME | ok/FAILED/TIMED OUT/skipped | seconds | note |",
# the note from the function note_NAME if there is one (it reads the log).
part() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS - 5))
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    say "| $name | skipped | 0 | no time left in the budget |"
    return 1
  fi
  local t0=$SECONDS rc
  if declare -F "$1" >/dev/null; then  # a function of this script: in a child bash that has it
    timeout -k 5 "$limit" bash -c "$(declare -f "$1"); \"\$@\"" "$1" "$@" >"$logs/$name.log" 2>&1
  else
    timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1
  fi
  rc=$?
  local status=ok
  ((rc == 124 || rc == 137)) && status="TIMED OUT after ${limit} s"
  ((rc != 0 && rc != 124 && rc != 137)) && status="FAILED (exit $rc)"
  ((rc != 0)) && failures=$((failures + 1))
  local note=""
  if declare -F "note_$name" >/dev/null; then note=$("note_$name" "$logs/$name.log" | tr '\n' ' '); fi
  [[ -z $note && $rc != 0 ]] && note=$(grep -v '^\s*$' "$logs/$name.log" | tail -1 | cut -c1-200)
  say "| $name | $status | $((SECONDS - t0)) | $note |"
  return "$rc"
}
finish() {
  say ""
  say "Total: $SECONDS s; parts failed: $failures. Logs: logs.tar.gz (one file per part)."
  {
    echo "$title"
    echo
    if [[ -s $logs/probe.log ]]; then echo '```'; cat "$logs/probe.log"; echo '```'; echo; fi
    echo "| part | result | s | note |"
    echo "| --- | --- | --- | --- |"
    cat "$summary"
  } >"$out/SUMMARY.md"
  tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null
  [[ $out == "$root/gpu-results" ]] && cp "$logs"/*.log "$out"/ 2>/dev/null
  exit $((failures > 0))
}

tree=""  # a copy whose working tree is not its HEAD's (a device tool's copy) says so
git rev-parse -q --verify HEAD >/dev/null 2>&1 && ! git diff --quiet HEAD -- 2>/dev/null && tree=" (working tree differs)"
title="# dtf GPU check ($mode mode), $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$tree"
echo "$title"

# ---- 1. unpack the bundle into the private prefix -----------------------------------------
unpack() {
  [[ -f $bundle/MANIFEST ]] || { echo "no bundle at $bundle: run scripts/gpu-bundle.sh on a machine with the registry"; return 1; }
  rm -rf "$prefix"  # the same bundle unpacks to the same files: builds made earlier keep working
  mkdir -p "$prefix"
  local deb
  for deb in "$bundle"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix" || return 1
    else  # no dpkg: the .deb is an ar archive holding data.tar.*
      python3 - "$deb" "$prefix" <<'PY' || return 1
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
pos = 8  # "!<arch>\n"
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(data[pos + 60:pos + 60 + size])).extractall(sys.argv[2])
    pos += 60 + size + (size & 1)
PY
    fi
    echo "unpacked $(basename "$deb")"
  done
  # Absolute links (libz.so -> /lib/...) point into the prefix instead of the machine's /.
  local link target
  while IFS= read -r link; do
    target=$(readlink "$link")
    [[ $target == /* ]] && ln -sfn "$prefix$target" "$link"
  done < <(find "$prefix" -type l)
  du -sh "$prefix"
}
part unpack 60 unpack || { say "The bundle could not be unpacked: nothing else can run."; finish; }

# ---- 2. probe -------------------------------------------------------------------------------
cuda_root=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
py_module_dir() {  # the directory of an installed Python package (the nvidia-* wheels)
  python3 -c "import importlib.util as u, sys; s = u.find_spec(sys.argv[1]); print(list(s.submodule_search_locations)[0])" "$1" 2>/dev/null
}
arch=90
gpus=0
nccl_args=()
have_nccl=0
cublas_args=()
extra_includes="$prefix/usr/include/x86_64-linux-gnu"
probe() {
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
    gpus=$(nvidia-smi -L | grep -c '^GPU')
    local cap
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
    [[ $cap =~ ^[0-9]+$ ]] && arch=$cap
  else
    echo "nvidia-smi: no GPU visible"
  fi
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
  echo "host compiler: $(c++ --version 2>/dev/null | head -1 || echo 'not found')"
  echo "cmake: $(cmake --version | head -1); ninja: $(ninja --version 2>/dev/null || echo 'not found'); cores: $(nproc)"
  echo "python3: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1 | tail -1)"
  echo "compute-sanitizer: $(command -v compute-sanitizer || ls "$cuda_root"/bin/compute-sanitizer 2>/dev/null || echo 'not found')"
  # cuBLAS and NCCL: the toolkit's, else the Python wheels'.
  local lib
  lib=$(ls "$cuda_root"/lib64/libcublas.so* "$cuda_root"/targets/x86_64-linux/lib/libcublas.so* 2>/dev/null | head -1)
  if [[ -n $lib ]]; then
    echo "cuBLAS: $lib (toolkit)"
  elif lib=$(py_module_dir nvidia.cublas) && [[ -n $lib ]]; then
    local so
    so=$(ls "$lib"/lib/libcublas.so* 2>/dev/null | head -1)
    echo "cuBLAS: $so (Python wheel)"
    cublas_args=(-DCUDA_cublas_LIBRARY="$so")
    # cuBLASLt (the dense layers' epilogues, CUDA::cublasLt) ships in the same wheel.
    so=$(ls "$lib"/lib/libcublasLt.so* 2>/dev/null | head -1)
    [[ -n $so ]] && cublas_args+=(-DCUDA_cublasLt_LIBRARY="$so")
    extra_includes+=";$lib/include"
  else
    echo "cuBLAS: not found"
  fi
  local h
  h=$(ls "$cuda_root"/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -1)
  lib=$(ls "$cuda_root"/lib64/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1)
  if [[ -n $h && -n $lib ]]; then
    echo "NCCL: $lib (system)"
    have_nccl=1
  elif lib=$(py_module_dir nvidia.nccl) && [[ -n $lib && -f $lib/include/nccl.h ]]; then
    local so
    so=$(ls "$lib"/lib/libnccl.so* 2>/dev/null | head -1)
    echo "NCCL: $so (Python wheel)"
    nccl_args=(-DDTF_NCCL_INCLUDE_DIR="$lib/include" -DDTF_NCCL_LIBRARY="$so")
    have_nccl=1
  else
    echo "NCCL: not found (the NCCL backend is not built)"
  fi
  echo "architecture: sm_$arch; GPUs: $gpus"
}
probe >"$logs/probe.log" 2>&1  # not through part(): its variables must stay in this shell
cat "$logs/probe.log"
if [[ $mode == gpu && $gpus == 0 && $configure_only == 0 ]]; then
  say "No GPU is visible: use --dry-run on a machine without one."
  finish
fi

# ---- 3. configure ---------------------------------------------------------------------------
u=$prefix/usr
libdir=$u/lib/x86_64-linux-gnu
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
common=(
  -DCMAKE_BUILD_TYPE=Release -DDTF_BUILD_TESTS=ON -DDTF_BUILD_EXAMPLES=ON -DDTF_BUILD_BENCHMARKS=ON
  -DCMAKE_PREFIX_PATH="$u"
  -DDTF_ASIO_INCLUDE_DIR="$u/include"
  -DOPENSSL_ROOT_DIR="$u" -DOPENSSL_INCLUDE_DIR="$u/include"
  -DOPENSSL_SSL_LIBRARY="$libdir/libssl.so" -DOPENSSL_CRYPTO_LIBRARY="$libdir/libcrypto.so"
  -DZLIB_INCLUDE_DIR="$u/include" -DZLIB_LIBRARY="$libdir/libz.so"
  -DDTF_WITH_MPI=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_Doxygen=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5
  -DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES="$extra_includes"
)
if [[ $mode == gpu ]]; then
  config=(-DDTF_CUDA=ON -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch"
          -DCMAKE_CUDA_FLAGS=-allow-unsupported-compiler  # a host g++ newer than nvcc lists
          -DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES="$extra_includes" "${cublas_args[@]}" "${nccl_args[@]}")
  targets=()
  { want device || want tests; } && targets+=(dtf_tests)
  want ctest && targets+=(dtf_tests dtfrun) && ((have_nccl)) && targets+=(dtf_nccl_backend_check)
  want sanitizer && targets+=(dtf_tests)
  want examples && targets+=(non_distributed ring_allreduce sync_sgd dtfrun)
  want bench && targets+=(bench_gpu)
  want e2e && targets+=(non_distributed ring_allreduce dtfrun)
  want torch && targets+=(dtfrun)  # torch_cnn is built in a configuration of its own (part torch)
else
  config=(-DDTF_CUDA=OFF -DBLAS_LIBRARIES="$libdir/openblas-pthread/libopenblas.so"
          -DDTF_CBLAS_INCLUDE_DIR="$u/include/x86_64-linux-gnu/openblas-pthread")
  read -r -a targets <<<"${DTF_GPU_TARGETS:-non_distributed dtfrun}"
fi
note_configure() { grep -E "^-- (Found|dtf)|CMake Error" "$1" | head -12 | sed 's/^-- //' | paste -sd ';' | cut -c1-400; }
((no_build)) || part configure 120 cmake -S "$root" -B "$build" "${generator[@]}" "${common[@]}" "${config[@]}" ||
  { say "The configure step failed: nothing can be built."; finish; }
# Every dependency the configure step found must be the bundle's, none the machine's own copy.
deps_from_bundle() {
  local entries foreign
  entries=$(grep -E '^(OPENSSL|ZLIB|DTF_ASIO|DTF_CBLAS|BLAS|xtensor|xtl|cereal|nlohmann_json|Catch2)[A-Za-z_]*:[A-Z]+=.' \
    "$build/CMakeCache.txt" | grep -v NOTFOUND)
  echo "$entries"
  foreign=$(echo "$entries" | grep -v "=$prefix")
  [[ -z $foreign ]] || { echo "found outside the bundle: $foreign"; return 1; }
}
note_deps_from_bundle() { grep -c "=$prefix" "$1" | sed 's/$/ dependency paths, all in the bundle'"'"'s prefix/'; grep "outside" "$1"; }
part deps_from_bundle 10 deps_from_bundle
((configure_only)) && finish

# ---- 4. build ------------------------------------------------------------------------------
keep_going=(-k)
[[ ${#generator[@]} -gt 0 ]] && keep_going=(-k 0)
note_build() { grep -cE "error:|Error [0-9]" "$1" | sed 's/^/errors: /'; grep -m3 -E "error:" "$1" | cut -c1-160; }
((no_build)) || part build 330 cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- "${keep_going[@]}"
# A test source that nvcc could not compile is left out of dtf_tests (DTF_TEST_EXCLUDE), and
# the rest built again, so the other test cases still run; the summary names what was left out.
failed_test_sources() { grep -E '^FAILED: |\] Error [0-9]' "$logs/build.log" 2>/dev/null |
  grep -oE 'tests/CMakeFiles/dtf_tests\.dir/[A-Za-z0-9_]+\.cpp\.o' |
  sed -E 's|.*/||; s|\.o$||' | sort -u | paste -sd ';'; }
if ((!no_build)) && [[ $mode == gpu && ! -x $build/tests/dtf_tests ]] && want_any_tests; then
  excluded=$(failed_test_sources)
  if [[ -n $excluded ]]; then
    say "| dtf_tests | without $excluded | 0 | nvcc could not compile them (build.log): built again without them |"
    part configure_without 60 cmake -S "$root" -B "$build" -DDTF_TEST_EXCLUDE="$excluded" &&
      part build_without 240 cmake --build "$build" -j "$jobs" --target dtf_tests -- "${keep_going[@]}"
  fi
fi
# has PROGRAM PART: whether the build made PROGRAM; if not, PART is recorded as not built.
has() {
  [[ -x $1 ]] && return 0
  say "| ${2:-$(basename "$1")} | not built | 0 | $1 is missing (see build) |"
  failures=$((failures + 1))
  return 1
}
data=$u/share/datasets/fashion-mnist
acc() { python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('accuracy %.4f, global_step %s, %.1f s' % (m['accuracy'], m.get('global_step'), m.get('wall_s', 0)))" "$1" 2>/dev/null || echo "no metrics"; }

if [[ $mode == dry ]]; then
  if has "$build/examples/non_distributed"; then
    part dry_run_example 600 "$build/examples/non_distributed" --epochs 1 --train_examples 6000 --data "$data" \
      --metrics_file "$logs/dry.json" --target_accuracy 0.75
    say "non_distributed from the bundle: $(acc "$logs/dry.json"); linked against: $(ldd "$build/examples/non_distributed" | grep -E 'ssl|crypto|libz|openblas' | awk '{print $3}' | paste -sd ' ')"
  fi
  finish
fi

# ---- 5. the GPU parts -------------------------------------------------------------------------
# The lent machines have one GPU: every process of a job shares it, which dtf refuses unless asked
# (dtf/device/select.hpp: one GPU per local rank by default).
export DTF_SHARE_GPUS=1
t=$build/tests/dtf_tests
export t DTF_TEST_FASHION_MNIST=$data  # the tests that read Fashion-MNIST find the bundle's
e=$build/examples
dtfrun=$build/tools/dtfrun
note_tests() {
  echo "$(grep -c '^PASS:' "$1") test cases passed, $(grep -c '^FAIL:' "$1") failed;"
  grep '^FAIL:' "$1" | head -10 | cut -c7-110 | sed 's/$/;/'
}
# Each test case in a process of its own, 8 at a time: a crash (device memory read on the host,
# say) ends one case, not the suite. Catch2 reads ',' '[' ']' in a name as syntax: escaped.
isolated_tests() {
  "$t" --list-test-names-only | sed '/^$/d' >"$logs/test-names.txt" || return 1
  echo "$(wc -l <"$logs/test-names.txt") test cases, each in its own process, 8 at a time"
  tr '\n' '\0' <"$logs/test-names.txt" | xargs -0 -P 8 -n 1 bash -c '
    spec=$(printf "%s" "$1" | sed -e "s/[],[]/\\\\&/g")
    out=$(timeout 120 "$t" "$spec" --warn NoAssertions 2>&1)
    rc=$?
    if ((rc == 0)) && grep -q "in 1 test case" <<<"$out"; then echo "PASS: $1"
    else printf "FAIL: %s (exit %d)\n%s\n----\n" "$1" "$rc" "$(tail -n 40 <<<"$out")"; fi' _ >"$logs/test-results.txt"
  cat "$logs/test-results.txt"
  ! grep -q '^FAIL:' "$logs/test-results.txt"
}
# The contract's cases in one process: a failure names its case and assertion in the log.
device_tests='[device],[step],[loss],[fused],[optim],[nan],[graph],[nccl_graph]'
note_device() { grep -E "test cases|passed|failed" "$1" | tail -2 | cut -c1-160; grep -m3 -E "FAILED:|REQUIRE|CHECK" "$1" | cut -c1-120; }
if want device && has "$t" device; then
  part device 90 "$t" "$device_tests" --durations yes
  # The TCP ring's pinned staging (section 6.0): its cases plain, then under racecheck (shared
  # memory hazards in the step's kernels) and synccheck (invalid barriers) while the copies run.
  san=$(command -v compute-sanitizer || echo "$cuda_root/bin/compute-sanitizer")
  note_staging() { grep -E "test cases|passed|failed" "$1" | tail -2 | cut -c1-160; }
  note_staging_racecheck() { grep -E "ERROR SUMMARY|RACECHECK SUMMARY|All tests passed|test cases:" "$1" | tail -2; }
  note_staging_synccheck() { grep -E "ERROR SUMMARY|All tests passed|test cases:" "$1" | tail -2; }
  part staging 30 "$t" "[staging]"
  part staging_racecheck 60 "$san" --tool racecheck --error-exitcode 9 "$t" "[staging]"
  part staging_synccheck 60 "$san" --tool synccheck --error-exitcode 9 "$t" "[staging]"
fi
note_ctest() { grep -E "tests passed|Not Run|\*\*\*Skipped|Failed " "$1" | head -6 | cut -c1-160; }
note_sanitizer() { grep -E "ERROR SUMMARY|All tests passed|test cases:" "$1" | tail -2; }
if { want tests || want ctest; } && has "$t" tests; then
  say "GPUs visible: $gpus. With one GPU, mirrored's replicas share it (its NCCL reduction across GPUs needs 2 or more) and nccl_backend_check skips itself (exit 77)."
  want tests && part tests 200 isolated_tests
  want ctest && part ctest 90 ctest --test-dir "$build" -E '^(dtf_tests|install_and_consume)$' -j 8 --timeout 60 --output-on-failure
fi
if want examples; then
  note_non_distributed() { acc "$logs/nd.json"; }
  note_ring_allreduce() { acc "$logs/ring.json"; }
  note_sync_sgd() { acc "$logs/sync.json"; }
  has "$e/non_distributed" && part non_distributed 90 "$e/non_distributed" --epochs 2 --data "$data" \
    --metrics_file "$logs/nd.json" --save_checkpoints_secs 0
  if has "$dtfrun" "ring_allreduce and sync_sgd (dtfrun)"; then
    has "$e/ring_allreduce" && part ring_allreduce 90 "$dtfrun" --workers 2 --timeout_s 85 -- "$e/ring_allreduce" \
      --epochs 2 --data "$data" --metrics_file "$logs/ring.json"
    has "$e/sync_sgd" && part sync_sgd 90 "$dtfrun" --ps 1 --workers 2 --timeout_s 85 -- "$e/sync_sgd" --epochs 2 \
      --data "$data" --metrics_file "$logs/sync.json"
  fi
fi
if want bench; then
  note_bench_gpu() { grep -E "^device:" "$1"; }
  note_bench_torch() { grep -E "^device:" "$1"; }
  has "$build/benchmarks/bench_gpu" && part bench_gpu 120 "$build/benchmarks/bench_gpu" --data "$data"
  part bench_torch 90 python3 "$root/benchmarks/gpu_step_time_torch.py"
  # Side by side: dtf's and PyTorch's step, nn::dense against cuBLAS, staging against plain.
  python3 - "$logs/bench_gpu.log" "$logs/bench_torch.log" <<'PY' | tee -a "$summary"
import sys
rows = {}
for path in sys.argv[1:]:
    try:
        for line in open(path):
            if line.startswith("csv,"):
                f = line.strip().split(",")
                rows.setdefault(f[1], []).append(f[2:])
    except OSError:
        pass
step = {}
for r in rows.get("step", []):
    step.setdefault((r[1], r[2]), {})[r[0]] = float(r[3])
if step:
    print("\n| MLP step (Adam) | batch | dtf ms | PyTorch ms | PyTorch fused-Adam ms | PyTorch / dtf | fused / dtf |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (w, b), v in step.items():
        d, t, f = v.get("dtf"), v.get("torch"), v.get("torch_fused")
        cell = lambda x: f"{x:.3f}" if x else "-"
        ratio = lambda x: f"{x / d:.2f}" if d and x else "-"
        print(f"| {w} | {b} | {cell(d)} | {cell(t)} | {cell(f)} | {ratio(t)} | {ratio(f)} |")
if rows.get("gemm"):
    print("\n| GEMM rows x in x out | nn::dense GF/s | cublasSgemm GF/s | dense / cuBLAS |\n| --- | --- | --- | --- |")
    for r in rows["gemm"]:
        print(f"| {r[0]} x {r[1]} x {r[2]} | {r[3]} | {r[4]} | {float(r[3]) / float(r[4]):.2f} |")
if rows.get("staging"):
    print("\n| ps variable MiB | pull staged GB/s | pull plain GB/s | push staged GB/s | push plain GB/s |\n| --- | --- | --- | --- | --- |")
    for r in rows["staging"]:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} |")
PY
fi
if want e2e; then
  # dtf's wall_s is dtf::train's whole run (session, checkpoints off, the chief's evaluation after
  # each epoch); PyTorch's is its training loop alone, the data resident on the GPU for both.
  note_e2e_torch() { grep -E "^(device|graph|ddp)" "$1" | cut -c1-90; }
  if has "$e/non_distributed" && has "$e/ring_allreduce" && has "$dtfrun"; then
    for b in 64 512; do
      part "e2e_dtf_b$b" 60 "$e/non_distributed" --epochs 2 --batch "$b" --data "$data" \
        --metrics_file "$logs/e2e_b$b.json" --save_checkpoints_secs 0 --log_every 100000
    done
    # The same step without its CUDA graphs (docs/design/gpu-execution.md, section 7).
    part e2e_dtf_b64_eager 60 "$e/non_distributed" --epochs 2 --batch 64 --data "$data" --nocuda_graph \
      --metrics_file "$logs/e2e_b64_eager.json" --save_checkpoints_secs 0 --log_every 100000
    part e2e_dtf_ring 90 "$dtfrun" --workers 2 --timeout_s 85 -- "$e/ring_allreduce" --epochs 2 --batch 64 \
      --data "$data" --metrics_file "$logs/e2e_ring.json" --log_every 100000 --backend tcp
    # NCCL beside it (docs/design/gpu-execution.md, section 6.1). NCCL refuses two ranks on one
    # GPU: with one GPU the run passes when it stops with that error (an error, not a hang).
    note_e2e_dtf_ring_nccl() { grep -E "share a GPU|NCCL error|did not complete" "$1" | head -2 | cut -c1-160; }
    nccl_refused() {
      "$@"
      local rc=$?
      ((rc != 0)) && grep -q "share a GPU" "$logs/e2e_dtf_ring_nccl.log"
    }
    ring_nccl=("$dtfrun" --workers 2 --timeout_s 85 -- "$e/ring_allreduce" --epochs 2 --batch 64 --data "$data" \
      --metrics_file "$logs/e2e_ring_nccl.json" --log_every 100000 --backend nccl)
    if ((gpus >= 2)); then
      part e2e_dtf_ring_nccl 90 "${ring_nccl[@]}"
    else
      part e2e_dtf_ring_nccl 90 nccl_refused "${ring_nccl[@]}"
    fi
  fi
  part e2e_torch 240 python3 "$root/benchmarks/gpu_e2e_torch.py" --data "$data" --epochs 2
  python3 - "$logs" <<'PY' | tee -a "$summary"
import json, os, sys
logs = sys.argv[1]
def dtf(name):
    try:
        m = json.load(open(os.path.join(logs, name)))
        return m["wall_s"], m["accuracy"]
    except (OSError, ValueError, KeyError):
        return None
torch = {}
try:
    for line in open(os.path.join(logs, "e2e_torch.log")):
        if line.startswith("csv,e2e,"):
            f = line.strip().split(",")
            torch[(f[2], int(f[3]))] = (float(f[4]), float(f[6]))
except OSError:
    pass
cell = lambda r: f"{r[0]:.3f} s ({r[1]:.4f})" if r else "-"
print("\n| 2 epochs, Fashion-MNIST MLP, Adam | dtf | PyTorch eager | fused Adam | CUDA graph | DDP gloo | dtf / graph |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for label, d, b in (("1 process, batch 64", dtf("e2e_b64.json"), 64),
                    ("1 process, batch 64, --nocuda_graph", dtf("e2e_b64_eager.json"), 64),
                    ("1 process, batch 512", dtf("e2e_b512.json"), 512),
                    ("2 processes on one GPU, batch 64 each", dtf("e2e_ring.json"), 64),
                    ("2 processes, NCCL (a GPU each), batch 64 each", dtf("e2e_ring_nccl.json"), 64)):
    two = "2 processes" in label
    g = torch.get(("torch_graph", b)) if not two else None
    ratio = f"{d[0] / g[0]:.2f}" if d and g else "-"
    print(f"| {label} | {cell(d)} | {cell(None if two else torch.get(('torch_eager', b)))} | "
          f"{cell(None if two else torch.get(('torch_fused', b)))} | {cell(g)} | "
          f"{cell(torch.get(('torch_ddp', b)) if two else None)} | {ratio} |")
PY
fi
if want torch; then
  # A configuration of its own: the main one disables find_package(Torch) (the bundle has no
  # LibTorch); this one finds PyTorch's, whose LibTorch has CUDA (cmake/dtfTorch.cmake defines
  # dtf::torch in a CUDA build only then). The later -D options override the common ones.
  torch_build=$build-torch
  torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  note_torch_configure() { grep -E "dtf: LibTorch|CMake Error" "$1" | head -3 | sed 's/^-- //' | cut -c1-200; }
  note_torch_build() { note_build "$1"; }
  if [[ -z $torch_prefix ]]; then
    say "| torch | skipped | 0 | python3 has no torch (torch.utils.cmake_prefix_path) |"
    failures=$((failures + 1))
  elif part torch_configure 150 cmake -S "$root" -B "$torch_build" "${generator[@]}" "${common[@]}" "${config[@]}" \
      -DCMAKE_DISABLE_FIND_PACKAGE_Torch=OFF -DCMAKE_PREFIX_PATH="$u;$torch_prefix" \
      -DDTF_BUILD_TESTS=OFF -DDTF_BUILD_BENCHMARKS=OFF &&
    part torch_build 360 cmake --build "$torch_build" -j "$jobs" --target torch_cnn dtfrun; then
    cnn=$torch_build/examples/torch_cnn
    note_torch_cnn_single() { acc "$logs/torch_single.json"; }
    note_torch_cnn_ring() { acc "$logs/torch_ring.json"; }
    note_torch_eager() { grep -o 'RESULT .*' "$1" | cut -c1-120; }
    note_torch_ddp() { grep -o 'RESULT .*' "$1" | cut -c1-120; }
    if has "$cnn" torch_cnn; then
      part torch_cnn_single 150 "$cnn" --strategy ring_allreduce --epochs 1 --data "$data" \
        --metrics_file "$logs/torch_single.json" --save_checkpoints_secs 0
      part torch_cnn_ring 180 "$torch_build/tools/dtfrun" --workers 2 --timeout_s 175 -- "$cnn" --strategy ring_allreduce \
        --epochs 1 --data "$data" --metrics_file "$logs/torch_ring.json"
    fi
    part torch_eager 120 python3 "$root/benchmarks/torch_cnn_ddp.py" --device cuda --mode eager --epochs 1 --data "$data"
    part torch_ddp 150 env GLOO_SOCKET_IFNAME=lo python3 "$root/benchmarks/torch_cnn_ddp.py" --device cuda --mode ddp \
      --workers 2 --epochs 1 --data "$data"
    python3 - "$logs" <<'PY' | tee -a "$summary"
import json, os, re, sys
logs = sys.argv[1]
def dtf(name):
    try:
        m = json.load(open(os.path.join(logs, name)))
        return m["wall_s"], m["accuracy"]
    except (OSError, ValueError, KeyError):
        return None
def torch(log):
    try:
        m = re.search(r"RESULT .*accuracy=([0-9.na]+) wall_s=([0-9.]+)", open(os.path.join(logs, log)).read())
        return (float(m.group(2)), float(m.group(1))) if m else None
    except OSError:
        return None
cell = lambda r: f"{r[0]:.1f} s ({r[1]:.4f})" if r else "-"
print("\n| 1 epoch, Fashion-MNIST CNN (examples/torch_cnn), Adam, batch 64 | dtf + LibTorch | PyTorch |")
print("| --- | --- | --- |")
print(f"| 1 process (dtf: ring_allreduce alone; PyTorch: eager) | {cell(dtf('torch_single.json'))} | {cell(torch('torch_eager.log'))} |")
print(f"| 2 processes on one GPU (dtf: ring_allreduce, TCP; PyTorch: DDP gloo) | {cell(dtf('torch_ring.json'))} | {cell(torch('torch_ddp.log'))} |")
PY
  fi
fi
if want sanitizer && has "$t" sanitizer; then
  san=$(command -v compute-sanitizer || echo "$cuda_root/bin/compute-sanitizer")
  part sanitizer 120 "$san" --tool memcheck --error-exitcode 9 --leak-check no "$t" "[tensor],[nn]~[sparse],[optim],[strategies]" --warn NoAssertions
fi
finish
