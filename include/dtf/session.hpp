// dtf/session.hpp — monitored_training_session: runs a training step over and over with hooks.
//
// The session is TensorFlow's MonitoredTrainingSession for dtf. It runs a user-provided step
// callable (a ps strategy's worker step, or a plain local lambda) and calls hooks around it
// in TensorFlow's order:
//
//   create():  begin()                          every hook, in the order added
//              scaffold: chief -> restore from the latest checkpoint, or init when none;
//                        other tasks -> wait until the chief has made the variables ready
//              after_create_session(ctx)        every hook
//   run(step): before_run(ctx)                  every hook
//              values = step(ctx)
//              after_run(ctx, values)           every hook
//   close():   end(ctx, status)                 every hook, status ok
//
// Unlike TensorFlow, end(ctx, status) also runs when the step, a hook or the scaffold throws:
// status then carries the error, and the session rethrows it after every hook's end ran.
// A session destroyed while an exception unwinds the stack without close() calls end with an
// "abandoned" error status. Chief-only hooks (add_chief_hook) exist only on the chief: on
// other tasks none of their callbacks runs.
//
// Stopping: should_stop() is a latch. It turns true when a hook calls ctx.request_stop(),
// when request_stop() is called on the session (from any thread, or from a signal handler:
// it only stores to a lock-free atomic), or when the step callable itself requests it. The
// step in progress completes, its after_run hooks run, and the next run() does nothing.
//
// Hooks are any movable type with at least one of the optional members below, detected with
// `requires` (see the session_hook concept). Hooks are stored by value; add_hook returns a
// reference to the stored hook so that callers can read its results later.
//
// Thread safety: one thread drives create/run/close; request_stop() and should_stop() may be
// called from any thread or signal handler.
//
// Errors: whatever the step, hooks or scaffold throw (dtf::error for dtf's own failures)
// propagates out of create/run/close after end(ctx, status) ran on every hook.
#pragma once

#include <dtf/error.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dtf {

/// What one step produced, handed to every hook's after_run.
struct run_values {
  /// Global step after this step. Leave empty for a local step function: the session then
  /// counts one global step per run.
  std::optional<std::int64_t> global_step;
  /// Mean loss of the step's batch, when the step computes one (nan_tensor and logging read it).
  std::optional<double> loss;
  /// A step that leaves its loss on the device (dtf::defers_loss; `loss` is then empty): the
  /// losses of this and earlier steps that reached the host during this run, oldest first, each
  /// once, as (global step, loss) (dtf/train/loss_reads.hpp). The logging, summary and NaN hooks
  /// read them.
  std::vector<std::pair<std::int64_t, double>> landed_losses;
  /// Examples processed by this step (for examples/s).
  std::size_t examples = 0;
  /// Named scalars (e.g. "learning_rate", "staleness_mean", "dropped_gradients"); logged by
  /// the logging hook and written as TensorBoard scalars by summary_saver.
  std::map<std::string, double> scalars;
  /// Named value sets to summarise as histograms (e.g. variables). Filled by the step only
  /// when ctx.summaries_requested() (they are copies, so not every step).
  std::map<std::string, std::vector<float>> histograms;
};

/// How a session ended: ok, or the error that ended it.
class run_status {
 public:
  run_status() = default;
  /// The status of a session ended by `error` (ok when null).
  explicit run_status(std::exception_ptr error) : error_(std::move(error)) {
    if (!error_) return;
    try {
      std::rethrow_exception(error_);
    } catch (const std::system_error& e) {
      message_ = e.what();
      code_ = e.code();
    } catch (const std::exception& e) {
      message_ = e.what();
      code_ = make_error_code(errc::internal);
    } catch (...) {
      message_ = "unknown exception";
      code_ = make_error_code(errc::internal);
    }
  }
  /// Whether the session ended without error.
  bool ok() const noexcept { return !error_; }
  /// The error's what() ("" when ok).
  const std::string& message() const noexcept { return message_; }
  /// The error's code (dtf::error and std::system_error keep theirs; other exceptions map to
  /// errc::internal; empty when ok).
  std::error_code code() const noexcept { return code_; }
  /// The error (null when ok).
  std::exception_ptr exception() const noexcept { return error_; }

 private:
  std::exception_ptr error_;
  std::string message_;
  std::error_code code_;
};

/// What hooks and the step see of the session. Passed by reference to every callback after
/// begin(); valid for the session's lifetime.
class run_context {
 public:
  /// The latest global step the session knows: before the step in before_run, after the step
  /// in after_run; -1 before the scaffold ran.
  std::int64_t global_step() const noexcept { return global_step_; }
  /// Global step when the session was created (after restore): 0 for a fresh run.
  std::int64_t initial_global_step() const noexcept { return initial_global_step_; }
  /// Runs this session has completed (not counting the one in progress).
  std::int64_t local_step() const noexcept { return local_step_; }
  /// Whether this task is the chief.
  bool is_chief() const noexcept { return is_chief_; }
  /// Reads the global step afresh from its source (the scaffold's global_step, e.g. a ps),
  /// updating global_step(). Without a source it returns global_step().
  std::int64_t read_global_step() {
    if (read_global_step_) global_step_ = read_global_step_();
    return global_step_;
  }
  /// Ends the session after the current step (a latch; thread- and signal-safe).
  void request_stop() noexcept { stop_->store(true, std::memory_order_relaxed); }
  /// Whether a stop was requested.
  bool stop_requested() const noexcept { return stop_->load(std::memory_order_relaxed); }
  /// A before_run hook asks the step to fill run_values::histograms (and other costly values).
  void request_summaries() noexcept { summaries_requested_ = true; }
  /// Whether a hook requested summaries for this run.
  bool summaries_requested() const noexcept { return summaries_requested_; }
  /// A before_run hook cancels this run: the step is not called, no after_run runs, and the
  /// session stops (e.g. feed_fn when its input is exhausted).
  void skip_run() noexcept {
    skip_run_ = true;
    request_stop();
  }
  /// Whether a hook cancelled this run (skip_run()).
  bool run_skipped() const noexcept { return skip_run_; }

 private:
  friend class monitored_training_session;
  explicit run_context(std::atomic<bool>* stop) : stop_(stop) {}
  std::atomic<bool>* stop_;
  std::function<std::int64_t()> read_global_step_;
  std::int64_t global_step_ = -1, initial_global_step_ = 0, local_step_ = 0;
  bool is_chief_ = true, summaries_requested_ = false, skip_run_ = false;
};

/// session_hook: a type the session can call. Every member is optional; a hook must have at
/// least one. For `H h`, `run_context ctx`, `const run_values v`, `const run_status s`:
///   h.begin()                        before the session is created (no global step yet)
///   h.after_create_session(ctx)      after restore/init; ctx.global_step() is the start step
///   h.before_run(ctx)                before each step
///   h.after_run(ctx, v)              after each step, with the step's values
///   h.end(ctx, s)                    once, at close or on error (s carries the error)
/// A member with one of these names but a signature the session cannot call is a compile
/// error (see detail::check_hook) rather than a silently ignored callback.
template <class H>
concept session_hook = std::move_constructible<H> &&
    (requires(H& h) { h.begin(); } || requires(H& h, run_context& c) { h.after_create_session(c); } ||
     requires(H& h, run_context& c) { h.before_run(c); } ||
     requires(H& h, run_context& c, const run_values& v) { h.after_run(c, v); } ||
     requires(H& h, run_context& c, const run_status& s) { h.end(c, s); });

/// The scaffold: how the session creates its state. Every member is optional.
///   restore     chief: restores the latest checkpoint; returns its global step, or nullopt
///               when there is none (checkpoint.hpp provides one for ps clusters)
///   init        chief: initialises the variables from scratch (when restore gave nullopt)
///   wait_ready  other tasks: blocks (bounded) until the chief made the variables ready
///   global_step reads the current global step (e.g. from the ps); without it the session
///               counts runs from the restored step (or 0)
struct session_scaffold {
  /// Chief: restores the latest checkpoint; returns its global step, or nullopt when there is none.
  std::function<std::optional<std::int64_t>()> restore;
  /// Chief: initialises the variables from scratch (when restore gave nullopt).
  std::function<void()> init;
  /// Other tasks: blocks (bounded) until the chief made the variables ready.
  std::function<void()> wait_ready;
  /// Reads the current global step (e.g. from the ps); without it the session counts runs.
  std::function<std::int64_t()> global_step;
};

/// How a monitored_training_session starts: as the chief or not, and its scaffold.
struct session_options {
  /// Whether this task is the chief (restores or initialises; runs chief-only hooks).
  bool is_chief = true;
  /// How the session creates its state.
  session_scaffold scaffold;
};

namespace detail {

// A member named like a callback that the session cannot call is a user error worth a
// readable message (a typo'd signature would otherwise be ignored silently).
template <class H>
constexpr void check_hook() {
  if constexpr (requires { &H::begin; })
    static_assert(requires(H& h) { h.begin(); }, "hook: begin must be callable as h.begin()");
  if constexpr (requires { &H::after_create_session; })
    static_assert(requires(H& h, run_context& c) { h.after_create_session(c); },
                  "hook: after_create_session must be callable as h.after_create_session(dtf::run_context&)");
  if constexpr (requires { &H::before_run; })
    static_assert(requires(H& h, run_context& c) { h.before_run(c); },
                  "hook: before_run must be callable as h.before_run(dtf::run_context&)");
  if constexpr (requires { &H::after_run; })
    static_assert(requires(H& h, run_context& c, const run_values& v) { h.after_run(c, v); },
                  "hook: after_run must be callable as h.after_run(dtf::run_context&, const dtf::run_values&)");
  if constexpr (requires { &H::end; })
    static_assert(requires(H& h, run_context& c, const run_status& s) { h.end(c, s); },
                  "hook: end must be callable as h.end(dtf::run_context&, const dtf::run_status&)");
}

struct any_hook {
  virtual ~any_hook() = default;
  virtual void begin() = 0;
  virtual void after_create_session(run_context& c) = 0;
  virtual void before_run(run_context& c) = 0;
  virtual void after_run(run_context& c, const run_values& v) = 0;
  virtual void end(run_context& c, const run_status& s) = 0;
};

template <class H>
struct hook_holder final : any_hook {
  explicit hook_holder(H h) : hook(std::move(h)) {}
  void begin() override {
    if constexpr (requires { hook.begin(); }) hook.begin();
  }
  void after_create_session(run_context& c) override {
    if constexpr (requires { hook.after_create_session(c); }) hook.after_create_session(c);
  }
  void before_run(run_context& c) override {
    if constexpr (requires { hook.before_run(c); }) hook.before_run(c);
  }
  void after_run(run_context& c, const run_values& v) override {
    if constexpr (requires { hook.after_run(c, v); }) hook.after_run(c, v);
  }
  void end(run_context& c, const run_status& s) override {
    if constexpr (requires { hook.end(c, s); }) hook.end(c, s);
  }
  H hook;
};

}  // namespace detail

/// Runs steps with hooks; see the file comment for the call order and guarantees.
///
///   dtf::monitored_training_session sess({.is_chief = chief, .scaffold = {...}});
///   sess.add_hook(dtf::hooks::stop_at_step({.last_step = 1000}));
///   sess.add_chief_hook(dtf::hooks::logging({.every_n_steps = 100}));
///   sess.train([&](dtf::run_context& ctx) { ...; return dtf::run_values{...}; });
///
/// or, keeping the loop in the caller: sess.create(); while (!sess.should_stop()) sess.run(step);
/// sess.close();
class monitored_training_session {
 public:
  /// A session configured by `options`; create() (or train()) starts it.
  explicit monitored_training_session(session_options options = {})
      : options_(std::move(options)), ctx_(&stop_) {
    ctx_.is_chief_ = options_.is_chief;
    ctx_.read_global_step_ = options_.scaffold.global_step;
  }
  monitored_training_session(const monitored_training_session&) = delete;
  monitored_training_session& operator=(const monitored_training_session&) = delete;

  /// Ends the hooks with an "abandoned" error status if the session was created but neither
  /// closed nor ended by an error (e.g. an exception thrown by the caller's own loop code).
  ~monitored_training_session() {
    if (state_ != state::created) return;
    try {
      throw error(errc::internal, std::uncaught_exceptions() > 0
                                      ? "session abandoned while an exception propagated"
                                      : "session destroyed without close()");
    } catch (...) {
      end_hooks(run_status(std::current_exception()));
    }
  }

  /// Adds a hook that runs on every task. Returns a reference to the stored hook (stable for
  /// the session's lifetime). Hooks can only be added before create().
  template <class H>
    requires session_hook<std::remove_cvref_t<H>>
  std::remove_cvref_t<H>& add_hook(H&& hook) {
    return add(std::forward<H>(hook), true);
  }
  /// Adds a hook that runs only on the chief. On other tasks the hook is stored but never
  /// called; the reference stays valid.
  template <class H>
    requires session_hook<std::remove_cvref_t<H>>
  std::remove_cvref_t<H>& add_chief_hook(H&& hook) {
    return add(std::forward<H>(hook), options_.is_chief);
  }

  /// begin, scaffold (restore/init or wait_ready), after_create_session. On error: end(error)
  /// on every hook, then rethrow.
  void create() {
    if (state_ != state::fresh) throw error(errc::invalid_argument, "monitored_training_session: create() called twice");
    state_ = state::created;
    guarded([&] {
      for (auto* h : active_) h->begin();
      const auto& sc = options_.scaffold;
      std::optional<std::int64_t> restored;
      if (options_.is_chief) {
        if (sc.restore) restored = sc.restore();
        if (!restored && sc.init) sc.init();
      } else if (sc.wait_ready) {
        sc.wait_ready();
      }
      if (sc.global_step) ctx_.global_step_ = sc.global_step();
      else ctx_.global_step_ = restored.value_or(0);
      ctx_.initial_global_step_ = ctx_.global_step_;
      for (auto* h : active_) h->after_create_session(ctx_);
    });
  }

  /// True once a stop was requested (by a hook, the step, request_stop()) or the session
  /// ended.
  bool should_stop() const noexcept { return state_ != state::created || stop_.load(std::memory_order_relaxed); }
  /// Requests a stop after the current step. Thread-safe and async-signal-safe.
  void request_stop() noexcept { stop_.store(true, std::memory_order_relaxed); }

  /// One step: before_run, step(ctx), after_run. Does nothing when should_stop(). Step must be
  /// callable as step(run_context&) returning run_values (or void: an empty run_values).
  template <class Step>
  void run(Step&& step) {
    if (state_ == state::fresh) create();
    if (should_stop()) return;
    guarded([&] {
      ctx_.summaries_requested_ = false;
      ctx_.skip_run_ = false;
      for (auto* h : active_) h->before_run(ctx_);
      if (ctx_.skip_run_) return;
      run_values v;
      if constexpr (std::is_void_v<std::invoke_result_t<Step&, run_context&>>) step(ctx_);
      else v = step(ctx_);
      if (v.global_step) ctx_.global_step_ = *v.global_step;
      else if (ctx_.read_global_step_) ctx_.global_step_ = ctx_.read_global_step_();
      else ctx_.global_step_ += 1;
      v.global_step = ctx_.global_step_;
      for (auto* h : active_) h->after_run(ctx_, v);
      ++ctx_.local_step_;
    });
  }

  /// end(ctx, ok) on every hook. Idempotent; does nothing after an error ended the session.
  void close() {
    if (state_ != state::created) {
      state_ = state_ == state::fresh ? state::closed : state_;
      return;
    }
    end_hooks(run_status{});
  }

  /// create(); run(step) until should_stop(); close(). Returns the final global step.
  template <class Step>
  std::int64_t train(Step&& step) {
    if (state_ == state::fresh) create();
    while (!should_stop()) run(step);
    close();
    return ctx_.global_step_;
  }

  /// What hooks and the step see of the session.
  const run_context& context() const noexcept { return ctx_; }
  /// The latest global step the session knows.
  std::int64_t global_step() const noexcept { return ctx_.global_step_; }
  /// Whether this task is the chief.
  bool is_chief() const noexcept { return options_.is_chief; }

 private:
  enum class state { fresh, created, closed };

  template <class H>
  std::remove_cvref_t<H>& add(H&& hook, bool active) {
    using T = std::remove_cvref_t<H>;
    detail::check_hook<T>();
    if (state_ != state::fresh)
      throw error(errc::invalid_argument, "monitored_training_session: hooks must be added before create()");
    auto holder = std::make_unique<detail::hook_holder<T>>(T(std::forward<H>(hook)));
    T& ref = holder->hook;
    if (active) active_.push_back(holder.get());
    hooks_.push_back(std::move(holder));
    return ref;
  }

  // Runs f; on an exception ends every hook with it as status and rethrows.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      auto e = std::current_exception();
      end_hooks(run_status(e));
      std::rethrow_exception(e);
    }
  }

  // Calls end on every active hook even if one throws; rethrows the first such error when the
  // session otherwise ended well (an error ending the session takes precedence).
  void end_hooks(const run_status& status) {
    state_ = state::closed;
    stop_.store(true, std::memory_order_relaxed);
    std::exception_ptr first;
    for (auto* h : active_) {
      try {
        h->end(ctx_, status);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first && status.ok()) std::rethrow_exception(first);
  }

  session_options options_;
  std::atomic<bool> stop_{false};
  run_context ctx_;
  std::vector<std::unique_ptr<detail::any_hook>> hooks_;
  std::vector<detail::any_hook*> active_;
  state state_ = state::fresh;
};

static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");

}  // namespace dtf
