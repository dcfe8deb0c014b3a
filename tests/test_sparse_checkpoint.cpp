// Checkpoints of embedding tables: each ps writes its own table file; a restore into another
// number of ps re-routes the rows; every row, slot and push count comes back exactly (checked
// against rows gathered before the save, the slots through the checkpoint reader, and the next
// identical pushes on both runs); crafted table files are refused naming the file and the cause;
// dtf-ckpt lists and exports tables.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <dtf/hooks/checkpoint_saver.hpp>
#include <dtf/ps.hpp>

#include "checkpoint_helpers.hpp"
#include "sparse_helpers.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <random>

using namespace dtf;
using namespace dtf::test::ckpt;
using dtf::test::gather;

namespace {

const embedding_spec fd_spec{.name = "fd", .rows = 50, .dim = 3, .strategy = partition_strategy::div, .init = {0.5f, 3}};
const embedding_spec fm_spec{.name = "fm", .rows = 37, .dim = 2, .strategy = partition_strategy::mod, .init = {0.5f, 4}};
const embedding_spec h_spec{.name = "h", .dim = 4, .init = {0.1f, 5}, .max_rows = 1000};

// A run of num_ps ps holding three tables: fixed div (Adam), fixed mod (Adagrad), hashed (Adam);
// the fixed tables cut into num_ps shards, the hashed one a shard per ps.
struct table_run {
  cluster_of c;
  embedding_tables tables{*c.client};
  std::uint32_t fd, fm, h;
  table_run(const std::string& dir, std::size_t num_ps, const placement& dense = {})
      : c(dir, dense.num_ps ? dense : placement{{}, num_ps}) {
    fd = tables.add_fixed(fd_spec, partitioners::fixed_size{num_ps});
    fm = tables.add_fixed(fm_spec, partitioners::fixed_size{num_ps});
    h = tables.add_hashed(h_spec);
    tables.create(fd, optim::adam{0.05f});
    tables.create(fm, optim::adagrad{0.3f});
    tables.create(h, optim::adam{0.02f});
  }
};

std::vector<std::uint64_t> fd_touched() {  // rows of every shard, for 1, 2 or 3 shards
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < 50; ++i)
    if (i % 3 != 1) ids.push_back(i);
  return ids;
}
std::vector<std::uint64_t> fm_touched() {
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < 37; ++i)
    if (i % 4 != 2) ids.push_back(i);
  return ids;
}
std::vector<std::uint64_t> h_ids() {
  std::mt19937_64 gen(17);
  std::vector<std::uint64_t> ids(40);
  for (auto& x : ids) x = gen();
  return ids;
}
std::vector<std::uint64_t> all(std::uint64_t n) {
  std::vector<std::uint64_t> ids(n);
  for (std::uint64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

void push(embedding_tables& t, std::uint32_t table, const std::vector<std::uint64_t>& ids, std::uint64_t seed) {
  const auto l = t.plan(table, ids);
  const auto g = seeded(l.rows() * l.dim, seed);  // by position in the plan: same plan, same rows
  std::vector<float> rows(g.size());
  // The gradient of id ids[i] depends on i alone, whatever the plan's order.
  for (std::size_t i = 0; i < ids.size(); ++i)
    std::copy_n(g.begin() + i * l.dim, l.dim, rows.begin() + l.index[i] * l.dim);
  t.push(l, rows);
}

void train_tables(table_run& r, int steps, std::uint64_t seed) {
  for (int s = 0; s < steps; ++s) {
    push(r.tables, r.fd, fd_touched(), seed + 10 * std::uint64_t(s));
    push(r.tables, r.fm, fm_touched(), seed + 10 * std::uint64_t(s) + 1);
    push(r.tables, r.h, h_ids(), seed + 10 * std::uint64_t(s) + 2);
  }
}

struct snapshot {
  std::vector<float> fd, fm, h;
  bool operator==(const snapshot&) const = default;
};
snapshot rows_of(table_run& r) {
  return {gather(r.tables, r.fd, all(50)), gather(r.tables, r.fm, all(37)), gather(r.tables, r.h, h_ids())};
}

// A checkpoint of the three tables saved by 2 ps after `steps` pushes (the ps then stop); its name.
std::string saved_by_two_ps(const fs::path& dir, int steps) {
  table_run a(dir.string(), 2);
  train_tables(a, steps, 5);
  return save_checkpoint(*a.c.client, {.directory = dir.string()}, {}).name;
}

// Rewrites table file `index` of checkpoint `name` with edit(header, data) and, with fix, the
// manifest's size and SHA-256 of it (so the reader gets past the checksum to the contents).
template <class Edit>
void rewrite_table_file(const fs::path& dir, const std::string& name, std::size_t index, Edit edit, bool fix = true) {
  const auto mpath = dir / (name + ".manifest.json");
  auto man = nlohmann::json::parse(std::ifstream(mpath));
  const auto file = dir / man["table_files"][index]["name"].get<std::string>();
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::uint64_t len = 0;
  std::memcpy(&len, bytes.data() + 8, 8);
  auto header = nlohmann::json::parse(bytes.substr(16, len));
  std::string data = bytes.substr(16 + len);
  edit(header, data);
  const std::string text = header.dump();
  len = text.size();
  std::string out = bytes.substr(0, 8) + std::string(reinterpret_cast<const char*>(&len), 8) + text + data;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << out;
  if (fix) {
    man["table_files"][index]["bytes"] = out.size();
    man["table_files"][index]["sha256"] = dtf::detail::sha256_hex(out.data(), out.size());
    std::ofstream(mpath, std::ios::trunc) << man.dump(1);
  }
}

}  // namespace

TEST_CASE("embedding tables saved by 2 ps restore into 1 and into 3 ps: rows, slots and push counts exactly",
          "[sparse][checkpoint]") {
  const std::size_t restore_ps = GENERATE(1, 3);
  temp_dir dir("sparse_reshard_" + std::to_string(restore_ps));
  table_run a(dir.path.string(), 2);
  train_tables(a, 3, 100);
  const auto before = rows_of(a);
  CHECK(a.tables.rows(a.h).held == 40);
  const auto m = save_checkpoint(*a.c.client, {.directory = dir.path.string()}, {}, 3);
  REQUIRE(m.tables.size() == 3);
  REQUIRE(m.table_files.size() == 2);  // each ps its own
  CHECK(m.find_table("fd")->rows_saved == 50);
  CHECK(m.find_table("h")->rows_saved == 40);
  CHECK(m.find_table("h")->spec.hashed());

  table_run b(dir.path.string(), restore_ps);
  CHECK(rows_of(b) != before);  // freshly initialised
  restore_checkpoint(*b.c.client, dir.path.string(), m.name, {}, ps_config{}, {}, restore_transfer::through_chief,
                     &b.tables);
  CHECK(rows_of(b) == before);
  CHECK(b.tables.rows(b.h).held == 40);  // a hashed table keeps its rows, and only those

  // Slots: the restored run's own checkpoint holds the very rows and slots the first one saved.
  const auto m2 = save_checkpoint(*b.c.client, {.directory = dir.path.string()}, {}, 4);
  const auto r1 = checkpoint_reader::open(dir.path, m.name), r2 = checkpoint_reader::open(dir.path, m2.name);
  CHECK(m2.table_files.size() == restore_ps);
  for (const char* t : {"fd", "fm", "h"})
    for (int slot = -1; slot < int(m.find_table(t)->num_slots); ++slot) {
      const auto x = read_checkpoint_table(r1, t, slot), y = read_checkpoint_table(r2, t, slot);
      CHECK(x.ids == y.ids);
      CHECK(x.rows == y.rows);
    }
  // The push counts (Adam's t) and slots: the next identical pushes give identical rows.
  train_tables(a, 2, 900);
  train_tables(b, 2, 900);
  CHECK(rows_of(b) == rows_of(a));
  CHECK(rows_of(b) != before);
}

TEST_CASE("restore_latest and the ps scaffold restore tables beside the dense model", "[sparse][checkpoint]") {
  temp_dir dir("sparse_scaffold");
  const ps_config config{.rule = optim::adam{0.01f}};
  table_run a(dir.path.string(), 2, place_on(2));
  a.c.client->initialize(seeded(num_parameters(model_vars()), 1), config);
  train(*a.c.client, 2, 7);
  train_tables(a, 2, 300);
  const auto before = rows_of(a);
  const auto dense = pull_all(*a.c.client);
  save_checkpoint(*a.c.client, {.directory = dir.path.string()}, model_vars());

  table_run b(dir.path.string(), 3, place_on(3));
  auto scaffold = ps_scaffold(*b.c.client, {.checkpoint_dir = dir.path.string(),
                                            .variables = model_vars(),
                                            .config = config,
                                            .tables = &b.tables});
  REQUIRE(scaffold.restore());
  CHECK(pull_all(*b.c.client) == dense);
  CHECK(rows_of(b) == before);
  // After a restore in which each ps reads its own dense slices, the tables come through the chief.
  table_run c(dir.path.string(), 1, place_on(1));
  REQUIRE(restore_latest(*c.c.client, dir.path.string(), model_vars(), config, {}, checkpoint_fallback::refuse,
                         restore_transfer::ps_reads_files, &c.tables));
  CHECK(rows_of(c) == before);
  CHECK(pull_all(*c.c.client) == dense);
}

TEST_CASE("a table restore names the table: not created, missing, another kind, dim, rows or rule",
          "[sparse][checkpoint][errors]") {
  temp_dir dir("sparse_mismatch");
  const auto name = saved_by_two_ps(dir.path, 1);
  auto try_restore = [&](const embedding_spec& spec, bool hashed, std::optional<optim::rule> rule) {
    cluster_of c(dir.path.string(), placement{{}, 1});
    embedding_tables t(*c.client);
    const auto id = hashed ? t.add_hashed(spec) : t.add_fixed(spec, partitioners::fixed_size{1});
    if (rule) t.create(id, *rule);
    restore_tables(*c.client, t, dir.path.string(), name);
  };
  CHECK_THROWS_WITH(try_restore(fd_spec, false, std::nullopt), Catch::Contains("'fd'") && Catch::Contains("create it"));
  auto other = fd_spec;
  other.name = "zz";
  CHECK_THROWS_WITH(try_restore(other, false, optim::adam{}), Catch::Contains("no embedding table 'zz'") &&
                                                                  Catch::Contains("fd, fm, h"));
  other = fd_spec;
  other.dim = 4;
  CHECK_THROWS_WITH(try_restore(other, false, optim::adam{}), Catch::Contains("'fd'") && Catch::Contains("dim 3"));
  other.dim = 3;
  other.rows = 51;
  CHECK_THROWS_WITH(try_restore(other, false, optim::adam{}), Catch::Contains("'fd'") && Catch::Contains("50 rows"));
  other = h_spec;
  other.name = "fd";
  CHECK_THROWS_WITH(try_restore(other, true, optim::adam{}), Catch::Contains("'fd'") && Catch::Contains("fixed table"));
  CHECK_THROWS_WITH(try_restore(fd_spec, false, optim::adagrad{}),
                    Catch::Contains("'fd'") && Catch::Contains("rule adam") && Catch::Contains("adagrad"));
  CHECK_NOTHROW(try_restore(fd_spec, false, optim::adam{}));
}

TEST_CASE("a crafted table file is refused, naming the file and the cause", "[sparse][checkpoint][input]") {
  temp_dir dir("sparse_crafted");
  const auto name = saved_by_two_ps(dir.path, 1);
  REQUIRE_NOTHROW(verify_checkpoint(dir.path, name));
  const std::string file0 = name + ".tables-0-of-2";
  // Keep a pristine copy of every file to restore between the cases.
  const fs::path pristine = dir.path / "pristine";
  fs::create_directories(pristine);
  for (const auto& e : fs::directory_iterator(dir.path))
    if (e.is_regular_file()) fs::copy_file(e.path(), pristine / e.path().filename());
  auto reset = [&] {
    for (const auto& e : fs::directory_iterator(pristine))
      fs::copy_file(e.path(), dir.path / e.path().filename(), fs::copy_options::overwrite_existing);
  };
  auto table_index = [](const nlohmann::json& h, const char* t) {
    for (std::size_t i = 0; i < h["tables"].size(); ++i)
      if (h["tables"][i]["name"] == t) return i;
    FAIL("no table " << t);
    return std::size_t(0);
  };
  auto refused = [&](const std::string& cause) {
    CHECK_THROWS_WITH(verify_checkpoint(dir.path, name), Catch::Contains(file0) && Catch::Contains(cause));
  };

  SECTION("a shard of more rows than the file holds") {
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json& h, std::string&) {
      h["tables"][table_index(h, "h")]["shards"][0]["rows"] = 400;  // within max_rows / shards
    });
    refused("rows exceed the file's");
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json& h, std::string&) {
      h["tables"][table_index(h, "h")]["shards"][0]["rows"] = std::uint64_t(1) << 62;
    });
    refused("rows in a shard of at most 500");
  }
  SECTION("an id outside a fixed table, also when restoring") {
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json& h, std::string& data) {
      REQUIRE(table_index(h, "fd") == 0);  // the file's first record is fd's first row
      const std::uint64_t id = 57;
      std::memcpy(data.data(), &id, 8);
    });
    refused("id 57 is not of this shard");
    table_run b(dir.path.string(), 1);
    CHECK_THROWS_WITH(restore_tables(*b.c.client, b.tables, dir.path.string(), name),
                      Catch::Contains(file0) && Catch::Contains("id 57"));
  }
  SECTION("a table whose dim differs from its rows' bytes, or from the manifest's") {
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json& h, std::string&) { h["tables"][table_index(h, "fd")]["dim"] = 4; });
    refused("exceed the file's");
    reset();
    // A header that fits its bytes but describes another table than the manifest's.
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json& h, std::string&) { h["tables"][table_index(h, "fd")]["init_seed"] = 9; });
    refused("table 'fd' is not the manifest's");
  }
  SECTION("a truncated file") {
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json&, std::string& data) { data.resize(data.size() - 10); },
                       false);
    refused("bytes, the manifest says");
    reset();
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json&, std::string& data) { data.resize(data.size() - 10); });
    refused("exceed the file's");
  }
  SECTION("a damaged byte") {
    rewrite_table_file(dir.path, name, 0, [&](nlohmann::json&, std::string& data) { data[20] ^= 1; }, false);
    refused("SHA-256");
  }
  reset();
  CHECK_NOTHROW(verify_checkpoint(dir.path, name));
}

#ifdef DTF_CKPT_TOOL
TEST_CASE("dtf-ckpt lists a checkpoint's tables and exports one as ids and rows", "[sparse][checkpoint][tool]") {
  temp_dir dir("sparse_tool");
  const auto name = saved_by_two_ps(dir.path, 2);
  auto run = [&](const std::string& args) {
    const auto out = dir.path / "tool.out";
    const int rc = std::system((std::string(DTF_CKPT_TOOL) + " " + args + " >" + out.string() + " 2>&1").c_str());
    std::ifstream in(out);
    return std::pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string((std::istreambuf_iterator<char>(in)), {}));
  };
  const auto [rc, list] = run("list " + dir.path.string());
  REQUIRE(rc == 0);
  // The table lines, as words: name, kind, dim, rows (- for hashed), shards, rule, rows saved.
  auto words_of = [&](const std::string& first) {
    std::istringstream lines(list);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream ws(line);
      std::vector<std::string> w{std::istream_iterator<std::string>(ws), {}};
      if (!w.empty() && w[0] == first) return w;
    }
    return std::vector<std::string>{};
  };
  CHECK(words_of("h") == std::vector<std::string>{"h", "hashed", "4", "-", "2", "adam", "40"});
  CHECK(words_of("fd") == std::vector<std::string>{"fd", "fixed", "3", "50", "2", "adam", "50"});
  CHECK(words_of("fm") == std::vector<std::string>{"fm", "fixed", "2", "37", "2", "adagrad", "37"});
  CHECK(list.find(name + ".tables-1-of-2") != std::string::npos);
  CHECK(run("verify " + dir.path.string()).first == 0);
  const auto npy = (dir.path / "h.npy").string();
  REQUIRE(run("export " + dir.path.string() + " h " + npy + " --slot 1").first == 0);
  // The .npy files: a 1.0 header, then the data; compared with the library's reader.
  auto data_of = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string b((std::istreambuf_iterator<char>(in)), {});
    const std::size_t len = std::uint8_t(b[8]) | std::size_t(std::uint8_t(b[9])) << 8;
    return std::pair(b.substr(10, len), b.substr(10 + len));
  };
  const auto want = read_checkpoint_table(checkpoint_reader::open(dir.path, name), "h", 1);
  const auto [rows_head, rows] = data_of(npy);
  const auto [ids_head, ids] = data_of((dir.path / "h.ids.npy").string());
  CHECK(rows_head.find("'descr': '<f4'") != std::string::npos);
  CHECK(rows_head.find("'shape': (40, 4)") != std::string::npos);
  CHECK(ids_head.find("'descr': '<u8'") != std::string::npos);
  REQUIRE(rows.size() == want.rows.size() * 4);
  CHECK(std::memcmp(rows.data(), want.rows.data(), rows.size()) == 0);
  REQUIRE(ids.size() == 40 * 8);
  CHECK(std::memcmp(ids.data(), want.ids.data(), ids.size()) == 0);
  CHECK(std::is_sorted(want.ids.begin(), want.ids.end()));
  CHECK(run("export " + dir.path.string() + " h " + npy + " --slot 0").first == 0);
  CHECK(run("export " + dir.path.string() + " fm " + npy + " --slot 1").first == 1);  // Adagrad: one slot
}
#endif
