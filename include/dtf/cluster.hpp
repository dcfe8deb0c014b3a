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
//
// Layout: dtf/cluster/spec.hpp (task_id, cluster_spec, cluster, cluster_flags),
// parse.hpp (shared checked parsing), from_config.hpp (flags, TF_CONFIG),
// from_scheduler.hpp (Slurm, MPI); this header resolves which applies.
#pragma once

#include <dtf/cluster/from_config.hpp>
#include <dtf/cluster/from_scheduler.hpp>
#include <dtf/cluster/parse.hpp>
#include <dtf/cluster/spec.hpp>

#include <string>

namespace dtf {

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
