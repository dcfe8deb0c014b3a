// dtf/data/dataset.hpp — an in-memory dataset of (features, label) examples and the input
// pipeline around it: shard, take, shuffle, normalise, batch, repeat, prefetch.
//
//   auto train = dtf::data::dataset::from_idx(images, labels)
//                    .shard(num_workers, worker_index)  // every num_workers-th example
//                    .shuffle(seed)                      // a new permutation every epoch
//                    .normalize()                        // to [0, 1]
//                    .batch(64)
//                    .repeat(5)                          // epochs; -1 repeats forever
//                    .prefetch(2);                       // batches built on a background thread
//   for (auto s = train.stream(); auto b = s.next();) { ... b->features, b->labels ... }
//   auto rest = train.stream(at);  // from a data::position (e.g. a restarted worker's)
//
// shard() and take() select examples and compose in call order; shuffle, normalize, batch,
// repeat and prefetch are settings of the pipeline whose effect does not depend on the order
// of the calls: each epoch permutes the selected examples (seed + epoch), then cuts them into
// batches. Datasets are values: each call returns a new dataset sharing the examples, except
// shard(), which keeps a compact copy of its examples only (so that a worker holds its shard,
// not the whole set). Examples read from IDX files stay the file's bytes (uint8) in memory;
// normalize() and the conversion to float32 happen per batch, into the batch's buffer.
// Thread safety: a dataset is immutable and may be shared; a batch_stream serves one thread.
#pragma once

#include <dtf/error.hpp>
#include <dtf/data/idx.hpp>
#include <dtf/data/position.hpp>
#include <dtf/nn/init.hpp>

#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

namespace dtf::data {

/// One batch in host memory.
struct host_batch {
  xt::xtensor<float, 2> features;      ///< [rows, features]
  xt::xtensor<std::int32_t, 1> labels;  ///< [rows]
  std::size_t epoch = 0;                ///< 0-based epoch the batch belongs to
  std::size_t index = 0;                ///< 0-based position of the batch within its epoch
};

class batch_stream;
class device_shard;

/// An in-memory dataset of (features, label) examples and the input pipeline around it: shard,
/// take, shuffle, normalize, batch, repeat, prefetch. A value: each call returns a new dataset
/// sharing the examples (shard() keeps a compact copy of its own). Immutable, so it may be shared
/// between threads; a batch_stream serves one thread.
class dataset {
 public:
  /// Examples as rows of `features` with one label each. value_min/value_max give the range
  /// of the raw feature values, used by normalize() (e.g. 0 and 255 for 8-bit pixels).
  dataset(xt::xtensor<float, 2> features, xt::xtensor<std::int32_t, 1> labels, float value_min, float value_max)
      : dataset(make_source(std::move(features), std::move(labels), value_min, value_max)) {}

  /// Images (IDX, [N, ...] unsigned bytes) flattened to [N, features], and labels (IDX, [N]).
  /// Errors: those of read_idx(), errc::corrupt_data when the label file is not one-dimensional
  /// u8 or its count differs from the image count.
  static dataset from_idx(const std::string& images_path, const std::string& labels_path) {
    idx_array images = read_idx(images_path);
    const idx_array labels = read_idx(labels_path);
    if (images.type != idx_type::u8 || images.shape.size() < 2)
      throw error(errc::corrupt_data, images_path + ": expected unsigned-byte images [N, ...], got a rank-" +
                                          std::to_string(images.shape.size()) + " array");
    if (labels.type != idx_type::u8 || labels.shape.size() != 1)
      throw error(errc::corrupt_data, labels_path + ": expected a one-dimensional unsigned-byte label array");
    if (labels.shape[0] != images.shape[0])
      throw error(errc::corrupt_data, labels_path + ": " + std::to_string(labels.shape[0]) + " labels for " +
                                          std::to_string(images.shape[0]) + " images in " + images_path);
    const std::size_t n = images.shape[0], width = images.size() / std::max<std::size_t>(n, 1);
    xt::xtensor<std::int32_t, 1> y = xt::xtensor<std::int32_t, 1>::from_shape({n});
    for (std::size_t i = 0; i < n; ++i) y(i) = std::int32_t(labels.bytes[i]);
    auto src = std::make_shared<source>();
    src->bytes = std::move(images.bytes);
    src->width = width;
    src->labels = std::move(y);
    src->value_min = 0.0f;
    src->value_max = 255.0f;
    return dataset(std::move(src), n);
  }

  /// Keeps every num_shards-th selected example starting at `index` (tf.data's shard), so
  /// that num_shards workers see disjoint parts whose union is the whole.
  dataset shard(std::size_t num_shards, std::size_t index) const {
    if (num_shards == 0 || index >= num_shards)
      throw error(errc::invalid_argument, "data::dataset::shard(num_shards=" + std::to_string(num_shards) +
                                              ", index=" + std::to_string(index) +
                                              "): index must be in [0, num_shards)");
    std::vector<std::uint32_t> picked;
    for (std::size_t i = index; i < indices_.size(); i += num_shards) picked.push_back(indices_[i]);
    // A compact copy of the picked examples, in selection order (indices 0..k-1 then name
    // the same examples in the same order, so shuffles and batches are unchanged).
    const source& from = *src_;
    auto kept = std::make_shared<source>();
    kept->width = from.width;
    kept->value_min = from.value_min;
    kept->value_max = from.value_max;
    kept->labels = xt::xtensor<std::int32_t, 1>::from_shape({picked.size()});
    const std::size_t w = from.width;
    if (from.is_bytes()) kept->bytes.resize(picked.size() * w);
    else kept->features = xt::xtensor<float, 2>::from_shape({picked.size(), w});
    for (std::size_t r = 0; r < picked.size(); ++r) {
      const std::size_t e = picked[r];
      if (from.is_bytes())
        std::copy_n(from.bytes.data() + e * w, w, kept->bytes.data() + r * w);
      else
        std::copy_n(from.features.data() + e * w, w, kept->features.data() + r * w);
      kept->labels(r) = from.labels(e);
    }
    dataset d = *this;
    d.src_ = std::move(kept);
    d.indices_.resize(picked.size());
    std::iota(d.indices_.begin(), d.indices_.end(), std::uint32_t{0});
    return d;
  }

  /// Keeps the first n selected examples (all when fewer).
  dataset take(std::size_t n) const {
    dataset d = *this;
    if (n < d.indices_.size()) d.indices_.resize(n);
    return d;
  }

  /// Visits the examples in a new seeded permutation every epoch (seed + epoch).
  dataset shuffle(std::uint64_t seed) const {
    dataset d = *this;
    d.shuffle_ = true;
    d.seed_ = seed;
    return d;
  }

  /// Maps features from [value_min, value_max] to [0, 1].
  dataset normalize() const {
    dataset d = *this;
    d.normalize_ = true;
    return d;
  }

  /// Batches of batch_size examples; the last batch of an epoch is smaller unless
  /// drop_remainder.
  dataset batch(std::size_t batch_size, bool drop_remainder = false) const {
    if (batch_size == 0) throw error(errc::invalid_argument, "data::dataset::batch: batch_size must be positive");
    dataset d = *this;
    d.batch_size_ = batch_size;
    d.drop_remainder_ = drop_remainder;
    return d;
  }

  /// Number of epochs; -1 for an endless stream.
  dataset repeat(std::int64_t epochs = -1) const {
    if (epochs < -1) throw error(errc::invalid_argument, "data::dataset::repeat: epochs must be -1 or >= 0");
    dataset d = *this;
    d.epochs_ = epochs;
    return d;
  }

  /// Builds up to `batches` batches ahead on a background thread (0: on the caller's thread).
  dataset prefetch(std::size_t batches) const {
    dataset d = *this;
    d.prefetch_ = batches;
    return d;
  }

  /// Number of selected examples.
  std::size_t size() const noexcept { return indices_.size(); }
  /// Number of features per example.
  std::size_t num_features() const noexcept { return src_->width; }
  /// Bytes the examples this dataset refers to occupy in memory (features and labels).
  std::size_t memory_bytes() const noexcept {
    return src_->bytes.size() + src_->features.size() * sizeof(float) + src_->labels.size() * sizeof(std::int32_t);
  }
  /// Examples per batch.
  std::size_t batch_size() const noexcept { return batch_size_; }
  /// Batches per epoch (the last one partial unless its remainder is dropped).
  std::size_t batches_per_epoch() const noexcept {
    return drop_remainder_ ? size() / batch_size_ : (size() + batch_size_ - 1) / batch_size_;
  }

  /// The examples of epoch `epoch` in the order the stream visits them, as rows of the examples
  /// this dataset refers to (device_shard's rows): the selection, permuted with seed + epoch
  /// when shuffled. Fisher–Yates with a generator of dtf's own, so that a seed gives the same
  /// order with every standard library.
  std::vector<std::uint32_t> epoch_order(std::size_t epoch) const {
    std::vector<std::uint32_t> order = indices_;
    if (!shuffle_) return order;
    nn::splitmix64 rng(seed_ + 0x9E3779B97F4A7C15ull * (epoch + 1));
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
    return order;
  }

  /// The label of selected example i (in selection order, before shuffling).
  std::int32_t label(std::size_t i) const { return src_->labels(indices_.at(i)); }

  /// A stream of batches; see batch_stream.
  batch_stream stream() const;
  /// The same stream from batch `from.batch` of epoch `from.epoch` on: exactly the batches the
  /// whole stream yields after that point (each epoch's permutation depends on the epoch alone).
  /// Errors: errc::invalid_argument when from.batch is not a batch of an epoch.
  batch_stream stream(const position& from) const;

 private:
  friend class batch_stream;
  friend class device_shard;
  // Features as float32 rows (the constructor) or as the file's bytes (from_idx): one of
  // the two is empty.
  struct source {
    xt::xtensor<float, 2> features;
    std::vector<std::uint8_t> bytes;
    std::size_t width = 0;
    xt::xtensor<std::int32_t, 1> labels;
    float value_min = 0.0f, value_max = 1.0f;
    bool is_bytes() const noexcept { return features.size() == 0 && !bytes.empty(); }
  };

  static std::pair<std::shared_ptr<const source>, std::size_t> make_source(xt::xtensor<float, 2> features,
                                                                          xt::xtensor<std::int32_t, 1> labels,
                                                                          float value_min, float value_max) {
    const std::size_t rows = features.shape(0), width = features.shape(1);
    auto src = std::make_shared<source>();
    src->features = std::move(features);
    src->width = width;
    src->labels = std::move(labels);
    src->value_min = value_min;
    src->value_max = value_max;
    return {std::move(src), rows};
  }
  explicit dataset(std::pair<std::shared_ptr<const source>, std::size_t> s) : dataset(std::move(s.first), s.second) {}

  dataset(std::shared_ptr<const source> src, std::size_t rows) : src_(std::move(src)) {
    if (rows != src_->labels.shape(0))
      throw error(errc::shape_mismatch, "data::dataset: " + std::to_string(rows) + " feature rows but " +
                                            std::to_string(src_->labels.shape(0)) + " labels");
    if (!(src_->value_max > src_->value_min))
      throw error(errc::invalid_argument, "data::dataset: value_max must exceed value_min");
    indices_.resize(rows);
    std::iota(indices_.begin(), indices_.end(), std::uint32_t{0});
  }

  std::shared_ptr<const source> src_;
  std::vector<std::uint32_t> indices_;
  bool shuffle_ = false;
  std::uint64_t seed_ = 0;
  bool normalize_ = false;
  std::size_t batch_size_ = 1;
  bool drop_remainder_ = false;
  std::int64_t epochs_ = 1;
  std::size_t prefetch_ = 0;
};

/// Produces a dataset's batches in order; with prefetch, on a background thread that stays
/// at most `prefetch` batches ahead and is stopped and joined when the stream is destroyed.
/// next() returns std::nullopt after the last epoch. An exception on the background thread
/// is rethrown by next().
class batch_stream {
 public:
  /// Starts at the beginning.
  explicit batch_stream(dataset d) : batch_stream(std::move(d), position{}) {}
  /// Starts at batch from.batch of epoch from.epoch (see dataset::stream(position)).
  batch_stream(dataset d, const position& from)
      : d_(std::move(d)), order_(d_.indices_), epoch_(std::size_t(from.epoch)), batch_in_epoch_(std::size_t(from.batch)) {
    const std::size_t per_epoch = d_.batches_per_epoch();
    if (from.batch > 0 && from.batch >= per_epoch)
      throw error(errc::invalid_argument, "data::batch_stream: batch " + std::to_string(from.batch) +
                                              " is not one of the " + std::to_string(per_epoch) + " of an epoch");
    // Mid-epoch: that epoch's permutation now (build_next permutes at an epoch's first batch).
    if (batch_in_epoch_ > 0 && d_.shuffle_) permute();
    if (d_.prefetch_ > 0) worker_ = std::thread([this] { produce(); });
  }
  batch_stream(const batch_stream&) = delete;
  batch_stream& operator=(const batch_stream&) = delete;
  ~batch_stream() {
    if (worker_.joinable()) {
      {
        std::lock_guard lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      worker_.join();
    }
  }

  /// The next batch, or std::nullopt after the last epoch.
  std::optional<host_batch> next() {
    if (!worker_.joinable()) return build_next();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || done_; });
    if (!queue_.empty()) {
      host_batch b = std::move(queue_.front());
      queue_.pop_front();
      cv_.notify_all();
      return b;
    }
    if (failure_) std::rethrow_exception(failure_);
    return std::nullopt;
  }

 private:
  std::optional<host_batch> build_next() {
    const std::size_t per_epoch = d_.batches_per_epoch();
    if (per_epoch == 0) return std::nullopt;
    if (batch_in_epoch_ == per_epoch) {
      batch_in_epoch_ = 0;
      ++epoch_;
    }
    if (d_.epochs_ >= 0 && epoch_ >= std::size_t(d_.epochs_)) return std::nullopt;
    if (batch_in_epoch_ == 0 && d_.shuffle_) permute();
    const std::size_t begin = batch_in_epoch_ * d_.batch_size_;
    const std::size_t rows = std::min(d_.batch_size_, order_.size() - begin);
    const std::size_t width = d_.num_features();
    host_batch b;
    b.features = xt::xtensor<float, 2>::from_shape({rows, width});
    b.labels = xt::xtensor<std::int32_t, 1>::from_shape({rows});
    b.epoch = epoch_;
    b.index = batch_in_epoch_;
    const auto& src = *d_.src_;
    const float lo = d_.normalize_ ? src.value_min : 0.0f;
    const float inv = d_.normalize_ ? 1.0f / (src.value_max - src.value_min) : 1.0f;
    const bool bytes = src.is_bytes();
    for (std::size_t r = 0; r < rows; ++r) {
      const std::uint32_t e = order_[begin + r];
      float* out = b.features.data() + r * width;
      if (bytes) {
        const std::uint8_t* in = src.bytes.data() + std::size_t(e) * width;
        for (std::size_t c = 0; c < width; ++c) out[c] = (float(in[c]) - lo) * inv;
      } else {
        const float* in = src.features.data() + std::size_t(e) * width;
        for (std::size_t c = 0; c < width; ++c) out[c] = (in[c] - lo) * inv;
      }
      b.labels(r) = src.labels(e);
    }
    ++batch_in_epoch_;
    return b;
  }

  void permute() { order_ = d_.epoch_order(epoch_); }

  void produce() {
    try {
      for (;;) {
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [&] { return stop_ || queue_.size() < d_.prefetch_; });
          if (stop_) break;
        }
        auto b = build_next();
        std::lock_guard lock(mu_);
        if (!b) break;
        queue_.push_back(std::move(*b));
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard lock(mu_);
      failure_ = std::current_exception();
    }
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }

  dataset d_;
  std::vector<std::uint32_t> order_;
  std::size_t epoch_ = 0, batch_in_epoch_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<host_batch> queue_;
  bool stop_ = false, done_ = false;
  std::exception_ptr failure_;
  std::thread worker_;  // last: started after every member it uses exists
};

inline batch_stream dataset::stream() const { return batch_stream(*this); }
inline batch_stream dataset::stream(const position& from) const { return batch_stream(*this, from); }

}  // namespace dtf::data
