// dtf/train/trusted_labels.hpp — a model's per-step label check switched off while it trains
// from a device shard that checked every label at upload (docs/design/gpu-execution.md,
// section 3): on CUDA builds that check is a search whose answer the host reads each step.
#pragma once

#include <dtf/nn/loss.hpp>

#include <concepts>
#include <cstddef>

namespace dtf::detail {

/// A model whose loss can skip its per-step label check (nn::sequential).
template <class M>
concept checks_labels = requires(M& m, const M& cm) {
  m.set_label_check(nn::label_check::trusted);
  { cm.label_check_mode() } -> std::same_as<nn::label_check>;
  { cm.num_classes() } -> std::convertible_to<std::size_t>;
};

/// While alive, a model that checks its labels trusts them (nn::label_check::trusted): the device
/// shard checked every label against the model's classes at upload, and its gather only
/// permutes them, so a per-step check (a host read on CUDA builds) would find nothing. The
/// model's own setting is restored afterwards.
template <class M>
class labels_checked_at_upload {
 public:
  explicit labels_checked_at_upload(M& net) : net_(net) {
    if constexpr (checks_labels<M>) {
      before_ = net.label_check_mode();
      net.set_label_check(nn::label_check::trusted);
    }
  }
  labels_checked_at_upload(const labels_checked_at_upload&) = delete;
  labels_checked_at_upload& operator=(const labels_checked_at_upload&) = delete;
  ~labels_checked_at_upload() {
    if constexpr (checks_labels<M>) net_.set_label_check(before_);
  }
  /// The classes to check at upload: the model's, or 0 (no check) for a model that checks none.
  static std::size_t classes(const M& net) {
    if constexpr (checks_labels<M>)
      return net.num_classes();
    else
      return 0;
  }

 private:
  M& net_;
  nn::label_check before_ = nn::label_check::verify;
};

}  // namespace dtf::detail
