// dtf/hooks/collective_restore.hpp — the session scaffold of a collective job (no ps): rank 0
// restores the latest checkpoint and broadcasts it, every rank resumes from the same state;
// and rank 0's checkpoint of the replicated state.
//
//   dtf::monitored_training_session session({.is_chief = comm.rank() == 0,
//       .scaffold = dtf::hooks::collective_scaffold(comm, model_dir, variables, engine, me)});
//   session.add_chief_hook(dtf::hooks::checkpoint_saver(
//       [&](std::int64_t step) { return dtf::hooks::save_replicated(ck, variables, engine, step); }, {...}));
//
// Engine: what the collective strategies build per task (ring_allreduce<M>, mirrored<M>):
// parameters() (device span), optimizer() (host_slots(), rule_name(), iterations()),
// global_step() and restore(values, slots, iterations, global_step).
// Checkpoints: the ps format with one shard file (dtf::write_checkpoint; dtf-ckpt reads it):
// the variables, the rule's slots and update count, the global step.
// Errors: those of the communicator and of dtf/checkpoint.hpp; a checkpoint rank 0 cannot read
// fails every rank, naming the directory.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/collectives.hpp>
#include <dtf/session.hpp>
#include <dtf/variable.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dtf::hooks {

/// The engine's parameters copied to host memory.
template <class Engine>
std::vector<float> host_parameters(const Engine& e) {
  const auto p = e.parameters();
  std::vector<float> host(p.size());
  thrust::copy(thrust::device_pointer_cast(p.data()), thrust::device_pointer_cast(p.data() + p.size()), host.begin());
  return host;
}

/// Rank 0's checkpoint of the replicated state at `step`; `write`, when given, writes it in
/// place of write_checkpoint (a hybrid job's, beside the tables the ps write).
template <class Engine>
checkpoint_manifest save_replicated(
    const checkpoint_options& ck, const std::vector<variable_spec>& variables, const Engine& e, std::int64_t step,
    const std::function<checkpoint_manifest(const host_checkpoint_state&)>& write = {}) {
  const auto values = host_parameters(e);
  const auto& opt = e.optimizer();
  const auto slots = opt.host_slots();
  host_checkpoint_state state{.variables = variables, .values = values, .rule = opt.rule_name(),
                              .slots = {}, .iterations = opt.iterations(), .global_step = step};
  for (const auto& s : slots) state.slots.emplace_back(s);
  return write ? write(state) : write_checkpoint(ck, state);
}

/// Every rank: rank 0 reads the latest checkpoint under `model_dir` (when there is one) and
/// broadcasts it; every rank restores it into the engine. Returns the restored global step, or
/// nullopt (no directory, no checkpoint). `restored_from` receives the checkpoint's name.
/// `check` (rank 0) sees the manifest before anything is broadcast: a throw refuses the restore
/// on every rank.
template <class Engine>
std::optional<std::int64_t> restore_and_broadcast(communicator& comm, const std::string& model_dir,
                                                  const std::vector<variable_spec>& variables, Engine& e,
                                                  const std::string& me, std::string* restored_from = nullptr,
                                                  const std::function<void(const checkpoint_manifest&)>& check = {}) {
  if (model_dir.empty()) return std::nullopt;
  // header: found (1), none (0) or failed (-1); global step; update count; slots
  std::int64_t header[4] = {0, 0, 0, 0};
  std::optional<checkpoint_reader> ck;
  std::string name;
  if (comm.rank() == 0) {
    try {
      // The latest checkpoint that verifies (a damaged latest is logged and the newest kept one
      // that verifies is used, as for the parameter servers).
      ck = open_latest_checkpoint(model_dir, checkpoint_fallback::newest_valid, [&me](const std::string& line) {
        std::printf("%s: %s\n", me.c_str(), line.c_str());
        std::fflush(stdout);
      });
      if (ck) {
        name = ck->manifest().name;
        header[0] = 1;
        header[1] = ck->manifest().global_step;
        header[2] = ck->manifest().variables.empty() ? 0 : ck->manifest().variables.front().iterations;
        header[3] = std::int64_t(ck->manifest().num_slots);
        for (const auto& v : variables) ck->match(v);  // every model variable, same shape
        if (check) check(ck->manifest());
      }
    } catch (...) {
      header[0] = -1;
      comm.broadcast("session/restore_header", std::span<std::int64_t>(header), 0);
      throw;
    }
  }
  comm.broadcast("session/restore_header", std::span<std::int64_t>(header), 0);
  if (header[0] < 0) throw error(errc::io_error, "rank 0 could not read the latest checkpoint in " + model_dir);
  if (header[0] == 0) return std::nullopt;
  const std::size_t n = num_parameters(variables);
  std::vector<float> values(n);
  std::vector<std::vector<float>> slots(static_cast<std::size_t>(header[3]), std::vector<float>(n));
  if (comm.rank() == 0) {
    // Variables land at the model's offsets, whatever layout saved them.
    for (const auto& v : variables) {
      const auto& saved = ck->match(v);
      ck->read(0, saved.offset, std::span<float>(values).subspan(v.offset, v.size()));
      for (std::size_t k = 0; k < slots.size(); ++k)
        ck->read(k + 1, saved.offset, std::span<float>(slots[k]).subspan(v.offset, v.size()));
    }
  }
  comm.broadcast("session/restore_values", std::span<float>(values), 0);
  for (auto& s : slots) comm.broadcast("session/restore_slot", std::span<float>(s), 0);
  e.restore(values, slots, header[2], header[1]);
  name = name.empty() ? "ckpt-" + std::to_string(header[1]) : name;
  if (restored_from) *restored_from = name;
  std::printf("%s: restored %s from %s (global step %lld)\n", me.c_str(), name.c_str(), model_dir.c_str(),
              static_cast<long long>(header[1]));
  std::fflush(stdout);
  return header[1];
}

/// The scaffold of a collective session: restore (rank 0) and wait_ready (the others) both run
/// restore_and_broadcast, so every rank takes part in the broadcast; the global step is the
/// engine's. `check`: as restore_and_broadcast's.
template <class Engine>
session_scaffold collective_scaffold(communicator& comm, std::string model_dir, std::vector<variable_spec> variables,
                                     Engine& e, std::string me,
                                     std::function<void(const checkpoint_manifest&)> check = {}) {
  auto share = [&comm, &e, model_dir, variables, me, check] {
    return restore_and_broadcast(comm, model_dir, variables, e, me, nullptr, check);
  };
  return {.restore = share, .wait_ready = [share] { share(); }, .global_step = [&e] { return e.global_step(); }};
}

}  // namespace dtf::hooks
