// dtf/transport/cluster_hosts.hpp — the IP addresses of a cluster's own hosts, which a server
// (the ps's rpc_server, a ring rank's acceptor) gives handshake slots of their own, so that
// strangers connecting from other addresses cannot hold the cluster's tasks out
// (docs/guides/security.md).
//
// A connection's source address is compared as text: both sides are normalised here (an
// IPv4-mapped IPv6 address as its IPv4 form, no brackets), so that "::ffff:10.0.0.5" and
// "10.0.0.5" are one host.
//
// Thread safety: pure functions (getaddrinfo is reentrant). Errors: none; a host that does not
// resolve is left out (its tasks then share the strangers' budget, as before).
#pragma once

#include <dtf/transport/address.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dtf::transport {

/// `source` (an address as a socket reports its peer: "10.0.0.5", "[::1]", "::ffff:10.0.0.5")
/// in the one form cluster hosts are kept in.
inline std::string normalised_source(std::string_view source) {
  if (source.size() >= 2 && source.front() == '[' && source.back() == ']') source = source.substr(1, source.size() - 2);
  constexpr std::string_view mapped = "::ffff:";
  if (source.size() > mapped.size() && source.substr(0, mapped.size()) == mapped &&
      source.find(':', mapped.size()) == std::string_view::npos)
    source.remove_prefix(mapped.size());
  return std::string(source);
}

/// The IP addresses `addresses` ("host:port" as a cluster spec holds them) resolve to, each
/// normalised; names are resolved now (every address of a name counts).
inline std::set<std::string> resolve_cluster_hosts(const std::vector<std::string>& addresses) {
  std::set<std::string> out;
  for (const auto& a : addresses) {
    std::string why;
    const auto hp = parse_address(a, address_use::connect, why);
    if (!hp) continue;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(hp->host.c_str(), nullptr, &hints, &found) != 0) continue;
    for (const addrinfo* p = found; p != nullptr; p = p->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = p->ai_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr);
      if ((p->ai_family == AF_INET || p->ai_family == AF_INET6) && ::inet_ntop(p->ai_family, raw, text, sizeof text))
        out.insert(normalised_source(text));
    }
    ::freeaddrinfo(found);
  }
  return out;
}

}  // namespace dtf::transport
