// The job table (live view, state file, `dtfrun status`); see view.hpp.
#include "view.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "common.hpp"
#include "json.hpp"

namespace dtfrun {

namespace {

std::optional<double> to_double(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  const std::string copy(text);
  char* end = nullptr;
  const double v = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<long long> to_integer(std::string_view text) {
  long long v = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string format_loss(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, (std::fabs(v) >= 1e4 || (v != 0 && std::fabs(v) < 1e-3)) ? "%.3g" : "%.4f", v);
  return buf;
}

std::string format_bytes(long long bytes) {
  const double mib = double(bytes) / (1024.0 * 1024.0);
  if (mib >= 1024.0) return fixed(mib / 1024.0, 2) + " GiB";
  return fixed(mib, 1) + " MiB";
}

std::string format_elapsed(double seconds) {
  const long long s = static_cast<long long>(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

std::string pad_right(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}
std::string pad_left(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

// Cuts a line to `width` display columns (the table is ASCII, so bytes are columns).
std::string cut(std::string line, std::size_t width) {
  if (width > 0 && line.size() > width) line.resize(width);
  return line;
}

std::string optional_json(const std::optional<long long>& v) {
  return v ? std::to_string(*v) : "null";
}
std::string optional_json(const std::optional<double>& v) {
  if (!v) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", *v);
  return buf;
}

// A member of a state file's object: a number, or a string, when it is one (else none, "").
std::optional<double> number_at(const nlohmann::ordered_json& object, const char* key) {
  const auto it = object.find(key);  // end() unless an object with that member
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}
std::string string_at(const nlohmann::ordered_json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

bool parse_progress_tokens(std::string_view line, task_view& t) {
  bool found = false;
  std::size_t at = 0;
  while (at < line.size()) {
    const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    while (at < line.size() && space(line[at])) ++at;
    std::size_t end = at;
    while (end < line.size() && !space(line[end])) ++end;
    std::string_view token = line.substr(at, end - at);
    at = end;
    // A trailing comma or semicolon belongs to the sentence, not the number.
    while (!token.empty() && (token.back() == ',' || token.back() == ';')) token.remove_suffix(1);
    const auto eq = token.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = token.substr(0, eq);
    const std::string_view value = token.substr(eq + 1);
    if (key == "step") {
      if (auto v = to_integer(value)) t.step = *v, found = true;
    } else if (key == "last_step") {
      if (auto v = to_integer(value)) t.last_step = *v, found = true;
    } else if (key == "loss") {
      if (auto v = to_double(value)) t.loss = *v, found = true;
    } else if (key == "steps_per_sec") {
      if (auto v = to_double(value)) t.steps_per_sec = *v, found = true;
    }
  }
  return found;
}

std::vector<std::string> render_table(const job_view& job, std::size_t width) {
  std::vector<std::string> lines;
  lines.push_back(cut("dtfrun " + std::to_string(job.dtfrun_pid) + " | " + job.phase + " | " +
                          format_elapsed(job.elapsed_s) + " | " + job.command,
                      width));
  std::size_t name_w = 4, state_w = 5;
  for (const task_view& t : job.tasks) {
    name_w = std::max(name_w, t.name.size());
    state_w = std::max(state_w, t.state.size());
  }
  const auto dash = [](bool present, const std::string& text) { return present ? text : "-"; };
  lines.push_back(cut(pad_right("task", name_w) + "  " + pad_right("state", state_w) + "  " +
                          "restarts" + "  " + pad_left("step", 9) + "  " + pad_left("steps/s", 8) + "  " +
                          pad_left("loss", 9) + "  " + pad_left("CPU %", 6) + "  " + pad_left("RSS", 10),
                      width));
  for (const task_view& t : job.tasks) {
    std::string line = pad_right(t.name, name_w) + "  " + pad_right(t.state, state_w) + "  " +
                       pad_left(std::to_string(t.restarts), 8) + "  " +
                       pad_left(dash(t.step.has_value(), t.step ? std::to_string(*t.step) : ""), 9) + "  " +
                       pad_left(dash(t.steps_per_sec.has_value(), t.steps_per_sec ? fixed(*t.steps_per_sec, 1) : ""), 8) +
                       "  " + pad_left(dash(t.loss.has_value(), t.loss ? format_loss(*t.loss) : ""), 9) + "  " +
                       pad_left(dash(t.cpu_percent.has_value(), t.cpu_percent ? fixed(*t.cpu_percent, 1) : ""), 6) +
                       "  " + pad_left(dash(t.rss_bytes.has_value(), t.rss_bytes ? format_bytes(*t.rss_bytes) : ""), 10);
    lines.push_back(cut(line, width));
  }
  const task_view* chief = nullptr;
  for (const task_view& t : job.tasks) {
    if (t.name == job.chief) chief = &t;
  }
  std::string bar_line = "chief " + job.chief + ": ";
  if (chief == nullptr || !chief->step) {
    bar_line += "no step reported yet";
  } else if (!chief->last_step || *chief->last_step <= 0) {
    bar_line += "step " + std::to_string(*chief->step);
  } else {
    const double fraction = std::clamp(double(*chief->step) / double(*chief->last_step), 0.0, 1.0);
    const std::string figures = " " + std::to_string(*chief->step) + "/" + std::to_string(*chief->last_step) + " " +
                                std::to_string(static_cast<int>(fraction * 100.0)) + "%";
    std::string eta;
    if (chief->state == "running" && chief->steps_per_sec && *chief->steps_per_sec > 0 &&
        *chief->step < *chief->last_step) {
      eta = " eta " + format_elapsed(double(*chief->last_step - *chief->step) / *chief->steps_per_sec);
    }
    // The bar takes what the terminal leaves (between 10 and 50 columns).
    const std::size_t used = bar_line.size() + 2 + figures.size() + eta.size();
    std::size_t bar_w = 40;
    if (width > 0) bar_w = width > used + 10 ? std::min<std::size_t>(50, width - used) : 10;
    const auto filled = static_cast<std::size_t>(fraction * double(bar_w) + 0.5);
    bar_line += "[" + std::string(filled, '#') + std::string(bar_w - filled, '.') + "]" + figures + eta;
  }
  lines.push_back(cut(bar_line, width));
  return lines;
}

std::string json_string(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string to_json(const job_view& job) {
  std::string out = "{\"pid\": " + std::to_string(job.dtfrun_pid) + ", \"command\": " + json_string(job.command) +
                    ", \"phase\": " + json_string(job.phase) + ", \"elapsed_s\": " + fixed(job.elapsed_s, 3) +
                    ", \"chief\": " + json_string(job.chief) + ", \"tasks\": [";
  for (std::size_t i = 0; i < job.tasks.size(); ++i) {
    const task_view& t = job.tasks[i];
    out += i == 0 ? "\n  " : ",\n  ";
    out += "{\"name\": " + json_string(t.name) + ", \"state\": " + json_string(t.state) +
           ", \"restarts\": " + std::to_string(t.restarts) + ", \"pid\": " + std::to_string(t.pid) +
           ", \"step\": " + optional_json(t.step) + ", \"last_step\": " + optional_json(t.last_step) +
           ", \"loss\": " + optional_json(t.loss) + ", \"steps_per_sec\": " + optional_json(t.steps_per_sec) +
           ", \"cpu_percent\": " + optional_json(t.cpu_percent) + ", \"rss_bytes\": " + optional_json(t.rss_bytes) +
           "}";
  }
  out += "]}\n";
  return out;
}

job_view job_view_from_json(std::string_view text) {
  const nlohmann::ordered_json doc = parse_json(text);
  if (!doc.is_object()) throw std::runtime_error("a state file holds a JSON object");
  job_view job;
  job.dtfrun_pid = static_cast<pid_t>(number_at(doc, "pid").value_or(-1));
  job.command = string_at(doc, "command");
  job.phase = string_at(doc, "phase");
  job.elapsed_s = number_at(doc, "elapsed_s").value_or(0.0);
  job.chief = string_at(doc, "chief");
  const auto tasks = doc.find("tasks");
  if (tasks == doc.end() || !tasks->is_array()) throw std::runtime_error("no task list");
  for (const nlohmann::ordered_json& item : *tasks) {
    task_view t;
    t.name = string_at(item, "name");
    t.state = string_at(item, "state");
    t.restarts = static_cast<long long>(number_at(item, "restarts").value_or(0));
    t.pid = static_cast<pid_t>(number_at(item, "pid").value_or(-1));
    if (auto v = number_at(item, "step")) t.step = static_cast<long long>(*v);
    if (auto v = number_at(item, "last_step")) t.last_step = static_cast<long long>(*v);
    t.loss = number_at(item, "loss");
    t.steps_per_sec = number_at(item, "steps_per_sec");
    t.cpu_percent = number_at(item, "cpu_percent");
    if (auto v = number_at(item, "rss_bytes")) t.rss_bytes = static_cast<long long>(*v);
    job.tasks.push_back(std::move(t));
  }
  return job;
}

std::string state_directory() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  struct stat info {};
  if (runtime != nullptr && runtime[0] == '/' && ::stat(runtime, &info) == 0 && S_ISDIR(info.st_mode)) {
    return std::string(runtime) + "/dtfrun";
  }
  return "/tmp/dtfrun-" + std::to_string(::getuid());
}

bool write_file_atomically(const std::string& path, std::string_view text) {
  const std::string temporary = path + ".tmp" + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  std::string_view rest = text;
  bool ok = true;
  while (!rest.empty()) {
    const ssize_t n = ::write(fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  ok = ::close(fd) == 0 && ok;
  if (ok && ::rename(temporary.c_str(), path.c_str()) == 0) return true;
  ::unlink(temporary.c_str());
  return false;
}

std::vector<group_usage> sample_groups(const std::vector<pid_t>& groups) {
  std::vector<group_usage> usage(groups.size());
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return usage;
  static const double ticks_per_second = double(::sysconf(_SC_CLK_TCK));
  static const long long page_bytes = ::sysconf(_SC_PAGESIZE);
  while (const dirent* entry = ::readdir(proc)) {
    const auto pid = to_integer(entry->d_name);
    if (!pid) continue;
    const std::string base = std::string("/proc/") + entry->d_name;
    std::ifstream stat_file(base + "/stat");
    std::string stat_line;
    if (!std::getline(stat_file, stat_line)) continue;
    // The command name (field 2) may hold spaces and ')'; the fields after the last ')'
    // are: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime.
    const auto close_paren = stat_line.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream fields(stat_line.substr(close_paren + 1));
    std::string state;
    long long ppid = 0, pgrp = 0, skip = 0, utime = 0, stime = 0;
    fields >> state >> ppid >> pgrp;
    for (int i = 0; i < 8; ++i) fields >> skip;
    fields >> utime >> stime;
    if (!fields) continue;
    const auto it = std::find(groups.begin(), groups.end(), static_cast<pid_t>(pgrp));
    if (it == groups.end() || state == "Z" || state == "X") continue;
    group_usage& u = usage[static_cast<std::size_t>(it - groups.begin())];
    u.found = true;
    u.cpu_seconds += double(utime + stime) / ticks_per_second;
    std::ifstream statm(base + "/statm");
    long long size_pages = 0, resident_pages = 0;
    if (statm >> size_pages >> resident_pages) u.rss_bytes += resident_pages * page_bytes;
  }
  ::closedir(proc);
  return usage;
}

namespace {

bool process_alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

constexpr std::string_view status_usage =
    R"(usage: dtfrun status [PID]

Prints the task table of the running dtfrun job with process id PID, or of every running
dtfrun job of this user when PID is left out, once. The table is what the live view shows:
state, restarts, step, steps/s, loss, CPU % and resident memory of each task, and the
chief's progress. dtfrun keeps it in a state file under $XDG_RUNTIME_DIR/dtfrun (or
/tmp/dtfrun-<uid>), updated about once a second.

exit status: 0 when a table was printed, 1 when no such job runs, 2 for a bad command line.
)";

}  // namespace

int status_main(int argc, char** argv) {
  std::optional<pid_t> wanted;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      write_all(STDOUT_FILENO, status_usage);
      return 0;
    }
    const auto pid = to_integer(arg);
    if (!pid || *pid <= 0 || wanted) {
      say("status takes at most one process id, not '" + std::string(arg) + "' (see dtfrun status --help)");
      return exit_usage;
    }
    wanted = static_cast<pid_t>(*pid);
  }
  const std::string dir = state_directory();
  // Only a directory of this user's that no one else may write holds state files to believe.
  if (struct stat info {}; ::lstat(dir.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode) || info.st_uid != ::getuid() || (info.st_mode & 077) != 0) {
      say("refusing " + dir + ": " +
          (!S_ISDIR(info.st_mode) ? std::string("not a directory")
           : info.st_uid != ::getuid() ? "owned by uid " + std::to_string(info.st_uid) + ", not by this user"
                                       : std::string("open to other users (its mode must be 0700)")));
      return exit_failure;
    }
  }
  std::vector<pid_t> pids;
  if (wanted) {
    pids.push_back(*wanted);
  } else if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(d)) {
      const std::string_view name = entry->d_name;
      if (!name.ends_with(".json")) continue;
      if (auto pid = to_integer(name.substr(0, name.size() - 5))) pids.push_back(static_cast<pid_t>(*pid));
    }
    ::closedir(d);
  }
  std::sort(pids.begin(), pids.end());
  std::size_t width = 0;
  winsize size{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    width = size.ws_col;
  }
  std::string out;
  for (pid_t pid : pids) {
    const std::string path = dir + "/" + std::to_string(pid) + ".json";
    if (!process_alive(pid)) {
      if (!wanted) ::unlink(path.c_str());  // left by a dtfrun that was killed
      continue;
    }
    const auto text = read_whole_file(path);
    if (!text) continue;
    try {
      const job_view job = job_view_from_json(*text);
      if (!out.empty()) out += '\n';
      for (const std::string& line : render_table(job, width)) out += line + '\n';
    } catch (const std::exception& e) {
      say("cannot read " + path + ": " + e.what());
      return exit_failure;
    }
  }
  if (out.empty()) {
    say(wanted ? "no running dtfrun job with pid " + std::to_string(*wanted) + " (no state file in " + dir + ")"
               : "no running dtfrun job found (no state file in " + dir + ")");
    return exit_failure;
  }
  write_all(STDOUT_FILENO, out);
  return 0;
}

}  // namespace dtfrun
