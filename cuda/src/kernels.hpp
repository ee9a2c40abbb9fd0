// Launch wrappers for the backend's own kernels (kernels.cu): the optimizer and the vgpu sum.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace stealbatch::cuda::detail {

// Each update scales the reduced sum grad[0..n) by `scale` (1 / the step's sample count, which the host knows exactly).
void sgd_update(float* params, const float* grad, float* velocity, std::size_t n, float scale, float lr, float momentum, float weight_decay,
                cudaStream_t s);
void adam_update(float* params, const float* grad, float* m, float* v, std::size_t n, float scale, float lr, float beta1, float beta2,
                 float eps, float weight_decay, float c1, float c2, cudaStream_t s);
// out's row i = rows' row ids[i], for i < n (at most 2^31 - 1); row_bytes a multiple of 4, every address 4-aligned.
void gather_rows(const std::byte* rows, std::size_t row_bytes, const std::uint32_t* ids, std::size_t n, std::byte* out, cudaStream_t s);
// out_k[i] = sum over d of bufs[d][i] for every buffer k (the sum written back into all of them). bufs is a
// device array of `count` device pointers.
void sum_into_all(float* const* bufs, std::size_t count, std::size_t n, cudaStream_t s);
// Deterministic mode, one tensor of a cell (the host's rule, runtime/src/reduction/fixed_point.cpp): acc[i] += round(v[i] *
// 2^shift), to nearest with ties to even, modulo 2^64, unless shift is kNoExponent (the scan alone); *largest_bits
// becomes the max of itself and every |v[i]|'s bit pattern (sign cleared: the float order, inf and NaN above every
// finite value); v[i] = 0.
void cell_to_fixed(float* v, std::size_t n, int shift, unsigned long long* acc, unsigned* largest_bits, cudaStream_t s);

}  // namespace stealbatch::cuda::detail
