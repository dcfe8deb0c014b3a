// dtf-ckpt — inspects dtf checkpoints (dtf/checkpoint.hpp).
//
//   dtf-ckpt list   DIR [NAME]                    variables with shapes, dtype and SHA-256 of
//                                                 their values; embedding tables (kind, dim, rows
//                                                 saved); shard and table files with sizes, checksums
//                                                 and the rows of each table in each table file
//   dtf-ckpt verify DIR [NAME | --all]            every field, file size, SHA-256, the shard layout
//                                                 and every table row's id; --all: every kept
//                                                 checkpoint, which are usable and which one a
//                                                 restore would use
//   dtf-ckpt export DIR VARIABLE OUT.npy [--name NAME] [--slot K]
//                                                 one variable (or its update-rule slot K) as .npy;
//                                                 an embedding table: its rows sorted by id as
//                                                 OUT.npy [rows, dim] float32 and their ids as
//                                                 OUT.ids.npy [rows] uint64
//
// NAME defaults to the latest checkpoint named by DIR/checkpoint. Everything goes through the
// library's one reader (dtf::checkpoint_reader: the same checks as restore), streaming: no
// command holds a whole checkpoint in memory (export holds the one variable or table). Exit status: 0 ok, 1 a checkpoint failed
// verification or a variable is missing, 2 bad usage.
#include <dtf/checkpoint.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

int usage(const char* why) {
  if (why) std::fprintf(stderr, "dtf-ckpt: %s\n", why);
  std::fprintf(stderr,
               "usage: dtf-ckpt list DIR [NAME]\n"
               "       dtf-ckpt verify DIR [NAME | --all]\n"
               "       dtf-ckpt export DIR VARIABLE|TABLE OUT.npy [--name NAME] [--slot K]\n"
               "NAME defaults to the latest checkpoint in DIR (its 'checkpoint' state file).\n"
               "A table exports its rows sorted by id to OUT.npy and their ids to OUT.ids.npy.\n");
  return 2;
}

std::string resolve_name(const std::string& dir, const std::string& name) {
  if (!name.empty()) return name;
  const auto latest = dtf::latest_checkpoint(dir);
  if (!latest) throw dtf::error(dtf::errc::io_error, dir + " has no checkpoint state file (or it names none)");
  return *latest;
}

int list(const std::string& dir, const std::string& name_arg) {
  const auto name = resolve_name(dir, name_arg);
  const auto r = dtf::checkpoint_reader::open(dir, name);  // verifies every checksum first
  const auto& m = r.manifest();
  std::printf("checkpoint %s  global_step %lld  rule %s (%zu slots)  saved by %zu ps\n", m.name.c_str(),
              static_cast<long long>(m.global_step), m.rule.c_str(), m.num_slots, m.num_ps);
  std::printf("%-32s %-14s %-8s %10s %8s  %s\n", "variable", "shape", "dtype", "elements", "shards", "sha256 (values)");
  std::vector<float> chunk(std::size_t(1) << 18);
  for (std::size_t i = 0; i < m.variables.size(); ++i) {
    const auto& v = m.variables[i];
    std::size_t shards = 0;
    for (const auto& s : m.shards) shards += s.variable == i ? 1 : 0;
    dtf::detail::sha256 h;
    for (std::size_t at = 0; at < v.size(); at += chunk.size()) {
      const auto part = std::span<float>(chunk).first(std::min(chunk.size(), v.size() - at));
      r.read(0, v.offset + at, part);
      h.update(part.data(), part.size_bytes());
    }
    std::printf("%-32s %-14s %-8s %10zu %8zu  %s\n", v.name.c_str(), dtf::to_string(v.shape).c_str(), m.dtype.c_str(),
                v.size(), shards, h.hex().c_str());
  }
  if (!m.tables.empty()) {
    std::printf("%-32s %-7s %8s %12s %8s %-10s %12s\n", "table", "kind", "dim", "rows", "shards", "rule", "rows saved");
    for (const auto& t : m.tables)
      std::printf("%-32s %-7s %8u %12s %8llu %-10s %12llu\n", t.spec.name.c_str(), t.spec.hashed() ? "hashed" : "fixed",
                  unsigned(t.spec.dim), t.spec.hashed() ? "-" : std::to_string(t.spec.rows).c_str(),
                  static_cast<unsigned long long>(t.num_shards), t.rule.c_str(),
                  static_cast<unsigned long long>(t.rows_saved));
  }
  std::printf("files:\n");
  for (const auto& f : m.files)
    std::printf("  %-40s ps %zu  %12llu bytes  sha256 %s\n", f.name.c_str(), f.ps,
                static_cast<unsigned long long>(f.bytes), f.sha256.c_str());
  for (std::size_t i = 0; i < m.table_files.size(); ++i) {
    const auto& f = m.table_files[i];
    std::printf("  %-40s ps %zu  %12llu bytes  sha256 %s\n", f.name.c_str(), f.ps,
                static_cast<unsigned long long>(f.bytes), f.sha256.c_str());
    for (const auto& t : r.table_files()[i].header().tables) {
      unsigned long long rows = 0;
      for (const auto& s : t.shards) rows += s.rows;
      std::printf("    %-38s %zu shards  %12llu rows\n", t.table.spec.name.c_str(), t.shards.size(), rows);
    }
  }
  return 0;
}

void print_verdict(const std::string& name, const std::optional<dtf::checkpoint_manifest>& m, const std::string& why) {
  if (m)
    std::printf("%s: OK (global step %lld, %zu variables, %zu tables, %zu files)\n", name.c_str(),
                static_cast<long long>(m->global_step), m->variables.size(), m->tables.size(),
                m->files.size() + m->table_files.size());
  else
    std::printf("%s: FAILED: %s\n", name.c_str(), why.c_str());
}

int verify(const std::string& dir, const std::string& arg) {
  if (arg != "--all") {
    const auto name = resolve_name(dir, arg);
    try {
      print_verdict(name, dtf::verify_checkpoint(dir, name), "");
      return 0;
    } catch (const dtf::error& e) {
      print_verdict(name, std::nullopt, e.what());
      return 1;
    }
  }
  if (!dtf::read_checkpoint_state(dir)) throw dtf::error(dtf::errc::io_error, dir + " has no checkpoint state file");
  const auto verdicts = dtf::verify_all_checkpoints(dir);
  std::string usable, restore;
  for (const auto& v : verdicts) {
    print_verdict(v.name + (v.latest ? " (latest)" : ""), v.manifest, v.error);
    if (v.usable()) {
      usable += (usable.empty() ? "" : ", ") + v.name;
      restore = v.name;  // oldest first: the last usable one is the newest
    }
  }
  // What a restore would do: the latest when it verifies, else the newest kept one that does.
  const auto latest = std::find_if(verdicts.begin(), verdicts.end(), [](const auto& v) { return v.latest; });
  if (latest != verdicts.end() && latest->usable()) restore = latest->name;
  std::printf("usable: %s\n", usable.empty() ? "none" : usable.c_str());
  std::printf("restore would use: %s\n", restore.empty() ? "none (restore fails)" : restore.c_str());
  return usable.size() && std::all_of(verdicts.begin(), verdicts.end(), [](const auto& v) { return v.usable(); }) ? 0 : 1;
}

int export_npy(const std::string& dir, const std::string& variable, const std::string& out, const std::string& name_arg,
               int slot) {
  const auto name = resolve_name(dir, name_arg);
  const auto r = dtf::checkpoint_reader::open(dir, name);
  if (!r.manifest().find(variable) && r.manifest().find_table(variable)) {
    const auto t = dtf::read_checkpoint_table(r, variable, slot);
    const std::string ids = (out.size() > 4 && out.ends_with(".npy") ? out.substr(0, out.size() - 4) : out) + ".ids.npy";
    dtf::write_npy(out, {t.ids.size(), t.dim}, t.rows);
    dtf::write_npy(ids, {t.ids.size()}, std::span<const std::uint64_t>(t.ids));
    std::printf("table %s%s of %s: %zu rows x %u float32 -> %s, ids -> %s\n", variable.c_str(),
                slot < 0 ? "" : (" slot " + std::to_string(slot)).c_str(), name.c_str(), t.ids.size(), unsigned(t.dim),
                out.c_str(), ids.c_str());
    return 0;
  }
  const auto& v = r.variable(variable);
  std::vector<float> data(v.size());
  r.read_variable(variable, slot, data);
  dtf::write_npy(out, v.shape, data);
  std::printf("%s%s of %s: %s float32 -> %s\n", variable.c_str(),
              slot < 0 ? "" : (" slot " + std::to_string(slot)).c_str(), name.c_str(), dtf::to_string(v.shape).c_str(),
              out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") return usage(nullptr);
  const std::string cmd = args[0];
  if (cmd == "list") {
    if (args.size() < 2 || args.size() > 3) return usage("list takes DIR [NAME]");
    return list(args[1], args.size() == 3 ? args[2] : "");
  }
  if (cmd == "verify") {
    if (args.size() < 2 || args.size() > 3) return usage("verify takes DIR [NAME | --all]");
    return verify(args[1], args.size() == 3 ? args[2] : "");
  }
  if (cmd == "export") {
    if (args.size() < 4) return usage("export takes DIR VARIABLE OUT.npy");
    std::string name;
    int slot = -1;
    for (std::size_t i = 4; i < args.size(); ++i) {
      if (args[i] == "--name" && i + 1 < args.size()) {
        name = args[++i];
      } else if (args[i] == "--slot" && i + 1 < args.size()) {
        char* end = nullptr;
        const long k = std::strtol(args[++i].c_str(), &end, 10);
        if (*end != '\0' || k < 0 || k > 1) return usage("--slot takes 0 or 1");
        slot = int(k);
      } else {
        return usage(("unknown export option '" + args[i] + "'").c_str());
      }
    }
    return export_npy(args[1], args[2], args[3], name, slot);
  }
  return usage(("unknown command '" + cmd + "'").c_str());
} catch (const std::exception& e) {
  std::fprintf(stderr, "dtf-ckpt: %s\n", e.what());
  return 1;
}
