// dtf/collectives/broadcast.hpp — broadcast: a pipeline from the root around the ring, B per rank.
#pragma once

#include <dtf/collectives.hpp>

namespace dtf {

// Each rank receives from its left neighbour and forwards segment by segment,
// so the whole broadcast costs one pass of B plus (n-1) segment latencies.
inline void tcp_backend::do_broadcast(const std::string& name, dtype type, std::span<std::byte> data,
                                       std::size_t root) {
  check_type(type, data.size(), name);
  auto d = descriptor(detail::collective_kind::broadcast, name, detail::fnv1a(name), type, data.size() / size_of(type));
  d.root = std::uint32_t(root);
  if (size_ == 1) return;
  const std::size_t n = size_, distance = (rank_ + n - root) % n;
  std::vector<detail::ring_step> steps;
  steps.push_back(header_step(d, data.size()));
  detail::ring_step first;
  if (distance == 0) {
    first.send = data.data();
    first.send_bytes = data.size();
  } else {
    first.recv = data.data();
    first.recv_bytes = data.size();
  }
  steps.push_back(std::move(first));
  if (distance != 0 && distance + 1 < n) {  // forward what arrives, segment by segment
    detail::ring_step forward;
    forward.send = data.data();
    forward.send_bytes = data.size();
    forward.gated = true;
    steps.push_back(std::move(forward));
  }
  detail::run_ring(link_, steps, detail::reduce_for(type, reduce_op::sum), detail::scale_for(type),
                   "rank " + std::to_string(rank_) + ": " + d.describe());
}

}  // namespace dtf
