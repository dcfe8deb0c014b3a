// The benchmarks' MLP of any shape: --hidden "2048,2048" gives Dense+ReLU per hidden layer and
// Dense logits (the same network as train_peers.py and overlap_peer_ddp.py build).
#pragma once

#include <dtf/nn/sequential.hpp>

#include <cstddef>
#include <sstream>
#include <string>
#include <vector>

namespace bench {

/// "256,128" -> {256, 128}.
inline std::vector<std::size_t> parse_widths(const std::string& s) {
  std::vector<std::size_t> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) out.push_back(std::stoul(part));
  return out;
}

/// {inputs, hidden..., classes}.
inline std::vector<std::size_t> layer_widths(std::size_t inputs, const std::string& hidden, std::size_t classes) {
  std::vector<std::size_t> widths{inputs};
  for (auto w : parse_widths(hidden)) widths.push_back(w);
  widths.push_back(classes);
  return widths;
}

/// Dense layers between consecutive widths, ReLU after each but the last.
inline dtf::nn::sequential mlp(const std::vector<std::size_t>& widths) {
  std::vector<dtf::nn::layer> layers;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    layers.push_back(dtf::nn::dense(widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) layers.push_back(dtf::nn::relu());
  }
  return dtf::nn::sequential(std::move(layers));
}

}  // namespace bench
