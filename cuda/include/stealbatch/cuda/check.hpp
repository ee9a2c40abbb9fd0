// Check macros for the CUDA runtime, cuBLAS and NCCL: evaluate once, report the call text and file:line.
#pragma once

#include <stealbatch/error.hpp>

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace stealbatch::detail {

[[noreturn]] void throw_cuda(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void throw_nccl(ncclResult_t r, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line);
// Logs instead of throwing: for destructors, which never throw.
void warn_cuda(cudaError_t e, const char* expr, const char* file, int line) noexcept;

}  // namespace stealbatch::detail

#define SB_CUDA_CHECK(expr)                                                                  \
  do {                                                                                       \
    const cudaError_t sb_e_ = (expr);                                                        \
    if (sb_e_ != cudaSuccess) ::stealbatch::detail::throw_cuda(sb_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define SB_CUDA_WARN(expr)                                                                   \
  do {                                                                                       \
    const cudaError_t sb_e_ = (expr);                                                        \
    if (sb_e_ != cudaSuccess) ::stealbatch::detail::warn_cuda(sb_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define SB_NCCL_CHECK(expr)                                                                  \
  do {                                                                                       \
    const ncclResult_t sb_r_ = (expr);                                                       \
    if (sb_r_ != ncclSuccess) ::stealbatch::detail::throw_nccl(sb_r_, #expr, __FILE__, __LINE__); \
  } while (0)

#define SB_CUBLAS_CHECK(expr)                                                                       \
  do {                                                                                              \
    const cublasStatus_t sb_s_ = (expr);                                                            \
    if (sb_s_ != CUBLAS_STATUS_SUCCESS) ::stealbatch::detail::throw_cublas(sb_s_, #expr, __FILE__, __LINE__); \
  } while (0)
