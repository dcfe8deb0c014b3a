// dtf/metrics/binary.hpp — the metrics of a binary classifier (click-through prediction):
// exact ROC AUC and log loss, over whole arrays or accumulated batch by batch.
//
//   dtf::metrics::binary_accumulator acc;
//   for (each evaluation batch) acc.add(probabilities, labels);   // spans of float, labels 0/1
//   auto m = acc.result();                                        // m.auc, m.log_loss, m.examples
//
// AUC is exact: the scores are sorted once and ties take their average rank, so AUC is the
// Mann–Whitney statistic P(score of a positive > score of a negative) + P(equal) / 2 over all
// positive–negative pairs (a constant predictor scores 0.5). It needs both classes; with one
// class missing it is NaN and result().auc_defined() is false. Scores may be any finite values
// (only their order counts); the accumulator keeps every (score, label): 8 bytes per example.
//
// Log loss is the mean of -(y log p + (1 - y) log(1 - p)) over examples, p clipped to
// [eps, 1 - eps] (default 1e-7: float probabilities of 0 or 1 cost at most -log(1e-7) ≈ 16.1
// each instead of infinity), summed in double. Its scores must be probabilities in [0, 1].
//
// Errors (errc::invalid_argument): spans of different lengths, a label other than 0 or 1, a
// non-finite score, a log-loss score outside [0, 1]; each names the offending index.
#pragma once

#include <dtf/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::metrics {

/// The default clipping of log loss's probabilities.
inline constexpr double default_log_loss_eps = 1e-7;

namespace detail {
template <class L>
bool positive_label(L y, std::size_t i, const char* who) {
  if (y == L(0)) return false;
  if (y == L(1)) return true;
  throw error(errc::invalid_argument, std::string(who) + ": label " + std::to_string(static_cast<double>(y)) +
                                          " at index " + std::to_string(i) + " is not 0 or 1");
}

inline void check_sizes(std::size_t scores, std::size_t labels, const char* who) {
  if (scores != labels)
    throw error(errc::invalid_argument, std::string(who) + ": " + std::to_string(scores) + " scores but " +
                                            std::to_string(labels) + " labels");
}

inline void check_score(double s, std::size_t i, bool probability, const char* who) {
  if (!std::isfinite(s) || (probability && (s < 0.0 || s > 1.0)))
    throw error(errc::invalid_argument, std::string(who) + ": score " + std::to_string(s) + " at index " +
                                            std::to_string(i) +
                                            (probability ? " is not a probability in [0, 1]" : " is not finite"));
}

/// AUC of (score, positive) pairs, sorted here (ties at their average rank).
inline double auc_of(std::vector<std::pair<float, bool>>& v) {
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double positives = 0, rank_sum = 0;  // ranks from 1
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    double pos_in_tie = 0;
    while (j < v.size() && v[j].first == v[i].first) pos_in_tie += v[j++].second ? 1 : 0;
    const double average_rank = (double(i + 1) + double(j)) / 2.0;  // ranks i+1 .. j
    rank_sum += pos_in_tie * average_rank;
    positives += pos_in_tie;
    i = j;
  }
  const double negatives = double(v.size()) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives);
}

/// -(y log p + (1 - y) log(1 - p)), p clipped to [eps, 1 - eps].
inline double log_loss_term(double p, bool positive, double eps) {
  p = std::clamp(p, eps, 1.0 - eps);
  return positive ? -std::log(p) : -std::log1p(-p);
}
}  // namespace detail

/// Exact ROC AUC of `scores` against `labels` (0 or 1); NaN when one class is absent.
template <class L>
double auc(std::span<const float> scores, std::span<const L> labels) {
  detail::check_sizes(scores.size(), labels.size(), "metrics::auc");
  std::vector<std::pair<float, bool>> v(scores.size());
  for (std::size_t i = 0; i < scores.size(); ++i) {
    detail::check_score(scores[i], i, false, "metrics::auc");
    v[i] = {scores[i], detail::positive_label(labels[i], i, "metrics::auc")};
  }
  return detail::auc_of(v);
}

/// Mean log loss of probabilities `p` against `labels` (0 or 1), p clipped to [eps, 1 - eps];
/// 0 for no examples.
template <class L>
double log_loss(std::span<const float> p, std::span<const L> labels, double eps = default_log_loss_eps) {
  detail::check_sizes(p.size(), labels.size(), "metrics::log_loss");
  double sum = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    detail::check_score(p[i], i, true, "metrics::log_loss");
    sum += detail::log_loss_term(p[i], detail::positive_label(labels[i], i, "metrics::log_loss"), eps);
  }
  return p.empty() ? 0.0 : sum / double(p.size());
}

/// auc for containers (std::vector, ...) of scores and labels.
template <class P, class L>
double auc(const P& scores, const L& labels) {
  return auc(std::span<const float>(scores), std::span<const typename L::value_type>(labels));
}
/// log_loss for containers (std::vector, ...) of probabilities and labels.
template <class P, class L>
double log_loss(const P& p, const L& labels, double eps = default_log_loss_eps) {
  return log_loss(std::span<const float>(p), std::span<const typename L::value_type>(labels), eps);
}

/// What binary_accumulator::result() reports.
struct binary_metrics {
  std::uint64_t examples = 0;   ///< pairs accumulated
  std::uint64_t positives = 0;  ///< of which labelled 1
  /// Exact AUC; NaN when one class is absent.
  double auc = std::numeric_limits<double>::quiet_NaN();
  /// Mean clipped log loss (0 for no examples).
  double log_loss = 0;
  /// Whether auc is defined (both classes seen).
  bool auc_defined() const noexcept { return !std::isnan(auc); }
};

/// Exact AUC and log loss accumulated over batches of (probability, label). Keeps every pair
/// (8 bytes each) for the AUC; log loss is summed as the batches arrive.
class binary_accumulator {
 public:
  /// An empty accumulator whose log loss clips probabilities to [eps, 1 - eps].
  /// Errors: errc::invalid_argument when eps is outside [0, 0.5).
  explicit binary_accumulator(double eps = default_log_loss_eps) : eps_(eps) {
    if (!(eps >= 0.0 && eps < 0.5))
      throw error(errc::invalid_argument, "metrics::binary_accumulator: eps " + std::to_string(eps) +
                                              " is outside [0, 0.5)");
  }

  /// Adds a batch: probabilities in [0, 1] and labels 0 or 1 (float, int, ...). A batch with
  /// a bad entry is refused whole (nothing of it is added); the error names its index.
  template <class L>
  void add(std::span<const float> p, std::span<const L> labels) {
    detail::check_sizes(p.size(), labels.size(), "metrics::binary_accumulator");
    const std::size_t base = pairs_.size();
    double sum = 0;
    std::uint64_t pos = 0;
    try {
      for (std::size_t i = 0; i < p.size(); ++i) {
        detail::check_score(p[i], i, true, "metrics::binary_accumulator");
        const bool y = detail::positive_label(labels[i], i, "metrics::binary_accumulator");
        sum += detail::log_loss_term(p[i], y, eps_);
        pos += y ? 1 : 0;
        pairs_.emplace_back(p[i], y);
      }
    } catch (...) {
      pairs_.resize(base);
      throw;
    }
    loss_sum_ += sum;
    positives_ += pos;
  }
  /// The same for containers (std::vector, ...).
  template <class P, class L>
  void add(const P& p, const L& labels) {
    add(std::span<const float>(p), std::span<const typename L::value_type>(labels));
  }

  /// The metrics over everything added so far (sorts a copy of the pairs: O(n log n)).
  binary_metrics result() const {
    binary_metrics m;
    m.examples = pairs_.size();
    m.positives = positives_;
    m.log_loss = pairs_.empty() ? 0.0 : loss_sum_ / double(pairs_.size());
    auto copy = pairs_;
    m.auc = detail::auc_of(copy);
    return m;
  }

  /// Forgets every batch (a new evaluation).
  void clear() noexcept {
    pairs_.clear();
    loss_sum_ = 0;
    positives_ = 0;
  }

  /// Examples added.
  std::size_t size() const noexcept { return pairs_.size(); }

 private:
  double eps_;
  std::vector<std::pair<float, bool>> pairs_;
  double loss_sum_ = 0;
  std::uint64_t positives_ = 0;
};

}  // namespace dtf::metrics
