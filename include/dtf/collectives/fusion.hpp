// dtf/collectives/fusion.hpp — fused allreduce: tensors of one dtype packed into buffers of at most fusion_threshold_bytes.
#pragma once

#include <dtf/collectives.hpp>

namespace dtf {

// Packing amortises the per-collective latency (descriptor, n-1 or 2(n-1)
// steps) over many small tensors; tensors of a CUDA build are staged through
// host memory here.
inline void tcp_backend::do_fused(std::span<const named_tensor> tensors, reduce_op op) {
  std::size_t i = 0;
  while (i < tensors.size()) {
    const named_tensor& first = tensors[i];
    if (!first.value) throw error(errc::invalid_argument, "allreduce: tensor '" + first.name + "' is null");
    const dtype type = first.value->type();
    std::size_t j = i, bytes = 0;
    std::uint64_t hash = detail::fnv1a("fused");
    while (j < tensors.size() && tensors[j].value && tensors[j].value->type() == type &&
           (j == i || bytes + tensors[j].value->size_bytes() <= options_.fusion_threshold_bytes)) {
      bytes += tensors[j].value->size_bytes();
      hash = detail::fnv1a(tensors[j].name, hash);
      hash = detail::fnv1a(std::to_string(tensors[j].value->size()) + ";", hash);
      ++j;
    }
    if (j == i + 1) {
      tensor& t = *first.value;
      if constexpr (device_memory_is_host_accessible) {
        do_allreduce(first.name, detail::fnv1a(first.name), type, t.bytes(), op);
      } else {
        fusion_.resize(t.size_bytes());
        detail::copy_tensor_to_host(t, fusion_);
        do_allreduce(first.name, detail::fnv1a(first.name), type, fusion_, op);
        detail::copy_tensor_from_host(fusion_, t);
      }
    } else {
      fusion_.resize(bytes);
      std::size_t at = 0;
      for (std::size_t k = i; k < j; ++k) {
        const tensor& t = *tensors[k].value;
        detail::copy_tensor_to_host(t, std::span<std::byte>(fusion_.data() + at, t.size_bytes()));
        at += t.size_bytes();
      }
      const std::string name = first.name + " + " + std::to_string(j - i - 1) + " more (fused)";
      do_allreduce(name, hash, type, fusion_, op);
      at = 0;
      for (std::size_t k = i; k < j; ++k) {
        tensor& t = *tensors[k].value;
        detail::copy_tensor_from_host(std::span<const std::byte>(fusion_.data() + at, t.size_bytes()), t);
        at += t.size_bytes();
      }
    }
    i = j;
  }
}

}  // namespace dtf
