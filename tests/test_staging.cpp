// The segmented staging of device memory (dtf/detail/staging_pipeline.hpp,
// dtf/ps/device_staging.hpp): the schedule and the bytes, with the host copy engine that stands
// in for the CUDA one on CPU builds, compared with references computed byte by byte; then the
// whole path through the transport to real parameter servers, against the host path.
#include <catch2/catch.hpp>

#include <dtf/detail/staging_pipeline.hpp>
#include <dtf/device_span.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>
#include <dtf/tensor.hpp>

#include "ps_helpers.hpp"

#include <cstdint>
#include <random>
#include <vector>

using namespace dtf;
using dtf::detail::host_copy_engine;
using dtf::detail::staged_range;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {

using op = host_copy_engine::op;

std::vector<std::byte> random_bytes(std::size_t n, std::mt19937& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  return v;
}

// Ranges over a device buffer of `size` bytes, in a shuffled order, some empty.
std::vector<staged_range> random_ranges(std::size_t size, std::mt19937& rng) {
  std::vector<std::size_t> cuts{0, size};
  const std::size_t pieces = 1 + rng() % 6;
  for (std::size_t i = 0; i < pieces; ++i) cuts.push_back(rng() % (size + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<staged_range> r;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) r.push_back({cuts[i], cuts[i + 1] - cuts[i]});
  std::shuffle(r.begin(), r.end(), rng);
  return r;
}

// The message a pipeline must carry: each range's bytes in turn, one byte at a time.
std::vector<std::byte> expected_message(const std::vector<std::byte>& device, const std::vector<staged_range>& ranges) {
  std::vector<std::byte> out;
  for (const auto& r : ranges)
    for (std::size_t i = 0; i < r.bytes; ++i) out.push_back(device[r.offset + i]);
  return out;
}

// The marks and waits of a send of n segments: mark 0, then for each k: mark k+1 (when there is
// one), wait k.
std::vector<op> expected_send_sync(std::size_t n) {
  std::vector<op> out;
  if (n == 0) return out;
  out.push_back({op::mark, 0});
  for (std::size_t k = 0; k < n; ++k) {
    if (k + 1 < n) out.push_back({op::mark, k + 1});
    out.push_back({op::wait, k});
  }
  return out;
}

std::vector<op> only(const std::vector<op>& log, std::initializer_list<op::kind_t> kinds) {
  std::vector<op> out;
  for (const auto& o : log)
    if (std::find(kinds.begin(), kinds.end(), o.kind) != kinds.end()) out.push_back(o);
  return out;
}

std::size_t copied(const std::vector<op>& log, op::kind_t kind) {
  std::size_t n = 0;
  for (const auto& o : log)
    if (o.kind == kind) n += o.value;
  return n;
}

}  // namespace

TEST_CASE("segment plan: whole segments, a short last one, none for an empty message", "[staging]") {
  for (std::size_t total : {0u, 1u, 7u, 8u, 9u, 64u, 100u})
    for (std::size_t seg : {1u, 3u, 8u, 1000u}) {
      const detail::segment_plan p{total, seg};
      // Reference: walk the bytes and start a segment every `seg` of them.
      std::size_t count = 0;
      for (std::size_t b = 0; b < total; ++b)
        if (b % seg == 0) ++count;
      REQUIRE(p.count() == count);
      std::size_t covered = 0;
      for (std::size_t k = 0; k < p.count(); ++k) {
        CHECK(p.begin(k) == covered);
        const std::size_t len = p.end(k) - p.begin(k);
        CHECK(len == (k + 1 < p.count() ? seg : total - seg * (p.count() - 1)));
        covered += len;
      }
      CHECK(covered == total);
    }
}

TEST_CASE("staged send: every byte in order, copy k+1 issued before waiting for k", "[staging]") {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t size = rng() % 200;
    const auto device = random_bytes(size, rng);
    const auto ranges = random_ranges(size, rng);
    const std::size_t seg = 1 + rng() % 40;
    host_copy_engine e;
    detail::staged_send send(e, device.data(), ranges, seg);
    const auto want = expected_message(device, ranges);
    REQUIRE(send.total_bytes() == want.size());
    send.begin();
    std::vector<std::byte> wire;
    for (std::size_t k = 0; k < send.count(); ++k) {
      const auto s = send.segment(k);
      CHECK(s.size() == std::min(seg, want.size() - k * seg));
      wire.insert(wire.end(), s.begin(), s.end());
    }
    CHECK(wire == want);
    CHECK(only(e.log(), {op::mark, op::wait}) == expected_send_sync(send.count()));
    CHECK(copied(e.log(), op::to_staging) == want.size());
    CHECK(copied(e.log(), op::from_staging) == 0);
  }
}

TEST_CASE("staged send: a segment's copies are issued before its mark, and split at range ends", "[staging]") {
  // Two ranges of 5 and 4 bytes in segments of 3: segment 1 takes 2 bytes of the first range
  // and 1 of the second.
  std::vector<std::byte> device(20);
  for (std::size_t i = 0; i < device.size(); ++i) device[i] = std::byte(i);
  const std::vector<staged_range> ranges{{10, 5}, {2, 4}};
  host_copy_engine e;
  detail::staged_send send(e, device.data(), ranges, 3);
  REQUIRE(send.count() == 3);
  send.begin();
  for (std::size_t k = 0; k < 3; ++k) send.segment(k);
  const std::vector<op> want{{op::to_staging, 3}, {op::mark, 0},                        // 10 11 12
                             {op::to_staging, 2}, {op::to_staging, 1}, {op::mark, 1},  // 13 14 | 2
                             {op::wait, 0},
                             {op::to_staging, 3}, {op::mark, 2},  // 3 4 5
                             {op::wait, 1}, {op::wait, 2}};
  CHECK(e.log() == want);
  const std::vector<std::byte> staged(e.staging().begin(), e.staging().begin() + 9);
  const std::vector<std::byte> ref{std::byte(10), std::byte(11), std::byte(12), std::byte(13), std::byte(14),
                                   std::byte(2),  std::byte(3),  std::byte(4),  std::byte(5)};
  CHECK(staged == ref);
}

TEST_CASE("staged receive: segments land in their ranges, bytes outside them untouched", "[staging]") {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t size = rng() % 200;
    const auto ranges = random_ranges(size, rng);
    const std::size_t seg = 1 + rng() % 40;
    std::size_t total = 0;
    for (const auto& r : ranges) total += r.bytes;
    const auto message = random_bytes(total, rng);
    std::vector<std::byte> device(size + 8, std::byte(0xAB));  // 8 bytes no range covers
    // Reference: byte i of the message goes to the i-th byte of the ranges taken in turn.
    auto want = device;
    std::size_t i = 0;
    for (const auto& r : ranges)
      for (std::size_t b = 0; b < r.bytes; ++b) want[r.offset + b] = message[i++];

    host_copy_engine e;
    detail::staged_receive recv(e, device.data(), ranges, seg);
    REQUIRE(recv.total_bytes() == total);
    std::size_t at = 0;
    for (std::size_t k = 0; k < recv.count(); ++k) {
      auto s = recv.segment(k);
      CHECK(s.size() == std::min(seg, total - at));
      std::copy(message.begin() + std::ptrdiff_t(at), message.begin() + std::ptrdiff_t(at + s.size()), s.begin());
      at += s.size();
      recv.received(k);
    }
    recv.finish();
    CHECK(at == total);
    CHECK(device == want);
    CHECK(copied(e.log(), op::from_staging) == total);
    // No wait inside the receive: the copies of every segment are waited for once, at the end.
    CHECK(only(e.log(), {op::wait, op::wait_all}) == std::vector<op>{{op::wait_all, 0}});
  }
}

TEST_CASE("staging: an empty message has no segments and copies nothing", "[staging]") {
  host_copy_engine e;
  const std::vector<staged_range> none;
  detail::staged_send send(e, nullptr, none, 16);
  send.begin();
  CHECK(send.count() == 0);
  detail::staged_receive recv(e, nullptr, none, 16);
  CHECK(recv.count() == 0);
  recv.finish();
  CHECK(only(e.log(), {op::to_staging, op::from_staging, op::mark, op::wait}).empty());
}

TEST_CASE("staging: out-of-order use and a zero segment size are refused", "[staging]") {
  std::vector<std::byte> device(10);
  const std::vector<staged_range> ranges{{0, 10}};
  host_copy_engine e;
  CHECK_THROWS_AS(detail::staged_send(e, device.data(), ranges, 0), error);
  detail::staged_send send(e, device.data(), ranges, 4);
  CHECK_THROWS_AS(send.segment(0), error);  // before begin()
  send.begin();
  CHECK_THROWS_AS(send.segment(1), error);
  detail::staged_receive recv(e, device.data(), ranges, 4);
  CHECK_THROWS_AS(recv.received(1), error);
  recv.received(0);
  CHECK_THROWS_AS(recv.finish(), error);  // two of three segments never came
}

// An engine that can be ordered against a compute stream, as the CUDA one (set_stream,
// before_send): it notes where in its copy log each send's ordering came.
struct ordered_engine : host_copy_engine {
  void set_stream(int s) { stream = s; }
  void before_send() { ordered_at.push_back(log().size()); }
  int stream = 0;
  std::vector<std::size_t> ordered_at;
};

TEST_CASE("staging against a compute stream: every engine gets the stream, a send is ordered before its first copy",
          "[staging]") {
  std::mt19937 rng(41);
  const auto device = random_bytes(40, rng);
  const std::vector<staged_range> ranges{{8, 12}, {0, 8}, {24, 16}};
  detail::connection_staging<ordered_engine> staging(2, 7);
  staging.set_stream(5);
  CHECK(staging.engine(0).stream == 5);
  CHECK(staging.engine(1).stream == 5);
  rpc_call first, second;
  staging.attach_payload(first, 1, device.data(), ranges);
  auto& e = staging.engine(1);
  REQUIRE(e.ordered_at == std::vector<std::size_t>{0});  // before any copy of the send
  REQUIRE(!e.log().empty());
  CHECK(e.log().front().kind == op::to_staging);  // segment 0 issued at attach, after the ordering
  for (std::size_t k = 0; k < first.payload_source->count(); ++k) first.payload_source->segment(k);
  const std::size_t copies_of_first = e.log().size();
  staging.attach_payload(second, 1, device.data(), ranges);
  CHECK(e.ordered_at == std::vector<std::size_t>{0, copies_of_first});  // each send, before its copies
  CHECK(staging.engine(0).ordered_at.empty());  // only the connection that sends
  // A reply is not a send: no ordering before it (its copies are handed over at its end).
  rpc_call reply;
  std::vector<std::byte> out(40);
  staging.attach_reply(reply, 0, out.data(), ranges);
  CHECK(staging.engine(0).ordered_at.empty());
}

TEST_CASE("ps client: device buffers staged in segments give what the host path gives", "[staging][ps][transport]") {
  const std::vector<variable_spec> vars{{"w", {10, 3}, 0}, {"b", {3}, 30}, {"v", {7}, 33}};
  const auto layout = partitioners::fixed_size{3}.place(vars, 2);
  std::vector<float> init(40);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = 0.5f * float(i) - 3.0f;
  std::vector<float> grads(40), deltas(40);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    grads[i] = float(i % 7) - 2.5f;
    deltas[i] = 0.25f * float(i % 5);
  }

  // The same sequence through the host path and through staging with 7-byte segments (floats
  // split across segments, segments across shards).
  auto run = [&](bool staged) {
    running_ps ps0(opts("ps.0")), ps1(opts("ps.1"));
    ps_client c({ps0.address(), ps1.address()}, layout, opts("worker.0"));
    c.connect();
    c.initialize(init, {optim::sgd{0.5f}});
    detail::connection_staging<host_copy_engine> staging(2, 7);
    std::vector<float> out(40, -1.0f);
    std::vector<std::vector<float>> pulls;
    if (staged) {
      c.push_gradients(device_span<const float>{grads}, staging);
      c.push_deltas(device_span<const float>{deltas}, staging);
      c.push_gradients(device_span<const float>{grads}, staging, 0.125f);
      c.pull(device_span<float>{out}, staging);
      // Both connections staged, in more than one segment each.
      for (std::size_t ps = 0; ps < 2; ++ps) {
        const auto marks = only(staging.engine(ps).log(), {op::mark});
        CHECK(marks.size() > 2);
      }
    } else {
      c.push_gradients(grads);
      c.push_deltas(deltas);
      c.push_gradients(grads, 0.125f);
      c.pull(out);
    }
    return out;
  };
  const auto host = run(false);
  const auto staged = run(true);
  CHECK(staged == host);
  // And the host path is the update itself: w - 0.5 g + d - 0.125 g.
  for (std::size_t i = 0; i < init.size(); ++i)
    CHECK(host[i] == Approx(init[i] - 0.5f * grads[i] + deltas[i] - 0.125f * grads[i]));
}

TEST_CASE("ps client: device buffers go in requests of bounded size, pushes and synchronous contributions too",
          "[staging][ps][transport][parts]") {
  // 24 shards of 3 floats or 1 over 2 ps; requests of at most 25 bytes carry 2 to 6 shards, in
  // frames of at most 30 bytes. Each request's shards must be attached to the ps's staging
  // buffer when the previous request is answered (one buffer per ps); the ps refuses a request
  // whose bytes are not its shards', or over 30 bytes (a whole ps's share is 96).
  const std::vector<variable_spec> vars{{"w", {12, 3}, 0}, {"v", {12}, 36}};
  const auto layout = partitioners::fixed_size{12}.place(vars, 2);
  std::vector<float> init(48), grads(48), grads2(48);
  for (std::size_t i = 0; i < init.size(); ++i) {
    init[i] = 0.5f * float(i) - 3.0f;
    grads[i] = float(i % 7) - 2.5f;
    grads2[i] = 0.25f * float(i % 5);
  }
  for (const std::size_t replicas : {std::size_t(0), std::size_t(1)}) {
    DYNAMIC_SECTION((replicas ? "synchronous" : "asynchronous")) {
      auto small = [](std::string name) {  // frames of at most 30 bytes: a whole ps's share is refused
        auto t = opts(std::move(name));
        t.limits.max_payload_bytes = 30;
        return t;
      };
      running_ps ps0(small("ps.0")), ps1(small("ps.1"));
      auto o = small("worker.0");
      o.max_request_bytes = 25;
      ps_client c({ps0.address(), ps1.address()}, layout, o);
      c.connect();
      c.initialize(init, {optim::sgd{0.5f}, apply_mode::locked, replicas, replicas});
      detail::connection_staging<host_copy_engine> staging(2, 7);
      std::vector<float> out(48, -1.0f);
      if (replicas) {
        CHECK(c.push_sync(device_span<const float>{grads}, staging, 0).global_step == 1);
        CHECK(c.push_sync(device_span<const float>{grads2}, staging, 1, 0.125f).global_step == 2);
      } else {
        c.push_gradients(device_span<const float>{grads}, staging);
        c.push_gradients(device_span<const float>{grads2}, staging, 0.125f);
      }
      CHECK(c.pull(device_span<float>{out}, staging) == 2);
      for (std::size_t i = 0; i < init.size(); ++i) CHECK(out[i] == Approx(init[i] - 0.5f * grads[i] - 0.125f * grads2[i]));
    }
  }
}

TEST_CASE("ps client: the device forms read and write a device tensor's memory", "[staging][ps][transport]") {
  // CPU builds: in place (device memory is host memory); CUDA builds: through the pinned
  // staging buffer and the CUDA copy engine.
  // Requests of at most 12 bytes: each of the 2 shards (12 and 8 bytes) in a request of its own.
  for (const std::size_t bytes : {std::size_t(0), std::size_t(12)}) {
    DYNAMIC_SECTION("requests of at most " << bytes << " bytes (0: one per ps)") {
      running_ps ps0(opts("ps.0"));
      const auto layout = partitioners::fixed_size{2}.place({{"w", {5}, 0}}, 1);
      auto o = opts("worker.0");
      if (bytes) o.max_request_bytes = bytes;
      ps_client c({ps0.address()}, layout, o);
      c.connect();
      const std::vector<float> init{1, 2, 3, 4, 5};
      c.initialize(init, {optim::sgd{1.0f}});
      tensor g = tensor::from_host<float>({5}, std::vector<float>{1, 1, 1, 1, 1}), out({5});
      c.push_gradients(device_span<const float>{g.span<float>()});
      c.pull(device_span<float>{out.span<float>()});
      CHECK(out.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4});
    }
  }
}
