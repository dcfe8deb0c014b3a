// dtf/nn/init.hpp — seeded, platform-independent initialisers.
//
// The standard library's distributions are implementation-defined, so the same seed could give
// different weights with another standard library; these are written out so that a seed means
// the same initial model on every task and every build.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>

namespace dtf::nn {

/// How a Dense layer's kernel is initialised (biases start at zero).
enum class initializer {
  automatic,       ///< he_normal when a ReLU follows the layer, glorot_uniform otherwise
  glorot_uniform,  ///< U(-l, l), l = sqrt(6 / (fan_in + fan_out))   (Glorot & Bengio 2010)
  he_normal,       ///< N(0, 2 / fan_in)                               (He et al. 2015)
  zeros,
};

/// SplitMix64: a small, well-mixed generator; also used to derive per-layer seeds.
class splitmix64 {
 public:
  /// A generator seeded with `seed`.
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  /// The next 64-bit value.
  std::uint64_t operator()() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept { return double((*this)() >> 11) * 0x1.0p-53; }
  /// Standard normal (Box–Muller; one of the pair is discarded for simplicity).
  double normal() noexcept {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::uint64_t state_;
};

/// Fills host memory `out` with a kernel of the given fans.
inline void fill_kernel(std::span<float> out, std::size_t fan_in, std::size_t fan_out, initializer init,
                        std::uint64_t seed) {
  splitmix64 rng(seed);
  switch (init) {
    case initializer::automatic:  // resolved by the caller; treat as Glorot
    case initializer::glorot_uniform: {
      const double limit = std::sqrt(6.0 / double(fan_in + fan_out));
      for (auto& w : out) w = float((2.0 * rng.uniform() - 1.0) * limit);
      break;
    }
    case initializer::he_normal: {
      const double stddev = std::sqrt(2.0 / double(fan_in));
      for (auto& w : out) w = float(rng.normal() * stddev);
      break;
    }
    case initializer::zeros:
      for (auto& w : out) w = 0.0f;
      break;
  }
}

}  // namespace dtf::nn
