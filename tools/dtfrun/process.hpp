// Starting and watching the processes dtfrun runs (a cluster's tasks, a sweep's runs): the
// signals to dtfrun, read from a signalfd; a child started in a process group of its own that
// dies with dtfrun; and how a child ended.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"

namespace dtfrun {

// How a child ended, from waitid(): an exit code or the signal that killed it.
struct task_end {
  bool killed = false;
  int value = 0;  // exit code, or signal number when killed

  bool failed() const { return killed || value != 0; }
  int shell_status() const { return killed ? 128 + value : value; }
  std::string describe() const {
    return killed ? "killed by signal " + signal_name(value)
                  : "exit status " + std::to_string(value);
  }
};

// SIGCHLD, SIGINT, SIGTERM and SIGHUP are read from the returned signalfd (non-blocking) in an
// event loop, so they are blocked rather than handled; `original_mask` receives the mask from
// before, which the children get back. A signal the parent set to be ignored (SIGINT for a
// script's background job, SIGHUP under nohup) stays ignored: the kernel drops it, as that
// parent asked. SIGCHLD is the exception: ignoring it would make the kernel reap the children
// before dtfrun sees them. Throws std::runtime_error when no signalfd can be made.
inline int open_signal_fd(sigset_t& original_mask) {
  ::signal(SIGCHLD, SIG_DFL);
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, &original_mask);
  const int fd = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error("signalfd: " + errno_text(errno));
  // A closed stdout must not kill dtfrun (and with it, its children); see write_all.
  ::signal(SIGPIPE, SIG_IGN);
  return fd;
}

// A child's standard streams (fds of dtfrun's, duplicated onto 0, 1 and 2), and one more fd
// that the child inherits as it is (-1: none).
struct child_fds {
  int in = -1;
  int out = -1;
  int err = -1;
  int inherited = -1;
};

struct spawned {
  pid_t pid = -1;  // -1: fork failed, with errno `error`
  int error = 0;
};

// Starts `program` (a path, as resolve_command found it) with `args` (args[0] the command as
// written) and the environment `env`. The child runs in a process group of its own, so that
// signals for it reach whatever it starts and a Ctrl-C on the terminal reaches only dtfrun; it
// dies with dtfrun, even when dtfrun is killed with SIGKILL; it gets `original_mask` back. An
// executable file without a #! line is run by /bin/sh, as execvp does. A program that cannot
// be executed exits with status 127 after a line "<who>: cannot execute ..." on its stderr.
inline spawned spawn(const std::string& program, std::vector<std::string> args,
                     std::vector<std::string> env, const child_fds& fds,
                     const sigset_t& original_mask, std::string_view who) {
  // Everything the child needs is built before fork so the child only makes system calls.
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::string shell = "/bin/sh";
  std::string script = program;
  std::vector<char*> shell_argv{shell.data(), script.data()};
  shell_argv.insert(shell_argv.end(), argv.begin() + 1, argv.end());
  const std::string exec_failed = std::string(who) + ": cannot execute " + program + ": ";

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return spawned{-1, errno};
  if (pid == 0) {
    ::setpgid(0, 0);
    // If dtfrun died before prctl took effect the child was already re-parented and would
    // never get the signal, hence the getppid check.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(exit_failure);
    ::dup2(fds.in, STDIN_FILENO);
    if (fds.inherited >= 0) ::fcntl(fds.inherited, F_SETFD, 0);  // this one survives the exec
    ::dup2(fds.out, STDOUT_FILENO);
    ::dup2(fds.err, STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &original_mask, nullptr);
    ::execve(program.c_str(), argv.data(), envp.data());
    if (errno == ENOEXEC) ::execve(shell.c_str(), shell_argv.data(), envp.data());
    const int error = errno;
    write_all(STDERR_FILENO, exec_failed);
    write_all(STDERR_FILENO, std::strerror(error));
    write_all(STDERR_FILENO, "\n");
    ::_exit(127);
  }
  // Also set here, so that a signal sent to the group right after fork cannot miss it;
  // EACCES once the child has exec'd is expected.
  ::setpgid(pid, pid);
  return spawned{pid, 0};
}

// How the child `pid` ended, or nothing while it runs. WNOWAIT leaves it a zombie until it is
// reaped with waitpid: its pid, which is also its process group id, cannot be reused
// meanwhile, so kill(-pgid) always reaches its group and never a stranger's.
inline std::optional<task_end> child_ended(pid_t pid) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return std::nullopt;
  if (info.si_pid != pid) return std::nullopt;
  return task_end{info.si_code != CLD_EXITED, info.si_status};
}

}  // namespace dtfrun
