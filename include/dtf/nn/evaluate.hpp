// dtf/nn/evaluate.hpp — loss and accuracy of a classifier over a dataset.
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/data/dataset.hpp>
#include <dtf/host.hpp>
#include <dtf/nn/loss.hpp>

#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dtf::nn {

/// Loss and accuracy of a classifier over a dataset.
struct evaluation {
  double loss = 0.0;         ///< mean softmax cross-entropy
  double accuracy = 0.0;     ///< fraction of examples whose top logit is the label
  /// The number of examples evaluated.
  std::size_t examples = 0;
  /// Further figures of an evaluation callback (name, value), appended to the RESULT line as
  /// name=value (e.g. a binary classifier's auc and log_loss: dtf/metrics/binary_eval.hpp).
  std::vector<std::pair<std::string, double>> metrics;
};

namespace detail {
/// The loss and accuracy of a pass, summed batch by batch.
class evaluation_sum {
 public:
  void add(const tensor& logits, const tensor& labels) {
    const std::size_t rows = labels.size();
    loss_sum_ += double(xent_(logits, labels, nullptr)) * double(rows);
    correct_ += count_correct(logits, labels);
    examples_ += rows;
  }
  evaluation result() const {
    evaluation r;
    r.examples = examples_;
    if (examples_) {
      r.loss = loss_sum_ / double(examples_);
      r.accuracy = double(correct_) / double(examples_);
    }
    return r;
  }

 private:
  softmax_cross_entropy xent_;
  double loss_sum_ = 0.0;
  std::size_t correct_ = 0, examples_ = 0;
};
}  // namespace detail

/// Evaluates parameters p of m over one pass of `ds` (its batch size is used; shuffle,
/// repeat and prefetch settings are ignored: one ordered epoch).
template <classifier M>
evaluation evaluate(M& m, std::span<const float> p, const data::dataset& ds) {
  detail::evaluation_sum sum;
  tensor x, y, logits;
  auto stream = ds.repeat(1).prefetch(0).stream();
  while (auto b = stream.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    m.logits(p, x, logits);
    sum.add(logits, y);
  }
  return sum.result();
}

}  // namespace dtf::nn
