// Synchronous strategies against an in-process parameter server, workers as threads.
#include <catch2/catch.hpp>

#include <dtf/nn.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps/checkpointing.hpp>
#include <dtf/strategies/sync.hpp>

#include "helpers.hpp"
#include "ps_helpers.hpp"
#include "train_helpers.hpp"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <functional>
#include <limits>
#include <tuple>
#include <unistd.h>
#include <latch>
#include <utility>
#include <map>
#include <mutex>
#include <set>
#include <thread>

using namespace dtf;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {
nn::sequential net3() { return test::small_net(); }
data::dataset random_labels(std::size_t n, std::uint64_t seed) { return test::synthetic(n, seed, test::labels::random); }
using test::run_threads;
}  // namespace

TEST_CASE("2 workers at batch B with N = 2 equal one process at batch 2B (plain SGD)", "[sync][sync_sgd]") {
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::greedy_load_balancing{}.place(proto.variables(), 1);
  const auto data = random_labels(160, 4);
  const int k_steps = 5;
  {
    ps_client chief({ps0.address()}, layout, opts("worker.0"));
    chief.connect();
    strategies::sync_worker<strategies::sync_sgd, nn::sequential> w(
        strategies::sync_sgd({.replicas_to_aggregate = 2, .rule = optim::sgd{0.1f}}), proto, chief, 0);
    w.initialize_ps(8);
  }
  run_threads(2, [&](std::size_t k) {
    auto net = net3();
    ps_client c({ps0.address()}, layout, opts("worker." + std::to_string(k)));
    c.connect();
    strategies::sync_worker<strategies::sync_sgd, nn::sequential> w(
        strategies::sync_sgd({.replicas_to_aggregate = 2, .rule = optim::sgd{0.1f}}), net, c, k);
    w.begin();
    auto s = data.shard(2, k).batch(16).stream();
    for (int i = 0; i < k_steps; ++i) w.step(*s.next());
    CHECK(w.drops().dropped == 0);
    c.mark_done();
  });
  // One process, batch 32 over the same examples.
  auto net = net3();
  std::vector<float> p = test::initial_parameters(net, 8), g(p.size());
  tensor x, y;
  auto s = data.batch(32).stream();
  for (int i = 0; i < k_steps; ++i) {
    auto b = s.next();
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    test::loss_and_gradients_on_host(net, p, x, y, g);
    for (std::size_t j = 0; j < p.size(); ++j) p[j] -= 0.1f * g[j];
  }
  ps_client reader({ps0.address()}, layout, opts("evaluator.0"));
  reader.connect();
  std::vector<float> centre(p.size());
  CHECK(reader.pull(centre) == k_steps);
  for (std::size_t j = 0; j < p.size(); ++j) REQUIRE(centre[j] == Catch::Detail::Approx(p[j]).margin(1e-5));
}

TEST_CASE("a slowed worker with one backup does not hold the steps and its stale gradients are counted",
          "[sync][straggler]") {
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::round_robin{}.place(proto.variables(), 1);
  const auto data = random_labels(3000, 5);
  const std::int64_t last_step = 30;
  const strategies::sync_sgd_config cfg{.replicas_to_aggregate = 2, .rule = optim::sgd{0.05f}};
  {
    ps_client chief({ps0.address()}, layout, opts("worker.0"));
    chief.connect();
    strategies::sync_worker<strategies::sync_sgd, nn::sequential> w(strategies::sync_sgd(cfg), proto, chief, 0);
    w.initialize_ps(1);
  }
  std::vector<strategies::drop_stats> drops(3);
  // The fast workers start once the straggler has pulled step 0 and begun computing from it, so
  // its first contribution is in flight however late its thread was scheduled.
  std::latch straggler_computing(1);
  std::atomic<bool> released{false};
  const auto release = [&] {
    if (!released.exchange(true)) straggler_computing.count_down();
  };
  run_threads(3, [&](std::size_t k) {
    // Released as well if the straggler fails before computing, so no fast worker waits forever.
    struct guard {
      std::function<void()> f;
      ~guard() { if (f) f(); }
    } on_exit{k == 2 ? std::function<void()>(release) : std::function<void()>()};
    auto net = net3();
    ps_client c({ps0.address()}, layout, opts("worker." + std::to_string(k)));
    c.connect();
    strategies::sync_worker<strategies::sync_sgd, nn::sequential> w(strategies::sync_sgd(cfg), net, c, k);
    w.set_last_step(last_step);
    // The straggler: worker 2's gradients take 100 ms longer than the others'.
    if (k == 2) {
      w.set_compute_delay(std::chrono::milliseconds(100));
      w.set_before_compute(release);
    }
    w.begin();
    if (k != 2) straggler_computing.wait();
    auto s = data.shard(3, k).batch(16).repeat().stream();
    while (!w.finished()) w.step(*s.next());
    drops[k] = w.drops();
    c.mark_done();
  });
  // The two fast workers carried every step; the slow one's late contributions were dropped.
  CHECK(drops[0].contributions - drops[0].dropped + drops[1].contributions - drops[1].dropped >=
        std::uint64_t(2 * last_step - 2));
  CHECK(drops[2].dropped >= 1);
  CHECK(drops[2].contributions < std::uint64_t(last_step) / 2);
  const auto counted = ps0.ps->dropped_contributions();
  REQUIRE(counted.count("worker.2") == 1);
  CHECK(counted.at("worker.2") == drops[2].dropped);
  CHECK(ps0.ps->global_step() == last_step);
}

TEST_CASE("a dead worker with N = 2 of 2 ends in a clear error, not a hang", "[sync][errors]") {
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::round_robin{}.place(proto.variables(), 1);
  ps_client a({ps0.address()}, layout, opts("worker.0"));
  a.connect();
  const std::size_t n = proto.num_parameters();
  std::vector<float> p(n, 0.0f), g(n, 0.01f);
  a.initialize(p, {optim::sgd{0.1f}, apply_mode::locked, 2});
  {
    ps_client b({ps0.address()}, layout, opts("worker.1"));
    b.connect();
    std::thread tb([&] { b.push_sync(g, 0); });
    CHECK(a.push_sync(g, 0).global_step == 1);  // both contributed: step 0 complete
    tb.join();
  }  // worker.1's connection closes without mark_done: it died
  CHECK_THROWS_WITH(a.push_sync(g, 1), Catch::Contains("worker.1 disconnected") && Catch::Contains("1 of the 2"));
}

TEST_CASE("contributions for a finished step are dropped and reported", "[sync]") {
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::round_robin{}.place(proto.variables(), 1);
  ps_client a({ps0.address()}, layout, opts("worker.0"));
  a.connect();
  std::vector<float> p(proto.num_parameters(), 0.0f), g(p.size(), 1.0f);
  a.initialize(p, {optim::sgd{0.5f}, apply_mode::locked, 1});
  CHECK(a.push_sync(g, 0).global_step == 1);
  const auto r = a.push_sync(g, 0);
  CHECK(r.dropped);
  CHECK(r.dropped_total == 1);
  CHECK_THROWS_WITH(a.push_sync(g, 5), Catch::Contains("step 5") && Catch::Contains("at step 1"));
  a.pull(p);
  CHECK(p[0] == Catch::Detail::Approx(-0.5));  // only the accepted contribution was applied
}

TEST_CASE("per-worker rates scale contributions and SAGN averages window updates", "[sync][sagn]") {
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::round_robin{}.place(proto.variables(), 1);
  const auto data = random_labels(960, 6);
  {
    ps_client chief({ps0.address()}, layout, opts("worker.0"));
    chief.connect();
    strategies::sync_worker<strategies::sagn, nn::sequential> w(
        strategies::sagn({.replicas_to_aggregate = 2, .window = 4, .local_rule = optim::adam{0.01f}}), proto, chief, 0);
    w.initialize_ps(2);
  }
  tensor x, y;
  auto all = data.batch(960).stream();
  auto b = all.next();
  assign_from_host(x, b->features);
  assign_from_host(y, b->labels);
  auto eval = net3();
  const std::vector<float> p0 = test::initial_parameters(eval, 2);
  const float before = test::loss_on_host(eval, p0, x, y);
  run_threads(2, [&](std::size_t k) {
    auto net = net3();
    ps_client c({ps0.address()}, layout, opts("worker." + std::to_string(k)));
    c.connect();
    strategies::sync_worker<strategies::sagn, nn::sequential> w(
        strategies::sagn({.replicas_to_aggregate = 2, .window = 4, .local_rule = optim::adam{0.01f}}), net, c, k);
    w.set_last_step(40);
    w.begin();
    auto s = data.shard(2, k).batch(16).repeat().stream();
    while (!w.finished()) w.step(*s.next());
    c.mark_done();
  });
  ps_client reader({ps0.address()}, layout, opts("evaluator.0"));
  reader.connect();
  std::vector<float> centre(p0.size());
  CHECK(reader.pull(centre) == 40);
  CHECK(test::loss_on_host(eval, centre, x, y) < 0.95f * before);  // random labels: learnable only by memorising

  // Per-worker rates: worker k's gradient is multiplied by its rate before averaging.
  strategies::sync_sgd_config rates{.replicas_to_aggregate = 2, .rule = optim::sgd{1.0f}, .worker_rates = {0.1f, 0.3f}};
  CHECK(strategies::sync_rate(rates, 0) == std::nullopt);
  rates.linear_scaling = true;
  rates.warmup_steps = 10;
  CHECK(*strategies::sync_rate(rates, 0) == Catch::Detail::Approx(1.0));
  CHECK(*strategies::sync_rate(rates, 5) == Catch::Detail::Approx(1.5));
  CHECK(*strategies::sync_rate(rates, 10) == Catch::Detail::Approx(2.0));
}

TEST_CASE("per-worker rates: the ps applies the mean of rate-scaled gradients", "[sync][rates]") {
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::round_robin{}.place(proto.variables(), 1);
  const auto data = random_labels(32, 7);
  const strategies::sync_sgd_config cfg{.replicas_to_aggregate = 2, .rule = optim::sgd{1.0f}, .worker_rates = {0.1f, 0.3f}};
  {
    ps_client chief({ps0.address()}, layout, opts("worker.0"));
    chief.connect();
    strategies::sync_worker<strategies::sync_sgd, nn::sequential> w(strategies::sync_sgd(cfg), proto, chief, 0);
    w.initialize_ps(3);
  }
  run_threads(2, [&](std::size_t k) {
    auto net = net3();
    ps_client c({ps0.address()}, layout, opts("worker." + std::to_string(k)));
    c.connect();
    strategies::sync_worker<strategies::sync_sgd, nn::sequential> w(strategies::sync_sgd(cfg), net, c, k);
    w.begin();
    auto s = data.shard(2, k).batch(16).stream();
    w.step(*s.next());
    c.mark_done();
  });
  // Expected: p0 − (0.1 g0 + 0.3 g1) / 2, g_k the gradient of worker k's batch at p0.
  auto net = net3();
  std::vector<float> p = test::initial_parameters(net, 3), g0(p.size()), g1(p.size());
  tensor x, y;
  for (std::size_t k = 0; k < 2; ++k) {
    auto s = data.shard(2, k).batch(16).stream();
    auto b = s.next();
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    test::loss_and_gradients_on_host(net, p, x, y, k == 0 ? g0 : g1);
  }
  ps_client reader({ps0.address()}, layout, opts("evaluator.0"));
  reader.connect();
  std::vector<float> centre(p.size());
  reader.pull(centre);
  for (std::size_t j = 0; j < p.size(); ++j)
    REQUIRE(centre[j] == Catch::Detail::Approx(p[j] - (0.1f * g0[j] + 0.3f * g1[j]) / 2).margin(1e-6));
}

namespace {
// W workers (threads) contribute constant deltas c_k = 2^k to synchronous steps on `num_ps`
// ps until the global step reaches `steps`; N per step. Each step adds (Σ of its N admitted
// c_k) / N to every element, so the steps' contributor sets are read back from the values:
// every element of every ps must hold the same value, which is the sum over the steps of
// their averages (a different subset on one ps would show as a different value there).
void sync_deltas_on(std::size_t num_ps, std::size_t workers, std::size_t n, std::int64_t steps) {
  std::vector<std::unique_ptr<running_ps>> ps;
  std::vector<std::string> addresses;
  for (std::size_t i = 0; i < num_ps; ++i) {
    ps.push_back(std::make_unique<running_ps>(opts("ps." + std::to_string(i)), 2));
    addresses.push_back(ps.back()->address());
  }
  const std::vector<variable_spec> vars{{"w", {10, 3}, 0}, {"b", {3}, 30}, {"v", {7}, 33}};
  const auto layout = partitioners::fixed_size{3}.place(vars, num_ps);
  ps_client chief(addresses, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(std::vector<float>(40, 0.0f), {optim::sgd{}, apply_mode::locked, n, workers});
  std::mutex mu;
  std::map<std::int64_t, std::set<std::size_t>> admitted;  // step -> contributors ps 0 admitted
  std::uint64_t dropped = 0, mixed_pulls = 0;  // counted here, checked after the threads
  run_threads(workers, [&](std::size_t k) {
    ps_client c(addresses, layout, opts("worker." + std::to_string(k + 1)));
    c.connect();
    std::vector<float> v(40), delta(40, float(1u << k));
    for (std::int64_t t = c.pull(v); t < steps; t = c.pull(v)) {
      // The values a pull returns are those of its tag: every element is the same.
      const bool mixed = std::any_of(v.begin(), v.end(), [&](float x) { return x != v[0]; });
      const auto r = c.push_sync(delta, t, std::nullopt, /*delta=*/true);
      std::lock_guard g(mu);
      mixed_pulls += mixed ? 1 : 0;
      if (r.dropped)
        ++dropped;
      else
        admitted[t].insert(k);
    }
    c.mark_done();
  });
  // Every pull returned the values of one step: each ps applies a step under its step lock,
  // which its pulls share, and the client reads again a ps still behind the others.
  CHECK(mixed_pulls == 0);
  std::vector<float> v(40);
  CHECK(chief.pull(v) == steps);
  float expect = 0.0f;
  REQUIRE(admitted.size() == std::size_t(steps));
  for (const auto& [t, who] : admitted) {
    REQUIRE(who.size() == n);
    float sum = 0.0f;
    for (auto k : who) sum += float(1u << k);
    expect += sum / float(n);
  }
  for (float x : v) REQUIRE(x == expect);
  // Dropped contributions are counted by ps 0 alone, one for each the workers saw.
  std::uint64_t counted = 0;
  for (const auto& [who, d] : ps[0]->ps->dropped_contributions()) counted += d;
  CHECK(counted == dropped);
  for (std::size_t i = 1; i < num_ps; ++i) CHECK(ps[i]->ps->dropped_contributions().empty());
  for (std::size_t i = 0; i < num_ps; ++i) CHECK(ps[i]->ps->global_step() == steps);
}
}  // namespace

TEST_CASE("synchronous steps on 2 ps, 2 workers, N = 2: every ps applies the same contributions", "[sync][multi_ps]") {
  sync_deltas_on(2, 2, 2, 12);
}
TEST_CASE("synchronous steps on 3 ps, 2 workers, N = 2: every ps applies the same contributions", "[sync][multi_ps]") {
  sync_deltas_on(3, 2, 2, 12);
}
TEST_CASE("synchronous steps on 2 ps, 3 workers, N = 2 (a backup): the same N on every ps", "[sync][multi_ps]") {
  sync_deltas_on(2, 3, 2, 12);
}
TEST_CASE("synchronous steps on 3 ps, 3 workers, N = 2 (a backup): the same N on every ps", "[sync][multi_ps]") {
  sync_deltas_on(3, 3, 2, 12);
}

namespace {
// A synchronous request of the protocol (dtf/ps/sync_protocol.hpp) on its own, as a worker that
// dies part-way through push_sync would have sent it: ps `ps`'s part of g.
rpc_call part_of(ps_client& c, const placement& layout, std::size_t ps, detail::message_kind kind,
                 const std::vector<float>& g, std::int64_t step, std::uint64_t incarnation, std::uint64_t sequence = 0,
                 const std::function<void(detail::ps_sync_push_msg&)>& tweak = {}) {
  detail::ps_sync_push_msg m;
  m.ids = c.shards_of(ps);
  m.step = step;
  m.incarnation = incarnation;
  m.sequence = sequence;
  if (tweak) tweak(m);
  auto call = c.request(ps, kind, detail::encode_message(m));
  for (auto id : m.ids)
    call.payload.push_back(asio::buffer(g.data() + layout.shards[id].offset, layout.shards[id].size * sizeof(float)));
  return call;
}
std::vector<rpc_call> one(rpc_call c) {
  std::vector<rpc_call> v;
  v.push_back(std::move(c));
  return v;
}
// Waits (bounded) until ps holds `k` commits waiting for their step's decision.
void wait_for_commits(running_ps& ps, std::size_t k) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (ps.ps->sync_waiters() < k && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  REQUIRE(ps.ps->sync_waiters() == k);
}
const std::vector<variable_spec> two_ps_vars{{"w", {4, 3}, 0}, {"b", {3}, 12}};  // 15 floats
}  // namespace

TEST_CASE("a step whose committers died before forwarding its decision completes through the next pull",
          "[sync][multi_ps][protocol]") {
  running_ps ps0(opts("ps.0")), ps1(opts("ps.1"));
  const std::vector<std::string> addresses{ps0.address(), ps1.address()};
  const auto layout = partitioners::fixed_size{3}.place(two_ps_vars, 2);
  ps_client chief(addresses, layout, opts("chief.0"));
  chief.connect();
  std::vector<float> theta(15);
  for (std::size_t j = 0; j < theta.size(); ++j) theta[j] = 0.25f * float(j);
  chief.initialize(theta, {optim::sgd{0.5f}, apply_mode::locked, 2, 3});
  ps_client c(addresses, layout, opts("worker.2"));
  c.connect();
  std::vector<float> v(15);
  REQUIRE(c.pull(v) == 0);  // worker.2 is a live replica
  std::vector<float> ga(15), gb(15);
  for (std::size_t j = 0; j < 15; ++j) ga[j] = float(j % 4) - 1.0f, gb[j] = 0.5f * float(j);
  {
    ps_client a(addresses, layout, opts("worker.0")), b(addresses, layout, opts("worker.1"));
    a.connect();
    b.connect();
    // Both stage their parts on ps 1 and commit on ps 0; then they die without forwarding.
    for (auto [w, g, inc] : {std::tuple{&a, &ga, 11u}, std::tuple{&b, &gb, 12u}}) {
      auto stage = one(part_of(*w, layout, 1, detail::message_kind::ps_sync_stage, *g, 0, inc));
      w->call_all(stage);
    }
    std::vector<rpc_call> ca = one(part_of(a, layout, 0, detail::message_kind::ps_sync_push, ga, 0, 11));
    std::thread ta([&] { a.call_all(ca); });
    wait_for_commits(ps0, 1);
    auto cb = one(part_of(b, layout, 0, detail::message_kind::ps_sync_push, gb, 0, 12));
    b.call_all(cb);
    ta.join();
    const auto st = detail::decode_message<detail::ps_status_msg>(cb[0].reply_meta, "status");
    REQUIRE(st.decision);
    CHECK(st.decision->ids == std::vector<detail::contribution_id>{{"worker.0", 11, 0}, {"worker.1", 12, 0}});
  }
  CHECK(ps0.ps->global_step() == 1);
  CHECK(ps1.ps->global_step() == 0);  // nobody forwarded the decision
  // worker.2's pull finds ps 1 behind, takes the decision from ps 0 and forwards it.
  REQUIRE(c.pull(v) == 1);
  CHECK(ps1.ps->global_step() == 1);
  for (std::size_t j = 0; j < 15; ++j) REQUIRE(v[j] == Catch::Detail::Approx(theta[j] - 0.5f * (ga[j] + gb[j]) / 2));
}

TEST_CASE("a retried commit counts once: its first bytes, answered on the retry's connection", "[sync][protocol]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{3}.place(two_ps_vars, 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(std::vector<float>(15, 1.0f), {optim::sgd{1.0f}, apply_mode::locked, 2, 2});
  std::vector<float> first(15, 0.5f), retried(15, 8.0f), gb(15, 0.25f);
  ps_client a1({ps0.address()}, layout, opts("worker.0")), a2({ps0.address()}, layout, opts("worker.0"));
  ps_client b({ps0.address()}, layout, opts("worker.1"));
  a1.connect();
  a2.connect();
  b.connect();
  auto c1 = one(part_of(a1, layout, 0, detail::message_kind::ps_sync_push, first, 0, 5));
  std::string superseded;
  std::thread t1([&] {
    try {
      a1.call_all(c1);
    } catch (const error& e) {
      superseded = e.what();
    }
  });
  wait_for_commits(ps0, 1);
  // The same contribution again (a timed-out request sent anew), from another connection.
  auto c2 = one(part_of(a2, layout, 0, detail::message_kind::ps_sync_push, retried, 0, 5));
  std::thread t2([&] { a2.call_all(c2); });
  t1.join();
  CHECK_THAT(superseded, Catch::Contains("superseded by a retry"));
  wait_for_commits(ps0, 1);
  const auto r = b.push_sync(gb, 0);
  t2.join();
  CHECK(r.global_step == 1);
  CHECK_FALSE(r.dropped);
  const auto st = detail::decode_message<detail::ps_status_msg>(c2[0].reply_meta, "status");
  REQUIRE(st.decision);
  CHECK(st.decision->ids.size() == 2);
  // A retry of an admitted commit after the decision is answered with it, not dropped.
  auto c3 = one(part_of(a2, layout, 0, detail::message_kind::ps_sync_push, retried, 0, 5));
  a2.call_all(c3);
  const auto late = detail::decode_message<detail::ps_status_msg>(c3[0].reply_meta, "status");
  CHECK_FALSE(late.dropped);
  CHECK(late.decision == st.decision);
  std::vector<float> v(15);
  b.pull(v);
  for (float x : v) REQUIRE(x == Catch::Detail::Approx(1.0f - (0.5f + 0.25f) / 2));  // the first bytes, once
  CHECK(ps0.ps->dropped_contributions().empty());
}

TEST_CASE("a worker that pulled and died before contributing fails the step, named", "[sync][errors][protocol]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{3}.place(two_ps_vars, 1);
  ps_client a({ps0.address()}, layout, opts("worker.0"));
  a.connect();
  std::vector<float> v(15, 0.0f), g(15, 1.0f);
  a.initialize(v, {optim::sgd{0.1f}, apply_mode::locked, 2, 2});
  a.pull(v);  // a live replica
  ps_client evaluator({ps0.address()}, layout, opts("evaluator.0"));
  evaluator.connect();
  evaluator.pull(v);  // not a replica: it contributes nothing
  {
    ps_client b({ps0.address()}, layout, opts("worker.1"));
    b.connect();
    b.pull(v);
  }  // worker.1 dies before its first contribution
  CHECK_THROWS_WITH(a.push_sync(g, 0), Catch::Contains("worker.1 disconnected") && Catch::Contains("1 of the 2"));
}

TEST_CASE("a backup worker that dies without its done report counts as finished: steps and the chief's wait go on",
          "[sync][errors][protocol]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{3}.place(two_ps_vars, 1);
  ps_client a({ps0.address()}, layout, opts("worker.0")), b({ps0.address()}, layout, opts("worker.1"));
  a.connect();
  b.connect();
  std::vector<float> v(15, 0.0f), g(15, 1.0f);
  a.initialize(v, {optim::sgd{0.5f}, apply_mode::locked, 2, 3});  // N = 2 of 3 workers: one backup
  a.pull(v);
  b.pull(v);
  {
    ps_client c({ps0.address()}, layout, opts("worker.2"));
    c.connect();
    c.pull(v);
  }  // worker.2 dies: the two left are the N each step needs
  sync_result rb;
  std::thread other([&] { rb = b.push_sync(g, 0); });
  const auto ra = a.push_sync(g, 0);
  other.join();
  CHECK(ra.global_step == 1);
  CHECK(rb.global_step == 1);
  a.pull(v);
  for (float x : v) REQUIRE(x == -0.5f);  // the average of the two contributions, at rate 0.5
  a.mark_done();
  b.mark_done();
  CHECK(a.wait_workers_done(3, std::chrono::seconds(10)) == 3);  // worker.2 counted as finished
  CHECK(ps0.ps->done_tasks() == std::set<std::string>{"worker.0", "worker.1", "worker.2"});
}

TEST_CASE("a skipped contribution and the next for the same step stage different parts on ps 1",
          "[sync][multi_ps][protocol]") {
  ps_options o0{opts("ps.0"), 1}, o1{opts("ps.1"), 1};
  o0.nonfinite = o1.nonfinite = nonfinite_policy::skip;
  running_ps ps0(o0), ps1(o1);
  const std::vector<std::string> addresses{ps0.address(), ps1.address()};
  const auto layout = partitioners::fixed_size{3}.place(two_ps_vars, 2);
  ps_client a(addresses, layout, opts("worker.0"));
  a.connect();
  std::vector<float> v(15, 0.0f), bad(15, 1.0f), good(15, 2.0f);
  a.initialize(v, {optim::sgd{1.0f}, apply_mode::locked, 1, 1});
  bad[14] = std::numeric_limits<float>::quiet_NaN();  // on ps 1 (the last shard)
  CHECK(a.push_sync(bad, 0).skipped);
  const auto r = a.push_sync(good, 0);
  CHECK_FALSE(r.skipped);
  CHECK(r.global_step == 1);
  a.pull(v);
  for (float x : v) REQUIRE(x == -2.0f);  // the second contribution on both ps
}

TEST_CASE("checkpoints taken while a backup worker keeps steps completing hold one step on every ps",
          "[sync][multi_ps][protocol][checkpoint]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dtf_test_sync_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::unique_ptr<running_ps>> ps;
  std::vector<std::string> addresses;
  for (std::size_t i = 0; i < 2; ++i) {
    ps_options o{opts("ps." + std::to_string(i)), 2};
    o.checkpoint_dir = dir.string();
    o.transport.log = [](const std::string&) {};
    ps.push_back(std::make_unique<running_ps>(o));
    addresses.push_back(ps.back()->address());
  }
  const std::vector<variable_spec> vars{{"w", {10, 3}, 0}, {"b", {3}, 30}, {"v", {7}, 33}};
  const auto layout = partitioners::fixed_size{3}.place(vars, 2);
  ps_client chief(addresses, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(std::vector<float>(40, 0.0f), {optim::sgd{}, apply_mode::locked, 2, 3});
  constexpr std::int64_t steps = 60;
  std::mutex mu;
  std::map<std::int64_t, std::set<std::size_t>> admitted;  // step -> the contributors ps 0 admitted
  std::atomic<std::size_t> running{3};
  std::vector<checkpoint_manifest> saved;
  std::thread saver([&] {  // the chief saves while the workers train, and once after
    const checkpoint_options ck{.directory = dir.string(), .max_to_keep = 1000};
    while (running.load() > 0) saved.push_back(save_checkpoint(chief, ck, vars));
    saved.push_back(save_checkpoint(chief, ck, vars));
  });
  run_threads(3, [&](std::size_t k) {
    ps_client c(addresses, layout, opts("worker." + std::to_string(k)));
    c.connect();
    std::vector<float> v(40), delta(40, float(1u << k));
    for (std::int64_t t = c.pull(v); t < steps; t = c.pull(v)) {
      const auto r = c.push_sync(delta, t, std::nullopt, /*delta=*/true);
      std::lock_guard g(mu);
      if (!r.dropped) admitted[t].insert(k);
    }
    c.mark_done();
    --running;
  });
  saver.join();
  REQUIRE(admitted.size() == std::size_t(steps));
  std::vector<float> after(steps + 1, 0.0f);  // after[t]: every element's value after t steps
  for (const auto& [t, who] : admitted) {
    float sum = 0.0f;
    for (auto k : who) sum += float(1u << k);
    after[std::size_t(t) + 1] = after[std::size_t(t)] + sum / 2;
  }
  REQUIRE(saved.size() >= 2);
  std::size_t during = 0;  // checkpoints of a step training had not finished
  for (const auto& m : saved) {
    INFO("checkpoint " << m.name);
    REQUIRE(m.global_step >= 0);
    REQUIRE(m.global_step <= steps);
    during += m.global_step < steps;
    const auto r = checkpoint_reader::open(dir, m.name);
    std::vector<float> v(40);
    r.read(0, 0, v);
    for (float x : v) REQUIRE(x == after[std::size_t(m.global_step)]);  // both ps's files: that step
  }
  CHECK(during > 0);
  // A manifest claiming another step than its files' is refused, naming the file and the field.
  const auto& last = saved.back();
  CHECK(last.synchronous);
  auto j = last.to_json();
  j["global_step"] = last.global_step + 1;
  std::vector<std::vector<std::byte>> bytes;
  for (const auto& f : last.files) {
    std::ifstream in(dir / f.name, std::ios::binary);
    std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes.emplace_back(reinterpret_cast<const std::byte*>(c.data()), reinterpret_cast<const std::byte*>(c.data()) + c.size());
  }
  std::vector<std::span<const std::byte>> files(bytes.begin(), bytes.end());
  CHECK_THROWS_WITH(checkpoint_reader::from_memory(j.dump(), files, "edited manifest"),
                    Catch::Contains("header.global_step") && Catch::Contains("the checkpoint's is"));
  fs::remove_all(dir);
}

namespace {
// A job whose tasks hold what dtfrun gives them (docs/design/identity.md): the 2 ps the master
// secret, the chief and the workers their own task keys. N = 2 of 3 workers: worker.0 and
// worker.1 train, worker.2 is the attacker (its own key only).
const std::string sync_master = "sync-test-master-secret-0123456789";
transport_options keyed(const std::string& identity) {
  auto o = opts(identity);
  o.task_key = derive_task_key(sync_master, identity);
  return o;
}
struct keyed_job {
  running_ps ps0{opts("ps.0", sync_master)}, ps1{opts("ps.1", sync_master)};
  std::vector<std::string> addresses{ps0.address(), ps1.address()};
  placement layout = partitioners::fixed_size{3}.place(two_ps_vars, 2);
  std::vector<float> theta = std::vector<float>(15), g[2] = {std::vector<float>(15), std::vector<float>(15)};
  static constexpr float rate = 0.5f;  // the honest workers' learning rate (the rule's is 1)
  keyed_job() {
    for (std::size_t j = 0; j < 15; ++j) {
      theta[j] = 0.25f * float(j);
      g[0][j] = 0.125f * float(j % 5) - 0.25f;
      g[1][j] = 0.5f - 0.0625f * float(j);
    }
    ps_client chief(addresses, layout, keyed("chief.0"));
    chief.connect();
    chief.initialize(theta, {optim::sgd{1.0f}, apply_mode::locked, 2, 3});
  }
  // worker.0 and worker.1, each with its own key, contribute g[k] at `rate` until step `steps`,
  // in requests of at most `request_bytes` (0: the default, one per ps).
  void train(std::int64_t steps, std::size_t request_bytes = 0) {
    run_threads(2, [&](std::size_t k) {
      auto o = keyed("worker." + std::to_string(k));
      if (request_bytes) o.max_request_bytes = request_bytes;
      ps_client c(addresses, layout, o);
      c.connect();
      std::vector<float> v(15);
      for (std::int64_t t = c.pull(v); t < steps; t = c.pull(v))
        if (c.push_sync(g[k], t, rate).dropped) throw std::runtime_error("an honest contribution was dropped");
      c.mark_done();
    });
  }
  // Both ps hold what `steps` steps of the two honest contributions make, computed here.
  void check_trained(std::int64_t steps) {
    std::vector<float> expect = theta, v(15);
    for (std::int64_t t = 0; t < steps; ++t)
      for (std::size_t j = 0; j < 15; ++j) expect[j] -= rate * ((g[0][j] + g[1][j]) * 0.5f);
    ps_client reader(addresses, layout, keyed("evaluator.0"));
    reader.connect();
    CHECK(reader.pull(v) == steps);
    CHECK(ps0.ps->global_step() == steps);
    CHECK(ps1.ps->global_step() == steps);
    for (std::size_t j = 0; j < 15; ++j) REQUIRE(v[j] == Catch::Detail::Approx(expect[j]).margin(1e-6));
  }
};
// Runs `attack` on a thread of its own until it is answered or ps 0 holds it as a waiting commit
// (before the fix, an unproven commit waited for its step), so the honest workers come after it.
struct pending_attack {
  std::string error;
  std::thread thread;
  std::atomic<bool> answered{false};
  pending_attack(running_ps& ps0, std::function<void()> attack) {
    thread = std::thread([this, attack = std::move(attack)] {
      try {
        attack();
      } catch (const dtf::error& e) {
        error = e.what();
      }
      answered = true;
    });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!answered && ps0.ps->sync_waiters() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  std::string result() {
    thread.join();
    return error;
  }
  ~pending_attack() {  // a failed check unwinds past result()
    if (thread.joinable()) thread.join();
  }
};
}  // namespace

TEST_CASE("with a secret, a commit whose part ps 1 never staged is refused to its sender and training goes on",
          "[sync][multi_ps][protocol][hostile]") {
  keyed_job job;
  ps_client attacker(job.addresses, job.layout, keyed("worker.2"));
  attacker.connect();
  const std::vector<float> zero(15, 0.0f);
  pending_attack commit(job.ps0, [&] {
    auto c = one(part_of(attacker, job.layout, 0, detail::message_kind::ps_sync_push, zero, 0, 77));
    attacker.call_all(c);
  });
  job.train(6);
  CHECK_THAT(commit.result(), Catch::Contains("without ps.1's receipt"));
  job.check_trained(6);
}

TEST_CASE("with a secret, decisions ps 0 did not make are refused to their sender and training goes on",
          "[sync][multi_ps][protocol][hostile]") {
  keyed_job job;
  ps_client attacker(job.addresses, job.layout, keyed("worker.2"));
  attacker.connect();
  const std::vector<float> zero(15, 0.0f);
  auto stage = one(part_of(attacker, job.layout, 1, detail::message_kind::ps_sync_stage, zero, 0, 77));
  attacker.call_all(stage);  // a part of its own staged on ps 1, as a forger would name
  auto forward = [&](const detail::sync_decision& d) {
    std::vector<rpc_call> c{attacker.request(1, detail::message_kind::ps_sync_apply,
                                             detail::encode_message(detail::ps_sync_apply_msg{d}))};
    attacker.call_all(c);
  };
  detail::sync_decision made_up;  // its own part and one of a made-up incarnation, never staged
  made_up.step = 0;
  made_up.ids = {{"worker.2", 77, 0}, {"worker.2", 78, 0}};
  CHECK_THROWS_WITH(forward(made_up), Catch::Contains("that ps 0 did not make"));
  made_up.ids = {{"worker.0", 1, 0}, {"worker.1", 2, 0}};
  CHECK_THROWS_WITH(forward(made_up), Catch::Contains("that ps 0 did not make"));
  CHECK(job.ps1.ps->global_step() == 0);
  job.train(6);
  job.check_trained(6);
  // A decision ps 0 made, asked for as a pull does, then altered: refused; as made: answered.
  std::vector<rpc_call> ask{attacker.request(0, detail::message_kind::ps_sync_decision,
                                             detail::encode_message(detail::ps_sync_apply_msg{{5, {}}}))};
  attacker.call_all(ask);
  const auto st = detail::decode_message<detail::ps_status_msg>(ask[0].reply_meta, "status");
  REQUIRE(st.decision);
  auto altered = *st.decision;
  std::swap(altered.ids[0], altered.ids[1]);
  CHECK_THROWS_WITH(forward(altered), Catch::Contains("that ps 0 did not make"));
  CHECK_NOTHROW(forward(*st.decision));
  job.check_trained(6);
}

TEST_CASE("with a secret, a first contribution at another rate is refused to its sender, the honest ones decide",
          "[sync][multi_ps][protocol][hostile]") {
  keyed_job job;
  ps_client attacker(job.addresses, job.layout, keyed("worker.2"));
  attacker.connect();
  const std::vector<float> zero(15, 0.0f);
  // A zero contribution at the rule's rate (no learning rate), staged on ps 1 with its receipt,
  // committed before anyone else's.
  auto stage = one(part_of(attacker, job.layout, 1, detail::message_kind::ps_sync_stage, zero, 0, 77));
  attacker.call_all(stage);
  const auto receipt = detail::decode_message<detail::ps_status_msg>(stage[0].reply_meta, "status").receipt;
  REQUIRE(receipt);
  pending_attack commit(job.ps0, [&] {
    auto c = one(part_of(attacker, job.layout, 0, detail::message_kind::ps_sync_push, zero, 0, 77, 0,
                         [&](detail::ps_sync_push_msg& m) { m.receipts = {*receipt}; }));
    attacker.call_all(c);
  });
  job.train(6);
  CHECK_THAT(commit.result(), Catch::Contains("decided with gradients at learning rate 0.5"));
  job.check_trained(6);
  // Late, to the decided step, at another rate: dropped, as any late commit.
  auto late = one(part_of(attacker, job.layout, 0, detail::message_kind::ps_sync_push, zero, 0, 79, 0,
                          [](detail::ps_sync_push_msg& m) { m.kind = detail::update_kind::delta; }));
  attacker.call_all(late);
  CHECK(detail::decode_message<detail::ps_status_msg>(late[0].reply_meta, "status").dropped);
  job.check_trained(6);
}

TEST_CASE("with a secret, parts in segments carry their receipts, and a half-staged part's commit is refused",
          "[sync][multi_ps][protocol][hostile]") {
  keyed_job job;
  ps_client attacker(job.addresses, job.layout, keyed("worker.2"));
  attacker.connect();
  REQUIRE(job.layout.num_ps == 2);
  REQUIRE(attacker.shards_of(1).size() >= 2);
  // Segment 0 of 2 of its part on ps 1 (its first shard), then the commit: refused.
  const std::vector<float> zero(15, 0.0f);
  auto half = one(part_of(attacker, job.layout, 1, detail::message_kind::ps_sync_stage, zero, 0, 77, 0,
                          [&](detail::ps_sync_push_msg& m) {
                            m.ids.resize(1);
                            m.segments = 2;
                          }));
  attacker.call_all(half);
  CHECK_FALSE(detail::decode_message<detail::ps_status_msg>(half[0].reply_meta, "status").receipt);
  pending_attack commit(job.ps0, [&] {
    auto c = one(part_of(attacker, job.layout, 0, detail::message_kind::ps_sync_push, zero, 0, 77));
    attacker.call_all(c);
  });
  // The honest workers send each shard in a segment of its own (requests of 1 byte).
  job.train(6, 1);
  CHECK_THAT(commit.result(), Catch::Contains("without ps.1's receipt"));
  job.check_trained(6);
}

TEST_CASE("sync_sgd: the ps applies its rule with weight decay at the schedule's rate to a clipped contribution",
          "[sync][sync_sgd][loop]") {
  // One worker, N = 1: each step's update is the ps's rule (momentum with PyTorch's L2 weight
  // decay, carried in the ps config) at rate schedule(t) on the worker's clipped gradient.
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::round_robin{}.place(proto.variables(), 1);
  const auto data = random_labels(48, 5);
  const optim::piecewise_constant steps{{2, 4}, {0.3f, 0.1f, 0.03f}};
  const float clip = 0.1f, wd = 0.05f, mu = 0.9f;
  const strategies::sync_sgd_config cfg{.replicas_to_aggregate = 1,
                                        .rule = optim::momentum{.learning_rate = 1.0f, .momentum = mu, .weight_decay = wd},
                                        .schedule = steps};
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  strategies::sync_worker<strategies::sync_sgd, nn::sequential> w(strategies::sync_sgd(cfg), proto, client, 0);
  w.set_clip_norm(clip);
  w.initialize_ps(8);
  w.begin();
  auto net = net3();
  std::vector<double> p, v;
  {
    const auto p0 = test::initial_parameters(net, 8);
    p.assign(p0.begin(), p0.end());
    v.assign(p.size(), 0.0);
  }
  std::vector<float> pf(p.size()), g(p.size());
  tensor x, y;
  auto s = data.batch(8).stream();
  for (std::int64_t t = 0; t < 6; ++t) {
    auto b = s.next();
    w.step(*b);
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    std::copy(p.begin(), p.end(), pf.begin());
    test::loss_and_gradients_on_host(net, pf, x, y, g);
    double sum = 0;
    for (float e : g) sum += double(e) * double(e);
    const double coef = std::min(1.0, double(clip) / (std::sqrt(sum) + 1e-6));
    for (std::size_t j = 0; j < p.size(); ++j) {
      const double d = coef * g[j] + wd * p[j];
      v[j] = mu * v[j] + d;
      p[j] -= double(steps(t)) * v[j];
    }
  }
  ps_client reader({ps0.address()}, layout, opts("evaluator.0"));
  reader.connect();
  std::vector<float> centre(p.size());
  CHECK(reader.pull(centre) == 6);
  for (std::size_t j = 0; j < p.size(); ++j) REQUIRE(centre[j] == Catch::Detail::Approx(p[j]).margin(1e-5));
  CHECK_THROWS_WITH(strategies::sync_sgd({.linear_scaling = true, .schedule = steps}), Catch::Contains("linear_scaling"));
}

TEST_CASE("sagn: the local rule's rate from a schedule of the pulled global step", "[sync][sagn][loop]") {
  // One worker, N = 1, window 1: each step is local SGD at schedule(t) from θ̃ of step t, added whole.
  running_ps ps0(opts("ps.0"));
  auto proto = net3();
  const auto layout = partitioners::round_robin{}.place(proto.variables(), 1);
  const auto data = random_labels(40, 6);
  const optim::exponential_decay decay{.learning_rate = 0.3f, .decay_steps = 2, .decay_rate = 0.5f};
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  strategies::sync_worker<strategies::sagn, nn::sequential> w(
      strategies::sagn({.replicas_to_aggregate = 1, .window = 1, .local_rule = optim::sgd{1.0f}, .schedule = decay}), proto,
      client, 0);
  w.initialize_ps(8);
  w.begin();
  auto net = net3();
  std::vector<float> p = test::initial_parameters(net, 8), g(p.size());
  tensor x, y;
  auto s = data.batch(8).stream();
  for (std::int64_t t = 0; t < 5; ++t) {
    auto b = s.next();
    w.step(*b);
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    test::loss_and_gradients_on_host(net, p, x, y, g);
    for (std::size_t j = 0; j < p.size(); ++j) p[j] -= decay(t) * g[j];
  }
  ps_client reader({ps0.address()}, layout, opts("evaluator.0"));
  reader.connect();
  std::vector<float> centre(p.size());
  CHECK(reader.pull(centre) == 5);
  for (std::size_t j = 0; j < p.size(); ++j) REQUIRE(centre[j] == Catch::Detail::Approx(p[j]).margin(1e-5));
}
