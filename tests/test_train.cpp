// The strategy contract (dtf::strategy: archetypes, every built-in, what a type lacks) and
// dtf::train in one process (a collective strategy on a cluster of this process alone),
// compared with an independent training loop.
#include <dtf/device/loss_ring.hpp>
#include <dtf/strategies/aeasgd.hpp>
#include <dtf/strategies/agn.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/dyn_sgd.hpp>
#include <dtf/strategies/eamsgd.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/mirrored.hpp>
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/strategies/sync.hpp>
#include <dtf/train.hpp>
#include <dtf/train_flags.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "helpers.hpp"
#include "train_helpers.hpp"

// The file's code in a namespace of its own: its using-directive for dtf::strategies would
// otherwise reach every source compiled after this one in its unity batch (tests/CMakeLists.txt).
namespace train_tests {

namespace {

// Minimal archetypes of the contract, one per kind: exactly the required expressions.
struct archetype_state {};
struct async_archetype {
  struct config_type {};
  using state_type = archetype_state;
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::asynchronous;
  dtf::optim::rule ps_rule() const { return dtf::optim::sgd{}; }
  bool lock_free() const { return false; }
  void begin(state_type&) {}
  float step(state_type&, const dtf::detail::strategy_gradient_fn&) { return 0; }
  void end(state_type&) {}
};
struct sync_archetype {
  struct config_type {};
  using state_type = archetype_state;
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::synchronous;
  dtf::optim::rule ps_rule() const { return dtf::optim::sgd{}; }
  std::size_t replicas_to_aggregate() const { return 1; }
  std::size_t steps_per_contribution() const { return 1; }
  void begin(state_type&) {}
  float step(state_type&, const dtf::detail::strategy_gradient_fn&) { return 0; }
  void end(state_type&) {}
};
template <class M>
struct engine_archetype {};
struct collective_archetype {
  struct config_type {};
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::collective;
  template <class M>
  using engine = engine_archetype<M>;
  std::size_t replicas_per_process() const { return 1; }
};
static_assert(dtf::strategy<async_archetype>);
static_assert(dtf::strategy<sync_archetype>);
static_assert(dtf::strategy<collective_archetype>);

// One requirement removed at a time: no longer a strategy.
struct async_without_lock_free {
  struct config_type {};
  using state_type = archetype_state;
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::asynchronous;
  dtf::optim::rule ps_rule() const { return dtf::optim::sgd{}; }
  void begin(state_type&) {}
  float step(state_type&, const dtf::detail::strategy_gradient_fn&) { return 0; }
  void end(state_type&) {}
};
struct sync_without_replicas {
  struct config_type {};
  using state_type = archetype_state;
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::synchronous;
  dtf::optim::rule ps_rule() const { return dtf::optim::sgd{}; }
  std::size_t steps_per_contribution() const { return 1; }
  void begin(state_type&) {}
  float step(state_type&, const dtf::detail::strategy_gradient_fn&) { return 0; }
  void end(state_type&) {}
};
struct collective_without_engine {
  struct config_type {};
  static constexpr dtf::strategy_kind kind = dtf::strategy_kind::collective;
  std::size_t replicas_per_process() const { return 1; }
};
static_assert(!dtf::strategy<async_without_lock_free>);
static_assert(!dtf::strategy<sync_without_replicas>);
static_assert(!dtf::strategy<collective_without_engine>);
static_assert(!dtf::strategy<int>);

// Every built-in models the one contract.
using namespace dtf::strategies;
static_assert(dtf::strategy<hogwild> && dtf::strategy<downpour> && dtf::strategy<agn> && dtf::strategy<dyn_sgd> &&
              dtf::strategy<aeasgd> && dtf::strategy<eamsgd> && dtf::strategy<sync_sgd> && dtf::strategy<sagn> &&
              dtf::strategy<ring_allreduce<>> && dtf::strategy<mirrored<>>);
static_assert(hogwild::kind == dtf::strategy_kind::asynchronous && sagn::kind == dtf::strategy_kind::synchronous &&
              mirrored<>::kind == dtf::strategy_kind::collective);

/// A user hook: counts the steps it saw.
struct counting_hook {
  std::int64_t* runs;
  void after_run(dtf::run_context&, const dtf::run_values&) { ++*runs; }
};

/// The plain loop train() must match with one rank and SGD: shard 0 of 1, shuffled with the
/// seed, batched; gradients and the update on the same model.
std::vector<float> reference_sgd(const dtf::data::dataset& d, std::size_t batch, std::uint64_t seed, float lr,
                                 std::int64_t steps, float& last_loss) {
  auto net = dtf::test::small_net();
  const std::size_t n = net.num_parameters();
  dtf::tensor p({n}), g({n}), x, y;
  net.initialize(p.span<float>(), seed);
  dtf::optim::optimizer<> opt(dtf::optim::sgd{lr}, n);
  auto stream = d.shuffle(seed).batch(batch).repeat(-1).stream();
  for (std::int64_t s = 0; s < steps; ++s) {
    const auto b = stream.next();
    dtf::assign_from_host(x, b->features);
    dtf::assign_from_host(y, b->labels);
    last_loss = net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
    opt.apply(p.span<float>(), g.span<float>());
  }
  return p.to_vector<float>();
}

/// The first global step (1-based) whose loss is not finite in a plain loop that reads every
/// step's loss (0: none within `steps`).
std::int64_t first_diverged_step(const dtf::data::dataset& d, std::size_t batch, std::uint64_t seed, float lr,
                                 std::int64_t steps) {
  auto net = dtf::test::small_net();
  const std::size_t n = net.num_parameters();
  dtf::tensor p({n}), g({n}), x, y;
  net.initialize(p.span<float>(), seed);
  dtf::optim::optimizer<> opt(dtf::optim::sgd{lr}, n);
  auto stream = d.shuffle(seed).batch(batch).repeat(-1).stream();
  for (std::int64_t s = 1; s <= steps; ++s) {
    const auto b = stream.next();
    dtf::assign_from_host(x, b->features);
    dtf::assign_from_host(y, b->labels);
    if (!std::isfinite(net.loss_and_gradients(p.span<float>(), x, y, g.span<float>()))) return s;
    opt.apply(p.span<float>(), g.span<float>());
  }
  return 0;
}

}  // namespace

TEST_CASE("train: one rank of ring_allreduce matches a plain SGD loop, with the user's hook", "[train]") {
  const auto data = dtf::test::synthetic(640, 7, dtf::test::labels::argmax);
  auto net = dtf::test::small_net();
  std::vector<float> final_params;
  std::int64_t hook_runs = 0;
  dtf::train_options o{.name = "test", .epochs = 3, .batch = 32, .seed = 11, .log_every = 0};
  o.evaluate = [&](std::span<const float> p) {
    final_params = dtf::test::host_copy(p);
    return dtf::nn::evaluate(net, p, dtf::test::synthetic(200, 8, dtf::test::labels::argmax).batch(100));
  };
  const auto r = dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>({.rule = dtf::optim::sgd{0.1f}}), o,
                            dtf::partitioners::round_robin{}, counting_hook{&hook_runs});
  float reference_loss = 0;
  const auto reference = reference_sgd(data, 32, 11, 0.1f, 3 * 20, reference_loss);
  CHECK(r.exit_code == 0);
  CHECK(r.global_step == 60);  // 3 epochs of 640 / 32 batches
  CHECK(hook_runs == 60);
  CHECK(r.loss == Approx(reference_loss).epsilon(1e-5));
  REQUIRE(final_params.size() == reference.size());
  for (std::size_t i = 0; i < reference.size(); ++i) REQUIRE(final_params[i] == Approx(reference[i]).margin(1e-5));
  REQUIRE(r.evaluation);
  CHECK(r.evaluation->accuracy > 0.6);  // the argmax task is learnable; 1/3 is chance
}

TEST_CASE("train: losses read through the ring still stop a diverged run at the step that diverged", "[train][nan]") {
  // A rate so large that the loss overflows after a few steps; the plain loop says at which.
  const auto data = dtf::test::synthetic(320, 3, dtf::test::labels::argmax);
  const float lr = 1e12f;
  const std::int64_t bad = first_diverged_step(data, 32, 5, lr, 30);
  REQUIRE(bad > 1);  // a step past the first: the ring has entries before it
  auto run = [&](int log_every, bool loss_ring, dtf::hooks::nan_policy policy) {
    auto net = dtf::test::small_net();
    dtf::train_options o{.epochs = 5, .batch = 32, .seed = 5, .log_every = log_every};
    o.nan_policy = policy;
    o.loss_ring = loss_ring;
    return dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>({.rule = dtf::optim::sgd{lr}}), o);
  };
  auto failed_at = [&](int log_every, bool loss_ring) -> std::int64_t {
    try {
      run(log_every, loss_ring, dtf::hooks::nan_policy::fail);
    } catch (const dtf::hooks::nan_loss_error& e) {
      return e.step();
    }
    return -1;
  };
  // log_every = 1: the ring is read every step, so the error names the step itself; the same as
  // the loss read per step (train_options::loss_ring off).
  CHECK(failed_at(1, true) == bad);
  CHECK(failed_at(1, false) == bad);
  // log_every = 4: the contract allows up to 4 steps late on a GPU, and names the step whose loss
  // it was; the CPU twin's copies are immediate, so a poll sees it at once. The stop policy ends
  // the run there.
  const std::int64_t late = failed_at(4, true);
  CHECK(late == bad);
  const auto stopped = run(4, true, dtf::hooks::nan_policy::stop);
  CHECK(stopped.global_step >= bad);
  CHECK(stopped.global_step < bad + 4);
#if !DTF_CUDA
  CHECK(stopped.global_step == bad);
#endif
  CHECK_FALSE(std::isfinite(stopped.loss));
}

TEST_CASE("train: the update at a diverged step applies nothing, so the parameters are the step before's", "[train][nan]") {
  // The run above with log_every large and the stop policy; the reference is the same run stopped
  // by last_step before the bad step (an independent run, not a copy taken during this one).
  const auto data = dtf::test::synthetic(320, 3, dtf::test::labels::argmax);
  const float lr = 1e12f;
  const std::int64_t bad = first_diverged_step(data, 32, 5, lr, 30);
  REQUIRE(bad > 1);
  auto run = [&](std::int64_t last_step, std::vector<float>& params) {
    auto net = dtf::test::small_net();
    dtf::train_options o{.epochs = 5, .batch = 32, .seed = 5, .log_every = 100};
    o.nan_policy = dtf::hooks::nan_policy::stop;
    o.last_step = last_step;
    o.evaluate = [&params](std::span<const float> p) {  // at the stop: the parameters trained
      params = dtf::test::host_copy(p);
      return dtf::nn::evaluation{};
    };
    return dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>({.rule = dtf::optim::sgd{lr}}), o);
  };
  std::vector<float> diverged, before;
  const auto stopped = run(0, diverged);
  const auto reference = run(bad - 1, before);
  CHECK(reference.global_step == bad - 1);
  CHECK(std::isfinite(reference.loss));
  CHECK_FALSE(std::isfinite(stopped.loss));  // still reported: the stop policy ended the run
  CHECK(stopped.global_step >= bad);
#if !DTF_CUDA
  CHECK(stopped.global_step == bad);
#endif
  REQUIRE(diverged.size() == before.size());
  CHECK(diverged == before);  // bit for bit: the bad step's update applied nothing
}

TEST_CASE("ring_allreduce: once the watched ring's flag is raised, no update applies (no host read)", "[train][nan]") {
  // A NaN in step `bad`'s batch; the ring is never polled during the steps, as on a GPU where
  // the host reads it only every log_every steps. The later batches are finite, so only the
  // device flag can keep their updates out.
  const auto data = dtf::test::synthetic(320, 3, dtf::test::labels::argmax);
  constexpr std::int64_t bad = 4;
  auto run = [&](std::int64_t steps, bool watch, std::vector<dtf::device::step_loss>* landed) {
    dtf::nn::sequential net{dtf::nn::dense(8, 3)};  // no ReLU to turn the NaN into 0: the loss sees it
    std::vector<float> params;
    {
      auto comm = dtf::communicator::single();
      ring_allreduce<dtf::nn::sequential> engine(comm, net, {.rule = dtf::optim::adam{.learning_rate = 0.01f}});
      CHECK(net.context() == &engine.context());  // the model's step runs on the engine's context
      engine.initialize(5);
      dtf::device::loss_ring ring(16);
      if (watch) engine.watch_losses(&ring);
      auto stream = data.shuffle(5).batch(32).repeat(-1).stream();
      for (std::int64_t s = 1; s <= steps; ++s) {
        dtf::data::host_batch b = *stream.next();
        if (s == bad) b.features(0, 0) = std::numeric_limits<float>::quiet_NaN();
        engine.step_deferred(std::span<const dtf::data::host_batch>(&b, 1));
      }
      if (landed) {
        *landed = ring.drain();
        CHECK(ring.first_nonfinite() == std::optional<std::int64_t>(bad));
      }
      params = dtf::test::host_copy(engine.parameters());
    }
    CHECK(net.context() == nullptr);  // the engine took its context back
    return params;
  };
  std::vector<dtf::device::step_loss> landed;
  const auto reference = run(bad - 1, false, nullptr);
  const auto skipped = run(bad + 3, true, &landed);
  CHECK(skipped == reference);  // bit for bit: steps bad .. bad + 3 applied nothing
  REQUIRE(landed.size() == std::size_t(bad + 3));  // every step pushed by the engine, in order
  for (std::size_t i = 0; i < landed.size(); ++i) {
    CHECK(landed[i].step == std::int64_t(i) + 1);
    CHECK(std::isfinite(landed[i].loss) == (landed[i].step != bad));
  }
  const auto unwatched = run(bad + 3, false, nullptr);  // without the flag the NaN reaches the parameters
  CHECK(std::any_of(unwatched.begin(), unwatched.end(), [](float v) { return std::isnan(v); }));
}

TEST_CASE("train: num_steps and last_step end a collective run at that step", "[train]") {
  const auto data = dtf::test::synthetic(320, 3, dtf::test::labels::argmax);
  auto net = dtf::test::small_net();
  dtf::train_options o{.epochs = 10, .batch = 32, .log_every = 0};
  o.num_steps = 7;
  CHECK(dtf::train(dtf::local_cluster(), net, data, mirrored<>({}, 2), o).global_step == 7);
  o.num_steps = 0;
  o.last_step = 4;
  CHECK(dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>(), o).global_step == 4);
}

TEST_CASE("train: bad options and a ps strategy without ps tasks are errors that name the cause", "[train]") {
  const auto data = dtf::test::synthetic(64, 1, dtf::test::labels::argmax);
  auto net = dtf::test::small_net();
  dtf::train_options o;
  o.last_step = 5;
  o.num_steps = 5;
  CHECK_THROWS_WITH(dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>(), o),
                    Catch::Contains("num_steps") && Catch::Contains("not both"));
  CHECK_THROWS_WITH(dtf::train(dtf::local_cluster(), net, data, hogwild(), dtf::train_options{}),
                    Catch::Contains("needs ps tasks"));
  CHECK_THROWS_WITH(dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>(), {.max_recoveries = 1}),
                    Catch::Contains("no parameter server"));
  // TLS reaches the ring (collective_options::tls): it needs a secret there too.
  CHECK_THROWS_WITH(dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>(), {.tls = true}),
                    Catch::Contains("TLS needs a cluster secret"));
  dtf::train_options with_tls;
  with_tls.num_steps = 2;
  with_tls.secret = "s";
  with_tls.tls = true;
  CHECK(dtf::train(dtf::local_cluster(), net, data, ring_allreduce<>(), with_tls).global_step == 2);
}

TEST_CASE("train_flags: flags become options, and bad values name the flag", "[train]") {
  dtf::train_flags tf;
  dtf::flag_parser flags("test");
  tf.add_to(flags);
  const char* argv[] = {"prog", "--epochs", "3", "--nan_policy", "stop", "--model_dir", "m", "--slow_worker", "0",
                        "--slow_ms", "25", "--partitioner", "fixed_size", "--num_shards", "3"};
  REQUIRE(flags.parse(int(std::size(argv)), const_cast<char**>(argv)));
  dtf::cluster c;
  c.spec.jobs["ps"][0] = "127.0.0.1:1";
  c.spec.jobs["worker"][0] = "127.0.0.1:2";
  c.self = {"worker", 0};
  const auto o = tf.options(c, "scheme");
  CHECK(o.name == "scheme");
  CHECK(o.epochs == 3);
  CHECK(o.model_dir == "m");
  CHECK(o.nan_policy == dtf::hooks::nan_policy::stop);
  CHECK(o.compute_delay == std::chrono::milliseconds(25));
  const auto vars = dtf::test::small_net().variables();
  CHECK(tf.partitioner().place(vars, 2).shards.size() == 3 * vars.size());
  tf.nan_policy = "ignore";
  CHECK_THROWS_WITH(tf.options(c, "scheme"), Catch::Contains("--nan_policy"));
  CHECK_THROWS_WITH((dtf::named_partitioner{"nope", 1}.place(vars, 2)), Catch::Contains("--partitioner"));
}

TEST_CASE("train_flags: --clip_norm, --weight_decay and --backward_passes_per_step reach the options and the rule, "
          "and bad values name the flag",
          "[train][loop]") {
  const dtf::cluster alone = dtf::local_cluster();
  {
    dtf::train_flags tf;
    dtf::flag_parser flags("test");
    tf.add_to(flags, dtf::train_flag_set::collective);
    const char* argv[] = {"prog", "--clip_norm", "0.5", "--weight_decay", "0.02", "--backward_passes_per_step", "4"};
    REQUIRE(flags.parse(int(std::size(argv)), const_cast<char**>(argv)));
    const auto o = tf.options(alone, "scheme");
    CHECK(o.clip_norm == 0.5f);
    CHECK(o.backward_passes_per_step == 4);
    const auto adamw = std::get<dtf::optim::adamw>(tf.rule("adamw", 1e-3f));
    CHECK(adamw.weight_decay == 0.02f);
    CHECK(adamw.learning_rate == 1e-3f);
    CHECK(std::get<dtf::optim::momentum>(tf.rule("nesterov", 0.1f)).nesterov);
    CHECK(std::get<dtf::optim::momentum>(tf.rule("nesterov", 0.1f)).weight_decay == 0.02f);
    CHECK(std::get<dtf::optim::sgd>(tf.rule("sgd", 0.1f)).weight_decay == 0.02f);
  }
  {
    dtf::train_flags tf;  // none given: off, one pass, each rule's own decay
    dtf::flag_parser flags("test");
    tf.add_to(flags, dtf::train_flag_set::collective);
    const char* argv[] = {"prog"};
    REQUIRE(flags.parse(1, const_cast<char**>(argv)));
    const auto o = tf.options(alone, "scheme");
    CHECK(o.clip_norm == 0.0f);
    CHECK(o.backward_passes_per_step == 1);
    CHECK(std::get<dtf::optim::adamw>(tf.rule("adamw", 1e-3f)).weight_decay == 0.01f);
    CHECK(std::get<dtf::optim::adam>(tf.rule("adam", 1e-3f)).weight_decay == 0.0f);
  }
  {
    dtf::train_flags tf;  // the ps set has no micro-batches (a ps worker pushes every batch)
    dtf::flag_parser flags("test");
    tf.add_to(flags);
    const char* argv[] = {"prog", "--backward_passes_per_step", "2"};
    CHECK_THROWS_WITH(flags.parse(int(std::size(argv)), const_cast<char**>(argv)),
                      Catch::Contains("unknown flag --backward_passes_per_step"));
  }
  auto rejects = [&](std::vector<const char*> args, const std::string& flag) {
    INFO(args[0] << " " << args[1]);
    dtf::train_flags tf;
    dtf::flag_parser flags("test");
    tf.add_to(flags, dtf::train_flag_set::collective);
    args.insert(args.begin(), "prog");
    CHECK_THROWS_WITH(
        [&] {
          if (flags.parse(int(args.size()), const_cast<char**>(args.data()))) {
            (void)tf.options(alone, "scheme");
            (void)tf.rule("sgd", 0.1f);
          }
        }(),
        Catch::Contains("--" + flag));
  };
  rejects({"--clip_norm", "-1"}, "clip_norm");
  rejects({"--clip_norm", "nan"}, "clip_norm");
  rejects({"--clip_norm", "one"}, "clip_norm");
  rejects({"--weight_decay", "-0.1"}, "weight_decay");
  rejects({"--weight_decay", "0.1x"}, "weight_decay");
  rejects({"--weight_decay", "inf"}, "weight_decay");
  rejects({"--backward_passes_per_step", "0"}, "backward_passes_per_step");
  rejects({"--backward_passes_per_step", "-2"}, "backward_passes_per_step");
  rejects({"--backward_passes_per_step", "2.5"}, "backward_passes_per_step");
}


namespace {
// A run of ring_allreduce's deferred step on one rank (section 7 of docs/design/gpu-execution.md)
// over 100 examples in batches of 32 (an epoch: three full batches and a short one of 4), with
// adamw, a schedule and a watched loss ring; after step 6 an evaluation of 50 rows on the same
// model (its buffers grow), after step 10 a restore of the engine's own state.
struct graph_run {
  std::vector<float> params;
  std::int64_t iterations = 0;
  std::vector<dtf::device::step_loss> losses;
  dtf::device::graph_counts full, last;
};
graph_run run_graphs(bool graphs, int steps = 16) {
  const auto data = dtf::test::synthetic(100, 3, dtf::test::labels::argmax);
  auto net = dtf::test::small_net();
  net.set_label_check(dtf::nn::label_check::trusted);  // the labels are in range: as checked at upload
  auto comm = dtf::communicator::single();
  ring_allreduce<dtf::nn::sequential> engine(
      comm, net,
      {.rule = dtf::optim::adamw{.learning_rate = 0.02f},
       .schedule = dtf::optim::cosine_decay{.learning_rate = 0.02f, .decay_steps = 12, .warmup_steps = 3},
       .clip_norm = 0.5f});  // the clip runs between the graphs, on the device
  engine.initialize(3);
  dtf::device::loss_ring ring(64);
  engine.watch_losses(&ring);
  CHECK(engine.use_step_graphs(graphs) == graphs);
  auto stream = data.shuffle(3).batch(32).repeat(-1).stream();
  dtf::tensor x, y, big_x, logits;
  for (int s = 1; s <= steps; ++s) {
    const dtf::data::host_batch b = *stream.next();
    engine.context().synchronize();  // the last step no longer reads the batch (copies on the legacy stream)
    dtf::assign_from_host(x, b.features);
    dtf::assign_from_host(y, b.labels);
    engine.step_deferred(x, y);
    if (s == 6) {
      dtf::assign_from_host(big_x, dtf::test::synthetic(50, 4, dtf::test::labels::argmax).batch(50).stream().next()->features);
      net.logits(engine.parameters(), big_x, logits);
    }
    if (s == 10) {
      const auto values = dtf::test::host_copy(engine.parameters());
      const auto& opt = engine.optimizer();
      engine.restore(values, opt.host_slots(), opt.iterations(), engine.global_step());
    }
  }
  graph_run r;
  r.losses = ring.drain();
  r.params = dtf::test::host_copy(engine.parameters());
  r.iterations = engine.optimizer().iterations();
  r.full = engine.graphs().counts(32);
  r.last = engine.graphs().counts(4);
  return r;
}
}  // namespace

TEST_CASE("ring_allreduce: the step as graphs gives the eager step's parameters bit for bit, a graph per batch size",
          "[train][graph]") {
  const graph_run eager = run_graphs(false), graphed = run_graphs(true);
  CHECK(graphed.params == eager.params);  // bit for bit: the same kernels, the rate read from memory
  CHECK(graphed.iterations == 16);
  CHECK(eager.iterations == 16);  // a replay counts its update on the host too
  REQUIRE(graphed.losses.size() == 16);
  CHECK(graphed.losses == eager.losses);
  // Full batches (32 rows): eager at 1, 7 (the evaluation grew the buffers), 11 (the restore);
  // captured at 2, 9, 13 (9 and 13 after a short step: the buffers keep their allocations, so
  // reshaping them is host bookkeeping); replayed at 3, 5 (after the short step 4: the captured
  // pointers, whatever the buffers' host shape), 6, 10, 14, 15. The short batch (4 rows): eager
  // at 4, 8 (after the evaluation's drop), 12 (after the restore's), captured at 16.
  CHECK(graphed.full == dtf::device::graph_counts{.eager = 3, .captures = 3, .replays = 6});
  CHECK(graphed.last == dtf::device::graph_counts{.eager = 3, .captures = 1, .replays = 0});
  CHECK(eager.full == dtf::device::graph_counts{});  // off: no step goes through the cache
}

TEST_CASE("ring_allreduce: step graphs apply to one rank's capturable step only", "[train][graph]") {
  auto net = dtf::test::small_net();
  auto comm = dtf::communicator::single();
  {
    ring_allreduce<dtf::nn::sequential> clipped(comm, net, {.clip_norm = 1.0f});
    CHECK(clipped.use_step_graphs(true));  // the clip runs on the device, between the graphs
  }
  {
    ring_allreduce<dtf::nn::sequential> engine(comm, net, {});
    CHECK(engine.use_step_graphs(true));
    engine.initialize(1);
    // Labels checked per step (label_check::verify) read back: the step stays eager.
    const auto data = dtf::test::synthetic(8, 1, dtf::test::labels::argmax);
    const auto b = *data.batch(8).stream().next();
    dtf::tensor x, y;
    dtf::assign_from_host(x, b.features);
    dtf::assign_from_host(y, b.labels);
    for (int s = 0; s < 3; ++s) engine.step_deferred(x, y);
    CHECK(engine.graphs().counts(8) == dtf::device::graph_counts{});
    CHECK_FALSE(engine.use_step_graphs(false));
  }
}

TEST_CASE("train: cuda_graph on and off give the same parameters bit for bit (device data, one rank)", "[train][graph]") {
  const auto data = dtf::test::synthetic(300, 7, dtf::test::labels::argmax);  // 300 / 32: a short last batch
  auto run = [&](bool graphs) {
    auto net = dtf::test::small_net();
    std::vector<float> params;
    dtf::train_options o{.name = "test", .epochs = 2, .batch = 32, .seed = 5, .log_every = 0};
    o.device_data = true;
    o.cuda_graph = graphs;
    o.evaluate = [&](std::span<const float> p) {
      params = dtf::test::host_copy(p);
      return dtf::nn::evaluate(net, p, dtf::test::synthetic(100, 8, dtf::test::labels::argmax).batch(100));
    };
    const auto r = dtf::train(dtf::local_cluster(), net, data,
                              ring_allreduce<>({.rule = dtf::optim::adam{.learning_rate = 0.01f},
                                                .schedule = dtf::optim::cosine_decay{.learning_rate = 0.01f, .decay_steps = 20}}),
                              o);
    CHECK(r.global_step == 20);
    return std::pair(params, r.loss);
  };
  const auto eager = run(false), graphed = run(true);
  CHECK(graphed.first == eager.first);
  CHECK(graphed.second == eager.second);
}

#if DTF_CUDA
TEST_CASE("ring_allreduce: replayed step graphs move no pool counter", "[train][graph][gpu]") {
  auto net = dtf::test::small_net();
  net.set_label_check(dtf::nn::label_check::trusted);
  auto comm = dtf::communicator::single();
  ring_allreduce<dtf::nn::sequential> engine(comm, net, {.rule = dtf::optim::adam{.learning_rate = 0.01f}});
  engine.initialize(2);
  REQUIRE(engine.use_step_graphs(true));
  const auto b = *dtf::test::synthetic(16, 2, dtf::test::labels::argmax).batch(16).stream().next();
  dtf::tensor x, y;
  dtf::assign_from_host(x, b.features);
  dtf::assign_from_host(y, b.labels);
  engine.step_deferred(x, y);  // eager
  engine.step_deferred(x, y);  // captured
  engine.context().synchronize();
  const auto warm = engine.context().pool().stats();
  for (int s = 0; s < 5; ++s) engine.step_deferred(x, y);
  engine.context().synchronize();
  const auto after = engine.context().pool().stats();
  CHECK(after.requests == warm.requests);
  CHECK(after.system_allocations == warm.system_allocations);
  CHECK(after.bytes_reserved == warm.bytes_reserved);
  CHECK(engine.graphs().counts(16) == dtf::device::graph_counts{.eager = 1, .captures = 1, .replays = 5});
  CHECK(engine.optimizer().iterations() == 7);
}
#endif

}  // namespace train_tests

TEST_CASE("train: clip_norm and backward_passes_per_step reach the collective engine, and a schedule sets the rate",
          "[train][loop]") {
  // One rank: the engine's averaged gradient is the batch's own. Reference: the plain loop of
  // reference_sgd with the gradient clipped by torch.nn.utils.clip_grad_norm_'s formula and the
  // rate from the schedule (micro-batches change nothing but rounding).
  const auto data = dtf::test::synthetic(320, 7, dtf::test::labels::argmax);
  const float clip = 0.05f;
  const dtf::optim::exponential_decay decay{.learning_rate = 0.5f, .decay_steps = 5, .decay_rate = 0.5f};
  auto net = dtf::test::small_net();
  const std::size_t n = net.num_parameters();
  dtf::tensor p({n}), g({n}), x, y;
  net.initialize(p.span<float>(), 11);
  dtf::optim::optimizer<> opt(dtf::optim::sgd{0.1f}, n);
  auto stream = data.shuffle(11).batch(32).stream();
  for (std::int64_t s = 0; s < 10; ++s) {
    const auto b = stream.next();
    dtf::assign_from_host(x, b->features);
    dtf::assign_from_host(y, b->labels);
    net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
    auto gv = g.to_vector<float>();
    double sum = 0;
    for (float v : gv) sum += double(v) * double(v);
    const double coef = double(clip) / (std::sqrt(sum) + 1e-6);
    if (coef < 1)
      for (float& v : gv) v *= float(coef);
    g.copy_from_host<float>(gv);
    opt.apply(p.span<float>(), g.span<float>(), decay(s));
  }
  const auto reference = p.to_vector<float>();

  std::vector<float> final_params;
  dtf::train_options o{.epochs = 1, .batch = 32, .seed = 11, .log_every = 0};
  o.clip_norm = clip;
  o.backward_passes_per_step = 2;
  o.evaluate = [&](std::span<const float> q) {
    final_params = dtf::test::host_copy(q);
    return dtf::nn::evaluation{};
  };
  const auto r = dtf::train(dtf::local_cluster(), net, data,
                            dtf::strategies::ring_allreduce<>({.rule = dtf::optim::sgd{0.1f}, .schedule = decay}), o);
  CHECK(r.global_step == 10);
  REQUIRE(final_params.size() == reference.size());
  for (std::size_t i = 0; i < reference.size(); ++i) REQUIRE(final_params[i] == Approx(reference[i]).margin(1e-5));

  // The options and the strategy's config disagreeing, a ps strategy asked for micro-batches, bad values.
  dtf::train_options two{.log_every = 0};
  two.clip_norm = 1;
  CHECK_THROWS_WITH(dtf::train(dtf::local_cluster(), net, data, dtf::strategies::ring_allreduce<>({.clip_norm = 2}), two),
                    Catch::Contains("clip_norm") && Catch::Contains("give one"));
  two.clip_norm = -1;
  CHECK_THROWS_WITH(dtf::train(dtf::local_cluster(), net, data, dtf::strategies::ring_allreduce<>(), two), Catch::Contains("clip_norm"));
  dtf::train_options passes{.log_every = 0};
  passes.backward_passes_per_step = 0;
  CHECK_THROWS_WITH(dtf::train(dtf::local_cluster(), net, data, dtf::strategies::mirrored<>({}, 2), passes),
                    Catch::Contains("backward_passes_per_step"));
}
