// dtf::strategies::hybrid (docs/design/hybrid.md): an embedding model's tables on the ps, its
// dense variables by ring-allreduce among the workers. One worker through dtf::train against an
// independent local computation of the whole model (dense parameters and the whole table held
// here, plain SGD), bit for bit; two ranks' engines (threads on loopback) whose dense replicas
// stay bitwise equal while the ps hold no dense variable; checkpoints of both halves; a ps
// replaced mid-job (stopped and restarted empty on its port) recovered in the job against the
// uninterrupted job, or ending every rank with the error naming it; the refusals.
#include <catch2/catch.hpp>

#include <dtf/nn/embedding_sequential.hpp>
#include <dtf/ps.hpp>
#include <dtf/strategies/hybrid.hpp>
#include <dtf/train.hpp>

#include "helpers.hpp"
#include "ps_helpers.hpp"
#include "rank_helpers.hpp"
#include "sparse_helpers.hpp"
#include "train_helpers.hpp"

#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <cmath>
#include <mutex>
#include <utility>

namespace hybrid_test {

using namespace dtf;

constexpr std::size_t V = 7, D = 3, L = 2, H = 5, K = 4;

// n examples of L ids in [0, V) (repeats within and across examples), labels in [0, K).
data::dataset id_data(std::size_t n, std::uint64_t seed) {
  nn::splitmix64 rng(seed);
  xt::xtensor<float, 2> x = xt::xtensor<float, 2>::from_shape({n, L});
  xt::xtensor<std::int32_t, 1> y = xt::xtensor<std::int32_t, 1>::from_shape({n});
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t l = 0; l < L; ++l) x(i, l) = float(rng() % 4 + (l == 0 ? 0 : 3));  // 0..6, 3 shared
    y(i) = std::int32_t(rng() % K);
  }
  return data::dataset(std::move(x), std::move(y), 0.0f, 1.0f);
}

// The checkpoint tests' data: 5 batches of 5 an epoch, the last of 3.
data::dataset make_data() { return id_data(23, 9); }

nn::embedding_sequential make_net(const embedding_spec& table) {
  return nn::embedding_sequential({.table = table, .ids_per_example = L, .combine = nn::embedding_combine::concat},
                                  nn::sequential{nn::dense(L * D, H), nn::relu(), nn::dense(H, K)});
}

embedding_spec table_spec(bool hashed) {
  return {.name = "words", .rows = hashed ? 0 : V, .dim = D, .init = {.scale = 0.3f, .seed = 5}};
}

// The whole table as the initialiser fills it.
std::vector<float> initial_table(const embedding_spec& spec) {
  std::vector<float> t(V * spec.dim);
  for (std::size_t v = 0; v < V; ++v) spec.init(v, std::span<float>(t).subspan(v * spec.dim, spec.dim));
  return t;
}

// A ps on a free loopback port that accepts any cluster id (the spec's id depends on the ports).
test::running_ps any_cluster_ps(const std::string& name) {
  ps_options po{test::opts(name)};
  po.transport.cluster_id.clear();
  po.transport.log = [](const std::string&) {};
  return test::running_ps(std::move(po));
}

// A cluster of the given ps and one worker (rank 0, whose ring of one listens on a free port).
cluster one_worker_cluster(const std::vector<const test::running_ps*>& ps) {
  cluster c;
  c.source = "test";
  for (std::size_t p = 0; p < ps.size(); ++p) c.spec.jobs["ps"][p] = ps[p]->address();
  c.spec.jobs["worker"][0] = "127.0.0.1:0";
  c.self = {"worker", 0};
  return c;
}

// One process's plain SGD step on batch b: θ -= lr g, each row of the batch -= table_lr g.
// Returns the batch's loss.
float local_sgd_step(nn::embedding_sequential& net, const data::host_batch& b, std::vector<float>& theta,
                     std::vector<float>& table, float lr, float table_lr) {
  dtf::detail::batch_ids ids;
  net.embedding_ids(b, 0, ids.all);
  ids.deduplicate();
  std::vector<float> values, grads, g(theta.size());
  for (auto id : ids.unique) values.insert(values.end(), table.begin() + id * D, table.begin() + (id + 1) * D);
  grads.assign(values.size(), 0.0f);
  const embedding_rows rows{D, ids.index, values, grads};
  tensor x, y;
  assign_from_host(x, b.features);
  assign_from_host(y, b.labels);
  const float loss = test::loss_and_gradients_on_host(net, theta, std::span<const embedding_rows>(&rows, 1), x, y, g);
  for (std::size_t i = 0; i < theta.size(); ++i) theta[i] -= lr * g[i];
  for (std::size_t u = 0; u < ids.unique.size(); ++u)
    for (std::size_t k = 0; k < D; ++k) table[ids.unique[u] * D + k] -= table_lr * grads[u * D + k];
  return loss;
}

// Rows [k * n, (k + 1) * n) of a batch: rank k's part.
data::host_batch part_of(const data::host_batch& b, std::size_t k, std::size_t n) {
  data::host_batch out;
  out.features = xt::view(b.features, xt::range(k * n, (k + 1) * n), xt::all());
  out.labels = xt::view(b.labels, xt::range(k * n, (k + 1) * n));
  return out;
}

TEST_CASE("hybrid, one worker, plain SGD: dtf::train equals one process trained locally, dense part and rows bit "
          "for bit, asynchronous or synchronous tables",
          "[hybrid][train]") {
  const bool hashed = GENERATE(false, true);
  const auto mode = GENERATE(strategies::table_updates::asynchronous, strategies::table_updates::synchronous);
  CAPTURE(hashed, strategies::to_string(mode));
  const auto spec = table_spec(hashed);
  auto net = make_net(spec), ref_net = make_net(spec);
  auto ps0 = any_cluster_ps("ps.0"), ps1 = any_cluster_ps("ps.1");
  const cluster c = one_worker_cluster({&ps0, &ps1});
  const auto data = id_data(23, 9);  // 5 batches of 5 a epoch, the last of 3
  const float lr = 0.2f, table_lr = 0.5f;
  std::vector<float> trained_dense, trained_rows;
  const std::vector<std::uint64_t> all_ids = {0, 1, 2, 3, 4, 5, 6};
  train_options o{.name = "hybrid-test", .epochs = 2, .batch = 5, .seed = 11, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000};
  o.embedding_rule = optim::sgd{table_lr};
  // Rank 0's evaluation at the end of each epoch: the last one sees the trained state.
  o.evaluate_rows = [&](std::span<const float> p, const row_reader& read) {
    trained_dense = test::host_copy(p);
    trained_rows.assign(V * D, 0.0f);
    read(0, all_ids, trained_rows);
    return nn::evaluation{.loss = 1.0, .accuracy = 0.5, .examples = 1};
  };
  const auto r = train(c, net, data, strategies::hybrid({.dense = {.rule = optim::sgd{lr}}, .tables = mode}), o);
  CHECK(r.exit_code == 0);
  CHECK(r.global_step == 10);
  // No dense variable was ever sent to a ps (synchronous tables: initialised with none, for the
  // protocol's step).
  CHECK(ps0.ps->initialized() == (mode == strategies::table_updates::synchronous));
  CHECK(ps1.ps->initialized() == (mode == strategies::table_updates::synchronous));
  if (mode == strategies::table_updates::synchronous) CHECK(ps0.ps->global_step() == 10);
  CHECK(ps0.ps->shutdown_requested());  // rank 0 ended the job
  CHECK(ps1.ps->shutdown_requested());

  // The reference: the same batches (the shard of the only worker, shuffled with seed + 0), the
  // model's loss and gradients at θ and the whole table, θ -= lr g, each touched row -= table_lr g.
  std::vector<float> theta = test::initial_parameters(ref_net, o.seed);
  auto table = initial_table(spec);
  float last_loss = 0;
  auto stream = data.shard(1, 0).shuffle(o.seed).batch(o.batch).repeat(o.epochs).stream();
  while (auto b = stream.next()) last_loss = local_sgd_step(ref_net, *b, theta, table, lr, table_lr);
  CHECK(r.loss == last_loss);
  REQUIRE(trained_dense.size() == theta.size());
  for (std::size_t i = 0; i < theta.size(); ++i) {
    CAPTURE(i);
    CHECK(trained_dense[i] == theta[i]);
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    CAPTURE(i);
    CHECK(trained_rows[i] == table[i]);
  }
  CHECK(table != initial_table(spec));  // the rows did train
}

// What two ranks' engines (threads, over two ps) hold after 4 steps of 5 examples each.
struct two_ranks {
  std::vector<std::vector<float>> dense{2}, rows{2};  // per rank: its dense replica, the table read after
  std::vector<std::vector<float>> losses{2};          // per rank: each step's loss
  bool ps_initialised = true;                         // whether a ps was initialised (dense shards or the sync step)
};
constexpr std::size_t per_rank = 5, steps = 4;
two_ranks run_two_ranks(const data::dataset& batches, const strategies::hybrid& strategy, const optim::rule& rows_rule,
                        bool hashed = false) {
  const auto spec = table_spec(hashed);
  test::running_ps ps0{test::opts("ps.0")}, ps1{test::opts("ps.1")};
  two_ranks out;
  collective_options co;
  co.timeout_ms = 10000;
  const auto failures = test::run_ranks_collect(2, co, [&](communicator& comm) {
    const std::size_t k = comm.rank();
    auto net = make_net(spec);
    ps_client client({ps0.address(), ps1.address()}, placement{.shards = {}, .num_ps = 2},
                     test::opts("worker." + std::to_string(k)));
    client.connect();
    auto engine = strategy.make(comm, client, net);
    engine.set_embedding_rule(rows_rule);
    // embedding_sequential streams its dense gradients: the ring reduces them during backprop.
    RANK_CHECK(engine.overlaps() == strategy.config.dense.overlap, engine.overlaps());
    engine.initialize(3);
    auto stream = batches.stream();
    while (auto b = stream.next()) {
      const float loss = engine.step(part_of(*b, k, per_rank));
      RANK_CHECK(std::isfinite(loss), "loss " << loss);
      out.losses[k].push_back(loss);
    }
    RANK_CHECK(engine.global_step() == std::int64_t(steps), engine.global_step());
    out.dense[k] = test::host_copy(engine.parameters());
    comm.barrier();  // every rank's pushes acknowledged: the rows are final
    out.rows[k] = test::gather(engine.tables(), 0, {0, 1, 2, 3, 4, 5, 6});
    client.mark_done();  // a finished rank (synchronous tables: its departure fails no step)
  });
  for (std::size_t r = 0; r < 2; ++r)
    if (failures[r]) FAIL("rank " << r << ": " << test::message_of(failures[r]));
  out.ps_initialised = ps0.ps->initialized() || ps1.ps->initialized();
  return out;
}

TEST_CASE("hybrid engines on 2 ranks: the dense replicas stay bitwise equal and the ps hold the tables only",
          "[hybrid]") {
  const bool overlap = GENERATE(false, true);
  CAPTURE(overlap);
  const auto data = id_data(2 * per_rank * steps, 21).batch(2 * per_rank);
  const auto r = run_two_ranks(
      data, strategies::hybrid({.dense = {.rule = optim::adam{.learning_rate = 1e-2f}, .overlap = overlap,
                                          .bucket_bytes = 1}}),
      optim::adagrad{.learning_rate = 0.1f});
  CHECK(r.dense[0] == r.dense[1]);    // bitwise
  CHECK(r.losses[0] == r.losses[1]);  // the loss averaged over the ranks
  CHECK(r.rows[0] == r.rows[1]);
  CHECK(r.rows[0] != initial_table(table_spec(false)));  // the ps trained the rows
  CHECK_FALSE(r.ps_initialised);                          // and hold no dense variable
}

// With the rows frozen (their rule's rate 0) the steps are deterministic: the dense part is
// ring_allreduce's over the rows, so plain SGD on 2 ranks of 5 examples equals one process at
// batch 10 (the mean of equal-size means, up to rounding), and overlap on or off give the same
// bits.
TEST_CASE("hybrid engines on 2 ranks, rows frozen: the dense part equals one process at the summed batch, overlap on "
          "and off bit for bit",
          "[hybrid]") {
  const float lr = 0.3f;
  const auto data = id_data(2 * per_rank * steps, 33).batch(2 * per_rank);
  auto run = [&](bool overlap) {
    return run_two_ranks(
        data, strategies::hybrid({.dense = {.rule = optim::sgd{lr}, .overlap = overlap, .bucket_bytes = 1}}),
        optim::sgd{0.0f});
  };
  const auto on = run(true), off = run(false);
  CHECK(on.dense[0] == off.dense[0]);
  CHECK(on.dense[0] == on.dense[1]);
  CHECK(on.losses[0] == off.losses[0]);
  const auto spec = table_spec(false);
  const auto table = initial_table(spec);
  CHECK(on.rows[0] == table);  // frozen

  auto ref_net = make_net(spec);
  std::vector<float> theta = test::initial_parameters(ref_net, 3), frozen = table;
  auto stream = data.stream();
  std::size_t step = 0;
  while (auto b = stream.next()) {
    const float loss = local_sgd_step(ref_net, *b, theta, frozen, lr, 0.0f);
    CHECK(on.losses[0][step++] == Approx(loss).epsilon(1e-6));
  }
  for (std::size_t i = 0; i < theta.size(); ++i) {
    CAPTURE(i);
    CHECK(on.dense[0][i] == Approx(theta[i]).margin(1e-6));
  }
}

// Synchronous tables: each step's rows are averaged over the two ranks' contributions and
// applied once, so with plain SGD both halves equal one process at batch 10.
TEST_CASE("hybrid engines on 2 ranks, synchronous tables, plain SGD: dense part and rows equal one process at the "
          "summed batch",
          "[hybrid]") {
  const bool hashed = GENERATE(false, true);
  CAPTURE(hashed);
  const float lr = 0.3f, table_lr = 0.5f;
  const auto data = id_data(2 * per_rank * steps, 41).batch(2 * per_rank);
  const auto r = run_two_ranks(
      data, strategies::hybrid({.dense = {.rule = optim::sgd{lr}, .bucket_bytes = 1},
                                .tables = strategies::table_updates::synchronous}),
      optim::sgd{table_lr}, hashed);
  CHECK(r.dense[0] == r.dense[1]);
  CHECK(r.rows[0] == r.rows[1]);
  const auto spec = table_spec(hashed);
  auto ref_net = make_net(spec);
  std::vector<float> theta = test::initial_parameters(ref_net, 3), table = initial_table(spec);
  auto stream = data.stream();
  std::size_t step = 0;
  while (auto b = stream.next()) {
    const float loss = local_sgd_step(ref_net, *b, theta, table, lr, table_lr);
    CHECK(r.losses[0][step++] == Approx(loss).epsilon(1e-6));
  }
  for (std::size_t i = 0; i < theta.size(); ++i) {
    CAPTURE(i);
    CHECK(r.dense[0][i] == Approx(theta[i]).margin(1e-6));
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    CAPTURE(i);
    CHECK(r.rows[0][i] == Approx(table[i]).margin(1e-6));
  }
  CHECK(table != initial_table(spec));
}

// Rank 0's hook that replaces ps 0 once, after step `at`: stopped and started again on its port
// with none of its state (its tables, its step), as dtfrun restarts a dead ps. The other rank
// is then in the agreed stop's allreduce of that step, so both find the ps gone at step at + 1.
struct replace_ps_after {
  std::int64_t at;
  std::function<void()> replace;
  std::shared_ptr<bool> done = std::make_shared<bool>(false);  // once, across the copies a recovery makes
  void after_run(run_context& ctx, const run_values&) {
    if (*done || ctx.global_step() != at) return;
    *done = true;
    replace();
  }
};

// The phases dtf::train runs on each rank of a 2-worker hybrid job (run_hybrid_rank: engine,
// session, agreed stop, checkpoints, evaluation, RESULT), over a ring the test builds on free
// ports (dtf::train would listen on the cluster's addresses) and two fresh ps serving
// o.model_dir; every rank reports done before the ring's last barrier, and rank 0 then shuts the
// ps down, as train_hybrid does. Returns each rank's result; `ps_step`: ps 0's step at the end.
// `replace_after` >= 0: ps 0 is replaced after that step (replace_ps_after); `errors`: each
// rank's error (empty: none) instead of rethrowing it.
std::vector<train_result> two_rank_job(const data::dataset& data, const strategies::hybrid& strategy,
                                       const train_options& o, std::int64_t* ps_step = nullptr,
                                       std::int64_t replace_after = -1, std::vector<std::string>* errors = nullptr) {
  std::deque<test::running_ps> servers;
  std::vector<ps_options> options;
  cluster c;
  c.source = "test";
  for (std::size_t p = 0; p < 2; ++p) {
    ps_options po{test::opts("ps." + std::to_string(p))};
    po.transport.cluster_id.clear();
    po.transport.log = [](const std::string&) {};
    po.checkpoint_dir = o.model_dir;
    options.push_back(po);
    c.spec.jobs["ps"][p] = servers.emplace_back(std::move(po)).address();
  }
  c.spec.jobs["worker"][0] = "127.0.0.1:1";  // the ring below is the test's own
  c.spec.jobs["worker"][1] = "127.0.0.1:2";
  test::ring_setup setup(2);
  std::vector<train_result> results(2);
  if (errors) errors->assign(2, "");
  test::run_threads(2, [&](std::size_t k) {
    cluster me = c;
    me.self = {"worker", k};
    auto net = make_net(table_spec(false));
    dtf::detail::ps_job job(me, o, {}, placement{.shards = {}, .num_ps = 2}, dtf::detail::ps_transport(me, o),
                            std::chrono::steady_clock::now());
    dtf::detail::ring_job ring;
    ring.me = me.self.str();
    collective_options co;
    co.timeout_ms = 10000;
    ring.comm_holder.emplace(std::move(setup.listeners[k]), k, setup.addresses, std::vector<std::string>{}, co);
    try {
      if (k == 0 && replace_after >= 0)
        results[k] = dtf::detail::run_hybrid_rank(job, ring, data, strategy, net, o,
                                                  replace_ps_after{replace_after, [&] { servers[0].restart(options[0]); }});
      else
        results[k] = dtf::detail::run_hybrid_rank(job, ring, data, strategy, net, o);  // reports done
    } catch (const dtf::error& e) {
      if (!errors) throw;
      (*errors)[k] = e.what();
      if (job.is_chief)  // as train_hybrid: the chief's failure ends the job
        dtf::detail::shutdown_ps_after_failure(job, dynamic_cast<const strategies::lost_ps*>(&e) != nullptr);
      return;
    }
    if (job.is_chief) dtf::detail::shutdown_ps(job);  // the others may still be leaving
  });
  CHECK(servers[0].ps->shutdown_requested());
  if (ps_step) *ps_step = servers[0].ps->global_step();
  return results;
}

// Synchronous tables with plain SGD: the job equals one process trained on both ranks' batches
// of each step.
TEST_CASE("hybrid through dtf::train's phases on 2 ranks, synchronous tables: equals one process at the summed batch",
          "[hybrid][train]") {
  const auto spec = table_spec(false);
  const auto data = id_data(20, 17);  // a shard of 10 per rank: 2 batches of 5 an epoch
  const float lr = 0.3f, table_lr = 0.5f;
  train_options o{.name = "hybrid-2", .epochs = 2, .batch = 5, .seed = 7, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000};
  o.embedding_rule = optim::sgd{table_lr};
  std::vector<float> trained_dense, trained_rows;
  o.evaluate_rows = [&](std::span<const float> p, const row_reader& read) {
    trained_dense = test::host_copy(p);
    trained_rows.assign(V * D, 0.0f);
    const std::vector<std::uint64_t> all_ids = {0, 1, 2, 3, 4, 5, 6};
    read(0, all_ids, trained_rows);
    return nn::evaluation{.loss = 1.0, .accuracy = 0.5, .examples = 1};
  };
  const strategies::hybrid strategy({.dense = {.rule = optim::sgd{lr}, .bucket_bytes = 1},
                                     .tables = strategies::table_updates::synchronous});
  std::int64_t ps_step = -1;
  const auto results = two_rank_job(data, strategy, o, &ps_step);
  for (const auto& r : results) {
    CHECK(r.exit_code == 0);
    CHECK(r.global_step == 4);
  }
  CHECK(ps_step == 4);  // the ps's step is the ring's

  // The reference: each step, rank 0's and rank 1's batches (their shards, shuffled with seed + k)
  // as one batch of 10.
  auto ref_net = make_net(spec);
  std::vector<float> theta = test::initial_parameters(ref_net, o.seed), table = initial_table(spec);
  auto s0 = data.shard(2, 0).shuffle(o.seed).batch(o.batch).repeat(o.epochs).stream();
  auto s1 = data.shard(2, 1).shuffle(o.seed + 1).batch(o.batch).repeat(o.epochs).stream();
  std::size_t steps_run = 0;
  while (auto b0 = s0.next()) {
    auto b1 = s1.next();
    REQUIRE(b1);
    data::host_batch both;
    both.features = xt::concatenate(xt::xtuple(b0->features, b1->features), 0);
    both.labels = xt::concatenate(xt::xtuple(b0->labels, b1->labels), 0);
    local_sgd_step(ref_net, both, theta, table, lr, table_lr);
    ++steps_run;
  }
  CHECK(steps_run == 4);
  REQUIRE(trained_dense.size() == theta.size());
  for (std::size_t i = 0; i < theta.size(); ++i) {
    CAPTURE(i);
    CHECK(trained_dense[i] == Approx(theta[i]).margin(1e-6));
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    CAPTURE(i);
    CHECK(trained_rows[i] == Approx(table[i]).margin(1e-6));
  }
}

// A hybrid job through dtf::train on one worker and `num_ps` ps (fresh ones, serving `dir`),
// resumed from dir's latest checkpoint when there is one, to `last_step` (0: the epochs' end).
struct trained_state {
  std::vector<float> dense, rows;  // the dense part and the whole table at the end
  std::int64_t step = 0;
};
trained_state train_in(std::size_t num_ps, const std::string& dir, std::int64_t last_step,
                       const strategies::hybrid& strategy, train_options o) {
  std::deque<test::running_ps> servers;
  cluster c;
  c.source = "test";
  for (std::size_t p = 0; p < num_ps; ++p) {
    ps_options po{test::opts("ps." + std::to_string(p))};
    po.transport.cluster_id.clear();
    po.transport.log = [](const std::string&) {};
    po.checkpoint_dir = dir;
    c.spec.jobs["ps"][p] = servers.emplace_back(std::move(po)).address();
  }
  c.spec.jobs["worker"][0] = "127.0.0.1:0";
  c.self = {"worker", 0};
  auto net = make_net(table_spec(false));
  trained_state t;
  o.model_dir = dir;
  o.last_step = last_step;
  o.evaluate_rows = [&t](std::span<const float> p, const row_reader& read) {
    t.dense = test::host_copy(p);
    t.rows.assign(V * D, 0.0f);
    read(0, std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6}, t.rows);
    return nn::evaluation{.loss = 1.0, .accuracy = 0.5, .examples = 1};
  };
  const auto r = train(c, net, make_data(), strategy, o);
  CHECK(r.exit_code == 0);
  t.step = r.global_step;
  return t;
}

// Two ranks save together: every rank's pushes of a step acknowledged before rank 0 saves it,
// the seconds cadence decided by rank 0 for both (here every step). Synchronous tables average
// two contributions (a sum of two is exact in either order), so the job is deterministic.
TEST_CASE("hybrid checkpoints on 2 ranks, synchronous tables: saved every step and resumed from step 2, the job "
          "equals the uninterrupted one bit for bit",
          "[hybrid][train][checkpoint]") {
  const auto data = id_data(20, 17);  // 2 batches of 5 an epoch per rank
  train_options o{.name = "hybrid-2-ckpt", .epochs = 2, .batch = 5, .seed = 7, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000};
  o.embedding_rule = optim::adagrad{.learning_rate = 0.1f};
  o.save_checkpoints_secs = 1e-9;  // due after every step, on rank 0's clock
  trained_state at;
  o.evaluate_rows = [&at](std::span<const float> p, const row_reader& read) {
    at.dense = test::host_copy(p);
    at.rows.assign(V * D, 0.0f);
    read(0, std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6}, at.rows);
    return nn::evaluation{.loss = 1.0, .accuracy = 0.5, .examples = 1};
  };
  const strategies::hybrid strategy({.dense = {.rule = optim::adam{.learning_rate = 1e-2f}, .bucket_bytes = 1},
                                     .tables = strategies::table_updates::synchronous});
  test::temp_dir whole("hybrid2-whole"), parts("hybrid2-parts");
  auto run = [&](const test::temp_dir& dir, std::int64_t last_step) {
    auto opts = o;
    opts.model_dir = dir.path().string();
    opts.last_step = last_step;
    for (const auto& r : two_rank_job(data, strategy, opts)) CHECK(r.exit_code == 0);
    return at;
  };
  const auto full = run(whole, 0);
  const auto first = run(parts, 2);
  const auto state = read_checkpoint_state(parts.path());
  REQUIRE(state);
  CHECK(state->all == std::vector<std::string>{"ckpt-0", "ckpt-1", "ckpt-2"});
  for (const auto& name : state->all) {
    CAPTURE(name);
    CHECK(name == "ckpt-" + std::to_string(verify_checkpoint(parts.path(), name).global_step));
  }
  CHECK(read_checkpoint(parts.path(), "ckpt-2").values == first.dense);
  const auto resumed = run(parts, 0);
  CHECK(resumed.dense == full.dense);
  CHECK(resumed.rows == full.rows);
  CHECK(resumed.rows != first.rows);
}

TEST_CASE("hybrid checkpoints: a job saved at step 4 and resumed equals the uninterrupted run bit for bit, restored "
          "into another number of ps, every file of a checkpoint of one step",
          "[hybrid][train][checkpoint]") {
  const auto mode = GENERATE(strategies::table_updates::asynchronous, strategies::table_updates::synchronous);
  // The ps of the run that saves (the restore at its step takes the other count, the resumed run 2).
  const std::size_t saved_by = mode == strategies::table_updates::asynchronous ? 1 : 2;
  CAPTURE(strategies::to_string(mode), saved_by);
  // Adam's slots and update count on the dense side, Adagrad's accumulators on the rows: a
  // restore that lost any of them would not reproduce the run.
  const strategies::hybrid strategy({.dense = {.rule = optim::adam{.learning_rate = 1e-2f}}, .tables = mode});
  train_options o{.name = "hybrid-ckpt", .epochs = 2, .batch = 5, .seed = 11, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000};
  o.embedding_rule = optim::adagrad{.learning_rate = 0.1f};
  o.save_checkpoints_steps = 3;
  o.save_checkpoints_secs = 0;
  test::temp_dir whole("hybrid-whole"), parts("hybrid-parts");
  const auto full = train_in(2, whole.path().string(), 0, strategy, o);  // the independent reference
  REQUIRE(full.step == 10);

  const auto first = train_in(saved_by, parts.path().string(), 4, strategy, o);
  REQUIRE(first.step == 4);
  // Saved at the start, every 3 steps and at the end; every file holds its checkpoint's step
  // (verify_checkpoint checks each shard file's header) and the manifest names it.
  const auto state = read_checkpoint_state(parts.path());
  REQUIRE(state);
  CHECK(state->all == std::vector<std::string>{"ckpt-0", "ckpt-3", "ckpt-4"});
  for (const auto& name : state->all) {
    CAPTURE(name);
    const auto m = verify_checkpoint(parts.path(), name);
    CHECK(name == "ckpt-" + std::to_string(m.global_step));
    CHECK(m.num_ps == saved_by);
    CHECK(m.synchronous == (mode == strategies::table_updates::synchronous));
    CHECK(m.table_files.size() == saved_by);
    CHECK(m.rule == "adam");
  }
  // The checkpoint holds the state the run ended with, both halves.
  const auto saved = read_checkpoint(parts.path(), "ckpt-4");
  CHECK(saved.values == first.dense);
  const auto rows = read_checkpoint_table(checkpoint_reader::open(parts.path(), "ckpt-4"), "words");
  CHECK(rows.ids == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(rows.rows == first.rows);

  // Restored into the other number of ps at its own step: the same rows and dense values.
  const auto again = train_in(3 - saved_by, parts.path().string(), 4, strategy, o);
  CHECK(again.step == 4);
  CHECK(again.dense == first.dense);
  CHECK(again.rows == first.rows);

  // Resumed into 2 ps to the end: the uninterrupted run's bits.
  const auto resumed = train_in(2, parts.path().string(), 0, strategy, o);
  CHECK(resumed.step == 10);
  CHECK(resumed.dense == full.dense);
  CHECK(resumed.rows == full.rows);
  CHECK(resumed.rows != first.rows);
}

TEST_CASE("hybrid refuses to resume from a checkpoint without tables (a ring_allreduce job's), naming it",
          "[hybrid][train][checkpoint]") {
  test::temp_dir dir("hybrid-dense-only");
  auto net = make_net(table_spec(false));
  const auto values = test::initial_parameters(net, 1);
  (void)write_checkpoint({.directory = dir.path().string()},
                         {.variables = net.variables(), .values = values, .rule = "sgd", .global_step = 2});
  train_options o{.name = "hybrid-refuse", .epochs = 1, .batch = 5, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000};
  try {
    (void)train_in(1, dir.path().string(), 0, strategies::hybrid(), o);
    FAIL("a checkpoint without tables was restored");
  } catch (const dtf::error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("checkpoint ckpt-2") && Catch::Contains("holds no embedding table"));
  }
}

// A ps replaced (restarted empty) after step 3, the latest checkpoint at step 2: every rank
// leaves step 4 at the same point (the ranks agree after the step), rank 0 restores ps 0 and 1
// from ckpt-2 and broadcasts the dense part, and both ranks train steps 3 to 6 again. Replaced
// after the last step (6) with checkpoints every 4 steps: rank 0's evaluation and its final
// save find the ps gone, every rank learns it from the save, and the job rewinds to step 4.
// Either way the job ends equal to the uninterrupted one bit for bit.
TEST_CASE("hybrid, 2 ranks, synchronous tables: a ps replaced after a checkpoint is restored in the job, which "
          "ends equal to the uninterrupted one bit for bit",
          "[hybrid][train][checkpoint][recovery]") {
  const auto [replace_after, every] =
      GENERATE(std::pair<std::int64_t, std::int64_t>{3, 2}, std::pair<std::int64_t, std::int64_t>{6, 4});
  CAPTURE(replace_after, every);
  const auto data = id_data(20, 17);  // 2 batches of 5 an epoch per rank
  train_options o{.name = "hybrid-recover", .epochs = 3, .batch = 5, .seed = 7, .summary_every = 0,
                  .log_every = 0, .timeout_ms = 10000};
  o.embedding_rule = optim::adagrad{.learning_rate = 0.1f};
  o.save_checkpoints_steps = every;
  o.save_checkpoints_secs = 0;
  o.max_recoveries = 1;
  trained_state at;
  std::mutex m;
  o.evaluate_rows = [&](std::span<const float> p, const row_reader& read) {
    const std::lock_guard lock(m);
    at.dense = test::host_copy(p);
    at.rows.assign(V * D, 0.0f);
    read(0, std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6}, at.rows);
    return nn::evaluation{.loss = 1.0, .accuracy = 0.5, .examples = 1};
  };
  const strategies::hybrid strategy({.dense = {.rule = optim::adam{.learning_rate = 1e-2f}, .bucket_bytes = 1},
                                     .tables = strategies::table_updates::synchronous});
  test::temp_dir whole("hybrid-rec-whole"), replaced("hybrid-rec-replaced");
  auto run = [&](const test::temp_dir& dir, std::int64_t replace, std::vector<train_result>* results) {
    auto opts = o;
    opts.model_dir = dir.path().string();
    std::int64_t ps_step = -1;
    *results = two_rank_job(data, strategy, opts, &ps_step, replace);
    CHECK(ps_step == 6);
    return at;
  };
  std::vector<train_result> full_results, results;
  const auto full = run(whole, -1, &full_results);
  const auto recovered = run(replaced, replace_after, &results);
  for (std::size_t k = 0; k < 2; ++k) {
    CAPTURE(k);
    CHECK(full_results[k].exit_code == 0);
    CHECK(full_results[k].recoveries == 0);
    CHECK(results[k].exit_code == 0);
    CHECK(results[k].recoveries == 1);
    CHECK(results[k].global_step == 6);
  }
  REQUIRE(!recovered.dense.empty());
  CHECK(recovered.dense == full.dense);
  CHECK(recovered.rows == full.rows);
}

// Asynchronous tables recover the same way; two ranks' pushes of a step reach the ps in either
// order (Adagrad's rows then differ in rounding), so the job is compared with no reference: both
// ranks recover once and end at the last step, whose checkpoint holds every row, as the ps held
// them at the end.
TEST_CASE("hybrid, 2 ranks, asynchronous tables: a ps replaced after a checkpoint is restored in the job",
          "[hybrid][train][checkpoint][recovery]") {
  const auto data = id_data(20, 17);
  test::temp_dir dir("hybrid-rec-async");
  train_options o{.name = "hybrid-recover-async", .epochs = 3, .batch = 5, .seed = 7, .summary_every = 0,
                  .log_every = 0, .timeout_ms = 10000};
  o.embedding_rule = optim::adagrad{.learning_rate = 0.1f};
  o.model_dir = dir.path().string();
  o.save_checkpoints_steps = 2;
  o.save_checkpoints_secs = 0;
  o.max_recoveries = 1;
  std::vector<float> rows;
  o.evaluate_rows = [&](std::span<const float>, const row_reader& read) {
    rows.assign(V * D, 0.0f);
    read(0, std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6}, rows);
    return nn::evaluation{.loss = 1.0, .accuracy = 0.5, .examples = 1};
  };
  const strategies::hybrid strategy({.dense = {.rule = optim::adam{.learning_rate = 1e-2f}}});
  const auto results = two_rank_job(data, strategy, o, nullptr, 3);
  for (std::size_t k = 0; k < 2; ++k) {
    CAPTURE(k);
    CHECK(results[k].exit_code == 0);
    CHECK(results[k].recoveries == 1);
    CHECK(results[k].global_step == 6);
  }
  CHECK(read_checkpoint_state(dir.path())->latest == "ckpt-6");
  const auto saved = read_checkpoint_table(checkpoint_reader::open(dir.path(), "ckpt-6"), "words");
  CHECK(saved.ids == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6});
  CHECK(saved.rows == rows);  // rank 0's last evaluation read them from the ps
}

// max_recoveries 0: both ranks end at the same point with the error naming the ps and the cause
// (neither waits for the other in the ring); no checkpoint: the same, naming the missing one.
// Replaced after step 3, the ranks learn it after step 4 (index 3); after the last step, rank 0's
// evaluation finds it and every rank learns it at the end, after their done reports.
TEST_CASE("hybrid, 2 ranks: a ps replaced with max_recoveries 0, or with no checkpoint, ends every rank with the "
          "error naming the ps",
          "[hybrid][train][recovery]") {
  const auto data = id_data(20, 17);
  train_options o{.name = "hybrid-lost", .epochs = 3, .batch = 5, .seed = 7, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000};
  o.evaluate_rows = [](std::span<const float>, const row_reader& read) {
    std::vector<float> rows(V * D);
    read(0, std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6}, rows);
    return nn::evaluation{.loss = 1.0, .accuracy = 0.5, .examples = 1};
  };
  const strategies::hybrid strategy({.dense = {.rule = optim::sgd{.learning_rate = 0.1f}},
                                     .tables = strategies::table_updates::synchronous});
  const bool with_checkpoint = GENERATE(true, false);
  const std::int64_t replace_after = GENERATE(3, 6);
  CAPTURE(with_checkpoint, replace_after);
  test::temp_dir dir("hybrid-lost");
  if (with_checkpoint) {
    o.model_dir = dir.path().string();
    o.save_checkpoints_steps = 2;
    o.save_checkpoints_secs = 0;
  } else {
    o.max_recoveries = 2;  // nothing to rewind to
  }
  std::vector<std::string> errors;
  const auto started = std::chrono::steady_clock::now();
  (void)two_rank_job(data, strategy, o, nullptr, replace_after, &errors);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(8));  // no ring timeout waited for
  const std::string where = replace_after == 3 ? "hybrid: step 3: " : "hybrid: the end: ";
  for (std::size_t k = 0; k < 2; ++k) {
    CAPTURE(k, errors[k]);
    CHECK_THAT(errors[k], Catch::Contains(where) && Catch::Contains("lost a parameter server"));
    if (with_checkpoint) CHECK_THAT(errors[k], Catch::Contains("max_recoveries is 0: the job ends"));
    else CHECK_THAT(errors[k], Catch::Contains("no checkpoint to restore the parameter servers from (no model_dir)"));
  }
  // A rank that saw the failure names the ps (ps.0 and its address).
  CHECK((errors[0].find("ps.0 (127.0.0.1:") != std::string::npos ||
         errors[1].find("ps.0 (127.0.0.1:") != std::string::npos));
}

TEST_CASE("hybrid refuses a cluster without ps, by name",
          "[hybrid][train]") {
  auto net = make_net(table_spec(false));
  const auto data = id_data(10, 1);
  const train_options o{.name = "rec", .epochs = 1, .batch = 5, .log_every = 0};
  auto refused = [&](const cluster& c, strategies::hybrid s, const train_options& opts, const std::string& why) {
    try {
      (void)train(c, net, data, s, opts);
      FAIL("not refused: " << why);
    } catch (const dtf::error& e) {
      CHECK(e.code() == errc::invalid_config);
      CHECK_THAT(e.what(), Catch::Contains("rec (dtf::strategies::hybrid)") && Catch::Contains(why));
    }
  };
  refused(local_cluster(), strategies::hybrid(), o, "the cluster has no ps tasks to hold the embedding tables");
}

}  // namespace hybrid_test
