// Device discovery that treats a missing driver as "no GPU", the NCCL version, and a fill kernel.
#include <stealbatch/cuda/check.hpp>
#include <stealbatch/cuda/device_info.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

namespace stealbatch::cuda {

namespace {

__global__ void fill_kernel(float* p, std::size_t n, float v) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = v;
  }
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later calls do not report it
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (e != cudaSuccess) return std::string("no CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" + std::to_string(static_cast<int>(e)) + ")";
  if (n == 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return "";
}

int nccl_version() {
  int v = 0;
  SB_NCCL_CHECK(ncclGetVersion(&v));
  return v;
}

void fill(float* device_ptr, std::size_t n, float value, void* stream) {
  if (n == 0) return;
  const int block = 256;
  const int grid = static_cast<int>((n + block - 1) / block < 1024 ? (n + block - 1) / block : 1024);
  fill_kernel<<<grid, block, 0, static_cast<cudaStream_t>(stream)>>>(device_ptr, n, value);
  SB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stealbatch::cuda
