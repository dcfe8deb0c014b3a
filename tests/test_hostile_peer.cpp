// A hostile or broken peer cannot stall or exhaust a task (issue 14): connection caps, idle
// deadlines and heartbeats, accept back-off when descriptors run out, concurrent ring
// handshakes, escaped peer text, no cluster id told to strangers, no allocation of what a
// peer announces. Loopback only, port 0, ranks as threads.
#include <catch2/catch.hpp>

#include <dtf/collectives.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>
#include <dtf/transport/address.hpp>

#include "ps_helpers.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <chrono>
#include <exception>
#include <new>
#include <thread>

using namespace dtf;
using dtf::test::log_sink;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {

// A raw client connection speaking the dtf frames by hand.
struct raw_peer {
  asio::io_context io;
  detail::tcp_socket s{io};
  raw_peer() = default;
  explicit raw_peer(std::uint16_t port) { s.connect({asio::ip::make_address("127.0.0.1"), port}); }
  void send_frame(detail::message_kind kind, const std::vector<std::byte>& meta, std::uint64_t payload = 0,
                  std::uint32_t status = 0) {
    detail::frame_header h;
    h.kind = kind;
    h.meta_size = std::uint32_t(meta.size());
    h.payload_size = payload;
    h.status = status;
    const auto b = detail::encode_header(h);
    asio::write(s, std::array{asio::buffer(b), asio::buffer(meta)});
  }
  std::pair<detail::frame_header, std::vector<std::byte>> read_frame() {
    std::array<std::byte, detail::frame_header_size> hb{};
    asio::read(s, asio::buffer(hb));
    const auto h = detail::decode_header(hb, {});
    std::vector<std::byte> meta(h.meta_size);
    asio::read(s, asio::buffer(meta));
    return {h, meta};
  }
  // Client handshake without a secret; returns the server's answer kind.
  detail::message_kind hello(const std::string& identity, const std::string& cluster = "test-cluster") {
    detail::hello_msg m;
    m.cluster_id = cluster;
    m.identity = identity;
    send_frame(detail::message_kind::hello, detail::encode_message(m));
    return read_frame().first.kind;
  }
  // Reads until the server closes the connection (bounded by the server's own timeouts).
  bool closed_by_peer() {
    std::array<char, 256> buf;
    std::error_code ec;
    while (!ec) s.read_some(asio::buffer(buf), ec);
    return ec == asio::error::eof || ec == asio::error::connection_reset;
  }
};

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

TEST_CASE("a server refuses connections past max_handshakes and logs why", "[transport][hostile]") {
  log_sink log;
  auto o = opts("ps.0", "", &log);
  o.max_handshakes = 3;
  o.handshake_timeout_ms = 20000;  // the silent ones hold their slots for the whole test
  running_ps ps0(o);
  raw_peer silent1(ps0.ps->port()), silent2(ps0.ps->port());
  // Under the cap a real client is served (accepted after the two silent ones: FIFO backlog);
  // once authenticated it no longer counts against the handshake budget.
  raw_peer good(ps0.ps->port());
  CHECK(good.hello("worker.0") == detail::message_kind::welcome);
  raw_peer silent3(ps0.ps->port());
  raw_peer fifth(ps0.ps->port());
  CHECK(fifth.closed_by_peer());
  CHECK(log.contains("3 connections in the handshake (max_handshakes)"));
  CHECK(log.contains("refused a connection from 127.0.0.1:"));
  CHECK(ps0.ps->rejected_connections() >= 1);
}

TEST_CASE("an authenticated peer silent between frames is dropped after idle_timeout_ms, one sending heartbeats is kept",
          "[transport][hostile]") {
  log_sink log;
  auto o = opts("ps.0", "s3cret", &log);
  o.idle_timeout_ms = 600;
  running_ps ps0(o);
  const std::string address = "127.0.0.1:" + std::to_string(ps0.ps->port());

  rpc_client alive(opts("worker.0", "s3cret"));
  alive.add_peer("ps.0", address);
  alive.connect_all();
  rpc_client quiet(opts("worker.1", "s3cret"));
  quiet.add_peer("ps.0", address);
  quiet.connect_all();
  // worker.0 sends a heartbeat every 150 ms for twice the idle deadline: the gaps, not the
  // total, count. Each gap is a bounded wait for worker.0's drop, which must not come.
  for (int i = 0; i < 8; ++i) {
    REQUIRE_FALSE(log.wait_for("'worker.0' from", std::chrono::milliseconds(150)));
    REQUIRE_NOTHROW(alive.heartbeat());
  }
  // worker.1 said nothing since its handshake: dropped, with the reason logged.
  REQUIRE(log.wait_for("'worker.1' from 127.0.0.1:"));
  CHECK(log.contains("sent nothing (idle) within 600 ms"));
  std::error_code ec;
  quiet.heartbeat(ec);
  CHECK(ec == make_error_code(errc::peer_failure));
  CHECK_FALSE(log.contains("'worker.0' from"));
  alive.heartbeat(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("without a secret, peers dropped after their handshake are logged a line per interval with their count",
          "[transport][hostile]") {
  log_sink log;
  auto o = opts("ps.0", "", &log);  // no secret: every peer authenticates
  o.refusal_log_interval_ms = 300;
  running_ps ps0(o);
  const auto garbage_peer = [&] {  // a peer that completes the handshake, then sends a bad frame
    raw_peer p(ps0.ps->port());
    REQUIRE(p.hello("worker.7") == detail::message_kind::welcome);
    std::array<std::byte, detail::frame_header_size> junk;
    junk.fill(std::byte{0xff});
    asio::write(p.s, asio::buffer(junk));
    REQUIRE(p.closed_by_peer());  // its drop is logged (or counted) before the connection closes
  };
  const auto start = std::chrono::steady_clock::now();
  constexpr std::size_t n = 40;
  for (std::size_t i = 0; i < n; ++i) garbage_peer();
  // The count of those not logged comes with the first drop after the interval.
  std::size_t more = 0;
  while (!log.contains("similar lines suppressed") && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    garbage_peer();
    ++more;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  const auto c = test::count_logged(log, "disconnected 'worker.7'");
  INFO(c.lines << " lines for " << n + more << " drops in " << ms << " ms");
  CHECK(c.events == n + more);                          // every drop logged or counted
  CHECK(c.lines <= 2 + std::size_t(ms) / 300);          // a line per interval
  CHECK(c.lines < n / 4);
}

TEST_CASE("accept failing with EMFILE backs off instead of spinning, then serves", "[transport][hostile]") {
  log_sink log;
  running_ps ps0(opts("ps.0", "", &log));
  // The client's socket exists before descriptors run out; connecting needs none.
  raw_peer client;
  client.s.open(asio::ip::tcp::v4());
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  const int lowest_free = ::fcntl(0, F_DUPFD, 0);
  REQUIRE(lowest_free >= 0);
  ::close(lowest_free);
  struct restore {
    rlimit r;
    ~restore() { ::setrlimit(RLIMIT_NOFILE, &r); }
  } guard{saved};
  rlimit tight = saved;
  tight.rlim_cur = rlim_t(lowest_free);  // every descriptor below is taken: accept gets EMFILE
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
  client.s.connect({asio::ip::make_address("127.0.0.1"), ps0.ps->port()});
  const bool failed = log.wait_for("accept failed", std::chrono::seconds(5));
  // Half a second of a pending connection that cannot be accepted.
  const double cpu0 = cpu_seconds();
  const std::size_t lines0 = log.count("accept failed");
  // Half a second, or less when the acceptor spins (3 more failures logged ends the wait).
  const bool spinning = log.wait_for_count("accept failed", lines0 + 3, std::chrono::milliseconds(500));
  const double cpu = cpu_seconds() - cpu0;
  const std::size_t lines = log.count("accept failed") - lines0;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK(failed);
  INFO("accept failures logged in 0.5 s: " << lines << ", CPU " << cpu << " s");
  CHECK_FALSE(spinning);
  CHECK(lines <= 2);   // a spinning acceptor logs thousands
  CHECK(cpu < 0.25);   // and burns the whole half second
  // With descriptors back, the pending connection is accepted (within the 1 s back-off cap).
  CHECK(client.hello("worker.0") == detail::message_kind::welcome);
}

TEST_CASE("peer-supplied identities are escaped before they are logged", "[transport][hostile]") {
  log_sink log;
  running_ps ps0(opts("ps.0", "s3cret", &log));
  rpc_client c(opts("evil\nFAKE: ps.0 accepted root\x1b[2J", "wrong"));
  c.add_peer("ps.0", "127.0.0.1:" + std::to_string(ps0.ps->port()));
  CHECK_THROWS_WITH(c.connect_all(), Catch::Contains("wrong cluster secret"));
  REQUIRE(log.wait_for("wrong cluster secret"));
  std::lock_guard g(log.mu);
  bool seen = false;
  for (const auto& l : log.lines) {
    CHECK(l.find('\n') == std::string::npos);
    CHECK(l.find('\x1b') == std::string::npos);
    seen = seen || l.find("evil\\x0aFAKE: ps.0 accepted root\\x1b[2J") != std::string::npos;
  }
  CHECK(seen);
}

TEST_CASE("a refused stranger is not told the cluster id", "[transport][hostile]") {
  log_sink log;
  auto o = opts("ps.0", "", &log);
  o.cluster_id = "prod-cluster-7f3a";
  running_ps ps0(o);
  auto stranger = opts("worker.0");
  stranger.cluster_id = "guess";
  rpc_client c(stranger);
  c.add_peer("ps.0", "127.0.0.1:" + std::to_string(ps0.ps->port()));
  try {
    c.connect_all();
    FAIL("a client of another cluster was admitted");
  } catch (const error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("cluster id 'guess' is not this cluster's") != std::string::npos);
    CHECK(m.find("prod-cluster-7f3a") == std::string::npos);
  }
  // The same holds on a ring port.
  ring_listener listener("127.0.0.1:0");
  const std::string ring_address = "127.0.0.1:" + std::to_string(listener.port());
  std::exception_ptr rank1;
  std::thread accepting([&] {
    try {
      collective_options co;
      co.cluster_id = "prod-cluster-7f3a";
      co.connect_timeout_ms = 3000;
      communicator comm(std::move(listener), 1, {"127.0.0.1:1", ring_address}, {"worker.0", "worker.1"}, co);
    } catch (...) {
      rank1 = std::current_exception();
    }
  });
  const auto deadline = detail::ring_clock::now() + std::chrono::seconds(3);
  auto fd = detail::connect_with_retry(ring_address, "rank 1", deadline);
  try {
    detail::client_handshake(fd.get(), {"guess", "worker.0", ""}, deadline, "rank 1");
    FAIL("a ring port admitted a peer of another cluster");
  } catch (const error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("is not this cluster's") != std::string::npos);
    CHECK(m.find("prod-cluster-7f3a") == std::string::npos);
  }
  fd.reset();
  accepting.join();
  CHECK(rank1);  // it never met its real neighbour
}

TEST_CASE("one silent socket on a rank's port does not stall the ring's set-up", "[collectives][hostile]") {
  std::vector<ring_listener> listeners;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    listeners.emplace_back("127.0.0.1:0");
    addresses.push_back("127.0.0.1:" + std::to_string(listeners.back().port()));
  }
  // Connected before any rank exists, so each rank's acceptor meets them first (FIFO backlog).
  std::vector<detail::unique_fd> silent;
  for (const auto& a : addresses)
    silent.push_back(detail::connect_with_retry(a, "rank", detail::ring_clock::now() + std::chrono::seconds(5)));
  collective_options o;
  o.connect_timeout_ms = 8000;
  o.handshake_timeout_ms = 8000;  // as long as set-up: only concurrency can save it
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::exception_ptr> failures(3);
  std::vector<std::thread> ranks;
  for (std::size_t r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      try {
        communicator c(std::move(listeners[r]), r, addresses, {}, o);
        std::vector<float> v{float(r + 1)};
        c.allreduce<float>("x", v);
        if (v[0] != 6.0f) throw std::runtime_error("allreduce gave " + std::to_string(v[0]));
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK_NOTHROW(failures[r] ? std::rethrow_exception(failures[r]) : void());
  }
  CHECK(seconds < 4.0);
}

TEST_CASE("a worker does not allocate the payload a malicious ps announces", "[transport][hostile]") {
  // A fake ps: handshake, then a failure reply announcing 2 GiB, or a reply larger than asked.
  for (const std::uint32_t status : {std::uint32_t(errc::internal), std::uint32_t(0)}) {
    asio::io_context io;
    detail::tcp_acceptor acceptor(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    const auto port = acceptor.local_endpoint().port();
    std::thread fake([&] {
      detail::tcp_socket s(io);
      acceptor.accept(s);
      detail::handshake hs(detail::handshake::role::server, {"test-cluster", "ps.0", ""});
      std::vector<std::byte> in;
      while (hs.status() == detail::handshake::state::running) {
        in.resize(hs.bytes_wanted());
        asio::read(s, asio::buffer(in));
        hs.receive(in);
        const auto out = hs.take_output();
        asio::write(s, asio::buffer(out));
      }
      std::array<std::byte, detail::frame_header_size> hb{};
      asio::read(s, asio::buffer(hb));
      const auto request = detail::decode_header(hb, {});
      std::vector<std::byte> meta(request.meta_size + request.payload_size);
      asio::read(s, asio::buffer(meta));
      const auto reason = detail::encode_message(detail::refused_msg{"no"});
      detail::frame_header h;
      h.kind = detail::message_kind::reply;
      h.request_id = request.request_id;
      h.status = status;
      h.meta_size = status ? std::uint32_t(reason.size()) : 0;
      h.payload_size = std::uint64_t(1) << 31;
      const auto b = detail::encode_header(h);
      asio::write(s, std::array{asio::buffer(b), asio::buffer(reason.data(), h.meta_size)});
      std::error_code ec;
      std::array<char, 16> sink;
      s.read_some(asio::buffer(sink), ec);  // until the worker hangs up
    });
    rpc_client c(opts("worker.0"));
    c.add_peer("ps.0", "127.0.0.1:" + std::to_string(port));
    c.connect_all();
    std::vector<float> values(4);
    rpc_call call;
    call.kind = detail::message_kind::ps_pull;
    call.meta = detail::encode_message(detail::ps_pull_msg{{0}});
    call.reply_payload.push_back(asio::buffer(values));
    const auto t0 = std::chrono::steady_clock::now();
    std::error_code ec;
    try {
      c.call(call);
      FAIL("the reply was accepted");
    } catch (const error& e) {
      INFO(e.what());
      CHECK(e.code() == make_error_code(errc::peer_failure));
      CHECK(std::string(e.what()).find("carries 2147483648 payload bytes") != std::string::npos);
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));  // no wait for the 2 GiB
    c.call(call, ec);  // the connection was dropped
    CHECK(ec == make_error_code(errc::peer_failure));
    fake.join();
  }
}

namespace {

// The reason a failure reply carries.
std::string reason_of(const std::pair<detail::frame_header, std::vector<std::byte>>& reply) {
  return detail::decode_message<detail::refused_msg>(reply.second, "reply").reason;
}

}  // namespace

TEST_CASE("a ps refuses a payload its request cannot carry before reading or allocating it", "[ps][hostile]") {
  log_sink log;
  running_ps ps0(opts("ps.0", "", &log));
  const std::vector<variable_spec> vars{{"w", {10, 3}, 0}, {"b", {10}, 30}};
  const auto layout = partitioners::fixed_size{1}.place(vars, 1);
  std::vector<std::uint32_t> ids;
  for (const auto id : layout.shards_on(0)) ids.push_back(id);
  const std::uint64_t huge = std::uint64_t(3) << 30;
  // The refusal comes at once, before any payload byte is sent: nothing waited for, nothing
  // allocated for the 3 GiB (the connection then drops them unread, here until we hang up).
  auto refused = [&](detail::message_kind kind, const std::vector<std::byte>& meta, std::uint64_t payload) {
    raw_peer p(ps0.ps->port());
    REQUIRE(p.hello("worker.1") == detail::message_kind::welcome);
    const auto t0 = std::chrono::steady_clock::now();
    p.send_frame(kind, meta, payload);
    const auto reply = p.read_frame();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    CHECK(reply.first.status == std::uint32_t(errc::invalid_argument));
    return reason_of(reply);
  };
  // Before init a push may carry nothing.
  CHECK_THAT(refused(detail::message_kind::ps_push, detail::encode_message(detail::ps_push_msg{ids}), huge),
             Catch::Contains("announcing 3221225472 payload bytes, where at most 0 are expected"));
  // An init whose payload disagrees with the sizes it names.
  detail::ps_init_msg init;
  init.ids = ids;
  for (const auto id : ids) init.sizes.push_back(layout.shards[id].size);
  CHECK_THAT(refused(detail::message_kind::ps_init, detail::encode_message(init), huge),
             Catch::Contains("init: 3221225472 payload bytes for 40 floats"));
  CHECK_FALSE(ps0.ps->initialized());
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  std::vector<float> values(40);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i);
  chief.initialize(values, {optim::sgd{}});
  // After init a push carries at most the model (160 bytes here); a sparse request names a
  // table, and this ps holds none.
  CHECK_THAT(refused(detail::message_kind::ps_gather, detail::encode_message(detail::ps_gather_msg{}), huge),
             Catch::Contains("embedding table 0 is not held here"));
  {
    // One byte too many: refused at once, its bytes dropped, and the connection goes on.
    raw_peer p(ps0.ps->port());
    REQUIRE(p.hello("worker.1") == detail::message_kind::welcome);
    p.send_frame(detail::message_kind::ps_sync_push, detail::encode_message(detail::ps_sync_push_msg{}), 161);
    const auto reply = p.read_frame();
    CHECK_THAT(reason_of(reply), Catch::Contains("announcing 161 payload bytes, where at most 160 are expected"));
    const std::vector<std::byte> junk(161, std::byte{0x7f});
    asio::write(p.s, asio::buffer(junk));
    p.send_frame(detail::message_kind::ps_step, {});
    const auto step = p.read_frame();
    CHECK(step.first.status == 0);
    CHECK(detail::decode_message<detail::ps_status_msg>(step.second, "status").initialized);
  }
  CHECK(log.wait_for("refused a request of 'worker.1' unread", std::chrono::seconds(2)));
  // The ps kept its data and serves: a whole-model push of ones at rate 1 is applied.
  std::vector<float> v(40), ones(40, 1.0f);
  chief.push_gradients(ones, 1.0f);
  chief.pull(v);
  for (std::size_t i = 0; i < v.size(); ++i) CHECK(v[i] == float(i) - 1.0f);
}

namespace {

// A handler whose every request runs out of memory.
struct out_of_memory_handler {
  void operator()(const rpc_peer&, const detail::frame_header&, std::span<const std::byte>, std::span<std::byte>,
                  rpc_reply&) {
    throw std::bad_alloc();
  }
};

}  // namespace

TEST_CASE("bad_alloc in a handler is an error reply, and the server goes on serving", "[transport][hostile]") {
  out_of_memory_handler handler;
  rpc_server<out_of_memory_handler> server(handler, opts("ps.0"), "127.0.0.1:0");
  std::thread serving([&] { server.run(); });
  rpc_client c(opts("worker.0"));
  c.add_peer("ps.0", "127.0.0.1:" + std::to_string(server.port()));
  c.connect_all();
  for (int i = 0; i < 2; ++i) {
    rpc_call call;
    call.kind = detail::message_kind::ps_step;
    std::error_code ec;
    try {
      c.call(call);
      FAIL("the request succeeded");
    } catch (const error& e) {
      INFO(e.what());
      CHECK(e.code() == make_error_code(errc::invalid_argument));
      CHECK(std::string(e.what()).find("out of memory while handling a request of kind 20") != std::string::npos);
    }
  }
  CHECK(server.connections() == 1);  // the same connection answered both
  server.stop();
  serving.join();
}

TEST_CASE("one address parser: host:port, [v6]:port, bind addresses", "[transport][address]") {
  using transport::address_use;
  using transport::host_port;
  std::string why;
  CHECK(transport::parse_address("ps-0.ns.svc:2222", address_use::connect, why) == host_port{"ps-0.ns.svc", 2222});
  CHECK(transport::parse_address("[fe80::1%eth0]:1", address_use::connect, why) == host_port{"fe80::1%eth0", 1});
  CHECK(transport::parse_address("127.0.0.1:0", address_use::bind, why) == host_port{"127.0.0.1", 0});
  CHECK(transport::parse_address("*:2222", address_use::bind, why) == host_port{"*", 2222});
  CHECK_FALSE(transport::parse_address("127.0.0.1:0", address_use::connect, why));
  CHECK(why == "port 0 is outside 1..65535");
  CHECK_FALSE(transport::parse_address("::1:2222", address_use::connect, why));
  CHECK(why.find("brackets") != std::string::npos);
  CHECK_FALSE(transport::parse_address("host:99999", address_use::connect, why));
  CHECK_FALSE(transport::parse_address("host:", address_use::connect, why));
  CHECK_FALSE(transport::parse_address("ho st:1", address_use::connect, why));
  CHECK_FALSE(transport::parse_address("[::1]2222", address_use::connect, why));
  CHECK(transport::format_address("::1", 5) == "[::1]:5");
  CHECK(transport::format_address("h", 5) == "h:5");
  // The transports use it: a bad address is a clear error, not a resolver's.
  rpc_client c(opts("worker.0"));
  c.add_peer("ps.0", "::1:2222");
  CHECK_THROWS_WITH(c.connect_all(), Catch::Contains("brackets"));
  CHECK_THROWS_WITH(ring_listener("localhost"), Catch::Contains("expected host:port"));
}

TEST_CASE("the handshake machine never asks for more than its frame and refuses oversized hellos",
          "[transport][handshake]") {
  detail::handshake client(detail::handshake::role::client, {"c", "worker.0", "k"});
  detail::handshake server(detail::handshake::role::server, {"c", "ps.0", "k"});
  // Byte by byte in both directions: the machines agree and end authenticated.
  for (int round = 0; round < 10; ++round) {
    for (const auto b : client.take_output()) {
      REQUIRE(server.bytes_wanted() > 0);
      server.receive(std::span<const std::byte>(&b, 1));
    }
    for (const auto b : server.take_output()) {
      REQUIRE(client.bytes_wanted() > 0);
      client.receive(std::span<const std::byte>(&b, 1));
    }
  }
  CHECK(client.status() == detail::handshake::state::done);
  CHECK(server.status() == detail::handshake::state::done);
  CHECK(server.peer_identity() == "worker.0");
  CHECK(client.peer_identity() == "ps.0");
  CHECK(client.bytes_wanted() == 0);
  // A hello announcing more than max_handshake_meta is refused from its header alone.
  detail::handshake s2(detail::handshake::role::server, {"c", "ps.0", ""});
  detail::frame_header h;
  h.kind = detail::message_kind::hello;
  h.meta_size = detail::max_handshake_meta + 1;
  const auto hb = detail::encode_header(h);
  s2.receive(hb);
  CHECK(s2.status() == detail::handshake::state::failed);
  CHECK(s2.failure().find("exceeds the limit") != std::string::npos);
}
