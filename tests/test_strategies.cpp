// Asynchronous strategies against an in-process parameter server: exact equivalences where
// they exist, and a short convergence run of every strategy with two workers (threads, each
// with its own model and connection).
#include <catch2/catch.hpp>

#include <dtf/data/fashion_mnist.hpp>
#include <dtf/nn.hpp>
#include <dtf/optim/schedule.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/strategies/aeasgd.hpp>
#include <dtf/strategies/agn.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/dyn_sgd.hpp>
#include <dtf/strategies/eamsgd.hpp>
#include <dtf/strategies/hogwild.hpp>

#include "helpers.hpp"
#include "ps_helpers.hpp"
#include "train_helpers.hpp"

#include <cmath>
#include <cstring>

using namespace dtf;
using dtf::test::opts;
using dtf::test::running_ps;
using dtf::test::small_net;

namespace {
data::dataset synthetic(std::size_t n, std::uint64_t seed) {
  return test::synthetic(n, seed, test::labels::argmax);
}

template <class S>
using worker_t = strategies::async_worker<S, nn::sequential>;

}  // namespace

TEST_CASE("AGN with window 1, one worker and local SGD equals SGD on the ps", "[strategies][agn]") {
  running_ps ps0(opts("ps.0"));
  auto net = small_net();
  const auto layout = partitioners::round_robin{}.place(net.variables(), 1);
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  worker_t<strategies::agn> w(strategies::agn({1, optim::sgd{0.1f}}), net, client, 0, 1);
  w.initialize_ps(3);
  w.begin();
  // The same steps done locally: p -= 0.1 g on the same batches.
  auto reference_net = small_net();
  std::vector<float> p(w.params().begin(), w.params().end()), g(p.size());
  tensor x, y;
  auto s = synthetic(64, 1).batch(16).repeat(2).stream();
  while (auto b = s.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    test::loss_and_gradients_on_host(reference_net, p, x, y, g);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= 0.1f * g[i];
    w.step(*b);
  }
  w.end();
  std::vector<float> centre(p.size());
  client.pull(centre);
  for (std::size_t i = 0; i < p.size(); ++i) REQUIRE(centre[i] == Catch::Detail::Approx(p[i]).margin(1e-6));
  CHECK(w.staleness().pushes == 8);
  CHECK(w.staleness().max == 0);
}

TEST_CASE("AGN divides a partial last window by the steps it took, not by lambda", "[strategies][agn]") {
  running_ps ps0(opts("ps.0"));
  auto net = small_net();
  const auto layout = partitioners::round_robin{}.place(net.variables(), 1);
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  const float lr = 0.1f;
  const std::size_t lambda = 3;
  worker_t<strategies::agn> w(strategies::agn({lambda, optim::sgd{lr}}), net, client, 0, 1);
  w.initialize_ps(5);
  w.begin();
  // Reference (Hermans' AGN, local SGD): each window of λ steps from the pulled centre commits
  // (θ − θ_pulled)/λ; the last, partial window of k < λ steps commits (θ − θ_pulled)/k.
  auto reference_net = small_net();
  std::vector<float> centre(w.params().begin(), w.params().end()), p = centre, g(p.size());
  tensor x, y;
  std::size_t in_window = 0;
  auto commit = [&] {
    for (std::size_t i = 0; i < p.size(); ++i) centre[i] += (p[i] - centre[i]) / float(in_window);
    p = centre;
    in_window = 0;
  };
  auto s = synthetic(64, 2).batch(16).stream();  // 4 batches: a full window and one step
  while (auto b = s.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    test::loss_and_gradients_on_host(reference_net, p, x, y, g);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
    if (++in_window == lambda) commit();
    w.step(*b);
  }
  REQUIRE(in_window == 1);
  commit();
  w.end();
  std::vector<float> got(p.size());
  client.pull(got);
  for (std::size_t i = 0; i < p.size(); ++i) REQUIRE(got[i] == Catch::Detail::Approx(centre[i]).margin(1e-6));
  CHECK(w.staleness().pushes == 2);
}

TEST_CASE("DOWNPOUR re-pulls after a recovery (begin) instead of training on its stale copy", "[strategies][downpour]") {
  running_ps ps0(opts("ps.0"));
  auto net = small_net();
  const auto layout = partitioners::round_robin{}.place(net.variables(), 1);
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  strategies::downpour_config c;
  c.fetch_every = 100;  // no scheduled fetch in this test after the first step
  c.push_every = 1;
  c.local_rule = optim::sgd{0.1f};
  c.ps_rule = optim::sgd{0.1f};
  worker_t<strategies::downpour> w(strategies::downpour(c), net, client, 0, 1);
  w.initialize_ps(7);
  w.begin();
  auto s = synthetic(32, 4).batch(16).stream();
  w.step(*s.next());
  // The ps is restored to other values (as a recovery's restore would), then after_recovery
  // runs the strategy's begin(): the next step must compute its gradient at the new θ̃.
  std::vector<float> centre(w.params().size());
  client.pull(centre);
  client.push_deltas(std::vector<float>(centre.size(), 0.25f), false);
  for (auto& v : centre) v += 0.25f;
  w.begin();
  const auto b = s.next();
  w.step(*b);
  auto reference_net = small_net();
  std::vector<float> g(centre.size());
  tensor x, y;
  assign_from_host(x, b->features);
  assign_from_host(y, b->labels);
  test::loss_and_gradients_on_host(reference_net, centre, x, y, g);
  for (std::size_t i = 0; i < centre.size(); ++i)
    REQUIRE(w.params()[i] == Catch::Detail::Approx(centre[i] - 0.1f * g[i]).margin(1e-6));
}

TEST_CASE("DynSGD, two workers in a scripted interleaving: each commit scaled by 1/(tau+1)", "[strategies][dyn_sgd]") {
  running_ps ps0(opts("ps.0"));
  auto net_a = small_net(), net_b = small_net();
  const auto layout = partitioners::round_robin{}.place(net_a.variables(), 1);
  ps_client ca({ps0.address()}, layout, opts("worker.0")), cb({ps0.address()}, layout, opts("worker.1"));
  ca.connect();
  cb.connect();
  const float lr = 0.1f;
  const std::size_t lambda = 2;
  worker_t<strategies::dyn_sgd> a(strategies::dyn_sgd({lambda, optim::sgd{lr}}), net_a, ca, 0, 2);
  worker_t<strategies::dyn_sgd> b(strategies::dyn_sgd({lambda, optim::sgd{lr}}), net_b, cb, 1, 2);
  a.initialize_ps(11);
  a.begin();
  b.begin();
  // Reference (Jiang et al.'s DynSGD): θ̃ += (θ_k − θ_pulled) / (τ + 1), τ = commits since the
  // committer's pull.
  auto ref_net = small_net();
  std::vector<float> centre(a.params().begin(), a.params().end());
  std::vector<float> pulled_a = centre, pulled_b = centre, g(centre.size());
  std::int64_t commits = 0, seen_a = 0, seen_b = 0;
  tensor x, y;
  auto local = [&](std::vector<float> p, const std::vector<data::host_batch>& bs) {
    for (const auto& bt : bs) {
      assign_from_host(x, bt.features);
      assign_from_host(y, bt.labels);
      test::loss_and_gradients_on_host(ref_net, p, x, y, g);
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
    }
    return p;
  };
  auto commit = [&](const std::vector<float>& p, std::vector<float>& pulled, std::int64_t& seen) {
    const float scale = 1.0f / float(commits - seen + 1);
    for (std::size_t i = 0; i < p.size(); ++i) centre[i] += (p[i] - pulled[i]) * scale;
    ++commits;
    pulled = centre;
    seen = commits;
  };
  auto s = synthetic(96, 6).batch(16).stream();
  auto window = [&] {
    std::vector<data::host_batch> bs;
    for (std::size_t i = 0; i < lambda; ++i) bs.push_back(*s.next());
    return bs;
  };
  // Script: a commits (τ = 0), b commits (τ = 1), a commits again (τ = 1).
  for (int turn : {0, 1, 0}) {
    const auto bs = window();
    auto& w = turn == 0 ? a : b;
    auto& pulled = turn == 0 ? pulled_a : pulled_b;
    auto& seen = turn == 0 ? seen_a : seen_b;
    const auto p = local(pulled, bs);
    for (const auto& bt : bs) w.step(bt);
    commit(p, pulled, seen);
  }
  CHECK(a.staleness().max == 1);
  CHECK(b.staleness().max == 1);
  std::vector<float> got(centre.size());
  ca.read_values(got);
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Catch::Detail::Approx(centre[i]).margin(1e-6));
}

TEST_CASE("DynSGD with one worker sees staleness 0 and adds its residual whole", "[strategies][dyn_sgd]") {
  running_ps ps0(opts("ps.0"));
  auto net = small_net();
  ps_client client({ps0.address()}, partitioners::round_robin{}.place(net.variables(), 1), opts("worker.0"));
  client.connect();
  worker_t<strategies::dyn_sgd> w(strategies::dyn_sgd({5, optim::sgd{0.1f}}), net, client, 0, 1);
  w.initialize_ps(3);
  w.begin();
  auto s = synthetic(320, 2).batch(16).stream();
  while (auto b = s.next()) w.step(*b);
  w.end();
  CHECK(w.staleness().pushes == 4);
  CHECK(w.staleness().max == 0);
  // Unscaled commits and a re-pull after each: the worker's copy is the centre.
  std::vector<float> centre(w.params().size());
  client.pull(centre);
  CHECK(std::equal(centre.begin(), centre.end(), w.params().begin()));
}

TEST_CASE("AEASGD's elastic step moves worker and centre by the same E", "[strategies][aeasgd]") {
  running_ps ps0(opts("ps.0"));
  auto net = small_net();
  ps_client client({ps0.address()}, partitioners::round_robin{}.place(net.variables(), 1), opts("worker.0"));
  client.connect();
  const strategies::aeasgd_config cfg{.window = 1, .learning_rate = 0.1f, .rho = 4.0f};
  worker_t<strategies::aeasgd> w(strategies::aeasgd(cfg), net, client, 0, 1);
  w.initialize_ps(5);
  w.begin();
  std::vector<float> c0(w.params().size()), c1(c0.size());
  client.pull(c0);
  // θ1 = θ0 − η g, computed independently.
  auto s = synthetic(16, 3).batch(16).stream();
  auto b = s.next();
  REQUIRE(b);
  auto reference_net = small_net();
  std::vector<float> theta1(w.params().begin(), w.params().end()), g(theta1.size());
  tensor x, y;
  assign_from_host(x, b->features);
  assign_from_host(y, b->labels);
  test::loss_and_gradients_on_host(reference_net, theta1, x, y, g);
  for (std::size_t i = 0; i < theta1.size(); ++i) theta1[i] -= 0.1f * g[i];
  w.step(*b);  // local step, then the elastic step (window 1)
  client.pull(c1);
  const auto e = w.strategy().elastic_state().last_elastic_difference();
  const float alpha = 0.4f;
  double moved = 0.0;
  for (std::size_t i = 0; i < e.size(); ++i) {
    REQUIRE(e[i] == Catch::Detail::Approx(alpha * (theta1[i] - c0[i])).margin(1e-6));
    REQUIRE(theta1[i] - w.params()[i] == Catch::Detail::Approx(e[i]).margin(1e-6));  // worker moved by −E
    REQUIRE(c1[i] - c0[i] == Catch::Detail::Approx(e[i]).margin(1e-6));              // centre moved by +E
    moved += std::abs(e[i]);
  }
  CHECK(moved > 0.0);
}

TEST_CASE("EAMSGD equals the paper's update: gradient at the look-ahead theta + mu v, elastic every tau", "[strategies][eamsgd]") {
  running_ps ps0(opts("ps.0"));
  auto net = small_net();
  const auto layout = partitioners::round_robin{}.place(net.variables(), 1);
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  const strategies::eamsgd_config c{.window = 2, .learning_rate = 0.05f, .momentum = 0.9f, .rho = 4.0f};
  worker_t<strategies::eamsgd> w(strategies::eamsgd(c), net, client, 0, 1);
  w.initialize_ps(13);
  w.begin();
  // Reference (Zhang et al. 2015, Algorithm 2 with one worker).
  auto ref_net = small_net();
  std::vector<float> centre(w.params().begin(), w.params().end()), theta = centre, v(theta.size(), 0.0f),
      ahead(theta.size()), g(theta.size());
  const float alpha = c.learning_rate * c.rho;
  tensor x, y;
  auto s = synthetic(80, 8).batch(16).stream();  // 5 steps: two elastic updates
  std::int64_t step = 0;
  while (auto b = s.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    for (std::size_t i = 0; i < theta.size(); ++i) ahead[i] = theta[i] + c.momentum * v[i];
    test::loss_and_gradients_on_host(ref_net, ahead, x, y, g);
    for (std::size_t i = 0; i < theta.size(); ++i) {
      v[i] = c.momentum * v[i] - c.learning_rate * g[i];
      theta[i] += v[i];
    }
    if (++step % std::int64_t(c.window) == 0)
      for (std::size_t i = 0; i < theta.size(); ++i) {
        const float e = alpha * (theta[i] - centre[i]);
        theta[i] -= e;
        centre[i] += e;
      }
    w.step(*b);
  }
  std::vector<float> got(centre.size());
  client.pull(got);
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i] == Catch::Detail::Approx(centre[i]).margin(1e-6));
    REQUIRE(w.params()[i] == Catch::Detail::Approx(theta[i]).margin(1e-6));
  }
  CHECK(w.staleness().pushes == 2);
}

TEST_CASE("elastic strategies refuse alpha outside (0, 1) and windows must be positive", "[strategies][errors]") {
  CHECK_THROWS_WITH(strategies::aeasgd({.window = 4, .learning_rate = 0.5f, .rho = 5.0f}), Catch::Contains("alpha"));
  CHECK_THROWS_WITH(strategies::agn({0, optim::sgd{}}), Catch::Contains("window"));
  CHECK_THROWS_WITH(strategies::downpour({.fetch_every = 0}), Catch::Contains("fetch_every"));
}

namespace {
// Trains `make()` with two workers (threads) on a 2,000-example Fashion-MNIST subset for three
// epochs; returns {loss of the initial centre, loss of the final centre} on 1,000 test images.
template <class S>
std::pair<double, double> two_workers(const std::function<S()>& make) {
  running_ps ps0(opts("ps.0"));
  auto eval_net = nn::sequential{nn::dense(784, 64), nn::relu(), nn::dense(64, 10)};
  const auto layout = partitioners::greedy_load_balancing{}.place(eval_net.variables(), 1);
  const auto train = data::load_fashion_mnist(data::split::train, test::fashion_mnist_dir()).take(2000).normalize();
  const auto test = data::load_fashion_mnist(data::split::test, test::fashion_mnist_dir()).take(1000).normalize().batch(500);
  const std::size_t n = eval_net.num_parameters();
  tensor init({n});
  eval_net.initialize(init.span<float>(), 11);
  const double before = nn::evaluate(eval_net, init.span<float>(), test).loss;

  std::vector<std::exception_ptr> failures(2);
  std::vector<std::thread> threads;
  std::mutex init_mu;
  std::condition_variable init_cv;
  bool initialised = false;
  for (std::size_t k = 0; k < 2; ++k)
    threads.emplace_back([&, k] {
      try {
        auto net = nn::sequential{nn::dense(784, 64), nn::relu(), nn::dense(64, 10)};
        ps_client client({ps0.address()}, layout, opts("worker." + std::to_string(k)));
        client.connect();
        worker_t<S> w(make(), net, client, k, 2);
        if (k == 0) {
          w.initialize_ps(11);
          std::lock_guard g(init_mu);
          initialised = true;
          init_cv.notify_all();
        } else {
          std::unique_lock g(init_mu);
          init_cv.wait(g, [&] { return initialised; });
        }
        w.begin();
        auto s = train.shard(2, k).shuffle(k).batch(32).repeat(3).stream();
        while (auto b = s.next()) w.step(*b);
        w.end();
      } catch (...) {
        failures[k] = std::current_exception();
        std::lock_guard g(init_mu);
        initialised = true;  // release the other thread
        init_cv.notify_all();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
  ps_client reader({ps0.address()}, layout, opts("evaluator.0"));
  reader.connect();
  std::vector<float> centre(n);
  reader.pull(centre);
  tensor c = tensor::from_host<float>({n}, centre);
  return {before, nn::evaluate(eval_net, c.span<float>(), test).loss};
}
}  // namespace

TEST_CASE("every strategy lowers the loss well below its start with two workers", "[strategies][convergence]") {
  using namespace strategies;
  std::vector<std::pair<std::string, std::pair<double, double>>> runs;
  // Hogwild and DOWNPOUR without their staleness-aware rate: with it, the rate of each push
  // depends on how the two threads interleave, and so would this test's outcome (the rule itself
  // is pinned exactly in test_staleness_aware.cpp).
  runs.emplace_back("hogwild",
                    two_workers<hogwild>([] { return hogwild({.learning_rate = 0.1f, .staleness_aware = false}); }));
  runs.emplace_back("downpour", two_workers<downpour>([] {
                      return downpour({.local_rule = optim::sgd{0.05f},
                                       .ps_rule = optim::adagrad{0.05f},
                                       .staleness_aware = false});
                    }));
  runs.emplace_back("downpour_easy", two_workers<downpour>([] {
                      auto c = downpour_easy_config({0.05f, 0.02f}, 0.05f);
                      c.staleness_aware = false;
                      return downpour(c);
                    }));
  runs.emplace_back("agn", two_workers<agn>([] { return agn({4, optim::adam{2e-3f}}); }));
  runs.emplace_back("dyn_sgd", two_workers<dyn_sgd>([] { return dyn_sgd({4, optim::adam{2e-3f}}); }));
  runs.emplace_back("aeasgd", two_workers<aeasgd>([] {
                      return aeasgd({.window = 4, .learning_rate = 0.1f, .rho = 5.0f});
                    }));
  runs.emplace_back("eamsgd", two_workers<eamsgd>([] {
                      return eamsgd({.window = 4, .learning_rate = 0.02f, .momentum = 0.9f, .rho = 5.0f});
                    }));
  for (const auto& [name, losses] : runs) {
    INFO(name << ": loss " << losses.first << " -> " << losses.second);
    CHECK(losses.second < 0.5 * losses.first);
  }
}

#if !DTF_CUDA
TEST_CASE("hogwild_threads: lock-free threads on one shared buffer learn", "[strategies][hogwild]") {
  std::vector<nn::sequential> replicas;
  for (int k = 0; k < 2; ++k) replicas.push_back(small_net());
  std::vector<float> shared(replicas[0].num_parameters());
  replicas[0].initialize(shared, 4);
  const auto ds = synthetic(1024, 9);
  tensor x, y;
  auto whole = ds.batch(1024).stream();
  auto all = whole.next();
  assign_from_host(x, all->features);
  assign_from_host(y, all->labels);
  const float before = replicas[0].loss(shared, x, y);
  auto s0 = ds.shard(2, 0).batch(16).repeat(20).stream();
  auto s1 = ds.shard(2, 1).batch(16).repeat(20).stream();
  const auto report = strategies::hogwild_threads(replicas, std::span<float>(shared), {&s0, &s1}, 0.2f);
  CHECK(report.steps == 2 * 20 * 32);
  CHECK(replicas[0].loss(shared, x, y) < 0.5f * before);
}
namespace {
// A model whose gradient is 1 everywhere, whatever the parameters: Hogwild's result is then
// exactly θ₀ − η · (number of steps), unless an update is lost.
struct constant_gradient_model {
  std::size_t n = 64;
  std::vector<variable_spec> variables() const { return {{"w", {n}, 0}}; }
  void initialize(std::span<float> p, std::uint64_t) { std::fill(p.begin(), p.end(), 0.0f); }
  float loss_and_gradients(std::span<const float>, const tensor&, const tensor&, std::span<float> g) {
    std::fill(g.begin(), g.end(), 1.0f);
    return 0.0f;
  }
};
}  // namespace

TEST_CASE("hogwild_threads loses no update: every thread's step lands", "[strategies][hogwild]") {
  std::vector<constant_gradient_model> replicas(4);
  std::vector<float> shared(64, 0.0f);
  const auto ds = synthetic(256, 3);
  auto s0 = ds.shard(4, 0).batch(1).repeat(8).stream();
  auto s1 = ds.shard(4, 1).batch(1).repeat(8).stream();
  auto s2 = ds.shard(4, 2).batch(1).repeat(8).stream();
  auto s3 = ds.shard(4, 3).batch(1).repeat(8).stream();
  std::vector<data::batch_stream*> ptrs{&s0, &s1, &s2, &s3};
  // η = 1 and integer steps: every partial sum is exact in float.
  const auto report = strategies::hogwild_threads(replicas, std::span<float>(shared), ptrs, 1.0f);
  REQUIRE(report.steps == 4 * 64 * 8);
  for (float v : shared) REQUIRE(v == -float(report.steps));
}
#endif

TEST_CASE("a ps worker clips its own gradient before the push, and the push carries the schedule's rate",
          "[strategies][hogwild][loop]") {
  // One hogwild worker (no staleness): θ̃ -= lr(t) clip(g) at the global step t the worker saw.
  running_ps ps0(opts("ps.0"));
  auto net = small_net();
  const auto layout = partitioners::round_robin{}.place(net.variables(), 1);
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  const optim::cosine_decay cosine{.learning_rate = 0.5f, .decay_steps = 6, .warmup_steps = 2, .warmup_from = 0.1f};
  const float clip = 0.05f;
  worker_t<strategies::hogwild> w(strategies::hogwild({.schedule = cosine}), net, client, 0, 1);
  w.set_clip_norm(clip);
  w.initialize_ps(3);
  w.begin();
  auto reference_net = small_net();
  std::vector<float> p(w.params().begin(), w.params().end()), g(p.size());
  tensor x, y;
  auto s = synthetic(64, 1).batch(8).stream();
  std::int64_t t = 0;
  bool clipped = false;
  while (auto b = s.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    test::loss_and_gradients_on_host(reference_net, p, x, y, g);
    double sum = 0;
    for (float v : g) sum += double(v) * double(v);
    const double coef = double(clip) / (std::sqrt(sum) + 1e-6);
    clipped = clipped || coef < 1;
    const float lr = cosine(t++);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * (coef < 1 ? g[i] * float(coef) : g[i]);
    w.step(*b);
  }
  w.end();
  CHECK(clipped);
  std::vector<float> centre(p.size());
  client.pull(centre);
  for (std::size_t i = 0; i < p.size(); ++i) REQUIRE(centre[i] == Catch::Detail::Approx(p[i]).margin(1e-6));
  CHECK_THROWS_WITH(w.set_clip_norm(-1.0f), Catch::Contains("clip_norm"));
}

TEST_CASE("AGN and DynSGD take the local rate from a schedule of the global step", "[strategies][agn][loop]") {
  // Window 1, one worker: every step commits, so step t runs at the global step t and θ̃ follows
  // p -= schedule(t) g.
  const optim::piecewise_constant steps{{1, 3}, {0.2f, 0.1f, 0.05f}};
  for (const bool dyn : {false, true}) {
    INFO((dyn ? "dyn_sgd" : "agn"));
    running_ps ps0(opts("ps.0"));
    auto net = small_net();
    const auto layout = partitioners::round_robin{}.place(net.variables(), 1);
    ps_client client({ps0.address()}, layout, opts("worker.0"));
    client.connect();
    auto reference_net = small_net();
    std::vector<float> p, g;
    tensor x, y;
    auto run = [&](auto& w) {
      w.initialize_ps(3);
      w.begin();
      p.assign(w.params().begin(), w.params().end());
      g.assign(p.size(), 0.0f);
      auto s = synthetic(48, 2).batch(8).stream();
      std::int64_t t = 0;
      while (auto b = s.next()) {
        assign_from_host(x, b->features);
        assign_from_host(y, b->labels);
        test::loss_and_gradients_on_host(reference_net, p, x, y, g);
        const float lr = steps(t++);
        for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
        w.step(*b);
      }
      w.end();
    };
    if (dyn) {
      worker_t<strategies::dyn_sgd> w(
          strategies::dyn_sgd({.window = 1, .local_rule = optim::sgd{1.0f}, .schedule = steps}), net, client, 0, 1);
      run(w);
    } else {
      worker_t<strategies::agn> w(strategies::agn({.window = 1, .local_rule = optim::sgd{1.0f}, .schedule = steps}), net,
                                  client, 0, 1);
      run(w);
    }
    std::vector<float> centre(p.size());
    client.pull(centre);
    for (std::size_t i = 0; i < p.size(); ++i) REQUIRE(centre[i] == Catch::Detail::Approx(p[i]).margin(1e-6));
  }
}

TEST_CASE("a worker's gradient: the batch through pinned slots, a deferred loss copied with the gradient", "[strategies][staging]") {
  // nn::sequential defers its loss, so batch_gradient (dense_staging) brings device_loss() back
  // with the gradient instead of the float path's read; both must equal loss_and_gradients on the
  // same batch and parameters, bit for bit, batches of other rows (16, 16, 8) included.
  static_assert(defers_loss<nn::sequential>);
  auto net = small_net();
  auto reference = small_net();
  const std::size_t n = num_parameters(net.variables());
  strategies::detail::batch_gradient<nn::sequential> gradient(net, n);
  tensor init({n});
  net.initialize(init.span<float>(), 5);
  std::vector<float> p(n), g(n), rg(n);
  init.copy_to_host<float>(std::span<float>(p));
  tensor x, y;
  auto s = synthetic(40, 2).batch(16).repeat(2).stream();
  std::size_t steps = 0;
  while (auto b = s.next()) {
    gradient.set_batch(*b);
    const float loss = gradient(p, g);
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    const float expected = test::loss_and_gradients_on_host(reference, p, x, y, rg);
    REQUIRE(std::isfinite(expected));
    CHECK(std::memcmp(&loss, &expected, sizeof loss) == 0);
    CHECK(g == rg);
    for (std::size_t i = 0; i < n; ++i) p[i] -= 0.1f * g[i];  // other parameters at each step
    ++steps;
  }
  CHECK(steps == 6);
}
