#include <catch2/catch.hpp>

#include <dtf/detail/messages.hpp>
#include <dtf/optim.hpp>
#include <dtf/optim/device_clip.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/tensor.hpp>

#include "helpers.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

using namespace dtf;
using Catch::Detail::Approx;

namespace {
// Two steps of `r` on p = {1, -2} with gradients g1 then g2; returns p after each step.
std::vector<std::vector<float>> two_steps(optim::rule r, std::vector<float> g1, std::vector<float> g2) {
  tensor p = tensor::from_host<float>({2}, std::vector<float>{1.0f, -2.0f});
  tensor g({2});
  optim::optimizer<> opt(r, 2);
  std::vector<std::vector<float>> out;
  for (auto& gv : {g1, g2}) {
    test::set(g, gv);
    opt.apply(p.span<float>(), g.span<float>());
    out.push_back(test::get(p));
  }
  return out;
}
}  // namespace

TEST_CASE("sgd step is p -= lr g", "[optim]") {
  auto s = two_steps(optim::sgd{.learning_rate = 0.1f}, {0.5f, -1.0f}, {1.0f, 2.0f});
  CHECK(s[0][0] == Approx(0.95f));
  CHECK(s[0][1] == Approx(-1.9f));
  CHECK(s[1][0] == Approx(0.85f));
  CHECK(s[1][1] == Approx(-2.1f));
}

TEST_CASE("momentum accumulates velocity, and nesterov looks ahead", "[optim]") {
  // v1 = g1 = 0.5; p = 1 - 0.1*0.5 = 0.95. v2 = 0.9*0.5 + 1 = 1.45; p = 0.95 - 0.145 = 0.805.
  auto m = two_steps(optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f}, {0.5f, 0.0f}, {1.0f, 0.0f});
  CHECK(m[0][0] == Approx(0.95f));
  CHECK(m[1][0] == Approx(0.805f));
  // Nesterov: p -= lr (g + mu v). Step 1: v = 0.5, p = 1 - 0.1*(0.5 + 0.45) = 0.905.
  // Step 2: v = 1.45, p = 0.905 - 0.1*(1 + 1.305) = 0.6745.
  auto n = two_steps(optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true}, {0.5f, 0.0f},
                     {1.0f, 0.0f});
  CHECK(n[0][0] == Approx(0.905f));
  CHECK(n[1][0] == Approx(0.6745f));
  CHECK(n[1][1] == Approx(-2.0f));
}

TEST_CASE("adagrad divides by the root of accumulated squares", "[optim]") {
  // a = 0.1 + 0.25 = 0.35; p = 1 - 0.1*0.5/(sqrt(0.35)+1e-7).
  // a = 0.35 + 1 = 1.35; p -= 0.1*1/sqrt(1.35).
  auto s = two_steps(optim::adagrad{.learning_rate = 0.1f}, {0.5f, 0.0f}, {1.0f, 0.0f});
  const double p1 = 1.0 - 0.1 * 0.5 / std::sqrt(0.35);
  CHECK(s[0][0] == Approx(p1).epsilon(1e-6));
  CHECK(s[1][0] == Approx(p1 - 0.1 / std::sqrt(1.35)).epsilon(1e-6));
  CHECK(s[1][1] == Approx(-2.0f));  // zero gradient leaves the parameter alone
}

TEST_CASE("adam follows TensorFlow's bias-corrected rate", "[optim]") {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto s = two_steps(optim::adam{.learning_rate = float(lr)}, {0.5f, -3.0f}, {1.0f, 2.0f});
  double m = 0, v = 0, p = 1.0;
  const double g[2] = {0.5, 1.0};
  for (int t = 1; t <= 2; ++t) {
    m = b1 * m + (1 - b1) * g[t - 1];
    v = b2 * v + (1 - b2) * g[t - 1] * g[t - 1];
    const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    p -= lr_t * m / (std::sqrt(v) + eps);
    CHECK(s[t - 1][0] == Approx(p).epsilon(1e-6));
  }
  // The first Adam step moves every coordinate by about lr, whatever the gradient's scale.
  CHECK(s[0][1] == Approx(-2.0 + lr).epsilon(1e-5));
}

TEST_CASE("host_space and device_space optimizers agree", "[optim]") {
  std::vector<float> p0{0.3f, -0.7f, 1.1f}, g{0.2f, 0.4f, -0.6f};
  tensor pd = tensor::from_host<float>({3}, p0), gd = tensor::from_host<float>({3}, g);
  std::vector<float> ph = p0;
  optim::optimizer<optim::device_space> od(optim::adam{.learning_rate = 0.05f}, 3);
  optim::optimizer<optim::host_space> oh(optim::adam{.learning_rate = 0.05f}, 3);
  for (int i = 0; i < 3; ++i) {
    od.apply(pd.span<float>(), gd.span<float>());
    oh.apply(std::span<float>(ph), std::span<const float>(g));
  }
  auto pdv = test::get(pd);
  for (int i = 0; i < 3; ++i) CHECK(pdv[i] == Approx(ph[i]));
  CHECK(od.iterations() == 3);
}

TEST_CASE("optimizer rejects buffers of the wrong size", "[optim]") {
  optim::optimizer<optim::host_space> o(optim::sgd{}, 4);
  std::vector<float> p(3), g(3);
  CHECK_THROWS_WITH(o.apply(std::span<float>(p), std::span<const float>(g)), Catch::Contains("size 4"));
}

TEST_CASE("make_rule names every built-in and rejects others", "[optim]") {
  CHECK(std::holds_alternative<optim::adam>(optim::make_rule("adam", 0.1f)));
  CHECK(std::get<optim::momentum>(optim::make_rule("nesterov", 0.1f)).nesterov);
  CHECK(std::get<optim::sgd>(optim::make_rule("sgd", 0.25f)).learning_rate == 0.25f);
  CHECK_THROWS_WITH(optim::make_rule("rmsprop", 0.1f), Catch::Contains("rmsprop"));
}

TEST_CASE("schedules: piecewise, exponential, linear scaling with warmup", "[optim][schedule]") {
  optim::piecewise_constant pc{{10, 20}, {1.0f, 0.5f, 0.1f}};
  CHECK(pc(0) == 1.0f);
  CHECK(pc(10) == 1.0f);
  CHECK(pc(11) == 0.5f);
  CHECK(pc(21) == 0.1f);
  CHECK_THROWS(optim::piecewise_constant{{10}, {1.0f}}(0));

  optim::exponential_decay ed{.learning_rate = 1.0f, .decay_steps = 10, .decay_rate = 0.5f, .staircase = true};
  CHECK(ed(9) == 1.0f);
  CHECK(ed(10) == 0.5f);
  ed.staircase = false;
  CHECK(ed(5) == Approx(std::sqrt(0.5)));

  // Goyal et al.: k = 8 replicas, base 0.1, warmup over 100 steps, then x0.1 at step 1000.
  optim::linear_scaling_warmup w{.base_rate = 0.1f, .scale = 8.0f, .warmup_steps = 100,
                                 .decay_boundaries = {1000}, .decay_factors = {0.1f}};
  CHECK(w(0) == Approx(0.1));
  CHECK(w(50) == Approx(0.1 + 0.7 * 0.5));
  CHECK(w(100) == Approx(0.8));
  CHECK(w(999) == Approx(0.8));
  CHECK(w(1000) == Approx(0.08));
  optim::linear_scaling_warmup no_warmup{.base_rate = 0.1f, .scale = 4.0f};
  CHECK(no_warmup(0) == Approx(0.4));
}

TEST_CASE("adam's fused pass over a long buffer matches the per-element formula bitwise", "[optim]") {
  // 1003 elements (not a multiple of any vector width), three steps, seeded gradients of
  // mixed scales. Reference: the documented float formula, one element at a time.
  const std::size_t n = 1003;
  const float lr = 0.003f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(double(state >> 40) / double(1ull << 24));
  };
  for (auto& x : p) x = 2 * next() - 1;
  tensor pt = tensor::from_host<float>({n}, p), gt({n});
  optim::optimizer<> opt(optim::adam{.learning_rate = lr, .beta1 = b1, .beta2 = b2, .epsilon = eps}, n);
  for (int t = 1; t <= 3; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = (2 * next() - 1) * (i % 7 == 0 ? 100.0f : 0.01f);
    test::set(gt, g);
    opt.apply(pt.span<float>(), gt.span<const float>());
    const float lr_t = float(lr * std::sqrt(1.0 - std::pow(double(b2), t)) / (1.0 - std::pow(double(b1), t)));
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
    const auto got = test::get(pt);
    std::size_t differ = 0;
#if DTF_CUDA
    // On the GPU nvcc contracts a * b + c into one rounding (FMA) and its sqrt and division
    // round differently from the host's: within 4 units in the last place, not bitwise.
    for (std::size_t i = 0; i < n; ++i)
      differ += std::abs(got[i] - p[i]) > 4 * std::numeric_limits<float>::epsilon() * std::abs(p[i]);
#else
    for (std::size_t i = 0; i < n; ++i) differ += got[i] != p[i];
#endif
    INFO("step " << t);
    CHECK(differ == 0);
  }
}

TEST_CASE("adam's update count: a restore continues bit for bit, and set_iterations moves the rate", "[optim]") {
  // CUDA builds keep the count on the device (the update reads nothing from the host's mirror):
  // a restore must reach it before the next update, and the rate must be that of count + 1.
  const std::size_t n = 5;
  const optim::adam rule{.learning_rate = 0.01f};
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 5; ++t) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = float(0.1 * (int(i) - 2) + 0.03 * t);
    grads.push_back(g);
  }
  tensor p = tensor::from_host<float>({n}, std::vector<float>{0.5f, -0.25f, 1.0f, 0.0f, -2.0f}), g({n});
  optim::optimizer<> continuous(rule, n), restored(rule, n);
  tensor q({n});
  for (int t = 0; t < 5; ++t) {
    if (t == 3) {  // restore the second optimizer from the first's checkpoint after three updates
      const auto slots = continuous.host_slots();
      restored.load_host_slots(slots, continuous.iterations());
      test::set(q, test::get(p));
    }
    test::set(g, grads[std::size_t(t)]);
    continuous.apply(p.span<float>(), g.span<const float>());
    if (t >= 3) restored.apply(q.span<float>(), g.span<const float>());
  }
  CHECK(restored.iterations() == 5);
  CHECK(test::get(q) == test::get(p));

  // After set_iterations(10) the next update is t = 11: against a double reference of that step.
  optim::optimizer<> late(rule, n);
  late.set_iterations(10);
  tensor r = tensor::from_host<float>({n}, std::vector<float>(n, 1.0f));
  test::set(g, grads[0]);
  late.apply(r.span<float>(), g.span<const float>());
  CHECK(late.iterations() == 11);
  const auto got = test::get(r);
  const double lr_t = 0.01 * std::sqrt(1 - std::pow(0.999, 11)) / (1 - std::pow(0.9, 11));
  for (std::size_t i = 0; i < n; ++i) {
    const double gi = grads[0][i], m = 0.1 * gi, v = 0.001 * gi * gi;
    CHECK(got[i] == Approx(1.0 - lr_t * m / (std::sqrt(v) + 1e-8)).epsilon(1e-6));
  }
}

namespace {
// `steps` updates of rule `r` on n seeded parameters with seeded gradients; returns the final
// parameters and, through `p`/`g`, the start values and every step's gradients for a reference.
std::vector<float> run_rule(optim::rule r, std::size_t n, int steps, std::vector<float>& p0,
                            std::vector<std::vector<float>>& gs) {
  std::uint64_t state = 777;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(double(state >> 40) / double(1ull << 24));
  };
  p0.resize(n);
  for (auto& x : p0) x = 4 * next() - 2;
  tensor pt = tensor::from_host<float>({n}, p0), gt({n});
  optim::optimizer<> opt(r, n);
  gs.assign(std::size_t(steps), std::vector<float>(n));
  for (auto& g : gs) {
    for (auto& x : g) x = next() - 0.5f;
    test::set(gt, g);
    opt.apply(pt.span<float>(), gt.span<const float>());
  }
  return test::get(pt);
}
}  // namespace

TEST_CASE("weight decay: L2 for sgd, momentum, adagrad and adam as PyTorch's weight_decay", "[optim]") {
  // Reference in double: PyTorch's g + wd p fed to each rule's own formula.
  const double lr = 0.05, wd = 0.1, mu = 0.9;
  const std::size_t n = 37;  // not a multiple of the vector width
  std::vector<float> p0;
  std::vector<std::vector<float>> gs;
  auto check = [&](const std::vector<float>& got, const std::vector<double>& want) {
    for (std::size_t i = 0; i < n; ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-5).margin(1e-6));
  };
  SECTION("sgd") {
    auto got = run_rule(optim::sgd{.learning_rate = float(lr), .weight_decay = float(wd)}, n, 5, p0, gs);
    std::vector<double> p(p0.begin(), p0.end());
    for (auto& g : gs)
      for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    check(got, p);
  }
  SECTION("momentum and nesterov") {
    for (bool nesterov : {false, true}) {
      auto got = run_rule(optim::momentum{.learning_rate = float(lr), .momentum = float(mu), .nesterov = nesterov,
                                          .weight_decay = float(wd)},
                          n, 5, p0, gs);
      std::vector<double> p(p0.begin(), p0.end()), v(n, 0.0);
      for (auto& g : gs)
        for (std::size_t i = 0; i < n; ++i) {
          const double d = g[i] + wd * p[i];
          v[i] = mu * v[i] + d;
          p[i] -= nesterov ? lr * (d + mu * v[i]) : lr * v[i];
        }
      check(got, p);
    }
  }
  SECTION("adagrad") {
    auto got = run_rule(optim::adagrad{.learning_rate = float(lr), .weight_decay = float(wd)}, n, 5, p0, gs);
    std::vector<double> p(p0.begin(), p0.end()), a(n, 0.1);
    for (auto& g : gs)
      for (std::size_t i = 0; i < n; ++i) {
        const double d = g[i] + wd * p[i];
        a[i] += d * d;
        p[i] -= lr * d / (std::sqrt(a[i]) + 1e-7);
      }
    check(got, p);
  }
  SECTION("adam") {
    auto got = run_rule(optim::adam{.learning_rate = float(lr), .weight_decay = float(wd)}, n, 5, p0, gs);
    std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
    int t = 0;
    for (auto& g : gs) {
      ++t;
      const double lr_t = lr * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
      for (std::size_t i = 0; i < n; ++i) {
        const double d = g[i] + wd * p[i];
        m[i] = 0.9 * m[i] + 0.1 * d;
        v[i] = 0.999 * v[i] + 0.001 * d * d;
        p[i] -= lr_t * m[i] / (std::sqrt(v[i]) + 1e-8);
      }
    }
    check(got, p);
  }
}

TEST_CASE("adamw decays decoupled from the gradient (Loshchilov & Hutter, torch.optim.AdamW)", "[optim]") {
  CHECK(optim::adamw{}.weight_decay == 0.01f);  // PyTorch's default
  CHECK(std::holds_alternative<optim::adamw>(optim::make_rule("adamw", 0.1f)));
  const std::size_t n = 1003;
  std::vector<float> p0;
  std::vector<std::vector<float>> gs;
  const float lr = 0.01f, wd = 0.5f;
  auto got = run_rule(optim::adamw{.learning_rate = lr, .weight_decay = wd}, n, 4, p0, gs);
  // The float formula, element by element: p *= 1 - lr wd, then Adam's step (the fused SSE
  // pass must round alike).
  std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
  const float keep = float(1.0 - double(lr) * double(wd));
  for (int t = 1; t <= 4; ++t) {
    const float lr_t = float(lr * std::sqrt(1.0 - std::pow(double(0.999f), t)) / (1.0 - std::pow(double(0.9f), t)));
    const auto& g = gs[std::size_t(t - 1)];
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = 0.9f * m[i] + (1.0f - 0.9f) * g[i];
      v[i] = 0.999f * v[i] + (1.0f - 0.999f) * g[i] * g[i];
      p[i] *= keep;
      p[i] -= lr_t * m[i] / (std::sqrt(v[i]) + 1e-8f);
    }
  }
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i)
    differ += std::abs(got[i] - p[i]) > (DTF_CUDA ? 4 : 0) * std::numeric_limits<float>::epsilon() * std::abs(p[i]);
  CHECK(differ == 0);
  // The same in double: decay at the rate, unlike adam's L2 (whose decay Adam's scaling undoes).
  std::vector<double> pd(p0.begin(), p0.end()), md(n, 0.0), vd(n, 0.0);
  for (int t = 1; t <= 4; ++t) {
    const double lr_t = lr * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
    for (std::size_t i = 0; i < n; ++i) {
      const double g = gs[std::size_t(t - 1)][i];
      md[i] = 0.9 * md[i] + 0.1 * g;
      vd[i] = 0.999 * vd[i] + 0.001 * g * g;
      pd[i] = pd[i] * (1 - double(lr) * wd) - lr_t * md[i] / (std::sqrt(vd[i]) + 1e-8);
    }
  }
  for (std::size_t i = 0; i < n; i += 97) CHECK(got[i] == Approx(pd[i]).epsilon(1e-5).margin(1e-6));
  // weight_decay 0 is adam bit for bit.
  std::vector<float> q0;
  auto plain = run_rule(optim::adam{.learning_rate = lr}, n, 4, q0, gs);
  auto none = run_rule(optim::adamw{.learning_rate = lr, .weight_decay = 0.0f}, n, 4, q0, gs);
  CHECK(plain == none);
}

TEST_CASE("rules travel to a ps with their weight decay", "[optim]") {
  for (const optim::rule& r : {optim::rule(optim::sgd{.learning_rate = 0.1f, .weight_decay = 1e-4f}),
                               optim::rule(optim::momentum{.learning_rate = 0.1f, .nesterov = true, .weight_decay = 0.2f}),
                               optim::rule(optim::adagrad{.learning_rate = 0.3f, .weight_decay = 0.25f}),
                               optim::rule(optim::adam{.learning_rate = 0.1f, .beta2 = 0.99f, .weight_decay = 0.5f}),
                               optim::rule(optim::adamw{.learning_rate = 0.2f, .beta1 = 0.8f, .weight_decay = 0.05f})}) {
    const auto back = detail::rule_msg::from(r).to_rule();
    CHECK(back.index() == r.index());
    CHECK(ps_detail::describe_rule(back) == ps_detail::describe_rule(r));
    CHECK_THAT(ps_detail::describe_rule(r), Catch::Contains("weight_decay"));
  }
  CHECK(ps_detail::describe_rule(optim::adamw{}) ==
        "adamw (learning_rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-08, weight_decay 0.01)");
}

TEST_CASE("cosine decay with linear warm-up", "[optim][schedule]") {
  const double pi = std::acos(-1.0);
  optim::cosine_decay c{.learning_rate = 0.1f, .decay_steps = 100, .alpha = 0.1f, .warmup_steps = 10,
                        .warmup_from = 0.01f};
  CHECK(c(0) == Approx(0.01));
  CHECK(c(5) == Approx(0.01 + 0.09 * 0.5));
  CHECK(c(10) == Approx(0.1));
  CHECK(c(60) == Approx(0.1 * (0.9 * 0.5 * (1 + std::cos(pi * 0.5)) + 0.1)));
  CHECK(c(110) == Approx(0.01));
  CHECK(c(1000) == Approx(0.01));
  optim::cosine_decay plain{.learning_rate = 1.0f, .decay_steps = 4};
  CHECK(plain(0) == 1.0f);
  CHECK(plain(1) == Approx(0.5 * (1 + std::cos(pi / 4))));
  CHECK(plain(4) == Approx(0.0).margin(1e-7));
  CHECK_THROWS_WITH((optim::cosine_decay{.decay_steps = 0}(3)), Catch::Contains("decay_steps"));
}

TEST_CASE("clip_by_global_norm scales as torch.nn.utils.clip_grad_norm_", "[optim][clip]") {
  std::vector<float> g{3.0f, -4.0f, 0.0f, 12.0f};  // norm 13
  tensor t = tensor::from_host<float>({4}, g);
  CHECK(optim::clip_by_global_norm(t.span<float>(), 26.0f) == Approx(13.0));  // under the bound: unchanged
  CHECK(test::get(t) == g);
  CHECK(optim::clip_by_global_norm(t.span<float>(), 0.0f) == Approx(13.0));  // off
  CHECK(test::get(t) == g);
  CHECK(optim::clip_by_global_norm(t.span<float>(), 1.3f) == Approx(13.0));
  const auto clipped = test::get(t);
  const double coef = 1.3 / (13.0 + 1e-6);
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(clipped[i] == Approx(g[i] * coef));
  CHECK(optim::global_norm(t.span<const float>()) == Approx(1.3).epsilon(1e-6));
  std::vector<float> h = g;
  CHECK(optim::clip_by_global_norm<optim::host_space>(std::span<float>(h), 6.5f) == Approx(13.0));
  CHECK(h[3] == Approx(6.0).epsilon(1e-6));
  CHECK_THROWS_WITH(optim::clip_by_global_norm(t.span<float>(), -1.0f), Catch::Contains("max_norm"));
}

TEST_CASE("device_clip: the norm in a device scalar and the scale from it, clip_by_global_norm's bits",
          "[optim][clip]") {
  // A seeded gradient of 10007 floats (not a multiple of a block), norm about 58.
  std::vector<float> g(10007);
  std::uint64_t s = 12345;
  for (auto& x : g) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = float(std::int64_t(s >> 40) - (std::int64_t(1) << 23)) / float(1 << 23);
  }
  // Independent reference: the sum in long double, the scale as the formula says.
  long double sum = 0;
  for (const float x : g) sum += (long double)x * (long double)x;
  const double want = double(std::sqrt(sum));
  optim::device_clip clip;
  CHECK(clip.norm({}) == 0.0);  // before any apply
  for (const float max_norm : {1.0f, 1e6f, 0.0f}) {
    INFO("max_norm " << max_norm);
    tensor host_t = tensor::from_host<float>({g.size()}, g), dev_t = tensor::from_host<float>({g.size()}, g);
    const double host_norm = optim::clip_by_global_norm(host_t.span<float>(), max_norm);
    clip.apply({}, dev_t.span<float>(), max_norm);
    const double dev_norm = clip.norm({});
    // CPU builds: the same index order, so the same bits (a GPU's block order agrees within rounding).
    if (device_memory_is_host_accessible) {
      CHECK(dev_norm == host_norm);
      CHECK(test::get(dev_t) == test::get(host_t));
    }
    CHECK(dev_norm == Approx(want).epsilon(1e-12));
    const auto out = test::get(dev_t);
    const double coef = double(max_norm) / (want + 1e-6);
    for (std::size_t i = 0; i < g.size(); i += 97)
      CHECK(out[i] == (max_norm > 0.0f && coef < 1.0 ? Approx(double(g[i]) * coef).epsilon(1e-6) : Approx(g[i]).epsilon(0)));
  }
  // A non-finite norm leaves g alone; the norm reports it. A bad bound names max_norm.
  std::vector<float> bad{1.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f};
  tensor b = tensor::from_host<float>({3}, bad);
  clip.apply({}, b.span<float>(), 0.5f);
  CHECK(std::isnan(clip.norm({})));
  const auto kept = test::get(b);
  CHECK((kept[0] == 1.0f && std::isnan(kept[1]) && kept[2] == 3.0f));
  bad[1] = std::numeric_limits<float>::infinity();
  test::set(b, bad);
  clip.apply({}, b.span<float>(), 0.5f);
  CHECK(std::isinf(clip.norm({})));
  CHECK(test::get(b)[0] == 1.0f);
  CHECK_THROWS_WITH(clip.apply({}, b.span<float>(), -1.0f), Catch::Contains("max_norm"));
  CHECK_THROWS_WITH(clip.apply({}, b.span<float>(), std::numeric_limits<float>::quiet_NaN()), Catch::Contains("max_norm"));
}

TEST_CASE("a rate read from memory (set_rate_source) gives the rate argument's parameters bitwise", "[optim][schedule]") {
  // The graph's update (docs/design/gpu-execution.md, section 7) reads each step's rate from a
  // float written before its launch; the reference passes the schedule's rate as the argument.
  const std::function<float(std::int64_t)> schedule = optim::cosine_decay{.learning_rate = 0.05f, .decay_steps = 5, .warmup_steps = 2};
  const std::vector<optim::rule> rules{optim::sgd{.learning_rate = 0.1f, .weight_decay = 0.01f},
                                       optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true},
                                       optim::adagrad{.learning_rate = 0.1f},
                                       optim::adam{.learning_rate = 0.1f},
                                       optim::adamw{.learning_rate = 0.1f, .weight_decay = 0.3f}};
  const std::size_t n = 37;
  for (const auto& r : rules) {
    std::vector<float> p0(n), g(n);
    for (std::size_t i = 0; i < n; ++i) p0[i] = float(int(i * 13 % 17) - 8) / 7.0f;
    tensor expected = tensor::from_host<float>({n}, p0), got = tensor::from_host<float>({n}, p0), gt({n}), rate({1});
    optim::optimizer<> reference(r, n), from_memory(r, n);
    from_memory.set_rate_source(rate.data<float>());
    CHECK(from_memory.rate_source() == rate.data<float>());
    for (std::int64_t step = 0; step < 6; ++step) {
      for (std::size_t i = 0; i < n; ++i) g[i] = float(int((i + 3 * std::size_t(step)) * 7 % 11) - 5) / 3.0f;
      test::set(gt, g);
      reference.apply(expected.span<float>(), gt.span<const float>(), schedule(step));
      test::set(rate, {schedule(step)});
      from_memory.apply(got.span<float>(), gt.span<const float>(), 123.0f);  // the argument is ignored
    }
    INFO(from_memory.rule_name());
    CHECK(test::get(got) == test::get(expected));
    CHECK(from_memory.iterations() == reference.iterations());
  }
}
