// dtf/strategies/dense_staging.hpp — a model's loss and gradient at host parameters: directly on
// CPU builds (device memory is host memory), staged through device tensors on CUDA builds.
// Used by the workers' gradient computations (dtf/strategies/async.hpp, embedding_gradient.hpp).
#pragma once

#include <dtf/config.hpp>
#include <dtf/tensor.hpp>

#include <span>

namespace dtf::strategies::detail {

class dense_staging {
 public:
  explicit dense_staging(std::size_t n) {
    if constexpr (!device_memory_is_host_accessible) {
      params_.resize({n});
      grads_.resize({n});
    }
  }
  /// f(device params, device grads) -> loss, called at host parameters `at`; the gradient
  /// lands in the host span g.
  template <class F>
  float operator()(std::span<const float> at, std::span<float> g, F&& f) {
    if constexpr (device_memory_is_host_accessible) {
      return f(at, g);
    } else {
      params_.copy_from_host<float>(at);
      const float loss = f(std::span<const float>(params_.span<float>()), grads_.span<float>());
      grads_.copy_to_host<float>(g);
      return loss;
    }
  }

 private:
  tensor params_, grads_;
};

}  // namespace dtf::strategies::detail
