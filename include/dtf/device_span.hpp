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

template <class T>
struct device_span {
  std::span<T> elements;  ///< in device memory (host memory on CPU builds)

  std::size_t size() const noexcept { return elements.size(); }
  T* data() const noexcept { return elements.data(); }
  /// The read-only view.
  operator device_span<const T>() const noexcept
    requires(!std::is_const_v<T>)
  {
    return {elements};
  }
};

}  // namespace dtf
