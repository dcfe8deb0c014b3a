// dtf/device/select.hpp — one GPU per process: which device a training task uses.
//
// Every process of a job on a machine with several GPUs must use a GPU of its own, as Horovod's
// `torch.cuda.set_device(hvd.local_rank())` and torchrun's LOCAL_RANK do. dtf reads the task's
// local rank (its index among the processes its launcher started on this host) from the first
// launcher that set one, in this order:
//
//   DTF_LOCAL_RANK / DTF_LOCAL_SIZE                     dtfrun (chief and workers; ps tasks get none)
//   LOCAL_RANK / LOCAL_WORLD_SIZE                       torchrun and tools that copy its variables
//   OMPI_COMM_WORLD_LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_SIZE    Open MPI's mpirun
//   MV2_COMM_WORLD_LOCAL_RANK / MV2_COMM_WORLD_LOCAL_SIZE      MVAPICH2
//   MPI_LOCALRANKID / MPI_LOCALNRANKS                   MPICH's Hydra
//   SLURM_LOCALID / SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE, at SLURM_NODEID)   srun
//
// and picks device = local rank among the GPUs the process can see (CUDA_VISIBLE_DEVICES is the
// CUDA runtime's: the devices it names are numbered 0.. in its order). Rules (choose_device):
//   1. An explicit device (--gpu N, selection_options::device) is used as given; it must be visible.
//   2. No launcher variable: device 0 (one process on this host).
//   3. local size <= visible GPUs: device = local rank.
//   4. More local ranks than visible GPUs:
//      - sharing asked for (--share_gpus, DTF_SHARE_GPUS=1): device = local rank mod visible;
//      - exactly one GPU visible and CUDA_VISIBLE_DEVICES names exactly one: the launcher gave
//        each process its own (Slurm's --gpus-per-task, a per-rank CUDA_VISIBLE_DEVICES): device 0.
//        A process cannot see whether the others were shown the same one: that case is the user's;
//      - otherwise an error naming the counts, the variable the local rank came from, and the two
//        ways out.
//   A malformed variable (not a non-negative integer, a rank not below its size) is an error
//   naming it; nothing is guessed.
// The decision is a pure function of the variables and the visible count, so CPU builds test it;
// select_device() applies it on CUDA builds (cudaSetDevice) and only reports it on CPU builds.
// Call it before anything allocates device memory: train_flags::resolve_cluster() does, for
// training tasks; a program that does not use train_flags calls dtf::device::select_device().
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#if DTF_CUDA
#include <cuda_runtime.h>
#endif

namespace dtf::device {

/// Reads one environment variable (nullptr when unset); getenv by default, a map in tests.
using env_lookup = std::function<const char*(const char*)>;

/// This process's place among the processes its launcher started on this host.
struct local_rank_info {
  int rank = 0;                ///< 0-based local rank
  std::optional<int> size;     ///< local ranks on this host, when the launcher says
  std::string source;          ///< the variable the rank came from, e.g. "OMPI_COMM_WORLD_LOCAL_RANK"
};

/// How the device is chosen.
struct selection_options {
  int device = -1;     ///< an explicit device (visible numbering); -1: from the local rank
  bool share = false;  ///< allow more local ranks than visible GPUs (ranks share GPUs round-robin)
};

/// The decision: the device and why.
struct selection {
  int device = 0;                        ///< the device to use (visible numbering)
  int visible = 0;                       ///< GPUs the process sees
  std::optional<local_rank_info> local;  ///< the local rank it came from (none: explicit or no launcher)
  bool shared = false;                   ///< other local ranks use the same device
  std::string reason;                    ///< one line: "GPU 1 of 2 (local rank 1 of 2 from DTF_LOCAL_RANK)"
};

namespace detail {

/// A non-negative int from `text`, or an error naming `var`.
inline int parse_count(std::string_view var, const char* text) {
  const std::string s = text ? text : "";
  auto bad = [&] {
    return error(errc::invalid_config, "$" + std::string(var) + "='" + s + "': expected a non-negative integer");
  };
  if (s.empty() || s.size() > 9) throw bad();
  int v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') throw bad();
    v = v * 10 + (ch - '0');
  }
  return v;
}

/// Slurm's task counts per node, "2(x3),1" (2 tasks on each of 3 nodes, then 1), at node `node`
/// (none past the list). The whole value is checked, whichever node is asked for.
inline std::optional<int> slurm_tasks_on_node(std::string_view var, const char* text, int node) {
  const std::string s = text ? text : "";
  auto bad = [&] {
    return error(errc::invalid_config, "$" + std::string(var) + "='" + s + "': expected counts like 2(x3),1");
  };
  std::optional<int> found;
  long long seen = 0;
  for (std::size_t i = 0;;) {
    std::size_t j = i;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j == i) throw bad();
    const int count = parse_count(var, s.substr(i, j - i).c_str());
    int repeat = 1;
    if (j < s.size() && s[j] == '(') {
      if (s.compare(j, 2, "(x") != 0) throw bad();
      const std::size_t k = s.find(')', j);
      if (k == std::string::npos || k == j + 2) throw bad();
      const std::string r = s.substr(j + 2, k - j - 2);
      if (r.find_first_not_of("0123456789") != std::string::npos) throw bad();
      repeat = parse_count(var, r.c_str());
      if (repeat == 0) throw bad();
      j = k + 1;
    }
    if (!found && node < seen + repeat) found = count;
    seen += repeat;
    if (j == s.size()) return found;
    if (s[j] != ',') throw bad();
    i = j + 1;
  }
}

}  // namespace detail

/// The local rank from the first launcher's variables that are set (see the file comment), or
/// none. Errors: errc::invalid_config naming a malformed variable, or a rank not below its size.
inline std::optional<local_rank_info> local_rank_from(const env_lookup& env) {
  struct launcher {
    const char* rank;
    const char* size;
  };
  static constexpr launcher launchers[] = {{"DTF_LOCAL_RANK", "DTF_LOCAL_SIZE"},
                                           {"LOCAL_RANK", "LOCAL_WORLD_SIZE"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                                           {"MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"},
                                           {"MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
                                           {"SLURM_LOCALID", nullptr}};
  for (const launcher& l : launchers) {
    const char* r = env(l.rank);
    if (!r) continue;
    local_rank_info info;
    info.source = l.rank;
    info.rank = detail::parse_count(l.rank, r);
    if (l.size) {
      if (const char* s = env(l.size)) info.size = detail::parse_count(l.size, s);
    } else {  // Slurm: the step's (or the job's) tasks on this node
      const char* node = env("SLURM_NODEID");
      const int n = node ? detail::parse_count("SLURM_NODEID", node) : 0;
      for (const char* var : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
        if (const char* t = env(var)) {
          info.size = detail::slurm_tasks_on_node(var, t, n);
          break;
        }
    }
    if (info.size && info.rank >= *info.size)
      throw error(errc::invalid_config, "$" + info.source + "=" + std::to_string(info.rank) + " is not below its " +
                                            std::to_string(*info.size) + " local ranks");
    return info;
  }
  return std::nullopt;
}

/// The number of devices CUDA_VISIBLE_DEVICES names (none when unset or empty).
inline std::optional<int> devices_named(const char* cuda_visible_devices) {
  if (!cuda_visible_devices) return std::nullopt;
  const std::string_view s(cuda_visible_devices);
  if (s.empty()) return 0;
  int n = 1;
  for (char ch : s) n += ch == ',' ? 1 : 0;
  return n;
}

/// The decision for a process that sees `visible` GPUs (see the file comment's rules).
/// Errors: errc::invalid_config when no GPU is visible, an explicit device is not visible, or
/// more local ranks than GPUs share without `share`.
inline selection choose_device(const std::optional<local_rank_info>& local, int visible,
                               const char* cuda_visible_devices, const selection_options& o) {
  const std::string cvd = cuda_visible_devices ? std::string(" (CUDA_VISIBLE_DEVICES=") + cuda_visible_devices + ")" : "";
  if (visible <= 0) throw error(errc::invalid_config, "no GPU is visible to this process" + cvd);
  selection s;
  s.visible = visible;
  auto of = [&](int d) { return "GPU " + std::to_string(d) + " of " + std::to_string(visible); };
  if (o.device >= 0) {
    if (o.device >= visible)
      throw error(errc::invalid_config, "--gpu " + std::to_string(o.device) + ": only " + std::to_string(visible) +
                                            " GPUs are visible" + cvd);
    s.device = o.device;
    s.reason = of(s.device) + " (--gpu)";
    return s;
  }
  if (!local) {
    s.reason = of(0) + " (no launcher's local rank)";
    return s;
  }
  s.local = local;
  const int size = local->size.value_or(local->rank + 1);
  const std::string from = "local rank " + std::to_string(local->rank) +
                           (local->size ? " of " + std::to_string(*local->size) : std::string()) + " from " +
                           local->source;
  if (size <= visible) {
    s.device = local->rank;
    s.reason = of(s.device) + " (" + from + ")";
    return s;
  }
  if (o.share) {
    s.device = local->rank % visible;
    s.shared = true;
    s.reason = of(s.device) + ", shared (" + from + ", sharing allowed)";
    return s;
  }
  if (visible == 1 && devices_named(cuda_visible_devices) == 1) {
    s.reason = of(0) + " (" + from + "; CUDA_VISIBLE_DEVICES=" + cuda_visible_devices +
               " shows this process one GPU of its own)";
    return s;
  }
  throw error(errc::invalid_config,
              std::to_string(size) + " local ranks on this host (" + from + ") but " + std::to_string(visible) +
                  " GPUs visible" + cvd + ": give each process a GPU of its own (fewer processes per host, or a "
                  "per-process CUDA_VISIBLE_DEVICES), or let them share with --share_gpus (DTF_SHARE_GPUS=1)");
}

/// The GPUs this process sees (0 on CPU builds, and when the CUDA runtime finds none).
inline int visible_devices() {
#if DTF_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

/// Whether DTF_SHARE_GPUS asks for sharing ("1" or "true").
inline bool share_from_environment(const env_lookup& env) {
  const char* v = env("DTF_SHARE_GPUS");
  return v && (std::string_view(v) == "1" || std::string_view(v) == "true");
}

/// Chooses this process's GPU from the environment and, on CUDA builds, makes it the current
/// device (cudaSetDevice). On CPU builds nothing is chosen: std::nullopt (the local-rank
/// variables are still checked, so a malformed one is an error on every build).
/// Errors: as choose_device; errc::internal when cudaSetDevice fails.
inline std::optional<selection> select_device(selection_options o = {},
                                              const env_lookup& env = [](const char* v) { return std::getenv(v); }) {
  const auto local = local_rank_from(env);
  if (share_from_environment(env)) o.share = true;
#if DTF_CUDA
  selection s = choose_device(local, visible_devices(), env("CUDA_VISIBLE_DEVICES"), o);
  if (const cudaError_t rc = cudaSetDevice(s.device); rc != cudaSuccess)
    throw error(errc::internal, "cudaSetDevice(" + std::to_string(s.device) + "): " + cudaGetErrorString(rc));
  return s;
#else
  (void)local;
  return std::nullopt;
#endif
}

}  // namespace dtf::device
