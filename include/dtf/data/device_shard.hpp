// dtf/data/device_shard.hpp — a training shard uploaded once to device memory, and its batches
// gathered and normalised there (docs/design/gpu-execution.md, section 3).
//
//   auto train = dtf::data::load_fashion_mnist(dtf::data::split::train)
//                    .shard(workers, index).shuffle(seed).normalize().batch(64);
//   dtf::data::device_shard shard(train, 10);  // the examples and labels, uploaded; labels checked
//   for (dtf::data::position at; ...) shard.gather(at.epoch, at.batch, x, y);  // x, y: device tensors
//
// The host pipeline (data::batch_stream) builds every batch on the CPU and the strategy copies it
// to the device; on a GPU that is a pageable copy per step. A device_shard holds the examples the
// dataset refers to in device memory as they are in the host (an IDX file's bytes stay uint8,
// float32 rows stay float32) with their labels, uploaded once. gather() cuts batch `index` of
// epoch `epoch` exactly as the stream does: the same permutation (dataset::epoch_order), the
// same rows, and the same arithmetic for normalisation ((value - min) * (1 / (max - min)) in
// float32, which no compiler contracts into a fused multiply-add), so its batch equals the
// stream's bit for bit, and positions and resumption are those of the host pipeline.
//
// Work per call: the features' and labels' gather, one device::for_each_index each over device
// memory, issued on stream() (set_stream(), e.g. a training engine's compute stream, where
// dtf::train puts them; the legacy default stream otherwise); on CPU builds a loop on the calling
// thread (each element is computed alone, so the bits are those of any order). An epoch's order
// is uploaded once, at its first batch, through a pinned buffer allocated at construction
// (device::pinned_upload): on CUDA builds a cudaMemcpyAsync of 4 bytes per example on stream(),
// ordered after the gathers that read the last epoch's order, which the host does not wait for
// (it waits only, before writing the pinned buffer again, for the last epoch's copy, an epoch of
// batches ago).
// Memory: the examples of the dataset's source (after shard(), the shard alone; after take() of an
// unsharded set, the whole source), one epoch's order on the device and in pinned host memory.
// Thread safety: one device_shard serves one thread at a time.
#pragma once

#include <dtf/data/dataset.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/device/pinned_upload.hpp>
#include <dtf/error.hpp>
#include <dtf/tensor.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtf::data {

namespace detail {
// out[k] = (float(in[order[r] * width + c]) - lo) * inv for k = r * width + c: the stream's
// normalisation of one batch element (In: std::uint8_t or float).
template <class In>
struct gather_features {
  const In* in;
  const std::uint32_t* order;
  float* out;
  std::size_t width;
  float lo, inv;
  DTF_HD void operator()(std::size_t k) const {
    const std::size_t r = k / width, c = k - r * width;
    out[k] = (float(in[std::size_t(order[r]) * width + c]) - lo) * inv;
  }
};
struct gather_labels {
  const std::int32_t* in;
  const std::uint32_t* order;
  std::int32_t* out;
  DTF_HD void operator()(std::size_t r) const { out[r] = in[order[r]]; }
};
}  // namespace detail

/// A dataset's examples and labels in device memory, uploaded once, and its batches gathered and
/// normalised there, equal bit for bit to the host stream's (see the file comment).
class device_shard {
 public:
  /// Uploads the examples `d` refers to. With `classes` > 0 every selected label must be in
  /// [0, classes). Errors: errc::invalid_argument naming the first example whose label is not.
  explicit device_shard(const dataset& d, std::size_t classes = 0) : d_(d) {
    const auto& src = *d_.src_;
    if (classes > 0)
      for (std::size_t i = 0; i < d_.indices_.size(); ++i) {
        const std::int32_t label = src.labels(d_.indices_[i]);
        if (label < 0 || std::size_t(label) >= classes)
          throw error(errc::invalid_argument, "data::device_shard: example " + std::to_string(i) + " has label " +
                                                  std::to_string(label) + ", not in [0, " + std::to_string(classes) + ")");
      }
    if (src.is_bytes())
      bytes_.assign(src.bytes.begin(), src.bytes.end());
    else
      floats_.assign(src.features.data(), src.features.data() + src.features.size());
    labels_.assign(src.labels.data(), src.labels.data() + src.labels.size());
    const float lo = d_.normalize_ ? src.value_min : 0.0f;
    lo_ = lo;
    inv_ = d_.normalize_ ? 1.0f / (src.value_max - src.value_min) : 1.0f;
    order_.resize(d_.size());  // an epoch's order: allocated now, before any gather reads it
    upload_ = device::pinned_upload(d_.size() * sizeof(std::uint32_t));
  }

  /// Examples per epoch, features per example, batches per epoch: the dataset's.
  ///@{
  std::size_t size() const noexcept { return d_.size(); }
  std::size_t num_features() const noexcept { return d_.num_features(); }
  std::size_t batches_per_epoch() const noexcept { return d_.batches_per_epoch(); }
  ///@}

  /// Batch `index` of epoch `epoch` into device tensors: x float32 [rows, features], y int32
  /// [rows] (resized, their allocations kept when large enough). Errors: errc::out_of_range
  /// when the batch is not one of an epoch's, or the epoch is past the dataset's last.
  void gather(std::size_t epoch, std::size_t index, tensor& x, tensor& y) {
    const std::size_t per_epoch = d_.batches_per_epoch();
    if (index >= per_epoch)
      throw error(errc::out_of_range, "data::device_shard: batch " + std::to_string(index) + " is not one of the " +
                                          std::to_string(per_epoch) + " of an epoch");
    if (d_.epochs_ >= 0 && epoch >= std::size_t(d_.epochs_))
      throw error(errc::out_of_range, "data::device_shard: epoch " + std::to_string(epoch) + " is past the dataset's " +
                                          std::to_string(d_.epochs_));
    if (epoch_ != epoch) {
      upload_order(d_.epoch_order(epoch));
      epoch_ = epoch;
    }
    const std::size_t begin = index * d_.batch_size_;
    const std::size_t rows = std::min(d_.batch_size_, d_.size() - begin);
    const std::size_t width = d_.num_features();
    x.resize(dims{rows, width}, dtype::float32);
    y.resize(dims{rows}, dtype::int32);
    const std::uint32_t* order = thrust::raw_pointer_cast(order_.data()) + begin;
    if (!bytes_.empty())
      device::for_each_index(stream_, rows * width,
                             detail::gather_features<std::uint8_t>{thrust::raw_pointer_cast(bytes_.data()), order,
                                                                   x.data<float>(), width, lo_, inv_},
                             "data::device_shard (features)");
    else
      device::for_each_index(stream_, rows * width,
                             detail::gather_features<float>{thrust::raw_pointer_cast(floats_.data()), order,
                                                            x.data<float>(), width, lo_, inv_},
                             "data::device_shard (features)");
    device::for_each_index(stream_, rows,
                           detail::gather_labels{thrust::raw_pointer_cast(labels_.data()), order, y.data<std::int32_t>()},
                           "data::device_shard (labels)");
  }

  /// The stream the gathers are issued on (CUDA builds; null, the legacy default stream, unless set).
  device::stream_t stream() const noexcept { return stream_; }
  /// Issues later gathers (and order uploads) on s; whoever reads a batch orders its reads after
  /// them (the same stream, or an event). No effect on CPU builds.
  void set_stream(device::stream_t s) noexcept { stream_ = s; }

  /// Device bytes held: the examples, their labels and one epoch's order.
  std::size_t memory_bytes() const noexcept {
    return bytes_.size() + floats_.size() * sizeof(float) + labels_.size() * sizeof(std::int32_t) +
           order_.size() * sizeof(std::uint32_t);
  }

 private:
  // An epoch's order into order_, on stream_ after the gathers issued so far (see the file comment).
  void upload_order(const std::vector<std::uint32_t>& order) {
    if (order.size() != order_.size()) {  // not an epoch of this dataset's (kept for safety)
#if DTF_CUDA
      if (const cudaError_t rc = cudaStreamSynchronize(stream_); rc != cudaSuccess)  // the resize is on the legacy stream
        throw error(errc::internal, std::string("data::device_shard: uploading an epoch's order: ") + cudaGetErrorString(rc));
#endif
      order_.resize(order.size());
    }
    upload_.upload(thrust::raw_pointer_cast(order_.data()), order.data(), order.size() * sizeof(std::uint32_t), stream_);
  }

  dataset d_;
  thrust::device_vector<std::uint8_t> bytes_;  // an IDX file's bytes, or
  thrust::device_vector<float> floats_;        // float32 rows
  thrust::device_vector<std::int32_t> labels_;
  thrust::device_vector<std::uint32_t> order_;  // epoch_'s order
  device::pinned_upload upload_;                // its way there
  std::optional<std::size_t> epoch_;            // the epoch order_ holds (none yet)
  float lo_ = 0.0f, inv_ = 1.0f;
  device::stream_t stream_{};
};

}  // namespace dtf::data
