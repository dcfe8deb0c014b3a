// --metrics_file: the final figures of a run as one JSON object, for dtfrun sweep and scripts.
#pragma once

#include <dtf/error.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace examples {

/// Writes {"accuracy", "loss", "global_step", "wall_s", "workers"} to `path` through a
/// temporary file renamed over it, so that a reader sees the whole object or nothing.
inline void write_metrics_file(const std::string& path, double accuracy, double loss, std::int64_t global_step,
                               double wall_s, std::size_t workers) {
  const std::filesystem::path target(path);
  const std::filesystem::path temporary = target.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    char json[256];
    std::snprintf(json, sizeof json,
                  "{\"accuracy\": %.6f, \"loss\": %.6f, \"global_step\": %lld, \"wall_s\": %.3f, \"workers\": %zu}\n",
                  accuracy, loss, static_cast<long long>(global_step), wall_s, workers);
    out << json;
    out.flush();
    if (!out) throw dtf::error(dtf::errc::io_error, "--metrics_file: cannot write '" + temporary.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(temporary, target, ec);
  if (ec)
    throw dtf::error(dtf::errc::io_error, "--metrics_file: cannot rename '" + temporary.string() + "' to '" +
                                              target.string() + "': " + ec.message());
}

}  // namespace examples
