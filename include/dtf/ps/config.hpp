// dtf/ps/config.hpp — what configures a parameter server and what its client reports back.
//
//   ps_config    what the chief sends at init/restore: the update rule, the apply mode and the
//                number of replicas each synchronous step aggregates (0: asynchronous)
//   ps_options   the ps task's own settings: transport, I/O threads, its checkpoint directory,
//                the non-finite-gradient policy and the bounds on what a peer may make it hold
#pragma once

#include <dtf/checkpoint.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/optim/rules.hpp>
#include <dtf/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace dtf {

/// How pushes are applied to a shard.
enum class apply_mode {
  locked,     ///< one update at a time per shard; a pull sees no update half-applied
  lock_free,  ///< Hogwild: updates race (only for rules without state: sgd; see parameter_server)
};

/// What the chief configures every ps with (at init and at restore).
struct ps_config {
  /// The update rule every shard applies.
  optim::rule rule = optim::sgd{};
  /// How pushes are applied to a shard.
  apply_mode mode = apply_mode::locked;
  std::size_t replicas_to_aggregate = 0;  ///< N > 0: synchronous, N contributions per step
  std::size_t num_workers = 0;            ///< > 0: init fails when N exceeds it (0: unchecked)
};

/// What a ps does with a gradient or delta that holds a NaN or an infinity.
enum class nonfinite_policy {
  reject,  ///< error reply naming the worker; nothing applied (the default)
  skip,    ///< nothing applied, the reply says so (push_result::skipped); logged
  apply,   ///< applied as sent (the parameters may become non-finite)
};

/// A parameter server task's own settings: transport, I/O threads, its checkpoint directory, the
/// non-finite-gradient policy and the bounds on what a peer may make it hold.
struct ps_options {
  /// The transport's settings (listening, TLS, limits, timeouts).
  transport_options transport{};
  int threads = 1;  ///< I/O threads; with lock_free shards, updates from several run concurrently
  checkpoint_fault save_fault{};  ///< testing crash safety: a save stops part-way through its file
  /// Testing exception safety: called before each shard's update (dense pushes and synchronous
  /// applies); it may throw, as copy on write's allocation may.
  std::function<void()> apply_fault{};
  /// Where this ps writes its checkpoint shard files and reads them for a restore
  /// (restore_transfer::ps_reads_files). Never taken from the wire; empty: saving is refused.
  std::string checkpoint_dir;
  /// What to do with a non-finite gradient or delta.
  nonfinite_policy nonfinite = nonfinite_policy::reject;
  /// A push of at least transport.pieces_min_bytes whose sender checked its values finite is
  /// applied a piece (whole shards, at least apply_piece_bytes) at a time as its bytes arrive
  /// (dtf/ps/push_pieces.hpp); false: applied once all of it is in.
  bool apply_as_received = true;
  /// The least bytes of a piece applied as it arrives (apply_as_received).
  std::size_t apply_piece_bytes = std::size_t(256) << 10;
  /// The tasks allowed to report done; empty: any authenticated identity, at most max_done_tasks.
  std::vector<std::string> known_workers;
  /// The one task allowed to initialise, restore, save and shut down this ps (its transport
  /// identity, e.g. "chief.0"); empty: any authenticated peer. dtf::train sets the cluster's chief.
  std::string chief;
  /// The most tasks that may report done when known_workers is empty.
  std::size_t max_done_tasks = 4096;
  /// Bytes this ps may hold for embedding tables (values and slots, a hashed table counted at its
  /// max_rows share): a table's creation carries no payload, so this bounds what it can ask for.
  std::uint64_t max_sparse_bytes = std::uint64_t(16) << 30;
};

/// How a restore moves a checkpoint's bytes into the ps tasks.
enum class restore_transfer {
  through_chief,   ///< the chief reads the files and sends each ps its slices, one ps at a time
  ps_reads_files,  ///< each ps reads (and verifies) its own slices from the shard files of its
                   ///< own ps_options::checkpoint_dir (the same directory as the chief's); the
                   ///< chief holds nothing model-sized, so a model larger than its memory restores
};

/// What a push reports back.
struct push_result {
  std::int64_t global_step = -1;  ///< after the push (from ps 0)
  std::uint64_t staleness = 0;    ///< largest, over the ps pushed to, count of updates applied
                                  ///< since this client's last pull (0 for a fresh pull)
  bool skipped = false;           ///< a ps skipped it (non-finite values, nonfinite_policy::skip)
};

/// What a synchronous contribution reports back.
struct sync_result {
  std::int64_t global_step = -1;   ///< after the step completed (or the current one, if dropped)
  bool dropped = false;            ///< the contribution came for a finished step
  bool skipped = false;            ///< non-finite values under nonfinite_policy::skip
  std::uint64_t dropped_total = 0; ///< this worker's dropped contributions so far (per ps, max)
};

namespace ps_detail {
/// The configuration an init or restore carries, checked: N above the workers could never
/// complete a step; lock-free has no meaning when one average is applied per step.
/// Errors: errc::invalid_config naming which.
inline ps_config config_of(const detail::ps_init_msg& m) {
  const ps_config c{m.rule.to_rule(), m.lock_free ? apply_mode::lock_free : apply_mode::locked,
                    std::size_t(m.replicas_to_aggregate), std::size_t(m.num_workers)};
  if (c.num_workers > 0 && c.replicas_to_aggregate > c.num_workers)
    throw error(errc::invalid_config, "replicas_to_aggregate is " + std::to_string(c.replicas_to_aggregate) +
                                          " but the job has " + std::to_string(c.num_workers) +
                                          " workers: no step could ever complete");
  if (c.replicas_to_aggregate > 0 && c.mode == apply_mode::lock_free)
    throw error(errc::invalid_config, "synchronous training applies one average per step: lock-free is meaningless");
  return c;
}

/// What a ps holds and how it trains it: what a second init (a restarted chief's) is compared
/// with. config.num_workers is not compared: it only bounds N when an init is checked.
struct held_model {
  ps_config config;
  std::map<std::uint32_t, std::uint64_t> shard_sizes;  ///< elements of each shard held, by id
};

/// A rule as the errors name it: "momentum (learning_rate 0.1, momentum 0.9, nesterov)".
inline std::string describe_rule(const optim::rule& rule) {
  const auto num = [](float x) {  // the shortest text that reads back as x
    char buf[32];
    for (int digits = 6; digits <= 9; ++digits)
      if (std::snprintf(buf, sizeof buf, "%.*g", digits, double(x)); std::strtof(buf, nullptr) == x) break;
    return std::string(buf);
  };
  const detail::rule_msg r = detail::rule_msg::from(rule);
  std::string out = r.name + " (learning_rate " + num(r.learning_rate);
  if (r.name == "momentum") out += ", momentum " + num(r.momentum) + (r.nesterov ? ", nesterov" : "");
  if (r.name == "adagrad") out += ", initial_accumulator " + num(r.initial_accumulator) + ", epsilon " + num(r.epsilon);
  if (r.name == "adam" || r.name == "adamw")
    out += ", beta1 " + num(r.beta1) + ", beta2 " + num(r.beta2) + ", epsilon " + num(r.epsilon);
  if (r.weight_decay != 0.0f || r.name == "adamw") out += ", weight_decay " + num(r.weight_decay);
  return out + ")";
}

/// Empty when init `m` (checked: `asked`) is of the model a ps holds, trained as it trains it:
/// the same shards of the same sizes, the same update rule with the same hyperparameters, the
/// same apply mode and N (0: asynchronous). Otherwise every difference, for the error a second
/// init gets (a restarted chief's init is ignored only when it would change nothing).
inline std::string training_change(const held_model& held, const detail::ps_init_msg& m, const ps_config& asked) {
  std::vector<std::string> changes;
  const auto ids = std::to_string(held.shard_sizes.size()), sent = std::to_string(m.ids.size());
  if (m.ids.size() != held.shard_sizes.size())
    changes.push_back("this ps already holds another model: " + ids + " shards here, the init sends " + sent);
  for (std::size_t i = 0; i < m.ids.size() && i < m.sizes.size() && changes.empty(); ++i) {
    const auto it = held.shard_sizes.find(m.ids[i]);
    if (it == held.shard_sizes.end())
      changes.push_back("this ps already holds another model: shard " + std::to_string(m.ids[i]) + " is not held here");
    else if (it->second != m.sizes[i])
      changes.push_back("this ps already holds another model: shard " + std::to_string(m.ids[i]) + " holds " +
                        std::to_string(it->second) + " elements here, the init sends " + std::to_string(m.sizes[i]));
  }
  const std::string rule = describe_rule(held.config.rule), wanted_rule = describe_rule(asked.rule);
  if (held.config.rule.index() != asked.rule.index())
    changes.push_back("this ps already holds another model: its update rule is " + rule + ", the init asks for " +
                      wanted_rule);
  else if (rule != wanted_rule)  // every hyperparameter is in the text, at the precision that tells floats apart
    changes.push_back("this ps applies update rule " + rule + ", the init asks for " + wanted_rule);
  const auto how = [](std::size_t n, apply_mode mode) {
    return n > 0 ? "synchronously (replicas_to_aggregate " + std::to_string(n) + ")"
                 : std::string(mode == apply_mode::lock_free ? "asynchronously, lock-free" : "asynchronously, locked");
  };
  const std::string trains = how(held.config.replicas_to_aggregate, held.config.mode),
                    wanted = how(asked.replicas_to_aggregate, asked.mode);
  if (trains != wanted) changes.push_back("this ps trains its model " + trains + ", the init asks for " + wanted);
  if (changes.empty()) return {};
  std::string out;
  for (const auto& c : changes) out += (out.empty() ? "" : "; ") + c;
  return out + " (restart the ps to change it)";
}
}  // namespace ps_detail

}  // namespace dtf
