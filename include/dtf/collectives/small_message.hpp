// dtf/collectives/small_message.hpp — allreduce of small messages: every buffer around the ring.
#pragma once

#include <dtf/collectives.hpp>

#include <cstring>

namespace dtf {

// Small messages (B <= small_bytes): every rank's [descriptor|data] travels
// around the ring (n-1 steps, (n-1)·B per rank) and every rank reduces in rank
// order 0..n-1, so all ranks end with the same bits at half the latency of
// reduce-scatter + allgather.
inline void tcp_backend::small_allreduce(detail::collective_descriptor& d, std::span<std::byte> data,
                                          detail::reduce_fn reduce, detail::scale_fn scale,
                                          const std::string& context) {
  const std::size_t n = size_;
  const reduce_op op = d.op;
  std::vector<detail::ring_step> steps;
  // Each received slot is checked against this rank's descriptor.
  d.algorithm = detail::ring_algorithm::small;
  const std::size_t slot = detail::collective_header_size + data.size();
  slots_.resize(slot * n);
  const auto h = detail::encode_descriptor(d, data.size());
  std::memcpy(slots_.data(), h.data(), h.size());
  if (!data.empty()) std::memcpy(slots_.data() + h.size(), data.data(), data.size());
  for (std::size_t g = 0; g + 1 < n; ++g) {
    detail::ring_step s;
    s.send = slots_.data() + g * slot;
    s.send_bytes = slot;
    s.recv = slots_.data() + (g + 1) * slot;
    s.recv_bytes = slot;
    s.gated = true;
    const std::size_t origin = (rank_ + n - g - 1) % n;
    s.on_received = [this, &d, slot, g, origin] {
      const auto theirs = detail::decode_descriptor(std::span<const std::byte, detail::collective_header_size>(
                                                        slots_.data() + (g + 1) * slot, detail::collective_header_size),
                                                    link_.left_name);
      detail::check_descriptor(d, theirs, describe(origin));
      if (theirs.origin != origin)
        throw error(errc::peer_failure, link_.left_name + " forwarded rank " + std::to_string(theirs.origin) +
                                            "'s data where rank " + std::to_string(origin) + "'s was due");
    };
    steps.push_back(std::move(s));
  }
  detail::run_ring(link_, steps, reduce, scale, context);
  // Reduce in rank order 0..n-1 on every rank: identical bits everywhere.
  const auto slot_data = [&](std::size_t k) {
    return slots_.data() + ((rank_ + n - k) % n) * slot + detail::collective_header_size;
  };
  if (!data.empty()) {
    std::memcpy(data.data(), slot_data(0), data.size());
    for (std::size_t k = 1; k < n; ++k) reduce(data.data(), slot_data(k), data.size());
    if (op == reduce_op::average) scale(data.data(), data.size(), n);
  }
}

}  // namespace dtf
