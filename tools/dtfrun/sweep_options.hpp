// `dtfrun sweep`'s command line: the help text, the grid and the other options, and how
// each flag is read. Errors are usage_error (exit status 2, nothing started) naming the flag.
#pragma once

#include <algorithm>
#include <cctype>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"

namespace dtfrun {

inline constexpr std::string_view sweep_usage =
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

inline bool valid_key(std::string_view key) {
  if (key.empty() || key.front() == '-') return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

inline grid_entry parse_grid(std::string_view text) {
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

inline sweep_options parse_sweep_options(int argc, char** argv) {
  sweep_options opts;
  const flags_end end = scan_flags(argc, argv, 2, "dtfrun sweep --help", [&](const flag_arg& f, auto next_value) {
    const auto& [written, name, inline_value] = f;
    if (name != "grid" && name != "parallel" && name != "out" && name != "sort" && name != "timeout_s") {
      throw usage_error("unknown sweep flag '--" + std::string(written) + "' (see dtfrun sweep --help)");
    }
    const std::string_view value = next_value();
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
  });
  if (end.help) {
    opts.help = true;
    return opts;
  }
  const bool saw_separator = end.saw_separator;
  int i = end.command_at;
  if (opts.grid.empty()) throw usage_error("sweep needs at least one --grid KEY=V1,V2,...");
  if (!saw_separator) throw usage_error("missing '--' before the command (see dtfrun sweep --help)");
  if (i >= argc) throw usage_error("missing the command after '--' (see dtfrun sweep --help)");
  for (; i < argc; ++i) opts.command.emplace_back(argv[i]);
  return opts;
}

}  // namespace dtfrun
