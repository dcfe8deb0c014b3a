// A task's output on its way to dtfrun's stdout and stderr: read from the task's pipes, cut
// into lines with the task's name in front ("ps.0     | ..."), and scanned for the progress
// tokens the table shows (step=, loss=, ...). Printing is the caller's (see job_monitor).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "cluster.hpp"
#include "common.hpp"
#include "view.hpp"

namespace dtfrun {

// A task that writes without newlines must not grow dtfrun's memory without bound: a
// partial line this long is printed as a line of its own.
inline constexpr std::size_t max_line_bytes = 64 * 1024;
inline constexpr std::size_t read_chunk_bytes = 64 * 1024;

// One of a task's two output pipes, and the partial line read from it so far. A restarted
// task gets new pipes; the old ones are read until every writer has closed them.
struct output_pipe {
  task* owner = nullptr;
  int fd = -1;
  int target_fd = -1;  // dtfrun's stdout or stderr
  std::string pending;
};

// Takes the whole lines out of p.pending (and a partial line of max_line_bytes, cut), each
// with the task's prefix, as one text: one write per read keeps a task's lines together and
// the number of system calls low. Their progress tokens go into the task's view.
inline std::string take_lines(output_pipe& p) {
  task& t = *p.owner;
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
    parse_progress_tokens(std::string_view(p.pending).substr(start, newline + 1 - start), t.view);
    start = newline + 1;
  }
  p.pending.erase(0, start);
  return text;
}

// Prints what is left of a partial line, as a line, and closes the pipe (p.fd becomes -1).
inline void close_pipe(output_pipe& p) {
  task& t = *p.owner;
  if (!p.pending.empty()) {
    parse_progress_tokens(p.pending, t.view);
    console::get().log(p.target_fd, t.prefix + p.pending + "\n");
    p.pending.clear();
  }
  ::close(p.fd);
  p.fd = -1;
}

// Reads what is available, once (the pipe is non-blocking), and returns the lines to print
// (possibly none). Nothing when nothing was read: at the end of the pipe, or on an error,
// the pipe is closed.
inline std::optional<std::string> read_lines(output_pipe& p) {
  char buffer[read_chunk_bytes];
  const ssize_t n = ::read(p.fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return std::nullopt;
  if (n <= 0) {
    close_pipe(p);
    return std::nullopt;
  }
  p.pending.append(buffer, static_cast<std::size_t>(n));
  return take_lines(p);
}

}  // namespace dtfrun
