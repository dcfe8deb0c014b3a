# Shared by the multi-process tests; sourced with dtfrun and distributed_setup as $1 and $2.
set -u
dtfrun=${1:?usage: $0 <dtfrun> <distributed_setup>}
example=${2:?usage: $0 <dtfrun> <distributed_setup>}
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_mp.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

source "$(dirname "${BASH_SOURCE[0]}")/../script_lib.sh"

# The small training run every test uses: one epoch on a 3,000-example subset.
small=(--epochs 1 --train_examples 3000 --log_every 10 --batch 32)

# start_ps LOG ARGS...: starts a ps of $example in the background and waits until it serves.
# Its port is bound and listening before the ps starts, and handed down to it
# (tests/launch_with_ports.py): never free between its choice and its use. The workers' ports
# are names in the cluster only (no worker of a ps strategy listens). The cluster has
# $num_workers workers (default 1). Sets ps_pid, ps_port and cluster=(...); the ps's exit
# status appears in $work/ps/status.0.
start_ps() {
  local log=$1 ports workers
  shift
  mkdir -p "$work/ps"
  python3 "$(dirname "${BASH_SOURCE[0]}")/../launch_with_ports.py" "$work/ps" 1 --names "${num_workers:-1}" \
    --log "$log" "$example" --job_name ps --task_index 0 --ps_hosts "127.0.0.1:{port}" --worker_hosts "{names}" \
    "$@" &
  pids+=($!)
  wait_until 30 test -e "$work/ps/started" || fail "the ps did not start"
  read -r ps_pid <"$work/ps/pid.0"
  pids+=("$ps_pid")
  wait_until 30 bash -c "grep -q 'serving' '$log' || ! kill -0 $ps_pid 2>/dev/null" || fail "the ps did not start"
  grep -q 'serving' "$log" || fail "the ps exited at start"
  read -r -a ports <"$work/ps/ports"
  ps_port=${ports[0]}
  workers=$(printf '127.0.0.1:%s,' "${ports[@]:1}")
  cluster=(--ps_hosts "127.0.0.1:$ps_port" --worker_hosts "${workers%,}")
}
