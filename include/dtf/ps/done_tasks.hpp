// dtf/ps/done_tasks.hpp — the ps's set of tasks that reported the end of their training
// (ps_done, ps_done_tasks), with the chief's bounded wait for it, and the one rule for which
// task names a ps keeps in its tables (this set, and dtf/ps/position_table.hpp's positions).
//
// What a peer cannot do: put a name other than a known worker (ps_options::known_workers) in
// the set or, without that list, more than max_done_tasks names of at most 256 characters; a
// request with one bad name records none. With a cluster secret, report another task done
// (docs/design/identity.md): a name other than the sender's proven identity needs the proof a
// ps gave out with it (done_proof, an HMAC under the master secret, which only the ps and the
// launcher hold), so a task can re-announce the names it learnt to a restarted ps, never make
// one up; a request with one unproven name is refused, to its sender, and records none.
//
// Thread safety: its own mutex (requests arrive on every I/O thread).
#pragma once

#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/detail/hmac.hpp>
#include <dtf/error.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/transport.hpp>
#include <dtf/transport/credentials.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace dtf::ps_detail {

/// The proof that `task` reported done, which a ps holding the master secret gives out with its
/// done set and checks when a task relays the name: HMAC-SHA256(M, "dtf done v1" ‖cluster id‖
/// ‖task‖) in hex. Its label differs from the task and ring keys' (dtf/transport/credentials.hpp),
/// so it equals no key; knowing it says nothing about M or any key (HMAC is a PRF).
inline std::string done_proof(const transport_options& t, const std::string& task) {
  return detail::to_hex(detail::hmac_sha256(t.secret, {"dtf done v1", detail::framed(t.cluster_id), detail::framed(task)}));
}

/// Throws unless a table of `held` names (not yet holding `name`) may take `name`: a known
/// worker when ps_options::known_workers is set, else a name of 1 to 256 characters while the
/// table holds fewer than max_done_tasks. `what` starts the message ("done", "positions").
inline void admit_task_name(const ps_options& options, const std::string& name, std::size_t held, const char* what) {
  const auto& known = options.known_workers;
  if (!known.empty()) {
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw error(errc::invalid_argument, std::string(what) + ": '" + name.substr(0, 64) + "' is not a worker of this job");
  } else if (name.empty() || name.size() > 256 || held >= options.max_done_tasks) {
    throw error(errc::invalid_argument, std::string(what) + ": '" + name.substr(0, 64) +
                                            "' is not a worker name of 1 to 256 characters, or the table is full");
  }
}

class done_registry {
 public:
  explicit done_registry(const ps_options& options) : options_(options) {}

  /// Adds names (all or nothing), then answers the waiters whose count is reached.
  void add(const std::vector<std::string>& names) {
    std::lock_guard g(mu_);
    std::set<std::string> added;
    for (const auto& n : names) {
      if (done_.count(n) || added.count(n)) continue;
      admit_task_name(options_, n, done_.size() + added.size(), "done");
      added.insert(n);
    }
    done_.merge(added);
    for (auto it = waiting_.begin(); it != waiting_.end();)
      if (it->second.target <= done_.size()) {
        it->second.answer.send(reply());
        it = waiting_.erase(it);
      } else {
        ++it;
      }
  }

  /// A worker of a synchronous job with backups left without its done report, and the steps go
  /// on without it (sync_aggregator::disconnected): it counts as done, so the chief's final wait
  /// ends. A name the set may not take (admit_task_name) is left out.
  void add_departed(const std::string& name) noexcept {
    try {
      add({name});
    } catch (const std::exception&) {
    }
  }

  /// ps_done_tasks: the tasks a client knows to be done join the set (a restarted ps lost it);
  /// the reply is the whole set. With wait_for it is answered when the set holds that many or
  /// after wait_ms (at most the transport's timeout), whichever is first; one waiting request
  /// per connection (a connection has one request in flight).
  void handle(const rpc_peer& peer, const detail::ps_done_tasks_msg& m, rpc_reply& out) {
    check_relayed(peer, m);
    add(m.tasks);
    std::lock_guard g(mu_);
    if (m.wait_for <= done_.size() || !peer.defer_until) {
      out.meta = reply().meta;
      return;
    }
    const auto limit = std::chrono::milliseconds(std::min<std::uint32_t>(m.wait_ms, options_.transport.timeout_ms));
    waiting_[peer.remote] = waiter{m.wait_for, peer.defer_until(limit, [this, remote = peer.remote] {
                                     std::lock_guard g2(mu_);
                                     waiting_.erase(remote);
                                     return reply();
                                   })};
    out.deferred = true;
  }

  /// A connection ended: its waiting request goes. Returns whether `identity` reported done.
  bool disconnected(const rpc_peer& peer) {
    std::lock_guard g(mu_);
    waiting_.erase(peer.remote);
    return done_.count(peer.identity) > 0;
  }

  std::size_t size() const {
    std::lock_guard g(mu_);
    return done_.size();
  }
  /// Requests waiting for the set to grow.
  std::size_t waiting() const {
    std::lock_guard g(mu_);
    return waiting_.size();
  }
  /// Drops the waiting requests unanswered: their responders hold the connections, which must
  /// go before the transport does (the ps's destructor).
  void clear_waiting() {
    std::lock_guard g(mu_);
    waiting_.clear();
  }
  std::set<std::string> names() const {
    std::lock_guard g(mu_);
    return done_;
  }

 private:
  // With a secret, every name but the sender's own needs a ps's proof (see the file comment).
  // Without one, identities are self-declared and a name proves nothing either way.
  void check_relayed(const rpc_peer& peer, const detail::ps_done_tasks_msg& m) const {
    const auto& t = options_.transport;
    if (t.secret.empty()) return;
    for (std::size_t i = 0; i < m.tasks.size(); ++i) {
      const auto& name = m.tasks[i];
      if (name == peer.identity) continue;
      if (i < m.proofs.size()) {
        const auto want = done_proof(t, name);
        if (m.proofs[i].size() == want.size() && CRYPTO_memcmp(m.proofs[i].data(), want.data(), want.size()) == 0)
          continue;
      }
      throw error(errc::invalid_argument, "done: " + peer.identity + " may report its own end only; '" +
                                              name.substr(0, 64) + "' came without a ps's proof that it reported done");
    }
  }

  // Every task known to be done (with their proofs when this ps has a secret). Caller holds mu_.
  rpc_reply reply() const {
    detail::ps_done_tasks_msg m;
    m.tasks.assign(done_.begin(), done_.end());
    if (!options_.transport.secret.empty())
      for (const auto& n : m.tasks) m.proofs.push_back(done_proof(options_.transport, n));
    rpc_reply r;
    r.meta = detail::encode_message(m);
    return r;
  }

  struct waiter {
    std::uint64_t target;  // answer when the set holds this many
    rpc_responder answer;
  };
  const ps_options& options_;
  mutable std::mutex mu_;
  std::set<std::string> done_;
  std::map<std::string, waiter> waiting_;  // per connection (its remote address)
};

}  // namespace dtf::ps_detail
