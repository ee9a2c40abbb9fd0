// The building blocks the example models share, on oneDNN: GEMM, dense layers, ReLU, softmax cross-entropy, accuracy.
#pragma once

#include <stealbatch/models/compare.hpp>
#include <stealbatch/models/dense_data.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace stealbatch::examples {

// The kernels' library and the instruction set its code runs on this CPU, for run headers: "oneDNN 2.6.3 avx512_core".
std::string kernels_in_use();
// Empty, or what to do when the kernels run older code than this CPU could (a cap on oneDNN's instruction set).
std::string kernel_warning();
// Gives oneDNN on the calling thread as many threads as the TBB arena it runs in (a CPU device's share of the
// cores). Every kernel below calls it; a model's own oneDNN primitives call it before they run.
void use_arena_threads();

// C (m x n, row-major) = op(A) op(B) + beta C, with op(X) = X or its transpose (row-major as stored): oneDNN's
// sgemm, on the calling thread's arena threads. Throws std::runtime_error when oneDNN reports a failure.
void sgemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
           float* c, std::size_t ldc);

// y (b x out) = x (b x in) * W^T + bias, with W stored row-major [out][in].
//
//   dense_forward(x, b, 784, 128, w, bias, y);   // y is resized to b * 128
void dense_forward(std::span<const float> x, std::size_t b, std::size_t in, std::size_t out, std::span<const float> weight,
                   std::span<const float> bias, std::vector<float>& y);
// dW += dy^T x and dbias += the column sums of dy (accumulating across chunks); then, when dx is given,
// dx = dy W (assigned, resized to b * in).
void dense_backward(std::span<const float> x, std::span<const float> dy, std::size_t b, std::size_t in, std::size_t out,
                    std::span<const float> weight, std::span<float> dweight, std::span<float> dbias, std::vector<float>* dx);

void relu(std::span<float> v);
// Zeroes grad where the ReLU's output is 0: the derivative at 0 is taken as 0.
void relu_backward(std::span<const float> out, std::span<float> grad);

// Softmax cross-entropy of b = samples.size() rows of logits against data.y[samples[i]]: writes
// dL/dlogits = softmax - onehot to dlogits (resized to b * classes) and returns the loss summed over the samples
// (not averaged), accumulated in double.
double softmax_cross_entropy(std::span<const float> logits, std::size_t classes, const DenseData& data,
                             std::span<const std::uint32_t> samples, std::vector<float>& dlogits);

// The fraction of data classified correctly (the largest logit is at the label; the first one on a tie).
// logits(samples) runs the forward pass over those samples and returns their logits, samples.size() x classes;
// it is handed consecutive batches of at most `batch` samples.
double batched_accuracy(const DenseData& data, std::size_t classes, std::size_t batch,
                        const std::function<std::span<const float>(std::span<const std::uint32_t>)>& logits);

}  // namespace stealbatch::examples
