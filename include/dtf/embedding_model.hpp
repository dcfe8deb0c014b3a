// dtf/embedding_model.hpp — models whose embedding tables live sparsely on the parameter
// servers beside their dense variables (dtf/ps/sparse_client.hpp holds the tables' client).
//
// A dtf::model computes on one flat buffer of every parameter, which a worker pulls whole. An
// embedding_model also declares tables (embedding_spec: fixed or hashed) that no worker ever
// holds: for each batch the worker asks the model which ids it looks up, gathers those rows
// (deduplicated, one request per ps), hands them to the model, and pushes the rows' gradients
// back, which each ps applies with the tables' update rule, lazily, row by row.
//
// Required expressions, for `const M cm`, `M m`, a host batch `b`, a table index `t`, a vector
// `ids` of std::uint64_t, spans `p`/`cp` (dense parameters), `g` (dense gradients), `rows`
// (std::span<const embedding_rows>, one per table in embeddings()' order), device tensors `x`
// (the batch's features) and `y` (its labels) and a seed `s`:
//   cm.variables()                  -> std::vector<variable_spec>  the dense variables (as dtf::model)
//   cm.embeddings()                 -> std::vector<embedding_spec> the tables, in a fixed order
//   m.initialize(p, s)              fills the dense parameters (the tables initialise on the ps
//                                   from their specs' row_initializer)
//   m.embedding_ids(b, t, ids)      replaces ids with the ids batch b looks up in table t, in the
//                                   order the model will index them (repeats allowed)
//   m.loss_and_gradients(cp, rows, x, y, g) -> float: the batch's mean loss; writes d loss / d p
//                                   into g and d loss / d row into rows[t].grads (summed over a
//                                   row's uses; not accumulated)
// embedding_classifier also:
//   m.logits(cp, rows, x, out)      [batch, classes] logits into the device tensor out
// streams_row_gradients (optional) also, for a gradient_ready_fn `ready`:
//   m.loss_and_gradients(cp, rows, x, y, g, ready) -> float: as above, reporting each dense
//                                   variable's gradient as soon as it is final
//
// Rows are host memory (they come from the wire); dense parameters and x, y are device memory
// as for dtf::model. nn::embedding_sequential (dtf/nn/embedding_sequential.hpp) is a built-in.
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/host.hpp>
#include <dtf/nn/evaluate.hpp>
#include <dtf/ps/embedding_layout.hpp>

#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

namespace dtf {

/// The rows of one table that a batch uses, as the model sees them.
struct embedding_rows {
  /// Floats per row.
  std::uint32_t dim = 0;
  std::span<const std::uint32_t> index;  ///< per id embedding_ids listed, its row in values
  std::span<const float> values;         ///< the distinct rows, rows × dim
  std::span<float> grads;                ///< rows × dim: d loss / d row, written by the model (empty when evaluating)
  /// The number of distinct rows.
  std::size_t rows() const noexcept { return dim ? values.size() / dim : 0; }
};

template <class M>
concept embedding_model = requires(const M& cm, M& m, std::span<float> p, std::span<const float> cp,
                                   std::span<float> g, const tensor& x, const tensor& y, std::uint64_t s,
                                   const data::host_batch& b, std::size_t t, std::vector<std::uint64_t>& ids,
                                   std::span<const embedding_rows> rows) {
  { cm.variables() } -> std::convertible_to<std::vector<variable_spec>>;
  { cm.embeddings() } -> std::convertible_to<std::vector<embedding_spec>>;
  m.initialize(p, s);
  m.embedding_ids(b, t, ids);
  { m.loss_and_gradients(cp, rows, x, y, g) } -> std::convertible_to<float>;
};

/// streams_row_gradients (optional): an embedding model that hands each dense variable's
/// gradient to the strategy as soon as backprop has produced it (as dtf::streams_gradients),
/// so that a hybrid job's ring reduces it while backprop computes the layers below:
///   m.loss_and_gradients(cp, rows, x, y, g, ready) -> float  as above, and calls ready for
///                                   every float of g exactly once, in the order backprop
///                                   finishes them (the same order on every task)
template <class M>
concept streams_row_gradients =
    embedding_model<M> && requires(M& m, std::span<const float> cp, std::span<const embedding_rows> rows,
                                   const tensor& x, const tensor& y, std::span<float> g,
                                   const gradient_ready_fn& ready) {
      { m.loss_and_gradients(cp, rows, x, y, g, ready) } -> std::convertible_to<float>;
    };

template <class M>
concept embedding_classifier = embedding_model<M> && requires(M& m, std::span<const float> cp,
                                                              std::span<const embedding_rows> rows, const tensor& x,
                                                              tensor& out) { m.logits(cp, rows, x, out); };

/// Reads rows of a model's tables: rows (ids.size() × the table's dim floats) receives the rows
/// of `ids` (distinct) of table `table`. dtf::train hands one to train_options::evaluate_rows.
using row_reader = std::function<void(std::size_t table, std::span<const std::uint64_t> ids, std::span<float> rows)>;

namespace detail {
/// One table's distinct ids of a batch and the index of each use (embedding_rows::index).
struct batch_ids {
  std::vector<std::uint64_t> all, unique;
  std::vector<std::uint32_t> index;
  std::unordered_map<std::uint64_t, std::uint32_t> first;
  void deduplicate() {
    unique.clear();
    first.clear();
    index.resize(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      auto [it, fresh] = first.try_emplace(all[i], std::uint32_t(unique.size()));
      if (fresh) unique.push_back(all[i]);
      index[i] = it->second;
    }
  }
};

/// One ordered pass of `ds` through embedding classifier m: each batch's rows read through
/// `read`, its logits computed with dense parameters p and handed to use(batch, logits). The
/// loop of every evaluation of an embedding model (nn::evaluate, metrics::evaluate_binary).
template <embedding_classifier M, class Use>
void for_each_logits(M& m, std::span<const float> p, const row_reader& read, const data::dataset& ds, Use&& use) {
  tensor x, logits;
  const auto specs = m.embeddings();
  std::vector<batch_ids> ids(specs.size());
  std::vector<std::vector<float>> values(specs.size());
  std::vector<embedding_rows> rows(specs.size());
  auto stream = ds.repeat(1).prefetch(0).stream();
  while (auto b = stream.next()) {
    for (std::size_t t = 0; t < specs.size(); ++t) {
      m.embedding_ids(*b, t, ids[t].all);
      ids[t].deduplicate();
      values[t].resize(ids[t].unique.size() * specs[t].dim);
      read(t, ids[t].unique, values[t]);
      rows[t] = {specs[t].dim, ids[t].index, values[t], {}};
    }
    assign_from_host(x, b->features);
    m.logits(p, std::span<const embedding_rows>(rows), x, logits);
    use(*b, static_cast<const tensor&>(logits));
  }
}
}  // namespace detail

}  // namespace dtf

namespace dtf::nn {

/// Evaluates dense parameters p and the tables read through `read` of m over one ordered pass
/// of `ds` (as nn::evaluate for a classifier).
template <embedding_classifier M>
evaluation evaluate(M& m, std::span<const float> p, const row_reader& read, const data::dataset& ds) {
  nn::detail::evaluation_sum sum;
  tensor y;
  dtf::detail::for_each_logits(m, p, read, ds, [&](const data::host_batch& b, const tensor& logits) {
    assign_from_host(y, b.labels);
    sum.add(logits, y);
  });
  return sum.result();
}

}  // namespace dtf::nn
