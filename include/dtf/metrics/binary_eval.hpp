// dtf/metrics/binary_eval.hpp — the evaluation callback of a click model (a binary classifier)
// for dtf::train: exact AUC and log loss over a held-out set, printed on the RESULT line.
//
//   auto last = std::make_shared<dtf::metrics::binary_metrics>();    // optional: the figures
//   options.evaluate_rows = dtf::metrics::binary_evaluate_on(net, test.batch(4096), last);  // embedding model
//   options.evaluate = dtf::metrics::binary_evaluate_on(net, test.batch(4096));             // dense model
//   // the chief's RESULT line then ends in "auc=0.7912 log_loss=0.4567"
//
// The model's logits are read as a logistic model's: one logit z per example, p = sigmoid(z),
// or two, p = softmax(z)[1] = sigmoid(z1 − z0) (two-class softmax cross-entropy, nn::sequential's
// loss, is the binary cross-entropy of that difference, so such a model is a logistic model with
// one redundant degree of freedom). Labels must be 0 or 1.
//
// The nn::evaluation returned (what dtf::train reports after each epoch and at the end): loss
// is the mean log loss (clipped as metrics::log_loss), accuracy the fraction of examples on the
// right side of p = 0.5, metrics = {auc, log_loss}. `sink`, when given, receives each
// evaluation's binary_metrics (for the program's own report after dtf::train returns).
//
// Errors: errc::shape_mismatch for logits of another width than 1 or 2; those of
// binary_accumulator (a label other than 0 or 1, a non-finite logit), naming the index.
// Cost: one ordered pass over the set; 8 bytes per example kept for the exact AUC.
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/embedding_model.hpp>
#include <dtf/host.hpp>
#include <dtf/metrics/binary.hpp>
#include <dtf/nn/evaluate.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dtf::metrics {

namespace detail {

/// Accumulates one batch's logits (device memory, [n, 1] or [n, 2]) against its labels.
class binary_evaluation_sum {
 public:
  void add(const tensor& logits, std::span<const std::int32_t> labels) {
    const std::size_t n = labels.size();
    const std::size_t width = n ? logits.size() / n : 0;
    if (n && (logits.size() != n * width || (width != 1 && width != 2)))
      throw error(errc::shape_mismatch, "metrics::binary_evaluate: " + std::to_string(logits.size()) +
                                            " logits for " + std::to_string(n) +
                                            " examples (a binary classifier has 1 or 2 per example)");
    host_.resize(logits.size());
    logits.copy_to_host<float>(std::span<float>(host_));
    p_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float z = width == 1 ? host_[i] : host_[2 * i + 1] - host_[2 * i];
      if (!std::isfinite(z))
        throw error(errc::invalid_argument, "metrics::binary_evaluate: a non-finite logit at example " +
                                                std::to_string(examples_ + i));
      // sigmoid without overflow: exp of a non-positive argument only
      const float e = std::exp(-std::fabs(z));
      p_[i] = z >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
      correct_ += (p_[i] >= 0.5f) == (labels[i] == 1) ? 1 : 0;
    }
    acc_.add(std::span<const float>(p_), labels);
    examples_ += n;
  }
  nn::evaluation result(binary_metrics* sink) const {
    const binary_metrics m = acc_.result();
    if (sink) *sink = m;
    nn::evaluation e;
    e.examples = examples_;
    e.loss = m.log_loss;
    e.accuracy = examples_ ? double(correct_) / double(examples_) : 0.0;
    e.metrics = {{"auc", m.auc}, {"log_loss", m.log_loss}};
    return e;
  }

 private:
  binary_accumulator acc_;
  std::vector<float> host_, p_;
  std::size_t correct_ = 0, examples_ = 0;
};

inline std::span<const std::int32_t> labels_of(const data::host_batch& b) {
  return {b.labels.data(), b.labels.size()};
}

}  // namespace detail

/// AUC, log loss and accuracy of dense parameters p of a binary classifier m over one ordered
/// pass of `ds` (see the file comment); `sink` (optional) receives the binary_metrics.
template <classifier M>
nn::evaluation evaluate_binary(M& m, std::span<const float> p, const data::dataset& ds, binary_metrics* sink = nullptr) {
  detail::binary_evaluation_sum sum;
  tensor x, logits;
  auto stream = ds.repeat(1).prefetch(0).stream();
  while (auto b = stream.next()) {
    assign_from_host(x, b->features);
    m.logits(p, x, logits);
    sum.add(logits, detail::labels_of(*b));
  }
  return sum.result(sink);
}

/// The same for an embedding classifier: its tables' rows read through `read` (as nn::evaluate).
template <embedding_classifier M>
nn::evaluation evaluate_binary(M& m, std::span<const float> p, const row_reader& read, const data::dataset& ds,
                               binary_metrics* sink = nullptr) {
  detail::binary_evaluation_sum sum;
  dtf::detail::for_each_logits(m, p, read, ds, [&](const data::host_batch& b, const tensor& logits) {
    sum.add(logits, detail::labels_of(b));
  });
  return sum.result(sink);
}

/// An evaluation callback for train_options::evaluate: evaluate_binary of `m` over `test`.
template <classifier M>
std::function<nn::evaluation(std::span<const float>)> binary_evaluate_on(
    M& m, data::dataset test, std::shared_ptr<binary_metrics> sink = {}) {
  return [&m, test = std::move(test), sink](std::span<const float> p) {
    return evaluate_binary(m, p, test, sink.get());
  };
}
/// The same for an embedding classifier, for train_options::evaluate_rows.
template <embedding_classifier M>
std::function<nn::evaluation(std::span<const float>, const row_reader&)> binary_evaluate_on(
    M& m, data::dataset test, std::shared_ptr<binary_metrics> sink = {}) {
  return [&m, test = std::move(test), sink](std::span<const float> p, const row_reader& rows) {
    return evaluate_binary(m, p, rows, test, sink.get());
  };
}

}  // namespace dtf::metrics
