// What the launcher shows of its running job (see view.hpp for the table itself): the live
// view, redrawn at the bottom of the terminal below the tasks' lines, and the state file that
// `dtfrun status` reads, rewritten about once a second with fresh CPU and memory figures.
#pragma once

#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster.hpp"
#include "common.hpp"
#include "view.hpp"

namespace dtfrun {

// How often the state file is rewritten and CPU/memory figures are sampled.
inline constexpr std::chrono::milliseconds refresh_interval{1000};

// Whether a flag's value is a secret to keep out of the view, the state file and `dtfrun
// status`: its name says secret, password, passwd or token, and it does not name a file.
inline bool secret_bearing_flag(std::string_view name) {
  while (name.starts_with('-')) name.remove_prefix(1);
  if (name.ends_with("_file") || name.ends_with("-file")) return false;
  for (const std::string_view word : {"secret", "password", "passwd", "token"})
    if (name.find(word) != std::string_view::npos) return true;
  return false;
}

// The command line as the view shows it: the values of secret-bearing flags (--secret X,
// --secret=X) replaced by "***".
inline std::string masked_command_line(const std::vector<std::string>& command) {
  std::string out;
  bool mask_next = false;
  for (const std::string& word : command) {
    std::string shown = word;
    if (mask_next) {
      shown = "***";
      mask_next = false;
    } else if (word.starts_with("-")) {
      const auto eq = word.find('=');
      if (secret_bearing_flag(std::string_view(word).substr(0, eq)))
        eq == std::string::npos ? void(mask_next = true) : void(shown = word.substr(0, eq + 1) + "***");
    }
    out += (out.empty() ? "" : " ") + shown;
  }
  return out;
}

// Reads the launcher's tasks and is told the job's phase; it writes only the tasks' CPU and
// memory figures. Not thread-safe (the launcher is single-threaded).
class job_monitor {
 public:
  // `tasks` (never resized) and `chief` are the launcher's and outlive the monitor.
  job_monitor(const std::vector<std::string>& command, std::vector<task>& tasks, const task& chief)
      : tasks_(tasks), chief_(chief), command_(masked_command_line(command)) {}

  // At the job's start: the clock starts, the live view is on when `live` says so (unset: when
  // stdout is a terminal that is not "dumb") and the state file is chosen.
  void start(std::optional<bool> live) {
    started_ = steady::now();
    live_ = live.value_or(::isatty(STDOUT_FILENO) == 1 && !dumb_terminal());
    open_state_file();
  }

  steady::time_point next_refresh() const { return next_refresh_; }

  // Samples CPU and memory, rewrites the state file and redraws the live view.
  void refresh(std::string_view phase) {
    const auto now = steady::now();
    std::vector<pid_t> groups;
    for (const task& t : tasks_) groups.push_back(t.running ? t.pid : -1);
    const std::vector<group_usage> usage = sample_groups(groups);
    const double interval_s =
        last_sample_ ? std::chrono::duration<double>(now - *last_sample_).count() : 0.0;
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      task& t = tasks_[i];
      if (!t.running || !usage[i].found) {
        t.cpu_seconds.reset();
        continue;
      }
      if (t.cpu_seconds && interval_s > 0.05) {
        t.view.cpu_percent = std::max(0.0, 100.0 * (usage[i].cpu_seconds - *t.cpu_seconds) / interval_s);
      }
      t.cpu_seconds = usage[i].cpu_seconds;
      t.view.rss_bytes = usage[i].rss_bytes;
    }
    last_sample_ = now;
    next_refresh_ = now + refresh_interval;
    if (!state_path_.empty()) write_file_atomically(state_path_, to_json(snapshot(phase)));
    redraw(phase);
  }

  void redraw(std::string_view phase) {
    if (live_) console::get().set_footer(footer(phase));
  }

  // Prints a task's lines to `fd`; in the live view, the footer is redrawn below them, with
  // the figures they brought.
  void print(int fd, const std::string& text, std::string_view phase) {
    if (live_) {
      const auto lines = footer(phase);
      console::get().log(fd, text, &lines);
    } else {
      write_all(fd, text);
    }
  }

  // At the job's end: the state file goes; the last table stays on the screen.
  void finish(std::string_view phase) {
    if (!state_path_.empty()) ::unlink(state_path_.c_str());
    if (live_) {
      redraw(phase);
      console::get().keep_footer();
    }
  }

 private:
  static bool dumb_terminal() {
    const char* term = std::getenv("TERM");
    return term == nullptr || std::string_view(term) == "dumb";
  }

  static std::string task_state(const task& t) {
    if (t.running) return "running";
    if (t.restart_at) return "restarting";
    if (!t.end) return "not started";
    if (t.failed) return "failed (" + t.end->describe() + ")";
    return t.end->failed() ? t.end->describe() : "done";
  }

  job_view snapshot(std::string_view phase) const {
    job_view job;
    job.dtfrun_pid = ::getpid();
    job.command = command_;
    job.phase = phase;
    job.elapsed_s = std::chrono::duration<double>(steady::now() - started_).count();
    job.chief = chief_.name;
    for (const task& t : tasks_) {
      task_view v = t.view;
      v.name = t.name;
      v.state = task_state(t);
      v.restarts = t.restarts;
      v.pid = t.pid;
      if (!t.running) {
        v.cpu_percent.reset();
        v.rss_bytes.reset();
      }
      job.tasks.push_back(std::move(v));
    }
    return job;
  }

  // The live view's table, cut to the terminal: lines one column short of its width (so
  // the cursor never wraps), and with more tasks than rows, the rows that fit and a line
  // that says how many are left out (the cursor cannot move above the screen's top).
  std::vector<std::string> footer(std::string_view phase) const {
    winsize size{};
    std::size_t width = 79, height = 24;
    if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0) {
      if (size.ws_col > 1) width = size.ws_col - 1u;
      if (size.ws_row > 0) height = size.ws_row;
    }
    std::vector<std::string> lines = render_table(snapshot(phase), width);
    const std::size_t max_lines = std::max<std::size_t>(height, 6) - 2;
    if (lines.size() > max_lines) {
      // Title and header, the first task rows, the count of the others, the chief's bar.
      const std::size_t rows_kept = max_lines - 4;
      const std::size_t left_out = lines.size() - 3 - rows_kept;
      std::string bar = lines.back();
      lines.resize(2 + rows_kept);
      lines.push_back("... " + std::to_string(left_out) + " more tasks (dtfrun status shows all)");
      lines.push_back(std::move(bar));
    }
    return lines;
  }

  void open_state_file() {
    const std::string dir = state_directory();
    // Only this user may read the job's table (it holds the command line).
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return;
    struct stat info {};
    if (::lstat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != ::getuid() ||
        (info.st_mode & 077) != 0)
      return;
    state_path_ = dir + "/" + std::to_string(::getpid()) + ".json";
  }

  std::vector<task>& tasks_;
  const task& chief_;
  std::string command_;  // the tasks' command line, for the table's title
  bool live_ = false;
  std::string state_path_;  // empty: no state file
  steady::time_point started_;
  steady::time_point next_refresh_;
  std::optional<steady::time_point> last_sample_;
};

}  // namespace dtfrun
