// dtf/hooks/nan_tensor.hpp — watches the loss for NaN or infinity.
//
// After every step whose run_values carry a loss (or losses of earlier steps that reached the host
// through a loss ring: then the step named is the one whose loss it was): when it is not finite,
// either fail (throw
// nan_loss_error, so the session ends every hook with that error and rethrows it) or warn and
// stop the session cleanly (its checkpoint_saver then saves the last good state — note that
// with a ps the variables may already hold the diverged values).
#pragma once

#include <dtf/error.hpp>
#include <dtf/session.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace dtf::hooks {

/// The error a diverged loss raises (errc::corrupt_data: the numbers are no longer usable).
class nan_loss_error : public error {
 public:
  /// The loss `loss` at global step `step` is not finite.
  nan_loss_error(std::int64_t step, double loss)
      : error(errc::corrupt_data, "loss is " + std::string(std::isnan(loss) ? "NaN" : "infinite") + " at global step " +
                                      std::to_string(step) + ": training diverged"),
        step_(step) {}
  /// The global step at which the loss diverged.
  std::int64_t step() const noexcept { return step_; }

 private:
  std::int64_t step_;
};

/// What a nan_tensor hook does on a non-finite loss.
enum class nan_policy {
  fail,  ///< throw nan_loss_error
  stop,  ///< print a warning and request a stop
};

/// What a nan_tensor hook does on a non-finite loss.
struct nan_tensor_options {
  /// Fail or stop.
  nan_policy policy = nan_policy::fail;
  /// Where the stop policy's warning goes (default: stderr).
  std::function<void(const std::string&)> warn;
};

/// Hook: after every step whose run_values carry a loss, checks that it is finite; when not,
/// either throws nan_loss_error (the session ends with it) or warns and stops the session cleanly
/// (nan_policy).
class nan_tensor {
 public:
  /// Checks as `o` says.
  explicit nan_tensor(nan_tensor_options o = {}) : options_(std::move(o)) {}

  /// dtf::session_hook: after each step, with the step's values.
  void after_run(run_context& ctx, const run_values& v) {
    if (v.loss && !std::isfinite(*v.loss)) return diverged(ctx, ctx.global_step(), *v.loss);
    for (const auto& [step, loss] : v.landed_losses)
      if (!std::isfinite(loss)) return diverged(ctx, step, loss);  // the first bad one, by its own step
  }

  /// Times the stop policy fired.
  int stops() const noexcept { return stops_; }

 private:
  void diverged(run_context& ctx, std::int64_t step, double loss) {
    nan_loss_error e(step, loss);
    if (options_.policy == nan_policy::fail) throw e;
    ++stops_;
    const std::string line = std::string("warning: ") + e.message() + "; stopping";
    if (options_.warn) options_.warn(line);
    else std::fprintf(stderr, "%s\n", line.c_str());
    ctx.request_stop();
  }

  nan_tensor_options options_;
  int stops_ = 0;
};
static_assert(session_hook<nan_tensor>);

}  // namespace dtf::hooks
