// The checkpoint fuzz target's input: sections separated by a marker line —
//   manifest JSON, state file JSON, then one section per shard file (in the manifest's order).
// Shared by the target and the seed generator.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtf::fuzz {

inline constexpr std::string_view section_marker = "\n--dtf-section--\n";

inline std::vector<std::string_view> split_sections(std::string_view in) {
  std::vector<std::string_view> out;
  for (;;) {
    const auto at = in.find(section_marker);
    out.push_back(in.substr(0, at));
    if (at == std::string_view::npos) return out;
    in.remove_prefix(at + section_marker.size());
  }
}

inline std::string join_sections(const std::vector<std::string>& parts) {
  std::string s;
  for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? std::string(section_marker) : "") + parts[i];
  return s;
}

}  // namespace dtf::fuzz
