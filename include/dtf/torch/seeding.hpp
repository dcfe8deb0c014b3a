// dtf/torch/seeding.hpp — the LibTorch adapter's randomness (dtf/torch/module_model.hpp): the
// process-wide lock under which a forward reseeds LibTorch's shared default generator, the mix
// that derives a forward's seed, which built-in layers draw random numbers in their forward, and
// the initialisation of LibTorch's built-in layers from a seed: one rule for every built-in
// layer with parameters, its own reset_parameters() (the distributions its constructor draws
// from) re-run under torch::manual_seed(seed) on LibTorch's default generator (reset_from_seed).
#pragma once

#include <dtf/error.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>

namespace dtf::libtorch {

namespace detail {
/// Process-wide: LibTorch's default generator is shared, so a reseed and the forward that draws
/// from it happen under one lock.
inline std::mutex& generator_mutex() {
  static std::mutex m;
  return m;
}
/// A 64-bit mix (splitmix64's finaliser).
inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// The buffer that carries a module's forward count (dtf::has_buffers: saved with the chief's
/// buffers, given back on a restore, broadcast at a collective job's start): three floats of 21
/// bits each, exact in float32, so a count below 2^63 survives.
inline constexpr const char* forward_count_name = "dtf/forward_count";
inline void put_count(std::uint64_t n, std::span<float> out) {
  for (std::size_t k = 0; k < 3; ++k) out[k] = float((n >> (21 * k)) & 0x1FFFFF);
}
/// Errors: errc::corrupt_data when a float is not a 21-bit count (buffers from elsewhere).
inline std::uint64_t get_count(std::span<const float> in) {
  std::uint64_t n = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    if (!(in[k] >= 0.0f && in[k] < float(1 << 21) && in[k] == std::floor(in[k])))
      throw error(errc::corrupt_data, std::string("dtf::libtorch::module_model: buffer '") + forward_count_name +
                                          "' holds " + std::to_string(in[k]) + ", not a count");
    n |= std::uint64_t(in[k]) << (21 * k);
  }
  return n;
}

/// Calls reset_parameters() when `m` is one of the layers Ts (the first that matches).
template <class... Ts>
bool reset_as(::torch::nn::Module& m) {
  return ((dynamic_cast<Ts*>(&m) ? (dynamic_cast<Ts*>(&m)->reset_parameters(), true) : false) || ...);
}

/// Whether `m`'s forward draws from LibTorch's generator in train mode: the dropout layers, RReLU,
/// and the layers with a dropout option above 0 (MultiheadAttention, and so the Transformer
/// layers; LSTM, GRU, RNN between their layers). A module whose forward draws in code of its own
/// (torch::dropout called in a custom forward) is not seen: module_options::random_forward.
inline bool draws_random(const ::torch::nn::Module& m) {
  namespace nn = ::torch::nn;
  if (dynamic_cast<const nn::DropoutImpl*>(&m) || dynamic_cast<const nn::Dropout2dImpl*>(&m) ||
      dynamic_cast<const nn::Dropout3dImpl*>(&m) || dynamic_cast<const nn::AlphaDropoutImpl*>(&m) ||
      dynamic_cast<const nn::FeatureAlphaDropoutImpl*>(&m) || dynamic_cast<const nn::RReLUImpl*>(&m))
    return true;
  if (auto* p = dynamic_cast<const nn::MultiheadAttentionImpl*>(&m)) return p->options.dropout() > 0;
  if (auto* p = dynamic_cast<const nn::LSTMImpl*>(&m)) return p->options.dropout() > 0;
  if (auto* p = dynamic_cast<const nn::GRUImpl*>(&m)) return p->options.dropout() > 0;
  if (auto* p = dynamic_cast<const nn::RNNImpl*>(&m)) return p->options.dropout() > 0;
  return false;
}
/// Re-draws the parameters `m` registers itself as LibTorch's constructor of a built-in layer
/// does (its reset_parameters(), from LibTorch's default generator): every built-in layer with
/// parameters of LibTorch 1.13. MultiheadAttention's out_proj is drawn first and its bias then
/// zeroed, as the constructor leaves it; PReLU's weight is its constant. Returns false for a
/// module of the user's own.
inline bool reset_builtin(::torch::nn::Module& m) {
  namespace nn = ::torch::nn;
  if (auto* p = dynamic_cast<nn::MultiheadAttentionImpl*>(&m)) {
    p->out_proj->reset_parameters();
    p->_reset_parameters();
    return true;
  }
  if (auto* p = dynamic_cast<nn::PReLUImpl*>(&m)) return p->weight.fill_(p->options.init()), true;
  return reset_as<nn::LinearImpl, nn::BilinearImpl, nn::Conv1dImpl, nn::Conv2dImpl, nn::Conv3dImpl,
                  nn::ConvTranspose1dImpl, nn::ConvTranspose2dImpl, nn::ConvTranspose3dImpl, nn::BatchNorm1dImpl,
                  nn::BatchNorm2dImpl, nn::BatchNorm3dImpl, nn::InstanceNorm1dImpl, nn::InstanceNorm2dImpl,
                  nn::InstanceNorm3dImpl, nn::LayerNormImpl, nn::GroupNormImpl, nn::EmbeddingImpl,
                  nn::EmbeddingBagImpl, nn::RNNImpl, nn::LSTMImpl, nn::GRUImpl, nn::RNNCellImpl, nn::LSTMCellImpl,
                  nn::GRUCellImpl>(m);
}

/// The seeded initialisation (init_from::seed): under torch::manual_seed(seed), with the
/// generator lock held, every module of `root` that registers parameters of its own, in
/// pre-order (the order a constructor builds them), reset_builtin, which draws its parameters
/// and its submodules'; a module whose parameters are all `drawn` already (a tied layer
/// reached twice, a copy's tie, MultiheadAttention's out_proj) is skipped. `drawn(t)` says
/// whether tensor t's slot was drawn, `draw(t)` marks it.
template <class Drawn, class Draw>
void reset_from_seed(::torch::nn::Module& root, std::uint64_t seed, Drawn&& drawn, Draw&& draw) {
  ::torch::NoGradGuard no_grad;
  std::lock_guard lock(generator_mutex());
  ::torch::manual_seed(seed);
  for (const auto& m : root.modules(/*include_self=*/true)) {
    const auto own = m->parameters(/*recurse=*/false);
    if (own.empty() || std::all_of(own.begin(), own.end(), [&](const ::torch::Tensor& t) { return drawn(t); })) continue;
    if (!reset_builtin(*m)) continue;
    for (const auto& t : m->parameters(/*recurse=*/true)) draw(t);
  }
}
}  // namespace detail

}  // namespace dtf::libtorch
