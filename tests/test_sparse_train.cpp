// Training models with embedding tables on the ps: nn::embedding_sequential's gradients against
// a one-hot dense reference, and an asynchronous worker's steps and two synchronous workers'
// steps against a local reference of the whole model (dense parameters and the whole table
// held here).
#include <catch2/catch.hpp>

#include <dtf/nn/embedding_sequential.hpp>
#include <dtf/ps.hpp>
#include <dtf/strategies/hogwild.hpp>
#include <dtf/strategies/sync.hpp>

#include "helpers.hpp"
#include "ps_helpers.hpp"
#include "train_helpers.hpp"

#include <cmath>

using namespace dtf;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {

constexpr std::size_t V = 7, D = 3, L = 2, B = 5, H = 5, K = 4;

// B examples of L ids in [0, V) (repeats within and across examples), labels in [0, K).
data::host_batch id_batch(std::uint64_t seed) {
  nn::splitmix64 rng(seed);
  data::host_batch b;
  b.features = xt::xtensor<float, 2>::from_shape({B, L});
  b.labels = xt::xtensor<std::int32_t, 1>::from_shape({B});
  for (std::size_t i = 0; i < B; ++i) {
    for (std::size_t l = 0; l < L; ++l) b.features(i, l) = float(rng() % 4 + (l == 0 ? 0 : 3));  // 0..6, 3 shared
    b.labels(i) = std::int32_t(rng() % K);
  }
  return b;
}

nn::embedding_sequential make_net(nn::embedding_combine combine, embedding_spec table = {.name = "e", .rows = V, .dim = D}) {
  const std::size_t width = combine == nn::embedding_combine::concat ? L * D : D;
  return nn::embedding_sequential({.table = table, .ids_per_example = L, .combine = combine},
                                  nn::sequential{nn::dense(width, H), nn::relu(), nn::dense(H, K)});
}

// The whole table as the initialiser fills it.
std::vector<float> initial_table(const embedding_spec& spec, std::size_t rows) {
  std::vector<float> t(rows * spec.dim);
  for (std::size_t v = 0; v < rows; ++v) spec.init(v, std::span<float>(t).subspan(v * spec.dim, spec.dim));
  return t;
}

// The rows of a batch's distinct ids read from a dense table, and the views the model takes.
struct local_rows {
  dtf::detail::batch_ids ids;
  std::vector<float> values, grads;
  embedding_rows view;
  local_rows(nn::embedding_sequential& net, const data::host_batch& b, const std::vector<float>& table) {
    net.embedding_ids(b, 0, ids.all);
    ids.deduplicate();
    for (auto id : ids.unique) values.insert(values.end(), table.begin() + id * D, table.begin() + (id + 1) * D);
    grads.assign(values.size(), -1.0f);
    view = {D, ids.index, values, grads};
  }
};

}  // namespace

TEST_CASE("embedding_sequential's gradients equal a dense model on one-hot inputs", "[sparse][nn][train]") {
  for (auto combine : {nn::embedding_combine::concat, nn::embedding_combine::sum, nn::embedding_combine::mean}) {
    CAPTURE(int(combine));
    auto net = make_net(combine);
    const auto b = id_batch(3);
    std::vector<float> p = test::initial_parameters(net, 11), g(net.num_parameters());
    const auto table = initial_table(net.embeddings()[0], V);
    local_rows rows(net, b, table);
    tensor x, y;
    assign_from_host(x, b.features);
    assign_from_host(y, b.labels);
    const float loss =
        test::loss_and_gradients_on_host(net, p, std::span<const embedding_rows>(&rows.view, 1), x, y, g);

    // Reference: inputs one-hot (concat: one block of V per position; sum/mean: counts, / L for
    // mean) through a linear dense layer whose kernel holds the table (concat: L diagonal
    // blocks), zero bias, then the same layers.
    const bool concat = combine == nn::embedding_combine::concat;
    const std::size_t in = concat ? L * V : V, out = concat ? L * D : D;
    nn::sequential ref{nn::dense(in, out), nn::dense(out, H), nn::relu(), nn::dense(H, K)};
    std::vector<float> rp(ref.num_parameters(), 0.0f), rg(rp.size());
    for (std::size_t blk = 0; blk < (concat ? L : 1); ++blk)
      for (std::size_t v = 0; v < V; ++v)
        for (std::size_t k = 0; k < D; ++k) rp[(blk * V + v) * out + blk * D + k] = table[v * D + k];
    const std::size_t first = in * out + out;  // kernel and bias of the lookup layer
    std::copy(p.begin(), p.end(), rp.begin() + std::ptrdiff_t(first));
    xt::xtensor<float, 2> onehot = xt::zeros<float>({B, in});
    for (std::size_t i = 0; i < B; ++i)
      for (std::size_t l = 0; l < L; ++l)
        onehot(i, (concat ? l * V : 0) + std::size_t(b.features(i, l))) +=
            combine == nn::embedding_combine::mean ? 1.0f / float(L) : 1.0f;
    tensor rx;
    assign_from_host(rx, onehot);
    const float ref_loss = test::loss_and_gradients_on_host(ref, rp, rx, y, rg);
    CHECK(loss == Approx(ref_loss).epsilon(1e-6));
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(g[i] == Approx(rg[first + i]).margin(1e-6));
    // A row's gradient: the kernel gradient of its one-hot input, summed over the blocks.
    for (std::size_t u = 0; u < rows.ids.unique.size(); ++u)
      for (std::size_t k = 0; k < D; ++k) {
        double expect = 0;
        for (std::size_t blk = 0; blk < (concat ? L : 1); ++blk)
          expect += rg[(blk * V + rows.ids.unique[u]) * out + blk * D + k];
        CHECK(rows.grads[u * D + k] == Approx(expect).margin(1e-6));
      }
  }
}

TEST_CASE("embedding_sequential refuses features that are not ids, naming the place", "[sparse][nn][train]") {
  auto net = make_net(nn::embedding_combine::concat);
  auto b = id_batch(1);
  std::vector<std::uint64_t> ids;
  b.features(2, 1) = 1.5f;
  CHECK_THROWS_WITH(net.embedding_ids(b, 0, ids), Catch::Contains("feature (2, 1)") && Catch::Contains("not an id"));
  b.features(2, 1) = -1.0f;
  CHECK_THROWS_WITH(net.embedding_ids(b, 0, ids), Catch::Contains("not an id"));
  CHECK_THROWS_WITH(net.embedding_ids(b, 1, ids), Catch::Contains("table 1 of 1"));
  CHECK_THROWS_AS(nn::embedding_sequential({.table = {.name = "e", .rows = V, .dim = D}, .ids_per_example = L},
                                           nn::sequential{nn::dense(5, K)}),
                  dtf::error);
}

TEST_CASE("hogwild with an embedding model: dense and table updates equal a local reference", "[sparse][train]") {
  const bool hashed = GENERATE(false, true);
  CAPTURE(hashed);
  embedding_spec spec{.name = "words", .rows = hashed ? 0 : V, .dim = D, .init = {.scale = 0.3f, .seed = 5}};
  auto net = make_net(nn::embedding_combine::concat, spec);
  auto ref_net = make_net(nn::embedding_combine::concat, spec);
  running_ps ps0{opts("ps.0")}, ps1{opts("ps.1")};
  const auto layout = partitioners::greedy_load_balancing{}.place(net.variables(), 2);
  ps_client client({ps0.address(), ps1.address()}, layout, opts("worker.0"));
  client.connect();
  const float lr = 0.2f, table_lr = 0.5f;
  strategies::async_worker<strategies::hogwild, nn::embedding_sequential> w(
      strategies::hogwild({.learning_rate = lr, .epoch_decay = 1.0f}), net, client, 0, 1);
  w.set_embedding_rule(optim::sgd{table_lr});
  w.initialize_ps(17);
  w.begin();

  std::vector<float> theta = test::initial_parameters(ref_net, 17), g(theta.size());
  auto table = initial_table(spec, V);
  const auto initial = table;
  std::vector<bool> touched(V, false);
  for (std::uint64_t s = 0; s < 4; ++s) {
    const auto b = id_batch(100 + s);
    // Reference step: the loss at θ and the table, θ -= lr g, touched rows -= table_lr row grad.
    local_rows rows(ref_net, b, table);
    tensor x, y;
    assign_from_host(x, b.features);
    assign_from_host(y, b.labels);
    const float ref_loss =
        test::loss_and_gradients_on_host(ref_net, theta, std::span<const embedding_rows>(&rows.view, 1), x, y, g);
    for (std::size_t i = 0; i < theta.size(); ++i) theta[i] -= lr * g[i];
    for (std::size_t u = 0; u < rows.ids.unique.size(); ++u) {
      touched[rows.ids.unique[u]] = true;
      for (std::size_t k = 0; k < D; ++k) table[rows.ids.unique[u] * D + k] -= table_lr * rows.grads[u * D + k];
    }
    CHECK(w.step(b) == Approx(ref_loss).epsilon(1e-6));
  }
  std::vector<float> centre(theta.size());
  client.pull(centre);
  for (std::size_t i = 0; i < theta.size(); ++i) CHECK(centre[i] == Approx(theta[i]).margin(1e-6));
  std::vector<std::uint64_t> all(V);
  for (std::size_t v = 0; v < V; ++v) all[v] = v;
  std::vector<float> held(V * D);
  strategies::detail::read_rows(w.tables())(0, all, held);  // a hashed table creates the rows not touched yet
  for (std::size_t v = 0; v < V; ++v)
    for (std::size_t k = 0; k < D; ++k) {
      CAPTURE(v, k);
      if (touched[v])
        CHECK(held[v * D + k] == Approx(table[v * D + k]).margin(1e-6));
      else
        CHECK(held[v * D + k] == initial[v * D + k]);  // untouched: the initialiser's values, exactly
    }
  if (hashed) CHECK(w.tables().rows(0).held == V);  // the gather above created the untouched rows
}

// SyncSGD, 2 workers, N = 2, over 2 ps: each step the ps average the two dense gradients and
// the two workers' rows' gradients (a row one worker did not touch counts as zero for it), and
// apply both with the step; untouched rows keep their initial values exactly.
TEST_CASE("sync_sgd with an embedding model: 2 workers' dense and row averages equal a local reference",
          "[sparse][train][sync]") {
  const bool hashed = GENERATE(false, true);
  // Requests of at most 1 byte: each shard in a segment of its own, the rows in one after them.
  const std::size_t request_bytes = GENERATE(std::size_t(0), std::size_t(1));
  CAPTURE(hashed, request_bytes);
  auto client_opts = [&](std::string name) {
    auto o = opts(std::move(name));
    if (request_bytes) o.max_request_bytes = request_bytes;
    return o;
  };
  embedding_spec spec{.name = "words", .rows = hashed ? 0 : V, .dim = D, .init = {.scale = 0.3f, .seed = 5}};
  auto ref_net = make_net(nn::embedding_combine::concat, spec);
  running_ps ps0{opts("ps.0")}, ps1{opts("ps.1")};
  const auto layout = partitioners::greedy_load_balancing{}.place(ref_net.variables(), 2);
  const float lr = 0.2f, table_lr = 0.5f;
  const auto config = strategies::sync_sgd_config{.replicas_to_aggregate = 2, .rule = optim::sgd{lr}};
  using worker_type = strategies::sync_worker<strategies::sync_sgd, nn::embedding_sequential>;
  constexpr std::size_t steps = 3;
  auto batch_of = [](std::size_t k, std::size_t s) { return id_batch(200 + 2 * s + k); };
  {
    auto net = make_net(nn::embedding_combine::concat, spec);
    ps_client chief({ps0.address(), ps1.address()}, layout, client_opts("worker.0"));
    chief.connect();
    worker_type w(strategies::sync_sgd(config), net, chief, 0);
    w.set_embedding_rule(optim::sgd{table_lr});
    w.initialize_ps(17, 2);
  }
  std::vector<std::vector<float>> losses(2);  // checked here: Catch's assertions are not thread-safe
  std::vector<strategies::drop_stats> drops(2);
  test::run_threads(2, [&](std::size_t k) {
    auto net = make_net(nn::embedding_combine::concat, spec);
    ps_client c({ps0.address(), ps1.address()}, layout, client_opts("worker." + std::to_string(k)));
    c.connect();
    worker_type w(strategies::sync_sgd(config), net, c, k);
    w.begin();
    for (std::size_t s = 0; s < steps; ++s) losses[k].push_back(w.step(batch_of(k, s)));
    drops[k] = w.drops();
  });

  // Reference: both workers' gradients at the same θ and table, averaged.
  std::vector<float> theta = test::initial_parameters(ref_net, 17), g0(theta.size()), g1(theta.size());
  auto table = initial_table(spec, V);
  const auto initial = table;
  std::vector<bool> touched(V, false);
  for (std::size_t s = 0; s < steps; ++s) {
    std::vector<float> row_sum(V * D, 0.0f);
    for (std::size_t k = 0; k < 2; ++k) {
      const auto b = batch_of(k, s);
      local_rows rows(ref_net, b, table);
      tensor x, y;
      assign_from_host(x, b.features);
      assign_from_host(y, b.labels);
      auto& g = k == 0 ? g0 : g1;
      const float loss =
          test::loss_and_gradients_on_host(ref_net, theta, std::span<const embedding_rows>(&rows.view, 1), x, y, g);
      CHECK(losses[k][s] == Approx(loss).epsilon(1e-6));
      for (std::size_t u = 0; u < rows.ids.unique.size(); ++u) {
        touched[rows.ids.unique[u]] = true;
        for (std::size_t d = 0; d < D; ++d) row_sum[rows.ids.unique[u] * D + d] += rows.grads[u * D + d];
      }
    }
    for (std::size_t i = 0; i < theta.size(); ++i) theta[i] -= lr * ((g0[i] + g1[i]) * 0.5f);
    for (std::size_t i = 0; i < table.size(); ++i) table[i] -= table_lr * (row_sum[i] * 0.5f);
  }
  for (const auto& d : drops) CHECK(d.contributions == steps);
  for (const auto& d : drops) CHECK(d.dropped == 0);
  ps_client reader({ps0.address(), ps1.address()}, layout, opts("chief.0"));
  reader.connect();
  std::vector<float> centre(theta.size());
  CHECK(reader.pull(centre) == std::int64_t(steps));
  for (std::size_t i = 0; i < theta.size(); ++i) CHECK(centre[i] == Approx(theta[i]).margin(1e-6));
  embedding_tables tables(reader);
  strategies::detail::add_tables(ref_net, tables, 2);
  std::vector<std::uint64_t> all(V);
  for (std::size_t v = 0; v < V; ++v) all[v] = v;
  std::vector<float> held(V * D);
  strategies::detail::read_rows(tables)(0, all, held);
  for (std::size_t v = 0; v < V; ++v)
    for (std::size_t d = 0; d < D; ++d) {
      CAPTURE(v, d);
      if (touched[v])
        CHECK(held[v * D + d] == Approx(table[v * D + d]).margin(1e-6));
      else
        CHECK(held[v * D + d] == initial[v * D + d]);
    }
}

TEST_CASE("nn::evaluate of an embedding classifier reads rows through the reader", "[sparse][nn][train]") {
  auto net = make_net(nn::embedding_combine::mean);
  std::vector<float> p = test::initial_parameters(net, 2), g(net.num_parameters());
  const auto table = initial_table(net.embeddings()[0], V);
  const auto b = id_batch(9);
  local_rows rows(net, b, table);
  tensor x, y;
  assign_from_host(x, b.features);
  assign_from_host(y, b.labels);
  const float loss =
      test::loss_and_gradients_on_host(net, p, std::span<const embedding_rows>(&rows.view, 1), x, y, g);
  std::size_t reads = 0;
  row_reader reader = [&](std::size_t t, std::span<const std::uint64_t> ids, std::span<float> out) {
    REQUIRE(t == 0);
    REQUIRE(out.size() == ids.size() * D);
    for (std::size_t i = 0; i < ids.size(); ++i) std::copy_n(table.begin() + ids[i] * D, D, out.begin() + i * D);
    reads += ids.size();
  };
  tensor pt = tensor::from_host<float>({p.size()}, p);  // parameters are device memory
  const auto e =
      nn::evaluate(net, pt.span<float>(), reader, data::dataset(b.features, b.labels, 0.0f, float(V)).batch(B));
  CHECK(e.examples == B);
  CHECK(e.loss == Approx(loss).epsilon(1e-6));
  CHECK(reads == rows.ids.unique.size());  // each distinct id read once
}
