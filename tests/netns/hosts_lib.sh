# tests/netns/hosts_lib.sh — three "hosts" on this machine for the multi-host tests: network
# namespaces $id"h1".."h3" with the addresses 10.0.0.1-3 on eth0, joined by veth pairs on a
# bridge that sits in a fourth namespace $id"sw" (the host's own network is untouched).
# Source it, then:
#   remove_netns_hosts   kills every process in the namespaces and deletes them (call it from
#                        the EXIT trap; harmless before or without make_netns_hosts)
#   make_netns_hosts     creates them; calls skip (define it: exit 77) where the machine refuses
#                        namespaces, a program in one, a bridge or a veth pair, and fail (define
#                        it) when a later step fails. Needs $work, a scratch directory.
# Sets id, sw and hosts (the three namespaces' names, host 1 first).
id="dtf$$"
sw="${id}sw"
hosts=("${id}h1" "${id}h2" "${id}h3")

remove_netns_hosts() {
  local ns pid
  for ns in "${hosts[@]}" "$sw"; do
    if ip netns list 2>/dev/null | grep -qw "$ns"; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
      ip netns del "$ns" 2>/dev/null
    fi
  done
}

make_netns_hosts() {
  local i ns
  command -v ip >/dev/null || skip "no 'ip' command (iproute2) to build network namespaces"
  if ! ip netns add "$sw" 2>"$work/netns.err"; then
    skip "this machine refuses network namespaces: ip netns add: $(head -n1 "$work/netns.err")"
  fi
  ip netns exec "$sw" true 2>"$work/netns.err" ||
    skip "this machine refuses to run programs in a network namespace: ip netns exec: $(head -n1 "$work/netns.err")"
  ip -n "$sw" link add br0 type bridge 2>"$work/netns.err" ||
    skip "this machine refuses a bridge in a network namespace: $(head -n1 "$work/netns.err")"
  ip -n "$sw" link add "${id}p" type veth peer name "${id}q" 2>"$work/netns.err" ||
    skip "this machine refuses veth pairs: $(head -n1 "$work/netns.err")"
  ip -n "$sw" link del "${id}p"
  ip -n "$sw" link set br0 up || fail "cannot bring the bridge up"
  for i in 1 2 3; do
    ns=${hosts[$((i - 1))]}
    ip netns add "$ns" || fail "cannot create namespace $ns"
    ip link add "${id}a$i" netns "$ns" type veth peer name "${id}b$i" netns "$sw" ||
      fail "cannot create the veth pair of $ns"
    ip -n "$ns" link set "${id}a$i" name eth0 || fail "cannot rename the veth in $ns"
    ip -n "$ns" addr add "10.0.0.$i/24" dev eth0 || fail "cannot address $ns"
    ip -n "$ns" link set lo up && ip -n "$ns" link set eth0 up || fail "cannot bring $ns up"
    ip -n "$sw" link set "${id}b$i" master br0 && ip -n "$sw" link set "${id}b$i" up ||
      fail "cannot attach $ns to the bridge"
  done
  ip -n "${hosts[0]}" -4 addr show | grep -q "inet 10.0.0.1/24" || fail "host 1 lacks its address"
}
