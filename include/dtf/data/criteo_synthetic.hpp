// dtf/data/criteo_synthetic.hpp — synthetic click logs in the Criteo TSV format
// (dtf/data/criteo.hpp) with a planted model, so tests and benchmarks have data here and a
// known best achievable AUC to compare a trained model against.
//
//   auto logs = dtf::data::synthetic_criteo({.examples = 100000, .seed = 7});
//   logs.write("train.tsv.gz", true);             // what read_criteo reads back as logs.columns()
//   double best = logs.best_auc();                // the AUC of the true click probabilities
//
// The planted structure, all of it drawn from the seed alone (the same logs on every platform:
// no std:: distributions, whose output differs between standard libraries):
//   ids         categorical column c draws a rank k in [0, vocabulary) with P(k) ∝ 1/(k+1)^s
//               (Zipf, s = zipf_exponent); the rank is written as 8 hex digits through a 32-bit
//               bijection salted by the column and the seed (distinct ranks, distinct texts).
//   numbers     integer column j is floor(exp(mu_j + z) - 1), z ~ N(0, 1), mu_j from 1 to 4
//               across the columns (I2 shifted down by 3, so some values are negative, as
//               Criteo's I2 is).
//   missing     every feature field is empty with probability missing_rate.
//   hidden      each (column, rank) has a scalar effect b ~ N(0, 1) and an embedding
//               e ~ N(0, I_dim), drawn by hashing (seed, column, rank), never stored; each
//               integer column a weight v_j ~ N(0, 1). A missing field has b = 0, e = 0.
//   the model   logit = bias + linear_scale · Σ_c b_c / √26
//                      + interaction_scale · Σ_{c<c'} <e_c, e_c'> / √(325 · dim)
//                      + numeric_scale · Σ_j v_j (criteo_dense_value(x_j) − mu_j) / √13
//               (x_j as written; a missing one counts 0), p = sigmoid(logit), label ~ Bernoulli(p).
// The model reads only what the file holds, so p is the best any model of the file can predict:
// the AUC of p over the sample (best_auc) is the target a trained model approaches (over a
// finite sample a model can land a little above or below it). Defaults give a click rate
// near 0.2 and a best AUC near 0.81 (100,000 examples, seeds 1 and 3: 0.81, 0.805).
//
// Bounds: vocabulary ≤ 2^24 (the Zipf table holds one double per rank), dim ≤ 64; the logs
// hold 312 bytes per example (raw values) plus what columns() returns.
#pragma once

#include <dtf/data/criteo.hpp>
#include <dtf/error.hpp>
#include <dtf/metrics/binary.hpp>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace dtf::data {

/// The knobs of synthetic_criteo.
struct criteo_synthetic_config {
  std::size_t examples = 10000;  ///< lines to generate
  std::uint64_t seed = 1;        ///< the same seed gives the same logs on every platform
  /// Distinct values per categorical column (at most 2^24).
  std::size_t vocabulary = 1000;
  /// Zipf exponent s of the ids' ranks (> 0).
  double zipf_exponent = 1.1;
  /// Dimension of the hidden per-id embeddings (1 to 64).
  std::size_t dim = 4;
  /// Probability that a feature field is empty.
  double missing_rate = 0.05;
  /// The hidden model's terms (see the file comment).
  double bias = -1.5;
  double linear_scale = 1.0;       ///< weight of the ids' own effects
  double interaction_scale = 0.8;  ///< weight of the pairwise embedding interactions
  double numeric_scale = 0.6;      ///< weight of the numeric columns
};

/// Synthetic logs: the raw fields (what write() prints), the labels drawn and the true click
/// probabilities.
struct criteo_synthetic {
  /// Marks a missing integer field in `integers`.
  static constexpr std::int64_t missing_integer = std::numeric_limits<std::int64_t>::min();
  /// Marks a missing categorical field in `categorical`.
  static constexpr std::int64_t missing_categorical = -1;

  std::vector<float> labels;             ///< 0 or 1
  std::vector<float> click_probability;  ///< the planted model's p per example
  std::vector<std::int64_t> integers;    ///< [examples, 13]: values or missing_integer
  std::vector<std::int64_t> categorical; ///< [examples, 26]: 32-bit values or missing_categorical

  /// The number of examples.
  std::size_t size() const noexcept { return labels.size(); }

  /// The AUC of the true probabilities against the labels drawn: the best a model can reach.
  double best_auc() const { return metrics::auc(click_probability, labels); }
  /// The log loss of the true probabilities (the least a model can expect).
  double best_log_loss() const { return metrics::log_loss(click_probability, labels); }

  /// Example i's line as write() prints it, without the newline.
  std::string line(std::size_t i) const {
    std::string s = labels[i] != 0.0f ? "1" : "0";
    for (std::size_t j = 0; j < criteo_dense_columns; ++j) {
      s += '\t';
      const std::int64_t v = integers[i * criteo_dense_columns + j];
      if (v != missing_integer) s += std::to_string(v);
    }
    for (std::size_t c = 0; c < criteo_categorical_columns; ++c) {
      s += '\t';
      const std::int64_t v = categorical[i * criteo_categorical_columns + c];
      if (v != missing_categorical) {
        char hex[12];
        std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(v));
        s += hex;
      }
    }
    return s;
  }

  /// The columns read_criteo returns for the file write() makes.
  criteo_columns columns() const {
    criteo_columns out;
    out.labels = labels;
    out.dense.resize(size() * criteo_dense_columns);
    out.ids.resize(size() * criteo_categorical_columns);
    for (std::size_t k = 0; k < out.dense.size(); ++k)
      out.dense[k] = integers[k] == missing_integer ? 0.0f : criteo_dense_value(integers[k]);
    for (std::size_t k = 0; k < out.ids.size(); ++k) {
      if (categorical[k] == missing_categorical) {
        out.ids[k] = criteo_missing_id;
        continue;
      }
      char hex[12];
      std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(categorical[k]));
      out.ids[k] = criteo_id(k % criteo_categorical_columns, hex);
    }
    return out;
  }

  /// Writes the logs as Criteo TSV to `path`, gzip-compressed when `gzip`.
  void write(const std::string& path, bool gzip = false) const {
    std::unique_ptr<gzFile_s, detail::gz_closer> f(gzopen(path.c_str(), gzip ? "wb6" : "wbT"));
    if (!f) throw error(errc::io_error, path + ": cannot create (" + std::strerror(errno) + ")");
    std::string buf;
    auto flush = [&] {
      if (!buf.empty() && gzwrite(f.get(), buf.data(), unsigned(buf.size())) != int(buf.size())) {
        int code = 0;
        throw error(errc::io_error, path + ": write failed (" + gzerror(f.get(), &code) + ")");
      }
      buf.clear();
    };
    for (std::size_t i = 0; i < size(); ++i) {
      buf += line(i);
      buf += '\n';
      if (buf.size() >= (std::size_t(1) << 20)) flush();
    }
    flush();
    if (gzclose(f.release()) != Z_OK) throw error(errc::io_error, path + ": closing failed (disk full?)");
  }
};

namespace detail {

inline std::uint64_t synth_mix(std::uint64_t x) noexcept {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// A uniform double in (0, 1) from 64 random bits.
inline double synth_unit(std::uint64_t bits) noexcept { return (double(bits >> 11) + 0.5) * 0x1.0p-53; }
/// A standard normal from two hashes (Box–Muller; one of the pair is used).
inline double synth_normal(std::uint64_t key) noexcept {
  const double u1 = synth_unit(synth_mix(key)), u2 = synth_unit(synth_mix(key ^ 0x5bd1e9955bd1e995ull));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
/// A key for the hidden value `what` of (column, rank) under `seed`.
inline std::uint64_t synth_key(std::uint64_t seed, std::uint64_t column, std::uint64_t rank, std::uint64_t what) {
  return synth_mix(synth_mix(synth_mix(seed ^ 0x243f6a8885a308d3ull) ^ column) ^ rank) ^ (what * 0x9e3779b97f4a7c15ull);
}
/// A bijection of 32-bit values (xorshift-multiply rounds, each invertible).
inline std::uint32_t synth_permute(std::uint32_t x, std::uint32_t salt) noexcept {
  x ^= salt;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

/// A sequential stream of random bits (splitmix64).
struct synth_stream {
  std::uint64_t state;
  std::uint64_t next() noexcept { return synth_mix(state++ * 0x9e3779b97f4a7c15ull); }
  double unit() noexcept { return synth_unit(next()); }
  double normal() noexcept { return synth_normal(next()); }
};

}  // namespace detail

/// Draws synthetic Criteo logs (see the file comment); the same config gives the same logs.
inline criteo_synthetic synthetic_criteo(const criteo_synthetic_config& cfg) {
  const char* who = "data::synthetic_criteo: ";
  if (cfg.vocabulary == 0 || cfg.vocabulary > (std::size_t(1) << 24))
    throw error(errc::invalid_argument, who + std::string("vocabulary ") + std::to_string(cfg.vocabulary) +
                                            " is outside [1, 2^24]");
  if (cfg.dim == 0 || cfg.dim > 64)
    throw error(errc::invalid_argument, who + std::string("dim ") + std::to_string(cfg.dim) + " is outside [1, 64]");
  if (!(cfg.zipf_exponent > 0.0) || !std::isfinite(cfg.zipf_exponent))
    throw error(errc::invalid_argument, who + std::string("zipf_exponent must be positive and finite"));
  if (!(cfg.missing_rate >= 0.0 && cfg.missing_rate < 1.0))
    throw error(errc::invalid_argument, who + std::string("missing_rate must be in [0, 1)"));
  for (double x : {cfg.bias, cfg.linear_scale, cfg.interaction_scale, cfg.numeric_scale})
    if (!std::isfinite(x)) throw error(errc::invalid_argument, who + std::string("a model term is not finite"));

  constexpr std::size_t D = criteo_dense_columns, C = criteo_categorical_columns;
  // The Zipf CDF over ranks (shared by the columns).
  std::vector<double> cdf(cfg.vocabulary);
  double total = 0;
  for (std::size_t k = 0; k < cfg.vocabulary; ++k) cdf[k] = total += std::pow(double(k + 1), -cfg.zipf_exponent);
  for (auto& x : cdf) x /= total;
  std::array<double, D> mu{}, v{};
  for (std::size_t j = 0; j < D; ++j) {
    mu[j] = 1.0 + 3.0 * double(j) / double(D - 1);
    v[j] = detail::synth_normal(detail::synth_key(cfg.seed, 1000 + j, 0, 0));
  }
  const double lin = cfg.linear_scale / std::sqrt(double(C));
  const double inter = cfg.interaction_scale / std::sqrt(double(C * (C - 1) / 2) * double(cfg.dim));
  const double num = cfg.numeric_scale / std::sqrt(double(D));

  criteo_synthetic out;
  out.labels.resize(cfg.examples);
  out.click_probability.resize(cfg.examples);
  out.integers.resize(cfg.examples * D);
  out.categorical.resize(cfg.examples * C);
  detail::synth_stream rng{detail::synth_mix(cfg.seed)};
  std::vector<double> e_sum(cfg.dim);
  for (std::size_t i = 0; i < cfg.examples; ++i) {
    double logit = cfg.bias, numeric = 0, linear = 0, squares = 0;
    std::fill(e_sum.begin(), e_sum.end(), 0.0);
    for (std::size_t j = 0; j < D; ++j) {
      const bool missing = rng.unit() < cfg.missing_rate;
      const double z = rng.normal();
      std::int64_t x = static_cast<std::int64_t>(std::floor(std::expm1(mu[j] + z))) - (j == 1 ? 3 : 0);
      out.integers[i * D + j] = missing ? criteo_synthetic::missing_integer : x;
      numeric += v[j] * ((missing ? 0.0 : double(criteo_dense_value(x))) - mu[j]);
    }
    for (std::size_t c = 0; c < C; ++c) {
      const bool missing = rng.unit() < cfg.missing_rate;
      const double u = rng.unit();
      const auto rank = std::size_t(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      const std::size_t k = rank < cfg.vocabulary ? rank : cfg.vocabulary - 1;
      const auto salt = std::uint32_t(detail::synth_mix(cfg.seed ^ (c + 1)));
      out.categorical[i * C + c] =
          missing ? criteo_synthetic::missing_categorical : std::int64_t(detail::synth_permute(std::uint32_t(k), salt));
      if (missing) continue;
      linear += detail::synth_normal(detail::synth_key(cfg.seed, c, k, 0));
      for (std::size_t d = 0; d < cfg.dim; ++d) {
        const double e = detail::synth_normal(detail::synth_key(cfg.seed, c, k, 1 + d));
        e_sum[d] += e;
        squares += e * e;
      }
    }
    double pairs = -squares;  // Σ_{c<c'} <e_c, e_c'> = (|Σ e|² − Σ |e|²) / 2
    for (double s : e_sum) pairs += s * s;
    logit += lin * linear + inter * pairs / 2.0 + num * numeric;
    const double p = 1.0 / (1.0 + std::exp(-logit));
    out.click_probability[i] = static_cast<float>(p);
    out.labels[i] = rng.unit() < p ? 1.0f : 0.0f;
  }
  return out;
}

}  // namespace dtf::data
