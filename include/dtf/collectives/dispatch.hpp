// dtf/collectives/dispatch.hpp — picks the allreduce algorithm by world and message size.
#pragma once

#include <dtf/collectives.hpp>

namespace dtf {

// The allreduce dispatch (CCCL's API -> dispatch -> detail): checks, builds the
// descriptor and picks the algorithm by world size and message size; every rank
// picks the same one because the knobs it reads must agree (a difference fails
// the descriptor check).
//
//   power-of-two world of 4+ ranks, hypercube on    -> recursive doubling /
//   halving (recursive.hpp) 2 ranks, B <= small_bytes                       ->
//   one exchange (two_rank.hpp) B <= small_bytes -> small-message ring
//   (small_message.hpp) otherwise                                       -> ring
//   reduce-scatter + allgather (ring.hpp)
inline void tcp_backend::do_allreduce(const std::string& name, std::uint64_t name_hash, dtype type,
                                       std::span<std::byte> data, reduce_op op) {
  check_type(type, data.size(), name);
  const std::size_t esize = size_of(type);
  const std::size_t count = data.size() / esize;
  auto d = descriptor(detail::collective_kind::allreduce, name, name_hash, type, count);
  d.op = op;
  if (size_ == 1) return;  // the sum, min, max and average of one rank's values are its values
  const auto reduce = detail::reduce_for(type, op);
  const auto scale = detail::scale_for(type);
  const std::string context = "rank " + std::to_string(rank_) + ": " + d.describe();
  if (uses_hypercube()) return hypercube_allreduce(d, data, reduce, scale, context);
  if (size_ == 2 && data.size() <= options_.small_bytes) return two_rank_allreduce(d, data, reduce, scale, context);
  if (data.size() <= options_.small_bytes) return small_allreduce(d, data, reduce, scale, context);
  ring_allreduce(d, data, reduce, scale, context);
}

}  // namespace dtf
