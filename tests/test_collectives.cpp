// Collectives: N ranks as threads in one process over loopback (port 0), each rank's first
// exception rethrown after join.
#include <dtf/collectives.hpp>
#include <dtf/strategies/mirrored.hpp>
#include <dtf/strategies/ring_allreduce.hpp>
#include <dtf/host.hpp>
#include <dtf/optim.hpp>

#include <xtensor/xview.hpp>

#include "helpers.hpp"
#include "rank_helpers.hpp"
#include "train_helpers.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace {

using dtf::test::message_of;

using dtf::collective_options;
using dtf::communicator;
using dtf::reduce_op;
using dtf::ring_listener;
using dtf::test::ring_setup;
using dtf::test::run_ranks_collect;

// DTF_TEST_RING_TLS=1 (ctest's collectives_tests_under_tls) runs every test here with each ring
// inside TLS (collective_options::tls, with a secret): TLS must change no result, no error and
// no timeout.
collective_options test_options() {
  collective_options o;
  o.timeout_ms = 5000;
  o.connect_timeout_ms = 10000;
  if (const char* v = std::getenv("DTF_TEST_RING_TLS"); v && std::string_view(v) == "1") {
    o.tls = true;
    o.secret = "ring-tls-test-secret";
  }
  return o;
}

/// Runs body on n ranks and asserts, on this thread, that every rank succeeded (naming the
/// rank and its error otherwise). Catch2's assertion macros are not thread-safe, so rank
/// bodies check with RANK_CHECK, which throws, instead of CHECK/REQUIRE.
void run_ranks(std::size_t n, const collective_options& o, const std::function<void(communicator&)>& body) {
  const auto failures = run_ranks_collect(n, o, body);
  for (std::size_t r = 0; r < failures.size(); ++r) {
    INFO("rank " << r);
    REQUIRE((failures[r] ? message_of(failures[r]) : std::string()) == "");
  }
}


// Integer-valued floats well inside float's exact range, so sums are exact in any order.
float value(std::size_t rank, std::size_t i) { return float(int((i * 7 + rank * 13) % 1001) - 500); }

}  // namespace

TEST_CASE("allreduce sums integer-valued floats exactly for 2, 3 and 4 ranks at many sizes", "[collectives]") {
  const std::size_t n = GENERATE(2u, 3u, 4u, 8u);
  auto o = test_options();
  o.segment_bytes = GENERATE(4096u, 256u * 1024u);  // many segments per chunk, and few
  o.hypercube = GENERATE(true, false);               // power-of-two worlds: both algorithms
  std::vector<std::size_t> sizes{0, 1, n - 1, n + 1, 2, 7, 13, 1021, 4096, 4099, 65537, (1u << 20) + 3};
  run_ranks(n, o, [&](communicator& c) {
    for (const std::size_t size : sizes) {
      std::vector<float> v(size);
      for (std::size_t i = 0; i < size; ++i) v[i] = value(c.rank(), i);
      c.allreduce<float>("grad" + std::to_string(size), v);
      for (std::size_t i = 0; i < size; ++i) {
        float expected = 0;
        for (std::size_t r = 0; r < n; ++r) expected += value(r, i);
        RANK_CHECK(v[i] == expected,
                   "rank " << c.rank() << " size " << size << " element " << i << ": " << v[i] << " != " << expected);
      }
    }
  });
}

TEST_CASE("allreduce average, min and max, and int32 and float64 tensors", "[collectives]") {
  const std::size_t n = GENERATE(2u, 3u, 4u);
  run_ranks(n, test_options(), [&](communicator& c) {
    for (const std::size_t size : {5u, 3000u, 100001u}) {  // the small path and the ring
      std::vector<double> avg(size);
      std::vector<std::int32_t> mn(size), mx(size);
      for (std::size_t i = 0; i < size; ++i) {
        avg[i] = double(n) * value(c.rank(), i);
        mn[i] = mx[i] = std::int32_t(value(c.rank(), i));
      }
      c.allreduce<double>("avg", avg, reduce_op::average);
      c.allreduce<std::int32_t>("min", mn, reduce_op::min);
      c.allreduce<std::int32_t>("max", mx, reduce_op::max);
      for (std::size_t i = 0; i < size; ++i) {
        double sum = 0;
        std::int32_t lo = 1 << 30, hi = -(1 << 30);
        for (std::size_t r = 0; r < n; ++r) {
          sum += value(r, i);
          lo = std::min(lo, std::int32_t(value(r, i)));
          hi = std::max(hi, std::int32_t(value(r, i)));
        }
        RANK_CHECK(avg[i] == sum && mn[i] == lo && mx[i] == hi, "rank " << c.rank() << " size " << size << " element " << i);
      }
    }
  });
}

TEST_CASE("broadcast and allgather deliver exact copies", "[collectives]") {
  const std::size_t n = GENERATE(2u, 3u, 4u);
  run_ranks(n, test_options(), [&](communicator& c) {
    for (const std::size_t size : {0u, 1u, 17u, 300000u}) {
      for (std::size_t root = 0; root < n; ++root) {
        std::vector<float> v(size, -1.0f);
        if (c.rank() == root)
          for (std::size_t i = 0; i < size; ++i) v[i] = value(root, i);
        c.broadcast<float>("init", v, root);
        for (std::size_t i = 0; i < size; ++i)
          RANK_CHECK(v[i] == value(root, i), "broadcast: rank " << c.rank() << " root " << root << " element " << i);
      }
      std::vector<float> mine(size), all(size * n);
      for (std::size_t i = 0; i < size; ++i) mine[i] = value(c.rank(), i);
      c.allgather<float>("gather", mine, all);
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t i = 0; i < size; ++i)
          RANK_CHECK(all[r * size + i] == value(r, i), "allgather: rank " << c.rank() << " block " << r << " element " << i);
    }
    c.barrier();
  });
}

TEST_CASE("fused allreduce of several tensors equals one allreduce per tensor", "[collectives]") {
  auto o = test_options();
  o.fusion_threshold_bytes = 4000;  // some groups fuse, the large tensor goes alone
  run_ranks(3, o, [&](communicator& c) {
    const std::vector<std::size_t> sizes{10, 300, 1, 5000, 7, 0, 100};
    std::vector<dtf::tensor> ts;
    for (std::size_t s : sizes) ts.emplace_back(dtf::dims{s});
    dtf::tensor ints({9}, dtf::dtype::int32);
    std::vector<dtf::named_tensor> list;
    for (std::size_t k = 0; k < ts.size(); ++k) {
      std::vector<float> v(sizes[k]);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(c.rank() + k, i);
      ts[k].copy_from_host<float>(v);
      list.push_back({"t" + std::to_string(k), &ts[k]});
      if (k == 2) list.push_back({"ints", &ints});
    }
    std::vector<std::int32_t> iv(9, std::int32_t(c.rank() + 1));
    ints.copy_from_host<std::int32_t>(iv);
    c.allreduce(std::span<const dtf::named_tensor>(list), reduce_op::sum);
    for (std::size_t k = 0; k < ts.size(); ++k) {
      const auto v = ts[k].to_vector<float>();
      for (std::size_t i = 0; i < v.size(); ++i) {
        const float expected = value(k, i) + value(1 + k, i) + value(2 + k, i);
        RANK_CHECK(v[i] == expected, "tensor " << k << " element " << i);
      }
    }
    for (auto x : ints.to_vector<std::int32_t>()) RANK_CHECK(x == 6, "fused int32 sum " << x);
  });
}

TEST_CASE("ranks that disagree on a tensor's name, size or dtype fail naming the rank and tensor", "[collectives]") {
  const std::size_t n = GENERATE(2u, 3u, 4u);
  const int fault = GENERATE(0, 1, 2);  // name, element count, dtype
  const std::size_t size = GENERATE(10u, 100000u);  // the small path and the ring
  const std::size_t odd = n - 1;
  const auto t0 = std::chrono::steady_clock::now();
  const auto failures = run_ranks_collect(n, test_options(), [&](communicator& c) {
    std::vector<float> f(size + (fault == 1 && c.rank() == odd ? 1 : 0), 1.0f);
    std::vector<double> d(size, 1.0);
    const std::string name = fault == 0 && c.rank() == odd ? "layer2/bias" : "layer1/weights";
    if (fault == 2 && c.rank() == odd)
      c.allreduce<double>(name, d);
    else
      c.allreduce<float>(name, f);
  });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));  // no rank waited for its timeout
  bool named = false;
  for (std::size_t r = 0; r < n; ++r) {
    INFO("rank " << r);
    REQUIRE(failures[r]);
    const std::string m = message_of(failures[r]);
    if (m.find("mismatched collective") != std::string::npos) {
      named = true;
      // The odd rank names whichever neighbour or partner it compared with; the others name it.
      if (r != odd) CHECK(m.find("rank " + std::to_string(odd)) != std::string::npos);
      CHECK(m.find("layer1/weights") != std::string::npos);
      if (fault == 0) CHECK(m.find("layer2/bias") != std::string::npos);
      if (fault == 2) CHECK(m.find("float64") != std::string::npos);
    }
  }
  CHECK(named);
}

TEST_CASE("a dead rank makes every other rank fail within the timeout", "[collectives]") {
  const std::size_t n = GENERATE(2u, 3u, 4u);
  const bool hang = GENERATE(false, true);  // the rank exits, or stays alive without calling
  auto o = test_options();
  o.timeout_ms = 1000;
  const std::size_t dead = 1;
  std::mutex m;
  std::condition_variable cv;
  std::size_t finished = 0;  // live ranks whose collective has ended (it must fail)
  const auto t0 = std::chrono::steady_clock::now();
  const auto failures = run_ranks_collect(n, o, [&](communicator& c) {
    std::vector<float> v(200000, 1.0f);
    c.allreduce<float>("warmup", v);
    if (c.rank() == dead) {
      if (hang) {
        // Stays connected but never calls the collective until the others have given up.
        std::unique_lock lock(m);
        cv.wait_for(lock, std::chrono::milliseconds(o.timeout_ms * 4), [&] { return finished == n - 1; });
      }
      return;  // the communicator closes its connections
    }
    try {
      c.allreduce<float>("grads", v);
    } catch (...) {
      std::lock_guard lock(m);
      ++finished;
      cv.notify_all();
      throw;
    }
  });
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  for (std::size_t r = 0; r < n; ++r) {
    INFO("rank " << r);
    if (r == dead) {
      CHECK_FALSE(failures[r]);
      continue;
    }
    REQUIRE(failures[r]);
    const std::string m = message_of(failures[r]);
    CHECK(m.find("grads") != std::string::npos);
    CHECK(m.find("rank ") != std::string::npos);
  }
  CHECK(elapsed < std::chrono::milliseconds(o.timeout_ms * (hang ? 3 : 1)));
}

TEST_CASE("a failed communicator refuses later collectives", "[collectives]") {
  const auto failures = run_ranks_collect(2, test_options(), [&](communicator& c) {
    std::vector<float> v(10, 1.0f);
    if (c.rank() == 0) {
      c.allreduce<float>("a", v);
    } else {
      bool threw = false;
      try {
        c.allreduce<float>("b", v);
      } catch (const dtf::error&) {
        threw = true;
      }
      RANK_CHECK(threw, "a mismatched collective succeeded");
      try {
        c.allreduce<float>("a", v);
      } catch (const dtf::error& e) {
        RANK_CHECK(std::string(e.what()).find("failed earlier") != std::string::npos, e.what());
        return;
      }
      RANK_CHECK(false, "a broken communicator served a collective");
    }
  });
  REQUIRE(failures[0]);
  INFO((failures[1] ? message_of(failures[1]) : std::string()));
  CHECK_FALSE(failures[1]);
}

TEST_CASE("ring connections authenticate with the cluster secret", "[collectives]") {
  ring_setup setup(2);
  std::vector<std::exception_ptr> failures(2);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        auto o = test_options();
        o.connect_timeout_ms = 1500;
        o.cluster_id = "c1";
        o.secret = r == 0 ? "right" : "wrong";
        communicator c(std::move(setup.listeners[r]), r, setup.addresses, {"worker.0", "worker.1"}, o);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < 2; ++r) {
    REQUIRE(failures[r]);
    const std::string m = message_of(failures[r]);
    INFO(m);
    CHECK((m.find("secret") != std::string::npos || m.find("worker.") != std::string::npos));
  }
  // With the same secret both connect and agree.
  run_ranks(2, [] {
    auto o = test_options();
    o.secret = "s3cret";
    o.cluster_id = "c1";
    return o;
  }(), [](communicator& c) {
    std::vector<float> v{float(c.rank())};
    c.allreduce<float>("x", v);
    RANK_CHECK(v[0] == 1.0f, v[0]);
  });
}

TEST_CASE("two ranks at batch B equal one process at batch 2B after k SGD steps", "[collectives]") {
  using namespace dtf;
  const std::size_t batch = 16, steps = 20;
  const auto data = test::synthetic(batch * 2 * steps, 7, test::labels::argmax);
  const auto full = data.batch(2 * batch);
  auto net0 = test::small_net();
  const std::size_t np = net0.num_parameters();

  // One process, batches of 2B.
  tensor p1({np}), g1({np});
  net0.initialize(p1.span<float>(), 3);
  optim::optimizer<> opt1(optim::sgd{.learning_rate = 0.1f}, np);
  {
    auto stream = full.stream();
    tensor x, y;
    while (auto b = stream.next()) {
      assign_from_host(x, b->features);
      assign_from_host(y, b->labels);
      net0.loss_and_gradients(p1.span<float>(), x, y, g1.span<float>());
      opt1.apply(p1.span<float>(), g1.span<float>());
    }
  }
  // Two ranks, each on its half of every batch of 2B; gradients averaged.
  std::vector<std::vector<float>> result(2);
  run_ranks(2, test_options(), [&](communicator& c) {
    auto net = test::small_net();
    tensor p({np}), g({np});
    if (c.rank() == 0) net.initialize(p.span<float>(), 3);
    c.broadcast("params", p, 0);
    optim::optimizer<> opt(optim::sgd{.learning_rate = 0.1f}, np);
    auto stream = full.stream();
    tensor x, y;
    while (auto b = stream.next()) {
      const std::size_t half = b->labels.size() / 2, begin = c.rank() * half;
      xt::xtensor<float, 2> xs = xt::view(b->features, xt::range(begin, begin + half), xt::all());
      xt::xtensor<std::int32_t, 1> ys = xt::view(b->labels, xt::range(begin, begin + half));
      assign_from_host(x, xs);
      assign_from_host(y, ys);
      net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
      c.allreduce("grads", g, reduce_op::average);
      opt.apply(p.span<float>(), g.span<float>());
    }
    result[c.rank()] = p.to_vector<float>();
  });
  REQUIRE(result[0] == result[1]);  // bitwise identical replicas
  const auto single = p1.to_vector<float>();
  for (std::size_t i = 0; i < np; ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
}

namespace {

/// Rows [begin, begin + rows) of a host batch.
dtf::data::host_batch rows_of(const dtf::data::host_batch& b, std::size_t begin, std::size_t rows) {
  dtf::data::host_batch out;
  out.features = xt::view(b.features, xt::range(begin, begin + rows), xt::all());
  out.labels = xt::view(b.labels, xt::range(begin, begin + rows));
  return out;
}

/// Parameters after training the small net with SGD on `steps` batches of `batch` examples in one process.
std::vector<float> train_single(std::size_t batch, std::size_t steps) {
  using namespace dtf;
  const auto data = test::synthetic(batch * steps, 7, test::labels::argmax).batch(batch);
  auto net = test::small_net();
  const std::size_t np = net.num_parameters();
  tensor p({np}), g({np}), x, y;
  net.initialize(p.span<float>(), 3);
  optim::optimizer<> opt(optim::sgd{.learning_rate = 0.1f}, np);
  auto stream = data.stream();
  while (auto b = stream.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
    opt.apply(p.span<float>(), g.span<float>());
  }
  return p.to_vector<float>();
}

}  // namespace

TEST_CASE("ring_allreduce strategy: 2 ranks at batch B equal one process at 2B", "[collectives][strategies]") {
  const std::size_t batch = 8, steps = 15;
  const auto single = train_single(2 * batch, steps);
  const auto data = dtf::test::synthetic(2 * batch * steps, 7, dtf::test::labels::argmax).batch(2 * batch);
  std::vector<std::vector<float>> result(2);
  run_ranks(2, test_options(), [&](communicator& c) {
    auto net = dtf::test::small_net();
    dtf::strategies::ring_allreduce<dtf::nn::sequential> s(c, net, {.rule = dtf::optim::sgd{.learning_rate = 0.1f}});
    s.initialize(3);
    auto stream = data.stream();
    float loss = 0;
    while (auto b = stream.next()) loss = s.step(rows_of(*b, c.rank() * batch, batch));
    RANK_CHECK(std::isfinite(loss), loss);
    RANK_CHECK(s.global_step() == std::int64_t(steps), s.global_step());
    result[c.rank()] = dtf::test::host_copy(s.parameters());
  });
  REQUIRE(result[0] == result[1]);
  for (std::size_t i = 0; i < single.size(); ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
}

TEST_CASE("mirrored: 2 replicas x 2 processes at batch B equal one process at 4B", "[collectives][strategies]") {
  const std::size_t batch = 8, steps = 15, replicas = 2;
  const auto single = train_single(4 * batch, steps);
  const auto data = dtf::test::synthetic(4 * batch * steps, 7, dtf::test::labels::argmax).batch(4 * batch);
  std::vector<std::vector<float>> result(4);
  run_ranks(2, test_options(), [&](communicator& c) {
    dtf::strategies::mirrored<dtf::nn::sequential> s(c, dtf::test::small_net(), replicas,
                                                     {.rule = dtf::optim::sgd{.learning_rate = 0.1f}});
    RANK_CHECK(s.global_replicas() == 4, s.global_replicas());
    s.initialize(3);
    auto stream = data.stream();
    while (auto b = stream.next()) {
      std::vector<dtf::data::host_batch> mine;
      for (std::size_t k = 0; k < replicas; ++k) mine.push_back(rows_of(*b, (c.rank() * replicas + k) * batch, batch));
      const float loss = s.step(mine);
      RANK_CHECK(std::isfinite(loss), loss);
    }
    for (std::size_t k = 0; k < replicas; ++k)
      result[c.rank() * replicas + k] = dtf::test::host_copy(s.parameters(k));
  });
  for (std::size_t k = 1; k < 4; ++k) REQUIRE(result[k] == result[0]);  // every replica identical
  for (std::size_t i = 0; i < single.size(); ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
}

TEST_CASE("mirrored in one process: a failing replica fails the step instead of hanging", "[collectives][strategies]") {
  auto comm = communicator::single();
  dtf::strategies::mirrored<dtf::nn::sequential> s(comm, dtf::test::small_net(), 3,
                                                   {.rule = dtf::optim::sgd{.learning_rate = 0.1f}, .timeout_ms = 5000});
  s.initialize(1);
  auto stream = dtf::test::synthetic(30, 1, dtf::test::labels::argmax).batch(10).stream();
  std::vector<dtf::data::host_batch> batches{*stream.next(), *stream.next(), *stream.next()};
  CHECK(std::isfinite(s.step(batches)));
  batches[1].features = xt::xtensor<float, 2>::from_shape({10, 5});  // wrong width: the dense layer throws
  try {
    s.step(batches);
    FAIL("the step succeeded");
  } catch (const dtf::error& e) {
    CHECK(e.code() == dtf::make_error_code(dtf::errc::shape_mismatch));
  }
}

TEST_CASE("mirrored: each replica's model runs on a context of its own, bound again at each step",
          "[collectives][strategies][device]") {
  auto comm = communicator::single();
  const auto prototype = dtf::test::small_net();
  REQUIRE(prototype.context() == nullptr);
  dtf::strategies::mirrored<dtf::nn::sequential> s(comm, prototype, 2, {.rule = dtf::optim::sgd{.learning_rate = 0.1f}});
  const dtf::device::context* first = s.model(0).context();
  CHECK(first != nullptr);
  CHECK(s.model(1).context() != nullptr);
  CHECK(s.model(1).context() != first);  // one per replica, never shared between threads
  CHECK(prototype.context() == nullptr);  // the prototype is not touched
  s.initialize(2);
  auto stream = dtf::test::synthetic(20, 5, dtf::test::labels::argmax).batch(10).stream();
  std::vector<dtf::data::host_batch> batches{*stream.next(), *stream.next()};
  // Something else took replica 0's model off its context: the next step binds it again, so its
  // work is on the stream the replica's update follows.
  s.model(0).clear_context();
  const auto before = dtf::test::host_copy(s.parameters(0));
  CHECK(std::isfinite(s.step(batches)));
  CHECK(s.model(0).context() == first);
  CHECK(dtf::test::host_copy(s.parameters(0)) != before);
  CHECK(dtf::test::host_copy(s.parameters(1)) == dtf::test::host_copy(s.parameters(0)));
}

// ---------------------------------------------------------------------------------------------
// Overlap of gradient communication with backprop (dtf/strategies/gradient_buckets.hpp).

namespace {

using dtf::strategies::detail::bucket_reducer;
using dtf::strategies::detail::gradient_bucket;

/// small_net without the streaming form of loss_and_gradients: reduced after backprop.
struct non_streaming_net {
  dtf::nn::sequential net = dtf::test::small_net();
  std::vector<dtf::variable_spec> variables() const { return net.variables(); }
  void initialize(std::span<float> p, std::uint64_t s) const { net.initialize(p, s); }
  float loss_and_gradients(std::span<const float> p, const dtf::tensor& x, const dtf::tensor& y, std::span<float> g) {
    return net.loss_and_gradients(p, x, y, g);
  }
};
static_assert(dtf::model<non_streaming_net> && !dtf::streams_gradients<non_streaming_net>);

/// small_net whose backprop fails on `fail_rank` at step `fail_step`, after it has reported the
/// top layer's gradient (so that its first bucket is on the wire).
struct failing_net {
  dtf::nn::sequential net = dtf::test::small_net();
  std::size_t rank = 0, fail_rank = 1, step = 0, fail_step = 2;
  std::vector<dtf::variable_spec> variables() const { return net.variables(); }
  void initialize(std::span<float> p, std::uint64_t s) const { net.initialize(p, s); }
  float loss_and_gradients(std::span<const float> p, const dtf::tensor& x, const dtf::tensor& y, std::span<float> g) {
    return net.loss_and_gradients(p, x, y, g);
  }
  float loss_and_gradients(std::span<const float> p, const dtf::tensor& x, const dtf::tensor& y, std::span<float> g,
                           const dtf::gradient_ready_fn& ready) {
    const bool fail = rank == fail_rank && ++step == fail_step;
    return net.loss_and_gradients(p, x, y, g, dtf::gradient_ready_fn([&](std::size_t first, std::size_t count) {
                                    ready(first, count);
                                    if (fail) throw dtf::error(dtf::errc::internal, "failing_net: backprop failed");
                                  }));
  }
};
static_assert(dtf::streams_gradients<failing_net>);

/// Records the buckets a reducer reduces, and lets a test wait (bounded) for one.
struct bucket_log {
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::size_t> order;
  bucket_reducer::reduce_fn fn() {
    return [this](std::size_t k, const gradient_bucket&) {
      std::lock_guard lock(m);
      order.push_back(k);
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t count) {
    std::unique_lock lock(m);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return order.size() >= count; });
  }
  std::vector<std::size_t> seen() {
    std::lock_guard lock(m);
    return order;
  }
};

/// Trains `steps` batches of `batch` examples per rank on `ranks` ranks with a ring_allreduce
/// engine built by make(comm, net); returns every rank's parameters.
template <class Net>
std::vector<std::vector<float>> train_ring(std::size_t ranks, std::size_t batch, std::size_t steps,
                                           dtf::strategies::ring_allreduce_config config, bool expect_overlap) {
  const auto data = dtf::test::synthetic(ranks * batch * steps, 11, dtf::test::labels::argmax).batch(ranks * batch);
  std::vector<std::vector<float>> result(ranks);
  run_ranks(ranks, test_options(), [&](communicator& c) {
    Net net;
    dtf::strategies::ring_allreduce<Net> s(c, net, config);
    RANK_CHECK(s.overlaps() == expect_overlap, s.overlaps());
    s.initialize(5);
    auto stream = data.stream();
    while (auto b = stream.next()) {
      const float loss = s.step(rows_of(*b, c.rank() * batch, batch));
      RANK_CHECK(std::isfinite(loss), loss);
    }
    result[c.rank()] = dtf::test::host_copy(s.parameters());
  });
  return result;
}

struct streaming_net : dtf::nn::sequential {
  streaming_net() : dtf::nn::sequential(dtf::test::small_net()) {}
};

}  // namespace

TEST_CASE("gradient buckets are cut at variable boundaries from the top layer down", "[collectives][overlap]") {
  using dtf::strategies::detail::plan_buckets;
  const auto vars = dtf::test::small_net().variables();  // kernel 0:128, bias 128:16, kernel 144:48, bias 192:3
  const std::size_t pre = dtf::strategies::detail::exchange_prefix;
  CHECK(plan_buckets(vars, pre, 0) == std::vector<gradient_bucket>{{0, pre + 195}});
  CHECK(plan_buckets(vars, pre, 1) ==
        std::vector<gradient_bucket>{{pre + 192, pre + 195}, {pre + 144, pre + 192}, {pre + 128, pre + 144}, {0, pre + 128}});
  // At least 200 bytes (50 floats) each; the last takes the rest, the prefix with it.
  CHECK(plan_buckets(vars, pre, 200) == std::vector<gradient_bucket>{{pre + 144, pre + 195}, {0, pre + 144}});
  CHECK(plan_buckets(vars, pre, 1 << 20) == std::vector<gradient_bucket>{{0, pre + 195}});
  // The wide MLP at 4 MiB: buckets tile the buffer and none but the last is under 4 MiB.
  dtf::nn::sequential wide{dtf::nn::dense(784, 2048), dtf::nn::relu(), dtf::nn::dense(2048, 2048), dtf::nn::relu(),
                           dtf::nn::dense(2048, 10)};
  const auto b = plan_buckets(wide.variables(), pre, std::size_t(4) << 20);
  REQUIRE(b.size() == 2);  // [dense_1/kernel, end) and [0, dense_1/kernel)
  CHECK(b.front().end == pre + wide.num_parameters());
  CHECK(b.back().begin == 0);
  for (std::size_t k = 0; k + 1 < b.size(); ++k) {
    CHECK(b[k].begin == b[k + 1].end);
    CHECK(b[k].size() * sizeof(float) >= (std::size_t(4) << 20));
  }
}

TEST_CASE("gradient buckets cut again in a step's report order: plan_buckets' cut for a top-down order, rank 0's "
          "order on every rank",
          "[collectives][overlap]") {
  using dtf::strategies::detail::plan_in_order;
  using dtf::strategies::detail::reported_order;
  const auto vars = dtf::test::small_net().variables();  // kernel 0:128, bias 128:16, kernel 144:48, bias 192:3
  const std::size_t pre = dtf::strategies::detail::exchange_prefix;
  // Top down (nn::sequential's reports): the same cut as plan_buckets at every size.
  const std::vector<std::size_t> down{3, 2, 1, 0}, up{0, 1, 2, 3};
  for (std::size_t bytes : {0u, 1u, 200u, 1u << 20})
    CHECK(plan_in_order(vars, pre, bytes, down) == dtf::strategies::detail::plan_buckets(vars, pre, bytes));
  // Bottom up: the first variable's bucket first, the prefix alone last.
  CHECK(plan_in_order(vars, pre, 1, up) ==
        std::vector<gradient_bucket>{{pre, pre + 128}, {pre + 128, pre + 144}, {pre + 144, pre + 192}, {pre + 192, pre + 195}, {0, pre}});
  CHECK(plan_in_order(vars, pre, 600, up) == std::vector<gradient_bucket>{{pre, pre + 192}, {pre + 192, pre + 195}, {0, pre}});
  // Scattered: a variable not adjacent to the bucket being grown starts another (no copies).
  CHECK(plan_in_order(vars, pre, 1000, {3, 0, 1, 2}) ==
        std::vector<gradient_bucket>{{pre + 192, pre + 195}, {0, pre + 195 - 3}});
  CHECK_THROWS_WITH(plan_in_order(vars, pre, 1, {0, 1, 1, 3}), Catch::Contains("not a permutation"));
  CHECK_THROWS_WITH(plan_in_order(vars, pre, 1, {0, 1}), Catch::Contains("has 2 variables, the model 4"));
  // Reports as they came: a range reaches the variables whose first float it holds, top down.
  CHECK(reported_order(vars, pre, {{pre + 128, 16}, {pre, 128}, {pre + 144, 51}}) == std::vector<std::size_t>{1, 0, 3, 2});
  CHECK(reported_order(vars, pre, {{pre + 144, 48}}) == std::vector<std::size_t>{2, 3, 1, 0});  // the rest, top down
  // The reducer keeps the step's reports; two ranks that saw different orders both take rank 0's.
  std::vector<std::vector<gradient_bucket>> planned(2);
  run_ranks(2, test_options(), [&](communicator& c) {
    bucket_reducer reducer(dtf::strategies::detail::plan_buckets(vars, pre, 1), /*overlap=*/false);
    reducer.record_reports(true);
    reducer.begin_step([](std::size_t, const gradient_bucket&) {});
    for (std::size_t i : c.rank() == 0 ? up : down) reducer.report(pre + vars[i].offset, vars[i].size());
    reducer.finish();
    planned[c.rank()] = dtf::strategies::detail::replan_after_first_step(c, "order", vars, pre, 1, reducer);
  });
  CHECK(planned[0] == plan_in_order(vars, pre, 1, up));
  CHECK(planned[1] == planned[0]);
  // Gaps in a layout (floats no variable names) belong to the variable below them, as in plan_buckets.
  const std::vector<dtf::variable_spec> gappy{{"a", {3}, 2}, {"b", {2}, 8}};
  for (std::size_t bytes : {1u, 20u, 1000u})
    CHECK(plan_in_order(gappy, pre, bytes, {1, 0}) == dtf::strategies::detail::plan_buckets(gappy, pre, bytes));
  CHECK(plan_in_order(gappy, pre, 1, {0, 1}) == std::vector<gradient_bucket>{{pre + 2, pre + 8}, {pre + 8, pre + 10}, {0, pre + 2}});
  CHECK_NOTHROW(bucket_reducer(plan_in_order(gappy, pre, 1, {0, 1}), false));
  // A reducer takes any buckets that cover the buffer once, in their list's order.
  CHECK_NOTHROW(bucket_reducer(plan_in_order(vars, pre, 1, up), false));
  CHECK_THROWS_WITH(bucket_reducer({{0, 4}, {2, 8}}, false), Catch::Contains("cover the buffer, each float once"));
}

TEST_CASE("bucket_reducer with a communication thread reduces a bucket while backprop still runs", "[collectives][overlap]") {
  const std::vector<gradient_bucket> buckets{{6, 10}, {2, 6}, {0, 2}};
  bucket_reducer reducer(buckets, /*overlap=*/true);
  REQUIRE(reducer.overlapping());
  for (int step = 0; step < 3; ++step) {
    bucket_log log;
    reducer.begin_step(log.fn());
    reducer.report(6, 4);
    REQUIRE(log.wait_for(1));  // bucket 0 is reduced before the rest of the gradient exists
    CHECK(log.seen() == std::vector<std::size_t>{0});
    reducer.report(2, 2);
    reducer.report(4, 2);
    REQUIRE(log.wait_for(2));
    reducer.finish();  // bucket 2 (the prefix, never reported) is reduced now
    CHECK(log.seen() == std::vector<std::size_t>{0, 1, 2});
  }
}

TEST_CASE("bucket_reducer keeps the bucket order whatever order the gradients come in", "[collectives][overlap]") {
  const std::vector<gradient_bucket> buckets{{6, 10}, {2, 6}, {0, 2}};
  for (const bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    bucket_reducer reducer(buckets, overlap);
    bucket_log log;
    reducer.begin_step(log.fn());
    reducer.report(2, 4);  // bucket 1 first: it waits for bucket 0
    reducer.report(0, 2);
    if (!overlap) CHECK(log.seen().empty());  // without a thread nothing moves before finish
    reducer.report(6, 4);
    reducer.finish();
    CHECK(log.seen() == std::vector<std::size_t>{0, 1, 2});
  }
}

TEST_CASE("bucket_reducer: two reporters, double reports, errors and aborted steps", "[collectives][overlap]") {
  const std::vector<gradient_bucket> buckets{{6, 10}, {0, 6}};
  SECTION("a bucket is ready once every reporter has reported it") {
    bucket_reducer reducer(buckets, true, /*reporters=*/2);
    bucket_log log;
    reducer.begin_step(log.fn());
    reducer.report(6, 4);
    reducer.report(0, 6);
    reducer.report(6, 4);  // the second replica's top layer: bucket 0 is complete
    REQUIRE(log.wait_for(1));
    reducer.finish();
    CHECK(log.seen() == std::vector<std::size_t>{0, 1});
  }
  SECTION("a float reported more often than there are reporters, or outside the buffer, is refused") {
    bucket_reducer reducer(buckets, false);
    bucket_log log;
    reducer.begin_step(log.fn());
    reducer.report(6, 4);
    CHECK_THROWS_WITH(reducer.report(8, 1), Catch::Contains("reported more often than there are reporters"));
    CHECK_THROWS_WITH(reducer.report(9, 5), Catch::Contains("outside the buffer"));
  }
  SECTION("a failed reduction is rethrown by finish, and the next step runs") {
    bucket_reducer reducer(buckets, true);
    reducer.begin_step([](std::size_t k, const gradient_bucket&) {
      if (k == 1) throw dtf::error(dtf::errc::peer_failure, "bucket 1 failed");
    });
    reducer.report(6, 4);
    CHECK_THROWS_WITH(reducer.finish(), Catch::Contains("bucket 1 failed"));
    bucket_log log;
    reducer.begin_step(log.fn());
    reducer.finish();
    CHECK(log.seen() == std::vector<std::size_t>{0, 1});
  }
  SECTION("an aborted step reduces nothing more, and the next step runs") {
    bucket_reducer reducer(buckets, true);
    bucket_log first;
    reducer.begin_step(first.fn());
    reducer.report(6, 4);
    REQUIRE(first.wait_for(1));
    reducer.abort_step();
    bucket_log second;
    reducer.begin_step(second.fn());
    reducer.report(6, 4);
    reducer.finish();
    CHECK(first.seen() == std::vector<std::size_t>{0});
    CHECK(second.seen() == std::vector<std::size_t>{0, 1});
  }
}

TEST_CASE("ring_allreduce: overlap on and off give the same parameters bit for bit", "[collectives][overlap]") {
  dtf::strategies::ring_allreduce_config on{.rule = dtf::optim::adam{.learning_rate = 1e-2f}, .bucket_bytes = 1};
  auto off = on;
  off.overlap = false;
  const std::size_t batch = 6, steps = 8;
  for (const std::size_t ranks : {2, 3}) {
    INFO(ranks << " ranks");
    const auto with = train_ring<streaming_net>(ranks, batch, steps, on, /*expect_overlap=*/true);
    const auto without = train_ring<streaming_net>(ranks, batch, steps, off, false);
    const auto unstreamed = train_ring<non_streaming_net>(ranks, batch, steps, on, false);
    for (std::size_t r = 0; r < ranks; ++r) {
      REQUIRE(with[r] == with[0]);
      REQUIRE(with[r] == without[r]);
      REQUIRE(with[r] == unstreamed[r]);
    }
  }
}

TEST_CASE("ring_allreduce with overlap: 3 ranks at batch B equal one process at 3B", "[collectives][overlap][staging]") {
  // Plain SGD: the mean of the ranks' mean gradients is the gradient of the whole batch.
  const std::size_t batch = 8, steps = 15;
  const auto single = train_single(3 * batch, steps);
  const auto data = dtf::test::synthetic(3 * batch * steps, 7, dtf::test::labels::argmax).batch(3 * batch);
  std::vector<std::vector<float>> result(3);
  run_ranks(3, test_options(), [&](communicator& c) {
    auto net = dtf::test::small_net();
    dtf::strategies::ring_allreduce<dtf::nn::sequential> s(
        c, net, {.rule = dtf::optim::sgd{.learning_rate = 0.1f}, .overlap = true, .bucket_bytes = 1});
    RANK_CHECK(s.overlaps() && s.buckets().size() == 4, s.buckets().size());
    s.initialize(3);
    auto stream = data.stream();
    while (auto b = stream.next()) s.step(rows_of(*b, c.rank() * batch, batch));
    result[c.rank()] = dtf::test::host_copy(s.parameters());
  });
  for (std::size_t r = 1; r < 3; ++r) REQUIRE(result[r] == result[0]);
  for (std::size_t i = 0; i < single.size(); ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
}

TEST_CASE("ring_allreduce: a step that leaves the loss on the device gives step()'s parameters and loss", "[collectives][overlap][nan][staging]") {
  // step_deferred (nn::sequential models dtf::defers_loss) against step(), 2 ranks, Adam: the
  // same parameters bit for bit, and the averaged loss left at device_loss() is step()'s.
  const std::size_t batch = 8, steps = 6;
  const auto data = dtf::test::synthetic(2 * batch * steps, 9, dtf::test::labels::argmax).batch(2 * batch);
  std::vector<std::vector<float>> params(4);
  std::vector<std::vector<float>> losses(4);
  run_ranks(2, test_options(), [&](communicator& c) {
    for (const bool deferred : {false, true}) {
      auto net = dtf::test::small_net();
      dtf::strategies::ring_allreduce<dtf::nn::sequential> s(
          c, net, {.rule = dtf::optim::adam{.learning_rate = 1e-2f}, .bucket_bytes = 1});
      s.initialize(5);
      auto stream = data.stream();
      auto& out = losses[2 * std::size_t(deferred) + c.rank()];
      while (auto b = stream.next()) {
        const auto mine = rows_of(*b, c.rank() * batch, batch);
        if (!deferred) {
          out.push_back(s.step(mine));
          continue;
        }
        s.step_deferred(std::span<const dtf::data::host_batch>(&mine, 1));
        // CUDA builds: the average is written on the engine's streams, not the legacy stream
        // this copy uses; the host waits for them first (a hook's read goes through the loss ring).
        s.context().synchronize();
        float loss = 0;
        thrust::copy(thrust::device_pointer_cast(s.device_loss()), thrust::device_pointer_cast(s.device_loss()) + 1, &loss);
        out.push_back(loss);
      }
      params[2 * std::size_t(deferred) + c.rank()] = dtf::test::host_copy(s.parameters());
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    REQUIRE(params[2 + r] == params[r]);
    REQUIRE(losses[2 + r] == losses[r]);
    REQUIRE(losses[r].size() == steps);
  }
  REQUIRE(losses[0] == losses[1]);  // every rank holds the average
}

TEST_CASE("ring_allreduce with overlap: a rank whose backprop fails mid-step fails every rank within the timeout",
          "[collectives][overlap]") {
  auto o = test_options();
  o.timeout_ms = 2000;
  const auto data = dtf::test::synthetic(3 * 4 * 4, 7, dtf::test::labels::argmax).batch(12);
  const auto started = std::chrono::steady_clock::now();
  const auto failures = run_ranks_collect(3, o, [&](communicator& c) {
    failing_net net;
    net.rank = c.rank();
    dtf::strategies::ring_allreduce<failing_net> s(c, net, {.bucket_bytes = 1});
    s.initialize(1);
    auto stream = data.stream();
    while (auto b = stream.next()) s.step(rows_of(*b, c.rank() * 4, 4));
  });
  const auto took = std::chrono::steady_clock::now() - started;
  CHECK(took < std::chrono::seconds(20));
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    REQUIRE(failures[r]);
  }
  CHECK_THAT(message_of(failures[1]), Catch::Contains("failing_net: backprop failed"));
}

TEST_CASE("mirrored: overlap on and off give the same variables bit for bit", "[collectives][overlap]") {
  const std::size_t batch = 6, steps = 8, replicas = 2, processes = 2;
  const auto data =
      dtf::test::synthetic(processes * replicas * batch * steps, 13, dtf::test::labels::argmax).batch(4 * batch);
  auto train = [&](bool overlap) {
    std::vector<std::vector<float>> result(processes * replicas);
    run_ranks(processes, test_options(), [&](communicator& c) {
      dtf::strategies::mirrored<dtf::nn::sequential> s(
          c, dtf::test::small_net(), replicas,
          {.rule = dtf::optim::adam{.learning_rate = 1e-2f}, .overlap = overlap, .bucket_bytes = 1});
      // mirrored overlaps on CPU builds only (its replicas' gradients are read on the host).
      RANK_CHECK(s.overlaps() == (overlap && dtf::device_memory_is_host_accessible), s.overlaps());
      s.initialize(3);
      auto stream = data.stream();
      while (auto b = stream.next()) {
        std::vector<dtf::data::host_batch> mine;
        for (std::size_t k = 0; k < replicas; ++k) mine.push_back(rows_of(*b, (c.rank() * replicas + k) * batch, batch));
        RANK_CHECK(std::isfinite(s.step(mine)), "loss");
      }
      for (std::size_t k = 0; k < replicas; ++k)
        result[c.rank() * replicas + k] = dtf::test::host_copy(s.parameters(k));
    });
    return result;
  };
  const auto with = train(true), without = train(false);
  for (std::size_t k = 0; k < with.size(); ++k) {
    REQUIRE(with[k] == with[0]);
    REQUIRE(with[k] == without[k]);
  }
}

// ---------------------------------------------------------------------------------------------
// The training loop's extras: schedules, clipping by global norm, AdamW, micro-batch accumulation.

namespace {

/// What a one-process reference loop applies on top of a plain step.
struct loop_reference {
  dtf::optim::rule rule = dtf::optim::sgd{.learning_rate = 0.1f};
  float clip_norm = 0;
  std::function<float(std::int64_t)> schedule{};
};

/// Parameters after `steps` steps of `batch` examples in one process, the gradient clipped by
/// its own arithmetic (torch.nn.utils.clip_grad_norm_'s: norm in double, scale
/// clip / (norm + 1e-6) when below 1) and the rate from the schedule; `norms`: each step's
/// norm before clipping.
std::vector<float> train_single_loop(std::size_t batch, std::size_t steps, const loop_reference& ref,
                                     std::vector<double>* norms = nullptr) {
  using namespace dtf;
  const auto data = test::synthetic(batch * steps, 7, test::labels::argmax).batch(batch);
  auto net = test::small_net();
  const std::size_t np = net.num_parameters();
  tensor p({np}), g({np}), x, y;
  net.initialize(p.span<float>(), 3);
  optim::optimizer<> opt(ref.rule, np);
  auto stream = data.stream();
  std::int64_t step = 0;
  while (auto b = stream.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    net.loss_and_gradients(p.span<float>(), x, y, g.span<float>());
    if (ref.clip_norm > 0) {
      auto gv = g.to_vector<float>();
      double sum = 0;
      for (float v : gv) sum += double(v) * double(v);
      const double norm = std::sqrt(sum), coef = double(ref.clip_norm) / (norm + 1e-6);
      if (norms) norms->push_back(norm);
      if (coef < 1)
        for (float& v : gv) v *= float(coef);
      g.copy_from_host<float>(gv);
    }
    const float lr = ref.schedule ? ref.schedule(step) : optim::detail::base_learning_rate(ref.rule);
    opt.apply(p.span<float>(), g.span<float>(), lr);
    ++step;
  }
  return p.to_vector<float>();
}

/// Every rank's parameters after training the small net on `ranks` ranks at batch `batch` each
/// with `config` (the same data as train_single_loop at ranks * batch).
std::vector<std::vector<float>> train_ranks_loop(std::size_t ranks, std::size_t batch, std::size_t steps,
                                                 const dtf::strategies::ring_allreduce_config& config,
                                                 std::vector<float>* first_norms = nullptr) {
  const auto data = dtf::test::synthetic(ranks * batch * steps, 7, dtf::test::labels::argmax).batch(ranks * batch);
  std::vector<std::vector<float>> result(ranks);
  run_ranks(ranks, test_options(), [&](communicator& c) {
    auto net = dtf::test::small_net();
    dtf::strategies::ring_allreduce<dtf::nn::sequential> s(c, net, config);
    s.initialize(3);
    auto stream = data.stream();
    while (auto b = stream.next()) {
      const float loss = s.step(rows_of(*b, c.rank() * batch, batch));
      RANK_CHECK(std::isfinite(loss), loss);
      if (first_norms && c.rank() == 0) first_norms->push_back(s.gradient_norm());
    }
    result[c.rank()] = dtf::test::host_copy(s.parameters());
  });
  return result;
}

}  // namespace

TEST_CASE("ring_allreduce: clip_norm clips the averaged gradient, 2 ranks at B equal one process at 2B",
          "[collectives][loop]") {
  const std::size_t batch = 8, steps = 12;
  for (const dtf::optim::rule rule : {dtf::optim::rule(dtf::optim::sgd{.learning_rate = 0.5f}),
                                      dtf::optim::rule(dtf::optim::adamw{.learning_rate = 0.01f, .weight_decay = 0.1f})}) {
    INFO("rule " << dtf::optim::optimizer<>(rule, 1).rule_name());
    std::vector<double> want_norms;
    const auto single = train_single_loop(2 * batch, steps, {.rule = rule, .clip_norm = 0.05f}, &want_norms);
    std::vector<float> norms;
    const auto result = train_ranks_loop(2, batch, steps, {.rule = rule, .clip_norm = 0.05f}, &norms);
    REQUIRE(result[0] == result[1]);  // every rank clipped the same averaged gradient
    REQUIRE(norms.size() == want_norms.size());
    CHECK(norms[0] > 0.05f);  // the bound binds
    for (std::size_t i = 0; i < norms.size(); ++i) CHECK(norms[i] == Approx(want_norms[i]).epsilon(1e-4));
    for (std::size_t i = 0; i < single.size(); ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
    // And clipping changed the outcome.
    const auto unclipped = train_single_loop(2 * batch, steps, {.rule = rule});
    double diff = 0;
    for (std::size_t i = 0; i < single.size(); ++i) diff += std::abs(double(unclipped[i]) - double(single[i]));
    CHECK(diff > 1e-3);
  }
}

TEST_CASE("ring_allreduce: a schedule sets each step's rate", "[collectives][loop]") {
  const std::size_t batch = 8, steps = 12;
  const dtf::optim::cosine_decay cosine{.learning_rate = 0.5f, .decay_steps = 8, .alpha = 0.1f, .warmup_steps = 3};
  const auto single = train_single_loop(2 * batch, steps, {.schedule = cosine});
  const auto result = train_ranks_loop(2, batch, steps, {.rule = dtf::optim::sgd{.learning_rate = 0.1f}, .schedule = cosine});
  REQUIRE(result[0] == result[1]);
  for (std::size_t i = 0; i < single.size(); ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
  auto comm = communicator::single();
  auto net = dtf::test::small_net();
  CHECK_THROWS_WITH((dtf::strategies::ring_allreduce<dtf::nn::sequential>(
                        comm, net, {.linear_scaling = true, .schedule = cosine})),
                    Catch::Contains("linear_scaling"));
  CHECK_THROWS_WITH((dtf::strategies::ring_allreduce<dtf::nn::sequential>(comm, net, {.clip_norm = -1.0f})),
                    Catch::Contains("clip_norm"));
}

TEST_CASE("ring_allreduce: backward_passes_per_step accumulates micro-batches into the batch's gradient",
          "[collectives][loop]") {
  // Plain SGD: rows-weighted means of the micro-batches' mean gradients are the batch's mean
  // gradient, so 2 ranks at B in k passes equal one process at 2B in one.
  const std::size_t batch = 8, steps = 10;
  const auto single = train_single_loop(2 * batch, steps, {});
  for (const int passes : {2, 3}) {  // 8 rows: 4 + 4, and 2 + 3 + 3
    INFO(passes << " passes");
    const auto result = train_ranks_loop(
        2, batch, steps, {.rule = dtf::optim::sgd{.learning_rate = 0.1f}, .bucket_bytes = 1, .backward_passes_per_step = passes});
    REQUIRE(result[0] == result[1]);
    for (std::size_t i = 0; i < single.size(); ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
  }
  auto comm = communicator::single();
  auto net = dtf::test::small_net();
  dtf::strategies::ring_allreduce<dtf::nn::sequential> s(comm, net, {.backward_passes_per_step = 9});
  s.initialize(1);
  auto stream = dtf::test::synthetic(8, 1, dtf::test::labels::argmax).batch(8).stream();
  CHECK_THROWS_WITH(s.step(*stream.next()), Catch::Contains("8 rows"));
  CHECK_THROWS_WITH((dtf::strategies::ring_allreduce<dtf::nn::sequential>(comm, net, {.backward_passes_per_step = 0})),
                    Catch::Contains("backward_passes_per_step"));
}

TEST_CASE("micro_batches: the device form sums the passes' losses on the device, the host form's bits",
          "[collectives][loop]") {
  // A batch of 10 rows in 3 passes (3 + 3 + 4): the host form reads each pass's loss, the
  // device form adds w * device_loss() into a device scalar; the same floats in the same order.
  auto net = dtf::test::small_net();
  dtf::tensor params({dtf::num_parameters(net.variables())});
  net.initialize(params.span<float>(), 3);
  auto stream = dtf::test::synthetic(10, 1, dtf::test::labels::argmax).batch(10).stream();
  const dtf::data::host_batch b = *stream.next();
  dtf::tensor x, y;
  dtf::assign_from_host(x, b.features);
  dtf::assign_from_host(y, b.labels);
  const std::size_t n = params.size();
  dtf::tensor g_host({n}), g_dev({n}), g_whole({n});
  dtf::strategies::detail::micro_batches host_form(3), dev_form(3);
  const float host_loss = host_form.loss_and_gradients(net, params.span<const float>(), x, y, g_host.span<float>());
  dev_form.enqueue_loss_and_gradients(net, params.span<const float>(), x, y, g_dev.span<float>(), {});
  const float dev_loss = dtf::test::host_copy(std::span<const float>(dev_form.device_loss(), 1))[0];
  if (dtf::device_memory_is_host_accessible) {  // CPU builds: bit for bit
    CHECK(dev_loss == host_loss);
    CHECK(dtf::test::host_copy(g_dev.span<const float>()) == dtf::test::host_copy(g_host.span<const float>()));
  }
  // Independent reference: the whole batch in one pass (the rows-weighted mean of the passes'
  // means is the batch's mean, up to float rounding).
  const float whole = net.loss_and_gradients(params.span<const float>(), x, y, g_whole.span<float>());
  CHECK(dev_loss == Approx(whole).epsilon(1e-5));
  const auto gw = dtf::test::host_copy(g_whole.span<const float>()), gd = dtf::test::host_copy(g_dev.span<const float>());
  for (std::size_t i = 0; i < n; ++i) CHECK(gd[i] == Approx(gw[i]).margin(1e-6));
  // A second call on the same shapes overwrites the loss (it does not add to the last one).
  dev_form.enqueue_loss_and_gradients(net, params.span<const float>(), x, y, g_dev.span<float>(), {});
  CHECK(dtf::test::host_copy(std::span<const float>(dev_form.device_loss(), 1))[0] == dev_loss);
}

TEST_CASE("ring_allreduce: step_deferred with micro-batches gives step()'s parameters and losses bit for bit",
          "[collectives][loop]") {
  // 52 examples in batches of 16: 16, 16, 16 and a short 4 (new pass shapes at each epoch's end).
  const auto data = dtf::test::synthetic(52, 2, dtf::test::labels::argmax);
  auto run = [&](bool deferred, std::vector<float>& losses) {
    auto comm = communicator::single();
    auto net = dtf::test::small_net();
    dtf::strategies::ring_allreduce<dtf::nn::sequential> s(
        comm, net, {.rule = dtf::optim::adam{.learning_rate = 0.01f}, .clip_norm = 0.5f, .backward_passes_per_step = 3});
    s.initialize(7);
    auto stream = data.shuffle(3).batch(16).repeat(-1).stream();
    int short_batches = 0;
    for (int step = 0; step < 10; ++step) {
      const dtf::data::host_batch b = *stream.next();
      const std::span<const dtf::data::host_batch> one(&b, 1);
      short_batches += b.labels.size() == 4;
      if (deferred) {
        s.step_deferred(one);
        s.context().synchronize();  // the host reads the loss the compute stream wrote
        losses.push_back(dtf::test::host_copy(std::span<const float>(s.device_loss(), 1))[0]);
      } else {
        losses.push_back(s.step(one));
      }
    }
    CHECK(s.gradient_norm() > 0.0f);
    CHECK(short_batches == 2);
    return dtf::test::host_copy(s.parameters());
  };
  std::vector<float> host_losses, dev_losses;
  const auto host_params = run(false, host_losses), dev_params = run(true, dev_losses);
  if (dtf::device_memory_is_host_accessible) {
    CHECK(dev_params == host_params);
    CHECK(dev_losses == host_losses);
  }
  for (std::size_t i = 0; i < host_losses.size(); ++i) CHECK(dev_losses[i] == Approx(host_losses[i]).epsilon(1e-5));
}

TEST_CASE("mirrored: clip_norm, a schedule and micro-batches, 2 replicas x 2 processes equal one process at 4B",
          "[collectives][loop]") {
  const std::size_t batch = 8, steps = 10, replicas = 2;
  const dtf::optim::exponential_decay decay{.learning_rate = 0.5f, .decay_steps = 4, .decay_rate = 0.5f};
  const auto single = train_single_loop(4 * batch, steps, {.clip_norm = 0.05f, .schedule = decay});
  const auto data = dtf::test::synthetic(4 * batch * steps, 7, dtf::test::labels::argmax).batch(4 * batch);
  for (const int passes : {1, 2}) {
    INFO(passes << " passes");
    std::vector<std::vector<float>> result(4);
    run_ranks(2, test_options(), [&](communicator& c) {
      dtf::strategies::mirrored<dtf::nn::sequential> s(
          c, dtf::test::small_net(), replicas,
          {.rule = dtf::optim::sgd{.learning_rate = 0.1f}, .schedule = decay, .clip_norm = 0.05f,
           .backward_passes_per_step = passes});
      s.initialize(3);
      auto stream = data.stream();
      while (auto b = stream.next()) {
        std::vector<dtf::data::host_batch> mine;
        for (std::size_t k = 0; k < replicas; ++k) mine.push_back(rows_of(*b, (c.rank() * replicas + k) * batch, batch));
        s.step(mine);
        RANK_CHECK(s.gradient_norm() > 0.0f, s.gradient_norm());
      }
      for (std::size_t k = 0; k < replicas; ++k) result[c.rank() * replicas + k] = dtf::test::host_copy(s.parameters(k));
    });
    for (std::size_t k = 1; k < 4; ++k) REQUIRE(result[k] == result[0]);
    for (std::size_t i = 0; i < single.size(); ++i) REQUIRE(result[0][i] == Approx(single[i]).margin(1e-5));
  }
}

// mirrored's exchange across processes on the NCCL path (docs/design/gpu-execution.md, section
// 2.1): each bucket to a pinned buffer, the ring there, and back, against the ring in place on
// the buffer (the host path's), bucket by bucket in the same order: bit for bit. CPU builds: plain
// copies; CUDA builds: the copies on a communication stream, the buffer on the device.
TEST_CASE("mirrored staging: buckets through a pinned buffer equal the ring in place, bit for bit",
          "[collectives][strategies][staging]") {
  namespace sd = dtf::strategies::detail;
  const std::size_t pre = sd::exchange_prefix, total = pre + 1000;
  const std::vector<sd::gradient_bucket> buckets{{pre + 600, total}, {pre + 200, pre + 600}, {0, pre + 200}};
  run_ranks(2, test_options(), [&](communicator& c) {
    std::vector<float> mine(total);
    for (std::size_t i = 0; i < total; ++i) mine[i] = value(c.rank(), i) * 0.37f + 0.1f;  // averages round
    std::vector<float> want = mine;
    for (std::size_t k = 0; k < buckets.size(); ++k)
      c.allreduce<float>("in place/" + std::to_string(k),
                         std::span<float>(want).subspan(buckets[k].begin, buckets[k].size()), reduce_op::average);
    dtf::tensor grads({total});
    grads.copy_from_host<float>(mine);
    sd::pinned_floats host(total);
    sd::replica_staging staging(total);
    dtf::device::context ctx;
#if DTF_CUDA
    const dtf::device::stream_t stream = ctx.comm_stream();
#else
    const dtf::device::stream_t stream = nullptr;
#endif
    for (std::size_t k = 0; k < buckets.size(); ++k)
      staging.reduce(buckets[k], c, "staged/" + std::to_string(k), grads.data<float>(), host.data(), stream);
    ctx.synchronize();
    RANK_CHECK(dtf::test::host_copy(grads.span<const float>()) == want, "the staged buffer differs");
    RANK_CHECK(std::vector<float>(host.data(), host.data() + total) == want, "the pinned buffer differs");
    host[0] = -1.0f;  // one process: the loss's slot alone, read after its wait
    staging.loss_to_host(grads.data<float>(), host.data(), stream);
    staging.wait_loss();
    RANK_CHECK(host[0] == want[0], host[0]);
    try {
      staging.reduce({total - 1, total + 1}, c, "past", grads.data<float>(), host.data(), stream);
      throw std::runtime_error("a bucket past the buffer was reduced");
    } catch (const dtf::error& e) {
      RANK_CHECK(e.code() == dtf::make_error_code(dtf::errc::invalid_argument), e.what());
      RANK_CHECK(std::string(e.what()).find("past the buffer of 1016 floats") != std::string::npos, e.what());
    }
  });
}

#if DTF_CUDA
// mirrored on its replicas' contexts (docs/design/gpu-execution.md, section 2.1) against the
// model stepped by hand: one replica in one process averages nothing (a mean of one, times 1.0f),
// so its variables are the hand-made step's, bit for bit where the reference runs on a context of
// its own (cuBLAS may choose its algorithms by the handle's workspace), and within rounding of
// today's path (no context: the legacy default stream, the thread's cuBLAS handle).
TEST_CASE("mirrored: one replica on its context equals the model stepped by hand", "[collectives][strategies][gpu]") {
  auto comm = communicator::single();
  const auto prototype = dtf::test::small_net();
  const dtf::optim::rule rule = dtf::optim::adam{.learning_rate = 0.01f};
  dtf::strategies::mirrored<dtf::nn::sequential, false> s(comm, prototype, 1, {.rule = rule});
  s.initialize(9);
  auto stream = dtf::test::synthetic(60, 13, dtf::test::labels::argmax).batch(20).stream();
  std::vector<dtf::data::host_batch> batches;
  while (auto b = stream.next()) batches.push_back(*b);

  const std::size_t n = dtf::num_parameters(prototype.variables());
  auto by_hand = [&](bool on_context) {
    dtf::nn::sequential net(prototype);
    dtf::device::context ctx;
    dtf::optim::optimizer<> opt(rule, n);
    if (on_context) {
      net.set_context(ctx);
      opt.set_stream(ctx.compute_stream());
    }
    dtf::tensor params({n}), grads({n}), x, y;
    net.initialize(params.span<float>(), 9);
    std::vector<float> losses;
    for (const auto& b : batches) {
      ctx.synchronize();
      dtf::assign_from_host(x, b.features);
      dtf::assign_from_host(y, b.labels);
      losses.push_back(net.loss_and_gradients(params.span<const float>(), x, y, grads.span<float>()));
      opt.apply(params.span<float>(), grads.span<const float>());
    }
    ctx.synchronize();
    auto values = dtf::test::host_copy(params.span<const float>());
    if (on_context) net.clear_context();
    return std::pair{values, losses};
  };
  std::vector<float> losses;
  for (const auto& b : batches) losses.push_back(s.step(std::span<const dtf::data::host_batch>(&b, 1)));
  const auto mine = dtf::test::host_copy(s.parameters());

  const auto [same, same_losses] = by_hand(true);
  CHECK(mine == same);
  CHECK(losses == same_losses);
  const auto [today, today_losses] = by_hand(false);
  REQUIRE(mine.size() == today.size());
  for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == Approx(today[i]).margin(1e-6));
  for (std::size_t i = 0; i < losses.size(); ++i) CHECK(losses[i] == Approx(today_losses[i]).margin(1e-6));
}
// mirrored across processes from the device (section 2.1): 2 processes' ranks on threads, one
// replica each on a single GPU (the host path, pinned buffers), or with 2+ GPUs two replicas each
// (the NCCL path in an NCCL build: the buckets through pinned memory, the broadcast, the device
// clip; two rank threads then drive two NCCL groups over the same GPUs), with clip_norm, against
// the host path and the one-process reference within rounding.
TEST_CASE("mirrored across processes from the device equals the host path within rounding",
          "[collectives][strategies][gpu][staging]") {
  int gpus = 0;
  REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
  const std::size_t replicas = gpus >= 2 ? 2 : 1, batch = 8, steps = 6;
  const float clip = 0.05f;
  std::vector<double> norms;
  const auto single = train_single_loop(2 * replicas * batch, steps, {.clip_norm = clip}, &norms);
  const auto data = dtf::test::synthetic(2 * replicas * batch * steps, 7, dtf::test::labels::argmax).batch(2 * replicas * batch);
  auto run = [&]<class S>(std::vector<float>& losses, std::vector<float>& seen_norms, bool& on_gpus) {
    std::vector<std::vector<float>> result(2 * replicas);
    run_ranks(2, test_options(), [&](communicator& c) {
      S s(c, dtf::test::small_net(), replicas, {.rule = dtf::optim::sgd{.learning_rate = 0.1f}, .clip_norm = clip});
      s.initialize(3);
      auto stream = data.stream();
      while (auto b = stream.next()) {
        std::vector<dtf::data::host_batch> mine;
        for (std::size_t k = 0; k < replicas; ++k) mine.push_back(rows_of(*b, (c.rank() * replicas + k) * batch, batch));
        const float loss = s.step(mine);
        if (c.rank() == 0) {
          losses.push_back(loss);
          seen_norms.push_back(s.gradient_norm());
        }
      }
      if (c.rank() == 0) on_gpus = s.reduces_on_gpus();
      for (std::size_t k = 0; k < replicas; ++k) result[c.rank() * replicas + k] = dtf::test::host_copy(s.parameters(k));
    });
    for (std::size_t k = 1; k < result.size(); ++k) REQUIRE(result[k] == result[0]);
    return result[0];
  };
  std::vector<float> losses, host_losses, seen, host_seen;
  bool on_gpus = false, host_on_gpus = true;
  const auto mine = run.template operator()<dtf::strategies::mirrored<dtf::nn::sequential>>(losses, seen, on_gpus);
  const auto host = run.template operator()<dtf::strategies::mirrored<dtf::nn::sequential, false>>(host_losses, host_seen, host_on_gpus);
  INFO(replicas << " replicas per process; NCCL path: " << on_gpus);
  CHECK(!host_on_gpus);
  CHECK(on_gpus == (replicas > 1 && DTF_MIRRORED_NCCL));
  REQUIRE(mine.size() == single.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    CHECK(mine[i] == Approx(host[i]).margin(1e-5));
    CHECK(mine[i] == Approx(single[i]).margin(1e-5));
  }
  REQUIRE(losses.size() == steps);
  for (std::size_t t = 0; t < steps; ++t) {
    CHECK(losses[t] == Approx(host_losses[t]).epsilon(1e-5));
    CHECK(seen[t] == Approx(norms[t]).epsilon(1e-4));
    CHECK(host_seen[t] == Approx(norms[t]).epsilon(1e-4));
  }
}
#endif

// Section 7 of docs/design/gpu-execution.md: where a collective engine's step may run as CUDA
// graphs, as a pure function of the ranks, the backend and the passes.
TEST_CASE("step graphs apply to one rank or the NCCL backend, one pass per step", "[collectives][graph]") {
  using dtf::strategies::detail::step_graphs_apply;
  for (const std::size_t ranks : {1u, 2u, 8u})
    for (const bool nccl : {false, true})
      for (const int passes : {1, 2}) {
        INFO(ranks << " ranks, nccl " << nccl << ", " << passes << " passes");
        CHECK(step_graphs_apply(ranks, nccl, passes) == (passes == 1 && (ranks == 1 || nccl)));
      }
}

TEST_CASE("engine context: the host's waits call the wait guard first, and its error ends them", "[collectives][health]") {
  // ring_allreduce with NCCL installs the exchange's bounded, health-checked wait as the guard
  // (section 6.1): parameters(), optimizer(), restore(), the loss read go through settle().
  auto net = dtf::test::small_net();
  dtf::strategies::detail::engine_context<dtf::nn::sequential> ctx(net);
  std::vector<std::string> seen;
  bool dead = false;
  ctx.set_wait_guard([&](const std::string& what) {
    seen.push_back(what);
    if (dead) throw dtf::error(dtf::errc::peer_failure, "stand-in: NCCL reported an error");
  });
  ctx.settle();
  ctx.guard("the gradient's norm");
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == "the gradient's norm");
  dead = true;
  CHECK_THROWS_WITH(ctx.settle(), Catch::Contains("NCCL reported an error"));
  ctx.set_wait_guard({});
  ctx.settle();  // none: the plain wait
  CHECK(seen.size() == 3);
}

namespace {
// A 2-rank ring_allreduce run of deferred steps with graphs `graphs` on `backend`: rank 1's
// batch is short (5 rows) at step 6, so the ranks' batch keys differ there (one rank's eager
// step against the other's replay). Per rank: the parameters, the full batch's graph counts,
// whether use_step_graphs said on. CUDA builds: rank r on GPU r.
struct ring_graph_run {
  std::vector<std::vector<float>> params = std::vector<std::vector<float>>(2);
  std::vector<dtf::device::graph_counts> full = std::vector<dtf::device::graph_counts>(2);
  std::vector<int> on = std::vector<int>(2);
};
ring_graph_run run_ring_graphs(bool graphs, dtf::strategies::exchange_backend backend) {
  const std::size_t batch = 16, steps = 10;
  const auto data = dtf::test::synthetic(2 * batch * steps, 12, dtf::test::labels::argmax).batch(2 * batch);
  ring_graph_run out;
  run_ranks(2, test_options(), [&](communicator& c) {
#if DTF_CUDA
    RANK_CHECK(cudaSetDevice(int(c.rank())) == cudaSuccess, "cudaSetDevice(" << c.rank() << ")");
#endif
    auto net = dtf::test::small_net();
    net.set_label_check(dtf::nn::label_check::trusted);  // capturable: no per-step label read
    dtf::strategies::ring_allreduce<dtf::nn::sequential> s(
        c, net, {.rule = dtf::optim::adam{.learning_rate = 1e-2f}, .bucket_bytes = 256, .backend = backend});
    s.initialize(6);
    dtf::device::loss_ring ring(4);
    s.watch_losses(&ring);
    out.on[c.rank()] = s.use_step_graphs(graphs);
    auto stream = data.stream();
    dtf::tensor x, y;
    for (std::size_t step = 1; auto b = stream.next(); ++step) {
      const std::size_t rows = c.rank() == 1 && step == 6 ? 5 : batch;
      const auto mine = rows_of(*b, c.rank() * batch, rows);
      s.context().synchronize();  // the last step no longer reads x, y (copies on the legacy stream)
      dtf::assign_from_host(x, mine.features);
      dtf::assign_from_host(y, mine.labels);
      s.step_deferred(x, y);
      (void)ring.poll();
    }
    RANK_CHECK(ring.drain().size() <= steps, "");
    out.params[c.rank()] = dtf::test::host_copy(s.parameters());
    out.full[c.rank()] = s.graphs().counts(batch);
    s.watch_losses(nullptr);
  });
  return out;
}
}  // namespace

TEST_CASE("ring_allreduce on the TCP ring, 2 ranks: graphs asked for stay off, the eager step's parameters",
          "[collectives][graph]") {
  // The TCP ring waits on the host per bucket (section 6.0): no capture; the engine says so and
  // steps eagerly, bit for bit as without the request.
  using dtf::strategies::exchange_backend;
  const auto eager = run_ring_graphs(false, exchange_backend::tcp);
  const auto asked = run_ring_graphs(true, exchange_backend::tcp);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(asked.on[r] == 0);
    CHECK(asked.full[r] == dtf::device::graph_counts{});
    CHECK(asked.params[r] == eager.params[r]);
    CHECK(eager.params[r] == eager.params[0]);
  }
}

#if DTF_CUDA
TEST_CASE("ring_allreduce with NCCL, 2 ranks: the step as CUDA graphs, the allreduces captured",
          "[collectives][graph][nccl_graph][gpu]") {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (!dtf::strategies::detail::nccl_exchange_built || gpus < 2) {
    WARN("skipped: needs a build linking dtf::nccl and 2 GPUs (one per rank); nccl "
         << dtf::strategies::detail::nccl_exchange_built << ", " << gpus << " GPU(s)");
    return;
  }
  using dtf::strategies::exchange_backend;
  const auto eager = run_ring_graphs(false, exchange_backend::nccl);
  const auto graphed = run_ring_graphs(true, exchange_backend::nccl);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(graphed.on[r] == 1);
    REQUIRE(graphed.params[r].size() == eager.params[r].size());
    CHECK(graphed.params[r] == graphed.params[0]);  // every rank gets NCCL's same bits
    // NCCL may pick another algorithm under capture: within rounding of the eager run.
    for (std::size_t i = 0; i < eager.params[r].size(); ++i)
      CHECK(graphed.params[r][i] == Approx(eager.params[r][i]).margin(1e-5));
  }
  // Full batches: eager at 1 (the buckets' replan follows it), captured at 2, replayed after;
  // rank 1's short step 6 is a key of its own (eager) while rank 0 replays: the same collectives.
  CHECK(graphed.full[0] == dtf::device::graph_counts{.eager = 1, .captures = 1, .replays = 8});
  CHECK(graphed.full[1] == dtf::device::graph_counts{.eager = 1, .captures = 1, .replays = 7});
}
#endif
