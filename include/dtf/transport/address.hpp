// dtf/transport/address.hpp — the one parser of "host:port" addresses.
//
// Every place that reads an address uses it: the cluster spec (dtf/cluster.hpp), both socket
// kinds (dtf/transport.hpp, dtf/detail/ring_socket.hpp) and tools/dtfrun. It depends on the
// standard library only, so dtfrun (plain C++ even in a CUDA build) includes it too.
//
// Grammar: host ':' port, or '[' ipv6 ']' ':' port. The host holds letters, digits, '-', '.'
// and '_' (an IPv6 literal in brackets also ':' and '%'); a bare IPv6 address (several colons,
// no brackets) is refused because its port cannot be told from its last group. The port is a
// decimal number in 1..65535, or 0 where the address is one to bind (port 0 picks a free
// port); a bind address may also name the host "*" (every interface).
//
// Thread safety: pure functions. Errors: parse_address(text, why) returns std::nullopt and
// says why in `why`; the throwing forms are in the headers that own an error type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dtf::transport {

/// A parsed address: the host without brackets and the port.
struct host_port {
  /// The host, without brackets.
  std::string host;
  /// The port.
  std::uint16_t port = 0;
  /// Equal when host and port are.
  bool operator==(const host_port&) const = default;
};

/// What an address is for.
enum class address_use {
  connect,  ///< a peer's address: port 1..65535
  bind,     ///< an address to listen on: port 0..65535, host "*" allowed
};

/// Parses `text`; std::nullopt with the reason in `why` ("expected host:port", ...).
inline std::optional<host_port> parse_address(std::string_view text, address_use use, std::string& why) {
  const auto alnum = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  const auto bad = [&](std::string reason) -> std::optional<host_port> {
    why = std::move(reason);
    return std::nullopt;
  };
  std::string_view host, port;
  if (text.starts_with('[')) {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("unbalanced '['; expected [host]:port");
    host = text.substr(1, close - 1);
    if (host.empty()) return bad("empty host; expected [host]:port");
    for (const char c : host)
      if (!alnum(c) && c != ':' && c != '.' && c != '%' && c != '-' && c != '_')
        return bad("unexpected character '" + std::string(1, c) + "' in the host");
    if (text.substr(close + 1, 1) != ":") return bad("expected [host]:port");
    port = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("expected host:port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.empty()) return bad("empty host; expected host:port");
    if (host.find(':') != std::string_view::npos) return bad("write an IPv6 address in brackets: [host]:port");
    if (!(use == address_use::bind && host == "*"))
      for (const char c : host)
        if (!alnum(c) && c != '-' && c != '.' && c != '_')
          return bad("unexpected character '" + std::string(1, c) + "' in the host");
  }
  if (port.empty()) return bad("missing port; expected host:port");
  std::uint32_t value = 0;
  for (const char c : port) {
    if (c < '0' || c > '9') return bad("port '" + std::string(port) + "' is not a number");
    if (value <= 65535) value = value * 10 + std::uint32_t(c - '0');
  }
  const std::uint32_t lowest = use == address_use::bind ? 0 : 1;
  if (value < lowest || value > 65535 || port.size() > 5)
    return bad("port " + std::string(port) + " is outside " + std::to_string(lowest) + "..65535");
  return host_port{std::string(host), std::uint16_t(value)};
}

/// "host:port", with an IPv6 literal in brackets ("[::1]:2222").
inline std::string format_address(std::string_view host, std::uint16_t port) {
  const bool bracket = host.find(':') != std::string_view::npos && !host.starts_with('[');
  return (bracket ? "[" + std::string(host) + "]" : std::string(host)) + ":" + std::to_string(port);
}

}  // namespace dtf::transport
