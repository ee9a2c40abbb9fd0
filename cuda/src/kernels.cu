// The backend's kernels: element-wise optimizer updates (the same arithmetic on every replica, so the replicas
// stay bit-identical) and the reduction across the parts of one GPU.
#include "kernels.hpp"

#include <stealbatch/cuda/check.hpp>
#include <stealbatch/runtime/detail/fixed_point.hpp>

#include <cmath>

namespace stealbatch::cuda::detail {

namespace {

constexpr int kBlock = 256;
constexpr int kNoExponentOnDevice = stealbatch::detail::kNoExponent;  // a constant the kernels can read

unsigned blocks(std::size_t n) {
  const std::size_t b = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

__global__ void sgd_kernel(float* params, const float* grad, float* vel, std::size_t n, float scale, float lr, float mu, float wd) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float g = __fmaf_rn(wd, params[i], grad[i] * scale);
    const float m = __fmaf_rn(mu, vel[i], g);
    vel[i] = m;
    params[i] = __fmaf_rn(-lr, m, params[i]);
  }
}

__global__ void adam_kernel(float* params, const float* grad, float* m1, float* m2, std::size_t n, float scale, float lr, float b1, float b2,
                            float eps, float wd, float c1, float c2) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float g = __fmaf_rn(wd, params[i], grad[i] * scale);
    const float m = b1 * m1[i] + (1.0f - b1) * g;
    const float v = b2 * m2[i] + (1.0f - b2) * g * g;
    m1[i] = m;
    m2[i] = v;
    params[i] -= lr * (m / c1) / (sqrtf(v / c2) + eps);
  }
}

// Block i copies row ids[i] of `rows` into row i of `out`, `words` 32-bit words a row.
__global__ void gather_rows_kernel(const unsigned* rows, std::size_t words, const std::uint32_t* ids, unsigned* out) {
  const unsigned* src = rows + static_cast<std::size_t>(ids[blockIdx.x]) * words;
  unsigned* dst = out + static_cast<std::size_t>(blockIdx.x) * words;
  for (std::size_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
}

__global__ void sum_kernel(float* const* bufs, std::size_t count, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (std::size_t d = 0; d < count; ++d) s += bufs[d][i];  // in device order: the same sum for every layout of chunks
    for (std::size_t d = 0; d < count; ++d) bufs[d][i] = s;
  }
}

// A finite |y| under 2^51 (every value of a step that stands) rounds the way the host's does: __double2ll_rn rounds
// to nearest, ties to even. A value past that only happens in a step that is redone, whose sums are thrown away.
__global__ void cell_to_fixed_kernel(float* v, std::size_t n, int shift, double scale, unsigned long long* acc, unsigned* largest_bits) {
  unsigned largest = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float x = v[i];
    const unsigned a = __float_as_uint(x) & 0x7fffffffu;
    largest = a > largest ? a : largest;
    if (shift != kNoExponentOnDevice && a < 0x7f800000u) acc[i] += static_cast<unsigned long long>(__double2ll_rn(static_cast<double>(x) * scale));
    v[i] = 0.0f;
  }
  // Every thread of the block reaches here (kBlock is a multiple of the warp): the warp's max, then one atomic.
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned other = __shfl_down_sync(0xffffffffu, largest, o);
    largest = other > largest ? other : largest;
  }
  if ((threadIdx.x & 31u) == 0 && largest != 0) atomicMax(largest_bits, largest);
}

}  // namespace

void cell_to_fixed(float* v, std::size_t n, int shift, unsigned long long* acc, unsigned* largest_bits, cudaStream_t s) {
  if (n == 0) return;
  const double scale = shift == stealbatch::detail::kNoExponent ? 0.0 : std::ldexp(1.0, shift);
  cell_to_fixed_kernel<<<blocks(n), kBlock, 0, s>>>(v, n, shift, scale, acc, largest_bits);
  SB_CUDA_CHECK(cudaGetLastError());
}

void sgd_update(float* params, const float* grad, float* velocity, std::size_t n, float scale, float lr, float momentum, float weight_decay,
                cudaStream_t s) {
  sgd_kernel<<<blocks(n), kBlock, 0, s>>>(params, grad, velocity, n, scale, lr, momentum, weight_decay);
  SB_CUDA_CHECK(cudaGetLastError());
}

void adam_update(float* params, const float* grad, float* m, float* v, std::size_t n, float scale, float lr, float beta1, float beta2,
                 float eps, float weight_decay, float c1, float c2, cudaStream_t s) {
  adam_kernel<<<blocks(n), kBlock, 0, s>>>(params, grad, m, v, n, scale, lr, beta1, beta2, eps, weight_decay, c1, c2);
  SB_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const std::byte* rows, std::size_t row_bytes, const std::uint32_t* ids, std::size_t n, std::byte* out, cudaStream_t s) {
  if (n == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n), 128, 0, s>>>(reinterpret_cast<const unsigned*>(rows), row_bytes / 4, ids, reinterpret_cast<unsigned*>(out));
  SB_CUDA_CHECK(cudaGetLastError());
}

void sum_into_all(float* const* bufs, std::size_t count, std::size_t n, cudaStream_t s) {
  sum_kernel<<<blocks(n), kBlock, 0, s>>>(bufs, count, n);
  SB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stealbatch::cuda::detail
