// examples/recommender/torch_model.hpp — model.hpp's DLRM-style click model with its dense tower
// written in LibTorch (dtf::libtorch::embedding_tower, dtf/torch/embedding_tower.hpp): the same
// hashed table on the ps, the same ids (dlrm's embedding_ids reads them), the same z, top MLP and
// wide part, as a torch::nn module with dlrm's loss (binary cross-entropy of one logit). The program recommender_torch (main.cpp built with RECOMMENDER_TORCH,
// only where LibTorch is found) trains it with any of the example's strategies.
#pragma once

#include <dtf/torch/embedding_tower.hpp>

#include "model.hpp"

#include <cstdint>
#include <memory>
#include <utility>

namespace examples::recommender {

/// The top of dlrm in LibTorch: numeric x [batch, 13] and the rows [batch, 26, D + 1] (e_i, b_i)
/// to z = [x | e_1..e_26 | <e_i, e_j> for i < j], then the ReLU layers and 1 output, plus the
/// wide part Σ_i b_i + <w, x> + Σ_{i<j} <e_i, e_j>: the logit [batch, 1].
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
    mlp_->push_back(torch::nn::Linear(in, 1));
    wide_ = register_module("wide", torch::nn::Linear(torch::nn::LinearOptions(criteo_dense_columns, 1).bias(false)));
    torch::NoGradGuard no_grad;
    wide_->weight.zero_();  // as dlrm's w
    // The upper triangle row by row: dlrm's order of the pairs.
    const auto pairs = torch::triu_indices(criteo_categorical_columns, criteo_categorical_columns, 1);
    first_ = pairs[0];
    second_ = pairs[1];
  }
  torch::Tensor forward(const torch::Tensor& numeric, const torch::Tensor& rows) {
    const auto e = rows.narrow(2, 0, std::int64_t(c_.dim));
    const auto dots = torch::bmm(e, e.transpose(1, 2));  // [batch, 26, 26]
    const auto pairs = dots.index({torch::indexing::Slice(), first_, second_});
    const auto deep = mlp_->forward(torch::cat({numeric, e.flatten(1), pairs}, 1));
    return deep + rows.select(2, std::int64_t(c_.dim)).sum(1, true) + wide_->forward(numeric) + pairs.sum(1, true);
  }

  dlrm_config c_;
  torch::nn::Sequential mlp_{nullptr};
  torch::nn::Linear wide_{nullptr};  // w (no bias: the last layer's is the logit's)
  torch::Tensor first_, second_;  // the pairs (i, j), i < j
};
TORCH_MODULE(torch_top);

/// dlrm's loss: the mean binary cross-entropy of sigmoid(logit) against labels 0 or 1.
struct binary_cross_entropy {
  torch::Tensor operator()(const torch::Tensor& logits, const torch::Tensor& labels) const {
    return torch::binary_cross_entropy_with_logits(logits.squeeze(1), labels.to(logits.scalar_type()));
  }
};

using torch_dlrm = dtf::libtorch::embedding_tower<torch_top, binary_cross_entropy>;

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
