// dtf::torch::module_model (include/dtf/torch/module_model.hpp) against independent references:
// dtf::nn::sequential's hand-written backprop with the same weights (loss, gradients, and the
// same training under every strategy), one process at the combined batch for ring-allreduce,
// and the streaming contract counted float by float. Built only where LibTorch is found.
#include <dtf/nn.hpp>
#include <dtf/torch/module_model.hpp>

#include <catch2/catch.hpp>

#include "../train_helpers.hpp"
#include "twin.hpp"

#include <cmath>
#include <cstring>
#include <vector>

namespace {

using dtf::tensor;
using dtf::torch::module_model;
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

TEST_CASE("torch: parameters and gradients are the caller's buffers, not copies", "[torch]") {
  module_model<tnn::Sequential> net(torch_small_net());
  std::vector<float> p(net.num_parameters()), g(net.num_parameters(), 7.0f);
  net.initialize(p, 1);
  const auto batch = first_batch(16, 2);
  net.loss_and_gradients(p, batch.x, batch.y, g);
  std::size_t k = 0;
  for (const auto& t : net.module()->parameters()) {
    const auto& v = net.variables()[k++];
    CHECK(t.data_ptr<float>() == p.data() + v.offset);
    CHECK(t.grad().data_ptr<float>() == g.data() + v.offset);
  }
  // A second step overwrites the gradient (no accumulation across steps).
  std::vector<float> first = g;
  net.loss_and_gradients(p, batch.x, batch.y, g);
  CHECK(g == first);
  // Another buffer: the module follows it.
  std::vector<float> p2 = p;
  p2[0] += 1.0f;
  net.loss_and_gradients(p2, batch.x, batch.y, g);
  CHECK(net.module()->parameters()[0].data_ptr<float>() == p2.data());
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
  CHECK(net.module()->parameters()[0].data_ptr<float>() == copy.module()->parameters()[0].data_ptr<float>());
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
