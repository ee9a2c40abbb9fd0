// The failure paths of the check macros (typed errors that name the call, the code and file:line), and the cuBLAS handle.
#include <stealbatch/cuda/check.hpp>
#include <stealbatch/cuda/handles.hpp>

#include <cublas_v2.h>

#include <cstdio>
#include <string>

namespace stealbatch::detail {

void throw_cuda(cudaError_t e, const char* expr, const char* file, int line) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " + cudaGetErrorName(e) +
                  " (" + std::to_string(static_cast<int>(e)) + "): " + cudaGetErrorString(e));
}

void throw_nccl(ncclResult_t r, const char* expr, const char* file, int line) {
  throw NcclError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " + ncclGetErrorString(r) +
                  " (" + std::to_string(static_cast<int>(r)) + ")");
}

void throw_cublas(cublasStatus_t s, const char* expr, const char* file, int line) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " + cublasGetStatusName(s) + " (" +
                  std::to_string(static_cast<int>(s)) + "): " + cublasGetStatusString(s));
}

void warn_cuda(cudaError_t e, const char* expr, const char* file, int line) noexcept {
  std::fprintf(stderr, "stealbatch: %s:%d: %s failed: %s (%d)\n", file, line, expr, cudaGetErrorName(e), static_cast<int>(e));
}

}  // namespace stealbatch::detail

namespace stealbatch::cuda {

void BlasDeleter::operator()(cublasHandle_t h) const noexcept {
  const cublasStatus_t s = cublasDestroy(h);
  if (s != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "stealbatch: cublasDestroy failed: %s (%d)\n", cublasGetStatusName(s), static_cast<int>(s));
}

BlasHandle make_blas() {
  cublasHandle_t h = nullptr;
  SB_CUBLAS_CHECK(cublasCreate(&h));
  return BlasHandle(h);
}

}  // namespace stealbatch::cuda
