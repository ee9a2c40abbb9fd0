// MlpCuda and CnnCuda: cuBLAS GEMMs (column-major calls on row-major tensors) and small kernels.
//
// Row-major A[r][c] is column-major c x r, so each row-major product below is written as its transpose:
//   forward   Z[m][out]  = X[m][in] W[out][in]^T   ->  gemm(T, N, out, m, in, W, X) = Z^T
//   weights   dW[out][in] += dZ[m][out]^T X[m][in] ->  gemm(N, T, in, out, m, X, dZ) = dW^T  (beta = 1)
//   inputs    dX[m][in]  = dZ[m][out] W[out][in]   ->  gemm(N, N, in, m, out, W, dZ) = dX^T
#include <stealbatch/models/models_cuda.hpp>

#include <stealbatch/cuda/check.hpp>

#include <cublas_v2.h>

#include <array>
#include <span>
#include <string>

namespace stealbatch::examples {

namespace {

constexpr int kBlock = 256;

unsigned grid(std::size_t n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock > 0 ? (n + kBlock - 1) / kBlock : 1); }

// C (column-major M x N) = alpha op(A) op(B) + beta C.
void gemm(const ChunkContext& ctx, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
          const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  const float one = 1.0f;
  SB_CUBLAS_CHECK(cublasSgemm(static_cast<cublasHandle_t>(ctx.blas), ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, a, static_cast<int>(lda), b,
                              static_cast<int>(ldb), &beta, c, static_cast<int>(ldc)));
}

// y[r][c] += bias[c] over rows of `cols`; then ReLU if relu.
__global__ void bias_act_rows(float* y, const float* bias, std::size_t rows, std::size_t cols, bool relu) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  float v = y[i] + bias[i % cols];
  y[i] = relu ? fmaxf(v, 0.0f) : v;
}

// y[c][j] += bias[c] for planes of `plane` elements; then ReLU.
__global__ void bias_act_planes(float* y, const float* bias, std::size_t channels, std::size_t plane) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= channels * plane) return;
  y[i] = fmaxf(y[i] + bias[i / plane], 0.0f);
}

// One thread per sample: softmax cross-entropy of the logits row, as the CPU models compute it (double sums).
__global__ void softmax_xent(const float* logits, std::size_t classes, const float* input, std::size_t ld_input, std::size_t label_col,
                             std::size_t rows, float* dlogits, float* loss_out) {
  const std::size_t r = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* z = logits + r * classes;
  float zmax = z[0];
  for (std::size_t k = 1; k < classes; ++k) zmax = fmaxf(zmax, z[k]);
  double denom = 0;
  for (std::size_t k = 0; k < classes; ++k) denom += exp(static_cast<double>(z[k] - zmax));
  const std::size_t label = static_cast<std::size_t>(input[r * ld_input + label_col]);
  for (std::size_t k = 0; k < classes; ++k) {
    dlogits[r * classes + k] = static_cast<float>(exp(static_cast<double>(z[k] - zmax)) / denom) - (k == label ? 1.0f : 0.0f);
  }
  atomicAdd(loss_out, static_cast<float>(log(denom) - static_cast<double>(z[label] - zmax)));
}

// db[c] += sum over rows of d[r][c]: one thread per column, rows in order (deterministic).
__global__ void bias_grad_rows(const float* d, std::size_t rows, std::size_t cols, float* db) {
  const std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (std::size_t r = 0; r < rows; ++r) s += d[r * cols + c];
  db[c] += s;
}

// db[c] += sum of plane c of d: one block per channel, a fixed-order tree (deterministic).
__global__ void bias_grad_planes(const float* d, std::size_t plane, float* db) {
  __shared__ double part[kBlock];  // up to samples * 784 terms: summed in double, as the CPU model does
  const float* p = d + blockIdx.x * plane;
  double s = 0.0;
  for (std::size_t j = threadIdx.x; j < plane; j += blockDim.x) s += p[j];
  part[threadIdx.x] = s;
  __syncthreads();
  for (unsigned w = kBlock / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[blockIdx.x] += static_cast<float>(part[0]);
}

__global__ void relu_backward(float* d, const float* act, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n && act[i] <= 0.0f) d[i] = 0.0f;
}

// im2col with zero padding: col[(c, ky, kx)][(b, y, x)] = in[c * cs + b * bs + (y + ky - pad) * side + (x + kx - pad)].
__global__ void im2col(const float* in, std::size_t channels, std::size_t batch, std::size_t cs, std::size_t bs, int side, int k, int pad,
                       float* col) {
  const std::size_t hw = static_cast<std::size_t>(side) * side, cols = batch * hw;
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= channels * k * k * cols) return;
  const std::size_t row = i / cols, j = i % cols;
  const int c = static_cast<int>(row / (k * k)), ky = static_cast<int>(row / k % k), kx = static_cast<int>(row % k);
  const std::size_t b = j / hw;
  const int y = static_cast<int>(j % hw) / side + ky - pad, x = static_cast<int>(j % hw) % side + kx - pad;
  col[i] = (y >= 0 && y < side && x >= 0 && x < side) ? in[c * cs + b * bs + static_cast<std::size_t>(y) * side + x] : 0.0f;
}

// The adjoint of im2col for [c][b][y][x] maps: each input element gathers its col entries (no atomics).
__global__ void col2im(const float* col, std::size_t channels, std::size_t batch, int side, int k, int pad, float* out) {
  const std::size_t hw = static_cast<std::size_t>(side) * side, cols = batch * hw;
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= channels * cols) return;
  const std::size_t c = i / cols, j = i % cols, b = j / hw;
  const int y = static_cast<int>(j % hw) / side, x = static_cast<int>(j % hw) % side;
  float s = 0.0f;
  for (int ky = 0; ky < k; ++ky) {
    for (int kx = 0; kx < k; ++kx) {
      const int oy = y - ky + pad, ox = x - kx + pad;  // the output position whose window put this pixel at (ky, kx)
      if (oy < 0 || oy >= side || ox < 0 || ox >= side) continue;
      s += col[(c * k * k + static_cast<std::size_t>(ky) * k + kx) * cols + b * hw + static_cast<std::size_t>(oy) * side + ox];
    }
  }
  out[i] = s;
}

// 2x2 max-pool of [c][b][side][side] maps; out[c][b][side/2][side/2], arg = the first maximum (strict >).
__global__ void maxpool(const float* in, std::size_t planes, int side, float* out, unsigned char* arg) {
  const int h = side / 2;
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= planes * h * h) return;
  const std::size_t p = i / (h * h);
  const int py = static_cast<int>(i % (h * h)) / h, px = static_cast<int>(i % (h * h)) % h;
  const float* src = in + p * side * side;
  float best = src[(2 * py) * side + 2 * px];
  unsigned char at = 0;
  for (unsigned char w = 1; w < 4; ++w) {
    const float v = src[(2 * py + w / 2) * side + 2 * px + w % 2];
    if (v > best) best = v, at = w;
  }
  out[i] = best;
  arg[i] = at;
}

__global__ void maxpool_backward(const float* dout, const unsigned char* arg, std::size_t planes, int side, float* din) {
  const int h = side / 2;
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= planes * side * side) return;
  const std::size_t p = i / (side * side);
  const int y = static_cast<int>(i % (side * side)) / side, x = static_cast<int>(i % (side * side)) % side;
  const std::size_t o = p * h * h + static_cast<std::size_t>(y / 2) * h + x / 2;
  din[i] = arg[o] == (y % 2) * 2 + (x % 2) ? dout[o] : 0.0f;
}

// [c][b][j] <-> [b][c][j] (to and from the flattened rows fc1 reads).
__global__ void cbj_to_bcj(const float* in, std::size_t c, std::size_t b, std::size_t j, float* out) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= c * b * j) return;
  const std::size_t cc = i / (b * j), bb = i / j % b, jj = i % j;
  out[(bb * c + cc) * j + jj] = in[i];
}
__global__ void bcj_to_cbj(const float* in, std::size_t c, std::size_t b, std::size_t j, float* out) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= c * b * j) return;
  const std::size_t bb = i / (c * j), cc = i / j % c, jj = i % j;
  out[(cc * b + bb) * j + jj] = in[i];
}

// A bump allocator over the device's workspace.
class Arena {
 public:
  explicit Arena(std::byte* base) : m_base(base) {}
  template <class T>
  T* take(std::size_t n) {
    T* p = m_base ? reinterpret_cast<T*>(m_base + m_used) : nullptr;
    m_used += (n * sizeof(T) + 255) / 256 * 256;
    return p;
  }
  std::size_t used() const { return m_used; }

 private:
  std::byte* m_base;
  std::size_t m_used = 0;
};

// The fully connected layers from x (rows of ldx floats, labels at column label_col of `input`); returns dX of
// the first layer in dx0 when it is not null.
// Its pointers live on the stack: a chunk allocates nothing on the host.
void fc_stack(const ChunkContext& ctx, std::span<const std::size_t> sizes, std::size_t param_offset, const float* x, std::size_t ldx,
              const float* input, std::size_t ld_input, std::size_t label_col, std::size_t m, Arena& arena, float* dx0) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  const std::size_t layers = sizes.size() - 1;  // at most MlpCuda::kMaxLayers (its constructor checks)
  std::array<const float*, MlpCuda::kMaxLayers> w{}, b{};
  std::array<float*, MlpCuda::kMaxLayers> gw{}, gb{};
  std::array<float*, MlpCuda::kMaxLayers + 1> act{}, delta{};
  std::size_t off = param_offset;
  for (std::size_t l = 0; l < layers; ++l) {
    w[l] = ctx.params.data() + off, gw[l] = ctx.grad.data() + off;
    off += sizes[l] * sizes[l + 1];
    b[l] = ctx.params.data() + off, gb[l] = ctx.grad.data() + off;
    off += sizes[l + 1];
    act[l + 1] = arena.take<float>(m * sizes[l + 1]);
    delta[l + 1] = arena.take<float>(m * sizes[l + 1]);
  }
  act[0] = const_cast<float*>(x);
  for (std::size_t l = 0; l < layers; ++l) {
    const std::size_t in = sizes[l], out = sizes[l + 1], ld = l == 0 ? ldx : in;
    gemm(ctx, true, false, out, m, in, w[l], in, act[l], ld, 0.0f, act[l + 1], out);
    bias_act_rows<<<grid(m * out), kBlock, 0, s>>>(act[l + 1], b[l], m, out, l + 1 < layers);
  }
  const std::size_t classes = sizes.back();
  softmax_xent<<<grid(m), kBlock, 0, s>>>(act[layers], classes, input, ld_input, label_col, m, delta[layers], ctx.device_loss);
  for (std::size_t l = layers; l-- > 0;) {
    const std::size_t in = sizes[l], out = sizes[l + 1], ld = l == 0 ? ldx : in;
    gemm(ctx, false, true, in, out, m, act[l], ld, delta[l + 1], out, 1.0f, gw[l], in);
    bias_grad_rows<<<grid(out), kBlock, 0, s>>>(delta[l + 1], m, out, gb[l]);
    float* dx = l > 0 ? delta[l] : dx0;
    if (dx == nullptr) break;
    gemm(ctx, false, false, in, m, out, w[l], in, delta[l + 1], out, 0.0f, dx, in);
    if (l > 0) relu_backward<<<grid(m * in), kBlock, 0, s>>>(dx, act[l], m * in);
  }
}

std::size_t fc_bytes(std::span<const std::size_t> sizes, std::size_t m) {
  std::size_t bytes = 0;
  for (std::size_t l = 1; l < sizes.size(); ++l) bytes += 2 * ((m * sizes[l] * sizeof(float) + 255) / 256 * 256);
  return bytes;
}

void require_input(const ChunkContext& ctx) {
  if (ctx.input == nullptr || ctx.stream == nullptr) {
    throw ConfigError("the GPU models read their samples from ChunkContext::input: set RuntimeOptions::gpu.input_bytes and .gather "
                      "(gpu_input_bytes, gather_sample) and run on a GPU device");
  }
}

}  // namespace

MlpCuda::MlpCuda(std::vector<std::size_t> sizes) : m_sizes(std::move(sizes)) {
  if (m_sizes.size() < 2 || m_sizes.size() > kMaxLayers + 1) {
    throw ConfigError("MlpCuda: " + std::to_string(m_sizes.size()) + " layer sizes; give 2 to " + std::to_string(kMaxLayers + 1) +
                      " (inputs, hidden layers, classes)");
  }
}

void MlpCuda::accumulate(ChunkContext& ctx) const {
  require_input(ctx);
  const std::size_t m = ctx.samples.size(), features = m_sizes.front();
  auto* base = static_cast<std::byte*>(ctx.workspace(fc_bytes(m_sizes, m)));
  Arena arena(base);
  const auto* input = static_cast<const float*>(ctx.input);
  fc_stack(ctx, m_sizes, 0, input, features + 1, input, features + 1, features, m, arena, nullptr);
  SB_CUDA_CHECK(cudaGetLastError());
}

void CnnCuda::accumulate(ChunkContext& ctx) const {
  constexpr int kSide = 28, kHalf = 14, kQuarter = 7, kK = 5, kPad = 2;
  constexpr std::size_t kC1 = 16, kC2 = 32, kFeatures = 784, kLd = kFeatures + 1, kFlat = kC2 * kQuarter * kQuarter;
  require_input(ctx);
  constexpr std::array<std::size_t, 3> fc = {kFlat, 128, 10};
  const std::size_t m = ctx.samples.size();
  const std::size_t hw1 = kSide * kSide, hw2 = kHalf * kHalf;
  const std::size_t col1_n = 1 * kK * kK * m * hw1, col2_n = kC1 * kK * kK * m * hw2;
  const float* p = ctx.params.data();
  float* g = ctx.grad.data();
  const std::size_t w1 = 0, b1 = w1 + kC1 * 25, w2 = b1 + kC1, b2 = w2 + kC2 * kC1 * 25, fc_off = b2 + kC2;
  struct Buffers {
    float *col1, *conv1, *pool1, *col2, *conv2, *pool2, *flat, *d_flat, *d_pool2, *d_conv2, *d_col2, *d_pool1, *d_conv1;
    unsigned char *arg1, *arg2;
  } b{};
  auto carve = [&](Arena& a) {
    b.col1 = a.take<float>(col1_n), b.conv1 = a.take<float>(kC1 * m * hw1), b.pool1 = a.take<float>(kC1 * m * hw2);
    b.arg1 = a.take<unsigned char>(kC1 * m * hw2);
    b.col2 = a.take<float>(col2_n), b.conv2 = a.take<float>(kC2 * m * hw2), b.pool2 = a.take<float>(kFlat * m);
    b.arg2 = a.take<unsigned char>(kFlat * m);
    b.flat = a.take<float>(kFlat * m), b.d_flat = a.take<float>(kFlat * m), b.d_pool2 = a.take<float>(kFlat * m);
    b.d_conv2 = a.take<float>(kC2 * m * hw2), b.d_col2 = a.take<float>(col2_n), b.d_pool1 = a.take<float>(kC1 * m * hw2);
    b.d_conv1 = a.take<float>(kC1 * m * hw1);
  };
  Arena measure(nullptr);
  carve(measure);
  Arena arena(static_cast<std::byte*>(ctx.workspace(measure.used() + fc_bytes(fc, m))));
  carve(arena);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  const auto* input = static_cast<const float*>(ctx.input);
  auto [col1, conv1, pool1, col2, conv2, pool2, flat, d_flat, d_pool2, d_conv2, d_col2, d_pool1, d_conv1, arg1, arg2] = b;

  // conv1: the input rows are [b][784] with a label after each (stride 785); maps are [c][b][y][x] from here on.
  im2col<<<grid(col1_n), kBlock, 0, s>>>(input, 1, m, 0, kLd, kSide, kK, kPad, col1);
  gemm(ctx, false, false, m * hw1, kC1, 25, col1, m * hw1, p + w1, 25, 0.0f, conv1, m * hw1);
  bias_act_planes<<<grid(kC1 * m * hw1), kBlock, 0, s>>>(conv1, p + b1, kC1, m * hw1);
  maxpool<<<grid(kC1 * m * hw2), kBlock, 0, s>>>(conv1, kC1 * m, kSide, pool1, arg1);
  // conv2
  im2col<<<grid(col2_n), kBlock, 0, s>>>(pool1, kC1, m, m * hw2, hw2, kHalf, kK, kPad, col2);
  gemm(ctx, false, false, m * hw2, kC2, kC1 * 25, col2, m * hw2, p + w2, kC1 * 25, 0.0f, conv2, m * hw2);
  bias_act_planes<<<grid(kC2 * m * hw2), kBlock, 0, s>>>(conv2, p + b2, kC2, m * hw2);
  maxpool<<<grid(kFlat * m), kBlock, 0, s>>>(conv2, kC2 * m, kHalf, pool2, arg2);
  cbj_to_bcj<<<grid(kFlat * m), kBlock, 0, s>>>(pool2, kC2, m, kQuarter * kQuarter, flat);
  // fc1, fc2, the loss, and their backward passes down to d_flat.
  fc_stack(ctx, fc, fc_off, flat, kFlat, input, kLd, kFeatures, m, arena, d_flat);
  // conv2 backward
  bcj_to_cbj<<<grid(kFlat * m), kBlock, 0, s>>>(d_flat, kC2, m, kQuarter * kQuarter, d_pool2);
  maxpool_backward<<<grid(kC2 * m * hw2), kBlock, 0, s>>>(d_pool2, arg2, kC2 * m, kHalf, d_conv2);
  relu_backward<<<grid(kC2 * m * hw2), kBlock, 0, s>>>(d_conv2, conv2, kC2 * m * hw2);
  gemm(ctx, true, false, kC1 * 25, kC2, m * hw2, col2, m * hw2, d_conv2, m * hw2, 1.0f, g + w2, kC1 * 25);
  bias_grad_planes<<<kC2, kBlock, 0, s>>>(d_conv2, m * hw2, g + b2);
  gemm(ctx, false, true, m * hw2, kC1 * 25, kC2, d_conv2, m * hw2, p + w2, kC1 * 25, 0.0f, d_col2, m * hw2);
  col2im<<<grid(kC1 * m * hw2), kBlock, 0, s>>>(d_col2, kC1, m, kHalf, kK, kPad, d_pool1);
  // conv1 backward (no input gradient)
  maxpool_backward<<<grid(kC1 * m * hw1), kBlock, 0, s>>>(d_pool1, arg1, kC1 * m, kSide, d_conv1);
  relu_backward<<<grid(kC1 * m * hw1), kBlock, 0, s>>>(d_conv1, conv1, kC1 * m * hw1);
  gemm(ctx, true, false, 25, kC1, m * hw1, col1, m * hw1, d_conv1, m * hw1, 1.0f, g + w1, 25);
  bias_grad_planes<<<kC1, kBlock, 0, s>>>(d_conv1, m * hw1, g + b1);
  SB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stealbatch::examples
