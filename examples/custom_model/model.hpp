// custom_model's model: a 784-H-10 ReLU network written by hand (plain loops on host copies),
// not dtf::nn. It models dtf::model and dtf::classifier, so dtf::train trains it and
// dtf::nn::evaluate measures it. Parameters: W1 [784, H], b1 [H], W2 [H, 10], b2 [10], one
// flat buffer in device memory (host memory on CPU builds).
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/tensor.hpp>
#include <dtf/variable.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

class two_layer_net {
 public:
  explicit two_layer_net(std::size_t hidden = 64) : h_(hidden) {}

  std::vector<dtf::variable_spec> variables() const {
    return {{"w1", {in_, h_}, 0}, {"b1", {h_}, in_ * h_}, {"w2", {h_, out_}, w2_at()}, {"b2", {out_}, w2_at() + h_ * out_}};
  }

  /// He-normal weights from `seed`, zero biases.
  void initialize(std::span<float> p, std::uint64_t seed) const {
    std::vector<float> host(p.size(), 0.0f);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> w1(0.0f, std::sqrt(2.0f / float(in_))), w2(0.0f, std::sqrt(2.0f / float(h_)));
    for (std::size_t i = 0; i < in_ * h_; ++i) host[i] = w1(rng);
    for (std::size_t i = 0; i < h_ * out_; ++i) host[w2_at() + i] = w2(rng);
    thrust::copy(host.begin(), host.end(), thrust::device_pointer_cast(p.data()));
  }

  /// Mean softmax cross-entropy over the batch; writes d loss / d p into g.
  float loss_and_gradients(std::span<const float> p, const dtf::tensor& x, const dtf::tensor& y, std::span<float> g) {
    forward(p, x);
    const auto labels = y.to_vector<std::int32_t>();
    const std::size_t n = labels.size();
    std::vector<float> grad(p.size(), 0.0f), dz(n * out_), dh(n * h_, 0.0f);
    double loss = 0;
    for (std::size_t r = 0; r < n; ++r) {  // softmax, loss, dL/dlogits
      const float* z = &z_[r * out_];
      const float top = *std::max_element(z, z + out_);
      float sum = 0;
      for (std::size_t k = 0; k < out_; ++k) sum += std::exp(z[k] - top);
      for (std::size_t k = 0; k < out_; ++k)
        dz[r * out_ + k] = (std::exp(z[k] - top) / sum - (std::int32_t(k) == labels[r] ? 1.0f : 0.0f)) / float(n);
      loss += std::log(sum) + top - z[labels[r]];
    }
    const float* w2 = &p_[w2_at()];
    for (std::size_t r = 0; r < n; ++r)  // layer 2 gradients, and dL/dhidden through the ReLU
      for (std::size_t j = 0; j < h_; ++j) {
        if (a_[r * h_ + j] <= 0) continue;
        float s = 0;
        for (std::size_t k = 0; k < out_; ++k) {
          grad[w2_at() + j * out_ + k] += a_[r * h_ + j] * dz[r * out_ + k];
          s += w2[j * out_ + k] * dz[r * out_ + k];
        }
        dh[r * h_ + j] = s;
      }
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t k = 0; k < out_; ++k) grad[w2_at() + h_ * out_ + k] += dz[r * out_ + k];
    for (std::size_t r = 0; r < n; ++r)  // layer 1 gradients
      for (std::size_t i = 0; i < in_; ++i) {
        const float xi = x_[r * in_ + i];
        if (xi == 0) continue;
        for (std::size_t j = 0; j < h_; ++j) grad[i * h_ + j] += xi * dh[r * h_ + j];
      }
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t j = 0; j < h_; ++j) grad[in_ * h_ + j] += dh[r * h_ + j];
    thrust::copy(grad.begin(), grad.end(), thrust::device_pointer_cast(g.data()));
    return float(loss / double(n));
  }

  /// [batch, 10] logits into out (for dtf::nn::evaluate).
  void logits(std::span<const float> p, const dtf::tensor& x, dtf::tensor& out) {
    forward(p, x);
    out.resize({z_.size() / out_, out_}, dtf::dtype::float32);
    out.copy_from_host<float>(std::span<const float>(z_));
  }

 private:
  std::size_t w2_at() const { return in_ * h_ + h_; }

  /// Copies p and x to host and computes the hidden activations a_ and the logits z_.
  void forward(std::span<const float> p, const dtf::tensor& x) {
    p_.resize(p.size());
    thrust::copy(thrust::device_pointer_cast(p.data()), thrust::device_pointer_cast(p.data() + p.size()), p_.begin());
    x_ = x.to_vector<float>();
    const std::size_t n = x_.size() / in_;
    a_.assign(n * h_, 0.0f);
    z_.assign(n * out_, 0.0f);
    for (std::size_t r = 0; r < n; ++r) {
      float* a = &a_[r * h_];
      std::copy_n(&p_[in_ * h_], h_, a);
      for (std::size_t i = 0; i < in_; ++i) {
        const float xi = x_[r * in_ + i];
        if (xi == 0) continue;
        for (std::size_t j = 0; j < h_; ++j) a[j] += xi * p_[i * h_ + j];
      }
      for (std::size_t j = 0; j < h_; ++j) a[j] = std::max(a[j], 0.0f);
      float* z = &z_[r * out_];
      std::copy_n(&p_[w2_at() + h_ * out_], out_, z);
      for (std::size_t j = 0; j < h_; ++j)
        for (std::size_t k = 0; k < out_; ++k) z[k] += a[j] * p_[w2_at() + j * out_ + k];
    }
  }

  std::size_t in_ = 784, h_, out_ = 10;
  std::vector<float> p_, x_, a_, z_;
};
static_assert(dtf::classifier<two_layer_net>);
