// A connected peer cannot break the parameter server: requests no dtf client would send, each
// answered with an error to that peer alone while the ps keeps its data and serves the others.
#include <catch2/catch.hpp>

#include <dtf/partitioners.hpp>
#include <dtf/ps.hpp>

#include "helpers.hpp"
#include "checkpoint_helpers.hpp"
#include "ps_helpers.hpp"
#include "train_helpers.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <chrono>
#include <memory>
#include <regex>
#include <thread>

using namespace dtf;
using dtf::test::opts;
using dtf::test::running_ps;
using dtf::test::ckpt::temp_dir;

namespace {

std::vector<variable_spec> vars40() { return {{"w", {10, 3}, 0}, {"b", {3}, 30}, {"v", {7}, 33}}; }

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + float(i);
  return v;
}

// A peer that speaks the protocol but sends what it likes. call() returns the error text
// ("" on success) and reconnects after a failure.
struct raw_peer {
  rpc_client rpc;
  raw_peer(const std::string& address, const std::string& identity) : rpc(opts(identity)) {
    rpc.add_peer("ps.0", address);
    rpc.connect_all();
  }
  template <class Msg>
  std::string call(detail::message_kind kind, const Msg& m, std::span<const float> payload = {},
                   std::span<float> reply = {}, std::vector<std::byte>* reply_meta = nullptr) {
    std::vector<rpc_call> c(1);
    c[0].kind = kind;
    c[0].meta = detail::encode_message(m);
    if (!payload.empty()) c[0].payload.push_back(asio::buffer(payload.data(), payload.size_bytes()));
    if (!reply.empty()) c[0].reply_payload.push_back(asio::buffer(reply.data(), reply.size_bytes()));
    try {
      rpc.call_all(c);
    } catch (const error& e) {
      rpc.connect_all();
      return e.what();
    }
    if (reply_meta) *reply_meta = c[0].reply_meta;
    return "";
  }
};

std::vector<std::uint32_t> ids_of(const placement& layout, std::size_t ps) {
  const auto v = layout.shards_on(ps);
  return {v.begin(), v.end()};
}

ps_options in_dir(const temp_dir& dir) {
  ps_options o{opts("ps.0")};
  o.checkpoint_dir = dir.path.string();
  return o;
}

// One ps writing into its own checkpoint directory, initialised by the chief with 1..40 (SGD,
// a shard per variable) and saved once as checkpoint "ckpt-0".
struct saved_ps {
  temp_dir dir;
  running_ps ps;
  ps_client chief;
  checkpoint_manifest saved;
  explicit saved_ps(const std::string& name)
      : dir(name), ps(in_dir(dir)), chief({ps.address()}, partitioners::fixed_size{1}.place(vars40(), 1), opts("chief.0")) {
    chief.connect();
    chief.initialize(iota(40, 1.0f), {optim::sgd{}});
    saved = save_checkpoint(chief, {dir.path.string(), "ckpt", 2}, vars40());
  }
};

}  // namespace

TEST_CASE("a pull naming a shard twice, or one not held, is an error: the reply is bounded", "[ps][hostile]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{2}.place(vars40(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(iota(40, 1.0f), {optim::sgd{}});
  raw_peer bad(ps0.address(), "worker.1");
  const auto ids = ids_of(layout, 0);
  const std::uint32_t first = ids.front();
  const auto n = layout.shards[first].size;
  std::vector<float> twice(2 * n);
  CHECK_THAT(bad.call(detail::message_kind::ps_pull, detail::ps_pull_msg{{first, first}}, {}, twice),
             Catch::Contains("named twice"));
  std::vector<float> one(n);
  CHECK_THAT(bad.call(detail::message_kind::ps_pull, detail::ps_pull_msg{{9999}}, {}, one),
             Catch::Contains("not held"));
  // The ps still serves, and its data is intact.
  std::vector<float> v(40);
  chief.pull(v);
  CHECK(v == iota(40, 1.0f));
}

TEST_CASE("non-finite pushes are rejected naming the worker, and skip and apply are the other policies", "[ps][hostile]") {
  const auto layout = partitioners::fixed_size{1}.place(vars40(), 1);
  auto nan_grads = iota(40, 0.0f);
  nan_grads[7] = std::numeric_limits<float>::quiet_NaN();
  auto inf_grads = iota(40, 0.0f);
  inf_grads[0] = std::numeric_limits<float>::infinity();
  SECTION("reject (the default)") {
    running_ps ps0(opts("ps.0"));
    ps_client w({ps0.address()}, layout, opts("worker.3"));
    w.connect();
    w.initialize(iota(40, 1.0f), {optim::sgd{1.0f}});
    CHECK_THROWS_WITH(w.push_gradients(nan_grads), Catch::Contains("worker.3") && Catch::Contains("non-finite"));
    w.connect();
    CHECK_THROWS_WITH(w.push_deltas(inf_grads), Catch::Contains("worker.3"));
    w.connect();
    std::vector<float> v(40);
    CHECK(w.pull(v) == 0);  // no step advanced
    CHECK(v == iota(40, 1.0f));
  }
  SECTION("skip and apply") {
    ps_options skip{opts("ps.0")};
    skip.nonfinite = nonfinite_policy::skip;
    auto s = std::make_unique<parameter_server>("127.0.0.1:0", skip);
    std::thread t([p = s.get()] { p->run(); });
    ps_client w({"127.0.0.1:" + std::to_string(s->port())}, layout, opts("worker.3"));
    w.connect();
    w.initialize(iota(40, 1.0f), {optim::sgd{1.0f}});
    const auto r = w.push_gradients(nan_grads);
    CHECK(r.skipped);
    CHECK(r.global_step == 0);
    std::vector<float> v(40);
    w.pull(v);
    CHECK(v == iota(40, 1.0f));
    s->stop();
    t.join();

    ps_options apply{opts("ps.0")};
    apply.nonfinite = nonfinite_policy::apply;
    s = std::make_unique<parameter_server>("127.0.0.1:0", apply);
    std::thread t2([p = s.get()] { p->run(); });
    ps_client w2({"127.0.0.1:" + std::to_string(s->port())}, layout, opts("worker.3"));
    w2.connect();
    w2.initialize(iota(40, 1.0f), {optim::sgd{1.0f}});
    CHECK_FALSE(w2.push_gradients(nan_grads).skipped);
    w2.pull(v);
    CHECK(std::isnan(v[7]));
    CHECK(v[8] == 9.0f - 8.0f);
    s->stop();
    t2.join();
  }
}

TEST_CASE("an empty push cannot advance the global step of a ps that holds shards", "[ps][hostile]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{1}.place(vars40(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(iota(40, 1.0f), {optim::sgd{}});
  raw_peer bad(ps0.address(), "worker.1");
  detail::ps_push_msg m;
  m.increment_step = true;
  CHECK_THAT(bad.call(detail::message_kind::ps_push, m), Catch::Contains("cannot advance the global step"));
  CHECK(chief.global_step() == 0);
  CHECK(chief.push_gradients(std::vector<float>(40, 0.0f)).global_step == 1);
}

TEST_CASE("a second init with another model is an error, and with the same model it is ignored", "[ps][hostile]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{2}.place(vars40(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(iota(40, 1.0f), {optim::sgd{}});
  chief.initialize(iota(40, 5.0f), {optim::sgd{}});  // a restarted chief: the values here win
  std::vector<float> v(40);
  chief.pull(v);
  CHECK(v == iota(40, 1.0f));
  CHECK_THROWS_WITH(chief.initialize(iota(40, 5.0f), {optim::adam{}}), Catch::Contains("another model"));
  chief.connect();
  const auto other = partitioners::fixed_size{1}.place(vars40(), 1);
  ps_client other_chief({ps0.address()}, other, opts("chief.0"));
  other_chief.connect();
  CHECK_THROWS_WITH(other_chief.initialize(iota(40, 5.0f), {optim::sgd{}}), Catch::Contains("another model"));
  chief.pull(v);
  CHECK(v == iota(40, 1.0f));
}

TEST_CASE("a second init that trains the model another way is an error naming the difference", "[ps][hostile]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{2}.place(vars40(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(iota(40, 1.0f), {optim::sgd{}, apply_mode::locked, 2, 3});
  chief.initialize(iota(40, 5.0f), {optim::sgd{}, apply_mode::locked, 2, 3});  // the same: ignored
  const auto refused = [&](const ps_config& c, const std::string& asked) {
    CHECK_THROWS_WITH(chief.initialize(iota(40, 5.0f), c),
                      Catch::Contains("trains its model synchronously (replicas_to_aggregate 2), the init asks for " + asked));
    chief.connect();  // an error reply closes the client's connections
  };
  refused({optim::sgd{}}, "asynchronously, locked");
  refused({optim::sgd{}, apply_mode::lock_free}, "asynchronously, lock-free");
  refused({optim::sgd{}, apply_mode::locked, 3, 3}, "synchronously (replicas_to_aggregate 3)");
  std::vector<float> v(40);
  chief.pull(v);
  CHECK(v == iota(40, 1.0f));

  running_ps ps1(opts("ps.0"));
  ps_client async_chief({ps1.address()}, layout, opts("chief.0"));
  async_chief.connect();
  async_chief.initialize(iota(40, 1.0f), {optim::sgd{}, apply_mode::lock_free});
  CHECK_THROWS_WITH(async_chief.initialize(iota(40, 1.0f), {optim::sgd{}, apply_mode::locked, 1, 3}),
                    Catch::Contains("trains its model asynchronously, lock-free, the init asks for synchronously"));
}

TEST_CASE("a second init with other hyperparameters or other shard sizes is an error naming each difference",
          "[ps][hostile]") {
  // Issue 31: a second init compared the rule's name and the training mode only, so a restarted
  // chief with another learning rate (or momentum, ...) was ignored, and a model of other shard
  // sizes was refused without saying which shard.
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{2}.place(vars40(), 1);  // sizes 15 15 2 1 4 3
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  const optim::rule held = optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f};
  chief.initialize(iota(40, 1.0f), {held, apply_mode::locked, 2, 3});
  chief.initialize(iota(40, 5.0f), {held, apply_mode::locked, 2, 3});  // the same: ignored
  const auto refused = [&](ps_client& c, const ps_config& asked, const std::string& says) {
    CHECK_THROWS_WITH(c.initialize(iota(40, 5.0f), asked),
                      Catch::Contains("init from chief.0: " + says) && Catch::Contains("(restart the ps to change it)"));
    c.connect();  // an error reply closes the client's connections
  };
  const std::string momentum_here = "momentum (learning_rate 0.1, momentum 0.9)";
  refused(chief, {optim::momentum{.learning_rate = 0.05f, .momentum = 0.9f}, apply_mode::locked, 2, 3},
          "this ps applies update rule " + momentum_here + ", the init asks for momentum (learning_rate 0.05, momentum 0.9)");
  refused(chief, {optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true}, apply_mode::locked, 2, 3},
          "this ps applies update rule " + momentum_here + ", the init asks for momentum (learning_rate 0.1, momentum "
          "0.9, nesterov)");
  refused(chief, {optim::momentum{.learning_rate = 0.1f, .momentum = 0.99f}, apply_mode::locked, 2, 3},
          "this ps applies update rule " + momentum_here + ", the init asks for momentum (learning_rate 0.1, momentum "
          "0.99)");
  // Every difference at once, each named.
  refused(chief, {optim::adam{}, apply_mode::locked, 0, 3},
          "this ps already holds another model: its update rule is " + momentum_here +
              ", the init asks for adam (learning_rate 0.001, beta1 0.9, beta2 0.999, epsilon 1e-08); this ps trains "
              "its model synchronously (replicas_to_aggregate 2), the init asks for asynchronously, locked");
  // Other shards: fewer of them, or as many of other sizes (w of 9 rows, v of 10: 15 12 2 1 5 5).
  ps_client fewer({ps0.address()}, partitioners::fixed_size{1}.place(vars40(), 1), opts("chief.0"));
  fewer.connect();
  refused(fewer, {held, apply_mode::locked, 2, 3}, "this ps already holds another model: 6 shards here, the init sends 3");
  const std::vector<variable_spec> resized{{"w", {9, 3}, 0}, {"b", {3}, 27}, {"v", {10}, 30}};
  ps_client other({ps0.address()}, partitioners::fixed_size{2}.place(resized, 1), opts("chief.0"));
  other.connect();
  refused(other, {held, apply_mode::locked, 2, 3},
          "this ps already holds another model: shard 1 holds 15 elements here, the init sends 12");
  std::vector<float> v(40);
  chief.pull(v);
  CHECK(v == iota(40, 1.0f));  // nothing refused changed a value
}

TEST_CASE("init refuses replicas_to_aggregate above the workers, and lock-free with a stateful rule", "[ps][hostile]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{1}.place(vars40(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  CHECK_THROWS_WITH(chief.initialize(iota(40, 1.0f), {optim::sgd{}, apply_mode::locked, 3, 2}),
                    Catch::Contains("replicas_to_aggregate is 3") && Catch::Contains("2 workers"));
  chief.connect();
  CHECK_THROWS_WITH(chief.initialize(iota(40, 1.0f), {optim::adam{}, apply_mode::lock_free}),
                    Catch::Contains("lock-free"));
  chief.connect();
  CHECK_FALSE(ps0.ps->initialized());
  chief.initialize(iota(40, 1.0f), {optim::sgd{}, apply_mode::locked, 2, 2});
  CHECK(ps0.ps->initialized());
}

TEST_CASE("with ps_options::chief set, init, restore, save and shutdown are the chief's alone", "[ps][hostile]") {
  const auto layout = partitioners::fixed_size{1}.place(vars40(), 1);
  temp_dir dir("chief_only");
  ps_options o = in_dir(dir);
  o.chief = "chief.0";
  running_ps s(o);
  const std::string address = s.address();
  raw_peer bad(address, "worker.1");
  detail::ps_init_msg init;
  init.ids = ids_of(layout, 0);
  for (auto id : init.ids) init.sizes.push_back(layout.shards[id].size);
  init.rule = detail::rule_msg::from(optim::sgd{});
  const auto values = iota(40, 1.0f);
  // Before the chief: a worker's init (payload refused unread) does not initialise the ps.
  CHECK_THAT(bad.call(detail::message_kind::ps_init, init, values), Catch::Contains("only the chief (chief.0)"));
  CHECK_FALSE(s.ps->initialized());
  ps_client chief({address}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(values, {optim::sgd{}});
  detail::ps_restore_msg restore;
  restore.init = init;
  restore.iterations.assign(init.ids.size(), 0);
  const auto other = iota(40, 100.0f);
  CHECK_THAT(bad.call(detail::message_kind::ps_restore, restore, other), Catch::Contains("only the chief"));
  CHECK_THAT(bad.call(detail::message_kind::ps_save, detail::ps_save_msg{"mine", 0, 1}), Catch::Contains("only the chief"));
  CHECK(std::filesystem::is_empty(dir.path));
  CHECK_THAT(bad.call(detail::message_kind::ps_shutdown, detail::empty_msg{}), Catch::Contains("only the chief"));
  // The ps still serves, with the chief's values; the chief's own save and shutdown work.
  std::vector<float> v(40);
  CHECK(bad.call(detail::message_kind::ps_pull, detail::ps_pull_msg{init.ids}, {}, v).empty());
  CHECK(v == values);
  CHECK(save_checkpoint(chief, {dir.path.string(), "ckpt", 2}, vars40()).files.size() == 1);
  CHECK_FALSE(s.ps->shutdown_requested());  // none of the worker's requests counted
  chief.shutdown();
  CHECK(s.ps->shutdown_requested());
}

TEST_CASE("requests refused unread and dropped stale contributions are logged a line per interval with their count",
          "[ps][hostile][sync]") {
  dtf::test::log_sink log;
  ps_options o{opts("ps.0", "", &log)};
  o.transport.refusal_log_interval_ms = 300;
  o.chief = "chief.0";
  running_ps s(o);
  const auto layout = partitioners::fixed_size{2}.place(vars40(), 1);
  // Repeats `one` (returning whether it did what is logged) n times, then until a line carries
  // the count of those held back (the first after the interval), at most 5 s; returns how
  // often it ran and the milliseconds taken.
  const auto flood = [&](std::size_t n, const std::function<bool()>& counted, const std::function<bool()>& one) {
    const auto start = std::chrono::steady_clock::now();
    std::size_t done = 0;
    for (std::size_t i = 0; i < n; ++i) done += one();
    while (!counted() && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) done += one();
    return std::pair{done, std::size_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - start).count())};
  };
  constexpr std::size_t n = 40;
  SECTION("a worker's chief-only requests, refused before their payload is read") {
    raw_peer bad(s.address(), "worker.1");
    detail::ps_init_msg init;
    init.ids = ids_of(layout, 0);
    for (auto id : init.ids) init.sizes.push_back(layout.shards[id].size);
    init.rule = detail::rule_msg::from(optim::sgd{});
    const auto values = iota(40, 1.0f);
    const auto [sent, ms] = flood(n, [&] { return log.contains("similar lines suppressed"); }, [&] {
      return bad.call(detail::message_kind::ps_init, init, values).find("only the chief") != std::string::npos;
    });
    const auto c = dtf::test::count_logged(log, "refused a request of 'worker.1' unread");
    INFO(c.lines << " lines for " << sent << " refusals in " << ms << " ms");
    CHECK(c.events == sent);
    CHECK(c.lines <= 2 + ms / 300);
    CHECK(c.lines < n / 4);
  }
  SECTION("a backup worker's contributions to finished steps") {
    ps_client chief({s.address()}, layout, opts("chief.0"));
    chief.connect();
    chief.initialize(iota(40, 0.0f), {optim::sgd{1.0f}, apply_mode::locked, 1});  // each push completes a step
    ps_client first({s.address()}, layout, opts("worker.1"));
    first.connect();
    REQUIRE_FALSE(first.push_sync(std::vector<float>(40, 1.0f), 0).dropped);
    ps_client late({s.address()}, layout, opts("worker.2"));
    late.connect();
    // Each line counts itself and those not logged before it: "dropped K stale contribution(s)".
    const auto stale = [&] {
      return dtf::test::count_logged(log, "stale contribution(s) since the last such line, the latest of worker.2 "
                                          "for step 0", std::regex(R"(dropped (\d+) stale)"));
    };
    const auto [sent, ms] = flood(n, [&] { const auto c = stale(); return c.events > 2 * c.lines; },
                                  [&] { return late.push_sync(std::vector<float>(40, 1.0f), 0).dropped; });
    REQUIRE(sent > n);
    // count_logged adds a line's own one to its K: each line is K + 1 there.
    const auto c = stale();
    const std::size_t lines = c.lines, events = c.events - c.lines;
    INFO(lines << " lines for " << sent << " dropped contributions in " << ms << " ms");
    CHECK(events == sent);
    CHECK(lines <= 2 + ms / 300);
    CHECK(lines < n / 4);
    CHECK(s.ps->dropped_contributions() == std::map<std::string, std::uint64_t>{{"worker.2", sent}});
  }
}

TEST_CASE("the done-task set holds only known workers, or a bounded number of names", "[ps][hostile]") {
  SECTION("known workers") {
    ps_options o{opts("ps.0")};
    o.known_workers = {"chief.0", "worker.1"};
    running_ps ps(o);
    raw_peer bad(ps.address(), "worker.1");
    CHECK_THAT(bad.call(detail::message_kind::ps_done_tasks, detail::ps_done_tasks_msg{{"worker.1", "intruder.7"}}),
               Catch::Contains("intruder.7") && Catch::Contains("not a worker"));
    CHECK(ps.ps->done_tasks().empty());  // nothing of a rejected request was recorded
    CHECK(bad.call(detail::message_kind::ps_done_tasks, detail::ps_done_tasks_msg{{"worker.1"}}) == "");
    CHECK(ps.ps->done_tasks() == std::set<std::string>{"worker.1"});
    raw_peer stranger(ps.address(), "worker.9");
    CHECK_THAT(stranger.call(detail::message_kind::ps_done, detail::empty_msg{}), Catch::Contains("worker.9"));
    CHECK(ps.ps->done_tasks().size() == 1);
  }
  SECTION("bounded") {
    ps_options o{opts("ps.0")};
    o.max_done_tasks = 3;
    running_ps ps(o);
    raw_peer bad(ps.address(), "worker.1");
    CHECK_THAT(bad.call(detail::message_kind::ps_done_tasks, detail::ps_done_tasks_msg{{"a", "b", "c", "d", "e"}}),
               Catch::Contains("full"));
    CHECK(ps.ps->done_tasks().size() <= 3);
    CHECK_THAT(bad.call(detail::message_kind::ps_done_tasks, detail::ps_done_tasks_msg{{std::string(300, 'x')}}),
               Catch::Contains("not a worker"));
  }
}

TEST_CASE("a ps destroyed while the chief waits for done reports releases the wait before its transport",
          "[ps][hostile]") {
  // The waiting request's responder holds its connection; were it released after the transport
  // (as it was), the connection would be destroyed on a freed server: AddressSanitizer's
  // heap-use-after-free (tests/CMakeLists.txt builds this file with it, test dtf_asan_tests).
  running_ps ps(opts("ps.0"));
  rpc_client chief(opts("chief.0"));
  chief.add_peer("ps.0", ps.address());
  chief.connect_all();
  std::vector<rpc_call> c(1);
  c[0].kind = detail::message_kind::ps_done_tasks;
  c[0].meta = detail::encode_message(detail::ps_done_tasks_msg{{}, 1, 60000});
  std::string answer = "none yet";
  std::thread waiter([&] {
    try {
      chief.call_all(c);
      answer = "a reply";
    } catch (const error& e) {
      answer = e.what();
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ps.ps->done_waiters() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  REQUIRE(ps.ps->done_waiters() == 1);
  ps.kill();  // stop, join and destroy the ps while the request waits
  waiter.join();
  CHECK(answer != "a reply");  // the connection closed unanswered: the chief sees an error
  CHECK(answer != "none yet");
}

TEST_CASE("a ps on two I/O threads destroyed while three done waits are pending touches no freed memory",
          "[ps][hostile]") {
  // Issue 31 item 8: every done wait holds its connection and a timer on the ps's I/O context
  // (peer.defer_until); destroying the ps must release them all before the transport goes,
  // whichever thread took them. Under AddressSanitizer (dtf_asan_tests) a release after the
  // transport is a heap-use-after-free.
  running_ps ps(opts("ps.0"), 2);
  std::vector<std::unique_ptr<rpc_client>> clients;
  std::vector<std::string> answers(3, "none yet");
  std::vector<std::thread> waiters;
  for (std::size_t k = 0; k < 3; ++k) {
    clients.push_back(std::make_unique<rpc_client>(opts(k == 0 ? "chief.0" : "worker." + std::to_string(k))));
    clients[k]->add_peer("ps.0", ps.address());
    clients[k]->connect_all();
  }
  for (std::size_t k = 0; k < 3; ++k)  // the clients are all made: the threads read a vector that no longer grows
    waiters.emplace_back([&, k] {
      std::vector<rpc_call> c(1);
      c[0].kind = detail::message_kind::ps_done_tasks;
      c[0].meta = detail::encode_message(detail::ps_done_tasks_msg{{}, 10, 60000});
      try {
        clients[k]->call_all(c);
        answers[k] = "a reply";
      } catch (const error& e) {
        answers[k] = e.what();
      }
    });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ps.ps->done_waiters() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  REQUIRE(ps.ps->done_waiters() == 3);
  ps.kill();  // stop, join and destroy the ps while the three requests wait
  for (auto& t : waiters) t.join();
  for (const auto& a : answers) {
    CHECK(a != "a reply");  // each connection closed unanswered
    CHECK(a != "none yet");
  }
}

TEST_CASE("a synchronous step's per-worker tables take only known workers, or a bounded number of names",
          "[ps][hostile][sync]") {
  const auto layout = partitioners::fixed_size{2}.place(vars40(), 1);
  const auto contribute = [&](running_ps& ps, const std::string& who, std::int64_t step) -> std::string {
    try {
      ps_client w({ps.address()}, layout, opts(who));
      w.connect();
      w.push_sync(std::vector<float>(40, 1.0f), step);
      return "";
    } catch (const error& e) {
      return e.what();
    }
  };
  const auto started = [&](ps_options o) {
    auto ps = std::make_unique<running_ps>(std::move(o));
    ps_client chief({ps->address()}, layout, opts("chief.0"));
    chief.connect();
    chief.initialize(iota(40, 0.0f), {optim::sgd{1.0f}, apply_mode::locked, 1});  // each push completes a step
    return ps;
  };
  SECTION("known workers") {
    ps_options o{opts("ps.0")};
    o.known_workers = {"worker.1"};
    auto ps = started(o);
    CHECK(contribute(*ps, "worker.1", 0) == "");
    CHECK_THAT(contribute(*ps, "intruder.7", 1), Catch::Contains("intruder.7") && Catch::Contains("not a worker"));
    CHECK(ps->ps->global_step() == 1);  // the refused contribution completed no step
  }
  SECTION("bounded") {
    ps_options o{opts("ps.0")};
    o.max_done_tasks = 2;
    auto ps = started(o);
    // A contribution that arrives for a finished step is dropped, and its sender's name is kept
    // (dropped_contributions): two names fill the table, a third is refused.
    CHECK(contribute(*ps, "worker.1", 0) == "");  // completes step 0 (then disconnects: not kept)
    CHECK(contribute(*ps, "worker.2", 0) == "");  // dropped: step 0 is over
    CHECK(contribute(*ps, "worker.3", 0) == "");  // dropped
    CHECK_THAT(contribute(*ps, "worker.4", 0), Catch::Contains("worker.4") && Catch::Contains("full"));
    CHECK(ps->ps->dropped_contributions() == std::map<std::string, std::uint64_t>{{"worker.2", 1}, {"worker.3", 1}});
  }
}

TEST_CASE("a malformed sync contribution is an error to its sender only and records nothing", "[ps][hostile][sync]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{2}.place(vars40(), 1);
  ps_client chief({ps0.address()}, layout, opts("chief.0"));
  chief.connect();
  chief.initialize(iota(40, 0.0f), {optim::sgd{1.0f}, apply_mode::locked, 2});
  const auto ids = ids_of(layout, 0);
  raw_peer w1(ps0.address(), "worker.1");
  // Too few bytes, then a subset of the shards, then a NaN: each refused.
  std::vector<float> short_buf(39, 1.0f);
  CHECK_THAT(w1.call(detail::message_kind::ps_sync_push, detail::ps_sync_push_msg{ids, 0}, short_buf),
             Catch::Contains("every shard"));
  std::vector<std::uint32_t> subset(ids.begin(), ids.begin() + 1);
  std::vector<float> part(layout.shards[subset[0]].size, 1.0f);
  CHECK_THAT(w1.call(detail::message_kind::ps_sync_push, detail::ps_sync_push_msg{subset, 0}, part),
             Catch::Contains("every shard"));
  std::vector<float> nan_buf(40, 1.0f);
  nan_buf[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(w1.call(detail::message_kind::ps_sync_push, detail::ps_sync_push_msg{ids, 0}, nan_buf),
             Catch::Contains("worker.1") && Catch::Contains("non-finite"));
  // Neither counted: worker.1's valid contribution and worker.2's complete the step with
  // exactly their average (1 and 3: the step subtracts 2 from every value).
  std::vector<float> v(40);
  std::vector<sync_result> results(2);  // checked here: Catch's assertions are not thread-safe
  test::run_threads(2, [&](std::size_t k) {
    ps_client w(std::vector<std::string>{ps0.address()}, layout, opts("worker." + std::to_string(k + 1)));
    w.connect();
    std::vector<float> g(40, k == 0 ? 1.0f : 3.0f);
    results[k] = w.push_sync(g, 0);
  });
  for (const auto& r : results) {
    CHECK_FALSE(r.dropped);
    CHECK(r.global_step == 1);
  }
  chief.pull(v);
  auto expect = iota(40, 0.0f);
  for (auto& x : expect) x -= 2.0f;
  CHECK(v == expect);
}

TEST_CASE("the ps writes checkpoints only into its own configured directory", "[ps][hostile][checkpoint]") {
  {
    temp_dir dir("hostile_unconfigured");
    running_ps unconfigured(opts("ps.0"));
    ps_client chief({unconfigured.address()}, partitioners::fixed_size{1}.place(vars40(), 1), opts("chief.0"));
    chief.connect();
    chief.initialize(iota(40, 1.0f), {optim::sgd{}});
    CHECK_THROWS_WITH(save_checkpoint(chief, {dir.path.string(), "ckpt", 2}, vars40()),
                      Catch::Contains("no checkpoint directory"));
  }
  saved_ps p("hostile_configured");
  CHECK(std::filesystem::exists(p.dir.path / p.saved.files.at(0).name));
  // A name that leaves the directory is refused by the ps.
  raw_peer bad(p.ps.address(), "worker.1");
  CHECK_FALSE(bad.call(detail::message_kind::ps_save, detail::ps_save_msg{"../escape", 0, 1}).empty());
  CHECK_FALSE(std::filesystem::exists(p.dir.path.parent_path() / "escape.ps-0-of-1.shard"));
}

TEST_CASE("a restore from the ps's files asks for no more elements than the checkpoint holds",
          "[ps][hostile][checkpoint]") {
  saved_ps p("restore_bound");
  // Each range lies inside the 40 saved elements, but 1024 shards of all 40 (a message well
  // inside the control-message bound) would make the ps allocate 1024 times the checkpoint:
  // refused before anything is allocated.
  detail::ps_restore_msg bomb;
  bomb.init.rule = detail::rule_msg::from(optim::sgd{});
  bomb.checkpoint = p.saved.name;
  bomb.from_files = true;
  for (std::uint32_t i = 0; i < 1024; ++i) {
    bomb.init.ids.push_back(i);
    bomb.init.sizes.push_back(40);
    bomb.iterations.push_back(0);
    bomb.from.push_back(0);
  }
  raw_peer bad(p.ps.address(), "worker.1");
  CHECK_THAT(bad.call(detail::message_kind::ps_restore, bomb), Catch::Contains("more elements than checkpoint"));
  // Two shards of 20 inside the 40 saved: within the bound, and restored.
  detail::ps_restore_msg two = bomb;
  two.init.ids = {0, 1};
  two.init.sizes = {20, 20};
  two.iterations = {0, 0};
  two.from = {20, 0};
  CHECK(bad.call(detail::message_kind::ps_restore, two).empty());
  std::vector<float> back(20);
  CHECK(bad.call(detail::message_kind::ps_pull, detail::ps_pull_msg{{0}}, {}, back).empty());
  CHECK(back == iota(20, 21.0f));
}

TEST_CASE("an evaluation read does not reset a worker's staleness (DynSGD's tau)", "[ps][dyn_sgd]") {
  running_ps ps0(opts("ps.0"));
  const auto layout = partitioners::fixed_size{1}.place(vars40(), 1);
  ps_client a({ps0.address()}, layout, opts("chief.0")), b({ps0.address()}, layout, opts("worker.1"));
  a.connect();
  b.connect();
  a.initialize(iota(40, 0.0f), {optim::sgd{}});
  std::vector<float> v(40);
  a.pull(v);
  b.pull(v);
  b.push_deltas(std::vector<float>(40, 1.0f));
  b.push_deltas(std::vector<float>(40, 1.0f));
  a.read_values(v);  // the chief's evaluation of the centre variable
  CHECK(v[0] == 2.0f);
  // a's push was computed from its pull, two updates ago: scaled by 1/3.
  const auto r = a.push_deltas(std::vector<float>(40, 3.0f), true, /*scale_by_staleness=*/true);
  CHECK(r.staleness == 2);
  a.pull(v);
  CHECK(v[0] == 3.0f);
}
