// The checkpoint fuzz target's seed corpus: real checkpoints written by the library's own
// writers (one process's host state with each update rule, and a 2-ps checkpoint written shard
// file by shard file as the ps tasks do, without and with embedding-table files), each packed as the target's input
// (checkpoint_input.hpp). The target writes them at start-up when DTF_SEED_WORK and
// DTF_SEED_CORPUS name a scratch directory and its corpus directory (run_checkpoint_fuzzer.sh).
#pragma once

#include <dtf/checkpoint.hpp>

#include "checkpoint_input.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dtf::fuzz {

namespace fs = std::filesystem;

namespace seeds {

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void pack(const fs::path& dir, const std::string& name, const fs::path& out) {
  const auto m = dtf::read_manifest(dir, name);
  std::vector<std::string> parts{slurp(dir / (name + ".manifest.json")), slurp(dir / "checkpoint")};
  for (const auto& f : m.files) parts.push_back(slurp(dir / f.name));
  for (const auto& f : m.table_files) parts.push_back(slurp(dir / f.name));
  std::ofstream(out, std::ios::binary) << dtf::fuzz::join_sections(parts);
}

}  // namespace seeds

/// Writes the seeds: checkpoints into work/, their packed inputs into corpus/.
inline int write_checkpoint_seeds(const fs::path& work, const fs::path& corpus) {
  fs::create_directories(corpus);
  const std::vector<dtf::variable_spec> vars{
      {"dense_0/kernel", {4, 3}, 0}, {"dense_0/bias", {3}, 12}, {"scale", {}, 15}, {"empty", {0, 2}, 16}};
  std::vector<float> values(16), s0(16), s1(16);
  for (std::size_t i = 0; i < 16; ++i) {
    values[i] = 0.5f * float(i) - 2.0f;
    s0[i] = 0.01f * float(i);
    s1[i] = 1.0f + float(i);
  }
  int k = 0;
  for (const char* rule : {"sgd", "momentum", "adagrad", "adam"}) {
    const auto dir = work / rule;
    fs::remove_all(dir);
    dtf::host_checkpoint_state st{.variables = vars, .values = values, .rule = rule, .slots = {}, .iterations = 7,
                                  .global_step = 7};
    const int n = dtf::detail::ckpt::rule_slots(rule);
    if (n >= 1) st.slots.push_back(s0);
    if (n >= 2) st.slots.push_back(s1);
    const auto m = dtf::write_checkpoint({.directory = dir.string(), .max_to_keep = 2}, st);
    seeds::pack(dir, m.name, corpus / ("host_" + std::string(rule)));
    ++k;
  }
  // Two ps: dense_0/kernel split in rows [0, 2) on ps 0 and [2, 4) on ps 1, the rest on ps 1.
  const auto dir = work / "two_ps";
  fs::remove_all(dir);
  dtf::checkpoint_manifest m;
  m.name = "ckpt-3";
  m.global_step = 3;
  m.num_ps = 2;
  m.rule = "momentum";
  m.num_slots = 1;
  for (const auto& v : vars) m.variables.push_back({v.name, v.shape, v.offset, 3});
  m.shards = {{0, 0, 0, 0, 0, 2, 0, 6}, {1, 0, 1, 1, 2, 4, 6, 6}, {2, 1, 0, 1, 0, 3, 12, 3},
              {3, 2, 0, 0, 0, 1, 15, 1}, {4, 3, 0, 1, 0, 0, 16, 0}};
  auto write_shards = [&] {
    m.files.clear();
    for (std::size_t ps = 0; ps < 2; ++ps) {
      std::vector<dtf::detail::ckpt::shard_record> records;
      for (const auto& s : m.shards)
        if (s.ps == ps)
          records.push_back({.id = s.id, .size = s.size, .iterations = 3, .tensors = {values.data() + s.offset, s0.data() + s.offset}});
      m.files.push_back(dtf::detail::ckpt::write_shard_file(dir, m.name, ps, 2, 3, 1, records));
    }
  };
  write_shards();
  dtf::commit_checkpoint(dir, m, 0);
  seeds::pack(dir, m.name, corpus / "two_ps");
  // The same with embedding tables: a fixed one over both ps, a hashed one on ps 0.
  m.name = "ckpt-4";
  write_shards();
  const dtf::checkpoint_table words{{.name = "words", .rows = 5, .dim = 2}, 2, "momentum", 1, 5};
  const dtf::checkpoint_table users{{.name = "users", .dim = 2, .max_rows = 8, .evict_after = 3}, 1, "momentum", 1, 3};
  auto snapshot = [&](const dtf::checkpoint_table& t, std::uint32_t shard, std::vector<std::uint64_t> ids) {
    dtf::detail::ckpt::table_snapshot::shard s{shard, 4, ids.size(), {}};
    for (auto id : ids) {
      std::vector<float> row{0.25f * float(id % 16), -1.0f, 0.5f, 0.125f};  // values, slot
      const auto* at = reinterpret_cast<const std::byte*>(&id);
      s.records.insert(s.records.end(), at, at + 8);
      const auto* f = reinterpret_cast<const std::byte*>(row.data());
      s.records.insert(s.records.end(), f, f + row.size() * sizeof(float));
      if (t.spec.hashed()) s.records.insert(s.records.end(), at, at + 8);  // an age
    }
    return dtf::detail::ckpt::table_snapshot{t, {s}};
  };
  m.tables = {words, users};
  m.table_files = {
      dtf::detail::ckpt::write_table_file(dir, m.name, 0, 2,
                                          {snapshot(words, 0, {0, 1, 2}), snapshot(users, 0, {7, 12345, 1ull << 40})}),
      dtf::detail::ckpt::write_table_file(dir, m.name, 1, 2, {snapshot(words, 1, {3, 4})})};
  dtf::commit_checkpoint(dir, m, 0);
  seeds::pack(dir, m.name, corpus / "two_ps_tables");
  return k + 2;
}

}  // namespace dtf::fuzz
