// A sweep's results: each run's status and the metrics it wrote (a JSON object of numbers in
// its metrics.json), and the table of every run, sorted by the chosen metric, printed and
// saved as results.csv.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "json.hpp"
#include "process.hpp"
#include "sweep_options.hpp"
#include "view.hpp"

namespace dtfrun {

inline std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

inline std::string format_metric(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

inline std::string fixed_1(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// One combination of the grid's values, run once.
struct sweep_run {
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

// Reads the metrics r wrote (the numbers among the members of a JSON object, in document
// order) once it has ended. A malformed file makes r a "bad metrics file" row, with a message
// after `label` naming the file and what is wrong; a missing one, "no metrics file" (unless
// the run failed anyway).
inline void read_metrics(sweep_run& r, const std::string& label) {
  const std::string path = r.dir + "/metrics.json";
  const std::optional<std::string> text = read_whole_file(path);
  if (!text) {
    if (!r.end->failed()) r.metrics_problem = "no metrics file";
    return;
  }
  try {
    const nlohmann::ordered_json doc = parse_json(*text);
    if (!doc.is_object()) throw std::runtime_error("not a JSON object");
    for (const auto& [key, value] : doc.items()) {
      if (value.is_number()) r.metrics.emplace_back(key, value.get<double>());
    }
  } catch (const std::exception& e) {
    r.metrics_problem = "bad metrics file";
    say("sweep: " + label + ": " + path + ": " + e.what());
  }
}

// Prints the table of every run (its values, status, elapsed_s and metrics; the sort metric's
// column first, runs without it last) and saves it as <out>/results.csv, then a line saying
// how many runs succeeded. Returns the sweep's exit status.
inline int report_results(const sweep_options& opts, const std::vector<sweep_run>& runs,
                          std::optional<int> exit_signal) {
  // Metric columns: the sort metric first, then the others in the order first seen.
  std::vector<std::string> metric_names;
  for (const sweep_run& r : runs) {
    for (const auto& [key, value] : r.metrics) {
      if (std::find(metric_names.begin(), metric_names.end(), key) == metric_names.end()) {
        metric_names.push_back(key);
      }
    }
  }
  auto sort_at = std::find(metric_names.begin(), metric_names.end(), opts.sort_metric);
  if (sort_at != metric_names.end()) std::rotate(metric_names.begin(), sort_at, sort_at + 1);

  std::vector<const sweep_run*> order;
  for (const sweep_run& r : runs) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), [&](const sweep_run* a, const sweep_run* b) {
    const auto va = a->metric(opts.sort_metric);
    const auto vb = b->metric(opts.sort_metric);
    if (va.has_value() != vb.has_value()) return va.has_value();
    if (!va) return false;
    return opts.descending ? *va > *vb : *va < *vb;
  });

  std::vector<std::string> header{"run"};
  for (const grid_entry& g : opts.grid) header.push_back(g.key);
  header.insert(header.end(), {"status", "elapsed_s"});
  header.insert(header.end(), metric_names.begin(), metric_names.end());
  std::vector<std::vector<std::string>> rows;
  for (const sweep_run* r : order) {
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
  const std::string csv_path = opts.out + "/results.csv";
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
      const bool numeric = c == 0 || c >= opts.grid.size() + 2;
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
  for (const sweep_run& r : runs) failed += r.started && !r.succeeded();
  say("sweep: " + std::to_string(runs.size() - failed) + " of " + std::to_string(runs.size()) +
      " runs succeeded" + (saved ? "; table saved as " + csv_path : "; cannot write " + csv_path));
  if (exit_signal) return 128 + *exit_signal;
  return failed > 0 || !saved ? exit_failure : 0;
}

}  // namespace dtfrun
