// dtf/tensor.hpp — a typed, shaped buffer in device memory.
//
// dtf::tensor owns a thrust::device_vector of bytes plus a shape and a dtype. On CPU builds
// "device" memory is host memory managed by Thrust's OpenMP (or CPP) system; on CUDA builds
// it is GPU memory. bytes() is a contiguous view of the whole buffer, which the transport
// sends and receives in place (no copy into an archive). Host interop through xtensor lives
// in <dtf/host.hpp> so that translation units which only move bytes stay light.
//
// Thread safety: distinct tensors may be used from different threads; one tensor must not be
// modified concurrently with any other use.
#pragma once

#include <dtf/config.hpp>
#include <dtf/dtype.hpp>
#include <dtf/error.hpp>
#include <dtf/shape.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>
#include <thrust/device_vector.h>
#include <thrust/fill.h>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf {

/// A typed, shaped buffer in device memory (host memory managed by Thrust on CPU builds, GPU
/// memory on CUDA builds). bytes() is a contiguous view of the whole buffer, which the transport
/// sends and receives in place. Distinct tensors may be used from different threads; one tensor
/// must not be modified concurrently with any other use.
class tensor {
 public:
  /// An empty float32 tensor of shape [0].
  tensor() : tensor(dims{0}, dtype::float32) {}

  /// A zero-filled tensor of the given shape and dtype.
  explicit tensor(dims shape, dtype type = dtype::float32)
      : shape_(std::move(shape)), dtype_(type), bytes_(num_elements(shape_) * size_of(type)), storage_(bytes_) {}

  /// The element type.
  dtype type() const noexcept { return dtype_; }
  /// The dimensions.
  const dims& shape() const noexcept { return shape_; }
  /// The number of dimensions.
  std::size_t rank() const noexcept { return shape_.size(); }
  /// Dimension i. Errors: errc::out_of_range when i >= rank().
  std::size_t dim(std::size_t i) const {
    if (i >= shape_.size())
      throw error(errc::out_of_range, "tensor::dim(" + std::to_string(i) + ") of a rank-" +
                                          std::to_string(shape_.size()) + " tensor");
    return shape_[i];
  }
  /// The number of elements.
  std::size_t size() const noexcept { return num_elements(shape_); }
  /// The buffer's size in bytes.
  std::size_t size_bytes() const noexcept { return bytes_; }
  /// The allocation's size in bytes: resize() within it touches no memory.
  std::size_t capacity_bytes() const noexcept { return storage_.size(); }

  /// Changes the shape (and dtype), keeping the allocation when it is large enough. The
  /// contents are unspecified afterwards. Use it to reuse a buffer across steps.
  /// Within capacity_bytes() only the shape changes: nothing is allocated, written or issued on
  /// any stream (CUDA builds: work queued on another stream that reads the buffer is unaffected,
  /// so the host need not wait for it). Beyond it the allocation grows (Thrust, on the legacy
  /// default stream: the caller orders it against other streams).
  void resize(dims shape, dtype type) {
    const std::size_t n = num_elements(shape) * size_of(type);
    if (n > storage_.size()) storage_.resize(n);
    shape_ = std::move(shape);
    dtype_ = type;
    bytes_ = n;
  }
  /// As resize(shape, type), keeping the dtype.
  void resize(dims shape) { resize(std::move(shape), dtype_); }

  /// Reinterprets the same elements under another shape with the same element count.
  void reshape(dims shape) {
    if (num_elements(shape) != size())
      throw error(errc::shape_mismatch, "tensor::reshape from " + to_string(shape_) + " to " +
                                            to_string(shape) + " changes the element count");
    shape_ = std::move(shape);
  }

  /// Raw pointer to the elements in device memory; the dtype must be T's.
  ///@{
  template <tensor_element T>
  T* data() {
    check_type<T>();
    return reinterpret_cast<T*>(thrust::raw_pointer_cast(storage_.data()));
  }
  template <tensor_element T>
  const T* data() const {
    check_type<T>();
    return reinterpret_cast<const T*>(thrust::raw_pointer_cast(storage_.data()));
  }
  ///@}

  /// The elements as a span over device memory (dereference it on the host only when
  /// dtf::device_memory_is_host_accessible).
  ///@{
  template <tensor_element T>
  std::span<T> span() { return {data<T>(), size()}; }
  template <tensor_element T>
  std::span<const T> span() const { return {data<T>(), size()}; }
  ///@}

  /// Thrust device pointer to the elements, for Thrust algorithms.
  ///@{
  template <tensor_element T>
  thrust::device_ptr<T> device_ptr() { return thrust::device_pointer_cast(data<T>()); }
  template <tensor_element T>
  thrust::device_ptr<const T> device_ptr() const { return thrust::device_pointer_cast(data<T>()); }
  ///@}

  /// The whole buffer as contiguous bytes in device memory: what the transport sends.
  ///@{
  std::span<std::byte> bytes() noexcept {
    return {reinterpret_cast<std::byte*>(thrust::raw_pointer_cast(storage_.data())), bytes_};
  }
  std::span<const std::byte> bytes() const noexcept {
    return {reinterpret_cast<const std::byte*>(thrust::raw_pointer_cast(storage_.data())), bytes_};
  }
  ///@}

  /// Sets every element to zero.
  void zero() { thrust::fill(storage_.begin(), storage_.begin() + bytes_, static_cast<unsigned char>(0)); }

  /// Copies n = size() elements from host memory into the tensor.
  template <tensor_element T>
  void copy_from_host(std::span<const T> src) {
    if (src.size() != size())
      throw error(errc::shape_mismatch, "tensor::copy_from_host: " + std::to_string(src.size()) +
                                            " elements into a tensor of shape " + to_string(shape_));
    thrust::copy(src.begin(), src.end(), device_ptr<T>());
  }

  /// Copies all elements into host memory (dst.size() must equal size()).
  template <tensor_element T>
  void copy_to_host(std::span<T> dst) const {
    if (dst.size() != size())
      throw error(errc::shape_mismatch, "tensor::copy_to_host: tensor of shape " + to_string(shape_) +
                                            " into " + std::to_string(dst.size()) + " elements");
    auto p = device_ptr<T>();
    thrust::copy(p, p + size(), dst.begin());
  }

  /// The elements copied into a host std::vector.
  template <tensor_element T>
  std::vector<T> to_vector() const {
    std::vector<T> out(size());
    copy_to_host<T>(std::span<T>(out));
    return out;
  }

  /// A tensor of the given shape holding a copy of host values.
  template <tensor_element T>
  static tensor from_host(dims shape, std::span<const T> values) {
    tensor t(std::move(shape), dtype_v<T>);
    t.copy_from_host<T>(values);
    return t;
  }

 private:
  template <class T>
  void check_type() const {
    if (dtype_v<T> != dtype_)
      throw error(errc::invalid_argument, std::string("tensor of dtype ") + std::string(name_of(dtype_)) +
                                              " accessed as " + std::string(name_of(dtype_v<T>)));
  }

  dims shape_;
  dtype dtype_;
  std::size_t bytes_;                              // size_bytes(): the shape's bytes
  thrust::device_vector<unsigned char> storage_;  // capacity_bytes() >= bytes_
};

}  // namespace dtf
