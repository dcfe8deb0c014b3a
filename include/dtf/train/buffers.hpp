// dtf/train/buffers.hpp — what dtf::train does with a model's buffers (dtf::has_buffers:
// BatchNorm's running statistics and the like; dtf/concepts.hpp): the chief's (rank 0's) are the
// job's. Each task's model updates its own in training; only the chief's are ever read (its
// evaluation, its checkpoints), so nothing crosses the network per step. DDP broadcasts rank 0's
// before every forward to keep the replicas' copies identical; dtf does not, since no result it
// reads depends on another rank's copy, and a per-step broadcast costs a collective per step.
//   save      the chief writes NAME.buffers (dtf/checkpoint/buffers_file.hpp) before each
//             checkpoint NAME's manifest
//   restore   the chief reads the restored checkpoint's NAME.buffers into its model (a
//             checkpoint without one, saved by a model without buffers, leaves them as they are,
//             saying so)
//   start     a collective job broadcasts rank 0's (after a restore, the restored ones) to every
//             rank and replica, so every copy starts equal; a ps job's chief publishes its own
//             on ps 0 (after it initialised or restored the job, and again after it
//             re-initialised a ps that restarted) and every worker takes them at its start
//   evaluate  mirrored's replicas are copies: replica 0's buffers are copied into the caller's
//             model before each evaluation and save
// Models without buffers compile none of this.
#pragma once

#include <dtf/checkpoint/buffers_file.hpp>
#include <dtf/collectives.hpp>
#include <dtf/concepts.hpp>
#include <dtf/error.hpp>
#include <dtf/ps/positions.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace dtf::detail {

/// The buffers of `m` (empty for a model without any).
template <class M>
std::vector<float> buffers_of(const M& m) {
  if constexpr (has_buffers<M>) {
    std::vector<float> values(num_parameters(m.buffers()));
    if (!values.empty()) m.read_buffers(values);
    return values;
  } else {
    return {};
  }
}

/// The chief, before checkpoint `name`'s manifest: its model's buffers beside it.
template <class M>
void save_buffers(const M& m, const std::string& dir, const std::string& name) {
  if constexpr (has_buffers<M>) {
    const auto specs = m.buffers();
    if (specs.empty() || dir.empty()) return;
    write_buffers_file(dir, name, specs, buffers_of(m));
  }
}

/// The chief, after restoring checkpoint `name`: its buffers into the model. Returns whether
/// the checkpoint had them (and says so when it had none).
template <class M>
bool restore_buffers(M& m, const std::string& dir, const std::string& name, const std::string& me) {
  if constexpr (has_buffers<M>) {
    const auto specs = m.buffers();
    if (specs.empty() || dir.empty()) return false;
    std::vector<float> values(num_parameters(specs));
    if (!read_buffers_file(dir, name, specs, values)) {
      std::error_code ec;  // no checkpoint of that name (a run that saves none at its start): nothing to say
      if (!std::filesystem::exists(std::filesystem::path(dir) / detail::ckpt::manifest_file_name(name), ec)) return false;
      std::printf("%s: checkpoint %s has no buffers file; the model keeps its own buffers\n", me.c_str(), name.c_str());
      std::fflush(stdout);
      return false;
    }
    m.write_buffers(values);
    return true;
  } else {
    return false;
  }
}

/// A collective job's start, on every rank: rank 0's buffers (read from checkpoint `restored`
/// when it is not empty and has them, else rank 0's model's) into every rank's model and, for
/// an engine with replicas (mirrored), into each replica. An error on rank 0 fails every rank.
template <class M, class Engine>
void share_buffers(communicator& comm, M& net, Engine& engine, const std::string& dir, const std::string& restored,
                   const std::string& me) {
  if constexpr (has_buffers<M>) {
    const auto specs = net.buffers();
    if (specs.empty()) return;
    std::int64_t ok = 1;
    if (comm.rank() == 0) {
      try {
        if (!restored.empty()) restore_buffers(net, dir, restored, me);
      } catch (...) {
        ok = 0;
        comm.broadcast("session/buffers_header", std::span<std::int64_t>(&ok, 1), 0);
        throw;
      }
    }
    comm.broadcast("session/buffers_header", std::span<std::int64_t>(&ok, 1), 0);
    if (ok == 0) throw error(errc::io_error, "rank 0 could not read the buffers of checkpoint " + restored);
    std::vector<float> values = buffers_of(net);
    comm.broadcast("session/buffers", std::span<float>(values), 0);
    net.write_buffers(values);
    if constexpr (requires { engine.replicas(); engine.model(std::size_t(0)); })
      for (std::size_t k = 0; k < engine.replicas(); ++k) engine.model(k).write_buffers(values);
  }
}

/// A ps job's start: the chief publishes its model's buffers on ps 0; a worker waits up to
/// `timeout` for them and takes them into its model. Errors: errc::timeout naming the wait
/// when the chief's never come; errc::shape_mismatch for another model's.
template <class M>
void share_ps_buffers(ps_client& ps, M& net, bool chief, std::chrono::milliseconds timeout) {
  if constexpr (has_buffers<M>) {
    if (net.buffers().empty()) return;
    std::vector<float> values = buffers_of(net);
    if (chief) return publish_buffers(ps, values);
    if (!published_buffers(ps, values, timeout))
      throw error(errc::timeout, "the chief published no model buffers on ps 0 within " +
                                     std::to_string(timeout.count()) + " ms");
    net.write_buffers(values);
  }
}

/// mirrored: replica 0's buffers into the caller's model (which evaluation and saves read);
/// nothing for an engine that trains the caller's model itself.
template <class M, class Engine>
void take_replica_buffers(M& net, Engine& engine) {
  if constexpr (has_buffers<M>) {
    if constexpr (requires { engine.model(std::size_t(0)); }) {
      if (net.buffers().empty()) return;
      net.write_buffers(buffers_of(engine.model(0)));
    }
  }
}

}  // namespace dtf::detail
