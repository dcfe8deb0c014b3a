// The LibTorch adapter's ownership rule (dtf/torch/module_model.hpp's file comment): the module
// never points into memory dtf has freed. Each case frees what dtf lent the module and then uses
// the module as LibTorch code would; the suite runs them under AddressSanitizer
// (torch_lifetime_under_asan, tests/torch/CMakeLists.txt), where a read or write through a
// stale view is an error even when it would not crash. The values are checked against LibTorch
// alone: the module's own tensors, saved and loaded by torch::save / torch::load.
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/torch/module_model.hpp>

#include <catch2/catch.hpp>

#include "../train_helpers.hpp"
#include "twin.hpp"

#include <memory>
#include <sstream>
#include <type_traits>
#include <vector>

// The former namespace name stays an alias for a release (this target does not define
// DTF_NO_LEGACY_TORCH_NAMESPACE).
static_assert(std::is_same_v<dtf::torch::module_options, dtf::libtorch::module_options>);

namespace {

using dtf::libtorch::module_model;
namespace tnn = torch::nn;

/// The module's parameters, flattened in named_parameters() order (LibTorch alone).
std::vector<float> values_of(const tnn::Module& m) {
  std::vector<float> out;
  for (const auto& t : m.parameters()) {
    const auto c = t.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

struct batch_tensors {
  dtf::tensor x, y;
};
batch_tensors first_batch(std::size_t n, std::uint64_t seed) {
  const auto data = dtf::test::synthetic(n, seed, dtf::test::labels::argmax).batch(n);
  auto b = *data.stream().next();
  batch_tensors t;
  dtf::assign_from_host(t.x, b.features);
  dtf::assign_from_host(t.y, b.labels);
  return t;
}

/// The module's mean cross-entropy on the batch, by LibTorch alone (forward and backward).
float torch_step(tnn::Sequential& m, const batch_tensors& b) {
  const auto n = std::int64_t(b.x.dim(0));
  auto x = torch::from_blob(const_cast<float*>(b.x.data<float>()), {n, 8}).clone();
  auto y = torch::from_blob(const_cast<std::int32_t*>(b.y.data<std::int32_t>()), {n}, torch::kInt).to(torch::kLong);
  auto loss = torch::nn::functional::cross_entropy(m->forward(x), y);
  loss.backward();
  return loss.item<float>();
}

}  // namespace

TEST_CASE("torch: after the buffers dtf lent are freed, the module keeps its values and LibTorch uses it",
          "[torch][lifetime]") {
  module_model<tnn::Sequential> net(dtf::test::torch_small_net());
  const auto batch = first_batch(16, 2);
  std::vector<float> trained;
  {
    auto p = std::make_unique<std::vector<float>>(net.num_parameters());
    auto g = std::make_unique<std::vector<float>>(net.num_parameters());
    net.initialize(*p, 1);
    std::size_t lent = 0;
    net.loss_and_gradients(*p, batch.x, batch.y, *g, [&](std::size_t first, std::size_t count) {
      // During the call each .grad() is the caller's slice.
      for (const auto& t : net.module()->parameters())
        if (t.grad().defined() && t.grad().data_ptr<float>() == g->data() + first) lent += count;
    });
    CHECK(lent == net.num_parameters());
    for (auto& v : *p) v += 1.0f;  // the caller's buffer moves on: the module holds what it was handed
    net.logits(*p, batch.x, *std::make_unique<dtf::tensor>());
    trained = *p;
  }  // p and g freed
  CHECK(values_of(*net.module()) == trained);
  for (const auto& t : net.module()->parameters()) CHECK_FALSE(t.grad().defined());  // the loan ended
  // LibTorch alone: an optimizer step, torch::save and torch::load.
  torch::optim::SGD sgd(net.module()->parameters(), torch::optim::SGDOptions(0.1));
  torch_step(net.module(), batch);
  sgd.step();
  const auto stepped = values_of(*net.module());
  CHECK(stepped != trained);
  std::stringstream file;
  torch::save(net.module(), file);
  auto loaded = dtf::test::torch_small_net();
  torch::load(loaded, file);
  CHECK(values_of(*loaded) == stepped);
  // A second initialize writes into the module's own tensors and the new buffer only.
  std::vector<float> again(net.num_parameters());
  net.initialize(again, 1);
  std::vector<float> first(net.num_parameters());
  module_model<tnn::Sequential>(dtf::test::torch_small_net()).initialize(first, 1);
  CHECK(again == first);
  CHECK(values_of(*net.module()) == again);
}

TEST_CASE("torch: a module outlives its module_model and the strategies that trained it", "[torch][lifetime]") {
  auto module = dtf::test::torch_small_net();
  const auto batch = first_batch(16, 3);
  const auto data = dtf::test::synthetic(32, 4, dtf::test::labels::argmax).batch(16);
  std::vector<float> after_first;
  {
    module_model<tnn::Sequential> net(module);
    auto comm = dtf::communicator::single();
    for (int run = 0; run < 2; ++run) {  // a second strategy after the first's buffers are freed
      dtf::strategies::ring_allreduce<module_model<tnn::Sequential>> r(comm, net, {.rule = dtf::optim::sgd{0.1f}});
      r.initialize(5);
      auto s = data.stream();
      while (auto b = s.next()) r.step(*b);
      if (run == 0) after_first.assign(r.parameters().begin(), r.parameters().end());
    }
    CHECK(after_first.size() == net.num_parameters());
  }  // the module_model and both strategies gone; the module lives on
  // Its hooks went with the module_model: LibTorch's own training of the module is untouched.
  torch::optim::SGD sgd(module->parameters(), torch::optim::SGDOptions(0.1));
  sgd.zero_grad();
  const float loss = torch_step(module, batch);
  CHECK(std::isfinite(loss));
  for (const auto& t : module->parameters()) CHECK(t.grad().defined());
  sgd.step();
}
