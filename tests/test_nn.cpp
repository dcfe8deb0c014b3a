#include <catch2/catch.hpp>

#include <dtf/nn.hpp>
#include <dtf/optim.hpp>
#include <dtf/train/trusted_labels.hpp>

#include "helpers.hpp"

#include <cmath>

using namespace dtf;
using Catch::Detail::Approx;

namespace {

// A batch of `rows` rows of `features` seeded values in [-1, 1] and labels in [0, classes).
std::pair<tensor, tensor> make_batch(std::size_t rows, std::size_t features, std::size_t classes, std::uint64_t seed) {
  nn::splitmix64 rng(seed);
  std::vector<float> x(rows * features);
  for (auto& v : x) v = float(2 * rng.uniform() - 1);
  std::vector<std::int32_t> y(rows);
  for (auto& v : y) v = std::int32_t(rng() % classes);
  return {tensor::from_host<float>({rows, features}, x), tensor::from_host<std::int32_t>({rows}, y)};
}

// Compares the model's analytic gradient with central differences of its loss, in double
// steps on float32 parameters. Returns the largest error over all parameters in units of the
// tolerance 5e-4 + 1e-2 |numeric| (float32 round-off in the loss is about 1e-7 / h), so a
// result below 1 passes.
template <class Net>
double max_gradient_error(Net& net, const tensor& x, const tensor& y, std::uint64_t seed) {
  const std::size_t n = net.num_parameters();
  tensor p({n}), g({n});
  net.initialize(p.span<float>(), seed);
  // Non-zero biases so that the bias gradient path is exercised too.
  auto pv = test::get(p);
  nn::splitmix64 rng(seed + 1);
  for (auto& v : pv) v += float(0.1 * (2 * rng.uniform() - 1));
  test::set(p, pv);
  net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
  const auto gv = test::get(g);
  double worst = 0.0;
  const float h = 1e-3f;
  for (std::size_t i = 0; i < n; ++i) {
    auto q = pv;
    q[i] = pv[i] + h;
    test::set(p, q);
    const double up = net.loss(p.span<float>(), x, y);
    q[i] = pv[i] - h;
    test::set(p, q);
    const double down = net.loss(p.span<float>(), x, y);
    const double numeric = (up - down) / (2.0 * h);
    const double err = std::abs(numeric - gv[i]) / (5e-4 + 1e-2 * std::abs(numeric));
    worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace

TEST_CASE("dense layer gradient matches finite differences", "[nn][gradcheck]") {
  nn::sequential net{nn::dense(5, 3)};
  auto [x, y] = make_batch(4, 5, 3, 1);
  CHECK(max_gradient_error(net, x, y, 7) < 1.0);
}

TEST_CASE("relu between dense layers: gradient matches finite differences", "[nn][gradcheck]") {
  nn::sequential net{nn::dense(6, 8), nn::relu(), nn::dense(8, 4)};
  auto [x, y] = make_batch(5, 6, 4, 2);
  CHECK(max_gradient_error(net, x, y, 11) < 1.0);
}

TEST_CASE("deep MLP gradient matches finite differences", "[nn][gradcheck]") {
  nn::sequential net{nn::dense(7, 6), nn::relu(), nn::dense(6, 5), nn::relu(), nn::dense(5, 3)};
  auto [x, y] = make_batch(6, 7, 3, 3);
  CHECK(max_gradient_error(net, x, y, 5) < 1.0);
}

TEST_CASE("softmax cross-entropy: value and gradient", "[nn][loss]") {
  // Row 0: logits (1, 2, 3), label 2: loss = log(e^1+e^2+e^3) - 3.
  // Row 1: logits (0, 0, 0), label 0: loss = log 3.
  auto logits = tensor::from_host<float>({2, 3}, std::vector<float>{1, 2, 3, 0, 0, 0});
  auto labels = tensor::from_host<std::int32_t>({2}, std::vector<std::int32_t>{2, 0});
  nn::softmax_cross_entropy xent;
  tensor grad;
  const float loss = xent(logits, labels, &grad);
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  CHECK(loss == Approx((l0 + std::log(3.0)) / 2));
  const auto g = test::get(grad);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  CHECK(g[0] == Approx(std::exp(1.0) / z / 2));
  CHECK(g[2] == Approx((std::exp(3.0) / z - 1) / 2));
  CHECK(g[3] == Approx((1.0 / 3 - 1) / 2));
  CHECK(g[4] == Approx(1.0 / 3 / 2));
  // Large logits do not overflow.
  auto big = tensor::from_host<float>({1, 2}, std::vector<float>{1000.0f, 0.0f});
  auto lab = tensor::from_host<std::int32_t>({1}, std::vector<std::int32_t>{0});
  CHECK(xent(big, lab, nullptr) == Approx(0.0).margin(1e-6));
}

TEST_CASE("softmax cross-entropy gradient matches finite differences of the logits", "[nn][loss][gradcheck]") {
  std::vector<float> z{0.3f, -1.2f, 2.0f, 0.1f, 0.5f, 0.5f, -0.4f, 1.7f};
  auto labels = tensor::from_host<std::int32_t>({2}, std::vector<std::int32_t>{3, 0});
  nn::softmax_cross_entropy xent;
  tensor logits = tensor::from_host<float>({2, 4}, z), grad;
  xent(logits, labels, &grad);
  const auto g = test::get(grad);
  for (std::size_t i = 0; i < z.size(); ++i) {
    auto q = z;
    q[i] += 1e-2f;
    test::set(logits, q);
    const double up = xent(logits, labels, nullptr);
    q[i] -= 2e-2f;
    test::set(logits, q);
    const double down = xent(logits, labels, nullptr);
    CHECK(g[i] == Approx((up - down) / 2e-2).margin(2e-4));
  }
}

TEST_CASE("labels out of range are named", "[nn][loss][errors]") {
  auto logits = tensor::from_host<float>({3, 4}, std::vector<float>(12, 0.0f));
  auto labels = tensor::from_host<std::int32_t>({3}, std::vector<std::int32_t>{1, 9, 2});
  nn::softmax_cross_entropy xent;
  CHECK_THROWS_WITH(xent(logits, labels, nullptr), Catch::Contains("label 9 at row 1") && Catch::Contains("[0, 4)"));
  auto negative = tensor::from_host<std::int32_t>({3}, std::vector<std::int32_t>{0, 0, -1});
  CHECK_THROWS_WITH(xent(logits, negative, nullptr), Catch::Contains("label -1 at row 2"));
  auto short_labels = tensor::from_host<std::int32_t>({2}, std::vector<std::int32_t>{0, 0});
  CHECK_THROWS_WITH(xent(logits, short_labels, nullptr), Catch::Contains("2 labels for 3 rows"));
}

TEST_CASE("layers that do not chain are refused at construction", "[nn][errors]") {
  CHECK_THROWS_WITH((nn::sequential{nn::dense(784, 256), nn::relu(), nn::dense(128, 10)}),
                    Catch::Contains("layer 2") && Catch::Contains("expects 128") && Catch::Contains("produce 256"));
  CHECK_THROWS_WITH((nn::sequential{nn::relu(), nn::dense(4, 2)}), Catch::Contains("layer 0"));
  CHECK_THROWS_WITH((nn::sequential{nn::dense(4, 2), nn::relu()}), Catch::Contains("last layer must be dense"));
  CHECK_THROWS_WITH(nn::dense(0, 3), Catch::Contains("positive"));
}

TEST_CASE("input width and buffer sizes are checked", "[nn][errors]") {
  nn::sequential net{nn::dense(4, 3)};
  tensor p({net.num_parameters()}), g({net.num_parameters()}), small({5});
  auto [x, y] = make_batch(2, 5, 3, 1);
  CHECK_THROWS_WITH(net.loss_and_gradients(p.span<float>(), x, y, g.span<float>()),
                    Catch::Contains("5 features") && Catch::Contains("expects 4"));
  auto [x4, y4] = make_batch(2, 4, 3, 1);
  CHECK_THROWS_WITH(net.loss_and_gradients(small.span<float>(), x4, y4, g.span<float>()),
                    Catch::Contains("parameter buffer has 5 floats"));
}

TEST_CASE("variables are named, shaped and laid out in order", "[nn]") {
  nn::sequential net{nn::dense(784, 256), nn::relu(), nn::dense(256, 10)};
  const auto vars = net.variables();
  REQUIRE(vars.size() == 4);
  CHECK(vars[0].name == "dense_0/kernel");
  CHECK(vars[0].shape == dims{784, 256});
  CHECK(vars[1].name == "dense_0/bias");
  CHECK(vars[1].offset == 784 * 256);
  CHECK(vars[3].name == "dense_1/bias");
  CHECK(vars[3].offset + vars[3].size() == net.num_parameters());
  CHECK(num_parameters(vars) == net.num_parameters());
}

TEST_CASE("initialisation is seeded and follows He and Glorot scales", "[nn][init]") {
  nn::sequential net{nn::dense(400, 300), nn::relu(), nn::dense(300, 100)};
  tensor a({net.num_parameters()}), b({net.num_parameters()}), c({net.num_parameters()});
  net.initialize(a.span<float>(), 1);
  net.initialize(b.span<float>(), 1);
  net.initialize(c.span<float>(), 2);
  const auto av = test::get(a), bv = test::get(b), cv = test::get(c);
  CHECK(av == bv);
  CHECK(av != cv);
  // Layer 0 is followed by ReLU: He normal, std sqrt(2/400).
  double sum = 0, sq = 0;
  for (std::size_t i = 0; i < 400 * 300; ++i) sum += av[i], sq += double(av[i]) * av[i];
  const double mean = sum / (400 * 300), stddev = std::sqrt(sq / (400 * 300) - mean * mean);
  CHECK(mean == Approx(0.0).margin(2e-3));
  CHECK(stddev == Approx(std::sqrt(2.0 / 400)).epsilon(0.02));
  // Biases start at zero.
  for (std::size_t i = 400 * 300; i < 400 * 300 + 300; ++i) CHECK(av[i] == 0.0f);
  // Layer 1 is last: Glorot uniform within sqrt(6/(300+100)).
  const std::size_t off = 400 * 300 + 300;
  float lo = 0, hi = 0;
  for (std::size_t i = off; i < off + 300 * 100; ++i) lo = std::min(lo, av[i]), hi = std::max(hi, av[i]);
  const float limit = float(std::sqrt(6.0 / 400));
  CHECK(hi <= limit);
  CHECK(lo >= -limit);
  CHECK(hi > 0.9f * limit);
}

TEST_CASE("an MLP learns a separable problem", "[nn][train]") {
  // Class = which of 3 coordinates is largest: learnable, not linearly trivial at init.
  nn::splitmix64 rng(3);
  const std::size_t rows = 256;
  std::vector<float> xv(rows * 3);
  std::vector<std::int32_t> yv(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    for (int c = 0; c < 3; ++c) xv[r * 3 + c] = float(rng.uniform());
    yv[r] = std::int32_t(std::max_element(&xv[r * 3], &xv[r * 3] + 3) - &xv[r * 3]);
  }
  auto x = tensor::from_host<float>({rows, 3}, xv);
  auto y = tensor::from_host<std::int32_t>({rows}, yv);
  nn::sequential net{nn::dense(3, 32), nn::relu(), nn::dense(32, 3)};
  tensor p({net.num_parameters()}), g({net.num_parameters()});
  net.initialize(p.span<float>(), 9);
  optim::optimizer<> opt(optim::adam{.learning_rate = 0.02f}, net.num_parameters());
  const float first = net.loss(p.span<float>(), x, y);
  for (int i = 0; i < 300; ++i) {
    net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
    opt.apply(p.span<float>(), g.span<float>());
  }
  CHECK(net.loss(p.span<float>(), x, y) < 0.25f * first);
  tensor logits;
  net.logits(p.span<float>(), x, logits);
  CHECK(nn::count_correct(logits, y) > rows * 9 / 10);
}

// A user's own model: linear softmax regression written without nn::sequential. It asks
// for exactly what dtf::model requires, so it doubles as the concept's archetype.
namespace {
struct linear_regression_model {
  std::size_t in = 2;
  std::vector<variable_spec> variables() const { return {{"w", {in}, 0}, {"b", {1}, in}}; }
  void initialize(std::span<float> p, std::uint64_t) const {
    thrust::fill(thrust::device_pointer_cast(p.data()), thrust::device_pointer_cast(p.data() + p.size()), 0.0f);
  }
  // Squared error of w.x + b against the label value, computed on the host.
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g) {
    const auto xs = x.to_vector<float>();
    const auto ys = y.to_vector<std::int32_t>();
    std::vector<float> pv(p.size()), gv(p.size(), 0.0f);
    thrust::copy(thrust::device_pointer_cast(p.data()), thrust::device_pointer_cast(p.data() + p.size()), pv.begin());
    float loss = 0;
    const std::size_t rows = ys.size();
    for (std::size_t r = 0; r < rows; ++r) {
      float pred = pv[in];
      for (std::size_t c = 0; c < in; ++c) pred += pv[c] * xs[r * in + c];
      const float e = pred - float(ys[r]);
      loss += e * e / float(rows);
      for (std::size_t c = 0; c < in; ++c) gv[c] += 2 * e * xs[r * in + c] / float(rows);
      gv[in] += 2 * e / float(rows);
    }
    thrust::copy(gv.begin(), gv.end(), thrust::device_pointer_cast(g.data()));
    return loss;
  }
};
static_assert(model<linear_regression_model>);
static_assert(!classifier<linear_regression_model>);
}  // namespace

TEST_CASE("a user-defined model trains through dtf::optim", "[nn][concept]") {
  linear_regression_model m;
  // y = 2 x0 + 1 x1 (integer labels).
  auto x = tensor::from_host<float>({4, 2}, std::vector<float>{0, 0, 1, 0, 0, 1, 1, 1});
  auto y = tensor::from_host<std::int32_t>({4}, std::vector<std::int32_t>{0, 2, 1, 3});
  tensor p({3}), g({3});
  m.initialize(p.span<float>(), 0);
  optim::optimizer<> opt(optim::sgd{.learning_rate = 0.2f}, 3);
  for (int i = 0; i < 500; ++i) {
    m.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
    opt.apply(p.span<float>(), g.span<float>());
  }
  const auto pv = test::get(p);
  CHECK(pv[0] == Approx(2.0).margin(1e-3));
  CHECK(pv[1] == Approx(1.0).margin(1e-3));
  CHECK(pv[2] == Approx(0.0).margin(1e-3));
}

namespace {
// Independent reference: forward and backward of dense/relu stacks in double on the host,
// with the layers taken one at a time (no fusion). spec lists the layers: a positive value is
// a Dense layer's output width, 0 a ReLU.
struct host_mlp {
  std::vector<int> spec;
  std::size_t in;
  // Returns the mean loss and writes the gradient (same flat layout as nn::sequential).
  double loss_and_gradients(const std::vector<float>& p, const std::vector<float>& x, const std::vector<std::int32_t>& y,
                            std::size_t rows, std::vector<double>& g) const {
    std::vector<std::vector<double>> acts{std::vector<double>(x.begin(), x.end())};
    std::vector<std::size_t> widths{in}, offsets;
    std::size_t off = 0;
    for (int s : spec) {
      const auto& a = acts.back();
      const std::size_t w = widths.back();
      offsets.push_back(off);
      if (s > 0) {
        const std::size_t o = std::size_t(s);
        std::vector<double> out(rows * o);
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t j = 0; j < o; ++j) {
            double v = p[off + w * o + j];
            for (std::size_t k = 0; k < w; ++k) v += a[r * w + k] * double(p[off + k * o + j]);
            out[r * o + j] = v;
          }
        off += w * o + o;
        acts.push_back(out);
        widths.push_back(o);
      } else {
        std::vector<double> out(a.size());
        for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] > 0 ? a[i] : 0;
        acts.push_back(out);
        widths.push_back(w);
      }
    }
    const std::size_t classes = widths.back();
    std::vector<double> d(rows * classes);
    double loss = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const double* z = &acts.back()[r * classes];
      double m = z[0], sum = 0;
      for (std::size_t c = 1; c < classes; ++c) m = std::max(m, z[c]);
      for (std::size_t c = 0; c < classes; ++c) sum += std::exp(z[c] - m);
      loss += std::log(sum) + m - z[y[r]];
      for (std::size_t c = 0; c < classes; ++c)
        d[r * classes + c] = (std::exp(z[c] - m) / sum - (int(c) == y[r] ? 1.0 : 0.0)) / double(rows);
    }
    g.assign(off, 0.0);
    for (std::size_t l = spec.size(); l-- > 0;) {
      const auto& a = acts[l];
      const std::size_t w = widths[l];
      if (spec[l] > 0) {
        const std::size_t o = std::size_t(spec[l]);
        std::vector<double> dx(rows * w, 0.0);
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t j = 0; j < o; ++j) {
            const double dv = d[r * o + j];
            g[offsets[l] + w * o + j] += dv;
            for (std::size_t k = 0; k < w; ++k) {
              g[offsets[l] + k * o + j] += a[r * w + k] * dv;
              dx[r * w + k] += dv * double(p[offsets[l] + k * o + j]);
            }
          }
        d = dx;
      } else {
        for (std::size_t i = 0; i < d.size(); ++i) d[i] = acts[l + 1][i] > 0 ? d[i] : 0;
      }
    }
    return loss / double(rows);
  }
};
}  // namespace

TEST_CASE("fused dense+relu step matches an independent layer-by-layer reference", "[nn][fused]") {
  // Dense+ReLU pairs are fused (bias and ReLU in one pass, mask and bias gradient in one
  // pass); a ReLU after a ReLU is not. Both must give the reference's loss and gradient.
  nn::sequential net{nn::dense(13, 11), nn::relu(), nn::dense(11, 9), nn::relu(), nn::relu(), nn::dense(9, 4)};
  const host_mlp ref{{11, 0, 9, 0, 0, 4}, 13};
  for (std::size_t rows : {1, 7, 33}) {
    auto [x, y] = make_batch(rows, 13, 4, 40 + rows);
    tensor p({net.num_parameters()}), g({net.num_parameters()});
    net.initialize(p.span<float>(), 5);
    auto pv = test::get(p);
    nn::splitmix64 rng(9);
    for (auto& v : pv) v += float(0.2 * (2 * rng.uniform() - 1));  // non-zero biases
    test::set(p, pv);
    // Two steps on the same instance: buffers reused from the first must not leak into the second.
    for (int step = 0; step < 2; ++step) {
      const float loss = net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
      std::vector<double> gref;
      const double lref = ref.loss_and_gradients(pv, test::get(x), y.to_vector<std::int32_t>(), rows, gref);
      CHECK(loss == Approx(lref).epsilon(1e-5));
      const auto gv = test::get(g);
      REQUIRE(gv.size() == gref.size());
      for (std::size_t i = 0; i < gv.size(); ++i) {
        INFO("rows " << rows << " parameter " << i);
        REQUIRE(std::abs(gv[i] - gref[i]) <= 1e-5 + 1e-4 * std::abs(gref[i]));
      }
    }
  }
}

#if DTF_CUDA
TEST_CASE("nn::sequential on a CUDA build refuses host memory as parameters, naming the buffer", "[nn][errors]") {
  nn::sequential net{nn::dense(3, 2)};
  std::vector<float> host_p(net.num_parameters()), host_g(net.num_parameters());
  tensor p({net.num_parameters()}), g({net.num_parameters()});
  tensor x = tensor::from_host<float>({1, 3}, std::vector<float>{1, 2, 3});
  tensor y = tensor::from_host<std::int32_t>({1}, std::vector<std::int32_t>{1});
  CHECK_THROWS_WITH(net.initialize(host_p, 1),
                    Catch::Contains("nn::sequential: the parameter buffer is host memory"));
  net.initialize(p.span<float>(), 1);
  CHECK_THROWS_WITH(net.loss_and_gradients(p.span<float>(), x, y, host_g),
                    Catch::Contains("the gradient buffer is host memory"));
  // The device context is still usable: the refused calls launched nothing.
  CHECK(std::isfinite(net.loss_and_gradients(p.span<float>(), x, y, g.span<float>())));
}

TEST_CASE("cuBLASLt epilogues on a context match the cuBLAS path", "[nn][fused][gpu]") {
  // dense 0 + ReLU feeds dense 2: RELU_AUX_BIAS forward (130 outputs: a mask of 2 x 128 bits per
  // row), its mask and bias gradient applied by dense 2's input-gradient matmul (DRELU_BGRAD);
  // dense 2 + ReLU is followed by another ReLU: RELU_BIAS forward, the mask kernel, BGRADA;
  // dense 5 alone: BIAS forward, BGRADA. Where cuBLASLt has no algorithm the layer stays on the
  // cuBLAS path, so the comparison holds either way; the count says how many matmuls fused.
  // Not bit for bit: cuBLASLt may pick another GEMM algorithm (k-order, split-K) than
  // cublasSgemm, and the bias gradient is summed in the epilogue instead of by a GEMV over ones,
  // so the float sums associate differently: within 1e-5 + 1e-4 |cuBLAS| (sums of at most 130
  // products of O(1) terms, each path within a few float ulps of the exact sum). Batches of at
  // most 64 rows keep a pre-activation within rounding of 0 (which the two paths could mask
  // differently) unlikely.
  const std::vector<nn::layer> layers{nn::dense(13, 130), nn::relu(), nn::dense(130, 9),
                                      nn::relu(),         nn::relu(), nn::dense(9, 4)};
  nn::sequential fused(layers), plain(layers);
  device::context ctx;
  fused.set_context(ctx);
  const std::size_t n = fused.num_parameters();
  tensor p({n});
  fused.initialize(p.span<float>(), 5);
  auto pv = test::get(p);
  nn::splitmix64 rng(9);
  for (auto& v : pv) v += float(0.2 * (2 * rng.uniform() - 1));  // non-zero biases
  test::set(p, pv);
  // A shape change and back: the plans of 64 rows are reused the second time.
  for (std::size_t rows : {7, 64, 33, 64}) {
    auto [x, y] = make_batch(rows, 13, 4, 70 + rows);
    tensor gf({n}), gp({n}), dxf, dxp;
    const float lf = fused.loss_and_gradients(p.span<float>(), x, y, gf.span<float>(), &dxf);
    const float lp = plain.loss_and_gradients(p.span<float>(), x, y, gp.span<float>(), &dxp);
    ctx.synchronize();  // the fused step ran on the context's non-blocking stream
    INFO("rows " << rows);
    CHECK(lf == Approx(lp).epsilon(1e-5));
    const auto a = test::get(gf), b = test::get(gp);
    for (std::size_t i = 0; i < n; ++i) {
      INFO("parameter " << i);
      REQUIRE(std::abs(a[i] - b[i]) <= 1e-5 + 1e-4 * std::abs(b[i]));
    }
    const auto da = test::get(dxf), db = test::get(dxp);
    REQUIRE(da.size() == rows * 13);
    REQUIRE(db.size() == da.size());
    for (std::size_t i = 0; i < da.size(); ++i) {
      INFO("input gradient " << i);
      REQUIRE(std::abs(da[i] - db[i]) <= 1e-5 + 1e-4 * std::abs(db[i]));
    }
  }
  CHECK(plain.epilogue_matmuls() == 0);
  // At most 6 per step (3 forward, 2 BGRADA, 1 DRELU_BGRAD); which ones cuBLASLt takes in FP32
  // depends on the GPU and library, so only "some" is required (none would mean the path is dead).
  WARN("cuBLASLt matmuls issued: " << fused.epilogue_matmuls() << " of at most " << 4 * 6);
  CHECK(fused.epilogue_matmuls() > 0);
}
#endif

namespace {
// The float at a device address (host memory on CPU builds).
float read_device_float(const float* p) {
  float v = 0;
  thrust::copy(thrust::device_pointer_cast(p), thrust::device_pointer_cast(p) + 1, &v);
  return v;
}

// Softmax cross-entropy in double, row by row: the mean loss and d loss / d logits.
double xent_reference(const std::vector<float>& z, const std::vector<std::int32_t>& y, std::size_t classes,
                      std::vector<double>& grad) {
  const std::size_t rows = y.size();
  grad.assign(z.size(), 0.0);
  double total = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double m = z[r * classes];
    for (std::size_t c = 0; c < classes; ++c) m = std::max(m, double(z[r * classes + c]));
    double sum = 0;
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(double(z[r * classes + c]) - m);
    total += std::log(sum) + m - z[r * classes + std::size_t(y[r])];
    for (std::size_t c = 0; c < classes; ++c)
      grad[r * classes + c] =
          (std::exp(double(z[r * classes + c]) - m) / sum - (std::int32_t(c) == y[r] ? 1.0 : 0.0)) / double(rows);
  }
  return total / double(rows);
}
}  // namespace

TEST_CASE("fused softmax cross-entropy: the mean stays on the device and matches a double reference", "[nn][loss][fused]") {
  nn::softmax_cross_entropy xent;
  const float* slot = nullptr;
  // 513 rows: more rows than the reduction's block has threads, so each thread sums several.
  for (std::size_t rows : {1, 7, 300, 513, 64}) {
    const std::size_t classes = 10;
    auto [logits, labels] = make_batch(rows, classes, classes, 70 + rows);
    std::vector<float> z = test::get(logits);
    for (auto& v : z) v *= 4.0f;  // confident rows as well as flat ones
    test::set(logits, z);
    tensor g_enq, g_op;
    xent.enqueue(logits, labels, &g_enq, nn::label_check::trusted);
    if (!slot) slot = xent.device_loss();
    CHECK(xent.device_loss() == slot);  // one scalar, kept as the batch grows and shrinks
    const float on_device = read_device_float(xent.device_loss());
    CHECK(xent.read_loss() == on_device);
    const float value = xent(logits, labels, &g_op);
    CHECK(value == on_device);  // the same kernels whether the labels are checked or trusted
    CHECK(test::get(g_enq) == test::get(g_op));
    std::vector<double> gref;
    const double ref = xent_reference(z, labels.to_vector<std::int32_t>(), classes, gref);
    INFO("rows " << rows);
    CHECK(value == Approx(ref).epsilon(1e-5));
    const auto g = test::get(g_op);
    REQUIRE(g.size() == gref.size());
    for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(std::abs(g[i] - gref[i]) <= 1e-7 + 1e-5 * std::abs(gref[i]));
  }
  // No rows: the mean is 0.
  tensor none_z({0, 4}), none_y({0}, dtype::int32);
  xent.enqueue(none_z, none_y, nullptr);
  CHECK(read_device_float(xent.device_loss()) == 0.0f);
}

TEST_CASE("trusted labels skip the check but never index with a bad label", "[nn][loss][errors]") {
  auto logits = tensor::from_host<float>({3, 4}, std::vector<float>{0.5f, 1, -1, 2, 0, 0, 0, 0, 3, 1, 2, 0});
  auto bad = tensor::from_host<std::int32_t>({3}, std::vector<std::int32_t>{1, 9, 2});
  auto good = tensor::from_host<std::int32_t>({3}, std::vector<std::int32_t>{1, 3, 2});
  nn::softmax_cross_entropy xent;
  CHECK_THROWS_WITH(xent.enqueue(logits, bad, nullptr), Catch::Contains("label 9 at row 1"));
  tensor g_bad, g_good;
  xent.enqueue(logits, bad, &g_bad, nn::label_check::trusted);
  CHECK(std::isnan(xent.read_loss()));  // the NaN hooks see it
  xent.enqueue(logits, good, &g_good, nn::label_check::trusted);
  CHECK(std::isfinite(xent.read_loss()));
  const auto gb = test::get(g_bad), gg = test::get(g_good);
  for (std::size_t i = 0; i < 12; ++i) {
    INFO("gradient " << i);
    if (i / 4 == 1)
      CHECK(std::isnan(gb[i]));
    else
      CHECK(gb[i] == gg[i]);  // the other rows as with good labels
  }
  // The type and count of the labels are still checked (host metadata).
  auto short_labels = tensor::from_host<std::int32_t>({2}, std::vector<std::int32_t>{0, 0});
  CHECK_THROWS_WITH(xent.enqueue(logits, short_labels, nullptr, nn::label_check::trusted),
                    Catch::Contains("2 labels for 3 rows"));
  tensor float_labels({3});
  CHECK_THROWS_AS(xent.enqueue(logits, float_labels, nullptr, nn::label_check::trusted), dtf::error);
}

TEST_CASE("nn::sequential with trusted labels gives the checked path's loss and gradients bit for bit", "[nn][loss]") {
  nn::sequential checked{nn::dense(6, 5), nn::relu(), nn::dense(5, 3)}, trusted = checked;
  trusted.set_label_check(nn::label_check::trusted);
  auto [x, y] = make_batch(9, 6, 3, 12);
  tensor p({checked.num_parameters()}), g1({checked.num_parameters()}), g2({checked.num_parameters()});
  checked.initialize(p.span<float>(), 3);
  const float l1 = checked.loss_and_gradients(p.span<float>(), x, y, g1.span<float>());
  std::vector<std::size_t> reported;
  const float l2 = trusted.loss_and_gradients(p.span<float>(), x, y, g2.span<float>(),
                                              gradient_ready_fn([&](std::size_t first, std::size_t) { reported.push_back(first); }));
  CHECK(l1 == l2);
  CHECK(read_device_float(trusted.device_loss()) == l2);
  CHECK(test::get(g1) == test::get(g2));
  CHECK(reported == std::vector<std::size_t>{5 * 6 + 5, 0});  // last layer first
}

TEST_CASE("training from a device shard trusts a sequential's labels for the run only", "[nn][loss]") {
  nn::sequential net{nn::dense(4, 3)};
  CHECK(dtf::detail::labels_checked_at_upload<nn::sequential>::classes(net) == 3);  // what the shard checks
  {
    dtf::detail::labels_checked_at_upload<nn::sequential> scope(net);
    CHECK(net.label_check_mode() == nn::label_check::trusted);
  }
  CHECK(net.label_check_mode() == nn::label_check::verify);  // the model's own setting again
  // A model without the switch: nothing checked at upload, nothing changed.
  struct plain {};
  plain p;
  CHECK(dtf::detail::labels_checked_at_upload<plain>::classes(p) == 0);
  dtf::detail::labels_checked_at_upload<plain> none(p);
}
