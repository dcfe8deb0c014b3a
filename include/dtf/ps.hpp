// dtf/ps.hpp — the parameter server and its client.
//
// A ps task holds shards of the model's variables (placed by a partitioner, dtf/partitioners.hpp)
// in host memory and serves:
//   init      the chief's initial values and update rule (the rule's slots live on the ps)
//   ready     whether init has happened, so workers wait for it instead of racing it
//   pull      current values of the requested shards; the reply payload is their raw bytes
//   push      gradients (the ps applies SGD, momentum, Adagrad or Adam from dtf::optim) or deltas
//             (the ps adds them, scaled by 1/(staleness+1) for DynSGD); optionally advances the
//             global step (kept on ps 0). Each ps counts the pushes it applied; a push reports
//             its staleness: how many updates the ps applied since the pusher's last pull.
//   step      the global step
//   done      a worker reports the end of its training (the chief waits for all of them)
//   done tasks  which tasks reported done; the request adds the ones the client knows of, so
//             a restarted ps, which lost its set, learns it again from the chief (or any client)
//   shutdown  the chief ends the job: the ps replies, stops and run() returns (exit 0)
//   save      write this ps's shards (values, update-rule slots, update counts) as one shard
//             file of a checkpoint (dtf/checkpoint.hpp); the chief then writes the manifest
//   restore   replace every shard, the slots, the update counts and the global step with the
//             ones the chief sends from a checkpoint (initialises a fresh ps, e.g. a restarted one)
//
// Apply modes: locked (default: one update at a time per shard, and a pull sees no update
// half-applied, at the price of one snapshot copy of the shard into the reply buffer) and
// lock-free (Hogwild: updates race, pulls are sent straight from the shard's memory).
//
// Communication volume: a pull moves every requested shard's bytes once, server to worker;
// a push moves them once the other way. The worker's bytes go from its buffer to the socket
// and from the socket into its buffer (scatter/gather, no copy on the worker).
//
// Thread safety: parameter_server::stop() from any thread; a ps_client serves one thread.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/optim/optimizer.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/transport.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

namespace dtf {

struct ps_options {
  transport_options transport{};
  int threads = 1;  ///< I/O threads; with lock_free shards, updates from several run concurrently
  checkpoint_fault save_fault{};  ///< testing crash safety: a save stops part-way through its file
};

/// How a restore moves a checkpoint's bytes into the ps tasks.
enum class restore_transfer {
  through_chief,   ///< the chief reads the files and sends each ps its slices, one ps at a time
  ps_reads_files,  ///< each ps reads (and verifies) its own slices from the shard files: the
                   ///< checkpoint directory must be visible to every ps (as for saving); the
                   ///< chief holds nothing model-sized, so a model larger than its memory restores
};

/// A parameter server task. Construct it on its address, then run() until the chief's shutdown.
class parameter_server {
 public:
  /// Listens on bind_address ("host:port"; port 0 picks one). Errors: errc::io_error when the
  /// address cannot be bound.
  parameter_server(const std::string& bind_address, ps_options options)
      : options_(std::move(options)), server_(*this, options_.transport, bind_address, options_.threads) {}

  /// Releases deferred replies before the transport (which they reference) goes away.
  ~parameter_server() {
    std::lock_guard g(sync_mu_);
    sync_waiting_.clear();
  }
  parameter_server(const parameter_server&) = delete;
  parameter_server& operator=(const parameter_server&) = delete;

  std::uint16_t port() const { return server_.port(); }

  /// Serves until a shutdown request (returns normally) or stop().
  void run() { server_.run(); }
  void stop() { server_.stop(); }

  bool initialized() const noexcept { return initialized_.load(); }
  std::int64_t global_step() const noexcept { return global_step_.load(); }
  bool shutdown_requested() const noexcept { return shutdown_.load(); }
  /// Connections refused or dropped for malformed input.
  std::size_t rejected_connections() const noexcept { return server_.rejected(); }

  /// The request handler (called by the transport on its I/O threads).
  void operator()(const rpc_peer& peer, const detail::frame_header& h, std::span<const std::byte> meta,
                  std::span<std::byte> payload, rpc_reply& reply) {
    using detail::message_kind;
    switch (h.kind) {
      case message_kind::ps_init: return init(peer, detail::decode_message<detail::ps_init_msg>(meta, "init"), payload, reply);
      case message_kind::ps_ready:
      case message_kind::ps_step: return status(reply);
      case message_kind::ps_done: {
        {
          std::lock_guard g(done_mu_);
          done_.insert(peer.identity);
        }
        return status(reply);
      }
      case message_kind::ps_done_tasks: {
        // The tasks a client knows to be done join this ps's set (a restarted ps lost it);
        // the reply is the whole set, so the client learns the names others reported.
        auto m = detail::decode_message<detail::ps_done_tasks_msg>(meta, "done tasks");
        detail::ps_done_tasks_msg out;
        {
          std::lock_guard g(done_mu_);
          done_.insert(m.tasks.begin(), m.tasks.end());
          out.tasks.assign(done_.begin(), done_.end());
        }
        reply.meta = detail::encode_message(out);
        return;
      }
      case message_kind::ps_pull: return pull(detail::decode_message<detail::ps_pull_msg>(meta, "pull"), peer, reply);
      case message_kind::ps_push: return push(detail::decode_message<detail::ps_push_msg>(meta, "push"), payload, reply);
      case message_kind::ps_sync_push:
        return sync_push(peer, detail::decode_message<detail::ps_sync_push_msg>(meta, "sync push"), payload, reply);
      case message_kind::ps_save: return save(detail::decode_message<detail::ps_save_msg>(meta, "save"), reply);
      case message_kind::ps_restore:
        return restore(peer, detail::decode_message<detail::ps_restore_msg>(meta, "restore"), payload, reply);
      case message_kind::ps_shutdown:
        detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": shutdown requested by " +
                                                 peer.identity + "; global step " + std::to_string(global_step_.load()));
        shutdown_ = true;
        status(reply);
        reply.stop_server = true;
        return;
      default:
        throw error(errc::invalid_argument, "unexpected message kind " + std::to_string(int(h.kind)));
    }
  }

 private:
  struct shard_state {
    std::vector<float> values;
    std::unique_ptr<optim::optimizer<optim::host_space>> opt;
    std::mutex mu;
  };

  void status(rpc_reply& reply, std::uint64_t updates, std::uint64_t staleness = 0, bool dropped = false,
              std::uint64_t dropped_total = 0) const {
    std::uint64_t done = 0;
    {
      std::lock_guard g(done_mu_);
      done = done_.size();
    }
    reply.meta = detail::encode_message(detail::ps_status_msg{global_step_.load(), initialized_.load(), updates,
                                                              staleness, done, dropped, dropped_total});
  }
  void status(rpc_reply& reply) const { status(reply, updates_.load()); }

  void init(const rpc_peer& peer, const detail::ps_init_msg& m, std::span<const std::byte> payload, rpc_reply& reply) {
    std::unique_lock lock(shards_mu_);
    if (initialized_) {
      // A restarted chief initialises again: the values already here win (as in TensorFlow,
      // where only an uninitialised variable is initialised).
      detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": init from " + peer.identity +
                                               " ignored: already initialised");
      return status(reply);
    }
    if (m.ids.size() != m.sizes.size()) throw error(errc::corrupt_data, "init: ids and sizes differ in length");
    std::uint64_t total = 0;
    for (auto sz : m.sizes) {
      if (sz > payload.size() / sizeof(float) - total)
        throw error(errc::shape_mismatch, "init: shard sizes exceed the " + std::to_string(payload.size()) +
                                              " payload bytes");
      total += sz;
    }
    if (total * sizeof(float) != payload.size())
      throw error(errc::shape_mismatch, "init: " + std::to_string(payload.size()) + " payload bytes for " +
                                            std::to_string(total) + " floats");
    const optim::rule rule = m.rule.to_rule();
    std::size_t at = 0;
    for (std::size_t i = 0; i < m.ids.size(); ++i) {
      auto s = std::make_unique<shard_state>();
      s->values.resize(m.sizes[i]);
      std::memcpy(s->values.data(), payload.data() + at, m.sizes[i] * sizeof(float));
      at += m.sizes[i] * sizeof(float);
      s->opt = std::make_unique<optim::optimizer<optim::host_space>>(rule, m.sizes[i]);
      shards_[m.ids[i]] = std::move(s);
    }
    lock_free_ = m.lock_free;
    {
      std::lock_guard g(sync_mu_);
      sync_n_ = std::size_t(m.replicas_to_aggregate);
      for (auto id : m.ids) sync_acc_[id].assign(shards_[id]->values.size(), 0.0f);
    }
    initialized_ = true;
    detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": initialised " +
                                             std::to_string(m.ids.size()) + " shards (" + std::to_string(total) +
                                             " floats) by " + peer.identity + ", rule " + m.rule.name +
                                             (m.lock_free ? ", lock-free" : ", locked"));
    status(reply);
  }

public:
  /// Transport callback: a peer's connection ended. In synchronous mode a worker that
  /// vanishes without having reported done may leave fewer than N replicas: then every
  /// waiting worker, and every later contribution, gets an error saying so.
  void disconnected(const rpc_peer& peer) {
    bool finished = false;
    {
      std::lock_guard g(done_mu_);
      finished = done_.count(peer.identity) > 0;
    }
    std::lock_guard g(sync_mu_);
    if (sync_n_ == 0 || !sync_alive_.erase(peer.identity) || finished) return;
    if (sync_alive_.size() < sync_n_ && sync_failure_.empty()) {
      sync_failure_ = "synchronous training cannot continue: " + peer.identity + " disconnected, leaving " +
                      std::to_string(sync_alive_.size()) + " of the " + std::to_string(sync_n_) +
                      " replicas each step needs";
      detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": " + sync_failure_);
      for (auto& w : sync_waiting_) w.send(rpc_reply::failure(errc::peer_failure, sync_failure_));
      sync_waiting_.clear();
    }
  }

  /// Contributions dropped because they arrived for a finished step, per worker.
  std::map<std::string, std::uint64_t> dropped_contributions() const {
    std::lock_guard g(sync_mu_);
    return sync_dropped_;
  }

 private:
  // Synchronous aggregation (SyncReplicasOptimizer semantics): contributions tagged with the
  // step they were computed at; the first N for the current step are averaged and applied,
  // the step advances and every contributor is released; contributions for an older step are
  // dropped and counted per worker.
  void sync_push(const rpc_peer& peer, const detail::ps_sync_push_msg& m, std::span<std::byte> payload,
                 rpc_reply& reply) {
    std::shared_lock shards_lock(shards_mu_);
    require_initialized();
    std::unique_lock g(sync_mu_);
    if (sync_n_ == 0) throw error(errc::invalid_argument, "synchronous push to a ps initialised for asynchronous training");
    if (m.step < sync_step_) {
      const auto n = ++sync_dropped_[peer.identity];
      detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": dropped a stale contribution of " +
                                               peer.identity + " for step " + std::to_string(m.step) + " (now " +
                                               std::to_string(sync_step_) + "; " + std::to_string(n) +
                                               " dropped from it so far)");
      status(reply, updates_.load(), 0, /*dropped=*/true, n);
      return;
    }
    if (!sync_failure_.empty()) throw error(errc::peer_failure, sync_failure_);
    if (m.step > sync_step_)
      throw error(errc::invalid_argument, peer.identity + " contributed for step " + std::to_string(m.step) +
                                              " but the ps is at step " + std::to_string(sync_step_));
    // One contribution per worker and step (a worker that timed out and retried must not
    // count twice).
    if (!sync_contributors_.insert(peer.identity).second)
      throw error(errc::invalid_argument, peer.identity + " already contributed to step " + std::to_string(sync_step_));
    sync_alive_.insert(peer.identity);
    std::size_t bytes = 0;
    for (auto id : m.ids) bytes += find(id).values.size() * sizeof(float);
    if (bytes != payload.size())
      throw error(errc::shape_mismatch, "sync push: " + std::to_string(payload.size()) + " payload bytes for shards of " +
                                            std::to_string(bytes) + " bytes");
    std::size_t at = 0;
    for (auto id : m.ids) {
      auto& acc = sync_acc_.at(id);
      const auto* in = reinterpret_cast<const float*>(payload.data() + at);
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += in[i];
      at += acc.size() * sizeof(float);
    }
    sync_lr_ = m.learning_rate;
    sync_delta_ = m.delta;
    ++sync_count_;
    reply.deferred = true;
    sync_waiting_.push_back(peer.defer());
    if (sync_count_ < sync_n_) return;

    // The N-th contribution: average, apply, advance, release everyone.
    const float inv = 1.0f / float(sync_n_);
    for (auto& [id, acc] : sync_acc_) {
      for (auto& v : acc) v *= inv;
      auto& s = find(id);
      std::lock_guard sg(s.mu);
      if (sync_delta_) {
        for (std::size_t i = 0; i < acc.size(); ++i) s.values[i] += acc[i];
      } else if (sync_lr_ < 0) {
        s.opt->apply(std::span<float>(s.values), std::span<const float>(acc));
      } else {
        s.opt->apply(std::span<float>(s.values), std::span<const float>(acc), sync_lr_);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
    }
    ++sync_step_;
    global_step_ = sync_step_;
    ++updates_;
    sync_count_ = 0;
    sync_contributors_.clear();
    for (auto& w : sync_waiting_) {
      rpc_reply r;
      status(r, updates_.load());
      w.send(std::move(r));
    }
    sync_waiting_.clear();
  }

  shard_state& find(std::uint32_t id) {
    auto it = shards_.find(id);
    if (it == shards_.end())
      throw error(errc::out_of_range, "shard " + std::to_string(id) + " is not held by " + options_.transport.identity);
    return *it->second;
  }

  // Snapshot of every shard (each under its lock, so no locked update is half-applied in it),
  // then the file is written outside the locks: pushes continue while the bytes go to disk.
  // Lock-free (Hogwild) updates take no lock, so they may race with the copy, as they race
  // with pulls. Shards are copied one after another: in asynchronous training a checkpoint is
  // a per-shard-consistent snapshot, not one instant of the whole model (TensorFlow's Saver
  // gives the same).
  void save(const detail::ps_save_msg& m, rpc_reply& reply) {
    std::vector<std::vector<float>> copies;
    std::vector<detail::ckpt::shard_record> records;
    detail::ps_saved_msg out;
    std::size_t num_slots = 0;
    {
      std::shared_lock lock(shards_mu_);
      require_initialized();
      out.global_step = global_step_.load();
      for (auto& [id, s] : shards_) {
        std::lock_guard g(s->mu);
        num_slots = optim::detail::slot_count(s->opt->update_rule());
        out.rule = std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); },
                              s->opt->update_rule());
        detail::ckpt::shard_record r{id, s->values.size(), s->opt->iterations(), {}};
        copies.emplace_back(s->values.begin(), s->values.end());
        for (std::size_t k = 0; k < num_slots; ++k) {
          auto slot = s->opt->slot(k);
          copies.emplace_back(slot.begin(), slot.end());
        }
        records.push_back(std::move(r));
        out.ids.push_back(id);
        out.iterations.push_back(s->opt->iterations());
      }
    }
    std::size_t c = 0;
    for (auto& r : records)
      for (std::size_t k = 0; k <= num_slots; ++k) r.tensors.push_back(copies[c++].data());
    const auto f = detail::ckpt::write_shard_file(m.directory, m.name, std::size_t(m.ps_index), std::size_t(m.num_ps),
                                                  out.global_step, num_slots, records, options_.save_fault);
    out.file = f.name;
    out.sha256 = f.sha256;
    out.bytes = f.bytes;
    out.num_slots = num_slots;
    if (out.rule.empty()) out.rule = "sgd";
    detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": saved " +
                                             std::to_string(records.size()) + " shards to " + m.directory + "/" +
                                             f.name + " (" + std::to_string(f.bytes) + " bytes) at global step " +
                                             std::to_string(out.global_step));
    reply.meta = detail::encode_message(out);
  }

  void restore(const rpc_peer& peer, const detail::ps_restore_msg& m, std::span<const std::byte> payload,
               rpc_reply& reply) {
    const auto& init = m.init;
    if (init.ids.size() != init.sizes.size() || init.ids.size() != m.iterations.size())
      throw error(errc::corrupt_data, "restore: ids, sizes and iterations differ in length");
    const optim::rule rule = init.rule.to_rule();
    if (optim::detail::slot_count(rule) != m.num_slots)
      throw error(errc::invalid_argument, "restore: rule " + init.rule.name + " has " +
                                              std::to_string(optim::detail::slot_count(rule)) + " slots, " +
                                              std::to_string(m.num_slots) + " sent");
    if (!m.directory.empty()) return restore_from_files(peer, m, rule, payload, reply);
    const std::uint64_t per = 1 + m.num_slots;
    std::uint64_t total = 0;
    for (auto sz : init.sizes) {
      if (sz > payload.size() / sizeof(float) / per - total / per)
        throw error(errc::shape_mismatch, "restore: shard sizes exceed the " + std::to_string(payload.size()) +
                                              " payload bytes");
      total += sz * per;
    }
    if (total * sizeof(float) != payload.size())
      throw error(errc::shape_mismatch, "restore: " + std::to_string(payload.size()) + " payload bytes for " +
                                            std::to_string(total) + " floats");
    std::map<std::uint32_t, std::unique_ptr<shard_state>> fresh;
    std::size_t at = 0;
    for (std::size_t i = 0; i < init.ids.size(); ++i) {
      const std::size_t n = init.sizes[i];
      auto s = std::make_unique<shard_state>();
      s->values.resize(n);
      std::memcpy(s->values.data(), payload.data() + at, n * sizeof(float));
      at += n * sizeof(float);
      s->opt = std::make_unique<optim::optimizer<optim::host_space>>(rule, n);
      for (std::size_t k = 0; k < m.num_slots; ++k) {
        std::memcpy(s->opt->slot(k).data(), payload.data() + at, n * sizeof(float));
        at += n * sizeof(float);
      }
      s->opt->set_iterations(m.iterations[i]);
      fresh[init.ids[i]] = std::move(s);
    }
    install_restored(peer, m, std::move(fresh), reply);
  }

  // The restore message names the checkpoint and each shard's first element in its saved
  // layout; this ps opens (and verifies) only the shard files holding its ranges and reads its
  // shards' values and slots from them. Every size is checked against the verified files
  // before anything is allocated.
  void restore_from_files(const rpc_peer& peer, const detail::ps_restore_msg& m, const optim::rule& rule,
                          std::span<const std::byte> payload, rpc_reply& reply) {
    const auto& init = m.init;
    if (!payload.empty() || m.from.size() != init.ids.size())
      throw error(errc::corrupt_data, "restore from files: a payload, or " + std::to_string(m.from.size()) +
                                          " ranges for " + std::to_string(init.ids.size()) + " shards");
    std::vector<checkpoint_reader::element_range> ranges;
    for (std::size_t i = 0; i < init.ids.size(); ++i) ranges.push_back({m.from[i], init.sizes[i]});
    const auto ck = checkpoint_reader::open_for(m.directory, m.checkpoint, ranges);
    if (ck.manifest().num_slots != m.num_slots && m.num_slots != 0)
      throw error(errc::invalid_config, "restore: checkpoint " + m.checkpoint + " holds " +
                                            std::to_string(ck.manifest().num_slots) + " slots, " +
                                            std::to_string(m.num_slots) + " wanted");
    for (const auto& r : ranges)
      if (r.first > ck.num_parameters() || r.count > ck.num_parameters() - r.first)
        throw error(errc::out_of_range, "restore: elements [" + std::to_string(r.first) + ", +" +
                                            std::to_string(r.count) + ") outside checkpoint " + m.checkpoint);
    std::map<std::uint32_t, std::unique_ptr<shard_state>> fresh;
    for (std::size_t i = 0; i < init.ids.size(); ++i) {
      const std::size_t n = init.sizes[i];
      auto s = std::make_unique<shard_state>();
      s->values.resize(n);
      ck.read(0, m.from[i], s->values);
      s->opt = std::make_unique<optim::optimizer<optim::host_space>>(rule, n);
      for (std::size_t k = 0; k < m.num_slots; ++k) ck.read(k + 1, m.from[i], s->opt->slot(k));
      s->opt->set_iterations(m.iterations[i]);
      fresh[init.ids[i]] = std::move(s);
    }
    install_restored(peer, m, std::move(fresh), reply);
  }

  void install_restored(const rpc_peer& peer, const detail::ps_restore_msg& m,
                        std::map<std::uint32_t, std::unique_ptr<shard_state>> fresh, rpc_reply& reply) {
    const auto& init = m.init;
    std::unique_lock lock(shards_mu_);
    shards_ = std::move(fresh);
    lock_free_ = init.lock_free;
    {
      std::lock_guard g(sync_mu_);
      // Contributors waiting on a step that the restore replaced learn it (they retry).
      for (auto& w : sync_waiting_)
        w.send(rpc_reply::failure(errc::peer_failure, options_.transport.identity + " was restored from checkpoint " +
                                                          m.checkpoint + " while this step was aggregated"));
      sync_waiting_.clear();
      sync_n_ = std::size_t(init.replicas_to_aggregate);
      sync_acc_.clear();  // a model-sized buffer, needed only by synchronous training
      if (sync_n_ > 0)
        for (auto id : init.ids) sync_acc_[id].assign(shards_[id]->values.size(), 0.0f);
      sync_step_ = m.global_step;
      sync_count_ = 0;
      sync_contributors_.clear();
      sync_failure_.clear();
    }
    global_step_ = m.global_step;
    initialized_ = true;
    detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": restored " +
                                             std::to_string(init.ids.size()) + " shards from checkpoint " +
                                             m.checkpoint + " (global step " + std::to_string(m.global_step) +
                                             (m.directory.empty() ? ") sent by " : ") read from its files, asked by ") +
                                             peer.identity);
    status(reply);
  }

  void require_initialized() const {
    if (!initialized_) throw error(errc::invalid_argument, options_.transport.identity + " is not initialised yet");
  }

  void pull(const detail::ps_pull_msg& m, const rpc_peer& peer, rpc_reply& reply) {
    std::shared_lock lock(shards_mu_);
    require_initialized();
    // The count read before the values: updates that land during the read count as missed.
    const std::uint64_t seen = updates_.load();
    if (lock_free_) {
      // Hogwild: send straight from the shards (updates may race with the send).
      for (auto id : m.ids) {
        auto& s = find(id);
        reply.payload.push_back(asio::buffer(s.values.data(), s.values.size() * sizeof(float)));
      }
    } else {
      // Locked: a consistent snapshot of each shard, copied under its lock.
      std::size_t bytes = 0;
      for (auto id : m.ids) bytes += find(id).values.size() * sizeof(float);
      peer.scratch->resize(bytes);
      std::size_t at = 0;
      for (auto id : m.ids) {
        auto& s = find(id);
        std::lock_guard g(s.mu);
        std::memcpy(peer.scratch->data() + at, s.values.data(), s.values.size() * sizeof(float));
        at += s.values.size() * sizeof(float);
      }
      reply.payload.push_back(asio::buffer(*peer.scratch));
    }
    status(reply, seen);
  }

  void push(const detail::ps_push_msg& m, std::span<std::byte> payload, rpc_reply& reply) {
    std::uint64_t staleness = 0, updates = 0;
    {
      std::shared_lock lock(shards_mu_);
      require_initialized();
      // Staleness: updates applied since the pusher read the values this push was computed
      // from. Counted at arrival, so concurrent pushes each see the others that came first.
      const std::uint64_t before = updates_.fetch_add(m.ids.empty() ? 0 : 1);
      staleness = before >= m.seen_updates ? before - m.seen_updates : 0;
      updates = before + (m.ids.empty() ? 0 : 1);
      const float scale = m.scale_by_staleness ? 1.0f / float(staleness + 1) : 1.0f;
      std::size_t bytes = 0;
      for (auto id : m.ids) bytes += find(id).values.size() * sizeof(float);
      if (bytes != payload.size())
        throw error(errc::shape_mismatch, "push: " + std::to_string(payload.size()) + " payload bytes for shards of " +
                                              std::to_string(bytes) + " bytes");
      std::size_t at = 0;
      for (auto id : m.ids) {
        auto& s = find(id);
        const std::size_t n = s.values.size();
        const auto* in = reinterpret_cast<const float*>(payload.data() + at);
        at += n * sizeof(float);
        std::unique_lock g(s.mu, std::defer_lock);
        if (!lock_free_) g.lock();
        if (m.delta) {
          float* v = s.values.data();
          if (scale == 1.0f) {
            for (std::size_t i = 0; i < n; ++i) v[i] += in[i];
          } else {
            for (std::size_t i = 0; i < n; ++i) v[i] += scale * in[i];
          }
        } else if (m.learning_rate < 0) {
          s.opt->apply(std::span<float>(s.values), std::span<const float>(in, n));
        } else {
          s.opt->apply(std::span<float>(s.values), std::span<const float>(in, n), m.learning_rate);
        }
      }
    }
    if (m.increment_step) ++global_step_;
    status(reply, updates, staleness);
  }

  ps_options options_;
  std::shared_mutex shards_mu_;  // init (exclusive) against pull/push (shared)
  std::map<std::uint32_t, std::unique_ptr<shard_state>> shards_;
  std::atomic<bool> initialized_{false}, shutdown_{false};
  bool lock_free_ = false;
  std::atomic<std::int64_t> global_step_{0};
  std::atomic<std::uint64_t> updates_{0};
  mutable std::mutex done_mu_;
  std::set<std::string> done_;  // identities that reported the end of their training
  // Synchronous mode (sync_n_ > 0).
  mutable std::mutex sync_mu_;
  std::size_t sync_n_ = 0, sync_count_ = 0;
  std::int64_t sync_step_ = 0;
  float sync_lr_ = -1.0f;
  bool sync_delta_ = false;
  std::map<std::uint32_t, std::vector<float>> sync_acc_;  // per shard: sum of this step's contributions
  std::vector<rpc_responder> sync_waiting_;               // contributors of the current step
  std::set<std::string> sync_alive_;                      // workers that contributed and are connected
  std::set<std::string> sync_contributors_;               // of the current step
  std::map<std::string, std::uint64_t> sync_dropped_;
  std::string sync_failure_;
  rpc_server<parameter_server> server_;  // last: its handler (this) is complete before it starts
};

/// What a push reports back.
struct push_result {
  std::int64_t global_step = -1;  ///< after the push (from ps 0)
  std::uint64_t staleness = 0;    ///< largest, over the ps pushed to, count of updates applied
                                  ///< since this client's last pull (0 for a fresh pull)
};

/// What a synchronous contribution reports back.
struct sync_result {
  std::int64_t global_step = -1;   ///< after the step completed (or the current one, if dropped)
  bool dropped = false;            ///< the contribution came for a finished step
  std::uint64_t dropped_total = 0; ///< this worker's dropped contributions so far (per ps, max)
};

/// A worker's (or the chief's) view of the parameter servers.
///
/// Buffers passed to pull/push are the model's flat float32 parameter or gradient buffers in
/// host memory (on CUDA builds copy device tensors through a host buffer first); shards are
/// read from and written to their place in them directly.
class ps_client {
 public:
  /// ps_addresses[i] is ps task i's "host:port"; placement says which shards each holds.
  ps_client(std::vector<std::string> ps_addresses, placement layout, transport_options options)
      : layout_(std::move(layout)), rpc_(std::move(options)) {
    if (ps_addresses.size() != layout_.num_ps)
      throw error(errc::invalid_config, "ps_client: " + std::to_string(ps_addresses.size()) +
                                            " ps addresses for a placement over " + std::to_string(layout_.num_ps) +
                                            " ps tasks");
    for (std::size_t i = 0; i < ps_addresses.size(); ++i) rpc_.add_peer("ps." + std::to_string(i), ps_addresses[i]);
    for (std::size_t i = 0; i < layout_.num_ps; ++i) ids_.push_back(to_ids(layout_.shards_on(i)));
    seen_.assign(layout_.num_ps, 0);
  }

  const placement& layout() const noexcept { return layout_; }
  /// This task's identity ("worker.1"), as presented to the ps.
  const std::string& identity() const noexcept { return rpc_.options().identity; }

  /// Connects to every ps (retrying while they start). Errors: see rpc_client::connect_all.
  void connect() { rpc_.connect_all(); }

  /// Sends the initial values and the update rule to every ps (the chief does this once).
  /// With replicas_to_aggregate = N > 0 the ps runs synchronously (see push_sync).
  void initialize(std::span<const float> params, const optim::rule& rule, bool lock_free = false,
                  std::size_t replicas_to_aggregate = 0) {
    check_size(params.size(), "initialize");
    std::vector<rpc_call> calls(layout_.num_ps);
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) {
      detail::ps_init_msg m;
      m.ids = ids_[ps];
      for (auto id : m.ids) m.sizes.push_back(layout_.shards[id].size);
      m.rule = detail::rule_msg::from(rule);
      m.lock_free = lock_free;
      m.replicas_to_aggregate = replicas_to_aggregate;
      calls[ps] = make_call(ps, detail::message_kind::ps_init, detail::encode_message(m));
      gather(calls[ps], ps, params);
    }
    run(calls);
  }

  /// True when every ps has been initialised.
  bool ready() {
    auto calls = broadcast(detail::message_kind::ps_ready);
    run(calls);
    for (auto& c : calls)
      if (!detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").initialized) return false;
    return true;
  }

  /// Waits (polling every poll_ms, bounded by timeout) until every ps is initialised.
  /// Errors: errc::timeout naming the wait.
  void wait_ready(std::chrono::milliseconds timeout, std::chrono::milliseconds poll = std::chrono::milliseconds(50)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready()) {
      if (std::chrono::steady_clock::now() + poll > deadline)
        throw error(errc::timeout, "parameter servers not initialised within " + std::to_string(timeout.count()) +
                                       " ms (is the chief running?)");
      // Polling interval of a readiness check, not a synchronisation stand-in: the ps has no
      // way to call the worker back.
      std::this_thread::sleep_for(poll);
    }
  }

  /// Reads every shard into params. Returns the global step.
  std::int64_t pull(std::span<float> params) {
    check_size(params.size(), "pull");
    std::vector<rpc_call> calls(layout_.num_ps);
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) {
      calls[ps] = make_call(ps, detail::message_kind::ps_pull, detail::encode_message(detail::ps_pull_msg{ids_[ps]}));
      for (auto id : ids_[ps])
        calls[ps].reply_payload.push_back(
            asio::buffer(params.data() + layout_.shards[id].offset, layout_.shards[id].size * sizeof(float)));
    }
    run(calls);
    for (const auto& c : calls)
      seen_[c.peer] = detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").updates;
    track_done(calls);
    return step_of(calls);
  }

  /// Sends gradients; each ps applies its update rule (with `learning_rate` when given).
  /// Advances the global step when increment_step.
  push_result push_gradients(std::span<const float> grads, std::optional<float> learning_rate = std::nullopt,
                             bool increment_step = true) {
    return push(grads, false, learning_rate.value_or(-1.0f), increment_step, false);
  }

  /// Sends deltas that each ps adds to its values; with scale_by_staleness (DynSGD) each ps
  /// first multiplies them by 1 / (staleness + 1).
  push_result push_deltas(std::span<const float> deltas, bool increment_step = true,
                          bool scale_by_staleness = false) {
    return push(deltas, true, -1.0f, increment_step, scale_by_staleness);
  }

  /// Synchronous contribution for global step `step`: returns when the step is complete
  /// (N contributions averaged and applied on every ps) or at once when `step` is already
  /// finished (the contribution is dropped: result.dropped). With delta the average is added;
  /// otherwise each ps applies its rule to it (at `learning_rate` when given).
  /// Errors: errc::peer_failure when fewer than N replicas remain; errc::timeout.
  sync_result push_sync(std::span<const float> buf, std::int64_t step, std::optional<float> learning_rate = std::nullopt,
                        bool delta = false) {
    check_size(buf.size(), "push_sync");
    std::vector<rpc_call> calls;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) {
      detail::ps_sync_push_msg m{ids_[ps], step, learning_rate.value_or(-1.0f), delta};
      calls.push_back(make_call(ps, detail::message_kind::ps_sync_push, detail::encode_message(m)));
      gather(calls.back(), ps, buf);
    }
    run(calls);
    sync_result r;
    for (const auto& c : calls) {
      const auto st = detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status");
      r.dropped = r.dropped || st.dropped;
      r.dropped_total = std::max(r.dropped_total, st.dropped_total);
      if (c.peer == 0) r.global_step = st.global_step;
    }
    track_done(calls);
    return r;
  }

  /// The global step (held by ps 0).
  std::int64_t global_step() {
    rpc_call c = make_call(0, detail::message_kind::ps_step, detail::encode_message(detail::empty_msg{}));
    rpc_.call(c);
    return detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").global_step;
  }

  /// Tells every ps that this task has finished training (idempotent per task identity).
  void mark_done() {
    // Every ps: each one must tell a worker that finished from one that died.
    auto calls = broadcast(detail::message_kind::ps_done);
    run(calls);
  }

  /// How many tasks have called mark_done(): the union of the sets every ps holds and the
  /// ones this client learnt before. Re-announces the tasks this client knows of to every ps,
  /// so a ps restarted (empty) after a worker finished learns it again and the chief's wait
  /// for the workers ends. The client also learns the names whenever a pull or push reply
  /// shows a ps whose count differs from what it knows (one extra request then), so the chief
  /// knows of a finished worker within a step even when the ps dies afterwards.
  std::size_t workers_done() {
    std::vector<std::size_t> targets(layout_.num_ps);
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) targets[ps] = ps;
    // Two rounds at most: a ps that lacked names another ps told of in the first round gets
    // the union in the second.
    for (int round = 0; round < 2 && !targets.empty(); ++round) {
      detail::ps_done_tasks_msg m;
      m.tasks.assign(done_seen_.begin(), done_seen_.end());
      const auto meta = detail::encode_message(m);
      std::vector<rpc_call> calls;
      for (auto ps : targets) calls.push_back(make_call(ps, detail::message_kind::ps_done_tasks, meta));
      run(calls);
      std::vector<std::size_t> known(calls.size());
      for (std::size_t i = 0; i < calls.size(); ++i) {
        auto r = detail::decode_message<detail::ps_done_tasks_msg>(calls[i].reply_meta, "done tasks");
        known[i] = r.tasks.size();
        for (auto& t : r.tasks) done_seen_.insert(std::move(t));
      }
      std::vector<std::size_t> lacking;
      for (std::size_t i = 0; i < calls.size(); ++i)
        if (known[i] < done_seen_.size()) lacking.push_back(targets[i]);
      targets = std::move(lacking);
    }
    return done_seen_.size();
  }

  /// The tasks this client knows to have called mark_done() (see workers_done()).
  const std::set<std::string>& done_tasks() const noexcept { return done_seen_; }

  /// Ends the job: every ps replies and exits. The chief calls this when training is done.
  void shutdown() {
    auto calls = broadcast(detail::message_kind::ps_shutdown);
    run(calls);
  }

  /// Reconnects to every ps whose connection failed (a restarted ps comes back on the same
  /// address), retrying until transport_options::connect_timeout_ms.
  void reconnect() { rpc_.connect_all(); }

  /// Saves a checkpoint (the chief does this): every ps writes its shard file into
  /// options.directory, then the manifest and the state file are written here, and
  /// checkpoints beyond options.max_to_keep are deleted. `vars` are the model's variables
  /// (the placement's variable indices refer to them). The checkpoint is named
  /// "<prefix>-<step>"; without `step`, the global step read from ps 0 first. Returns the
  /// manifest (its global_step is ps 0's at the time of the save).
  /// Errors: errc::io_error / peer_failure when a ps cannot write its file (the previous
  /// checkpoint stays the latest); errc::invalid_argument when vars do not match the placement.
  checkpoint_manifest save_checkpoint(const checkpoint_options& options, const std::vector<variable_spec>& vars,
                                      std::optional<std::int64_t> step = std::nullopt) {
    for (const auto& sh : layout_.shards)
      if (sh.variable >= vars.size())
        throw error(errc::invalid_argument, "save_checkpoint: the placement names variable " +
                                                std::to_string(sh.variable) + " of " + std::to_string(vars.size()));
    if (options.directory.empty()) throw error(errc::invalid_config, "save_checkpoint: no checkpoint directory");
    std::error_code ec;
    std::filesystem::create_directories(options.directory, ec);
    if (ec)
      throw error(errc::io_error, "cannot create checkpoint directory " + options.directory + ": " + ec.message());
    checkpoint_manifest m;
    m.name = options.prefix + "-" + std::to_string(step ? *step : global_step());
    m.num_ps = layout_.num_ps;
    // The ps tasks may run in another working directory: they get the absolute path.
    const std::string directory = std::filesystem::absolute(options.directory).lexically_normal().string();
    std::vector<rpc_call> calls;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps)
      calls.push_back(make_call(ps, detail::message_kind::ps_save,
                                detail::encode_message(detail::ps_save_msg{directory, m.name, ps, layout_.num_ps})));
    run(calls);
    std::vector<std::int64_t> iterations(vars.size(), 0);
    for (const auto& c : calls) {
      const auto r = detail::decode_message<detail::ps_saved_msg>(c.reply_meta, "saved");
      if (c.peer == 0) m.global_step = r.global_step;
      if (!r.ids.empty()) {
        m.rule = r.rule;
        m.num_slots = std::size_t(r.num_slots);
      }
      m.files.push_back({r.file, c.peer, r.bytes, r.sha256});
      for (std::size_t i = 0; i < r.ids.size() && i < r.iterations.size(); ++i) {
        if (r.ids[i] >= layout_.shards.size())
          throw error(errc::corrupt_data, "ps." + std::to_string(c.peer) + " saved shard " + std::to_string(r.ids[i]) +
                                              " outside the placement");
        auto& it = iterations[layout_.shards[r.ids[i]].variable];
        it = std::max(it, r.iterations[i]);
      }
    }
    for (std::size_t v = 0; v < vars.size(); ++v)
      m.variables.push_back({vars[v].name, vars[v].shape, vars[v].offset, iterations[v]});
    for (std::size_t id = 0; id < layout_.shards.size(); ++id) {
      const auto& sh = layout_.shards[id];
      m.shards.push_back({std::uint32_t(id), sh.variable, sh.part, sh.ps, sh.row_begin, sh.row_end, sh.offset, sh.size});
    }
    commit_checkpoint(options.directory, m, options.max_to_keep);
    return m;
  }

  /// Restores checkpoint `name` of `directory` into every ps, whatever number of ps tasks
  /// saved it: the checkpoint is verified (checkpoint_reader: every field, size and SHA-256),
  /// its variables matched to `vars` by name and re-sliced for this client's placement; values,
  /// the rule's slots, the update counts and the global step replace what each ps held
  /// (initialised or not). `rule`, lock_free and replicas_to_aggregate are as in initialize().
  /// Returns the restored global step; the values are left in `params` when it is non-empty.
  /// Streaming (restore_transfer::through_chief): each ps's slices are read from the shard
  /// files and sent before the next ps's are read, so the chief holds one ps's share of the
  /// checkpoint, never the whole model. With ps_reads_files the chief reads only the manifest
  /// and each ps opens, verifies and reads its own slices (params are then pulled from the ps).
  /// Errors: errc::corrupt_data / io_error (a file missing or damaged), invalid_argument /
  /// shape_mismatch (a variable missing or reshaped), invalid_config (the checkpoint's slots
  /// belong to another update rule).
  std::int64_t restore_checkpoint(const std::string& directory, const std::string& name,
                                  const std::vector<variable_spec>& vars, const optim::rule& rule, bool lock_free = false,
                                  std::size_t replicas_to_aggregate = 0, std::span<float> params = {},
                                  restore_transfer transfer = restore_transfer::through_chief) {
    const restore_settings how{vars, rule, lock_free, replicas_to_aggregate, params};
    if (transfer == restore_transfer::ps_reads_files) return restore_by_ps(directory, read_manifest(directory, name), how);
    return restore_from(checkpoint_reader::open(directory, name), how);
  }

  /// Restores the latest checkpoint of `directory` (see restore_checkpoint); returns its
  /// global step, or nullopt (nothing changed) when the directory holds none. When the latest
  /// fails verification, with checkpoint_fallback::newest_valid (the default) the transport's
  /// log says so and the newest kept checkpoint that verifies is restored; with refuse, or when
  /// none verifies, the error is thrown (errc::corrupt_data naming the latest's cause). The
  /// chief verifies the candidates either way (reading every file once, holding nothing).
  std::optional<std::int64_t> restore_latest(const std::string& directory, const std::vector<variable_spec>& vars,
                                             const optim::rule& rule, bool lock_free = false,
                                             std::size_t replicas_to_aggregate = 0, std::span<float> params = {},
                                             checkpoint_fallback fallback = checkpoint_fallback::newest_valid,
                                             restore_transfer transfer = restore_transfer::through_chief) {
    auto reader = open_latest_checkpoint(directory, fallback, [this](const std::string& line) {
      detail::log_line(rpc_.options(), "dtf " + identity() + ": " + line);
    });
    if (!reader) return std::nullopt;
    const restore_settings how{vars, rule, lock_free, replicas_to_aggregate, params};
    if (transfer == restore_transfer::ps_reads_files) return restore_by_ps(directory, reader->manifest(), how);
    return restore_from(*reader, how);
  }

 private:
  struct restore_settings {
    const std::vector<variable_spec>& vars;
    const optim::rule& rule;
    bool lock_free;
    std::size_t replicas_to_aggregate;
    std::span<float> params;
  };

  // Checks a restore against the checkpoint's manifest; returns each model variable's match
  // and the rule's slot count.
  std::pair<std::vector<const checkpoint_variable*>, std::size_t> plan_restore(const checkpoint_manifest& man,
                                                                              const restore_settings& how) const {
    const auto& vars = how.vars;
    const std::size_t num_slots = optim::detail::slot_count(how.rule);
    const std::string rule_name =
        std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); }, how.rule);
    if (num_slots != 0 && (man.num_slots != num_slots || man.rule != rule_name))
      throw error(errc::invalid_config, "checkpoint " + man.name + " holds the slots of rule " + man.rule +
                                            ", the restoring run uses " + rule_name);
    check_size(num_parameters(vars), "restore_checkpoint");
    if (!how.params.empty()) check_size(how.params.size(), "restore_checkpoint");
    std::vector<const checkpoint_variable*> saved(vars.size());
    for (std::size_t v = 0; v < vars.size(); ++v) saved[v] = &checkpoint_reader::match_variable(man, vars[v]);
    for (const auto& sh : layout_.shards)
      if (sh.variable >= vars.size() || sh.offset < vars[sh.variable].offset ||
          sh.offset - vars[sh.variable].offset > vars[sh.variable].size() ||
          sh.size > vars[sh.variable].size() - (sh.offset - vars[sh.variable].offset))
        throw error(errc::invalid_argument, "restore_checkpoint: a shard of the placement lies outside variable " +
                                                std::to_string(sh.variable) + " of " + std::to_string(vars.size()));
    return {std::move(saved), num_slots};
  }

  // The restore message for ps `ps` (no payload); from[i]: shard i's first saved element.
  detail::ps_restore_msg restore_message(std::size_t ps, const checkpoint_manifest& man,
                                         const std::vector<const checkpoint_variable*>& saved, std::size_t num_slots,
                                         const restore_settings& how, std::vector<std::uint64_t>& from) const {
    detail::ps_restore_msg m;
    m.init.ids = ids_[ps];
    from.clear();
    for (auto id : m.init.ids) {
      const auto& sh = layout_.shards[id];
      const auto& sv = *saved[sh.variable];
      m.init.sizes.push_back(sh.size);
      m.iterations.push_back(sv.iterations);
      from.push_back(sv.offset + (sh.offset - how.vars[sh.variable].offset));  // inside sv: plan_restore
    }
    m.init.rule = detail::rule_msg::from(how.rule);
    m.init.lock_free = how.lock_free;
    m.init.replicas_to_aggregate = how.replicas_to_aggregate;
    m.global_step = man.global_step;
    m.num_slots = num_slots;
    m.checkpoint = man.name;
    return m;
  }

  std::int64_t restore_from(const checkpoint_reader& ck, const restore_settings& how) {
    const auto& man = ck.manifest();
    const auto [saved, num_slots] = plan_restore(man, how);
    // One ps at a time: read its shards' values and slots from the files, send, release.
    std::vector<std::uint64_t> from;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) {
      auto m = restore_message(ps, man, saved, num_slots, how, from);
      std::size_t floats = 0;
      for (auto n : m.init.sizes) floats += n * (1 + num_slots);
      std::vector<float> payload(floats);
      std::size_t at = 0;
      for (std::size_t i = 0; i < m.init.ids.size(); ++i) {
        const std::size_t n = m.init.sizes[i];
        for (std::size_t k = 0; k <= num_slots; ++k) {
          ck.read(k, from[i], std::span<float>(payload).subspan(at, n));
          if (k == 0 && !how.params.empty())
            std::copy_n(payload.begin() + std::ptrdiff_t(at), n,
                        how.params.begin() + std::ptrdiff_t(layout_.shards[m.init.ids[i]].offset));
          at += n;
        }
      }
      rpc_call c = make_call(ps, detail::message_kind::ps_restore, detail::encode_message(m));
      c.payload.push_back(asio::buffer(payload.data(), payload.size() * sizeof(float)));
      rpc_.call(c);
    }
    return man.global_step;
  }

  std::int64_t restore_by_ps(const std::string& directory, const checkpoint_manifest& man, const restore_settings& how) {
    const auto [saved, num_slots] = plan_restore(man, how);
    // The ps tasks may run in another working directory: they get the absolute path.
    const std::string dir = std::filesystem::absolute(directory).lexically_normal().string();
    std::vector<rpc_call> calls(layout_.num_ps);
    std::vector<std::uint64_t> from;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) {
      auto m = restore_message(ps, man, saved, num_slots, how, from);
      m.directory = dir;
      m.from = from;
      calls[ps] = make_call(ps, detail::message_kind::ps_restore, detail::encode_message(m));
    }
    run(calls);  // every ps reads its own slices, in parallel
    if (!how.params.empty()) pull(how.params);
    return man.global_step;
  }

  static std::vector<std::uint32_t> to_ids(const std::vector<std::size_t>& v) {
    return std::vector<std::uint32_t>(v.begin(), v.end());
  }

  void check_size(std::size_t n, const char* what) const {
    std::size_t total = 0;
    for (const auto& s : layout_.shards) total = std::max(total, s.offset + s.size);
    if (n < total)
      throw error(errc::shape_mismatch, std::string("ps_client::") + what + ": buffer of " + std::to_string(n) +
                                            " floats, the placement covers " + std::to_string(total));
  }

  rpc_call make_call(std::size_t ps, detail::message_kind kind, std::vector<std::byte> meta) const {
    rpc_call c;
    c.peer = ps;
    c.kind = kind;
    c.meta = std::move(meta);
    return c;
  }

  void gather(rpc_call& c, std::size_t ps, std::span<const float> buf) const {
    for (auto id : ids_[ps])
      c.payload.push_back(asio::buffer(buf.data() + layout_.shards[id].offset, layout_.shards[id].size * sizeof(float)));
  }

  std::vector<rpc_call> broadcast(detail::message_kind kind) const {
    std::vector<rpc_call> calls;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps)
      calls.push_back(make_call(ps, kind, detail::encode_message(detail::empty_msg{})));
    return calls;
  }

  push_result push(std::span<const float> buf, bool delta, float lr, bool increment_step, bool scale) {
    check_size(buf.size(), "push");
    std::vector<rpc_call> calls;
    for (std::size_t ps = 0; ps < layout_.num_ps; ++ps) {
      // ps 0 holds the global step, so it always gets a push (possibly of no shards).
      if (ids_[ps].empty() && !(ps == 0 && increment_step)) continue;
      detail::ps_push_msg m{ids_[ps], delta, lr, increment_step && ps == 0, seen_[ps], scale};
      calls.push_back(make_call(ps, detail::message_kind::ps_push, detail::encode_message(m)));
      gather(calls.back(), ps, buf);
    }
    run(calls);
    track_done(calls);
    push_result r;
    r.global_step = step_of(calls);
    for (const auto& c : calls)
      r.staleness =
          std::max(r.staleness, detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").staleness);
    return r;
  }

  std::int64_t step_of(const std::vector<rpc_call>& calls) const {
    for (const auto& c : calls)
      if (c.peer == 0) return detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").global_step;
    return -1;
  }

  void run(std::vector<rpc_call>& calls) { rpc_.call_all(std::span<rpc_call>(calls)); }

  // After a pull or push: a ps whose done count differs from the tasks this client knows of
  // has news (a task finished) or lost its set (it restarted): exchange the names.
  void track_done(const std::vector<rpc_call>& calls) {
    for (const auto& c : calls)
      if (detail::decode_message<detail::ps_status_msg>(c.reply_meta, "status").workers_done != done_seen_.size()) {
        workers_done();
        return;
      }
  }

  placement layout_;
  rpc_client rpc_;
  std::vector<std::vector<std::uint32_t>> ids_;  // shard ids held by each ps
  std::vector<std::uint64_t> seen_;              // each ps's update count at the last pull
  std::set<std::string> done_seen_;              // tasks known to have called mark_done()
};

}  // namespace dtf
