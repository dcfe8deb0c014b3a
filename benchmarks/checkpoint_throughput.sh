#!/usr/bin/env bash
# Checkpoint save and restore throughput of a ps cluster (1, 2 and 4 ps) next to dd and cp of
# the same bytes, in one run on the same disk.
#   benchmarks/checkpoint_throughput.sh [BUILD_DIR] [MIB] [RULE] [DIR]
# Defaults: build, a 1024 MiB model, sgd (the checkpoint is the model's bytes), /tmp/dtf_ckpt_bench.
# The dd/cp reads are not cache-cold (this script does not drop the page cache), nor are the
# benchmark's restores: compare like with like.
set -euo pipefail
build=${1:-build} mib=${2:-1024} rule=${3:-sgd} dir=${4:-/tmp/dtf_ckpt_bench}
bench=$build/benchmarks/bench_checkpoint_throughput
[[ -x $bench ]] || { echo "no $bench: build the benchmarks first" >&2; exit 1; }
tensors=1
[[ $rule == adam ]] && tensors=3
bytes_mib=$((mib * tensors))
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dtf_ckpt_dd.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
gbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.2f", b / s / 1e9 }'; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }
bytes=$((bytes_mib * 1048576))
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); disk of $dir: $(df -T "$(dirname "$dir")" | awk 'NR==2 {print $2}'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== dd and cp of the same $bytes_mib MiB =="
t=$(secs dd if=/dev/zero of="$scratch/a.bin" bs=1M count="$bytes_mib" conv=fsync)
echo "dd write+fsync   $t s  $(gbps $bytes "$t") GB/s"
t=$(secs dd if="$scratch/a.bin" of=/dev/null bs=1M)
echo "dd read          $t s  $(gbps $bytes "$t") GB/s"
t=$(secs sh -c "cp '$scratch/a.bin' '$scratch/b.bin' && sync '$scratch/b.bin'")
echo "cp + sync        $t s  $(gbps $bytes "$t") GB/s"
rm -f "$scratch"/*.bin
echo "== dtf checkpoints: $mib MiB model, $rule =="
"$bench" --mib "$mib" --rule "$rule" --repeats 3 --dir "$dir"
