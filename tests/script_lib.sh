# Helpers shared by the script tests; source it once $work (the test's directory) is set.

# fail MESSAGE: prints the message and the last 40 lines of every log in $work, exits 1.
fail() {
  echo "FAIL: $*" >&2
  local f
  for f in "$work"/*.log; do
    [[ -f "$f" ]] || continue
    echo "---- $f (last 40 lines)" >&2
    tail -n 40 "$f" >&2
  done
  exit 1
}

# wait_until <seconds> <command...>: polls the command until it succeeds; false on timeout.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}
