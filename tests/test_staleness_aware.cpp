// The staleness-aware rules of the asynchronous strategies, each against an independent
// reference computation of the update in a scripted interleaving (docs/guides/choosing-a-strategy.md
// states the rules), and the chief's watch for a loss rising while staleness grows.
// Gradients come from a fixed function of the parameters (no model), so every expected value
// is computed here with the same float operations the ps and the worker perform: the
// comparisons are exact.
#include <catch2/catch.hpp>

#include <dtf/partitioners.hpp>
#include <dtf/strategies/aeasgd.hpp>
#include <dtf/strategies/agn.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/dyn_sgd.hpp>
#include <dtf/strategies/eamsgd.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/staleness_watch.hpp>

#include "ps_helpers.hpp"
#include "train_helpers.hpp"

#include <cmath>
#include <functional>
#include <random>

using namespace dtf;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {

std::vector<float> seeded(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Two clients of one ps holding small_net's variables.
struct two_clients {
  running_ps ps0{opts("ps.0")};
  placement layout = partitioners::round_robin{}.place(test::small_net().variables(), 1);
  ps_client a{{ps0.address()}, layout, opts("worker.0")}, b{{ps0.address()}, layout, opts("worker.1")};
  std::size_t n = 0;
  two_clients() {
    a.connect();
    b.connect();
    for (const auto& s : layout.shards) n += s.size;
  }
  std::vector<float> init(const optim::rule& r, apply_mode mode = apply_mode::locked) {
    std::vector<float> v = seeded(n, 1);
    a.initialize(v, {.rule = r, .mode = mode});
    return v;
  }
  std::vector<float> centre() {
    std::vector<float> v(n);
    a.read_values(v);
    return v;
  }
};

// The gradient the tests' "model" computes at `at`: g = 0.5 at + c, with c fixed.
struct affine_gradient {
  std::vector<float> c;
  int calls = 0;
  std::function<void()> during;  // runs inside the first call (another worker's push)
  float operator()(std::span<const float> at, std::span<float> g) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.5f * at[i] + c[i];
    if (calls++ == 0 && during) during();
    return 1.0f;
  }
  std::vector<float> at(std::span<const float> p) const {
    std::vector<float> g(p.size());
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.5f * p[i] + c[i];
    return g;
  }
};

// A worker's state around its own buffers.
struct state_of {
  std::vector<float> params, grads;
  strategies::staleness_stats st;
  strategies::worker_state w;
  state_of(ps_client& ps, std::size_t n, std::size_t index, std::size_t workers)
      : params(n), grads(n), w{params, grads, ps, index, workers, 0, 0, 0, st} {}
  float step(auto& s, affine_gradient& f) {
    const float loss = s.step(w, std::ref(f));
    ++w.local_step;
    return loss;
  }
};

void require_equal(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == want[i]);
}

}  // namespace

TEST_CASE("the ps applies a staleness-aware gradient push at its rate / (tau + 1), plain pushes at the full rate",
          "[strategies][staleness]") {
  const auto mode = GENERATE(apply_mode::locked, apply_mode::lock_free);
  two_clients c;
  const float lr = 0.1f;
  auto ref = c.init(optim::sgd{lr}, mode);
  const auto g1 = seeded(c.n, 2), g2 = seeded(c.n, 3), g3 = seeded(c.n, 4), g4 = seeded(c.n, 5);
  std::vector<float> scratch(c.n);
  c.a.pull(scratch);
  c.b.pull(scratch);  // both have seen 0 updates
  auto sgd = [&](const std::vector<float>& g, float rate) {
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] -= rate * g[i];
  };
  CHECK(c.a.push_gradients(g1, std::nullopt, true, true).staleness == 0);
  sgd(g1, (1.0f / 1.0f) * lr);
  CHECK(c.b.push_gradients(g2, std::nullopt, true, true).staleness == 1);
  sgd(g2, (1.0f / 2.0f) * lr);
  CHECK(c.b.push_gradients(g3, 0.05f, true, true).staleness == 2);  // a rate of its own, scaled too
  sgd(g3, (1.0f / 3.0f) * 0.05f);
  CHECK(c.a.push_gradients(g4, std::nullopt, true, false).staleness == 3);  // not staleness-aware
  sgd(g4, lr);
  require_equal(c.centre(), ref);
}

TEST_CASE("a staleness-aware push scales Adagrad's rate, not the gradient its accumulator sums", "[strategies][staleness]") {
  two_clients c;
  const optim::adagrad rule{.learning_rate = 0.05f, .initial_accumulator = 0.1f, .epsilon = 1e-7f};
  auto ref = c.init(rule);
  std::vector<float> acc(c.n, rule.initial_accumulator), scratch(c.n);
  auto adagrad = [&](const std::vector<float>& g, float rate) {
    for (std::size_t i = 0; i < ref.size(); ++i) {
      acc[i] = acc[i] + g[i] * g[i];
      ref[i] -= rate * g[i] / (std::sqrt(acc[i]) + rule.epsilon);
    }
  };
  c.a.pull(scratch);
  c.b.pull(scratch);
  const auto g1 = seeded(c.n, 6), g2 = seeded(c.n, 7);
  c.b.push_gradients(g1, std::nullopt, true, true);
  adagrad(g1, rule.learning_rate);
  c.b.push_gradients(g1, std::nullopt, true, true);  // b's second push: τ = 1
  adagrad(g1, 0.5f * rule.learning_rate);
  CHECK(c.a.push_gradients(g2, std::nullopt, true, true).staleness == 2);
  adagrad(g2, (1.0f / 3.0f) * rule.learning_rate);
  require_equal(c.centre(), ref);
}

TEST_CASE("hogwild, staleness-aware: a push that another worker's update overtook lands at eta beta^epoch / (tau + 1)",
          "[strategies][staleness][hogwild]") {
  const bool aware = GENERATE(true, false);
  two_clients c;
  const strategies::hogwild_config cfg{.learning_rate = 0.05f, .epoch_decay = 0.9f, .staleness_aware = aware};
  auto ref = c.init(strategies::hogwild(cfg).ps_rule(), apply_mode::lock_free);
  strategies::hogwild h(cfg);
  state_of s(c.a, c.n, 0, 2);
  s.w.epoch = 1;
  const auto other = seeded(c.n, 8);
  affine_gradient f{seeded(c.n, 9)};
  f.during = [&] { c.b.push_gradients(other, 0.05f, true, true); };  // b: pulled nothing, τ = 0
  const auto g = f.at(ref);  // a's gradient at the values it pulled
  h.begin(s.w);
  s.step(h, f);
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] -= 0.05f * other[i];
  const float rate = 0.05f * std::pow(0.9f, 1.0f);
  const float scaled = aware ? (1.0f / 2.0f) * rate : rate;
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] -= scaled * g[i];
  CHECK(s.st.max == 1);
  require_equal(c.centre(), ref);
  CHECK(std::string(h.stability_setting()).find(aware ? "--lr" : "--staleness_aware") != std::string::npos);
}

TEST_CASE("DOWNPOUR, staleness-aware: the accumulated gradient is applied by Adagrad at its rate / (tau + 1)",
          "[strategies][staleness][downpour]") {
  const bool aware = GENERATE(true, false);
  two_clients c;
  strategies::downpour_config cfg;
  cfg.fetch_every = cfg.push_every = 2;
  cfg.local_rule = optim::sgd{0.01f};
  cfg.ps_rule = optim::adagrad{.learning_rate = 0.05f};
  cfg.staleness_aware = aware;
  auto centre = c.init(cfg.ps_rule);
  strategies::downpour d(cfg);
  state_of s(c.a, c.n, 0, 2);
  const auto other = seeded(c.n, 10);
  affine_gradient f{seeded(c.n, 11)};
  f.during = [&] { c.b.push_gradients(other, std::nullopt, true, false); };
  // Reference: the worker pulls θ̃, takes two local SGD steps accumulating their gradients; b's
  // push (Adagrad at the full rate) lands meanwhile; the window's sum is then applied by Adagrad.
  std::vector<float> local = centre, acc_g(c.n, 0.0f), adagrad_a(c.n, 0.1f);
  for (int k = 0; k < 2; ++k) {
    const auto g = f.at(local);
    for (std::size_t i = 0; i < c.n; ++i) {
      acc_g[i] += g[i];
      local[i] -= 0.01f * g[i];
    }
  }
  auto adagrad = [&](const std::vector<float>& g, float rate) {
    for (std::size_t i = 0; i < c.n; ++i) {
      adagrad_a[i] = adagrad_a[i] + g[i] * g[i];
      centre[i] -= rate * g[i] / (std::sqrt(adagrad_a[i]) + 1e-7f);
    }
  };
  adagrad(other, 0.05f);
  adagrad(acc_g, aware ? (1.0f / 2.0f) * 0.05f : 0.05f);
  d.begin(s.w);
  s.step(d, f);
  s.step(d, f);
  CHECK(s.st.pushes == 1);
  CHECK(s.st.max == 1);
  require_equal(s.params, local);
  require_equal(c.centre(), centre);
}

TEST_CASE("AGN normalises a commit by its window's steps, and with staleness_aware off commits the raw residual",
          "[strategies][staleness][agn]") {
  const bool aware = GENERATE(true, false);
  two_clients c;
  auto centre = c.init(optim::sgd{});
  strategies::agn a({.window = 2, .local_rule = optim::sgd{0.1f}, .staleness_aware = aware});
  state_of s(c.a, c.n, 0, 1);
  affine_gradient f{seeded(c.n, 12)};
  std::vector<float> p = centre;
  for (int k = 0; k < 2; ++k) {
    const auto g = f.at(p);
    for (std::size_t i = 0; i < c.n; ++i) p[i] -= 0.1f * g[i];
  }
  const float scale = aware ? 1.0f / 2.0f : 1.0f;
  for (std::size_t i = 0; i < c.n; ++i) centre[i] += (p[i] - centre[i]) * scale;
  a.begin(s.w);
  s.step(a, f);
  s.step(a, f);
  require_equal(c.centre(), centre);
  require_equal(s.params, centre);  // re-pulled after the commit
}

TEST_CASE("DynSGD scales an overtaken commit by 1 / (tau + 1), and with staleness_aware off adds it whole",
          "[strategies][staleness][dyn_sgd]") {
  const bool aware = GENERATE(true, false);
  two_clients c;
  auto centre = c.init(optim::sgd{});
  strategies::dyn_sgd d({.window = 1, .local_rule = optim::sgd{0.1f}, .staleness_aware = aware});
  state_of s(c.a, c.n, 0, 2);
  const auto other = seeded(c.n, 13);
  affine_gradient f{seeded(c.n, 14)};
  f.during = [&] { c.b.push_deltas(other); };
  d.begin(s.w);
  const auto g = f.at(centre);
  std::vector<float> residual(c.n);
  for (std::size_t i = 0; i < c.n; ++i) residual[i] = (centre[i] - 0.1f * g[i]) - centre[i];
  for (std::size_t i = 0; i < c.n; ++i) centre[i] += other[i];
  const float scale = aware ? 1.0f / 2.0f : 1.0f;
  for (std::size_t i = 0; i < c.n; ++i) centre[i] += (aware ? scale * residual[i] : residual[i]);
  s.step(d, f);
  CHECK(s.st.max == 1);
  require_equal(c.centre(), centre);
}

TEST_CASE("AEASGD and EAMSGD, staleness-aware: alpha = min(eta rho, beta / p) for p workers",
          "[strategies][staleness][aeasgd][eamsgd]") {
  const strategies::aeasgd_config on{.window = 1, .learning_rate = 0.1f, .rho = 4.0f};
  auto off = on;
  off.staleness_aware = false;
  CHECK(strategies::aeasgd(on).alpha(1) == 0.4f);
  CHECK(strategies::aeasgd(on).alpha(2) == 0.4f);  // 0.9 / 2 > η ρ
  CHECK(strategies::aeasgd(on).alpha(4) == 0.9f / 4.0f);
  CHECK(strategies::aeasgd(on).alpha(64) == 0.9f / 64.0f);
  CHECK(strategies::aeasgd(off).alpha(64) == 0.4f);
  const strategies::eamsgd_config m{.window = 1, .learning_rate = 0.05f, .momentum = 0.9f, .rho = 4.0f, .beta = 0.5f};
  CHECK(strategies::eamsgd(m).alpha(1) == 0.05f * 4.0f);
  CHECK(strategies::eamsgd(m).alpha(16) == 0.5f / 16.0f);
  CHECK_THROWS_WITH(strategies::aeasgd({.window = 1, .learning_rate = 0.1f, .rho = 4.0f, .beta = 1.5f}),
                    Catch::Contains("beta"));

  // The elastic step of worker 0 of 4 uses that α: E = α (θ₁ − θ̃), θ₁ −= E, θ̃ += E.
  const bool aware = GENERATE(true, false);
  two_clients c;
  auto centre = c.init(optim::sgd{});
  strategies::aeasgd a(aware ? on : off);
  state_of s(c.a, c.n, 0, 4);
  affine_gradient f{seeded(c.n, 15)};
  a.begin(s.w);
  const auto g = f.at(centre);
  std::vector<float> theta = centre;
  for (std::size_t i = 0; i < c.n; ++i) theta[i] -= 0.1f * g[i];
  const float alpha = aware ? 0.9f / 4.0f : 0.1f * 4.0f;
  for (std::size_t i = 0; i < c.n; ++i) {
    const float e = alpha * (theta[i] - centre[i]);
    theta[i] -= e;
    centre[i] += e;
  }
  s.step(a, f);
  require_equal(s.params, theta);
  require_equal(c.centre(), centre);
}

TEST_CASE("the staleness watch warns once when the loss rises while staleness grows, naming the setting",
          "[strategies][staleness][watch]") {
  strategies::staleness_watch watch("--lr (hogwild_config::learning_rate)", {.window_steps = 4, .rise = 0.1});
  strategies::staleness_stats st;
  std::vector<std::string> said;
  auto window = [&](double loss, std::uint64_t staleness) {
    for (int k = 0; k < 4; ++k) {
      st.record(staleness);
      if (auto m = watch.record(loss, st)) said.push_back(*m);
    }
  };
  window(2.0, 0);
  window(1.5, 3);   // staleness grows, loss falls: fine
  window(1.6, 3);   // loss rises 6.7 %, staleness flat: fine
  window(2.5, 3);   // loss rises 56 %, staleness flat: fine
  window(1.0, 1);
  window(1.05, 2);  // staleness grows, loss rises 5 % (under 10 %): fine
  CHECK(said.empty());
  window(2.0, 9);  // loss doubles while staleness grows from 2 to 9: the warning
  REQUIRE(said.size() == 1);
  CHECK_THAT(said[0], Catch::Contains("rose from 1.05 to 2") && Catch::Contains("from 2.00 to 9.00") &&
                          Catch::Contains("--lr (hogwild_config::learning_rate)"));
  window(4.0, 20);  // once only
  CHECK(said.size() == 1);
  CHECK(watch.windows() == 8);
  CHECK_THROWS_WITH(strategies::staleness_watch("x", {.window_steps = 0}), Catch::Contains("window_steps"));
}
