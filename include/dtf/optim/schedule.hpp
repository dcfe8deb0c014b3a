// dtf/optim/schedule.hpp — learning-rate schedules (models of dtf::lr_schedule).
//
// A schedule maps the global step (from 0) to a learning rate. Use one with
// optimizer::apply(params, grads, schedule(step)).
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dtf::optim {

/// The same rate at every step.
struct constant_schedule {
  /// The rate.
  float learning_rate = 0.01f;
  /// The rate at any step.
  float operator()(std::int64_t) const { return learning_rate; }
};

/// values[0] while step <= boundaries[0], values[i] while boundaries[i-1] < step <= boundaries[i],
/// values.back() after the last boundary (tf.train.piecewise_constant). values.size() must be boundaries.size() + 1.
struct piecewise_constant {
  /// Steps where the rate changes, rising.
  std::vector<std::int64_t> boundaries;
  /// The rates, one more than boundaries.
  std::vector<float> values;
  /// The rate at global step `step`. Errors: errc::invalid_config when values.size() is not
  /// boundaries.size() + 1.
  float operator()(std::int64_t step) const {
    if (values.size() != boundaries.size() + 1)
      throw error(errc::invalid_config, "optim::piecewise_constant: " + std::to_string(values.size()) +
                                            " values for " + std::to_string(boundaries.size()) +
                                            " boundaries (need one more value than boundaries)");
    const auto it = std::upper_bound(boundaries.begin(), boundaries.end(), step - 1);
    return values[std::size_t(it - boundaries.begin())];
  }
};

/// lr * rate^(step / decay_steps), the exponent floored when staircase (tf.train.exponential_decay).
struct exponential_decay {
  /// lr.
  float learning_rate = 0.01f;
  /// Steps per decay.
  std::int64_t decay_steps = 1000;
  /// rate.
  float decay_rate = 0.96f;
  /// Floor the exponent.
  bool staircase = false;
  /// The rate at global step `step`.
  float operator()(std::int64_t step) const {
    double e = double(step) / double(std::max<std::int64_t>(decay_steps, 1));
    if (staircase) e = std::floor(e);
    return float(learning_rate * std::pow(double(decay_rate), e));
  }
};

/// The linear scaling rule with gradual warmup (Goyal et al. 2017, "Accurate, Large Minibatch
/// SGD"): when the global batch is `scale` times the reference batch for which base_rate was
/// tuned, the target rate is scale * base_rate, reached linearly from base_rate over the first
/// warmup_steps steps. After warmup the rate is scale * base_rate times the optional
/// decay multipliers (piecewise: multiply by decay_factors[i] from step decay_boundaries[i]).
struct linear_scaling_warmup {
  /// The rate tuned for the reference batch.
  float base_rate = 0.1f;
  float scale = 1.0f;              ///< k: global batch / reference batch (e.g. number of replicas)
  std::int64_t warmup_steps = 0;   ///< 0 disables warmup
  /// Steps from which a decay factor applies, rising.
  std::vector<std::int64_t> decay_boundaries{};
  /// The factors, one per boundary.
  std::vector<float> decay_factors{};

  /// The rate at global step `step`. Errors: errc::invalid_config when the decay lists differ in
  /// length.
  float operator()(std::int64_t step) const {
    if (decay_boundaries.size() != decay_factors.size())
      throw error(errc::invalid_config, "optim::linear_scaling_warmup: decay_boundaries and decay_factors differ in "
                                        "length");
    const double target = double(base_rate) * double(scale);
    double lr = target;
    if (step < warmup_steps)
      lr = double(base_rate) + (target - double(base_rate)) * double(step) / double(warmup_steps);
    for (std::size_t i = 0; i < decay_boundaries.size(); ++i)
      if (step >= decay_boundaries[i]) lr *= double(decay_factors[i]);
    return float(lr);
  }
};

/// Cosine decay with linear warm-up (tf.keras.optimizers.schedules.CosineDecay with
/// warmup_steps; PyTorch's LinearLR then CosineAnnealingLR): from warmup_from to learning_rate
/// linearly over the first warmup_steps steps, then learning_rate * ((1 - alpha) *
/// (1 + cos(pi * s / decay_steps)) / 2 + alpha) at s = step - warmup_steps steps after the
/// warm-up (s capped at decay_steps: alpha * learning_rate from then on).
struct cosine_decay {
  /// The peak rate (after warm-up).
  float learning_rate = 0.01f;
  /// Steps from the peak to the floor.
  std::int64_t decay_steps = 1000;
  /// The floor as a fraction of learning_rate.
  float alpha = 0.0f;
  /// Steps of linear warm-up (0: none).
  std::int64_t warmup_steps = 0;
  /// The rate at step 0 of the warm-up.
  float warmup_from = 0.0f;
  /// The rate at global step `step`. Errors: errc::invalid_config when decay_steps is not
  /// positive or warmup_steps is negative.
  float operator()(std::int64_t step) const {
    if (decay_steps <= 0 || warmup_steps < 0)
      throw error(errc::invalid_config, "optim::cosine_decay: decay_steps " + std::to_string(decay_steps) +
                                            ", warmup_steps " + std::to_string(warmup_steps) +
                                            " (decay_steps must be positive, warmup_steps not negative)");
    if (step < warmup_steps)
      return float(double(warmup_from) +
                   (double(learning_rate) - double(warmup_from)) * double(step) / double(warmup_steps));
    const double s = double(std::min(step - warmup_steps, decay_steps)) / double(decay_steps);
    const double pi = 3.14159265358979323846;
    return float(double(learning_rate) * ((1.0 - double(alpha)) * 0.5 * (1.0 + std::cos(pi * s)) + double(alpha)));
  }
};

static_assert(lr_schedule<constant_schedule>);
static_assert(lr_schedule<cosine_decay>);
static_assert(lr_schedule<piecewise_constant>);
static_assert(lr_schedule<exponential_decay>);
static_assert(lr_schedule<linear_scaling_warmup>);

}  // namespace dtf::optim
