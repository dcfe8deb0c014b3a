// dtf/partitioners.hpp — where a model's variables live: which ps task holds which rows.
//
// A partitioner maps the variables of a model (name, shape, place in the flat float32
// parameter buffer) to shards on ps tasks. Two families are built in:
//
//   whole variables   round_robin, greedy_load_balancing: one shard per variable; they
//                     choose only the ps (TF 1.x replica_device_setter's ps strategies).
//   sharded variables fixed_size, variable_axis_size, min_max: each variable is cut along
//                     axis 0 (TF 1.x tf.compat.v1.*_partitioner) and the shards are dealt
//                     to the ps tasks in turn, as replica_device_setter's default
//                     round-robin strategy deals every partitioned-variable part.
//
// Every shard is a contiguous run of rows in the "div" layout: a k-way split of dim0 rows
// gives shard j dim0 / k rows, plus one when j < dim0 % k, so a shard is also a contiguous
// range [offset, offset + size) of the flat buffer and the shards of a variable tile it.
//
// Where dtf differs from TensorFlow:
//   - Only axis 0 is split, and only float32 variables are handled (no string elements).
//   - A rank-0 variable is one shard of one row, rows [0, 1); TensorFlow's sharding
//     partitioners reject it (there is no axis 0 to split).
//   - A variable with no elements (dim0 == 0, or any zero dimension) is one shard of size 0
//     covering all its rows; TensorFlow asks for zero partitions or divides by zero.
//   - Zero counts and sizes are errors here where TensorFlow accepts some of them
//     (min_max's min_slice_size == 0 divides by zero there).
//
// Thread safety: the partitioners and placement are plain values; concurrent const use is
// safe.
//
// Errors: place() throws dtf::error(errc::invalid_argument) naming the partitioner and the
// parameter at fault when num_ps or a count or size parameter is zero; placement's queries
// throw dtf::error(errc::out_of_range) for a ps index outside [0, num_ps).
#pragma once

#include <dtf/error.hpp>
#include <dtf/variable.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <string>
#include <vector>

namespace dtf {

/// One contiguous piece of a variable placed on one ps task. Variables are split only along
/// axis 0, in the contiguous ("div") layout, so a shard is rows [row_begin, row_end) =
/// elements [offset, offset + size) of the model's flat buffer.
struct shard {
  std::size_t variable;   ///< index into the variables vector given to place()
  std::size_t part;       ///< 0-based index of this shard within its variable
  std::size_t ps;         ///< ps task index
  std::size_t row_begin;  ///< first row along axis 0 (a rank-0 variable has rows [0, 1))
  std::size_t row_end;    ///< one past the last row along axis 0
  std::size_t offset;     ///< first element in the flat parameter buffer
  std::size_t size;       ///< number of elements

  /// Equal when every field is.
  friend bool operator==(const shard&, const shard&) = default;
};

/// The result of a partitioner: every shard of every variable and the ps that holds it.
struct placement {
  std::vector<shard> shards;  ///< ordered by variable, then part; shard id = position here
  std::size_t num_ps = 0;     ///< number of ps tasks the shards were dealt to

  /// Ids of the shards held by `ps`, ascending. Throws errc::out_of_range if ps >= num_ps.
  std::vector<std::size_t> shards_on(std::size_t ps) const {
    check_ps(ps, "shards_on");
    std::vector<std::size_t> ids;
    for (std::size_t i = 0; i < shards.size(); ++i)
      if (shards[i].ps == ps) ids.push_back(i);
    return ids;
  }

  /// float32 bytes held by `ps`. Throws errc::out_of_range if ps >= num_ps.
  std::size_t bytes_on(std::size_t ps) const {
    check_ps(ps, "bytes_on");
    std::size_t bytes = 0;
    for (const auto& s : shards)
      if (s.ps == ps) bytes += s.size * sizeof(float);
    return bytes;
  }

  /// Number of shards of `variable` (0 for an index this placement does not hold).
  std::size_t num_parts(std::size_t variable) const {
    return static_cast<std::size_t>(
        std::count_if(shards.begin(), shards.end(), [&](const shard& s) { return s.variable == variable; }));
  }

 private:
  void check_ps(std::size_t ps, const char* what) const {
    if (ps >= num_ps)
      throw error(errc::out_of_range, std::string("dtf::placement::") + what + ": ps " + std::to_string(ps) +
                                          " is outside [0, " + std::to_string(num_ps) + ")");
  }
};

/// partitioner: decides which ps task holds which rows of each variable.
///
/// Required expressions, for `const P p`, `const std::vector<variable_spec> vars` and a
/// ps count `n`:
///   p.place(vars, n)  -> placement: shards ordered by variable then part, each variable's
///                        shards tiling its rows and its range of the flat buffer, every
///                        shard's ps in [0, n), and placement.num_ps == n
/// place must be deterministic: every task computes the same placement independently.
template <class P>
concept partitioner = requires(const P& p, const std::vector<variable_spec>& vars, std::size_t n) {
  { p.place(vars, n) } -> std::convertible_to<placement>;
};

namespace detail::partition {

// Rows along axis 0 and elements per row; a rank-0 variable is one row of one element.
inline std::size_t rows_of(const variable_spec& v) noexcept { return v.shape.empty() ? 1 : v.shape.front(); }
inline std::size_t row_elements_of(const variable_spec& v) noexcept {
  return v.shape.empty() ? 1 : num_elements(dims(v.shape.begin() + 1, v.shape.end()));
}

inline void require_positive(std::size_t value, const char* partitioner_name, const char* parameter) {
  if (value == 0)
    throw error(errc::invalid_argument, std::string("dtf::partitioners::") + partitioner_name + ": " + parameter +
                                            " must be positive (got 0)");
}

// Appends the k-way "div" split of variable `index` to `out`, the shards going to the ps
// tasks next_ps, next_ps + 1, ... (mod num_ps). A variable with no elements stays whole:
// empty shards would only cost messages.
inline void split(const variable_spec& v, std::size_t index, std::size_t k, std::size_t num_ps,
                  std::size_t& next_ps, std::vector<shard>& out) {
  const std::size_t rows = rows_of(v), row_elements = row_elements_of(v);
  if (v.size() == 0) k = 1;
  const std::size_t base = rows / k, extra = rows % k;
  std::size_t row = 0;
  for (std::size_t j = 0; j < k; ++j) {
    const std::size_t n = base + (j < extra ? 1 : 0);
    out.push_back(shard{.variable = index,
                        .part = j,
                        .ps = next_ps,
                        .row_begin = row,
                        .row_end = row + n,
                        .offset = v.offset + row * row_elements,
                        .size = n * row_elements});
    row += n;
    next_ps = (next_ps + 1) % num_ps;
  }
}

// Splits every variable into shards_for(variable) parts and deals the shards to the ps
// tasks in turn with one counter across all variables, as replica_device_setter's default
// round-robin strategy does with the parts of partitioned variables.
template <class ShardsFor>
placement deal(const std::vector<variable_spec>& vars, std::size_t num_ps, ShardsFor shards_for) {
  placement p;
  p.num_ps = num_ps;
  std::size_t next_ps = 0;
  for (std::size_t i = 0; i < vars.size(); ++i) split(vars[i], i, shards_for(vars[i]), num_ps, next_ps, p.shards);
  return p;
}

inline std::size_t ceil_div(std::size_t a, std::size_t b) noexcept { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace detail::partition

/// The built-in partitioners (each models dtf::partitioner).
namespace partitioners {

/// Whole variables, dealt in turn: variable i goes to ps i % num_ps (TF 1.x
/// replica_device_setter's default round-robin ps strategy).
struct round_robin {
  /// dtf::partitioner: the placement of `vars` on `num_ps` ps tasks.
  placement place(const std::vector<variable_spec>& vars, std::size_t num_ps) const {
    detail::partition::require_positive(num_ps, "round_robin", "num_ps");
    return detail::partition::deal(vars, num_ps, [](const variable_spec&) { return std::size_t{1}; });
  }
};
static_assert(partitioner<round_robin>, "round_robin must model dtf::partitioner");

/// Whole variables in order, each to the ps holding the fewest bytes so far; ties go to
/// the lowest index (TF 1.x GreedyLoadBalancingStrategy with byte_size_load_fn). The result
/// depends on the order of the variables, as TensorFlow's does.
struct greedy_load_balancing {
  /// dtf::partitioner: the placement of `vars` on `num_ps` ps tasks.
  placement place(const std::vector<variable_spec>& vars, std::size_t num_ps) const {
    detail::partition::require_positive(num_ps, "greedy_load_balancing", "num_ps");
    placement p;
    p.num_ps = num_ps;
    std::vector<std::size_t> load(num_ps, 0);
    for (std::size_t i = 0; i < vars.size(); ++i) {
      // min_element returns the first minimum: the lowest index among equally loaded ps.
      const auto ps = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      std::size_t target = ps;
      detail::partition::split(vars[i], i, 1, num_ps, target, p.shards);
      load[ps] += vars[i].size_bytes();
    }
    return p;
  }
};
static_assert(partitioner<greedy_load_balancing>, "greedy_load_balancing must model dtf::partitioner");

/// A fixed number of shards per variable (tf.compat.v1.fixed_size_partitioner, axis 0):
/// each variable is split into min(num_shards, dim0) shards, the first dim0 % k of them one
/// row longer; the shards are dealt to the ps tasks in turn across all variables.
struct fixed_size {
  std::size_t num_shards = 1;  ///< shards per variable (fewer when dim0 is smaller); > 0

  /// dtf::partitioner: the placement of `vars` on `num_ps` ps tasks.
  placement place(const std::vector<variable_spec>& vars, std::size_t num_ps) const {
    detail::partition::require_positive(num_ps, "fixed_size", "num_ps");
    detail::partition::require_positive(num_shards, "fixed_size", "num_shards");
    return detail::partition::deal(vars, num_ps, [this](const variable_spec& v) {
      return std::max<std::size_t>(1, std::min(num_shards, detail::partition::rows_of(v)));
    });
  }
};
static_assert(partitioner<fixed_size>, "fixed_size must model dtf::partitioner");

/// Shards no larger than max_shard_bytes where rows allow
/// (tf.compat.v1.variable_axis_size_partitioner, axis 0): with slice_bytes the bytes of one
/// row, slices_per_shard = max(1, max_shard_bytes / slice_bytes) (integer division, the
/// floor TensorFlow takes) and shards = ceil(dim0 / slices_per_shard), capped at max_shards
/// when it is set. A row larger than max_shard_bytes becomes a shard of its own. The count
/// is then split in the "div" layout, so with a cap or an uneven count a shard may hold
/// more rows than slices_per_shard. Shards are dealt to the ps tasks in turn.
struct variable_axis_size {
  std::size_t max_shard_bytes;  ///< target upper bound on a shard's bytes; > 0
  std::size_t max_shards = 0;   ///< cap on shards per variable, taking precedence; 0 = no cap

  /// dtf::partitioner: the placement of `vars` on `num_ps` ps tasks.
  placement place(const std::vector<variable_spec>& vars, std::size_t num_ps) const {
    detail::partition::require_positive(num_ps, "variable_axis_size", "num_ps");
    detail::partition::require_positive(max_shard_bytes, "variable_axis_size", "max_shard_bytes");
    return detail::partition::deal(vars, num_ps, [this](const variable_spec& v) -> std::size_t {
      const std::size_t slice_bytes = detail::partition::row_elements_of(v) * sizeof(float);
      if (v.size() == 0 || slice_bytes == 0) return 1;
      const std::size_t slices_per_shard = std::max<std::size_t>(1, max_shard_bytes / slice_bytes);
      std::size_t shards = detail::partition::ceil_div(detail::partition::rows_of(v), slices_per_shard);
      if (max_shards != 0) shards = std::min(shards, max_shards);
      return shards;
    });
  }
};
static_assert(partitioner<variable_axis_size>, "variable_axis_size must model dtf::partitioner");

/// Partitions of at least min_slice_size bytes, at most max_partitions of them
/// (tf.compat.v1.min_max_variable_partitioner, axis 0): partitions =
/// max(1, min(dim0, max_partitions, ceil(total_bytes / min_slice_size))), split in the "div"
/// layout and dealt to the ps tasks in turn. As in TensorFlow, the last partitions may be
/// smaller than min_slice_size when the bytes do not divide evenly.
struct min_max {
  std::size_t max_partitions = 1;         ///< upper bound on partitions per variable; > 0
  std::size_t min_slice_size = 256 << 10;  ///< bytes each partition should hold at least; > 0

  /// dtf::partitioner: the placement of `vars` on `num_ps` ps tasks.
  placement place(const std::vector<variable_spec>& vars, std::size_t num_ps) const {
    detail::partition::require_positive(num_ps, "min_max", "num_ps");
    detail::partition::require_positive(max_partitions, "min_max", "max_partitions");
    detail::partition::require_positive(min_slice_size, "min_max", "min_slice_size");
    return detail::partition::deal(vars, num_ps, [this](const variable_spec& v) {
      const std::size_t wanted = detail::partition::ceil_div(v.size_bytes(), min_slice_size);
      return std::max<std::size_t>(1, std::min({detail::partition::rows_of(v), max_partitions, wanted}));
    });
  }
};
static_assert(partitioner<min_max>, "min_max must model dtf::partitioner");

}  // namespace partitioners
}  // namespace dtf
