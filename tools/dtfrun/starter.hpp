// Starting a cluster's tasks: each runs the command with dtfrun's environment plus its own
// TF_CONFIG, DTF_TASK=<job>.<index>, DTF_RESTART_COUNT and DTF_LISTEN_FD (the listening socket
// it inherits), stdin from /dev/null and its stdout and stderr into pipes that dtfrun reads.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dtf/transport/credentials.hpp>

#include "cluster.hpp"
#include "common.hpp"
#include "process.hpp"

extern char** environ;

namespace dtfrun {

class task_starter {
 public:
  // `program` is the command's program as resolve_command found it.
  task_starter(std::string program, std::vector<std::string> command)
      : program_(std::move(program)), command_(std::move(command)) {}
  task_starter(const task_starter&) = delete;
  task_starter& operator=(const task_starter&) = delete;
  ~task_starter() {
    if (dev_null_ >= 0) ::close(dev_null_);
  }

  // Takes dtfrun's environment (less the variables each task gets its own value of, and the
  // credentials) and opens /dev/null; the tasks get `original_mask`, dtfrun's signal mask from
  // before it blocked the signals it reads. False, after a message, when /dev/null cannot be
  // opened or the master secret is too short.
  bool open(const sigset_t& original_mask) {
    original_mask_ = original_mask;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view entry = *e;
      if (entry.starts_with("DTF_CLUSTER_SECRET=")) {
        master_ = std::string(entry.substr(entry.find('=') + 1));
        continue;
      }
      if (entry.starts_with("TF_CONFIG=") || entry.starts_with("DTF_TASK=") ||
          entry.starts_with("DTF_RESTART_COUNT=") || entry.starts_with("DTF_LISTEN_FD=") ||
          entry.starts_with("DTF_TASK_KEY=") || entry.starts_with("DTF_RING_KEY=") ||
          entry.starts_with("DTF_LOCAL_RANK=") || entry.starts_with("DTF_LOCAL_SIZE=")) {
        continue;
      }
      base_env_.emplace_back(entry);
    }
    if (!master_.empty() && master_.size() < dtf::min_secret_bytes) {
      say("$DTF_CLUSTER_SECRET has " + std::to_string(master_.size()) + " bytes; at least " +
          std::to_string(dtf::min_secret_bytes) + " are required (e.g. openssl rand -hex 32)");
      return false;
    }
    dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (dev_null_ < 0) {
      say("cannot open /dev/null: " + errno_text(errno));
      return false;
    }
    return true;
  }

  // Starts `t` (again, after a failure) as a member of `tasks`; returns the read ends of its
  // stdout and stderr pipes (non-blocking), or nothing after a message saying why it could not
  // start. Without `keep_port` (no restarts) the task alone holds its listening socket.
  std::optional<std::array<int, 2>> start(task& t, const std::vector<task>& tasks, bool keep_port) {
    std::vector<std::string> env = base_env_;
    env.push_back("TF_CONFIG=" + tf_config_for(tasks, t));
    env.push_back("DTF_TASK=" + t.name);
    env.push_back("DTF_RESTART_COUNT=" + std::to_string(t.restarts));
    if (t.listen_fd >= 0) env.push_back("DTF_LISTEN_FD=" + std::to_string(t.listen_fd));
    // The training tasks' local ranks (chief first, then the workers), from which each picks a
    // GPU of its own (dtf/device/select.hpp); a ps or an evaluator trains nothing and gets none.
    if (t.job == "chief" || t.job == "worker") {
      int rank = -1, size = 0;
      for (const task& other : tasks)
        if (other.job == "chief" || other.job == "worker") {
          if (&other == &t || other.name == t.name) rank = size;
          ++size;
        }
      env.push_back("DTF_LOCAL_RANK=" + std::to_string(rank));
      env.push_back("DTF_LOCAL_SIZE=" + std::to_string(size));
    }
    // Each task gets only the credential it needs (docs/design/identity.md): a ps the master
    // secret, any other task its own key and the ring key, so that it can present no other name.
    if (!master_.empty()) {
      if (t.name.starts_with("ps.")) {
        env.push_back("DTF_CLUSTER_SECRET=" + master_);
      } else {
        env.push_back("DTF_TASK_KEY=" + dtf::derive_task_key(master_, t.name));
        env.push_back("DTF_RING_KEY=" + dtf::derive_ring_key(master_));
      }
    }

    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
      say("cannot create a pipe for " + t.name + ": " + errno_text(errno));
      return std::nullopt;
    }
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      say("cannot create a pipe for " + t.name + ": " + errno_text(errno));
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      return std::nullopt;
    }
    const spawned child = spawn(program_, command_, std::move(env),
                                child_fds{dev_null_, out_pipe[1], err_pipe[1], t.listen_fd},
                                original_mask_, "dtfrun");
    if (child.pid < 0) {
      say("cannot start " + t.name + ": fork: " + errno_text(child.error));
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
      return std::nullopt;
    }
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    // Non-blocking read ends let the final drain stop at "no more data" instead of waiting.
    for (int fd : {out_pipe[0], err_pipe[0]}) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    t.pid = child.pid;
    t.running = true;
    // A dead task's port then refuses at once.
    if (!keep_port) release_port(t);
    t.cpu_seconds.reset();
    t.view.cpu_percent.reset();
    t.end.reset();
    t.restart_at.reset();
    say((t.restarts == 0 ? "started " : "restarted ") + t.name + " (pid " +
        std::to_string(child.pid) + ")" + (t.address.empty() ? "" : " at " + t.address) +
        (t.restarts == 0 ? "" : ", restart " + std::to_string(t.restarts)));
    return std::array<int, 2>{out_pipe[0], err_pipe[0]};
  }

 private:
  std::string program_;
  std::vector<std::string> command_;
  std::vector<std::string> base_env_;
  std::string master_;  // $DTF_CLUSTER_SECRET, given to ps tasks only
  int dev_null_ = -1;
  sigset_t original_mask_{};
};

}  // namespace dtfrun
