// dtf/ps/done_client.hpp — ps_client's part in the end of a job, a base of ps_client
// (dtf/ps/client.hpp): a task reports that it finished (mark_done), and the chief counts and
// waits for the tasks that did (workers_done, wait_workers_done). The ps side is
// dtf/ps/done_tasks.hpp.
//
// The client remembers every task it learnt finished, with the proof a ps gave for each (with a
// cluster secret; dtf/ps/done_tasks.hpp), and re-announces them, so a ps restarted (empty)
// after a worker finished learns it again and the chief's wait ends; it also learns the
// names whenever a pull or push reply shows a ps whose count differs from what it knows
// (track_done: one extra request then), so the chief knows of a finished worker within a step
// even when the ps dies afterwards.
//
// Thread safety: as the ps_client's (one thread).
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/transport.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dtf::ps_detail {

/// Client: ps_client, which gives this base its calls (make_call, broadcast, run) and layout.
template <class Client>
class done_client {
 public:
  /// Tells every ps that this task has finished training (idempotent per task identity).
  void mark_done() {
    // Every ps: each one must tell a worker that finished from one that died.
    auto calls = self().broadcast(detail::message_kind::ps_done);
    self().run(calls);
  }

  /// How many tasks have called mark_done(): the union of the sets every ps holds and the
  /// ones this client learnt before (re-announced to every ps; see the file comment).
  std::size_t workers_done() {
    std::vector<std::size_t> targets(self().layout().num_ps);
    for (std::size_t ps = 0; ps < targets.size(); ++ps) targets[ps] = ps;
    // Two rounds at most: a ps that lacked names another ps told of in the first round gets
    // the union in the second.
    for (int round = 0; round < 2 && !targets.empty(); ++round) {
      const auto meta = detail::encode_message(known_msg());
      std::vector<rpc_call> calls;
      for (auto ps : targets) calls.push_back(self().make_call(ps, detail::message_kind::ps_done_tasks, meta));
      self().run(calls);
      std::vector<std::size_t> known(calls.size());
      for (std::size_t i = 0; i < calls.size(); ++i) known[i] = learn(calls[i]);
      std::vector<std::size_t> lacking;
      for (std::size_t i = 0; i < calls.size(); ++i)
        if (known[i] < done_seen_.size()) lacking.push_back(targets[i]);
      targets = std::move(lacking);
    }
    return done_seen_.size();
  }

  /// Waits until n tasks have called mark_done() (as workers_done() counts them), or `limit`
  /// has passed; returns the count. Blocks on ps 0, which answers when a task reports done
  /// (no polling); each wait is shorter than half the request deadline.
  std::size_t wait_workers_done(std::size_t n, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const std::size_t have = workers_done();
      const auto now = std::chrono::steady_clock::now();
      if (have >= n || now >= deadline) return have;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      auto m = known_msg();
      m.wait_for = have + 1;  // answered as soon as ps 0 hears of one more
      m.wait_ms = std::uint32_t(std::min<std::int64_t>(left.count(), self().transport().timeout_ms / 2));
      std::vector<rpc_call> one{self().make_call(0, detail::message_kind::ps_done_tasks, detail::encode_message(m))};
      self().run(one);
      learn(one[0]);
    }
  }

  /// The tasks this client knows to have called mark_done() (see workers_done()).
  const std::set<std::string>& done_tasks() const noexcept { return done_seen_; }

 protected:
  // After a pull or push: a ps whose done count differs from the tasks this client knows of
  // has news (a task finished) or lost its set (it restarted): exchange the names.
  void track_done(const std::vector<rpc_call>& calls) {
    for (const auto& c : calls)
      if (detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").workers_done != done_seen_.size()) {
        workers_done();
        return;
      }
  }

 private:
  Client& self() { return static_cast<Client&>(*this); }
  detail::ps_done_tasks_msg known_msg() const {
    detail::ps_done_tasks_msg m;
    m.tasks.assign(done_seen_.begin(), done_seen_.end());
    if (!proofs_.empty())
      for (const auto& t : m.tasks) {
        const auto it = proofs_.find(t);
        m.proofs.push_back(it == proofs_.end() ? std::string() : it->second);
      }
    return m;
  }
  // Adds the names a done-tasks reply holds; returns how many it held.
  std::size_t learn(const rpc_call& c) {
    auto r = detail::decode_message<detail::ps_done_tasks_msg>(c.reply_meta, "done tasks");
    for (std::size_t i = 0; i < r.tasks.size(); ++i) {
      if (i < r.proofs.size()) proofs_[r.tasks[i]] = std::move(r.proofs[i]);
      done_seen_.insert(std::move(r.tasks[i]));
    }
    return r.tasks.size();
  }

  std::set<std::string> done_seen_;  // tasks known to have called mark_done()
  std::map<std::string, std::string> proofs_;  // a ps's proof for each of them (with a secret)
};

}  // namespace dtf::ps_detail
