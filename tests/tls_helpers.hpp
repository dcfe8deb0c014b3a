// Shared by the TLS tests (test_tls.cpp: the request/reply transport; test_ring_tls.cpp: the
// collectives' ring): a payload with a recognisable text, a byte search, and a TCP relay that
// records what crosses the wire.
#pragma once

#include <dtf/transport.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstddef>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace dtf::test {

// A payload whose bytes repeat a recognisable text.
inline std::vector<std::byte> pattern_payload(std::size_t n) {
  static const std::string text = "PLAINTEXT-PATTERN-0123456789-";
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte(text[i % text.size()]);
  return v;
}

inline bool contains(const std::vector<std::byte>& hay, std::string_view needle) {
  const auto* h = reinterpret_cast<const char*>(hay.data());
  return std::search(h, h + hay.size(), needle.begin(), needle.end()) != h + hay.size();
}

// A TCP relay for one connection that records the bytes of each direction. Each direction runs
// on its own thread until its source ends, then half-closes its destination, so both threads
// end once the client and then the server have closed.
struct recording_proxy {
  asio::io_context io;
  detail::tcp_acceptor acceptor{io, {asio::ip::make_address("127.0.0.1"), 0}};
  detail::tcp_socket down{io}, up{io};
  std::vector<std::byte> to_server, to_client;
  std::thread accepting, a, b;

  /// `flip_to_server_at`: the offset of a byte of the client-to-server stream to invert on its
  /// way (an active attacker's edit); none by default.
  explicit recording_proxy(const std::string& server_address, std::size_t flip_to_server_at = SIZE_MAX) {
    const auto target = detail::resolve_endpoint(io, server_address);
    accepting = std::thread([this, target, flip_to_server_at] {
      std::error_code ec;
      acceptor.accept(down, ec);
      if (!ec) up.connect(target, ec);
      if (ec) return;
      a = std::thread([this, flip_to_server_at] { relay(down, up, to_server, flip_to_server_at); });
      b = std::thread([this] { relay(up, down, to_client, SIZE_MAX); });
    });
  }
  // On a failed test: wakes every blocked accept and read (shutdown), then joins.
  ~recording_proxy() {
    if (!accepting.joinable()) return;
    ::shutdown(acceptor.native_handle(), SHUT_RDWR);
    accepting.join();
    ::shutdown(down.native_handle(), SHUT_RDWR);
    ::shutdown(up.native_handle(), SHUT_RDWR);
    join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(acceptor.local_endpoint().port()); }
  static void relay(detail::tcp_socket& from, detail::tcp_socket& to, std::vector<std::byte>& record,
                    std::size_t flip_at) {
    std::array<std::byte, 64 * 1024> buf;
    std::error_code ec;
    for (;;) {
      const std::size_t n = from.read_some(asio::buffer(buf), ec);
      if (ec) break;
      record.insert(record.end(), buf.begin(), buf.begin() + std::ptrdiff_t(n));
      if (flip_at >= record.size() - n && flip_at < record.size()) buf[flip_at - (record.size() - n)] ^= std::byte{0xff};
      asio::write(to, asio::buffer(buf.data(), n), ec);
      if (ec) break;
    }
    to.shutdown(asio::socket_base::shutdown_send, ec);
  }
  // Call after the client and the server have closed their ends.
  void join() {
    for (auto* t : {&accepting, &a, &b})
      if (t->joinable()) t->join();
  }
};


}  // namespace dtf::test
