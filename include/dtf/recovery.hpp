// dtf/recovery.hpp — carrying on after a parameter server dies and is restarted.
//
// With `dtfrun --max-restarts`, a task that dies is started again on the same address. What
// the other tasks then do (TensorFlow 1.x recreates the session; dtf recovers in place):
//
//   a worker   its request to the dead ps fails (errc::peer_failure or errc::timeout);
//              ps_recovery reconnects (retrying until the ps listens again, bounded by
//              transport_options::connect_timeout_ms), then waits, bounded, until every ps
//              is ready: a restarted ps is not, so the worker is held there while the chief
//              re-initialises it; then the caller's after_recovery runs (e.g. the strategy's
//              begin(), which pulls θ̃ afresh) and the failed operation runs again.
//   the chief  reconnects the same way; when a ps came back uninitialised it calls
//              `reinitialise` — typically ps_client::restore_latest, which restores *every* ps
//              from the latest checkpoint (the shards must agree on one step, as when
//              TensorFlow's chief restores after a ps failure) — then after_recovery and a
//              retry.
//   every task re-announces the tasks it knows to have reported done (ps_client::workers_done):
//              a restarted ps lost that set, and the chief's wait for the workers needs it.
//   a restarted worker    connects and waits for the ps like any worker at start, then trains
//                         (the session's scaffold: ps_scaffold in hooks/checkpoint_saver.hpp).
//   a restarted chief     restores every ps from the latest checkpoint (the scaffold's restore)
//                         and carries on from its global step.
//
// Errors that are not a lost peer or a timeout (a shape mismatch, a corrupt checkpoint) are
// not retried. After max_recoveries recoveries, or when a recovery itself fails for good
// (the ps never comes back within the connect timeout), the error propagates.
//
// Thread safety: like the ps_client it drives (one thread).
#pragma once

#include <dtf/error.hpp>
#include <dtf/ps.hpp>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

namespace dtf {

/// How often and how long ps_recovery tries.
struct recovery_options {
  int max_recoveries = 16;                         ///< per ps_recovery object
  std::chrono::milliseconds ready_timeout{120000};  ///< a worker waits this long for the chief's re-initialisation
  std::function<void(const std::string&)> log;     ///< one line per recovery; default: stderr
};

/// Carries a task on after a parameter server died and was restarted on the same address: run(f)
/// runs f and, when it fails with a lost peer or a timeout, reconnects, waits until every ps is
/// ready (the chief re-initialises a ps that came back empty), runs after_recovery and retries f,
/// at most max_recoveries times. One thread, like the ps_client it drives.
class ps_recovery {
 public:
  /// reinitialise: the chief's re-initialisation of a ps that came back empty (ignored on
  /// other tasks). after_recovery: runs after every recovery, before the retry (optional).
  ps_recovery(ps_client& ps, bool is_chief, std::function<void()> reinitialise, recovery_options o = {},
              std::function<void()> after_recovery = {})
      : ps_(ps),
        is_chief_(is_chief),
        reinitialise_(std::move(reinitialise)),
        after_recovery_(std::move(after_recovery)),
        options_(std::move(o)) {
    if (is_chief_ && !reinitialise_)
      throw error(errc::invalid_argument, "ps_recovery: the chief needs a re-initialisation");
  }

  /// Whether an error means a lost or restarted peer (worth a recovery).
  static bool recoverable(const error& e) noexcept {
    return e.code() == make_error_code(errc::peer_failure) || e.code() == make_error_code(errc::timeout);
  }

  /// Runs f(); when it fails with a recoverable error, recovers and runs it again.
  template <class F>
  decltype(auto) run(F&& f) {
    for (;;) {
      try {
        return f();
      } catch (const error& e) {
        if (!recoverable(e) || recoveries_ >= options_.max_recoveries) throw;
        log("lost a parameter server (" + std::string(e.what()) + "); recovering");
      }
      recover_until_done();
    }
  }

  /// Reconnects and, on the chief, re-initialises a ps that came back empty; elsewhere waits
  /// until every ps is ready. Then after_recovery.
  void recover() {
    ++recoveries_;
    ps_.reconnect();
    if (is_chief_) {
      if (!ps_.ready()) {
        log("a parameter server came back uninitialised; re-initialising from the latest checkpoint");
        reinitialise_();
        ++reinitialisations_;
      }
    } else {
      ps_.wait_ready(options_.ready_timeout);
    }
    // A restarted ps forgot which tasks reported done: tell it the ones this task knows of
    // (otherwise the chief would wait for a worker that finished before the ps died).
    ps_.workers_done();
    if (after_recovery_) after_recovery_();
    log("recovered (recovery " + std::to_string(recoveries_) + ")");
  }

  /// Recoveries made so far.
  int recoveries() const noexcept { return recoveries_; }
  /// Times the chief re-initialised the parameter servers.
  int reinitialisations() const noexcept { return reinitialisations_; }

 private:
  // A recovery may itself hit the lost peer (e.g. the ps died again): retried within the limit.
  void recover_until_done() {
    for (;;) {
      try {
        recover();
        return;
      } catch (const error& e) {
        if (!recoverable(e) || recoveries_ >= options_.max_recoveries) throw;
        log("recovery failed (" + std::string(e.what()) + "); trying again");
      }
    }
  }

  void log(const std::string& line) const {
    const std::string text = ps_.identity() + ": " + line;
    if (options_.log) options_.log(text);
    else std::fprintf(stderr, "%s\n", text.c_str());
  }

  ps_client& ps_;
  bool is_chief_;
  std::function<void()> reinitialise_, after_recovery_;
  recovery_options options_;
  int recoveries_ = 0, reinitialisations_ = 0;
};

}  // namespace dtf
