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
  double loss = 0.0;         ///< mean softmax cross-entropy (a dtf::evaluates_loss model: its own loss)
  double accuracy = 0.0;     ///< fraction of examples whose top logit is the label (0: no logits)
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
  void add(const tensor& logits, const tensor& labels) { add(xent_(logits, labels, nullptr), &logits, labels); }
  /// A batch whose mean loss is known; its logits (null or empty: none) give the correct ones.
  void add(float mean_loss, const tensor* logits, const tensor& labels) {
    const std::size_t rows = labels.size();
    loss_sum_ += double(mean_loss) * double(rows);
    if (logits && logits->size() > 0) correct_ += count_correct(*logits, labels);
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
/// repeat and prefetch settings are ignored: one ordered epoch). The loss is the model's own
/// when it has one (dtf::evaluates_loss), else softmax cross-entropy of the logits.
template <model M>
  requires classifier<M> || evaluates_loss<M>
evaluation evaluate(M& m, std::span<const float> p, const data::dataset& ds) {
  detail::evaluation_sum sum;
  tensor x, y, logits;
  auto stream = ds.repeat(1).prefetch(0).stream();
  while (auto b = stream.next()) {
    assign_from_host(x, b->features);
    assign_from_host(y, b->labels);
    if constexpr (evaluates_loss<M>) {
      const float loss = m.evaluation_loss(p, x, y, logits);
      sum.add(loss, &logits, y);
    } else {
      m.logits(p, x, logits);
      sum.add(logits, y);
    }
  }
  return sum.result();
}

}  // namespace dtf::nn
