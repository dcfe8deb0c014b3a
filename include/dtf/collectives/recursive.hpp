// dtf/collectives/recursive.hpp — allreduce by recursive doubling (small) and recursive halving + doubling (large) in power-of-two worlds.
#pragma once

#include <dtf/collectives.hpp>

#include <algorithm>
#include <utility>

namespace dtf {

// Power-of-two worlds. Small: recursive doubling, log2(n) exchanges of the
// whole buffer with partner rank ^ 2^k. Large: recursive halving
// (reduce-scatter: keep half the range, send the other half, d = n/2 .. 1) then
// recursive doubling (allgather, d = 1 .. n/2). Every pairwise sum is
// commutative, so all ranks end with the same bits.
inline void tcp_backend::hypercube_allreduce(detail::collective_descriptor& d, std::span<std::byte> data,
                                              detail::reduce_fn reduce, detail::scale_fn scale,
                                              const std::string& context) {
  const std::size_t esize = size_of(d.type), count = data.size() / esize, stages = partners_.size();
  std::vector<detail::ring_step> steps;
  if (data.size() <= options_.hypercube_small_bytes) {
    d.algorithm = detail::ring_algorithm::recursive_doubling;
    staging_.resize(data.size());
    for (std::size_t k = 0; k < stages; ++k) {
      const auto link = partner_link(k);
      steps.clear();
      steps.push_back(header_step(d, data.size(), rank_ ^ (std::size_t(1) << k), link.left_name));
      steps.push_back(detail::ring_step::exchange(data, staging_.data()));
      detail::run_ring(link, steps, reduce, scale, context);
      if (!data.empty()) reduce(data.data(), staging_.data(), data.size());
    }
    if (d.op == reduce_op::average && !data.empty()) scale(data.data(), data.size(), size_);
    return;
  }
  d.algorithm = detail::ring_algorithm::halving_doubling;
  staging_.resize(std::min((count / 2 + 1) * esize, 2 * detail::ring_segment(options_.segment_bytes)));
  std::vector<std::pair<std::size_t, std::size_t>> before(stages);
  std::size_t b = 0, e = count;
  for (std::size_t k = stages; k-- > 0;) {  // reduce-scatter by recursive halving
    const std::size_t dist = std::size_t(1) << k, mid = b + (e - b) / 2;
    const bool lower = (rank_ & dist) == 0;
    const std::size_t sb = lower ? mid : b, se = lower ? e : mid, kb = lower ? b : mid, ke = lower ? mid : e;
    const auto link = partner_link(k);
    steps.clear();
    steps.push_back(header_step(d, data.size(), rank_ ^ dist, link.left_name));
    detail::ring_step st;
    st.send = data.data() + sb * esize;
    st.send_bytes = (se - sb) * esize;
    st.recv = staging_.data();
    st.recv_bytes = (ke - kb) * esize;
    st.reduce_into = data.data() + kb * esize;
    st.windowed = true;
    if (k == 0 && d.op == reduce_op::average) st.divide_by = size_;  // this rank's final block
    steps.push_back(std::move(st));
    detail::run_ring(link, steps, reduce, scale, context);
    before[k] = {b, e};
    b = kb;
    e = ke;
  }
  for (std::size_t k = 0; k < stages; ++k) {  // allgather by recursive doubling
    const auto [ob, oe] = before[k];
    const bool lower = (rank_ & (std::size_t(1) << k)) == 0;  // we kept the lower half at this stage
    const std::size_t pb = lower ? e : ob, pe = lower ? oe : b;
    steps.clear();
    detail::ring_step st;
    st.send = data.data() + b * esize;
    st.send_bytes = (e - b) * esize;
    st.recv = data.data() + pb * esize;
    st.recv_bytes = (pe - pb) * esize;
    steps.push_back(std::move(st));
    detail::run_ring(partner_link(k), steps, reduce, scale, context);
    b = ob;
    e = oe;
  }
}

}  // namespace dtf
