// Identities bound to credentials (docs/design/identity.md): a task key proves one identity
// only, the ps acts on the proven one, the handshake binds both identities and the direction,
// and a TLS client refuses a server that did not prove the key.
#include <catch2/catch.hpp>

#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>
#include <dtf/ps/positions.hpp>
#include <dtf/recovery.hpp>
#include <dtf/train_flags.hpp>
#include <dtf/transport/credentials.hpp>

#include "ps_helpers.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace dtf;
using dtf::test::log_sink;
using dtf::test::opts;
using dtf::test::running_ps;

namespace {

const std::string master = "identity-test-master-secret-0123";

std::vector<variable_spec> vars12() { return {{"w", {4, 3}, 0}}; }

// A client that holds only `key_of`'s task key and presents `identity`.
transport_options with_key(const std::string& identity, const std::string& key_of) {
  auto o = opts(identity);
  o.task_key = derive_task_key(master, key_of);
  return o;
}

// Drives a client and a server handshake machine against each other in memory; `tamper` may
// rewrite each frame the server sends before the client reads it.
void run_handshakes(detail::handshake& client, detail::handshake& server,
                    const std::function<void(std::vector<std::byte>&)>& tamper = {}) {
  using state = detail::handshake::state;
  auto feed = [](detail::handshake& to, std::vector<std::byte> bytes) {
    std::size_t at = 0;
    while (at < bytes.size() && to.status() == state::running) {
      const auto n = std::min(to.bytes_wanted(), bytes.size() - at);
      to.receive(std::span<const std::byte>(bytes.data() + at, n));
      at += n;
    }
  };
  for (int round = 0; round < 8; ++round) {
    feed(server, client.take_output());
    auto out = server.take_output();
    if (tamper && !out.empty()) tamper(out);
    feed(client, std::move(out));
    if (client.status() != state::running && server.status() != state::running) break;
  }
}

}  // namespace

TEST_CASE("task keys: one per identity, none equal to another's or to the ring key", "[identity]") {
  const auto w1 = derive_task_key(master, "worker.1");
  CHECK(w1.size() == 64);
  CHECK(w1 == derive_task_key(master, "worker.1"));
  CHECK(w1 != derive_task_key(master, "worker.2"));
  CHECK(w1 != derive_task_key(master, "chief.0"));
  CHECK(w1 != derive_task_key(master + "x", "worker.1"));
  CHECK(derive_ring_key(master) != derive_task_key(master, ""));
  CHECK_THROWS_WITH(derive_task_key("", "worker.1"), Catch::Contains("master secret"));
  CHECK_THROWS_WITH(check_secret_length("short", "$DTF_CLUSTER_SECRET"), Catch::Contains("at least 16"));
  CHECK_NOTHROW(check_secret_length(master, "$DTF_CLUSTER_SECRET"));
}

TEST_CASE("a worker's key cannot connect as the chief or as another worker", "[identity][ps][hostile]") {
  log_sink log;
  ps_options po{opts("ps.0", master, &log)};
  po.chief = "chief.0";
  running_ps s(po);
  for (const std::string& name : {"chief.0", "worker.0"}) {
    INFO("worker.1's key presenting " << name);
    rpc_client impostor(with_key(name, "worker.1"));
    impostor.add_peer("ps.0", s.address());
    CHECK_THROWS_WITH(impostor.connect_all(), Catch::Contains("refused") && Catch::Contains("wrong cluster secret"));
  }
  CHECK(log.wait_for("a key that is not 'chief.0''s"));
  CHECK(log.wait_for("a key that is not 'worker.0''s"));
  CHECK_FALSE(s.ps->shutdown_requested());
}

TEST_CASE("the ps acts on the proven identity: a worker's key cannot init, restore, save or shut down",
          "[identity][ps][hostile]") {
  const auto layout = partitioners::fixed_size{1}.place(vars12(), 1);
  ps_options po{opts("ps.0", master)};
  po.chief = "chief.0";
  running_ps s(po);
  std::vector<float> values(12);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i + 1);
  // worker.1 with its own key: connects, but the chief's operations are refused.
  ps_client worker({s.address()}, layout, with_key("worker.1", "worker.1"));
  worker.connect();
  CHECK_THROWS_WITH(worker.initialize(values, {optim::sgd{}}), Catch::Contains("only the chief (chief.0)"));
  CHECK_FALSE(s.ps->initialized());
  // The chief with its key: init works; the worker then pulls the chief's values.
  ps_client chief({s.address()}, layout, with_key("chief.0", "chief.0"));
  chief.connect();
  chief.initialize(values, {optim::sgd{}});
  std::vector<float> pulled(12);
  worker.pull(pulled);
  CHECK(pulled == values);
  CHECK_THROWS_WITH(worker.shutdown(), Catch::Contains("only the chief"));
  CHECK_FALSE(s.ps->shutdown_requested());
  chief.shutdown();
  CHECK(s.ps->shutdown_requested());
}

// One request of `kind` from `client`: "" when answered, else the refusal's text.
template <class Msg>
std::string ask(rpc_client& client, detail::message_kind kind, const Msg& m, std::vector<std::byte>* reply = nullptr) {
  std::vector<rpc_call> c(1);
  c[0].kind = kind;
  c[0].meta = detail::encode_message(m);
  try {
    client.call_all(c);
  } catch (const error& e) {
    return e.what();
  }
  if (reply) *reply = c[0].reply_meta;
  return "";
}

TEST_CASE("a worker's key reports done and positions as itself only", "[identity][ps][hostile]") {
  ps_options po{opts("ps.0", master)};
  po.chief = "chief.0";
  running_ps s(po);
  rpc_client w1(with_key("worker.1", "worker.1"));
  w1.add_peer("ps.0", s.address());
  w1.connect_all();
  using detail::message_kind;
  // Others' names, bare or with made-up proofs: refused, to the sender, and nothing recorded.
  CHECK_THAT(ask(w1, message_kind::ps_done_tasks, detail::ps_done_tasks_msg{{"worker.0", "chief.0"}}),
             Catch::Contains("worker.1 may report its own end only") && Catch::Contains("'worker.0'"));
  detail::ps_done_tasks_msg forged{{"worker.1", "chief.0"}};
  forged.proofs = {"", std::string(64, 'a')};
  CHECK_THAT(ask(w1, message_kind::ps_done_tasks, forged), Catch::Contains("'chief.0'"));
  CHECK(s.ps->done_tasks().empty());
  // Its own end: recorded; the reply's proof is bound to that name and proves no other.
  std::vector<std::byte> meta;
  CHECK(ask(w1, message_kind::ps_done_tasks, detail::ps_done_tasks_msg{{"worker.1"}}, &meta) == "");
  const auto got = detail::decode_message<detail::ps_done_tasks_msg>(meta, "done tasks");
  REQUIRE(got.proofs.size() == 1);
  detail::ps_done_tasks_msg replayed{{"worker.0"}};
  replayed.proofs = got.proofs;
  CHECK_THAT(ask(w1, message_kind::ps_done_tasks, replayed), Catch::Contains("'worker.0'"));
  CHECK(s.ps->done_tasks() == std::set<std::string>{"worker.1"});
  // Positions: another task's, also as a restore (the chief's), refused; its own recorded.
  data::position at;
  at.epoch = 3;
  for (const bool fill_only : {false, true}) {
    detail::ps_positions_msg m;
    m.positions = {{"worker.0", at}};
    m.fill_only = fill_only;
    CHECK_THAT(ask(w1, message_kind::ps_positions, m), Catch::Contains("worker.1 may report its own position only"));
  }
  detail::ps_positions_msg own;
  own.positions = {{"worker.1", at}};
  CHECK(ask(w1, message_kind::ps_positions, own) == "");
  rpc_client chief(with_key("chief.0", "chief.0"));
  chief.add_peer("ps.0", s.address());
  chief.connect_all();
  detail::ps_positions_msg restore;
  restore.positions = {{"worker.0", at}, {"worker.1", data::position{}}};
  restore.fill_only = true;
  CHECK(ask(chief, message_kind::ps_positions, restore) == "");
  detail::ps_positions_msg all;
  all.all = true;
  REQUIRE(ask(chief, message_kind::ps_positions, all, &meta) == "");
  const auto held = detail::decode_message<detail::ps_positions_msg>(meta, "positions").positions;
  REQUIRE(held.size() == 2);
  CHECK(held[0].task == "worker.0");
  CHECK(held[0].at.epoch == 3);
  CHECK(held[1].at.epoch == 3);  // worker.1's own report: a restore fills, never overrides
}

TEST_CASE("only the chief publishes the model buffers on ps 0, and any task reads them", "[identity][ps][hostile]") {
  const auto layout = partitioners::fixed_size{1}.place(vars12(), 1);
  ps_options po{opts("ps.0", master)};
  po.chief = "chief.0";
  running_ps s(po);
  ps_client worker({s.address()}, layout, with_key("worker.0", "worker.0"));
  ps_client chief({s.address()}, layout, with_key("chief.0", "chief.0"));
  worker.connect();
  chief.connect();
  std::vector<float> got(3);
  CHECK_FALSE(published_buffers(worker, got, std::chrono::milliseconds(0)));  // none published yet
  const std::vector<float> mine{1.5f, -2.0f, 0.25f};
  CHECK_THROWS_WITH(publish_buffers(worker, mine), Catch::Contains("only the chief"));
  CHECK_FALSE(published_buffers(worker, got, std::chrono::milliseconds(0)));  // the refused ones are not kept
  publish_buffers(chief, mine);
  REQUIRE(published_buffers(worker, got, std::chrono::milliseconds(0)));
  CHECK(got == mine);
  std::vector<float> other(4);
  CHECK_THROWS_WITH(published_buffers(worker, other, std::chrono::milliseconds(0)),
                    Catch::Contains("3 floats") && Catch::Contains("has 4"));
}

TEST_CASE("a task re-announces the done tasks it learnt, with their proofs, to a restarted ps", "[identity][ps]") {
  const auto layout = partitioners::fixed_size{1}.place(vars12(), 1);
  ps_options po{opts("ps.0", master)};
  po.chief = "chief.0";
  auto first = std::make_unique<running_ps>(po);
  const auto port = first->ps->port();
  const std::string address = first->address();
  ps_client worker({address}, layout, with_key("worker.0", "worker.0"));
  ps_client chief({address}, layout, with_key("chief.0", "chief.0"));
  worker.connect();
  chief.connect();
  worker.mark_done();
  CHECK(chief.workers_done() == 1);
  // The ps comes back empty on the same port; the chief tells it what it learnt.
  first.reset();
  parameter_server second("127.0.0.1:" + std::to_string(port), po);
  std::thread serve([&] { second.run(); });
  ps_recovery rec(chief, true, [&] { chief.initialize(std::vector<float>(12, 1.0f), {optim::sgd{}}); },
                  {.log = [](const std::string&) {}});
  CHECK(rec.run([&] { return chief.workers_done(); }) == 1);
  CHECK(rec.recoveries() == 1);
  CHECK(second.done_tasks() == std::set<std::string>{"worker.0"});
  second.stop();
  serve.join();
}

TEST_CASE("the single shared secret still works: a holder of the master derives its own key", "[identity][ps]") {
  const auto layout = partitioners::fixed_size{1}.place(vars12(), 1);
  running_ps s(opts("ps.0", master));
  ps_client chief({s.address()}, layout, opts("chief.0", master));
  chief.connect();
  chief.initialize(std::vector<float>(12, 1.0f), {optim::sgd{}});
  ps_client worker({s.address()}, layout, with_key("worker.0", "worker.0"));
  worker.connect();
  std::vector<float> pulled(12);
  worker.pull(pulled);
  CHECK(pulled == std::vector<float>(12, 1.0f));
  // A task with only its key cannot serve: it cannot derive its peers' keys.
  auto only_key = with_key("ps.1", "ps.1");
  CHECK_THROWS_WITH(parameter_server("127.0.0.1:0", ps_options{only_key}).run(), Catch::Contains("master secret"));
}

TEST_CASE("the handshake binds both identities and the direction", "[identity][handshake]") {
  using state = detail::handshake::state;
  SECTION("a welcome naming another server fails the server's proof") {
    detail::handshake client(detail::handshake::role::client, {"c1", "worker.0", {}, derive_task_key(master, "worker.0")});
    detail::handshake server(detail::handshake::role::server, {"c1", "ps.0", master, {}});
    run_handshakes(client, server, [](std::vector<std::byte>& frame) {
      const auto h = detail::decode_header(std::span<const std::byte, detail::frame_header_size>(
                                               frame.data(), detail::frame_header_size),
                                           detail::frame_limits{detail::max_handshake_meta, 0});
      if (h.kind != detail::message_kind::welcome) return;
      auto w = detail::decode_message<detail::welcome_msg>(
          std::span<const std::byte>(frame).subspan(detail::frame_header_size), "welcome");
      w.identity = "ps.1";  // a relay that renames the server
      const auto meta = detail::encode_message(w);
      detail::frame_header nh = h;
      nh.meta_size = std::uint32_t(meta.size());
      const auto header = detail::encode_header(nh);
      frame.assign(header.begin(), header.end());
      frame.insert(frame.end(), meta.begin(), meta.end());
    });
    CHECK(server.status() == state::done);
    CHECK(client.status() == state::failed);
    CHECK_THAT(client.failure(), Catch::Contains("failed to prove"));
  }
  SECTION("the right key on both ends completes, naming the peers") {
    detail::handshake client(detail::handshake::role::client, {"c1", "worker.0", {}, derive_task_key(master, "worker.0")});
    detail::handshake server(detail::handshake::role::server, {"c1", "ps.0", master, {}});
    run_handshakes(client, server);
    CHECK(client.status() == state::done);
    CHECK(server.status() == state::done);
    CHECK(server.peer_identity() == "worker.0");
    CHECK(client.peer_identity() == "ps.0");
  }
  SECTION("a server that checks no cluster id authenticates a client of any cluster") {
    detail::handshake client(detail::handshake::role::client, {"c1", "worker.0", master, {}});
    detail::handshake server(detail::handshake::role::server, {"", "ps.0", master, {}});
    run_handshakes(client, server);
    CHECK(client.status() == state::done);
    CHECK(server.status() == state::done);
  }
}

namespace {

// A TLS 1.3 server that is not dtf: a self-signed certificate, no pre-shared key. It accepts one
// connection and records whatever application bytes arrive after its handshake.
struct rogue_tls_server {
  int listener = -1;
  int port = 0;
  std::string received;
  bool handshake_completed = false;
  std::thread thread;

  rogue_tls_server() {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener, 4) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread([this] { serve(); });
  }
  // Waits for the one connection to end (the rogue's reads time out after 3 s).
  void join() {
    ::shutdown(listener, SHUT_RDWR);
    if (thread.joinable()) thread.join();
  }
  ~rogue_tls_server() {
    join();
    ::close(listener);
  }

  void serve() {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = X509_new();
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), 0);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("ps.0"), -1, -1, 0);
    X509_set_issuer_name(cert, X509_get_subject_name(cert));
    X509_sign(cert, key, EVP_sha256());
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_use_certificate(ctx, cert);
    SSL_CTX_use_PrivateKey(ctx, key);
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      timeval limit{3, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
      SSL* ssl = SSL_new(ctx);
      SSL_set_fd(ssl, fd);
      if (SSL_accept(ssl) == 1) {
        handshake_completed = true;
        char buf[4096];
        for (;;) {
          const int n = SSL_read(ssl, buf, sizeof buf);
          if (n <= 0) break;
          received.append(buf, std::size_t(n));
        }
      }
      SSL_free(ssl);
      ::close(fd);
    }
    SSL_CTX_free(ctx);
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

}  // namespace

TEST_CASE("a TLS client refuses a server that answers with a certificate instead of the key",
          "[identity][tls][hostile]") {
  rogue_tls_server rogue;
  auto o = with_key("worker.0", "worker.0");
  o.tls = true;
  o.connect_timeout_ms = 2000;
  rpc_client client(o);
  client.add_peer("ps.0", "127.0.0.1:" + std::to_string(rogue.port));
  CHECK_THROWS_WITH(client.connect_all(), Catch::Contains("did not prove the cluster key"));
  rogue.join();
  CHECK_FALSE(rogue.handshake_completed);
  CHECK(rogue.received.empty());
}

TEST_CASE("train_flags takes the credentials out of the environment and refuses a short secret",
          "[identity][train]") {
  dtf::cluster c;
  c.spec.jobs["ps"][0] = "127.0.0.1:1";
  c.spec.jobs["worker"][0] = "127.0.0.1:2";
  c.self = {"worker", 0};
  ::setenv("DTF_TASK_KEY", derive_task_key(master, "worker.0").c_str(), 1);
  ::setenv("DTF_RING_KEY", derive_ring_key(master).c_str(), 1);
  dtf::train_flags tf;
  const auto o = tf.options(c, "scheme");
  CHECK(o.task_key == derive_task_key(master, "worker.0"));
  CHECK(o.ring_key == derive_ring_key(master));
  CHECK(o.secret.empty());
  // Gone from the environment (so from anything this task starts), kept by the flags.
  CHECK(std::getenv("DTF_TASK_KEY") == nullptr);
  CHECK(std::getenv("DTF_RING_KEY") == nullptr);
  CHECK(tf.options(c, "scheme").task_key == o.task_key);

  ::setenv("DTF_CLUSTER_SECRET", "short", 1);
  dtf::train_flags short_secret;
  CHECK_THROWS_WITH(short_secret.options(c, "scheme"), Catch::Contains("at least 16"));
  CHECK(std::getenv("DTF_CLUSTER_SECRET") == nullptr);

  // --secret_file: owner-only files only.
  const auto path = std::filesystem::temp_directory_path() / ("dtf_secret_" + std::to_string(::getpid()));
  std::ofstream(path) << master << "\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                                         std::filesystem::perms::group_read);
  dtf::train_flags from_file;
  from_file.secret_file = path.string();
  CHECK_THROWS_WITH(from_file.options(c, "scheme"), Catch::Contains("readable or writable by others"));
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  CHECK(from_file.options(c, "scheme").secret == master);
  std::filesystem::remove(path);
  CHECK_THROWS_WITH(read_secret_file(path.string()), Catch::Contains(path.string()));
}
