// dtf/detail/messages.hpp — the control messages of the dtf protocol (cereal-serialisable
// aggregates). Cheap to include: the fuzz target decodes every one of them.
#pragma once

#include <dtf/data/position.hpp>
#include <dtf/detail/frame.hpp>
#include <dtf/detail/hmac.hpp>
#include <dtf/error.hpp>
#include <dtf/optim/rules.hpp>

#include <cereal/types/optional.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtf::detail {

// ---- handshake ------------------------------------------------------------------------------

struct hello_msg {
  std::uint32_t protocol = protocol_version;
  std::string cluster_id, identity;
  digest nonce{};
  bool authenticate = false;
  template <class A>
  void serialize(A& ar) {
    ar(protocol, cluster_id, identity, nonce, authenticate);
  }
};
struct challenge_msg {
  digest nonce{};
  template <class A>
  void serialize(A& ar) {
    ar(nonce);
  }
};
struct auth_msg {
  digest mac{};
  template <class A>
  void serialize(A& ar) {
    ar(mac);
  }
};
struct welcome_msg {
  std::string identity;
  digest mac{};
  template <class A>
  void serialize(A& ar) {
    ar(identity, mac);
  }
};
/// Reason for a refused connection or a failed request.
struct refused_msg {
  std::string reason;
  template <class A>
  void serialize(A& ar) {
    ar(reason);
  }
};

// ---- parameter server -----------------------------------------------------------------------

/// An optim::rule on the wire (weight_decay since protocol version 7).
struct rule_msg {
  std::string name = "sgd";
  float learning_rate = 0.01f, momentum = 0.9f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f,
        initial_accumulator = 0.1f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  template <class A>
  void serialize(A& ar) {
    ar(name, learning_rate, momentum, beta1, beta2, epsilon, initial_accumulator, nesterov, weight_decay);
  }
  static rule_msg from(const optim::rule& r) {
    rule_msg m;
    std::visit(
        [&](const auto& x) {
          using R = std::decay_t<decltype(x)>;
          m.name = std::string(R::name);
          m.learning_rate = x.learning_rate;
          m.weight_decay = x.weight_decay;
          if constexpr (std::is_same_v<R, optim::momentum>) m.momentum = x.momentum, m.nesterov = x.nesterov;
          if constexpr (std::is_same_v<R, optim::adagrad>)
            m.initial_accumulator = x.initial_accumulator, m.epsilon = x.epsilon;
          if constexpr (std::is_same_v<R, optim::adam> || std::is_same_v<R, optim::adamw>)
            m.beta1 = x.beta1, m.beta2 = x.beta2, m.epsilon = x.epsilon;
        },
        r);
    return m;
  }
  optim::rule to_rule() const {
    if (name == "sgd") return optim::sgd{learning_rate, weight_decay};
    if (name == "momentum") return optim::momentum{learning_rate, momentum, nesterov, weight_decay};
    if (name == "adagrad") return optim::adagrad{learning_rate, initial_accumulator, epsilon, weight_decay};
    if (name == "adam") return optim::adam{learning_rate, beta1, beta2, epsilon, weight_decay};
    if (name == "adamw") return optim::adamw{learning_rate, beta1, beta2, epsilon, weight_decay};
    throw error(errc::corrupt_data, "unknown update rule '" + name + "'");
  }
};

/// What a push or a synchronous contribution carries.
enum class update_kind : std::uint8_t {
  gradient,      ///< the ps applies its update rule (at the message's learning rate, if any)
  delta,         ///< the ps adds the values
  scaled_delta,  ///< DynSGD: the ps adds the values times 1 / (staleness + 1)
  scaled_gradient,  ///< staleness-aware: the ps applies its rule at its rate times 1 / (staleness + 1)
};
template <class A>
std::uint8_t save_minimal(const A&, const update_kind& k) {
  return std::uint8_t(k);
}
template <class A>
void load_minimal(const A&, update_kind& k, const std::uint8_t& v) {
  if (v > std::uint8_t(update_kind::scaled_gradient)) throw error(errc::corrupt_data, "unknown update kind " + std::to_string(v));
  k = update_kind(v);
}

/// The kind of a gradient push: scaled by its staleness or not.
inline update_kind gradient_kind(bool scale_by_staleness) noexcept {
  return scale_by_staleness ? update_kind::scaled_gradient : update_kind::gradient;
}

struct ps_init_msg {
  std::vector<std::uint32_t> ids;
  std::vector<std::uint64_t> sizes;  // elements per shard, in ids order
  rule_msg rule;
  bool lock_free = false;
  std::uint64_t replicas_to_aggregate = 0;  // > 0: synchronous mode, N gradients per step
  std::uint64_t num_workers = 0;            // > 0: N must not exceed it
  // An init or restore in parts (dtf/ps/incoming_model.hpp): this is part `part` of `parts`,
  // ids and sizes being this part's shards.
  std::uint32_t part = 0, parts = 1;
  // The job's ps count and this ps's index: a synchronous ps 0 admits a commit only with a
  // receipt of each of ps 1 .. num_ps - 1 (docs/design/sync-protocol.md).
  std::uint32_t num_ps = 1, ps_index = 0;
  template <class A>
  void serialize(A& ar) {
    ar(ids, sizes, rule, lock_free, replicas_to_aggregate, num_workers, part, parts, num_ps, ps_index);
  }
};
struct ps_pull_msg {
  std::vector<std::uint32_t> ids;
  template <class A>
  void serialize(A& ar) {
    ar(ids);
  }
};
struct ps_push_msg {
  std::vector<std::uint32_t> ids;
  update_kind kind = update_kind::gradient;
  std::optional<float> learning_rate;  // gradient: none = the rule's own rate
  bool increment_step = false;         // advance the global step (ps 0 holds it)
  std::uint64_t seen_updates = 0;      // the ps's update count when this worker last pulled
  /// Whether every value is finite, as the sender checked (a push the ps may apply a piece at
  /// a time as it arrives); none: not checked.
  std::optional<bool> all_finite;
  /// Whether this request ends the push (a push in parts counts as one update, with its last:
  /// dtf/ps/request_parts.hpp).
  bool counts = true;
  template <class A>
  void serialize(A& ar) {
    ar(ids, kind, learning_rate, increment_step, seen_updates, all_finite, counts);
  }
};
/// Rows of one embedding table in a synchronous contribution: after the dense shards' floats
/// the payload holds, per part in order, count uint64 ids, then count * dim floats.
struct sync_rows_part {
  std::uint32_t table = 0;
  std::uint64_t count = 0;
  template <class A>
  void serialize(A& ar) {
    ar(table, count);
  }
};
/// A synchronous contribution's kind and learning rate (the step's is fixed by ps 0's decision).
struct step_rate {
  update_kind kind = update_kind::gradient;  // gradient or delta (the average is added)
  std::optional<float> learning_rate;        // gradient: none = the rule's own rate
  bool operator==(const step_rate&) const = default;
  template <class A>
  void serialize(A& ar) {
    ar(kind, learning_rate);
  }
};
/// A synchronous contribution's id: the authenticated identity of its sender (never a name
/// from the message), the incarnation its client drew (a restarted worker draws another) and
/// the client's count of its answered contributions (a retry of an unanswered one repeats it).
struct contribution_id {
  std::string worker;
  std::uint64_t incarnation = 0, sequence = 0;
  auto operator<=>(const contribution_id&) const = default;
  template <class A>
  void serialize(A& ar) {
    ar(worker, incarnation, sequence);
  }
};
/// ps p > 0 -> the worker, answering the stage of a part's last segment: ps `ps` holds every
/// segment of `id`'s part for `step`, of `rate`; mac under the ps key (zero without a secret).
/// The worker carries ps 1 .. P - 1's receipts in its commit (dtf/ps/sync_protocol.hpp).
struct sync_receipt {
  std::uint32_t ps = 0;
  std::int64_t step = 0;
  contribution_id id;
  step_rate rate;
  digest mac{};
  bool operator==(const sync_receipt&) const = default;
  template <class A>
  void serialize(A& ar) {
    ar(ps, step, id, rate, mac);
  }
};
struct ps_sync_push_msg {
  std::vector<std::uint32_t> ids;
  std::int64_t step = 0;               // the global step the contribution was computed at
  update_kind kind = update_kind::gradient;  // gradient or delta (the average is added)
  std::optional<float> learning_rate;  // gradient: none = the rule's own rate
  std::vector<sync_rows_part> rows;    // embedding rows held by this ps (applied with the step)
  std::optional<data::position> position;  // to ps 0: the sender's data position once this
                                           // contribution's step completes (recorded then)
  bool all_finite = true;  // to ps 0: every value of the whole contribution (all ps) is finite
  std::uint64_t incarnation = 0;  // drawn by the sender's client and the client's count of its
  std::uint64_t sequence = 0;     // contributions: with its identity, the contribution's id
  std::uint32_t segment = 0, segments = 1;  // a part larger than one request: this request's
                                            // place in it (docs/design/large-models.md)
  std::vector<sync_receipt> receipts;  // a commit (to ps 0): the other ps's receipts for the part
  step_rate rate() const { return {kind, learning_rate}; }
  template <class A>
  void serialize(A& ar) {
    ar(ids, step, kind, learning_rate, rows, position, all_finite, incarnation, sequence, segment, segments, receipts);
  }
};
/// ps 0's decision of a synchronous step: the contributions it averages, in order, and the
/// step's rate; mac: ps 0's proof under the ps key (zero without a secret).
struct sync_decision {
  std::int64_t step = 0;
  std::vector<contribution_id> ids;
  step_rate rate;
  digest mac{};
  bool operator==(const sync_decision&) const = default;
  template <class A>
  void serialize(A& ar) {
    ar(step, ids, rate, mac);
  }
};
/// Worker -> ps p > 0: apply `decision` (ps_sync_apply); worker -> ps 0: the decision of step
/// `decision.step`, ids empty (ps_sync_decision).
struct ps_sync_apply_msg {
  sync_decision decision;
  template <class A>
  void serialize(A& ar) {
    ar(decision);
  }
};
/// Chief -> ps 0: stop deciding steps (a synchronous checkpoint; for at most timeout_ms) or
/// resume. Answered with ps 0's status (its step: the one held).
struct ps_sync_hold_msg {
  bool hold = true;
  std::uint64_t timeout_ms = 0;
  template <class A>
  void serialize(A& ar) {
    ar(hold, timeout_ms);
  }
};
struct ps_status_msg {
  std::int64_t global_step = 0;
  bool initialized = false;
  std::uint64_t updates = 0;    // pushes this ps has applied (after this request)
  std::uint64_t staleness = 0;  // push replies: updates applied since the pusher's last pull
  std::uint64_t workers_done = 0;  // tasks that reported the end of their training (ps_done)
  bool dropped = false;            // sync push: the contribution was for a finished step
  std::uint64_t dropped_total = 0; // sync push: this worker's dropped contributions so far
  bool skipped = false;            // push: not applied (non-finite values, policy skip)
  bool synchronous = false;        // the ps aggregates synchronous steps (its global step is its own)
  std::optional<sync_decision> decision;  // ps 0's answer to a commit or a decision request
  std::optional<sync_receipt> receipt;    // ps p > 0's answer to the stage of a part's last segment
  template <class A>
  void serialize(A& ar) {
    ar(global_step, initialized, updates, staleness, workers_done, dropped, dropped_total, skipped, synchronous,
       decision, receipt);
  }
};
/// Chief -> ps: write your shards as DIR/NAME.ps-I-of-N.shard (see dtf/checkpoint.hpp), DIR
/// being the ps's own ps_options::checkpoint_dir (never a directory from the wire).
struct ps_save_msg {
  std::string name;
  std::uint64_t ps_index = 0, num_ps = 1;
  std::optional<std::int64_t> at_step;  // synchronous: the step the ps must be at (else an error)
  template <class A>
  void serialize(A& ar) {
    ar(name, ps_index, num_ps, at_step);
  }
};
/// ps -> chief: the shard file written.
struct ps_saved_msg {
  std::string file, sha256, rule;
  std::uint64_t bytes = 0, num_slots = 0;
  std::int64_t global_step = 0;
  std::vector<std::uint32_t> ids;            // shards saved
  std::vector<std::int64_t> iterations;      // per shard: updates its rule had applied
  // Embedding tables (when the ps holds any): the table file written, and per table its JSON
  // (dtf/checkpoint/table_format.hpp) with "shards" (the indices held here) and "rows_saved" (here).
  std::string table_file, table_sha256;
  std::uint64_t table_bytes = 0;
  std::vector<std::string> tables;
  template <class A>
  void serialize(A& ar) {
    ar(file, sha256, rule, bytes, num_slots, global_step, ids, iterations, table_file, table_sha256, table_bytes,
       tables);
  }
};
/// Chief -> ps: replace your state with these shards (values, then num_slots slots each, in
/// the payload), this global step and these per-shard update counts. With `from` set the
/// payload is empty: the ps reads its shards itself from checkpoint `checkpoint` of its own
/// ps_options::checkpoint_dir, shard i from element from[i] of the saved flat layout (the chief
/// never holds the model).
struct ps_restore_msg {
  ps_init_msg init;
  std::int64_t global_step = 0;
  std::uint64_t num_slots = 0;
  std::vector<std::int64_t> iterations;  // per shard, in init.ids order
  std::string checkpoint;                // the checkpoint's name (for the log, and to read)
  bool from_files = false;               // the ps reads the shard files itself
  std::vector<std::uint64_t> from;       // per shard, from_files: first saved element
  template <class A>
  void serialize(A& ar) {
    ar(init, global_step, num_slots, iterations, checkpoint, from_files, from);
  }
};
/// ps_done_tasks, both ways: the request names the done tasks the sender knows of (the ps
/// adds them to its own); the reply names every task this ps knows to be done. With wait_for,
/// the ps answers once it knows of that many, or after wait_ms (then with what it knows).
/// proofs (with a cluster secret): for each of `tasks`, the proof a ps gave that it reported done
/// (dtf/ps/done_tasks.hpp's done_proof), which a sender needs for every name but its own.
struct ps_done_tasks_msg {
  std::vector<std::string> tasks;
  std::uint64_t wait_for = 0;  // request: 0 answers at once
  std::uint32_t wait_ms = 0;   // request: the longest the answer may wait
  std::vector<std::string> proofs;
  template <class A>
  void serialize(A& ar) {
    ar(tasks, wait_for, wait_ms, proofs);
  }
};
/// ps_positions, both ways (dtf/ps/positions.hpp). Request: record `positions` (each replaces
/// that task's, or with fill_only only a task the ps holds none for: a restore from a checkpoint
/// never overrides a live task's newer report) and ask for the positions of `tasks` (or of every
/// task with all). Reply: the positions asked for that the ps holds.
struct ps_positions_msg {
  std::vector<data::task_position> positions;
  bool fill_only = false;
  std::vector<std::string> tasks;
  bool all = false;
  template <class A>
  void serialize(A& ar) {
    ar(positions, fill_only, tasks, all);
  }
};
/// ps_buffers, both ways (dtf/ps/positions.hpp): the chief's model buffers (dtf::has_buffers),
/// which ps 0 keeps for the workers. Request `op`: publish (the chief; the payload is `floats`
/// floats), query (how many ps 0 holds) or fetch (the payload of the reply: `floats` floats, as
/// many as ps 0 holds). Reply: whether ps 0 holds any (`held`) and how many floats.
struct ps_buffers_msg {
  enum : std::uint8_t { query = 0, publish = 1, fetch = 2 };
  std::uint8_t op = query;
  bool held = false;
  std::uint64_t floats = 0;
  template <class A>
  void serialize(A& ar) {
    ar(op, held, floats);
  }
};
// ---- sparse variables (dtf/ps/embedding_layout.hpp, dtf/ps/sparse_client.hpp) ---------------

/// Chief -> ps: create embedding table `table`: its spec, its shard count (shard j lives on ps
/// j % num_ps, the div split of rows for a fixed table) and its update rule. No payload: each
/// ps initialises its rows from the spec's initialiser.
struct ps_embedding_init_msg {
  std::uint32_t table = 0;
  std::string name;
  std::uint64_t rows = 0;
  std::uint32_t dim = 0;
  std::uint8_t strategy = 0;  // partition_strategy
  float init_scale = 0.05f;
  std::uint64_t seed = 1, max_rows = 0, evict_after = 0;
  std::uint64_t num_shards = 1, num_ps = 1, ps_index = 0;
  rule_msg rule;
  template <class A>
  void serialize(A& ar) {
    ar(table, name, rows, dim, strategy, init_scale, seed, max_rows, evict_after, num_shards, num_ps, ps_index, rule);
  }
};
/// Worker -> ps: the rows of `count` distinct ids (payload: count uint64 ids; reply payload:
/// count * dim floats).
struct ps_gather_msg {
  std::uint32_t table = 0;
  std::uint64_t count = 0;
  template <class A>
  void serialize(A& ar) {
    ar(table, count);
  }
};
/// Worker -> ps: one update per row (payload: count uint64 ids, then count * dim floats).
struct ps_sparse_push_msg {
  std::uint32_t table = 0;
  std::uint64_t count = 0;
  bool delta = false;                  // add the rows; otherwise the table's rule applies them
  std::optional<float> learning_rate;  // gradient: none = the rule's own rate
  template <class A>
  void serialize(A& ar) {
    ar(table, count, delta, learning_rate);
  }
};
/// Chief -> ps: restore rows of embedding table `table` from checkpoint `checkpoint`. With begin
/// (no payload): the shards of the table this ps holds (all of them) start at these push counts,
/// a hashed shard emptied. Otherwise: `count` rows (payload: count uint64 ids, the rows' values,
/// then each of the num_slots slots (count * dim floats each), then for a hashed table count
/// uint64 ages: pushes of its shard since the row was last touched) replace the rows of those ids.
struct ps_sparse_restore_msg {
  std::uint32_t table = 0;
  bool begin = false;
  std::vector<std::uint32_t> shards;
  std::vector<std::int64_t> iterations;  // begin: per shard
  std::uint64_t count = 0, num_slots = 0;
  std::string checkpoint;
  template <class A>
  void serialize(A& ar) {
    ar(table, begin, shards, iterations, count, num_slots, checkpoint);
  }
};
/// ps -> worker: rows held and evicted per table held here.
struct ps_sparse_stats_msg {
  std::vector<std::uint32_t> tables;
  std::vector<std::uint64_t> rows, evicted;
  template <class A>
  void serialize(A& ar) {
    ar(tables, rows, evicted);
  }
};

struct empty_msg {
  template <class A>
  void serialize(A&) {}
};

}  // namespace dtf::detail
