// TLS 1.3 on the request/reply transport (dtf/transport/tls.hpp): round trips, refusals by
// name (a peer in the other mode, a wrong secret, another cluster), the bytes on the wire, the
// key and the handshake's settings, and a ps that gives the same values over TLS as in clear.
// Servers run on threads of this process, bound to port 0 on loopback.
#include <catch2/catch.hpp>

#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>
#include <dtf/transport.hpp>
#include <dtf/transport/tls.hpp>

#include "ps_helpers.hpp"
#include "tls_helpers.hpp"

#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace dtf;
using dtf::test::log_sink;
using dtf::test::opts;
using dtf::test::running_ps;
using dtf::test::contains;
using dtf::test::pattern_payload;
using dtf::test::recording_proxy;

namespace {

transport_options tls_opts(std::string identity, std::string secret, log_sink* log = nullptr) {
  auto o = opts(std::move(identity), std::move(secret), log);
  o.tls = true;
  return o;
}

// Answers every request with its own payload.
struct echo_handler {
  void operator()(const rpc_peer& peer, const detail::frame_header&, std::span<const std::byte>,
                  std::span<std::byte> payload, rpc_reply& reply) {
    peer.scratch->assign(payload.begin(), payload.end());
    reply.payload.push_back(asio::buffer(*peer.scratch));
  }
};

// An echo server on its own thread.
struct echo_server {
  echo_handler handler;
  rpc_server<echo_handler> server;
  std::thread thread;
  explicit echo_server(transport_options o, int threads = 1) : server(handler, std::move(o), "127.0.0.1:0", threads) {
    thread = std::thread([this] { server.run(); });
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(server.port()); }
  ~echo_server() {
    server.stop();
    thread.join();
  }
};

// One request to `address`; returns the echoed payload.
std::vector<std::byte> echo(rpc_client& c, std::size_t peer, const std::vector<std::byte>& payload) {
  std::vector<std::byte> back(payload.size());
  rpc_call call{.peer = peer, .kind = detail::message_kind::ps_step};
  call.payload.push_back(asio::buffer(payload));
  call.reply_payload.push_back(asio::buffer(back));
  c.call(call);
  return back;
}

}  // namespace

TEST_CASE("TLS: requests and replies round-trip intact, small and large", "[transport][tls]") {
  echo_server server(tls_opts("ps.0", "s3cret"));
  rpc_client c(tls_opts("worker.0", "s3cret"));
  c.add_peer("ps.0", server.address());
  c.connect_all();
  for (const std::size_t n : {std::size_t(0), std::size_t(7), std::size_t(3) << 20}) {
    const auto payload = pattern_payload(n);
    const bool intact = echo(c, 0, payload) == payload;  // (no expansion of megabytes on failure)
    CHECK(intact);
  }
  c.heartbeat();
  CHECK(server.server.rejected() == 0);
}

TEST_CASE("TLS: a server with 4 I/O threads serves 4 TLS clients at once", "[transport][tls]") {
  echo_server server(tls_opts("ps.0", "s3cret"), 4);
  std::vector<std::thread> clients;
  std::vector<int> intact(4, 0);
  std::vector<std::exception_ptr> failed(4);
  for (int k = 0; k < 4; ++k)
    clients.emplace_back([&, k] {
      try {
        rpc_client c(tls_opts("worker." + std::to_string(k), "s3cret"));
        c.add_peer("ps.0", server.address());
        c.connect_all();
        for (int i = 0; i < 20; ++i) {
          const auto payload = pattern_payload(std::size_t(1000 + 70000 * (i % 5) + k));
          intact[std::size_t(k)] += echo(c, 0, payload) == payload;
        }
      } catch (...) {
        failed[std::size_t(k)] = std::current_exception();
      }
    });
  for (auto& t : clients) t.join();
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
  CHECK(intact == std::vector<int>(4, 20));
  CHECK(server.server.rejected() == 0);
}

TEST_CASE("TLS: a plain client is refused by a TLS server with the reason on both sides", "[transport][tls]") {
  log_sink log;
  echo_server server(tls_opts("ps.0", "s3cret", &log));
  rpc_client plain(opts("worker.0", "s3cret"));
  plain.add_peer("ps.0", server.address());
  CHECK_THROWS_WITH(plain.connect_all(), Catch::Contains("this task requires TLS"));
  CHECK(log.wait_for("refused: a peer without TLS"));
  // The server goes on serving TLS clients.
  rpc_client c(tls_opts("worker.1", "s3cret"));
  c.add_peer("ps.0", server.address());
  c.connect_all();
  CHECK(echo(c, 0, pattern_payload(100)) == pattern_payload(100));
}

TEST_CASE("TLS: a TLS client is refused by a plain server with the reason on both sides", "[transport][tls]") {
  log_sink log;
  echo_server server(opts("ps.0", "s3cret", &log));
  rpc_client c(tls_opts("worker.0", "s3cret"));
  c.add_peer("ps.0", server.address());
  try {
    c.connect_all();
    FAIL("a TLS client connected to a plain server");
  } catch (const error& e) {
    INFO(e.what());
    CHECK(e.code() == make_error_code(errc::peer_failure));
    CHECK_THAT(e.what(), Catch::Contains("without TLS"));
  }
  CHECK(log.wait_for("the peer speaks TLS and this task does not"));
}

TEST_CASE("TLS: a wrong secret or another cluster id fails the TLS handshake, named", "[transport][tls]") {
  log_sink log;
  echo_server server(tls_opts("ps.0", "s3cret", &log));
  rpc_client wrong(tls_opts("worker.0", "wrong"));
  wrong.add_peer("ps.0", server.address());
  CHECK_THROWS_WITH(wrong.connect_all(), Catch::Contains("another cluster secret or cluster id"));
  CHECK(log.wait_for("another cluster secret or cluster id"));
  auto stranger = tls_opts("worker.1", "s3cret");
  stranger.cluster_id = "other-cluster";
  rpc_client other(stranger);
  other.add_peer("ps.0", server.address());
  CHECK_THROWS_WITH(other.connect_all(), Catch::Contains("another cluster secret or cluster id"));
  CHECK(log.wait_for_count("another cluster secret or cluster id", 2, std::chrono::seconds(10)));
  // The refusals tell the stranger nothing of this cluster's id.
  CHECK_FALSE(log.contains("test-cluster"));
  CHECK(server.server.rejected() == 2);
}

TEST_CASE("TLS: turning TLS on without a secret is invalid_config", "[transport][tls]") {
  echo_handler handler;
  const auto is_config = [](const error& e) { return e.code() == make_error_code(errc::invalid_config); };
  try {
    rpc_client c(tls_opts("worker.0", ""));
    FAIL("a TLS client without a secret was made");
  } catch (const error& e) {
    CHECK(is_config(e));
    CHECK_THAT(e.what(), Catch::Contains("TLS needs a cluster secret"));
  }
  CHECK_THROWS_MATCHES(rpc_server<echo_handler>(handler, tls_opts("ps.0", ""), "127.0.0.1:0"), error,
                       Catch::Predicate<error>(is_config, "invalid_config"));
}

TEST_CASE("TLS: the bytes on the wire are not the plaintext (which a plain connection shows)", "[transport][tls]") {
  const auto payload = pattern_payload(256 * 1024);
  for (const bool tls : {false, true}) {
    INFO("tls " << tls);
    echo_server server(tls ? tls_opts("ps.0", "s3cret") : opts("ps.0", "s3cret"));
    recording_proxy proxy(server.address());
    {
      rpc_client c(tls ? tls_opts("worker.0", "s3cret") : opts("worker.0", "s3cret"));
      c.add_peer("ps.0", proxy.address());
      c.connect_all();
      const bool intact = echo(c, 0, payload) == payload;
      CHECK(intact);
    }  // the client closes; the server then closes its end
    proxy.join();
    CHECK(proxy.to_server.size() > payload.size());
    CHECK(proxy.to_client.size() > payload.size());
    // The payload, and the identities of the dtf handshake, in clear only without TLS; under TLS
    // the client's task name appears as the PSK identity of its ClientHello (whose key the
    // server derives), and the server's not at all.
    CHECK(contains(proxy.to_server, "PLAINTEXT-PATTERN") == !tls);
    CHECK(contains(proxy.to_client, "PLAINTEXT-PATTERN") == !tls);
    CHECK(contains(proxy.to_server, "worker.0"));
    CHECK(contains(proxy.to_server, "dtf-psk-v2:worker.0") == tls);
    CHECK(contains(proxy.to_client, "ps.0") == !tls);
    if (tls) CHECK(proxy.to_server[0] == std::byte{detail::tls_handshake_record});
  }
}

TEST_CASE("TLS: the key is HKDF of the secret bound to the cluster id, handshakes TLS 1.3 PSK with (EC)DHE",
          "[transport][tls]") {
  const auto k = detail::derive_tls_key("s3cret", "c1");
  const dtf::credentials master{"s3cret-0123456789", {}};
  CHECK(k == detail::derive_tls_key("s3cret", "c1"));
  CHECK(k != detail::derive_tls_key("s3cret", "c2"));
  CHECK(k != detail::derive_tls_key("s3cret2", "c1"));
  CHECK_THROWS_WITH(detail::derive_tls_key("", "c1"), Catch::Contains("TLS needs a cluster secret"));
  // A client and a server context as the transport makes them, driven over a BIO pair.
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> cctx(SSL_CTX_new(TLS_client_method()), &SSL_CTX_free),
      sctx(SSL_CTX_new(TLS_server_method()), &SSL_CTX_free);
  detail::configure_tls(cctx.get(), detail::tls_role::client, master, "worker.0", "c1");
  detail::configure_tls(sctx.get(), detail::tls_role::server, master, "ps.0", "c1");
  CHECK((SSL_CTX_get_options(cctx.get()) & SSL_OP_ALLOW_NO_DHE_KEX) == 0);
  CHECK((SSL_CTX_get_options(sctx.get()) & SSL_OP_ALLOW_NO_DHE_KEX) == 0);
  std::unique_ptr<SSL, decltype(&SSL_free)> client(SSL_new(cctx.get()), &SSL_free), server(SSL_new(sctx.get()), &SSL_free);
  BIO *cb = nullptr, *sb = nullptr;
  REQUIRE(BIO_new_bio_pair(&cb, 0, &sb, 0) == 1);
  SSL_set_bio(client.get(), cb, cb);
  SSL_set_bio(server.get(), sb, sb);
  SSL_set_connect_state(client.get());
  SSL_set_accept_state(server.get());
  bool client_done = false, server_done = false;
  for (int round = 0; round < 20 && !(client_done && server_done); ++round) {
    if (!client_done) client_done = SSL_do_handshake(client.get()) == 1;
    if (!server_done) server_done = SSL_do_handshake(server.get()) == 1;
  }
  REQUIRE(client_done);
  REQUIRE(server_done);
  CHECK(SSL_version(client.get()) == TLS1_3_VERSION);
  CHECK(std::string(SSL_CIPHER_get_name(SSL_get_current_cipher(client.get()))) == "TLS_AES_128_GCM_SHA256");
  CHECK(SSL_session_reused(client.get()) == 1);  // the PSK authenticated the handshake
  CHECK(SSL_session_reused(server.get()) == 1);
  CHECK(SSL_get_negotiated_group(client.get()) != 0);  // an (EC)DHE share: psk_dhe_ke, forward secret
  CHECK(SSL_get_peer_certificate(client.get()) == nullptr);
}

TEST_CASE("TLS: ps push and pull over TLS give the same values as in clear", "[ps][transport][tls]") {
  const std::vector<variable_spec> vars{{"w", {64, 32}, 0}, {"b", {32}, 2048}};
  const std::size_t n = 2048 + 32;
  const auto run = [&](bool tls) {
    const auto o = [&](std::string who) { return tls ? tls_opts(std::move(who), "s3cret") : opts(std::move(who), "s3cret"); };
    running_ps ps0(o("ps.0")), ps1(o("ps.1"));
    const auto layout = partitioners::fixed_size{2}.place(vars, 2);
    ps_client c({ps0.address(), ps1.address()}, layout, o("worker.0"));
    c.connect();
    std::vector<float> init(n), g(n);
    for (std::size_t i = 0; i < n; ++i) init[i] = 0.001f * float(i) - 1.0f;
    c.initialize(init, {optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f}});
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < n; ++i) g[i] = float((i * 7 + std::size_t(step)) % 13) * 0.01f - 0.05f;
      c.push_gradients(g);
      c.push_deltas(std::span<const float>(g).first(n));
    }
    std::vector<float> pulled(n, 0.0f);
    CHECK(c.pull(pulled) == 6);
    return pulled;
  };
  const auto plain = run(false);
  const auto encrypted = run(true);
  CHECK(encrypted == plain);
  CHECK(plain != std::vector<float>(n, 0.0f));
}
