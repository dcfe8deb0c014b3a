// monitored_training_session: hook call order, chief-only hooks, end(status) on error, the
// stop latch, the scaffold; every built-in hook; the TensorBoard event-file writer (framing,
// checksums and protos decoded back by a small reader here; tests/tensorboard/ reads the
// files with TensorBoard itself).
#include <catch2/catch.hpp>

#include <dtf/hooks.hpp>
#include <dtf/session.hpp>
#include <dtf/summary.hpp>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

using namespace dtf;
namespace fs = std::filesystem;

namespace {

using log_t = std::vector<std::string>;

// Records every callback as "<name>.<callback>[:detail]".
struct recorder {
  std::string name;
  log_t* log;
  void begin() { log->push_back(name + ".begin"); }
  void after_create_session(run_context& c) {
    log->push_back(name + ".after_create_session:" + std::to_string(c.global_step()));
  }
  void before_run(run_context& c) { log->push_back(name + ".before_run:" + std::to_string(c.global_step())); }
  void after_run(run_context& c, const run_values& v) {
    log->push_back(name + ".after_run:" + std::to_string(c.global_step()) + "/" + std::to_string(*v.global_step));
  }
  void end(run_context& c, const run_status& s) {
    log->push_back(name + ".end:" + (s.ok() ? std::string("ok") : "error:" + s.message()) + "@" +
                   std::to_string(c.global_step()));
  }
};

struct only_end {
  int* calls;
  void end(run_context&, const run_status&) { ++*calls; }
};
struct nothing {};

// Archetypes: one callback suffices; a type with none is not a hook.
static_assert(session_hook<only_end>);
static_assert(!session_hook<nothing>);
static_assert(!session_hook<int>);

run_values step_loss(double loss) {
  run_values v;
  v.loss = loss;
  return v;
}

fs::path fresh_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("dtf_test_session_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

// --- a reader of the event files, independent of the writer ---------------------------

struct decoded_value {
  std::string tag;
  std::optional<float> simple_value;
  std::optional<histogram_summary> histo;
};
struct decoded_event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<decoded_value> values;
};

struct pb_reader {
  const unsigned char* p;
  const unsigned char* end;
  bool done() const { return p >= end; }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      REQUIRE(p < end);
      const unsigned char b = *p++;
      v |= std::uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    FAIL("varint too long");
    return 0;
  }
  std::uint64_t fixed(int n) {
    REQUIRE(end - p >= n);
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t(p[i]) << (8 * i);
    p += n;
    return v;
  }
  pb_reader sub() {
    const auto n = varint();
    REQUIRE(std::uint64_t(end - p) >= n);
    pb_reader r{p, p + n};
    p += n;
    return r;
  }
  double f64() { return std::bit_cast<double>(fixed(8)); }
};

std::vector<double> packed(pb_reader r) {
  std::vector<double> out;
  while (!r.done()) out.push_back(r.f64());
  return out;
}

histogram_summary decode_histo(pb_reader r) {
  histogram_summary h;
  while (!r.done()) {
    const auto key = r.varint();
    switch (key >> 3) {
      case 1: h.min = r.f64(); break;
      case 2: h.max = r.f64(); break;
      case 3: h.num = r.f64(); break;
      case 4: h.sum = r.f64(); break;
      case 5: h.sum_squares = r.f64(); break;
      case 6: h.bucket_limit = packed(r.sub()); break;
      case 7: h.bucket = packed(r.sub()); break;
      default: FAIL("unexpected HistogramProto field " << (key >> 3));
    }
  }
  return h;
}

decoded_value decode_value(pb_reader r) {
  decoded_value v;
  while (!r.done()) {
    const auto key = r.varint();
    if (key == ((1u << 3) | 2)) {
      auto s = r.sub();
      v.tag.assign(reinterpret_cast<const char*>(s.p), std::size_t(s.end - s.p));
    } else if (key == ((2u << 3) | 5)) {
      v.simple_value = std::bit_cast<float>(std::uint32_t(r.fixed(4)));
    } else if (key == ((5u << 3) | 2)) {
      v.histo = decode_histo(r.sub());
    } else {
      FAIL("unexpected Value key " << key);
    }
  }
  return v;
}

decoded_event decode_event(pb_reader r) {
  decoded_event e;
  while (!r.done()) {
    const auto key = r.varint();
    if (key == ((1u << 3) | 1)) {
      e.wall_time = r.f64();
    } else if (key == ((2u << 3) | 0)) {
      e.step = std::int64_t(r.varint());
    } else if (key == ((3u << 3) | 2)) {
      auto s = r.sub();
      e.file_version.assign(reinterpret_cast<const char*>(s.p), std::size_t(s.end - s.p));
    } else if (key == ((5u << 3) | 2)) {
      auto s = r.sub();
      while (!s.done()) {
        REQUIRE(s.varint() == ((1u << 3) | 2));
        e.values.push_back(decode_value(s.sub()));
      }
    } else {
      FAIL("unexpected Event key " << key);
    }
  }
  return e;
}

std::uint32_t le32(const unsigned char* p) { return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24; }

// Reads every record, checking both masked CRCs.
std::vector<decoded_event> read_events(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  REQUIRE(in);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<decoded_event> out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 12);
    std::uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= std::uint64_t(bytes[at + i]) << (8 * i);
    const auto* hdr = reinterpret_cast<const std::byte*>(&bytes[at]);
    REQUIRE(le32(&bytes[at + 8]) == detail::masked_crc32c(std::span<const std::byte>(hdr, 8)));
    REQUIRE(bytes.size() - at - 12 >= n + 4);
    const auto* data = reinterpret_cast<const std::byte*>(&bytes[at + 12]);
    REQUIRE(le32(&bytes[at + 12 + n]) == detail::masked_crc32c(std::span<const std::byte>(data, n)));
    out.push_back(decode_event(pb_reader{&bytes[at + 12], &bytes[at + 12 + n]}));
    at += 12 + n + 4;
  }
  return out;
}

fs::path only_event_file(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  REQUIRE(files[0].filename().string().rfind("events.out.tfevents.", 0) == 0);
  return files[0];
}

}  // namespace

// --- the session ------------------------------------------------------------------------

TEST_CASE("session calls hooks in TensorFlow's order, scaffold between begin and after_create_session", "[session]") {
  log_t log;
  monitored_training_session s({.is_chief = true,
                                .scaffold = {.restore = [&] { log.push_back("restore"); return std::optional<std::int64_t>(); },
                                             .init = [&] { log.push_back("init"); }}});
  s.add_hook(recorder{"a", &log});
  s.add_chief_hook(recorder{"c", &log});
  s.add_hook(recorder{"b", &log});
  s.create();
  s.run([&](run_context& ctx) {
    log.push_back("step:" + std::to_string(ctx.global_step()));
    return run_values{};
  });
  s.close();
  s.close();  // idempotent
  const log_t expected = {"a.begin", "c.begin", "b.begin", "restore", "init",
                          "a.after_create_session:0", "c.after_create_session:0", "b.after_create_session:0",
                          "a.before_run:0", "c.before_run:0", "b.before_run:0", "step:0",
                          "a.after_run:1/1", "c.after_run:1/1", "b.after_run:1/1",
                          "a.end:ok@1", "c.end:ok@1", "b.end:ok@1"};
  CHECK(log == expected);
}

TEST_CASE("session runs chief-only hooks on the chief only, and waits for readiness elsewhere", "[session]") {
  log_t log;
  monitored_training_session s({.is_chief = false,
                                .scaffold = {.restore = [&] { log.push_back("restore"); return std::optional<std::int64_t>(7); },
                                             .init = [&] { log.push_back("init"); },
                                             .wait_ready = [&] { log.push_back("wait_ready"); },
                                             .global_step = [] { return std::int64_t(12); }}});
  s.add_hook(recorder{"a", &log});
  auto& chief_only = s.add_chief_hook(recorder{"c", &log});
  CHECK(chief_only.name == "c");
  s.run([](run_context&) { return run_values{.global_step = 13}; });
  s.close();
  const log_t expected = {"a.begin", "wait_ready", "a.after_create_session:12", "a.before_run:12", "a.after_run:13/13",
                          "a.end:ok@13"};
  CHECK(log == expected);
}

TEST_CASE("session restores on the chief: init only when there is no checkpoint", "[session]") {
  int inits = 0;
  SECTION("a checkpoint at step 40") {
    monitored_training_session s({.scaffold = {.restore = [] { return std::optional<std::int64_t>(40); },
                                               .init = [&] { ++inits; }}});
    s.create();
    CHECK(s.global_step() == 40);
    CHECK(s.context().initial_global_step() == 40);
    s.run([](run_context&) { return run_values{}; });  // a local step counts one global step
    CHECK(s.global_step() == 41);
    CHECK(inits == 0);
  }
  SECTION("no checkpoint") {
    monitored_training_session s({.scaffold = {.restore = [] { return std::optional<std::int64_t>(); },
                                               .init = [&] { ++inits; }}});
    s.create();
    CHECK(s.global_step() == 0);
    CHECK(inits == 1);
  }
}

TEST_CASE("session ends every hook with the error when the step throws, then rethrows it", "[session]") {
  log_t log;
  monitored_training_session s;
  s.add_hook(recorder{"a", &log});
  s.add_hook(recorder{"b", &log});
  int runs = 0;
  auto step = [&](run_context&) -> run_values {
    if (++runs == 3) throw error(errc::io_error, "disk gone");
    return {};
  };
  s.run(step);
  s.run(step);
  try {
    s.run(step);
    FAIL("no exception");
  } catch (const error& e) {
    CHECK(e.code() == errc::io_error);
  }
  CHECK(s.should_stop());
  s.run(step);  // ended: does nothing
  s.close();    // ended: does nothing
  CHECK(runs == 3);
  REQUIRE(log.size() >= 2);
  CHECK(log[log.size() - 2] == "a.end:error:disk gone: I/O error@2");
  CHECK(log.back() == "b.end:error:disk gone: I/O error@2");
  CHECK(std::count_if(log.begin(), log.end(), [](const std::string& l) { return l.find(".end") != std::string::npos; }) == 2);
}

TEST_CASE("session ends hooks with the error when a hook or the scaffold throws", "[session]") {
  log_t log;
  SECTION("a hook's before_run") {
    struct thrower {
      void before_run(run_context&) { throw std::runtime_error("hook failed"); }
    };
    monitored_training_session s;
    s.add_hook(recorder{"a", &log});
    s.add_hook(thrower{});
    bool stepped = false;
    CHECK_THROWS_WITH(s.run([&](run_context&) { stepped = true; return run_values{}; }), "hook failed");
    CHECK_FALSE(stepped);
    CHECK(log.back() == "a.end:error:hook failed@0");
  }
  SECTION("the scaffold's restore") {
    monitored_training_session s({.scaffold = {.restore = []() -> std::optional<std::int64_t> {
                                    throw error(errc::corrupt_data, "checksum mismatch in shard 1");
                                  }}});
    s.add_hook(recorder{"a", &log});
    CHECK_THROWS_AS(s.create(), error);
    const log_t expected = {"a.begin", "a.end:error:checksum mismatch in shard 1: corrupt data@-1"};
    CHECK(log == expected);
  }
}

TEST_CASE("session runs every hook's end even when one end throws", "[session]") {
  struct bad_end {
    void end(run_context&, const run_status&) { throw error(errc::io_error, "cannot save"); }
  };
  int ends = 0;
  monitored_training_session s;
  s.add_hook(bad_end{});
  s.add_hook(only_end{&ends});
  s.create();
  CHECK_THROWS_WITH(s.close(), Catch::Contains("cannot save"));
  CHECK(ends == 1);
}

TEST_CASE("session abandoned by an exception ends its hooks with an error status", "[session]") {
  log_t log;
  try {
    monitored_training_session s;
    s.add_hook(recorder{"a", &log});
    s.create();
    throw std::runtime_error("caller's own loop failed");
  } catch (const std::runtime_error&) {
  }
  REQUIRE_FALSE(log.empty());
  CHECK(log.back().find("a.end:error:session abandoned") == 0);
}

TEST_CASE("should_stop is a latch set by hooks, the step or another thread", "[session]") {
  SECTION("a hook") {
    struct stopper {
      void after_run(run_context& c, const run_values&) {
        if (c.local_step() == 2) c.request_stop();
      }
    };
    monitored_training_session s;
    s.add_hook(stopper{});
    int steps = 0;
    CHECK(s.train([&](run_context&) { ++steps; return run_values{}; }) == 3);
    CHECK(steps == 3);
    CHECK(s.should_stop());
  }
  SECTION("the step itself") {
    monitored_training_session s;
    int steps = 0;
    s.train([&](run_context& c) {
      if (++steps == 5) c.request_stop();
      return run_values{};
    });
    CHECK(steps == 5);
  }
  SECTION("another thread") {
    monitored_training_session s;
    s.create();
    std::thread t([&] { s.request_stop(); });
    t.join();
    CHECK(s.should_stop());
    int steps = 0;
    s.run([&](run_context&) { ++steps; return run_values{}; });
    CHECK(steps == 0);
    s.close();
    CHECK(s.should_stop());
  }
  SECTION("hooks cannot be added after create") {
    monitored_training_session s;
    s.create();
    int ends = 0;
    CHECK_THROWS_AS(s.add_hook(only_end{&ends}), error);
  }
}

// --- hooks ---------------------------------------------------------------------------

TEST_CASE("stop_at_step stops at last_step or after num_steps from the restored step", "[session][hooks]") {
  SECTION("last_step") {
    monitored_training_session s;
    auto& h = s.add_hook(hooks::stop_at_step({.last_step = 10}));
    CHECK(s.train([](run_context&) { return run_values{}; }) == 10);
    CHECK(h.last_step() == 10);
  }
  SECTION("num_steps counts from the restored step") {
    monitored_training_session s({.scaffold = {.restore = [] { return std::optional<std::int64_t>(100); }}});
    s.add_hook(hooks::stop_at_step({.num_steps = 5}));
    CHECK(s.train([](run_context&) { return run_values{}; }) == 105);
  }
  SECTION("a session that starts past last_step runs no step") {
    monitored_training_session s({.scaffold = {.restore = [] { return std::optional<std::int64_t>(50); }}});
    s.add_hook(hooks::stop_at_step({.last_step = 20}));
    int steps = 0;
    s.train([&](run_context&) { ++steps; return run_values{}; });
    CHECK(steps == 0);
  }
  SECTION("global steps that jump (other workers) stop at the first step at or past last_step") {
    monitored_training_session s;
    s.add_hook(hooks::stop_at_step({.last_step = 10}));
    std::int64_t g = 0;
    CHECK(s.train([&](run_context&) { return run_values{.global_step = g += 3}; }) == 12);
  }
  CHECK_THROWS_AS(hooks::stop_at_step({}), error);
  CHECK_THROWS_AS(hooks::stop_at_step({.num_steps = 1, .last_step = 2}), error);
  CHECK_THROWS_AS(hooks::stop_at_step({.num_steps = -1}), error);
}

TEST_CASE("nan_tensor fails the session or stops it with a warning", "[session][hooks]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  SECTION("fail") {
    log_t log;
    monitored_training_session s;
    s.add_hook(hooks::nan_tensor());
    s.add_hook(recorder{"r", &log});
    int steps = 0;
    try {
      s.train([&](run_context&) { return step_loss(++steps == 4 ? nan : 0.5); });
      FAIL("no exception");
    } catch (const hooks::nan_loss_error& e) {
      CHECK(e.step() == 4);
      CHECK(e.code() == errc::corrupt_data);
      CHECK_THAT(e.what(), Catch::Contains("loss is NaN at global step 4"));
    }
    CHECK(steps == 4);
    CHECK(log.back().find("r.end:error:loss is NaN at global step 4") == 0);
  }
  SECTION("stop") {
    std::vector<std::string> warnings;
    monitored_training_session s;
    auto& h = s.add_hook(hooks::nan_tensor({.policy = hooks::nan_policy::stop,
                                            .warn = [&](const std::string& w) { warnings.push_back(w); }}));
    int steps = 0;
    s.train([&](run_context&) { return step_loss(++steps == 3 ? std::numeric_limits<double>::infinity() : 0.5); });
    CHECK(steps == 3);
    CHECK(h.stops() == 1);
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Catch::Contains("loss is infinite at global step 3"));
  }
  SECTION("steps without a loss are not checked") {
    monitored_training_session s;
    s.add_hook(hooks::nan_tensor());
    s.add_hook(hooks::stop_at_step({.last_step = 3}));
    CHECK(s.train([](run_context&) { return run_values{}; }) == 3);
  }
}

TEST_CASE("logging writes key=value progress lines every N iterations", "[session][hooks]") {
  std::vector<std::string> lines;
  monitored_training_session s;
  auto& stop = s.add_hook(hooks::stop_at_step({.num_steps = 20}));
  s.add_hook(hooks::logging(
      {.every_n_iter = 5, .prefix = "worker.0", .stop = &stop, .sink = [&](const std::string& l) { lines.push_back(l); }}));
  int steps = 0;
  s.train([&](run_context&) {
    ++steps;
    run_values v = step_loss(double(steps));
    v.scalars["lr"] = 0.1;
    return v;
  });
  REQUIRE(lines.size() == 4);
  // Losses 1..5 average to 3; 16..20 to 18.
  CHECK_THAT(lines[0], Catch::StartsWith("worker.0: step=5 last_step=20 loss=3.0000 steps_per_sec="));
  CHECK_THAT(lines[0], Catch::EndsWith(" lr=0.1"));
  CHECK_THAT(lines[3], Catch::StartsWith("worker.0: step=20 last_step=20 loss=18.0000 "));
}

TEST_CASE("the NaN and logging hooks read losses that land late, by the steps they belong to", "[session][hooks]") {
  // A step that reads its losses through a ring: step k hands over the losses of the steps that
  // landed during it (here: every second step delivers two, the last step's one).
  auto landed = [](int step, double (*loss)(int)) {
    run_values v;
    if (step % 2 == 0)
      for (int k = step - 1; k <= step; ++k) v.landed_losses.emplace_back(k, loss(k));
    return v;
  };
  SECTION("NaN: named by its own step, seen when it lands") {
    monitored_training_session s;
    s.add_hook(hooks::nan_tensor());
    int steps = 0;
    try {
      s.train([&](run_context&) { return landed(++steps, [](int k) { return k == 5 ? std::numeric_limits<double>::quiet_NaN() : 0.5; }); });
      FAIL("no exception");
    } catch (const hooks::nan_loss_error& e) {
      CHECK(e.step() == 5);  // landed at step 6
    }
    CHECK(steps == 6);
  }
  SECTION("logging: the mean of the losses that landed since the previous line") {
    std::vector<std::string> lines;
    monitored_training_session s;
    auto& stop = s.add_hook(hooks::stop_at_step({.num_steps = 8}));
    s.add_hook(hooks::logging({.every_n_iter = 4, .stop = &stop, .sink = [&](const std::string& l) { lines.push_back(l); }}));
    int steps = 0;
    s.train([&](run_context&) { return landed(++steps, [](int k) { return double(k); }); });
    REQUIRE(lines.size() == 2);
    CHECK_THAT(lines[0], Catch::StartsWith("step=4 last_step=8 loss=2.5000 "));  // 1..4
    CHECK_THAT(lines[1], Catch::StartsWith("step=8 last_step=8 loss=6.5000 "));  // 5..8
  }
}

TEST_CASE("logging counts this task's iterations, reporting the global step", "[session][hooks]") {
  std::vector<std::string> lines;
  monitored_training_session s({.scaffold = {.restore = [] { return std::optional<std::int64_t>(30); }}});
  s.add_hook(hooks::stop_at_step({.num_steps = 12}));
  s.add_hook(hooks::logging({.every_n_iter = 2, .at_end = true, .sink = [&](const std::string& l) { lines.push_back(l); }}));
  std::int64_t g = 30;
  s.train([&](run_context&) {  // three workers: the global step advances by 3 per run here
    run_values v = step_loss(1.0);
    v.global_step = g += 3;
    return v;
  });
  REQUIRE(lines.size() == 2);  // iterations 2 and 4; at the end nothing new to report
  CHECK_THAT(lines[0], Catch::StartsWith("step=36 loss=1.0000 steps_per_sec="));
  CHECK_THAT(lines[1], Catch::StartsWith("step=42 loss=1.0000 steps_per_sec="));
}

TEST_CASE("logging every few seconds, and at the end", "[session][hooks]") {
  std::vector<std::string> lines;
  monitored_training_session s;
  s.add_hook(hooks::stop_at_step({.last_step = 3}));
  // every_secs so small that every step after the first qualifies: the time path triggers.
  auto& h = s.add_hook(hooks::logging({.every_n_iter = 0, .every_secs = 1e-9, .last_step = 3, .at_end = true,
                                       .sink = [&](const std::string& l) { lines.push_back(l); }}));
  s.train([](run_context&) { return step_loss(0.25); });
  CHECK(h.lines() == std::int64_t(lines.size()));
  REQUIRE_FALSE(lines.empty());
  CHECK_THAT(lines.back(), Catch::StartsWith("step=3 last_step=3 loss=0.2500"));
}

TEST_CASE("step_counter measures global steps per second and writes them as summaries", "[session][hooks]") {
  const auto dir = fresh_dir("step_counter");
  auto writer = std::make_shared<summary_writer>(dir);
  monitored_training_session s;
  s.add_hook(hooks::stop_at_step({.last_step = 40}));
  auto& counter = s.add_hook(hooks::step_counter({.every_n_steps = 10, .writer = writer}));
  std::int64_t g = 0;
  s.train([&](run_context&) { return run_values{.global_step = g += 2, .examples = 8}; });  // two workers
  CHECK(counter.measurements() == 4);
  CHECK(counter.steps_per_sec() > 0);
  // 10 global steps are 5 of this task's runs: examples/s is 8*5 per (same) interval.
  CHECK(counter.examples_per_sec() == Approx(counter.steps_per_sec() * 4.0).epsilon(1e-9));
  writer->flush();
  const auto events = read_events(writer->path());
  REQUIRE(events.size() == 5);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[1].step == 10);
  CHECK(events[4].step == 40);
  REQUIRE(events[4].values.size() == 2);
  CHECK(events[4].values[1].tag == "global_step/sec");
  CHECK(*events[4].values[1].simple_value == Approx(counter.steps_per_sec()).epsilon(1e-6));
  fs::remove_all(dir);
}

TEST_CASE("summary_saver asks the step for summaries every N steps and writes them", "[session][hooks][summary]") {
  const auto dir = fresh_dir("summary_saver");
  monitored_training_session s;
  s.add_hook(hooks::stop_at_step({.last_step = 25}));
  auto& saver = s.add_hook(hooks::summary_saver({.every_n_steps = 10, .writer = std::make_shared<summary_writer>(dir)}));
  int requested = 0;
  s.train([&](run_context& ctx) {
    run_values v = step_loss(1.0 / double(ctx.global_step() + 1));
    v.scalars["learning_rate"] = 0.05;
    if (ctx.summaries_requested()) {
      ++requested;
      v.histograms["dense/w"] = {1, 2, 2, 3, 3, 3};
    }
    return v;
  });
  // Triggers for steps 1 (first), 11 and 21.
  CHECK(requested == 3);
  CHECK(saver.writes() == 3);
  const auto events = read_events(only_event_file(dir));
  REQUIRE(events.size() == 7);  // version + (scalars, histogram) x 3
  CHECK(events[1].step == 1);
  REQUIRE(events[1].values.size() == 2);
  CHECK(events[1].values[0].tag == "learning_rate");
  CHECK(*events[1].values[0].simple_value == Approx(0.05f));
  CHECK(events[1].values[1].tag == "loss");
  CHECK(*events[1].values[1].simple_value == Approx(1.0));
  CHECK(events[3].step == 11);
  CHECK(*events[3].values[1].simple_value == Approx(1.0 / 11));  // the step that ran at global step 10
  CHECK(events[6].step == 21);
  REQUIRE(events[6].values.size() == 1);
  CHECK(events[6].values[0].tag == "dense/w");
  const auto& h = *events[6].values[0].histo;
  CHECK(h.num == 6);
  CHECK(h.min == 1);
  CHECK(h.max == 3);
  CHECK(h.sum == 14);
  CHECK(h.sum_squares == 36);
  fs::remove_all(dir);
}

TEST_CASE("summary_saver writes the step's own loss when it lands through a ring", "[session][hooks][summary]") {
  const auto dir = fresh_dir("summary_saver_landed");
  monitored_training_session s;
  s.add_hook(hooks::stop_at_step({.last_step = 12}));
  s.add_hook(hooks::summary_saver({.every_n_steps = 10, .writer = std::make_shared<summary_writer>(dir)}));
  s.train([&](run_context& ctx) {
    run_values v;  // no loss of its own: earlier steps' and, when summaries are asked for, its own
    const std::int64_t step = ctx.global_step() + 1;
    v.landed_losses.emplace_back(step - 1, 100.0);
    if (ctx.summaries_requested()) v.landed_losses.emplace_back(step, double(step));
    return v;
  });
  const auto events = read_events(only_event_file(dir));
  REQUIRE(events.size() == 3);  // version + scalars at steps 1 and 11
  CHECK(events[1].step == 1);
  REQUIRE(events[1].values.size() == 1);
  CHECK(events[1].values[0].tag == "loss");
  CHECK(*events[1].values[0].simple_value == Approx(1.0));
  CHECK(events[2].step == 11);
  CHECK(*events[2].values[0].simple_value == Approx(11.0));
  fs::remove_all(dir);
}

TEST_CASE("global_step_waiter holds the run until the global step is reached", "[session][hooks]") {
  std::int64_t reads = 0;
  SECTION("reached after some polls") {
    monitored_training_session s({.is_chief = false, .scaffold = {.global_step = [&] { return 10 * reads++; }}});
    auto& w = s.add_hook(hooks::global_step_waiter({.wait_until_step = 50, .poll_ms = 1, .timeout_ms = 10000}));
    s.add_hook(hooks::stop_at_step({.num_steps = 1}));
    int steps = 0;
    s.train([&](run_context& ctx) {
      ++steps;
      CHECK(ctx.global_step() >= 50);
      return run_values{.global_step = ctx.global_step() + 1};
    });
    CHECK(steps == 1);
    CHECK(w.reached());
    CHECK(w.polls() == 4);  // 10, 20, 30, 40 read below the target (0 was read at create)
  }
  SECTION("a bounded wait") {
    monitored_training_session s({.scaffold = {.global_step = [] { return std::int64_t(3); }}});
    s.add_hook(hooks::global_step_waiter({.wait_until_step = 50, .poll_ms = 1, .timeout_ms = 20}));
    CHECK_THROWS_AS(s.run([](run_context&) { return run_values{}; }), error);
  }
  SECTION("a stop request ends the wait") {
    struct stop_now {
      void before_run(run_context& c) { c.request_stop(); }
    };
    monitored_training_session s({.scaffold = {.global_step = [] { return std::int64_t(3); }}});
    s.add_hook(stop_now{});
    s.add_hook(hooks::global_step_waiter({.wait_until_step = 50, .poll_ms = 1, .timeout_ms = 60000}));
    int steps = 0;
    s.run([&](run_context&) { ++steps; return run_values{}; });
    CHECK(steps == 0);
  }
}

TEST_CASE("final_ops runs once at a successful end only", "[session][hooks]") {
  SECTION("ok") {
    monitored_training_session s;
    s.add_hook(hooks::stop_at_step({.last_step = 4}));
    auto& f = s.add_hook(hooks::final_ops([](run_context& c) { return double(c.global_step()) * 0.5; }));
    s.train([](run_context&) { return run_values{}; });
    CHECK(f.ran());
    REQUIRE(f.value());
    CHECK(*f.value() == 2.0);
  }
  SECTION("error") {
    int calls = 0;
    monitored_training_session s;
    auto& f = s.add_hook(hooks::final_ops([&] { ++calls; }));
    CHECK_THROWS(s.run([](run_context&) -> run_values { throw std::runtime_error("x"); }));
    CHECK_FALSE(f.ran());
    CHECK(calls == 0);
  }
}

TEST_CASE("feed_fn stages every step's input and stops when it runs out", "[session][hooks]") {
  const std::vector<int> inputs = {3, 1, 4, 1, 5};
  std::size_t next = 0;
  int current = 0;
  monitored_training_session s;
  auto& feed = s.add_hook(hooks::feed_fn([&](run_context&) {
    if (next == inputs.size()) return false;
    current = inputs[next++];
    return true;
  }));
  int sum = 0, steps = 0;
  s.train([&](run_context&) {
    sum += current;
    ++steps;
    return run_values{};
  });
  CHECK(steps == 5);
  CHECK(sum == 14);
  CHECK(feed.feeds() == 5);
  CHECK(s.global_step() == 5);
}

TEST_CASE("step_timer triggers by steps or seconds", "[session][hooks]") {
  using clock = hooks::step_timer::clock;
  const auto t0 = clock::now();
  hooks::step_timer by_steps(10, 0);
  CHECK(by_steps.should_trigger(0, t0));
  CHECK_FALSE(by_steps.update(0, t0));
  CHECK_FALSE(by_steps.should_trigger(9, t0 + std::chrono::hours(1)));
  CHECK(by_steps.should_trigger(10, t0));
  const auto e = by_steps.update(12, t0 + std::chrono::seconds(3));
  REQUIRE(e);
  CHECK(e->steps == 12);
  CHECK(e->secs == Approx(3.0));
  hooks::step_timer by_secs(0, 2.0);
  by_secs.update(5, t0);
  CHECK_FALSE(by_secs.should_trigger(6, t0 + std::chrono::seconds(1)));
  CHECK(by_secs.should_trigger(6, t0 + std::chrono::seconds(2)));
  CHECK_FALSE(by_secs.should_trigger(5, t0 + std::chrono::seconds(9)));  // same step
  CHECK_FALSE(hooks::step_timer(0, 0).should_trigger(1, t0));
  CHECK_THROWS_AS(hooks::step_timer(-1, 0), error);
}

// --- the event-file writer --------------------------------------------------------------

TEST_CASE("crc32c matches the Castagnoli check value, and the mask is TFRecord's", "[summary]") {
  const char* text = "123456789";
  const auto bytes = std::as_bytes(std::span<const char>(text, 9));
  CHECK(detail::crc32c(bytes) == 0xE3069283u);
  CHECK(detail::crc32c(bytes.subspan(4), detail::crc32c(bytes.first(4))) == 0xE3069283u);
  const std::uint32_t c = 0xE3069283u;
  CHECK(detail::masked_crc32c(bytes) == ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST_CASE("proto_writer encodes varints, negative int64 and fixed fields as protobuf does", "[summary]") {
  detail::proto_writer w;
  w.int64_field(2, 300);
  w.int64_field(2, -1);
  w.float_field(2, 1.0f);
  const auto b = w.bytes();
  const std::vector<unsigned> got(reinterpret_cast<const unsigned char*>(b.data()),
                                  reinterpret_cast<const unsigned char*>(b.data()) + b.size());
  const std::vector<unsigned> expected = {0x10, 0xAC, 0x02,                                            // 300
                                          0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01,  // -1
                                          0x15, 0x00, 0x00, 0x80, 0x3F};                               // 1.0f
  CHECK(got == expected);
}

TEST_CASE("histogram_summary buckets finite values between min and max", "[summary]") {
  const std::vector<float> v = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, std::nanf(""), 4.0f};
  const auto h = histogram_summary::of(v, 4);
  CHECK(h.num == 6);
  CHECK(h.min == 0);
  CHECK(h.max == 4);
  CHECK(h.sum == 14);
  CHECK(h.sum_squares == 46);
  CHECK(h.bucket_limit == std::vector<double>{1, 2, 3, 4});
  CHECK(h.bucket == std::vector<double>{2, 1, 1, 2});  // [0,1], (1,2], (2,3], (3,4]
  const auto one = histogram_summary::of(std::vector<float>{7, 7}, 30);
  CHECK(one.bucket_limit == std::vector<double>{7});
  CHECK(one.bucket == std::vector<double>{2});
  CHECK(histogram_summary::of(std::vector<float>{}, 30).num == 0);
}

TEST_CASE("summary_writer files are named for TensorBoard and never shared between writers", "[summary]") {
  const auto dir = fresh_dir("writer");
  summary_writer a(dir / "run");
  summary_writer b(dir / "run");
  CHECK(a.path() != b.path());
  CHECK(a.path().filename().string().rfind("events.out.tfevents.", 0) == 0);
  a.add_scalar("x", 2.5, -3);
  a.flush();
  const auto events = read_events(a.path());
  REQUIRE(events.size() == 2);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].wall_time > 1.6e9);
  CHECK(events[1].step == -3);
  CHECK(events[1].values[0].tag == "x");
  CHECK(*events[1].values[0].simple_value == 2.5f);
  fs::remove_all(dir);
  // A directory that cannot be created names itself.
  std::ofstream(fs::temp_directory_path() / "dtf_test_session_file") << "x";
  CHECK_THROWS_WITH(summary_writer(fs::temp_directory_path() / "dtf_test_session_file" / "sub"),
                    Catch::Contains("dtf_test_session_file"));
  fs::remove(fs::temp_directory_path() / "dtf_test_session_file");
}
