// dtf/ps/sync_client.hpp — ps_client's part in the synchronous protocol over several ps (the
// protocol: dtf/ps/sync_protocol.hpp), a base of ps_client (dtf/ps/client.hpp): the id of this
// client's contributions, and the forwarding of ps 0's decisions to the other ps.
//
// Thread safety: as the ps_client's (one thread).
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace dtf::ps_detail {

/// Client: ps_client, which gives this base its calls (make_call, run).
template <class Client>
class sync_client {
 protected:
  /// With the task's identity, the id of a contribution: the incarnation is drawn per client, so
  /// a restarted task's contributions are never taken for its earlier life's; the sequence
  /// counts the answered contributions, so a retry of one that got no answer (a timeout, a lost
  /// connection: ps_recovery runs the step again) has its id, and counts once.
  std::uint64_t incarnation() const noexcept { return incarnation_; }
  std::uint64_t sequence() const noexcept { return sequence_; }
  void answered() noexcept { ++sequence_; }

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
