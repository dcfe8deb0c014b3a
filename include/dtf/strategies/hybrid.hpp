// dtf/strategies/hybrid.hpp — an embedding model (dtf/embedding_model.hpp) trained with its
// tables on the parameter servers and its dense variables synchronised by ring-allreduce among
// the workers (docs/design/hybrid.md): the recommendation models' split, tables too big for a
// worker and touched a few rows a step, a dense tower small and touched whole every step.
//
//   dtf::train(cluster, net, data,
//              dtf::strategies::hybrid({.dense = {.rule = dtf::optim::adam{1e-3f}},
//                                       .tables = dtf::strategies::table_updates::asynchronous}),
//              options);            // options.embedding_rule: the rows' rule on the ps
//
// Every training task (the chief is rank 0) is a ring rank and a ps client; the ps hold the
// tables and nothing else (no dense shard, no dense traffic to them). Step t on rank k:
//   1. rows: each table's distinct ids of the batch, gathered (one request per ps holding some);
//   2. forward/backward of the dense part on the rank's replica: the dense gradient goes to the
//      ring in ring_allreduce's buckets (its engine, unchanged: same buckets, overlap on or off
//      bitwise equal, the loss averaged with it);
//   3. the rows' gradients pushed at once, as soon as backprop has produced them (the lookup is
//      the model's bottom), while the ring reduces the last buckets:
//      asynchronous tables: each ps applies a push on arrival with the table's rule (as
//        Hogwild's rows: a rank may read a row before another rank's push of the step lands);
//      synchronous tables: the rows go through the sync protocol (dtf/ps/sync_protocol.hpp) as
//        a contribution to step t with an empty dense part; the ps (initialised by rank 0 with
//        no dense shard, N = the ranks) apply step t once, the rows averaged over the N
//        contributions (a row a rank did not touch counts as zero), and the push returns once
//        every ps has applied it, so no rank gathers step t + 1's rows before. With equal
//        batches per rank and plain SGD the job equals one process at the summed batch;
//   4. every rank applies the same averaged dense gradient with the same rule, so the dense
//      replicas stay bitwise identical (as ring_allreduce).
// The rows' rule is options.embedding_rule (dtf::train), else the dense rule.
// Errors: those of the communicator (a dead rank fails every rank) and of the ps client;
// synchronous tables: a ps whose step is not the ring's is errc::invalid_argument naming both.
// A lost ps, when the ranks agree on it (agree_on_lost_ps; dtf::train always): a rank whose ps
// request fails with errc::peer_failure or errc::timeout finishes the step's ring collectives
// anyway (zero rows, no push), then every rank learns of it through one allreduce after the
// step (agree) and every rank throws lost_ps at the same step (the step's result is void: the
// caller ends the job or rewinds every rank to a checkpoint, docs/design/hybrid.md section 4).
// Thread safety: one thread per engine.
#pragma once

#include <dtf/collectives.hpp>
#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/error.hpp>
#include <dtf/ps/sparse_client.hpp>
#include <dtf/strategies/embedding_gradient.hpp>
#include <dtf/strategies/ring_allreduce.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::strategies {

/// How a hybrid job applies the rows' gradients on the ps.
enum class table_updates {
  asynchronous,  ///< each rank's push applied on arrival (TensorFlow's asynchronous embeddings)
  synchronous,   ///< a step's pushes of every rank applied once, averaged over the ranks
};

/// The name of a table_updates value, as logs and the RESULT line say it.
inline const char* to_string(table_updates t) noexcept {
  return t == table_updates::synchronous ? "synchronous" : "asynchronous";
}

/// hybrid's knobs: the dense part's, with ring_allreduce's meaning, and the tables' mode.
struct hybrid_config {
  ring_allreduce_config dense{};  ///< the dense variables' rule, overlap and buckets (ring_allreduce_config)
  table_updates tables = table_updates::asynchronous;  ///< how the ps apply the rows' gradients
};

namespace detail {

/// The dense part of an embedding model as a dtf::model over the rows of the current batch, so
/// that ring_allreduce's engine trains it unchanged: its loss_and_gradients hands the model the
/// rows set for the step, and once the model has produced the rows' gradients calls rows_done
/// (the push), before the engine waits for the ring's last buckets.
template <embedding_model M>
class dense_tower {
 public:
  explicit dense_tower(M& m) : m_(m) {}
  std::vector<variable_spec> variables() const { return m_.variables(); }
  void initialize(std::span<float> p, std::uint64_t seed) { m_.initialize(p, seed); }
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g) {
    const float loss = m_.loss_and_gradients(p, rows_, x, y, g);
    if (rows_done_) rows_done_();
    return loss;
  }
  /// dtf::streams_gradients, when the model streams its dense gradients (streams_row_gradients).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
                           const gradient_ready_fn& ready)
    requires streams_row_gradients<M>
  {
    const float loss = m_.loss_and_gradients(p, rows_, x, y, g, ready);
    if (rows_done_) rows_done_();
    return loss;
  }
  /// The step's rows (valid until its loss_and_gradients returns) and what follows backprop.
  void set_rows(std::span<const embedding_rows> rows, std::function<void()> rows_done) {
    rows_ = rows;
    rows_done_ = std::move(rows_done);
  }

 private:
  M& m_;
  std::span<const embedding_rows> rows_;
  std::function<void()> rows_done_;
};

}  // namespace detail

template <embedding_model M>
class hybrid_engine;

/// Thrown on every rank of a hybrid job, at the same step, when a rank lost a ps (see the file
/// comment); its code is the ps request's (errc::peer_failure or errc::timeout), its message
/// names the ps when this rank saw the failure.
class lost_ps : public error {
 public:
  using error::error;
};

/// The strategy value dtf::train takes (dtf::strategy, kind hybrid): a cluster with ps tasks
/// (they hold the tables) and an embedding model; train builds hybrid_engine<M> on every rank.
class hybrid {
 public:
  /// dtf::strategy: the strategy's knobs.
  using config_type = hybrid_config;
  /// dtf::strategy: the shape of the job (see dtf::strategy_kind).
  static constexpr strategy_kind kind = strategy_kind::hybrid;
  /// The per-task engine for an embedding model M.
  template <embedding_model M>
  using engine = hybrid_engine<M>;

  hybrid() = default;
  /// A strategy with the given knobs.
  explicit hybrid(config_type c) : config(c) {}
  /// One batch per process and step.
  std::size_t replicas_per_process() const noexcept { return 1; }
  /// Builds this task's engine: the ring `comm` among the training tasks, the ps client `ps`
  /// (connected; its placement holds no dense shard), the model `net`.
  template <embedding_model M>
  engine<M> make(communicator& comm, ps_client& ps, M& net) const {
    return engine<M>(comm, ps, net, config);
  }

  /// The knobs every engine gets.
  config_type config;
};
static_assert(check_strategy<hybrid>(), "hybrid must model dtf::strategy: config_type, kind, replicas_per_process()");

/// One rank's engine: its replica of the dense variables (ring_allreduce's engine over the
/// model's dense part) and its view of the tables on the ps.
template <embedding_model M>
class hybrid_engine {
 public:
  /// This rank's engine over the ring `comm` and the ps client `ps` (see hybrid::make).
  hybrid_engine(communicator& comm, ps_client& ps, M& net, hybrid_config config)
      : config_(config), net_(net), ps_(ps), tables_(ps), tower_(net), ring_(comm, tower_, config.dense) {
    detail::add_tables(net, tables_, ps.layout().num_ps);
  }
  hybrid_engine(const hybrid_engine&) = delete;  // the ring engine refers to tower_
  hybrid_engine& operator=(const hybrid_engine&) = delete;

  /// The rule the ps apply to the rows (dtf::train: options.embedding_rule); the dense rule
  /// otherwise. Before initialize().
  void set_embedding_rule(optim::rule r) { rule_ = std::move(r); }

  /// Rank 0 creates the tables on every ps (a ps that holds one keeps its rows), with
  /// synchronous tables initialises the ps for the sync protocol (no dense shard, N = the
  /// ranks), and initialises the dense variables from `seed`; every rank receives them. The
  /// broadcast comes after the ps are ready, so no rank gathers from a table not created yet.
  void initialize(std::uint64_t seed) {
    if (ring_.comm().rank() == 0) {
      for (std::uint32_t t = 0; t < tables_.size(); ++t) tables_.create(t, ps_settings().rule);
      if (config_.tables == table_updates::synchronous) ps_.initialize({}, ps_settings());
    }
    ring_.initialize(seed);
  }
  /// The ps's configuration: the rows' rule; synchronous tables: the protocol's N = the ranks
  /// (what initialize and a restore of the ps give them).
  ps_config ps_settings() {
    const std::size_t n = config_.tables == table_updates::synchronous ? ring_.comm().size() : 0;
    return {.rule = rule_ ? *rule_ : config_.dense.rule, .replicas_to_aggregate = n, .num_workers = n};
  }

  /// One step on this rank's batch (see the file comment); returns the loss averaged over the
  /// ranks' batches.
  float step(const data::host_batch& b) {
    batch_.plan(net_, tables_, b);
    if (!agree_) {
      tower_.set_rows(batch_.gather(tables_), [this] { push_rows(); });
      return ring_.step(b);
    }
    std::span<const embedding_rows> rows;
    guard([&] { rows = batch_.gather(tables_); });
    if (lost_) rows = batch_.zero_rows();  // the ring's step still runs: the others are in it
    tower_.set_rows(rows, [this] {
      if (!lost_) guard([this] { push_rows(); });
    });
    const float loss = ring_.step(b);
    agree("step " + std::to_string(ring_.global_step() - 1));
    return loss;
  }
  /// The agreement on a lost ps (see the file comment), on every rank at the same point: throws
  /// lost_ps on every rank when any rank lost a ps since the last agreement. `where` names the
  /// point in the message.
  void agree(const std::string& where) {
    float lost[1] = {lost_ ? 1.0f : 0.0f};
    if (ring_.comm().size() > 1) ring_.comm().allreduce("hybrid/lost_ps", std::span<float>(lost), reduce_op::max);
    const std::optional<error> mine = std::exchange(lost_, std::nullopt);
    if (lost[0] == 0.0f) return;
    const std::string at = "hybrid: " + where + ": ";
    if (mine) throw lost_ps(mine->code(), at + "rank " + std::to_string(ring_.comm().rank()) +
                                              " lost a parameter server: " + mine->message());
    throw lost_ps(errc::peer_failure, at + "another rank lost a parameter server");
  }
  /// f(); a lost or restarted ps (errc::peer_failure, errc::timeout) is kept for the next
  /// agreement instead of thrown (other errors are thrown).
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const error& e) {
      if (e.code() != make_error_code(errc::peer_failure) && e.code() != make_error_code(errc::timeout)) throw;
      if (!lost_) lost_.emplace(e.code(), e.message());
    }
  }
  /// Forgets a lost ps kept for the next agreement (a recovery made after the ranks learnt of it
  /// another way, e.g. rank 0's failed save).
  void forget_lost() noexcept { lost_.reset(); }
  /// Whether a lost ps is agreed on by every rank (lost_ps at the same step) rather than thrown
  /// where it happens (see the file comment). Costs one 4-byte allreduce a step.
  void agree_on_lost_ps(bool on) noexcept { agree_ = on; }
  /// dtf::train's form: this rank's one batch (errc::invalid_argument for any other count).
  float step(std::span<const data::host_batch> batches) {
    if (batches.size() != 1)
      throw error(errc::invalid_argument, "hybrid: one batch per step, got " + std::to_string(batches.size()));
    return step(batches.front());
  }

  /// The rate of the dense rule's next step.
  float learning_rate() const { return ring_.learning_rate(); }
  /// This rank's dense parameters (every rank holds the same values).
  ///@{
  std::span<const float> parameters() const { return ring_.parameters(); }
  std::span<float> parameters() { return ring_.parameters(); }
  ///@}
  /// The global step: steps taken so far (or restored).
  std::int64_t global_step() const noexcept { return ring_.global_step(); }
  /// The ring the dense gradients are reduced over.
  communicator& comm() noexcept { return ring_.comm(); }
  /// Whether the dense buckets are reduced while backprop runs (ring_allreduce::overlaps).
  bool overlaps() const noexcept { return ring_.overlaps(); }
  /// The dense rule's state, for checkpoints (every rank holds the same).
  const optim::optimizer<>& optimizer() const noexcept { return ring_.optimizer(); }
  /// Restores the dense part's saved state on this rank (ring_allreduce::restore).
  void restore(std::span<const float> values, std::span<const std::vector<float>> slots, std::int64_t iterations,
               std::int64_t global_step) {
    ring_.restore(values, slots, iterations, global_step);
  }
  /// This rank's view of the tables on the ps.
  embedding_tables& tables() noexcept { return tables_; }
  /// The tables' mode.
  table_updates table_mode() const noexcept { return config_.tables; }

 private:
  // Step 3 of the file comment: the rows' gradients to the ps (global_step(): the step running).
  void push_rows() {
    if (config_.tables == table_updates::asynchronous) return batch_.push(tables_);
    batch_.keep();
    const std::int64_t step = ring_.global_step();
    const auto r = ps_.push_sync({}, step, std::nullopt, false, batch_.contribution());
    if (r.dropped || r.global_step != step + 1)
      throw error(errc::invalid_argument, "hybrid: the ring is at step " + std::to_string(step) +
                                              ", the parameter servers " + (r.dropped ? "had finished it (at step " : "at step ") +
                                              std::to_string(r.global_step) + (r.dropped ? ")" : " after it"));
  }

  hybrid_config config_;
  M& net_;
  ps_client& ps_;
  embedding_tables tables_;
  std::optional<optim::rule> rule_;
  bool agree_ = false;
  std::optional<error> lost_;  // this step's lost ps, when agree_
  detail::batch_rows batch_;  // the step's rows, per table
  detail::dense_tower<M> tower_;
  ring_allreduce<detail::dense_tower<M>> ring_;  // last: its communication thread stops first
};

}  // namespace dtf::strategies
