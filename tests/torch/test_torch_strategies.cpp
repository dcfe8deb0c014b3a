// Every dtf strategy trains a LibTorch module: the torch twin of dtf::test::small_net() under
// each strategy ends where dtf::nn::sequential ends under the same strategy, from the same
// start on the same batches (an independent reference: the hand-written backprop), and
// ring-allreduce over 2 and 3 ranks equals one process at the combined batch, overlap on and off
// bitwise equal. A module of two inputs and a float target trains through a step of its own
// (dtf/torch/step.hpp) as LibTorch alone, and evaluation reports the model's own loss.
#include <dtf/nn.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/strategies/aeasgd.hpp>
#include <dtf/strategies/agn.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/dyn_sgd.hpp>
#include <dtf/strategies/eamsgd.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/mirrored.hpp>
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/strategies/sync.hpp>
#include <dtf/torch/module_model.hpp>
#include <dtf/train/options.hpp>

#include <catch2/catch.hpp>
#include <xtensor/xview.hpp>

#include "../ps_helpers.hpp"
#include "../rank_helpers.hpp"
#include "../train_helpers.hpp"
#include "twin.hpp"

#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

using namespace dtf;  // with DTF_NO_LEGACY_TORCH_NAMESPACE (tests/torch/CMakeLists.txt): torch:: is LibTorch's
using dtf::test::opts;
using dtf::test::running_ps;

namespace {

/// The twin, initialised as small_net() is from the same seed (relaid out), so both start equal.
struct torch_twin : dtf::libtorch::module_model<::torch::nn::Sequential> {
  torch_twin() : module_model(test::torch_small_net()) {}
  void initialize(std::span<float> p, std::uint64_t seed) {
    const auto q = test::relayout(test::small_net_init(seed), /*to_torch=*/true);
    std::copy(q.begin(), q.end(), p.begin());
  }
};
static_assert(streams_gradients<torch_twin>);

/// A plain small_net(), default-constructible like the twin.
struct sequential_net : nn::sequential {
  sequential_net() : nn::sequential(test::small_net()) {}
};

data::dataset batches() { return test::synthetic(128, 1, test::labels::argmax).batch(16).repeat(2); }

/// One worker (a strategies::sync_worker of make()'s strategy when Sync, else an async_worker)
/// against one ps, through 16 batches; the centre at the end, in small_net's layout.
template <class M, bool Sync, class Make>
std::vector<float> centre(const Make& make) {
  using S = decltype(make());
  running_ps ps0(opts("ps.0"));
  M net;
  const auto layout = partitioners::greedy_load_balancing{}.place(net.variables(), 1);
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  auto w = [&] {
    if constexpr (Sync)
      return std::make_unique<strategies::sync_worker<S, M>>(make(), net, client, 0);
    else
      return std::make_unique<strategies::async_worker<S, M>>(make(), net, client, 0, 1);
  }();
  w->initialize_ps(3);
  w->begin();
  auto s = batches().stream();
  while (auto b = s.next()) w->step(*b);
  w->end();
  std::vector<float> values(num_parameters(net.variables()));
  client.pull(values);
  return std::is_same_v<M, torch_twin> ? test::relayout(values, /*to_torch=*/false) : values;
}
template <class M, class Make>
std::vector<float> async_centre(const Make& make) {
  return centre<M, false>(make);
}
template <class M, class Make>
std::vector<float> sync_centre(const Make& make) {
  return centre<M, true>(make);
}

/// Two replicas of mirrored in this process (SGD); the parameters at the end, small_net's layout.
template <class M>
std::vector<float> mirrored_params() {
  auto comm = communicator::single();
  M net;
  strategies::mirrored<M> s(comm, net, 2, {.rule = optim::sgd{0.1f}});
  s.initialize(3);
  auto stream = test::synthetic(128, 1, test::labels::argmax).batch(16).stream();
  while (true) {
    auto a = stream.next(), b = stream.next();
    if (!a || !b) break;
    const data::host_batch two[] = {*a, *b};
    s.step(two);
  }
  std::vector<float> p(s.parameters().begin(), s.parameters().end());
  return std::is_same_v<M, torch_twin> ? test::relayout(p, /*to_torch=*/false) : p;
}

/// Largest |a - b| over the largest |b|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    gap = std::max(gap, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return gap / scale;
}

data::host_batch rows_of(const data::host_batch& b, std::size_t begin, std::size_t rows) {
  data::host_batch out;
  out.features = xt::view(b.features, xt::range(begin, begin + rows), xt::all());
  out.labels = xt::view(b.labels, xt::range(begin, begin + rows));
  return out;
}


/// Linear(8, 8) frozen at 0.5, ReLU, Linear(8, 8) used twice (tied), Linear(8, 3), seeded:
/// 99 trainable floats (LibTorch's named_parameters() lists 243, 72 of them frozen).
::torch::nn::Sequential frozen_tied_net() {
  return test::seeded(14, [] {  // ranks build it on threads of one process
    namespace tnn = ::torch::nn;
    tnn::Linear f(8, 8), l(8, 8);
    {
      ::torch::NoGradGuard no_grad;
      f->weight.fill_(0.5f);
      f->bias.fill_(0.5f);
    }
    f->weight.requires_grad_(false);
    f->bias.requires_grad_(false);
    return tnn::Sequential(f, tnn::ReLU(), l, tnn::ReLU(), l, tnn::Linear(8, 3));
  });
}

/// frozen_tied_net() as a dtf model that starts from the module's values.
struct frozen_tied : dtf::libtorch::module_model<::torch::nn::Sequential> {
  frozen_tied() : module_model(frozen_tied_net(), {.init = dtf::libtorch::init_from::module}) {}
};

/// LibTorch alone: SGD (p - lr g, the same float arithmetic) on frozen_tied_net() over data's
/// batches, one step each; its distinct trainable values at the end.
std::vector<float> torch_sgd(const data::dataset& data, float lr) {
  auto m = frozen_tied_net();
  const auto params = test::distinct_trainable(*m);
  auto s = data.stream();
  while (auto b = s.next()) {
    const auto n = std::int64_t(b->labels.size());
    auto x = ::torch::from_blob(const_cast<float*>(b->features.data()), {n, 8}).clone();
    auto y = ::torch::from_blob(const_cast<std::int32_t*>(b->labels.data()), {n}, ::torch::kInt).to(::torch::kLong);
    for (const auto& t : params) t.mutable_grad() = ::torch::Tensor();
    ::torch::nn::functional::cross_entropy(m->forward(x), y).backward();
    ::torch::NoGradGuard no_grad;
    for (const auto& t : params) t.sub_(t.grad() * lr);
  }
  return test::flat(params);
}

}  // namespace

// Tolerance: the two models sum float32 products in different orders (LibTorch's kernels against
// OpenBLAS); after 16 steps the centres agree to 1e-7 of the largest parameter under every
// strategy here (measured 1.2e-8 to 9.7e-8); the bound is 1e-6.
TEST_CASE("torch: every asynchronous and synchronous strategy trains the module as it trains dtf::nn",
          "[torch][strategies]") {
  using namespace strategies;
  const double tolerance = 1e-6;
  auto check = [&](const std::string& name, const std::vector<float>& twin, const std::vector<float>& reference) {
    INFO(name << ": relative gap " << relative_gap(twin, reference));
    CHECK(relative_gap(twin, reference) <= tolerance);
    CHECK(relative_gap(reference, test::relayout(test::small_net_init(3), false)) > 1e-3);  // it moved
  };
  const auto hw = [] { return hogwild({.learning_rate = 0.1f}); };
  check("hogwild", async_centre<torch_twin>(hw), async_centre<sequential_net>(hw));
  const auto dp = [] { return downpour({.local_rule = optim::sgd{0.05f}, .ps_rule = optim::adagrad{0.05f}}); };
  check("downpour", async_centre<torch_twin>(dp), async_centre<sequential_net>(dp));
  const auto easy = [] { return downpour(downpour_easy_config({0.05f, 0.02f}, 0.05f)); };
  check("downpour_easy", async_centre<torch_twin>(easy), async_centre<sequential_net>(easy));
  const auto ag = [] { return agn({4, optim::adam{2e-3f}}); };
  check("agn", async_centre<torch_twin>(ag), async_centre<sequential_net>(ag));
  const auto dyn = [] { return dyn_sgd({4, optim::adam{2e-3f}}); };
  check("dyn_sgd", async_centre<torch_twin>(dyn), async_centre<sequential_net>(dyn));
  const auto ae = [] { return aeasgd({.window = 4, .learning_rate = 0.1f, .rho = 5.0f}); };
  check("aeasgd", async_centre<torch_twin>(ae), async_centre<sequential_net>(ae));
  const auto em = [] { return eamsgd({.window = 4, .learning_rate = 0.02f, .momentum = 0.9f, .rho = 5.0f}); };
  check("eamsgd", async_centre<torch_twin>(em), async_centre<sequential_net>(em));
  const auto ss = [] { return sync_sgd({.replicas_to_aggregate = 1, .rule = optim::momentum{0.05f, 0.9f}}); };
  check("sync_sgd", sync_centre<torch_twin>(ss), sync_centre<sequential_net>(ss));
  const auto rates = [] { return sync_sgd({.replicas_to_aggregate = 1, .rule = optim::sgd{0.1f}, .worker_rates = {0.5f}}); };
  check("sync_sgd rates", sync_centre<torch_twin>(rates), sync_centre<sequential_net>(rates));
  const auto sa = [] { return sagn({.replicas_to_aggregate = 1, .window = 4, .local_rule = optim::adam{0.01f}}); };
  check("sagn", sync_centre<torch_twin>(sa), sync_centre<sequential_net>(sa));
  check("mirrored", mirrored_params<torch_twin>(), mirrored_params<sequential_net>());
}

TEST_CASE("torch: ring-allreduce over 2 and 3 ranks equals one process at the combined batch, overlap on and off "
          "bitwise equal",
          "[torch][collectives][overlap]") {
  for (std::size_t ranks : {2, 3}) {
    const std::size_t batch = 8, steps = 4;
    const auto data = test::synthetic(ranks * batch * steps, 11, test::labels::argmax).batch(ranks * batch);
    // One process: SGD on the whole batch.
    torch_twin single;
    std::vector<float> p(single.num_parameters()), g(p.size());
    single.initialize(p, 5);
    tensor x, y;
    auto s = data.stream();
    while (auto b = s.next()) {
      assign_from_host(x, b->features);
      assign_from_host(y, b->labels);
      single.loss_and_gradients(p, x, y, g);
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= 0.1f * g[i];
    }
    std::vector<std::vector<float>> by_overlap[2];
    for (bool overlap : {false, true}) {
      auto& result = by_overlap[overlap];
      result.resize(ranks);
      const auto failures = test::run_ranks_collect(ranks, {}, [&](communicator& c) {
        torch_twin net;
        strategies::ring_allreduce<torch_twin> r(c, net, {.rule = optim::sgd{0.1f}, .overlap = overlap, .bucket_bytes = 1});
        RANK_CHECK(r.overlaps() == overlap, r.overlaps());
        r.initialize(5);
        auto stream = data.stream();
        while (auto b = stream.next()) r.step(rows_of(*b, c.rank() * batch, batch));
        result[c.rank()].assign(r.parameters().begin(), r.parameters().end());
      });
      for (std::size_t k = 0; k < ranks; ++k) {
        INFO("rank " << k << " of " << ranks);
        REQUIRE((failures[k] ? test::message_of(failures[k]) : std::string()) == "");
      }
    }
    INFO(ranks << " ranks: relative gap to one process " << relative_gap(by_overlap[1][0], p));
    CHECK(by_overlap[1] == by_overlap[0]);                 // overlap changes no bit
    for (const auto& r : by_overlap[1]) CHECK(r == by_overlap[1][0]);  // the replicas agree bitwise
    CHECK(relative_gap(by_overlap[1][0], p) <= 1e-5);     // the mean of ranks' means is the batch mean
  }
}

TEST_CASE("torch: mirrored's copies keep a frozen layer and a tie, and train as LibTorch at the combined batch",
          "[torch][strategies][state]") {
  // Two replicas of batch 16 against LibTorch alone on the 32 rows (the mean of two equal
  // batches' means is the mean over both; the sums run in another order: 1e-6 relative).
  const auto data = test::synthetic(128, 8, test::labels::argmax);
  auto comm = communicator::single();
  frozen_tied net;
  REQUIRE(net.num_parameters() == 99);
  strategies::mirrored<frozen_tied> s(comm, net, 2, {.rule = optim::sgd{0.1f}});
  s.initialize(1);
  auto stream = data.batch(16).stream();
  while (true) {
    auto a = stream.next(), b = stream.next();
    if (!a || !b) break;
    const data::host_batch two[] = {*a, *b};
    s.step(two);
  }
  const std::vector<float> trained(s.parameters().begin(), s.parameters().end());
  const auto reference = torch_sgd(data.batch(32), 0.1f);
  INFO("relative gap " << relative_gap(trained, reference));
  CHECK(relative_gap(trained, reference) <= 1e-6);
  CHECK(relative_gap(reference, test::flat(test::distinct_trainable(*frozen_tied_net()))) > 1e-3);  // it moved
  for (std::size_t k = 0; k < 2; ++k) {
    const auto f = s.model(k).module()[0]->as<::torch::nn::Linear>();
    CHECK_FALSE(f->weight.requires_grad());
    CHECK(::torch::all(f->weight == 0.5f).item<bool>());
  }
}

TEST_CASE("torch: ring-allreduce with a tie and a frozen layer: overlap on and off bitwise, as one process",
          "[torch][collectives][overlap][state]") {
  const std::size_t ranks = 2, batch = 8, steps = 4;
  const auto data = test::synthetic(ranks * batch * steps, 12, test::labels::argmax).batch(ranks * batch);
  std::vector<std::vector<float>> by_overlap[2];
  for (bool overlap : {false, true}) {
    auto& result = by_overlap[overlap];
    result.resize(ranks);
    const auto failures = test::run_ranks_collect(ranks, {}, [&](communicator& c) {
      frozen_tied net;
      strategies::ring_allreduce<frozen_tied> r(c, net, {.rule = optim::sgd{0.1f}, .overlap = overlap, .bucket_bytes = 1});
      RANK_CHECK(r.overlaps() == overlap, r.overlaps());
      r.initialize(5);
      auto stream = data.stream();
      while (auto b = stream.next()) r.step(rows_of(*b, c.rank() * batch, batch));
      result[c.rank()].assign(r.parameters().begin(), r.parameters().end());
    });
    for (std::size_t k = 0; k < ranks; ++k) {
      INFO("rank " << k);
      REQUIRE((failures[k] ? test::message_of(failures[k]) : std::string()) == "");
    }
  }
  const auto reference = torch_sgd(data, 0.1f);
  INFO("relative gap to LibTorch alone " << relative_gap(by_overlap[1][0], reference));
  CHECK(by_overlap[1] == by_overlap[0]);
  CHECK(by_overlap[1][1] == by_overlap[1][0]);
  CHECK(relative_gap(by_overlap[1][0], reference) <= 1e-5);
}

TEST_CASE("torch: init_from::module gives a loaded module's values back bit for bit through a ps and ring-allreduce",
          "[torch][strategies][state]") {
  // A pretrained module: values of its own, saved and loaded with LibTorch.
  std::string saved;
  {
    auto m = test::torch_small_net();
    ::torch::manual_seed(21);
    ::torch::NoGradGuard no_grad;
    for (auto& t : m->parameters()) t.normal_(0.0, 2.0);
    std::ostringstream out;
    ::torch::save(m, out);
    saved = out.str();
  }
  auto loaded = [&] {
    auto m = test::torch_small_net();
    std::istringstream in(saved);
    ::torch::load(m, in);
    return m;
  };
  const auto values = test::flat(test::distinct_trainable(*loaded()));
  struct tuned : dtf::libtorch::module_model<::torch::nn::Sequential> {
    explicit tuned(::torch::nn::Sequential m) : module_model(std::move(m), {.init = dtf::libtorch::init_from::module}) {}
  };
  // Through a ps: the chief initialises it, no step is taken, the ps holds the loaded values.
  {
    running_ps ps0(opts("ps.0"));
    tuned net(loaded());
    const auto layout = partitioners::greedy_load_balancing{}.place(net.variables(), 1);
    ps_client client({ps0.address()}, layout, opts("worker.0"));
    client.connect();
    strategies::async_worker<strategies::downpour, tuned> w(strategies::downpour(strategies::downpour_config{}), net, client, 0, 1);
    w.initialize_ps(3);
    std::vector<float> held(values.size());
    client.pull(held);
    CHECK(held == values);
  }
  // Through ring-allreduce over 2 ranks: rank 0's module's values on every rank (rank 1's module
  // holds other values).
  std::vector<std::vector<float>> held(2);
  const auto failures = test::run_ranks_collect(2, {}, [&](communicator& c) {
    tuned net(c.rank() == 0 ? loaded() : test::torch_small_net());
    strategies::ring_allreduce<tuned> r(c, net, {.rule = optim::sgd{0.1f}});
    r.initialize(3);
    held[c.rank()].assign(r.parameters().begin(), r.parameters().end());
  });
  for (std::size_t k = 0; k < 2; ++k) {
    INFO("rank " << k);
    REQUIRE((failures[k] ? test::message_of(failures[k]) : std::string()) == "");
    CHECK(held[k] == values);
  }
}

namespace {

/// torch_small_net() from seed 31, built one at a time (test::seeded).
::torch::nn::Sequential seeded_small_net() { return test::seeded(31, test::torch_small_net); }

/// Cross-entropy after zero_grad(set_to_none) on its module (LibTorch 2's default zeroing, here
/// in the loss): every .grad() dtf lent is undefined when backward starts.
struct clears_grads {
  mutable ::torch::nn::Sequential m;  // a holder: it shares the module
  ::torch::Tensor operator()(const ::torch::Tensor& logits, const ::torch::Tensor& labels) const {
    m->zero_grad(/*set_to_none=*/true);
    return ::torch::nn::functional::cross_entropy(logits, labels);
  }
};

/// Cross-entropy whose gradient it also accumulates itself with create_graph (as a loss with a
/// gradient penalty might): LibTorch's AccumulateGrad then replaces each .grad() with a new
/// tensor (it adds out of place); the caller's backward adds the same gradient again: 2 g.
struct backward_with_graph {
  ::torch::Tensor operator()(const ::torch::Tensor& logits, const ::torch::Tensor& labels) const {
    auto loss = ::torch::nn::functional::cross_entropy(logits, labels);
    ::torch::autograd::backward({loss}, {}, /*keep_graph=*/true, /*create_graph=*/true);
    return loss;
  }
};

template <class Loss>
struct replacing : dtf::libtorch::module_model<::torch::nn::Sequential, Loss> {
  using base = dtf::libtorch::module_model<::torch::nn::Sequential, Loss>;
  explicit replacing(::torch::nn::Sequential m) : base(m, {.init = dtf::libtorch::init_from::module}, loss_for(m)) {}
  static Loss loss_for(const ::torch::nn::Sequential& m) {
    if constexpr (std::is_same_v<Loss, clears_grads>)
      return {m};
    else
      return {};
  }
};

/// LibTorch alone running the same loss: SGD on seeded_small_net() over data's batches (the
/// .grad()s undefined before each step, as a LibTorch 2 loop leaves them).
template <class Loss>
std::vector<float> torch_sgd_with(const data::dataset& data, float lr) {
  auto m = seeded_small_net();
  const auto loss = replacing<Loss>::loss_for(m);
  const auto params = test::distinct_trainable(*m);
  auto s = data.stream();
  while (auto b = s.next()) {
    const auto n = std::int64_t(b->labels.size());
    auto x = ::torch::from_blob(const_cast<float*>(b->features.data()), {n, 8}).clone();
    auto y = ::torch::from_blob(const_cast<std::int32_t*>(b->labels.data()), {n}, ::torch::kInt).to(::torch::kLong);
    for (const auto& t : params) t.mutable_grad() = ::torch::Tensor();
    loss(m->forward(x), y).backward();
    ::torch::NoGradGuard no_grad;
    for (const auto& t : params) t.sub_(t.grad() * lr);
  }
  return test::flat(params);
}

/// Ring-allreduce over 2 ranks with overlap on and off: bitwise equal, and as LibTorch alone.
template <class Loss>
void check_replaced_gradients(const char* what) {
  INFO(what);
  const std::size_t ranks = 2, batch = 8, steps = 3;
  const auto data = test::synthetic(ranks * batch * steps, 13, test::labels::argmax).batch(ranks * batch);
  std::vector<std::vector<float>> by_overlap[2];
  for (bool overlap : {false, true}) {
    auto& result = by_overlap[overlap];
    result.resize(ranks);
    const auto failures = test::run_ranks_collect(ranks, {}, [&](communicator& c) {
      replacing<Loss> net(seeded_small_net());
      strategies::ring_allreduce<replacing<Loss>> r(c, net, {.rule = optim::sgd{0.1f}, .overlap = overlap, .bucket_bytes = 1});
      RANK_CHECK(r.overlaps() == overlap, r.overlaps());
      r.initialize(5);
      auto stream = data.stream();
      while (auto b = stream.next()) r.step(rows_of(*b, c.rank() * batch, batch));
      result[c.rank()].assign(r.parameters().begin(), r.parameters().end());
    });
    for (std::size_t k = 0; k < ranks; ++k) {
      INFO("rank " << k);
      REQUIRE((failures[k] ? test::message_of(failures[k]) : std::string()) == "");
    }
  }
  const auto reference = torch_sgd_with<Loss>(data, 0.1f);
  INFO("relative gap to LibTorch alone " << relative_gap(by_overlap[1][0], reference));
  CHECK(by_overlap[1] == by_overlap[0]);
  CHECK(by_overlap[1][1] == by_overlap[1][0]);
  CHECK(relative_gap(by_overlap[1][0], reference) <= 1e-5);
  CHECK(relative_gap(reference, test::flat(test::distinct_trainable(*seeded_small_net()))) > 1e-3);  // it moved
}

}  // namespace

TEST_CASE("torch: a .grad() the loss cleared (set_to_none) or replaced (create_graph) is reduced whole: ring "
          "overlap on and off bitwise, as LibTorch alone",
          "[torch][collectives][overlap]") {
  check_replaced_gradients<clears_grads>("zero_grad(set_to_none) in the loss");
  check_replaced_gradients<backward_with_graph>("a backward with create_graph in the loss");
}

// The general step (dtf/torch/step.hpp): a module of two inputs regressing a float target, all
// three columns of dtf's feature rows, trained through loss(module, batch).
namespace {

struct TwoInputImpl : ::torch::nn::Cloneable<TwoInputImpl> {
  TwoInputImpl() { reset(); }
  void reset() override {
    a = register_module("a", ::torch::nn::Linear(3, 8));
    b = register_module("b", ::torch::nn::Linear(4, 8));
    out = register_module("out", ::torch::nn::Linear(8, 1));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x1, const ::torch::Tensor& x2) {
    return out->forward(::torch::tanh(a->forward(x1) + b->forward(x2)));
  }
  ::torch::nn::Linear a{nullptr}, b{nullptr}, out{nullptr};
};
struct TwoInput : ::torch::nn::ModuleHolder<TwoInputImpl> {  // TORCH_MODULE(TwoInput), but for `using namespace dtf`
  using ModuleHolder::ModuleHolder;
  TwoInput() : ModuleHolder(std::make_shared<TwoInputImpl>()) {}
};

/// TwoInput from seed 41, built one at a time (test::seeded).
TwoInput two_input_net() { return test::seeded(41, [] { return TwoInput(); }); }

/// Mean squared error of the prediction from columns 0-2 and 3-6 against column 7.
struct mse_step {
  ::torch::Tensor operator()(TwoInput& m, const dtf::libtorch::batch& b) const {
    return ::torch::mse_loss(m->forward(b["x1"], b["x2"]), b["y"]);
  }
};

struct two_input : dtf::libtorch::module_model<TwoInput, mse_step> {
  two_input()
      : module_model(two_input_net(), {.init = dtf::libtorch::init_from::module, .inputs = {{"x1", 3}, {"x2", 4}, {"y", 1}}}) {}
};
static_assert(streams_gradients<two_input> && evaluates_loss<two_input>);
static_assert(!classifier<two_input>, "a step of the module's own has no logits");

/// LibTorch alone: the same module and loss, the columns sliced by hand; SGD over data's batches.
std::vector<float> torch_mse_sgd(const data::dataset& data, float lr) {
  auto m = two_input_net();
  const auto params = test::distinct_trainable(*m);
  auto s = data.stream();
  while (auto b = s.next()) {
    const auto n = std::int64_t(b->labels.size());
    const auto x = ::torch::from_blob(const_cast<float*>(b->features.data()), {n, 8}).clone();
    for (const auto& t : params) t.mutable_grad() = ::torch::Tensor();
    ::torch::mse_loss(m->forward(x.slice(1, 0, 3), x.slice(1, 3, 7)), x.slice(1, 7, 8)).backward();
    ::torch::NoGradGuard no_grad;
    for (const auto& t : params) t.sub_(t.grad() * lr);
  }
  return test::flat(params);
}

}  // namespace

TEST_CASE("torch: a two-input module with a float target (MSE) through a step of its own: ring-allreduce over 2 "
          "ranks and SyncSGD through a ps train as LibTorch alone",
          "[torch][step]") {
  const std::size_t ranks = 2, batch = 8, steps = 4;
  const auto rows = test::synthetic(ranks * batch * steps, 17, test::labels::random);
  const auto data = rows.batch(ranks * batch);
  const auto start = test::flat(test::distinct_trainable(*two_input_net()));
  std::vector<std::vector<float>> by_overlap[2];
  for (bool overlap : {false, true}) {
    auto& result = by_overlap[overlap];
    result.resize(ranks);
    const auto failures = test::run_ranks_collect(ranks, {}, [&](communicator& c) {
      two_input net;
      strategies::ring_allreduce<two_input> r(c, net, {.rule = optim::sgd{0.1f}, .overlap = overlap, .bucket_bytes = 1});
      RANK_CHECK(r.overlaps() == overlap, r.overlaps());
      r.initialize(5);
      auto stream = data.stream();
      while (auto b = stream.next()) r.step(rows_of(*b, c.rank() * batch, batch));
      result[c.rank()].assign(r.parameters().begin(), r.parameters().end());
    });
    for (std::size_t k = 0; k < ranks; ++k) {
      INFO("rank " << k);
      REQUIRE((failures[k] ? test::message_of(failures[k]) : std::string()) == "");
    }
  }
  const auto reference = torch_mse_sgd(data, 0.1f);  // the combined batch of 16
  INFO("ring: relative gap to LibTorch alone " << relative_gap(by_overlap[1][0], reference));
  CHECK(by_overlap[1] == by_overlap[0]);
  CHECK(by_overlap[1][1] == by_overlap[1][0]);
  CHECK(relative_gap(by_overlap[1][0], reference) <= 1e-5);
  CHECK(relative_gap(reference, start) > 1e-3);  // it moved

  // SyncSGD, one worker against one ps (the ps applies SGD): LibTorch alone at the worker's batch.
  const auto small = rows.batch(batch);
  running_ps ps0(opts("ps.0"));
  two_input net;
  const auto layout = partitioners::greedy_load_balancing{}.place(net.variables(), 1);
  ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  strategies::sync_worker<strategies::sync_sgd, two_input> w(
      strategies::sync_sgd({.replicas_to_aggregate = 1, .rule = optim::sgd{0.1f}}), net, client, 0);
  w.initialize_ps(3);
  w.begin();
  auto s = small.stream();
  while (auto b = s.next()) w.step(*b);
  w.end();
  std::vector<float> centre(net.num_parameters());
  client.pull(centre);
  const auto ps_reference = torch_mse_sgd(small, 0.1f);
  INFO("sync_sgd: relative gap to LibTorch alone " << relative_gap(centre, ps_reference));
  CHECK(relative_gap(centre, ps_reference) <= 1e-6);
  CHECK(relative_gap(ps_reference, start) > 1e-3);
}

namespace {

/// Cross-entropy with label smoothing 0.2: not the softmax cross-entropy dtf computes itself.
struct smoothed {
  ::torch::Tensor operator()(const ::torch::Tensor& logits, const ::torch::Tensor& labels) const {
    return ::torch::nn::functional::cross_entropy(
        logits, labels, ::torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(0.2));
  }
};

/// seeded_small_net() with its parameters times 5: confident logits, where smoothing matters.
::torch::nn::Sequential sharp_net() {
  auto m = seeded_small_net();
  ::torch::NoGradGuard no_grad;
  for (auto& t : m->parameters()) t.mul_(5.0f);
  return m;
}

}  // namespace

TEST_CASE("torch: evaluation reports the model's own loss (label smoothing, a step's MSE), as LibTorch computes it",
          "[torch][step][evaluate]") {
  const auto test_set = test::synthetic(50, 23, test::labels::argmax);
  const auto all = [&] {  // the whole set as LibTorch tensors
    auto b = test_set.batch(50).stream().next();
    const auto x = ::torch::from_blob(const_cast<float*>(b->features.data()), {50, 8}).clone();
    const auto y = ::torch::from_blob(const_cast<std::int32_t*>(b->labels.data()), {50}, ::torch::kInt).to(::torch::kLong);
    return std::pair{x, y};
  }();
  {
    dtf::libtorch::module_model<::torch::nn::Sequential, smoothed> net(sharp_net(),
                                                                    {.init = dtf::libtorch::init_from::module});
    std::vector<float> p(net.num_parameters());
    net.initialize(p, 1);
    const auto e = dtf::evaluate_on(net, test_set.batch(16))(p);  // batches of 16, 16, 16 and 2
    auto m = sharp_net();
    ::torch::NoGradGuard no_grad;
    const auto logits = m->forward(all.first);
    const double expected = smoothed{}(logits, all.second).item<double>();
    const double plain = ::torch::nn::functional::cross_entropy(logits, all.second).item<double>();
    const double accuracy = (logits.argmax(1) == all.second).to(::torch::kDouble).mean().item<double>();
    CHECK(e.examples == 50);
    CHECK(e.loss == Approx(expected).epsilon(1e-5));
    INFO("label-smoothed " << expected << ", plain cross-entropy " << plain);
    CHECK(std::abs(expected - plain) > 1e-2);  // not cross-entropy's value
    CHECK(e.accuracy == Approx(accuracy));
  }
  {
    two_input net;
    std::vector<float> p(net.num_parameters());
    net.initialize(p, 1);
    const auto e = dtf::evaluate_on(net, test_set.batch(16))(p);
    auto m = two_input_net();
    ::torch::NoGradGuard no_grad;
    const auto err = m->forward(all.first.slice(1, 0, 3), all.first.slice(1, 3, 7)) - all.first.slice(1, 7, 8);
    const auto errors = err.contiguous();
    double sum = 0;  // by hand: the mean of the squared errors
    for (std::int64_t i = 0; i < 50; ++i) sum += double(errors.data_ptr<float>()[i]) * double(errors.data_ptr<float>()[i]);
    CHECK(e.examples == 50);
    CHECK(e.loss == Approx(sum / 50).epsilon(1e-5));
    CHECK(e.accuracy == 0);  // no logits
  }
}

TEST_CASE("torch: a step's named inputs are checked: widths, names, and inputs without a step", "[torch][step]") {
  using dtf::libtorch::module_model;
  CHECK_THROWS_WITH((module_model<TwoInput, mse_step>(two_input_net(), {.inputs = {{"x1", 3}, {"x1", 4}}})),
                    Catch::Contains("'x1' is named twice"));
  CHECK_THROWS_WITH((module_model<TwoInput, mse_step>(two_input_net(), {.inputs = {{"x1", 0}}})),
                    Catch::Contains("'x1' has width 0"));
  CHECK_THROWS_WITH((module_model<::torch::nn::Sequential>(seeded_small_net(), {.inputs = {{"x", 8}}})),
                    Catch::Contains("named inputs are for a step"));
  module_model<TwoInput, mse_step> short_net(two_input_net(), {.inputs = {{"x1", 3}, {"x2", 4}}});
  std::vector<float> p(short_net.num_parameters()), g(p.size());
  short_net.initialize(p, 1);
  tensor x, y;
  auto b = test::synthetic(4, 1, test::labels::argmax).batch(4).stream().next();
  assign_from_host(x, b->features);
  assign_from_host(y, b->labels);
  CHECK_THROWS_WITH(short_net.loss_and_gradients(p, x, y, g), Catch::Contains("take 7 columns, the features have 8"));
  // The guide's form: a lambda, the model's type deduced; the same loss as mse_step's.
  auto lambda = [](TwoInput& m, const dtf::libtorch::batch& b) {
    return ::torch::mse_loss(m->forward(b["x1"], b["x2"]), b["y"]);
  };
  dtf::libtorch::module_model deduced(two_input_net(), {.inputs = {{"x1", 3}, {"x2", 4}, {"y", 1}}}, lambda);
  static_assert(std::is_same_v<decltype(deduced), module_model<TwoInput, decltype(lambda)>>);
  two_input named;
  std::vector<float> g2(g.size());
  CHECK(deduced.loss_and_gradients(p, x, y, g) == named.loss_and_gradients(p, x, y, g2));
  CHECK(g == g2);
  module_model<TwoInput, decltype(lambda)> unnamed(two_input_net(), {.inputs = {{"x1", 3}, {"x2", 4}, {"target", 1}}});
  CHECK_THROWS_WITH(unnamed.loss_and_gradients(p, x, y, g), Catch::Contains("no input 'y' (options.inputs: x1, x2, target)"));
}

TEST_CASE("libtorch namespace: after `using namespace dtf`, torch:: names LibTorch", "[torch][namespace]") {
  // Without DTF_NO_LEGACY_TORCH_NAMESPACE the alias dtf::torch would make this ambiguous.
  const torch::Tensor t = torch::ones({2, 3});
  const libtorch::module_options o{};
  CHECK(t.sum().item<float>() == 6.0f);
  CHECK(o.threads == 0);
}


namespace {

/// Linear(8, 12), ReLU, Linear(12, 10), ReLU, Linear(10, 3), registered in reverse of their
/// use (the head first): named_parameters() lists head, mid, in, and backward finishes them in
/// that order too, so the buffer's layout is the reverse of plan_buckets' (top-down) assumption.
struct ReversedImpl : ::torch::nn::Cloneable<ReversedImpl> {
  ReversedImpl() { reset(); }
  void reset() override {
    head = register_module("head", ::torch::nn::Linear(10, 3));
    mid = register_module("mid", ::torch::nn::Linear(12, 10));
    in = register_module("in", ::torch::nn::Linear(8, 12));
  }
  ::torch::Tensor forward(::torch::Tensor x) {
    return head->forward(::torch::relu(mid->forward(::torch::relu(in->forward(x)))));
  }
  ::torch::nn::Linear head{nullptr}, mid{nullptr}, in{nullptr};
};
TORCH_MODULE(Reversed);

/// Reversed() from seed 41, built one at a time (test::seeded).
Reversed seeded_reversed() { return test::seeded(41, [] { return Reversed(); }); }

/// Buckets as [begin, end, begin, end, ...] (Catch prints that; gradient_bucket has no operator<<).
std::vector<std::size_t> flat_buckets(const std::vector<strategies::detail::gradient_bucket>& bs) {
  std::vector<std::size_t> out;
  for (const auto& b : bs) out.insert(out.end(), {b.begin, b.end});
  return out;
}

struct reversed_model : dtf::libtorch::module_model<Reversed> {
  reversed_model() : module_model(seeded_reversed(), {.init = dtf::libtorch::init_from::module}) {}
};

}  // namespace

TEST_CASE("torch: ring-allreduce cuts its buckets again after the first step in the backward's order (a module "
          "declared in reverse of use): overlap on and off bitwise, as LibTorch alone",
          "[torch][collectives][overlap]") {
  using strategies::detail::gradient_bucket;
  constexpr std::size_t pre = strategies::detail::exchange_prefix;
  const std::size_t ranks = 2, batch = 8, steps = 3;
  const auto data = test::synthetic(ranks * batch * steps, 19, test::labels::argmax).batch(ranks * batch);
  // The backward's order, observed independently: the ready callback of a lone model's step.
  reversed_model lone;
  const auto vars = lone.variables();
  REQUIRE(vars.size() == 6);
  std::vector<std::string> ready_names;
  {
    std::vector<float> p(lone.num_parameters()), g(p.size());
    lone.initialize(p, 5);
    auto b = *data.stream().next();
    tensor x, y;
    assign_from_host(x, b.features);
    assign_from_host(y, b.labels);
    lone.loss_and_gradients(p, x, y, g, [&](std::size_t first, std::size_t) {
      for (const auto& v : vars)
        if (v.offset == first) ready_names.push_back(v.name);
    });
  }
  REQUIRE(ready_names.size() == 6);
  for (std::size_t k = 0; k < 6; ++k)  // head's two first, then mid's, then in's
    CHECK(ready_names[k].substr(0, ready_names[k].find('.')) == std::vector<std::string>{"head", "mid", "in"}[k / 2]);
  CHECK(vars.front().name.rfind("head.", 0) == 0);  // declared first: the bottom of the buffer

  std::vector<std::vector<float>> by_overlap[2];
  std::vector<gradient_bucket> before[2], after[2];
  for (bool overlap : {false, true}) {
    auto& result = by_overlap[overlap];
    result.resize(ranks);
    const auto failures = test::run_ranks_collect(ranks, {}, [&](communicator& c) {
      reversed_model net;
      strategies::ring_allreduce<reversed_model> r(c, net, {.rule = optim::sgd{0.1f}, .overlap = overlap, .bucket_bytes = 1});
      RANK_CHECK(r.overlaps() == overlap, r.overlaps());
      r.initialize(5);
      if (c.rank() == 0) before[overlap] = r.buckets();
      auto stream = data.stream();
      while (auto b = stream.next()) {
        r.step(rows_of(*b, c.rank() * batch, batch));
        if (c.rank() == 0 && r.global_step() == 1) after[overlap] = r.buckets();
      }
      result[c.rank()].assign(r.parameters().begin(), r.parameters().end());
    });
    for (std::size_t k = 0; k < ranks; ++k) {
      INFO("rank " << k);
      REQUIRE((failures[k] ? test::message_of(failures[k]) : std::string()) == "");
    }
  }
  // Before: plan_buckets' cut, from the top of the buffer (in's bias) down. After the first
  // step: one bucket per variable in the order the backward reported them, the prefix last.
  CHECK(flat_buckets(before[1]) == flat_buckets(strategies::detail::plan_buckets(vars, pre, 1)));
  CHECK(flat_buckets(after[0]) == flat_buckets(after[1]));
  REQUIRE(after[1].size() == 7);
  for (std::size_t k = 0; k < 6; ++k) {
    const auto& v = *std::find_if(vars.begin(), vars.end(), [&](const auto& s) { return s.name == ready_names[k]; });
    CHECK(flat_buckets({after[1][k]}) == std::vector<std::size_t>{pre + v.offset, pre + v.offset + v.size()});
  }
  CHECK(flat_buckets({after[1][6]}) == std::vector<std::size_t>{0, pre});
  CHECK(flat_buckets(after[1]) != flat_buckets(before[1]));

  // LibTorch alone at the summed batch: SGD on the same module over data's batches.
  auto m = seeded_reversed();
  const auto params = test::distinct_trainable(*m);
  auto s = data.stream();
  while (auto b = s.next()) {
    const auto n = std::int64_t(b->labels.size());
    auto x = ::torch::from_blob(const_cast<float*>(b->features.data()), {n, 8}).clone();
    auto y = ::torch::from_blob(const_cast<std::int32_t*>(b->labels.data()), {n}, ::torch::kInt).to(::torch::kLong);
    for (const auto& t : params) t.mutable_grad() = ::torch::Tensor();
    ::torch::nn::functional::cross_entropy(m->forward(x), y).backward();
    ::torch::NoGradGuard no_grad;
    for (const auto& t : params) t.sub_(t.grad() * 0.1f);
  }
  const auto reference = test::flat(params);
  INFO("relative gap to LibTorch alone " << relative_gap(by_overlap[1][0], reference));
  CHECK(by_overlap[1] == by_overlap[0]);
  CHECK(by_overlap[1][1] == by_overlap[1][0]);
  CHECK(relative_gap(by_overlap[1][0], reference) <= 1e-5);
  CHECK(relative_gap(reference, test::flat(test::distinct_trainable(*seeded_reversed()))) > 1e-3);  // it moved
}

TEST_CASE("torch: a module declared in its backward's order keeps plan_buckets' cut after the first step",
          "[torch][collectives][overlap]") {
  // The twin (Linear(8, 16), ReLU, Linear(16, 3)) reports from the top of its buffer down: the
  // buckets after the first step are those before, so its steps are those of before the rebuild.
  const auto data = test::synthetic(32, 23, test::labels::argmax).batch(16);
  std::vector<strategies::detail::gradient_bucket> before, after;
  const auto failures = test::run_ranks_collect(2, {}, [&](communicator& c) {
    torch_twin net;
    strategies::ring_allreduce<torch_twin> r(c, net, {.rule = optim::sgd{0.1f}, .bucket_bytes = 1});
    r.initialize(5);
    const auto b0 = r.buckets();
    auto stream = data.stream();
    while (auto b = stream.next()) r.step(rows_of(*b, c.rank() * 8, 8));
    if (c.rank() == 0) before = b0, after = r.buckets();
  });
  for (std::size_t k = 0; k < 2; ++k) REQUIRE((failures[k] ? test::message_of(failures[k]) : std::string()) == "");
  CHECK(before.size() == 4);
  CHECK(flat_buckets(after) == flat_buckets(before));
}
