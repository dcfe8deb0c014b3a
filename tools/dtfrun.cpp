// dtfrun: starts a whole dtf cluster on this machine from one command (DESIGN.md §8).
//
//   dtfrun --ps 2 --workers 3 -- ./build/examples/downpour --lr 0.01
//
// Every task runs the same command with its own TF_CONFIG (and DTF_TASK=<job>.<index>),
// each line of a task's output is printed with the task's name in front of it, the job ends
// when the chief ends, and no task outlives dtfrun. `dtfrun --help` lists the flags and the
// exit-status rules.
//
// Linux only: it relies on prctl(PR_SET_PDEATHSIG) and signalfd.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

extern char** environ;

namespace {

using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int exit_failure = 1;  // a non-chief task failed, or a task could not be started
constexpr int exit_usage = 2;    // bad command line; nothing was started
constexpr int exit_timeout = 124;

// How long tasks get between SIGTERM and SIGKILL, and after SIGKILL how long dtfrun waits
// for them to be gone and for their output pipes to close before it exits regardless.
constexpr milliseconds term_wait{3000};
constexpr milliseconds kill_wait{2000};

// A task that writes without newlines must not grow dtfrun's memory without bound: a
// partial line this long is printed as a line of its own.
constexpr std::size_t max_line_bytes = 64 * 1024;
constexpr std::size_t read_chunk_bytes = 64 * 1024;

// More tasks than this on one machine is a typo, not a cluster (and would exhaust fds).
constexpr long long max_tasks_per_job = 1024;

constexpr std::string_view usage_text =
    R"(usage: dtfrun [options] -- CMD [ARGS...]

Starts a dtf cluster on this machine. Every task runs CMD ARGS with its own TF_CONFIG
and DTF_TASK=<job>.<index> added to dtfrun's environment, stdin from /dev/null, in a
process group of its own. Each line a task writes is printed with the task's name in
front ("ps.0     | ..."), stdout to stdout and stderr to stderr.

options:
  --ps N          parameter-server tasks (default 0)
  --workers M     worker tasks (default 1); 0 needs --chief
  --chief         add a chief task; without it worker 0 is the chief
  --evaluator     add an evaluator task (not listed in the cluster, as in TensorFlow)
  --host H        address the tasks listen on; free ports are picked on it
                  (default 127.0.0.1)
  --grace_ms MS   after the chief exits, how long the other tasks may take to end by
                  themselves before they get SIGTERM (default 10000)
  --timeout_s S   time limit for the job, counted until the chief exits; 0: none
                  (default 0)
  --max-restarts N | ps=N,worker=M,chief=K,evaluator=E
                  how often each task of a role may be restarted after it failed
                  (non-zero exit or killed by a signal); a bare N applies to every
                  role, a role left out gets 0 (default 0)
  --restart_delay_ms MS
                  wait before a failed task is started again (default 1000)
  -h, --help      print this help and exit
Flags take their value as the next argument or after '=' (--ps=2); '-' and '_' in a
flag's name are the same (--max_restarts, --grace-ms).

restarts: a failed task with restarts left is started again with the same TF_CONFIG
(same address and port) and DTF_RESTART_COUNT=<k> (0 on the first start); whatever it
left running in its process group is killed first. This holds for the chief too; a
chief that exits with status 0 ends the job. A task without restarts left that fails
ends the job as described below, with a line saying which task failed and how.

SIGINT (Ctrl-C): the first asks the chief to stop: SIGTERM goes to the chief's process
group only (a dtf chief saves a checkpoint and ends the job normally); the other tasks
then get the grace period as after any end of the chief. A second SIGINT kills every
task at once. SIGTERM and SIGHUP tear the whole cluster down.

teardown: tasks still running get SIGTERM (to their whole process group), and SIGKILL
3 s later; a second SIGINT/SIGTERM skips the wait. When dtfrun exits, whatever the tasks
left running in their process groups is killed. Tasks die with dtfrun even when it is
killed with SIGKILL (PR_SET_PDEATHSIG; this reaches the task processes themselves, not
processes they started).

exit status:
  the chief's       when the chief ends the job (128+N if signal N killed the chief)
  1                 a non-chief task failed (non-zero exit or killed by a signal) with no
                    restarts left before the chief ended, or a task could not be started
  2                 bad command line; nothing was started
  124               the --timeout_s limit was reached
  128+N             dtfrun got signal N (SIGHUP 129, SIGINT 130, SIGTERM 143); after a
                    SIGINT this holds however the chief then ended
)";

// ---- small helpers ----------------------------------------------------------------------

// Writes all of `data` to `fd`. Output that cannot be delivered (a closed pipe on dtfrun's
// stdout, say) is dropped: losing a log line must not take the cluster down with it.
void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      // dtfrun's own stdout was handed to it non-blocking; wait (bounded) until it drains.
      pollfd pfd{fd, POLLOUT, 0};
      if (::poll(&pfd, 1, 1000) <= 0) return;
    } else {
      return;
    }
  }
}

void say(std::string_view message) {
  std::string line = "dtfrun: ";
  line += message;
  line += '\n';
  write_all(STDERR_FILENO, line);
}

std::string errno_text(int error) { return std::strerror(error); }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return "signal " + std::to_string(sig);
  }
}

// How a task ended, from waitid(): an exit code or the signal that killed it.
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

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// ---- command line -----------------------------------------------------------------------

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --max-restarts: per task of each role.
struct restart_limits {
  long long ps = 0;
  long long chief = 0;
  long long worker = 0;
  long long evaluator = 0;

  long long for_job(std::string_view job) const {
    if (job == "ps") return ps;
    if (job == "chief") return chief;
    if (job == "worker") return worker;
    return evaluator;
  }
};

struct options {
  long long ps_count = 0;
  long long worker_count = 1;
  bool chief = false;
  bool evaluator = false;
  std::string host = "127.0.0.1";
  long long grace_ms = 10000;
  long long timeout_s = 0;
  restart_limits max_restarts;
  long long restart_delay_ms = 1000;
  std::vector<std::string> command;
  bool help = false;
};

long long parse_count(std::string_view flag, std::string_view text, long long max) {
  long long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || value < 0 ||
      value > max) {
    throw usage_error("--" + std::string(flag) + " needs a whole number from 0 to " +
                      std::to_string(max) + ", not '" + std::string(text) + "'");
  }
  return value;
}

constexpr long long max_restarts_limit = 1'000'000;

// "N" or "ps=N,worker=M,chief=K,evaluator=E" (any subset, any order).
restart_limits parse_restarts(std::string_view text) {
  restart_limits limits;
  if (text.find('=') == std::string_view::npos) {
    const long long n = parse_count("max-restarts", text, max_restarts_limit);
    return {n, n, n, n};
  }
  std::vector<std::string_view> seen;
  while (true) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    const auto eq = item.find('=');
    const std::string_view role = item.substr(0, eq);
    if (eq == std::string_view::npos ||
        (role != "ps" && role != "worker" && role != "chief" && role != "evaluator")) {
      throw usage_error("--max-restarts needs N or role=N,... with roles ps, worker, chief, "
                        "evaluator, not '" + std::string(item) + "'");
    }
    if (std::find(seen.begin(), seen.end(), role) != seen.end()) {
      throw usage_error("--max-restarts names '" + std::string(role) + "' twice");
    }
    seen.push_back(role);
    const long long n = parse_count("max-restarts " + std::string(role), item.substr(eq + 1),
                                    max_restarts_limit);
    (role == "ps" ? limits.ps : role == "worker" ? limits.worker
                             : role == "chief" ? limits.chief : limits.evaluator) = n;
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return limits;
}

options parse_options(int argc, char** argv) {
  options opts;
  bool saw_separator = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      saw_separator = true;
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      opts.help = true;
      return opts;
    }
    if (!arg.starts_with("--")) {
      const bool separator_follows =
          std::find(argv + i, argv + argc, std::string_view("--")) != argv + argc;
      throw usage_error(separator_follows
                            ? "unexpected argument '" + std::string(arg) +
                                  "' before '--' (see dtfrun --help)"
                            : "missing '--' before the command '" + std::string(arg) +
                                  "' (see dtfrun --help)");
    }
    std::string_view written = arg.substr(2);
    std::optional<std::string_view> inline_value;
    if (auto eq = written.find('='); eq != std::string_view::npos) {
      inline_value = written.substr(eq + 1);
      written = written.substr(0, eq);
    }
    // '-' and '_' are the same in a flag's name; messages show the name as written.
    std::string normalized(written);
    std::replace(normalized.begin(), normalized.end(), '-', '_');
    const std::string_view name = normalized;
    if (name == "chief" || name == "evaluator") {
      if (inline_value) throw usage_error("--" + std::string(written) + " takes no value");
      (name == "chief" ? opts.chief : opts.evaluator) = true;
      continue;
    }
    const bool takes_value = name == "ps" || name == "workers" || name == "host" ||
                             name == "grace_ms" || name == "timeout_s" ||
                             name == "max_restarts" || name == "restart_delay_ms";
    if (!takes_value) {
      throw usage_error("unknown flag '--" + std::string(written) + "' (see dtfrun --help)");
    }
    std::string_view value;
    if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw usage_error("--" + std::string(written) + " needs a value");
    }
    if (name == "ps") {
      opts.ps_count = parse_count(written, value, max_tasks_per_job);
    } else if (name == "workers") {
      opts.worker_count = parse_count(written, value, max_tasks_per_job);
    } else if (name == "host") {
      if (value.empty()) throw usage_error("--host needs a non-empty address");
      opts.host = value;
    } else if (name == "grace_ms") {
      opts.grace_ms = parse_count(written, value, 1'000'000'000LL);
    } else if (name == "max_restarts") {
      opts.max_restarts = parse_restarts(value);
    } else if (name == "restart_delay_ms") {
      opts.restart_delay_ms = parse_count(written, value, 1'000'000'000LL);
    } else {
      opts.timeout_s = parse_count(written, value, 1'000'000'000LL);
    }
  }
  if (!saw_separator) throw usage_error("missing '--' before the command (see dtfrun --help)");
  if (i >= argc) throw usage_error("missing the command after '--' (see dtfrun --help)");
  if (opts.worker_count == 0 && !opts.chief) {
    throw usage_error("--workers 0 leaves no chief; add --chief or start at least one worker");
  }
  for (; i < argc; ++i) opts.command.emplace_back(argv[i]);
  return opts;
}

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// Finds the program up front, as execvp would, so that a typo is a usage error before any
// task starts rather than N identical failures after all of them did.
std::string resolve_command(const std::string& name) {
  if (name.empty()) throw usage_error("the command after '--' is empty");
  if (name.find('/') != std::string::npos) {
    if (!is_executable_file(name)) {
      throw usage_error("cannot execute '" + name + "': not an executable file");
    }
    return name;
  }
  const char* path_env = std::getenv("PATH");
  std::string_view path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    auto colon = path.find(':');
    std::string_view dir = path.substr(0, colon);
    // An empty PATH entry means the current directory, as in execvp.
    std::string candidate = dir.empty() ? name : std::string(dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string_view::npos) break;
    path.remove_prefix(colon + 1);
  }
  throw usage_error("cannot execute '" + name + "': not found on PATH");
}

// ---- the cluster ------------------------------------------------------------------------

struct task {
  std::string job;  // "ps", "chief", "worker", "evaluator"
  int index = 0;
  std::string name;     // "worker.1"
  std::string address;  // "127.0.0.1:40123"; empty for the evaluator
  std::string prefix;   // name padded to the common width, then " | "
  pid_t pid = -1;       // also the task's process group id; -1 while not started
  bool running = false;
  std::optional<task_end> end;  // of the latest run
  long long restarts = 0;       // starts after the first
  std::optional<steady::time_point> restart_at;  // a failed task waiting to start again
};

// One of a task's two output pipes, and the partial line read from it so far. A restarted
// task gets new pipes; the old ones are read until every writer has closed them.
struct output_pipe {
  task* owner = nullptr;
  int fd = -1;
  int target_fd = -1;  // dtfrun's stdout or stderr
  std::string pending;
};

// Holds one socket bound to port 0 per requested port until all are chosen, so the kernel
// cannot hand out the same port twice; the sockets close when this goes away, just before
// the tasks start and bind the ports themselves.
class port_picker {
 public:
  explicit port_picker(const std::string& host) : host_(host) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
      throw usage_error("cannot resolve --host '" + host + "': " + ::gai_strerror(rc));
    }
    // Prefer IPv4: "localhost" commonly resolves to ::1 first, but most servers bind 0/IPv4.
    const addrinfo* chosen = found;
    for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      if (ai->ai_family == AF_INET) {
        chosen = ai;
        break;
      }
    }
    std::memcpy(&address_, chosen->ai_addr, chosen->ai_addrlen);
    address_length_ = chosen->ai_addrlen;
    family_ = chosen->ai_family;
    ::freeaddrinfo(found);
  }
  port_picker(const port_picker&) = delete;
  port_picker& operator=(const port_picker&) = delete;
  ~port_picker() {
    for (int fd : sockets_) ::close(fd);
  }

  // "host:port" (IPv6 literals in brackets) for a port nobody else holds right now.
  std::string next_address() {
    int fd = ::socket(family_, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw usage_error("cannot open a socket to pick a port: " + errno_text(errno));
    sockets_.push_back(fd);
    sockaddr_storage bound = address_;
    if (family_ == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&bound)->sin_port = 0;
    } else {
      reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port = 0;
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&bound), address_length_) != 0) {
      throw usage_error("cannot bind a port on --host '" + host_ + "': " + errno_text(errno));
    }
    socklen_t length = sizeof bound;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      throw usage_error("cannot read back a picked port: " + errno_text(errno));
    }
    const in_port_t port = family_ == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port;
    const bool bracket = host_.find(':') != std::string::npos;
    return (bracket ? "[" + host_ + "]" : host_) + ":" + std::to_string(ntohs(port));
  }

 private:
  std::string host_;
  sockaddr_storage address_{};
  socklen_t address_length_ = 0;
  int family_ = AF_INET;
  std::vector<int> sockets_;
};

// Tasks in start order: ps first (workers connect to them), then chief, workers, evaluator.
std::vector<task> plan_tasks(const options& opts) {
  std::vector<task> tasks;
  auto add = [&](const char* job, long long count) {
    for (long long i = 0; i < count; ++i) {
      task t;
      t.job = job;
      t.index = static_cast<int>(i);
      t.name = t.job + "." + std::to_string(i);
      tasks.push_back(std::move(t));
    }
  };
  add("ps", opts.ps_count);
  add("chief", opts.chief ? 1 : 0);
  add("worker", opts.worker_count);
  add("evaluator", opts.evaluator ? 1 : 0);

  port_picker picker(opts.host);
  for (task& t : tasks) {
    if (t.job != "evaluator") t.address = picker.next_address();
  }

  std::size_t width = 0;
  for (const task& t : tasks) width = std::max(width, t.name.size());
  for (task& t : tasks) t.prefix = t.name + std::string(width - t.name.size(), ' ') + " | ";
  return tasks;
}

// TensorFlow's TF_CONFIG: the cluster (empty jobs left out; the evaluator is not a member)
// and this task's type and index.
std::string tf_config_for(const std::vector<task>& tasks, const task& self) {
  std::string cluster;
  for (const char* job : {"chief", "worker", "ps"}) {
    std::string members;
    for (const task& t : tasks) {
      if (t.job != job) continue;
      if (!members.empty()) members += ", ";
      members += json_string(t.address);
    }
    if (members.empty()) continue;
    if (!cluster.empty()) cluster += ", ";
    cluster += json_string(job) + ": [" + members + "]";
  }
  return R"({"cluster": {)" + cluster + R"(}, "task": {"type": )" + json_string(self.job) +
         R"(, "index": )" + std::to_string(self.index) + "}}";
}

// Runs the cluster: starts the tasks, relays their output and decides when and how the job
// ends. Single-threaded; every event (output, a task ending, a signal to dtfrun, a
// deadline) arrives through one poll() call.
class launcher {
 public:
  launcher(options opts, std::string program)
      : opts_(std::move(opts)), program_(std::move(program)), tasks_(plan_tasks(opts_)) {
    chief_ = opts_.chief ? find("chief") : find("worker");
  }

  int run() {
    setup_signals();
    if (start_all()) {
      phase_ = phase::running;
      if (opts_.timeout_s > 0) {
        job_deadline_ = steady::now() + std::chrono::seconds(opts_.timeout_s);
      }
    } else {
      exit_status_ = exit_failure;
      begin_terminate();
    }
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

  void setup_signals() {
    // SIGCHLD, SIGINT, SIGTERM and SIGHUP are read from a signalfd in the event loop, so they
    // are blocked rather than handled; the children get dtfrun's original mask back. A
    // signal the parent set to be ignored (SIGINT for a script's background job, SIGHUP
    // under nohup) stays ignored: the kernel drops it, as that parent asked. SIGCHLD is the
    // exception: ignoring it would make the kernel reap the tasks before dtfrun sees them.
    ::signal(SIGCHLD, SIG_DFL);
    sigset_t handled;
    sigemptyset(&handled);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
    ::sigprocmask(SIG_BLOCK, &handled, &original_mask_);
    signal_fd_ = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signal_fd_ < 0) throw std::runtime_error("signalfd: " + errno_text(errno));
    // A closed stdout must not kill dtfrun (and with it, the cluster); see write_all.
    ::signal(SIGPIPE, SIG_IGN);
  }

  bool start_all() {
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view entry = *e;
      if (entry.starts_with("TF_CONFIG=") || entry.starts_with("DTF_TASK=") ||
          entry.starts_with("DTF_RESTART_COUNT=")) {
        continue;
      }
      base_env_.emplace_back(entry);
    }
    dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (dev_null_ < 0) {
      say("cannot open /dev/null: " + errno_text(errno));
      return false;
    }
    for (task& t : tasks_) {
      if (!start_task(t)) return false;
    }
    return true;
  }

  bool start_task(task& t) {
    // Everything the child needs is built before fork so the child only makes system calls.
    std::vector<std::string> env_strings = base_env_;
    env_strings.push_back("TF_CONFIG=" + tf_config_for(tasks_, t));
    env_strings.push_back("DTF_TASK=" + t.name);
    env_strings.push_back("DTF_RESTART_COUNT=" + std::to_string(t.restarts));
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_strings = opts_.command;
    std::vector<char*> argv;
    for (std::string& s : arg_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    // An executable file without a #! line is a shell script to execvp; do the same.
    std::string shell = "/bin/sh";
    std::string script = program_;
    std::vector<char*> shell_argv{shell.data(), script.data()};
    shell_argv.insert(shell_argv.end(), argv.begin() + 1, argv.end());
    const std::string exec_failed = "dtfrun: cannot execute " + program_ + ": ";

    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
      say("cannot create a pipe for " + t.name + ": " + errno_text(errno));
      return false;
    }
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
      say("cannot create a pipe for " + t.name + ": " + errno_text(errno));
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      return false;
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      say("cannot start " + t.name + ": fork: " + errno_text(errno));
      for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
      return false;
    }
    if (pid == 0) {
      // Own process group: signals for this task reach whatever it starts, and a Ctrl-C on
      // the terminal reaches only dtfrun, which then tears the cluster down in order.
      ::setpgid(0, 0);
      // Die with dtfrun even if it is SIGKILLed. If dtfrun died before prctl took effect we
      // were already re-parented and would never get the signal, hence the getppid check.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(exit_failure);
      ::dup2(dev_null_, STDIN_FILENO);
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
      ::execve(program_.c_str(), argv.data(), envp.data());
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
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    // Non-blocking read ends let the final drain stop at "no more data" instead of waiting.
    for (int fd : {out_pipe[0], err_pipe[0]}) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    t.pid = pid;
    t.running = true;
    t.end.reset();
    t.restart_at.reset();
    pipes_.push_back(output_pipe{&t, out_pipe[0], STDOUT_FILENO, {}});
    pipes_.push_back(output_pipe{&t, err_pipe[0], STDERR_FILENO, {}});
    say((t.restarts == 0 ? "started " : "restarted ") + t.name + " (pid " +
        std::to_string(pid) + ")" + (t.address.empty() ? "" : " at " + t.address) +
        (t.restarts == 0 ? "" : ", restart " + std::to_string(t.restarts)));
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
          if (fds[i + 1].revents != 0) relay(*pipes[i]->owner, *pipes[i]);
        }
        if (fds[0].revents != 0) read_signals();
      }
      pipes_.remove_if([](const output_pipe& p) { return p.fd < 0; });
      advance();
    }
  }

  // Reads what is available (once: poll said it would not block) and prints whole lines.
  void relay(const task& t, output_pipe& p) {
    char buffer[read_chunk_bytes];
    const ssize_t n = ::read(p.fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_pipe(t, p);
      return;
    }
    p.pending.append(buffer, static_cast<std::size_t>(n));
    emit_lines(t, p);
  }

  void emit_lines(const task& t, output_pipe& p) {
    // One write per read keeps a task's lines together and the number of system calls low.
    std::string text;
    std::size_t start = 0;
    while (true) {
      std::size_t newline = p.pending.find('\n', start);
      if (newline == std::string::npos) {
        if (p.pending.size() - start < max_line_bytes) break;
        newline = start + max_line_bytes - 1;
        text += t.prefix;
        text.append(p.pending, start, newline + 1 - start);
        text += '\n';
      } else {
        text += t.prefix;
        text.append(p.pending, start, newline + 1 - start);
      }
      start = newline + 1;
    }
    p.pending.erase(0, start);
    write_all(p.target_fd, text);
  }

  void close_pipe(const task& t, output_pipe& p) {
    if (!p.pending.empty()) {
      write_all(p.target_fd, t.prefix + p.pending + "\n");
      p.pending.clear();
    }
    ::close(p.fd);
    p.fd = -1;
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
    siginfo_t info{};
    // WNOWAIT leaves the task a zombie until dtfrun exits: its pid, which is also its
    // process group id, cannot be reused meanwhile, so kill(-pgid) at teardown always
    // reaches this task's group and never a stranger's.
    if (::waitid(P_PID, static_cast<id_t>(t.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return;
    if (info.si_pid != t.pid) return;
    t.running = false;
    t.end = task_end{info.si_code != CLD_EXITED, info.si_status};
    on_task_end(t);
  }

  // " after 2 restarts" once a task was restarted; empty before.
  static std::string after_restarts(const task& t) {
    if (t.restarts == 0) return "";
    return " after " + std::to_string(t.restarts) + (t.restarts == 1 ? " restart" : " restarts");
  }

  bool restarts_left(const task& t) const {
    return t.restarts < opts_.max_restarts.for_job(t.job);
  }

  // A failed task starts again after --restart_delay_ms. Whatever it left in its process
  // group would hold its port and its output pipes, so that goes first; then the zombie is
  // reaped (its pid is no longer a group dtfrun signals).
  void schedule_restart(task& t) {
    const long long limit = opts_.max_restarts.for_job(t.job);
    say(t.name + (&t == chief_ ? " (chief)" : "") + " failed (" + t.end->describe() +
        "); restarting it (restart " + std::to_string(t.restarts + 1) + " of " +
        std::to_string(limit) + ")");
    ::kill(-t.pid, SIGKILL);
    int status = 0;
    ::waitpid(t.pid, &status, 0);
    t.pid = -1;
    ++t.restarts;
    t.restart_at = steady::now() + milliseconds(opts_.restart_delay_ms);
  }

  void on_task_end(task& t) {
    const bool may_restart = phase_ == phase::running || phase_ == phase::stopping;
    if (&t == chief_) {
      if (phase_ == phase::running && t.end->failed() && restarts_left(t)) {
        schedule_restart(t);
      } else if (phase_ == phase::running || phase_ == phase::stopping) {
        say(t.name + " (chief) ended (" + t.end->describe() + ")" + after_restarts(t) +
            (phase_ == phase::stopping ? " after the stop request" : ""));
        if (phase_ == phase::running) exit_status_ = t.end->shell_status();
        phase_ = phase::grace;
        deadline_ = steady::now() + milliseconds(opts_.grace_ms);
        for (task& other : tasks_) other.restart_at.reset();
      }
      return;
    }
    if (!t.end->failed()) return;
    if (may_restart && restarts_left(t)) {
      schedule_restart(t);
    } else if (phase_ == phase::running) {
      say(t.name + " failed (" + t.end->describe() + ")" + after_restarts(t) +
          "; tearing down the cluster");
      exit_status_ = exit_failure;
      begin_terminate();
    } else if (phase_ == phase::stopping) {
      say(t.name + " failed (" + t.end->describe() + ")" + after_restarts(t) +
          " while the chief was stopping");
    } else if (phase_ == phase::grace) {
      say(t.name + " failed (" + t.end->describe() + ") after the chief ended");
    }
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
    if (!next) return -1;
    const auto left = std::chrono::ceil<milliseconds>(*next - steady::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, 24LL * 3600 * 1000));
  }

  void finish() {
    // Whatever is still buffered in a pipe (only when the kill wait ran out) is printed, then
    // partial lines with the task's prefix.
    for (output_pipe& p : pipes_) {
      if (p.fd < 0) continue;
      char buffer[read_chunk_bytes];
      ssize_t n;
      while ((n = ::read(p.fd, buffer, sizeof buffer)) > 0) {
        p.pending.append(buffer, static_cast<std::size_t>(n));
        emit_lines(*p.owner, p);
      }
      close_pipe(*p.owner, p);
    }
    pipes_.clear();
    for (task& t : tasks_) {
      if (t.pid > 0) {
        int status = 0;
        ::waitpid(t.pid, &status, WNOHANG);
      }
    }
  }

  options opts_;
  std::string program_;
  std::vector<task> tasks_;  // never resized after construction: pipes point into it
  std::list<output_pipe> pipes_;
  std::vector<std::string> base_env_;
  task* chief_ = nullptr;
  int signal_fd_ = -1;
  int dev_null_ = -1;
  sigset_t original_mask_{};
  phase phase_ = phase::running;
  std::optional<steady::time_point> deadline_;      // of the current phase
  std::optional<steady::time_point> job_deadline_;  // --timeout_s, while running
  std::optional<int> exit_status_;
};

}  // namespace

int main(int argc, char** argv) {
  // With stdin, stdout or stderr closed, the tasks' pipes could land on fds 0-2 and be
  // clobbered when a task's standard streams are set up; /dev/null holds those places.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) ::open("/dev/null", O_RDWR);
  }
  options opts;
  std::string program;
  try {
    opts = parse_options(argc, argv);
    if (opts.help) {
      write_all(STDOUT_FILENO, usage_text);
      return 0;
    }
    program = resolve_command(opts.command.front());
    launcher cluster(std::move(opts), std::move(program));
    return cluster.run();
  } catch (const usage_error& e) {
    say(e.what());
    return exit_usage;
  } catch (const std::exception& e) {
    say(e.what());
    return exit_failure;
  }
}
