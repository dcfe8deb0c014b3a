# benchmarks/torch_common.sh — what the LibTorch benchmarks (torch_cnn.sh, torch_transformer.sh)
# share: building their programs in a LibTorch build, teeing their output to
# benchmarks/results/, one contestant's run reduced to its RESULT line, and rounds with the order
# rotated. Sourced, never run; the caller sets NAME (its name in messages) and HERE (benchmarks/).

# torch_build BUILD TARGET...: turns DTF_BUILD_BENCHMARKS on in BUILD if it is off and brings the
# targets up to date (a no-op when they are: a stale program would lack flags). Exits on failure.
torch_build() {
  local build=$1 log=${TMPDIR:-/tmp}/dtf_${NAME}_build.log
  shift
  [[ -f $build/CMakeCache.txt ]] || { echo "$NAME.sh: $build is not a configured build directory" >&2; exit 2; }
  grep -q '^DTF_BUILD_BENCHMARKS:BOOL=ON' "$build/CMakeCache.txt" ||
    cmake -DDTF_BUILD_BENCHMARKS=ON "$build" >/dev/null || exit 1
  if ! cmake --build "$build" --target "$@" -j2 >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "$NAME.sh: cannot build $* in $build (is it configured with LibTorch? dtf::torch needs libtorch-dev)" >&2
    exit 1
  fi
}

# abs PATH: PATH made absolute.
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

# torch_output: from here on everything printed goes also to RESULTS
# (benchmarks/results/NAME_<date>.txt); sets work (a scratch folder removed at exit), OUT (the
# contestants' tagged RESULT lines) and START_LOAD. torch_finish closes it.
torch_output() {
  mkdir -p "$HERE/results"
  RESULTS=$HERE/results/${NAME}_$(date -u +%Y-%m-%d_%H%M).txt
  exec > >(tee "$RESULTS") 2>&1
  TEE=$!
  work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_$NAME.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  trap 'exit 130' INT TERM
  OUT=$work/results.txt
  : >"$OUT"
  START_LOAD=$(load)
}

load() { cut -d' ' -f1-3 /proc/loadavg; }

# result_line LOG RC CONTESTANT: prints the RESULT line's fields (without "RESULT "), or says
# the contestant failed (its exit status and the end of its output) and returns 1.
result_line() {
  local log=$1 rc=$2 line
  line=$(grep -o 'RESULT scheme=.*' "$log" | head -n1)
  if [[ -z $line || $rc != 0 ]]; then
    echo "  $3: FAILED (exit status $rc); its output:" >&2
    tail -n 20 "$log" | sed 's/^/    /' >&2
    return 1
  fi
  echo "${line#RESULT }"
}

# rounds N CONTESTANT...: runs `run CONTESTANT` for each, N rounds, round r starting with the
# r-th contestant so that noise from other work hits all of them alike; sets r for run.
rounds() {
  local n=$1 i
  shift
  local names=("$@")
  for ((r = 1; r <= n; r++)); do
    echo "round $r/$n (load $(load))"
    for ((i = 0; i < ${#names[@]}; i++)); do
      run "${names[$(((i + r - 1) % ${#names[@]}))]}"
    done
  done
}

# torch_finish: the machine's load after, where the output was written; waits for tee.
torch_finish() {
  echo "uptime after: $(uptime)"
  echo "(written to $RESULTS)"
  exec >&- 2>&-
  wait "$TEE"  # tee has written everything before the script ends
}
