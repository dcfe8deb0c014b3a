// dtf/ps/server.hpp — the parameter server task: request dispatch and the checks that keep a
// connected peer from breaking it. Storage and apply: shard_store; synchronous steps:
// sync_requests (the protocol: dtf/ps/sync_protocol.hpp).
//
// Requests (see dtf/detail/messages.hpp):
//   init      the chief's initial values and ps_config, in parts (dtf/ps/incoming_model.hpp); a
//             second init of the same model trained the same way is ignored, else refused naming why
//   ready     whether init has happened, so workers wait for it instead of racing it
//   pull      current values of the requested shards (distinct, held here: the reply is bounded)
//   push      gradients (the ps applies its rule) or deltas (added; DynSGD scales them by
//             1/(staleness+1)); optionally advances the global step (kept on ps 0). Staleness:
//             updates applied since the pusher's last pull; an update counts once it is applied.
//             A large push is applied a piece at a time as it arrives (dtf/ps/push_pieces.hpp)
//   sync push, stage, apply, decision   a synchronous step's commit on ps 0, parts staged on
//             the other ps, the decision forwarded to them (dtf/ps/sync_requests.hpp)
//   embedding init, gather, sparse push, sparse stats (sparse_service.hpp); step, shutdown, save,
//   restore, done (tasks), positions: ps_client, checkpointing, done_tasks, position_table
// What a peer cannot do (each is an error reply to that peer alone; the ps keeps serving):
//   make it allocate beyond the model: a request's announced payload is checked before the
//   transport allocates for it (payload_limit: init and restore exactly what their meta names,
//   a push at most this ps's shards, a sparse request at most the rows held of its table, a
//   sync push both; larger is refused and its bytes dropped unread), pulls and pushes name
//   distinct shards held here, pushes carry exactly their shards' bytes; bad_alloc in a handler
//   is an error reply; apply NaN or infinity (ps_options::nonfinite, default reject, naming the
//   worker); advance the global step with an empty push on a ps that holds shards; count in
//   another worker's name in a synchronous step (contributions are the connection's); corrupt a
//   step with a malformed contribution (validated before it is recorded); grow the done-task set
//   or the synchronous tables' names beyond the known workers (ps_options::known_workers) or
//   max_done_tasks; re-initialise a different model, or one trained another way, by a second
//   init; init, restore, save, hold the steps or shut down the ps when ps_options::chief names
//   another task; choose where checkpoints are written or read (ps_options::checkpoint_dir;
//   names are confined to it, the writer never follows a symlink). Saves are written on a
//   thread of their own (dtf/ps/save_thread.hpp), each shard copied in its turn: a save holds at
//   most one shard's values and slots more than the model (dtf/ps/shard_snapshot.hpp).
// What a peer can do: all an authenticated worker may (push finite garbage, push to ps 0 without
// shards to advance the step when ps 0 holds none); without a secret, forward a decision of its
// own (docs/design/sync-protocol.md); without ps_options::chief, restore a model and shut down.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/done_tasks.hpp>
#include <dtf/ps/incoming_model.hpp>
#include <dtf/ps/position_table.hpp>
#include <dtf/ps/push_pieces.hpp>
#include <dtf/ps/save_thread.hpp>
#include <dtf/ps/shard_snapshot.hpp>
#include <dtf/ps/shard_store.hpp>
#include <dtf/ps/sparse_service.hpp>
#include <dtf/ps/sync_requests.hpp>
#include <dtf/transport.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <shared_mutex>
#include <string>

namespace dtf {
/// A parameter server task. Construct it on its address, then run() until the chief's shutdown.
class parameter_server {
 public:
  /// Listens on bind_address ("host:port"; port 0 picks one). Errors: errc::io_error if unbound.
  parameter_server(const std::string& bind_address, ps_options options)
      : options_(std::move(options)), server_(*this, options_.transport, bind_address, options_.threads) { store_.set_fault(options_.apply_fault); }
  /// Waits for a save being written; releases the deferred replies (they hold connections)
  /// before the transport goes.
  ~parameter_server() { saves_.join(), sync_.clear_waiting(), done_.clear_waiting(); }
  parameter_server(const parameter_server&) = delete;
  parameter_server& operator=(const parameter_server&) = delete;

  std::uint16_t port() const { return server_.port(); }  ///< the port it listens on (the one picked for port 0)
  /// Serves until a shutdown request (returns normally) or stop().
  void run() { server_.run(); }
  void stop() { server_.stop(); }  ///< stops serving: run() returns

  bool initialized() const noexcept { return initialized_.load(); }  ///< the chief initialised or restored it
  std::int64_t global_step() const noexcept { return global_step_.load(); }  ///< this ps's global step
  bool shutdown_requested() const noexcept { return shutdown_.load(); }  ///< a shutdown was requested
  /// Connections refused or dropped for malformed input.
  std::size_t rejected_connections() const noexcept { return server_.rejected(); }
  /// Contributions dropped because they arrived for a finished step, per worker.
  std::map<std::string, std::uint64_t> dropped_contributions() const { return sync_.dropped(); }
  /// Pushes applied a piece at a time as they arrived (dtf/ps/push_pieces.hpp), whole or not.
  std::uint64_t pushes_applied_as_received() const noexcept { return pieced_.load(); }
  std::set<std::string> done_tasks() const { return done_.names(); }  ///< the tasks that reported done
  std::size_t done_waiters() const { return done_.waiting(); }  ///< requests waiting for more of them
  std::size_t sync_waiters() const { return sync_.waiting(); }  ///< commits waiting for their step's decision

  /// The request handler (called by the transport on its I/O threads).
  void operator()(const rpc_peer& peer, const detail::frame_header& h, std::span<const std::byte> meta,
                  std::span<std::byte> payload, rpc_reply& reply) {
    try {
      dispatch(peer, h, meta, payload, reply);
    } catch (const std::bad_alloc&) {
      throw error(errc::invalid_argument, "request of " + peer.identity + " needs more memory than this ps has");
    }
  }

  /// Transport callback, before a request's payload is allocated: the most bytes it may carry
  /// (see the file comment). A larger announcement is refused unread.
  std::uint64_t payload_limit(const rpc_peer& peer, const detail::frame_header& h, std::span<const std::byte> meta) {
    using detail::message_kind;
    require_chief(peer, h.kind);  // refused unread
    switch (h.kind) {
      case message_kind::ps_init: {
        const auto m = detail::decode_message<detail::ps_init_msg>(meta, "init");
        ps_detail::shard_store::check_model(m.ids, m.sizes, h.payload_size, 1, "init");
        return h.payload_size;
      }
      case message_kind::ps_restore: {
        const auto m = detail::decode_message<detail::ps_restore_msg>(meta, "restore");
        if (m.from_files) return 0;
        if (m.num_slots > 2) throw error(errc::corrupt_data, "restore: " + std::to_string(m.num_slots) + " slots (at most 2)");
        ps_detail::shard_store::check_model(m.init.ids, m.init.sizes, h.payload_size, 1 + std::uint64_t(m.num_slots),
                                            "restore");
        return h.payload_size;
      }
      case message_kind::ps_push: return model_bytes_.load();
      case message_kind::ps_sync_push:
      case message_kind::ps_sync_stage: return model_bytes_.load() + sparse_.payload_limit(h.kind, meta);
      case message_kind::ps_gather:
      case message_kind::ps_sparse_push:
      case message_kind::ps_sparse_restore: return sparse_.payload_limit(h.kind, meta);
      case message_kind::ps_buffers: return positions_.buffers_limit(peer, meta, h.payload_size);
      default: return 0;
    }
  }

  /// Transport callback, for a large request: a push to apply a piece at a time as it arrives
  /// (dtf/ps/push_pieces.hpp); anything else is taken whole (also where this returns nothing:
  /// the single call then answers, with the error when there is one).
  rpc_pieces payload_pieces(const rpc_peer& peer, const detail::frame_header& h, std::span<const std::byte> meta) {
    if (h.kind != detail::message_kind::ps_push || !options_.apply_as_received) return {};
    auto m = detail::decode_message<detail::ps_push_msg>(meta, "push");
    if (!m.all_finite.value_or(false) && options_.nonfinite != nonfinite_policy::apply) return {};
    std::shared_lock lock(shards_mu_);
    if (!initialized_ || m.ids.empty() || store_.bytes_of(m.ids) != h.payload_size) return {};
    const std::uint64_t before = updates_.load();
    const std::uint64_t staleness = before >= m.seen_updates ? before - m.seen_updates : 0;
    auto p = std::make_shared<ps_detail::push_pieces>(std::move(m), store_, generation_.load(), staleness,
                                                      options_.apply_piece_bytes);
    if (p->ends().size() < 2) return {};
    rpc_pieces s;
    s.ends = p->ends();
    s.on_piece = [this, p](std::size_t k, std::span<std::byte> bytes) {
      std::shared_lock piece_lock(shards_mu_);
      p->apply(k, bytes, store_, generation_.load(), options_.nonfinite);
    };
    s.finish = [this, p, who = peer.identity](rpc_reply& reply) {
      ++pieced_;
      const bool counts = p->shards_applied() > 0 && p->message().counts;  // a push's last part counts
      const std::uint64_t updates = counts ? updates_.fetch_add(1) + 1 : updates_.load();
      if (!p->failure().empty()) throw error(errc::invalid_argument, "push of " + who + " " + p->failure());
      if (p->message().increment_step) ++global_step_;
      status(reply, updates, p->staleness());
    };
    return s;
  }

  /// Transport callback: a peer's connection ended (see sync_aggregator::disconnected).
  void disconnected(const rpc_peer& peer) {
    const bool finished = done_.disconnected(peer);
    sync_requests_.disconnected(peer, shards_mu_);  // a checkpoint's hold ends with its connection
    if (const auto d = sync_.disconnected(peer.remote, peer.identity, finished)) {
      detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": " + d->why);
      if (!d->fatal) done_.add_departed(peer.identity);  // a backup's loss: the chief's final wait ends
    }
  }

 private:
  void dispatch(const rpc_peer& peer, const detail::frame_header& h, std::span<const std::byte> meta,
                std::span<std::byte> payload, rpc_reply& reply) {
    using detail::message_kind;
    require_chief(peer, h.kind);
    switch (h.kind) {
      case message_kind::ps_init: return init(peer, detail::decode_message<detail::ps_init_msg>(meta, "init"), payload, reply);
      case message_kind::ps_ready:
      case message_kind::ps_step: return status(reply);
      case message_kind::ps_done:
        done_.add({peer.identity});
        return status(reply);
      case message_kind::ps_done_tasks:
        return done_.handle(peer, detail::decode_message<detail::ps_done_tasks_msg>(meta, "done tasks"), reply);
      case message_kind::ps_pull:
        if (synchronous_) sync_.seen(peer.remote, peer.identity);  // a live replica (before the step lock)
        return pull(detail::decode_message<detail::ps_pull_msg>(meta, "pull"), peer, reply);
      case message_kind::ps_push:
        return push(peer, detail::decode_message<detail::ps_push_msg>(meta, "push"), payload, reply);
      case message_kind::ps_sync_push:
      case message_kind::ps_sync_stage:
      case message_kind::ps_sync_apply:
      case message_kind::ps_sync_decision:
      case message_kind::ps_sync_hold: {
        std::shared_lock lock(shards_mu_);
        if (h.kind != message_kind::ps_sync_hold) require_initialized();  // a model of tables alone saves
        return sync_requests_.handle(peer, h.kind, meta, payload, reply);
      }
      case message_kind::ps_embedding_init:
      case message_kind::ps_gather:
      case message_kind::ps_sparse_push:
      case message_kind::ps_sparse_stats:
      case message_kind::ps_sparse_restore: {
        const bool skipped = sparse_.handle(peer, h.kind, meta, payload, reply);
        if (reply.meta.empty()) status(reply, updates_.load(), 0, false, 0, skipped);
        return;
      }
      case message_kind::ps_positions: return positions_.handle(peer, meta, reply);
      case message_kind::ps_buffers: return positions_.buffers(meta, payload, reply);
      case message_kind::ps_save: return save(peer, detail::decode_message<detail::ps_save_msg>(meta, "save"), reply);
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

  void status(rpc_reply& reply, std::uint64_t updates, std::uint64_t staleness = 0, bool dropped = false,
              std::uint64_t dropped_total = 0, bool skipped = false,
              const std::optional<detail::sync_decision>& decision = std::nullopt) const {
    const std::uint64_t done = done_.size();
    reply.meta = detail::encode_message(detail::ps_status_msg{global_step_.load(), initialized_.load(), updates,
                                                              staleness, done, dropped, dropped_total, skipped,
                                                              synchronous_.load(), decision});
  }
  void status(rpc_reply& reply) const { status(reply, updates_.load()); }

  // Init and restore come in parts, the last installing the model (dtf/ps/incoming_model.hpp). A restarted
  // chief's init of an initialised ps: the values here win (TensorFlow's rule) if model and training are the same.
  void init(const rpc_peer& peer, const detail::ps_init_msg& m, std::span<const std::byte> payload, rpc_reply& reply) {
    const ps_config cfg = ps_detail::config_of(m);
    ps_detail::shard_store::check_mode(cfg.rule, cfg.mode);
    std::unique_lock lock(shards_mu_);
    const bool again = initialized_;
    auto part = again ? ps_detail::shard_map{} : ps_detail::shard_store::from_payload(
        m.ids, m.sizes, std::vector<std::int64_t>(m.ids.size()), cfg.rule, 0, payload);
    if (!incoming_.add("init", peer.identity, again ? "of an initialised ps" : "", m, std::move(part)))
      return status(reply);
    const auto whole = incoming_.whole();
    auto shards = incoming_.take_shards();
    if (again) {
      if (const auto change = ps_detail::training_change(store_.held(sync_.replicas()), whole, cfg); !change.empty())
        throw error(errc::invalid_argument, "init from " + peer.identity + ": " + change);
      detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": init from " + peer.identity +
                                               " ignored: already initialised");
      return status(reply);
    }
    std::uint64_t floats = 0;
    for (const auto n : whole.sizes) floats += n;
    store_.install(std::move(shards), cfg.rule, cfg.mode);
    ++generation_;
    model_bytes_ = floats * sizeof(float);
    sync_.configure(cfg.replicas_to_aggregate, store_, 0, "initialised", ps_detail::sync_proofs::of(options_.transport.secret, m));
    synchronous_ = cfg.replicas_to_aggregate > 0;
    initialized_ = true;
    detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": initialised " +
                                             std::to_string(whole.ids.size()) + " shards (" + std::to_string(floats) +
                                             " floats in " + std::to_string(m.parts) + " parts) by " + peer.identity +
                                             ", rule " + m.rule.name + (m.lock_free ? ", lock-free" : ", locked"));
    status(reply);
  }

  // Written on the save thread, into this ps's own checkpoint directory, each shard copied in
  // its turn (dtf/ps/shard_snapshot.hpp: at most one shard's copy is held); answered from there.
  // The save thread holds shards_mu_ (shared) for the whole write: an init or restore waits for
  // it, pulls and pushes go on. Synchronous training also holds step_mu_ (shared), so the file
  // is of one step: that step's apply waits (the chief holds ps 0's decisions while it saves).
  void save(const rpc_peer& peer, const detail::ps_save_msg& m, rpc_reply& reply) {
    if (options_.checkpoint_dir.empty())
      throw error(errc::invalid_config, options_.transport.identity + " has no checkpoint directory (ps_options::checkpoint_dir)");
    reply.deferred = true;  // answered by the save thread
    saves_.run([this, m, respond = peer.defer()]() mutable {
      rpc_reply r;
      try {
        if (options_.save_fault.before_write) options_.save_fault.before_write();
        detail::ps_saved_msg out;
        {
          std::shared_lock lock(shards_mu_);
          if (!sparse_.holds_tables()) require_initialized();  // a model of tables alone saves them
          std::shared_lock step_lock(step_mu_, std::defer_lock);
          if (synchronous_) step_lock.lock();
          out.global_step = global_step_.load();
          if (m.at_step && *m.at_step != out.global_step)
            throw error(errc::peer_failure, options_.transport.identity + " is at step " + std::to_string(out.global_step) +
                                                ", the checkpoint is of step " + std::to_string(*m.at_step));
          out.rule = store_.rule_name();
          ps_detail::save_shards(store_, options_.checkpoint_dir, m, options_.save_fault, out);
        }
        sparse_.save(options_.checkpoint_dir, m, options_.save_fault, out);
        detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": saved " +
                                                 std::to_string(out.ids.size()) + " shards to " + out.file + " (" +
                                                 std::to_string(out.bytes) + " bytes) at global step " +
                                                 std::to_string(out.global_step));
        r.meta = detail::encode_message(out);
      } catch (const error& e) {
        r = rpc_reply::failure(errc(e.code().value()), e.message());
      } catch (const std::exception& e) {
        r = rpc_reply::failure(errc::io_error, options_.transport.identity + " could not save: " + e.what());
      }
      respond.send(std::move(r));
    });
  }

  void restore(const rpc_peer& peer, const detail::ps_restore_msg& m, std::span<const std::byte> payload,
               rpc_reply& reply) {
    const ps_config cfg = ps_detail::config_of(m.init);
    auto fresh = ps_detail::shard_store::from_restore(options_.checkpoint_dir, options_.transport.identity, m, cfg, payload);
    std::unique_lock lock(shards_mu_);
    if (!incoming_.add("restore", peer.identity, m.checkpoint + " at step " + std::to_string(m.global_step), m.init,
                       std::move(fresh)))
      return status(reply);
    fresh = incoming_.take_shards();
    std::uint64_t floats = 0;
    for (const auto& [id, sh] : fresh) floats += sh->values.size();
    store_.install(std::move(fresh), cfg.rule, cfg.mode);
    ++generation_;
    model_bytes_ = floats * sizeof(float);
    // Contributors waiting on a step that the restore replaced learn it (they retry).
    sync_.configure(cfg.replicas_to_aggregate, store_, m.global_step,
                    options_.transport.identity + " was restored from checkpoint " + m.checkpoint +
                        " while this step was aggregated",
                    ps_detail::sync_proofs::of(options_.transport.secret, m.init));
    global_step_ = m.global_step;
    synchronous_ = cfg.replicas_to_aggregate > 0;
    initialized_ = true;
    detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": restored " +
                                             std::to_string(store_.shards().size()) + " shards from checkpoint " +
                                             m.checkpoint + " (global step " + std::to_string(m.global_step) +
                                             (m.from_files ? ") read from its files, asked by " : ") sent by ") +
                                             peer.identity);
    status(reply);
  }

  void require_chief(const rpc_peer& peer, detail::message_kind k) const {
    using enum detail::message_kind;
    if (options_.chief.empty() || peer.identity == options_.chief) return;
    if (const char* what = k == ps_init ? "init" : k == ps_restore ? "restore" : k == ps_save ? "save"
                           : k == ps_shutdown ? "shutdown" : k == ps_sync_hold ? "a hold of the steps" : nullptr)
      throw error(errc::invalid_argument, std::string(what) + " from " + peer.identity + " refused: only the chief (" +
                                              options_.chief + ") may ask it");
  }

  void require_initialized() const {
    if (!initialized_) throw error(errc::invalid_argument, options_.transport.identity + " is not initialised yet");
  }

  void pull(const detail::ps_pull_msg& m, const rpc_peer& peer, rpc_reply& reply) {
    std::shared_lock lock(shards_mu_);
    require_initialized();
    // Synchronous training: the values and the step in the reply are of one step (a step's
    // apply holds step_mu_ exclusively from its first shard to its new number).
    std::shared_lock step_lock(step_mu_, std::defer_lock);
    if (synchronous_) step_lock.lock();
    const std::size_t bytes = store_.bytes_of(m.ids);  // distinct, held: bounded by the model
    // The count read before the values: an update counts once applied, so every counted one
    // is in the values (updates that land during the read make the staleness over-, not under-,
    // counted).
    const std::uint64_t seen = updates_.load();
    if (store_.mode() == apply_mode::locked) {
      // Written straight from the shards: each leased as it is now (copy on write keeps the
      // leased values unchanged while the socket reads them).
      std::vector<std::span<const float>> values;
      store_.lease(m.ids, values, reply.holds);
      for (const auto v : values) reply.payload.push_back(asio::buffer(v.data(), v.size_bytes()));
    } else {
      // Lock-free: copied with atomic loads while updates go on (sending straight from the
      // shards' memory would race with the concurrent fetch_adds).
      peer.scratch->resize(bytes);
      store_.copy_out(m.ids, peer.scratch->data());
      reply.payload.push_back(asio::buffer(*peer.scratch));
    }
    status(reply, seen);
  }

  void push(const rpc_peer& peer, const detail::ps_push_msg& m, std::span<std::byte> payload, rpc_reply& reply) {
    std::uint64_t staleness = 0, updates = 0;
    bool skipped = false;
    {
      std::shared_lock lock(shards_mu_);
      require_initialized();
      const std::size_t bytes = store_.bytes_of(m.ids);
      if (bytes != payload.size())
        throw error(errc::shape_mismatch, "push of " + peer.identity + ": " + std::to_string(payload.size()) +
                                              " payload bytes for shards of " + std::to_string(bytes) + " bytes");
      if (m.ids.empty() && m.increment_step && !store_.shards().empty())
        throw error(errc::invalid_argument, "push of " + peer.identity + " carries no update: it cannot advance the global step");
      const std::span<const float> in(reinterpret_cast<const float*>(payload.data()), payload.size() / sizeof(float));
      if (options_.nonfinite != nonfinite_policy::apply && !ps_detail::all_finite(in)) {
        if (options_.nonfinite == nonfinite_policy::reject)
          throw error(errc::invalid_argument, "push of " + peer.identity + " holds non-finite values: rejected");
        detail::log_line(options_.transport, "dtf " + options_.transport.identity + ": skipped a non-finite push of " +
                                                 peer.identity);
        skipped = true;
      }
      if (!skipped) {
        // Staleness: updates applied since the pusher read its values; this one counts once applied.
        const std::uint64_t before = updates_.load();
        staleness = before >= m.seen_updates ? before - m.seen_updates : 0;
        std::size_t applied = 0;
        try {
          store_.apply_all(m.ids, {m.kind, {}, m.learning_rate, 1.0f / float(staleness + 1)}, in, applied);
        } catch (const std::exception& e) {  // the shards applied are in the values: the update counts
          if (applied > 0) updates_.fetch_add(1);
          throw error(errc::invalid_argument, "push of " + peer.identity + " failed after " + std::to_string(applied) +
                                                  " of " + std::to_string(m.ids.size()) + " shards were applied (" +
                                                  e.what() + "): counted as an update, the step not advanced");
        }
        updates = m.ids.empty() || !m.counts ? updates_.load() : updates_.fetch_add(1) + 1;  // a push's last part counts
        if (m.increment_step) ++global_step_;
      } else {
        updates = updates_.load();
      }
    }
    status(reply, updates, staleness, false, 0, skipped);
  }

  ps_options options_;
  std::shared_mutex shards_mu_;  // init/restore (exclusive) against everything else (shared)
  std::shared_mutex step_mu_;    // synchronous: a step's apply (exclusive) against pulls (shared)
  ps_detail::shard_store store_;
  ps_detail::incoming_model incoming_;  // an init or restore whose parts are arriving (under shards_mu_)
  ps_detail::sync_aggregator sync_;
  ps_detail::sparse_service sparse_{options_};  // embedding tables (their own lock)
  ps_detail::position_table positions_{options_};  // the training tasks' data positions (their own lock)
  std::atomic<bool> initialized_{false}, shutdown_{false}, synchronous_{false};
  std::atomic<std::int64_t> global_step_{0};
  std::atomic<std::uint64_t> updates_{0}, pieced_{0}, generation_{0};  // generation: init/restore count (push_pieces)
  std::atomic<std::uint64_t> model_bytes_{0};  // the dense shards held here, in bytes (init/restore)
  ps_detail::done_registry done_{options_};  // tasks that reported the end of their training (its own lock)
  ps_detail::save_thread saves_;  // writes checkpoint files off the I/O threads
  ps_detail::sync_requests sync_requests_{options_, store_, sparse_, positions_, sync_, step_mu_, global_step_, updates_,
                                          [this](rpc_reply& r, bool dropped, std::uint64_t total, bool skipped, const auto& d) {
                                            status(r, updates_.load(), 0, dropped, total, skipped, d);
                                          }};
  rpc_server<parameter_server> server_;  // last: its handler (this) is complete before it starts
};

}  // namespace dtf
