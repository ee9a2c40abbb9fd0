// The failure paths of the check macros: typed errors that name the call, the code and file:line.
#include <stealbatch/cuda/check.hpp>

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

void warn_cuda(cudaError_t e, const char* expr, const char* file, int line) noexcept {
  std::fprintf(stderr, "stealbatch: %s:%d: %s failed: %s (%d)\n", file, line, expr, cudaGetErrorName(e), static_cast<int>(e));
}

}  // namespace stealbatch::detail
