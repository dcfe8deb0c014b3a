// `dtfrun sweep`; see sweep.hpp and the help text below.
#include "sweep.hpp"

#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cctype>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "common.hpp"
#include "json.hpp"
#include "view.hpp"

extern char** environ;

namespace dtfrun {

namespace {

using std::chrono::milliseconds;

constexpr std::string_view sweep_usage =
    R"(usage: dtfrun sweep --grid KEY=V1,V2,... [--grid KEY2=...] [--parallel P] [--out DIR]
                    [--sort METRIC[:asc|desc]] [--timeout_s S] -- CMD [ARGS...]

Runs CMD ARGS once for every combination of the grid's values (the first --grid varies
slowest), at most P at a time (default 1). Run k gets its own directory DIR/NNN_KEY=V_...,
with its output (stdout and stderr) in log.txt there, and is started as

  CMD ARGS --KEY V [--KEY2 V2 ...] --metrics_file DIR/NNN_.../metrics.json

with DTF_RUN_DIR set to its directory. CMD may itself be a cluster, e.g.
`dtfrun --ps 1 --workers 2 -- build/examples/downpour`: the flags reach the program. A run
writes its final figures as a JSON object of numbers to its metrics file (the examples'
chief does: accuracy, loss, global_step, wall_s). When all runs have ended, the sweep
prints a table of every run (its values, status, elapsed_s and metrics) sorted by
METRIC (default accuracy, descending; runs without it last) and saves it as
DIR/results.csv. A failed run is a row with its status; the sweep goes on.

options:
  --grid KEY=V1,V2,...  a hyperparameter and its values (repeatable; keys distinct)
  --parallel P          runs at the same time (default 1)
  --out DIR             where the runs' directories and results.csv go (default
                        sweep-YYYYmmdd-HHMMSS); must not hold a results.csv yet
  --sort METRIC[:asc|desc]
                        the metric to sort by and its direction (default accuracy:desc)
  --timeout_s S         time limit per run: SIGTERM, then SIGKILL 3 s later; 0: none
                        (default 0)

signals: the first SIGINT passes SIGINT on to the running runs (a dtfrun run asks its
chief to stop) and starts no more runs; a second kills them. SIGTERM and SIGHUP send
SIGTERM to the running runs, and SIGKILL 3 s later. Each run is a process group of its
own and dies with the sweep even when that is killed with SIGKILL.

exit status: 0 when every run succeeded, 1 when some run failed (or could not write its
metrics), 2 for a bad command line (nothing started), 128+N after signal N.
)";

constexpr milliseconds kill_after{3000};

struct grid_entry {
  std::string key;
  std::vector<std::string> values;
};

struct sweep_options {
  std::vector<grid_entry> grid;
  long long parallel = 1;
  std::string out;
  std::string sort_metric = "accuracy";
  bool descending = true;
  long long timeout_s = 0;
  std::vector<std::string> command;
  bool help = false;
};

bool valid_key(std::string_view key) {
  if (key.empty() || key.front() == '-') return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

grid_entry parse_grid(std::string_view text) {
  const auto eq = text.find('=');
  const std::string_view key = text.substr(0, eq);
  if (eq == std::string_view::npos || !valid_key(key)) {
    throw usage_error("--grid needs KEY=V1,V2,... with a key of letters, digits, '_', '-' or '.', not '" +
                      std::string(text) + "'");
  }
  grid_entry g{std::string(key), {}};
  std::string_view rest = text.substr(eq + 1);
  if (rest.empty()) throw usage_error("--grid " + g.key + " has no values");
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view value = rest.substr(0, comma);
    if (value.empty()) throw usage_error("--grid " + g.key + " has an empty value in '" + std::string(text) + "'");
    if (std::find(g.values.begin(), g.values.end(), value) != g.values.end()) {
      throw usage_error("--grid " + g.key + " lists '" + std::string(value) + "' twice");
    }
    g.values.emplace_back(value);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return g;
}

sweep_options parse_sweep_options(int argc, char** argv) {
  sweep_options opts;
  bool saw_separator = false;
  int i = 2;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      saw_separator = true;
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      opts.help = true;
      return opts;
    }
    const auto [written, name, inline_value] =
        split_flag(arg, std::span<char* const>(argv + i, argv + argc), "dtfrun sweep --help");
    if (name != "grid" && name != "parallel" && name != "out" && name != "sort" && name != "timeout_s") {
      throw usage_error("unknown sweep flag '--" + std::string(written) + "' (see dtfrun sweep --help)");
    }
    std::string_view value;
    if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw usage_error("--" + std::string(written) + " needs a value");
    }
    if (name == "grid") {
      grid_entry g = parse_grid(value);
      for (const grid_entry& other : opts.grid) {
        if (other.key == g.key) throw usage_error("--grid " + g.key + " is given twice");
      }
      opts.grid.push_back(std::move(g));
    } else if (name == "parallel") {
      opts.parallel = parse_count(written, value, 1024);
      if (opts.parallel == 0) throw usage_error("--parallel needs at least 1");
    } else if (name == "out") {
      if (value.empty()) throw usage_error("--out needs a directory");
      opts.out = value;
    } else if (name == "timeout_s") {
      opts.timeout_s = parse_count(written, value, 1'000'000'000LL);
    } else {
      const auto colon = value.find(':');
      opts.sort_metric = value.substr(0, colon);
      const std::string_view order = colon == std::string_view::npos ? "desc" : value.substr(colon + 1);
      if (opts.sort_metric.empty() || (order != "asc" && order != "desc")) {
        throw usage_error("--sort needs METRIC, METRIC:asc or METRIC:desc, not '" + std::string(value) + "'");
      }
      opts.descending = order == "desc";
    }
  }
  if (opts.grid.empty()) throw usage_error("sweep needs at least one --grid KEY=V1,V2,...");
  if (!saw_separator) throw usage_error("missing '--' before the command (see dtfrun sweep --help)");
  if (i >= argc) throw usage_error("missing the command after '--' (see dtfrun sweep --help)");
  for (; i < argc; ++i) opts.command.emplace_back(argv[i]);
  return opts;
}

// A value as it may appear in a directory name.
std::string path_safe(std::string_view text) {
  std::string out;
  for (char c : text) {
    out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '=' ? c : '_';
  }
  return out.substr(0, 40);
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string format_metric(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string fixed_1(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
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

struct run {
  std::size_t index = 0;  // 1-based
  std::vector<std::string> values;  // one per grid entry
  std::string dir;
  pid_t pid = -1;
  bool started = false;
  bool running = false;
  std::optional<task_end> end;
  bool timed_out = false;
  steady::time_point start_time;
  std::optional<steady::time_point> term_sent;
  double wall_s = 0.0;
  std::vector<std::pair<std::string, double>> metrics;
  std::string metrics_problem;  // "no metrics file", "bad metrics file: ..."

  bool succeeded() const { return end && !end->failed() && metrics_problem.empty(); }
  std::string status() const {
    if (!started) return "not run";
    if (running) return "running";
    if (timed_out) return "timed out";
    if (end->failed()) return end->killed ? "killed by " + signal_name(end->value) : "exit " + std::to_string(end->value);
    return metrics_problem.empty() ? "ok" : metrics_problem;
  }
  std::optional<double> metric(const std::string& name) const {
    for (const auto& [key, value] : metrics) {
      if (key == name) return value;
    }
    return std::nullopt;
  }
};

class sweeper {
 public:
  sweeper(sweep_options opts, std::string program) : opts_(std::move(opts)), program_(std::move(program)) {
    plan();
  }

  int run_all() {
    setup_signals();
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
      run r;
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

  std::string describe(const run& r) const {
    std::string text = "[" + std::to_string(r.index) + "/" + std::to_string(runs_.size()) + "]";
    for (std::size_t g = 0; g < opts_.grid.size(); ++g) text += " " + opts_.grid[g].key + "=" + r.values[g];
    return text;
  }

  void setup_signals() {
    ::signal(SIGCHLD, SIG_DFL);
    sigset_t handled;
    sigemptyset(&handled);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, sig);
    ::sigprocmask(SIG_BLOCK, &handled, &original_mask_);
    signal_fd_ = ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signal_fd_ < 0) throw std::runtime_error("signalfd: " + errno_text(errno));
    ::signal(SIGPIPE, SIG_IGN);
  }

  std::size_t running_count() const {
    std::size_t n = 0;
    for (const run& r : runs_) n += r.running;
    return n;
  }

  void start_runs() {
    while (next_ < runs_.size() && running_count() < static_cast<std::size_t>(opts_.parallel)) {
      start(runs_[next_++]);
    }
  }

  void start(run& r) {
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
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::string shell = "/bin/sh";
    std::vector<char*> shell_argv{shell.data(), program_.data()};
    shell_argv.insert(shell_argv.end(), argv.begin() + 1, argv.end());
    std::vector<std::string> env = base_env_;
    env.push_back("DTF_RUN_DIR=" + r.dir);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string exec_failed = "dtfrun sweep: cannot execute " + program_ + ": ";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      r.end = task_end{false, 127};
      say("sweep: " + describe(r) + ": fork: " + errno_text(errno));
      ::close(log_fd);
      ::close(null_fd);
      return;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(exit_failure);
      ::dup2(null_fd, STDIN_FILENO);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
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
    ::setpgid(pid, pid);
    ::close(log_fd);
    ::close(null_fd);
    r.pid = pid;
    r.running = true;
    say("sweep: " + describe(r) + ": started (pid " + std::to_string(pid) + "), log " + log_path);
  }

  void wait_for_event() {
    std::optional<steady::time_point> next;
    for (const run& r : runs_) {
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
    for (run& r : runs_) {
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
    for (run& r : runs_) {
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
    for (run& r : runs_) {
      if (!r.running) continue;
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) continue;
      if (info.si_pid != r.pid) continue;
      // Whatever the run left in its process group goes with it; then the zombie is reaped.
      ::kill(-r.pid, SIGKILL);
      int status = 0;
      ::waitpid(r.pid, &status, 0);
      r.running = false;
      r.end = task_end{info.si_code != CLD_EXITED, info.si_status};
      r.wall_s = std::chrono::duration<double>(steady::now() - r.start_time).count();
      read_metrics(r);
      std::string figures;
      for (const auto& [key, value] : r.metrics) figures += " " + key + "=" + format_metric(value);
      say("sweep: " + describe(r) + ": " + (r.end->failed() ? r.end->describe() : r.status()) + " after " +
          fixed_1(r.wall_s) + " s" + (figures.empty() ? "" : ";" + figures));
    }
  }

  void read_metrics(run& r) {
    const std::string path = r.dir + "/metrics.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      if (!r.end->failed()) r.metrics_problem = "no metrics file";
      return;
    }
    std::ostringstream text;
    text << in.rdbuf();
    try {
      const json_value doc = json_reader::parse(text.str());
      if (doc.type != json_value::kind::object) throw std::runtime_error("not a JSON object");
      for (std::size_t i = 0; i < doc.keys.size(); ++i) {
        if (doc.items[i].type == json_value::kind::number) r.metrics.emplace_back(doc.keys[i], doc.items[i].number);
      }
    } catch (const std::exception& e) {
      r.metrics_problem = "bad metrics file";
      say("sweep: " + describe(r) + ": " + path + ": " + e.what());
    }
  }

  int report() {
    // Metric columns: the sort metric first, then the others in the order first seen.
    std::vector<std::string> metric_names;
    for (const run& r : runs_) {
      for (const auto& [key, value] : r.metrics) {
        if (std::find(metric_names.begin(), metric_names.end(), key) == metric_names.end()) {
          metric_names.push_back(key);
        }
      }
    }
    auto sort_at = std::find(metric_names.begin(), metric_names.end(), opts_.sort_metric);
    if (sort_at != metric_names.end()) std::rotate(metric_names.begin(), sort_at, sort_at + 1);

    std::vector<const run*> order;
    for (const run& r : runs_) order.push_back(&r);
    std::stable_sort(order.begin(), order.end(), [&](const run* a, const run* b) {
      const auto va = a->metric(opts_.sort_metric);
      const auto vb = b->metric(opts_.sort_metric);
      if (va.has_value() != vb.has_value()) return va.has_value();
      if (!va) return false;
      return opts_.descending ? *va > *vb : *va < *vb;
    });

    std::vector<std::string> header{"run"};
    for (const grid_entry& g : opts_.grid) header.push_back(g.key);
    header.insert(header.end(), {"status", "elapsed_s"});
    header.insert(header.end(), metric_names.begin(), metric_names.end());
    std::vector<std::vector<std::string>> rows;
    for (const run* r : order) {
      std::vector<std::string> row{std::to_string(r->index)};
      row.insert(row.end(), r->values.begin(), r->values.end());
      row.push_back(r->status());
      row.push_back(r->started && !r->running ? fixed_1(r->wall_s) : "");
      for (const std::string& m : metric_names) {
        const auto v = r->metric(m);
        row.push_back(v ? format_metric(*v) : "");
      }
      rows.push_back(std::move(row));
    }

    std::string csv;
    for (std::size_t c = 0; c < header.size(); ++c) csv += (c ? "," : "") + csv_field(header[c]);
    csv += ",dir\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      for (std::size_t c = 0; c < rows[i].size(); ++c) csv += (c ? "," : "") + csv_field(rows[i][c]);
      csv += "," + csv_field(order[i]->dir) + "\n";
    }
    const std::string csv_path = opts_.out + "/results.csv";
    const bool saved = write_file_atomically(csv_path, csv);

    std::vector<std::size_t> widths(header.size());
    for (std::size_t c = 0; c < header.size(); ++c) {
      widths[c] = header[c].size();
      for (const auto& row : rows) widths[c] = std::max(widths[c], row[c].size());
    }
    std::string table;
    const auto add_row = [&](const std::vector<std::string>& row) {
      std::string line;
      for (std::size_t c = 0; c < row.size(); ++c) {
        const bool numeric = c == 0 || c >= opts_.grid.size() + 2;
        const std::string cell = numeric ? std::string(widths[c] - row[c].size(), ' ') + row[c]
                                         : row[c] + std::string(widths[c] - row[c].size(), ' ');
        line += (c ? "  " : "") + cell;
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      table += line + "\n";
    };
    add_row(header);
    for (const auto& row : rows) add_row(row);
    write_all(STDOUT_FILENO, table);

    std::size_t failed = 0;
    for (const run& r : runs_) failed += r.started && !r.succeeded();
    say("sweep: " + std::to_string(runs_.size() - failed) + " of " + std::to_string(runs_.size()) +
        " runs succeeded" + (saved ? "; table saved as " + csv_path : "; cannot write " + csv_path));
    if (exit_signal_) return 128 + *exit_signal_;
    return failed > 0 || !saved ? exit_failure : 0;
  }

  sweep_options opts_;
  std::string program_;
  std::vector<run> runs_;
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
