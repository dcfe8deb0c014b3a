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

static_assert(lr_schedule<constant_schedule>);
static_assert(lr_schedule<piecewise_constant>);
static_assert(lr_schedule<exponential_decay>);
static_assert(lr_schedule<linear_scaling_warmup>);

}  // namespace dtf::optim
