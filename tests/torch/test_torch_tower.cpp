// dtf::libtorch::embedding_tower: a LibTorch module as the dense part of an embedding model. The
// reference is LibTorch alone: the same module over embeddings looked up by hand (index_select
// from two leaf weight tensors, TorchRec's "sparse arch" in its simplest form), plain SGD on the
// module's parameters and on the whole weights. One process (the tower's gradients and a few
// SGD steps), the hybrid strategy on 2 ranks over 1 ps (synchronous tables: one process at the
// summed batch) and Hogwild with one worker (dense part and rows as the reference). And
// examples/recommender's LibTorch top against its dtf::nn top (model.hpp) with the same weights.
#include <dtf/nn/init.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/hybrid.hpp>
#include <dtf/torch/embedding_tower.hpp>

#include <catch2/catch.hpp>
#include <xtensor/xview.hpp>

#include "../../examples/recommender/torch_model.hpp"
#include "../helpers.hpp"
#include "../ps_helpers.hpp"
#include "../rank_helpers.hpp"
#include "../sparse_helpers.hpp"

#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tower_test {

// N numeric columns; table "a" (fixed, Va rows) looked up La times per example, table "b"
// (hashed, ids below Vb) once; rows of dim D; H hidden units; K classes.
constexpr std::int64_t N = 2, Va = 7, La = 2, Vb = 5, D = 3, H = 6, K = 4, F = La + 1;

// A DLRM-like top: [numeric | the rows concatenated | <row 0, row 1>] -> Linear, ReLU, Linear.
struct TopImpl : ::torch::nn::Cloneable<TopImpl> {
  TopImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", ::torch::nn::Linear(N + F * D + 1, H));
    fc2 = register_module("fc2", ::torch::nn::Linear(H, K));
  }
  ::torch::Tensor forward(const ::torch::Tensor& numeric, const ::torch::Tensor& rows) {
    const auto dot = (rows.select(1, 0) * rows.select(1, 1)).sum(1, /*keepdim=*/true);
    return fc2(::torch::relu(fc1(::torch::cat({numeric, rows.flatten(1), dot}, 1))));
  }
  ::torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Top);

using tower = dtf::libtorch::embedding_tower<Top>;
static_assert(dtf::embedding_classifier<tower>);
static_assert(dtf::streams_row_gradients<tower>);

// The same initial values every time (ranks build theirs on threads: the seed and LibTorch's one
// generator under a lock).
Top make_top() {
  static std::mutex building;
  std::lock_guard held(building);
  ::torch::manual_seed(23);
  return Top();
}

dtf::embedding_spec spec_a() { return {.name = "a", .rows = std::uint64_t(Va), .dim = D, .init = {.scale = 0.4f, .seed = 5}}; }
dtf::embedding_spec spec_b() { return {.name = "b", .rows = 0, .dim = D, .init = {.scale = 0.4f, .seed = 6}}; }

tower make_tower() {
  return tower(make_top(), {.numeric = N, .tables = {{.table = spec_a(), .lookups = La}, {.table = spec_b()}}},
               {.init = dtf::libtorch::init_from::module});
}

// A table's first `rows` rows as its initialiser fills them, [rows, D].
::torch::Tensor initial_weights(const dtf::embedding_spec& s, std::int64_t rows) {
  auto w = ::torch::empty({rows, D});
  for (std::int64_t v = 0; v < rows; ++v)
    s.init(std::uint64_t(v), std::span<float>(w.data_ptr<float>() + v * D, std::size_t(D)));
  return w.requires_grad_(true);
}

// n examples: N numeric values, La ids of a (repeats), one id of b; labels in [0, K).
dtf::data::dataset tower_data(std::size_t n, std::uint64_t seed) {
  dtf::nn::splitmix64 rng(seed);
  xt::xtensor<float, 2> x = xt::xtensor<float, 2>::from_shape({n, std::size_t(N + F)});
  xt::xtensor<std::int32_t, 1> y = xt::xtensor<std::int32_t, 1>::from_shape({n});
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < std::size_t(N); ++c) x(i, c) = float(rng() % 1000) / 500.0f - 1.0f;
    for (std::size_t c = 0; c < std::size_t(La); ++c) x(i, N + c) = float(rng() % Va);
    x(i, N + La) = float(rng() % Vb);
    y(i) = std::int32_t(rng() % K);
  }
  return dtf::data::dataset(std::move(x), std::move(y), -1.0f, 1.0f);
}

// LibTorch alone: the module over rows looked up from the weights a and b by hand, plain SGD
// (lr on the module, table_lr on the rows).
struct reference {
  Top top = make_top();
  ::torch::Tensor a = initial_weights(spec_a(), Va), b = initial_weights(spec_b(), Vb);
  float step(const dtf::data::host_batch& batch, float lr, float table_lr) {
    const auto n = std::int64_t(batch.labels.size());
    const auto x = ::torch::from_blob(const_cast<float*>(batch.features.data()), {n, N + F}).clone();
    const auto y = ::torch::from_blob(const_cast<std::int32_t*>(batch.labels.data()), {n}, ::torch::kInt).to(::torch::kLong);
    const auto ids = x.narrow(1, N, F).to(::torch::kLong);
    const auto rows = ::torch::cat({a.index_select(0, ids.narrow(1, 0, La).reshape({-1})).view({n, La, D}),
                                    b.index_select(0, ids.select(1, La)).view({n, 1, D})},
                                   1);
    for (auto& t : top->parameters()) t.mutable_grad() = ::torch::Tensor();
    a.mutable_grad() = ::torch::Tensor();
    b.mutable_grad() = ::torch::Tensor();
    const auto loss = ::torch::nn::functional::cross_entropy(top->forward(x.narrow(1, 0, N), rows), y);
    loss.backward();
    ::torch::NoGradGuard no_grad;
    for (auto& t : top->parameters()) t.sub_(t.grad() * lr);
    a.sub_(a.grad() * table_lr);
    b.sub_(b.grad() * table_lr);
    return loss.item<float>();
  }
  std::vector<float> dense() const {  // in the tower's variable order (fc1, fc2)
    std::vector<float> out;
    for (const auto& t : top->parameters()) {
      const auto c = t.detach().contiguous();
      out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    }
    return out;
  }
  static std::vector<float> flat(const ::torch::Tensor& w) {
    const auto c = w.detach().contiguous();
    return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
  }
};

void check_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(what << " [" << i << "]");
    CHECK(got[i] == Approx(want[i]).margin(1e-5));
  }
}

dtf::data::host_batch part_of(const dtf::data::host_batch& b, std::size_t k, std::size_t n) {
  dtf::data::host_batch out;
  out.features = xt::view(b.features, xt::range(k * n, (k + 1) * n), xt::all());
  out.labels = xt::view(b.labels, xt::range(k * n, (k + 1) * n));
  return out;
}

std::vector<std::uint64_t> upto(std::int64_t n) {
  std::vector<std::uint64_t> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

TEST_CASE("torch tower: one process, a few SGD steps, equals LibTorch alone over embeddings looked up by hand",
          "[torch][tower]") {
  auto net = make_tower();
  const auto vars = net.variables();
  REQUIRE(vars.size() == 4);
  CHECK(vars[0].name == "fc1.weight");  // the module's own names
  CHECK(net.embeddings().size() == 2);
  std::vector<float> theta(net.num_parameters());
  net.initialize(theta, 3);
  reference ref;
  check_close(theta, ref.dense(), "initial dense");
  const auto initial = theta;
  auto table_a = reference::flat(ref.a), table_b = reference::flat(ref.b);
  const float lr = 0.2f, table_lr = 0.5f;
  auto stream = tower_data(24, 9).batch(8).stream();
  while (auto b = stream.next()) {
    // The tower's step with rows gathered here, as a strategy does; SGD on the host.
    std::vector<dtf::detail::batch_ids> ids(2);
    std::vector<std::vector<float>> values(2), grads(2);
    std::vector<dtf::embedding_rows> rows(2);
    for (std::size_t t = 0; t < 2; ++t) {
      net.embedding_ids(*b, t, ids[t].all);
      ids[t].deduplicate();
      auto& table = t == 0 ? table_a : table_b;
      for (auto id : ids[t].unique)
        values[t].insert(values[t].end(), table.begin() + std::ptrdiff_t(id * D), table.begin() + std::ptrdiff_t((id + 1) * D));
      grads[t].assign(values[t].size(), 1.0f);  // overwritten, not accumulated
      rows[t] = {std::uint32_t(D), ids[t].index, values[t], grads[t]};
    }
    dtf::tensor x, y;
    dtf::assign_from_host(x, b->features);
    dtf::assign_from_host(y, b->labels);
    std::vector<float> g(theta.size());
    const float loss = net.loss_and_gradients(theta, std::span<const dtf::embedding_rows>(rows), x, y, g);
    for (std::size_t i = 0; i < theta.size(); ++i) theta[i] -= lr * g[i];
    for (std::size_t t = 0; t < 2; ++t) {
      auto& table = t == 0 ? table_a : table_b;
      for (std::size_t u = 0; u < ids[t].unique.size(); ++u)
        for (std::size_t k = 0; k < std::size_t(D); ++k) table[ids[t].unique[u] * D + k] -= table_lr * grads[t][u * D + k];
    }
    CHECK(loss == Approx(ref.step(*b, lr, table_lr)).epsilon(1e-6));
  }
  check_close(theta, ref.dense(), "dense");
  check_close(table_a, reference::flat(ref.a), "table a");
  check_close(table_b, reference::flat(ref.b), "table b");
  CHECK(theta != initial);  // it moved
  net.set_parameters(theta);  // dtf::train's hand-over: the module then holds the trained values
  const auto w = reference::flat(net.module()->fc1->weight);
  CHECK(std::vector<float>(theta.begin(), theta.begin() + std::ptrdiff_t(w.size())) == w);
}

// A copy (a mirrored replica) is a deep copy: its module is its own, with the source's values,
// and its training leaves the source's module alone.
TEST_CASE("torch tower: a copy is deep, its module its own", "[torch][tower]") {
  auto net = make_tower();
  std::vector<float> theta(net.num_parameters());
  net.initialize(theta, 3);
  tower copy(net);
  CHECK_FALSE(copy.module()->fc1->weight.is_same(net.module()->fc1->weight));
  CHECK(copy.variables()[0].name == "fc1.weight");
  CHECK(::torch::equal(copy.module()->fc2->bias, net.module()->fc2->bias));
  auto moved = theta;
  for (auto& v : moved) v += 1.0f;
  copy.set_parameters(moved);
  CHECK(reference::flat(net.module()->fc2->bias) == std::vector<float>(theta.end() - K, theta.end()));
  CHECK(reference::flat(copy.module()->fc2->bias) == std::vector<float>(moved.end() - K, moved.end()));
}

TEST_CASE("torch tower: bad tables, ids and rows are errors naming the cause", "[torch][tower]") {
  CHECK_THROWS_WITH(tower(make_top(), {.numeric = N}), Catch::Contains("no tables"));
  auto other = spec_b();
  other.dim = D + 1;
  CHECK_THROWS_WITH(tower(make_top(), {.numeric = N, .tables = {{.table = spec_a(), .lookups = La}, {.table = other}}}),
                    Catch::Contains("table 'b' has dim 4") && Catch::Contains("one dim"));
  CHECK_THROWS_WITH(tower(make_top(), {.tables = {{.table = spec_a(), .lookups = 0}}}), Catch::Contains("no lookups"));
  CHECK_THROWS_WITH(tower(make_top(), {.tables = {{.table = spec_a()}}}, {.input_shape = {9}}),
                    Catch::Contains("input_shape"));
  auto net = make_tower();
  auto b = *tower_data(4, 1).batch(4).stream().next();
  std::vector<std::uint64_t> ids;
  net.embedding_ids(b, 1, ids);
  CHECK(ids.size() == 4);
  CHECK_THROWS_WITH(net.embedding_ids(b, 2, ids), Catch::Contains("table 2 of 2"));
  b.features(1, N + 1) = 2.5f;
  CHECK_THROWS_WITH(net.embedding_ids(b, 0, ids), Catch::Contains("feature (1, 3)") && Catch::Contains("not an id"));
  std::vector<float> p(net.num_parameters()), g(p.size());
  dtf::tensor x, y;
  dtf::assign_from_host(x, b.features);
  dtf::assign_from_host(y, b.labels);
  const std::vector<std::uint32_t> index(3, 0);  // 3 ids where the batch takes 8
  const std::vector<float> values(D);
  const dtf::embedding_rows rows[2] = {{std::uint32_t(D), index, values, {}}, {std::uint32_t(D), index, values, {}}};
  CHECK_THROWS_WITH(net.loss_and_gradients(p, std::span<const dtf::embedding_rows>(rows), x, y, g),
                    Catch::Contains("table 'a'") && Catch::Contains("takes 8"));
}

TEST_CASE("torch tower: hybrid on 2 ranks over 1 ps, synchronous tables, plain SGD, equals LibTorch alone at the "
          "summed batch",
          "[torch][tower][hybrid]") {
  using dtf::test::opts;
  const bool overlap = GENERATE(false, true);
  CAPTURE(overlap);
  const float lr = 0.2f, table_lr = 0.5f;
  constexpr std::size_t per_rank = 4;
  const auto data = tower_data(2 * per_rank * 3, 31).batch(2 * per_rank);
  const dtf::strategies::hybrid strategy({.dense = {.rule = dtf::optim::sgd{lr}, .overlap = overlap, .bucket_bytes = 64},
                                          .tables = dtf::strategies::table_updates::synchronous});
  dtf::test::running_ps ps0{opts("ps.0")};
  std::vector<std::vector<float>> dense(2), a(2), b(2), losses(2);
  dtf::collective_options co;
  co.timeout_ms = 10000;
  const auto failures = dtf::test::run_ranks_collect(2, co, [&](dtf::communicator& comm) {
    const std::size_t k = comm.rank();
    auto net = make_tower();
    dtf::ps_client client({ps0.address()}, dtf::placement{.shards = {}, .num_ps = 1}, opts("worker." + std::to_string(k)));
    client.connect();
    auto engine = strategy.make(comm, client, net);
    engine.set_embedding_rule(dtf::optim::sgd{table_lr});
    RANK_CHECK(engine.overlaps() == overlap, engine.overlaps());  // the tower streams its dense gradients
    engine.initialize(3);
    auto stream = data.stream();
    while (auto batch = stream.next()) losses[k].push_back(engine.step(part_of(*batch, k, per_rank)));
    dense[k] = dtf::test::host_copy(engine.parameters());
    comm.barrier();  // every rank's pushes applied: the rows are final
    a[k] = dtf::test::gather(engine.tables(), 0, upto(Va));
    b[k] = dtf::test::gather(engine.tables(), 1, upto(Vb));
    client.mark_done();
  });
  for (std::size_t r = 0; r < 2; ++r)
    if (failures[r]) FAIL("rank " << r << ": " << dtf::test::message_of(failures[r]));
  CHECK(dense[0] == dense[1]);  // bitwise: the ring's replicas
  CHECK(losses[0] == losses[1]);
  reference ref;
  std::vector<float> ref_losses;
  auto stream = data.stream();
  while (auto batch = stream.next()) ref_losses.push_back(ref.step(*batch, lr, table_lr));
  REQUIRE(losses[0].size() == ref_losses.size());
  for (std::size_t s = 0; s < ref_losses.size(); ++s) CHECK(losses[0][s] == Approx(ref_losses[s]).epsilon(1e-5));
  check_close(dense[0], ref.dense(), "dense");
  check_close(a[0], reference::flat(ref.a), "table a");
  check_close(b[0], reference::flat(ref.b), "table b");
}

TEST_CASE("torch tower: Hogwild with one worker over 1 ps equals LibTorch alone, dense part and rows",
          "[torch][tower][hogwild]") {
  using dtf::test::opts;
  const float lr = 0.2f, table_lr = 0.5f;
  dtf::test::running_ps ps0{opts("ps.0")};
  auto net = make_tower();
  const auto layout = dtf::partitioners::greedy_load_balancing{}.place(net.variables(), 1);
  dtf::ps_client client({ps0.address()}, layout, opts("worker.0"));
  client.connect();
  dtf::strategies::async_worker<dtf::strategies::hogwild, tower> w(
      dtf::strategies::hogwild({.learning_rate = lr, .epoch_decay = 1.0f}), net, client, 0, 1);
  w.set_embedding_rule(dtf::optim::sgd{table_lr});
  w.initialize_ps(3);
  w.begin();
  reference ref;
  auto stream = tower_data(24, 13).batch(6).stream();
  while (auto b = stream.next()) CHECK(w.step(*b) == Approx(ref.step(*b, lr, table_lr)).epsilon(1e-5));
  w.end();
  std::vector<float> centre(net.num_parameters());
  client.pull(centre);
  check_close(centre, ref.dense(), "dense");
  check_close(dtf::test::gather(w.tables(), 0, upto(Va)), reference::flat(ref.a), "table a");
  check_close(dtf::test::gather(w.tables(), 1, upto(Vb)), reference::flat(ref.b), "table b");
}

// examples/recommender: torch_model.hpp's LibTorch top (bmm and the upper triangle, the wide part) against
// model.hpp's by hand with the same weights (Dense's kernels [in, out] are Linear's weights
// transposed): the same loss, dense gradient and rows' gradients on one batch.
TEST_CASE("torch tower: the recommender's LibTorch top equals its dtf::nn top with the same weights",
          "[torch][tower][recommender]") {
  namespace rec = examples::recommender;
  const rec::dlrm_config c{.dim = 4, .hidden = {8}};
  rec::dlrm by_hand(c);
  rec::torch_dlrm net(rec::torch_top(c), rec::torch_dlrm_input(c));
  const auto p = dtf::test::initial_parameters(by_hand, 5);
  const auto hand_vars = by_hand.variables(), torch_vars = net.variables();
  REQUIRE(hand_vars.size() == torch_vars.size());
  // p in the tower's layout, and a map from its floats back to by_hand's.
  std::vector<float> q(p.size());
  std::vector<std::size_t> from(p.size());
  for (std::size_t v = 0; v < hand_vars.size(); ++v) {
    const auto& h = hand_vars[v];
    REQUIRE(h.size() == torch_vars[v].size());
    const std::size_t rows = h.shape.size() == 2 ? h.shape[0] : 1, cols = h.shape.size() == 2 ? h.shape[1] : h.size();
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t o = 0; o < cols; ++o) {
        const std::size_t at = torch_vars[v].offset + (h.shape.size() == 2 ? o * rows + i : o);
        from[at] = h.offset + i * cols + o;
        q[at] = p[from[at]];
      }
  }
  constexpr std::size_t n = 6;
  dtf::nn::splitmix64 rng(8);
  dtf::data::host_batch b;
  b.features = xt::zeros<float>({n, rec::feature_width});
  b.labels = xt::zeros<std::int32_t>({n});
  for (std::size_t e = 0; e < n; ++e) {
    for (std::size_t j = 0; j < rec::criteo_dense_columns; ++j) b.features(e, j) = float(rng() % 100) / 50.0f;
    for (std::size_t k = 0; k < rec::criteo_categorical_columns; ++k)  // few ids: rows used several times
      b.features(e, rec::criteo_dense_columns + k * rec::id_pieces) = float(rng() % 9);
    b.labels(e) = std::int32_t(rng() % 2);
  }
  dtf::detail::batch_ids ids;
  by_hand.embedding_ids(b, 0, ids.all);
  std::vector<std::uint64_t> tower_ids;
  net.embedding_ids(b, 0, tower_ids);
  CHECK(tower_ids == ids.all);
  ids.deduplicate();
  std::vector<float> values(ids.unique.size() * (c.dim + 1));  // e_i, b_i
  for (auto& v : values) v = float(rng() % 1000) / 1000.0f - 0.5f;
  std::vector<float> hand_grads(values.size()), tower_grads(values.size());
  const dtf::embedding_rows hand_rows{c.dim + 1, ids.index, values, hand_grads},
      tower_rows{c.dim + 1, ids.index, values, tower_grads};
  dtf::tensor x, y;
  dtf::assign_from_host(x, b.features);
  dtf::assign_from_host(y, b.labels);
  std::vector<float> g_hand(p.size()), g_tower(p.size());
  const float hand_loss = dtf::test::loss_and_gradients_on_host(by_hand, p, std::span<const dtf::embedding_rows>(&hand_rows, 1),
                                                                x, y, g_hand);
  const float tower_loss = dtf::test::loss_and_gradients_on_host(net, q, std::span<const dtf::embedding_rows>(&tower_rows, 1),
                                                                 x, y, g_tower);
  CHECK(tower_loss == Approx(hand_loss).epsilon(1e-5));
  for (std::size_t i = 0; i < q.size(); ++i) {
    INFO("dense gradient [" << i << "]");
    CHECK(g_tower[i] == Approx(g_hand[from[i]]).margin(1e-5));
  }
  check_close(tower_grads, hand_grads, "rows' gradients");
}

}  // namespace tower_test
