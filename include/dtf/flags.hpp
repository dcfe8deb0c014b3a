// dtf/flags.hpp — command-line flags for dtf programs (`--name value` or `--name=value`).
//
//   int epochs = 5; float lr = 1e-3f;
//   dtf::flag_parser flags("Trains an MLP on Fashion-MNIST.");
//   flags.add("epochs", epochs, "passes over the training set").add("lr", lr, "learning rate");
//   if (!flags.parse(argc, argv)) return 0;  // --help printed the usage
//
// Errors: dtf::error(errc::invalid_config) naming the flag for an unknown flag, a missing
// value, or a value that does not parse completely as the flag's type.
#pragma once

#include <dtf/error.hpp>

#include <charconv>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtf {

/// Command-line flags for dtf programs (`--name value` or `--name=value`), each bound to a
/// variable that holds its default. Errors: dtf::error(errc::invalid_config) naming the flag for
/// an unknown flag, a missing value, or a value that does not parse completely as the flag's type.
class flag_parser {
 public:
  /// A parser whose usage starts with `description`.
  explicit flag_parser(std::string description) : description_(std::move(description)) {}

  /// Registers --name bound to target (bool, integers, float, double, std::string); the
  /// target's current value is the default.
  template <class T>
  flag_parser& add(const std::string& name, T& target, std::string help) {
    flag f;
    f.help = std::move(help);
    f.is_bool = std::is_same_v<T, bool>;
    f.default_value = show(target);
    f.set = [&target, name](std::string_view v) { parse_value(name, v, target); };
    flags_[name] = std::move(f);
    return *this;
  }

  /// Parses argv. Returns false (after printing the usage to stdout) when --help is given.
  /// Arguments after "--" and positional arguments are kept in positional().
  bool parse(int argc, const char* const* argv) {
    if (argc > 0) program_ = argv[0];
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i];
      if (arg == "--") {
        for (++i; i < argc; ++i) positional_.emplace_back(argv[i]);
        break;
      }
      if (!arg.starts_with("--")) {
        positional_.emplace_back(arg);
        continue;
      }
      arg.remove_prefix(2);
      if (arg == "help" || arg == "h") {
        std::cout << usage();
        return false;
      }
      std::string name(arg.substr(0, arg.find('=')));
      std::optional<std::string> value;
      if (arg.find('=') != std::string_view::npos) value = std::string(arg.substr(arg.find('=') + 1));
      auto it = flags_.find(name);
      if (it == flags_.end() && name.starts_with("no") && flags_.count(name.substr(2)) && flags_[name.substr(2)].is_bool &&
          !value) {
        flags_[name.substr(2)].set("false");
        continue;
      }
      if (it == flags_.end()) throw error(errc::invalid_config, "unknown flag --" + name + " (see --help)");
      if (!value) {
        if (it->second.is_bool) {
          value = "true";
        } else {
          if (i + 1 >= argc) throw error(errc::invalid_config, "flag --" + name + " needs a value");
          value = argv[++i];
        }
      }
      it->second.set(*value);
    }
    return true;
  }

  /// As parse(argc, argv) above, for main's non-const argv.
  bool parse(int argc, char** argv) { return parse(argc, const_cast<const char* const*>(argv)); }

  /// The arguments that are not flags, in order.
  const std::vector<std::string>& positional() const noexcept { return positional_; }

  /// The usage text --help prints: the description, then every flag with its default.
  std::string usage() const {
    std::string s = "usage: " + program_ + " [flags]\n" + description_ + "\n\nflags:\n";
    for (const auto& [name, f] : flags_)
      s += "  --" + name + (f.is_bool ? "" : " VALUE") + "\n      " + f.help + " (default: " + f.default_value + ")\n";
    return s;
  }

 private:
  struct flag {
    std::string help, default_value;
    bool is_bool = false;
    std::function<void(std::string_view)> set;
  };

  template <class T>
  static std::string show(const T& v) {
    if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
    else if constexpr (std::is_same_v<T, std::string>) return v.empty() ? "\"\"" : v;
    else return std::to_string(v);
  }

  template <class T>
  static void parse_value(const std::string& name, std::string_view v, T& out) {
    auto bad = [&] {
      return error(errc::invalid_config, "flag --" + name + ": cannot parse '" + std::string(v) + "'");
    };
    if constexpr (std::is_same_v<T, std::string>) {
      out = std::string(v);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (v == "true" || v == "1" || v == "yes") out = true;
      else if (v == "false" || v == "0" || v == "no") out = false;
      else throw bad();
    } else {
      T parsed{};
      auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), parsed);
      if (ec != std::errc() || ptr != v.data() + v.size() || v.empty()) throw bad();
      out = parsed;
    }
  }

  std::string description_, program_ = "program";
  std::map<std::string, flag> flags_;
  std::vector<std::string> positional_;
};

}  // namespace dtf
