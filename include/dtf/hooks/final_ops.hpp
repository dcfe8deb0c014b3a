// dtf/hooks/final_ops.hpp — runs a callable once when the session ends well.
//
// At end(ctx, status) with status ok, calls f(ctx) (or f()) and keeps its result (e.g. a final
// evaluation). On an error end it does nothing: the state is not trustworthy. Whatever f
// throws propagates out of close().
#pragma once

#include <dtf/session.hpp>

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace dtf::hooks {

namespace detail {
template <class F>
auto call_final(F& f, run_context& ctx) {
  if constexpr (std::is_invocable_v<F&, run_context&>) return f(ctx);
  else return f();
}
}  // namespace detail

/// Hook: when the session ends without error, calls f(ctx) (or f()) once and keeps its result
/// (e.g. a final evaluation). On an error end it does nothing. Whatever f throws propagates out
/// of close().
template <class F>
  requires std::is_invocable_v<F&, run_context&> || std::is_invocable_v<F&>
class final_ops {
 public:
  /// What the callable returns (void or a value kept by value()).
  using result_type = decltype(detail::call_final(std::declval<F&>(), std::declval<run_context&>()));

  /// Runs `f` when the session ends without error.
  explicit final_ops(F f) : f_(std::move(f)) {}

  /// dtf::session_hook: once, at close or on error (`status` carries the error).
  void end(run_context& ctx, const run_status& status) {
    if (!status.ok()) return;
    if constexpr (std::is_void_v<result_type>) {
      detail::call_final(f_, ctx);
      ran_ = true;
    } else {
      value_.emplace(detail::call_final(f_, ctx));
      ran_ = true;
    }
  }

  /// Whether the callable ran.
  bool ran() const noexcept { return ran_; }
  /// The callable's result (empty until it ran; only for non-void callables).
  const auto& value() const noexcept
    requires(!std::is_void_v<result_type>)
  {
    return value_;
  }

 private:
  struct none {};
  F f_;
  bool ran_ = false;
  std::conditional_t<std::is_void_v<result_type>, none, std::optional<result_type>> value_;
};

}  // namespace dtf::hooks
