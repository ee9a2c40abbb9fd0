// The example models as torch::nn modules, for the libtorch adapter: the same networks, parameter names, shapes and
// order as the hand-written MlpModel and CnnModel, so a layout, a start and a gradient carry over between them; and
// TorchLm, a byte-level causal transformer over variable-length documents.
#pragma once

#include <stealbatch/torch.hpp>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace stealbatch::examples {

// sizes[0] inputs, ReLU between layers, sizes.back() outputs: fc1, fc2, ... (fcN.weight [out, in], fcN.bias).
struct TorchMlpImpl : ::torch::nn::Module {
  explicit TorchMlpImpl(const std::vector<std::int64_t>& sizes) {
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      layers.push_back(register_module("fc" + std::to_string(l + 1), ::torch::nn::Linear(sizes[l], sizes[l + 1])));
    }
  }
  ::torch::Tensor forward(::torch::Tensor x) {
    for (std::size_t l = 0; l < layers.size(); ++l) {
      x = layers[l](x);
      if (l + 1 < layers.size()) x = ::torch::relu(x);
    }
    return x;
  }
  std::vector<::torch::nn::Linear> layers;
};

// CnnModel's network: 28x28 rows in, conv5x5x16 (pad 2) + ReLU + 2x2 max-pool, conv5x5x32 + ReLU + pool, then
// fc1 (1568 -> 128) + ReLU and fc2 (128 -> 10); the flattening is [channel][y][x], as CnnModel's.
struct TorchCnnImpl : ::torch::nn::Module {
  TorchCnnImpl()
      : conv1(register_module("conv1", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(1, 16, 5).padding(2)))),
        conv2(register_module("conv2", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(16, 32, 5).padding(2)))),
        fc1(register_module("fc1", ::torch::nn::Linear(32 * 7 * 7, 128))),
        fc2(register_module("fc2", ::torch::nn::Linear(128, 10))) {}
  ::torch::Tensor forward(::torch::Tensor x) {
    x = x.view({-1, 1, 28, 28});
    x = ::torch::max_pool2d(::torch::relu(conv1(x)), 2);
    x = ::torch::max_pool2d(::torch::relu(conv2(x)), 2);
    return fc2(::torch::relu(fc1(x.flatten(1))));
  }
  ::torch::nn::Conv2d conv1, conv2;
  ::torch::nn::Linear fc1, fc2;
};

struct TorchLmOptions {
  std::int64_t width = 128, layers = 2, heads = 4, max_len = 1024;
};

// One pre-norm transformer block: x + attention(ln1(x)), then x + mlp(ln2(x)) with a 4x GELU MLP.
struct TorchLmBlockImpl : ::torch::nn::Module {
  TorchLmBlockImpl(std::int64_t width, std::int64_t head_count)
      : heads(head_count),
        ln1(register_module("ln1", ::torch::nn::LayerNorm(::torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", ::torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", ::torch::nn::Linear(width, width))),
        ln2(register_module("ln2", ::torch::nn::LayerNorm(::torch::nn::LayerNormOptions({width})))),
        fc(register_module("fc", ::torch::nn::Linear(width, 4 * width))),
        out(register_module("out", ::torch::nn::Linear(4 * width, width))) {}

  // Causal self-attention of x [B, L, w] over each row: every query sees its own and the earlier positions. On right
  // padding this is exact for the real tokens (their keys are all real); a padding query's output reaches no real one.
  ::torch::Tensor attend(const ::torch::Tensor& x) {
    const std::int64_t b = x.size(0), l = x.size(1), w = x.size(2), dh = w / heads;
    const ::torch::Tensor h = qkv(x).view({b, l, 3, heads, dh}).permute({2, 0, 3, 1, 4});  // [3, B, H, L, dh]
    ::torch::Tensor att = ::torch::matmul(h[0], h[1].transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
    const ::torch::Tensor later = ::torch::ones({l, l}, ::torch::TensorOptions().dtype(::torch::kBool).device(x.device())).triu(1);
    att = att.masked_fill(later, -std::numeric_limits<float>::infinity()).softmax(-1);
    return proj(::torch::matmul(att, h[2]).transpose(1, 2).reshape({b, l, w}));
  }

  // x: [n, L, w] padded, or [1, T, w] packed with the sequences' lengths (attention within each, one at a time: no
  // work on the blocks a T x T mask would forbid).
  ::torch::Tensor forward(::torch::Tensor x, const libtorch::Sequences& s) {
    const ::torch::Tensor y = ln1(x);
    if (s.form == libtorch::SequenceForm::kPadded) {
      x = x + attend(y);
    } else {
      std::vector<::torch::Tensor> parts;
      for (const ::torch::Tensor& seq : y.split_with_sizes(s.lengths, 1)) parts.push_back(attend(seq));
      x = x + ::torch::cat(parts, 1);
    }
    return x + out(::torch::gelu(fc(ln2(x))));
  }

  std::int64_t heads;
  ::torch::nn::LayerNorm ln1;
  ::torch::nn::Linear qkv, proj;
  ::torch::nn::LayerNorm ln2;
  ::torch::nn::Linear fc, out;
};

// A byte-level causal transformer language model: token and position embeddings, `layers` blocks, a final norm and
// a head to the next byte's 256 logits. It reads Sequences in either form, with or without their dense mask (it
// attends causally within each sequence itself). Output: logits, [n, L, 256] padded or [1, T, 256] packed.
struct TorchLmImpl : ::torch::nn::Module {
  explicit TorchLmImpl(const TorchLmOptions& o)
      : tok(register_module("tok", ::torch::nn::Embedding(256, o.width))),
        pos(register_module("pos", ::torch::nn::Embedding(o.max_len, o.width))) {
    if (o.width % o.heads != 0) throw std::invalid_argument("TorchLm: width " + std::to_string(o.width) + " is not a multiple of heads " + std::to_string(o.heads));
    for (std::int64_t l = 0; l < o.layers; ++l) blocks.push_back(register_module("block" + std::to_string(l), std::make_shared<TorchLmBlockImpl>(o.width, o.heads)));
    ln = register_module("ln", ::torch::nn::LayerNorm(::torch::nn::LayerNormOptions({o.width})));
    head = register_module("head", ::torch::nn::Linear(o.width, 256));
  }
  ::torch::Tensor forward(const libtorch::Sequences& s) {
    ::torch::Tensor x = tok(s.tokens) + pos(s.positions);
    for (auto& b : blocks) x = b->forward(x, s);
    return head(ln(x));
  }
  ::torch::nn::Embedding tok, pos;
  std::vector<std::shared_ptr<TorchLmBlockImpl>> blocks;
  ::torch::nn::LayerNorm ln{nullptr};
  ::torch::nn::Linear head{nullptr};
};

// The summed next-byte cross-entropy (nats) over a chunk's targets; padding and each sequence's last token have none.
inline ::torch::Tensor next_byte_loss(const ::torch::Tensor& logits, const libtorch::Sequences& s) {
  return ::torch::nn::functional::cross_entropy(
      logits.reshape({-1, 256}), s.targets.reshape({-1}),
      ::torch::nn::functional::CrossEntropyFuncOptions().reduction(::torch::kSum).ignore_index(libtorch::Sequences::kNoTarget));
}

}  // namespace stealbatch::examples
