// dtf/hooks/feed_fn.hpp — prepares each step's input before it runs.
//
// Before every run it calls f(ctx); f stages the step's input (e.g. the next batch into a
// buffer the step reads). When f returns false the input is exhausted: the run is skipped
// (no step, no after_run) and the session stops. A callable returning void always feeds.
#pragma once

#include <dtf/session.hpp>

#include <type_traits>
#include <utility>

namespace dtf::hooks {

/// Hook: before every run calls f(ctx), which stages the step's input. When f returns false the
/// input is exhausted: the run is skipped and the session stops. A callable returning void always
/// feeds.
template <class F>
  requires std::is_invocable_v<F&, run_context&>
class feed_fn {
 public:
  /// Feeds each run through `f`.
  explicit feed_fn(F f) : f_(std::move(f)) {}

  /// dtf::session_hook: before each step.
  void before_run(run_context& ctx) {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, run_context&>>) {
      f_(ctx);
    } else {
      if (!static_cast<bool>(f_(ctx))) {
        ctx.skip_run();
        return;
      }
    }
    ++feeds_;
  }

  /// The runs fed so far.
  std::int64_t feeds() const noexcept { return feeds_; }

 private:
  F f_;
  std::int64_t feeds_ = 0;
};

}  // namespace dtf::hooks
