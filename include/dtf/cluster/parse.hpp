// dtf/cluster/parse.hpp — the pieces every cluster source shares: job names, address lists,
// Slurm node lists and tasks-per-node lists, numbers from the environment, each checked and
// named in its error (dtf/cluster.hpp).
#pragma once

#include <dtf/cluster/spec.hpp>
#include <dtf/error.hpp>
#include <dtf/transport/address.hpp>

#include <algorithm>
#include <charconv>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dtf {

namespace detail {

[[noreturn]] inline void config_error(const std::string& message) { throw error(errc::invalid_config, message); }

inline std::string_view trim_blanks(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

inline bool is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Digits only (no sign, no blanks); nullopt when empty, not decimal or too large.
inline std::optional<std::uint64_t> parse_decimal(std::string_view s) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), is_digit)) return std::nullopt;
  std::uint64_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

inline const char* known_jobs_text() { return "chief, master, worker, ps, evaluator"; }

// The job a name stands for ("master" is the legacy name of "chief"); nullopt when unknown.
inline std::optional<std::string> canonical_job(std::string_view name) {
  if (name == "master") return "chief";
  if (name == "chief" || name == "worker" || name == "ps" || name == "evaluator") return std::string(name);
  return std::nullopt;
}

inline std::string label(std::string_view job, std::size_t index) {
  return std::string(job) + "[" + std::to_string(index) + "]";
}

// Finds an address given to two tasks, across all jobs.
class address_registry {
 public:
  // `label` names the task as the user wrote it ("master[0]"), `field` the place to blame.
  void add(const std::string& address, const std::string& label, const std::string& field) {
    if (address.empty()) return;
    const auto [it, inserted] = seen_.emplace(address, label);
    if (!inserted) config_error(field + ": duplicate address " + address + " (also " + it->second + ")");
  }

 private:
  std::map<std::string, std::string> seen_;
};

// A Slurm step or MPI world larger than this is a malformed variable, not a real job; the
// bound keeps a bad value from allocating without limit.
inline constexpr std::uint64_t max_cluster_tasks = std::uint64_t(1) << 20;

// Splits text on commas outside brackets.
inline std::vector<std::string_view> split_top_level(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t depth = 0, start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') ++depth;
    else if (text[i] == ']' && depth > 0) --depth;
    else if (text[i] == ',' && depth == 0) {
      out.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(text.substr(start));
  return out;
}

inline std::vector<std::string> expand_nodelist(std::string_view list, const std::string& field) {
  const auto fail = [&](const std::string& why) {
    config_error(field + ": bad node list '" + std::string(list) + "': " + why);
  };
  // Brackets first, so that the errors below can assume they pair up.
  std::size_t depth = 0;
  for (const char c : list) {
    if (c == '[' && depth++ > 0) fail("nested '['");
    if (c == ']' && depth-- == 0) fail("unbalanced ']'");
  }
  if (depth != 0) fail("unbalanced '['");
  if (trim_blanks(list).empty()) fail("empty");

  std::vector<std::string> hosts;
  std::size_t position = 0;
  for (const std::string_view item : split_top_level(list)) {
    if (item.empty()) fail("empty host name at position " + std::to_string(position));
    ++position;
    // A host pattern is literal text and bracket groups; the groups multiply out, the
    // leftmost varying slowest ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2).
    std::vector<std::string> names{""};
    std::size_t pos = 0;
    while (pos <= item.size()) {
      const std::size_t open = std::min(item.find('[', pos), item.size());
      const std::string_view literal = item.substr(pos, open - pos);
      for (const char c : literal)
        if (!is_alnum(c) && c != '-' && c != '.' && c != '_')
          fail("unexpected character '" + std::string(1, c) + "' in host name '" + std::string(item) + "'");
      for (auto& name : names) name += literal;
      if (open == item.size()) break;
      const std::size_t close = item.find(']', open);
      const std::string_view group = item.substr(open + 1, close - open - 1);
      if (group.empty()) fail("empty brackets in '" + std::string(item) + "'");
      std::vector<std::string> values;
      for (const std::string_view range : split_top_level(group)) {
        const std::size_t dash = range.find('-');
        const std::string_view lo_text = range.substr(0, dash);
        const std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
        const auto lo = parse_decimal(lo_text), hi = parse_decimal(hi_text);
        if (!lo || !hi) fail("bad range '" + std::string(range) + "' in '" + std::string(item) + "' (expected N or N-M)");
        if (*lo > *hi) fail("range " + std::string(range) + " is descending");
        if (*hi - *lo >= max_cluster_tasks || values.size() + (*hi - *lo) >= max_cluster_tasks)
          fail("more than " + std::to_string(max_cluster_tasks) + " hosts");
        // Slurm pads every number to the width of the range's lower bound ("01-10").
        for (std::uint64_t v = *lo; v <= *hi; ++v) {
          std::string digits = std::to_string(v);
          if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
          values.push_back(std::move(digits));
        }
      }
      if (names.size() * values.size() > max_cluster_tasks) fail("more than " + std::to_string(max_cluster_tasks) + " hosts");
      std::vector<std::string> product;
      product.reserve(names.size() * values.size());
      for (const auto& name : names)
        for (const auto& value : values) product.push_back(name + value);
      names = std::move(product);
      pos = close + 1;
    }
    if (hosts.size() + names.size() > max_cluster_tasks) fail("more than " + std::to_string(max_cluster_tasks) + " hosts");
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

// "2(x3),1" -> 2 2 2 1.
inline std::vector<std::size_t> parse_tasks_per_node(std::string_view text, const std::string& field) {
  const auto fail = [&](const std::string& why) {
    config_error(field + ": bad tasks-per-node list '" + std::string(text) + "': " + why);
  };
  std::vector<std::size_t> counts;
  for (std::string_view item : split_top_level(text)) {
    item = trim_blanks(item);
    std::string_view count_text = item, repeat_text = "1";
    if (const std::size_t paren = item.find('('); paren != std::string_view::npos) {
      if (!item.ends_with(')') || item.substr(paren, 2) != "(x")
        fail("expected N or N(xM), got '" + std::string(item) + "'");
      count_text = item.substr(0, paren);
      repeat_text = item.substr(paren + 2, item.size() - paren - 3);
    }
    const auto count = parse_decimal(count_text), repeat = parse_decimal(repeat_text);
    if (!count || !repeat || *count == 0 || *repeat == 0)
      fail("expected N or N(xM) with N, M >= 1, got '" + std::string(item) + "'");
    if (*count > max_cluster_tasks || *repeat > max_cluster_tasks - counts.size())
      fail("more than " + std::to_string(max_cluster_tasks) + " nodes or tasks");
    counts.insert(counts.end(), std::size_t(*repeat), std::size_t(*count));
  }
  return counts;
}

// A variable holding a count or rank.
inline std::uint64_t env_number(const std::string& name, const std::string& value) {
  const auto parsed = parse_decimal(trim_blanks(value));
  if (!parsed) config_error(name + " '" + value + "' is not a non-negative integer");
  return *parsed;
}

// The first of two variables that is set, with its name.
inline std::pair<std::string, std::optional<std::string>> first_set(const environment& env, const std::string& first,
                                                                    const std::string& second) {
  if (auto value = env(first)) return {first, std::move(value)};
  return {second, env(second)};
}

// Rank r of a Slurm or MPI world: ranks 0..num_ps-1 are ps tasks, the rest workers.
inline task_id rank_task(std::size_t rank, std::size_t num_ps) {
  return rank < num_ps ? task_id{"ps", rank} : task_id{"worker", rank - num_ps};
}

inline void check_has_workers(std::size_t num_ps, std::size_t num_tasks, const std::string& what) {
  if (num_ps >= num_tasks)
    config_error("--num_ps " + std::to_string(num_ps) + " leaves no workers: " + what + " is " +
                 std::to_string(num_tasks));
}

}  // namespace detail

/// Splits "host:port" or "[ipv6]:port" into the host (without brackets) and the port.
/// Throws dtf::error(errc::invalid_config) starting with `field` when the host is empty or
/// holds characters a host name or address cannot, an IPv6 address is not in brackets, or
/// the port is missing, not a number or outside 1..65535.
inline std::pair<std::string, std::uint16_t> split_host_port(std::string_view addr, std::string_view field) {
  std::string why;
  auto parsed = transport::parse_address(addr, transport::address_use::connect, why);
  if (!parsed) detail::config_error(std::string(field) + ": bad address '" + std::string(addr) + "' (" + why + ")");
  return {std::move(parsed->host), parsed->port};
}

/// Expands a Slurm node list: "n[1-3],m5" -> n1 n2 n3 m5; "node[01-03,7]" -> node01 node02
/// node03 node7 (numbers keep the width of the range's lower bound); several bracket groups
/// in one name multiply out, the leftmost varying slowest. Throws
/// dtf::error(errc::invalid_config) for a descending range, unbalanced or nested brackets,
/// an empty name or range, or a character a host name cannot hold.
inline std::vector<std::string> expand_slurm_nodelist(std::string_view list) {
  return detail::expand_nodelist(list, "Slurm");
}

}  // namespace dtf
