// dtf/collectives/setup.hpp — connection set-up of a communicator (concurrent handshakes on its
// port; with collective_options::tls, each connection TLS 1.3 from its first byte) and the
// per-collective descriptor step.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/detail/ring_acceptor.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <exception>
#include <thread>

namespace dtf {

inline void tcp_backend::connect() {
  // Both contexts first: TLS without a secret is a configuration error even for one rank. The
  // connections' SSL objects hold references: the contexts live as long as they do.
  const auto tls_server = detail::make_tls_context(options_.tls, detail::tls_role::server, {options_.secret, {}},
                                                   names_[rank_], options_.cluster_id);
  const auto tls_client = detail::make_tls_context(options_.tls, detail::tls_role::client, {options_.secret, {}},
                                                   names_[rank_], options_.cluster_id);
  if (size_ == 1) return;
  using namespace std::chrono;
  const auto deadline = detail::ring_clock::now() + milliseconds(options_.connect_timeout_ms);
  struct incoming {
    std::string identity;
    detail::ring_connection* slot;
  };
  struct outgoing {
    std::size_t to;
    std::string identity;
    detail::ring_connection* slot;
  };
  std::vector<incoming> in{{names_[left_rank()], &left_}};
  std::vector<outgoing> out{{right_rank(), names_[rank_], &right_}};
  if (uses_hypercube()) {
    partners_.resize(std::size_t(std::countr_zero(size_)));
    for (std::size_t k = 0; k < partners_.size(); ++k) {
      const std::size_t d = std::size_t(1) << k, p = rank_ ^ d;
      if (rank_ & d)
        in.push_back({partner_identity(names_[p], d), &partners_[k]});
      else
        out.push_back({p, partner_identity(names_[rank_], d), &partners_[k]});
    }
  }
  const detail::handshake_identity server_me{options_.cluster_id, names_[rank_], options_.secret};
  // Wakes the acceptor when this rank's own connections fail: a refusal then ends the set-up
  // at once rather than at the deadline.
  detail::unique_fd cancel(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!cancel) throw error(errc::io_error, "eventfd: " + detail::errno_text(errno));
  std::exception_ptr accept_failure;
  std::thread acceptor([&] {
    // Setup only: the data path never leaves the calling thread.
    try {
      std::vector<std::string> expected;
      for (const auto& i : in) expected.push_back(i.identity);
      auto fds = detail::accept_neighbours(listener_.native_handle(), server_me, expected, deadline,
                                           {options_.handshake_timeout_ms, options_.max_pending_connections,
                                            options_.max_pending_per_source,
                                            transport::resolve_cluster_hosts(addresses_)},  // the ranks' hosts
                                           nullptr,
                                           tls_server.get(), cancel.get());
      for (std::size_t i = 0; i < in.size(); ++i) *in[i].slot = std::move(fds[i]);
    } catch (...) {
      accept_failure = std::current_exception();
    }
  });
  try {
    for (auto& o : out) {
      const std::string who = describe(o.to);
      // Tried again while the neighbour's acceptor closes it unanswered (its caps are full).
      *o.slot = detail::connect_and_handshake(addresses_[o.to], tls_client.get(),
                                              {options_.cluster_id, o.identity, options_.secret}, deadline, who);
    }
  } catch (...) {
    right_.reset();
    for (auto& p : partners_) p.reset();
    const std::uint64_t one = 1;
    (void)!::write(cancel.get(), &one, sizeof one);
    acceptor.join();
    throw;
  }
  acceptor.join();
  if (accept_failure) std::rethrow_exception(accept_failure);
  detail::tune_stream_socket(right_.get(), options_.socket_buffer_bytes);
  detail::tune_stream_socket(left_.get(), options_.socket_buffer_bytes);
  for (auto& p : partners_) detail::tune_stream_socket(p.get(), options_.socket_buffer_bytes);
  for (auto* c : {&right_, &left_}) if (c->tls) c->tls->set_read_buffer(detail::ring_tls_data_buffer);
  for (auto& p : partners_) if (p.tls) p.tls->set_read_buffer(detail::ring_tls_data_buffer);
  link_.right = right_.get();
  link_.left = left_.get();
  link_.right_tls = right_.tls.get();
  link_.left_tls = left_.tls.get();
  link_.right_name = describe(right_rank());
  link_.left_name = describe(left_rank());
  link_.timeout_ms = options_.timeout_ms;
  link_.spin_us = options_.spin_us;
  link_.segment_bytes = options_.segment_bytes;
}

// The link to hypercube partner rank ^ 2^k (one bidirectional connection).
inline detail::ring_link tcp_backend::partner_link(std::size_t k) const {
  detail::ring_link l = link_;
  l.right = l.left = partners_[k].get();
  l.right_tls = l.left_tls = partners_[k].tls.get();  // one connection, one TLS session both ways
  l.right_name = l.left_name = describe(rank_ ^ (std::size_t(1) << k));
  return l;
}

inline detail::collective_descriptor tcp_backend::descriptor(detail::collective_kind kind, const std::string& name,
                                                              std::uint64_t name_hash, dtype type, std::size_t count) {
  return detail::collective_descriptor::make(sequence_++, rank_, size_, kind, name, name_hash, type, count);
}

// A step that sends our descriptor and receives the left neighbour's, then
// checks it.
inline detail::ring_step tcp_backend::header_step(const detail::collective_descriptor& mine, std::uint64_t payload) {
  return header_step(mine, payload, left_rank(), link_.left_name);
}

inline detail::ring_step tcp_backend::header_step(const detail::collective_descriptor& mine, std::uint64_t payload,
                                                   std::size_t from, const std::string& from_name) {
  out_header_ = detail::encode_descriptor(mine, payload);
  detail::ring_step s;
  s.send = out_header_.data();
  s.send_bytes = out_header_.size();
  s.recv = in_header_.data();
  s.recv_bytes = in_header_.size();
  s.on_received = [this, &mine, from, from_name] {
    const auto theirs = detail::decode_descriptor(in_header_, from_name);
    detail::check_descriptor(mine, theirs, describe(from));
  };
  return s;
}

inline void tcp_backend::check_type(dtype type, std::size_t bytes, const std::string& name) const {
  if (dtf::size_of(type) == 0 || bytes % size_of(type) != 0)
    throw error(errc::invalid_argument, "collective on '" + name + "': " + std::to_string(bytes) +
                                            " bytes is not a whole number of " + std::string(name_of(type)));
}

}  // namespace dtf
