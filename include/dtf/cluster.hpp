// dtf/cluster.hpp — who is in the job, and which task this process is.
//
// Every task runs the same binary; resolve_cluster() works out the cluster spec (job ->
// index -> "host:port") and this process's own task from the first of these that is given:
//
//   1. explicit flags   --job_name --task_index --ps_hosts --worker_hosts [--chief_host]
//   2. TF_CONFIG        {"cluster": {"chief": [...], "worker": [...], "ps": [...]},
//                        "task": {"type": "worker", "index": 1}}   (Kubeflow's TFJob writes it)
//   3. Slurm            SLURM_PROCID set: srun started the tasks; addresses come from the
//                        step's node list and task layout, ports from --base_port
//   4. MPI              OMPI_COMM_WORLD_RANK or PMI_RANK set: mpirun started the tasks; the
//                        ranks meet at --rendezvous to exchange their addresses (the exchange
//                        itself is dtf::make_communicator in <dtf/collectives.hpp>: rank 0
//                        listens there, collects every rank's address and tells everyone)
//
//   dtf::cluster_flags cf;
//   dtf::flag_parser flags("Trains with downpour SGD.");
//   dtf::add_cluster_flags(flags, cf);
//   if (!flags.parse(argc, argv)) return 0;
//   const dtf::cluster c = dtf::resolve_cluster(cf);
//   if (c.is_chief()) { ... }
//
// A cluster without a chief job makes worker 0 the chief. Under Slurm and MPI the first
// --num_ps ranks are ps tasks and the rest are workers.
//
// The environment is read only through a dtf::environment, a function from a variable's
// name to its value; process_environment() is the one that reads the real one, so that
// tests and embedding programs can pass their own.
//
// Errors: a malformed or contradictory configuration throws dtf::error(errc::invalid_config)
// whose message names the flag, variable or TF_CONFIG field at fault, for example
// "TF_CONFIG: cluster.worker[1]: bad address 'foo' (expected host:port)". dtf never guesses
// past such an error.
//
// Thread safety: the types here are plain values; const member functions may be called
// concurrently. process_environment() reads the environment with std::getenv, which must
// not race with setenv.
#pragma once

#include <dtf/error.hpp>
#include <dtf/transport/address.hpp>
#include <dtf/flags.hpp>

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
  std::string job;
  std::size_t index = 0;

  /// "job.index", e.g. "worker.1".
  std::string str() const { return job + "." + std::to_string(index); }

  auto operator<=>(const task_id&) const = default;
};

/// The addresses of the tasks of a cluster: job -> (index -> "host:port").
///
/// Jobs are "chief", "worker", "ps" and "evaluator". Indices need not be contiguous (the
/// sparse TF_CONFIG form lists only the tasks a task talks to). Addresses are "" while they
/// are still unknown (MPI, before the ranks exchange them).
class cluster_spec {
 public:
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
  cluster_spec spec;
  task_id self;
  std::string source;      ///< "flags", "TF_CONFIG", "slurm" or "mpi"
  std::string rendezvous;  ///< MPI only: host:port where the ranks exchange their addresses

  /// The chief: chief.0 when the spec has a chief job, otherwise worker.0 (whether or not
  /// a sparse spec lists it).
  task_id chief() const {
    if (const auto it = spec.jobs.find("chief"); it != spec.jobs.end() && !it->second.empty())
      return {"chief", it->second.begin()->first};
    return {"worker", 0};
  }

  /// Whether this process is the chief.
  bool is_chief() const { return self == chief(); }

  std::size_t num_ps() const { return spec.num_tasks("ps"); }
  std::size_t num_workers() const { return spec.num_tasks("worker"); }

  /// A stable identifier of the spec: the FNV-1a 64-bit hash of its jobs, indices and
  /// addresses in canonical order, as 16 lower-case hex digits. Tasks compare it in the
  /// transport handshake to refuse peers from another cluster. It does not depend on
  /// `self`, and jobs without tasks do not count.
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

namespace detail {

[[noreturn]] inline void config_error(const std::string& message) { throw error(errc::invalid_config, message); }

inline std::string_view trim_blanks(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

inline bool is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Digits only (no sign, no blanks); nullopt when empty, not decimal or too large.
inline std::optional<std::uint64_t> parse_decimal(std::string_view s) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), is_digit)) return std::nullopt;
  std::uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

inline const char* known_jobs_text() { return "chief, master, worker, ps, evaluator"; }

// The job a name stands for ("master" is the legacy name of "chief"); nullopt when unknown.
inline std::optional<std::string> canonical_job(std::string_view name) {
  if (name == "master") return "chief";
  if (name == "chief" || name == "worker" || name == "ps" || name == "evaluator") return std::string(name);
  return std::nullopt;
}

inline std::string label(std::string_view job, std::size_t index) {
  return std::string(job) + "[" + std::to_string(index) + "]";
}

// Finds an address given to two tasks, across all jobs.
class address_registry {
 public:
  // `label` names the task as the user wrote it ("master[0]"), `field` the place to blame.
  void add(const std::string& address, const std::string& label, const std::string& field) {
    if (address.empty()) return;
    const auto [it, inserted] = seen_.emplace(address, label);
    if (!inserted) config_error(field + ": duplicate address " + address + " (also " + it->second + ")");
  }

 private:
  std::map<std::string, std::string> seen_;
};

// A Slurm step or MPI world larger than this is a malformed variable, not a real job; the
// bound keeps a bad value from allocating without limit.
inline constexpr std::uint64_t max_cluster_tasks = std::uint64_t(1) << 20;

// Splits text on commas outside brackets.
inline std::vector<std::string_view> split_top_level(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t depth = 0, start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') ++depth;
    else if (text[i] == ']' && depth > 0) --depth;
    else if (text[i] == ',' && depth == 0) {
      out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(text.substr(start));
  return out;
}

inline std::vector<std::string> expand_nodelist(std::string_view list, const std::string& field) {
  const auto fail = [&](const std::string& why) {
    config_error(field + ": bad node list '" + std::string(list) + "': " + why);
  };
  // Brackets first, so that the errors below can assume they pair up.
  std::size_t depth = 0;
  for (const char c : list) {
    if (c == '[' && depth++ > 0) fail("nested '['");
    if (c == ']' && depth-- == 0) fail("unbalanced ']'");
  }
  if (depth != 0) fail("unbalanced '['");
  if (trim_blanks(list).empty()) fail("empty");

  std::vector<std::string> hosts;
  std::size_t position = 0;
  for (const std::string_view item : split_top_level(list)) {
    if (item.empty()) fail("empty host name at position " + std::to_string(position));
    ++position;
    // A host pattern is literal text and bracket groups; the groups multiply out, the
    // leftmost varying slowest ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2).
    std::vector<std::string> names{""};
    std::size_t pos = 0;
    while (pos <= item.size()) {
      const std::size_t open = std::min(item.find('[', pos), item.size());
      const std::string_view literal = item.substr(pos, open - pos);
      for (const char c : literal)
        if (!is_alnum(c) && c != '-' && c != '.' && c != '_')
          fail("unexpected character '" + std::string(1, c) + "' in host name '" + std::string(item) + "'");
      for (auto& name : names) name += literal;
      if (open == item.size()) break;
      const std::size_t close = item.find(']', open);
      const std::string_view group = item.substr(open + 1, close - open - 1);
      if (group.empty()) fail("empty brackets in '" + std::string(item) + "'");
      std::vector<std::string> values;
      for (const std::string_view range : split_top_level(group)) {
        const std::size_t dash = range.find('-');
        const std::string_view lo_text = range.substr(0, dash);
        const std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
        const auto lo = parse_decimal(lo_text), hi = parse_decimal(hi_text);
        if (!lo || !hi) fail("bad range '" + std::string(range) + "' in '" + std::string(item) + "' (expected N or N-M)");
        if (*lo > *hi) fail("range " + std::string(range) + " is descending");
        if (*hi - *lo >= max_cluster_tasks || values.size() + (*hi - *lo) >= max_cluster_tasks)
          fail("more than " + std::to_string(max_cluster_tasks) + " hosts");
        // Slurm pads every number to the width of the range's lower bound ("01-10").
        for (std::uint64_t v = *lo; v <= *hi; ++v) {
          std::string digits = std::to_string(v);
          if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
          values.push_back(std::move(digits));
        }
      }
      if (names.size() * values.size() > max_cluster_tasks) fail("more than " + std::to_string(max_cluster_tasks) + " hosts");
      std::vector<std::string> product;
      product.reserve(names.size() * values.size());
      for (const auto& name : names)
        for (const auto& value : values) product.push_back(name + value);
      names = std::move(product);
      pos = close + 1;
    }
    if (hosts.size() + names.size() > max_cluster_tasks) fail("more than " + std::to_string(max_cluster_tasks) + " hosts");
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

// "2(x3),1" -> 2 2 2 1.
inline std::vector<std::size_t> parse_tasks_per_node(std::string_view text, const std::string& field) {
  const auto fail = [&](const std::string& why) {
    config_error(field + ": bad tasks-per-node list '" + std::string(text) + "': " + why);
  };
  std::vector<std::size_t> counts;
  for (std::string_view item : split_top_level(text)) {
    item = trim_blanks(item);
    std::string_view count_text = item, repeat_text = "1";
    if (const std::size_t paren = item.find('('); paren != std::string_view::npos) {
      if (!item.ends_with(')') || item.substr(paren, 2) != "(x")
        fail("expected N or N(xM), got '" + std::string(item) + "'");
      count_text = item.substr(0, paren);
      repeat_text = item.substr(paren + 2, item.size() - paren - 3);
    }
    const auto count = parse_decimal(count_text), repeat = parse_decimal(repeat_text);
    if (!count || !repeat || *count == 0 || *repeat == 0)
      fail("expected N or N(xM) with N, M >= 1, got '" + std::string(item) + "'");
    if (*count > max_cluster_tasks || *repeat > max_cluster_tasks - counts.size())
      fail("more than " + std::to_string(max_cluster_tasks) + " nodes or tasks");
    counts.insert(counts.end(), std::size_t(*repeat), std::size_t(*count));
  }
  return counts;
}

// A variable holding a count or rank.
inline std::uint64_t env_number(const std::string& name, const std::string& value) {
  const auto parsed = parse_decimal(trim_blanks(value));
  if (!parsed) config_error(name + " '" + value + "' is not a non-negative integer");
  return *parsed;
}

// The first of two variables that is set, with its name.
inline std::pair<std::string, std::optional<std::string>> first_set(const environment& env, const std::string& first,
                                                                    const std::string& second) {
  if (auto value = env(first)) return {first, std::move(value)};
  return {second, env(second)};
}

// Rank r of a Slurm or MPI world: ranks 0..num_ps-1 are ps tasks, the rest workers.
inline task_id rank_task(std::size_t rank, std::size_t num_ps) {
  return rank < num_ps ? task_id{"ps", rank} : task_id{"worker", rank - num_ps};
}

inline void check_has_workers(std::size_t num_ps, std::size_t num_tasks, const std::string& what) {
  if (num_ps >= num_tasks)
    config_error("--num_ps " + std::to_string(num_ps) + " leaves no workers: " + what + " is " +
                 std::to_string(num_tasks));
}

}  // namespace detail

/// Splits "host:port" or "[ipv6]:port" into the host (without brackets) and the port.
/// Throws dtf::error(errc::invalid_config) starting with `field` when the host is empty or
/// holds characters a host name or address cannot, an IPv6 address is not in brackets, or
/// the port is missing, not a number or outside 1..65535.
inline std::pair<std::string, std::uint16_t> split_host_port(std::string_view addr, std::string_view field) {
  std::string why;
  auto parsed = transport::parse_address(addr, transport::address_use::connect, why);
  if (!parsed) detail::config_error(std::string(field) + ": bad address '" + std::string(addr) + "' (" + why + ")");
  return {std::move(parsed->host), parsed->port};
}

/// Expands a Slurm node list: "n[1-3],m5" -> n1 n2 n3 m5; "node[01-03,7]" -> node01 node02
/// node03 node7 (numbers keep the width of the range's lower bound); several bracket groups
/// in one name multiply out, the leftmost varying slowest. Throws
/// dtf::error(errc::invalid_config) for a descending range, unbalanced or nested brackets,
/// an empty name or range, or a character a host name cannot hold.
inline std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  return detail::expand_nodelist(list, "Slurm");
}

/// The cluster given by explicit flags: --ps_hosts, --worker_hosts and --chief_host list the
/// tasks, --job_name and --task_index say which one this process is. An evaluator may be
/// absent from the spec. Throws dtf::error(errc::invalid_config) naming the flag for an
/// unknown job, a negative or out-of-range index, an empty list entry, a bad or duplicate
/// address, more than one chief, or a cluster with neither a chief nor a worker.
inline cluster cluster_from_flags(const cluster_flags& flags) {
  if (flags.job_name.empty())
    detail::config_error(std::string("--job_name: required (one of ") + detail::known_jobs_text() + ")");
  const auto job = detail::canonical_job(flags.job_name);
  if (!job) detail::config_error("--job_name '" + flags.job_name + "' is not one of " + detail::known_jobs_text());
  if (flags.task_index < 0)
    detail::config_error("--task_index " + std::to_string(flags.task_index) +
                         " is negative: pass this task's index within --job_name");

  cluster c;
  c.source = "flags";
  detail::address_registry seen;
  const auto add_hosts = [&](const std::string& flag, std::string_view text, const std::string& job_name, bool single) {
    if (detail::trim_blanks(text).empty()) return;
    const auto entries = detail::split_top_level(text);
    if (single && entries.size() > 1)
      detail::config_error(flag + ": expected one host:port, got " + std::to_string(entries.size()));
    auto& tasks = c.spec.jobs[job_name];
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::string address(detail::trim_blanks(entries[i]));
      if (address.empty()) detail::config_error(flag + ": empty entry " + detail::label(job_name, i) + " in '" + std::string(text) + "'");
      split_host_port(address, flag);
      seen.add(address, detail::label(job_name, i), flag);
      tasks[i] = address;
    }
  };
  add_hosts("--chief_host", flags.chief_host, "chief", true);
  add_hosts("--ps_hosts", flags.ps_hosts, "ps", false);
  add_hosts("--worker_hosts", flags.worker_hosts, "worker", false);
  if (c.spec.num_tasks("chief") + c.spec.num_tasks("worker") == 0)
    detail::config_error("--worker_hosts: empty: the cluster needs at least one worker (or a --chief_host)");

  c.self = {*job, std::size_t(flags.task_index)};
  if (*job != "evaluator" && c.self.index >= c.spec.num_tasks(*job)) {
    const std::string list_flag = *job == "chief" ? "--chief_host" : "--" + *job + "_hosts";
    detail::config_error("--task_index " + std::to_string(flags.task_index) + " out of range: " + list_flag + " lists " +
                         std::to_string(c.spec.num_tasks(*job)) + " " + *job + " tasks");
  }
  return c;
}

/// The cluster given by a TF_CONFIG document. Jobs may be lists of addresses or sparse
/// {"index": "address"} objects; "master" is the legacy name of "chief" (stored as "chief");
/// task.index may be a number or a numeric string; a task of type "evaluator" may be absent
/// from the cluster. Keys other than "cluster" and "task" ("environment", "rpc_layer") are
/// ignored. Throws dtf::error(errc::invalid_config) naming the field for malformed JSON, a
/// missing or mistyped cluster or task, an unknown job, both chief and master, a chief job
/// without exactly one task (index 0), a bad or duplicate address, a bad sparse index, an
/// unknown task type, or a task index the cluster does not list.
inline cluster cluster_from_tf_config(std::string_view text) {
  using nlohmann::json;
  const std::string prefix = "TF_CONFIG: ";
  const auto fail = [&](const std::string& message) { detail::config_error(prefix + message); };
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    fail(std::string("malformed JSON: ") + e.what());
  }
  if (!doc.is_object()) fail(std::string("expected an object with \"cluster\" and \"task\", got ") + doc.type_name());

  cluster c;
  c.source = "TF_CONFIG";
  const auto cluster_it = doc.find("cluster");
  if (cluster_it == doc.end()) fail("cluster: missing");
  if (!cluster_it->is_object()) fail(std::string("cluster: expected an object of jobs, got ") + cluster_it->type_name());
  if (cluster_it->contains("chief") && cluster_it->contains("master")) fail("cluster has both 'chief' and 'master'");

  detail::address_registry seen;
  for (const auto& [name, list] : cluster_it->items()) {
    const auto job = detail::canonical_job(name);
    if (!job) fail("cluster." + name + ": unknown job (expected one of " + detail::known_jobs_text() + ")");
    std::map<std::size_t, std::string> tasks;
    const auto add = [&](std::size_t index, const json& value) {
      const std::string field = prefix + "cluster." + detail::label(name, index);
      if (!value.is_string()) detail::config_error(field + ": expected a \"host:port\" string, got " + value.type_name());
      const auto& address = value.get_ref<const std::string&>();
      split_host_port(address, field);
      seen.add(address, detail::label(name, index), field);
      tasks[index] = address;
    };
    if (list.is_array()) {
      for (std::size_t i = 0; i < list.size(); ++i) add(i, list[i]);
    } else if (list.is_object()) {
      for (const auto& [key, value] : list.items()) {
        const auto index = detail::parse_decimal(key);
        if (!index) fail("cluster." + name + ": index '" + key + "' is not a non-negative integer");
        if (tasks.count(std::size_t(*index))) fail("cluster." + name + ": index " + std::to_string(*index) + " appears twice");
        add(std::size_t(*index), value);
      }
    } else {
      fail("cluster." + name + ": expected a list of addresses or an {\"index\": \"address\"} object, got " +
           list.type_name());
    }
    if (*job == "chief" && (tasks.size() != 1 || tasks.begin()->first != 0))
      fail("cluster." + name + ": must have exactly one task, with index 0 (has " + std::to_string(tasks.size()) + ")");
    if (!tasks.empty()) c.spec.jobs[*job] = std::move(tasks);
  }
  if (c.spec.num_tasks("chief") + c.spec.num_tasks("worker") == 0) fail("cluster: has neither a chief nor a worker");

  const auto task_it = doc.find("task");
  if (task_it == doc.end()) fail("task: missing (expected {\"type\": ..., \"index\": ...})");
  if (!task_it->is_object()) fail(std::string("task: expected an object, got ") + task_it->type_name());
  const auto type_it = task_it->find("type");
  if (type_it == task_it->end()) fail("task.type: missing");
  if (!type_it->is_string()) fail(std::string("task.type: expected a string, got ") + type_it->type_name());
  const auto& type = type_it->get_ref<const std::string&>();
  const auto job = detail::canonical_job(type);
  if (!job) fail("task.type '" + type + "' is not one of " + detail::known_jobs_text());

  const auto index_it = task_it->find("index");
  if (index_it == task_it->end()) fail("task.index: missing");
  std::uint64_t index = 0;
  if (index_it->is_number_unsigned()) {
    index = index_it->get<std::uint64_t>();
  } else if (index_it->is_number_integer()) {
    fail("task.index " + index_it->dump() + " is negative");
  } else if (index_it->is_string()) {
    const auto parsed = detail::parse_decimal(index_it->get_ref<const std::string&>());
    if (!parsed) fail("task.index " + index_it->dump() + " is not a non-negative integer");
    index = *parsed;
  } else {
    fail("task.index " + index_it->dump() + " is not a non-negative integer");
  }
  c.self = {*job, std::size_t(index)};

  const bool outside_evaluator = *job == "evaluator" && c.spec.num_tasks("evaluator") == 0;
  if (!outside_evaluator) {
    const auto job_it = c.spec.jobs.find(*job);
    if (job_it == c.spec.jobs.end() || !job_it->second.count(c.self.index)) {
      const std::size_t n = c.spec.num_tasks(*job);
      const bool dense = n == 0 || job_it->second.rbegin()->first == n - 1;
      if (dense)
        fail("task.index " + std::to_string(index) + " out of range: the cluster has " + std::to_string(n) + " " + type +
             " tasks");
      fail("task.index " + std::to_string(index) + ": cluster." + type + " lists no task " + std::to_string(index));
    }
  }
  return c;
}

/// The cluster of a Slurm step (tasks started by srun). Reads SLURM_PROCID,
/// SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST),
/// SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE, e.g. "2(x3),1"; without it each node
/// runs ceil(tasks / nodes) tasks, the last ones fewer) and SLURM_DISTRIBUTION (block, the
/// default, or cyclic). Rank r runs on the node that layout gives it, listening on
/// base_port + its index among the ranks of that node. Ranks 0..num_ps-1 are ps tasks, the
/// others workers (worker index r - num_ps); there is no chief job, so worker 0 is the chief.
/// When SLURM_NODEID or SLURM_LOCALID is set it must agree with the computed layout.
/// Throws dtf::error(errc::invalid_config) naming the variable (or --num_ps, --base_port)
/// for a missing or non-numeric variable, a bad node list or tasks-per-node list, a layout
/// that does not add up, SLURM_PROCID >= the task count, num_ps >= the task count, a port
/// past 65535, or a distribution other than block or cyclic.
inline cluster cluster_from_slurm(const environment& env, std::size_t num_ps, std::uint16_t base_port) {
  const auto procid_text = env("SLURM_PROCID");
  if (!procid_text) detail::config_error("SLURM_PROCID: not set (is this task running under srun?)");
  const std::uint64_t procid = detail::env_number("SLURM_PROCID", *procid_text);

  const auto [ntasks_var, ntasks_text] = detail::first_set(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS");
  if (!ntasks_text) detail::config_error("SLURM_STEP_NUM_TASKS: not set (nor SLURM_NTASKS)");
  const std::uint64_t ntasks = detail::env_number(ntasks_var, *ntasks_text);
  if (ntasks == 0) detail::config_error(ntasks_var + " is 0");
  if (ntasks > detail::max_cluster_tasks)
    detail::config_error(ntasks_var + " " + std::to_string(ntasks) + " is more than dtf's limit of " +
                         std::to_string(detail::max_cluster_tasks) + " tasks");
  if (procid >= ntasks)
    detail::config_error("SLURM_PROCID " + std::to_string(procid) + " out of range: " + ntasks_var + " is " +
                         std::to_string(ntasks));
  detail::check_has_workers(num_ps, std::size_t(ntasks), "the Slurm step's task count " + ntasks_var);
  if (base_port == 0) detail::config_error("--base_port 0 is not a port (expected 1..65535)");

  const auto [nodelist_var, nodelist] = detail::first_set(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
  if (!nodelist) detail::config_error("SLURM_STEP_NODELIST: not set (nor SLURM_JOB_NODELIST)");
  const std::vector<std::string> nodes = detail::expand_nodelist(*nodelist, nodelist_var);

  std::vector<std::size_t> per_node;
  const auto [layout_var, layout] = detail::first_set(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
  if (layout) {
    per_node = detail::parse_tasks_per_node(*layout, layout_var);
    if (per_node.size() != nodes.size())
      detail::config_error(layout_var + " '" + *layout + "' describes " + std::to_string(per_node.size()) + " nodes but " +
                           nodelist_var + " lists " + std::to_string(nodes.size()));
    std::uint64_t sum = 0;
    for (const auto n : per_node) sum += n;
    if (sum != ntasks)
      detail::config_error(layout_var + " '" + *layout + "' adds up to " + std::to_string(sum) + " tasks but " + ntasks_var +
                           " is " + std::to_string(ntasks));
  } else {
    const std::size_t per = std::size_t((ntasks + nodes.size() - 1) / nodes.size());
    std::size_t left = std::size_t(ntasks);
    for (std::size_t i = 0; i < nodes.size(); ++i, left -= std::min(per, left)) per_node.push_back(std::min(per, left));
  }

  bool cyclic = false;
  if (const auto distribution = env("SLURM_DISTRIBUTION")) {
    const std::string_view kind = std::string_view(*distribution).substr(0, distribution->find_first_of(":,"));
    if (kind == "cyclic") cyclic = true;
    else if (kind != "block" && !kind.empty())
      detail::config_error("SLURM_DISTRIBUTION '" + *distribution +
                           "': dtf derives task addresses for block or cyclic distribution only (srun --distribution=block)");
  }

  // node_of[r], local_of[r]: the node rank r runs on, and its index among that node's ranks.
  std::vector<std::size_t> node_of, local_of;
  std::vector<std::size_t> used(nodes.size(), 0);
  const auto place = [&](std::size_t node) {
    node_of.push_back(node);
    local_of.push_back(used[node]++);
  };
  if (cyclic) {
    while (node_of.size() < ntasks)
      for (std::size_t node = 0; node < nodes.size(); ++node)
        if (used[node] < per_node[node]) place(node);
  } else {
    for (std::size_t node = 0; node < nodes.size(); ++node)
      while (used[node] < per_node[node]) place(node);
  }

  cluster c;
  c.source = "slurm";
  detail::address_registry seen;
  for (std::size_t rank = 0; rank < ntasks; ++rank) {
    const std::size_t port = std::size_t(base_port) + local_of[rank];
    if (port > 65535)
      detail::config_error("--base_port " + std::to_string(base_port) + ": rank " + std::to_string(rank) + " is task " +
                           std::to_string(local_of[rank]) + " on node " + nodes[node_of[rank]] + ", and port " +
                           std::to_string(port) + " is past 65535");
    const task_id task = detail::rank_task(rank, num_ps);
    const std::string address = nodes[node_of[rank]] + ":" + std::to_string(port);
    split_host_port(address, nodelist_var);
    seen.add(address, detail::label(task.job, task.index), nodelist_var);
    c.spec.jobs[task.job][task.index] = address;
  }
  c.self = detail::rank_task(std::size_t(procid), num_ps);

  const auto agree = [&](const char* name, std::size_t expected, const char* what) {
    if (const auto value = env(name); value && detail::env_number(name, *value) != expected)
      detail::config_error(std::string(name) + " " + *value + " disagrees with the layout from " + nodelist_var + " and " +
                           (layout ? layout_var : ntasks_var) + ", which puts SLURM_PROCID " + std::to_string(procid) +
                           " at " + what + " " + std::to_string(expected));
  };
  agree("SLURM_NODEID", node_of[procid], "node");
  agree("SLURM_LOCALID", local_of[procid], "local index");
  return c;
}

/// The cluster of an MPI world (tasks started by mpirun). Reads OMPI_COMM_WORLD_RANK and
/// OMPI_COMM_WORLD_SIZE (Open MPI), or else PMI_RANK and PMI_SIZE (MPICH, Intel MPI). Ranks
/// 0..num_ps-1 are ps tasks, the others workers; there is no chief job, so worker 0 is the
/// chief. Addresses are left "" and `rendezvous` is set: the ranks fill the spec in by
/// meeting there. Throws dtf::error(errc::invalid_config) naming the variable (or
/// --num_ps, --rendezvous) when neither rank variable is set, the size is missing, either is
/// not a number, rank >= size, num_ps >= size, or rendezvous is empty or not host:port.
inline cluster cluster_from_mpi(const environment& env, std::size_t num_ps, const std::string& rendezvous) {
  std::string rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE";
  auto rank_text = env(rank_var);
  if (!rank_text) {
    rank_var = "PMI_RANK";
    size_var = "PMI_SIZE";
    rank_text = env(rank_var);
  }
  if (!rank_text) detail::config_error("OMPI_COMM_WORLD_RANK: not set (nor PMI_RANK): is this task running under mpirun?");
  const auto size_text = env(size_var);
  if (!size_text) detail::config_error(size_var + ": not set (but " + rank_var + " is)");
  const std::uint64_t rank = detail::env_number(rank_var, *rank_text);
  const std::uint64_t size = detail::env_number(size_var, *size_text);
  if (size == 0) detail::config_error(size_var + " is 0");
  if (size > detail::max_cluster_tasks)
    detail::config_error(size_var + " " + std::to_string(size) + " is more than dtf's limit of " +
                         std::to_string(detail::max_cluster_tasks) + " tasks");
  if (rank >= size)
    detail::config_error(rank_var + " " + std::to_string(rank) + " out of range: " + size_var + " is " + std::to_string(size));
  detail::check_has_workers(num_ps, std::size_t(size), size_var);
  if (rendezvous.empty())
    detail::config_error("--rendezvous: required under MPI (the host:port where the ranks exchange their addresses)");
  split_host_port(rendezvous, "--rendezvous");

  cluster c;
  c.source = "mpi";
  c.rendezvous = rendezvous;
  for (std::size_t r = 0; r < size; ++r) {
    const task_id task = detail::rank_task(r, num_ps);
    c.spec.jobs[task.job][task.index] = "";
  }
  c.self = detail::rank_task(std::size_t(rank), num_ps);
  return c;
}

/// Resolves this process's cluster from, in order: explicit flags (when --job_name is set),
/// TF_CONFIG (when set and not blank), Slurm (when SLURM_PROCID is set) and MPI (when
/// OMPI_COMM_WORLD_RANK or PMI_RANK is set). Throws dtf::error(errc::invalid_config) when
/// none applies (saying what to set), when host lists or --task_index are given without
/// --job_name, when --num_ps or --base_port is out of range, when SLURM_PROCID disagrees
/// with an MPI rank variable (mpirun inside a Slurm allocation: the Slurm variables then
/// describe mpirun's daemons, not the ranks), and for every error of the chosen source.
inline cluster resolve_cluster(const cluster_flags& flags, const environment& env = process_environment()) {
  if (!flags.job_name.empty()) return cluster_from_flags(flags);
  if (!flags.ps_hosts.empty() || !flags.worker_hosts.empty() || !flags.chief_host.empty())
    detail::config_error("--job_name: required with --ps_hosts, --worker_hosts or --chief_host");
  if (flags.task_index >= 0) detail::config_error("--task_index: given without --job_name");

  if (const auto tf_config = env("TF_CONFIG"); tf_config && !detail::trim_blanks(*tf_config).empty())
    return cluster_from_tf_config(*tf_config);

  const auto num_ps = [&] {
    if (flags.num_ps < 0) detail::config_error("--num_ps " + std::to_string(flags.num_ps) + " is negative");
    return std::size_t(flags.num_ps);
  };
  if (const auto procid = env("SLURM_PROCID")) {
    for (const char* mpi_rank : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"})
      if (const auto rank = env(mpi_rank); rank && detail::trim_blanks(*rank) != detail::trim_blanks(*procid))
        detail::config_error("SLURM_PROCID " + *procid + " disagrees with " + mpi_rank + " " + *rank +
                             ": mpirun inside a Slurm allocation? start the tasks with srun, or unset SLURM_PROCID");
    if (flags.base_port < 1 || flags.base_port > 65535)
      detail::config_error("--base_port " + std::to_string(flags.base_port) + " is not a port (expected 1..65535)");
    return cluster_from_slurm(env, num_ps(), std::uint16_t(flags.base_port));
  }
  if (env("OMPI_COMM_WORLD_RANK") || env("PMI_RANK")) return cluster_from_mpi(env, num_ps(), flags.rendezvous);

  detail::config_error(
      "no cluster configuration: pass --job_name and --task_index with --worker_hosts (and --ps_hosts, "
      "--chief_host), set TF_CONFIG, or start the tasks with srun (Slurm) or mpirun (with --rendezvous host:port)");
}

}  // namespace dtf
