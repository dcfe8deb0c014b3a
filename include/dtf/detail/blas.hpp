// dtf/detail/blas.hpp — row-major single-precision GEMM/GEMV on device memory.
//
// CPU builds call CBLAS (OpenBLAS) directly: xtensor-blas is kept out because its LAPACK
// declarations collide with a macro that <asio.hpp> defines. CUDA builds call cuBLAS, which
// is column-major: a row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T by swapping the operands.
#pragma once

#include <dtf/config.hpp>
#include <dtf/error.hpp>

#include <cstddef>
#include <string>

#if DTF_CUDA
#include <cublas_v2.h>
#else
#include <cblas.h>
#endif

namespace dtf::detail {

enum class transpose : bool { no = false, yes = true };

#if DTF_CUDA
/// The cuBLAS handle a call is issued with (null: this thread's handle on the legacy stream).
using blas_handle_t = cublasHandle_t;
#else
/// A placeholder on CPU builds (CBLAS runs on the calling thread).
using blas_handle_t = void*;
#endif

#if DTF_CUDA
inline void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw error(errc::internal, std::string(what) + " failed with cuBLAS status " + std::to_string(int(status)));
}

/// One cuBLAS handle per host thread (cuBLAS handles are not thread-safe to share).
inline cublasHandle_t cublas_handle() {
  struct holder {
    cublasHandle_t h{};
    holder() { check_cublas(cublasCreate(&h), "cublasCreate"); }
    ~holder() { cublasDestroy(h); }
  };
  thread_local holder handle;
  return handle.h;
}
#endif

/// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, all row-major with leading
/// dimensions lda, ldb, ldc (elements per row as stored). CUDA builds issue it with `handle`
/// (on the stream bound to it, e.g. a device::context's compute stream), or with this thread's
/// handle on the legacy default stream when it is null.
inline void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc, blas_handle_t handle = {}) {
  if (m == 0 || n == 0) return;
#if DTF_CUDA
  const cublasOperation_t opa = ta == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(cublasSgemm(handle ? handle : cublas_handle(), opb, opa, int(n), int(m), int(k), &alpha, b, int(ldb), a, int(lda),
                           &beta, c, int(ldc)),
               "cublasSgemm");
#else
  (void)handle;
  cblas_sgemm(CblasRowMajor, ta == transpose::yes ? CblasTrans : CblasNoTrans,
              tb == transpose::yes ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a, int(lda), b,
              int(ldb), beta, c, int(ldc));
#endif
}

/// y[n] = alpha * A[m,n]^T x[m] + beta * y (row-major A): column sums when x is all ones.
/// `handle` as for gemm.
inline void gemv_t(std::size_t m, std::size_t n, float alpha, const float* a, std::size_t lda, const float* x,
                   float beta, float* y, blas_handle_t handle = {}) {
  if (n == 0) return;
#if DTF_CUDA
  // A row-major [m,n] with leading dimension lda is, read column-major, the matrix A^T
  // [n,m]; A^T x is then an untransposed column-major GEMV.
  check_cublas(cublasSgemv(handle ? handle : cublas_handle(), CUBLAS_OP_N, int(n), int(m), &alpha, a, int(lda), x, 1, &beta, y, 1),
               "cublasSgemv");
#else
  (void)handle;
  cblas_sgemv(CblasRowMajor, CblasTrans, int(m), int(n), alpha, a, int(lda), x, 1, beta, y, 1);
#endif
}

/// Limits the BLAS library's own threads (one per process when several processes share
/// the cores). No effect on CUDA builds.
inline void set_blas_threads(int n) {
#if !DTF_CUDA
  openblas_set_num_threads(n);
#else
  (void)n;
#endif
}

}  // namespace dtf::detail
