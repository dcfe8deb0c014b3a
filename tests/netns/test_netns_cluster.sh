# Three "hosts" on this machine, built from network namespaces: a ps on one and a worker on
# each of the other two, addressed by the namespaces' own IPs (10.0.0.1-3) through veth
# pairs on a bridge (which sits in a fourth namespace, so the host's network is untouched).
# Each task's TF_CONFIG comes from `dtfrun --print-tf-config` for that host list. The job
# must train to the end: the chief's RESULT line, the ps shut down by the chief.
#
# Usage: test_netns_cluster.sh <dtfrun> <downpour>. Exits 77 (skipped) only when the machine
# refuses to create network namespaces; always removes the namespaces it made.
set -u
dtfrun=${1:?usage: $0 <dtfrun> <downpour>}
program=${2:?usage: $0 <dtfrun> <downpour>}
source "$(dirname "$0")/hosts_lib.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/dtf_netns.XXXXXX")
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  remove_netns_hosts
  rm -rf "$work"
}
trap cleanup EXIT

source "$(dirname "$0")/../script_lib.sh"

skip() {
  echo "SKIP: $*"
  exit 77
}

make_netns_hosts
addresses=(10.0.0.1 10.0.0.2 10.0.0.3)

list=$(IFS=,; echo "${addresses[*]}")
"$dtfrun" --print-tf-config --ps 1 --workers 2 --hosts "$list" --port-base 2222 >"$work/tf_config.txt" ||
  fail "dtfrun --print-tf-config failed"
grep -qF '"ps": ["10.0.0.1:2222"]' "$work/tf_config.txt" || fail "the ps is not placed on host 1: $(cat "$work/tf_config.txt")"

start() {  # start <namespace> <task> : runs the example there with its TF_CONFIG
  local ns=$1 task=$2 config
  config=$("$dtfrun" --print-tf-config --ps 1 --workers 2 --hosts "$list" --port-base 2222 --task "$task") ||
    fail "no TF_CONFIG for $task"
  TF_CONFIG="$config" ip netns exec "$ns" "$program" --epochs 2 --train_examples 6000 --batch 32 \
    --log_every 20 --finish_timeout_s 60 --metrics_file "$work/metrics.json" >"$work/$task.log" 2>&1 &
  pids+=($!)
}
start "${hosts[0]}" ps.0
start "${hosts[1]}" worker.0
start "${hosts[2]}" worker.1
chief=${pids[1]}

ended() { ! kill -0 "$1" 2>/dev/null; }
wait_until 120 ended "$chief" || fail "the chief did not finish within 120 s"
wait "$chief"
status=$?
[[ $status -eq 0 ]] || fail "the chief (worker.0 on host 2) exited with status $status"
grep -q '^RESULT scheme=downpour workers=2 accuracy=' "$work/worker.0.log" || fail "the chief printed no RESULT"
for task in ps.0 worker.1; do
  pid=${pids[$([[ $task == ps.0 ]] && echo 0 || echo 2)]}
  wait_until 30 ended "$pid" || fail "$task did not end after the chief"
  wait "$pid" || fail "$task exited with status $?"
done
grep -q 'shut down by the chief' "$work/ps.0.log" || fail "the ps was not shut down by the chief"
grep -q 'step=' "$work/worker.1.log" || fail "worker.1 on host 3 did not train"
grep -q '"accuracy"' "$work/metrics.json" || fail "no metrics file from the chief"
echo "trained across three namespaces: $(grep -o 'RESULT.*' "$work/worker.0.log")"
echo PASS
