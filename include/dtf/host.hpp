// dtf/host.hpp — host tensors (xtensor) and copies between host and device.
//
// Host-side data (datasets, checkpoint export, tests) uses xtensor containers. to_host() and
// from_host() copy; host_view() adapts a tensor's own memory without a copy and exists only
// where device memory is host memory (CPU builds), so that a CUDA build fails at compile time
// instead of dereferencing a GPU pointer on the host.
#pragma once

#include <dtf/tensor.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include <span>

namespace dtf {

/// A copy of the tensor's elements as a host xt::xarray with the same shape.
template <tensor_element T>
xt::xarray<T> to_host(const tensor& t) {
  xt::xarray<T> out = xt::xarray<T>::from_shape(t.shape());
  t.copy_to_host<T>(std::span<T>(out.data(), out.size()));
  return out;
}

/// A device tensor holding a copy of a host xtensor expression's values (row-major).
template <class E>
tensor from_host(const xt::xexpression<E>& expr) {
  using value_type = typename E::value_type;
  xt::xarray<value_type, xt::layout_type::row_major> tmp = expr.derived_cast();
  dims shape(tmp.shape().begin(), tmp.shape().end());
  return tensor::from_host<value_type>(std::move(shape), std::span<const value_type>(tmp.data(), tmp.size()));
}

/// Copies a host container's values into t, resizing t to the container's shape; the
/// allocation is reused when large enough (one copy, no temporary).
template <class C>
void assign_from_host(tensor& t, const C& host) {
  using value_type = typename C::value_type;
  dims shape(host.shape().begin(), host.shape().end());
  t.resize(std::move(shape), dtype_v<value_type>);
  t.copy_from_host<value_type>(std::span<const value_type>(host.data(), host.size()));
}

#if !DTF_CUDA
/// A host view of the tensor's own memory (no copy); writes go to the tensor.
/// Only on CPU builds: on CUDA builds use to_host() / from_host().
///@{
template <tensor_element T>
auto host_view(tensor& t) {
  return xt::adapt(t.data<T>(), t.size(), xt::no_ownership(), t.shape());
}
template <tensor_element T>
auto host_view(const tensor& t) {
  return xt::adapt(t.data<T>(), t.size(), xt::no_ownership(), t.shape());
}
///@}
#endif

}  // namespace dtf
