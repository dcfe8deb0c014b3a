// dtf/collectives/allgather.hpp — allgather: n-1 ring steps, (n-1)·B per rank.
#pragma once

#include <dtf/collectives.hpp>

#include <cstring>

namespace dtf {

inline void tcp_backend::do_allgather(const std::string& name, dtype type, std::span<const std::byte> in,
                                       std::span<std::byte> out) {
  check_type(type, in.size(), name);
  auto d = descriptor(detail::collective_kind::allgather, name, detail::fnv1a(name), type, in.size() / size_of(type));
  const std::size_t n = size_, block = in.size();
  if (block) std::memmove(out.data() + rank_ * block, in.data(), block);
  if (n == 1) return;
  std::vector<detail::ring_step> steps;
  steps.push_back(header_step(d, block * (n - 1)));
  for (std::size_t s = 0; s + 1 < n; ++s) {
    detail::ring_step st;
    st.send = out.data() + ((rank_ + n - s) % n) * block;
    st.send_bytes = block;
    st.recv = out.data() + ((rank_ + 2 * n - s - 1) % n) * block;
    st.recv_bytes = block;
    st.gated = s > 0;
    steps.push_back(std::move(st));
  }
  detail::run_ring(link_, steps, detail::reduce_for(type, reduce_op::sum), detail::scale_for(type),
                   "rank " + std::to_string(rank_) + ": " + d.describe());
}

}  // namespace dtf
