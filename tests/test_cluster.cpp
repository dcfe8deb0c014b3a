#include <catch2/catch.hpp>

#include <dtf/cluster.hpp>
#include <dtf/flags.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace dtf;

namespace Catch {
template <>
struct StringMaker<dtf::task_id> {
  static std::string convert(const dtf::task_id& task) { return task.str(); }
};
}  // namespace Catch

namespace {

using env_map = std::map<std::string, std::string>;

// An environment that holds exactly `vars`; the tests never read the real one.
environment fake_env(env_map vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The message of the dtf::error that `fn` throws, after checking that its code is
// invalid_config; fails the check when nothing is thrown.
template <class Fn>
std::string config_error_message(Fn&& fn) {
  try {
    fn();
  } catch (const dtf::error& e) {
    CHECK(e.code() == make_error_code(errc::invalid_config));
    return e.what();
  }
  FAIL_CHECK("no dtf::error was thrown");
  return {};
}

struct expected_cluster {
  std::string source;
  task_id self, chief;
  std::size_t num_ps = 0, num_workers = 0;
  std::vector<std::pair<task_id, std::string>> addresses;  // a sample of the spec
};

struct cluster_case {
  std::string name;
  cluster_flags flags;
  env_map env;
  std::optional<expected_cluster> expect;  // set for a valid configuration
  std::string rendezvous;                  // valid: the expected cluster::rendezvous
  std::string error;                       // invalid: text the message must contain
};

cluster_case valid(std::string name, cluster_flags flags, env_map env, expected_cluster expect,
                   std::string rendezvous = "") {
  return {std::move(name), std::move(flags), std::move(env), std::move(expect), std::move(rendezvous), {}};
}

cluster_case invalid(std::string name, cluster_flags flags, env_map env, std::string error) {
  return {std::move(name), std::move(flags), std::move(env), std::nullopt, {}, std::move(error)};
}

cluster_flags explicit_flags(std::string job, int index, std::string ps, std::string workers, std::string chief = "") {
  cluster_flags f;
  f.job_name = std::move(job);
  f.task_index = index;
  f.ps_hosts = std::move(ps);
  f.worker_hosts = std::move(workers);
  f.chief_host = std::move(chief);
  return f;
}

// Flags of a task started by a launcher (no explicit cluster).
cluster_flags launcher_flags(int num_ps, int base_port = 2222, std::string rendezvous = "") {
  cluster_flags f;
  f.num_ps = num_ps;
  f.base_port = base_port;
  f.rendezvous = std::move(rendezvous);
  return f;
}

env_map tf_config(std::string json) { return {{"TF_CONFIG", std::move(json)}}; }

env_map slurm_step(std::string procid, std::string ntasks, std::string nodelist, std::string tasks_per_node = "") {
  env_map env{{"SLURM_PROCID", std::move(procid)},
              {"SLURM_STEP_NUM_TASKS", std::move(ntasks)},
              {"SLURM_STEP_NODELIST", std::move(nodelist)}};
  if (!tasks_per_node.empty()) env["SLURM_STEP_TASKS_PER_NODE"] = std::move(tasks_per_node);
  return env;
}

env_map with(env_map env, const std::string& name, const std::string& value) {
  env[name] = value;
  return env;
}

std::vector<cluster_case> cluster_cases() {
  const cluster_flags none;
  std::vector<cluster_case> cases;
  const auto add = [&](cluster_case c) { cases.push_back(std::move(c)); };

  // ---- explicit flags
  add(valid("flags: worker 1 with one ps", explicit_flags("worker", 1, "ps0:2222", "w0:2222,w1:2222"), {},
            {"flags", {"worker", 1}, {"worker", 0}, 1, 2, {{{"ps", 0}, "ps0:2222"}, {{"worker", 1}, "w1:2222"}}}));
  add(valid("flags: the chief host is the chief", explicit_flags("chief", 0, "p:1", "w0:1,w1:1", "c:1"), {},
            {"flags", {"chief", 0}, {"chief", 0}, 1, 2, {{{"chief", 0}, "c:1"}, {{"worker", 0}, "w0:1"}}}));
  add(valid("flags: master is an alias of chief", explicit_flags("master", 0, "", "w:1", "m:1"), {},
            {"flags", {"chief", 0}, {"chief", 0}, 0, 1, {{{"chief", 0}, "m:1"}}}));
  add(valid("flags: an evaluator may be outside the spec", explicit_flags("evaluator", 0, "p:1", "w:1"), {},
            {"flags", {"evaluator", 0}, {"worker", 0}, 1, 1, {{{"worker", 0}, "w:1"}}}));
  add(valid("flags: bracketed IPv6 addresses", explicit_flags("ps", 0, "[::1]:2224", "[::1]:2222,[::1]:2223"), {},
            {"flags", {"ps", 0}, {"worker", 0}, 1, 2, {{{"ps", 0}, "[::1]:2224"}, {{"worker", 1}, "[::1]:2223"}}}));
  add(valid("flags: blanks around entries are trimmed", explicit_flags("worker", 0, "", " a:1 , b:2 "), {},
            {"flags", {"worker", 0}, {"worker", 0}, 0, 2, {{{"worker", 0}, "a:1"}, {{"worker", 1}, "b:2"}}}));
  add(invalid("flags: duplicate ps address", explicit_flags("worker", 0, "127.0.0.1:2222,127.0.0.1:2222", "w:1"), {},
              "--ps_hosts: duplicate address 127.0.0.1:2222 (also ps[0])"));
  add(invalid("flags: a worker reuses a ps address", explicit_flags("worker", 0, "h:1", "h:2,h:1"), {},
              "--worker_hosts: duplicate address h:1 (also ps[0])"));
  add(invalid("flags: unknown job name", explicit_flags("driver", 0, "", "w:1"), {},
              "--job_name 'driver' is not one of chief, master, worker, ps, evaluator"));
  add(invalid("flags: task index past the worker list", explicit_flags("worker", 2, "", "w0:1,w1:1"), {},
              "--task_index 2 out of range: --worker_hosts lists 2 worker tasks"));
  add(invalid("flags: ps job without ps hosts", explicit_flags("ps", 0, "", "w0:1"), {},
              "--task_index 0 out of range: --ps_hosts lists 0 ps tasks"));
  add(invalid("flags: negative task index", explicit_flags("worker", -1, "", "w:1"), {}, "--task_index -1 is negative"));
  add(invalid("flags: empty host list entry", explicit_flags("worker", 0, "", "a:1,,b:1"), {},
              "--worker_hosts: empty entry worker[1]"));
  add(invalid("flags: port out of range", explicit_flags("worker", 0, "", "h:70000"), {},
              "--worker_hosts: bad address 'h:70000' (port 70000 is outside 1..65535)"));
  add(invalid("flags: non-numeric port", explicit_flags("worker", 0, "h:http", "w:1"), {},
              "--ps_hosts: bad address 'h:http' (port 'http' is not a number)"));
  add(invalid("flags: missing port", explicit_flags("worker", 0, "", "w1"), {},
              "--worker_hosts: bad address 'w1' (expected host:port)"));
  add(invalid("flags: unbracketed IPv6", explicit_flags("worker", 0, "", "::1:2222"), {},
              "--worker_hosts: bad address '::1:2222' (write an IPv6 address in brackets"));
  add(invalid("flags: two chiefs", explicit_flags("chief", 0, "", "w:1", "c0:1,c1:1"), {},
              "--chief_host: expected one host:port, got 2"));
  add(invalid("flags: neither workers nor a chief", explicit_flags("ps", 0, "p:1", ""), {}, "--worker_hosts: empty"));
  add(invalid("flags: host lists without --job_name", explicit_flags("", 0, "p:1", "w:1"), {},
              "--job_name: required with --ps_hosts"));
  add(invalid("flags: --task_index without --job_name", explicit_flags("", 1, "", ""), {},
              "--task_index: given without --job_name"));

  // ---- TF_CONFIG
  add(valid("TF_CONFIG: dense lists", none,
            tf_config(R"({"cluster": {"worker": ["w0:1", "w1:1"], "ps": ["p0:1"]}, "task": {"type": "worker", "index": 1}})"),
            {"TF_CONFIG", {"worker", 1}, {"worker", 0}, 1, 2, {{{"worker", 1}, "w1:1"}, {{"ps", 0}, "p0:1"}}}));
  add(valid("TF_CONFIG: sparse {index: address} form", none,
            tf_config(R"({"cluster": {"worker": {"1": "w1:1", "3": "w3:1"}, "ps": ["p0:1"]},
                          "task": {"type": "worker", "index": 3}})"),
            {"TF_CONFIG", {"worker", 3}, {"worker", 0}, 1, 2, {{{"worker", 1}, "w1:1"}, {{"worker", 3}, "w3:1"}}}));
  add(valid("TF_CONFIG: master is stored as chief", none,
            tf_config(R"({"cluster": {"master": ["m:1"], "worker": ["w:1"]}, "task": {"type": "master", "index": 0}})"),
            {"TF_CONFIG", {"chief", 0}, {"chief", 0}, 0, 1, {{{"chief", 0}, "m:1"}}}));
  add(valid("TF_CONFIG: evaluator outside the cluster, environment ignored", none,
            tf_config(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                          "task": {"type": "evaluator", "index": 0}, "environment": "cloud"})"),
            {"TF_CONFIG", {"evaluator", 0}, {"chief", 0}, 0, 1, {{{"chief", 0}, "c:1"}}}));
  add(valid("TF_CONFIG: evaluator inside the cluster", none,
            tf_config(R"({"cluster": {"worker": ["w:1"], "evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}})"),
            {"TF_CONFIG", {"evaluator", 0}, {"worker", 0}, 0, 1, {{{"evaluator", 0}, "e:1"}}}));
  add(valid("TF_CONFIG: index as a numeric string", none,
            tf_config(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p0:1", "p1:1"]},
                          "task": {"type": "ps", "index": "1"}})"),
            {"TF_CONFIG", {"ps", 1}, {"chief", 0}, 2, 1, {{{"ps", 1}, "p1:1"}, {{"chief", 0}, "c:1"}}}));
  add(invalid("TF_CONFIG: malformed JSON", none, tf_config(R"({"cluster": {"worker": ["w:1"]})"),
              "TF_CONFIG: malformed JSON: "));
  add(invalid("TF_CONFIG: not an object", none, tf_config(R"(["w:1"])"), "TF_CONFIG: expected an object"));
  add(invalid("TF_CONFIG: unknown task type", none,
              tf_config(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "driver", "index": 0}})"),
              "TF_CONFIG: task.type 'driver' is not one of chief, master, worker, ps, evaluator"));
  add(invalid("TF_CONFIG: task index out of range", none,
              tf_config(R"({"cluster": {"worker": ["w0:1", "w1:1"]}, "task": {"type": "worker", "index": 3}})"),
              "TF_CONFIG: task.index 3 out of range: the cluster has 2 worker tasks"));
  add(invalid("TF_CONFIG: task index missing from a sparse job", none,
              tf_config(R"({"cluster": {"worker": {"0": "w0:1", "3": "w3:1"}}, "task": {"type": "worker", "index": 2}})"),
              "TF_CONFIG: task.index 2: cluster.worker lists no task 2"));
  add(invalid("TF_CONFIG: negative task index", none,
              tf_config(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": -1}})"),
              "TF_CONFIG: task.index -1 is negative"));
  add(invalid("TF_CONFIG: non-integer task index", none,
              tf_config(R"({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": "first"}})"),
              "TF_CONFIG: task.index \"first\" is not a non-negative integer"));
  add(invalid("TF_CONFIG: both chief and master", none,
              tf_config(R"({"cluster": {"chief": ["c:1"], "master": ["m:1"]}, "task": {"type": "chief", "index": 0}})"),
              "TF_CONFIG: cluster has both 'chief' and 'master'"));
  add(invalid("TF_CONFIG: two chiefs", none,
              tf_config(R"({"cluster": {"chief": ["c0:1", "c1:1"]}, "task": {"type": "chief", "index": 0}})"),
              "TF_CONFIG: cluster.chief: must have exactly one task"));
  add(invalid("TF_CONFIG: bad host:port", none,
              tf_config(R"({"cluster": {"worker": ["w:1", "foo"]}, "task": {"type": "worker", "index": 0}})"),
              "TF_CONFIG: cluster.worker[1]: bad address 'foo' (expected host:port)"));
  add(invalid("TF_CONFIG: address that is not a string", none,
              tf_config(R"({"cluster": {"worker": ["w:1"], "ps": [2222]}, "task": {"type": "worker", "index": 0}})"),
              "TF_CONFIG: cluster.ps[0]: expected a \"host:port\" string"));
  add(invalid("TF_CONFIG: duplicate addresses across jobs", none,
              tf_config(R"({"cluster": {"ps": ["h:1"], "worker": ["h:2", "h:1"]}, "task": {"type": "worker", "index": 0}})"),
              "TF_CONFIG: cluster.worker[1]: duplicate address h:1 (also ps[0])"));
  add(invalid("TF_CONFIG: unknown job in the cluster", none,
              tf_config(R"({"cluster": {"driver": ["d:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 0}})"),
              "TF_CONFIG: cluster.driver: unknown job"));
  add(invalid("TF_CONFIG: sparse index that is not a number", none,
              tf_config(R"({"cluster": {"worker": {"one": "w:1"}}, "task": {"type": "worker", "index": 0}})"),
              "TF_CONFIG: cluster.worker: index 'one' is not a non-negative integer"));
  add(invalid("TF_CONFIG: missing task", none, tf_config(R"({"cluster": {"worker": ["w:1"]}})"),
              "TF_CONFIG: task: missing"));
  add(invalid("TF_CONFIG: missing cluster", none, tf_config(R"({"task": {"type": "worker", "index": 0}})"),
              "TF_CONFIG: cluster: missing"));

  // ---- Slurm
  add(valid("Slurm: n[1-3],m5 with one task per node", launcher_flags(1),
            slurm_step("2", "4", "n[1-3],m5"),
            {"slurm", {"worker", 1}, {"worker", 0}, 1, 3,
             {{{"ps", 0}, "n1:2222"}, {{"worker", 1}, "n3:2222"}, {{"worker", 2}, "m5:2222"}}}));
  add(valid("Slurm: zero padding and 2(x2) tasks per node", launcher_flags(1),
            slurm_step("3", "4", "node[01-02]", "2(x2)"),
            {"slurm", {"worker", 2}, {"worker", 0}, 1, 3,
             {{{"ps", 0}, "node01:2222"}, {{"worker", 0}, "node01:2223"}, {{"worker", 1}, "node02:2222"},
              {{"worker", 2}, "node02:2223"}}}));
  add(valid("Slurm: job-level fallbacks and --base_port", launcher_flags(1, 5000),
            {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "a,b"}, {"SLURM_TASKS_PER_NODE", "2,1"}},
            {"slurm", {"ps", 0}, {"worker", 0}, 1, 2,
             {{{"ps", 0}, "a:5000"}, {{"worker", 0}, "a:5001"}, {{"worker", 1}, "b:5000"}}}));
  add(valid("Slurm: block layout of ceil(5/2) tasks per node, two ps", launcher_flags(2),
            slurm_step("4", "5", "gpu[7-8]"),
            {"slurm", {"worker", 2}, {"worker", 0}, 2, 3,
             {{{"ps", 1}, "gpu7:2223"}, {{"worker", 0}, "gpu7:2224"}, {{"worker", 2}, "gpu8:2223"}}}));
  add(valid("Slurm: cyclic distribution, no ps, consistent SLURM_LOCALID", launcher_flags(0),
            with(with(slurm_step("2", "4", "n[1-2]", "2(x2)"), "SLURM_DISTRIBUTION", "cyclic:block"), "SLURM_LOCALID", "1"),
            {"slurm", {"worker", 2}, {"worker", 0}, 0, 4,
             {{{"worker", 0}, "n1:2222"}, {{"worker", 1}, "n2:2222"}, {{"worker", 2}, "n1:2223"}}}));
  add(invalid("Slurm: SLURM_PROCID past the task count", launcher_flags(1), slurm_step("4", "4", "n[1-4]"),
              "SLURM_PROCID 4 out of range: SLURM_STEP_NUM_TASKS is 4"));
  add(invalid("Slurm: non-numeric SLURM_PROCID", launcher_flags(1), slurm_step("x", "4", "n[1-4]"),
              "SLURM_PROCID 'x' is not a non-negative integer"));
  add(invalid("Slurm: num_ps leaves no workers", launcher_flags(2), slurm_step("0", "2", "n[1-2]"),
              "--num_ps 2 leaves no workers"));
  add(invalid("Slurm: descending range", launcher_flags(1), slurm_step("0", "3", "n[3-1]"),
              "SLURM_STEP_NODELIST: bad node list 'n[3-1]': range 3-1 is descending"));
  add(invalid("Slurm: unbalanced bracket", launcher_flags(1), slurm_step("0", "3", "n[1-3"),
              "SLURM_STEP_NODELIST: bad node list 'n[1-3': unbalanced '['"));
  add(invalid("Slurm: tasks per node for the wrong number of nodes", launcher_flags(1),
              slurm_step("0", "4", "n[1-3]", "2(x2)"), "SLURM_STEP_TASKS_PER_NODE '2(x2)' describes 2 nodes"));
  add(invalid("Slurm: tasks per node that do not add up", launcher_flags(1), slurm_step("0", "5", "n[1-2]", "2(x2)"),
              "SLURM_STEP_TASKS_PER_NODE '2(x2)' adds up to 4 tasks but SLURM_STEP_NUM_TASKS is 5"));
  add(invalid("Slurm: malformed tasks per node", launcher_flags(1), slurm_step("0", "4", "n[1-2]", "2(3)"),
              "SLURM_STEP_TASKS_PER_NODE: bad tasks-per-node list '2(3)'"));
  add(invalid("Slurm: SLURM_LOCALID disagrees with the layout", launcher_flags(1),
              with(slurm_step("1", "4", "n[1-2]", "2(x2)"), "SLURM_LOCALID", "0"), "SLURM_LOCALID 0 disagrees"));
  add(invalid("Slurm: ports past 65535", launcher_flags(1, 65535), slurm_step("0", "2", "n1"),
              "--base_port 65535: rank 1"));
  add(invalid("Slurm: unsupported distribution", launcher_flags(1),
              with(slurm_step("0", "2", "n[1-2]"), "SLURM_DISTRIBUTION", "plane=2"), "SLURM_DISTRIBUTION 'plane=2'"));
  add(invalid("Slurm: no node list", launcher_flags(1), {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}},
              "SLURM_STEP_NODELIST: not set"));
  add(invalid("Slurm: mpirun inside a Slurm allocation", launcher_flags(1),
              with(slurm_step("0", "2", "n[1-2]"), "OMPI_COMM_WORLD_RANK", "3"),
              "SLURM_PROCID 0 disagrees with OMPI_COMM_WORLD_RANK 3"));

  // ---- MPI
  add(valid("MPI: Open MPI rank 0 is the ps", launcher_flags(1, 2222, "10.0.0.1:5555"),
            {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}},
            {"mpi", {"ps", 0}, {"worker", 0}, 1, 2, {{{"ps", 0}, ""}, {{"worker", 1}, ""}}}, "10.0.0.1:5555"));
  add(valid("MPI: PMI rank 2 is worker 1", launcher_flags(1, 2222, "head:5555"), {{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}},
            {"mpi", {"worker", 1}, {"worker", 0}, 1, 2, {{{"worker", 1}, ""}}}, "head:5555"));
  add(valid("MPI: Open MPI variables win over PMI ones", launcher_flags(0, 2222, "head:5555"),
            {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "5"}},
            {"mpi", {"worker", 1}, {"worker", 0}, 0, 2, {{{"worker", 0}, ""}}}, "head:5555"));
  add(invalid("MPI: missing rendezvous", launcher_flags(1), {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}},
              "--rendezvous: required under MPI"));
  add(invalid("MPI: rendezvous without a port", launcher_flags(1, 2222, "head"),
              {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}},
              "--rendezvous: bad address 'head' (expected host:port)"));
  add(invalid("MPI: rank past the world size", launcher_flags(1, 2222, "head:5555"),
              {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "3"}},
              "OMPI_COMM_WORLD_RANK 3 out of range: OMPI_COMM_WORLD_SIZE is 3"));
  add(invalid("MPI: PMI_RANK without PMI_SIZE", launcher_flags(1, 2222, "head:5555"), {{"PMI_RANK", "0"}},
              "PMI_SIZE: not set"));
  add(invalid("MPI: num_ps leaves no workers", launcher_flags(3, 2222, "head:5555"), {{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}},
              "--num_ps 3 leaves no workers: PMI_SIZE is 3"));
  add(invalid("MPI: negative --num_ps", launcher_flags(-1, 2222, "head:5555"), {{"PMI_RANK", "0"}, {"PMI_SIZE", "3"}},
              "--num_ps -1 is negative"));

  // ---- nothing at all
  add(invalid("no configuration", none, {}, "no cluster configuration: pass --job_name"));
  add(invalid("a blank TF_CONFIG counts as unset", none, tf_config("  "), "no cluster configuration"));
  return cases;
}

}  // namespace

TEST_CASE("resolve_cluster resolves each valid table case and names the field of each invalid one", "[cluster]") {
  const auto cases = cluster_cases();
  REQUIRE(cases.size() >= 30);
  std::size_t valid_cases = 0, invalid_cases = 0;
  for (const auto& c : cases) {
    INFO("case: " << c.name);
    const environment env = fake_env(c.env);
    if (!c.expect) {
      ++invalid_cases;
      CHECK_THAT(config_error_message([&] { resolve_cluster(c.flags, env); }), Catch::Contains(c.error));
      continue;
    }
    ++valid_cases;
    const expected_cluster& e = *c.expect;
    cluster got;
    try {
      got = resolve_cluster(c.flags, env);
    } catch (const std::exception& ex) {
      FAIL_CHECK("unexpected error: " << ex.what());
      continue;
    }
    CHECK(got.source == e.source);
    CHECK(got.self == e.self);
    CHECK(got.chief() == e.chief);
    CHECK(got.is_chief() == (e.self == e.chief));
    CHECK(got.num_ps() == e.num_ps);
    CHECK(got.num_workers() == e.num_workers);
    CHECK(got.rendezvous == c.rendezvous);
    for (const auto& [task, address] : e.addresses) {
      INFO("task " << task.str());
      CHECK(got.spec.address(task) == address);
    }
  }
  CHECK(valid_cases >= 10);
  CHECK(invalid_cases >= 20);
}

TEST_CASE("resolve_cluster prefers flags, then TF_CONFIG, then Slurm, then MPI", "[cluster]") {
  env_map env{{"TF_CONFIG", R"({"cluster": {"worker": ["tf0:1", "tf1:1"]}, "task": {"type": "worker", "index": 1}})"},
              {"SLURM_PROCID", "0"},
              {"SLURM_STEP_NUM_TASKS", "2"},
              {"SLURM_STEP_NODELIST", "n[1-2]"},
              {"PMI_RANK", "0"},
              {"PMI_SIZE", "2"}};
  cluster_flags flags = explicit_flags("ps", 0, "p:1", "w:1");
  flags.rendezvous = "head:5555";

  CHECK(resolve_cluster(flags, fake_env(env)).source == "flags");
  flags.job_name.clear();
  flags.task_index = -1;
  flags.ps_hosts.clear();
  flags.worker_hosts.clear();
  const cluster from_tf = resolve_cluster(flags, fake_env(env));
  CHECK(from_tf.source == "TF_CONFIG");
  CHECK(from_tf.self == task_id{"worker", 1});
  env.erase("TF_CONFIG");
  const cluster from_slurm = resolve_cluster(flags, fake_env(env));
  CHECK(from_slurm.source == "slurm");
  CHECK(from_slurm.spec.address({"worker", 0}) == "n2:2222");
  env.erase("SLURM_PROCID");
  const cluster from_mpi = resolve_cluster(flags, fake_env(env));
  CHECK(from_mpi.source == "mpi");
  CHECK(from_mpi.rendezvous == "head:5555");
  env.erase("PMI_RANK");
  CHECK_THAT(config_error_message([&] { resolve_cluster(flags, fake_env(env)); }),
             Catch::Contains("no cluster configuration"));
}

TEST_CASE("cluster::id is a stable hash of the spec that changes with any address", "[cluster]") {
  // The FNV-1a 64 offset basis: the hash of an empty spec, printed as 16 hex digits.
  CHECK(cluster{}.id() == "cbf29ce484222325");

  const cluster a = cluster_from_flags(explicit_flags("worker", 0, "p:1", "w0:1,w1:1", "c:1"));
  const cluster b = cluster_from_flags(explicit_flags("ps", 0, "p:1", "w0:1,w1:1", "c:1"));
  const cluster c = cluster_from_tf_config(
      R"({"cluster": {"ps": ["p:1"], "worker": ["w0:1", "w1:1"], "master": ["c:1"]}, "task": {"type": "worker", "index": 1}})");
  REQUIRE(a.id().size() == 16);
  CHECK(a.id().find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a.id() == a.id());
  CHECK(a.id() == b.id());  // every task of one cluster gets the same id
  CHECK(a.id() == c.id());  // whatever the source

  cluster moved = a;
  moved.spec.jobs["worker"][1] = "w1:2";
  CHECK(moved.id() != a.id());
  cluster renumbered = a;
  renumbered.spec.jobs["worker"].erase(1);
  renumbered.spec.jobs["worker"][2] = "w1:1";
  CHECK(renumbered.id() != a.id());
  cluster with_empty_job = a;
  with_empty_job.spec.jobs["evaluator"];
  CHECK(with_empty_job.id() == a.id());
}

namespace {

// FNV-1a 64 of `bytes` as 16 hex digits, written here independently of cluster::id().
std::string reference_fnv1a_hex(std::string_view bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (const unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

// The canonical text cluster::id() hashes for a spec: per job with tasks, in name order,
// job GS (index US address RS)... FS.
std::string reference_spec_text(const cluster_spec& spec) {
  std::string out;
  for (const auto& [job, tasks] : spec.jobs) {
    if (tasks.empty()) continue;
    out += job + "\x1d";
    for (const auto& [index, address] : tasks) out += std::to_string(index) + "\x1f" + address + "\x1e";
    out += "\x1c";
  }
  return out;
}

}  // namespace

TEST_CASE("cluster::id of a Slurm or MPI launch includes its job id, and flags and TF_CONFIG ids are unchanged",
          "[cluster]") {
  // Explicit clusters: no launch id, and the id is the hash of the spec alone, as before.
  const cluster flags = cluster_from_flags(explicit_flags("worker", 1, "p:1", "w0:1,w1:1", "c:1"));
  const cluster tf = cluster_from_tf_config(
      R"({"cluster": {"ps": ["p:1"], "worker": ["w0:1", "w1:1"], "chief": ["c:1"]}, "task": {"type": "ps", "index": 0}})");
  CHECK(flags.launch_id.empty());
  CHECK(tf.launch_id.empty());
  CHECK(reference_spec_text(flags.spec) == std::string("chief\x1d" "0\x1f" "c:1\x1e\x1c" "ps\x1d" "0\x1f" "p:1\x1e\x1c"
                                                       "worker\x1d" "0\x1f" "w0:1\x1e" "1\x1f" "w1:1\x1e\x1c"));
  CHECK(flags.id() == reference_fnv1a_hex(reference_spec_text(flags.spec)));
  CHECK(tf.id() == flags.id());

  // Slurm: two jobs on the same nodes differ only in SLURM_JOB_ID (or the step); every task of
  // one step gets one id.
  const auto slurm = [](std::string procid, std::string job, std::string step) {
    env_map env = slurm_step(std::move(procid), "3", "n[1-3]");
    if (!job.empty()) env["SLURM_JOB_ID"] = std::move(job);
    if (!step.empty()) env["SLURM_STEP_ID"] = std::move(step);
    return cluster_from_slurm(fake_env(env), 1, 2222);
  };
  const cluster job1_task0 = slurm("0", "4101", "0"), job1_task2 = slurm("2", "4101", "0");
  const cluster job2_task0 = slurm("0", "4102", "0"), job1_step1 = slurm("0", "4101", "1");
  CHECK(job1_task0.spec.jobs == job2_task0.spec.jobs);
  CHECK(job1_task0.launch_id == "SLURM_JOB_ID=4101;SLURM_STEP_ID=0");
  CHECK(job1_task0.id() == reference_fnv1a_hex(reference_spec_text(job1_task0.spec) + "\x1a" + job1_task0.launch_id));
  CHECK(job1_task0.id() == job1_task2.id());
  CHECK(job1_task0.id() != job2_task0.id());
  CHECK(job1_task0.id() != job1_step1.id());
  // Without a job id (as in the table cases) the id is the spec's.
  const cluster no_job = slurm("0", "", "");
  CHECK(no_job.launch_id.empty());
  CHECK(no_job.id() == reference_fnv1a_hex(reference_spec_text(no_job.spec)));

  // MPI: the spec is the same for every world of that size (addresses come later); Open MPI's
  // job id and per-job random key tell two launches apart, and every rank of one agrees.
  const auto open_mpi = [](std::string rank, std::string jobid, std::string key) {
    return cluster_from_mpi(fake_env({{"OMPI_COMM_WORLD_RANK", std::move(rank)},
                                      {"OMPI_COMM_WORLD_SIZE", "3"},
                                      {"PMIX_NAMESPACE", jobid},
                                      {"OMPI_MCA_ess_base_jobid", jobid},
                                      {"OMPI_MCA_orte_precondition_transports", std::move(key)}}),
                            0, "head:5555");
  };
  const cluster run1_rank0 = open_mpi("0", "71368705", "8c6c428ae9718e6b-d9e7b1dac0dcb010");
  const cluster run1_rank2 = open_mpi("2", "71368705", "8c6c428ae9718e6b-d9e7b1dac0dcb010");
  // Same job id (mpirun with the same pid, e.g. in a container), another random key.
  const cluster run2_rank0 = open_mpi("0", "71368705", "0f2d9a4c11b7e305-5be0c7d1a9e24f68");
  CHECK(run1_rank0.id() == run1_rank2.id());
  CHECK(run1_rank0.id() != run2_rank0.id());
  CHECK(open_mpi("0", "71434241", "8c6c428ae9718e6b-d9e7b1dac0dcb010").id() != run1_rank0.id());
  const cluster pmi2 = cluster_from_mpi(fake_env({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"PMI_JOBID", "4101.0"}}), 0,
                                        "head:5555");
  CHECK(pmi2.launch_id == "PMI_JOBID=4101.0");
  // MPICH's Hydra exports no job id: the spec's id, as before.
  const cluster hydra = cluster_from_mpi(fake_env({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}}), 0, "head:5555");
  CHECK(hydra.launch_id.empty());
  CHECK(hydra.id() == reference_fnv1a_hex(reference_spec_text(hydra.spec)));
}

TEST_CASE("cluster_spec::to_json round-trips through cluster_from_tf_config", "[cluster]") {
  const auto round_trip = [](const cluster& c) {
    const nlohmann::json doc = {{"cluster", c.spec.to_json()}, {"task", {{"type", c.self.job}, {"index", c.self.index}}}};
    return cluster_from_tf_config(doc.dump());
  };

  SECTION("dense lists") {
    const cluster c = cluster_from_flags(explicit_flags("worker", 1, "p0:1,p1:1", "w0:1,w1:1", "c:1"));
    const nlohmann::json json = c.spec.to_json();
    CHECK(json["worker"] == nlohmann::json::array({"w0:1", "w1:1"}));
    CHECK(json["chief"] == nlohmann::json::array({"c:1"}));
    const cluster back = round_trip(c);
    CHECK(back.spec.jobs == c.spec.jobs);
    CHECK(back.self == c.self);
    CHECK(back.id() == c.id());
  }
  SECTION("sparse objects") {
    const cluster c = cluster_from_tf_config(
        R"({"cluster": {"worker": {"1": "w1:1", "3": "w3:1"}, "ps": ["p:1"]}, "task": {"type": "worker", "index": 1}})");
    const nlohmann::json json = c.spec.to_json();
    CHECK(json["worker"] == nlohmann::json({{"1", "w1:1"}, {"3", "w3:1"}}));
    CHECK(json["ps"].is_array());
    const cluster back = round_trip(c);
    CHECK(back.spec.jobs == c.spec.jobs);
    CHECK(back.self == c.self);
  }
  SECTION("a Slurm layout") {
    const cluster c = cluster_from_slurm(fake_env(slurm_step("1", "4", "n[1-2]", "2(x2)")), 1, 3000);
    const cluster back = round_trip(c);
    CHECK(back.spec.jobs == c.spec.jobs);
    CHECK(back.self == task_id{"worker", 0});
  }
}

TEST_CASE("expand_slurm_nodelist expands ranges, keeps zero padding and rejects bad syntax", "[cluster]") {
  using list = std::vector<std::string>;
  CHECK(expand_slurm_nodelist("n[1-3],m5") == list{"n1", "n2", "n3", "m5"});
  CHECK(expand_slurm_nodelist("node[01-03,7]") == list{"node01", "node02", "node03", "node7"});
  CHECK(expand_slurm_nodelist("node[8-10]") == list{"node8", "node9", "node10"});
  CHECK(expand_slurm_nodelist("a,b") == list{"a", "b"});
  CHECK(expand_slurm_nodelist("single") == list{"single"});
  CHECK(expand_slurm_nodelist("r[1-2]n[1-2]") == list{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expand_slurm_nodelist("gpu[001-002].cluster,cpu[1,3]") ==
        list{"gpu001.cluster", "gpu002.cluster", "cpu1", "cpu3"});

  for (const char* bad : {"n[3-1]", "n[1-3", "n1-3]", "n[[1]]", "a,,b", "n[]", "n[a-b]", "n[1-2-3]", "", "n 1"}) {
    INFO("node list '" << bad << "'");
    CHECK_THAT(config_error_message([&] { expand_slurm_nodelist(bad); }), Catch::StartsWith("Slurm: bad node list"));
  }
}

TEST_CASE("split_host_port accepts host:port and [ipv6]:port in 1..65535", "[cluster]") {
  CHECK(split_host_port("localhost:2222", "f") == std::pair<std::string, std::uint16_t>{"localhost", 2222});
  CHECK(split_host_port("10.0.0.1:1", "f") == std::pair<std::string, std::uint16_t>{"10.0.0.1", 1});
  CHECK(split_host_port("[::1]:65535", "f") == std::pair<std::string, std::uint16_t>{"::1", 65535});
  CHECK(split_host_port("tfjob-worker-0.ns.svc:2222", "f").first == "tfjob-worker-0.ns.svc");

  for (const char* bad : {"host", "host:", ":2222", "host:0", "host:65536", "host:-1", "host:22x", "[::1]2222", "[::1:2222",
                          "[]:1", "::1:2222", "a b:1", "host:123456"}) {
    INFO("address '" << bad << "'");
    CHECK_THAT(config_error_message([&] { split_host_port(bad, "--the_field"); }),
               Catch::StartsWith("--the_field: bad address '" + std::string(bad) + "'"));
  }
}

TEST_CASE("cluster_spec::address names a task the spec does not list", "[cluster]") {
  const cluster c = cluster_from_flags(explicit_flags("worker", 0, "", "w0:1,w1:1"));
  CHECK(c.spec.address({"worker", 1}) == "w1:1");
  CHECK(c.spec.tasks("worker") == std::vector<task_id>{{"worker", 0}, {"worker", 1}});
  CHECK(c.spec.tasks("ps").empty());
  CHECK(c.spec.num_tasks("ps") == 0);
  try {
    c.spec.address({"worker", 5});
    FAIL("no error for a missing task");
  } catch (const dtf::error& e) {
    CHECK(e.code() == make_error_code(errc::out_of_range));
    CHECK_THAT(e.what(), Catch::Contains("worker.5"));
  }
}

TEST_CASE("task_id prints job.index and orders by job, then index", "[cluster]") {
  CHECK(task_id{"worker", 1}.str() == "worker.1");
  CHECK(task_id{"ps", 0} < task_id{"worker", 0});
  CHECK(task_id{"worker", 1} < task_id{"worker", 2});
  CHECK(task_id{"chief", 0} == task_id{"chief", 0});
}

TEST_CASE("add_cluster_flags registers every cluster flag", "[cluster]") {
  cluster_flags cf;
  flag_parser parser("cluster flags test");
  add_cluster_flags(parser, cf);
  const char* argv[] = {"prog",           "--job_name",    "worker",          "--task_index=1", "--ps_hosts", "p:1",
                        "--worker_hosts", "w0:1,w1:1",     "--chief_host",    "c:1",            "--num_ps",   "2",
                        "--base_port",    "3000",          "--rendezvous=h:9"};
  REQUIRE(parser.parse(int(std::size(argv)), argv));
  CHECK(cf.num_ps == 2);
  CHECK(cf.base_port == 3000);
  CHECK(cf.rendezvous == "h:9");
  const cluster c = resolve_cluster(cf, fake_env({}));
  CHECK(c.self == task_id{"worker", 1});
  CHECK(c.chief() == task_id{"chief", 0});
  CHECK_FALSE(c.is_chief());
  CHECK(c.spec.address({"chief", 0}) == "c:1");
  CHECK(c.spec.address({"ps", 0}) == "p:1");
}
