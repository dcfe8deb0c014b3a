// examples/recommender/torch_model.hpp — model.hpp's DLRM-style click model with its dense tower
// written in LibTorch (dtf::libtorch::embedding_tower, dtf/torch/embedding_tower.hpp): the same
// hashed table on the ps, the same ids (dlrm's embedding_ids reads them), the same z and top MLP,
// as a torch::nn module. The program recommender_torch (main.cpp built with RECOMMENDER_TORCH,
// only where LibTorch is found) trains it with any of the example's strategies.
#pragma once

#include <dtf/torch/embedding_tower.hpp>

#include "model.hpp"

#include <cstdint>
#include <memory>
#include <utility>

namespace examples::recommender {

/// The top of dlrm in LibTorch: numeric x [batch, 13] and the rows e [batch, 26, D] to
/// z = [x | e_1..e_26 | <e_i, e_j> for i < j], then the ReLU layers and 2 outputs.
struct torch_topImpl : torch::nn::Cloneable<torch_topImpl> {
  explicit torch_topImpl(dlrm_config c) : c_(std::move(c)) { reset(); }
  void reset() override {
    mlp_ = register_module("mlp", torch::nn::Sequential());
    std::int64_t in = std::int64_t(criteo_dense_columns + criteo_categorical_columns * c_.dim + num_pairs);
    for (std::size_t h : c_.hidden) {
      mlp_->push_back(torch::nn::Linear(in, std::int64_t(h)));
      mlp_->push_back(torch::nn::ReLU());
      in = std::int64_t(h);
    }
    mlp_->push_back(torch::nn::Linear(in, 2));
    // The upper triangle row by row: dlrm's order of the pairs.
    const auto pairs = torch::triu_indices(criteo_categorical_columns, criteo_categorical_columns, 1);
    first_ = pairs[0];
    second_ = pairs[1];
  }
  torch::Tensor forward(const torch::Tensor& numeric, const torch::Tensor& rows) {
    const auto dots = torch::bmm(rows, rows.transpose(1, 2));  // [batch, 26, 26]
    const auto pairs = dots.index({torch::indexing::Slice(), first_, second_});
    return mlp_->forward(torch::cat({numeric, rows.flatten(1), pairs}, 1));
  }

  dlrm_config c_;
  torch::nn::Sequential mlp_{nullptr};
  torch::Tensor first_, second_;  // the pairs (i, j), i < j
};
TORCH_MODULE(torch_top);

using torch_dlrm = dtf::libtorch::embedding_tower<torch_top>;

/// dlrm's table and ids for the tower: the 13 numeric columns first, the ids read by dlrm (four
/// 16-bit pieces each). Errors: dlrm's for a bad config.
inline dtf::libtorch::tower_input torch_dlrm_input(const dlrm_config& c) {
  auto ids = std::make_shared<const dlrm>(c);  // shared by the tower's copies: read only
  return {.numeric = criteo_dense_columns,
          .tables = {{.table = ids->embeddings().front(), .lookups = criteo_categorical_columns}},
          .read_ids = [ids](const dtf::data::host_batch& b, std::size_t t, std::vector<std::uint64_t>& out) {
            ids->embedding_ids(b, t, out);
          }};
}

}  // namespace examples::recommender
