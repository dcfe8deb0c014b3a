// Shared by the examples: Fashion-MNIST loading with its flags (--data, --train_examples), and
// a comma-separated list flag.
#pragma once

#include <dtf/data/dataset.hpp>
#include <dtf/data/fashion_mnist.hpp>
#include <dtf/error.hpp>
#include <dtf/flags.hpp>

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

struct fashion_mnist {
  std::string dir = dtf::data::fashion_mnist_default_dir;
  int train_examples = 0;

  void add_to(dtf::flag_parser& f) {
    f.add("data", dir, "directory holding the Fashion-MNIST IDX files")
        .add("train_examples", train_examples, "use only the first N training examples (0: all)");
  }
  /// The training set (the first --train_examples when given), normalised to [0, 1].
  dtf::data::dataset train() const {
    auto d = dtf::data::load_fashion_mnist(dtf::data::split::train, dir);
    if (train_examples > 0) d = d.take(std::size_t(train_examples));
    return d.normalize();
  }
  /// The test set, normalised, in batches of 1000.
  dtf::data::dataset test() const {
    return dtf::data::load_fashion_mnist(dtf::data::split::test, dir).normalize().batch(1000);
  }
};

/// "0.05,0.02" -> {0.05, 0.02}. Errors name the flag.
inline std::vector<float> parse_floats(const std::string& text, const char* flag) {
  std::vector<float> out;
  std::size_t at = 0;
  while (!text.empty()) {
    const auto comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    try {
      std::size_t used = 0;
      out.push_back(std::stof(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw dtf::error(dtf::errc::invalid_config, std::string("--") + flag + ": cannot parse '" + item + "'");
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace examples
