// dtf/dtype.hpp — element types of tensors, and their mapping to C++ types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace dtf {

/// Element type of a tensor. The numeric values are part of the wire and checkpoint
/// formats: never renumber.
enum class dtype : std::uint8_t {
  float32 = 1,
  float64 = 2,
  int32 = 3,
  int64 = 4,
  uint8 = 5,
};

/// Bytes per element.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return 4;
    case dtype::float64: return 8;
    case dtype::int32: return 4;
    case dtype::int64: return 8;
    case dtype::uint8: return 1;
  }
  return 0;
}

/// The dtype's name: "float32", "float64", "int32", "int64" or "uint8".
constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::uint8: return "uint8";
  }
  return "unknown";
}

/// dtype_of<T>::value is the dtype of the C++ type T, defined for the tensor element types only
/// (float, double, std::int32_t, std::int64_t, std::uint8_t); dtype_v<T> reads it.
template <class T>
struct dtype_of;  // no definition: only the types below are tensor elements
/// \cond
template <> struct dtype_of<float> { static constexpr dtype value = dtype::float32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::float64; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::int32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::int64; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::uint8; };
/// \endcond

/// The dtype of C++ type T (float, double, int32_t, int64_t, uint8_t).
template <class T>
inline constexpr dtype dtype_v = dtype_of<std::remove_cv_t<T>>::value;

/// Satisfied by the C++ types a tensor can hold.
template <class T>
concept tensor_element = requires { dtype_of<std::remove_cv_t<T>>::value; };

}  // namespace dtf
