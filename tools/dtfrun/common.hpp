// Shared by dtfrun's parts: output that cannot be lost or interleaved badly, messages,
// command-line errors, finding the program to run, reading a whole file.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dtfrun {

using steady = std::chrono::steady_clock;

constexpr int exit_failure = 1;  // a task failed, or could not be started
constexpr int exit_usage = 2;    // bad command line; nothing was started

// ---- small helpers ----------------------------------------------------------------------

// Writes all of `data` to `fd`. Output that cannot be delivered (a closed pipe on dtfrun's
// stdout, say) is dropped: losing a log line must not take the cluster down with it.
inline void write_all(int fd, std::string_view data) {
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

// Everything dtfrun and its tasks print goes through here, so that the live view (a table
// redrawn in place at the bottom of the terminal) can step aside for each log line.
class console {
 public:
  static console& get() {
    static console instance;
    return instance;
  }
  // Lines written to `fd` (whole lines, each ending in '\n'), above the footer; with
  // `new_footer`, the footer drawn below them is that one (lines must fit the terminal).
  void log(int fd, std::string_view text, const std::vector<std::string>* new_footer = nullptr) {
    const std::string erase = erase_sequence();
    if (new_footer != nullptr) {
      footer_text_.clear();
      for (const std::string& l : *new_footer) footer_text_ += l + "\x1b[K\n";
      footer_lines_ = new_footer->size();
    }
    if (erase.empty() && footer_lines_ == 0) {
      write_all(fd, text);
    } else if (fd == STDOUT_FILENO) {
      write_all(STDOUT_FILENO, erase + std::string(text) + footer_text_);
    } else {
      write_all(STDOUT_FILENO, erase);
      write_all(fd, text);
      write_all(STDOUT_FILENO, footer_text_);
    }
  }
  // Replaces the footer (empty: none). Lines must fit the terminal's width.
  void set_footer(const std::vector<std::string>& lines) { log(STDOUT_FILENO, "", &lines); }
  // Leaves the footer on the screen as it is and stops redrawing it.
  void keep_footer() {
    footer_lines_ = 0;
    footer_text_.clear();
  }

 private:
  std::string erase_sequence() const {
    if (footer_lines_ == 0) return "";
    // Up to the footer's first line, column 1, then clear to the end of the screen.
    return "\r\x1b[" + std::to_string(footer_lines_) + "A\x1b[J";
  }
  std::size_t footer_lines_ = 0;
  std::string footer_text_;
};

inline void say(std::string_view message) {
  std::string line = "dtfrun: ";
  line += message;
  line += '\n';
  console::get().log(STDERR_FILENO, line);
}

inline std::string errno_text(int error) { return std::strerror(error); }

inline std::string signal_name(int sig) {
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

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One `--name[=value]` argument of dtfrun's (or dtfrun sweep's) own flags, split: the name as
/// written (for messages), the name with '-' read as '_', and the value after '=' if any.
/// Anything that is not a flag is an error: a stray argument before '--', or a command
/// without its '--'. `rest` is what follows the argument; `help` names the --help to read.
struct flag_arg {
  std::string_view written;
  std::string name;
  std::optional<std::string_view> inline_value;
};

inline flag_arg split_flag(std::string_view arg, std::span<char* const> rest, std::string_view help) {
  if (!arg.starts_with("--")) {
    const bool separator_follows =
        std::find(rest.begin(), rest.end(), std::string_view("--")) != rest.end();
    throw usage_error((separator_follows ? "unexpected argument '" + std::string(arg) + "' before '--'"
                                         : "missing '--' before the command '" + std::string(arg) + "'") +
                      " (see " + std::string(help) + ")");
  }
  flag_arg f;
  f.written = arg.substr(2);
  if (auto eq = f.written.find('='); eq != std::string_view::npos) {
    f.inline_value = f.written.substr(eq + 1);
    f.written = f.written.substr(0, eq);
  }
  f.name = std::string(f.written);
  std::replace(f.name.begin(), f.name.end(), '-', '_');
  return f;
}

// Where the flags of a command line ended: at -h/--help, or at '--', or at the end.
struct flags_end {
  bool help = false;
  bool saw_separator = false;
  int command_at = 0;  // the first argument after '--'; argc when there is none
};

// Reads the flags argv[first], argv[first + 1], ... up to '--' or -h/--help, and calls
// on_flag(f, value) for each: f as split_flag splits it, value() its value (after '=', else the
// next argument; usage_error "--NAME needs a value" when there is none).
template <class OnFlag>
flags_end scan_flags(int argc, char** argv, int first, std::string_view help, OnFlag&& on_flag) {
  flags_end end;
  int i = first;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      end.saw_separator = true;
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      end.help = true;
      break;
    }
    const flag_arg f = split_flag(arg, std::span<char* const>(argv + i, argv + argc), help);
    on_flag(f, [&]() -> std::string_view {
      if (f.inline_value) return *f.inline_value;
      if (i + 1 < argc) return argv[++i];
      throw usage_error("--" + std::string(f.written) + " needs a value");
    });
  }
  end.command_at = i;
  return end;
}

inline long long parse_count(std::string_view flag, std::string_view text, long long max) {
  long long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || value < 0 ||
      value > max) {
    throw usage_error("--" + std::string(flag) + " needs a whole number from 0 to " +
                      std::to_string(max) + ", not '" + std::string(text) + "'");
  }
  return value;
}

inline bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

// Finds the program up front, as execvp would, so that a typo is a usage error before any
// task starts rather than N identical failures after all of them did.
inline std::string resolve_command(const std::string& name) {
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

// The whole of the file at `path`; nothing when it cannot be opened.
inline std::optional<std::string> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace dtfrun
