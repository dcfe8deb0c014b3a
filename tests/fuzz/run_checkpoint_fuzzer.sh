#!/usr/bin/env bash
# Builds the checkpoint-reader fuzz target with clang's libFuzzer (plus AddressSanitizer and
# UBSan), writes a seed corpus of real checkpoints with the library's writers, and runs the
# target for a bounded time. Usage: run_checkpoint_fuzzer.sh SOURCE_DIR WORK_DIR SECONDS
set -euo pipefail
src=$1 work=$2 secs=${3:-30}
mkdir -p "$work/checkpoint_corpus" "$work/checkpoint_seeds"
cxx=$(command -v clang++-14 || command -v clang++)
launcher=$(command -v ccache || true)
flags=(-std=c++20 -g -O1 -I"$src/include" -I"$src/tests/fuzz")
$launcher "$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$src/tests/fuzz/checkpoint_fuzzer.cpp" -o "$work/checkpoint_fuzzer" -lcrypto
# The target writes the seeds itself before fuzzing (one compile, not two).
DTF_SEED_WORK="$work/checkpoint_seeds" DTF_SEED_CORPUS="$work/checkpoint_corpus" \
  "$work/checkpoint_fuzzer" -artifact_prefix="$work/checkpoint-" -dict="$src/tests/fuzz/checkpoint.dict" \
  -max_total_time="$secs" -rss_limit_mb=1024 -malloc_limit_mb=256 -seed=1 "$work/checkpoint_corpus"
