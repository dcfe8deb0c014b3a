// dtf/torch/seeding.hpp — the LibTorch adapter's randomness (dtf/torch/module_model.hpp): the
// process-wide lock under which a forward reseeds LibTorch's shared default generator, the mix
// that derives a forward's seed, which built-in layers draw random numbers in their forward, and
// the initialisation of LibTorch's built-in layers from a seed.
#pragma once

#if DTF_CUDA
#error "dtf/torch: the LibTorch adapter is for CPU builds (Debian's LibTorch has no CUDA)"
#endif

#include <torch/torch.h>

#include <cstdint>
#include <mutex>

namespace dtf::torch {

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
/// Resets the parameters of LibTorch's built-in layers (what their constructors do).
inline bool reset_builtin(::torch::nn::Module& m) {
  namespace nn = ::torch::nn;
  if (auto* p = dynamic_cast<nn::LinearImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::Conv1dImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::Conv2dImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::Conv3dImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::BatchNorm1dImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::BatchNorm2dImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::BatchNorm3dImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::LayerNormImpl*>(&m)) return p->reset_parameters(), true;
  if (auto* p = dynamic_cast<nn::EmbeddingImpl*>(&m)) return p->reset_parameters(), true;
  return false;
}
}  // namespace detail

}  // namespace dtf::torch
