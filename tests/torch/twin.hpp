// The LibTorch twin of dtf::test::small_net() (Linear(8, 16), ReLU, Linear(16, 3)) and the map
// between the two parameter layouts, for tests that compare dtf::libtorch::module_model with
// dtf::nn::sequential; a module's distinct trainable values as LibTorch alone reads them.
#pragma once

#include <torch/torch.h>

#include "../train_helpers.hpp"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace dtf::test {

/// make() after ::torch::manual_seed(seed), one build at a time in the process: ranks build their
/// modules on threads of one process, and the seed and the draws from LibTorch's one global
/// generator must not interleave with another build's, or each build holds other values.
inline std::mutex& seeded_builds() {
  static std::mutex building;  // one for every build (not one per Make): they share the generator
  return building;
}
template <class Make>
auto seeded(std::uint64_t seed, Make&& make) {
  std::lock_guard held(seeded_builds());
  ::torch::manual_seed(seed);
  return make();
}

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

/// The distinct trainable tensors of `m`, in named_parameters() order (LibTorch alone: its C++
/// named_parameters() lists a tied tensor once per name).
inline std::vector<::torch::Tensor> distinct_trainable(const ::torch::nn::Module& m) {
  std::vector<::torch::Tensor> out;
  for (const auto& t : m.parameters())
    if (t.requires_grad() && std::none_of(out.begin(), out.end(), [&](const ::torch::Tensor& o) { return o.is_same(t); }))
      out.push_back(t);
  return out;
}

/// The tensors (or their gradients), flattened one after another.
inline std::vector<float> flat(const std::vector<::torch::Tensor>& ts, bool grads = false) {
  std::vector<float> out;
  for (const auto& t : ts) {
    const auto c = (grads ? t.grad() : t).detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
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
