// The launcher: runs a cluster on this machine. It starts the tasks, relays their output,
// restarts failed tasks that have restarts left and decides when and how the job ends (the
// phases below), then tears the cluster down: SIGTERM, and SIGKILL 3 s later. Single-threaded;
// every event (output, a task ending, a signal to dtfrun, a deadline) arrives through one
// poll() call. The exit-status rules are those of `dtfrun --help`.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster.hpp"
#include "common.hpp"
#include "monitor.hpp"
#include "options.hpp"
#include "output.hpp"
#include "process.hpp"
#include "restarts.hpp"
#include "starter.hpp"

namespace dtfrun {

inline constexpr int exit_timeout = 124;

// How long tasks get between SIGTERM and SIGKILL, and after SIGKILL how long dtfrun waits
// for them to be gone and for their output pipes to close before it exits regardless.
inline constexpr std::chrono::milliseconds term_wait{3000};
inline constexpr std::chrono::milliseconds kill_wait{2000};

class launcher {
 public:
  using milliseconds = std::chrono::milliseconds;

  launcher(options opts, std::string program)
      : opts_(std::move(opts)),
        tasks_(plan_tasks(opts_)),
        chief_(opts_.chief ? find("chief") : find("worker")),
        monitor_(opts_.command, tasks_, *chief_),
        starter_(std::move(program), opts_.command) {}

  int run() {
    signal_fd_ = open_signal_fd(original_mask_);
    monitor_.start(opts_.live);
    if (start_all()) {
      phase_ = phase::running;
      if (opts_.timeout_s > 0) {
        job_deadline_ = steady::now() + std::chrono::seconds(opts_.timeout_s);
      }
    } else {
      exit_status_ = exit_failure;
      begin_terminate();
    }
    monitor_.refresh(phase_name());
    event_loop();
    finish();
    return exit_status_.value_or(exit_failure);
  }

 private:
  // running: waiting for the chief. stopping: the chief was asked to stop (first SIGINT).
  // grace: the chief has ended; the others may finish by themselves. terminating: SIGTERM
  // sent. killing: SIGKILL sent. done: dtfrun exits.
  enum class phase { running, stopping, grace, terminating, killing, done };

  task* find(std::string_view job) {
    for (task& t : tasks_) {
      if (t.job == job) return &t;
    }
    return nullptr;
  }

  std::string phase_name() const {
    switch (phase_) {
      case phase::running: return "running";
      case phase::stopping: return "stopping (chief asked to stop)";
      case phase::grace: return "chief ended";
      case phase::terminating: return "tearing down (SIGTERM)";
      case phase::killing: return "tearing down (SIGKILL)";
      case phase::done: return "done";
    }
    return "";
  }

  bool start_all() {
    if (!starter_.open(original_mask_)) return false;
    for (task& t : tasks_) {
      if (!start_task(t)) return false;
    }
    return true;
  }

  bool start_task(task& t) {
    const auto fds = starter_.start(t, tasks_, opts_.max_restarts.for_job(t.job) > 0);
    if (!fds) return false;
    pipes_.push_back(output_pipe{&t, (*fds)[0], STDOUT_FILENO, {}});
    pipes_.push_back(output_pipe{&t, (*fds)[1], STDERR_FILENO, {}});
    return true;
  }

  void event_loop() {
    std::vector<pollfd> fds;
    std::vector<output_pipe*> pipes;  // pipes[i] belongs to fds[i + 1]
    while (phase_ != phase::done) {
      fds.assign(1, pollfd{signal_fd_, POLLIN, 0});
      pipes.clear();
      for (output_pipe& p : pipes_) {
        fds.push_back(pollfd{p.fd, POLLIN, 0});
        pipes.push_back(&p);
      }
      const int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms());
      if (ready < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text(errno));
      if (ready > 0) {
        for (std::size_t i = 0; i < pipes.size(); ++i) {
          if (fds[i + 1].revents == 0) continue;
          if (auto text = read_lines(*pipes[i])) monitor_.print(pipes[i]->target_fd, *text, phase_name());
        }
        if (fds[0].revents != 0) read_signals();
      }
      pipes_.remove_if([](const output_pipe& p) { return p.fd < 0; });
      const phase before = phase_;
      advance();
      if (phase_ != before) monitor_.redraw(phase_name());
      if (steady::now() >= monitor_.next_refresh()) monitor_.refresh(phase_name());
    }
  }

  void read_signals() {
    signalfd_siginfo info{};
    bool child_ended = false;
    while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        child_ended = true;
      } else {
        on_dtfrun_signal(sig);
      }
    }
    // Signals coalesce, so one SIGCHLD may stand for several tasks; look at all of them.
    if (child_ended) collect_exits();
  }

  void on_dtfrun_signal(int sig) {
    if (sig == SIGINT && phase_ == phase::running && chief_->running) {
      // A stop request: the chief saves and ends the job; a second SIGINT kills everything.
      say("received SIGINT; asking " + chief_->name +
          " (chief) to stop with SIGTERM (SIGINT again kills every task)");
      exit_status_ = 128 + sig;
      phase_ = phase::stopping;
      ::kill(-chief_->pid, SIGTERM);
    } else if (phase_ == phase::running || phase_ == phase::grace ||
               (phase_ == phase::stopping && sig != SIGINT)) {
      say("received " + signal_name(sig) + "; tearing down the cluster");
      exit_status_ = 128 + sig;
      begin_terminate();
    } else if (phase_ == phase::terminating || phase_ == phase::stopping) {
      say("received " + signal_name(sig) + " again; killing the cluster");
      begin_kill();
    }
  }

  void collect_exits() {
    // The chief first: when it ends together with another task, the job result is the
    // chief's, not a "failure before the chief ended".
    if (chief_->running) check_exit(*chief_);
    for (task& t : tasks_) {
      if (t.running) check_exit(t);
    }
  }

  void check_exit(task& t) {
    const std::optional<task_end> end = child_ended(t.pid);
    if (!end) return;
    t.running = false;
    t.end = end;
    on_task_end(t);
  }

  void on_task_end(task& t) {
    decide_end(t);
    if (!t.restart_at) release_port(t);  // not starting again: its port goes with it
  }

  void decide_end(task& t) {
    const bool may_restart = phase_ == phase::running || phase_ == phase::stopping;
    if (&t == chief_) {
      if (phase_ == phase::running && t.end->failed() && restarts_left(t, opts_.max_restarts)) {
        schedule_restart(t, &t == chief_, opts_);
      } else if (phase_ == phase::running || phase_ == phase::stopping) {
        t.failed = phase_ == phase::running && t.end->failed();
        say(t.name + " (chief) ended (" + t.end->describe() + ")" + after_restarts(t) +
            (phase_ == phase::stopping ? " after the stop request" : ""));
        if (phase_ == phase::running) exit_status_ = t.end->shell_status();
        phase_ = phase::grace;
        deadline_ = steady::now() + milliseconds(opts_.grace_ms);
        for (task& other : tasks_) {
          other.restart_at.reset();
          release_port(other);  // no restart now: a down task's port refuses at once
        }
      }
      return;
    }
    if (!t.end->failed()) return;
    if (may_restart && restarts_left(t, opts_.max_restarts)) {
      schedule_restart(t, &t == chief_, opts_);
      return;
    }
    t.failed = phase_ != phase::terminating && phase_ != phase::killing;
    if (phase_ == phase::running && let_worker_fail(t)) return;
    if (phase_ == phase::running) {
      say(t.name + " failed (" + t.end->describe() + ")" + after_restarts(t) +
          allowance_used_up(t) + "; tearing down the cluster");
      exit_status_ = exit_failure;
      begin_terminate();
    } else if (phase_ == phase::stopping) {
      say(t.name + " failed (" + t.end->describe() + ")" + after_restarts(t) +
          " while the chief was stopping");
    } else if (phase_ == phase::grace) {
      say(t.name + " failed (" + t.end->describe() + ") after the chief ended");
    }
  }

  // --worker-failures-allowed: a worker (never the chief) that failed for good while fewer than
  // K have leaves the job running. Whatever it left in its process group is killed, as before
  // a restart; its zombie, reaped at the end, keeps the group id reserved for signal_all.
  bool let_worker_fail(task& t) {
    if (t.job != "worker" || worker_failures_ >= opts_.worker_failures_allowed) return false;
    ++worker_failures_;
    say(t.name + " failed (" + t.end->describe() + ")" + after_restarts(t) + "; " +
        std::to_string(worker_failures_) + " of " + std::to_string(opts_.worker_failures_allowed) +
        " allowed worker failures: the job goes on without it");
    ::kill(-t.pid, SIGKILL);
    return true;
  }

  // For the worker failure that tears the job down although some were allowed.
  std::string allowance_used_up(const task& t) const {
    const long long k = opts_.worker_failures_allowed;
    if (t.job != "worker" || k == 0) return "";
    return k == 1 ? "; the 1 allowed worker failure is used up"
                  : "; the " + std::to_string(k) + " allowed worker failures are used up";
  }

  // Starts the failed tasks whose restart delay is over.
  void start_due_restarts(steady::time_point now) {
    for (task& t : tasks_) {
      if (!t.restart_at || now < *t.restart_at) continue;
      if (!start_task(t)) {
        exit_status_ = exit_failure;
        begin_terminate();
        return;
      }
    }
  }

  bool all_quiet() const {
    if (!pipes_.empty()) return false;
    for (const task& t : tasks_) {
      if (t.running) return false;
    }
    return true;
  }

  std::string still_running() const {
    std::string names;
    for (const task& t : tasks_) {
      if (!t.running) continue;
      if (!names.empty()) names += ", ";
      names += t.name;
    }
    return names;
  }

  void signal_all(int sig) {
    // Every task's group, also of tasks that have ended: processes they left behind in it
    // go too. The zombie leader keeps each group id reserved (see check_exit).
    for (const task& t : tasks_) {
      if (t.pid > 0) ::kill(-t.pid, sig);
    }
  }

  void begin_terminate() {
    for (task& t : tasks_) t.restart_at.reset();
    phase_ = phase::terminating;
    deadline_ = steady::now() + term_wait;
    signal_all(SIGTERM);
  }

  void begin_kill() {
    for (task& t : tasks_) t.restart_at.reset();
    phase_ = phase::killing;
    deadline_ = steady::now() + kill_wait;
    signal_all(SIGKILL);
  }

  // Moves between phases on what has happened and on the clock, as far as it goes now: a
  // phase entered here may already be complete (everything ended before SIGKILL was sent).
  void advance() {
    phase before;
    do {
      before = phase_;
      advance_once();
    } while (phase_ != before);
  }

  void advance_once() {
    const auto now = steady::now();
    const bool expired = deadline_ && now >= *deadline_;
    switch (phase_) {
      case phase::running:
      case phase::stopping:
        if (job_deadline_ && now >= *job_deadline_) {
          say("job time limit of " + std::to_string(opts_.timeout_s) +
              " s reached; tearing down the cluster");
          exit_status_ = exit_timeout;
          begin_terminate();
        } else {
          start_due_restarts(now);
        }
        break;
      case phase::grace:
        if (all_quiet()) {
          // Everyone finished by themselves; SIGKILL only reaches leftovers in their groups.
          begin_kill();
        } else if (expired) {
          const std::string names = still_running();
          const std::string after = std::to_string(opts_.grace_ms) + " ms after the chief ended";
          say(names.empty()
                  ? "processes started by ended tasks still hold their output open " + after +
                        "; sending SIGTERM"
                  : names + " still running " + after + "; sending SIGTERM");
          begin_terminate();
        }
        break;
      case phase::terminating:
        if (all_quiet()) {
          begin_kill();
        } else if (expired) {
          const std::string names = still_running();
          if (!names.empty()) {
            say(names + " still running " + std::to_string(term_wait.count()) +
                " ms after SIGTERM; sending SIGKILL");
          }
          begin_kill();
        }
        break;
      case phase::killing:
        if (all_quiet()) {
          phase_ = phase::done;
        } else if (expired) {
          const std::string names = still_running();
          if (!names.empty()) say(names + " did not exit after SIGKILL; giving up on them");
          phase_ = phase::done;
        }
        break;
      case phase::done:
        break;
    }
  }

  int poll_timeout_ms() const {
    std::optional<steady::time_point> next = deadline_;
    if (phase_ == phase::running || phase_ == phase::stopping) {
      next = job_deadline_;
      for (const task& t : tasks_) {
        if (t.restart_at && (!next || *t.restart_at < *next)) next = t.restart_at;
      }
    }
    if (!next || monitor_.next_refresh() < *next) next = monitor_.next_refresh();
    const auto left = std::chrono::ceil<milliseconds>(*next - steady::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, 24LL * 3600 * 1000));
  }
  void finish() {
    // Whatever is still buffered in a pipe (only when the kill wait ran out) is printed, then
    // partial lines with the task's prefix.
    for (output_pipe& p : pipes_) {
      while (p.fd >= 0) {
        const std::optional<std::string> text = read_lines(p);
        if (!text) break;
        monitor_.print(p.target_fd, *text, phase_name());
      }
      if (p.fd >= 0) close_pipe(p);
    }
    pipes_.clear();
    monitor_.finish(phase_name());
    for (task& t : tasks_) {
      if (t.pid > 0) {
        int status = 0;
        ::waitpid(t.pid, &status, WNOHANG);
      }
    }
  }

  options opts_;
  std::vector<task> tasks_;  // never resized after construction: pipes and the monitor point into it
  task* chief_ = nullptr;
  job_monitor monitor_;
  task_starter starter_;
  std::list<output_pipe> pipes_;
  int signal_fd_ = -1;
  sigset_t original_mask_{};
  phase phase_ = phase::running;
  std::optional<steady::time_point> deadline_;      // of the current phase
  std::optional<steady::time_point> job_deadline_;  // --timeout_s, while running
  std::optional<int> exit_status_;
  long long worker_failures_ = 0;  // let go under --worker-failures-allowed
};

}  // namespace dtfrun
