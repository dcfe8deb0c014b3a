// dtf/nn/layers.hpp — Dense and ReLU layers over device memory.
//
// Layers own no parameters: they read their slice of the model's flat parameter buffer and
// write their slice of the flat gradient buffer. On CUDA builds they own workspace (a ones
// vector for the bias), so an instance serves one thread at a time.
// GEMM goes through dtf::detail::gemm (CBLAS on CPU builds, cuBLAS on CUDA builds). On CPU
// builds everything else is one plain loop per layer, fused around the GEMMs: the bias (and
// a following ReLU) is added in one pass over the GEMM's output, and the ReLU mask and the
// bias gradient are one pass over dy. Thrust's device system would dispatch an OpenMP
// region per element-wise kernel, which costs more than these kernels at training batch
// sizes. CUDA builds keep the cuBLAS path (a ones vector for the bias) with the element-wise
// passes as device::for_each_index kernels; bound to a context's cuBLASLt (set_lt, which
// nn::sequential::set_context calls) a dense layer issues its GEMMs with cuBLASLt epilogues
// instead: bias (and ReLU) in the forward matmul, the bias gradient in the weight-gradient matmul,
// and the ReLU mask and bias gradient of a fused dense+ReLU below in its input-gradient matmul
// (dtf/nn/lt_epilogue.hpp, docs/design/gpu-execution.md section 4.1); the cuBLAS path stays the
// fallback where cuBLASLt has no algorithm for a shape.
// Streams (docs/design/gpu-execution.md, section 2): set_stream(s, handle) issues every kernel
// and GEMM of a layer on s through `handle` (a cuBLAS handle bound to s, e.g. a
// device::context's), with no host wait and, once the largest batch has been seen, no
// allocation; by default they go to the legacy default stream through this thread's handle.
// Outputs keep their allocation and their shape from step to step (a shape is rebuilt only
// when it changes), so a steady step allocates nothing on CPU builds either.
#pragma once

#include <dtf/concepts.hpp>
#include <dtf/detail/blas.hpp>
#include <dtf/device/kernels.hpp>
#include <dtf/nn/init.hpp>
#include <dtf/nn/lt_epilogue.hpp>
#include <dtf/tensor.hpp>

#include <thrust/device_vector.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtf::nn {

namespace detail {
struct relu_op {
  DTF_HD float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct relu_grad_op {  // (dy, y) -> dx
  DTF_HD float operator()(float dy, float y) const { return y > 0.0f ? dy : 0.0f; }
};
// Element i of the ReLU (out may alias in) and of its mask (dx may alias dy): device kernels.
struct relu_at {
  const float* in;
  float* out;
  DTF_HD void operator()(std::size_t i) const { out[i] = relu_op{}(in[i]); }
};
struct relu_grad_at {
  const float* dy;
  const float* y;
  float* dx;
  DTF_HD void operator()(std::size_t i) const { dx[i] = relu_grad_op{}(dy[i], y[i]); }
};

/// t as float32 [rows, cols], its allocation kept; the shape is rebuilt (a heap allocation) only
/// when it changes.
inline void shape_2d(tensor& t, std::size_t rows, std::size_t cols) {
  const dims& s = t.shape();
  if (t.type() == dtype::float32 && s.size() == 2 && s[0] == rows && s[1] == cols) return;
  t.resize({rows, cols}, dtype::float32);
}
/// t as float32 of x's shape, likewise.
inline void shape_like(tensor& t, const tensor& x) {
  if (t.type() == dtype::float32 && t.shape() == x.shape()) return;
  t.resize(x.shape(), dtype::float32);
}

/// Rows and features of a [batch, ...] float32 input (trailing dimensions are flattened).
inline std::pair<std::size_t, std::size_t> rows_and_features(const tensor& x, const std::string& who) {
  if (x.type() != dtype::float32)
    throw error(errc::invalid_argument, who + ": input must be float32, got " + std::string(name_of(x.type())));
  if (x.rank() < 1) throw error(errc::shape_mismatch, who + ": input must have a batch dimension");
  const std::size_t rows = x.dim(0);
  return {rows, rows == 0 ? 0 : x.size() / rows};
}
}  // namespace detail

/// A fused dense+ReLU below a dense layer (its output is that layer's input): its ReLU mask
/// (dense::relu_mask()) and its bias gradient, which the upper layer's input-gradient matmul can
/// write (dense::backward).
struct relu_below {
  const void* mask = nullptr;      ///< null: nothing below to fuse
  float* bias_gradient = nullptr;  ///< the layer below's db (its `out` floats in its gradient slice)
};

/// Fully connected layer: y = x W + b with W [in, out] (TensorFlow's layout) and b [out].
/// Variables: "<name>/kernel" [in, out], "<name>/bias" [out].
class dense {
 public:
  /// A layer of in_features inputs and out_features outputs, initialised by `init`.
  /// Errors: errc::invalid_argument when a count is 0.
  dense(std::size_t in_features, std::size_t out_features, initializer init = initializer::automatic)
      : in_(in_features), out_(out_features), init_(init) {
    if (in_ == 0 || out_ == 0)
      throw error(errc::invalid_argument, "nn::dense(" + std::to_string(in_) + ", " + std::to_string(out_) +
                                              "): feature counts must be positive");
  }

  /// Inputs per example.
  std::size_t in_features() const noexcept { return in_; }
  /// Outputs per example.
  std::size_t out_features() const noexcept { return out_; }
  /// How the kernel is initialised.
  initializer init() const noexcept { return init_; }
  /// in × out + out.
  std::size_t num_parameters() const noexcept { return in_ * out_ + out_; }

  /// Issues later kernels on `stream` and GEMMs through `blas` (a handle bound to that stream);
  /// null for both: the legacy default stream and this thread's handle. No effect on CPU builds.
  void set_stream(device::stream_t stream, dtf::detail::blas_handle_t blas) noexcept {
    stream_ = stream;
    blas_ = blas;
  }

#if DTF_CUDA
  /// Issues later GEMMs as cuBLASLt matmuls with epilogues through `lt` (a context's handle,
  /// workspace and compute stream: device::context::lt()); null: the cuBLAS path. Plans built
  /// for another binding are dropped.
  void set_lt(const device::blas_lt* lt) { lt_.bind(lt); }
#endif
  /// cuBLASLt matmuls issued so far (0 on CPU builds and when never bound).
  std::uint64_t epilogue_matmuls() const noexcept {
#if DTF_CUDA
    return lt_.matmuls();
#else
    return 0;
#endif
  }
  /// The ReLU mask the last forward_relu(..., keep_mask = true) kept for `rows` rows (cuBLASLt's
  /// bit mask, for input_gradient's DRELU_BGRAD in the dense layer above); null if none was kept
  /// (always on CPU builds and on the cuBLAS path).
  const void* relu_mask(std::size_t rows) const noexcept {
#if DTF_CUDA
    return lt_.mask(rows);
#else
    (void)rows;
    return nullptr;
#endif
  }

  /// The layer's variables, named after `name`, starting at element `offset` of the flat buffer.
  std::vector<variable_spec> variables(const std::string& name, std::size_t offset) const {
    return {{name + "/kernel", {in_, out_}, offset}, {name + "/bias", {out_}, offset + in_ * out_}};
  }

  /// Fills this layer's slice p (device memory, num_parameters() floats).
  void initialize(std::span<float> p, std::uint64_t seed, bool followed_by_relu) const {
    initializer kind = init_;
    if (kind == initializer::automatic) kind = followed_by_relu ? initializer::he_normal : initializer::glorot_uniform;
    std::vector<float> host(num_parameters(), 0.0f);
    fill_kernel(std::span<float>(host.data(), in_ * out_), in_, out_, kind, seed);
    thrust::copy(host.begin(), host.end(), thrust::device_pointer_cast(p.data()));
  }

  /// y [rows, out] = x [rows, in] W + b.
  void forward(const float* p, const tensor& x, tensor& y) { forward_impl(p, x, y, false, false); }

  /// y = max(0, x W + b): this layer followed by nn::relu, in one pass after the GEMM (one
  /// matmul on cuBLASLt). With keep_mask, on cuBLASLt, the ReLU's mask is kept (relu_mask()) for
  /// the input gradient of a dense layer above.
  void forward_relu(const float* p, const tensor& x, tensor& y, bool keep_mask = false) {
    forward_impl(p, x, y, true, keep_mask);
  }

  /// From dy [rows, out]: writes dW and db into g (this layer's gradient slice) and, when dx is
  /// not null, dx [rows, in] = dy W^T. `gradient_done`, when given, is called once dW and db
  /// are written, before dx is computed (so that they can travel while dx is computed).
  /// With `below` (a fused dense+ReLU under this layer) and cuBLASLt, dx is written already
  /// masked by its ReLU and its bias gradient with it (DRELU_BGRAD): returns true, and that layer
  /// then runs backward_relu(..., premasked = true). False otherwise (always on CPU builds).
  bool backward(const float* p, const tensor& x, const tensor& dy, float* g, tensor* dx,
                const std::function<void()>& gradient_done = {}, relu_below below = {}) {
    const std::size_t rows = dy.dim(0);
#if DTF_CUDA
    // One matmul for dW and db where cuBLASLt has one (BGRADA), else db by a GEMV over ones.
    if (!lt_.weight_gradient(rows, in_, out_, x.data<float>(), dy.data<float>(), g, g + in_ * out_)) {
      grow_ones(rows);
      dtf::detail::gemv_t(rows, out_, 1.0f, dy.data<float>(), out_, thrust::raw_pointer_cast(ones_.data()), 0.0f,
                          g + in_ * out_, blas_);
      weight_gradient(x, dy.data<float>(), rows, g);
    }
#else
    column_sums(dy.data<float>(), rows, g + in_ * out_);
    weight_gradient(x, dy.data<float>(), rows, g);
#endif
    if (gradient_done) gradient_done();
    return input_gradient(p, dy.data<float>(), rows, dx, below);
  }

  /// backward() of this layer followed by nn::relu whose output was y: dy (the gradient with
  /// respect to y) is masked in place where y is not positive, in the same pass that sums
  /// the bias gradient. Same result as relu::backward then backward(). `premasked` (CUDA builds:
  /// the layer above returned true from backward with this layer as `below`): dy is masked and
  /// db written already, only dW and dx remain. `below` and the result as for backward().
  bool backward_relu(const float* p, const tensor& x, const tensor& y, tensor& dy, float* g, tensor* dx,
                     const std::function<void()>& gradient_done = {}, relu_below below = {}, bool premasked = false) {
    const std::size_t rows = dy.dim(0);
#if DTF_CUDA
    if (premasked) {
      weight_gradient(x, dy.data<float>(), rows, g);
      if (gradient_done) gradient_done();
      return input_gradient(p, dy.data<float>(), rows, dx, below);
    }
    device::for_each_index(stream_, dy.size(), detail::relu_grad_at{dy.data<float>(), y.data<float>(), dy.data<float>()},
                           "nn::dense (relu mask)");
    return backward(p, x, dy, g, dx, gradient_done, below);
#else
    (void)below;
    (void)premasked;  // never set on CPU builds (backward returns false there)
    float* d = dy.data<float>();
    const float* yv = y.data<float>();
    float* db = g + in_ * out_;
    std::fill(db, db + out_, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      float* drow = d + r * out_;
      const float* yrow = yv + r * out_;
      for (std::size_t c = 0; c < out_; ++c) {
        const float v = yrow[c] > 0.0f ? drow[c] : 0.0f;
        drow[c] = v;
        db[c] += v;
      }
    }
    weight_gradient(x, d, rows, g);
    if (gradient_done) gradient_done();
    return input_gradient(p, d, rows, dx, {});
#endif
  }

 private:
  void forward_impl(const float* p, const tensor& x, tensor& y, bool relu_after, bool keep_mask) {
    const auto [rows, features] = detail::rows_and_features(x, "nn::dense");
    if (features != in_)
      throw error(errc::shape_mismatch, "nn::dense: input of shape " + to_string(x.shape()) + " has " +
                                            std::to_string(features) + " features, the layer expects " +
                                            std::to_string(in_));
    detail::shape_2d(y, rows, out_);
    const float* w = p;
    const float* b = p + in_ * out_;
#if DTF_CUDA
    // One matmul with the bias (and ReLU) epilogue where cuBLASLt has one.
    if (lt_.forward(rows, in_, out_, x.data<float>(), w, b, y.data<float>(), relu_after, keep_mask)) return;
    // y = 1 b^T (a rank-1 GEMM), then y += x W, then the ReLU in place.
    grow_ones(rows);
    dtf::detail::gemm(dtf::detail::transpose::no, dtf::detail::transpose::no, rows, out_, 1, 1.0f,
                      thrust::raw_pointer_cast(ones_.data()), 1, b, out_, 0.0f, y.data<float>(), out_, blas_);
    dtf::detail::gemm(dtf::detail::transpose::no, dtf::detail::transpose::no, rows, out_, in_, 1.0f,
                      x.data<float>(), in_, w, out_, 1.0f, y.data<float>(), out_, blas_);
    if (relu_after)
      device::for_each_index(stream_, y.size(), detail::relu_at{y.data<float>(), y.data<float>()}, "nn::dense (relu)");
#else
    (void)keep_mask;
    // y = x W, then y += b (and the ReLU) in one pass over y.
    float* out = y.data<float>();
    dtf::detail::gemm(dtf::detail::transpose::no, dtf::detail::transpose::no, rows, out_, in_, 1.0f,
                      x.data<float>(), in_, w, out_, 0.0f, out, out_);
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = out + r * out_;
      if (relu_after) {
        for (std::size_t c = 0; c < out_; ++c) {
          const float v = row[c] + b[c];
          row[c] = v > 0.0f ? v : 0.0f;
        }
      } else {
        for (std::size_t c = 0; c < out_; ++c) row[c] += b[c];
      }
    }
#endif
  }

#if DTF_CUDA
  // The ones vector covers `rows`. It grows only with the batch: the fill is Thrust's blocking
  // one on the legacy stream (it has completed when the call returns, before any use on stream_),
  // and the old buffer's cudaFree waits for the work that used it.
  void grow_ones(std::size_t rows) {
    if (ones_.size() < rows) ones_.assign(rows, 1.0f);
  }
#else
  // db[c] = sum over rows of dy[r, c].
  void column_sums(const float* dy, std::size_t rows, float* db) const {
    std::fill(db, db + out_, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* row = dy + r * out_;
      for (std::size_t c = 0; c < out_; ++c) db[c] += row[c];
    }
  }
#endif

  // dW = x^T dy into g.
  void weight_gradient(const tensor& x, const float* dy, std::size_t rows, float* g) {
    dtf::detail::gemm(dtf::detail::transpose::yes, dtf::detail::transpose::no, in_, out_, rows, 1.0f,
                      x.data<float>(), in_, dy, out_, 0.0f, g, out_, blas_);
  }
  // dx = dy W^T when dx is not null; masked with `below`'s ReLU and its db written where
  // cuBLASLt has DRELU_BGRAD for the shape (returns true).
  bool input_gradient(const float* p, const float* dy, std::size_t rows, tensor* dx, relu_below below) {
    if (!dx) return false;
    detail::shape_2d(*dx, rows, in_);
#if DTF_CUDA
    if (below.mask && lt_.input_gradient_drelu(rows, in_, out_, dy, p, dx->data<float>(), below.mask,
                                               below.bias_gradient))
      return true;
#else
    (void)below;
#endif
    dtf::detail::gemm(dtf::detail::transpose::no, dtf::detail::transpose::yes, rows, in_, out_, 1.0f, dy, out_, p,
                      out_, 0.0f, dx->data<float>(), in_, blas_);
    return false;
  }

  std::size_t in_;
  std::size_t out_;
  initializer init_;
  device::stream_t stream_{};
  dtf::detail::blas_handle_t blas_{};
#if DTF_CUDA
  thrust::device_vector<float> ones_;  // [rows] of 1: bias broadcast and bias gradient
  detail::dense_lt lt_;                // cuBLASLt plans and the ReLU mask (unbound: the cuBLAS path)
#endif
};

/// Rectified linear unit, element-wise; no variables.
class relu {
 public:
  /// Issues later kernels on `stream` (the legacy default stream unless set). No effect on CPU builds.
  void set_stream(device::stream_t stream) noexcept { stream_ = stream; }

  /// y = max(x, 0), element-wise.
  void forward(const tensor& x, tensor& y) const {
    detail::rows_and_features(x, "nn::relu");
    detail::shape_like(y, x);
#if DTF_CUDA
    device::for_each_index(stream_, x.size(), detail::relu_at{x.data<float>(), y.data<float>()}, "nn::relu");
#else
    const float* in = x.data<float>();
    float* out = y.data<float>();
    for (std::size_t i = 0, n = x.size(); i < n; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
#endif
  }
  /// dx = dy where the forward output y was positive, 0 elsewhere (dx may alias dy).
  void backward(const tensor& y, const tensor& dy, tensor& dx) const {
    if (&dx != &dy) detail::shape_like(dx, dy);
#if DTF_CUDA
    device::for_each_index(stream_, dy.size(), detail::relu_grad_at{dy.data<float>(), y.data<float>(), dx.data<float>()},
                           "nn::relu (backward)");
#else
    const float* d = dy.data<float>();
    const float* yv = y.data<float>();
    float* out = dx.data<float>();
    for (std::size_t i = 0, n = dy.size(); i < n; ++i) out[i] = yv[i] > 0.0f ? d[i] : 0.0f;
#endif
  }

 private:
  device::stream_t stream_{};
};

}  // namespace dtf::nn
