// dtf/ps/sync_aggregator.hpp — synchronous aggregation on one ps (SyncReplicasOptimizer).
//
// Contributions are tagged with the step they were computed at. The first N for the current
// step are averaged and applied (through shard_store::apply), the step advances and every
// contributor is released; contributions for an older step are dropped and counted per worker.
// A contribution may carry rows of embedding tables (an embedding model's row gradients): each
// row any contributor sent is summed over the step's contributions, divided by N (the dense
// average, a contributor that did not touch a row counting as a zero gradient: what a dense
// synchronous step computes for those rows) and applied once with the step by the table's rule,
// lazily; a dropped contribution's rows are dropped with it.
// A contribution is recorded only after it is validated (its step, its shard ids: exactly the
// shards this ps holds, its size, its values' finiteness, its kind matching the step's first
// contribution): a malformed one is an error to its sender alone and changes nothing. It is
// attributed to the authenticated connection's identity, never to a name in the message.
//
// Thread safety: every member takes the aggregator's mutex.
#pragma once

#include <dtf/detail/messages.hpp>
#include <dtf/ps/shard_store.hpp>
#include <dtf/transport.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <unordered_map>
#include <vector>

namespace dtf::ps_detail {

/// Rows of one embedding table in a synchronous contribution (sparse_service::sync_rows reads
/// them from the payload): ids.size() * dim floats.
struct contributed_rows {
  std::uint32_t table = 0, dim = 0;
  std::span<const std::uint64_t> ids;
  std::span<const float> rows;
};

class sync_aggregator {
 public:
  /// What contribute() did.
  struct outcome {
    bool dropped = false;            ///< for a finished step: reply at once
    std::uint64_t dropped_total = 0;
    bool skipped = false;            ///< non-finite values, nonfinite_policy::skip: reply at once
  };

  ~sync_aggregator() { clear_waiting(); }

  /// N replicas per step (0: asynchronous) over the store's shards, from step `step`. Waiting
  /// contributors get `reason` as an error (they retry).
  void configure(std::size_t n, const shard_store& store, std::int64_t step, const std::string& reason) {
    std::lock_guard g(mu_);
    for (auto& w : waiting_) w.send(rpc_reply::failure(errc::peer_failure, reason));
    waiting_.clear();
    n_ = n;
    acc_.clear();  // a model-sized buffer, needed only by synchronous training
    if (n_ > 0)
      for (const auto& [id, s] : store.shards()) acc_[id].assign(s->values.size(), 0.0f);
    step_ = step;
    count_ = 0;
    rows_.clear();
    positions_.clear();
    contributors_.clear();
    failure_.clear();
    kind_.reset();
  }

  /// Validates and records `who`'s contribution: `payload` its dense shards, `rows` its
  /// embedding rows. When it is the N-th, averages, applies with `apply(shard id, update)` and
  /// tables.apply_rows(table, ids, rows, delta) (every row any contributor sent, its sum / N:
  /// a row a contributor did not touch counts as a zero gradient, as in the dense average),
  /// advances the step and releases every contributor with `status(reply)` after
  /// `advanced(new step, positions)` (the data positions the step's contributions carried, by
  /// contributor: recorded with the step, before anyone is released). tables.reserve_rows(rows)
  /// checks the ids (and makes a hashed table's rows) last before recording. Returns nullopt
  /// when the reply is deferred.
  template <class Tables, class Apply, class Advanced, class Status>
  std::optional<outcome> contribute(const std::string& who, const detail::ps_sync_push_msg& m,
                                    std::span<const std::byte> payload, std::span<const contributed_rows> rows,
                                    const shard_store& store, Tables& tables, nonfinite_policy policy,
                                    const std::function<rpc_responder()>& defer, Apply&& apply, Advanced&& advanced,
                                    Status&& status) {
    std::lock_guard g(mu_);
    if (n_ == 0) throw error(errc::invalid_argument, "synchronous push to a ps initialised for asynchronous training");
    if (m.step < step_) {
      const auto n = ++dropped_[who];
      return outcome{true, n, false};
    }
    if (!failure_.empty()) throw error(errc::peer_failure, failure_);
    if (m.step > step_)
      throw error(errc::invalid_argument, who + " contributed for step " + std::to_string(m.step) +
                                              " but the ps is at step " + std::to_string(step_));
    if (contributors_.count(who))
      throw error(errc::invalid_argument, who + " already contributed to step " + std::to_string(step_));
    if (m.kind == detail::update_kind::scaled_delta || m.kind == detail::update_kind::scaled_gradient)
      throw error(errc::invalid_argument, who + ": a synchronous contribution cannot be staleness-scaled");
    // Exactly this ps's shards, each once: the average is over whole contributions.
    if (m.ids.size() != acc_.size() || store.bytes_of(m.ids) != payload.size())
      throw error(errc::shape_mismatch, who + ": a synchronous contribution must carry every shard of this ps once (" +
                                            std::to_string(m.ids.size()) + " shards, " +
                                            std::to_string(payload.size()) + " bytes sent)");
    const std::span<const float> in(reinterpret_cast<const float*>(payload.data()), payload.size() / sizeof(float));
    const auto rows_finite = [&] {
      for (const auto& r : rows)
        if (!all_finite(r.rows)) return false;
      return true;
    };
    if (policy != nonfinite_policy::apply && !(m.all_finite && all_finite(in) && rows_finite())) {
      if (policy == nonfinite_policy::reject)
        throw error(errc::invalid_argument, who + " contributed non-finite values to step " + std::to_string(step_));
      return outcome{false, 0, true};
    }
    if (kind_ && (*kind_ != m.kind || lr_ != m.learning_rate))
      throw error(errc::invalid_argument, who + ": contribution of another kind or learning rate than step " +
                                              std::to_string(step_) + "'s first");
    tables.reserve_rows(rows);  // last: ids not held here, repeated or beyond a full table throw
    // Valid: record it.
    kind_ = m.kind;
    lr_ = m.learning_rate;
    contributors_.insert(who);
    alive_.insert(who);
    if (m.position) positions_[who] = *m.position;
    std::size_t at = 0;
    for (auto id : m.ids) {
      auto& acc = acc_.at(id);
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += in[at + i];
      at += acc.size();
    }
    for (const auto& r : rows) {
      auto& sum = rows_[r.table];
      sum.dim = r.dim;
      for (std::size_t i = 0; i < r.ids.size(); ++i) {
        auto [it, fresh] = sum.at.try_emplace(r.ids[i], sum.ids.size());
        if (fresh) {
          sum.ids.push_back(r.ids[i]);
          sum.values.resize(sum.values.size() + r.dim, 0.0f);
        }
        float* to = sum.values.data() + it->second * r.dim;
        for (std::size_t k = 0; k < r.dim; ++k) to[k] += r.rows[i * r.dim + k];
      }
    }
    ++count_;
    waiting_.push_back(defer());
    if (count_ < n_) return std::nullopt;

    // The N-th contribution: average, apply, advance, release everyone.
    const float inv = 1.0f / float(n_);
    for (auto& [id, acc] : acc_) {
      for (auto& v : acc) v *= inv;
      apply(id, update{*kind_, acc, lr_, 1.0f});
      std::fill(acc.begin(), acc.end(), 0.0f);
    }
    for (auto& [table, sum] : rows_) {
      if (sum.ids.empty()) continue;
      for (auto& v : sum.values) v *= inv;
      // Does not throw: the ids were checked when recorded (see sparse_service::apply_rows).
      tables.apply_rows(table, sum.ids, sum.values, *kind_ == detail::update_kind::delta);
      sum.at.clear();  // emptied, not freed: the next step reuses the buffers
      sum.ids.clear();
      sum.values.clear();
    }
    ++step_;
    count_ = 0;
    contributors_.clear();
    kind_.reset();
    advanced(step_, positions_);
    positions_.clear();
    for (auto& w : waiting_) {
      rpc_reply r;
      status(r);
      w.send(std::move(r));
    }
    waiting_.clear();
    return std::nullopt;
  }

  /// A connection ended: a contributor that vanished without reporting done may leave fewer
  /// than N replicas; then every waiting worker, and every later contribution, gets an error.
  /// Returns the failure message when this made the step impossible.
  std::optional<std::string> disconnected(const std::string& who, bool finished) {
    std::lock_guard g(mu_);
    if (n_ == 0 || !alive_.erase(who) || finished) return std::nullopt;
    if (alive_.size() >= n_ || !failure_.empty()) return std::nullopt;
    failure_ = "synchronous training cannot continue: " + who + " disconnected, leaving " +
               std::to_string(alive_.size()) + " of the " + std::to_string(n_) + " replicas each step needs";
    for (auto& w : waiting_) w.send(rpc_reply::failure(errc::peer_failure, failure_));
    waiting_.clear();
    return failure_;
  }

  std::map<std::string, std::uint64_t> dropped() const {
    std::lock_guard g(mu_);
    return dropped_;
  }

  /// Whether `who` is in the per-worker tables already, and how many names they hold (the ps
  /// admits a new name as it admits a done report: ps_detail::admit_task_name).
  std::pair<bool, std::size_t> named(const std::string& who) const {
    std::lock_guard g(mu_);
    return {dropped_.count(who) > 0 || alive_.count(who) > 0, dropped_.size() + alive_.size()};
  }

  /// N, the contributions a step aggregates (0: asynchronous training).
  std::size_t replicas() const {
    std::lock_guard g(mu_);
    return n_;
  }

  void clear_waiting() {
    std::lock_guard g(mu_);
    waiting_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::size_t n_ = 0, count_ = 0;
  std::int64_t step_ = 0;
  std::optional<detail::update_kind> kind_;  // of the current step's first contribution
  std::optional<float> lr_;
  std::map<std::uint32_t, std::vector<float>> acc_;  // per shard: sum of this step's contributions
  struct row_sums {                                  // per table: this step's rows, summed
    std::uint32_t dim = 0;
    std::unordered_map<std::uint64_t, std::size_t> at;  // id -> its place in ids
    std::vector<std::uint64_t> ids;
    std::vector<float> values;
  };
  std::map<std::uint32_t, row_sums> rows_;
  std::map<std::string, data::position> positions_;  // carried by the current step's contributions
  std::vector<rpc_responder> waiting_;               // contributors of the current step
  std::set<std::string> alive_;                      // workers that contributed and are connected
  std::set<std::string> contributors_;               // of the current step
  std::map<std::string, std::uint64_t> dropped_;
  std::string failure_;
};

}  // namespace dtf::ps_detail
