// dtf-ckpt — inspects dtf checkpoints (dtf/checkpoint.hpp).
//
//   dtf-ckpt list   DIR [NAME]                    variables with shapes, dtype and SHA-256 of
//                                                 their values; shard files with sizes and checksums
//   dtf-ckpt verify DIR [NAME | --all]            every file's size and SHA-256 and the shard layout
//   dtf-ckpt export DIR VARIABLE OUT.npy [--name NAME] [--slot K]
//                                                 one variable (or its update-rule slot K) as .npy
//
// NAME defaults to the latest checkpoint named by DIR/checkpoint. Exit status: 0 ok, 1 a
// checkpoint failed verification or a variable is missing, 2 bad usage.
#include <dtf/checkpoint.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int usage(const char* why) {
  if (why) std::fprintf(stderr, "dtf-ckpt: %s\n", why);
  std::fprintf(stderr,
               "usage: dtf-ckpt list DIR [NAME]\n"
               "       dtf-ckpt verify DIR [NAME | --all]\n"
               "       dtf-ckpt export DIR VARIABLE OUT.npy [--name NAME] [--slot K]\n"
               "NAME defaults to the latest checkpoint in DIR (its 'checkpoint' state file).\n");
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
  const auto t = dtf::read_checkpoint(dir, name);  // verifies every checksum first
  const auto& m = t.manifest;
  std::printf("checkpoint %s  global_step %lld  rule %s (%zu slots)  saved by %zu ps\n", m.name.c_str(),
              static_cast<long long>(m.global_step), m.rule.c_str(), m.num_slots, m.num_ps);
  std::printf("%-32s %-14s %-8s %10s %8s  %s\n", "variable", "shape", "dtype", "elements", "shards", "sha256 (values)");
  for (const auto& v : m.variables) {
    std::size_t shards = 0;
    for (const auto& s : m.shards) shards += m.variables[s.variable].name == v.name ? 1 : 0;
    const auto values = t.variable(v.name);
    std::printf("%-32s %-14s %-8s %10zu %8zu  %s\n", v.name.c_str(), dtf::to_string(v.shape).c_str(), m.dtype.c_str(),
                v.size(), shards, dtf::detail::sha256_hex(values.data(), values.size_bytes()).c_str());
  }
  std::printf("files:\n");
  for (const auto& f : m.files)
    std::printf("  %-40s ps %zu  %12llu bytes  sha256 %s\n", f.name.c_str(), f.ps,
                static_cast<unsigned long long>(f.bytes), f.sha256.c_str());
  return 0;
}

int verify(const std::string& dir, const std::string& arg) {
  std::vector<std::string> names;
  if (arg == "--all") {
    const auto state = dtf::read_checkpoint_state(dir);
    if (!state) throw dtf::error(dtf::errc::io_error, dir + " has no checkpoint state file");
    names = state->all;
  } else {
    names.push_back(resolve_name(dir, arg));
  }
  int failed = 0;
  for (const auto& n : names) {
    try {
      const auto m = dtf::verify_checkpoint(dir, n);
      std::printf("%s: OK (global step %lld, %zu variables, %zu files)\n", n.c_str(),
                  static_cast<long long>(m.global_step), m.variables.size(), m.files.size());
    } catch (const dtf::error& e) {
      std::printf("%s: FAILED: %s\n", n.c_str(), e.what());
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}

int export_npy(const std::string& dir, const std::string& variable, const std::string& out, const std::string& name_arg,
               int slot) {
  const auto name = resolve_name(dir, name_arg);
  const auto t = dtf::read_checkpoint(dir, name);
  const auto* v = t.manifest.find(variable);
  if (!v) {
    std::string known;
    for (const auto& x : t.manifest.variables) known += (known.empty() ? "" : ", ") + x.name;
    throw dtf::error(dtf::errc::invalid_argument, "checkpoint " + name + " has no variable '" + variable +
                                                      "' (it has: " + known + ")");
  }
  const auto data = t.variable(variable, slot);
  dtf::write_npy(out, v->shape, data);
  std::printf("%s%s of %s: %s float32 -> %s\n", variable.c_str(),
              slot < 0 ? "" : (" slot " + std::to_string(slot)).c_str(), name.c_str(), dtf::to_string(v->shape).c_str(),
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
