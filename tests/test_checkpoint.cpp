// Checkpoints: ps save/restore with slots, update counts and the global step; resharding
// between different numbers of ps tasks; crash safety of a save; checksums; max_to_keep; .npy.
#include <catch2/catch.hpp>

#include <dtf/checkpoint.hpp>
#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/hooks/stop_at_step.hpp>
#include <dtf/nn/init.hpp>
#include <dtf/ps.hpp>
#include <dtf/recovery.hpp>

#include "checkpoint_helpers.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>
#include <fstream>
#include <map>
#include <memory>
#include <random>

namespace fs = std::filesystem;
using namespace dtf;
using namespace dtf::test::ckpt;

namespace {
std::vector<fs::path> files_starting(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  return out;
}

// Each shard's update count as its ps's file header records it, by shard id (the files read
// as the reader checks them: size, SHA-256, header).
std::map<std::uint32_t, std::int64_t> header_iterations(const fs::path& dir, const checkpoint_manifest& m) {
  std::map<std::uint32_t, std::int64_t> out;
  for (const auto& f : m.files) {
    const auto in = detail::ckpt::input_file::open(dir / f.name);
    const auto text = detail::ckpt::verified_header_text(in, f);
    const auto h = detail::ckpt::parse_shard_header(text, in.size(), f.ps, m.num_ps, m.num_slots, in.what());
    // Written last over the length reserved for the widest counts: padded with spaces.
    if (!h.entries.empty()) CHECK(text.back() == ' ');
    for (const auto& e : h.entries) out[e.id] = e.iterations;
  }
  return out;
}

// Pushes `steps` seeded gradients to the ps and applies them to `values` with `reference` (the
// rules are elementwise: one optimiser over the whole buffer is every shard's).
void train_alongside(ps_client& ps, optim::optimizer<optim::host_space>& reference, std::vector<float>& values,
                     std::uint64_t steps, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < steps; ++i) {
    const auto g = seeded(values.size(), seed + i);
    ps.push_gradients(g);
    reference.apply(values, g);
  }
}

// Elements [offset, offset + size) of `v`.
std::vector<float> slice(const std::vector<float>& v, std::size_t offset, std::size_t size) {
  return {v.begin() + std::ptrdiff_t(offset), v.begin() + std::ptrdiff_t(offset + size)};
}
// ps.`index` on loopback (checkpointing into `checkpoint_dir` when given), served on a thread.
// restart() is a crash and a restart: it stops the ps (its connections close) and starts an empty
// one on the same port.
class served_ps {
 public:
  explicit served_ps(std::size_t index, std::string checkpoint_dir = {})
      : index_(index), checkpoint_dir_(std::move(checkpoint_dir)) {
    start(0);
  }
  served_ps(const served_ps&) = delete;
  served_ps& operator=(const served_ps&) = delete;
  ~served_ps() { stop(); }
  void restart() {
    stop();
    start(port_);
  }
  void stop() {
    if (!ps_) return;
    ps_->stop();
    serve_.join();
    ps_.reset();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void start(std::uint16_t port) {
    ps_options o{test::opts("ps." + std::to_string(index_))};
    o.transport.log = [](const std::string&) {};
    if (!checkpoint_dir_.empty()) o.checkpoint_dir = checkpoint_dir_;
    ps_ = std::make_unique<parameter_server>("127.0.0.1:" + std::to_string(port), o);
    port_ = ps_->port();
    serve_ = std::thread([p = ps_.get()] { p->run(); });
  }
  std::size_t index_;
  std::string checkpoint_dir_;
  std::unique_ptr<parameter_server> ps_;
  std::uint16_t port_ = 0;
  std::thread serve_;
};

// Two served_ps and their addresses.
struct two_ps {
  explicit two_ps(const std::string& checkpoint_dir = {}) : ps0(0, checkpoint_dir), ps1(1, checkpoint_dir) {}
  served_ps ps0, ps1;
  std::vector<std::string> addr{ps0.address(), ps1.address()};
};
}  // namespace

TEST_CASE("a checkpoint restores values, Adam's moments and t, and the global step exactly", "[checkpoint]") {
  temp_dir dir("roundtrip");
  const auto vars = model_vars();
  const optim::rule rule = optim::adam{.learning_rate = 0.05f};
  cluster_of a(dir.path.string(), place_on(2));
  a.client->initialize(seeded(num_parameters(vars), 1), {rule});
  train(*a.client, 5, 100);
  const auto saved = pull_all(*a.client);
  const auto m = save_checkpoint(*a.client, {dir.path.string(), "ckpt", 3}, vars);
  CHECK(m.name == "ckpt-5");
  CHECK(m.global_step == 5);
  CHECK(m.rule == "adam");
  CHECK(m.num_slots == 2);
  REQUIRE(m.files.size() == 2);
  CHECK(latest_checkpoint(dir.path) == std::optional<std::string>("ckpt-5"));
  for (const auto& v : m.variables) CHECK(v.iterations == 5);

  cluster_of b(dir.path.string(), place_on(2));
  CHECK_FALSE(b.client->ready());
  const auto step = restore_latest(*b.client, dir.path.string(), vars, {rule});
  REQUIRE(step == std::optional<std::int64_t>(5));
  CHECK(b.client->ready());
  CHECK(b.client->global_step() == 5);
  CHECK(pull_all(*b.client) == saved);
  // Same moments and t: the next updates agree bit for bit with the run that saved.
  train(*a.client, 3, 500);
  train(*b.client, 3, 500);
  CHECK(pull_all(*b.client) == pull_all(*a.client));
  CHECK(b.client->global_step() == a.client->global_step());
}

TEST_CASE("a checkpoint saved by 2 ps restores into 1 and into 3 ps, and 1 into 3, with exact values",
          "[checkpoint][reshard]") {
  temp_dir dir("reshard");
  const auto vars = model_vars();
  const optim::rule rule = optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f};
  cluster_of two(dir.path.string(), place_on(2));
  two.client->initialize(seeded(num_parameters(vars), 2), {rule});
  train(*two.client, 4, 200);
  const auto saved = pull_all(*two.client);
  save_checkpoint(*two.client, {dir.path.string(), "two", 0}, vars);

  cluster_of one(dir.path.string(), partitioners::round_robin{}.place(vars, 1));
  REQUIRE(restore_checkpoint(*one.client, dir.path.string(), "two-4", vars, {rule}) == 4);
  CHECK(pull_all(*one.client) == saved);
  cluster_of three(dir.path.string(), place_on(3, 3));
  REQUIRE(restore_checkpoint(*three.client, dir.path.string(), "two-4", vars, {rule}) == 4);
  CHECK(pull_all(*three.client) == saved);
  // The momentum slots were resharded too: training continues identically everywhere.
  train(*two.client, 2, 300);
  train(*one.client, 2, 300);
  train(*three.client, 2, 300);
  const auto reference = pull_all(*two.client);
  CHECK(pull_all(*one.client) == reference);
  CHECK(pull_all(*three.client) == reference);

  // 1 -> 3.
  save_checkpoint(*one.client, {dir.path.string(), "one", 0}, vars);
  cluster_of three_again(dir.path.string(), place_on(3, 2));
  REQUIRE(restore_checkpoint(*three_again.client, dir.path.string(), "one-6", vars, {rule}) == 6);
  CHECK(pull_all(*three_again.client) == pull_all(*one.client));
  train(*one.client, 1, 400);
  train(*three_again.client, 1, 400);
  CHECK(pull_all(*three_again.client) == pull_all(*one.client));
}

TEST_CASE("a ps that holds no shard writes an empty shard file, and Adam's slots still restore", "[checkpoint][reshard]") {
  temp_dir dir("empty");
  const auto vars = model_vars();
  const optim::rule rule = optim::adam{.learning_rate = 0.01f};
  cluster_of five(dir.path.string(), partitioners::round_robin{}.place(vars, 5));  // 4 variables: ps.4 holds nothing
  five.client->initialize(seeded(num_parameters(vars), 8), {rule});
  train(*five.client, 3, 1600);
  const auto m = save_checkpoint(*five.client, {dir.path.string(), "ckpt", 0}, vars);
  CHECK(m.files.size() == 5);
  CHECK(m.num_slots == 2);
  CHECK_NOTHROW(verify_checkpoint(dir.path, m.name));
  cluster_of two(dir.path.string(), place_on(2));
  REQUIRE(restore_latest(*two.client, dir.path.string(), vars, {rule}) == std::optional<std::int64_t>(3));
  CHECK(pull_all(*two.client) == pull_all(*five.client));
  train(*five.client, 2, 1700);
  train(*two.client, 2, 1700);
  CHECK(pull_all(*two.client) == pull_all(*five.client));
}

TEST_CASE("a save that dies part-way through a shard file leaves the previous checkpoint the latest and intact",
          "[checkpoint][crash]") {
  temp_dir dir("crash");
  const auto vars = model_vars();
  const optim::rule rule = optim::adagrad{.learning_rate = 0.1f};
  cluster_of a(dir.path.string(), place_on(2), {checkpoint_fault{}, checkpoint_fault{.abort_after_bytes = 100}});
  a.client->initialize(seeded(num_parameters(vars), 3), {rule});
  train(*a.client, 2, 600);
  // ps.1's file is larger than 100 bytes, so every save of this cluster dies in the middle of
  // it; the first checkpoint comes from a healthy cluster restored from the same state.
  cluster_of healthy(dir.path.string(), place_on(2));
  healthy.client->initialize(seeded(num_parameters(vars), 3), {rule});
  train(*healthy.client, 2, 600);
  const auto good = pull_all(*healthy.client);
  save_checkpoint(*healthy.client, {dir.path.string(), "ckpt", 5}, vars);
  REQUIRE(latest_checkpoint(dir.path) == std::optional<std::string>("ckpt-2"));

  train(*a.client, 2, 700);
  try {
    save_checkpoint(*a.client, {dir.path.string(), "ckpt", 5}, vars);
    FAIL("the save should have failed");
  } catch (const error& e) {
    CHECK(std::string(e.what()).find("fault injection") != std::string::npos);
  }
  // On disk: ps.0's complete shard of ckpt-4, ps.1's half-written temporary file (its random
  // suffix after ".tmp."), no manifest.
  CHECK(fs::exists(dir.path / "ckpt-4.ps-0-of-2.shard"));
  const auto temporaries = files_starting(dir.path, "ckpt-4.ps-1-of-2.shard.tmp.");
  REQUIRE(temporaries.size() == 1);
  CHECK(fs::file_size(temporaries.front()) == 100);
  CHECK_FALSE(fs::exists(dir.path / "ckpt-4.manifest.json"));
  CHECK(latest_checkpoint(dir.path) == std::optional<std::string>("ckpt-2"));
  CHECK_NOTHROW(verify_checkpoint(dir.path, "ckpt-2"));
  cluster_of b(dir.path.string(), place_on(2));
  REQUIRE(restore_latest(*b.client, dir.path.string(), vars, {rule}) == std::optional<std::int64_t>(2));
  CHECK(pull_all(*b.client) == good);
  // The next successful save sweeps the debris away.
  save_checkpoint(*healthy.client, {dir.path.string(), "ckpt", 5}, vars, 6);
  CHECK(latest_checkpoint(dir.path) == std::optional<std::string>("ckpt-6"));
  CHECK_NOTHROW(verify_checkpoint(dir.path, "ckpt-6"));
  CHECK_NOTHROW(verify_checkpoint(dir.path, "ckpt-2"));
  CHECK_FALSE(fs::exists(dir.path / "ckpt-4.ps-0-of-2.shard"));
  CHECK(files_starting(dir.path, "ckpt-4.").empty());
}

TEST_CASE("restore refuses a damaged checkpoint, naming the file", "[checkpoint][errors]") {
  temp_dir dir("corrupt");
  const auto vars = model_vars();
  cluster_of a(dir.path.string(), place_on(2));
  a.client->initialize(seeded(num_parameters(vars), 4), {optim::sgd{}});
  save_checkpoint(*a.client, {dir.path.string(), "ckpt", 5}, vars, 1);
  const auto shard = dir.path / "ckpt-1.ps-1-of-2.shard";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  cluster_of b(dir.path.string(), place_on(2));
  try {
    restore_latest(*b.client, dir.path.string(), vars, {optim::sgd{}});
    FAIL("restore should have refused the damaged file");
  } catch (const error& e) {
    CHECK(e.code() == make_error_code(errc::corrupt_data));
    CHECK(std::string(e.what()).find("ckpt-1.ps-1-of-2.shard: SHA-256") != std::string::npos);
  }
  CHECK_FALSE(b.client->ready());
  fs::resize_file(shard, fs::file_size(shard) - 4);
  CHECK_THROWS_WITH(verify_checkpoint(dir.path, "ckpt-1"), Catch::Contains("the manifest says"));
  fs::remove(shard);
  CHECK_THROWS_WITH(verify_checkpoint(dir.path, "ckpt-1"), Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(verify_checkpoint(dir.path, "ckpt-9"), Catch::Contains("has no manifest"));
}

TEST_CASE("restore names a variable the checkpoint lacks, a changed shape and another rule's slots",
          "[checkpoint][errors]") {
  temp_dir dir("mismatch");
  const auto vars = model_vars();
  cluster_of a(dir.path.string(), place_on(1));
  a.client->initialize(seeded(num_parameters(vars), 5), {optim::adam{}});
  train(*a.client, 1, 50);
  save_checkpoint(*a.client, {dir.path.string(), "ckpt", 5}, vars);
  cluster_of b(dir.path.string(), place_on(1));
  auto renamed = vars;
  renamed[1].name = "dense_0/b";
  CHECK_THROWS_WITH(restore_latest(*b.client, dir.path.string(), renamed, {optim::adam{}}),
                    Catch::Contains("has no variable 'dense_0/b'"));
  auto reshaped = vars;
  reshaped[2].shape = {2, 5};
  CHECK_THROWS_WITH(restore_latest(*b.client, dir.path.string(), reshaped, {optim::adam{}}),
                    Catch::Contains("'dense_1/kernel' is [5, 2] in checkpoint ckpt-1 but [2, 5] in the model"));
  CHECK_THROWS_WITH(restore_latest(*b.client, dir.path.string(), vars, {optim::momentum{}}),
                    Catch::Contains("slots of rule adam"));
  // Plain SGD has no slots: it may start from any checkpoint's values.
  CHECK(restore_latest(*b.client, dir.path.string(), vars, {optim::sgd{}}) == std::optional<std::int64_t>(1));
}

TEST_CASE("max_to_keep prunes the oldest checkpoints and their files", "[checkpoint]") {
  temp_dir dir("keep");
  const auto vars = model_vars();
  cluster_of a(dir.path.string(), place_on(2));
  a.client->initialize(seeded(num_parameters(vars), 6), {optim::sgd{}});
  for (int i = 0; i < 4; ++i) {
    train(*a.client, 1, 800 + std::uint64_t(i));
    save_checkpoint(*a.client, {dir.path.string(), "ckpt", 2}, vars);
  }
  const auto state = read_checkpoint_state(dir.path);
  REQUIRE(state);
  CHECK(state->latest == "ckpt-4");
  CHECK(state->all == std::vector<std::string>{"ckpt-3", "ckpt-4"});
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    ++files;
    const auto name = e.path().filename().string();
    CHECK((name == "checkpoint" || name.rfind("ckpt-3.", 0) == 0 || name.rfind("ckpt-4.", 0) == 0));
  }
  CHECK(files == 1 + 2 * 3);
  for (const auto& n : state->all) CHECK_NOTHROW(verify_checkpoint(dir.path, n));
  // Files of other prefixes, and names that only look alike, are not touched.
  std::ofstream(dir.path / "ckpt-notes.txt") << "mine";
  std::ofstream(dir.path / "other-1.manifest.json") << "{}";
  save_checkpoint(*a.client, {dir.path.string(), "ckpt", 2}, vars, 9);
  CHECK(fs::exists(dir.path / "ckpt-notes.txt"));
  CHECK(fs::exists(dir.path / "other-1.manifest.json"));
  CHECK_FALSE(fs::exists(dir.path / "ckpt-3.manifest.json"));
}

TEST_CASE("a restored synchronous ps continues at the saved global step", "[checkpoint][sync]") {
  temp_dir dir("sync");
  const auto vars = model_vars();
  cluster_of a(dir.path.string(), place_on(2));
  a.client->initialize(seeded(num_parameters(vars), 7), {optim::sgd{.learning_rate = 0.5f}, apply_mode::locked, 1});
  const auto n = num_parameters(vars);
  for (std::int64_t s = 0; s < 3; ++s) a.client->push_sync(seeded(n, 900 + std::uint64_t(s)), s);
  save_checkpoint(*a.client, {dir.path.string(), "ckpt", 5}, vars);
  cluster_of b(dir.path.string(), place_on(1));
  REQUIRE(restore_latest(*b.client, dir.path.string(), vars, {optim::sgd{.learning_rate = 0.5f}, apply_mode::locked, 1}) ==
          std::optional<std::int64_t>(3));
  const auto r = b.client->push_sync(seeded(n, 903), 3);
  CHECK_FALSE(r.dropped);
  CHECK(r.global_step == 4);
  a.client->push_sync(seeded(n, 903), 3);
  CHECK(pull_all(*b.client) == pull_all(*a.client));
}

TEST_CASE("every shard file's step is checked against the checkpoint's, whether or not the manifest says "
          "synchronous", "[checkpoint][sync][errors]") {
  temp_dir dir("mixed_steps");
  const std::string d = dir.path.string();
  const auto vars = model_vars();
  const auto n = num_parameters(vars);
  const ps_config sync{optim::sgd{.learning_rate = 0.5f}, apply_mode::locked, 1};
  const auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const auto refused = [&](const std::string& name, const std::string& file, const std::string& steps) {
    cluster_of b(d, place_on(2));
    for (const auto& what : {error_of([&] { verify_checkpoint(d, name); }),  // what dtf-ckpt verify runs
                             error_of([&] { restore_checkpoint(*b.client, d, name, vars, sync); }),
                             error_of([&] {
                               restore_checkpoint(*b.client, d, name, vars, sync, {}, restore_transfer::ps_reads_files);
                             })})
      CHECK_THAT(what, Catch::Contains(file) && Catch::Contains("header.global_step") && Catch::Contains(steps));
    CHECK_FALSE(b.client->ready());
  };
  SECTION("synchronous: every file of the saved step; one of another step is refused, flag or no flag") {
    cluster_of a(d, place_on(2));
    a.client->initialize(seeded(n, 7), sync);
    for (std::int64_t s = 0; s < 3; ++s) a.client->push_sync(seeded(n, 900 + std::uint64_t(s)), s);
    const auto m = save_checkpoint(*a.client, {d, "ckpt", 5}, vars);
    REQUIRE(m.synchronous);
    CHECK(verify_checkpoint(d, m.name).global_step == 3);
    // ps.1's file of step 2 (as from an earlier save), the manifest's flag removed.
    set_shard_step(dir.path, m, 1, 2, [](nlohmann::json& j) { j.erase("synchronous"); });
    refused(m.name, m.files[1].name, "holds step 2, the checkpoint's is 3 (a synchronous save is of one step)");
  }
  SECTION("asynchronous: ps 0 holds the step, another ps the step of the last init or restore") {
    cluster_of a(d, place_on(2));
    a.client->initialize(seeded(n, 7), {optim::sgd{}});
    train(*a.client, 4, 300);
    const auto m = save_checkpoint(*a.client, {d, "ckpt", 4}, vars);
    REQUIRE_FALSE(m.synchronous);
    REQUIRE(m.global_step == 4);
    const auto steps = [&] {  // each file's step, as its header records it
      std::vector<std::int64_t> out;
      for (const auto& f : m.files) {
        const auto in = detail::ckpt::input_file::open(dir.path / f.name);
        out.push_back(detail::ckpt::parse_shard_header(detail::ckpt::verified_header_text(in, f), in.size(), f.ps,
                                                       m.num_ps, m.num_slots, in.what())
                          .global_step);
      }
      return out;
    };
    CHECK(steps() == std::vector<std::int64_t>{4, 0});  // legitimately different steps: it verifies
    CHECK_NOTHROW(verify_checkpoint(d, m.name));
    // Restored at 4, trained 2 more: ps.1 keeps 4, ps 0 is at 6.
    cluster_of b(d, place_on(2));
    REQUIRE(restore_latest(*b.client, d, vars, {optim::sgd{}}) == std::optional<std::int64_t>(4));
    train(*b.client, 2, 400);
    const auto later = save_checkpoint(*b.client, {d, "later", 6}, vars);
    CHECK(later.global_step == 6);
    CHECK_NOTHROW(verify_checkpoint(d, later.name));
    // ps 0's file not of the checkpoint's step, or another's past it: refused.
    set_shard_step(dir.path, later, 0, 5);
    refused(later.name, later.files[0].name, "holds step 5, the checkpoint's is 6 (ps 0 holds the global step)");
    set_shard_step(dir.path, later, 0, 6);  // as saved again
    CHECK_NOTHROW(verify_checkpoint(d, later.name));
    set_shard_step(dir.path, later, 1, 7);
    refused(later.name, later.files[1].name, "holds step 7, the checkpoint's is 6 (a ps's step is never past ps 0's)");
  }
}

TEST_CASE("write_npy writes a NumPy 1.0 header and the raw float32 data", "[checkpoint][npy]") {
  temp_dir dir("npy");
  const std::vector<float> data{1.0f, -2.5f, 3.25f, 0.0f, 5.0f, 6.0f};
  write_npy(dir.path / "a.npy", {2, 3}, data);
  write_npy(dir.path / "b.npy", {6}, data);
  write_npy(dir.path / "c.npy", {}, std::span<const float>(data).first(1));
  auto read = [&](const char* name) {
    std::ifstream in(dir.path / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto a = read("a.npy");
  REQUIRE(a.size() >= 10);
  CHECK(a.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t hlen = std::uint8_t(a[8]) | (std::size_t(std::uint8_t(a[9])) << 8);
  CHECK((10 + hlen) % 64 == 0);
  CHECK(a.substr(10, hlen).find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") == 0);
  CHECK(a[10 + hlen - 1] == '\n');
  REQUIRE(a.size() == 10 + hlen + data.size() * sizeof(float));
  CHECK(std::memcmp(a.data() + 10 + hlen, data.data(), data.size() * sizeof(float)) == 0);
  CHECK(read("b.npy").find("'shape': (6,), }") != std::string::npos);
  CHECK(read("c.npy").find("'shape': (), }") != std::string::npos);
  CHECK_THROWS_AS(write_npy(dir.path / "d.npy", {4}, data), error);
}

TEST_CASE("checkpoint_saver saves at start, every N steps and at the end, and the ps scaffold resumes from it",
          "[checkpoint][hooks]") {
  temp_dir dir("hook");
  const auto vars = model_vars();
  const optim::rule rule = optim::momentum{.learning_rate = 0.05f};
  const auto n = num_parameters(vars);
  const checkpoint_options ck{dir.path.string(), "model", 3};
  std::vector<std::int64_t> before, after;
  int begun = 0, ended = 0;
  std::vector<float> final_values;
  {
    cluster_of a(dir.path.string(), place_on(2));
    bool initialised = false;
    monitored_training_session s({.is_chief = true,
                                  .scaffold = ps_scaffold(*a.client, {.checkpoint_dir = dir.path.string(),
                                                                      .variables = vars,
                                                                      .config = {rule},
                                                                      .init = [&] {
                                                                        a.client->initialize(seeded(n, 11), {rule});
                                                                        initialised = true;
                                                                      }})});
    s.add_hook(hooks::stop_at_step({.last_step = 10}));
    auto& saver = s.add_chief_hook(hooks::checkpoint_saver::for_ps(
        *a.client, vars, ck,
        {.every_n_steps = 4,
         .every_secs = 0,
         .listeners = {{.begin = [&] { ++begun; },
                        .before_save = [&](std::int64_t st) { before.push_back(st); },
                        .after_save = [&](std::int64_t st, const checkpoint_manifest& m) {
                          after.push_back(m.global_step);
                          CHECK(m.name == "model-" + std::to_string(st));
                          return false;
                        },
                        .end = [&](std::int64_t) { ++ended; }}}}));
    std::uint64_t seed = 1000;
    CHECK(s.train([&](run_context&) {
      return run_values{.global_step = a.client->push_gradients(seeded(n, seed++)).global_step};
    }) == 10);
    CHECK(initialised);
    CHECK(saver.saves() == 4);
    final_values = pull_all(*a.client);
  }
  CHECK(begun == 1);
  CHECK(ended == 1);
  CHECK(before == std::vector<std::int64_t>{0, 4, 8, 10});
  CHECK(after == std::vector<std::int64_t>{0, 4, 8, 10});
  const auto state = read_checkpoint_state(dir.path);
  REQUIRE(state);
  CHECK(state->all == std::vector<std::string>{"model-4", "model-8", "model-10"});

  // A new run (one ps now) resumes at step 10 from the checkpoint and stops at once.
  cluster_of b(dir.path.string(), place_on(1));
  std::vector<float> restored;
  monitored_training_session s({.is_chief = true,
                                .scaffold = ps_scaffold(*b.client, {.checkpoint_dir = dir.path.string(),
                                                                    .variables = vars,
                                                                    .config = {rule},
                                                                    .init = [] { FAIL("init despite a checkpoint"); },
                                                                    .restored = [&](std::span<const float> v) {
                                                                      restored.assign(v.begin(), v.end());
                                                                    }})});
  s.add_hook(hooks::stop_at_step({.last_step = 12}));
  auto& saver = s.add_chief_hook(hooks::checkpoint_saver::for_ps(
      *b.client, vars, ck,
      {.every_n_steps = 0,
       .every_secs = 0,
       .listeners = {{.after_save = [](std::int64_t st, const checkpoint_manifest&) { return st >= 11; }}}}));
  std::uint64_t seed = 2000;
  s.create();
  CHECK(s.global_step() == 10);
  CHECK(restored == final_values);
  CHECK(pull_all(*b.client) == final_values);
  s.train([&](run_context&) { return run_values{.global_step = b.client->push_gradients(seeded(n, seed++)).global_step}; });
  CHECK(s.global_step() == 12);
  // Saved at start (10) and at the end (12); no interval.
  CHECK(saver.saves() == 2);
  CHECK(latest_checkpoint(dir.path) == std::optional<std::string>("model-12"));
}

TEST_CASE("after a ps restart the chief restores it from the latest checkpoint while a worker is held",
          "[checkpoint][recovery]") {
  temp_dir dir("recovery");
  const auto vars = model_vars();
  const auto n = num_parameters(vars);
  const optim::rule rule = optim::adagrad{.learning_rate = 0.1f};
  const auto layout = place_on(1);
  served_ps ps(0, dir.path.string());
  const std::vector<std::string> addr{ps.address()};
  ps_client chief(addr, layout, test::opts("chief.0"));
  ps_client worker(addr, layout, test::opts("worker.0"));
  chief.connect();
  worker.connect();
  chief.initialize(seeded(n, 21), {rule});
  train(chief, 3, 1100);
  const auto at_save = pull_all(chief);
  save_checkpoint(chief, {dir.path.string(), "ckpt", 2}, vars);
  train(chief, 2, 1200);  // progress after the checkpoint, lost with the ps

  // The ps dies (its connections close) and comes back empty on the same port.
  ps.restart();

  std::vector<std::string> log;
  std::mutex log_mu;
  auto logger = [&](const std::string& l) {
    std::lock_guard g(log_mu);
    log.push_back(l);
  };
  int worker_after = 0;
  std::vector<float> worker_values(n);
  std::thread w([&] {
    ps_recovery rec(worker, false, {}, {.ready_timeout = std::chrono::milliseconds(5000), .log = logger},
                    [&] { ++worker_after; });
    rec.run([&] { return worker.pull(worker_values); });
  });
  ps_recovery rec(
      chief, true, [&] { REQUIRE(restore_latest(chief, dir.path.string(), vars, {rule})); },
      {.log = logger});
  std::vector<float> chief_values(n);
  const auto step = rec.run([&] { return chief.pull(chief_values); });
  w.join();
  CHECK(step == 3);
  CHECK(rec.recoveries() == 1);
  CHECK(rec.reinitialisations() == 1);
  CHECK(worker_after == 1);
  CHECK(chief_values == at_save);
  CHECK(worker_values == at_save);
  // Adagrad's accumulators came back too: the next update matches one from the checkpoint.
  cluster_of reference(dir.path.string(), layout);
  restore_latest(*reference.client, dir.path.string(), vars, {rule});
  train(chief, 1, 1300);
  train(*reference.client, 1, 1300);
  CHECK(pull_all(chief) == pull_all(*reference.client));
  // Errors that are not a lost peer are not retried.
  int calls = 0;
  CHECK_THROWS_WITH(rec.run([&] {
    ++calls;
    std::vector<float> small(3);
    return chief.pull(small);
  }),
                    Catch::Contains("buffer of 3 floats"));
  CHECK(calls == 1);
  ps.stop();
}

TEST_CASE("when one of two ps restarts, the chief restores both from the latest checkpoint",
          "[checkpoint][recovery]") {
  temp_dir dir("recovery2");
  const auto vars = model_vars();
  const auto n = num_parameters(vars);
  const optim::rule rule = optim::momentum{.learning_rate = 0.1f};
  const auto layout = place_on(2);
  two_ps servers(dir.path.string());
  const auto& addr = servers.addr;
  ps_client chief(addr, layout, test::opts("chief.0"));
  chief.connect();
  chief.initialize(seeded(n, 31), {rule});
  train(chief, 4, 1400);
  const auto at_save = pull_all(chief);
  save_checkpoint(chief, {dir.path.string(), "ckpt", 2}, vars);
  train(chief, 3, 1500);  // ps.0 keeps these updates, ps.1 loses them

  servers.ps1.restart();

  ps_recovery rec(chief, true, [&] { REQUIRE(restore_latest(chief, dir.path.string(), vars, {rule})); },
                  {.log = [](const std::string&) {}});
  std::vector<float> values(n);
  CHECK(rec.run([&] { return chief.pull(values); }) == 4);
  CHECK(rec.reinitialisations() == 1);
  // Both shards at the checkpoint's step: no mix of ps.0's newer values with ps.1's older ones.
  CHECK(values == at_save);
  servers.ps0.stop();
  servers.ps1.stop();
}

TEST_CASE("a worker that finished before its ps restarted still counts: the chief's wait for the workers ends",
          "[checkpoint][recovery]") {
  temp_dir dir("recovery_done");
  const auto vars = model_vars();
  const auto n = num_parameters(vars);
  const optim::rule rule = optim::sgd{.learning_rate = 0.1f};
  const auto layout = place_on(1);
  served_ps ps(0, dir.path.string());
  const std::vector<std::string> addr{ps.address()};
  ps_client chief(addr, layout, test::opts("chief.0"));
  ps_client worker(addr, layout, test::opts("worker.0"));
  chief.connect();
  worker.connect();
  chief.initialize(seeded(n, 41), {rule});
  train(chief, 2, 1600);
  save_checkpoint(chief, {dir.path.string(), "ckpt", 2}, vars);
  // The worker trains, reports done and exits; the chief's next step learns its name.
  train(worker, 2, 1700);
  worker.mark_done();
  CHECK(chief.done_tasks().empty());
  train(chief, 1, 1800);
  CHECK(chief.done_tasks() == std::set<std::string>{"worker.0"});

  // The ps dies and comes back empty: it no longer knows that worker.0 finished.
  ps.restart();
  ps_recovery rec(chief, true, [&] { REQUIRE(restore_latest(chief, dir.path.string(), vars, {rule})); },
                  {.log = [](const std::string&) {}});
  // The chief's finish: mark done, then wait (bounded) for both training tasks.
  rec.run([&] { chief.mark_done(); });
  CHECK(rec.reinitialisations() == 1);
  CHECK(rec.run([&] { return chief.wait_workers_done(2, std::chrono::seconds(10)); }) == 2);
  // The restarted ps itself knows both again (another client with no memory of its own sees them).
  ps_client observer(addr, layout, test::opts("worker.1"));
  observer.connect();
  CHECK(observer.workers_done() == 2);
  CHECK(observer.done_tasks() == std::set<std::string>{"chief.0", "worker.0"});
  ps.stop();
}

TEST_CASE("a task marked done on one ps is learnt from the other when that one restarts", "[checkpoint][recovery]") {
  const auto layout = place_on(2);
  two_ps servers;
  const auto& addr = servers.addr;
  ps_client worker(addr, layout, test::opts("worker.0"));
  worker.connect();
  worker.mark_done();
  // ps.0 (which holds the global step) restarts; ps.1 still knows.
  servers.ps0.restart();
  ps_client chief(addr, layout, test::opts("chief.0"));
  chief.connect();
  CHECK(chief.workers_done() == 1);
  CHECK(chief.done_tasks() == std::set<std::string>{"worker.0"});
  ps_client observer({addr[0]}, place_on(1), test::opts("worker.1"));
  observer.connect();
  CHECK(observer.workers_done() == 1);  // ps.0 learnt it from the chief's query
  servers.ps0.stop();
  servers.ps1.stop();
}

TEST_CASE("write_checkpoint saves one process's host buffers in the ps format: exact round trip, pruning",
          "[checkpoint]") {
  temp_dir dir("host");
  const auto vars = model_vars();
  const std::size_t n = num_parameters(vars);
  std::vector<float> values(n), m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    values[i] = 0.25f * float(i) - 3.0f;
    m[i] = 1e-3f * float(i);
    v[i] = 7.0f + float(i);
  }
  const checkpoint_options ck{.directory = dir.path.string(), .max_to_keep = 2};
  for (std::int64_t step : {10, 20, 30}) {
    values[0] = float(step);
    const auto man = write_checkpoint(ck, {.variables = vars, .values = values, .rule = "adam",
                                           .slots = {m, v}, .iterations = step + 1, .global_step = step});
    CHECK(man.name == "ckpt-" + std::to_string(step));
    CHECK(man.num_ps == 1);
    CHECK(man.files.size() == 1);
  }
  CHECK(latest_checkpoint(dir.path) == "ckpt-30");
  CHECK(read_checkpoint_state(dir.path)->all == std::vector<std::string>{"ckpt-20", "ckpt-30"});
  CHECK_FALSE(fs::exists(dir.path / "ckpt-10.manifest.json"));
  const auto t = read_checkpoint(dir.path, "ckpt-30");
  CHECK(t.manifest.global_step == 30);
  CHECK(t.manifest.rule == "adam");
  CHECK(t.manifest.variables.front().iterations == 31);
  std::vector<float> out(n), out_m(n), out_v(n);
  copy_into_layout(t, vars, out);
  copy_into_layout(t, vars, out_m, 0);
  copy_into_layout(t, vars, out_v, 1);
  CHECK(out == values);
  CHECK(out_m == m);
  CHECK(out_v == v);
  // A slot of the wrong size is refused before anything is written.
  std::vector<float> short_slot(n - 1);
  CHECK_THROWS_AS(write_checkpoint(ck, {.variables = vars, .values = values, .rule = "momentum",
                                        .slots = {short_slot}, .global_step = 40}),
                  dtf::error);
  CHECK(latest_checkpoint(dir.path) == "ckpt-30");
}

TEST_CASE("a ps with one I/O thread serves pulls while its checkpoint file is written", "[checkpoint][ps]") {
  temp_dir dir("save_thread");
  std::promise<void> release;
  const auto released = release.get_future().share();
  std::atomic<bool> writing{false};
  checkpoint_fault f;
  f.before_write = [&] {  // on the ps's save thread, before it copies a shard or writes a byte
    writing = true;
    released.wait();
  };
  const auto layout = place_on(1);
  cluster_of c(dir.path.string(), layout, {f});  // one ps, one I/O thread
  const auto init = seeded(num_parameters(model_vars()), 7);
  c.client->initialize(init, {optim::sgd{0.1f}});
  std::optional<checkpoint_manifest> saved;
  std::thread saver([&] { saved = save_checkpoint(*c.client, {.directory = dir.path.string()}, model_vars()); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!writing && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  REQUIRE(writing);
  // Another task's pull is answered while the save waits on its thread (it would wait for the
  // whole file on the I/O thread, and time out here, were the file written there).
  ps_client reader({"127.0.0.1:" + std::to_string(c.servers[0]->port())}, layout, dtf::test::opts("worker.1"));
  reader.connect();
  CHECK(pull_all(reader) == init);
  release.set_value();
  saver.join();
  REQUIRE(saved);
  const auto r = checkpoint_reader::open(dir.path, saved->name);
  std::vector<float> v(init.size());
  r.read(0, 0, v);
  CHECK(v == init);
}

TEST_CASE("a ps's file holds every shard's values, Adam's moments and t as a reference optimiser has them",
          "[checkpoint][ps]") {
  temp_dir dir("streamed_adam");
  const auto vars = model_vars();
  const auto n = num_parameters(vars);
  const optim::rule rule = optim::adam{.learning_rate = 0.05f};
  const auto layout = place_on(2, 3);  // 10 shards, 5 on each ps
  cluster_of c(dir.path.string(), layout);
  auto values = seeded(n, 21);
  c.client->initialize(values, {rule});
  optim::optimizer<optim::host_space> reference(rule, n);
  train_alongside(*c.client, reference, values, 4, 2100);
  REQUIRE(pull_all(*c.client) == values);  // the ps's state at the step saved
  const auto m = save_checkpoint(*c.client, {dir.path.string(), "ckpt", 0}, vars);
  const auto r = checkpoint_reader::open(dir.path, m.name);
  const auto slots = reference.host_slots();
  REQUIRE(slots.size() == 2);
  std::vector<float> out(n);
  r.read(0, 0, out);
  CHECK(out == values);
  for (std::size_t k = 0; k < 2; ++k) {
    r.read(k + 1, 0, out);
    CHECK(out == slots[k]);
  }
  const auto iterations = header_iterations(dir.path, m);
  REQUIRE(iterations.size() == layout.shards.size());
  for (const auto& [id, t] : iterations) CHECK(t == 4);
  // Restored, it trains on exactly as the reference does.
  cluster_of b(dir.path.string(), place_on(1));
  REQUIRE(restore_latest(*b.client, dir.path.string(), vars, {rule}) == std::optional<std::int64_t>(m.global_step));
  train_alongside(*b.client, reference, values, 1, 2200);
  CHECK(pull_all(*b.client) == values);
}

TEST_CASE("a ps's save copies one shard at a time as its file is written, each with the update count read with it",
          "[checkpoint][ps]") {
  temp_dir dir("one_shard_at_a_time");
  const auto vars = model_vars();
  const auto n = num_parameters(vars);
  const optim::rule rule = optim::momentum{.learning_rate = 0.1f, .momentum = 0.9f};
  const auto layout = place_on(1, 3);  // 10 shards of 1 to 9 floats on one ps
  // After the first shard is copied, a worker's push lands: every shard copied after it holds
  // that update (and its count), the first does not.
  const auto extra = seeded(n, 3300);
  std::unique_ptr<ps_client> worker;
  std::vector<std::uint64_t> held;  // the save's copy buffer, in bytes, after each shard's copy
  std::string failure;
  checkpoint_fault f;
  f.shard_copied = [&](std::uint64_t bytes) {  // on the ps's save thread
    held.push_back(bytes);
    if (held.size() != 1) return;
    try {
      worker->push_gradients(extra);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  };
  cluster_of c(dir.path.string(), layout, {f});
  worker = std::make_unique<ps_client>(std::vector<std::string>{"127.0.0.1:" + std::to_string(c.servers[0]->port())},
                                       layout, dtf::test::opts("worker.1"));
  worker->connect();
  auto values = seeded(n, 33);
  c.client->initialize(values, {rule});
  optim::optimizer<optim::host_space> reference(rule, n);
  train_alongside(*c.client, reference, values, 3, 3200);
  const auto before = values;
  const auto before_slot = reference.host_slots().at(0);
  reference.apply(values, extra);
  const auto after_slot = reference.host_slots().at(0);
  const auto m = save_checkpoint(*c.client, {dir.path.string(), "ckpt", 0}, vars);
  CHECK(failure.empty());
  // One copy buffer, grown to the largest shard's values and momentum, never more.
  std::uint64_t largest = 0;
  for (const auto& sh : layout.shards) largest = std::max<std::uint64_t>(largest, sh.size * 2 * sizeof(float));
  REQUIRE(held.size() == layout.shards.size());
  CHECK(*std::max_element(held.begin(), held.end()) == largest);
  const auto iterations = header_iterations(dir.path, m);
  REQUIRE(iterations.size() == layout.shards.size());
  const auto r = checkpoint_reader::open(dir.path, m.name);
  const std::uint32_t first = iterations.begin()->first;  // the file holds the shards by id
  for (const auto& [id, t] : iterations) {
    INFO("shard " << id);
    const auto& sh = layout.shards[id];
    const bool late = id != first;
    CHECK(t == (late ? 4 : 3));
    std::vector<float> v(sh.size), slot(sh.size);
    r.read(0, sh.offset, v);
    r.read(1, sh.offset, slot);
    CHECK(v == slice(late ? values : before, sh.offset, sh.size));
    CHECK(slot == slice(late ? after_slot : before_slot, sh.offset, sh.size));
  }
}

TEST_CASE("a restore or save beyond a frame's limits is refused before anything is sent, saying what to do",
          "[checkpoint][errors]") {
  temp_dir dir("frame_limits");
  const auto vars = model_vars();
  const auto layout = place_on(1);
  cluster_of c(dir.path.string(), layout);
  const auto init = seeded(num_parameters(vars), 3);
  c.client->initialize(init, {optim::adam{}});
  save_checkpoint(*c.client, {dir.path.string(), "ck", 0}, vars);
  const std::string address = "127.0.0.1:" + std::to_string(c.servers[0]->port());
  auto client_with = [&](std::uint64_t max_payload, std::uint32_t max_meta) {
    auto o = dtf::test::opts("chief.0");
    o.limits.max_payload_bytes = max_payload;
    o.limits.max_meta_bytes = max_meta;
    auto p = std::make_unique<ps_client>(std::vector<std::string>{address}, layout, o);
    p->connect();
    return p;
  };
  // Values and two slots of 35 floats are 420 bytes through the chief: in frames of 400 bytes
  // they go in parts (docs/design/large-models.md).
  auto small_frames = client_with(400, 64 * 1024);
  REQUIRE(restore_latest(*small_frames, dir.path.string(), vars, {optim::adam{}}) == std::optional<std::int64_t>(0));
  CHECK(pull_all(*small_frames) == init);
  // A shard of 12 floats is 144 bytes with its slots: no frame of 100 bytes carries it.
  auto tiny_frames = client_with(100, 64 * 1024);
  CHECK_THROWS_WITH(restore_latest(*tiny_frames, dir.path.string(), vars, {optim::adam{}}),
                    Catch::Contains("144 bytes with its slots") && Catch::Contains("max_shard_bytes"));
  // Each ps reading its own files sends no values: it passes.
  REQUIRE(restore_checkpoint(*tiny_frames, dir.path.string(), "ck-0", vars, {optim::adam{}}, {},
                             restore_transfer::ps_reads_files) == 0);
  CHECK(pull_all(*tiny_frames) == init);
  // Metadata: a save's answer lists every shard, a restore's message too.
  auto small_meta = client_with(std::uint64_t(1) << 32, 200);
  CHECK_THROWS_WITH(save_checkpoint(*small_meta, {dir.path.string(), "ck", 0}, vars),
                    Catch::Contains("too many to list") && Catch::Contains("fewer, larger shards"));
  CHECK_THROWS_WITH(restore_latest(*small_meta, dir.path.string(), vars, {optim::adam{}}),
                    Catch::Contains("bytes of metadata") && Catch::Contains("fewer, larger shards"));
}
