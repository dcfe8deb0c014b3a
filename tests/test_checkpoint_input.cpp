// Checkpoints as input: crafted, damaged or hostile checkpoint directories are refused with an
// error naming the file and the field (never a write outside a buffer, an unbounded
// allocation or a file outside the directory); temporary files are never written through a
// symlink; restore falls back to the newest kept checkpoint that verifies; restore streams.
#include <catch2/catch.hpp>

#include <dtf/checkpoint.hpp>
#include <dtf/ps.hpp>

#include "checkpoint_helpers.hpp"

#include <nlohmann/json.hpp>

#include <malloc.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace dtf;
using namespace dtf::test::ckpt;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A checkpoint "ckpt-STEP" of model_vars() with Adam's two slots, one shard file.
checkpoint_manifest host_checkpoint(const fs::path& dir, std::int64_t step, std::size_t keep = 5) {
  const auto vars = model_vars();
  static std::vector<float> values, m, v;
  values = seeded(num_parameters(vars), std::uint64_t(step));
  m = seeded(values.size(), std::uint64_t(step) + 1);
  v = seeded(values.size(), std::uint64_t(step) + 2);
  return write_checkpoint({.directory = dir.string(), .max_to_keep = keep},
                          {.variables = vars, .values = values, .rule = "adam", .slots = {m, v}, .iterations = step,
                           .global_step = step});
}

// Rewrites ckpt-1's manifest after `edit`.
template <class Edit>
void edit_manifest(const fs::path& dir, Edit edit, const std::string& name = "ckpt-1") {
  const auto path = dir / (name + ".manifest.json");
  auto j = read_json(path);
  edit(j);
  write_text(path, j.dump(1));
}

// Replaces a shard file's bytes and makes the manifest's size and SHA-256 agree, so a reader
// gets past the checksum to the header.
void replace_shard(const fs::path& dir, const std::string& file, const std::string& bytes) {
  write_text(dir / file, bytes);
  edit_manifest(dir, [&](nlohmann::json& j) {
    for (auto& f : j["files"])
      if (f["name"] == file) {
        f["bytes"] = bytes.size();
        f["sha256"] = detail::sha256_hex(bytes.data(), bytes.size());
      }
  });
}

// A shard file with the given JSON header and `floats` float32 zeros after it.
std::string shard_bytes(const nlohmann::json& header, std::size_t floats) {
  const auto text = header.dump();
  std::string s("DTFSHRD1", 8);
  const std::uint64_t len = text.size();
  s.append(reinterpret_cast<const char*>(&len), 8);
  s += text;
  s.append(floats * sizeof(float), '\0');
  return s;
}

// The error of f(), which must throw dtf::error with code `code`.
template <class F>
std::string error_of(F&& f, errc code = errc::corrupt_data) {
  try {
    f();
  } catch (const error& e) {
    CHECK(e.code() == make_error_code(code));
    return e.what();
  }
  FAIL("no error was thrown");
  return {};
}

constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

}  // namespace

TEST_CASE("a manifest whose variable offset lies near 2^64 is refused, naming the file and field",
          "[checkpoint][input]") {
  temp_dir dir("offset");
  host_checkpoint(dir.path, 1);
  // Variable 1 and its shard moved to 2^64 - 2: offset + size wraps around, and a reader that
  // trusted it would write far outside its buffer.
  edit_manifest(dir.path, [](nlohmann::json& j) {
    j["variables"][1]["offset"] = u64_max - 1;
    j["shards"][1]["offset"] = u64_max - 1;
  });
  for (auto* what : {"verify", "read"}) {
    const auto e = error_of([&] {
      if (std::string(what) == "verify") (void)verify_checkpoint(dir.path, "ckpt-1");
      else (void)read_checkpoint(dir.path, "ckpt-1");
    });
    CHECK_THAT(e, Catch::Contains("ckpt-1.manifest.json") && Catch::Contains("variables[1].offset"));
  }
  // The chief's restore uses the same reader.
  cluster_of c(dir.path.string(), place_on(2));
  const auto e = error_of([&] { (void)restore_latest(*c.client, dir.path.string(), model_vars(), {optim::adam{}}); });
  CHECK_THAT(e, Catch::Contains("variables[1].offset"));
  CHECK_FALSE(c.client->ready());
}

TEST_CASE("a shape whose element count overflows size_t is refused", "[checkpoint][input]") {
  temp_dir dir("shape");
  host_checkpoint(dir.path, 1);
  // 21 * (2^32 + 1) * (2^32 - 1) * (2^64 - 1) is 21 modulo 2^64: a wrapping product would
  // pass every later check.
  edit_manifest(dir.path, [](nlohmann::json& j) {
    j["variables"][0]["shape"] = {21u, (1ull << 32) + 1, (1ull << 32) - 1, u64_max};
  });
  CHECK_THAT(error_of([&] { (void)verify_checkpoint(dir.path, "ckpt-1"); }),
             Catch::Contains("ckpt-1.manifest.json") && Catch::Contains("variables[0].shape") &&
                 Catch::Contains("overflow"));
}

TEST_CASE("a manifest describing more data than its files hold is refused before any allocation",
          "[checkpoint][input]") {
  temp_dir dir("extent");
  host_checkpoint(dir.path, 1);
  // A variable placed at 2^60: reading it whole would allocate 4 EiB.
  edit_manifest(dir.path, [](nlohmann::json& j) {
    j["variables"][3]["offset"] = 1ull << 60;
    j["shards"][3]["offset"] = 1ull << 60;
  });
  CHECK_THAT(error_of([&] { (void)read_checkpoint(dir.path, "ckpt-1"); }),
             Catch::Contains("ckpt-1.manifest.json") && Catch::Contains("files"));
}

TEST_CASE("dtype and update rule names come from a closed set", "[checkpoint][input]") {
  temp_dir dir("names");
  host_checkpoint(dir.path, 1);
  edit_manifest(dir.path, [](nlohmann::json& j) { j["rule"] = "rmsprop"; });
  CHECK_THAT(error_of([&] { (void)verify_checkpoint(dir.path, "ckpt-1"); }),
             Catch::Contains("ckpt-1.manifest.json") && Catch::Contains("rule 'rmsprop'"));
  edit_manifest(dir.path, [](nlohmann::json& j) {
    j["rule"] = "momentum";  // one slot, but two saved
  });
  CHECK_THAT(error_of([&] { (void)verify_checkpoint(dir.path, "ckpt-1"); }), Catch::Contains("num_slots"));
  edit_manifest(dir.path, [](nlohmann::json& j) {
    j["rule"] = "adam";
    j["dtype"] = "float64";
  });
  CHECK_THAT(error_of([&] { (void)verify_checkpoint(dir.path, "ckpt-1"); }), Catch::Contains("dtype 'float64'"));
}

TEST_CASE("a shard header whose entry sizes wrap around is refused, naming the file and the entry",
          "[checkpoint][input]") {
  temp_dir dir("header");
  host_checkpoint(dir.path, 1);
  const std::string file = "ckpt-1.ps-0-of-1.shard";
  // Two entries whose sizes sum to 2^64 (mod): total 0 floats after the header.
  const nlohmann::json header{{"format", 1}, {"ps", 0}, {"num_ps", 1}, {"global_step", 1}, {"num_slots", 2},
                              {"entries", {{{"shard", 0}, {"size", 1ull << 63}, {"iterations", 1}},
                                           {{"shard", 1}, {"size", 1ull << 63}, {"iterations", 1}}}}};
  replace_shard(dir.path, file, shard_bytes(header, 105));  // as many bytes as the real file
  CHECK_THAT(error_of([&] { (void)verify_checkpoint(dir.path, "ckpt-1"); }),
             Catch::Contains(file) && Catch::Contains("entries[0].size"));
  // A header claiming another ps, and one longer than the file.
  auto other = header;
  other["ps"] = 3;
  other["entries"] = nlohmann::json::array();
  replace_shard(dir.path, file, shard_bytes(other, 105));
  CHECK_THAT(error_of([&] { (void)verify_checkpoint(dir.path, "ckpt-1"); }),
             Catch::Contains(file) && Catch::Contains("ps 3"));
  // The real file with its header length field set to 2^40.
  host_checkpoint(dir.path, 1);
  auto real = read_bytes(dir.path / file);
  const std::uint64_t huge = 1ull << 40;
  real.replace(8, 8, reinterpret_cast<const char*>(&huge), 8);
  replace_shard(dir.path, file, real);
  CHECK_THAT(error_of([&] { (void)verify_checkpoint(dir.path, "ckpt-1"); }),
             Catch::Contains(file) && Catch::Contains("header length"));
}

TEST_CASE("the state file and the manifest can only name files inside the checkpoint directory",
          "[checkpoint][input]") {
  temp_dir dir("confined");
  const fs::path ckdir = dir.path / "ck";
  fs::create_directories(ckdir);
  host_checkpoint(ckdir, 1);
  // A perfectly valid checkpoint one level up, which a "../" name would reach.
  fs::copy_file(ckdir / "ckpt-1.ps-0-of-1.shard", dir.path / "outside.shard");
  fs::copy_file(ckdir / "ckpt-1.manifest.json", dir.path / "outside.manifest.json");
  for (const std::string bad : {"../outside", "/etc/passwd", "a/b", "..", ""}) {
    write_text(ckdir / "checkpoint",
               nlohmann::json{{"latest", bad}, {"all", bad.empty() ? nlohmann::json::array() : nlohmann::json::array({bad})}}.dump());
    if (bad.empty()) {
      CHECK_FALSE(latest_checkpoint(ckdir));  // no latest: nothing to restore
      continue;
    }
    CHECK_THAT(error_of([&] { (void)latest_checkpoint(ckdir); }),
               Catch::Contains(fs::path(ckdir / "checkpoint").string()) && Catch::Contains("latest"));
    CHECK_THROWS_AS(read_manifest(ckdir, bad), error);
  }
  write_text(ckdir / "checkpoint", nlohmann::json{{"latest", "ckpt-1"}, {"all", {"../outside", "ckpt-1"}}}.dump());
  CHECK_THAT(error_of([&] { (void)read_checkpoint_state(ckdir); }), Catch::Contains("all[0]"));
  write_text(ckdir / "checkpoint", nlohmann::json{{"latest", "ckpt-1"}, {"all", {"ckpt-1"}}}.dump());
  CHECK_NOTHROW(verify_checkpoint(ckdir, "ckpt-1"));
  for (const std::string bad : {std::string("../outside.shard"), (dir.path / "outside.shard").string(), std::string("sub/x.shard")}) {
    edit_manifest(ckdir, [&](nlohmann::json& j) { j["files"][0]["name"] = bad; });
    CHECK_THAT(error_of([&] { (void)verify_checkpoint(ckdir, "ckpt-1"); }),
               Catch::Contains("ckpt-1.manifest.json") && Catch::Contains("files[0].name"));
  }
}

TEST_CASE("checkpoint writers never write through a symlink at a temporary name", "[checkpoint][input]") {
  temp_dir dir("symlink");
  const fs::path ckdir = dir.path / "ck";
  fs::create_directories(ckdir);
  const fs::path victim = dir.path / "victim.txt";
  write_text(victim, "precious");
  // Yesterday's temporary names, planted by someone else, pointing at a file outside.
  for (const char* tmp : {"ckpt-7.ps-0-of-1.shard.tmp", "ckpt-7.manifest.json.tmp", "checkpoint.tmp",
                          "ckpt-8.ps-0-of-2.shard.tmp", "ckpt-8.ps-1-of-2.shard.tmp", "ckpt-8.manifest.json.tmp"})
    fs::create_symlink(victim, ckdir / tmp);
  host_checkpoint(ckdir, 7);
  CHECK(read_bytes(victim) == "precious");
  CHECK_NOTHROW(verify_checkpoint(ckdir, "ckpt-7"));
  // The ps-side shard writer too.
  cluster_of c(ckdir.string(), place_on(2));
  c.client->initialize(seeded(num_parameters(model_vars()), 3), {optim::sgd{}});
  save_checkpoint(*c.client, {ckdir.string(), "ckpt", 5}, model_vars(), 8);
  CHECK(read_bytes(victim) == "precious");
  CHECK_NOTHROW(verify_checkpoint(ckdir, "ckpt-8"));
  // Every temporary file was created anew and renamed: none is left beside the planted links.
  for (const auto& e : fs::directory_iterator(ckdir)) {
    const auto name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos) CHECK(fs::is_symlink(e.symlink_status()));
  }
}

TEST_CASE("restore falls back to the newest kept checkpoint that verifies, and says so", "[checkpoint][input]") {
  temp_dir dir("fallback");
  const auto vars = model_vars();
  const optim::rule rule = optim::adagrad{.learning_rate = 0.1f};
  cluster_of a(dir.path.string(), place_on(2));
  a.client->initialize(seeded(num_parameters(vars), 9), {rule});
  train(*a.client, 2, 100);
  const auto at_2 = pull_all(*a.client);
  save_checkpoint(*a.client, {dir.path.string(), "ckpt", 3}, vars);
  train(*a.client, 2, 200);
  save_checkpoint(*a.client, {dir.path.string(), "ckpt", 3}, vars);
  // The latest is damaged (a byte flipped in ps.1's shard file).
  {
    std::fstream f(dir.path / "ckpt-4.ps-1-of-2.shard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x55');
  }
  dtf::test::log_sink sink;
  cluster_of b(dir.path.string(), place_on(3, 1));
  b.client = std::make_unique<ps_client>(
      std::vector<std::string>{"127.0.0.1:" + std::to_string(b.servers[0]->port()),
                               "127.0.0.1:" + std::to_string(b.servers[1]->port()),
                               "127.0.0.1:" + std::to_string(b.servers[2]->port())},
      place_on(3, 1), dtf::test::opts("chief.0", "", &sink));
  b.client->connect();
  REQUIRE(restore_latest(*b.client, dir.path.string(), vars, {rule}) == std::optional<std::int64_t>(2));
  CHECK(pull_all(*b.client) == at_2);
  CHECK(sink.contains("ckpt-4 failed verification"));
  CHECK(sink.contains("ckpt-4.ps-1-of-2.shard: SHA-256"));
  CHECK(sink.contains("restoring ckpt-2"));
  // The option to refuse instead.
  cluster_of c(dir.path.string(), place_on(2));
  CHECK_THAT(error_of([&] {
               (void)restore_latest(*c.client, dir.path.string(), vars, {rule}, {}, checkpoint_fallback::refuse);
             }),
             Catch::Contains("ckpt-4.ps-1-of-2.shard: SHA-256"));
  CHECK_FALSE(c.client->ready());
  // What dtf-ckpt verify --all reports.
  const auto report = verify_all_checkpoints(dir.path);
  REQUIRE(report.size() == 2);
  CHECK(report[0].name == "ckpt-2");
  CHECK(report[0].usable());
  CHECK(report[1].name == "ckpt-4");
  CHECK_FALSE(report[1].usable());
  CHECK_THAT(report[1].error, Catch::Contains("SHA-256"));
  CHECK(newest_usable_checkpoint(dir.path) == std::optional<std::string>("ckpt-2"));
  // Nothing verifies: the error names the latest's cause.
  fs::remove(dir.path / "ckpt-2.ps-0-of-2.shard");
  CHECK_THAT(error_of([&] { (void)restore_latest(*c.client, dir.path.string(), vars, {rule}); }),
             Catch::Contains("no kept checkpoint") && Catch::Contains("ckpt-4.ps-1-of-2.shard: SHA-256"));
}

namespace {
// Peak resident set size of this process since the last reset (kB), from /proc.
std::size_t peak_rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}
std::size_t rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  return 0;
}
// Buffers of 1 MiB and more are mapped and unmapped (no dynamic mmap threshold), so memory a
// previous cluster freed is given back rather than reused unseen by the peak.
void map_large_buffers() {
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 20);
}
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return bool(out);
}
}  // namespace

TEST_CASE("restore streams the checkpoint: the chief never holds the whole model, let alone twice",
          "[checkpoint][input][memory]") {
  temp_dir dir("stream");
  map_large_buffers();
  // 32 MiB of values over 4 ps, plain SGD (no slots).
  const std::size_t rows = 8192, cols = 1024;
  const std::vector<variable_spec> vars{{"big/kernel", {rows, cols}, 0}};
  const std::size_t n = rows * cols;
  const double model_kb = double(n * sizeof(float)) / 1024.0;
  const auto layout = partitioners::fixed_size{4}.place(vars, 4);
  {
    cluster_of a(dir.path.string(), layout, {}, true);
    std::vector<float> init(n);
    for (std::size_t i = 0; i < n; ++i) init[i] = float(i % 977);
    a.client->initialize(init, {optim::sgd{}});
    save_checkpoint(*a.client, {dir.path.string(), "ckpt", 1}, vars, 1);
  }
  cluster_of b(dir.path.string(), layout, {}, true);
  REQUIRE(reset_peak_rss());  // /proc/self/clear_refs "5" (Linux >= 4.0)
  const auto base = rss_kb();
  REQUIRE(restore_latest(*b.client, dir.path.string(), vars, {optim::sgd{}}));
  const double grown = double(peak_rss_kb()) - double(base);
  // The ps tasks (threads of this process) now hold the model (1x), and each keeps the
  // receive buffer its restore message came in (the transport's, a quarter each: 1x in all).
  // Streaming adds one ps's quarter at the chief: 2.25x. Reading the whole checkpoint first, as
  // restore used to, adds at least two more copies (the assembled model and its re-slicing).
  INFO("peak growth " << grown / 1024 << " MiB for a " << model_kb / 1024 << " MiB model");
  CHECK(grown < 2.6 * model_kb);
  std::vector<float> back(n);
  b.client->pull(back);
  bool same = true;
  for (std::size_t i = 0; i < n && same; ++i) same = back[i] == float(i % 977);
  CHECK(same);
}

TEST_CASE("each ps can read its own slices from the shard files: resharding is exact and the chief holds no model",
          "[checkpoint][input][memory]") {
  temp_dir dir("by_ps");
  const auto vars = model_vars();
  const optim::rule rule = optim::adam{.learning_rate = 0.02f};
  cluster_of two(dir.path.string(), place_on(2));
  two.client->initialize(seeded(num_parameters(vars), 12), {rule});
  train(*two.client, 3, 1200);
  save_checkpoint(*two.client, {dir.path.string(), "ckpt", 2}, vars);
  // 2 -> 3 ps, values, Adam's moments and t: the next updates agree bit for bit.
  cluster_of three(dir.path.string(), place_on(3, 3));
  std::vector<float> params(num_parameters(vars));
  REQUIRE(restore_latest(*three.client, dir.path.string(), vars, {rule}, params,
                                       checkpoint_fallback::newest_valid, restore_transfer::ps_reads_files) ==
          std::optional<std::int64_t>(3));
  CHECK(params == pull_all(*two.client));
  train(*two.client, 2, 1300);
  train(*three.client, 2, 1300);
  CHECK(pull_all(*three.client) == pull_all(*two.client));
  // A ps verifies what it reads: a damaged file is refused by the ps, naming it.
  {
    std::fstream f(dir.path / "ckpt-3.ps-0-of-2.shard", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x21');
  }
  cluster_of again(dir.path.string(), place_on(2));
  CHECK_THAT(error_of([&] {
               (void)restore_checkpoint(*again.client, dir.path.string(), "ckpt-3", vars, {rule}, {},
                                                      restore_transfer::ps_reads_files);
             }),
             Catch::Contains("ckpt-3.ps-0-of-2.shard: SHA-256"));
}

TEST_CASE("a restore in which each ps reads its own slices costs the chief no model-sized buffer",
          "[checkpoint][input][memory]") {
  temp_dir dir("by_ps_memory");
  map_large_buffers();
  const std::size_t rows = 8192, cols = 1024;
  const std::vector<variable_spec> vars{{"big/kernel", {rows, cols}, 0}};
  const std::size_t n = rows * cols;
  const double model_kb = double(n * sizeof(float)) / 1024.0;
  const auto layout = partitioners::fixed_size{4}.place(vars, 4);
  {
    cluster_of a(dir.path.string(), layout, {}, true);
    std::vector<float> init(n);
    for (std::size_t i = 0; i < n; ++i) init[i] = float(i % 977);
    a.client->initialize(init, {optim::sgd{}});
    save_checkpoint(*a.client, {dir.path.string(), "ckpt", 1}, vars, 1);
  }
  cluster_of b(dir.path.string(), layout, {}, true);
  REQUIRE(reset_peak_rss());
  const auto base = rss_kb();
  restore_checkpoint(*b.client, dir.path.string(), "ckpt-1", vars, {optim::sgd{}}, {},
                               restore_transfer::ps_reads_files);
  const double grown = double(peak_rss_kb()) - double(base);
  // The ps tasks' new shards (1x); nothing at the chief, no receive buffers; a few 1 MiB
  // hashing buffers.
  INFO("peak growth " << grown / 1024 << " MiB for a " << model_kb / 1024 << " MiB model");
  CHECK(grown < 1.3 * model_kb);
  std::vector<float> back(n);
  b.client->pull(back);
  bool same = true;
  for (std::size_t i = 0; i < n && same; ++i) same = back[i] == float(i % 977);
  CHECK(same);
}
