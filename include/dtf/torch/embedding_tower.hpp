// dtf/torch/embedding_tower.hpp — a LibTorch torch::nn::Module as the dense part ("tower") of
// a dtf::embedding_model (dtf/embedding_model.hpp): the tables live on the parameter servers,
// the module computes on the rows looked up for the batch and the numeric features, and the
// gradient w.r.t. those rows goes back to the tables. A TorchRec-style model written in LibTorch
// (its "dense arch", interaction and "over arch") trains with dtf's tables and strategies
// (hybrid, SyncSGD, the asynchronous ps strategies).
//
//   struct TopImpl : torch::nn::Cloneable<TopImpl> {
//     torch::Tensor forward(const torch::Tensor& numeric, const torch::Tensor& rows);  // logits
//     ...
//   };
//   TORCH_MODULE(Top);
//   dtf::libtorch::embedding_tower<Top> net(Top(), {.numeric = 13, .tables = {{.table = {.name = "categorical",
//                                                                                     .rows = 0, .dim = 16},
//                                                                           .lookups = 26}}});
//   dtf::train(cluster, net, data, dtf::strategies::hybrid({}), options);
//
// What the module receives, as TorchRec's DLRM hands its interaction (dense features, then the
// pooled embeddings of every feature, one dim for all):
//   numeric  float32 [batch, numeric]: the first `numeric` feature columns, as the data has them
//            (a view of the batch, no gradient);
//   rows     float32 [batch, F, D], contiguous: for each example the rows its F ids look up
//            (tables in order, each table's lookups in its order), F = the lookups of every
//            table, D the tables' one dim. rows.flatten(1) is the plain concatenation.
// and it returns logits [batch, classes] for the loss (cross-entropy by default, as
// module_model). Ids: by default the feature columns after the numeric ones, `lookups` per table
// in table order, each an id stored as a float (an integer in [0, 2^24)); tower_input::read_ids
// replaces this for any other layout (ids hashed into several columns, say).
// Gradients: the module's parameters are the embedding model's dense variables, handled by
// dtf::libtorch::module_model (the names the module gives them, ties, frozen parameters, seeding,
// copies, modes, dropout masks and streaming as there: dtf/torch/module_model.hpp), and rows is
// an autograd leaf: after backward its gradient is summed over each row's uses into
// embedding_rows::grads, which the strategy pushes to the ps. Streaming (streams_row_gradients):
// each dense variable is reported as autograd finalises it, so a hybrid job reduces it on the
// ring during backprop; the rows' gradient is final when loss_and_gradients returns.
// Not carried: the module's registered buffers (BatchNorm statistics) stay each task's own
// (module_model's dtf::has_buffers is not forwarded for embedding models yet).
// CPU builds only (module_model.hpp has a GPU path, the tower not yet); include only in
// translation units that need LibTorch (dtf/dtf.hpp does not).
// Thread safety: one thread per instance (a copy is a deep copy, as module_model's).
#pragma once

#if DTF_CUDA
#error "dtf/torch/embedding_tower.hpp: CPU builds only (its rows come from the ps in host memory); module_model.hpp builds on CUDA"
#endif

#include <dtf/embedding_model.hpp>
#include <dtf/error.hpp>
#include <dtf/torch/module_model.hpp>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::libtorch {

/// One table of an embedding_tower and how many of its rows each example looks up.
struct tower_table {
  embedding_spec table;     ///< fixed or hashed; every table of a tower has one dim
  std::size_t lookups = 1;  ///< ids per example in this table
};

/// What an embedding_tower reads from a batch.
struct tower_input {
  /// Leading feature columns handed to the module as numeric features (0: none, [batch, 0]).
  std::size_t numeric = 0;
  /// The tables, in the order of the module's rows.
  std::vector<tower_table> tables;
  /// The ids batch b looks up in table t, row by row, `lookups` per example (the
  /// embedding_model's embedding_ids). Empty: the columns after the numeric ones (file comment).
  std::function<void(const data::host_batch& b, std::size_t t, std::vector<std::uint64_t>& ids)> read_ids;
};

namespace detail {

/// The root module_model holds: the user's module as its one child "tower", fed one step's
/// rows (set by embedding_tower before each forward) and the numeric columns of the input.
template <class Module>
class tower_root_impl : public ::torch::nn::Cloneable<tower_root_impl<Module>> {
 public:
  tower_root_impl(Module tower, std::size_t numeric) : tower(std::move(tower)), numeric(std::int64_t(numeric)) {
    reset();
  }
  /// Registers the tower. Cloneable::clone() runs it on a member-wise copy, whose tower is
  /// still the source's: the copy takes a clone of its own (Cloneable then copies the source's
  /// values into it), or the copy's training would write into the source's module.
  void reset() override {
    if (bound_) tower = Module(clone_module(tower));
    tower = this->register_module("tower", tower);
    bound_ = true;
  }
  /// The module's logits for the batch's features x [batch, columns] and the rows set.
  ::torch::Tensor forward(const ::torch::Tensor& x) { return tower->forward(x.narrow(1, 0, numeric), rows); }

  Module tower;
  std::int64_t numeric = 0;
  ::torch::Tensor rows;  // [batch, F, D] of the current step; a leaf requiring grad in training

 private:
  bool bound_ = false;
};

template <class Module>
class tower_root : public ::torch::nn::ModuleHolder<tower_root_impl<Module>> {
 public:
  using ::torch::nn::ModuleHolder<tower_root_impl<Module>>::ModuleHolder;
};

/// The prefix module_model gives the tower's names (stripped: the variables are the module's).
inline constexpr const char* tower_prefix = "tower.";

}  // namespace detail

/// A LibTorch module as the dense part of a dtf::embedding_model (models embedding_classifier
/// and streams_row_gradients). See the file comment for the contract.
template <class Module, class Loss = cross_entropy>
class embedding_tower {
 public:
  /// Wraps `module` (held; a copy of the holder shares it) over the tables and columns `in`;
  /// `options` as module_model's (input_shape must stay empty: the inputs are fixed here).
  /// Errors: errc::invalid_argument for no tables, a table with no lookups, tables of different
  /// dims or an input_shape, and module_model's (a parameter that is not float32, ...).
  embedding_tower(Module module, tower_input in, module_options options = {}, Loss loss = {})
      : in_(checked(std::move(in), options)),
        model_(detail::tower_root<Module>(std::make_shared<detail::tower_root_impl<Module>>(std::move(module),
                                                                                            in_.numeric)),
               std::move(options), std::move(loss)) {
    for (const auto& t : in_.tables) lookups_ += t.lookups;
  }
  /// A deep copy (module_model's): the module cloned with its ties, flags and modes.
  embedding_tower(const embedding_tower&) = default;
  embedding_tower& operator=(const embedding_tower&) = delete;

  /// dtf::embedding_model: the module's trainable parameters (module_model's variables).
  std::vector<variable_spec> variables() const {
    auto specs = model_.variables();
    for (auto& s : specs) s.name.erase(0, std::strlen(detail::tower_prefix));
    return specs;
  }
  /// dtf::embedding_model: the tables, in order.
  std::vector<embedding_spec> embeddings() const {
    std::vector<embedding_spec> out;
    for (const auto& t : in_.tables) out.push_back(t.table);
    return out;
  }
  /// Floats of the dense parameters.
  std::size_t num_parameters() const noexcept { return model_.num_parameters(); }
  /// The user's module (it holds the last dense parameters handed to the tower).
  Module& module() noexcept { return model_.module()->tower; }

  /// dtf::embedding_model: fills the dense parameters as options.init says (module_model's).
  void initialize(std::span<float> p, std::uint64_t seed) { model_.initialize(p, seed); }

  /// dtf::embedding_model: the ids batch b looks up in table t (tower_input::read_ids, or the
  /// id columns). Errors: errc::out_of_range for a table beyond the tower's; errc::shape_mismatch
  /// when the batch has too few columns or the reader returns another count; invalid_argument
  /// naming the example and column for a value that is not an id.
  void embedding_ids(const data::host_batch& b, std::size_t t, std::vector<std::uint64_t>& ids) const {
    if (t >= in_.tables.size())
      throw error(errc::out_of_range, "dtf::libtorch::embedding_tower: table " + std::to_string(t) + " of " +
                                          std::to_string(in_.tables.size()));
    const std::size_t n = b.features.shape(0), k = in_.tables[t].lookups;
    if (in_.read_ids) {
      in_.read_ids(b, t, ids);
      if (ids.size() != n * k)
        throw error(errc::shape_mismatch, "dtf::libtorch::embedding_tower: read_ids gave " + std::to_string(ids.size()) +
                                              " ids of table '" + in_.tables[t].table.name + "' for " +
                                              std::to_string(n) + " examples of " + std::to_string(k) + " lookups");
      return;
    }
    const std::size_t cols = b.features.dimension() == 2 ? b.features.shape(1) : 0;
    if (cols < in_.numeric + lookups_)
      throw error(errc::shape_mismatch, "dtf::libtorch::embedding_tower: a batch of " + std::to_string(cols) +
                                            " feature columns; the tower reads " + std::to_string(in_.numeric) +
                                            " numeric and " + std::to_string(lookups_) + " id columns");
    std::size_t first = in_.numeric;
    for (std::size_t u = 0; u < t; ++u) first += in_.tables[u].lookups;
    ids.resize(n * k);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = first; c < first + k; ++c) {
        const float v = b.features(r, c);
        if (!(v >= 0.0f) || v >= 16777216.0f || std::floor(v) != v)
          throw error(errc::invalid_argument, "dtf::libtorch::embedding_tower: feature (" + std::to_string(r) + ", " +
                                                  std::to_string(c) + ") = " + std::to_string(v) +
                                                  " is not an id (an integer in [0, 2^24))");
        ids[r * k + (c - first)] = std::uint64_t(v);
      }
  }

  /// dtf::embedding_model: the batch's mean loss; d loss / d p into g (as module_model) and
  /// d loss / d row into rows[t].grads, summed over the row's uses.
  float loss_and_gradients(std::span<const float> p, std::span<const embedding_rows> rows, const tensor& x,
                           const tensor& y, std::span<float> g) {
    return step(p, rows, x, y, g, nullptr);
  }

  /// dtf::streams_row_gradients: the same, reporting each dense variable as autograd
  /// finalises its gradient (module_model's streaming).
  float loss_and_gradients(std::span<const float> p, std::span<const embedding_rows> rows, const tensor& x,
                           const tensor& y, std::span<float> g, const gradient_ready_fn& ready) {
    return step(p, rows, x, y, g, ready ? &ready : nullptr);
  }

  /// dtf::embedding_classifier: logits [batch, classes] into out (the module in eval mode,
  /// without autograd, modes put back after: module_model's logits).
  void logits(std::span<const float> p, std::span<const embedding_rows> rows, const tensor& x, tensor& out) {
    struct clear {
      embedding_tower& t;
      ~clear() { t.model_.module()->rows = ::torch::Tensor(); }
    } done{*this};
    model_.module()->rows = gather(rows, x);
    model_.logits(p, x, out);
  }

  /// Takes p's values into the module (dtf::adopts_parameters: dtf::train's trained values).
  void set_parameters(std::span<const float> p) { model_.set_parameters(p); }

 private:
  static tower_input checked(tower_input in, const module_options& options) {
    const std::string me = "dtf::libtorch::embedding_tower: ";
    if (in.tables.empty()) throw error(errc::invalid_argument, me + "no tables (an embedding model has one at least)");
    if (!options.input_shape.empty())
      throw error(errc::invalid_argument, me + "module_options::input_shape must be empty: the module takes "
                                               "numeric [batch, numeric] and rows [batch, F, D]");
    for (const auto& t : in.tables) {
      if (t.lookups == 0) throw error(errc::invalid_argument, me + "table '" + t.table.name + "' has no lookups");
      if (t.table.dim != in.tables.front().table.dim)
        throw error(errc::invalid_argument, me + "table '" + t.table.name + "' has dim " +
                                                std::to_string(t.table.dim) + ", table '" +
                                                in.tables.front().table.name + "' " +
                                                std::to_string(in.tables.front().table.dim) +
                                                "; the rows [batch, F, D] need one dim for every table");
    }
    return in;
  }

  std::size_t dim() const noexcept { return in_.tables.front().table.dim; }

  // The rows of the batch x as [batch, F, D] (a new tensor: autograd may keep it). Errors:
  // errc::shape_mismatch for rows of another count, dim or batch, or x with too few columns.
  ::torch::Tensor gather(std::span<const embedding_rows> rows, const tensor& x) const {
    const std::string me = "dtf::libtorch::embedding_tower: ";
    if (x.rank() != 2 || x.dim(1) < in_.numeric)
      throw error(errc::shape_mismatch, me + "features must be [batch, columns] with " +
                                            std::to_string(in_.numeric) + " numeric columns at least");
    if (rows.size() != in_.tables.size())
      throw error(errc::shape_mismatch, me + std::to_string(rows.size()) + " tables of rows, the tower has " +
                                            std::to_string(in_.tables.size()));
    const std::size_t n = x.dim(0), D = dim();
    auto out = ::torch::empty({std::int64_t(n), std::int64_t(lookups_), std::int64_t(D)}, ::torch::kFloat);
    float* o = out.data_ptr<float>();
    std::size_t f0 = 0;
    for (std::size_t t = 0; t < rows.size(); ++t) {
      const auto& r = rows[t];
      const std::size_t k = in_.tables[t].lookups;
      if (r.dim != D || r.index.size() != n * k)
        throw error(errc::shape_mismatch, me + "table '" + in_.tables[t].table.name + "': " +
                                              std::to_string(r.index.size()) + " ids of dim " + std::to_string(r.dim) +
                                              ", the batch of " + std::to_string(n) + " takes " +
                                              std::to_string(n * k) + " of dim " + std::to_string(D));
      for (std::size_t e = 0; e < n; ++e)
        for (std::size_t j = 0; j < k; ++j) {
          const std::size_t u = r.index[e * k + j];
          if (u >= r.rows()) throw error(errc::out_of_range, me + "a row index beyond the rows given");
          std::memcpy(o + (e * lookups_ + f0 + j) * D, r.values.data() + u * D, D * sizeof(float));
        }
      f0 += k;
    }
    return out;
  }

  // d loss / d rows [batch, F, D] summed into each table's distinct rows (undefined: unused, zeros).
  void scatter(std::span<const embedding_rows> rows, const ::torch::Tensor& grad, std::size_t n) const {
    const std::size_t D = dim();
    const ::torch::Tensor g = grad.defined() ? grad.contiguous() : grad;
    std::size_t f0 = 0;
    for (std::size_t t = 0; t < rows.size(); ++t) {
      const auto& r = rows[t];
      const std::size_t k = in_.tables[t].lookups;
      std::fill(r.grads.begin(), r.grads.end(), 0.0f);
      if (g.defined() && !r.grads.empty()) {
        if (r.grads.size() != r.values.size())
          throw error(errc::shape_mismatch, "dtf::libtorch::embedding_tower: table '" + in_.tables[t].table.name +
                                                "': grads of " + std::to_string(r.grads.size()) + " floats for " +
                                                std::to_string(r.values.size()) + " of rows");
        const float* d = g.data_ptr<float>();
        for (std::size_t e = 0; e < n; ++e)
          for (std::size_t j = 0; j < k; ++j) {
            float* to = r.grads.data() + std::size_t(r.index[e * k + j]) * D;
            const float* from = d + (e * lookups_ + f0 + j) * D;
            for (std::size_t c = 0; c < D; ++c) to[c] += from[c];
          }
      }
      f0 += k;
    }
  }

  float step(std::span<const float> p, std::span<const embedding_rows> rows, const tensor& x, const tensor& y,
             std::span<float> g, const gradient_ready_fn* ready) {
    auto& root = *model_.module();
    struct clear {  // the step's rows (and autograd's hold on them) go with the call, thrown or not
      detail::tower_root_impl<Module>& r;
      ~clear() { r.rows = ::torch::Tensor(); }
    } done{root};
    root.rows = gather(rows, x).requires_grad_(true);
    const float loss = ready ? model_.loss_and_gradients(p, x, y, g, *ready) : model_.loss_and_gradients(p, x, y, g);
    scatter(rows, root.rows.grad(), x.dim(0));
    return loss;
  }

  tower_input in_;
  std::size_t lookups_ = 0;  // F: every table's lookups per example
  module_model<detail::tower_root<Module>, Loss> model_;
};

}  // namespace dtf::libtorch
