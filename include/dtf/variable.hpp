// dtf/variable.hpp — a model variable's name, shape and place in the flat parameter buffer.
#pragma once

#include <dtf/shape.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace dtf {

/// A named variable of a model: its place in the model's flat float32 parameter buffer.
struct variable_spec {
  std::string name;    ///< unique within the model, e.g. "dense_0/kernel"
  dims shape;          ///< row-major
  std::size_t offset;  ///< first element in the flat buffer
  /// The number of elements.
  std::size_t size() const noexcept { return num_elements(shape); }
  /// The size in bytes (float32).
  std::size_t size_bytes() const noexcept { return size() * sizeof(float); }
};

/// Total number of elements of all variables (the size of the flat buffer).
inline std::size_t num_parameters(const std::vector<variable_spec>& vars) noexcept {
  std::size_t n = 0;
  for (const auto& v : vars) n = std::max(n, v.offset + v.size());
  return n;
}

}  // namespace dtf
