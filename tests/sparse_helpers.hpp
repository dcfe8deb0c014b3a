// Test helpers for embedding tables: the rows of a batch of ids, in the batch's order.
#pragma once

#include <dtf/ps/sparse_client.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dtf::test {

// The rows of ids (repeats allowed) through a plan: ids.size() * dim floats, row i for ids[i].
inline std::vector<float> gather(embedding_tables& t, std::uint32_t table, const std::vector<std::uint64_t>& ids) {
  const auto l = t.plan(table, ids);
  std::vector<float> rows(l.rows() * l.dim), out(ids.size() * l.dim);
  t.gather(l, rows);
  for (std::size_t i = 0; i < ids.size(); ++i)
    std::copy_n(rows.begin() + l.index[i] * l.dim, l.dim, out.begin() + i * l.dim);
  return out;
}

}  // namespace dtf::test
