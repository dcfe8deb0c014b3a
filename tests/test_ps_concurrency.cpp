// The ps under concurrent updates from several I/O threads: lock-free (Hogwild) apply loses no
// update, locked apply of a stateful rule equals the same updates in sequence. Also built
// with ThreadSanitizer by tests/tsan/run_ps_tsan.sh (no data race on values, slots, counters).
#include <catch2/catch.hpp>

#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include "ps_helpers.hpp"

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
