// The LibTorch twin of dtf::test::small_net() (Linear(8, 16), ReLU, Linear(16, 3)) and the map
// between the two parameter layouts, for tests that compare dtf::torch::module_model with
// dtf::nn::sequential.
#pragma once

#include <torch/torch.h>

#include "../train_helpers.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace dtf::test {

/// Linear(8, 16), ReLU, Linear(16, 3): small_net() in LibTorch.
inline ::torch::nn::Sequential torch_small_net() {
  namespace tnn = ::torch::nn;
  return tnn::Sequential(tnn::Linear(8, 16), tnn::ReLU(), tnn::Linear(16, 3));
}

/// small_net's layout [k0 (8x16), b0, k1 (16x3), b1] -> the twin's [w0 (16x8), b0, w1 (3x16), b1]
/// (to_torch) or back: Dense keeps [in, out] kernels, Linear [out, in] weights.
inline std::vector<float> relayout(const std::vector<float>& p, bool to_torch) {
  std::vector<float> out(p.size());
  std::size_t at = 0;
  for (auto [in, outs] : {std::pair<std::size_t, std::size_t>{8, 16}, {16, 3}}) {
    for (std::size_t i = 0; i < in; ++i)
      for (std::size_t o = 0; o < outs; ++o) {
        const std::size_t dense = at + i * outs + o, linear = at + o * in + i;
        out[to_torch ? linear : dense] = p[to_torch ? dense : linear];
      }
    at += in * outs;
    std::copy_n(p.begin() + std::ptrdiff_t(at), outs, out.begin() + std::ptrdiff_t(at));
    at += outs;
  }
  return out;
}

/// small_net()'s parameters initialised from `seed`.
inline std::vector<float> small_net_init(std::uint64_t seed) {
  auto net = small_net();
  std::vector<float> p(net.num_parameters());
  net.initialize(p, seed);
  return p;
}

}  // namespace dtf::test
