// The NCCL bootstrap's exchange of the unique id over dtf's TCP ring, on every build (the id is
// opaque bytes here; no CUDA, no NCCL): ranks as threads over loopback, port 0. And the
// exchange backend's selection in ring_allreduce as a build without NCCL makes it.
#include <dtf/collectives/nccl_bootstrap.hpp>
#include <dtf/collectives/nccl.hpp>
#include <dtf/strategies/ring_allreduce.hpp>

#include "helpers.hpp"
#include "rank_helpers.hpp"
#include "train_helpers.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using dtf::communicator;
using dtf::collectives::nccl_id_bytes;
using dtf::test::message_of;
using dtf::test::run_ranks_collect;

dtf::collective_options bootstrap_options() {
  dtf::collective_options o;
  o.timeout_ms = 5000;
  o.connect_timeout_ms = 10000;
  return o;
}

// A seeded id per rank: the other ranks' own bytes differ from rank 0's, so a rank that kept its
// own would be caught.
nccl_id_bytes id_of(std::size_t rank) {
  std::mt19937_64 rng(0x5eed + rank);
  nccl_id_bytes id{};
  for (auto& b : id) b = std::byte(rng() & 0xff);
  return id;
}

}  // namespace

TEST_CASE("nccl bootstrap: every rank receives rank 0's 128 id bytes over the ring", "[collectives][nccl_bootstrap]") {
  for (std::size_t n : {1, 2, 3, 4}) {
    std::vector<nccl_id_bytes> got(n);
    const auto failures = run_ranks_collect(n, bootstrap_options(), [&](communicator& c) {
      got[c.rank()] = dtf::collectives::share_nccl_id(c, id_of(c.rank()));
      // The ring stays usable for the engine's own collectives afterwards.
      std::vector<float> x{float(c.rank())};
      c.allreduce("after bootstrap", std::span<float>(x), dtf::reduce_op::sum);
      RANK_CHECK(x[0] == float(n * (n - 1) / 2), "allreduce after the bootstrap gave " << x[0]);
    });
    for (std::size_t r = 0; r < n; ++r) {
      INFO(n << " ranks, rank " << r);
      REQUIRE((failures[r] ? message_of(failures[r]) : std::string()) == "");
      CHECK(got[r] == id_of(0));
    }
  }
}

TEST_CASE("nccl bootstrap: the frame round-trips and a malformed one names the cause", "[collectives][nccl_bootstrap]") {
  namespace d = dtf::collectives::detail;
  const nccl_id_bytes id = id_of(7);
  const auto frame = d::encode_nccl_id(id);
  CHECK(frame.size() == 152);
  CHECK(d::decode_nccl_id(frame, "rank 0") == id);
  auto bad = frame;
  bad[0] = 'x';
  CHECK_THROWS_WITH(d::decode_nccl_id(bad, "rank 0 (a)"), Catch::Contains("from rank 0 (a)") && Catch::Contains("wrong magic"));
  bad = frame;
  bad[8] = 64;  // an id of 64 bytes: a peer built against another NCCL
  CHECK_THROWS_WITH(d::decode_nccl_id(bad, "rank 0"), Catch::Contains("an id of 64 bytes"));
  bad = frame;
  bad[16 + 5] ^= 1;
  CHECK_THROWS_WITH(d::decode_nccl_id(bad, "rank 0"), Catch::Contains("hash does not match"));
  try {
    d::decode_nccl_id(bad, "rank 0");
  } catch (const dtf::error& e) {
    CHECK(e.code() == dtf::errc::peer_failure);
  }
}

TEST_CASE("nccl bootstrap: a malformed or short frame from rank 0 fails the receiving ranks clearly",
          "[collectives][nccl_bootstrap]") {
  namespace d = dtf::collectives::detail;
  SECTION("a frame with a corrupted id") {
    const auto failures = run_ranks_collect(3, bootstrap_options(), [&](communicator& c) {
      if (c.rank() == 0) {
        auto frame = d::encode_nccl_id(id_of(0));
        frame[16 + 100] ^= 0x40;  // rank 0 sends bytes whose hash does not match
        d::broadcast_nccl_id_frame(c, frame);
      } else {
        (void)dtf::collectives::share_nccl_id(c, id_of(c.rank()));
      }
    });
    CHECK(!failures[0]);
    for (std::size_t r : {1, 2}) {
      INFO("rank " << r);
      REQUIRE(failures[r]);
      const std::string m = message_of(failures[r]);
      CHECK_THAT(m, Catch::Contains("NCCL bootstrap") && Catch::Contains("rank 0") &&
                        Catch::Contains("hash does not match"));
    }
  }
  SECTION("a short frame (64 bytes: another dtf's layout)") {
    const auto failures = run_ranks_collect(2, bootstrap_options(), [&](communicator& c) {
      if (c.rank() == 0) {
        std::vector<std::uint8_t> short_frame(64, 1);
        c.broadcast(dtf::collectives::nccl_id_collective, std::span<std::uint8_t>(short_frame), 0);
      } else {
        (void)dtf::collectives::share_nccl_id(c, id_of(c.rank()));
      }
    });
    REQUIRE(failures[1]);
    const std::string m = message_of(failures[1]);
    INFO(m);
    CHECK_THAT(m, Catch::Contains("NCCL bootstrap") && Catch::Contains("rank 0"));
    CHECK_THAT(m, Catch::Contains("64") && Catch::Contains("152"));
    try {
      std::rethrow_exception(failures[1]);
    } catch (const dtf::error& e) {
      CHECK(e.code() == dtf::errc::invalid_argument);
    }
  }
}

TEST_CASE("exchange backend: names, and the choice of a build without NCCL", "[collectives][nccl_bootstrap]") {
  using dtf::strategies::exchange_backend;
  for (auto b : {exchange_backend::automatic, exchange_backend::tcp, exchange_backend::nccl})
    CHECK(dtf::strategies::parse_exchange_backend(dtf::strategies::name_of(b)) == b);
  CHECK_THROWS_WITH(dtf::strategies::parse_exchange_backend("gloo"), Catch::Contains("'gloo'"));
  if constexpr (dtf::strategies::detail::nccl_exchange_built) return;  // a CUDA build with NCCL: GPU checks

  // nccl asked for: an error at construction naming the cause, even for one rank.
  auto one = dtf::communicator::single();
  auto net = dtf::test::small_net();
  try {
    dtf::strategies::ring_allreduce<dtf::nn::sequential> s(one, net, {.backend = exchange_backend::nccl});
    FAIL("constructed");
  } catch (const dtf::error& e) {
    CHECK(e.code() == dtf::errc::invalid_config);
    CHECK_THAT(e.message(), Catch::Contains("ring_allreduce") && Catch::Contains("nccl backend") &&
                                (Catch::Contains("CPU build") || Catch::Contains("does not link dtf::nccl")));
  }
  // automatic and tcp: the TCP ring, and a step runs on 2 ranks.
  const auto data = dtf::test::synthetic(16, 7, dtf::test::labels::argmax).batch(8);
  const auto failures = run_ranks_collect(2, bootstrap_options(), [&](communicator& c) {
    for (auto b : {exchange_backend::automatic, exchange_backend::tcp}) {
      auto net = dtf::test::small_net();
      dtf::strategies::ring_allreduce<dtf::nn::sequential> s(c, net, {.backend = b});
      RANK_CHECK(s.backend() == exchange_backend::tcp, "backend " << dtf::strategies::name_of(s.backend()));
      s.initialize(3);
      auto stream = data.stream();
      const float loss = s.step(*stream.next());
      RANK_CHECK(std::isfinite(loss), loss);
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE((failures[r] ? message_of(failures[r]) : std::string()) == "");
  }
}

#if DTF_CUDA && defined(DTF_HAVE_NCCL)
// CUDA builds with NCCL (run by scripts/gpu-check.sh where a GPU is; never run yet): the
// communicator on one GPU. Two ranks need two GPUs (NCCL takes one rank per GPU), so one rank
// averages (the identity, exactly), and two ranks on one GPU must fail with NCCL's error, not hang.
TEST_CASE("nccl_communicator: one rank initialises, averages in place and finalises", "[collectives][nccl_bootstrap][gpu]") {
  auto ring = dtf::communicator::single(bootstrap_options());
  dtf::collectives::nccl_communicator nccl(ring);
  std::vector<float> host(1000);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(int(i % 97) - 48) * 0.25f;
  dtf::tensor t({host.size()});
  t.copy_from_host<float>(host);
  cudaStream_t stream{};
  cudaEvent_t done{};
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  nccl.allreduce_average(t.data<float>(), host.size(), stream, "the test buffer");
  REQUIRE(cudaEventRecord(done, stream) == cudaSuccess);
  nccl.wait(done, "the test buffer");
  CHECK(dtf::test::host_copy(t.span<const float>()) == host);
  cudaEventDestroy(done);
  cudaStreamDestroy(stream);
}

TEST_CASE("nccl_communicator: two ranks on one GPU fail with NCCL's error within the bound", "[collectives][nccl_bootstrap][gpu]") {
  const auto failures = run_ranks_collect(2, bootstrap_options(), [&](communicator& c) {
    dtf::collectives::nccl_communicator nccl(c);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE(failures[r]);
    CHECK_THAT(message_of(failures[r]), Catch::Contains("NCCL") && Catch::Contains("rank " + std::to_string(r)));
  }
}
#endif
