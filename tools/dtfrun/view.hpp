// What dtfrun shows about a running job: a table with a line per task (state, restarts,
// step, steps/s, loss, CPU %, resident memory) and a progress bar of the chief's step
// towards its last step. The launcher redraws it at the bottom of a terminal (the live view)
// and writes it as JSON to a state file about once a second; `dtfrun status` reads that file
// from another shell and prints the same table once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtfrun {

struct task_view {
  std::string name;   // "worker.1"
  std::string state;  // "running", "exited 0", "failed (exit status 3)", "restarting", ...
  long long restarts = 0;
  pid_t pid = -1;
  // From the task's output: the latest step=, last_step=, loss=, steps_per_sec= tokens.
  std::optional<long long> step;
  std::optional<long long> last_step;
  std::optional<double> loss;
  std::optional<double> steps_per_sec;
  // Of the task's process group, from /proc (absent once it has ended).
  std::optional<double> cpu_percent;
  std::optional<long long> rss_bytes;
};

struct job_view {
  pid_t dtfrun_pid = -1;
  std::string command;  // the tasks' command line, for the title
  std::string phase;    // "running", "stopping", "chief ended", "tearing down", "done"
  double elapsed_s = 0.0;
  std::string chief;  // name of the chief task
  std::vector<task_view> tasks;
};

// Reads step=, last_step=, loss= and steps_per_sec= tokens (separated by white space) from
// one output line into `t`; other tokens are ignored. Returns whether any was found.
bool parse_progress_tokens(std::string_view line, task_view& t);

// The table, one string per line without newlines, each cut to `width` columns (0: no limit).
std::vector<std::string> render_table(const job_view& job, std::size_t width);

// `text` as a JSON string literal, quotes included (in the state file, and in TF_CONFIG).
// Bytes that are not UTF-8 become U+FFFD: a reader would refuse the whole document.
std::string json_string(std::string_view text);

// The state file's JSON and back (throws std::runtime_error on malformed text).
std::string to_json(const job_view& job);
job_view job_view_from_json(std::string_view text);

// Where state files live: $XDG_RUNTIME_DIR/dtfrun when that is set, else /tmp/dtfrun-<uid>.
std::string state_directory();

// Writes `text` to `path` through a temporary file renamed into place. False on failure.
bool write_file_atomically(const std::string& path, std::string_view text);

// CPU time and resident memory of every process in a process group, summed, from /proc.
struct group_usage {
  double cpu_seconds = 0.0;
  long long rss_bytes = 0;
  bool found = false;  // some process of the group was still there
};
std::vector<group_usage> sample_groups(const std::vector<pid_t>& groups);

// `dtfrun status [PID]`.
int status_main(int argc, char** argv);

}  // namespace dtfrun
