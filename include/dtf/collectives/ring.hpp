// dtf/collectives/ring.hpp — allreduce by ring reduce-scatter then allgather (large messages).
#pragma once

#include <dtf/collectives.hpp>

#include <algorithm>

namespace dtf {

// Large messages: reduce-scatter then allgather around the ring, 2(n-1) steps;
// each rank sends and receives 2(n-1)/n·B. Chunks are split into segments of
// segment_bytes, so a segment is forwarded as soon as it has been received and
// reduced.
inline void tcp_backend::ring_allreduce(detail::collective_descriptor& d, std::span<std::byte> data,
                                         detail::reduce_fn reduce, detail::scale_fn scale, const std::string& context) {
  const std::size_t n = size_, esize = size_of(d.type), count = data.size() / esize;
  const reduce_op op = d.op;
  std::vector<detail::ring_step> steps;
  d.algorithm = detail::ring_algorithm::ring;
  std::size_t max_chunk = 0;
  for (std::size_t i = 0; i < n; ++i) max_chunk = std::max(max_chunk, detail::chunk_of(count, n, i).size());
  const std::size_t window = 2 * detail::ring_segment(options_.segment_bytes);
  staging_.resize(std::min(max_chunk * esize, window));
  std::byte* base = data.data();
  const auto chunk_ptr = [&](std::size_t i) { return base + detail::chunk_of(count, n, i).begin * esize; };
  const auto chunk_bytes = [&](std::size_t i) { return detail::chunk_of(count, n, i).size() * esize; };
  steps.push_back(header_step(d, data.size()));
  for (std::size_t s = 0; s + 1 < n; ++s) {  // reduce-scatter
    const std::size_t send_chunk = (rank_ + n - s) % n, recv_chunk = (rank_ + 2 * n - s - 1) % n;
    detail::ring_step st;
    st.send = chunk_ptr(send_chunk);
    st.send_bytes = chunk_bytes(send_chunk);
    st.recv = staging_.data();
    st.recv_bytes = chunk_bytes(recv_chunk);
    st.reduce_into = chunk_ptr(recv_chunk);
    st.windowed = true;
    st.gated = s > 0;
    if (s + 2 == n && op == reduce_op::average) st.divide_by = n;  // this rank's final chunk
    steps.push_back(std::move(st));
  }
  for (std::size_t s = 0; s + 1 < n; ++s) {  // allgather
    const std::size_t send_chunk = (rank_ + 1 + n - s) % n, recv_chunk = (rank_ + n - s) % n;
    detail::ring_step st;
    st.send = chunk_ptr(send_chunk);
    st.send_bytes = chunk_bytes(send_chunk);
    st.recv = chunk_ptr(recv_chunk);
    st.recv_bytes = chunk_bytes(recv_chunk);
    st.gated = true;
    steps.push_back(std::move(st));
  }
  detail::run_ring(link_, steps, reduce, scale, context);
}

}  // namespace dtf
