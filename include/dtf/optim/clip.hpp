// dtf/optim/clip.hpp — gradient clipping by global norm over a flat gradient buffer, as
// torch.nn.utils.clip_grad_norm_ (and tf.clip_by_global_norm):
//
//   norm = sqrt(sum of g_i^2);  if max_norm / (norm + 1e-6) < 1:  g *= max_norm / (norm + 1e-6)
//
// The flat buffer holds every variable's gradient, so its norm is the global norm. The sum runs
// in double. In host memory (and on CPU builds, where device memory is host memory) it runs
// in index order on the calling thread, so that every rank of a collective strategy, holding
// the same reduced gradient, computes the same norm bit for bit and the replicas stay equal;
// on a GPU it is Thrust's reduction, deterministic for a given size and device, and the host
// waits for it. dtf/optim/device_clip.hpp clips with the same arithmetic on a stream, the norm
// left in device memory (no host wait: what a training engine's step uses).
// Thread safety: none beyond the buffer's own (one call per buffer at a time).
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>
#include <dtf/optim/optimizer.hpp>

#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include <cmath>
#include <span>
#include <string>
#include <type_traits>

namespace dtf::optim {

namespace detail {
struct square_in_double {
  DTF_HD double operator()(float x) const { return double(x) * double(x); }
};
struct scale_by {
  float c;
  DTF_HD float operator()(float x) const { return x * c; }
};
// Whether Space's memory is read by the calling thread (host memory, or a CPU build's device).
template <class Space>
inline constexpr bool reads_on_host = !DTF_CUDA || std::is_same_v<Space, host_space>;
}  // namespace detail

/// The L2 norm of the flat buffer `g` in Space's memory (device_space: the worker's tensors;
/// host_space: host memory), summed in double (see the file comment).
template <class Space = device_space>
double global_norm(std::span<const float> g) {
  double sum = 0;
  if constexpr (detail::reads_on_host<Space>) {
    for (const float x : g) sum += double(x) * double(x);
  } else {
    sum = thrust::transform_reduce(Space::policy(), g.data(), g.data() + g.size(), detail::square_in_double{}, 0.0,
                                   thrust::plus<double>());
  }
  return std::sqrt(sum);
}

/// Clips the flat gradient `g` (Space's memory) to global norm max_norm as
/// torch.nn.utils.clip_grad_norm_ does (see the file comment) and returns the norm before
/// clipping. max_norm 0 leaves g alone (the norm is still computed). A non-finite norm
/// (a NaN or infinite gradient) leaves g alone too: the NaN check reports the loss.
/// Errors: errc::invalid_argument for a negative or NaN max_norm.
template <class Space = device_space>
double clip_by_global_norm(std::span<float> g, float max_norm) {
  if (!(max_norm >= 0.0f))
    throw error(errc::invalid_argument, "clip_by_global_norm: max_norm " + std::to_string(max_norm) +
                                            " (must be 0, off, or positive)");
  const double norm = global_norm<Space>(std::span<const float>(g));
  if (max_norm == 0.0f || !std::isfinite(norm)) return norm;
  const double coef = double(max_norm) / (norm + 1e-6);
  if (coef >= 1.0) return norm;
  const float c = float(coef);
  if constexpr (detail::reads_on_host<Space>) {
    for (float& x : g) x *= c;
  } else {
    thrust::transform(Space::policy(), g.data(), g.data() + g.size(), g.data(), detail::scale_by{c});
  }
  return norm;
}

/// A ps worker's clip norm, checked: returns max_norm. Errors: errc::invalid_config for a
/// negative or NaN norm, or a positive one on a model with embedding tables (`has_tables`: the
/// rows' gradients go to the ps apart from the flat gradient, so they would escape the norm).
inline float checked_worker_clip_norm(float max_norm, bool has_tables) {
  if (!(max_norm >= 0.0f)) throw error(errc::invalid_config, "clip_norm must be 0 (off) or positive");
  if (has_tables && max_norm > 0.0f)
    throw error(errc::invalid_config, "clip_norm: not for embedding models (the rows' gradients on the ps would "
                                      "escape the norm)");
  return max_norm;
}

}  // namespace dtf::optim
