// Strangers cannot lock a job out, grow a server's memory or pin its buffers (issue 30, items
// 2-4): the handshake has budgets of its own (in all, and per source address), apart from the
// authenticated connections'; a client retries a connection closed before its handshake; a
// payload buffer grows with the bytes that arrive, not to the size announced; a reply left
// unread ends its connection and releases what it pins. Loopback only: the strangers connect
// from 127.0.0.2 and up (Linux routes all of 127/8 to the loopback), the servers on port 0.
#include <catch2/catch.hpp>

#include <dtf/collectives.hpp>
#include <dtf/optim.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>
#include <dtf/transport.hpp>

#include "ps_helpers.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace dtf;
using dtf::test::log_sink;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {

// Raises this process's descriptor limit to its hard limit; returns the limit now in force.
std::size_t lockout_raise_fd_limit() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
  ::getrlimit(RLIMIT_NOFILE, &r);
  return std::size_t(r.rlim_cur);
}

// TCP connections from `source` to 127.0.0.1:port that send nothing (a stranger's).
struct lockout_strangers {
  asio::io_context io;
  std::vector<detail::tcp_socket> sockets;
  void open(const std::string& source, std::uint16_t port, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      detail::tcp_socket s(io);
      s.open(asio::ip::tcp::v4());
      s.bind({asio::ip::make_address(source), 0});
      s.connect({asio::ip::make_address("127.0.0.1"), port});
      sockets.push_back(std::move(s));
    }
  }
  // How many of them the server has closed (a read that ends at once; the open ones would block).
  std::size_t closed_by_server() {
    std::size_t n = 0;
    for (auto& s : sockets) {
      s.non_blocking(true);
      std::array<char, 16> buf;
      std::error_code ec;
      s.read_some(asio::buffer(buf), ec);
      n += ec == asio::error::eof || ec == asio::error::connection_reset;
    }
    return n;
  }
};

std::vector<variable_spec> lockout_model() { return {{"w", {8, 4}, 0}, {"b", {4}, 32}}; }

// Three SGD steps through the ps against the same steps computed here.
void lockout_train_and_check(ps_client& c) {
  std::vector<float> init(36), local(36);
  for (std::size_t i = 0; i < init.size(); ++i) init[i] = 0.25f * float(i) - 3.0f;
  c.initialize(init, {optim::sgd{0.5f}});
  local = init;
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g(36);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = float(step) - 0.125f * float(i);
    CHECK(c.push_gradients(g).global_step == step);
    for (std::size_t i = 0; i < g.size(); ++i) local[i] -= 0.5f * g[i];
  }
  std::vector<float> pulled(36);
  CHECK(c.pull(pulled) == 3);
  CHECK(pulled == local);
}

// Resets the peak resident set of this process to its present size (false: not possible).
bool lockout_reset_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return bool(clear);
}
// The peak resident set since the last lockout_reset_peak(), in bytes.
std::uint64_t lockout_peak_rss() {
  std::ifstream status("/proc/self/status");
  std::string key;
  std::uint64_t kib = 0;
  while (status >> key) {
    if (key == "VmHWM:") {
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 10, '\n');
  }
  return 0;
}
std::uint64_t lockout_rss() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * std::uint64_t(::sysconf(_SC_PAGESIZE));
}

// Answers every request with a large payload whose buffer is pinned by a hold (as a pull's
// reply pins shard leases), and says when the hold is released.
struct lockout_pinning_handler {
  std::vector<std::byte> big = std::vector<std::byte>(std::size_t(64) << 20, std::byte{7});
  std::mutex mu;
  std::condition_variable changed;
  int holds = 0;  // holds handed out and not yet released
  void operator()(const rpc_peer&, const detail::frame_header&, std::span<const std::byte>, std::span<std::byte>,
                  rpc_reply& reply) {
    {
      std::lock_guard g(mu);
      ++holds;
    }
    reply.payload.push_back(asio::buffer(big));
    reply.holds.push_back(std::shared_ptr<const void>(&big, [this](const void*) {
      {
        std::lock_guard g(mu);
        --holds;
      }
      changed.notify_all();
    }));
  }
  // Waits (bounded) until every hold handed out is released.
  bool wait_released(std::chrono::milliseconds limit) {
    std::unique_lock g(mu);
    return changed.wait_for(g, limit, [&] { return holds == 0; });
  }
};

// Takes any payload (bounded only by the frame limits, as a handler without payload_limit).
struct lockout_any_payload_handler {
  void operator()(const rpc_peer&, const detail::frame_header&, std::span<const std::byte>, std::span<std::byte>,
                  rpc_reply&) {}
};

// An rpc_server with handler H on a thread of its own; stopped and joined when it goes.
template <class H>
struct lockout_serving {
  H handler;
  rpc_server<H> server;
  std::thread thread;
  explicit lockout_serving(const transport_options& o) : server(handler, o, "127.0.0.1:0") {
    thread = std::thread([this] { server.run(); });
  }
  ~lockout_serving() {
    server.stop();
    thread.join();
  }
};

// A connection's handshake by hand (no secret), as any program could do it.
void lockout_raw_hello(detail::tcp_socket& s, const std::string& identity) {
  detail::hello_msg m;
  m.cluster_id = "test-cluster";
  m.identity = identity;
  const auto meta = detail::encode_message(m);
  detail::frame_header h;
  h.kind = detail::message_kind::hello;
  h.meta_size = std::uint32_t(meta.size());
  const auto hb = detail::encode_header(h);
  asio::write(s, std::array<asio::const_buffer, 2>{asio::buffer(hb), asio::buffer(meta)});
  std::array<std::byte, detail::frame_header_size> reply{};
  asio::read(s, asio::buffer(reply));
  const auto rh = detail::decode_header(reply, {});
  std::vector<std::byte> rm(rh.meta_size);
  asio::read(s, asio::buffer(rm));
  REQUIRE(rh.kind == detail::message_kind::welcome);
}

// A request header announcing `payload` bytes, followed by `first` of them.
void lockout_raw_request(detail::tcp_socket& s, detail::message_kind kind, std::uint64_t payload, std::size_t first) {
  detail::frame_header h;
  h.kind = kind;
  h.payload_size = payload;
  const auto hb = detail::encode_header(h);
  const std::vector<std::byte> bytes(first, std::byte{1});
  asio::write(s, std::array<asio::const_buffer, 2>{asio::buffer(hb), asio::buffer(bytes)});
}

}  // namespace

TEST_CASE("1,100 silent connections from a stranger do not keep a worker out: it connects and trains",
          "[transport][hostile][lockout]") {
  const std::size_t limit = lockout_raise_fd_limit();
  // Each stranger costs a descriptor here and, while the ps holds it, one there (same process).
  const std::size_t n = std::min<std::size_t>(1100, limit > 600 ? (limit - 300) / 2 : 0);
  INFO("descriptor limit " << limit << ", strangers " << n);
  REQUIRE(n >= 300);  // more than the handshake budget at least
  log_sink log;
  auto o = opts("ps.0", "a cluster secret of some length", &log);
  o.handshake_timeout_ms = 60000;  // the strangers' slots are not freed by their deadline here
  o.refusal_log_interval_ms = 1000;  // the default (the tests' helper logs every refusal)
  running_ps ps0(o);
  lockout_strangers strangers;
  strangers.open("127.0.0.2", ps0.ps->port(), n);
  // The worker comes after them all, from its own address.
  auto w = opts("worker.0", "a cluster secret of some length");
  ps_client c({ps0.address()}, partitioners::round_robin{}.place(lockout_model(), 1), w);
  c.connect();
  lockout_train_and_check(c);
  // The ps kept at most its per-source budget of them and told why it closed the others.
  CHECK(log.wait_for("max_handshakes_per_source"));
  CHECK(strangers.closed_by_server() >= n - o.max_handshakes_per_source);
  CHECK(ps0.ps->rejected_connections() >= n - o.max_handshakes_per_source);
  // One line a second, not one per stranger.
  CHECK(log.count("refused a connection from 127.0.0.2") < 10);
}

TEST_CASE("with the handshake budget taken, a worker retries until a slot frees and trains",
          "[transport][hostile][lockout]") {
  log_sink log;
  auto o = opts("ps.0", "a cluster secret of some length", &log);
  o.max_handshakes = 8;
  o.handshake_timeout_ms = 400;  // the strangers' slots free after this
  running_ps ps0(o);
  // Eight strangers from eight addresses: no per-source budget is reached, the total is.
  lockout_strangers strangers;
  for (int k = 2; k < 10; ++k) strangers.open("127.0.0." + std::to_string(k), ps0.ps->port(), 1);
  auto w = opts("worker.0", "a cluster secret of some length");
  w.connect_timeout_ms = 20000;
  ps_client c({ps0.address()}, partitioners::round_robin{}.place(lockout_model(), 1), w);
  // Its first attempts are closed at accept (all eight slots held); it tries again and gets in
  // once the strangers' handshake deadline has dropped them.
  c.connect();
  CHECK(log.contains("8 connections in the handshake (max_handshakes)"));
  CHECK(log.contains("did not complete the handshake within 400 ms"));
  lockout_train_and_check(c);
}

TEST_CASE("strangers from many addresses cannot take the handshake slots of the cluster's hosts",
          "[transport][hostile][lockout]") {
  const std::string secret = "a cluster secret of some length";
  // The strangers' budget filled from eight addresses (none over its per-source cap), a ninth
  // refused to show it is full; then the worker, from 127.0.0.1, connects with a short deadline.
  const auto flooded = [&](std::vector<std::string> cluster_hosts) -> std::string {
    log_sink log;
    auto o = opts("ps.0", secret, &log);
    o.max_handshakes = 16;
    o.max_handshakes_per_source = 2;
    o.handshake_timeout_ms = 60000;  // the strangers' slots are not freed during the test
    o.cluster_hosts = std::move(cluster_hosts);
    running_ps ps0(o);
    lockout_strangers strangers;
    for (int k = 2; k < 10; ++k) strangers.open("127.0.0." + std::to_string(k), ps0.ps->port(), 2);
    strangers.open("127.0.0.10", ps0.ps->port(), 1);
    REQUIRE(log.wait_for("refused a connection from 127.0.0.10"));
    CHECK(log.contains("16 connections in the handshake (max_handshakes)"));
    auto w = opts("worker.0", secret);
    w.connect_timeout_ms = 1500;
    ps_client c({ps0.address()}, partitioners::round_robin{}.place(lockout_model(), 1), w);
    try {
      c.connect();
    } catch (const error& e) {
      return e.what();
    }
    lockout_train_and_check(c);
    return "";
  };
  // One budget for all (no cluster hosts, as before): the worker is held out.
  CHECK_THAT(flooded({}), Catch::Contains("ps.0"));
  // The cluster's hosts have slots of their own: it connects at once and trains. A host name
  // resolves to its addresses; any port of the host counts.
  CHECK(flooded({"127.0.0.1:2222"}) == "");
  CHECK(flooded({"localhost:1"}) == "");
}

TEST_CASE("strangers from many addresses cannot take the handshake slots of a ring's ranks",
          "[collectives][hostile][lockout]") {
  std::vector<ring_listener> listeners;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    listeners.emplace_back("127.0.0.1:0");
    addresses.push_back("127.0.0.1:" + std::to_string(listeners.back().port()));
  }
  // Before any rank exists, each port's budget is taken by strangers from four addresses (one
  // each, its per-source cap), which stay silent past the set-up's deadline; each rank's
  // acceptor meets them first (FIFO backlog).
  lockout_strangers strangers;
  for (const auto& a : addresses)
    for (int k = 2; k < 6; ++k)
      strangers.open("127.0.0." + std::to_string(k), std::uint16_t(std::stoi(a.substr(a.rfind(':') + 1))), 1);
  collective_options o;
  o.max_pending_connections = 4;
  o.max_pending_per_source = 1;
  o.handshake_timeout_ms = 20000;
  o.connect_timeout_ms = 5000;
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
  CHECK(seconds < 4.0);  // the ranks' hosts (127.0.0.1) have slots of their own
}

TEST_CASE("past max_connections an authenticated peer is disconnected with the reason, and the others go on",
          "[transport][hostile][lockout]") {
  log_sink log;
  auto o = opts("ps.0", "a cluster secret of some length", &log);
  o.max_connections = 1;
  running_ps ps0(o);
  const auto layout = partitioners::round_robin{}.place(lockout_model(), 1);
  ps_client first({ps0.address()}, layout, opts("worker.0", "a cluster secret of some length"));
  first.connect();
  ps_client second({ps0.address()}, layout, opts("worker.1", "a cluster secret of some length"));
  second.connect();  // its handshake completes; the ps then closes the connection
  REQUIRE(log.wait_for("1 authenticated connections open (max_connections)"));
  std::vector<float> v(36);
  CHECK_THROWS(second.pull(v));
  lockout_train_and_check(first);
}

TEST_CASE("200 peers announcing 256 MiB payloads and stalling cost the server what they sent, not what they announced",
          "[transport][hostile][lockout]") {
  lockout_raise_fd_limit();
  log_sink log;
  auto o = opts("ps.0", "", &log);
  o.frame_timeout_ms = 1500;
  lockout_serving<lockout_any_payload_handler> serving(o);
  auto& server = serving.server;
  const std::uint64_t before = lockout_rss();
  REQUIRE(lockout_reset_peak());
  constexpr int peers = 200;
  constexpr std::uint64_t announced = std::uint64_t(256) << 20;
  {
    // Each: a real client's handshake, then a request announcing 256 MiB of which 1 KiB is sent.
    asio::io_context io;
    std::vector<detail::tcp_socket> raw;
    for (int i = 0; i < peers; ++i) {
      detail::tcp_socket s(io);
      s.connect({asio::ip::make_address("127.0.0.1"), server.port()});
      lockout_raw_hello(s, "worker." + std::to_string(i));
      lockout_raw_request(s, detail::message_kind::ps_push, announced, 1024);
      raw.push_back(std::move(s));
    }
    // Every one of them is dropped for stalling (no byte for frame_timeout_ms): by then the
    // server has taken all it would for them.
    REQUIRE(log.wait_for_count("sent an incomplete frame within 1500 ms", peers, std::chrono::seconds(60)));
  }
  const std::uint64_t peak = lockout_peak_rss();
  INFO("RSS before " << before / 1024 << " KiB, peak " << peak / 1024 << " KiB");
  // 200 x 64 KiB of buffer (the first growth step) is 12.5 MiB; announced in all: 50 GiB.
  CHECK(peak < before + (std::uint64_t(64) << 20));
}

TEST_CASE("a peer that stops reading its reply is disconnected after write_timeout_ms and the reply's holds released",
          "[transport][hostile][lockout]") {
  log_sink log;
  auto o = opts("ps.0", "", &log);
  o.write_timeout_ms = 500;
  lockout_serving<lockout_pinning_handler> serving(o);
  auto& server = serving.server;
  auto& handler = serving.handler;
  asio::io_context io;
  detail::tcp_socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), server.port()});
  lockout_raw_hello(s, "worker.0");
  // A request whose 64 MiB reply this peer never reads (far more than the sockets' buffers).
  lockout_raw_request(s, detail::message_kind::ps_pull, 0, 0);
  REQUIRE(log.wait_for("'worker.0' from 127.0.0.1:"));
  CHECK(log.contains("did not read its reply within 500 ms"));
  // The connection is gone and so is the hold (a shard lease, for a ps's pull): released when
  // the write's completion runs, just after the drop.
  CHECK(handler.wait_released(std::chrono::seconds(10)));
}
