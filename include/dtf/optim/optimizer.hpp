// dtf/optim/optimizer.hpp — applies an update rule to a flat parameter buffer, keeping the
// rule's slots (momentum, accumulators, Adam moments) beside it.
//
//   dtf::optim::optimizer<> opt(dtf::optim::adam{.learning_rate = 1e-3f}, net.num_parameters());
//   opt.apply(params, grads);            // rate from the rule
//   opt.apply(params, grads, lr(step));  // rate from a schedule
//
// The memory space is a template parameter: device_space for a worker's parameters (Thrust's
// device system: OpenMP on CPU builds, CUDA on GPU builds), host_space for a parameter
// server's shards in host memory. A server applying one rule to several shards keeps one
// optimizer per shard.
// CUDA builds, device_space: each update is one kernel over the flat buffer issued on stream()
// (set_stream(); the legacy default stream otherwise). Adam's update count lives in device
// memory: a one-thread kernel before the update increments it and computes the bias-corrected
// rate from it in double, as the host does, so the step reads nothing from the host's counter
// and can be captured in a CUDA graph and replayed (each replay advances the count). On the
// legacy stream apply() still waits for the update, as Thrust's blocking policy did (callers
// read the parameters from other streams); on a stream of the caller's it returns at once.
// iterations() is a host mirror of the count: apply() never reads it back. The rate `lr` is a
// kernel argument: a captured update replays the rate it was captured with, unless
// set_rate_source(rate) names a device float (host memory on CPU builds) that the update reads
// instead (a replayed update then uses whatever was written there before it: the rate of each
// step, docs/design/gpu-execution.md section 7). The parameters are those of the rate argument
// bit for bit (adamw's decay factor is computed on the device with the host's double arithmetic).
// set_skip_flag(flag): a device flag (host memory on CPU builds), e.g. a device::loss_ring's,
// read by the update kernels themselves: once it is non-zero they apply nothing (Adam's count on
// the device stays put too), so the steps between a non-finite loss and its read on the host
// leave the parameters and slots as they were, with no host read (docs/design/gpu-execution.md,
// section 5). iterations() still counts those updates (the host does not read the flag).
// Thread safety: none; one apply at a time per optimizer.
#pragma once

#include <dtf/device/kernels.hpp>
#include <dtf/error.hpp>
#include <dtf/optim/rules.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/host_vector.h>
#include <thrust/iterator/counting_iterator.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#if defined(__SSE2__) && !defined(__CUDACC__) && !defined(__FMA__)
// Without FMA contraction the scalar kernel and the SSE pass round alike.
#include <immintrin.h>
#define DTF_OPTIM_SSE 1
#else
/// 1 when the optimiser's host kernels use SSE2 (x86 without FMA contraction, not under nvcc), 0
/// otherwise.
#define DTF_OPTIM_SSE 0
#endif

namespace dtf::optim {

/// Buffers in Thrust's device system (the worker's tensors).
struct device_space {
  /// Thrust's device vector.
  template <class T>
  using vector = thrust::device_vector<T>;
  /// Thrust's device execution policy.
  static constexpr auto policy() { return thrust::device; }
};

/// Buffers in host memory (a parameter server's shards).
struct host_space {
  /// Thrust's host vector.
  template <class T>
  using vector = thrust::host_vector<T>;
  /// Thrust's host execution policy.
  static constexpr auto policy() { return thrust::host; }
};

namespace detail {
// Whether the updates are off: the skip flag is set and non-zero (null: never).
DTF_HD inline bool skipped(const std::int64_t* flag) { return flag && *flag != 0; }

template <class Kernel>
struct apply_at {
  Kernel k;
  float* p;
  const float* g;
  float* s0;
  float* s1;
  const std::int64_t* skip;
  const float* rate = nullptr;  // set_rate_source's: the rate read here instead of k.lr
  DTF_HD void operator()(std::size_t i) const {
    if (skipped(skip)) return;
    if (!rate) return k(p[i], g[i], s0, s1, i);
    Kernel at = k;
    at.lr = *rate;
    at(p[i], g[i], s0, s1, i);
  }
};

// adamw's decay factor 1 - lr wd in double, rounded once to float: adam_keep's arithmetic, with
// no contraction into a fused multiply-add on the device (the host's SSE2 does none either).
DTF_HD inline float decoupled_keep(float lr, float wd) {
#if defined(__CUDA_ARCH__)
  return float(__dsub_rn(1.0, __dmul_rn(double(lr), double(wd))));
#else
  return float(1.0 - double(lr) * double(wd));
#endif
}

// Adam's rate at update t: lr sqrt(1 - b2^t) / (1 - b1^t) in double, rounded once to float
// (the host's formula, used on the device too: sqrt is correctly rounded on both, CUDA's double
// pow is within 2 ulp of glibc's, and the rounding to float absorbs such a difference but in
// rare ties).
DTF_HD inline float adam_rate(float lr, float b1, float b2, std::int64_t t) {
  const double n = double(t);
  return float(lr * sqrt(1.0 - pow(double(b2), n)) / (1.0 - pow(double(b1), n)));
}

// One thread: the next update's count, and its rate into *lr_t (device memory on CUDA builds).
// With `rate` (set_rate_source): the rate read there, and adamw's decay factor (`decoupled`: its
// weight decay) written to lr_t[1].
struct adam_count {
  std::int64_t* t;
  float* lr_t;
  float lr, b1, b2;
  const std::int64_t* skip;
  const float* rate = nullptr;
  float decoupled = 0.0f;
  DTF_HD void operator()(std::size_t) const {
    if (skipped(skip)) return;
    const float r = rate ? *rate : lr;
    *lr_t = adam_rate(r, b1, b2, ++*t);
    if (rate && decoupled != 0.0f) lr_t[1] = decoupled_keep(r, decoupled);
  }
};

// Adam's element update with the rate read from where adam_count wrote it.
struct adam_at {
  const float* lr_t;
  float b1, b2, eps, wd, keep;  // wd, keep: adam_kernel's weight decay (adam_l2, adam_keep)
  float* p;
  const float* g;
  float* m;
  float* v;
  const std::int64_t* skip;
  bool keep_on_device = false;  // the decay factor at lr_t[1] (adam_count's, from the rate source)
  DTF_HD void operator()(std::size_t i) const {
    if (!skipped(skip)) adam_kernel{*lr_t, b1, b2, eps, wd, keep_on_device ? lr_t[1] : keep}(p[i], g[i], m, v, i);
  }
};

// The update in one pass over host memory (the buffers never overlap). GCC does not
// vectorise sqrtf under errno semantics (the default), so Adam's pass, the one that matters,
// is written with SSE: the same IEEE operations in the same order as adam_kernel (sqrt and
// division are correctly rounded either way), so both give the same bits.
template <class Kernel>
void host_apply(Kernel k, float* __restrict p, const float* __restrict g, float* __restrict s0,
                float* __restrict s1, std::size_t n) {
  std::size_t i = 0;
#if DTF_OPTIM_SSE
  if constexpr (std::is_same_v<Kernel, adam_kernel>) {
    const __m128 b1 = _mm_set1_ps(k.b1), b2 = _mm_set1_ps(k.b2), c1 = _mm_set1_ps(1.0f - k.b1),
                 c2 = _mm_set1_ps(1.0f - k.b2), lr = _mm_set1_ps(k.lr_t), eps = _mm_set1_ps(k.eps),
                 wd = _mm_set1_ps(k.wd), keep = _mm_set1_ps(k.keep);
    const bool l2 = k.wd != 0.0f, decoupled = k.keep != 1.0f;  // as adam_kernel: skipped when off
    for (; i + 4 <= n; i += 4) {
      __m128 gi = _mm_loadu_ps(g + i), pi = _mm_loadu_ps(p + i);
      if (l2) gi = _mm_add_ps(gi, _mm_mul_ps(wd, pi));
      if (decoupled) pi = _mm_mul_ps(pi, keep);
      const __m128 mi = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(s0 + i)), _mm_mul_ps(c1, gi));
      const __m128 vi = _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(s1 + i)), _mm_mul_ps(_mm_mul_ps(c2, gi), gi));
      _mm_storeu_ps(s0 + i, mi);
      _mm_storeu_ps(s1 + i, vi);
      const __m128 step = _mm_div_ps(_mm_mul_ps(lr, mi), _mm_add_ps(_mm_sqrt_ps(vi), eps));
      _mm_storeu_ps(p + i, _mm_sub_ps(pi, step));
    }
  }
#endif
  for (; i < n; ++i) k(p[i], g[i], s0, s1, i);
}
}  // namespace detail

/// Applies an update rule to a flat parameter buffer, keeping the rule's slots (momentum,
/// accumulators, Adam moments) beside it, in the memory space `Space` (device_space or
/// host_space).
template <class Space = device_space>
class optimizer {
 public:
  /// An optimiser applying rule `r` to buffers of `size` floats (its slots start at the rule's
  /// initial value).
  optimizer(rule r, std::size_t size) : rule_(r), size_(size) {
    const std::size_t n = detail::slot_count(rule_);
    const float init = detail::slot_initial_value(rule_);
    if (n >= 1) slot0_.assign(size, init);
    if (n >= 2) slot1_.assign(size, init);
#if DTF_CUDA
    if constexpr (on_device) {
      counter_.assign(1, 0);
      rate_.assign(2, 0.0f);  // Adam's rate, adamw's decay factor
    }
#endif
  }

  /// The rule applied.
  const rule& update_rule() const noexcept { return rule_; }
  /// The number of parameters.
  std::size_t size() const noexcept { return size_; }
  /// Number of updates applied so far (Adam's t).
  std::int64_t iterations() const noexcept { return iterations_; }

  /// Applies one update with the rule's own learning rate.
  void apply(std::span<float> params, std::span<const float> grads) {
    apply(params, grads, detail::base_learning_rate(rule_));
  }

  /// Applies one update with learning rate lr. params and grads live in Space's memory.
  /// Errors: errc::shape_mismatch when a buffer's size differs from the optimizer's.
  void apply(std::span<float> params, std::span<const float> grads, float lr) {
    if (params.size() != size_ || grads.size() != size_)
      throw error(errc::shape_mismatch, "optim::optimizer: " + std::to_string(params.size()) + " parameters and " +
                                            std::to_string(grads.size()) + " gradients for an optimizer of size " +
                                            std::to_string(size_));
#if DTF_CUDA
    if constexpr (on_device) sync_counter();
#endif
    ++iterations_;
    if constexpr (!on_device) {
      if (detail::skipped(skip_)) return;  // host memory: the flag is read here, as the kernels would
      if (rate_source_) lr = *rate_source_;  // and the rate
    }
    float* s0 = slot0_.empty() ? nullptr : thrust::raw_pointer_cast(slot0_.data());
    float* s1 = slot1_.empty() ? nullptr : thrust::raw_pointer_cast(slot1_.data());
    std::visit(
        [&](const auto& r) {
          using R = std::decay_t<decltype(r)>;
          if constexpr (std::is_same_v<R, sgd>) {
            run(detail::sgd_kernel{lr, r.weight_decay}, params, grads, s0, s1);
          } else if constexpr (std::is_same_v<R, momentum>) {
            run(detail::momentum_kernel{lr, r.momentum, r.nesterov, r.weight_decay}, params, grads, s0, s1);
          } else if constexpr (std::is_same_v<R, adagrad>) {
            run(detail::adagrad_kernel{lr, r.epsilon, r.weight_decay}, params, grads, s0, s1);
          } else if constexpr (on_device) {  // adam, adamw
#if DTF_CUDA
            float* rate = thrust::raw_pointer_cast(rate_.data());
            const float decoupled = decoupled_decay(r);
            device::for_each_index(stream_, 1,
                                   detail::adam_count{thrust::raw_pointer_cast(counter_.data()), rate, lr, r.beta1,
                                                      r.beta2, skip_, rate_source_, decoupled},
                                   "optim::optimizer (adam's count)");
            launch(detail::adam_at{rate, r.beta1, r.beta2, r.epsilon, detail::adam_l2(r), detail::adam_keep(r, lr),
                                   params.data(), grads.data(), s0, s1, skip_, rate_source_ && decoupled != 0.0f});
#endif
          } else {  // adam, adamw
            const float lr_t = detail::adam_rate(lr, r.beta1, r.beta2, iterations_);
            run(detail::adam_kernel{lr_t, r.beta1, r.beta2, r.epsilon, detail::adam_l2(r), detail::adam_keep(r, lr)},
                params, grads, s0, s1);
          }
        },
        rule_);
  }

  /// The stream the updates are issued on (CUDA builds, device_space; 0, the legacy default
  /// stream, unless set).
  device::stream_t stream() const noexcept { return stream_; }
  /// Issues later updates on s (e.g. a device::context's compute stream): apply() then returns
  /// without waiting for them. The gradients must be written by work ordered before it on s.
  /// The first update after a restore copies the count to the device from pageable memory, so
  /// it is not one to capture in a CUDA graph.
  void set_stream(device::stream_t s) noexcept { stream_ = s; }

  /// Later updates apply nothing while *flag is non-zero, read by the update kernels (see the
  /// file comment); `flag` is device memory (host memory on CPU builds, or host_space) and must
  /// outlive the updates. Null (the default): every update applies.
  void set_skip_flag(const std::int64_t* flag) noexcept { skip_ = flag; }
  /// The flag set by set_skip_flag (null by default).
  const std::int64_t* skip_flag() const noexcept { return skip_; }

  /// Later updates read their rate from *rate (device memory; host memory on CPU builds or
  /// host_space) when they run, not from apply()'s argument, which they then ignore: a captured
  /// update replays with the rate written there before each launch (see the file comment).
  /// `rate` must outlive the updates. Null (the default): the argument.
  void set_rate_source(const float* rate) noexcept { rate_source_ = rate; }
  /// The float set by set_rate_source (null by default).
  const float* rate_source() const noexcept { return rate_source_; }
  /// A replayed capture of apply() ran its kernels without calling it: the host's count
  /// (iterations()) follows the device's, which the replay advanced.
  void count_replayed_update() noexcept { ++iterations_; }

  /// The slots, for checkpoints: slot(0) and slot(1) hold num_slots buffers of size().
  std::span<float> slot(std::size_t i) {
    auto& v = i == 0 ? slot0_ : slot1_;
    return {thrust::raw_pointer_cast(v.data()), v.size()};
  }
  /// Sets the number of updates applied (a restore; CUDA builds copy it to the device's count
  /// before the next update).
  void set_iterations(std::int64_t t) noexcept {
    iterations_ = t;
    counter_stale_ = true;
  }

  /// The rule's name (sgd, momentum, nesterov, adagrad, adam, adamw), as checkpoints record it.
  std::string rule_name() const {
    return std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); }, rule_);
  }
  /// The slots copied to host memory (one vector of size() per slot), for checkpoints.
  std::vector<std::vector<float>> host_slots() const {
    std::vector<std::vector<float>> out;
    for (const auto* v : {&slot0_, &slot1_}) {
      if (v->empty()) continue;
      out.emplace_back(v->size());
      thrust::copy(v->begin(), v->end(), out.back().begin());
    }
    return out;
  }
  /// Restores the slots from host buffers and the update count (Adam's t). Errors:
  /// errc::shape_mismatch when the number or sizes of the slots do not match this rule's.
  void load_host_slots(std::span<const std::vector<float>> slots, std::int64_t iterations) {
    if (slots.size() != detail::slot_count(rule_))
      throw error(errc::shape_mismatch, "optimizer: " + std::to_string(slots.size()) + " slots for rule " + rule_name() +
                                            " (which has " + std::to_string(detail::slot_count(rule_)) + ")");
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto& v = i == 0 ? slot0_ : slot1_;
      if (slots[i].size() != v.size())
        throw error(errc::shape_mismatch, "optimizer: slot of " + std::to_string(slots[i].size()) + " floats, expected " +
                                              std::to_string(v.size()));
      thrust::copy(slots[i].begin(), slots[i].end(), v.begin());
    }
    set_iterations(iterations);
  }

 private:
  // True where the update runs as a CUDA kernel (CUDA builds, device_space).
  static constexpr bool on_device = DTF_CUDA && std::is_same_v<Space, device_space>;

  // adamw's decoupled weight decay (the decay factor's), 0 for adam.
  static float decoupled_decay(const adam&) noexcept { return 0.0f; }
  static float decoupled_decay(const adamw& r) noexcept { return r.weight_decay; }

  template <class Kernel>
  void run(Kernel k, std::span<float> params, std::span<const float> grads, float* s0, float* s1) {
    if constexpr (!on_device) {
      // Host memory: one fused pass in a plain loop (no Thrust dispatch per call).
      detail::host_apply(k, params.data(), grads.data(), s0, s1, size_);
    } else {
      launch(detail::apply_at<Kernel>{k, params.data(), grads.data(), s0, s1, skip_, rate_source_});
    }
  }

#if DTF_CUDA
  // One kernel over the buffer on stream_; on the legacy stream the host waits for it (see the
  // file comment).
  template <class F>
  void launch(F f) {
    device::for_each_index(stream_, size_, f, "optim::optimizer (update)");
    if (stream_ == nullptr || stream_ == cudaStreamLegacy)
      if (const cudaError_t rc = cudaStreamSynchronize(stream_); rc != cudaSuccess)
        throw error(errc::internal, std::string("optim::optimizer: update failed: ") + cudaGetErrorString(rc));
  }

  // After a restore, the device's count takes the host's (ordered on stream_ before the update).
  // Called before the host's count moves; only a restore pays this copy. From pageable memory
  // the copy has read its source when it returns (CUDA stages it), so a field will do.
  void sync_counter() {
    if (!counter_stale_) return;
    if (const cudaError_t rc = cudaMemcpyAsync(thrust::raw_pointer_cast(counter_.data()), &iterations_,
                                               sizeof iterations_, cudaMemcpyHostToDevice, stream_);
        rc != cudaSuccess)
      throw error(errc::internal, std::string("optim::optimizer: restoring the update count on the device: ") +
                                      cudaGetErrorString(rc));
    counter_stale_ = false;
  }
  thrust::device_vector<std::int64_t> counter_;  // Adam's t on the device (device_space only)
  thrust::device_vector<float> rate_;            // the rate adam_count computed for this update
#else
  template <class F>
  void launch(F) {}
#endif

  rule rule_;
  std::size_t size_;
  std::int64_t iterations_ = 0;
  bool counter_stale_ = false;  // set_iterations() since the device's count was last written
  device::stream_t stream_{};
  const std::int64_t* skip_ = nullptr;  // set_skip_flag's
  const float* rate_source_ = nullptr;  // set_rate_source's
  typename Space::template vector<float> slot0_, slot1_;
};

}  // namespace dtf::optim
