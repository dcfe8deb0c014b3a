// dtf/ps/sync_client.hpp — ps_client's part in the synchronous protocol over several ps (the
// protocol: dtf/ps/sync_protocol.hpp), a base of ps_client (dtf/ps/client.hpp): the id of this
// client's contributions, the forwarding of ps 0's decisions to the other ps, and the hold of
// the steps a synchronous checkpoint takes (dtf/ps/checkpointing.hpp).
//
// Thread safety: as the ps_client's (one thread).
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/transport.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace dtf::ps_detail {

/// Client: ps_client, which gives this base its calls (make_call, run).
template <class Client>
class sync_client {
 public:
  /// Synchronous training: stops ps 0 deciding steps (for at most the transport's timeout_ms)
  /// and brings every ps to ps 0's step, which it returns: what every ps then saves is that
  /// step's state. nullopt (nothing held) in asynchronous training. Errors: errc::timeout when
  /// a ps does not reach the step in time (the hold is released).
  std::optional<std::int64_t> hold_steps() {
    const auto timeout = self().transport().timeout_ms;
    std::vector<rpc_call> hold{self().make_call(0, detail::message_kind::ps_sync_hold,
                                                detail::encode_message(detail::ps_sync_hold_msg{true, timeout}))};
    self().run(hold);
    const auto st = detail::decode_message<detail::ps_status_msg>(hold[0].reply_meta, "status");
    if (!st.synchronous) return std::nullopt;
    try {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
      for (std::size_t ps = 1; ps < self().layout().num_ps; ++ps)
        for (;;) {
          std::vector<rpc_call> c{self().make_call(ps, detail::message_kind::ps_step,
                                                   detail::encode_message(detail::empty_msg{}))};
          self().run(c);
          const auto at = detail::decode_message<detail::ps_status_msg>(c[0].reply_meta, "status").global_step;
          if (at == st.global_step) break;
          if (at > st.global_step || std::chrono::steady_clock::now() > deadline)
            throw error(errc::timeout, "ps." + std::to_string(ps) + " is at step " + std::to_string(at) +
                                           ", not at ps.0's held step " + std::to_string(st.global_step));
          forward_decision(ps, at);  // its committers have not forwarded it yet
        }
    } catch (...) {
      release_steps();
      throw;
    }
    return st.global_step;
  }
  /// Ends hold_steps()'s hold.
  void release_steps() {
    std::vector<rpc_call> c{self().make_call(0, detail::message_kind::ps_sync_hold,
                                             detail::encode_message(detail::ps_sync_hold_msg{false, 0}))};
    self().run(c);
  }

 protected:
  /// With the task's identity, the id of a contribution: the incarnation is drawn per client, so
  /// a restarted task's contributions are never taken for its earlier life's; the sequence
  /// counts the answered contributions, so a retry of one that got no answer (a timeout, a lost
  /// connection: ps_recovery runs the step again) has its id, and counts once.
  std::uint64_t incarnation() const noexcept { return incarnation_; }
  std::uint64_t sequence() const noexcept { return sequence_; }  ///< see incarnation()
  void answered() noexcept { ++sequence_; }                      ///< a contribution was answered

  /// Sends decision d to ps 1 .. num_ps - 1; each has applied it (now or before) on return.
  void forward(const detail::sync_decision& d, std::size_t num_ps) {
    std::vector<rpc_call> calls;
    for (std::size_t ps = 1; ps < num_ps; ++ps)
      calls.push_back(self().make_call(ps, detail::message_kind::ps_sync_apply,
                                       detail::encode_message(detail::ps_sync_apply_msg{d})));
    self().run(calls);
  }

  /// Asks ps 0 for the decision of `step` and forwards it to ps `ps`, when ps 0 still keeps it
  /// (a pull found ps `ps` behind: the step's committers died before forwarding it).
  void forward_decision(std::size_t ps, std::int64_t step) {
    std::vector<rpc_call> ask{self().make_call(0, detail::message_kind::ps_sync_decision,
                                               detail::encode_message(detail::ps_sync_apply_msg{{step, {}}}))};
    self().run(ask);
    const auto st = detail::decode_message<detail::ps_status_msg>(ask[0].reply_meta, "status");
    if (!st.decision) return;
    std::vector<rpc_call> one{self().make_call(ps, detail::message_kind::ps_sync_apply,
                                               detail::encode_message(detail::ps_sync_apply_msg{*st.decision}))};
    self().run(one);
  }

 private:
  Client& self() { return static_cast<Client&>(*this); }
  std::uint64_t incarnation_ = (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::uint64_t sequence_ = 0;
};

}  // namespace dtf::ps_detail
