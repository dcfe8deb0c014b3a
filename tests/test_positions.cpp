// Data positions (dtf/data/position.hpp, dtf/ps/positions.hpp): a stream resumed at a position
// yields the rest of the whole stream; ps 0 keeps each task's position, a checkpoint carries
// them and a restore refills a ps that lost them; and dtf::train resumes a restarted worker's
// shard where it was, and a whole job restarted from a checkpoint (collective: from the global
// step; synchronous ps: from the checkpointed positions) ends with the bits of an uninterrupted
// run (issue 15: restarts redo no work).
#include <dtf/ps.hpp>
#include <dtf/ps/positions.hpp>
#include <dtf/strategies/downpour.hpp>
#include <dtf/strategies/mirrored.hpp>
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/strategies/sync.hpp>
#include <dtf/train.hpp>
#include <dtf/train/resume.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "checkpoint_helpers.hpp"
#include "helpers.hpp"
#include "train_helpers.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using dtf::data::position;

// Every batch's features, in stream order.
std::vector<std::vector<float>> features_of(dtf::data::batch_stream s) {
  std::vector<std::vector<float>> out;
  while (auto b = s.next()) out.emplace_back(b->features.begin(), b->features.end());
  return out;
}

// The small net, recording the features of every batch it computes gradients on (under
// `lock` when replicas compute on threads of their own: mirrored).
struct recording_net {
  dtf::nn::sequential net = dtf::test::small_net();
  std::vector<std::vector<float>>* seen = nullptr;
  std::mutex* lock = nullptr;
  std::vector<dtf::variable_spec> variables() const { return net.variables(); }
  void initialize(std::span<float> p, std::uint64_t seed) { net.initialize(p, seed); }
  float loss_and_gradients(std::span<const float> p, const dtf::tensor& x, const dtf::tensor& y, std::span<float> g) {
    if (lock) {
      std::lock_guard held(*lock);
      seen->push_back(x.to_vector<float>());
    } else {
      seen->push_back(x.to_vector<float>());
    }
    return net.loss_and_gradients(p, x, y, g);
  }
};

// The parameters a run ends with: its evaluation's argument (called last at the end).
void keep_final_parameters(dtf::train_options& o, std::vector<float>& out) {
  o.evaluate = [&out](std::span<const float> p) {
    out = dtf::test::host_copy(p);
    return dtf::nn::evaluation{};
  };
}

// The concatenation of two batch sequences.
std::vector<std::vector<float>> joined(std::vector<std::vector<float>> a, const std::vector<std::vector<float>>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The same batches in a canonical order (replicas on threads record in any order).
std::vector<std::vector<float>> sorted(std::vector<std::vector<float>> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// A user hook that ends its task with an exception after `steps` steps (a task killed mid-run).
struct die_after {
  std::int64_t steps;
  std::int64_t runs = 0;
  void after_run(dtf::run_context&, const dtf::run_values&) {
    if (++runs == steps) throw std::runtime_error("killed after " + std::to_string(steps) + " steps");
  }
};

}  // namespace

TEST_CASE("a stream started at a data position yields exactly the rest of the whole stream", "[data][positions]") {
  const auto shard = dtf::test::synthetic(203, 3, dtf::test::labels::random).shard(2, 1);  // 101 examples
  for (const std::size_t prefetch : {0, 2}) {
    const auto d = shard.shuffle(17).batch(8).repeat(4).prefetch(prefetch);
    const std::size_t per_epoch = d.batches_per_epoch();
    REQUIRE(per_epoch == 13);
    const auto all = features_of(d.stream());
    REQUIRE(all.size() == 4 * per_epoch);
    for (const std::uint64_t epoch : {0, 1, 3})
      for (const std::uint64_t batch : {0, 1, 7, 12}) {
        position at;
        at.epoch = epoch;
        at.batch = batch;
        const auto rest = features_of(d.stream(at));
        const auto skip = std::ptrdiff_t(epoch * per_epoch + batch);
        CHECK(rest == std::vector<std::vector<float>>(all.begin() + skip, all.end()));
      }
    position past;
    past.epoch = 4;  // every epoch done: nothing left
    CHECK(features_of(d.stream(past)).empty());
    position bad;
    bad.batch = 13;
    CHECK_THROWS_WITH(d.stream(bad), Catch::Contains("batch 13 is not one of the 13"));
  }
}

TEST_CASE("a data position follows the trained batches and refuses another layout, saying why", "[data][positions]") {
  auto at = position::start_of(3, 100, 8, 42);
  at.trained(0, 11, 8, 13);
  CHECK((at.epoch == 0 && at.batch == 12 && at.examples == 8 && at.steps == 1));
  at.trained(0, 12, 4, 13);  // the last, short batch of the epoch
  CHECK((at.epoch == 1 && at.batch == 0 && at.examples == 12 && at.steps == 2));
  const auto here = position::start_of(3, 100, 8, 42);
  CHECK_FALSE(at.unusable_in(here, 13));
  CHECK(*at.unusable_in(position::start_of(2, 100, 8, 42), 13) == "the number of shards was 3, is 2");
  CHECK(*at.unusable_in(position::start_of(3, 150, 8, 42), 19) == "the shard's size was 100, is 150");
  CHECK(*at.unusable_in(position::start_of(3, 100, 16, 42), 7) == "the batch size was 8, is 16");
  CHECK(*at.unusable_in(position::start_of(3, 100, 8, 43), 13) == "the shuffle seed was 42, is 43");
  auto past = at;
  past.batch = 13;
  CHECK(*past.unusable_in(here, 13) == "batch 13 is past the 13 batches of an epoch");
  auto hollow = at;
  hollow.examples = 0;
  CHECK(*hollow.unusable_in(here, 13) == "it counts 2 steps but no example");
}

TEST_CASE("a data position n batches on is where n trained() put it, short last batches counted exactly",
          "[data][positions]") {
  for (const bool drop_remainder : {false, true}) {
    // 101 examples in batches of 8: 13 batches an epoch, the last of 5 rows (or 12, none short).
    const auto d = dtf::test::synthetic(101, 3, dtf::test::labels::random).batch(8, drop_remainder);
    const std::uint64_t per_epoch = d.batches_per_epoch();
    REQUIRE(per_epoch == (drop_remainder ? 12 : 13));
    const auto start = position::start_of(1, d.size(), 8, 9);
    auto walked = start;
    auto s = d.repeat(-1).stream();
    for (std::uint64_t n = 0; n <= 3 * per_epoch + 2; ++n) {
      CAPTURE(drop_remainder, n);
      CHECK(start.after(n, per_epoch) == walked);
      const auto b = s.next();
      walked.trained(b->epoch, b->index, b->labels.size(), per_epoch);
    }
    // From a position part-way through an epoch: the same as from the start.
    const auto mid = start.after(per_epoch + 5, per_epoch);
    CHECK(mid.after(2 * per_epoch - 1, per_epoch) == start.after(3 * per_epoch + 4, per_epoch));
    CHECK(start.after(2 * per_epoch, per_epoch).examples == (drop_remainder ? 2 * 96 : 2 * 101));
  }
  CHECK(position::start_of(1, 0, 8, 9).after(5, 0) == position::start_of(1, 0, 8, 9));  // an empty shard
}

TEST_CASE("ps 0 keeps each task's data position, checkpoints carry them, and a restore refills a ps that lost them",
          "[checkpoint][positions]") {
  using namespace dtf;
  using namespace dtf::test::ckpt;
  temp_dir dir("positions");
  const auto vars = model_vars();
  const auto layout = partitioners::greedy_load_balancing{}.place(vars, 1);
  const optim::rule rule = optim::sgd{0.1f};
  const checkpoint_options ck{dir.path.string(), "model", 3};
  auto w1 = position::start_of(2, 100, 8, 43);
  w1.trained(2, 4, 8, 13);
  auto chief = position::start_of(2, 100, 8, 42);
  chief.trained(0, 0, 8, 13);
  {
    cluster_of a(dir.path.string(), layout);
    a.client->initialize(seeded(num_parameters(vars), 1), {rule});
    ps_client worker(std::vector<std::string>{"127.0.0.1:" + std::to_string(a.servers[0]->port())}, layout,
                     test::opts("worker.1"));
    worker.connect();
    CHECK_FALSE(recorded_position(worker));  // a first start: none
    report_position(worker, w1);
    report_position(*a.client, chief);
    CHECK(recorded_position(worker) == w1);
    CHECK(recorded_positions(*a.client) ==
          std::vector<data::task_position>{{"chief.0", chief}, {"worker.1", w1}});
    // Only a restore may name another task, and it never overrides a report.
    detail::ps_positions_msg forged;
    forged.positions.push_back({"chief.0", w1});
    std::vector<rpc_call> calls{worker.request(0, detail::message_kind::ps_positions, detail::encode_message(forged))};
    CHECK_THROWS_WITH(worker.call_all(calls), Catch::Contains("may report its own position only"));
    CHECK(recorded_positions(*a.client).front().at == chief);
    restore_positions(worker, {{"worker.1", chief}});
    CHECK(recorded_position(worker) == w1);
    const auto m = save_checkpoint(*a.client, ck, vars);
    CHECK(m.positions == std::vector<data::task_position>{{"chief.0", chief}, {"worker.1", w1}});
    CHECK(read_manifest(dir.path.string(), m.name).positions == m.positions);
  }
  // A fresh ps (a restart): empty until the chief restores the checkpoint, then its positions;
  // a position reported after the restore stays through a second restore.
  cluster_of b(dir.path.string(), layout);
  CHECK(recorded_positions(*b.client).empty());
  REQUIRE(restore_latest(*b.client, dir.path.string(), vars, {rule}));
  CHECK(recorded_positions(*b.client) == std::vector<data::task_position>{{"chief.0", chief}, {"worker.1", w1}});
  auto newer = chief;
  newer.trained(0, 1, 8, 13);
  report_position(*b.client, newer);
  REQUIRE(restore_latest(*b.client, dir.path.string(), vars, {rule}));
  CHECK(recorded_positions(*b.client) == std::vector<data::task_position>{{"chief.0", newer}, {"worker.1", w1}});
}

TEST_CASE("a checkpoint manifest with malformed positions is refused, naming the field", "[checkpoint][positions]") {
  dtf::checkpoint_manifest m;
  m.name = "model-1";
  m.num_ps = 1;
  m.files.push_back({"model-1.ps-0-of-1.shard", 0, 64, std::string(64, 'a')});
  m.positions.push_back({"worker.1", position::start_of(2, 100, 8, 43)});
  auto j = m.to_json();
  CHECK(dtf::checkpoint_manifest::from_json(j, "m").positions == m.positions);
  auto twice = j;
  twice["positions"].push_back(twice["positions"][0]);
  CHECK_THROWS_WITH(dtf::checkpoint_manifest::from_json(twice, "m"), Catch::Contains("positions[1].task"));
  auto negative = j;
  negative["positions"][0]["batch"] = -1;
  CHECK_THROWS_WITH(dtf::checkpoint_manifest::from_json(negative, "m"),
                    Catch::Contains("positions[0].batch: is not a non-negative integer"));
  auto missing = j;
  missing["positions"][0].erase("seed");
  CHECK_THROWS_WITH(dtf::checkpoint_manifest::from_json(missing, "m"), Catch::Contains("positions[0].seed: is missing"));
}

TEST_CASE("train: a worker restarted mid-run resumes its shard at the recorded position and redoes no batch",
          "[train][positions]") {
  using namespace dtf;
  // ps.0 on a free port (it accepts any cluster id: the spec's id depends on that port).
  ps_options po{test::opts("ps.0")};
  po.transport.cluster_id.clear();
  po.transport.log = [](const std::string&) {};
  parameter_server server("127.0.0.1:0", po);
  std::thread serving([&] { server.run(); });
  struct join_on_exit {
    parameter_server& s;
    std::thread& t;
    ~join_on_exit() {
      s.stop();
      t.join();
    }
  } joiner{server, serving};

  cluster c;
  c.source = "test";
  c.spec.jobs["ps"][0] = "127.0.0.1:" + std::to_string(server.port());
  c.spec.jobs["worker"][0] = "127.0.0.1:1";  // the workers listen nowhere (a ps strategy)
  c.spec.jobs["worker"][1] = "127.0.0.1:2";
  const auto data = test::synthetic(203, 3, test::labels::argmax);
  const train_options o{.name = "positions",
                        .epochs = 3,
                        .batch = 8,
                        .seed = 5,
                        .log_every = 0,
                        .timeout_ms = 10000,
                        .finish_timeout_s = 60};
  const auto strategy = [] { return strategies::downpour({.fetch_every = 1, .push_every = 1}); };
  // What worker 1 (training task 1 of 2) should train on: its shard in the seeded order, 3 epochs.
  const auto reference = features_of(data.shard(2, 1).shuffle(o.seed + 1).batch(o.batch).repeat(o.epochs).stream());
  REQUIRE(reference.size() == 3 * 13);
  const std::int64_t killed_after = 13 + 5;  // mid-way through its second epoch

  std::vector<std::vector<float>> first_life, second_life, chief_seen;
  train_result chief_result, worker_result;
  test::run_threads(2, [&](std::size_t k) {
    cluster me = c;
    me.self = {"worker", k};
    if (k == 0) {
      recording_net net{.seen = &chief_seen};
      chief_result = train(me, net, data, strategy(), o);
      return;
    }
    recording_net first{.seen = &first_life};
    CHECK_THROWS_WITH(train(me, first, data, strategy(), o, partitioners::greedy_load_balancing{},
                            die_after{killed_after}),
                      Catch::Contains("killed after 18 steps"));
    recording_net second{.seen = &second_life};
    worker_result = train(me, second, data, strategy(), o);
  });
  CHECK(chief_result.exit_code == 0);
  CHECK(chief_seen.size() == 3 * 13);  // the chief trained its own shard once
  REQUIRE(first_life.size() == std::size_t(killed_after));
  CHECK(first_life == std::vector<std::vector<float>>(reference.begin(), reference.begin() + killed_after));
  // The restarted worker trained the rest of its shard, in order, and nothing twice.
  CHECK(second_life.size() == reference.size() - std::size_t(killed_after));
  CHECK(second_life == std::vector<std::vector<float>>(reference.begin() + killed_after, reference.end()));
}

TEST_CASE("train: ring_allreduce resumed from a checkpoint trains the rest of its shard and ends where an "
          "uninterrupted run ends, bit for bit, its batches from the host or gathered on the device",
          "[train][positions]") {
  using namespace dtf;
  // 203 examples in batches of 8: 26 batches an epoch, the last of 3 rows.
  const auto data = test::synthetic(203, 3, test::labels::argmax);
  const auto strategy = [] { return strategies::ring_allreduce<>(); };  // Adam: slots and iterations restored too
  struct outcome {
    std::vector<float> uninterrupted, resumed;
    std::vector<std::vector<float>> all_seen;
  };
  auto run = [&](bool device_data) {
    INFO("device_data " << device_data);
    test::ckpt::temp_dir dir(device_data ? "collective_resume_device" : "collective_resume");
    train_options o{.name = "resume", .epochs = 3, .batch = 8, .seed = 5, .log_every = 0};
    o.device_data = device_data;
    outcome out;
    std::vector<std::vector<float>> first_life, second_life;
    keep_final_parameters(o, out.uninterrupted);
    recording_net reference{.seen = &out.all_seen};
    const auto whole = train(local_cluster(), reference, data, strategy(), o);
    REQUIRE(whole.global_step == 3 * 26);
    REQUIRE(out.all_seen.size() == 3 * 26);

    // The same run stopped part-way through its second epoch with a checkpoint there, then the
    // same command again.
    const std::int64_t stopped_at = 26 + 7;
    o.model_dir = dir.path.string();
    o.save_checkpoints_steps = stopped_at;
    o.summary_every = 0;
    o.last_step = stopped_at;
    keep_final_parameters(o, out.resumed);
    recording_net first{.seen = &first_life};
    REQUIRE(train(local_cluster(), first, data, strategy(), o).global_step == stopped_at);
    o.last_step = 0;
    recording_net second{.seen = &second_life};
    const auto rest = train(local_cluster(), second, data, strategy(), o);
    CHECK(rest.global_step == 3 * 26);
    CHECK(first_life.size() == std::size_t(stopped_at));
    // The resumed run trained the rest of the shard, in order, and no batch twice.
    CHECK(second_life.size() == out.all_seen.size() - std::size_t(stopped_at));
    CHECK(joined(first_life, second_life) == out.all_seen);
    REQUIRE(out.resumed.size() == out.uninterrupted.size());
    CHECK(out.resumed == out.uninterrupted);
    return out;
  };
  const outcome host = run(false), device = run(true);
  // The batches gathered on the device (data::device_shard) are the host streams', bit for bit.
  CHECK(device.all_seen == host.all_seen);
  CHECK(device.uninterrupted == host.uninterrupted);
}

TEST_CASE("train: mirrored replicas resume shards of different lengths each at its own place",
          "[train][positions]") {
  using namespace dtf;
  test::ckpt::temp_dir dir("mirrored_resume");
  // Two replicas: shards of 101 and 100 examples in batches of 10 make 11 and 10 batches an
  // epoch (the run's steps follow the shorter), so after 13 steps replica 0 is at batch 2 of
  // its second epoch and replica 1 at batch 3.
  const auto data = test::synthetic(201, 4, test::labels::argmax);
  train_options o{.name = "resume", .epochs = 3, .batch = 10, .seed = 7, .log_every = 0};
  const auto strategy = [] { return strategies::mirrored<>({}, 2); };
  std::mutex lock;
  std::vector<float> uninterrupted, resumed;
  std::vector<std::vector<float>> all_seen, first_life, second_life;
  keep_final_parameters(o, uninterrupted);
  recording_net reference{.seen = &all_seen, .lock = &lock};
  REQUIRE(train(local_cluster(), reference, data, strategy(), o).global_step == 3 * 10);
  REQUIRE(all_seen.size() == 2 * 3 * 10);

  const std::int64_t stopped_at = 13;
  o.model_dir = dir.path.string();
  o.save_checkpoints_steps = stopped_at;
  o.summary_every = 0;
  o.last_step = stopped_at;
  keep_final_parameters(o, resumed);
  recording_net first{.seen = &first_life, .lock = &lock};
  REQUIRE(train(local_cluster(), first, data, strategy(), o).global_step == stopped_at);
  o.last_step = 0;
  recording_net second{.seen = &second_life, .lock = &lock};
  CHECK(train(local_cluster(), second, data, strategy(), o).global_step == 3 * 10);
  CHECK(second_life.size() == all_seen.size() - 2 * std::size_t(stopped_at));
  CHECK(sorted(joined(first_life, second_life)) == sorted(all_seen));
  REQUIRE(resumed.size() == uninterrupted.size());
  CHECK(resumed == uninterrupted);
}

namespace {

// A ps task on a free port, served on a thread until the job shuts it down (or the test ends).
struct serving_ps {
  dtf::parameter_server server;
  std::thread serving;
  explicit serving_ps(dtf::ps_options po) : server("127.0.0.1:0", std::move(po)), serving([this] { server.run(); }) {}
  ~serving_ps() {
    server.stop();
    serving.join();
  }
};

// One life of a synchronous job on a fresh ps (a whole-job restart): 2 workers, each recording
// the batches it trained; the chief's final parameters.
void sync_job(const dtf::data::dataset& data, const dtf::train_options& options,
              std::vector<std::vector<float>> (&seen)[2], std::vector<float>& final_parameters) {
  using namespace dtf;
  ps_options po{test::opts("ps.0")};
  po.transport.cluster_id.clear();  // the spec's id depends on the free port
  po.transport.log = [](const std::string&) {};
  po.checkpoint_dir = options.model_dir;  // a ps writes and reads its shards of a checkpoint itself
  serving_ps ps(po);
  cluster c;
  c.source = "test";
  c.spec.jobs["ps"][0] = "127.0.0.1:" + std::to_string(ps.server.port());
  c.spec.jobs["worker"][0] = "127.0.0.1:1";  // the workers listen nowhere (a ps strategy)
  c.spec.jobs["worker"][1] = "127.0.0.1:2";
  train_options o = options;
  keep_final_parameters(o, final_parameters);
  test::run_threads(2, [&](std::size_t k) {
    cluster me = c;
    me.self = {"worker", k};
    recording_net net{.seen = &seen[k]};
    const auto r = train(me, net, data, strategies::sync_sgd({.replicas_to_aggregate = 2}), o);
    CHECK(r.exit_code == 0);
  });
}

}  // namespace

TEST_CASE("train: a synchronous job restarted from a checkpoint resumes every worker's data and ends where an "
          "uninterrupted job ends, bit for bit",
          "[train][positions]") {
  using namespace dtf;
  test::ckpt::temp_dir dir("sync_resume");
  // Two shards of 102 and 101 examples in batches of 8: 13 batches an epoch each, 2 epochs.
  // Each step averages one contribution of each worker (a + b == b + a: the bits do not depend
  // on which arrives first), with momentum on the ps (its slot is checkpointed).
  const auto data = test::synthetic(203, 6, test::labels::argmax);
  const train_options o{.name = "sync_resume",
                        .epochs = 2,
                        .batch = 8,
                        .seed = 3,
                        .summary_every = 0,
                        .log_every = 0,
                        .timeout_ms = 10000,
                        .finish_timeout_s = 60};
  std::vector<std::vector<float>> whole[2], first_life[2], second_life[2];
  std::vector<float> uninterrupted, resumed, ignored;
  sync_job(data, o, whole, uninterrupted);
  REQUIRE(whole[0].size() == 2 * 13);
  REQUIRE(whole[1].size() == 2 * 13);

  const std::int64_t stopped_at = 13 + 5;
  auto first = o;
  first.model_dir = dir.path.string();
  first.save_checkpoints_steps = stopped_at;
  first.last_step = stopped_at;
  sync_job(data, first, first_life, ignored);
  auto second = first;
  second.last_step = 0;
  sync_job(data, second, second_life, resumed);
  for (std::size_t k = 0; k < 2; ++k) {
    CAPTURE(k);
    CHECK(first_life[k].size() == std::size_t(stopped_at));
    CHECK(joined(first_life[k], second_life[k]) == whole[k]);
  }
  REQUIRE(resumed.size() == uninterrupted.size());
  CHECK(resumed == uninterrupted);
}

// Issue 31: a checkpoint whose global step or data positions the run's configuration never
// reaches is refused, naming the checkpoint and the value; one at the end of the run makes every
// task say that the training is already finished (nothing ends after 0 steps without a word).

namespace {

// What this process prints on stdout (dtf::train's lines) while it lives, up to text().
class captured_stdout {
 public:
  captured_stdout() : file_(std::tmpfile()), saved_(::dup(1)) {
    std::fflush(stdout);
    ::dup2(::fileno(file_), 1);
  }
  ~captured_stdout() { (void)text(); }
  captured_stdout(const captured_stdout&) = delete;
  captured_stdout& operator=(const captured_stdout&) = delete;
  // Ends the capture (once) and returns what was printed.
  std::string text() {
    if (saved_ >= 0) {
      std::fflush(stdout);
      ::dup2(saved_, 1);
      ::close(saved_);
      saved_ = -1;
      std::rewind(file_);
      for (int c; (c = std::fgetc(file_)) != EOF;) text_ += char(c);
      std::fclose(file_);
    }
    return text_;
  }

 private:
  std::FILE* file_;
  int saved_;
  std::string text_;
};

// Rewrites checkpoint `name`'s manifest in `dir` after `edit`.
template <class Edit>
void rewrite_manifest(const std::string& dir, const std::string& name, Edit edit) {
  const auto path = dir + "/" + name + ".manifest.json";
  nlohmann::json j;
  std::ifstream(path) >> j;
  edit(j);
  std::ofstream(path, std::ios::trunc) << j.dump(1);
}

// A ps job of one worker (the chief) on a fresh ps: its result, the batches it trained, what it printed.
struct one_worker_job {
  dtf::train_result result;
  std::vector<std::vector<float>> seen;
  std::string printed;
};
template <class Strategy>
one_worker_job run_one_worker(const dtf::data::dataset& data, const dtf::train_options& o, Strategy strategy) {
  using namespace dtf;
  ps_options po{test::opts("ps.0")};
  po.transport.cluster_id.clear();  // the spec's id depends on the free port
  po.transport.log = [](const std::string&) {};
  po.checkpoint_dir = o.model_dir;
  serving_ps ps(po);
  cluster c;
  c.source = "test";
  c.spec.jobs["ps"][0] = "127.0.0.1:" + std::to_string(ps.server.port());
  c.spec.jobs["worker"][0] = "127.0.0.1:1";  // listens nowhere (a ps strategy)
  c.self = {"worker", 0};
  one_worker_job job;
  recording_net net{.seen = &job.seen};
  captured_stdout out;
  try {
    job.result = train(c, net, data, std::move(strategy), o);
  } catch (...) {
    job.printed = out.text();
    throw;
  }
  job.printed = out.text();
  return job;
}

}  // namespace

TEST_CASE("a restored global step or data position is checked against the run's end, naming the source and value",
          "[data][positions]") {
  using dtf::detail::check_position;
  using dtf::detail::check_start_step;
  using dtf::detail::run_end;
  // A position dtf::train produces: 203 examples in batches of 8 (26 batches an epoch, the last of
  // 3 rows), after 30 batches: epoch 1, batch 4, 30 steps, 203 + 32 examples.
  position p = position::start_of(1, 203, 8, 5);
  for (std::uint64_t i = 0; i < 30; ++i) p.trained(i / 26, i % 26, i % 26 == 25 ? 3 : 8, 26);
  REQUIRE(p.epoch == 1);
  REQUIRE(p.batch == 4);
  REQUIRE(p.examples == 235);
  CHECK_FALSE(check_position(p, 26, std::nullopt, "worker.1", "ckpt-9"));
  CHECK_FALSE(check_position(p, 26, 2, "worker.1", "ckpt-9"));
  CHECK_THROWS_WITH(check_position(p, 26, 1, "worker.1", "checkpoint ckpt-9 of d"),
                    Catch::Contains("checkpoint ckpt-9 of d: the data position of worker.1 (epoch 1, batch 4, 30 steps, "
                                    "235 examples) is past the end of the --epochs 1 this run trains"));
  position end = position::start_of(1, 203, 8, 5);
  end.epoch = 2, end.steps = 52, end.examples = 406;
  CHECK(check_position(end, 26, 2, "worker.1", "ckpt-9"));  // the end of its 2 epochs: finished
  position crafted = p;
  crafted.epoch = 1000000;  // steps and examples left as they were
  CHECK_THROWS_WITH(check_position(crafted, 26, std::nullopt, "worker.1", "ckpt-9"),
                    Catch::Contains("(epoch 1000000, batch 4, 30 steps, 235 examples) is not one a run produces: at "
                                    "batch 26000004 of its stream it has passed 26000004 steps and 203000032 examples"));
  crafted.epoch = std::uint64_t(1) << 62;
  CHECK_THROWS_WITH(check_position(crafted, 26, std::nullopt, "worker.1", "ckpt-9"),
                    Catch::Contains("overflows its arithmetic"));
  crafted = p;
  crafted.batch = 26;
  CHECK_THROWS_WITH(check_position(crafted, 26, std::nullopt, "worker.1", "ckpt-9"),
                    Catch::Contains("names a batch past the 26 of an epoch"));

  const run_end sync{.last_step = 26, .what = "--epochs 1"};
  CHECK(check_start_step(25, sync, "ckpt-25").empty());
  CHECK(check_start_step(26, sync, "checkpoint ckpt-26 of d") ==
        "global step 26 (checkpoint ckpt-26 of d) is at or past the last step of this run, 26 (--epochs 1): training "
        "already finished, nothing to train");
  CHECK_THROWS_WITH(check_start_step(std::int64_t(1) << 62, sync, "checkpoint ckpt-26 of d"),
                    Catch::Contains("global step 4611686018427387904 (checkpoint ckpt-26 of d) is beyond the last step "
                                    "of this run, 26 (--epochs 1): this configuration never reaches it"));
  CHECK_THROWS_WITH(check_start_step(-1, sync, "ckpt-x"), Catch::Contains("global step -1 (ckpt-x) is negative"));
  // Asynchronous: pushes in flight carry the step past --last_step; it is finished, not refused.
  const run_end async{.last_step = 26, .exact = false, .what = "--last_step"};
  CHECK_THAT(check_start_step(30, async, "ckpt-30"), Catch::Contains("training already finished"));
  const run_end more{.num_steps = 10};
  CHECK(check_start_step(1000, more, "ckpt-1000").empty());
  CHECK_THROWS_WITH(check_start_step(std::numeric_limits<std::int64_t>::max() - 5, more, "ckpt-x"),
                    Catch::Contains("plus --num_steps 10 overflows"));
}

TEST_CASE("train: a collective run restarted at its last step says it is finished, and a checkpoint past the end is "
          "refused naming it and its step",
          "[train][positions]") {
  using namespace dtf;
  test::ckpt::temp_dir dir("collective_end");
  const std::string d = dir.path.string();
  const auto data = test::synthetic(203, 3, test::labels::argmax);  // 26 batches of 8 an epoch
  train_options o{.name = "end", .epochs = 1, .batch = 8, .seed = 5, .log_every = 0};
  o.model_dir = d;
  o.summary_every = 0;
  o.last_step = 10;
  std::vector<std::vector<float>> first_life, second_life;
  recording_net first{.seen = &first_life};
  REQUIRE(train(local_cluster(), first, data, strategies::ring_allreduce<>(), o).global_step == 10);
  REQUIRE(first_life.size() == 10);
  REQUIRE(latest_checkpoint(d) == "ckpt-10");
  // The same command again: nothing is left to train, and it says so.
  recording_net second{.seen = &second_life};
  captured_stdout out;
  const auto again = train(local_cluster(), second, data, strategies::ring_allreduce<>(), o);
  const std::string printed = out.text();
  CHECK(again.exit_code == 0);
  CHECK(again.global_step == 10);
  CHECK(second_life.empty());
  CHECK_THAT(printed, Catch::Contains("global step 10 (checkpoint ckpt-10 of " + d + ") is at or past the last step "
                                      "of this run, 10 (--last_step): training already finished, nothing to train"));
  // Its step made 2^62: past the 26 steps of --epochs 1, refused before any value is restored.
  test::ckpt::set_checkpoint_step(d, "ckpt-10", std::int64_t(1) << 62);  // its file too: the reader checks it
  o.last_step = 0;
  CHECK_THROWS_WITH(train(local_cluster(), second, data, strategies::ring_allreduce<>(), o),
                    Catch::Contains("global step 4611686018427387904 (checkpoint ckpt-10 of " + d + ") is beyond the "
                                    "last step of this run, 26 (--epochs 1)"));
  CHECK(second_life.empty());
}

TEST_CASE("train: an asynchronous job restarted at the end of its epochs says it is finished, and positions past "
          "them are refused naming the checkpoint, the task and the position",
          "[train][positions]") {
  using namespace dtf;
  test::ckpt::temp_dir dir("async_end");
  const std::string d = dir.path.string();
  const auto data = test::synthetic(203, 3, test::labels::argmax);  // one shard: 26 batches of 8 an epoch
  train_options o{.name = "async_end", .epochs = 1, .batch = 8, .seed = 5, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000, .finish_timeout_s = 60};
  o.model_dir = d;
  const auto strategy = [] { return strategies::downpour({.fetch_every = 1, .push_every = 1}); };
  const auto whole = run_one_worker(data, o, strategy());
  REQUIRE(whole.result.exit_code == 0);
  REQUIRE(whole.seen.size() == 26);
  const auto name = latest_checkpoint(d);
  REQUIRE(name);
  const auto saved = read_manifest(d, *name).positions;
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].task == "worker.0");
  CHECK(saved[0].at.epoch == 1);  // the end of its one epoch
  CHECK(saved[0].at.batch == 0);
  // The same job again: its position is the end of its epoch; it says so and trains nothing.
  const auto again = run_one_worker(data, o, strategy());
  CHECK(again.result.exit_code == 0);
  CHECK(again.seen.empty());
  CHECK_THAT(again.printed, Catch::Contains("worker.0: that is the end of its 1 epochs: training already finished, "
                                            "nothing to train"));
  // The position made epoch 10^6 (its steps and examples to match, or not): refused before the
  // ps gets any of the checkpoint.
  const auto crafted = [&](bool consistent) {
    rewrite_manifest(d, *name, [&](nlohmann::json& j) {
      j["positions"][0]["epoch"] = 1000000;
      j["positions"][0]["steps"] = consistent ? 26000000 : 26;
      j["positions"][0]["examples"] = consistent ? 203000000 : 203;
    });
    std::string error;
    try {
      (void)run_one_worker(data, o, strategy());
    } catch (const std::exception& e) {
      error = e.what();
    }
    return error;
  };
  CHECK_THAT(crafted(true), Catch::Contains("checkpoint " + *name + " of " + d + ": the data position of worker.0 "
                                            "(epoch 1000000, batch 0, 26000000 steps, 203000000 examples) is past the "
                                            "end of the --epochs 1 this run trains"));
  CHECK_THAT(crafted(false), Catch::Contains("checkpoint " + *name + " of " + d + ": the data position of worker.0 "
                                             "(epoch 1000000, batch 0, 26 steps, 203 examples) is not one a run "
                                             "produces"));
}

TEST_CASE("train: a synchronous job restarted at its last step says on every worker that it is finished, and a "
          "checkpoint past it is refused naming it and its step",
          "[train][positions]") {
  using namespace dtf;
  test::ckpt::temp_dir dir("sync_end");
  const std::string d = dir.path.string();
  // Two shards of 102 and 101 examples in batches of 8: 13 batches an epoch each; 1 epoch is 13 steps.
  const auto data = test::synthetic(203, 6, test::labels::argmax);
  train_options o{.name = "sync_end", .epochs = 1, .batch = 8, .seed = 3, .summary_every = 0, .log_every = 0,
                  .timeout_ms = 10000, .finish_timeout_s = 60};
  o.model_dir = d;
  std::vector<std::vector<float>> whole[2], again[2];
  std::vector<float> ignored;
  sync_job(data, o, whole, ignored);
  REQUIRE(whole[0].size() == 13);
  REQUIRE(latest_checkpoint(d) == "ckpt-13");
  std::string printed;
  {
    captured_stdout out;
    sync_job(data, o, again, ignored);
    printed = out.text();
  }
  CHECK(again[0].empty());
  CHECK(again[1].empty());
  CHECK_THAT(printed, Catch::Contains("worker.0: global step 13 (checkpoint ckpt-13 of " + d + ") is at or past the "
                                      "last step of this run, 13 (--epochs 1): training already finished, nothing to "
                                      "train"));
  CHECK_THAT(printed, Catch::Contains("worker.1: global step 13 (on the parameter servers) is at or past the last "
                                      "step of this run, 13 (--epochs 1): training already finished"));
  // Its step made 2^62 (a lone worker: the chief refuses the restore, so no other waits for it),
  // in its manifest and its files (the reader refuses a file of another step than the manifest's).
  test::ckpt::set_checkpoint_step(d, "ckpt-13", std::int64_t(1) << 62);
  const auto lone = data.shard(2, 0);  // the chief's shard alone: 13 batches, 1 epoch, 13 steps
  CHECK_THROWS_WITH(run_one_worker(lone, o, strategies::sync_sgd({.replicas_to_aggregate = 1})),
                    Catch::Contains("global step 4611686018427387904 (checkpoint ckpt-13 of " + d + ") is beyond the "
                                    "last step of this run, 13 (--epochs 1)"));
}
