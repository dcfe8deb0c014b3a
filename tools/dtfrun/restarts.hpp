// Restarts of failed tasks (--max-restarts, --restart_delay_ms): whether a task has one left,
// and taking a failed task down so that it can start again, with the same address and port.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>

#include "cluster.hpp"
#include "common.hpp"
#include "options.hpp"

namespace dtfrun {

inline bool restarts_left(const task& t, const restart_limits& limits) {
  return t.restarts < limits.for_job(t.job);
}

// " after 2 restarts" once a task was restarted; empty before.
inline std::string after_restarts(const task& t) {
  if (t.restarts == 0) return "";
  return " after " + std::to_string(t.restarts) + (t.restarts == 1 ? " restart" : " restarts");
}

// A failed task starts again after --restart_delay_ms (t.restart_at). Whatever it left in its
// process group would hold its port and its output pipes, so that goes first; then the zombie
// is reaped (its pid is no longer a group dtfrun signals).
inline void schedule_restart(task& t, bool is_chief, const options& opts) {
  const long long limit = opts.max_restarts.for_job(t.job);
  say(t.name + (is_chief ? " (chief)" : "") + " failed (" + t.end->describe() +
      "); restarting it (restart " + std::to_string(t.restarts + 1) + " of " +
      std::to_string(limit) + ")");
  ::kill(-t.pid, SIGKILL);
  int status = 0;
  ::waitpid(t.pid, &status, 0);
  t.pid = -1;
  ++t.restarts;
  t.restart_at = steady::now() + std::chrono::milliseconds(opts.restart_delay_ms);
}

}  // namespace dtfrun
