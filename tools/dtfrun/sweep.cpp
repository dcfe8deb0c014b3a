// `dtfrun sweep` (see sweep.hpp and sweep_options.hpp's help text): the runs of the grid,
// each in its own directory and process group, at most --parallel at a time, with a time
// limit each; signals to the sweep passed on to its runs. The table of results is
// sweep_results.hpp's.
#include "sweep.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.hpp"
#include "process.hpp"
#include "sweep_options.hpp"
#include "sweep_results.hpp"
#include "view.hpp"

extern char** environ;

namespace dtfrun {

namespace {

using std::chrono::milliseconds;

constexpr milliseconds kill_after{3000};

// A value as it may appear in a directory name.
std::string path_safe(std::string_view text) {
  std::string out;
  for (char c : text) {
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '=' ? c : '_';
  }
  return out.substr(0, 40);
}

bool make_directories(const std::string& path) {
  std::string partial;
  std::size_t at = 0;
  while (at <= path.size()) {
    const auto slash = path.find('/', at);
    partial = path.substr(0, slash);
    at = slash == std::string::npos ? path.size() + 1 : slash + 1;
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

class sweeper {
 public:
  sweeper(sweep_options opts, std::string program) : opts_(std::move(opts)), program_(std::move(program)) {
    plan();
  }

  int run_all() {
    signal_fd_ = open_signal_fd(original_mask_);
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string_view(*e).starts_with("DTF_RUN_DIR=")) continue;
      base_env_.emplace_back(*e);
    }
    say("sweep: " + std::to_string(runs_.size()) + " runs, at most " + std::to_string(opts_.parallel) +
        " at a time, in " + opts_.out);
    while (true) {
      if (!stopping_) start_runs();
      if (running_count() == 0 && (stopping_ || next_ == runs_.size())) break;
      wait_for_event();
      collect();
      enforce_deadlines();
    }
    return report();
  }

 private:
  void plan() {
    std::size_t total = 1;
    for (const grid_entry& g : opts_.grid) {
      total *= g.values.size();
      if (total > 100000) throw usage_error("the grid has more than 100000 combinations");
    }
    if (opts_.out.empty()) {
      char stamp[32];
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      ::localtime_r(&now, &local);
      std::strftime(stamp, sizeof stamp, "sweep-%Y%m%d-%H%M%S", &local);
      opts_.out = stamp;
    }
    struct stat info {};
    if (::stat((opts_.out + "/results.csv").c_str(), &info) == 0) {
      throw usage_error("--out " + opts_.out + " already holds a results.csv; choose another directory");
    }
    if (!make_directories(opts_.out)) {
      throw usage_error("cannot create the output directory '" + opts_.out + "': " + errno_text(errno));
    }
    const int digits = static_cast<int>(std::to_string(total).size()) < 3 ? 3 : static_cast<int>(std::to_string(total).size());
    for (std::size_t k = 0; k < total; ++k) {
      sweep_run r;
      r.index = k + 1;
      std::size_t rest = k;
      r.values.resize(opts_.grid.size());
      for (std::size_t g = opts_.grid.size(); g-- > 0;) {
        const auto& values = opts_.grid[g].values;
        r.values[g] = values[rest % values.size()];
        rest /= values.size();
      }
      char number[32];
      std::snprintf(number, sizeof number, "%0*zu", digits, r.index);
      std::string name = number;
      for (std::size_t g = 0; g < opts_.grid.size(); ++g) {
        name += "_" + path_safe(opts_.grid[g].key + "=" + r.values[g]);
      }
      r.dir = opts_.out + "/" + name;
      runs_.push_back(std::move(r));
    }
  }

  std::string describe(const sweep_run& r) const {
    std::string text = "[" + std::to_string(r.index) + "/" + std::to_string(runs_.size()) + "]";
    for (std::size_t g = 0; g < opts_.grid.size(); ++g) text += " " + opts_.grid[g].key + "=" + r.values[g];
    return text;
  }

  std::size_t running_count() const {
    std::size_t n = 0;
    for (const sweep_run& r : runs_) n += r.running;
    return n;
  }

  void start_runs() {
    while (next_ < runs_.size() && running_count() < static_cast<std::size_t>(opts_.parallel)) {
      start(runs_[next_++]);
    }
  }

  void start(sweep_run& r) {
    r.started = true;
    r.start_time = steady::now();
    if (!make_directories(r.dir)) {
      r.end = task_end{false, 127};
      r.metrics_problem = "cannot create its directory";
      say("sweep: " + describe(r) + ": cannot create " + r.dir + ": " + errno_text(errno));
      return;
    }
    const std::string log_path = r.dir + "/log.txt";
    const std::string metrics_path = r.dir + "/metrics.json";
    ::unlink(metrics_path.c_str());
    const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd < 0 || null_fd < 0) {
      r.end = task_end{false, 127};
      say("sweep: " + describe(r) + ": cannot open " + log_path + ": " + errno_text(errno));
      if (log_fd >= 0) ::close(log_fd);
      if (null_fd >= 0) ::close(null_fd);
      return;
    }
    std::vector<std::string> args = opts_.command;
    for (std::size_t g = 0; g < opts_.grid.size(); ++g) {
      args.push_back("--" + opts_.grid[g].key);
      args.push_back(r.values[g]);
    }
    args.push_back("--metrics_file");
    args.push_back(metrics_path);
    std::vector<std::string> env = base_env_;
    env.push_back("DTF_RUN_DIR=" + r.dir);
    const spawned child = spawn(program_, std::move(args), std::move(env), child_fds{null_fd, log_fd, log_fd},
                                original_mask_, "dtfrun sweep");
    ::close(log_fd);
    ::close(null_fd);
    if (child.pid < 0) {
      r.end = task_end{false, 127};
      say("sweep: " + describe(r) + ": fork: " + errno_text(child.error));
      return;
    }
    const pid_t pid = child.pid;
    r.pid = pid;
    r.running = true;
    say("sweep: " + describe(r) + ": started (pid " + std::to_string(pid) + "), log " + log_path);
  }

  void wait_for_event() {
    std::optional<steady::time_point> next;
    for (const sweep_run& r : runs_) {
      if (!r.running) continue;
      std::optional<steady::time_point> due;
      if (r.term_sent) {
        due = *r.term_sent + kill_after;
      } else if (opts_.timeout_s > 0) {
        due = r.start_time + std::chrono::seconds(opts_.timeout_s);
      }
      if (due && (!next || *due < *next)) next = due;
    }
    int timeout_ms = -1;
    if (next) {
      timeout_ms = static_cast<int>(std::clamp<long long>(
          std::chrono::ceil<milliseconds>(*next - steady::now()).count(), 0, 24LL * 3600 * 1000));
    }
    pollfd pfd{signal_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text(errno));
    signalfd_siginfo info{};
    while (::read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig != SIGCHLD) on_signal(sig);
    }
  }

  void signal_runs(int sig) {
    for (sweep_run& r : runs_) {
      if (!r.running) continue;
      ::kill(-r.pid, sig);
      if (sig == SIGTERM && !r.term_sent) r.term_sent = steady::now();
    }
  }

  void on_signal(int sig) {
    if (!exit_signal_) {
      exit_signal_ = sig;
      stopping_ = true;
      if (sig == SIGINT) {
        say("sweep: received SIGINT; passing it on to the running runs and starting no more "
            "(SIGINT again kills them)");
        signal_runs(SIGINT);
      } else {
        say("sweep: received " + signal_name(sig) + "; stopping the running runs");
        signal_runs(SIGTERM);
      }
    } else {
      say("sweep: received " + signal_name(sig) + " again; killing the running runs");
      signal_runs(SIGKILL);
    }
  }

  void enforce_deadlines() {
    const auto now = steady::now();
    for (sweep_run& r : runs_) {
      if (!r.running) continue;
      if (r.term_sent && now >= *r.term_sent + kill_after) {
        ::kill(-r.pid, SIGKILL);
      } else if (!r.term_sent && opts_.timeout_s > 0 && now >= r.start_time + std::chrono::seconds(opts_.timeout_s)) {
        say("sweep: " + describe(r) + ": time limit of " + std::to_string(opts_.timeout_s) +
            " s reached; sending SIGTERM");
        r.timed_out = true;
        ::kill(-r.pid, SIGTERM);
        r.term_sent = now;
      }
    }
  }

  void collect() {
    for (sweep_run& r : runs_) {
      if (!r.running) continue;
      const std::optional<task_end> end = child_ended(r.pid);
      if (!end) continue;
      // Whatever the run left in its process group goes with it; then the zombie is reaped.
      ::kill(-r.pid, SIGKILL);
      int status = 0;
      ::waitpid(r.pid, &status, 0);
      r.running = false;
      r.end = end;
      r.wall_s = std::chrono::duration<double>(steady::now() - r.start_time).count();
      read_metrics(r, describe(r));
      std::string figures;
      for (const auto& [key, value] : r.metrics) figures += " " + key + "=" + format_metric(value);
      say("sweep: " + describe(r) + ": " + (r.end->failed() ? r.end->describe() : r.status()) + " after " +
          fixed_1(r.wall_s) + " s" + (figures.empty() ? "" : ";" + figures));
    }
  }

  int report() const { return report_results(opts_, runs_, exit_signal_); }

  sweep_options opts_;
  std::string program_;
  std::vector<sweep_run> runs_;
  std::size_t next_ = 0;  // the next run to start
  std::vector<std::string> base_env_;
  int signal_fd_ = -1;
  sigset_t original_mask_{};
  bool stopping_ = false;
  std::optional<int> exit_signal_;
};

}  // namespace

int sweep_main(int argc, char** argv) {
  try {
    sweep_options opts = parse_sweep_options(argc, argv);
    if (opts.help) {
      write_all(STDOUT_FILENO, sweep_usage);
      return 0;
    }
    std::string program = resolve_command(opts.command.front());
    sweeper s(std::move(opts), std::move(program));
    return s.run_all();
  } catch (const usage_error& e) {
    say(e.what());
    return exit_usage;
  } catch (const std::exception& e) {
    say(e.what());
    return exit_failure;
  }
}

}  // namespace dtfrun
