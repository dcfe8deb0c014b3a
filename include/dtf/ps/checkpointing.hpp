// dtf/ps/checkpointing.hpp — checkpoints of a ps cluster, as free functions over a ps_client:
// save (every ps writes its own shard file, the chief the manifest) and restore (through the
// chief, or each ps reading its own files), resharding to the client's placement. Embedding
// tables are saved with them (each ps its own table file) and restored when the restore is given
// the restoring run's tables (dtf/ps/table_checkpoint.hpp). The training tasks' data positions
// (dtf/ps/positions.hpp) are saved in the manifest and given back to ps 0 by every restore.
// The ps tasks write and read only in their own ps_options::checkpoint_dir.
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/ps/client.hpp>
#include <dtf/ps/positions.hpp>
#include <dtf/ps/request_parts.hpp>
#include <dtf/ps/sparse_client.hpp>
#include <dtf/ps/table_checkpoint.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dtf {

namespace detail {

struct restore_settings {
  const std::vector<variable_spec>& vars;
  const ps_config& config;
  std::span<float> params;
};

// Checks a restore against the checkpoint's manifest; returns each model variable's match
// and the rule's slot count.
inline std::pair<std::vector<const checkpoint_variable*>, std::size_t> plan_restore(
    const ps_client& client, const checkpoint_manifest& man, const restore_settings& how) {
  const auto& vars = how.vars;
  const std::size_t num_slots = optim::detail::slot_count(how.config.rule);
  const std::string rule_name =
      std::visit([](const auto& r) { return std::string(std::decay_t<decltype(r)>::name); }, how.config.rule);
  // (A model of embedding tables alone has no dense slots to match: the tables' rules are checked
  // per table.)
  if (!vars.empty() && num_slots != 0 && (man.num_slots != num_slots || man.rule != rule_name))
    throw error(errc::invalid_config, "checkpoint " + man.name + " holds the slots of rule " + man.rule +
                                          ", the restoring run uses " + rule_name);
  client.check_size(num_parameters(vars), "restore_checkpoint");
  if (!how.params.empty()) client.check_size(how.params.size(), "restore_checkpoint");
  std::vector<const checkpoint_variable*> saved(vars.size());
  for (std::size_t v = 0; v < vars.size(); ++v) saved[v] = &checkpoint_reader::match_variable(man, vars[v]);
  for (const auto& sh : client.layout().shards)
    if (sh.variable >= vars.size() || sh.offset < vars[sh.variable].offset ||
        sh.offset - vars[sh.variable].offset > vars[sh.variable].size() ||
        sh.size > vars[sh.variable].size() - (sh.offset - vars[sh.variable].offset))
      throw error(errc::invalid_argument, "restore_checkpoint: a shard of the placement lies outside variable " +
                                              std::to_string(sh.variable) + " of " + std::to_string(vars.size()));
  return {std::move(saved), num_slots};
}

// The restore message for ps `ps` (no payload); from[i]: shard i's first saved element.
inline ps_restore_msg restore_message(const ps_client& client, std::size_t ps, const checkpoint_manifest& man,
                                      const std::vector<const checkpoint_variable*>& saved, std::size_t num_slots,
                                      const restore_settings& how, std::vector<std::uint64_t>& from) {
  ps_restore_msg m;
  m.init.ids = client.shards_of(ps);
  from.clear();
  for (auto id : m.init.ids) {
    const auto& sh = client.layout().shards[id];
    const auto& sv = *saved[sh.variable];
    m.init.sizes.push_back(sh.size);
    m.iterations.push_back(sv.iterations);
    from.push_back(sv.offset + (sh.offset - how.vars[sh.variable].offset));  // inside sv: plan_restore
  }
  ps_client::set_config(m.init, how.config);
  m.init.num_ps = std::uint32_t(client.layout().num_ps);  // the receipts a synchronous ps 0 requires
  m.init.ps_index = std::uint32_t(ps);
  m.global_step = man.global_step;
  m.num_slots = num_slots;
  m.checkpoint = man.name;
  return m;
}

// ps `ps`'s restore in parts (dtf/ps/request_parts.hpp: through the chief each carries at most
// max_request_bytes of values and slots; read by the ps, at most max_shards_per_request shards),
// each part's message with part and parts set; from[k][i]: part k's shard i's first saved element.
inline std::vector<ps_restore_msg> restore_parts(const ps_client& client, std::size_t ps, const checkpoint_manifest& man,
                                                 const std::vector<const checkpoint_variable*>& saved,
                                                 std::size_t num_slots, const restore_settings& how, bool by_ps,
                                                 std::vector<std::vector<std::uint64_t>>& from) {
  std::vector<std::uint64_t> all;
  const auto whole = restore_message(client, ps, man, saved, num_slots, how, all);
  const auto parts = ps_detail::request_parts(client.shards_of(ps), client.layout(), by_ps ? 0 : 1 + num_slots,
                                              client.transport(), "restore_checkpoint", ps);
  std::vector<ps_restore_msg> out;
  std::size_t i = 0;
  for (const auto& part : parts) {
    auto& m = out.emplace_back(whole);
    auto& f = from.emplace_back();
    m.init.ids = part;
    m.init.sizes.clear();
    m.iterations.clear();
    for (std::size_t j = 0; j < part.size(); ++j, ++i) {
      m.init.sizes.push_back(whole.init.sizes[i]);
      m.iterations.push_back(whole.iterations[i]);
      f.push_back(all[i]);
    }
    m.init.part = std::uint32_t(out.size() - 1);
    m.init.parts = std::uint32_t(parts.size());
    m.from_files = by_ps;
    if (by_ps) m.from = f;
    if (const auto meta = encode_message(m).size(); meta > client.transport().limits.max_meta_bytes)
      throw error(errc::invalid_argument, "restore of ps." + std::to_string(ps) + ": " + std::to_string(part.size()) +
                                              " shards make " + std::to_string(meta) + " bytes of metadata, over the " +
                                              std::to_string(client.transport().limits.max_meta_bytes) +
                                              " a frame may carry: place fewer, larger shards on each ps");
  }
  return out;
}

inline std::int64_t restore_from(ps_client& client, const checkpoint_reader& ck, const restore_settings& how) {
  const auto& man = ck.manifest();
  const auto [saved, num_slots] = plan_restore(client, man, how);
  std::vector<std::vector<ps_restore_msg>> msgs;  // every ps's parts, checked before anything is sent
  std::vector<std::vector<std::vector<std::uint64_t>>> from(client.layout().num_ps);
  for (std::size_t ps = 0; ps < client.layout().num_ps; ++ps)
    msgs.push_back(restore_parts(client, ps, man, saved, num_slots, how, false, from[ps]));
  // The positions first: a restore makes the ps ready, and a task that finds it ready reads its
  // position at once.
  restore_positions(client, man.positions);
  // One part at a time: read its shards' values and slots from the files into one buffer, send.
  std::vector<float> payload;
  for (std::size_t ps = 0; ps < client.layout().num_ps; ++ps)
    for (std::size_t k = 0; k < msgs[ps].size(); ++k) {
      const auto& m = msgs[ps][k];
      std::size_t floats = 0;
      for (auto n : m.init.sizes) floats += n * (1 + num_slots);
      payload.resize(floats);
      std::size_t at = 0;
      for (std::size_t i = 0; i < m.init.ids.size(); ++i) {
        const std::size_t n = m.init.sizes[i];
        for (std::size_t j = 0; j <= num_slots; ++j) {
          ck.read(j, from[ps][k][i], std::span<float>(payload).subspan(at, n));
          if (j == 0 && !how.params.empty())
            std::copy_n(payload.begin() + std::ptrdiff_t(at), n,
                        how.params.begin() + std::ptrdiff_t(client.layout().shards[m.init.ids[i]].offset));
          at += n;
        }
      }
      rpc_call c = client.request(ps, message_kind::ps_restore, encode_message(m));
      c.payload.push_back(asio::buffer(payload.data(), payload.size() * sizeof(float)));
      std::vector<rpc_call> one{std::move(c)};
      client.call_all(one);
    }
  return man.global_step;
}

inline std::int64_t restore_by_ps(ps_client& client, const checkpoint_manifest& man, const restore_settings& how) {
  const auto [saved, num_slots] = plan_restore(client, man, how);
  std::vector<rpc_call> calls;
  for (std::size_t ps = 0; ps < client.layout().num_ps; ++ps) {
    std::vector<std::vector<std::uint64_t>> from;
    for (const auto& m : restore_parts(client, ps, man, saved, num_slots, how, true, from))
      calls.push_back(client.request(ps, message_kind::ps_restore, encode_message(m)));
  }
  restore_positions(client, man.positions);  // before the ps is ready, as restore_from
  client.call_all(calls);  // every ps reads its own slices, in parallel; one ps's parts in order
  if (!how.params.empty()) client.pull(how.params);
  return man.global_step;
}

}  // namespace detail

/// Saves a checkpoint (the chief does this): every ps writes its shard file (and, holding
/// embedding tables, its table file) into its own ps_options::checkpoint_dir, which must be options.directory (the ps never takes a directory
/// from the wire), then the manifest and the state file are written here, and
/// checkpoints beyond options.max_to_keep are deleted. `vars` are the model's variables
/// (the placement's variable indices refer to them). The checkpoint is named
/// "<prefix>-<step>"; without `step`, the global step read from ps 0 first. Returns the
/// manifest (its global_step: ps 0's at the time of the save; in synchronous training the step
/// every ps saved, ps 0 holding its decisions meanwhile: sync_client::hold_steps).
/// `complete`, when given, sees the manifest before it is committed (the steps still held): a
/// hybrid job's rank 0 adds the dense variables it holds (dtf/train/hybrid_checkpoint.hpp).
/// Errors: errc::io_error / peer_failure when a ps cannot write its file (the previous
/// checkpoint stays the latest); errc::invalid_argument when vars do not match the placement.
inline checkpoint_manifest save_checkpoint(ps_client& client, const checkpoint_options& options,
                                         const std::vector<variable_spec>& vars,
                                         std::optional<std::int64_t> step = std::nullopt,
                                         const std::function<void(checkpoint_manifest&)>& complete = {}) {
  for (const auto& sh : client.layout().shards)
    if (sh.variable >= vars.size())
      throw error(errc::invalid_argument, "save_checkpoint: the placement names variable " +
                                              std::to_string(sh.variable) + " of " + std::to_string(vars.size()));
  if (options.directory.empty()) throw error(errc::invalid_config, "save_checkpoint: no checkpoint directory");
  std::error_code ec;
  std::filesystem::create_directories(options.directory, ec);
  if (ec)
    throw error(errc::io_error, "cannot create checkpoint directory " + options.directory + ": " + ec.message());
  checkpoint_manifest m;
  // Synchronous training: ps 0 stops deciding steps and every ps is brought to its step t,
  // so every file holds the state of t (dtf/ps/sync_protocol.hpp); released once written.
  const auto held = client.hold_steps();
  struct release {
    ps_client& client;
    bool held;
    ~release() {
      if (!held) return;
      try {
        client.release_steps();
      } catch (const error&) {  // ps 0 lost: its hold ended with the connection
      }
    }
  } release_on_exit{client, held.has_value()};
  m.name = options.prefix + "-" + std::to_string(held ? *held : step ? *step : client.global_step());
  m.num_ps = client.layout().num_ps;
  m.synchronous = held.has_value();
  for (std::size_t ps = 0; ps < client.layout().num_ps; ++ps)  // a ps's answer names each shard
    if (const std::size_t reply = 4096 + 12 * client.shards_of(ps).size(); reply > client.transport().limits.max_meta_bytes)
      throw error(errc::invalid_argument, "save_checkpoint: ps." + std::to_string(ps) + " holds " +
                                              std::to_string(client.shards_of(ps).size()) +
                                              " shards, too many to list in one answer (" +
                                              std::to_string(client.transport().limits.max_meta_bytes) +
                                              " bytes of metadata): place fewer, larger shards on each ps");
  std::vector<rpc_call> calls;
  for (std::size_t ps = 0; ps < client.layout().num_ps; ++ps)
    calls.push_back(client.request(ps, detail::message_kind::ps_save,
                                   detail::encode_message(detail::ps_save_msg{m.name, ps, client.layout().num_ps, held})));
  client.call_all(calls);
  std::vector<std::int64_t> iterations(vars.size(), 0);
  detail::saved_tables tables;
  for (const auto& c : calls) {
    const auto r = detail::decode_message<detail::ps_saved_msg>(c.reply_meta, "saved");
    tables.add(r, c.peer);
    if (c.peer == 0) m.global_step = r.global_step;
    if (!r.ids.empty()) {
      m.rule = r.rule;
      m.num_slots = std::size_t(r.num_slots);
    }
    m.files.push_back({r.file, c.peer, r.bytes, r.sha256});
    for (std::size_t i = 0; i < r.ids.size() && i < r.iterations.size(); ++i) {
      if (r.ids[i] >= client.layout().shards.size())
        throw error(errc::corrupt_data, "ps." + std::to_string(c.peer) + " saved shard " + std::to_string(r.ids[i]) +
                                            " outside the placement");
      auto& it = iterations[client.layout().shards[r.ids[i]].variable];
      it = std::max(it, r.iterations[i]);
    }
  }
  for (std::size_t v = 0; v < vars.size(); ++v)
    m.variables.push_back({vars[v].name, vars[v].shape, vars[v].offset, iterations[v]});
  for (std::size_t id = 0; id < client.layout().shards.size(); ++id) {
    const auto& sh = client.layout().shards[id];
    m.shards.push_back({std::uint32_t(id), sh.variable, sh.part, sh.ps, sh.row_begin, sh.row_end, sh.offset, sh.size});
  }
  tables.finish(m);
  // The positions reported by now: each at or past the work in the shards just saved (a task
  // restarted from this checkpoint may skip the few batches in between, never repeat one).
  m.positions = recorded_positions(client);
  if (complete) complete(m);
  commit_checkpoint(options.directory, m, options.max_to_keep);
  return m;
}

/// Restores checkpoint `name` of `directory` into every ps, whatever number of ps tasks
/// saved it: the checkpoint is verified (checkpoint_reader: every field, size and SHA-256),
/// its variables matched to `vars` by name and re-sliced for this client's placement; values,
/// the rule's slots, the update counts and the global step replace what each ps held
/// (initialised or not). `config` is as in ps_client::initialize().
/// Returns the restored global step; the values are left in `params` when it is non-empty.
/// Streaming (restore_transfer::through_chief): each ps's slices are read from the shard
/// files and sent a part at a time (at most transport_options::max_request_bytes of values and
/// slots, or one shard: docs/design/large-models.md), so the chief holds one part, never a
/// ps's share of the checkpoint. With ps_reads_files the chief reads only the manifest
/// and each ps opens, verifies and reads its own slices from its own ps_options::checkpoint_dir
/// (which must hold the same checkpoint; params are then pulled from the ps).
/// With `tables` (the restoring run's embedding tables, each created first), their rows are
/// restored too, through the chief either way (restore_tables, dtf/ps/table_checkpoint.hpp).
/// Errors: errc::corrupt_data / io_error (a file missing or damaged), invalid_argument /
/// shape_mismatch (a variable or table missing or reshaped), invalid_config (the checkpoint's
/// slots belong to another update rule).
inline std::int64_t restore_checkpoint(ps_client& client, const std::string& directory, const std::string& name,
                                       const std::vector<variable_spec>& vars, const ps_config& config,
                                       std::span<float> params = {},
                                       restore_transfer transfer = restore_transfer::through_chief,
                                       embedding_tables* tables = nullptr) {
  // The tables (and positions) before the dense values: their restore makes the ps ready, and
  // a worker that finds it ready gathers rows at once.
  const detail::restore_settings how{vars, config, params};
  if (transfer == restore_transfer::ps_reads_files) {
    if (tables) restore_tables(client, *tables, checkpoint_reader::open_tables(directory, name));
    return detail::restore_by_ps(client, read_manifest(directory, name), how);
  }
  const auto reader = checkpoint_reader::open(directory, name);
  if (tables) restore_tables(client, *tables, reader);
  return detail::restore_from(client, reader, how);
}

/// Restores the latest checkpoint of `directory` (see restore_checkpoint); returns its
/// global step, or nullopt (nothing changed) when the directory holds none. When the latest
/// fails verification, with checkpoint_fallback::newest_valid (the default) the transport's
/// log says so and the newest kept checkpoint that verifies is restored; with refuse, or when
/// none verifies, the error is thrown (errc::corrupt_data naming the latest's cause). The
/// chief verifies the candidates either way (reading every file once, holding nothing).
/// With `tables`, their rows are restored from the same checkpoint (see restore_checkpoint).
/// `check` sees the chosen checkpoint's manifest before anything is sent to a ps: a throw refuses
/// the restore (dtf::train checks the global step and the data positions against its options).
inline std::optional<std::int64_t> restore_latest(ps_client& client, const std::string& directory,
                                                  const std::vector<variable_spec>& vars, const ps_config& config,
                                                  std::span<float> params = {},
                                                  checkpoint_fallback fallback = checkpoint_fallback::newest_valid,
                                                  restore_transfer transfer = restore_transfer::through_chief,
                                                  embedding_tables* tables = nullptr,
                                                  const std::function<void(const checkpoint_manifest&)>& check = {}) {
  auto reader = open_latest_checkpoint(directory, fallback, [&client](const std::string& line) {
    detail::log_line(client.transport(), "dtf " + client.identity() + ": " + line);
  });
  if (!reader) return std::nullopt;
  if (check) check(reader->manifest());
  const detail::restore_settings how{vars, config, params};
  if (tables) restore_tables(client, *tables, *reader);  // before the ps is ready (restore_checkpoint)
  return transfer == restore_transfer::ps_reads_files ? detail::restore_by_ps(client, reader->manifest(), how)
                                                      : detail::restore_from(client, *reader, how);
}

}  // namespace dtf
