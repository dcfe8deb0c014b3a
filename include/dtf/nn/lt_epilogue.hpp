// dtf/nn/lt_epilogue.hpp — cuBLASLt matmuls with epilogues for nn::dense on CUDA builds
// (docs/design/gpu-execution.md, section 4.1): the forward GEMM with its bias and ReLU, the
// weight-gradient GEMM with the bias gradient (BGRADA), the input-gradient GEMM with the ReLU
// mask and bias gradient of the fused dense+ReLU below (DRELU_BGRAD).
//
// dtf's buffers are row-major and cuBLASLt is column-major: each row-major product is computed
// as its transpose, each matrix read as its own transpose with its row length as leading
// dimension (as dtf/detail/blas.hpp does for cublasSgemm). With W [in, out], x [rows, in]:
//   forward          D = y^T  (out x rows) = W^T (out x in, N) * x^T (in x rows, N)
//   weight gradient  D = dW^T (out x in)   = dy^T (out x rows, N) * x^T (in x rows, T)
//   input gradient   D = dx^T (in x rows)  = W^T (out x in, T) * dy^T (out x rows, N)
// so the bias and each bias gradient are one float per row of D, as cuBLASLt wants.
//
// A plan (descriptor, layouts, algorithm) is built the first time a layer meets a (GEMM, rows,
// pointer alignment) and kept, found or not: where cublasLtMatmulAlgoGetHeuristic finds no
// algorithm for the context's fixed workspace the shape stays unfused, decided once. Per call only
// the bias and mask pointers are set on the cached descriptor (host calls; no allocation, no
// device memory). The ReLU's bit mask is owned by the layer and grows (cudaMalloc) only with the
// largest batch seen, as the activations do.
// CPU builds: nothing here (they fuse bias, ReLU and the bias gradient in plain loops).
// Thread safety: none; a layer serves one thread at a time.
#pragma once

#include <dtf/config.hpp>
#include <dtf/device/context.hpp>
#include <dtf/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#if DTF_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

namespace dtf::nn::detail {

#if DTF_CUDA
inline void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw error(errc::internal, std::string("nn::dense: ") + what + " failed with cuBLAS status " +
                                    std::to_string(int(status)) + " (" + cublasGetStatusString(status) + ")");
}

/// The leading dimension, in bits, of a ReLU mask over `features` outputs per example: cuBLASLt
/// wants a multiple of 128, at least the rows of D.
inline std::int64_t relu_mask_ld(std::size_t features) { return std::int64_t((features + 127) / 128 * 128); }
/// Bytes of the mask of `rows` examples.
inline std::size_t relu_mask_bytes(std::size_t features, std::size_t rows) {
  return std::size_t(relu_mask_ld(features)) / 8 * rows;
}

/// The largest power of two, at most 16, that divides the address (what cuBLASLt's kernels may
/// assume about it).
inline std::uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 16;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

/// One cuBLASLt matmul, column-major D (m x n) = op(A) op(B) with an epilogue: its descriptor,
/// layouts and algorithm, built once (see the file comment).
class lt_plan {
 public:
  /// Builds the plan; usable() says whether the heuristic found an algorithm. `bias` and `aux`
  /// are the pointers of the first call (the heuristic reads their alignment, never their data).
  /// Errors: errc::internal naming the cuBLASLt call when a descriptor cannot be created.
  lt_plan(const device::blas_lt& lt, cublasOperation_t ta, cublasOperation_t tb, std::uint64_t m, std::uint64_t n,
          std::uint64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldd, cublasLtEpilogue_t epilogue,
          std::int64_t aux_ld, const void* a, const void* b, const void* d, const void* bias, const void* aux) {
    try {
      build(lt, ta, tb, m, n, k, lda, ldb, ldd, epilogue, aux_ld, a, b, d, bias, aux);
    } catch (...) {
      destroy();
      throw;
    }
  }
  lt_plan(const lt_plan&) = delete;
  lt_plan& operator=(const lt_plan&) = delete;
  ~lt_plan() { destroy(); }

  /// Whether the heuristic found an algorithm.
  bool usable() const noexcept { return usable_; }

  /// D = op(A) op(B) with the epilogue, on the context's compute stream with its workspace.
  /// `bias` (and `aux` where the epilogue has one) are set on the descriptor first.
  void run(const device::blas_lt& lt, const float* a, const float* b, float* d, const void* bias,
           const void* aux) const {
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (aux) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    const float one = 1.0f, zero = 0.0f;
    check_lt(cublasLtMatmul(lt.handle, desc_, &one, a, a_, b, b_, &zero, d, d_, d, d_, &algo_, lt.workspace,
                            lt.workspace_bytes, lt.stream),
             "cublasLtMatmul");
  }

 private:
  void build(const device::blas_lt& lt, cublasOperation_t ta, cublasOperation_t tb, std::uint64_t m,
             std::uint64_t n, std::uint64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldd,
             cublasLtEpilogue_t epilogue, std::int64_t aux_ld, const void* a, const void* b, const void* d,
             const void* bias, const void* aux) {
    check_lt(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    set(CUBLASLT_MATMUL_DESC_TRANSA, ta);
    set(CUBLASLT_MATMUL_DESC_TRANSB, tb);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (aux_ld > 0) {
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
    }
    // The matrices as stored (before op): A is m x k or k x m, B k x n or n x k.
    const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    check_lt(cublasLtMatrixLayoutCreate(&a_, CUDA_R_32F, na ? m : k, na ? k : m, lda), "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&b_, CUDA_R_32F, nb ? k : n, nb ? n : k, ldb), "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&d_, CUDA_R_32F, m, n, ldd), "cublasLtMatrixLayoutCreate");

    cublasLtMatmulPreference_t pref{};
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t workspace = lt.workspace_bytes;
    const std::uint32_t align_a = alignment_of(a), align_b = alignment_of(b), align_d = alignment_of(d);
    cublasStatus_t rc = CUBLAS_STATUS_SUCCESS;
    auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
      if (rc == CUBLAS_STATUS_SUCCESS) rc = cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof value);
    };
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (rc == CUBLAS_STATUS_SUCCESS)
      rc = cublasLtMatmulAlgoGetHeuristic(lt.handle, desc_, a_, b_, d_, d_, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // No algorithm (NOT_SUPPORTED, or none returned) is not an error: the caller stays unfused.
    usable_ = rc == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (usable_) algo_ = result.algo;
  }
  void destroy() noexcept {
    if (d_) cublasLtMatrixLayoutDestroy(d_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    d_ = b_ = a_ = nullptr;
    desc_ = nullptr;
  }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) const {
    check_lt(cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof value), "cublasLtMatmulDescSetAttribute");
  }

  cublasLtMatmulDesc_t desc_{};
  cublasLtMatrixLayout_t a_{}, b_{}, d_{};
  cublasLtMatmulAlgo_t algo_{};
  bool usable_ = false;
};

/// One dense layer's cuBLASLt state: the context it is bound to, its plans and its ReLU mask.
/// A copy starts unbound, with none (plans and mask belong to one instance).
class dense_lt {
 public:
  dense_lt() = default;
  dense_lt(const dense_lt&) {}
  dense_lt& operator=(const dense_lt&) {
    reset();
    lt_ = nullptr;
    return *this;
  }
  ~dense_lt() { free_mask(); }

  /// Binds the layer's matmuls to a context's cuBLASLt handle, workspace and stream (null:
  /// unbound, every call answers false). Plans built for another binding are dropped.
  void bind(const device::blas_lt* lt) {
    if (lt == lt_) return;
    reset();
    lt_ = lt;
  }

  /// y [rows, out] = x W + b, with relu max(0, .), keeping the ReLU's mask with keep_mask (for a
  /// dense layer above whose input gradient applies it). False where unbound or without an
  /// algorithm: nothing was issued, the caller computes y itself (and no mask is kept).
  bool forward(std::size_t rows, std::size_t in, std::size_t out, const float* x, const float* w, const float* b,
               float* y, bool relu, bool keep_mask) {
    mask_rows_ = no_rows;
    if (!lt_ || rows == 0) return false;
    keep_mask = keep_mask && relu;
    if (keep_mask) grow_mask(relu_mask_bytes(out, rows));
    const void* aux = keep_mask ? mask_ : nullptr;
    const cublasLtEpilogue_t epilogue = !relu ? CUBLASLT_EPILOGUE_BIAS
                                        : keep_mask ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS
                                                    : CUBLASLT_EPILOGUE_RELU_BIAS;
    const lt_plan* plan = find(epilogue, rows, key(w, x, y, b, aux), [&] {
      return std::make_unique<lt_plan>(*lt_, CUBLAS_OP_N, CUBLAS_OP_N, out, rows, in, out, in, out, epilogue,
                                       keep_mask ? relu_mask_ld(out) : 0, w, x, y, b, aux);
    });
    if (!plan) return false;
    plan->run(*lt_, w, x, y, b, aux);
    ++matmuls_;
    if (keep_mask) mask_rows_ = rows;
    return true;
  }

  /// dW [in, out] = x^T dy and db [out] = the column sums of dy, in one matmul (BGRADA). False
  /// where unbound or without an algorithm (nothing issued).
  bool weight_gradient(std::size_t rows, std::size_t in, std::size_t out, const float* x, const float* dy, float* dw,
                       float* db) {
    if (!lt_ || rows == 0) return false;
    const lt_plan* plan = find(CUBLASLT_EPILOGUE_BGRADA, rows, key(dy, x, dw, db, nullptr), [&] {
      return std::make_unique<lt_plan>(*lt_, CUBLAS_OP_N, CUBLAS_OP_T, out, in, rows, out, in, out,
                                       CUBLASLT_EPILOGUE_BGRADA, 0, dy, x, dw, db, nullptr);
    });
    if (!plan) return false;
    plan->run(*lt_, dy, x, dw, db, nullptr);
    ++matmuls_;
    return true;
  }

  /// dx [rows, in] = dy W^T where `mask` (the fused dense+ReLU below's, over its `in` outputs)
  /// is set, 0 elsewhere, and below_db [in] = the column sums of that masked dx (DRELU_BGRAD).
  /// False where unbound or without an algorithm (nothing issued).
  bool input_gradient_drelu(std::size_t rows, std::size_t in, std::size_t out, const float* dy, const float* w,
                            float* dx, const void* mask, float* below_db) {
    if (!lt_ || rows == 0 || !mask) return false;
    const lt_plan* plan = find(CUBLASLT_EPILOGUE_DRELU_BGRAD, rows, key(w, dy, dx, below_db, mask), [&] {
      return std::make_unique<lt_plan>(*lt_, CUBLAS_OP_T, CUBLAS_OP_N, in, rows, out, out, out, in,
                                       CUBLASLT_EPILOGUE_DRELU_BGRAD, relu_mask_ld(in), w, dy, dx, below_db, mask);
    });
    if (!plan) return false;
    plan->run(*lt_, w, dy, dx, below_db, mask);
    ++matmuls_;
    return true;
  }

  /// The ReLU mask the last forward() kept for `rows` rows, else null.
  const void* mask(std::size_t rows) const noexcept { return mask_rows_ == rows ? mask_ : nullptr; }
  /// cuBLASLt matmuls issued so far (host count).
  std::uint64_t matmuls() const noexcept { return matmuls_; }

 private:
  static constexpr std::size_t no_rows = ~std::size_t(0);
  struct entry {
    cublasLtEpilogue_t epilogue;
    std::size_t rows;
    std::uint32_t alignments;
    std::unique_ptr<lt_plan> plan;  // null: no algorithm for this shape (stays unfused)
  };

  // The alignments of a call's five pointers, 5 bits each (a null pointer counts as 16).
  static std::uint32_t key(const void* a, const void* b, const void* d, const void* bias, const void* aux) {
    std::uint32_t k = 0;
    for (const void* p : {a, b, d, bias, aux}) k = k << 5 | (p ? alignment_of(p) : 16u);
    return k;
  }

  // The plan of (epilogue, rows, alignments), built by make() the first time; null when the
  // heuristic found no algorithm (remembered, never asked again).
  template <class Make>
  const lt_plan* find(cublasLtEpilogue_t epilogue, std::size_t rows, std::uint32_t alignments, Make&& make) {
    for (const entry& e : plans_)
      if (e.epilogue == epilogue && e.rows == rows && e.alignments == alignments) return e.plan.get();
    std::unique_ptr<lt_plan> plan = make();
    if (!plan->usable()) plan.reset();
    plans_.push_back(entry{epilogue, rows, alignments, std::move(plan)});
    return plans_.back().plan.get();
  }

  // The mask grows only with the batch: cudaFree waits for the work that used the old one.
  void grow_mask(std::size_t bytes) {
    if (bytes <= mask_bytes_) return;
    free_mask();
    if (const cudaError_t rc = cudaMalloc(&mask_, bytes); rc != cudaSuccess) {
      mask_ = nullptr;
      throw error(errc::internal, std::string("nn::dense: cudaMalloc (ReLU mask): ") + cudaGetErrorString(rc));
    }
    mask_bytes_ = bytes;
  }
  void free_mask() noexcept {
    if (mask_) cudaFree(mask_);
    mask_ = nullptr;
    mask_bytes_ = 0;
    mask_rows_ = no_rows;
  }
  void reset() {
    plans_.clear();
    free_mask();
  }

  const device::blas_lt* lt_ = nullptr;
  std::vector<entry> plans_;
  void* mask_ = nullptr;
  std::size_t mask_bytes_ = 0;
  std::size_t mask_rows_ = no_rows;
  std::uint64_t matmuls_ = 0;
};
#endif

}  // namespace dtf::nn::detail
