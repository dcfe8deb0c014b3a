// dtf/ps/shard_store.hpp — the shards one ps holds, and the one place an update is applied.
//
// A shard is a flat float32 range of a variable (placed by a partitioner) with its update
// rule's optimiser state. apply(shard, update) is the only code that changes a shard's values:
// gradients go through the rule (dtf::optim; at the rate / (staleness + 1) for a staleness-aware
// push), deltas are added (scaled for DynSGD).
//
// Modes: locked (the shard's mutex is held for the whole update, and a pull leases the values
// under it, so a pull never sees an update half-applied; the reply is written from the leased
// buffer without a copy: see shard_values) and lock-free (Hogwild; a pull, and a checkpoint's
// save, copy with relaxed atomic loads: copy_out). Lock-free is allowed only
// for plain SGD, whose only state is the update count: every element is updated with an atomic
// relaxed fetch_add (updates from several I/O threads interleave element by element, none is
// lost, and none is a data race) and the count is an atomic. Rules with slots (momentum,
// Adagrad, Adam) keep per-element state that a concurrent update would corrupt: init refuses
// them lock-free.
//
// Thread safety: the map of shards is not synchronised here (the server holds a shared_mutex:
// init/restore exclusive, everything else shared); each shard synchronises its own updates.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/error.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/ps/config.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace dtf::ps_detail {

/// One update of one shard.
struct update {
  detail::update_kind kind = detail::update_kind::gradient;
  std::span<const float> values;
  std::optional<float> learning_rate;  ///< gradient: none = the rule's own rate
  float scale = 1.0f;  ///< scaled_delta, scaled_gradient: the factor (1 / (staleness + 1))
};

/// A shard's values, shared with the pulls whose replies are still being written (copy on
/// write): a pull leases the current buffer under the shard's lock and the socket reads it
/// after the lock is released, without a copy; an update that finds a lease outstanding writes
/// into a copy, which takes the buffer's place (the leased one is freed with its last lease).
/// A reply therefore never sees an update part-way, and an update never waits for a socket.
/// Memory: besides the current buffer, at most one leased buffer per connection in flight.
class shard_values {
  struct buffer {
    std::vector<float> v;
    std::atomic<std::uint32_t> leases{0};
  };

 public:
  shard_values() : buf_(std::make_shared<buffer>()) {}

  /// Fixed once the shard is made: read without the lock (the buffer pointer is not).
  std::size_t size() const noexcept { return size_; }
  /// Reading: under the shard's lock, or in lock-free mode with atomic loads.
  std::span<const float> view() const noexcept { return buf_->v; }
  /// Writing, under the shard's lock: the current buffer, or first a copy of it when a pull's
  /// reply still reads it. The acquire load pairs with a lease's release, so the socket's reads
  /// of a returned lease happen before these writes.
  std::span<float> writable() {
    if (buf_->leases.load(std::memory_order_acquire) != 0) {
      auto fresh = std::make_shared<buffer>();
      fresh->v = buf_->v;
      buf_ = std::move(fresh);
    }
    return buf_->v;
  }
  /// Writing where no lease can exist: a shard not yet shared (init, restore) or a lock-free
  /// shard (its pulls copy with atomic loads and take no lease).
  std::span<float> unshared() noexcept { return buf_->v; }
  void resize(std::size_t n) {  // a shard not yet shared
    buf_->v.resize(n);
    size_ = n;
  }

  /// Under the shard's lock: the current values, unchanged until the returned hold is released
  /// (from any thread).
  std::pair<std::span<const float>, std::shared_ptr<const void>> lease() const {
    std::shared_ptr<buffer> b = buf_;
    b->leases.fetch_add(1, std::memory_order_relaxed);  // seen by writers: they hold the same lock
    const std::span<const float> v = b->v;
    const buffer* raw = b.get();
    return {v, std::shared_ptr<const void>(raw, [b = std::move(b)](const void*) mutable {
              b->leases.fetch_sub(1, std::memory_order_release);
              b.reset();
            })};
  }

 private:
  std::shared_ptr<buffer> buf_;  // swapped by writable() under the shard's lock
  std::size_t size_ = 0;
};

struct shard {
  shard_values values;
  std::unique_ptr<optim::optimizer<optim::host_space>> opt;
  std::mutex mu;
  std::atomic<std::int64_t> lock_free_iterations{0};
};

/// Shards by id.
using shard_map = std::map<std::uint32_t, std::unique_ptr<shard>>;

/// True when every value is finite.
inline bool all_finite(std::span<const float> v) noexcept {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

class shard_store {
 public:
  /// Installs shards built elsewhere (an init or a restore, dtf/ps/incoming_model.hpp).
  void install(std::map<std::uint32_t, std::unique_ptr<shard>> fresh, const optim::rule& rule, apply_mode mode) {
    check_mode(rule, mode);
    shards_ = std::move(fresh);
    mode_ = mode;
    rule_ = rule;
    rule_name_ = std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); }, rule);
  }

  /// Shards of a restore sent in a payload: per shard its values, then num_slots slots, with
  /// its update count. Sizes are checked against the payload before anything is allocated.
  static std::map<std::uint32_t, std::unique_ptr<shard>> from_payload(
      const std::vector<std::uint32_t>& ids, const std::vector<std::uint64_t>& sizes,
      const std::vector<std::int64_t>& iterations, const optim::rule& rule, std::size_t num_slots,
      std::span<const std::byte> payload) {
    check_model(ids, sizes, payload.size(), 1 + num_slots, "restore");
    std::map<std::uint32_t, std::unique_ptr<shard>> fresh;
    std::size_t at = 0;
    auto take = [&](std::span<float> dst) {
      std::memcpy(dst.data(), payload.data() + at, dst.size() * sizeof(float));
      at += dst.size() * sizeof(float);
    };
    for (std::size_t i = 0; i < ids.size(); ++i) {
      auto s = make(rule, sizes[i]);
      take(s->values.unshared());
      for (std::size_t k = 0; k < num_slots; ++k) take(s->opt->slot(k));
      s->opt->set_iterations(iterations.at(i));
      fresh[ids[i]] = std::move(s);
    }
    return fresh;
  }

  /// Shards of a restore read from checkpoint files: only the shard files of `checkpoint_dir`
  /// (this ps's own, never a path from the wire) that hold the asked ranges are opened and
  /// verified; every size is checked against the verified files before anything is allocated.
  static std::map<std::uint32_t, std::unique_ptr<shard>> from_files(const std::string& checkpoint_dir,
                                                                    const std::string& identity,
                                                                    const detail::ps_restore_msg& m,
                                                                    const optim::rule& rule,
                                                                    std::span<const std::byte> payload) {
    const auto& init = m.init;
    if (checkpoint_dir.empty())
      throw error(errc::invalid_config, identity + " has no checkpoint directory to restore from");
    if (!payload.empty() || m.from.size() != init.ids.size() || init.sizes.size() != init.ids.size())
      throw error(errc::corrupt_data, "restore from files: a payload, or " + std::to_string(m.from.size()) +
                                          " ranges for " + std::to_string(init.ids.size()) + " shards");
    std::vector<checkpoint_reader::element_range> ranges;
    for (std::size_t i = 0; i < init.ids.size(); ++i) ranges.push_back({m.from[i], init.sizes[i]});
    const auto ck = checkpoint_reader::open_for(checkpoint_dir, m.checkpoint, ranges);
    if (ck.manifest().num_slots != m.num_slots && m.num_slots != 0)
      throw error(errc::invalid_config, "restore: checkpoint " + m.checkpoint + " holds " +
                                            std::to_string(ck.manifest().num_slots) + " slots, " +
                                            std::to_string(m.num_slots) + " wanted");
    // Bounded by the checkpoint: every range inside it and, since a ps's shards are distinct
    // slices of the saved flat layout, no more elements in all than it holds (a request naming
    // one range many times would otherwise make the ps allocate many times its size).
    std::uint64_t total = 0;
    for (const auto& r : ranges) {
      if (r.first > ck.num_parameters() || r.count > ck.num_parameters() - r.first)
        throw error(errc::out_of_range, "restore: elements [" + std::to_string(r.first) + ", +" +
                                            std::to_string(r.count) + ") outside checkpoint " + m.checkpoint);
      total += r.count;
      if (total > ck.num_parameters())
        throw error(errc::out_of_range, "restore: the shards ask for more elements than checkpoint " + m.checkpoint +
                                            " holds (" + std::to_string(ck.num_parameters()) + ")");
    }
    if (std::set<std::uint32_t>(init.ids.begin(), init.ids.end()).size() != init.ids.size())
      throw error(errc::corrupt_data, "restore: a shard id appears twice");
    std::map<std::uint32_t, std::unique_ptr<shard>> fresh;
    for (std::size_t i = 0; i < init.ids.size(); ++i) {
      auto s = make(rule, init.sizes[i]);
      ck.read(0, m.from[i], s->values.unshared());
      for (std::size_t k = 0; k < m.num_slots; ++k) ck.read(k + 1, m.from[i], s->opt->slot(k));
      s->opt->set_iterations(m.iterations[i]);
      fresh[init.ids[i]] = std::move(s);
    }
    return fresh;
  }

  /// The shards of one restore message (one part of a restore): from its payload, or read by
  /// the ps from its own checkpoint files (m.from_files). Errors: as from_payload and
  /// from_files, and when the message's slots or mode do not fit its rule.
  static shard_map from_restore(const std::string& checkpoint_dir, const std::string& identity,
                                const detail::ps_restore_msg& m, const ps_config& cfg, std::span<const std::byte> payload) {
    if (m.init.ids.size() != m.iterations.size())
      throw error(errc::corrupt_data, "restore: ids and iterations differ in length");
    if (optim::detail::slot_count(cfg.rule) != m.num_slots)
      throw error(errc::invalid_argument, "restore: rule " + m.init.rule.name + " has " +
                                              std::to_string(optim::detail::slot_count(cfg.rule)) + " slots, " +
                                              std::to_string(m.num_slots) + " sent");
    check_mode(cfg.rule, cfg.mode);
    if (m.from_files) return from_files(checkpoint_dir, identity, m, cfg.rule, payload);
    return from_payload(m.init.ids, m.init.sizes, m.iterations, cfg.rule, m.num_slots, payload);
  }

  static std::unique_ptr<shard> make(const optim::rule& rule, std::size_t n) {
    auto s = std::make_unique<shard>();
    s->values.resize(n);
    s->opt = std::make_unique<optim::optimizer<optim::host_space>>(rule, n);
    return s;
  }

  /// Checks that ids are distinct, sizes as many, and that they add up to `bytes` with `per`
  /// floats per element (values and slots), before anything is allocated.
  static void check_model(const std::vector<std::uint32_t>& ids, const std::vector<std::uint64_t>& sizes,
                          std::size_t bytes, std::uint64_t per, const char* what) {
    if (ids.size() != sizes.size()) throw error(errc::corrupt_data, std::string(what) + ": ids and sizes differ in length");
    if (std::set<std::uint32_t>(ids.begin(), ids.end()).size() != ids.size())
      throw error(errc::corrupt_data, std::string(what) + ": a shard id appears twice");
    const std::uint64_t floats = bytes / sizeof(float) / per;
    std::uint64_t total = 0;
    for (auto sz : sizes) {
      if (sz > floats - total)
        throw error(errc::shape_mismatch, std::string(what) + ": shard sizes exceed the " + std::to_string(bytes) +
                                              " payload bytes");
      total += sz;
    }
    if (total * per * sizeof(float) != bytes)
      throw error(errc::shape_mismatch, std::string(what) + ": " + std::to_string(bytes) + " payload bytes for " +
                                            std::to_string(total * per) + " floats");
  }

  static void check_mode(const optim::rule& rule, apply_mode mode) {
    if (mode == apply_mode::lock_free && !std::holds_alternative<optim::sgd>(rule))
      throw error(errc::invalid_config, "lock-free apply is only for plain sgd: a rule with per-element state (" +
                                            std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); }, rule) +
                                            ") would be corrupted by concurrent updates");
  }

  /// What it holds and how it trains it (N: the sync aggregator's), for a second init's check.
  held_model held(std::size_t replicas_to_aggregate) const {
    held_model h{{rule_, mode_, replicas_to_aggregate}, {}};
    for (const auto& [id, s] : shards_) h.shard_sizes[id] = s->values.size();
    return h;
  }

  shard& find(std::uint32_t id) const {
    auto it = shards_.find(id);
    if (it == shards_.end()) throw error(errc::out_of_range, "shard " + std::to_string(id) + " is not held here");
    return *it->second;
  }

  /// The bytes of shards `ids`. Errors: out_of_range for an unknown id, invalid_argument for
  /// one named twice (so a request's reply is bounded by the shards this ps holds).
  std::size_t bytes_of(const std::vector<std::uint32_t>& ids) const {
    if (ids.size() > shards_.size()) throw error(errc::invalid_argument, "a request names more shards than are held");
    std::set<std::uint32_t> seen;
    std::size_t bytes = 0;
    for (auto id : ids) {
      if (!seen.insert(id).second) throw error(errc::invalid_argument, "shard " + std::to_string(id) + " named twice");
      bytes += find(id).values.size() * sizeof(float);
    }
    return bytes;
  }

  /// Applies update u's kind, rate and scale to shards `ids` in order, each with its slice of
  /// `in`. `applied` counts the shards done, so a caller whose apply threw (bad_alloc in copy
  /// on write) knows how much of the update is in the values.
  void apply_all(const std::vector<std::uint32_t>& ids, update u, std::span<const float> in, std::size_t& applied) {
    std::size_t at = 0;
    for (const auto id : ids) {
      auto& s = find(id);
      u.values = in.subspan(at, s.values.size());
      apply(s, u);
      at += s.values.size();
      ++applied;
    }
  }

  /// A test's fault, called before each shard's update (ps_options::apply_fault).
  void set_fault(std::function<void()> f) { fault_ = std::move(f); }

  /// Applies one update to shard s (its values span s.values.size() elements).
  void apply(shard& s, const update& u) {
    if (fault_) fault_();
    const std::size_t n = s.values.size();
    if (u.values.size() != n) throw error(errc::shape_mismatch, "update of the wrong size");
    if (mode_ == apply_mode::lock_free) return apply_lock_free(s, u);
    std::lock_guard g(s.mu);
    const std::span<float> values = s.values.writable();
    float* v = values.data();
    const float* in = u.values.data();
    switch (u.kind) {
      case detail::update_kind::delta:
        for (std::size_t i = 0; i < n; ++i) v[i] += in[i];
        break;
      case detail::update_kind::scaled_delta:
        for (std::size_t i = 0; i < n; ++i) v[i] += u.scale * in[i];
        break;
      case detail::update_kind::gradient:
        if (u.learning_rate)
          s.opt->apply(values, u.values, *u.learning_rate);
        else
          s.opt->apply(values, u.values);
        break;
      case detail::update_kind::scaled_gradient:  // the rate is scaled, not g (Adagrad's and Adam's slots see g)
        s.opt->apply(values, u.values,
                     u.scale * u.learning_rate.value_or(optim::detail::base_learning_rate(s.opt->update_rule())));
        break;
    }
  }

  /// Lock-free mode: copies shards `ids` into dst (bytes_of(ids) bytes) element by element with
  /// relaxed atomic loads (updates may land part-way through the copy, as Hogwild allows; no
  /// data race). Locked mode: use lease().
  void copy_out(const std::vector<std::uint32_t>& ids, std::byte* dst) const {
    for (auto id : ids) {
      auto& s = find(id);
      const std::span<float> v = s.values.unshared();
      auto* out = reinterpret_cast<float*>(dst);
      for (std::size_t i = 0; i < v.size(); ++i) out[i] = std::atomic_ref<float>(v[i]).load(std::memory_order_relaxed);
      dst += v.size() * sizeof(float);
    }
  }

  /// Locked mode: leases of shards `ids` (each taken under its lock, so no update is half-applied
  /// in it), appended to `values` and `holds`; the values stay as they are until the holds go.
  void lease(const std::vector<std::uint32_t>& ids, std::vector<std::span<const float>>& values,
             std::vector<std::shared_ptr<const void>>& holds) const {
    for (auto id : ids) {
      auto& s = find(id);
      std::lock_guard g(s.mu);
      auto [v, hold] = s.values.lease();
      values.push_back(v);
      holds.push_back(std::move(hold));
    }
  }

  /// The update count of shard s's rule.
  static std::int64_t iterations(const shard& s) { return s.opt->iterations() + s.lock_free_iterations.load(); }

  apply_mode mode() const noexcept { return mode_; }
  const optim::rule& rule() const noexcept { return rule_; }  ///< the rule of every shard
  const std::string& rule_name() const noexcept { return rule_name_; }
  const std::map<std::uint32_t, std::unique_ptr<shard>>& shards() const noexcept { return shards_; }

 private:
  void apply_lock_free(shard& s, const update& u) {
    float scale = 1.0f;
    if (u.kind == detail::update_kind::gradient || u.kind == detail::update_kind::scaled_gradient) {
      scale = -(u.learning_rate ? *u.learning_rate : std::get<optim::sgd>(s.opt->update_rule()).learning_rate);
      if (u.kind == detail::update_kind::scaled_gradient) scale *= u.scale;
      s.lock_free_iterations.fetch_add(1);
    } else if (u.kind == detail::update_kind::scaled_delta) {
      scale = u.scale;
    }
    const std::span<float> v = s.values.unshared();
    for (std::size_t i = 0; i < v.size(); ++i)
      std::atomic_ref<float>(v[i]).fetch_add(scale * u.values[i], std::memory_order_relaxed);
  }

  std::map<std::uint32_t, std::unique_ptr<shard>> shards_;
  apply_mode mode_ = apply_mode::locked;
  optim::rule rule_ = optim::sgd{};
  std::string rule_name_ = "sgd";
  std::function<void()> fault_;
};

}  // namespace dtf::ps_detail
