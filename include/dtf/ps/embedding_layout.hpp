// dtf/ps/embedding_layout.hpp — sparse variables (embedding tables): what they are and where
// each row lives. Shared by the ps (dtf/ps/sparse_store.hpp) and the client
// (dtf/ps/sparse_client.hpp); both compute the same layout from the same spec.
//
// Two kinds of table:
//   fixed    rows ids [0, rows) of dim floats each, cut along axis 0 by a partitioner
//            (fixed_size, min_max, variable_axis_size, ...: dtf/partitioners.hpp) into shards
//            dealt to the ps in turn; an id goes to its shard by TensorFlow's partition strategy
//              div  contiguous blocks: shard j holds ids [row_begin_j, row_end_j)
//              mod  id % k: shard j holds ids j, j + k, j + 2k, ... (local row id / k)
//            (tf.nn.embedding_lookup's partition_strategy; a shard holds as many rows either way)
//   hashed   unbounded 64-bit ids: shard mix(id) % k; a row is created on the ps the first time
//            an id is touched, from the table's initialiser; at most max_rows rows over all
//            shards (max_rows / k per shard, rounded up); rows unseen for evict_after of their
//            shard's updates are evicted (0: never)
//
// Every row starts at the same values wherever it lives: row_initializer draws them from
// (seed, id) alone, so a table initialises on each ps without a byte on the wire, a test's
// dense reference computes the same start, and a checkpoint restored into another number of
// ps holds the rows the first run would have.
#pragma once

#include <dtf/error.hpp>
#include <dtf/partitioners.hpp>
#include <dtf/variable.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dtf {

/// How a fixed table's ids map to its shards: `div`, contiguous ranges of ids; `mod`, id % shards.
enum class partition_strategy : std::uint8_t { div, mod };

/// Rows start uniform in [-scale, scale), drawn from (seed, id).
struct row_initializer {
  /// Half-width of the uniform range.
  float scale = 0.05f;
  /// Seed of the per-id streams.
  std::uint64_t seed = 1;

  /// Fills `row` with id's initial values.
  void operator()(std::uint64_t id, std::span<float> row) const noexcept {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ (id + 0x632BE59BD9B4E019ull);
    for (float& x : row) {
      // splitmix64: a counter-based stream, the same on every machine.
      std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
      x = scale * (2.0f * u - 1.0f);
    }
  }
};

/// A sparse variable.
struct embedding_spec {
  std::string name;                ///< unique among the model's variables and tables
  std::uint64_t rows = 0;          ///< fixed: ids [0, rows); 0: hashed (any 64-bit id)
  std::uint32_t dim = 0;           ///< floats per row; > 0
  partition_strategy strategy = partition_strategy::div;  ///< fixed tables: how ids map to shards
  /// How rows start.
  row_initializer init{};
  std::uint64_t max_rows = std::uint64_t(1) << 24;  ///< hashed: rows held at most, over all shards
  std::uint64_t evict_after = 0;   ///< hashed: evict rows unseen for this many shard updates (0: never)

  /// Whether the table is hashed (rows == 0).
  bool hashed() const noexcept { return rows == 0; }
};

/// Where a row lives: its shard and its row within the shard (hashed: the id itself).
struct row_place {
  /// The row's shard.
  std::uint32_t shard;
  /// Its row within the shard (hashed: the id itself).
  std::uint64_t local;
};

/// One shard of a table.
struct table_shard {
  /// The ps that holds the shard.
  std::size_t ps;
  ///@{
  std::uint64_t row_begin = 0, row_end = 0;  ///< fixed tables, div layout's range (mod: as many rows)
  ///@}
  /// The shard's number of rows (fixed tables).
  std::uint64_t rows() const noexcept { return row_end - row_begin; }
};

/// A table's shards and its routing.
struct embedding_layout {
  /// The table's spec.
  embedding_spec spec;
  /// Its shards, in shard order.
  std::vector<table_shard> shards;
  /// The number of ps the shards are spread over.
  std::size_t num_ps = 0;

  /// A fixed table cut by `p` (a dtf::partitioner) over num_ps ps tasks.
  /// Errors: invalid_argument for a hashed spec, a zero dim or a partitioner error.
  template <partitioner P>
  static embedding_layout fixed(const embedding_spec& spec, const P& p, std::size_t num_ps) {
    check(spec);
    if (spec.hashed()) throw error(errc::invalid_argument, "embedding '" + spec.name + "': rows = 0 is a hashed table");
    const auto placed = p.place({variable_spec{spec.name, {std::size_t(spec.rows), spec.dim}, 0}}, num_ps);
    embedding_layout l{spec, {}, num_ps};
    for (const auto& s : placed.shards) l.shards.push_back({s.ps, s.row_begin, s.row_end});
    return l;
  }

  /// A hashed table of num_shards shards, shard j on ps j % num_ps.
  static embedding_layout hashed(const embedding_spec& spec, std::size_t num_shards, std::size_t num_ps) {
    check(spec);
    if (!spec.hashed()) throw error(errc::invalid_argument, "embedding '" + spec.name + "': a hashed table has rows = 0");
    if (num_shards == 0 || num_ps == 0)
      throw error(errc::invalid_argument, "embedding '" + spec.name + "': zero shards or ps");
    if (spec.max_rows == 0) throw error(errc::invalid_argument, "embedding '" + spec.name + "': max_rows = 0");
    embedding_layout l{spec, {}, num_ps};
    for (std::size_t j = 0; j < num_shards; ++j) l.shards.push_back({j % num_ps, 0, 0});
    return l;
  }

  /// The shard and local row of `id`. Errors: out_of_range naming the table and the id.
  row_place place(std::uint64_t id) const {
    const auto k = std::uint64_t(shards.size());
    if (spec.hashed()) return {std::uint32_t(mix(id) % k), id};
    if (id >= spec.rows)
      throw error(errc::out_of_range, "embedding '" + spec.name + "': id " + std::to_string(id) +
                                          " is outside [0, " + std::to_string(spec.rows) + ")");
    if (spec.strategy == partition_strategy::mod) return {std::uint32_t(id % k), id / k};
    // div: the first rows % k shards hold one row more (dtf::partitioners' div layout).
    const std::uint64_t base = spec.rows / k, extra = spec.rows % k;
    const std::uint64_t long_rows = extra * (base + 1);
    if (id < long_rows) return {std::uint32_t(id / (base + 1)), id % (base + 1)};
    const std::uint64_t j = extra + (id - long_rows) / base;
    return {std::uint32_t(j), id - shards[j].row_begin};
  }

  /// Rows of shard j held at most: a fixed shard's rows; a hashed shard's share of max_rows.
  std::uint64_t capacity(std::size_t j) const {
    if (!spec.hashed()) return shards.at(j).rows();
    return (spec.max_rows + shards.size() - 1) / shards.size();
  }

  /// The id of local row `local` of fixed shard j (the inverse of place()).
  std::uint64_t id_of(std::size_t j, std::uint64_t local) const {
    if (spec.hashed()) return local;
    return spec.strategy == partition_strategy::mod ? local * shards.size() + j : shards.at(j).row_begin + local;
  }

  /// The 64-bit finaliser of MurmurHash3: spreads consecutive ids over the shards.
  static std::uint64_t mix(std::uint64_t x) noexcept {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    return x ^ (x >> 33);
  }

 private:
  static void check(const embedding_spec& spec) {
    if (spec.dim == 0) throw error(errc::invalid_argument, "embedding '" + spec.name + "': dim must be positive");
    if (spec.name.empty() || spec.name.size() > 256)
      throw error(errc::invalid_argument, "an embedding needs a name of 1 to 256 characters");
  }
};

}  // namespace dtf
