// dtf/collectives/two_rank.hpp — allreduce of two ranks: one exchange.
#pragma once

#include <dtf/collectives.hpp>

namespace dtf {

// Two ranks: one exchange straight from and into the caller's buffer (a + b ==
// b + a, so both ranks end with the same bits). Each rank sends and receives B
// once.
inline void tcp_backend::two_rank_allreduce(detail::collective_descriptor& d, std::span<std::byte> data,
                                             detail::reduce_fn reduce, detail::scale_fn scale,
                                             const std::string& context) {
  const std::size_t n = size_;
  const reduce_op op = d.op;
  std::vector<detail::ring_step> steps;
  d.algorithm = detail::ring_algorithm::small;
  staging_.resize(data.size());
  steps.push_back(header_step(d, data.size()));
  steps.push_back(detail::ring_step::exchange(data, staging_.data()));
  detail::run_ring(link_, steps, reduce, scale, context);
  if (!data.empty()) {
    reduce(data.data(), staging_.data(), data.size());
    if (op == reduce_op::average) scale(data.data(), data.size(), n);
  }
}

}  // namespace dtf
