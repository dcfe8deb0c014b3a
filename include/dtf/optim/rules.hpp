// dtf/optim/rules.hpp — update rules as plain configuration structs.
//
// Each rule is an aggregate with documented defaults and an element-wise kernel used by
// dtf::optim::optimizer on any flat float buffer, on a worker's device or on a parameter
// server's host memory. The formulas are TensorFlow 1.x's (tf.train.*Optimizer).
//
// Weight decay is PyTorch's: `weight_decay` on sgd, momentum, adagrad and adam is the L2
// penalty folded into the gradient (g += wd p, torch.optim.SGD/Adagrad/Adam's weight_decay);
// adamw is Adam with decoupled weight decay (Loshchilov & Hutter 2019, torch.optim.AdamW:
// p *= 1 - lr wd before the Adam step, at this step's rate, default wd 0.01). At weight_decay
// 0 every rule computes exactly what it computed without the field.
#pragma once

#include <dtf/config.hpp>

#include <cmath>
#include <cstddef>
#include <string_view>
#include <variant>

namespace dtf::optim {

/// Plain SGD: p -= lr * g.
struct sgd {
  /// lr.
  float learning_rate = 0.01f;
  /// L2 penalty: g += weight_decay * p before the step (torch.optim.SGD's weight_decay).
  float weight_decay = 0.0f;
  /// Slot buffers the rule keeps beside the parameters.
  static constexpr std::size_t num_slots = 0;
  /// The rule's name (checkpoints, flags).
  static constexpr std::string_view name = "sgd";
};

/// Momentum (tf.train.MomentumOptimizer): v = mu v + g; p -= lr v, or with Nesterov
/// p -= lr (g + mu v).
struct momentum {
  /// lr.
  float learning_rate = 0.01f;
  float momentum = 0.9f;
  /// Nesterov momentum.
  bool nesterov = false;
  /// L2 penalty: g += weight_decay * p before the step (torch.optim.SGD's weight_decay).
  float weight_decay = 0.0f;
  /// Slot buffers the rule keeps beside the parameters (v).
  static constexpr std::size_t num_slots = 1;
  /// The rule's name (checkpoints, flags).
  static constexpr std::string_view name = "momentum";
};

/// Adagrad (Duchi et al. 2011): a += g^2; p -= lr g / (sqrt(a) + epsilon); a starts at
/// initial_accumulator (TensorFlow's default 0.1).
struct adagrad {
  /// lr.
  float learning_rate = 0.01f;
  /// The accumulator's initial value.
  float initial_accumulator = 0.1f;
  /// epsilon.
  float epsilon = 1e-7f;
  /// L2 penalty: g += weight_decay * p before the step (torch.optim.Adagrad's weight_decay).
  float weight_decay = 0.0f;
  /// Slot buffers the rule keeps beside the parameters (a).
  static constexpr std::size_t num_slots = 1;
  /// The rule's name (checkpoints, flags).
  static constexpr std::string_view name = "adagrad";
};

/// Adam (Kingma & Ba 2015), bias correction folded into the rate as in TensorFlow:
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps).
struct adam {
  /// lr.
  float learning_rate = 0.001f;
  /// b1.
  float beta1 = 0.9f;
  /// b2.
  float beta2 = 0.999f;
  /// eps.
  float epsilon = 1e-8f;
  /// L2 penalty: g += weight_decay * p before the step (torch.optim.Adam's weight_decay; for
  /// decoupled decay use adamw).
  float weight_decay = 0.0f;
  /// Slot buffers the rule keeps beside the parameters (m, v).
  static constexpr std::size_t num_slots = 2;
  /// The rule's name (checkpoints, flags).
  static constexpr std::string_view name = "adam";
};

/// AdamW (Loshchilov & Hutter 2019, torch.optim.AdamW): Adam's step (the same moments and
/// bias-corrected rate as adam) with decoupled weight decay, p *= 1 - lr wd first, lr this
/// step's rate (a schedule scales the decay with it, as in PyTorch).
struct adamw {
  /// lr.
  float learning_rate = 0.001f;
  /// b1.
  float beta1 = 0.9f;
  /// b2.
  float beta2 = 0.999f;
  /// eps.
  float epsilon = 1e-8f;
  /// Decoupled decay: p *= 1 - lr * weight_decay each step (PyTorch's default 0.01).
  float weight_decay = 0.01f;
  /// Slot buffers the rule keeps beside the parameters (m, v).
  static constexpr std::size_t num_slots = 2;
  /// The rule's name (checkpoints, flags).
  static constexpr std::string_view name = "adamw";
};

/// Any of the built-in rules (what a parameter server receives in its configuration).
using rule = std::variant<sgd, momentum, adagrad, adam, adamw>;

namespace detail {

// Element kernels: (param, grad, slot0, slot1) at index i with this step's rate. The rate
// is passed separately so that schedules can change it without touching the rule. wd: the L2
// penalty added to the gradient; keep (Adam): the decoupled decay's factor 1 - lr wd. Both
// skipped when off, so that a rule without decay rounds exactly as before (0 * inf is NaN).
struct sgd_kernel {
  float lr, wd = 0.0f;
  DTF_HD void operator()(float& p, float g, float*, float*, std::size_t) const {
    if (wd != 0.0f) g += wd * p;
    p -= lr * g;
  }
};
struct momentum_kernel {
  float lr, mu;
  bool nesterov;
  float wd = 0.0f;
  DTF_HD void operator()(float& p, float g, float* v, float*, std::size_t i) const {
    if (wd != 0.0f) g += wd * p;
    const float vi = mu * v[i] + g;
    v[i] = vi;
    p -= nesterov ? lr * (g + mu * vi) : lr * vi;
  }
};
struct adagrad_kernel {
  float lr, eps, wd = 0.0f;
  DTF_HD void operator()(float& p, float g, float* a, float*, std::size_t i) const {
    if (wd != 0.0f) g += wd * p;
    const float ai = a[i] + g * g;
    a[i] = ai;
    p -= lr * g / (sqrtf(ai) + eps);
  }
};
struct adam_kernel {
  float lr_t, b1, b2, eps, wd = 0.0f, keep = 1.0f;
  DTF_HD void operator()(float& p, float g, float* m, float* v, std::size_t i) const {
    if (wd != 0.0f) g += wd * p;
    if (keep != 1.0f) p *= keep;
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p -= lr_t * mi / (sqrtf(vi) + eps);
  }
};

/// An Adam-family rule's (adam, adamw) weight decay as adam_kernel takes it at rate lr: the L2
/// penalty wd (adam) and the decoupled factor keep = 1 - lr wd (adamw; computed in double).
///@{
inline float adam_l2(const adam& r) { return r.weight_decay; }
inline float adam_l2(const adamw&) { return 0.0f; }
inline float adam_keep(const adam&, float) { return 1.0f; }
inline float adam_keep(const adamw& r, float lr) { return float(1.0 - double(lr) * double(r.weight_decay)); }
///@}

/// Initial value of each slot of a rule.
inline float slot_initial_value(const rule& r) {
  if (auto* a = std::get_if<adagrad>(&r)) return a->initial_accumulator;
  return 0.0f;
}

inline std::size_t slot_count(const rule& r) {
  return std::visit([](const auto& x) { return std::decay_t<decltype(x)>::num_slots; }, r);
}

inline float base_learning_rate(const rule& r) {
  return std::visit([](const auto& x) { return x.learning_rate; }, r);
}

}  // namespace detail
}  // namespace dtf::optim

#include <dtf/error.hpp>
#include <string>

namespace dtf::optim {

/// The rule named `name` ("sgd", "momentum", "nesterov", "adagrad", "adam", "adamw") with
/// learning rate lr and every other setting at its default. Errors: errc::invalid_config
/// naming the unknown rule.
inline rule make_rule(std::string_view name, float lr) {
  if (name == "sgd") return sgd{.learning_rate = lr};
  if (name == "momentum") return momentum{.learning_rate = lr};
  if (name == "nesterov") return momentum{.learning_rate = lr, .nesterov = true};
  if (name == "adagrad") return adagrad{.learning_rate = lr};
  if (name == "adam") return adam{.learning_rate = lr};
  if (name == "adamw") return adamw{.learning_rate = lr};
  throw error(errc::invalid_config, "unknown optimizer '" + std::string(name) +
                                        "' (expected sgd, momentum, nesterov, adagrad, adam or adamw)");
}

}  // namespace dtf::optim
