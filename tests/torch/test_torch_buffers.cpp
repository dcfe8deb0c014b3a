// A LibTorch module's buffers (BatchNorm's running statistics) under dtf::train: the chief's are
// the job's (dtf/train/buffers.hpp). Rank 0's are every rank's at the start and then move by
// rank 0's own batches (against BatchNorm's update computed by hand); a checkpoint round trip
// gives parameters and buffers back bit for bit, through ring-allreduce and through 2 ps
// restored into 1; the buffers file refuses damage, naming it.
#include <dtf/checkpoint/buffers_file.hpp>
#include <dtf/ps.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/torch/module_model.hpp>
#include <dtf/train.hpp>

#include <catch2/catch.hpp>
#include <xtensor/xview.hpp>

#include "../checkpoint_helpers.hpp"
#include "../ps_helpers.hpp"
#include "../rank_helpers.hpp"
#include "../train_helpers.hpp"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using bn_model = dtf::libtorch::module_model<torch::nn::Sequential>;

/// BatchNorm1d(8) straight on the features (its statistics are the batch's own), then Linear(8, 3).
bn_model bn_net() {
  torch::manual_seed(7);
  return bn_model(torch::nn::Sequential(torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 3)));
}

std::vector<float> buffers_of(const bn_model& m) { return dtf::detail::buffers_of(m); }

/// What BatchNorm (momentum 0.1) makes of running statistics (mean, var) after one batch x
/// [rows, 8]: the batch's mean and unbiased variance blended in.
std::vector<float> bn_update(const std::vector<float>& before, const std::vector<float>& x) {
  const std::size_t rows = x.size() / 8;
  std::vector<float> after = before;
  for (std::size_t j = 0; j < 8; ++j) {
    double mean = 0, sq = 0;
    for (std::size_t r = 0; r < rows; ++r) mean += x[r * 8 + j];
    mean /= double(rows);
    for (std::size_t r = 0; r < rows; ++r) sq += (x[r * 8 + j] - mean) * (x[r * 8 + j] - mean);
    after[j] = float(0.9 * before[j] + 0.1 * mean);
    after[8 + j] = float(0.9 * before[8 + j] + 0.1 * sq / double(rows - 1));
  }
  return after;
}

void keep_final_parameters(dtf::train_options& o, std::vector<float>& out) {
  o.evaluate = [&out](std::span<const float> p) {
    out.assign(p.begin(), p.end());
    return dtf::nn::evaluation{};
  };
}


/// Linear(8, 8) with every value `value`, frozen, then Linear(8, 3).
bn_model frozen_pair(float value) {
  torch::manual_seed(15);
  torch::nn::Linear f(8, 8);
  {
    torch::NoGradGuard no_grad;
    f->weight.fill_(value);
    f->bias.fill_(value);
  }
  f->weight.requires_grad_(false);
  f->bias.requires_grad_(false);
  return bn_model(torch::nn::Sequential(f, torch::nn::Linear(8, 3)));
}

/// The module's parameters, flattened in named_parameters() order (LibTorch alone).
std::vector<float> module_values(const torch::nn::Module& m) {
  std::vector<float> out;
  for (const auto& t : m.parameters()) {
    const auto c = t.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

}  // namespace

TEST_CASE("torch: float32 buffers are the model's dtf buffers, other types stay the module's", "[torch][buffers]") {
  auto net = bn_net();
  const auto specs = net.buffers();
  REQUIRE(specs.size() == 2);  // running_mean, running_var (num_batches_tracked is int64)
  CHECK(specs[0].name == "0.running_mean");
  CHECK(specs[1].name == "0.running_var");
  CHECK(specs[1].offset == 8);
  std::vector<float> v(16);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f + 1.0f;
  net.write_buffers(v);
  CHECK(buffers_of(net) == v);
  CHECK_THROWS_WITH(net.write_buffers(std::vector<float>(3)), Catch::Contains("3 floats"));
}

TEST_CASE("torch: a buffers file round-trips and refuses damage, naming the file and the field", "[torch][buffers]") {
  dtf::test::ckpt::temp_dir dir("buffers_file");
  auto net = bn_net();
  const auto specs = net.buffers();
  std::vector<float> v(16);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) - 3.25f;
  dtf::write_buffers_file(dir.path, "ckpt-4", specs, v);
  std::vector<float> back(16);
  REQUIRE(dtf::read_buffers_file(dir.path, "ckpt-4", specs, back));
  CHECK(back == v);
  CHECK_FALSE(dtf::read_buffers_file(dir.path, "ckpt-5", specs, back));  // no such file
  // Another model's buffers.
  auto other = specs;
  other[1].name = "0.running_varx";
  CHECK_THROWS_WITH(dtf::read_buffers_file(dir.path, "ckpt-4", other, back),
                    Catch::Contains("ckpt-4.buffers") && Catch::Contains("buffers[1]") && Catch::Contains("running_varx"));
  // A flipped byte in the floats, then a truncated file.
  const auto path = dtf::buffers_file_path(dir.path, "ckpt-4");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  CHECK_THROWS_WITH(dtf::read_buffers_file(dir.path, "ckpt-4", specs, back),
                    Catch::Contains("sha256") && Catch::Contains("does not match"));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  CHECK_THROWS_WITH(dtf::read_buffers_file(dir.path, "ckpt-4", specs, back), Catch::Contains("bytes, its header says"));
  std::ofstream(path) << "not json\n";
  CHECK_THROWS_WITH(dtf::read_buffers_file(dir.path, "ckpt-4", specs, back), Catch::Contains("malformed JSON"));
}

TEST_CASE("torch: rank 0's buffers start every rank, and then each rank's move by its own batches only",
          "[torch][buffers][collectives]") {
  const std::size_t rows = 16;
  const auto data = dtf::test::synthetic(2 * rows, 9, dtf::test::labels::argmax).batch(2 * rows);
  const auto batch = *data.stream().next();
  std::vector<std::vector<float>> started(2), after(2);
  const auto failures = dtf::test::run_ranks_collect(2, {}, [&](dtf::communicator& c) {
    auto net = bn_net();
    if (c.rank() == 1) net.write_buffers(std::vector<float>(16, 42.0f));  // rank 1's own start differs
    dtf::strategies::ring_allreduce<bn_model> r(c, net, {.rule = dtf::optim::sgd{0.1f}});
    r.initialize(3);
    dtf::detail::share_buffers(c, net, r, "", "", "test");
    started[c.rank()] = buffers_of(net);
    dtf::data::host_batch mine;
    mine.features = xt::view(batch.features, xt::range(c.rank() * rows, (c.rank() + 1) * rows), xt::all());
    mine.labels = xt::view(batch.labels, xt::range(c.rank() * rows, (c.rank() + 1) * rows));
    r.step(mine);
    after[c.rank()] = buffers_of(net);
  });
  for (std::size_t k = 0; k < 2; ++k) {
    INFO("rank " << k);
    REQUIRE((failures[k] ? dtf::test::message_of(failures[k]) : std::string()) == "");
  }
  std::vector<float> initial(16, 0.0f);
  std::fill(initial.begin() + 8, initial.end(), 1.0f);  // BatchNorm's own start: mean 0, var 1
  CHECK(started[0] == initial);
  CHECK(started[1] == initial);  // rank 0's, not its own
  const std::vector<float> x(batch.features.begin(), batch.features.end());
  const auto expect0 = bn_update(initial, std::vector<float>(x.begin(), x.begin() + std::ptrdiff_t(rows * 8)));
  const auto expect1 = bn_update(initial, std::vector<float>(x.begin() + std::ptrdiff_t(rows * 8), x.end()));
  for (std::size_t i = 0; i < 16; ++i) {
    INFO("buffer float " << i);
    CHECK(after[0][i] == Approx(expect0[i]).epsilon(1e-5));
    CHECK(after[1][i] == Approx(expect1[i]).epsilon(1e-5));
  }
  CHECK(after[0] != after[1]);  // different data: the job's are rank 0's (they are the ones saved)
}

TEST_CASE("torch: ring-allreduce checkpoints restore parameters and buffers bit for bit", "[torch][buffers][checkpoint]") {
  dtf::test::ckpt::temp_dir dir("torch_buffers_ring");
  const auto data = dtf::test::synthetic(96, 4, dtf::test::labels::argmax);
  dtf::train_options o{.name = "buffers", .epochs = 1, .last_step = 7, .batch = 8, .seed = 2,
                       .model_dir = dir.path.string(), .summary_every = 0, .log_every = 0};
  std::vector<float> trained, restored;
  keep_final_parameters(o, trained);
  auto first = bn_net();
  REQUIRE(dtf::train(dtf::local_cluster(), first, data, dtf::strategies::ring_allreduce<>(), o).global_step == 7);
  const auto saved = buffers_of(first);
  CHECK(saved != buffers_of(bn_net()));  // training moved them
  CHECK(std::filesystem::exists(dtf::buffers_file_path(dir.path, "ckpt-7")));
  // The same command again: at its last step already, it restores and trains nothing.
  keep_final_parameters(o, restored);
  auto second = bn_net();
  REQUIRE(dtf::train(dtf::local_cluster(), second, data, dtf::strategies::ring_allreduce<>(), o).global_step == 7);
  CHECK(restored == trained);
  CHECK(buffers_of(second) == saved);
}

TEST_CASE("torch: buffers saved through 2 ps come back restored into 1 ps", "[torch][buffers][checkpoint]") {
  using namespace dtf;
  test::ckpt::temp_dir dir("torch_buffers_ps");
  const auto data = test::synthetic(96, 5, test::labels::argmax);
  train_options o{.name = "buffers_ps", .epochs = 1, .last_step = 6, .batch = 8, .seed = 2,
                  .model_dir = dir.path.string(), .summary_every = 0, .log_every = 0, .timeout_ms = 10000,
                  .finish_timeout_s = 60};
  auto job = [&](std::size_t num_ps, bn_model& net, std::vector<float>& final_parameters) {
    std::vector<std::unique_ptr<test::running_ps>> servers;
    cluster c;
    c.source = "test";
    for (std::size_t k = 0; k < num_ps; ++k) {
      ps_options po{test::opts("ps." + std::to_string(k))};
      po.transport.cluster_id.clear();  // the spec's id depends on the free ports
      po.transport.log = [](const std::string&) {};
      po.checkpoint_dir = o.model_dir;
      servers.push_back(std::make_unique<test::running_ps>(std::move(po)));
      c.spec.jobs["ps"][k] = servers.back()->address();
    }
    c.spec.jobs["worker"][0] = "127.0.0.1:1";  // the worker listens nowhere (a ps strategy)
    c.self = {"worker", 0};
    train_options mine = o;
    keep_final_parameters(mine, final_parameters);
    return train(c, net, data, strategies::downpour({.fetch_every = 1, .push_every = 1}), mine,
                 partitioners::round_robin{});
  };
  std::vector<float> trained, restored;
  auto first = bn_net();
  REQUIRE(job(2, first, trained).exit_code == 0);
  const auto saved = buffers_of(first);
  CHECK(saved != buffers_of(bn_net()));
  auto second = bn_net();
  REQUIRE(job(1, second, restored).exit_code == 0);
  CHECK(restored == trained);
  CHECK(buffers_of(second) == saved);
}

TEST_CASE("torch: frozen parameters are rank 0's on every rank, and no step moves them", "[torch][buffers][collectives]") {
  const auto data = dtf::test::synthetic(32, 10, dtf::test::labels::argmax).batch(16);
  std::vector<std::vector<float>> frozen(2);
  const auto failures = dtf::test::run_ranks_collect(2, {}, [&](dtf::communicator& c) {
    auto net = frozen_pair(c.rank() == 0 ? 0.5f : 0.25f);  // rank 1 built its frozen layer otherwise
    dtf::strategies::ring_allreduce<bn_model> r(c, net, {.rule = dtf::optim::sgd{0.1f}});
    r.initialize(3);
    dtf::detail::share_buffers(c, net, r, "", "", "test");  // dtf::train's start of a collective job
    auto s = data.stream();
    while (auto b = s.next()) r.step(*b);
    frozen[c.rank()] = module_values(*net.module()[0]);
  });
  for (std::size_t k = 0; k < 2; ++k) {
    INFO("rank " << k);
    REQUIRE((failures[k] ? dtf::test::message_of(failures[k]) : std::string()) == "");
    CHECK(frozen[k] == std::vector<float>(72, 0.5f));
  }
}

TEST_CASE("torch: after dtf::train returns, the module owns the trained values: LibTorch saves and runs it, and it "
          "trains again",
          "[torch][lifetime]") {
  const auto data = dtf::test::synthetic(96, 6, dtf::test::labels::argmax);
  auto net = bn_net();
  std::vector<float> trained;
  dtf::train_options o{.name = "owned", .epochs = 1, .last_step = 5, .batch = 8, .seed = 2, .summary_every = 0,
                       .log_every = 0};
  o.evaluate = [&](std::span<const float> p) {
    trained.assign(p.begin(), p.end());
    return dtf::nn::evaluate(net, p, data);
  };
  REQUIRE(dtf::train(dtf::local_cluster(), net, data, dtf::strategies::ring_allreduce<>(), o).global_step == 5);
  // The strategy and its buffers are gone: the module's own tensors hold the final parameters.
  CHECK(module_values(*net.module()) == trained);
  std::stringstream file;
  torch::save(net.module(), file);
  auto loaded = bn_net().module();
  torch::load(loaded, file);
  CHECK(module_values(*loaded) == trained);
  // LibTorch's forward on the module: the logits dtf computes (eval mode, the chief's buffers).
  auto batch = *data.batch(8).stream().next();
  dtf::tensor x, z;
  dtf::assign_from_host(x, batch.features);
  net.logits(trained, x, z);
  net.module()->eval();
  const auto out = net.module()->forward(torch::from_blob(x.data<float>(), {8, 8})).contiguous();
  net.module()->train();
  CHECK(std::vector<float>(out.data_ptr<float>(), out.data_ptr<float>() + out.numel()) == z.to_vector<float>());
  // A second run with the same model: a fresh start from the seed, trained as the first.
  std::vector<float> first = trained;
  REQUIRE(dtf::train(dtf::local_cluster(), net, data, dtf::strategies::ring_allreduce<>(), o).global_step == 5);
  CHECK(trained == first);
  CHECK(module_values(*net.module()) == trained);
}

TEST_CASE("torch: without an evaluation, dtf::train still leaves the job's trained values in the module",
          "[torch][lifetime]") {
  using namespace dtf;
  const auto data = test::synthetic(96, 5, test::labels::argmax);
  const train_options o{.name = "adopt", .epochs = 1, .last_step = 6, .batch = 8, .seed = 2, .summary_every = 0,
                        .log_every = 0, .timeout_ms = 10000, .finish_timeout_s = 60};
  // Through a ps: the chief's module takes the values on the ps at the end (set_parameters).
  auto ps_job = [&](bn_model& net, std::vector<float>* final_parameters) {
    ps_options po{test::opts("ps.0")};
    po.transport.cluster_id.clear();  // the spec's id depends on the free port
    po.transport.log = [](const std::string&) {};
    test::running_ps server(std::move(po));
    cluster c;
    c.source = "test";
    c.spec.jobs["ps"][0] = server.address();
    c.spec.jobs["worker"][0] = "127.0.0.1:1";  // the worker listens nowhere (a ps strategy)
    c.self = {"worker", 0};
    train_options mine = o;
    if (final_parameters) keep_final_parameters(mine, *final_parameters);
    return train(c, net, data, strategies::downpour({.fetch_every = 1, .push_every = 1}), mine,
                 partitioners::round_robin{});
  };
  std::vector<float> trained;
  auto evaluated = bn_net();
  REQUIRE(ps_job(evaluated, &trained).exit_code == 0);
  auto plain = bn_net();
  REQUIRE(ps_job(plain, nullptr).exit_code == 0);
  CHECK(module_values(*plain.module()) == trained);
  // Through ring-allreduce: every rank's module takes rank 0's final parameters.
  std::vector<float> ring_trained;
  train_options with_eval = o;
  keep_final_parameters(with_eval, ring_trained);
  auto first = bn_net();
  REQUIRE(train(local_cluster(), first, data, strategies::ring_allreduce<>(), with_eval).global_step == 6);
  auto second = bn_net();
  REQUIRE(train(local_cluster(), second, data, strategies::ring_allreduce<>(), o).global_step == 6);
  CHECK(module_values(*second.module()) == ring_trained);
}

TEST_CASE("torch: a job resumed from its model_dir draws the dropout masks an uninterrupted job draws, none again",
          "[torch][buffers][checkpoint]") {
  // ring-allreduce on one rank: 8 steps in one run against 4, a checkpoint, and 4 more after
  // --model_dir resumes it; with SGD the parameters are the same bit for bit only if the
  // resumed steps draw the uninterrupted run's masks 5 to 8 (a count restarted at 0 draws 1 to
  // 4 again).
  auto dropout_net = [] {
    torch::manual_seed(9);
    return bn_model(torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::Dropout(0.5), torch::nn::Linear(32, 3)),
                    {.seed = 4});
  };
  const auto data = dtf::test::synthetic(128, 6, dtf::test::labels::argmax);
  auto run = [&](const std::filesystem::path& dir, std::int64_t last_step) {
    dtf::train_options o{.name = "masks", .epochs = 1, .last_step = last_step, .batch = 8, .seed = 2,
                         .model_dir = dir.string(), .summary_every = 0, .log_every = 0};
    std::vector<float> trained;
    keep_final_parameters(o, trained);
    auto net = dropout_net();
    REQUIRE(dtf::train(dtf::local_cluster(), net, data, dtf::strategies::ring_allreduce<>(), o).global_step == last_step);
    return std::pair(trained, buffers_of(net));
  };
  dtf::test::ckpt::temp_dir once("torch_masks_once"), twice("torch_masks_twice");
  const auto [uninterrupted, count] = run(once.path, 8);
  CHECK(count == std::vector<float>{8, 0, 0});  // 8 training forwards
  (void)run(twice.path, 4);
  const auto [resumed, resumed_count] = run(twice.path, 8);
  CHECK(resumed_count == count);
  CHECK(resumed == uninterrupted);
}

TEST_CASE("torch: a ps job's workers take the chief's frozen parameters, also when the chief restored them",
          "[torch][buffers][checkpoint]") {
  using namespace dtf;
  test::ckpt::temp_dir dir("torch_frozen_ps");
  const auto data = test::synthetic(64, 11, test::labels::argmax);
  const train_options o{.name = "frozen_ps", .epochs = 1, .batch = 8, .seed = 2, .model_dir = dir.path.string(),
                        .summary_every = 0, .log_every = 0, .timeout_ms = 10000, .finish_timeout_s = 60};
  // One life of the job: the chief (worker 0) and worker 1, whose frozen layers were built with
  // `chief` and `worker`; each task's frozen values at the end.
  auto job = [&](float chief, float worker) {
    ps_options po{test::opts("ps.0")};
    po.transport.cluster_id.clear();  // the spec's id depends on the free port
    po.transport.log = [](const std::string&) {};
    po.checkpoint_dir = o.model_dir;
    test::running_ps ps(std::move(po));
    cluster c;
    c.source = "test";
    c.spec.jobs["ps"][0] = ps.address();
    c.spec.jobs["worker"][0] = "127.0.0.1:1";  // the workers listen nowhere (a ps strategy)
    c.spec.jobs["worker"][1] = "127.0.0.1:2";
    auto chief_net = frozen_pair(chief);  // built here, one after the other: they seed LibTorch's generator
    auto worker_net = frozen_pair(worker);
    bn_model* nets[] = {&chief_net, &worker_net};
    test::run_threads(2, [&](std::size_t k) {
      cluster me = c;
      me.self = {"worker", k};
      CHECK(train(me, *nets[k], data, strategies::downpour({.fetch_every = 1, .push_every = 1}), o).exit_code == 0);
    });
    return std::vector<std::vector<float>>{module_values(*chief_net.module()[0]), module_values(*worker_net.module()[0])};
  };
  const auto first = job(0.5f, 0.25f);
  CHECK(first[0] == std::vector<float>(72, 0.5f));
  CHECK(first[1] == std::vector<float>(72, 0.5f));  // the chief's, not its own 0.25
  // The same command again, every task's frozen layer built with 0.75: the chief restores 0.5
  // from the checkpoint (it is at its last step and trains nothing) and the worker takes it.
  const auto again = job(0.75f, 0.75f);
  CHECK(again[0] == std::vector<float>(72, 0.5f));
  CHECK(again[1] == std::vector<float>(72, 0.5f));
}
