// A large push applied a piece at a time as its bytes arrive (dtf/ps/push_pieces.hpp, the
// transport's rpc_pieces): the same values as a push applied whole, and what a sender that
// lies about its values can and cannot do.
#include <catch2/catch.hpp>

#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include "ps_helpers.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <thread>

using namespace dtf;
using dtf::test::opts;

namespace {

// 8 shards of 256 KiB (2 MiB): each a piece of its own at the default apply_piece_bytes.
constexpr std::size_t rows = 8, cols = 65536, n = rows * cols;

placement layout8() { return partitioners::fixed_size{rows}.place({{"w", {rows, cols}, 0}}, 1); }

struct ps_with {
  std::unique_ptr<parameter_server> ps;
  std::thread thread;
  ps_with(bool as_received, int threads, nonfinite_policy policy = nonfinite_policy::reject) {
    ps_options o{opts("ps.0"), threads};
    o.apply_as_received = as_received;
    o.nonfinite = policy;
    ps = std::make_unique<parameter_server>("127.0.0.1:0", o);
    thread = std::thread([p = ps.get()] { p->run(); });
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(ps->port()); }
  ~ps_with() {
    ps->stop();
    thread.join();
  }
};

std::vector<float> seeded(std::uint32_t seed, float scale) { return dtf::test::seeded_uniform(n, seed, scale); }

// A shard's range in the flat model.
std::pair<std::size_t, std::size_t> range_of(const placement& layout, std::size_t row) {
  for (const auto& s : layout.shards)
    if (s.offset == row * cols) return {s.offset, s.size};
  FAIL("no shard at row " << row);
  return {};
}

}  // namespace

TEST_CASE("a large push applied as it arrives gives exactly the values of one applied whole", "[ps][pieces]") {
  const auto layout = layout8();
  REQUIRE(layout.shards.size() == rows);
  const auto init = seeded(1, 1.0f);
  for (int threads : {1, 2}) {
    DYNAMIC_SECTION("sgd and momentum, " << threads << " I/O threads") {
      for (const optim::rule rule : {optim::rule{optim::sgd{0.1f}}, optim::rule{optim::momentum{0.05f, 0.9f}}}) {
        ps_with pieced(true, threads), whole(false, threads);
        std::vector<std::vector<float>> got;
        for (auto* p : {&pieced, &whole}) {
          ps_client c({p->address()}, layout, opts("worker.0"));
          c.connect();
          c.initialize(init, {rule});
          for (std::uint32_t k = 0; k < 3; ++k) c.push_gradients(seeded(10 + k, 0.5f));
          got.emplace_back(n);
          CHECK(c.pull(got.back()) == 3);
        }
        CHECK(pieced.ps->pushes_applied_as_received() == 3);
        CHECK(whole.ps->pushes_applied_as_received() == 0);
        CHECK(got[0] == got[1]);
        if (std::holds_alternative<optim::sgd>(rule)) {  // independent reference: v -= 0.1 g
          auto want = init;
          for (std::uint32_t k = 0; k < 3; ++k) {
            const auto g = seeded(10 + k, 0.5f);
            for (std::size_t i = 0; i < n; ++i) want[i] -= 0.1f * g[i];
          }
          CHECK(got[0] == want);
        }
      }
    }
  }
  SECTION("DynSGD: a stale delta is scaled by 1/(staleness+1) as a whole push's is") {
    ps_with ps(true, 1);
    ps_client a({ps.address()}, layout, opts("worker.0")), b({ps.address()}, layout, opts("worker.1"));
    a.connect();
    b.connect();
    a.initialize(init, {optim::sgd{}});
    std::vector<float> v(n);
    a.pull(v);
    b.pull(v);
    b.push_deltas(seeded(20, 1.0f), true, true);  // staleness 0 each: b pulls before it pushes
    b.pull(v);
    b.push_deltas(seeded(21, 1.0f), true, true);
    const auto r = a.push_deltas(seeded(22, 1.0f), true, true);
    CHECK(r.staleness == 2);
    CHECK(ps.ps->pushes_applied_as_received() == 3);
    auto want = init;
    const auto d0 = seeded(20, 1.0f), d1 = seeded(21, 1.0f), d2 = seeded(22, 1.0f);
    for (std::size_t i = 0; i < n; ++i) want[i] = ((want[i] + 1.0f * d0[i]) + 1.0f * d1[i]) + (1.0f / 3.0f) * d2[i];
    CHECK(a.pull(v) == 3);
    CHECK(v == want);
  }
}

TEST_CASE("a non-finite push is refused whole, and one declared finite loses its pieces from the NaN on", "[ps][pieces][hostile]") {
  const auto layout = layout8();
  const auto init = seeded(1, 1.0f);
  ps_with ps(true, 1);
  ps_client honest({ps.address()}, layout, opts("worker.0"));
  honest.connect();
  honest.initialize(init, {optim::sgd{1.0f}});
  auto grads = seeded(30, 1.0f);
  const auto [nan_at, nan_size] = range_of(layout, 5);
  grads[nan_at + 17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(n);

  // An honest client says its values are not finite: nothing is taken in pieces or applied.
  CHECK_THROWS_WITH(honest.push_gradients(grads), Catch::Contains("worker.0") && Catch::Contains("non-finite"));
  honest.connect();
  CHECK(honest.pull(v) == 0);
  CHECK(v == init);
  CHECK(ps.ps->pushes_applied_as_received() == 0);

  // A sender that declares them finite: the shards before the NaN's piece are applied, that one
  // and the later ones are not, the step does not advance, and the reply says so.
  rpc_client liar(opts("worker.9"));
  liar.add_peer("ps.0", ps.address());
  liar.connect_all();
  std::vector<std::uint32_t> ids;
  for (const auto& s : layout.shards) ids.push_back(std::uint32_t(&s - layout.shards.data()));
  std::sort(ids.begin(), ids.end(), [&](auto x, auto y) { return layout.shards[x].offset < layout.shards[y].offset; });
  detail::ps_push_msg m{ids, detail::update_kind::gradient, std::nullopt, true, 0, true};
  rpc_call c;
  c.kind = detail::message_kind::ps_push;
  c.meta = detail::encode_message(m);
  c.payload.push_back(asio::buffer(grads.data(), grads.size() * sizeof(float)));
  try {
    liar.call(c);
    FAIL("a push with a NaN was applied");
  } catch (const error& e) {
    const std::string why = e.what();
    INFO(why);
    CHECK(why.find("worker.9") != std::string::npos);
    CHECK(why.find("non-finite values in shard " + std::to_string(ids[5])) != std::string::npos);
    CHECK(why.find("first 5 of 8 shards were applied") != std::string::npos);
  }
  CHECK(ps.ps->pushes_applied_as_received() == 1);
  CHECK(honest.pull(v) == 0);
  for (std::size_t i = 0; i < n; ++i) {
    const float want = i < nan_at ? init[i] - 1.0f * grads[i] : init[i];
    if (v[i] != want) FAIL("element " << i << ": " << v[i] << ", want " << want);
  }

  // The ps goes on serving both: a finite push is applied as it arrives.
  grads[nan_at + 17] = 0.0f;
  CHECK(honest.push_gradients(grads).global_step == 1);
  CHECK(ps.ps->pushes_applied_as_received() == 2);
}

namespace {

// Multiples of 1/256 below 4 in magnitude (nonzero when `nonzero`): every sum of a few dozen of
// them, in any order, is exact in float.
std::vector<float> dyadic(std::uint32_t seed, bool nonzero) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<float> v(n);
  for (auto& x : v) {
    int k = d(gen);
    if (nonzero && k == 0) k = 1;
    x = float(k) / 256.0f;
  }
  return v;
}

}  // namespace

TEST_CASE("pushes in pieces from 3 clients at once on a ps with 4 I/O threads: exact values, no shard seen part-way",
          "[ps][pieces][concurrency]") {
  // Client k (1..3) pushes k * base 20 times; init and base are multiples of 1/256, so the
  // values are init + C * base exactly, for every order of the pushes, with C the sum of the
  // applied pushes' k. A 4th client pulls meanwhile (locked): each shard it sees must be
  // init + C * base for one integer C per shard, never decreasing.
  const auto layout = layout8();
  const auto init = dyadic(40, false), base = dyadic(41, true);
  constexpr int pushers = 3, pushes = 20;
  constexpr int total_c = pushes * (1 + 2 + 3);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;  // (Catch's macros only on this thread)
  for (std::size_t r = 0; r < rows; ++r) ranges.push_back(range_of(layout, r));
  for (const bool lock_free : {false, true}) {
    DYNAMIC_SECTION((lock_free ? "lock-free sgd gradients" : "locked deltas")) {
      ps_with ps(true, 4);
      ps_client chief({ps.address()}, layout, opts("chief.0"));
      chief.connect();
      chief.initialize(init, {optim::sgd{1.0f}, lock_free ? apply_mode::lock_free : apply_mode::locked});
      std::atomic<int> running{pushers};
      std::vector<std::string> failures(pushers + 1);
      std::vector<std::thread> ts;
      for (int k = 1; k <= pushers; ++k)
        ts.emplace_back([&, k] {
          try {
            ps_client c({ps.address()}, layout, opts("worker." + std::to_string(k)));
            c.connect();
            std::vector<float> u(n);
            // Locked: deltas +k*base; lock-free: gradients -k*base under sgd(1), the same update.
            for (std::size_t i = 0; i < n; ++i) u[i] = (lock_free ? -float(k) : float(k)) * base[i];
            for (int i = 0; i < pushes; ++i) {
              if (lock_free)
                c.push_gradients(u);
              else
                c.push_deltas(u);
            }
          } catch (const std::exception& e) {
            failures[std::size_t(k)] = e.what();
          }
          --running;
        });
      std::size_t pulls = 0;
      ts.emplace_back([&] {
        try {
          ps_client c({ps.address()}, layout, opts("worker.0"));
          c.connect();
          std::vector<float> v(n);
          std::vector<float> last(rows, 0.0f);
          do {
            c.pull(v);
            ++pulls;
            if (lock_free) continue;  // a lock-free pull may see a shard part-way (Hogwild)
            for (std::size_t r = 0; r < rows; ++r) {
              const auto [at, size] = ranges[r];
              const float cr = (v[at] - init[at]) / base[at];
              if (cr != std::floor(cr) || cr < last[r] || cr > float(total_c))
                failures[0] = "shard at row " + std::to_string(r) + ": C = " + std::to_string(cr);
              last[r] = cr;
              for (std::size_t i = at; i < at + size; ++i)
                if (v[i] != init[i] + cr * base[i]) {
                  failures[0] = "shard at row " + std::to_string(r) + " seen part-way: element " + std::to_string(i);
                  break;
                }
            }
          } while (running.load() > 0);
        } catch (const std::exception& e) {
          failures[0] = e.what();
        }
      });
      for (auto& t : ts) t.join();
      for (const auto& f : failures) CHECK(f.empty());
      CHECK(pulls >= 1);
      std::vector<float> v(n);
      CHECK(chief.pull(v) == pushers * pushes);
      CHECK(ps.ps->pushes_applied_as_received() == std::uint64_t(pushers * pushes));
      for (std::size_t i = 0; i < n; ++i)
        if (v[i] != init[i] + float(total_c) * base[i]) FAIL("element " << i << ": " << v[i]);
    }
  }
}

namespace {

// A handler taking every large request in three pieces, the second of which it refuses.
struct pieces_handler {
  std::vector<std::vector<std::byte>> seen;
  bool finished = false;
  void operator()(const rpc_peer&, const detail::frame_header&, std::span<const std::byte>, std::span<std::byte> p,
                  rpc_reply&) {
    seen.assign(1, std::vector<std::byte>(p.begin(), p.end()));
  }
  rpc_pieces payload_pieces(const rpc_peer&, const detail::frame_header& h, std::span<const std::byte> meta) {
    rpc_pieces s;
    s.ends = {h.payload_size / 4, h.payload_size / 2, h.payload_size};
    const bool refuse = !meta.empty() && meta[0] == std::byte{1};
    s.on_piece = [this, refuse](std::size_t i, std::span<std::byte> b) {
      if (refuse && i == 1) throw error(errc::invalid_argument, "piece 1 refused");
      seen.emplace_back(b.begin(), b.end());
    };
    s.finish = [this](rpc_reply&) { finished = true; };
    return s;
  }
};

}  // namespace

TEST_CASE("the transport hands a large payload over in pieces, in order, and a refused piece is the reply", "[transport][pieces]") {
  pieces_handler handler;
  transport_options o = opts("ps.0");
  o.pieces_min_bytes = 4096;
  rpc_server<pieces_handler> server(handler, o, "127.0.0.1:0");
  std::thread serving([&] { server.run(); });
  rpc_client c(opts("worker.0"));
  c.add_peer("ps.0", "127.0.0.1:" + std::to_string(server.port()));
  c.connect_all();
  std::vector<std::byte> payload(8192);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = std::byte(i * 7 + 3);
  auto call = [&](std::byte flag, std::size_t bytes) {
    rpc_call r;
    r.kind = detail::message_kind::ps_push;
    r.meta = {flag};
    r.payload.push_back(asio::buffer(payload.data(), bytes));
    c.call(r);
  };
  call(std::byte{0}, payload.size());
  REQUIRE(handler.seen.size() == 3);
  CHECK(handler.finished);
  CHECK(std::vector<std::byte>(payload.begin(), payload.begin() + 2048) == handler.seen[0]);
  CHECK(std::vector<std::byte>(payload.begin() + 2048, payload.begin() + 4096) == handler.seen[1]);
  CHECK(std::vector<std::byte>(payload.begin() + 4096, payload.end()) == handler.seen[2]);

  handler.seen.clear();
  handler.finished = false;
  CHECK_THROWS_WITH(call(std::byte{1}, payload.size()), Catch::Contains("piece 1 refused"));
  CHECK(handler.seen.size() == 1);  // piece 2 was read, not handed over
  CHECK_FALSE(handler.finished);

  call(std::byte{0}, 1024);  // below pieces_min_bytes: the single call, on the same connection
  REQUIRE(handler.seen.size() == 1);
  CHECK(handler.seen[0].size() == 1024);
  CHECK(server.connections() == 1);
  server.stop();
  serving.join();
}
