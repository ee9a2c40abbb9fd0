// The CNN's forward and backward passes: oneDNN's convolutions (forward, weight and data gradients) in the layouts it
// picks for this CPU; the pooling, whose tie rule the model fixes, and the dense layers here.
#include <stealbatch/models/cnn_model.hpp>

#include <stealbatch/error.hpp>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace stealbatch::examples {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;
constexpr std::size_t kPlans = 256;  // chunk sizes whose primitives are kept; more (an unusual run) start over

// Where element (n, c, y, x) of a 4-D map lies in one of oneDNN's layouts: plain (nchw) or with the channels in
// blocks of `block` (nChw16c, nChw8c). c's block is at stride c, the channel within it at stride 1.
struct Layout {
  std::size_t n = 0, c = 0, y = 0, x = 0, block = 1;
  std::size_t at(std::size_t ni, std::size_t ci, std::size_t yi, std::size_t xi) const noexcept {
    return ni * n + ci / block * c + yi * y + xi * x + ci % block;
  }
};

Layout layout_of(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.ndims != 4) throw std::logic_error("cnn: oneDNN chose a map layout that is not blocked");
  const auto& b = d.format_desc.blocking;
  const auto s = [&](int i) { return static_cast<std::size_t>(b.strides[i]); };
  Layout l{s(0), s(1), s(2), s(3), 1};
  if (b.inner_nblks == 1 && b.inner_idxs[0] == 1) {
    l.block = static_cast<std::size_t>(b.inner_blks[0]);
  } else if (b.inner_nblks != 0) {
    throw std::logic_error("cnn: oneDNN chose a map layout with " + std::to_string(b.inner_nblks) + " inner blocks; this model reads one, on channels");
  }
  return l;
}

std::size_t floats(const memory::desc& md) { return md.get_size() / sizeof(float); }

// One 5x5 convolution (stride 1, zero padding 2) with its ReLU fused, its weight gradient and (when asked) its data
// gradient, for one chunk size; plus the reorders between the model's oihw weights and the layouts they run in.
struct Conv {
  memory::desc src, dst, weights, weights_bwd, diff_weights;
  memory::desc plain_weights, bias;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::convolution_backward_data bwd_data;
  dnnl::reorder to_fwd, to_bwd, from_diff;  // empty where the layouts are the same
  Layout src_l, dst_l;
  bool data_grad = false;
  bool reference_weight_grad = false;  // oneDNN has no optimized weight gradient for these layouts: its reference code

  Conv(const dnnl::engine& eng, std::size_t m, std::size_t ic, std::size_t oc, std::size_t side, const memory::desc& src_md, bool with_data_grad,
       Tag dst_tag = Tag::any)
      : data_grad(with_data_grad) {
    const auto dim = [](std::size_t v) { return static_cast<memory::dim>(v); };
    const memory::dims w{dim(oc), dim(ic), 5, 5}, strides{1, 1}, pad{2, 2};
    plain_weights = memory::desc(w, kF32, Tag::oihw);
    bias = memory::desc({dim(oc)}, kF32, Tag::x);
    const memory::desc any_w(w, kF32, Tag::any), any_dst({dim(m), dim(oc), dim(side), dim(side)}, kF32, dst_tag);
    dnnl::post_ops relu;
    relu.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(relu);
    const dnnl::convolution_forward::primitive_desc fpd(
        {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md, any_w, bias, any_dst, strides, pad, pad}, attr, eng);
    src = fpd.src_desc(), dst = fpd.dst_desc(), weights = fpd.weights_desc();
    fwd = dnnl::convolution_forward(fpd);
    const dnnl::convolution_backward_weights::primitive_desc wpd(
        {dnnl::algorithm::convolution_direct, src, any_w, bias, dst, strides, pad, pad}, eng, fpd);
    diff_weights = wpd.diff_weights_desc();
    bwd_weights = dnnl::convolution_backward_weights(wpd);
    reference_weight_grad = std::string(wpd.impl_info_str()).rfind("ref", 0) == 0;
    if (diff_weights != plain_weights) from_diff = dnnl::reorder(dnnl::reorder::primitive_desc(eng, diff_weights, eng, plain_weights));
    if (weights != plain_weights) to_fwd = dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain_weights, eng, weights));
    if (with_data_grad) {
      const dnnl::convolution_backward_data::primitive_desc dpd({dnnl::algorithm::convolution_direct, src, any_w, dst, strides, pad, pad}, eng, fpd);
      weights_bwd = dpd.weights_desc();
      bwd_data = dnnl::convolution_backward_data(dpd);
      if (weights_bwd != plain_weights) to_bwd = dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain_weights, eng, weights_bwd));
    }
    src_l = layout_of(src), dst_l = layout_of(dst);
  }
};

// 2x2 max-pooling, stride 2, of a [b][channels][side][side] map in layout li into layout lo. arg records each
// window's FIRST maximum (strict '>' in the order (0,0), (0,1), (1,0), (1,1)) as 2 * row + column, at index
// ((n * channels + c) * half + py) * half + px. The channel loop runs innermost, where blocked layouts keep it
// contiguous.
void pool_forward(const float* in, const Layout& li, std::size_t b, std::size_t channels, std::size_t side, float* out, const Layout& lo,
                  std::uint8_t* arg) {
  const std::size_t half = side / 2, blk = li.block;
  for (std::size_t n = 0; n < b; ++n) {
    for (std::size_t cb = 0; cb < channels; cb += blk) {
      for (std::size_t py = 0; py < half; ++py) {
        for (std::size_t px = 0; px < half; ++px) {
          const float* w = in + li.at(n, cb, 2 * py, 2 * px);
          for (std::size_t lane = 0; lane < blk; ++lane) {
            const float v[4] = {w[lane], w[li.x + lane], w[li.y + lane], w[li.y + li.x + lane]};
            std::uint8_t at = 0;
            for (std::uint8_t i = 1; i < 4; ++i) {
              if (v[i] > v[at]) at = i;
            }
            const std::size_t c = cb + lane;
            out[lo.at(n, c, py, px)] = v[at];
            arg[((n * channels + c) * half + py) * half + px] = at;
          }
        }
      }
    }
  }
}

// Routes dpool (layout lp) to each window's recorded maximum in dconv (layout lc, zeroed here over `dconv_floats`),
// and through the ReLU below it: 0 where the convolution's output `conv` (layout lc) is 0.
void pool_backward(const float* dpool, const Layout& lp, const std::uint8_t* arg, const float* conv, const Layout& lc, std::size_t b,
                   std::size_t channels, std::size_t side, float* dconv, std::size_t dconv_floats) {
  const std::size_t half = side / 2;
  std::fill(dconv, dconv + dconv_floats, 0.0f);
  for (std::size_t n = 0; n < b; ++n) {
    for (std::size_t c = 0; c < channels; ++c) {
      for (std::size_t py = 0; py < half; ++py) {
        for (std::size_t px = 0; px < half; ++px) {
          const std::uint8_t at = arg[((n * channels + c) * half + py) * half + px];
          const std::size_t pos = lc.at(n, c, 2 * py + at / 2, 2 * px + at % 2);
          if (conv[pos] > 0.0f) dconv[pos] = dpool[lp.at(n, c, py, px)];
        }
      }
    }
  }
}

}  // namespace

// oneDNN's engine, stream and each chunk size's convolutions, and the buffers one chunk uses.
struct CnnModel::Workspace::Kernels {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  struct Plan {
    Conv conv1, conv2;
  };
  std::unordered_map<std::size_t, std::unique_ptr<Plan>> plans;
  std::vector<float> input, conv1, pool1, conv2, pool2, hidden, logits;
  std::vector<float> d_logits, d_hidden, d_pool2, d_conv2, d_pool1, d_conv1;
  std::vector<float> w1, w2, w2_bwd, dw1, dw2, dw_plain, db;
  std::vector<std::uint8_t> arg1, arg2;

  // Workspaces plan under one lock: oneDNN shares state between threads while it creates primitives (ThreadSanitizer
  // saw one workspace's set-up read a descriptor that another's had allocated inside the library), synchronized where
  // ThreadSanitizer cannot see it. Under the lock each set-up is an ordered hand-off to both. A workspace plans once
  // per chunk size, so the lock is off the steady-state path.
  Plan& plan(std::size_t m) {
    auto it = plans.find(m);
    if (it != plans.end()) return *it->second;
    static std::mutex creating;
    const std::lock_guard lock(creating);
    if (plans.size() >= kPlans) plans.clear();
    const auto dim = [](std::size_t v) { return static_cast<memory::dim>(v); };
    constexpr std::size_t side = CnnModel::kSide, half = side / 2;
    Conv c1(eng, m, 1, CnnModel::kConv1, side, memory::desc({dim(m), 1, dim(side), dim(side)}, kF32, Tag::nchw), false);
    if (c1.reference_weight_grad) {
      // Where the CPU has no AVX-512 (AVX2 only), oneDNN 2.6 runs the first layer's weight gradient (one input
      // channel, blocked output) in its reference code, 50 to 100 times slower; with the maps channels-last it has
      // a JIT kernel for the forward pass and the weight gradient alike. With one channel, nchw and nhwc are the
      // same bytes, so the input is not copied.
      Conv nhwc(eng, m, 1, CnnModel::kConv1, side, memory::desc({dim(m), 1, dim(side), dim(side)}, kF32, Tag::nhwc), false, Tag::nhwc);
      if (!nhwc.reference_weight_grad) c1 = std::move(nhwc);
    }
    Conv c2(eng, m, CnnModel::kConv1, CnnModel::kConv2, half,
            memory::desc({dim(m), dim(CnnModel::kConv1), dim(half), dim(half)}, kF32, Tag::any), true);
    return *plans.emplace(m, std::make_unique<Plan>(Plan{std::move(c1), std::move(c2)})).first->second;
  }
};

CnnModel::Workspace::Workspace() : kernels(std::make_unique<Kernels>()) {}
CnnModel::Workspace::~Workspace() = default;
CnnModel::Workspace::Workspace(Workspace&&) noexcept = default;
CnnModel::Workspace& CnnModel::Workspace::operator=(Workspace&&) noexcept = default;

namespace {

float* grow(std::vector<float>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

memory mem(const memory::desc& md, const dnnl::engine& eng, const float* p) { return memory(md, eng, const_cast<float*>(p)); }

// The weights as a convolution reads them: the model's own (oihw) when the layouts agree, else reordered into buf.
const float* weights_for(const dnnl::reorder& r, const memory::desc& plain, const memory::desc& target, const float* params, std::vector<float>& buf,
                         dnnl::stream& s, const dnnl::engine& eng) {
  if (!r) return params;
  float* dst = grow(buf, floats(target));
  memory from = mem(plain, eng, params), to = mem(target, eng, dst);
  r.execute(s, from, to);
  return dst;
}

}  // namespace

CnnModel::CnnModel() {
  m_conv1_w = m_layout.add("conv1.weight", {kConv1, 1, kKernel, kKernel});
  m_conv1_b = m_layout.add("conv1.bias", kConv1);
  m_conv2_w = m_layout.add("conv2.weight", {kConv2, kConv1, kKernel, kKernel});
  m_conv2_b = m_layout.add("conv2.bias", kConv2);
  m_fc1_w = m_layout.add("fc1.weight", {kHidden, kFlat});
  m_fc1_b = m_layout.add("fc1.bias", kHidden);
  m_fc2_w = m_layout.add("fc2.weight", {kClasses, kHidden});
  m_fc2_b = m_layout.add("fc2.bias", kClasses);
}

std::vector<float> CnnModel::initial_parameters(std::uint64_t seed) const {
  std::vector<float> p(m_layout.size(), 0.0f);
  std::mt19937_64 rng(seed);
  const std::pair<std::size_t, std::size_t> weights[] = {
      {m_conv1_w, 1 * kKernel * kKernel}, {m_conv2_w, kConv1 * kKernel * kKernel}, {m_fc1_w, kFlat}, {m_fc2_w, kHidden}};
  for (const auto& [tensor, fan_in] : weights) {
    const float bound = std::sqrt(6.0f / static_cast<float>(fan_in));
    std::uniform_real_distribution<float> u(-bound, bound);
    for (float& w : m_layout.view(std::span<float>(p), tensor)) w = u(rng);
  }
  return p;
}

void CnnModel::forward(std::span<const float> params, const DenseData& data, std::span<const std::uint32_t> samples, Workspace& ws) const {
  check_input(data, kSide * kSide, samples, "cnn (28x28 images)");
  use_arena_threads();
  Workspace::Kernels& k = *ws.kernels;
  const std::size_t b = samples.size(), half = kSide / 2, quarter = kSide / 4;
  Workspace::Kernels::Plan& p = k.plan(b);
  float* input = grow(k.input, b * kSide * kSide);
  for (std::size_t i = 0; i < b; ++i) {
    const float* row = data.x.data() + static_cast<std::size_t>(samples[i]) * data.features;
    std::copy(row, row + data.features, input + i * data.features);
  }
  const dnnl::engine& eng = k.eng;
  dnnl::stream& s = k.strm;
  // A convolution's forward pass: its weights in the primitive's layout (reordered into `w_buf` where that differs
  // from the plain one), then the primitive, into `out`.
  const auto conv_forward = [&](auto& c, const float* src, std::size_t weight, std::size_t bias, std::vector<float>& w_buf, std::vector<float>& out) {
    const float* w = weights_for(c.to_fwd, c.plain_weights, c.weights, m_layout.view(params, weight).data(), w_buf, s, eng);
    float* dst = grow(out, floats(c.dst));
    c.fwd.execute(s, {{DNNL_ARG_SRC, mem(c.src, eng, src)},
                      {DNNL_ARG_WEIGHTS, mem(c.weights, eng, w)},
                      {DNNL_ARG_BIAS, mem(c.bias, eng, m_layout.view(params, bias).data())},
                      {DNNL_ARG_DST, mem(c.dst, eng, dst)}});
    return dst;
  };
  float* conv1 = conv_forward(p.conv1, input, m_conv1_w, m_conv1_b, k.w1, k.conv1);
  k.arg1.resize(b * kConv1 * half * half);
  float* pool1 = grow(k.pool1, floats(p.conv2.src));
  pool_forward(conv1, p.conv1.dst_l, b, kConv1, kSide, pool1, p.conv2.src_l, k.arg1.data());
  float* conv2 = conv_forward(p.conv2, pool1, m_conv2_w, m_conv2_b, k.w2, k.conv2);
  s.wait();
  k.arg2.resize(b * kFlat);
  k.pool2.resize(b * kFlat);
  const Layout flat{kFlat, quarter * quarter, quarter, 1, 1};  // [sample][channel][y][x]: fc1's input rows
  pool_forward(conv2, p.conv2.dst_l, b, kConv2, half, k.pool2.data(), flat, k.arg2.data());
  dense_forward(k.pool2, b, kFlat, kHidden, m_layout.view(params, m_fc1_w), m_layout.view(params, m_fc1_b), k.hidden);
  relu(k.hidden);
  dense_forward(k.hidden, b, kHidden, kClasses, m_layout.view(params, m_fc2_w), m_layout.view(params, m_fc2_b), k.logits);
}

double CnnModel::accumulate_gradient(std::span<const float> params, std::span<float> grad, const DenseData& data,
                                     std::span<const std::uint32_t> samples, Workspace& ws) const {
  forward(params, data, samples, ws);
  Workspace::Kernels& k = *ws.kernels;
  const std::size_t b = samples.size(), half = kSide / 2, quarter = kSide / 4;
  Workspace::Kernels::Plan& p = k.plan(b);
  const dnnl::engine& eng = k.eng;
  dnnl::stream& s = k.strm;
  const double loss = softmax_cross_entropy(k.logits, kClasses, data, samples, k.d_logits);
  dense_backward(k.hidden, k.d_logits, b, kHidden, kClasses, m_layout.view(params, m_fc2_w), m_layout.view(grad, m_fc2_w),
                 m_layout.view(grad, m_fc2_b), &k.d_hidden);
  relu_backward(k.hidden, k.d_hidden);
  dense_backward(k.pool2, k.d_hidden, b, kFlat, kHidden, m_layout.view(params, m_fc1_w), m_layout.view(grad, m_fc1_w),
                 m_layout.view(grad, m_fc1_b), &k.d_pool2);
  const Layout flat{kFlat, quarter * quarter, quarter, 1, 1};
  float* d_conv2 = grow(k.d_conv2, floats(p.conv2.dst));
  pool_backward(k.d_pool2.data(), flat, k.arg2.data(), k.conv2.data(), p.conv2.dst_l, b, kConv2, half, d_conv2, floats(p.conv2.dst));

  // A convolution's weight and bias gradients, in the layout it computes them, added to the model's (oihw) ones.
  auto weight_grad = [&](Conv& c, const float* src, const float* d_dst, std::size_t w_tensor, std::size_t b_tensor, std::vector<float>& dw) {
    const std::span<float> gw = m_layout.view(grad, w_tensor), gb = m_layout.view(grad, b_tensor);
    float* diff_w = grow(dw, floats(c.diff_weights));
    float* diff_b = grow(k.db, gb.size());
    c.bwd_weights.execute(s, {{DNNL_ARG_SRC, mem(c.src, eng, src)},
                              {DNNL_ARG_DIFF_DST, mem(c.dst, eng, d_dst)},
                              {DNNL_ARG_DIFF_WEIGHTS, mem(c.diff_weights, eng, diff_w)},
                              {DNNL_ARG_DIFF_BIAS, mem(c.bias, eng, diff_b)}});
    const float* plain = diff_w;
    if (c.from_diff) {
      float* out = grow(k.dw_plain, gw.size());
      memory from = mem(c.diff_weights, eng, diff_w), to = mem(c.plain_weights, eng, out);
      c.from_diff.execute(s, from, to);
      plain = out;
    }
    s.wait();
    for (std::size_t i = 0; i < gw.size(); ++i) gw[i] += plain[i];
    for (std::size_t i = 0; i < gb.size(); ++i) gb[i] += diff_b[i];
  };
  weight_grad(p.conv2, k.pool1.data(), d_conv2, m_conv2_w, m_conv2_b, k.dw2);
  const float* w2b = weights_for(p.conv2.to_bwd, p.conv2.plain_weights, p.conv2.weights_bwd, m_layout.view(params, m_conv2_w).data(), k.w2_bwd, s, eng);
  float* d_pool1 = grow(k.d_pool1, floats(p.conv2.src));
  p.conv2.bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, mem(p.conv2.dst, eng, d_conv2)},
                               {DNNL_ARG_WEIGHTS, mem(p.conv2.weights_bwd, eng, w2b)},
                               {DNNL_ARG_DIFF_SRC, mem(p.conv2.src, eng, d_pool1)}});
  s.wait();
  float* d_conv1 = grow(k.d_conv1, floats(p.conv1.dst));
  pool_backward(d_pool1, p.conv2.src_l, k.arg1.data(), k.conv1.data(), p.conv1.dst_l, b, kConv1, kSide, d_conv1, floats(p.conv1.dst));
  // The input needs no gradient: conv1 stops at its weights.
  weight_grad(p.conv1, k.input.data(), d_conv1, m_conv1_w, m_conv1_b, k.dw1);
  return loss;
}

double CnnModel::accuracy(std::span<const float> params, const DenseData& data, Workspace& ws) const {
  return batched_accuracy(data, kClasses, 128, [&](std::span<const std::uint32_t> samples) {
    forward(params, data, samples, ws);
    return std::span<const float>(ws.kernels->logits);
  });
}

}  // namespace stealbatch::examples
