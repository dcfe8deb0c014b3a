// dtf/cluster/from_scheduler.hpp — a cluster a launcher started: a Slurm step (srun) or an
// MPI world (mpirun) (dtf/cluster.hpp).
#pragma once

#include <dtf/cluster/parse.hpp>
#include <dtf/cluster/spec.hpp>
#include <dtf/error.hpp>

#include <algorithm>
#include <charconv>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtf {

namespace detail {
/// A scheduler's rank and task count: the count between 1 and max_cluster_tasks, the rank
/// below it, and a worker among the tasks after num_ps ps (has_workers_what names the count).
inline void check_rank(const std::string& rank_var, std::uint64_t rank, const std::string& count_var,
                       std::uint64_t count, std::size_t num_ps, const std::string& has_workers_what) {
  if (count == 0) config_error(count_var + " is 0");
  if (count > max_cluster_tasks)
    config_error(count_var + " " + std::to_string(count) + " is more than dtf's limit of " +
                 std::to_string(max_cluster_tasks) + " tasks");
  if (rank >= count)
    config_error(rank_var + " " + std::to_string(rank) + " out of range: " + count_var + " is " + std::to_string(count));
  check_has_workers(num_ps, std::size_t(count), has_workers_what);
}

/// cluster::launch_id from a launcher's variables: "NAME=value" of each of `names` that is set,
/// in that order, joined by ';' (empty when none is). Every task of a launch sees the same.
inline std::string launch_id_from(const environment& env, std::initializer_list<const char*> names) {
  std::string out;
  for (const char* name : names)
    if (const auto value = env(name); value && !value->empty())
      out += (out.empty() ? "" : ";") + std::string(name) + "=" + *value;
  return out;
}
}  // namespace detail

/// The cluster of a Slurm step (tasks started by srun). Reads SLURM_PROCID,
/// SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST),
/// SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE, e.g. "2(x3),1"; without it each node
/// runs ceil(tasks / nodes) tasks, the last ones fewer) and SLURM_DISTRIBUTION (block, the
/// default, or cyclic). Rank r runs on the node that layout gives it, listening on
/// base_port + its index among the ranks of that node. Ranks 0..num_ps-1 are ps tasks, the
/// others workers (worker index r - num_ps); there is no chief job, so worker 0 is the chief.
/// When SLURM_NODEID or SLURM_LOCALID is set it must agree with the computed layout.
/// launch_id is the job and step (SLURM_JOB_ID or SLURM_JOBID, SLURM_STEP_ID or SLURM_STEPID),
/// so that two steps on the same nodes get different cluster ids.
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
  detail::check_rank("SLURM_PROCID", procid, ntasks_var, ntasks, num_ps, "the Slurm step's task count " + ntasks_var);
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
  c.launch_id = detail::launch_id_from(env, {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID"});
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
/// meeting there. launch_id is made of the launcher's job identifiers, those of
/// PMIX_NAMESPACE (PMIx: Open MPI 4 and 5, srun --mpi=pmix), OMPI_MCA_ess_base_jobid and
/// OMPI_MCA_orte_ess_jobid (Open MPI's job id), OMPI_MCA_orte_precondition_transports (a
/// random key Open MPI 4 draws per job), PMI_JOBID (srun --mpi=pmi2, Cray PALS) and
/// I_MPI_HYDRA_UUID (Intel MPI) that are set; MPICH's Hydra exports none, and there the
/// cluster id stays that of the spec alone. Throws dtf::error(errc::invalid_config) naming
/// the variable (or --num_ps, --rendezvous) when neither rank variable is set, the size is missing, either is
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
  detail::check_rank(rank_var, rank, size_var, size, num_ps, size_var);
  if (rendezvous.empty())
    detail::config_error("--rendezvous: required under MPI (the host:port where the ranks exchange their addresses)");
  split_host_port(rendezvous, "--rendezvous");

  cluster c;
  c.source = "mpi";
  c.launch_id = detail::launch_id_from(env, {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",
                                             "OMPI_MCA_orte_precondition_transports", "PMI_JOBID", "I_MPI_HYDRA_UUID"});
  c.rendezvous = rendezvous;
  for (std::size_t r = 0; r < size; ++r) {
    const task_id task = detail::rank_task(r, num_ps);
    c.spec.jobs[task.job][task.index] = "";
  }
  c.self = detail::rank_task(std::size_t(rank), num_ps);
  return c;
}

}  // namespace dtf
