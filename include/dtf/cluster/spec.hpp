// dtf/cluster/spec.hpp — what a cluster is: its tasks, their addresses, this process's own
// task, and the flags that describe one (dtf/cluster.hpp resolves it).
#pragma once

#include <dtf/error.hpp>
#include <dtf/flags.hpp>
#include <dtf/transport/address.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtf {

/// One task of the cluster: a job name ("chief", "worker", "ps", "evaluator") and an index.
struct task_id {
  /// The job name.
  std::string job;
  /// The task's index in its job.
  std::size_t index = 0;

  /// "job.index", e.g. "worker.1".
  std::string str() const { return job + "." + std::to_string(index); }

  /// Ordered by job, then index.
  auto operator<=>(const task_id&) const = default;
};

/// The addresses of the tasks of a cluster: job -> (index -> "host:port").
///
/// Jobs are "chief", "worker", "ps" and "evaluator". Indices need not be contiguous (the
/// sparse TF_CONFIG form lists only the tasks a task talks to). Addresses are "" while they
/// are still unknown (MPI, before the ranks exchange them).
class cluster_spec {
 public:
  /// job -> (index -> "host:port").
  std::map<std::string, std::map<std::size_t, std::string>> jobs;

  /// How many tasks the job lists; 0 for a job the spec does not have.
  std::size_t num_tasks(std::string_view job) const {
    const auto it = jobs.find(std::string(job));
    return it == jobs.end() ? 0 : it->second.size();
  }

  /// The address of a task. Throws dtf::error(errc::out_of_range) naming the task when the
  /// spec does not list it.
  const std::string& address(const task_id& task) const {
    if (const auto job = jobs.find(task.job); job != jobs.end())
      if (const auto it = job->second.find(task.index); it != job->second.end()) return it->second;
    throw error(errc::out_of_range, "the cluster spec has no task " + task.str());
  }

  /// The tasks of a job in index order; empty for a job the spec does not have.
  std::vector<task_id> tasks(std::string_view job) const {
    std::vector<task_id> out;
    if (const auto it = jobs.find(std::string(job)); it != jobs.end())
      for (const auto& [index, address] : it->second) out.push_back({it->first, index});
    return out;
  }

  /// The spec as TF_CONFIG's "cluster" object: a job whose indices are 0..n-1 is a list of
  /// addresses, any other job the sparse {"index": "address"} object.
  nlohmann::json to_json() const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [job, tasks] : jobs) {
      bool dense = true;
      std::size_t expected = 0;
      for (const auto& entry : tasks) dense = dense && entry.first == expected++;
      nlohmann::json list = dense ? nlohmann::json::array() : nlohmann::json::object();
      for (const auto& [index, address] : tasks) {
        if (dense) list.push_back(address);
        else list[std::to_string(index)] = address;
      }
      out[job] = std::move(list);
    }
    return out;
  }
};

/// A resolved cluster: the spec, this process's task, and where both came from.
struct cluster {
  /// The cluster's tasks and addresses.
  cluster_spec spec;
  /// This process's task.
  task_id self;
  std::string source;      ///< "flags", "TF_CONFIG", "slurm" or "mpi"
  std::string rendezvous;  ///< MPI only: host:port where the ranks exchange their addresses
  /// An identifier of this job's launch, shared by its tasks: set from the launcher's job id
  /// under Slurm and MPI (dtf/cluster/from_scheduler.hpp), where the spec alone is the same for
  /// every job of that size on those hosts; empty for clusters from flags or TF_CONFIG. id()
  /// includes it when it is not empty.
  std::string launch_id;

  /// The chief: chief.0 when the spec has a chief job, otherwise worker.0 (whether or not
  /// a sparse spec lists it).
  task_id chief() const {
    if (const auto it = spec.jobs.find("chief"); it != spec.jobs.end() && !it->second.empty())
      return {"chief", it->second.begin()->first};
    return {"worker", 0};
  }

  /// Whether this process is the chief.
  bool is_chief() const { return self == chief(); }

  /// The number of ps tasks.
  std::size_t num_ps() const { return spec.num_tasks("ps"); }
  /// The number of worker tasks (the chief job not included).
  std::size_t num_workers() const { return spec.num_tasks("worker"); }

  /// A stable identifier of the cluster: the FNV-1a 64-bit hash of its jobs, indices and
  /// addresses in canonical order, then of `launch_id` when it is set, as 16 lower-case hex
  /// digits. Tasks compare it in the transport handshake to refuse peers from another cluster
  /// (and it keys TLS: two MPI or Slurm launches on the same hosts get different keys from one
  /// secret). It does not depend on `self`, and jobs without tasks do not count.
  std::string id() const {
    std::uint64_t hash = 0xcbf29ce484222325ull;
    const auto feed = [&hash](std::string_view bytes) {
      for (const unsigned char byte : bytes) {
        hash ^= byte;
        hash *= 0x100000001b3ull;
      }
    };
    // Control characters separate the fields: none can occur in a validated job or address.
    for (const auto& [job, tasks] : spec.jobs) {
      if (tasks.empty()) continue;
      feed(job);
      feed(std::string_view("\x1d", 1));
      for (const auto& [index, address] : tasks) {
        feed(std::to_string(index));
        feed(std::string_view("\x1f", 1));
        feed(address);
        feed(std::string_view("\x1e", 1));
      }
      feed(std::string_view("\x1c", 1));
    }
    if (!launch_id.empty()) {  // after a separator no job or address holds: no spec collides with it
      feed(std::string_view("\x1a", 1));
      feed(launch_id);
    }
    static constexpr char digits[] = "0123456789abcdef";
    std::string out(16, '0');
    for (int i = 15; i >= 0; --i, hash >>= 4) out[std::size_t(i)] = digits[hash & 0xf];
    return out;
  }
};

/// Reads an environment variable: its value, or nullopt when it is not set.
using environment = std::function<std::optional<std::string>(const std::string&)>;

/// The process's real environment (std::getenv). The only place dtf reads it.
inline environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    if (const char* value = std::getenv(name.c_str())) return std::string(value);
    return std::nullopt;
  };
}

/// The cluster flags of a dtf program, with their defaults.
struct cluster_flags {
  std::string job_name;      ///< chief, master (alias of chief), worker, ps or evaluator
  std::string ps_hosts;      ///< comma-separated host:port list of the ps tasks
  std::string worker_hosts;  ///< comma-separated host:port list of the workers
  std::string chief_host;    ///< host:port of the chief; empty: worker 0 is the chief
  std::string rendezvous;    ///< MPI: host:port where the ranks exchange their addresses
  int task_index = -1;       ///< this task's index within job_name
  int num_ps = 1;            ///< Slurm and MPI: how many of the first ranks are ps tasks
  int base_port = 2222;      ///< Slurm: port of each node's first task; the next ones count up
};

/// Registers --job_name --task_index --ps_hosts --worker_hosts --chief_host --num_ps
/// --base_port --rendezvous on the parser, bound to the fields of `flags`.
inline void add_cluster_flags(flag_parser& parser, cluster_flags& flags) {
  parser.add("job_name", flags.job_name, "this task's job: chief, master, worker, ps or evaluator (with the host lists: an explicit cluster)")
      .add("task_index", flags.task_index, "this task's index within --job_name")
      .add("ps_hosts", flags.ps_hosts, "comma-separated host:port list of the ps tasks")
      .add("worker_hosts", flags.worker_hosts, "comma-separated host:port list of the workers")
      .add("chief_host", flags.chief_host, "host:port of the chief; without it worker 0 is the chief")
      .add("num_ps", flags.num_ps, "under Slurm or MPI: how many of the first ranks are ps tasks")
      .add("base_port", flags.base_port, "under Slurm: port of the first task on each node; the node's next tasks count up")
      .add("rendezvous", flags.rendezvous, "under MPI: host:port where the ranks exchange their addresses");
}

}  // namespace dtf
