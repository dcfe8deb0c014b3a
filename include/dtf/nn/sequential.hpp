// dtf/nn/sequential.hpp — a stack of layers ending in softmax cross-entropy; models
// dtf::model and dtf::classifier.
//
//   dtf::nn::sequential net{dtf::nn::dense(784, 256), dtf::nn::relu(),
//                           dtf::nn::dense(256, 10)};
//   std::vector<float> ... // or a dtf::tensor of net.num_parameters() floats
//   net.initialize(params, seed);
//   float loss = net.loss_and_gradients(params, x, y, grads);
//
// Variables are named "dense_<i>/kernel" and "dense_<i>/bias", i counting Dense layers from 0,
// laid out in layer order in the flat buffer.
// Streams: by default every kernel runs on the legacy default stream (GEMMs through this thread's
// cuBLAS handle). set_context(ctx) puts the whole step (layers, loss, the gradient events) on
// ctx's compute stream, GEMMs through its handle: no call of a steady step waits on the host
// except the ready callback's event (see loss_and_gradients; set_ready_on_device leaves that wait
// to the callee) and the loss's read, which enqueue_loss_and_gradients() leaves out. CPU builds: the same calls, no effect.
// On a context (CUDA builds) the Dense layers' GEMMs are cuBLASLt matmuls with epilogues where
// cuBLASLt has an algorithm for the shape (docs/design/gpu-execution.md, section 4.1): a
// Dense+ReLU pair whose ReLU feeds a Dense layer keeps its ReLU mask, and that layer's
// input-gradient matmul applies it and writes the pair's bias gradient (DRELU_BGRAD).
// Thread safety: an instance keeps activations between forward and backward; use one instance
// per thread (copies are cheap before the first step).
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/config.hpp>
#include <dtf/detail/device_memory.hpp>
#include <dtf/device/context.hpp>
#include <dtf/nn/init.hpp>
#include <dtf/nn/layers.hpp>
#include <dtf/nn/loss.hpp>

#if DTF_CUDA
#include <cuda_runtime_api.h>
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dtf::nn {

#if DTF_CUDA
namespace detail {
// One event per layer, created at its first use and kept: a ready callback costs an event
// record and a wait for it (none with set_ready_on_device), no creation per step. A copy starts with none of its own (events
// are not shared between instances).
struct layer_events {
  std::vector<cudaEvent_t> events;
  cudaEvent_t current = nullptr;
  layer_events() = default;
  layer_events(const layer_events&) {}
  layer_events& operator=(const layer_events&) { return *this; }
  ~layer_events() {
    for (cudaEvent_t e : events)
      if (e) cudaEventDestroy(e);
  }
  // Records layer i's event on `stream` (where the layers issue) and, with `wait`, waits for it.
  void record_and_wait(std::size_t i, std::size_t layers, cudaStream_t stream, bool wait = true) {
    if (events.size() < layers) events.resize(layers, nullptr);
    cudaError_t rc = cudaSuccess;
    if (!events[i]) rc = cudaEventCreateWithFlags(&events[i], cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(events[i], stream ? stream : cudaStreamLegacy);
    if (rc == cudaSuccess && wait) rc = cudaEventSynchronize(events[i]);
    if (rc != cudaSuccess)
      throw error(errc::internal, std::string("nn::sequential: waiting for a layer's gradient: ") + cudaGetErrorString(rc));
    current = events[i];
  }
};
}  // namespace detail
#endif

/// A layer of a sequential model.
using layer = std::variant<dense, relu>;

/// A stack of layers ending in softmax cross-entropy; models dtf::model and dtf::classifier.
class sequential {
 public:
  /// Errors: errc::shape_mismatch when a Dense layer's inputs do not match the features the
  /// previous layers produce; errc::invalid_argument for an empty model or one that does not
  /// end in a Dense layer (its outputs are the logits).
  sequential(std::initializer_list<layer> layers) : sequential(std::vector<layer>(layers)) {}

  /// The same from a list built at run time (e.g. widths read from flags).
  explicit sequential(std::vector<layer> layers) : layers_(std::move(layers)) {
    if (layers_.empty()) throw error(errc::invalid_argument, "nn::sequential: no layers");
    std::size_t width = 0, offset = 0, dense_index = 0;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      offsets_.push_back(offset);
      if (auto* d = std::get_if<dense>(&layers_[i])) {
        if (width != 0 && d->in_features() != width)
          throw error(errc::shape_mismatch, "nn::sequential: layer " + std::to_string(i) + " (dense " +
                                                std::to_string(d->in_features()) + "->" +
                                                std::to_string(d->out_features()) + ") expects " +
                                                std::to_string(d->in_features()) +
                                                " inputs but the layers before it produce " + std::to_string(width));
        if (width == 0) input_features_ = d->in_features();
        auto vars = d->variables("dense_" + std::to_string(dense_index++), offset);
        variables_.insert(variables_.end(), vars.begin(), vars.end());
        offset += d->num_parameters();
        width = d->out_features();
      } else if (width == 0) {
        throw error(errc::invalid_argument,
                    "nn::sequential: layer " + std::to_string(i) + " comes before any dense layer; the first layer "
                                                                   "must be dense so that the input width is known");
      }
    }
    if (!std::holds_alternative<dense>(layers_.back()))
      throw error(errc::invalid_argument, "nn::sequential: the last layer must be dense (it produces the logits)");
    classes_ = width;
    num_parameters_ = offset;
    acts_.resize(layers_.size());
    grads_.resize(layers_.size());
  }

  /// dtf::model: the variables ("dense_<i>/kernel", "dense_<i>/bias").
  std::vector<variable_spec> variables() const { return variables_; }
  /// The number of parameters.
  std::size_t num_parameters() const noexcept { return num_parameters_; }
  /// Features per example (the first layer's inputs).
  std::size_t input_features() const noexcept { return input_features_; }
  /// The number of classes (the last layer's outputs).
  std::size_t num_classes() const noexcept { return classes_; }

  /// Fills p (device memory, num_parameters() floats): kernels by each layer's initializer
  /// with a per-layer seed derived from `seed`, biases zero.
  void initialize(std::span<float> p, std::uint64_t seed) const {
    check_size(p, "parameter");
    splitmix64 seeds(seed);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::uint64_t layer_seed = seeds();
      if (auto* d = std::get_if<dense>(&layers_[i])) {
        const bool relu_next = i + 1 < layers_.size() && std::holds_alternative<relu>(layers_[i + 1]);
        d->initialize(p.subspan(offsets_[i], d->num_parameters()), layer_seed, relu_next);
      }
    }
  }

  /// Mean softmax cross-entropy of the batch; writes the gradient into g and, when input_grad
  /// is not null, d loss / d x into it ([batch, input_features()]: what a layer below, such as
  /// an embedding lookup, back-propagates).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
                           tensor* input_grad = nullptr) {
    backprop(p, x, y, g, input_grad, nullptr);
    return loss_.read_loss();  // after the backward pass is issued: the queue stays full
  }

  /// The same, calling ready(first, count) with each Dense layer's variables (its kernel and
  /// bias, one contiguous range) as soon as their gradient is written (before the layer's
  /// gradient with respect to its input is computed), from the last layer to the first
  /// (dtf::streams_gradients: a collective strategy reduces them while the layers below are
  /// computed). What ready may assume: the range's floats are final and may be read from any
  /// thread and any stream of the device. CUDA builds keep that promise by recording an event
  /// after the layer's kernels on the stream the layers use (the context's compute stream, else
  /// the legacy default stream) and waiting for that event on the host: the host waits for this
  /// layer's work only, not for
  /// the whole device as a cudaDeviceSynchronize would (that also waited for the
  /// communication thread's copies and collectives on their own streams). The event is
  /// gradient_event() during the call, for a callee that orders its reads on the device; with
  /// set_ready_on_device(true) the host does not wait and the callee must (section 6.0 of
  /// docs/design/gpu-execution.md).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
                           const gradient_ready_fn& ready) {
    backprop(p, x, y, g, nullptr, ready ? &ready : nullptr);
    return loss_.read_loss();
  }

  /// Both: d loss / d x into input_grad (when not null) and each Dense layer's variables
  /// reported to ready as above (a lookup below that streams its own gradients).
  float loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
                           tensor* input_grad, const gradient_ready_fn& ready) {
    backprop(p, x, y, g, input_grad, ready ? &ready : nullptr);
    return loss_.read_loss();
  }

  /// The same step without reading the loss (dtf::defers_loss): the mean loss is left at
  /// device_loss(), written by the work this call issued (on the context's compute stream, or
  /// the legacy default stream); read it after that work, e.g. through a device::loss_ring.
  /// The gradients and ready's calls are those of loss_and_gradients.
  void enqueue_loss_and_gradients(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g,
                                  const gradient_ready_fn& ready = {}) {
    backprop(p, x, y, g, nullptr, ready ? &ready : nullptr);
  }

  /// Issues every later step on ctx's compute stream, GEMMs through its cuBLAS handle (see the
  /// file comment). ctx must outlive the steps; on CPU builds nothing changes.
  void set_context(device::context& ctx) {
#if DTF_CUDA
    set_stream(ctx.compute_stream(), ctx.blas());
    set_lt(&ctx.lt());
#endif
    context_ = &ctx;
    ++generation_;
  }
  /// Goes back to the defaults (the legacy default stream, this thread's cuBLAS handle): a
  /// strategy that bound its context unbinds it before the context goes.
  void clear_context() {
#if DTF_CUDA
    set_stream(nullptr, nullptr);
    set_lt(nullptr);
#endif
    context_ = nullptr;
    ++generation_;
  }
  /// The context set by set_context (null by default).
  device::context* context() const noexcept { return context_; }
  /// The stream the step's kernels are issued on (null: the legacy default stream).
  device::stream_t stream() const noexcept { return stream_; }
  /// cuBLASLt matmuls the Dense layers have issued (their epilogue path, on a context; 0 on CPU
  /// builds and without one).
  std::uint64_t epilogue_matmuls() const noexcept {
    std::uint64_t n = 0;
    for (const auto& l : layers_)
      if (auto* d = std::get_if<dense>(&l)) n += d->epilogue_matmuls();
    return n;
  }

  /// Logits [batch, classes] of the batch into out. On a context's stream the host waits for
  /// them (evaluation, not the training step): callers read them from any stream.
  void logits(std::span<const float> p, const tensor& x, tensor& out) {
    check_size(p, "parameter");
    forward(p.data(), x, out);
#if DTF_CUDA
    if (stream_ != nullptr && stream_ != cudaStreamLegacy)
      if (const cudaError_t rc = cudaStreamSynchronize(stream_); rc != cudaSuccess)
        throw error(errc::internal, std::string("nn::sequential: logits: ") + cudaGetErrorString(rc));
#endif
  }

  /// How the loss checks the labels (label_check::verify unless set). label_check::trusted is
  /// for labels checked when they reached the device (data::device_shard): the step then reads
  /// nothing back for them (see nn::label_check).
  void set_label_check(label_check c) noexcept {
    if (c != label_check_) ++generation_;
    label_check_ = c;
  }
  /// How the loss checks the labels now.
  label_check label_check_mode() const noexcept { return label_check_; }
  /// The mean loss of the last step, in device memory (host memory on CPU builds): stable once a
  /// step has run, null before on CUDA builds (nn::softmax_cross_entropy::device_loss).
  const float* device_loss() const noexcept { return loss_.device_loss(); }

#if DTF_CUDA
  /// During a ready callback: an event recorded after the reported layer's gradient kernels.
  cudaEvent_t gradient_event() const noexcept { return events_.current; }
#endif
  /// On: a ready callback is called once the layer's event is recorded, without the host waiting
  /// for it; the callee orders every read of the range after gradient_event() (on the device:
  /// cudaStreamWaitEvent). Off (the default): the host waits, the range may be read from anywhere.
  /// CPU builds: no effect (every kernel has completed when it returns).
  void set_ready_on_device(bool on) noexcept { ready_on_device_ = on; }
  /// Whether ready callbacks leave the wait to the callee (set_ready_on_device).
  bool ready_on_device() const noexcept { return ready_on_device_; }

  /// A count that moves whenever a step captured in a CUDA graph may no longer be replayed
  /// (docs/design/gpu-execution.md, section 7): the buffers grew (a batch with more rows than any
  /// before, the step's or an evaluation's: they grow only then), the context or the label check
  /// changed.
  std::uint64_t storage_generation() const noexcept { return generation_; }
  /// Whether enqueue_loss_and_gradients without a ready callback issues no host read or wait (the
  /// labels are trusted: label_check::trusted), so that it can be captured.
  bool capturable_step() const noexcept { return label_check_ == label_check::trusted; }
  /// Whether the buffers already hold a batch of `rows` rows (no forward, a step's or an
  /// evaluation's, had fewer than the largest so far): a step of `rows` rows then grows nothing,
  /// so it allocates nothing and does not wait on the host (settle_before_growth).
  bool fits(std::size_t rows) const noexcept { return rows <= max_rows_ && max_rows_ > 0; }

  /// Mean loss of a batch without gradients.
  float loss(std::span<const float> p, const tensor& x, const tensor& y) {
    check_size(p, "parameter");
    forward(p.data(), x, acts_.back());
    loss_.enqueue(acts_.back(), y, nullptr, label_check_);
    return loss_.read_loss();
  }

 private:
  // Later work on `stream`, GEMMs through `blas` (a handle bound to it); null: the defaults.
  void set_stream(device::stream_t stream, dtf::detail::blas_handle_t blas) {
    stream_ = stream;
    for (auto& l : layers_) {
      if (auto* d = std::get_if<dense>(&l)) d->set_stream(stream, blas);
      else std::get<relu>(l).set_stream(stream);
    }
    loss_.set_stream(stream);
  }
#if DTF_CUDA
  // The Dense layers' cuBLASLt matmuls through `lt` (null: the cuBLAS path).
  void set_lt(const device::blas_lt* lt) {
    for (auto& l : layers_)
      if (auto* d = std::get_if<dense>(&l)) d->set_lt(lt);
  }
#endif

  // Forward, loss and backward; with `ready`, each Dense layer's gradient is reported as soon
  // as it is written. The loss stays where the loss left it (device_loss()).
  void backprop(std::span<const float> p, const tensor& x, const tensor& y, std::span<float> g, tensor* input_grad,
                 const gradient_ready_fn* ready) {
    check_size(p, "parameter");
    check_size(g, "gradient");
    forward(p.data(), x, acts_.back());
    loss_.enqueue(acts_.back(), y, &grads_.back(), label_check_);
    // grads_[i] holds d loss / d (output of layer i); each keeps its size from step to step.
    // premasked: the Dense+ReLU pair whose masked gradient and bias gradient the Dense layer
    // above already wrote (its DRELU_BGRAD matmul; never on CPU builds).
    std::size_t premasked = layers_.size();
    const std::size_t rows = x.rank() > 0 ? x.dim(0) : 0;
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const tensor& in = i == 0 ? x : acts_[i - 1];
      if (auto* d = std::get_if<dense>(&layers_[i])) {
        tensor* dx = i == 0 ? input_grad : &grads_[i - 1];
        // A Dense+ReLU pair below whose mask was kept: this layer's dx matmul may apply it.
        relu_below below;
        if (i >= 2 && keeps_mask(i - 2)) {
          const auto& under = std::get<dense>(layers_[i - 2]);
          below = {under.relu_mask(rows), g.data() + offsets_[i - 2] + under.in_features() * under.out_features()};
        }
        // The layer's kernel and bias gradient is final before its dx is computed.
        std::function<void()> done;
        if (ready)
          done = [&, i, d] {
#if DTF_CUDA
            // The strategy may read these floats from another thread and stream at once: wait
            // for this layer's work (on the layers' stream), not the device's.
            events_.record_and_wait(i, layers_.size(), stream_, !ready_on_device_);
#endif
            (*ready)(offsets_[i], d->num_parameters());
          };
        bool fused_below = false;
        if (relu_follows(i))  // the ReLU's mask is applied in the Dense layer's pass over dy
          fused_below = d->backward_relu(p.data() + offsets_[i], in, acts_[i + 1], grads_[i + 1], g.data() + offsets_[i],
                                         dx, done, below, premasked == i);
        else
          fused_below = d->backward(p.data() + offsets_[i], in, grads_[i], g.data() + offsets_[i], dx, done, below);
        if (fused_below) premasked = i - 2;
      } else if (!relu_follows(i - 1)) {  // layer 0 is always Dense
        std::get<relu>(layers_[i]).backward(acts_[i], grads_[i], grads_[i - 1]);
      }
    }
  }

  // The buffer's size, and on CUDA builds that it is device memory (dtf/detail/device_memory.hpp).
  void check_size(std::span<const float> b, const char* what) const {
    if (b.size() != num_parameters_)
      throw error(errc::shape_mismatch, std::string("nn::sequential: ") + what + " buffer has " +
                                            std::to_string(b.size()) + " floats, the model has " +
                                            std::to_string(num_parameters_));
    dtf::detail::require_device_memory(b.data(), "nn::sequential", what);
  }

  // True when layer i is Dense and layer i + 1 a ReLU: the pair runs as one fused layer
  // (the Dense output acts_[i] is then not written; acts_[i + 1] holds the ReLU's output).
  bool relu_follows(std::size_t i) const {
    return i + 1 < layers_.size() && std::holds_alternative<dense>(layers_[i]) &&
           std::holds_alternative<relu>(layers_[i + 1]);
  }
  // True when layer i and its ReLU are fused and a Dense layer reads the ReLU's output: the pair
  // keeps its ReLU mask (cuBLASLt) for that layer's input-gradient matmul.
  bool keeps_mask(std::size_t i) const {
    return relu_follows(i) && i + 2 < layers_.size() && std::holds_alternative<dense>(layers_[i + 2]);
  }

  void forward(const float* p, const tensor& x, tensor& out) {
    const std::size_t rows = x.rank() > 0 ? x.dim(0) : 0;
    if (rows > max_rows_) {
      max_rows_ = rows;  // the activations, gradients and workspaces may grow (storage_generation)
      ++generation_;
      settle_before_growth();
    }
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const tensor& in = i == 0 ? x : acts_[i - 1];
      tensor& dst = i + 1 == layers_.size() ? out : acts_[i];
      if (auto* d = std::get_if<dense>(&layers_[i])) {
        if (relu_follows(i)) {
          d->forward_relu(p + offsets_[i], in, acts_[i + 1], keeps_mask(i));
          ++i;
        } else {
          d->forward(p + offsets_[i], in, dst);
        }
      } else {
        std::get<relu>(layers_[i]).forward(in, dst);
      }
    }
  }

  // The buffers (activations, gradients, the loss's workspace, the ones vector, the ReLU masks)
  // keep their allocations: a batch of fewer rows than the largest so far only reshapes them
  // (tensor::resize within its capacity touches no memory). A batch of more rows grows them, by
  // Thrust on the legacy default stream (or cudaFree/cudaMalloc), which the context's
  // non-blocking compute stream does not wait for: steps still queued there may read what the
  // growth frees. So on a context the host waits for the compute stream before a step that grows
  // them (the first step, an evaluation of a larger batch): none when an epoch's short last batch
  // or the full batch after it comes.
  void settle_before_growth() {
#if DTF_CUDA
    if (stream_ != nullptr && stream_ != cudaStreamLegacy)
      if (const cudaError_t rc = cudaStreamSynchronize(stream_); rc != cudaSuccess)
        throw error(errc::internal, std::string("nn::sequential: waiting for the compute stream: ") +
                                        cudaGetErrorString(rc));
#endif
  }

  std::vector<layer> layers_;
  std::vector<std::size_t> offsets_;
  std::vector<variable_spec> variables_;
  std::size_t input_features_ = 0, classes_ = 0, num_parameters_ = 0;
  std::vector<tensor> acts_;  // output of each layer (the last one also holds logits)
  std::vector<tensor> grads_;  // d loss / d (output of each layer)
  softmax_cross_entropy loss_;
  label_check label_check_ = label_check::verify;
  device::context* context_ = nullptr;
  bool ready_on_device_ = false;  // set_ready_on_device
  std::size_t max_rows_ = 0;      // the most rows a step or evaluation has had
  std::uint64_t generation_ = 0;  // storage_generation
  device::stream_t stream_{};
#if DTF_CUDA
  detail::layer_events events_;
#endif
};

static_assert(model<sequential>, "nn::sequential must model dtf::model");
static_assert(classifier<sequential>, "nn::sequential must model dtf::classifier");
static_assert(streams_gradients<sequential>, "nn::sequential must model dtf::streams_gradients");
static_assert(defers_loss<sequential>, "nn::sequential must model dtf::defers_loss");

}  // namespace dtf::nn
