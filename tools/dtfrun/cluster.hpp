// A cluster's tasks: which there are (ps, chief, workers, evaluator), their addresses and
// output prefixes, and each task's TF_CONFIG; --print-tf-config, which prints those for a
// cluster spread over several hosts and starts nothing.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <dtf/transport/address.hpp>

#include "common.hpp"
#include "options.hpp"
#include "ports.hpp"
#include "process.hpp"
#include "view.hpp"

namespace dtfrun {

struct task {
  std::string job;  // "ps", "chief", "worker", "evaluator"
  int index = 0;
  std::string name;     // "worker.1"
  std::string address;  // "127.0.0.1:40123"; empty for the evaluator
  int listen_fd = -1;   // the socket listening on address, handed to the task (DTF_LISTEN_FD)
  std::string prefix;   // name padded to the common width, then " | "
  pid_t pid = -1;       // also the task's process group id; -1 while not started
  bool running = false;
  std::optional<task_end> end;  // of the latest run
  bool failed = false;          // failed by itself (not in a teardown) and not restarted
  long long restarts = 0;       // starts after the first
  std::optional<steady::time_point> restart_at;  // a failed task waiting to start again
  task_view view;  // progress tokens from its output, CPU and memory from /proc
  std::optional<double> cpu_seconds;  // at the last sample, for CPU %
};

// dtfrun's copy of t's listening socket (the task keeps its own while it runs).
inline void release_port(task& t) {
  if (t.listen_fd >= 0) ::close(t.listen_fd);
  t.listen_fd = -1;
}

// Tasks in start order: ps first (workers connect to them), then chief, workers, evaluator.
inline std::vector<task> list_tasks(const options& opts) {
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
  return tasks;
}

inline std::vector<task> plan_tasks(const options& opts) {
  std::vector<task> tasks = list_tasks(opts);
  port_picker picker(opts.host);
  long long next_port = opts.port_base.value_or(0);
  for (task& t : tasks) {
    if (t.job == "evaluator") continue;
    if (next_port > 65535) throw usage_error("--port-base leaves too few ports below 65536");
    t.address = picker.next_address(static_cast<int>(next_port));
    t.listen_fd = picker.release_last();
    if (next_port != 0) ++next_port;
  }
  if (opts.release_ports)  // only now: until every port is chosen, each is held
    for (task& t : tasks) {
      if (t.listen_fd >= 0) ::close(t.listen_fd);
      t.listen_fd = -1;
    }

  std::size_t width = 0;
  for (const task& t : tasks) width = std::max(width, t.name.size());
  for (task& t : tasks) t.prefix = t.name + std::string(width - t.name.size(), ' ') + " | ";
  return tasks;
}

// TensorFlow's TF_CONFIG: the cluster (empty jobs left out; the evaluator is not a member)
// and this task's type and index.
inline std::string tf_config_for(const std::vector<task>& tasks, const task& self) {
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

// --print-tf-config: the cluster spread over --hosts (see the help text).
inline int print_tf_config(const options& opts) {
  std::vector<task> tasks = list_tasks(opts);
  std::size_t members = 0;
  for (const task& t : tasks) members += t.job != "evaluator";
  // host:port or [v6]:port (dtf's one address parser); a bare IPv6 address has several colons
  // and no brackets, so it is a plain host. An entry meant with a port that does not parse is
  // an error naming why.
  const auto has_port = [](const std::string& h) {
    const bool meant = (h.starts_with('[') && h.find("]:") != std::string::npos) ||
                       std::count(h.begin(), h.end(), ':') == 1;
    if (!meant) return false;
    std::string why;
    if (!dtf::transport::parse_address(h, dtf::transport::address_use::connect, why)) {
      throw usage_error("--hosts entry '" + h + "': " + why);
    }
    return true;
  };
  const bool with_ports = std::all_of(opts.hosts.begin(), opts.hosts.end(), has_port);
  if (!with_ports && std::any_of(opts.hosts.begin(), opts.hosts.end(), has_port)) {
    throw usage_error("--hosts mixes host:port entries and plain hosts");
  }
  if (with_ports && opts.port_base) {
    throw usage_error("--port-base goes with plain host names, not host:port entries");
  }
  if (with_ports && opts.hosts.size() != members) {
    throw usage_error("--hosts lists " + std::to_string(opts.hosts.size()) +
                      " host:port entries for " + std::to_string(members) +
                      " cluster members (ps, chief, workers)");
  }
  const long long base = opts.port_base.value_or(2222);
  std::vector<long long> used(opts.hosts.size(), 0);
  std::size_t next = 0;
  for (task& t : tasks) {
    if (t.job == "evaluator") continue;
    if (with_ports) {
      t.address = opts.hosts[next++];
      continue;
    }
    const std::size_t h = next++ % opts.hosts.size();
    const long long port = base + used[h]++;
    if (port > 65535) throw usage_error("--port-base leaves too few ports below 65536");
    const std::string& host = opts.hosts[h];
    t.address = dtf::transport::format_address(host, static_cast<std::uint16_t>(port));
  }
  std::string out;
  bool found = opts.only_task.empty();
  for (const task& t : tasks) {
    if (!opts.only_task.empty()) {
      if (t.name != opts.only_task) continue;
      found = true;
      out += tf_config_for(tasks, t) + "\n";
    } else {
      out += t.name + "\t" + tf_config_for(tasks, t) + "\n";
    }
  }
  if (!found) throw usage_error("--task '" + opts.only_task + "' is not a task of this cluster");
  write_all(STDOUT_FILENO, out);
  return 0;
}

}  // namespace dtfrun
