// dtf/strategies/embedding_gradient.hpp — a worker's gradient computation for an
// embedding_model (dtf/embedding_model.hpp): the dense part as any model's, the tables' rows
// gathered from the parameter servers for each batch and their gradients pushed back.
//
// Per call (one gradient of the current batch): every table's distinct ids of the batch are
// gathered (one request per ps holding some), the model computes the loss, the dense gradient
// and the rows' gradients, and the rows' gradients are pushed at once (one request per ps), which
// each ps applies with the table's rule, lazily (dtf/ps/sparse_store.hpp). So whatever a
// strategy does with its dense parameters (a push every step for Hogwild, every n_push steps
// for DOWNPOUR, an elastic difference for AEASGD), the tables are trained like TensorFlow's
// asynchronous ps training trains embeddings: fresh rows read, sparse updates sent, every step.
// Synchronous training (keep_rows) sends the rows' gradients with the step's dense contribution
// instead, and each ps averages them over the step's N contributions (dtf/ps/sync_aggregator.hpp).
//
// Tables are laid out from the model's specs over the client's ps: a fixed table cut into one
// shard per ps (partitioners::fixed_size, like tf.fixed_size_partitioner(num_ps)) and ids routed
// by its spec's partition strategy; a hashed table with one shard per ps.
#pragma once

#include <dtf/embedding_model.hpp>
#include <dtf/ps/sparse_client.hpp>
#include <dtf/strategies/dense_staging.hpp>

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

namespace dtf::strategies::detail {

/// Registers m's tables, in order, with `tables` (every task does the same).
template <embedding_model M>
void add_tables(const M& m, embedding_tables& tables, std::size_t num_ps) {
  for (const auto& spec : m.embeddings()) {
    if (spec.hashed())
      tables.add_hashed(spec);
    else
      tables.add_fixed(spec, partitioners::fixed_size{num_ps});
  }
}

/// A batch's rows, per table of an embedding model (a worker's and a hybrid rank's scratch,
/// kept across batches): each table's ids of the batch, their lookup (distinct ids by ps), the
/// rows gathered, the rows' gradients, and the model's view of them.
class batch_rows {
 public:
  /// Plans batch `b`'s lookups in every table of `tables` (m's, in order); gathers nothing yet.
  template <embedding_model M>
  void plan(M& m, embedding_tables& tables, const data::host_batch& b) {
    const std::size_t n = tables.size();
    ids_.resize(n);
    lookups_.resize(n);
    values_.resize(n);
    grads_.resize(n);
    rows_.resize(n);
    for (std::size_t t = 0; t < n; ++t) {
      m.embedding_ids(b, t, ids_[t]);
      tables.plan(std::uint32_t(t), ids_[t], lookups_[t]);
      const std::size_t floats = lookups_[t].rows() * lookups_[t].dim;
      values_[t].resize(floats);
      grads_[t].resize(floats);
    }
  }
  /// Gathers the planned rows; returns the model's view of them, their gradients to fill
  /// (valid until the next plan).
  std::span<const embedding_rows> gather(embedding_tables& tables) {
    for (std::size_t t = 0; t < lookups_.size(); ++t) {
      tables.gather(lookups_[t], values_[t]);
      rows_[t] = {lookups_[t].dim, lookups_[t].index, values_[t], grads_[t]};
    }
    return rows_;
  }
  /// The planned rows as zeros, their gradients to fill (a step whose gather failed still runs
  /// its collectives: its result is discarded). Valid until the next plan.
  std::span<const embedding_rows> zero_rows() {
    for (std::size_t t = 0; t < lookups_.size(); ++t) {
      std::fill(values_[t].begin(), values_[t].end(), 0.0f);
      rows_[t] = {lookups_[t].dim, lookups_[t].index, values_[t], grads_[t]};
    }
    return rows_;
  }
  /// Pushes the rows' gradients, each ps applying them on arrival (asynchronous).
  void push(embedding_tables& tables) {
    for (std::size_t t = 0; t < lookups_.size(); ++t) tables.push(lookups_[t], grads_[t]);
  }
  /// Keeps the rows' gradients as a synchronous contribution (contribution()) instead.
  void keep() {
    contribution_.clear();
    for (std::size_t t = 0; t < lookups_.size(); ++t)
      contribution_.push_back({lookups_[t].table, lookups_[t].dim, lookups_[t].unique, lookups_[t].ps_begin, grads_[t]});
  }
  /// The rows' gradients kept, one entry per table (valid until the next plan).
  std::span<const sync_rows> contribution() const noexcept { return contribution_; }

 private:
  std::vector<std::vector<std::uint64_t>> ids_;
  std::vector<lookup> lookups_;
  std::vector<std::vector<float>> values_, grads_;
  std::vector<embedding_rows> rows_;
  std::vector<sync_rows> contribution_;
};

template <embedding_model M>
class embedding_gradient {
 public:
  embedding_gradient(M& m, std::size_t n, ps_client& ps) : model_(m), tables_(ps), staging_(n) {
    add_tables(m, tables_, ps.layout().num_ps);
  }

  /// Plans the current batch's lookups (distinct ids by ps); gathers nothing yet.
  void set_batch(const data::host_batch& b) {
    staging_.set_batch(x_, b.features, y_, b.labels, model_stream(model_));
    batch_.plan(model_, tables_, b);
  }

  float operator()(std::span<const float> at, std::span<float> g) {
    const std::span<const embedding_rows> rows = batch_.gather(tables_);
    const float loss = staging_(at, g, [&](std::span<const float> p, std::span<float> dg) {
      return model_.loss_and_gradients(p, rows, x_, y_, dg);
    }, model_stream(model_));
    if (keep_rows_)
      batch_.keep();
    else
      batch_.push(tables_);
    return loss;
  }

  /// Synchronous training: each call keeps the rows' gradients for the step's contribution
  /// (contribution(), sent with the dense gradient by ps_client::push_sync) instead of pushing.
  void keep_rows() noexcept { keep_rows_ = true; }
  /// The last call's rows' gradients, one entry per table (valid until the next set_batch).
  std::span<const sync_rows> contribution() const noexcept { return batch_.contribution(); }

  /// The rule the ps apply to the rows (set_rule; create_tables' fallback otherwise).
  void set_rule(optim::rule r) { rule_ = std::move(r); }
  /// The chief: creates every table on every ps with the rule set, else `fallback` (the
  /// strategy's ps rule); a ps that holds one keeps its rows.
  void create_tables(const optim::rule& fallback) {
    for (std::uint32_t t = 0; t < tables_.size(); ++t) tables_.create(t, rule_ ? *rule_ : fallback);
  }
  embedding_tables& tables() noexcept { return tables_; }

 private:
  M& model_;
  embedding_tables tables_;
  batch_rows batch_;
  bool keep_rows_ = false;
  std::optional<optim::rule> rule_;
  dense_staging staging_;
  tensor x_, y_;
};

/// A row_reader over `tables` (the chief's evaluation of the tables it trains).
inline row_reader read_rows(embedding_tables& tables) {
  return [&tables](std::size_t table, std::span<const std::uint64_t> ids, std::span<float> rows) {
    const auto l = tables.plan(std::uint32_t(table), ids);
    std::vector<float> gathered(l.rows() * l.dim);
    tables.gather(l, gathered);
    if (rows.size() != ids.size() * l.dim)
      throw error(errc::shape_mismatch, "row_reader: " + std::to_string(rows.size()) + " floats for " +
                                            std::to_string(ids.size()) + " rows of dim " + std::to_string(l.dim));
    for (std::size_t i = 0; i < ids.size(); ++i)
      std::copy_n(gathered.begin() + std::ptrdiff_t(std::size_t(l.index[i]) * l.dim), l.dim,
                  rows.begin() + std::ptrdiff_t(i * l.dim));
  };
}

}  // namespace dtf::strategies::detail
