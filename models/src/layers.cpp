// The shared building blocks on oneDNN: one GEMM per dense layer and direction, the loss in double.
#include <stealbatch/models/layers.hpp>

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace stealbatch::examples {

namespace {

// The name of the widest instruction set oneDNN's JIT uses on this CPU (dnnl_cpu_isa_t).
const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "other";
  }
}

}  // namespace

void use_arena_threads() {
  // oneDNN runs on OpenMP here, whose thread count is per calling thread: match the TBB arena the chunk runs in (a CPU
  // device's share of the cores; 1 on every device of cpu:4 on two cores), so that devices never oversubscribe.
  thread_local int set = 0;
  const int want = std::max(1, tbb::this_task_arena::max_concurrency());
  if (set != want) omp_set_num_threads(want), set = want;
}

std::string kernels_in_use() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " " + isa_name(dnnl_get_effective_cpu_isa());
}

std::string kernel_warning() {
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  const bool below512 = isa != dnnl_cpu_isa_avx512_core && isa != dnnl_cpu_isa_avx512_core_vnni && isa != dnnl_cpu_isa_avx512_core_bf16 &&
                        isa != dnnl_cpu_isa_avx512_core_amx;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && below512) {
    return "oneDNN runs " + std::string(isa_name(isa)) + " code on a CPU with AVX-512: unset DNNL_MAX_CPU_ISA (or ONEDNN_MAX_CPU_ISA) for its kernels";
  }
  if (__builtin_cpu_supports("avx2") && (isa == dnnl_cpu_isa_sse41 || isa == dnnl_cpu_isa_avx)) {
    return "oneDNN runs " + std::string(isa_name(isa)) + " code on a CPU with AVX2: unset DNNL_MAX_CPU_ISA (or ONEDNN_MAX_CPU_ISA)";
  }
  return {};
}

void sgemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
           float* c, std::size_t ldc) {
  use_arena_threads();
  const auto d = [](std::size_t x) { return static_cast<dnnl_dim_t>(x); };
  const dnnl_status_t s = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', d(m), d(n), d(k), 1.0f, a, d(lda), b, d(ldb), beta, c, d(ldc));
  if (s != dnnl_success) throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(static_cast<int>(s)));
}

void dense_forward(std::span<const float> x, std::size_t b, std::size_t in, std::size_t out, std::span<const float> weight,
                   std::span<const float> bias, std::vector<float>& y) {
  y.resize(b * out);
  for (std::size_t i = 0; i < b; ++i) std::copy(bias.begin(), bias.end(), y.begin() + static_cast<std::ptrdiff_t>(i * out));
  // y (b x out) += x (b x in) * W^T, with W stored out x in.
  sgemm(false, true, b, out, in, x.data(), in, weight.data(), in, 1.0f, y.data(), out);
}

void dense_backward(std::span<const float> x, std::span<const float> dy, std::size_t b, std::size_t in, std::size_t out,
                    std::span<const float> weight, std::span<float> dweight, std::span<float> dbias, std::vector<float>* dx) {
  // dW (out x in) += dy^T (out x b) * x (b x in); beta = 1 accumulates across chunks.
  sgemm(true, false, out, in, b, dy.data(), out, x.data(), in, 1.0f, dweight.data(), in);
  for (std::size_t i = 0; i < b; ++i) {
    for (std::size_t k = 0; k < out; ++k) dbias[k] += dy[i * out + k];
  }
  if (dx == nullptr) return;
  // dx (b x in) = dy (b x out) * W (out x in).
  dx->resize(b * in);
  sgemm(false, false, b, in, out, dy.data(), out, weight.data(), in, 0.0f, dx->data(), in);
}

void relu(std::span<float> v) {
  for (float& x : v) x = std::max(x, 0.0f);
}

void relu_backward(std::span<const float> out, std::span<float> grad) {
  for (std::size_t i = 0; i < grad.size(); ++i) {
    if (out[i] <= 0.0f) grad[i] = 0.0f;
  }
}
double softmax_cross_entropy(std::span<const float> logits, std::size_t classes, const DenseData& data,
                             std::span<const std::uint32_t> samples, std::vector<float>& dlogits) {
  const std::size_t b = samples.size();
  double loss = 0;
  dlogits.resize(b * classes);
  for (std::size_t i = 0; i < b; ++i) {
    const float* z = logits.data() + i * classes;
    float* g = dlogits.data() + i * classes;
    const float zmax = *std::max_element(z, z + classes);
    double denom = 0;
    for (std::size_t k = 0; k < classes; ++k) denom += std::exp(static_cast<double>(z[k] - zmax));
    const std::size_t label = data.y[samples[i]];
    for (std::size_t k = 0; k < classes; ++k) {
      g[k] = static_cast<float>(std::exp(static_cast<double>(z[k] - zmax)) / denom) - (k == label ? 1.0f : 0.0f);
    }
    loss += std::log(denom) - static_cast<double>(z[label] - zmax);
  }
  return loss;
}

double batched_accuracy(const DenseData& data, std::size_t classes, std::size_t batch,
                        const std::function<std::span<const float>(std::span<const std::uint32_t>)>& logits) {
  std::vector<std::uint32_t> idx;
  std::size_t correct = 0;
  for (std::size_t start = 0; start < data.count; start += batch) {
    const std::size_t b = std::min(batch, data.count - start);
    idx.resize(b);
    for (std::size_t i = 0; i < b; ++i) idx[i] = static_cast<std::uint32_t>(start + i);
    const std::span<const float> z = logits(idx);
    for (std::size_t i = 0; i < b; ++i) {
      const float* row = z.data() + i * classes;
      correct += static_cast<std::size_t>(std::max_element(row, row + classes) - row) == data.y[start + i];
    }
  }
  return data.count ? static_cast<double>(correct) / static_cast<double>(data.count) : 0.0;
}

}  // namespace stealbatch::examples
