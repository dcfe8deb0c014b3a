// dtf/transport/impl/io.hpp — the Asio types and small I/O helpers both sides of the
// request/reply transport use (dtf/transport.hpp).
#pragma once

#include <dtf/error.hpp>
#include <dtf/transport/address.hpp>
#include <dtf/transport/handshake.hpp>

#include <asio.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>

namespace dtf {
namespace detail {

// Asio I/O objects bound to io_context's concrete executor rather than the polymorphic
// any_io_executor: nvcc's front end cannot compile any_io_executor's property machinery, and
// the concrete type also saves an indirection per operation.
using io_executor = asio::io_context::executor_type;
using tcp_socket = asio::basic_stream_socket<asio::ip::tcp, io_executor>;
using tcp_acceptor = asio::basic_socket_acceptor<asio::ip::tcp, io_executor>;
using tcp_resolver = asio::ip::basic_resolver<asio::ip::tcp, io_executor>;
using io_strand = asio::strand<io_executor>;
template <class Executor>
using steady_timer_on = asio::basic_waitable_timer<std::chrono::steady_clock,
                                                   asio::wait_traits<std::chrono::steady_clock>, Executor>;

/// Resolves "host:port" (dtf/transport/address.hpp). Errors: errc::invalid_config.
inline asio::ip::tcp::endpoint resolve_endpoint(asio::io_context& io, const std::string& address,
                                                transport::address_use use = transport::address_use::connect) {
  std::string why;
  const auto parsed = transport::parse_address(address, use, why);
  if (!parsed) throw error(errc::invalid_config, "address '" + printable(address) + "': " + why);
  const std::string host = parsed->host == "*" ? "0.0.0.0" : parsed->host;
  tcp_resolver resolver(io);
  std::error_code ec;
  auto results = resolver.resolve(host, std::to_string(parsed->port), ec);
  if (ec || results.empty()) throw error(errc::invalid_config, "cannot resolve '" + address + "': " + ec.message());
  return *results.begin();
}

/// Completion condition for frames: transfer everything in as few system calls as the socket
/// allows. Asio's transfer_all caps each read and write at 64 KiB, which costs a system call
/// and a handler round trip per 64 KiB of tensor bytes (measured: push of 16 MiB 2.3 -> 2.8 GB/s).
struct transfer_all_large {
  std::size_t operator()(const std::error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : std::size_t(1) << 30;
  }
};

/// Runs `io` on this thread until `done()` or the deadline. Returns false on deadline.
template <class Done>
bool run_until(asio::io_context& io, std::chrono::steady_clock::time_point deadline, Done done) {
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    io.restart();
    io.run_one_for(deadline - now);
  }
  return true;
}

/// The most bytes a failure reply may carry after its reason: a failure has no payload, so a
/// peer announcing more is malformed (and a worker must not allocate what a ps announces).
inline constexpr std::uint64_t max_failure_payload = 0;

}  // namespace detail
}  // namespace dtf
