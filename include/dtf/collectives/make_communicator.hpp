// dtf/collectives/make_communicator.hpp — a communicator from a resolved
// cluster, with the MPI rendezvous (rank 0 collects every rank's listening port
// and sends the table back; inside TLS with collective_options::tls).
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/detail/ring_acceptor.hpp>
#include <dtf/detail/ring_handshake.hpp>

#include <cerrno>
#include <exception>
#include <string>
#include <vector>

namespace dtf {

namespace detail {

struct rendezvous_register_msg {
  std::uint32_t rank = 0;
  std::uint16_t port = 0;
  template <class A>
  void serialize(A& ar) {
    ar(rank, port);
  }
};
struct rendezvous_table_msg {
  std::vector<std::string> addresses;
  template <class A>
  void serialize(A& ar) {
    ar(addresses);
  }
};

/// The training ranks of a cluster in ring order: the chief (if a chief job
/// exists), then the workers by index.
inline std::vector<task_id> ring_tasks(const cluster& c) {
  std::vector<task_id> out;
  for (const auto& t : c.spec.tasks("chief")) out.push_back(t);
  for (const auto& t : c.spec.tasks("worker")) out.push_back(t);
  return out;
}

}  // namespace detail

inline communicator make_communicator(cluster& c, collective_options options) {
  const auto tasks = detail::ring_tasks(c);
  std::size_t rank = tasks.size();
  for (std::size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i] == c.self) rank = i;
  if (rank == tasks.size())
    throw error(errc::invalid_config, "make_communicator: " + c.self.str() + " is not a chief or worker task");
  std::vector<std::string> names;
  for (const auto& t : tasks) names.push_back(t.str());
  const std::size_t n = tasks.size();
  const detail::handshake_identity me{options.cluster_id, names[rank], options.secret};
  const auto deadline = detail::ring_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  // The rendezvous connections are TLS too when the ring is (same key, same refusals).
  const auto tls_server =
      detail::make_tls_context(options.tls, detail::tls_role::server, {options.secret, {}}, names[rank],
                               options.cluster_id);
  const auto tls_client =
      detail::make_tls_context(options.tls, detail::tls_role::client, {options.secret, {}}, names[rank],
                               options.cluster_id);

  if (c.source == "mpi" && !c.rendezvous.empty()) {
    std::vector<std::string> addresses(n);
    if (rank == 0) {
      ring_listener listener(c.rendezvous);
      addresses[0] = c.rendezvous;
      // Every other rank, by its identity, with the handshakes of all arriving connections run
      // at once: a silent socket at the rendezvous holds only itself, for at most
      // handshake_timeout_ms, strangers are refused, and connections over the caps (more than
      // max_pending_per_source from one host: ranks of a large job on one node too) are closed
      // unanswered and tried again by their rank (dtf/detail/ring_acceptor.hpp).
      const std::vector<std::string> expected(names.begin() + 1, names.end());
      std::vector<detail::ring_connection> peers;
      try {
        peers = detail::accept_neighbours(listener.native_handle(), me, expected, deadline,
                                          {options.handshake_timeout_ms, options.max_pending_connections,
                                           options.max_pending_per_source}, nullptr,
                                          tls_server.get());
      } catch (const error& e) {
        throw error(e.code(), "the rendezvous " + c.rendezvous + ": " + e.message());
      }
      for (std::size_t r = 1; r < n; ++r) {
        auto& fd = peers[r - 1];  // authenticated as names[r]
        auto [h, meta] = detail::read_control(fd, deadline, names[r] + " at the rendezvous");
        if (h.kind != detail::message_kind::rendezvous_register)
          throw error(errc::peer_failure, names[r] + ": expected a rendezvous registration");
        const auto reg = detail::decode_message<detail::rendezvous_register_msg>(meta, "rendezvous registration");
        if (reg.rank != r)
          throw error(errc::peer_failure, "'" + names[r] + "' registered as rank " + std::to_string(reg.rank));
        sockaddr_storage s{};
        socklen_t len = sizeof s;
        if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&s), &len) != 0)
          throw error(errc::peer_failure, names[r] + ": getpeername: " + detail::errno_text(errno));
        std::string host = detail::address_text(s);
        host = host.substr(0, host.rfind(':'));
        addresses[r] = host + ":" + std::to_string(reg.port);
      }
      const auto table = detail::encode_message(detail::rendezvous_table_msg{addresses});
      for (auto& p : peers)
        detail::write_control(p, detail::message_kind::rendezvous_table, table, deadline, "rank");
      for (std::size_t r = 0; r < n; ++r) c.spec.jobs[tasks[r].job][tasks[r].index] = addresses[r];
      return communicator(std::move(listener), rank, std::move(addresses), std::move(names), std::move(options));
    }
    ring_listener listener("0.0.0.0:0");
    const std::string who = "rank 0 (" + names[0] + ") at the rendezvous " + c.rendezvous;
    detail::ring_connection fd = detail::connect_and_handshake(c.rendezvous, tls_client.get(), me, deadline, who);
    detail::write_control(fd, detail::message_kind::rendezvous_register,
                          detail::encode_message(detail::rendezvous_register_msg{std::uint32_t(rank), listener.port()}),
                          deadline, who);
    auto [h, meta] = detail::read_control(fd, deadline, who);
    if (h.kind != detail::message_kind::rendezvous_table)
      throw error(errc::peer_failure, who + ": expected the rendezvous table");
    auto table = detail::decode_message<detail::rendezvous_table_msg>(meta, "rendezvous table");
    if (table.addresses.size() != n)
      throw error(errc::peer_failure, who + ": table of " + std::to_string(table.addresses.size()) +
                                          " ranks, expected " + std::to_string(n));
    for (std::size_t r = 0; r < n; ++r) c.spec.jobs[tasks[r].job][tasks[r].index] = table.addresses[r];
    return communicator(std::move(listener), rank, std::move(table.addresses), std::move(names), std::move(options));
  }

  std::vector<std::string> addresses;
  for (const auto& t : tasks) addresses.push_back(c.spec.address(t));
  ring_listener listener(addresses[rank]);
  return communicator(std::move(listener), rank, std::move(addresses), std::move(names), std::move(options));
}

}  // namespace dtf
