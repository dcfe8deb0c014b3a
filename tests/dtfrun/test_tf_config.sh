# Each task gets a TF_CONFIG that is valid JSON, names its own type and index, lists the
# same cluster (chief, worker, ps; the evaluator left out) on distinct ports, and a DTF_TASK
# that matches; dtfrun announces each task with its pid and address. The training tasks (chief,
# then workers) get the local ranks 0..n-1 and DTF_LOCAL_SIZE n; ps and evaluator tasks get none.
source "$(dirname "$0")/lib.sh"

cat >"$work/task.sh" <<'TASK'
printf '%s %s %s\n' "$DTF_TASK" "${DTF_LOCAL_RANK--}/${DTF_LOCAL_SIZE--}" "$TF_CONFIG"
TASK

check() {  # check <expected job sizes as JSON> <dtfrun flags...>
  local sizes=$1
  shift
  "$dtfrun" "$@" -- bash "$work/task.sh" >"$work/run.out" 2>"$work/run.err"
  expect_rc 0 $? "dtfrun $*"
  "$py" - "$work/run.out" "$work/run.err" "$sizes" <<'PY' || fail "TF_CONFIG check for: $*"
import json, re, sys
out, err, sizes = open(sys.argv[1]).read().splitlines(), open(sys.argv[2]).read(), json.loads(sys.argv[3])
expected = {f"{job}.{i}" for job, n in sizes.items() for i in range(n)}
clusters, locals_ = {}, {}
for line in out:
    prefix, sep, rest = line.partition(" | ")
    assert sep, f"unprefixed line: {line!r}"
    name = prefix.rstrip()
    dtf_task, _, rest = rest.partition(" ")
    local, _, config = rest.partition(" ")
    assert dtf_task == name, f"DTF_TASK {dtf_task!r} printed under {name!r}"
    locals_[name] = local
    parsed = json.loads(config)
    job, index = name.split(".")
    assert parsed["task"] == {"type": job, "index": int(index)}, parsed["task"]
    clusters[name] = parsed["cluster"]
assert set(clusters) == expected, f"tasks {sorted(clusters)} != {sorted(expected)}"
trainers = [f"chief.{i}" for i in range(sizes.get("chief", 0))] + [f"worker.{i}" for i in range(sizes.get("worker", 0))]
for name in expected:
    want = f"{trainers.index(name)}/{len(trainers)}" if name in trainers else "-/-"
    assert locals_[name] == want, f"{name}: DTF_LOCAL_RANK/DTF_LOCAL_SIZE {locals_[name]}, expected {want}"
cluster = next(iter(clusters.values()))
assert all(c == cluster for c in clusters.values()), "tasks disagree on the cluster"
listed = {job: n for job, n in sizes.items() if n > 0 and job != "evaluator"}
assert {job: len(cluster[job]) for job in cluster} == listed, cluster
addresses = [a for members in cluster.values() for a in members]
ports = [int(a.split(":")[1]) for a in addresses]
assert all(a.startswith("127.0.0.1:") for a in addresses), addresses
assert len(set(ports)) == len(ports) and all(0 < p < 65536 for p in ports), ports
# One "started" line per task: cluster members with their address, the evaluator without.
for name in expected:
    job, index = name.split(".")
    at = "" if job == "evaluator" else " at " + cluster[job][int(index)]
    assert re.search(rf"^dtfrun: started {re.escape(name)} \(pid [0-9]+\){re.escape(at)}$", err, re.M), \
        f"no started line for {name}"
PY
}

check '{"ps": 2, "chief": 1, "worker": 2, "evaluator": 1}' --ps 2 --workers 2 --chief --evaluator
check '{"worker": 1}'
check '{"chief": 1}' --workers 0 --chief
check '{"ps": 1, "worker": 3}' --ps=1 --workers=3 --host 127.0.0.1

# --port-base: consecutive ports from it, in start order (ps, chief, workers).
"$dtfrun" --port-base 0 -- true >/dev/null 2>&1 && fail "--port-base 0 accepted"
# Fixed ports are only race-free where nobody else can hold them: a network namespace of this
# test's own (a user namespace makes it unprivileged). Where the machine refuses one, the case
# is skipped (a base picked on the shared loopback could be taken meanwhile), and so where
# iproute2's ip is missing (it brings the namespace's loopback up).
if unshare -rn true 2>/dev/null && command -v ip >/dev/null; then
  base=2222
  unshare -rn bash -c 'ip link set lo up && exec "$@"' netns \
    "$dtfrun" --ps 1 --workers 2 --port-base "$base" -- bash "$work/task.sh" >"$work/base.out" 2>"$work/base.err"
  expect_rc 0 $? "--port-base in a network namespace"
  grep -qF "\"worker\": [\"127.0.0.1:$((base + 1))\", \"127.0.0.1:$((base + 2))\"], \"ps\": [\"127.0.0.1:$base\"]" \
    "$work/base.out" || fail "--port-base $base: ports not consecutive: $(head -n1 "$work/base.out")"
else
  echo "SKIP (this case): no private network namespace (or no ip command) for --port-base"
fi

# --print-tf-config: a line per task (name, tab, TF_CONFIG) for tasks spread over hosts.
"$dtfrun" --print-tf-config --ps 2 --workers 3 --chief --evaluator --hosts h1,h2,h3 >"$work/print.out" 2>"$work/print.err"
expect_rc 0 $? "--print-tf-config"
"$py" - "$work/print.out" <<'PY' || fail "--print-tf-config round-robin placement"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
names = [l.split("\t")[0] for l in lines]
assert names == ["ps.0", "ps.1", "chief.0", "worker.0", "worker.1", "worker.2", "evaluator.0"], names
configs = [json.loads(l.split("\t", 1)[1]) for l in lines]
want = {"chief": ["h3:2222"], "worker": ["h1:2223", "h2:2223", "h3:2223"], "ps": ["h1:2222", "h2:2222"]}
for name, c in zip(names, configs):
    job, index = name.split(".")
    assert c["task"] == {"type": job, "index": int(index)}, c
    assert c["cluster"] == want, c["cluster"]
PY
"$dtfrun" --print-tf-config --ps 1 --workers 2 --hosts 10.0.0.1:5000,10.0.0.2:6000,10.0.0.3:7000 --task worker.1 \
  >"$work/one.out" 2>&1
expect_rc 0 $? "--print-tf-config --task"
[[ "$(cat "$work/one.out")" == '{"cluster": {"worker": ["10.0.0.2:6000", "10.0.0.3:7000"], "ps": ["10.0.0.1:5000"]}, "task": {"type": "worker", "index": 1}}' ]] ||
  fail "--print-tf-config --task worker.1: $(cat "$work/one.out")"
"$dtfrun" --print-tf-config --workers 3 --hosts ::1,node2,fe80::2 --port-base 4000 --task worker.0 >"$work/v6.out" 2>&1
expect_rc 0 $? "--print-tf-config with IPv6 hosts"
grep -qF '"worker": ["[::1]:4000", "node2:4000", "[fe80::2]:4000"]' "$work/v6.out" || fail "IPv6 hosts not bracketed: $(cat "$work/v6.out")"
"$dtfrun" --print-tf-config --workers 2 --hosts [::1]:5000,[::2]:5001 --task worker.1 >"$work/v6p.out" 2>&1
expect_rc 0 $? "--print-tf-config with [v6]:port entries"
grep -qF '"worker": ["[::1]:5000", "[::2]:5001"]' "$work/v6p.out" || fail "[v6]:port entries: $(cat "$work/v6p.out")"
echo PASS
