// dtf/strategies/staleness_watch.hpp — the chief's watch for an asynchronous update made unstable
// by staleness: the loss rising over a window of steps while the staleness of the pushes grows.
//
// The steps are cut into windows of `window_steps`; for each window the watch keeps the mean
// loss and the mean staleness of the pushes made in it. When a window's mean loss exceeds the
// previous window's by more than `rise` (relative) while its mean staleness exceeds the previous
// window's, the watch returns, once per run, a message naming the scheme's setting to change.
// Thread safety: none (one per worker, called from its training loop).
#pragma once

#include <dtf/strategies/async.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace dtf::strategies {

/// staleness_watch's knobs.
/// The defaults catch the divergence of an asynchronous job within its first tens of steps,
/// when workers join and staleness climbs, and ignore the batch-to-batch noise of a loss.
struct staleness_watch_config {
  std::size_t window_steps = 10;  ///< steps per window
  double rise = 0.5;              ///< relative rise of the mean loss from one window to the next
};

/// Watches one worker's losses and push staleness (see the header comment).
class staleness_watch {
 public:
  /// `setting`: what the user should change, named in the message (e.g. "--lr (hogwild_config::
  /// learning_rate)"). Errors: errc::invalid_config when window_steps is 0 or rise is not positive.
  explicit staleness_watch(std::string setting, staleness_watch_config c = {})
      : setting_(std::move(setting)), c_(c) {
    if (c_.window_steps == 0 || !(c_.rise > 0.0))
      throw error(errc::invalid_config, "staleness_watch: window_steps and rise must be positive");
  }

  /// Records one step: its loss, and the worker's staleness statistics after it. Returns the
  /// warning the first time the loss rose while the staleness grew; nothing otherwise.
  std::optional<std::string> record(double loss, const staleness_stats& st) {
    if (std::isfinite(loss)) {
      loss_sum_ += loss;
      ++losses_;
    }
    if (++steps_ < c_.window_steps) return std::nullopt;
    const std::uint64_t pushes = st.pushes - pushes_at_;
    const window now{losses_ ? loss_sum_ / double(losses_) : 0.0,
                     pushes ? double(st.sum - sum_at_) / double(pushes) : 0.0, losses_ > 0 && pushes > 0};
    steps_ = losses_ = 0;
    loss_sum_ = 0.0;
    pushes_at_ = st.pushes;
    sum_at_ = st.sum;
    const window before = last_;
    last_ = now;
    ++windows_;
    if (warned_ || !before.valid || !now.valid) return std::nullopt;
    if (!(now.loss > before.loss * (1.0 + c_.rise) && now.staleness > before.staleness)) return std::nullopt;
    warned_ = true;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "the training loss rose from %.4g to %.4g over the last %zu steps while the staleness of the "
                  "pushes grew from %.2f to %.2f: the update is unstable at this staleness; change ",
                  before.loss, now.loss, c_.window_steps, before.staleness, now.staleness);
    return std::string(buf) + setting_ + " (this warning is printed once)";
  }

  /// Whether the warning has been given.
  bool warned() const noexcept { return warned_; }
  /// Windows completed so far.
  std::size_t windows() const noexcept { return windows_; }

 private:
  struct window {
    double loss = 0.0, staleness = 0.0;
    bool valid = false;
  };
  std::string setting_;
  staleness_watch_config c_;
  std::size_t steps_ = 0, losses_ = 0, windows_ = 0;
  double loss_sum_ = 0.0;
  std::uint64_t pushes_at_ = 0, sum_at_ = 0;
  window last_;
  bool warned_ = false;
};

/// The setting a user should change when strategy `s` is unstable at the measured staleness:
/// s.stability_setting() where the strategy names one, else a generic advice.
template <class S>
std::string stability_setting_of(const S& s) {
  if constexpr (requires { std::string(s.stability_setting()); })
    return std::string(s.stability_setting());
  else
    return "the strategy's learning rate (lower it), or use fewer workers";
}

}  // namespace dtf::strategies
