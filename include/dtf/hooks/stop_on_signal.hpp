// dtf/hooks/stop_on_signal.hpp — SIGTERM and SIGINT as a clean stop request.
//
//   dtf::monitored_training_session session(...);
//   dtf::hooks::stop_on_signal signals(session);   // while alive: a signal asks the session to stop
//
// The first SIGTERM or SIGINT requests a stop: the step in progress completes and the session
// ends as it would at its last step (the chief checkpoints at the end). A second signal ends
// the process at once with the default action. With direct = false the handler only counts
// the signal (stopped_by_signal()) and leaves the stop to the caller — a collective job agrees
// on it with every rank first (dtf/hooks/agreed_stop.hpp).
//
// One instance per process at a time; the previous handlers come back when it is destroyed.
// The handler is async-signal-safe (atomics, write(2), signal(), raise()).
#pragma once

#include <dtf/session.hpp>

#include <atomic>
#include <csignal>

#include <unistd.h>

namespace dtf::hooks {

namespace detail {
inline std::atomic<monitored_training_session*> signal_session{nullptr};
inline std::atomic<int> signals_seen{0};

extern "C" inline void on_stop_signal(int sig) {
  if (signals_seen.fetch_add(1) > 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (auto* s = signal_session.load()) s->request_stop();
  static const char msg[] = "stop requested by signal: finishing the current step\n";
  [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
}
}  // namespace detail

/// Routes SIGTERM and SIGINT to session.request_stop() while alive (or only counts them,
/// direct = false); restores the previous handlers when destroyed.
class stop_on_signal {
 public:
  /// Installs the handlers for session `s` (direct = false: only counts the signals).
  explicit stop_on_signal(monitored_training_session& s, bool direct = true) {
    detail::signals_seen = 0;
    detail::signal_session = direct ? &s : nullptr;
    old_term_ = std::signal(SIGTERM, detail::on_stop_signal);
    old_int_ = std::signal(SIGINT, detail::on_stop_signal);
  }
  ~stop_on_signal() {
    std::signal(SIGTERM, old_term_);
    std::signal(SIGINT, old_int_);
    detail::signal_session = nullptr;
  }
  stop_on_signal(const stop_on_signal&) = delete;
  stop_on_signal& operator=(const stop_on_signal&) = delete;

  /// Whether SIGTERM or SIGINT asked this process to stop since the last instance was made.
  static bool stopped_by_signal() noexcept { return detail::signals_seen.load() > 0; }

 private:
  void (*old_term_)(int) = SIG_DFL;
  void (*old_int_)(int) = SIG_DFL;
};

}  // namespace dtf::hooks
