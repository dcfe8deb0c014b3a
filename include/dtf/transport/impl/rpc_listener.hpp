// dtf/transport/impl/rpc_listener.hpp — the listening side of rpc_server (dtf/transport.hpp):
// binding (or taking the launcher's socket), the I/O threads, and the accept loop with its
// connection cap and back-off. Sessions: dtf/transport/impl/rpc_server.hpp.
#pragma once

#include <dtf/transport.hpp>
#include <dtf/transport/inherited.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtf {

template <class Handler>
rpc_server<Handler>::rpc_server(Handler& handler, transport_options options, const std::string& bind_address,
                                int threads)
    : handler_(handler),
      options_(std::move(options)),
      tls_context_(detail::make_tls_context(options_.tls, detail::tls_role::server,
                                            {options_.secret, options_.task_key}, options_.identity,
                                            options_.cluster_id)),
      stranger_log_(std::chrono::milliseconds(options_.refusal_log_interval_ms)),
      peer_log_(std::chrono::milliseconds(options_.refusal_log_interval_ms)),
      refusal_log_(std::chrono::milliseconds(options_.refusal_log_interval_ms)),
      acceptor_(io_),
      accept_backoff_(io_),
      cap_log_(std::chrono::milliseconds(options_.refusal_log_interval_ms)),
      threads_(std::max(1, threads)) {
  cluster_sources_ = transport::resolve_cluster_hosts(options_.cluster_hosts);
  // A server derives each client's key from the master secret (docs/design/identity.md).
  if (options_.secret.empty() && !options_.task_key.empty())
    throw error(errc::invalid_config, options_.identity + " holds only its own task key: a server needs the "
                                      "cluster's master secret to authenticate its peers");
  const auto endpoint = detail::resolve_endpoint(io_, bind_address, transport::address_use::bind);
  // The launcher's socket for this address when it handed one down (no port released between
  // its choice and this listen; dtf/transport/inherited.hpp).
  if (const int fd = transport::take_inherited_listener(bind_address); fd >= 0) {
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);  // checked by take_inherited_listener
    std::error_code ec;
    acceptor_.assign(local.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), fd, ec);
    if (!ec) return;
    ::close(fd);
  }
  acceptor_.open(endpoint.protocol());
  acceptor_.set_option(asio::socket_base::reuse_address(true));
  std::error_code ec;
  acceptor_.bind(endpoint, ec);
  if (ec) throw error(errc::io_error, "cannot listen on " + bind_address + ": " + ec.message());
  acceptor_.listen(asio::socket_base::max_listen_connections);
}

template <class Handler>
void rpc_server<Handler>::run() {
  accept();
  std::vector<std::thread> extra;
  for (int i = 1; i < threads_; ++i) extra.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& t : extra) t.join();
}

template <class Handler>
void rpc_server<Handler>::stop() {
  asio::post(io_, [this] {
    std::error_code ec;
    acceptor_.close(ec);
    accept_backoff_.cancel();
    io_.stop();
  });
}

template <class Handler>
void rpc_server<Handler>::accept() {
  acceptor_.async_accept([this](std::error_code ec, detail::tcp_socket sock) {
    using namespace std::chrono;
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      // Out of descriptors or memory: the pending connection stays in the backlog, so accepting
      // again at once fails again at once. Pause (10 ms doubling to 1 s) instead of spinning.
      accept_pause_ = std::clamp(accept_pause_ * 2, milliseconds(10), milliseconds(1000));
      accept_log_([&](const std::string& suppressed) {
        detail::log_line(options_, "dtf " + options_.identity + ": accept failed: " + ec.message() +
                                       "; retrying in " + std::to_string(accept_pause_.count()) + " ms" + suppressed);
      });
      accept_backoff_.expires_after(accept_pause_);
      accept_backoff_.async_wait([this](std::error_code wait_ec) {
        if (!wait_ec) accept();
      });
      return;
    }
    accept_pause_ = milliseconds(0);
    std::error_code ignored;
    const auto ep = sock.remote_endpoint(ignored);
    const std::string source = ignored ? std::string("unknown") : transport::normalised_source(ep.address().to_string());
    if (const auto why = admit_handshake(source); !why.empty()) {
      // Closed before a byte is read or written: the stranger learns nothing, costs no buffer,
      // and a real client retries (rpc_client::connect).
      ++rejected_;
      cap_log_([&](const std::string& suppressed) {
        detail::log_line(options_, "dtf " + options_.identity + ": refused a connection from " +
                                       (ignored ? source : transport::format_address(source, ep.port())) + ": " +
                                       why + suppressed);
      });
      sock.close(ignored);
    } else {
      std::make_shared<session>(*this, std::move(sock), source)->start();
    }
    accept();
  });
}

template <class Handler>
std::string rpc_server<Handler>::admit_handshake(const std::string& source) {
  std::lock_guard g(sources_mu_);
  // The cluster's hosts and everyone else have a budget each: strangers cannot take the tasks'.
  const bool own = cluster_sources_.count(source) > 0;
  auto& budget = own ? handshaking_own_ : handshaking_strangers_;
  if (budget >= options_.max_handshakes)
    return std::to_string(options_.max_handshakes) + " connections" + (own ? " from the cluster's hosts" : "") +
           " in the handshake (max_handshakes)";
  auto& from = handshaking_from_[source];
  if (from >= options_.max_handshakes_per_source) {
    if (from == 0) handshaking_from_.erase(source);
    return std::to_string(options_.max_handshakes_per_source) +
           " connections from this address in the handshake (max_handshakes_per_source)";
  }
  ++from;
  ++budget;
  ++handshaking_;
  return {};
}

template <class Handler>
void rpc_server<Handler>::end_handshake(const std::string& source) {
  std::lock_guard g(sources_mu_);
  const auto it = handshaking_from_.find(source);
  if (it != handshaking_from_.end() && --it->second == 0) handshaking_from_.erase(it);  // the map holds live sources only
  --(cluster_sources_.count(source) > 0 ? handshaking_own_ : handshaking_strangers_);
  --handshaking_;
}

}  // namespace dtf
