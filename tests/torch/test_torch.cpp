// dtf::libtorch::module_model (include/dtf/torch/module_model.hpp) against independent references:
// dtf::nn::sequential's hand-written backprop with the same weights (loss, gradients, and the
// same training under every strategy), one process at the combined batch for ring-allreduce,
// and the streaming contract counted float by float. Built only where LibTorch is found.
#include <dtf/nn.hpp>
#include <dtf/torch/module_model.hpp>

#include <catch2/catch.hpp>

#include "../train_helpers.hpp"
#include "twin.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <sstream>
#include <vector>

namespace {

using dtf::tensor;
using dtf::libtorch::module_model;
using dtf::test::distinct_trainable;
using dtf::test::flat;
using dtf::test::relayout;
using dtf::test::small_net_init;
using dtf::test::torch_small_net;
namespace tnn = torch::nn;

struct batch_tensors {
  tensor x, y;
};
batch_tensors first_batch(std::size_t n, std::uint64_t seed) {
  const auto data = dtf::test::synthetic(n, seed, dtf::test::labels::argmax).batch(n);
  auto b = *data.stream().next();
  batch_tensors t;
  dtf::assign_from_host(t.x, b.features);
  dtf::assign_from_host(t.y, b.labels);
  return t;
}

/// A module with a branch the forward never takes.
struct BranchyImpl : tnn::Cloneable<BranchyImpl> {
  BranchyImpl() { reset(); }
  void reset() override {
    a = register_module("a", tnn::Linear(8, 16));
    unused = register_module("unused", tnn::Linear(8, 4));
    b = register_module("b", tnn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return b(torch::relu(a(x))); }
  tnn::Linear a{nullptr}, unused{nullptr}, b{nullptr};
};
TORCH_MODULE(Branchy);


/// Linear(8, 8) used twice, then Linear(8, 3), seeded: LibTorch's C++ named_parameters() lists
/// the tied layer's weight and bias twice (171 floats).
tnn::Sequential tied_net() {
  torch::manual_seed(11);
  tnn::Linear l(8, 8);
  return tnn::Sequential(l, tnn::ReLU(), l, tnn::Linear(8, 3));
}

/// Linear(8, 8) with every value `value` and frozen (requires_grad false), ReLU, Linear(8, 3).
tnn::Sequential frozen_net(float value) {
  torch::manual_seed(12);
  tnn::Linear f(8, 8);
  {
    torch::NoGradGuard no_grad;
    f->weight.fill_(value);
    f->bias.fill_(value);
  }
  f->weight.requires_grad_(false);
  f->bias.requires_grad_(false);
  return tnn::Sequential(f, tnn::ReLU(), tnn::Linear(8, 3));
}

torch::Tensor torch_x(const tensor& x) {
  return torch::from_blob(const_cast<float*>(x.data<float>()), {std::int64_t(x.dim(0)), std::int64_t(x.dim(1))});
}
torch::Tensor torch_y(const tensor& y) {
  return torch::from_blob(const_cast<std::int32_t*>(y.data<std::int32_t>()), {std::int64_t(y.dim(0))}, torch::kInt)
      .to(torch::kLong);
}

/// LibTorch alone: the mean cross-entropy of forward on the batch, backward (gradients accumulate).
float torch_loss(const std::function<torch::Tensor(torch::Tensor)>& forward, const batch_tensors& b) {
  auto loss = torch::nn::functional::cross_entropy(forward(torch_x(b.x)), torch_y(b.y));
  loss.backward();
  return loss.item<float>();
}

/// A module whose forward records whether another thread could take dtf's generator lock.
struct LockProbeImpl : tnn::Cloneable<LockProbeImpl> {
  explicit LockProbeImpl(bool with_dropout) : with_dropout(with_dropout) { reset(); }
  void reset() override {
    fc = register_module("fc", tnn::Linear(8, 3));
    if (with_dropout) drop = register_module("drop", tnn::Dropout(0.5));
  }
  torch::Tensor forward(torch::Tensor x) {
    locked = !std::async(std::launch::async, [] {
                if (!dtf::libtorch::detail::generator_mutex().try_lock()) return false;
                dtf::libtorch::detail::generator_mutex().unlock();
                return true;
              }).get();
    return with_dropout ? drop(fc(x)) : fc(x);
  }
  bool with_dropout = false, locked = false;
  tnn::Linear fc{nullptr};
  tnn::Dropout drop{nullptr};
};
TORCH_MODULE(LockProbe);

}  // namespace

TEST_CASE("torch: variables are named_parameters in declaration order, packed", "[torch]") {
  module_model<tnn::Sequential> net(torch_small_net());
  const auto vars = net.variables();
  REQUIRE(vars.size() == 4);
  CHECK(vars[0].name == "0.weight");
  CHECK(vars[0].shape == dtf::dims{16, 8});
  CHECK(vars[1].name == "0.bias");
  CHECK(vars[1].offset == 128);
  CHECK(vars[2].name == "2.weight");
  CHECK(vars[2].shape == dtf::dims{3, 16});
  CHECK(vars[3].offset == 128 + 16 + 48);
  CHECK(net.num_parameters() == 195);
  // initialize is deterministic in the seed, and another seed gives other values.
  std::vector<float> a(195), b(195), c(195);
  net.initialize(a, 3);
  net.initialize(b, 3);
  net.initialize(c, 4);
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("torch: the same MLP as dtf::nn::sequential and as a LibTorch module: equal loss and gradients",
          "[torch]") {
  // Tolerance: float32 sums in another order (LibTorch's GEMM against OpenBLAS's): 1e-5
  // relative to the largest gradient, 1e-6 relative on the loss.
  auto seq = dtf::test::small_net();
  module_model<tnn::Sequential> net(torch_small_net());
  const auto p = small_net_init(21);
  const auto pt = relayout(p, /*to_torch=*/true);
  const auto batch = first_batch(64, 5);
  std::vector<float> g(p.size()), gt(p.size());
  const float loss = seq.loss_and_gradients(p, batch.x, batch.y, g);
  const float loss_t = net.loss_and_gradients(pt, batch.x, batch.y, gt);
  CHECK(loss_t == Approx(loss).epsilon(1e-6));
  const auto back = relayout(gt, /*to_torch=*/false);
  float largest = 0;
  for (float v : g) largest = std::max(largest, std::abs(v));
  REQUIRE(largest > 0);
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("gradient " << i);
    CHECK(std::abs(back[i] - g[i]) <= 1e-5f * largest);
  }
  // The logits too (eval mode, no autograd).
  tensor z, zt;
  seq.logits(p, batch.x, z);
  net.logits(pt, batch.x, zt);
  REQUIRE(zt.shape() == z.shape());
  const auto zv = z.to_vector<float>(), ztv = zt.to_vector<float>();
  for (std::size_t i = 0; i < zv.size(); ++i) CHECK(ztv[i] == Approx(zv[i]).margin(1e-5));
}

TEST_CASE("torch: the module holds the parameters handed to it, and gradients are the caller's buffer during the call",
          "[torch][lifetime]") {
  module_model<tnn::Sequential> net(torch_small_net());
  std::vector<float> p(net.num_parameters()), g(net.num_parameters(), 7.0f);
  net.initialize(p, 1);
  const auto batch = first_batch(16, 2);
  std::size_t lent = 0;
  net.loss_and_gradients(p, batch.x, batch.y, g, [&](std::size_t first, std::size_t count) {
    for (const auto& t : net.module()->parameters())
      if (t.grad().defined() && t.grad().data_ptr<float>() == g.data() + first) lent += count;
  });
  CHECK(lent == net.num_parameters());  // every gradient written in place, no copy
  std::size_t k = 0;
  for (const auto& t : net.module()->parameters()) {
    const auto v = net.variables()[k++];  // a copy: variables() returns by value
    CHECK_FALSE(t.grad().defined());  // the loan of g ended with the call
    CHECK(t.data_ptr<float>() != p.data() + v.offset);
    CHECK(torch::equal(t, torch::from_blob(p.data() + v.offset, t.sizes())));
  }
  // The caller's buffer changes after the call: the module's parameters do not.
  const auto held = net.module()->parameters()[0].clone();
  const auto kept = p;
  p[0] += 1.0f;
  CHECK(torch::equal(net.module()->parameters()[0], held));
  // A second step overwrites the gradient (no accumulation across steps).
  p = kept;
  std::vector<float> first = g;
  net.loss_and_gradients(p, batch.x, batch.y, g);
  CHECK(g == first);
}

TEST_CASE("torch: streaming reports every gradient float exactly once, in a fixed order, unused ones as zeros",
          "[torch][overlap]") {
  module_model<Branchy> net(Branchy{});
  const auto vars = net.variables();
  REQUIRE(vars.size() == 6);
  CHECK(vars[2].name == "unused.weight");
  std::vector<float> p(net.num_parameters()), g(net.num_parameters(), 5.0f);
  net.initialize(p, 9);
  const auto batch = first_batch(32, 4);
  auto run = [&] {
    std::vector<int> seen(g.size(), 0);
    std::vector<std::size_t> order;
    std::vector<float> at_report(g.size());
    net.loss_and_gradients(p, batch.x, batch.y, g, [&](std::size_t first, std::size_t count) {
      order.push_back(first);
      for (std::size_t i = first; i < first + count; ++i) {
        ++seen[i];
        at_report[i] = g[i];
      }
    });
    for (std::size_t i = 0; i < g.size(); ++i) {
      INFO("float " << i);
      REQUIRE(seen[i] == 1);
      CHECK(at_report[i] == g[i]);  // final when reported
    }
    return order;
  };
  const auto order = run();
  CHECK(order.size() == vars.size());
  CHECK(run() == order);
  // The unused branch is reported (last, after backward) with zeros.
  CHECK((order.back() == vars[2].offset || order[order.size() - 2] == vars[2].offset));
  for (std::size_t i = vars[2].offset; i < vars[4].offset; ++i) CHECK(g[i] == 0.0f);
  // The top layer's gradient is final before the first layer's.
  const auto pos = [&](std::size_t offset) { return std::find(order.begin(), order.end(), offset) - order.begin(); };
  CHECK(pos(vars[4].offset) < pos(vars[0].offset));
  // The same gradient as without streaming.
  std::vector<float> plain(g.size());
  net.loss_and_gradients(p, batch.x, batch.y, plain);
  CHECK(plain == g);
}

TEST_CASE("torch: a copy is a deep copy with its own replica index", "[torch]") {
  module_model<tnn::Sequential> net(torch_small_net());
  std::vector<float> p(net.num_parameters());
  net.initialize(p, 1);
  module_model<tnn::Sequential> copy(net);
  CHECK(copy.variables().size() == net.variables().size());
  CHECK(copy.module().ptr() != net.module().ptr());
  const auto batch = first_batch(8, 1);
  std::vector<float> g1(p.size()), g2(p.size());
  net.loss_and_gradients(p, batch.x, batch.y, g1);
  copy.loss_and_gradients(p, batch.x, batch.y, g2);
  CHECK(g1 == g2);
  CHECK(net.module()->parameters()[0].data_ptr<float>() != copy.module()->parameters()[0].data_ptr<float>());
  CHECK(torch::equal(net.module()->parameters()[0], copy.module()->parameters()[0]));
}

TEST_CASE("torch: dropout masks differ per task and replica and repeat with the seed", "[torch]") {
  auto make = [](std::uint64_t task) {
    return module_model<tnn::Sequential>(
        tnn::Sequential(tnn::Linear(8, 64), tnn::Dropout(0.5), tnn::Linear(64, 3)), {.seed = 1, .task = task});
  };
  const auto batch = first_batch(16, 3);
  auto grads = [&](module_model<tnn::Sequential>& m, std::vector<float>& p) {
    std::vector<float> g(p.size());
    m.loss_and_gradients(p, batch.x, batch.y, g);
    return g;
  };
  auto a = make(0), a_again = make(0), b = make(1);
  std::vector<float> p(a.num_parameters());
  a.initialize(p, 2);
  const auto ga = grads(a, p);
  CHECK(grads(a_again, p) == ga);  // same seed, task, replica and step
  CHECK(grads(b, p) != ga);        // another task
  module_model<tnn::Sequential> r0(a_again), r1(a_again);  // replicas 0 and 1 of a fresh source
  CHECK(grads(r0, p) == ga);  // replica 0, first forward: as the source's first
  CHECK(grads(r1, p) != ga);
}

TEST_CASE("torch: non-float32 parameters, no parameters, sparse gradients and wrong input shapes are errors naming the cause",
          "[torch][errors]") {
  tnn::Linear doubled(2, 2);
  doubled->to(torch::kDouble);
  CHECK_THROWS_WITH(module_model<tnn::Linear>(doubled), Catch::Contains("'weight'") && Catch::Contains("Double") &&
                                                            Catch::Contains("float32"));
  CHECK_THROWS_WITH(module_model<tnn::Sequential>(tnn::Sequential(tnn::ReLU())),
                    Catch::Contains("no trainable parameters"));
  CHECK_THROWS_WITH(module_model<tnn::Embedding>(tnn::Embedding(tnn::EmbeddingOptions(10, 4).sparse(true))),
                    Catch::Contains("sparse"));
  module_model<tnn::Sequential> net(torch_small_net(), {.input_shape = {1, 28, 28}});
  std::vector<float> p(net.num_parameters()), g(p.size());
  const auto batch = first_batch(4, 1);
  CHECK_THROWS_WITH(net.loss_and_gradients(p, batch.x, batch.y, g),
                    Catch::Contains("8 features") && Catch::Contains("[1, 28, 28]") && Catch::Contains("784"));
  std::vector<float> short_p(10);
  CHECK_THROWS_WITH(net.loss_and_gradients(short_p, batch.x, batch.y, g), Catch::Contains("10 floats"));
}

TEST_CASE("torch: a tied layer is one variable, and trains as LibTorch trains the tied module", "[torch][state]") {
  module_model<tnn::Sequential> net(tied_net(), {.init = dtf::libtorch::init_from::module});
  CHECK(net.num_parameters() == 99);  // 64 + 8 + 24 + 3, not LibTorch's 171
  const auto vars = net.variables();
  REQUIRE(vars.size() == 4);
  CHECK(vars[0].name == "0.weight");
  CHECK(vars[2].name == "3.weight");
  // LibTorch alone: the same module (same seed), SGD over its distinct parameters with the same
  // float arithmetic (p - 0.1 g): every step bit for bit.
  auto ref = tied_net();
  const auto ref_params = distinct_trainable(*ref);
  std::vector<float> p(net.num_parameters()), g(p.size());
  net.initialize(p, 0);
  CHECK(p == flat(ref_params));
  for (std::uint64_t step = 0; step < 3; ++step) {
    INFO("step " << step);
    const auto batch = first_batch(32, 20 + step);
    const float loss = net.loss_and_gradients(p, batch.x, batch.y, g);
    for (auto& t : ref_params) t.mutable_grad() = torch::Tensor();
    const float ref_loss = torch_loss([&](torch::Tensor x) { return ref->forward(x); }, batch);
    CHECK(loss == ref_loss);
    CHECK(g == flat(ref_params, /*grads=*/true));  // the tie's gradient: both uses summed
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= 0.1f * g[i];
    {
      torch::NoGradGuard no_grad;
      for (auto& t : ref_params) t.sub_(t.grad() * 0.1f);
    }
    CHECK(p == flat(ref_params));
  }
  // The module is tied still: both reaches hold the trained values.
  CHECK(net.module()[0]->as<tnn::Linear>()->weight.is_same(net.module()[2]->as<tnn::Linear>()->weight));
  // A copy keeps the tie.
  module_model<tnn::Sequential> copy(net);
  CHECK(copy.num_parameters() == 99);
  std::vector<float> g_copy(p.size());
  const auto batch = first_batch(32, 30);
  net.loss_and_gradients(p, batch.x, batch.y, g);
  copy.loss_and_gradients(p, batch.x, batch.y, g_copy);
  CHECK(g_copy == g);
}

TEST_CASE("torch: frozen parameters keep their values through initialize, are buffers, and stay frozen in copies",
          "[torch][state]") {
  module_model<tnn::Sequential> net(frozen_net(0.5f));
  CHECK(net.num_parameters() == 27);  // Linear(8, 3) only
  std::vector<float> p(net.num_parameters());
  net.initialize(p, 3);
  const auto frozen = net.module()[0]->as<tnn::Linear>();
  CHECK(torch::all(frozen->weight == 0.5f).item<bool>());
  CHECK(torch::all(frozen->bias == 0.5f).item<bool>());
  // The trainable layer as LibTorch draws it under the seed, after the frozen layer's draws
  // (every built-in layer is reset in order; the frozen one's values are put back).
  torch::manual_seed(3);
  tnn::Linear a(8, 8), b(8, 3);
  CHECK(p == flat({b->weight, b->bias}));
  // The frozen values are buffers: saved, restored and shared as the job's.
  const auto specs = net.buffers();
  REQUIRE(specs.size() == 2);
  CHECK(specs[0].name == "0.weight");
  CHECK(specs[1].name == "0.bias");
  std::vector<float> values(dtf::num_parameters(specs));
  net.read_buffers(values);
  CHECK(values == std::vector<float>(72, 0.5f));
  // A copy (clone() turns requires_grad back on) keeps them frozen, and computes the same.
  module_model<tnn::Sequential> copy(net);
  CHECK(copy.num_parameters() == 27);
  CHECK_FALSE(copy.module()[0]->as<tnn::Linear>()->weight.requires_grad());
  const auto batch = first_batch(16, 6);
  std::vector<float> g(p.size()), g_copy(p.size());
  net.loss_and_gradients(p, batch.x, batch.y, g);
  copy.loss_and_gradients(p, batch.x, batch.y, g_copy);
  CHECK(g_copy == g);
  CHECK(torch::all(frozen->weight == 0.5f).item<bool>());  // no step moved it
}

TEST_CASE("torch: a submodule the user put in eval stays in eval through training, evaluation and copies",
          "[torch][state]") {
  auto build = [] {
    torch::manual_seed(13);
    tnn::Sequential m(tnn::BatchNorm1d(8), tnn::Linear(8, 3));
    auto bn = m[0]->as<tnn::BatchNorm1d>();
    bn->running_mean.fill_(0.3f);
    bn->running_var.fill_(2.0f);
    bn->eval();  // frozen statistics: the usual fine-tuning recipe
    return m;
  };
  module_model<tnn::Sequential> net(build(), {.init = dtf::libtorch::init_from::module});
  auto bn = net.module()[0]->as<tnn::BatchNorm1d>();
  std::vector<float> p(net.num_parameters()), g(p.size());
  net.initialize(p, 0);
  const auto batch = first_batch(16, 7);
  net.loss_and_gradients(p, batch.x, batch.y, g);
  CHECK_FALSE(bn->is_training());
  CHECK(net.module()->is_training());
  CHECK(torch::all(bn->running_mean == 0.3f).item<bool>());  // eval: the statistics did not move
  // LibTorch alone, the same module in the same modes: the same gradient.
  auto ref = build();
  torch_loss([&](torch::Tensor x) { return ref->forward(x); }, batch);
  CHECK(g == flat(distinct_trainable(*ref), /*grads=*/true));
  tensor z;
  net.logits(p, batch.x, z);
  CHECK_FALSE(bn->is_training());
  CHECK(net.module()->is_training());
  CHECK(net.module()[1]->is_training());
  module_model<tnn::Sequential> copy(net);
  CHECK_FALSE(copy.module()[0]->is_training());
  CHECK(copy.module()->is_training());
}

TEST_CASE("torch: init_from::module gives the module's values bit for bit, and a seed gives LibTorch's draws",
          "[torch][state]") {
  // A module saved and loaded, as a pretrained one is.
  auto trained = torch_small_net();
  {
    torch::NoGradGuard no_grad;
    for (auto& t : trained->parameters()) t.uniform_(-3.0, 3.0);
  }
  std::stringstream file;
  torch::save(trained, file);
  auto loaded = torch_small_net();
  torch::load(loaded, file);
  module_model<tnn::Sequential> tuned(loaded, {.init = dtf::libtorch::init_from::module});
  std::vector<float> p(tuned.num_parameters());
  tuned.initialize(p, 9);
  CHECK(p == flat(distinct_trainable(*trained)));
  // init_from::seed (the default): the built-in layers as LibTorch draws them under the seed.
  module_model<tnn::Sequential> fresh(loaded);
  fresh.initialize(p, 9);
  torch::manual_seed(9);
  tnn::Linear a(8, 16), b(16, 3);  // in this order (a call's arguments are built in any order)
  CHECK(p == flat({a->weight, a->bias, b->weight, b->bias}));
}

TEST_CASE("torch: threads default to LibTorch's own, and only modules that draw random numbers take the generator lock",
          "[torch]") {
  const int before = torch::get_num_threads();
  torch::set_num_threads(2);
  { module_model<tnn::Sequential> net(torch_small_net()); }
  CHECK(torch::get_num_threads() == 2);  // constructing a model left the process's setting alone
  torch::set_num_threads(before);
  const auto batch = first_batch(8, 1);
  for (bool with_dropout : {false, true}) {
    LockProbe probe(with_dropout);
    module_model<LockProbe> net(probe);
    std::vector<float> p(net.num_parameters()), g(p.size());
    net.initialize(p, 1);
    net.loss_and_gradients(p, batch.x, batch.y, g);
    INFO("with dropout: " << with_dropout);
    CHECK(probe->locked == with_dropout);
  }
  // A forward that draws in code of its own says so.
  LockProbe plain(false);
  module_model<LockProbe> told(plain, {.random_forward = true});
  std::vector<float> p(told.num_parameters()), g(p.size());
  told.initialize(p, 1);
  told.loss_and_gradients(p, batch.x, batch.y, g);
  CHECK(plain->locked);
}

namespace {
/// Every built-in layer of LibTorch 1.13 that registers parameters (a TransformerEncoderLayer for
/// the composites), built one after another, in this order, from LibTorch's generator as it is.
tnn::ModuleList every_layer() {
  tnn::ModuleList l;
  l->push_back(tnn::Linear(4, 3));
  l->push_back(tnn::Bilinear(3, 3, 2));
  l->push_back(tnn::Conv1d(2, 2, 3));
  l->push_back(tnn::Conv2d(2, 2, 3));
  l->push_back(tnn::Conv3d(2, 2, 2));
  l->push_back(tnn::ConvTranspose1d(2, 2, 3));
  l->push_back(tnn::ConvTranspose2d(2, 2, 3));
  l->push_back(tnn::ConvTranspose3d(2, 2, 2));
  l->push_back(tnn::BatchNorm1d(3));
  l->push_back(tnn::BatchNorm2d(3));
  l->push_back(tnn::BatchNorm3d(3));
  l->push_back(tnn::InstanceNorm1d(tnn::InstanceNorm1dOptions(3).affine(true)));
  l->push_back(tnn::InstanceNorm2d(tnn::InstanceNorm2dOptions(3).affine(true)));
  l->push_back(tnn::InstanceNorm3d(tnn::InstanceNorm3dOptions(3).affine(true)));
  l->push_back(tnn::LayerNorm(tnn::LayerNormOptions({4})));
  l->push_back(tnn::GroupNorm(2, 4));
  l->push_back(tnn::Embedding(5, 3));
  l->push_back(tnn::EmbeddingBag(5, 3));
  l->push_back(tnn::RNN(3, 4));
  l->push_back(tnn::LSTM(3, 4));
  l->push_back(tnn::GRU(3, 4));
  l->push_back(tnn::RNNCell(3, 4));
  l->push_back(tnn::LSTMCell(3, 4));
  l->push_back(tnn::GRUCell(3, 4));
  l->push_back(tnn::MultiheadAttention(4, 2));
  l->push_back(tnn::MultiheadAttention(tnn::MultiheadAttentionOptions(4, 2).kdim(3).vdim(5).add_bias_kv(true)));
  l->push_back(tnn::PReLU());
  l->push_back(tnn::TransformerEncoderLayer(tnn::TransformerEncoderLayerOptions(4, 2).dim_feedforward(8).dropout(0)));
  return l;
}
}  // namespace

TEST_CASE("torch: the seed initialises every built-in layer with parameters as LibTorch constructs it under that seed",
          "[torch][state]") {
  // Two builds from other generator states, one of them changed by hand (as a user might):
  // initialized from one seed they are equal bit for bit, and equal to LibTorch's own
  // construction under torch::manual_seed(seed) (the independent reference).
  torch::manual_seed(1);
  module_model<tnn::ModuleList> a(every_layer());
  torch::manual_seed(2);
  module_model<tnn::ModuleList> b(every_layer());
  {
    torch::NoGradGuard no_grad;
    for (auto& t : b.module()->parameters()) t.add_(0.25);
  }
  std::vector<float> pa(a.num_parameters()), pb(pa.size()), pc(pa.size());
  a.initialize(pa, 7);
  b.initialize(pb, 7);
  CHECK(pa == pb);
  CHECK(pa == flat(b.module()->parameters()));  // the module holds them
  torch::manual_seed(7);
  const auto reference = every_layer();
  CHECK(pa == flat(reference->parameters()));
  // Another seed: every parameter drawn at random differs (the constant ones, e.g. a norm's
  // weight of ones or MultiheadAttention's zero biases, stay).
  a.initialize(pc, 8);
  for (const auto& v : a.variables()) {
    INFO(v.name);
    const auto first = pa.begin() + std::ptrdiff_t(v.offset), last = first + std::ptrdiff_t(v.size());
    const bool constant = std::all_of(first, last, [&](float x) { return x == *first; });
    if (!constant) CHECK_FALSE(std::equal(first, last, pc.begin() + std::ptrdiff_t(v.offset)));
  }
}

TEST_CASE("torch: a dropout module's forward count is a buffer: a restored model draws the masks the first would have "
          "drawn next, none again", "[torch][buffers]") {
  auto make = [] {
    return module_model<tnn::Sequential>(tnn::Sequential(tnn::Linear(8, 64), tnn::Dropout(0.5), tnn::Linear(64, 3)),
                                         {.seed = 1});
  };
  const auto batch = first_batch(16, 3);
  auto grads = [&](module_model<tnn::Sequential>& m, std::vector<float>& p) {
    std::vector<float> g(p.size());
    m.loss_and_gradients(p, batch.x, batch.y, g);
    return g;
  };
  auto first = make();
  std::vector<float> p(first.num_parameters());
  first.initialize(p, 2);
  const auto step1 = grads(first, p);
  (void)grads(first, p);
  const auto specs = first.buffers();
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].name == "dtf/forward_count");
  std::vector<float> saved(dtf::num_parameters(specs));
  first.read_buffers(saved);
  CHECK(saved == std::vector<float>{2, 0, 0});
  const auto step3 = grads(first, p);  // the uninterrupted run's third forward
  auto resumed = make();
  resumed.write_buffers(saved);
  CHECK(grads(resumed, p) == step3);
  auto fresh = make();
  CHECK(grads(fresh, p) == step1);  // a model not restored starts over
  CHECK(step3 != step1);
  saved[1] = -1.0f;
  CHECK_THROWS_WITH(resumed.write_buffers(saved), Catch::Contains("dtf/forward_count"));
}
