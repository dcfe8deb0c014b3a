// libFuzzer target for the checkpoint reader: the manifest, the state file, shard files and
// embedding-table files (headers and rows) as dtf::checkpoint_reader sees them. Whatever the bytes, reading either
// succeeds or throws dtf::error; it never crashes, reads or writes out of bounds, or allocates
// more than the input's bytes back. Input: sections (checkpoint_input.hpp) — manifest, state
// file, shard files (as many as the manifest's "files", when it parses), then table files. Each
// input runs twice: as given (checksums and sizes as written), and with the manifest's sizes and
// SHA-256 replaced by the sections' own, so the fuzzer gets past the checksum into the headers,
// the layout and the table rows.
#include <dtf/checkpoint.hpp>

#include "checkpoint_input.hpp"
#include "checkpoint_seeds.hpp"

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace {

void read_everything(const dtf::checkpoint_reader& r) {
  std::vector<float> buf(r.num_parameters());
  for (std::size_t t = 0; t <= r.manifest().num_slots; ++t) r.read(t, 0, buf);
  for (const auto& v : r.manifest().variables) {
    std::vector<float> one(v.size());
    r.read_variable(v.name, -1, one);
  }
  dtf::detail::ckpt::check_table_rows(r.table_files());
  for (const auto& t : r.manifest().tables)
    for (int slot = -1; slot < int(t.num_slots); ++slot) (void)dtf::read_checkpoint_table(r, t.spec.name, slot);
}

void open_and_read(const std::string& manifest, const std::vector<std::span<const std::byte>>& shards,
                   const std::vector<std::span<const std::byte>>& tables) {
  try {
    read_everything(dtf::checkpoint_reader::from_memory(manifest, shards, "fuzz.manifest.json", tables));
  } catch (const dtf::error&) {
  }
}

}  // namespace

// Before fuzzing: the seed corpus, when run_checkpoint_fuzzer.sh asks for it.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* work = std::getenv("DTF_SEED_WORK");
  const char* corpus = std::getenv("DTF_SEED_CORPUS");
  if (work && corpus) {
    const int n = dtf::fuzz::write_checkpoint_seeds(work, corpus);
    std::fprintf(stderr, "checkpoint_fuzzer: %d seed checkpoints written to %s\n", n, corpus);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto sections = dtf::fuzz::split_sections(std::string_view(reinterpret_cast<const char*>(data), size));
  const std::string manifest(sections[0]);
  try {
    (void)dtf::checkpoint_state::from_json(dtf::detail::ckpt::parse_json(std::string(sections.size() > 1 ? sections[1] : ""),
                                                                       "fuzz/checkpoint"),
                                          "fuzz/checkpoint");
  } catch (const dtf::error&) {
  }
  // The first sections after the state file are shard files (as many as the manifest names, when
  // it parses), the rest table files.
  std::size_t num_shards = sections.size() > 2 ? sections.size() - 2 : 0;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(manifest);
    if (j.is_object() && j.contains("files") && j["files"].is_array()) num_shards = std::min(num_shards, j["files"].size());
  } catch (const nlohmann::json::exception&) {
    j = nullptr;
  }
  std::vector<std::span<const std::byte>> shards, tables;
  for (std::size_t i = 2; i < sections.size(); ++i)
    (i < 2 + num_shards ? shards : tables)
        .emplace_back(reinterpret_cast<const std::byte*>(sections[i].data()), sections[i].size());
  open_and_read(manifest, shards, tables);
  // The same with the manifest's file sizes and checksums made to agree with the sections.
  try {
    auto fix = [&](const char* key, const std::vector<std::span<const std::byte>>& given) {
      if (!j.is_object() || !j.contains(key) || !j[key].is_array()) return;
      auto& files = j[key];
      for (std::size_t i = 0; i < files.size() && i < given.size(); ++i)
        if (files[i].is_object()) {
          files[i]["bytes"] = given[i].size();
          files[i]["sha256"] = dtf::detail::sha256_hex(given[i].data(), given[i].size());
        }
    };
    fix("files", shards);
    fix("table_files", tables);
    if (j.is_object()) open_and_read(j.dump(), shards, tables);
  } catch (const nlohmann::json::exception&) {
  }
  return 0;
}
