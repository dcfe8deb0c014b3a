// dtf/device_span.hpp — a span that says its elements are in device memory.
//
// Functions that move a buffer over the network take a device_span where the caller's buffer is
// a device tensor's (tensor::span<T>()): on CPU builds it is read and written in place like a
// host span (device memory is host memory, dtf::device_memory_is_host_accessible); on CUDA
// builds the bytes are staged through pinned host memory (see dtf/ps/client.hpp). A distinct
// type so that a host buffer is never taken for a device one or the other way round.
#pragma once

#include <dtf/config.hpp>

#include <cstddef>
#include <span>
#include <type_traits>

namespace dtf {

/// A span whose elements are in device memory (e.g. a tensor's, tensor::span<T>()). Functions that
/// move a buffer over the network take one; on CPU builds it is read and written in place, on CUDA
/// builds staged through pinned host memory. A distinct type so that a host buffer is never taken
/// for a device one or the other way round.
template <class T>
class device_span {
 public:
  device_span() = default;
  /// Says that `elements` are in device memory.
  explicit device_span(std::span<T> elements) noexcept : elements(elements) {}
  /// device_span<float> → device_span<const float>.
  template <class U>
    requires(!std::is_same_v<U, T> && std::is_convertible_v<U (*)[], T (*)[]>)
  device_span(device_span<U> other) noexcept : elements(other.elements) {}

  /// The number of elements.
  std::size_t size() const noexcept { return elements.size(); }
  /// Pointer to the first element (device memory).
  T* data() const noexcept { return elements.data(); }

  std::span<T> elements;  ///< in device memory (host memory on CPU builds)
};

}  // namespace dtf
