// Transfers cut into bounded requests (docs/design/large-models.md): a ps's share of an init,
// pull, push or restore goes in parts of at most transport_options::max_request_bytes. The
// values must be exactly those of an independent computation, a push in parts must count once,
// and a ps must refuse parts out of order; a synchronous contribution's part goes in segments.
#include <catch2/catch.hpp>

#include <dtf/checkpoint.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include "ps_helpers.hpp"

#include <filesystem>
#include <memory>
#include <random>
#include <unistd.h>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace lm {
// 12 shards of 1,000 floats (4,000 bytes) over 2 ps: 6 per ps.
constexpr std::size_t rows = 12, cols = 1000, n = rows * cols;
const std::vector<dtf::variable_spec> vars{{"w", {rows, cols}, 0}};
dtf::placement layout2() { return dtf::partitioners::fixed_size{rows}.place(vars, 2); }

std::vector<float> seeded(std::uint32_t seed, float scale) { return dtf::test::seeded_uniform(n, seed, scale); }

// Request bounds the tests run with: with 4,000-byte shards, 9,000 bytes make parts of 2 shards
// (3 per ps), 4,000 parts of one (6 per ps), 1 byte too (a shard larger than the bound goes
// alone); 0 is the default, one part per ps.
const std::size_t request_sizes[] = {9000, 4000, 1, 0};

// Options whose requests carry at most `bytes` of payload (0: the default, one part per ps here).
dtf::transport_options cut_at(std::string identity, std::size_t bytes) {
  auto o = dtf::test::opts(std::move(identity));
  if (bytes) o.max_request_bytes = bytes;
  return o;
}

struct two_ps {
  std::vector<std::unique_ptr<dtf::test::running_ps>> ps;
  explicit two_ps(const std::string& checkpoint_dir = "") {
    for (int i = 0; i < 2; ++i) {
      dtf::ps_options o{dtf::test::opts("ps." + std::to_string(i))};
      o.transport.log = [](const std::string&) {};
      o.checkpoint_dir = checkpoint_dir;
      ps.push_back(std::make_unique<dtf::test::running_ps>(o));
    }
  }
  std::unique_ptr<dtf::ps_client> client(std::string identity, std::size_t bytes) const {
    auto c = std::make_unique<dtf::ps_client>(std::vector<std::string>{ps[0]->address(), ps[1]->address()},
                                              layout2(), cut_at(std::move(identity), bytes));
    c->connect();
    return c;
  }
};

// Momentum SGD (v = mu v + g; w -= lr v) on every element: the reference.
void momentum_step(std::vector<float>& w, std::vector<float>& v, const std::vector<float>& g, float lr, float mu) {
  for (std::size_t i = 0; i < w.size(); ++i) {
    v[i] = mu * v[i] + g[i];
    w[i] -= lr * v[i];
  }
}

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("dtf_large_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};
}  // namespace lm

}  // namespace

TEST_CASE("a model sent in parts trains to exactly the values of momentum SGD, a push in parts counting once",
          "[ps][parts]") {
  const float lr = 0.05f, mu = 0.9f;
  for (const std::size_t bytes : lm::request_sizes) {
    DYNAMIC_SECTION("requests of at most " << bytes << " bytes") {
      lm::two_ps cluster;
      auto chief = cluster.client("chief.0", bytes);
      auto w = lm::seeded(1, 1.0f);
      std::vector<float> v(lm::n, 0.0f);
      chief->initialize(w, {dtf::optim::momentum{lr, mu}});
      auto other = cluster.client("worker.1", bytes);
      std::vector<float> got(lm::n);
      REQUIRE(other->pull(got) == 0);
      CHECK(got == w);
      for (std::uint32_t k = 0; k < 3; ++k) {
        const auto g = lm::seeded(10 + k, 0.5f);
        const auto r = chief->push_gradients(g);
        CHECK(r.global_step == k + 1);  // one step per push, not per part
        lm::momentum_step(w, v, g, lr, mu);
      }
      // worker.1 pulled before the 3 pushes: its push is 3 updates stale on each ps, whatever
      // the number of parts each push took.
      const auto r = other->push_gradients(lm::seeded(20, 0.5f));
      CHECK(r.staleness == 3);
      lm::momentum_step(w, v, lm::seeded(20, 0.5f), lr, mu);
      CHECK(chief->pull(got) == 4);
      for (std::size_t i = 0; i < lm::n; ++i) REQUIRE(got[i] == Approx(w[i]).epsilon(1e-6).margin(1e-6));
    }
  }
}

TEST_CASE("a checkpoint restores in parts through the chief and by the ps, values and momentum exact",
          "[ps][parts][checkpoint]") {
  const float lr = 0.05f, mu = 0.9f;
  lm::temp_dir dir("restore");
  auto w = lm::seeded(2, 1.0f);
  std::vector<float> v(lm::n, 0.0f);
  {
    lm::two_ps cluster(dir.path.string());
    auto chief = cluster.client("chief.0", 9000);
    chief->initialize(w, {dtf::optim::momentum{lr, mu}});
    for (std::uint32_t k = 0; k < 2; ++k) {
      chief->push_gradients(lm::seeded(30 + k, 0.5f));
      lm::momentum_step(w, v, lm::seeded(30 + k, 0.5f), lr, mu);
    }
    dtf::save_checkpoint(*chief, {dir.path.string(), "parts", 3}, lm::vars);
  }
  // One more step after the restore needs the momentum slot exactly as saved.
  auto w3 = w, v3 = v;
  lm::momentum_step(w3, v3, lm::seeded(40, 0.5f), lr, mu);
  for (const auto how : {dtf::restore_transfer::through_chief, dtf::restore_transfer::ps_reads_files}) {
    DYNAMIC_SECTION((how == dtf::restore_transfer::through_chief ? "through the chief" : "read by the ps")) {
      lm::two_ps cluster(dir.path.string());
      auto chief = cluster.client("chief.0", 4000);
      std::vector<float> got(lm::n);
      REQUIRE(dtf::restore_checkpoint(*chief, dir.path.string(), "parts-2", lm::vars,
                                      {dtf::optim::momentum{lr, mu}}, got, how) == 2);
      for (std::size_t i = 0; i < lm::n; ++i) REQUIRE(got[i] == Approx(w[i]).epsilon(1e-6).margin(1e-6));
      chief->push_gradients(lm::seeded(40, 0.5f));
      chief->pull(got);
      for (std::size_t i = 0; i < lm::n; ++i) REQUIRE(got[i] == Approx(w3[i]).epsilon(1e-6).margin(1e-6));
    }
  }
}

TEST_CASE("a ps refuses init parts out of order or from another sender, and part 0 starts again",
          "[ps][parts][hostile]") {
  lm::two_ps cluster;
  auto chief = cluster.client("chief.0", 0);
  auto other = cluster.client("worker.1", 0);
  const auto values = lm::seeded(3, 1.0f);
  const auto& ids = chief->shards_of(0);  // 6 shards of 1,000 floats: parts of 3
  auto part = [&](dtf::ps_client& c, std::uint32_t k, std::uint32_t first) {
    dtf::detail::ps_init_msg m;
    m.ids.assign(ids.begin() + first, ids.begin() + first + 3);
    m.sizes.assign(3, lm::cols);
    dtf::ps_client::set_config(m, {dtf::optim::sgd{0.1f}});
    m.part = k;
    m.parts = 2;
    auto call = c.request(0, dtf::detail::message_kind::ps_init, dtf::detail::encode_message(m));
    call.payload.push_back(asio::buffer(values.data(), 3 * lm::cols * sizeof(float)));
    std::vector<dtf::rpc_call> one{std::move(call)};
    try {
      c.call_all(one);
      return std::string();
    } catch (const dtf::error& e) {
      return std::string(e.what());
    }
  };
  CHECK_THAT(part(*chief, 1, 3), Catch::Contains("no init is under way"));
  CHECK(part(*chief, 0, 0).empty());
  CHECK_THAT(part(*other, 1, 3), Catch::Contains("expected part 1 of 2 of the init from chief.0"));
  CHECK(part(*chief, 0, 0).empty());  // a chief that starts again
  CHECK_THAT(part(*chief, 1, 0), Catch::Contains("shard " + std::to_string(ids[0]) + " appears twice"));
  CHECK_FALSE(cluster.ps[0]->ps->initialized());
  CHECK(part(*chief, 0, 0).empty());
  CHECK(part(*chief, 1, 3).empty());
  CHECK(cluster.ps[0]->ps->initialized());
}

TEST_CASE("a shard no frame can carry is refused before anything is sent, saying what to do", "[ps][parts]") {
  lm::two_ps cluster;
  auto o = lm::cut_at("chief.0", 0);
  o.limits.max_payload_bytes = 3000;  // below one shard's 4,000 bytes
  dtf::ps_client c({cluster.ps[0]->address(), cluster.ps[1]->address()}, lm::layout2(), o);
  c.connect();
  const auto values = lm::seeded(4, 1.0f);
  CHECK_THROWS_WITH(c.initialize(values, {dtf::optim::sgd{0.1f}}),
                    Catch::Contains("over the 3000 one frame may carry") && Catch::Contains("max_shard_bytes"));
  CHECK_FALSE(cluster.ps[0]->ps->initialized());
  CHECK_FALSE(cluster.ps[1]->ps->initialized());
  std::vector<float> buf(lm::n);
  CHECK_THROWS_WITH(c.push_sync(buf, 0), Catch::Contains("over the 3000 one frame may carry") &&
                                             Catch::Contains("max_shard_bytes"));
}

TEST_CASE("a push whose apply throws part-way counts as one update and names the shards applied",
          "[ps][parts][exception]") {
  // 12 shards on one ps; the third shard's update throws bad_alloc, as copy on write's
  // allocation may. Applied whole, or a piece (one shard) at a time as it arrives.
  const auto layout = dtf::partitioners::fixed_size{lm::rows}.place(lm::vars, 1);
  for (const bool as_received : {false, true}) {
    DYNAMIC_SECTION((as_received ? "applied as it arrives" : "applied whole")) {
      int calls = 0;
      dtf::ps_options o{dtf::test::opts("ps.0")};
      o.transport.log = [](const std::string&) {};
      o.transport.pieces_min_bytes = 1000;
      o.apply_as_received = as_received;
      o.apply_piece_bytes = 4000;
      o.apply_fault = [&calls] {
        if (++calls == 3) throw std::bad_alloc();
      };
      dtf::test::running_ps ps(o);
      auto co = dtf::test::opts("chief.0");
      co.pieces_min_bytes = 1000;
      dtf::ps_client chief({ps.address()}, layout, co), other({ps.address()}, layout, dtf::test::opts("worker.1"));
      chief.connect();
      other.connect();
      auto w = lm::seeded(5, 1.0f);
      chief.initialize(w, {dtf::optim::sgd{0.5f}});
      std::vector<float> got(lm::n);
      other.pull(got);
      const auto g = lm::seeded(6, 1.0f);
      CHECK_THROWS_WITH(chief.push_gradients(g), as_received ? Catch::Contains("its first 2 of 12 shards were applied")
                                                             : Catch::Contains("failed after 2 of 12 shards were applied"));
      CHECK(ps.ps->pushes_applied_as_received() == (as_received ? 1u : 0u));
      // The two shards applied are in the values (w - 0.5 g), the others are as initialised.
      for (const auto id : chief.shards_of(0)) {
        const auto& sh = layout.shards[id];
        const bool applied = id == chief.shards_of(0)[0] || id == chief.shards_of(0)[1];
        for (std::size_t i = sh.offset; i < sh.offset + sh.size; ++i)
          if (applied) w[i] -= 0.5f * g[i];
      }
      CHECK(chief.pull(got) == 0);  // the global step did not advance
      for (std::size_t i = 0; i < lm::n; ++i) REQUIRE(got[i] == Approx(w[i]).epsilon(1e-6).margin(1e-6));
      CHECK(other.push_gradients(lm::seeded(7, 0.1f)).staleness == 1);  // the failed push counted once
    }
  }
}

TEST_CASE("a synchronous contribution sent in segments averages to exactly the values of momentum SGD",
          "[ps][parts][sync]") {
  // N = 2 workers; each ps's part in segments of 2 shards, 1 shard, 1 byte (one shard each) or
  // whole (0). Every step must apply the average of both workers' gradients once, on both ps.
  const float lr = 0.05f, mu = 0.9f;
  for (const std::size_t bytes : lm::request_sizes) {
    DYNAMIC_SECTION("requests of at most " << bytes << " bytes") {
      lm::two_ps cluster;
      auto w = lm::seeded(8, 1.0f);
      std::vector<float> v(lm::n, 0.0f);
      std::vector<std::unique_ptr<dtf::ps_client>> workers;
      workers.push_back(cluster.client("worker.0", bytes));
      workers.push_back(cluster.client("worker.1", bytes));
      workers[0]->initialize(w, {dtf::optim::momentum{lr, mu}, dtf::apply_mode::locked, 2, 2});
      for (std::uint32_t t = 0; t < 3; ++t) {
        std::vector<dtf::sync_result> r(2);
        std::vector<std::thread> threads;
        for (std::size_t k = 0; k < 2; ++k)
          threads.emplace_back([&, k] {
            std::vector<float> got(lm::n);
            const auto step = workers[k]->pull(got);
            r[k] = workers[k]->push_sync(lm::seeded(50 + 2 * t + std::uint32_t(k), 0.5f), step);
          });
        for (auto& th : threads) th.join();
        for (const auto& x : r) {
          CHECK(x.global_step == t + 1);
          CHECK_FALSE(x.dropped);
        }
        const auto g0 = lm::seeded(50 + 2 * t, 0.5f), g1 = lm::seeded(51 + 2 * t, 0.5f);
        std::vector<float> avg(lm::n);
        for (std::size_t i = 0; i < lm::n; ++i) avg[i] = (g0[i] + g1[i]) * 0.5f;
        lm::momentum_step(w, v, avg, lr, mu);
      }
      std::vector<float> got(lm::n);
      CHECK(workers[1]->pull(got) == 3);
      for (std::size_t i = 0; i < lm::n; ++i) REQUIRE(got[i] == Approx(w[i]).epsilon(1e-6).margin(1e-6));
    }
  }
}

TEST_CASE("a ps refuses segments of a synchronous part out of order, and a retried segment counts once",
          "[ps][parts][sync][hostile]") {
  lm::two_ps cluster;
  auto a = cluster.client("worker.0", 0), b = cluster.client("worker.1", 0);
  const auto w = lm::seeded(9, 1.0f);
  a->initialize(w, {dtf::optim::sgd{1.0f}, dtf::apply_mode::locked, 2, 2});
  const auto g = lm::seeded(10, 0.5f);
  // Segment k of 2 (3 shards each) of ps `ps`'s part, from client c, as contribution `seq`.
  auto segment = [&](dtf::ps_client& c, std::size_t ps, std::uint32_t k, std::uint32_t first, dtf::detail::message_kind kind,
                     std::uint64_t seq = 0) {
    const auto& ids = c.shards_of(ps);
    dtf::detail::ps_sync_push_msg m;
    m.ids.assign(ids.begin() + first, ids.begin() + first + 3);
    m.segment = k;
    m.segments = 2;
    m.incarnation = 7;
    m.sequence = seq;
    auto call = c.request(ps, kind, dtf::detail::encode_message(m));
    for (auto id : m.ids)
      call.payload.push_back(asio::buffer(g.data() + lm::layout2().shards[id].offset, lm::cols * sizeof(float)));
    std::vector<dtf::rpc_call> one{std::move(call)};
    try {
      c.call_all(one);
      return std::string();
    } catch (const dtf::error& e) {
      return std::string(e.what());
    }
  };
  using k = dtf::detail::message_kind;
  CHECK_THAT(segment(*a, 1, 1, 3, k::ps_sync_stage), Catch::Contains("staged segment 1 of 2 with 0 staged here"));
  CHECK_THAT(segment(*a, 0, 1, 3, k::ps_sync_push), Catch::Contains("committed segment 1 of 2 with 0 staged here"));
  CHECK(segment(*a, 1, 0, 0, k::ps_sync_stage).empty());
  CHECK_THAT(segment(*a, 1, 1, 0, k::ps_sync_stage), Catch::Contains("must carry every shard of this ps once"));
  CHECK(segment(*a, 1, 1, 3, k::ps_sync_stage).empty());
  CHECK(segment(*a, 1, 0, 0, k::ps_sync_stage).empty());  // a retry: kept as first staged
  CHECK(segment(*a, 0, 0, 0, k::ps_sync_stage).empty());
  // worker.0's commit waits for worker.1's contribution (whole parts): then step 0 applies the
  // average of both, each once, on both ps.
  std::string committed = "unanswered";
  std::thread commit([&] { committed = segment(*a, 0, 1, 3, k::ps_sync_push); });
  const auto gb = lm::seeded(11, 0.5f);
  const auto rb = b->push_sync(gb, 0);
  commit.join();
  CHECK(committed.empty());
  CHECK(rb.global_step == 1);
  std::vector<float> got(lm::n);
  CHECK(b->pull(got) == 1);  // forwards the decision to ps 1 if worker.0 did not (it did not: a raw commit)
  for (std::size_t i = 0; i < lm::n; ++i) REQUIRE(got[i] == Approx(w[i] - (g[i] + gb[i]) * 0.5f).epsilon(1e-6).margin(1e-6));
}
