// The ps under concurrent updates from several I/O threads: lock-free (Hogwild) apply loses no
// update, locked apply of a stateful rule equals the same updates in sequence. Also built
// with ThreadSanitizer by tests/tsan/run_ps_tsan.sh (no data race on values, slots, counters).
#include <catch2/catch.hpp>

#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include "checkpoint_helpers.hpp"
#include "ps_helpers.hpp"

#include <atomic>
#include <cmath>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

using namespace dtf;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {
std::vector<variable_spec> vars64() { return {{"w", {16, 3}, 0}, {"b", {16}, 48}}; }

// `workers` clients on threads, each pushing `pushes` gradients of ones (and pulling between).
void hammer(const std::string& address, const placement& layout, std::size_t workers, int pushes) {
  std::vector<std::thread> ts;
  for (std::size_t k = 0; k < workers; ++k)
    ts.emplace_back([&, k] {
      ps_client c({address}, layout, opts("worker." + std::to_string(k)));
      c.connect();
      std::vector<float> v(64), g(64, 1.0f);
      for (int i = 0; i < pushes; ++i) {
        if (i % 4 == 0) c.pull(v);
        c.push_gradients(g);
      }
    });
  for (auto& t : ts) t.join();
}
}  // namespace

TEST_CASE("lock-free apply with 4 ps I/O threads loses no update", "[ps][hogwild][concurrency]") {
  running_ps ps0(opts("ps.0"), 4);
  const auto layout = partitioners::fixed_size{2}.place(vars64(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(std::vector<float>(64, 0.0f), {optim::sgd{1.0f}, apply_mode::lock_free});
  hammer(ps0.address(), layout, 4, 100);
  std::vector<float> v(64);
  CHECK(chief.pull(v) == 400);
  for (float x : v) REQUIRE(x == -400.0f);  // integers: every partial sum is exact
}

TEST_CASE("a checkpoint saved while lock-free pushes run reads every value with atomic loads",
          "[ps][hogwild][concurrency]") {
  // Issue 31: the snapshot of a lock-free shard read its values with plain loads while pushes on
  // other I/O threads updated them with atomic fetch_adds, a data race (ThreadSanitizer reports it
  // in tests/tsan/run_ps_tsan.sh's build). Each push subtracts exactly 1 from every element, so
  // every saved value is a whole number of pushes, and a save after the last push holds them all.
  test::ckpt::temp_dir dir("lock_free_save");
  ps_options o{opts("ps.0"), 4};
  o.transport.log = [](const std::string&) {};  // a line per save
  o.checkpoint_dir = dir.path.string();
  running_ps ps0(o);
  const auto layout = partitioners::fixed_size{2}.place(vars64(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(std::vector<float>(64, 0.0f), {optim::sgd{1.0f}, apply_mode::lock_free});
  const checkpoint_options ck{.directory = dir.path.string(), .max_to_keep = 1000};
  std::atomic<bool> pushing{true};
  std::thread pushes([&] {
    hammer(ps0.address(), layout, 3, 100);
    pushing = false;
  });
  std::vector<std::string> saved;
  do saved.push_back(save_checkpoint(chief, ck, vars64(), std::int64_t(saved.size())).name);
  while (pushing);
  pushes.join();
  saved.push_back(save_checkpoint(chief, ck, vars64(), std::int64_t(saved.size())).name);
  for (const auto& name : saved) {
    CAPTURE(name);
    std::vector<float> v(64);
    checkpoint_reader::open(dir.path, name).read(0, 0, v);
    for (float x : v) REQUIRE((x <= 0.0f && x >= -300.0f && x == std::floor(x)));
  }
  std::vector<float> last(64);
  checkpoint_reader::open(dir.path, saved.back()).read(0, 0, last);
  CHECK(last == std::vector<float>(64, -300.0f));
}

TEST_CASE("locked apply of Adam with 4 ps I/O threads equals the same pushes in sequence", "[ps][concurrency]") {
  running_ps ps0(opts("ps.0"), 4);
  const auto layout = partitioners::fixed_size{2}.place(vars64(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  const optim::rule rule = optim::adam{.learning_rate = 0.01f};
  chief.initialize(std::vector<float>(64, 0.5f), {rule});
  hammer(ps0.address(), layout, 4, 50);
  // Equal gradients: the order of the 200 pushes does not matter.
  std::vector<float> ref(64, 0.5f), g(64, 1.0f);
  optim::optimizer<optim::host_space> opt(rule, 64);
  for (int i = 0; i < 200; ++i) opt.apply(std::span<float>(ref), std::span<const float>(g));
  std::vector<float> v(64);
  CHECK(chief.pull(v) == 200);
  for (std::size_t i = 0; i < 64; ++i) REQUIRE(v[i] == ref[i]);
}

TEST_CASE("the chief's wait for the workers ends when the last one reports done, or at its limit",
          "[ps][done][concurrency]") {
  running_ps ps0(opts("ps.0"), 2);
  const auto layout = partitioners::fixed_size{2}.place(vars64(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.mark_done();
  // Nobody else reports: the wait (held by the ps, not polled) ends at its limit with 1.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(chief.wait_workers_done(2, std::chrono::milliseconds(300)) == 1);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
  // Two workers report from their threads while the chief waits (or before: either order
  // ends the wait with all three).
  std::vector<std::thread> ts;
  for (int k = 0; k < 2; ++k)
    ts.emplace_back([&, k] {
      ps_client w({ps0.address()}, layout, opts("worker." + std::to_string(k)));
      w.connect();
      w.mark_done();
    });
  CHECK(chief.wait_workers_done(3, std::chrono::seconds(20)) == 3);
  for (auto& t : ts) t.join();
  CHECK(chief.done_tasks() == std::set<std::string>{"chief.0", "worker.0", "worker.1"});
}

TEST_CASE("a leased shard keeps its values while an update writes into a copy, then updates go in place again",
          "[ps][concurrency]") {
  ps_detail::shard_values values;
  values.resize(4);
  for (std::size_t i = 0; i < 4; ++i) values.unshared()[i] = float(i + 1);
  const float* first = values.view().data();
  auto [leased, hold] = values.lease();
  CHECK(leased.data() == first);
  auto w = values.writable();  // a lease is out: the update gets a copy
  CHECK(w.data() != first);
  for (auto& x : w) x += 10.0f;
  CHECK(std::vector<float>(leased.begin(), leased.end()) == std::vector<float>{1, 2, 3, 4});
  CHECK(std::vector<float>(values.view().begin(), values.view().end()) == std::vector<float>{11, 12, 13, 14});
  hold.reset();
  const float* second = values.view().data();
  CHECK(values.writable().data() == second);  // no lease: in place
  auto [again, hold2] = values.lease();
  CHECK(again.data() == second);
}

TEST_CASE("locked pulls sent from leased shards never see an update part-way, with 4 ps I/O threads",
          "[ps][concurrency]") {
  // Every push adds 1 to every element of the one 64 Ki-float shard: a pull is consistent exactly
  // when all its elements are equal, and its value never goes down for one puller.
  running_ps ps0(opts("ps.0"), 4);
  const std::vector<variable_spec> vars{{"v", {65536}, 0}};
  const auto layout = partitioners::round_robin{}.place(vars, 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(std::vector<float>(65536, 0.0f), {optim::sgd{1.0f}});
  constexpr int pushes = 60;
  std::vector<std::thread> ts;
  std::vector<std::string> failures(4);
  for (std::size_t k = 0; k < 4; ++k)
    ts.emplace_back([&, k] {
      ps_client c({ps0.address()}, layout, opts("worker." + std::to_string(k)));
      c.connect();
      std::vector<float> v(65536), d(65536, 1.0f);
      float last = 0.0f;
      for (int i = 0; i < pushes; ++i) {
        if (k % 2 == 0) {
          c.push_deltas(d, false);
          continue;
        }
        c.pull(v);
        for (float x : v)
          if (x != v[0]) failures[k] = "a pull saw " + std::to_string(v[0]) + " and " + std::to_string(x);
        if (v[0] < last) failures[k] = "values went back from " + std::to_string(last) + " to " + std::to_string(v[0]);
        last = v[0];
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& f : failures) CHECK(f.empty());
  std::vector<float> v(65536);
  chief.pull(v);
  for (float x : v) REQUIRE(x == float(2 * pushes));
}
