// The optimizer updates, written as plain element loops so every replica computes bit-identical results.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/optimizer.hpp>

#include <cmath>
#include <stdexcept>
#include <string>

namespace stealbatch {

namespace {

void check(const char* field, float v, float lo, bool lo_open, float hi, bool hi_open) {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok) {
    throw ConfigError(std::string("optimizer: ") + field + " = " + std::to_string(v) + "; valid range is " + (lo_open ? "(" : "[") +
                      std::to_string(lo) + ", " + std::to_string(hi) + (hi_open ? ")" : "]"));
  }
}

}  // namespace

void validate(const OptimizerOptions& o) {
  check("lr", o.lr, 0, true, 10, false);
  check("momentum", o.momentum, 0, false, 1, true);
  check("beta1", o.beta1, 0, false, 1, true);
  check("beta2", o.beta2, 0, false, 1, true);
  check("eps", o.eps, 0, true, 1, true);
  check("weight_decay", o.weight_decay, 0, false, 1, true);
}

OptimizerKind parse_optimizer(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  throw ConfigError("optimizer = '" + std::string(name) + "': expected sgd or adam");
}

Optimizer::Optimizer(const OptimizerOptions& options, std::size_t size, bool double_buffered) : m_o(options), m_m(size, 0.0f) {
  validate(m_o);
  if (m_o.kind == OptimizerKind::kAdam) m_v.assign(size, 0.0f);
  if (double_buffered) m_m_next = m_m, m_v_next = m_v;
}

void Optimizer::restore(std::span<const float> first, std::span<const float> second, std::uint64_t steps) {
  if (first.size() != m_m.size() || second.size() != m_v.size()) {
    throw ConfigError("optimizer: a state of " + std::to_string(first.size()) + " + " + std::to_string(second.size()) + " floats for one of " +
                      std::to_string(m_m.size()) + " + " + std::to_string(m_v.size()));
  }
  m_m.assign(first.begin(), first.end());
  m_v.assign(second.begin(), second.end());
  if (!m_m_next.empty() || !m_v_next.empty()) m_m_next = m_m, m_v_next = m_v;  // double-buffered: update_into() writes these next
  m_t = steps;
}

void Optimizer::set_lr(float lr) {
  check("lr", lr, 0, true, 10, false);
  m_o.lr = lr;
}

namespace {

// The per-element updates, shared by the in-place loops (Optimizer::step) and the out-of-place ones (update_into).
struct SgdCoef {
  float scale, wd, mu, lr;
  void operator()(float p, float gs, float m, float& p_out, float& m_out) const {
    const float g = gs * scale + wd * p;
    const float mi = mu * m + g;
    m_out = mi;
    p_out = p - lr * mi;
  }
};

struct AdamCoef {
  float scale, wd, b1, b2, eps, step, inv_c2;
  void operator()(float p, float gs, float m, float v, float& p_out, float& m_out, float& v_out) const {
    const float g = gs * scale + wd * p;
    const float mi = b1 * m + (1.0f - b1) * g;
    const float vi = b2 * v + (1.0f - b2) * g * g;
    m_out = mi;
    v_out = vi;
    p_out = p - step * mi / (std::sqrt(vi * inv_c2) + eps);
  }
};

AdamCoef adam_coef(const OptimizerOptions& o, float grad_scale, std::uint64_t t) {
  const float c1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta1), static_cast<double>(t)));
  const float c2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta2), static_cast<double>(t)));
  // The bias corrections as one step size and one factor under the root: a division and a square root per
  // element instead of three divisions and a root.
  return {grad_scale, o.weight_decay, o.beta1, o.beta2, o.eps, o.lr / c1, 1.0f / c2};
}

// Out of place, every buffer distinct: `__restrict` on the parameters (GCC ignores it on local pointers) lets these
// vectorize without run-time alias checks, of which seven buffers would need more than GCC versions a loop for.
// Not inlined: GCC 12 drops the parameters' restrict when it inlines them into update_into().
[[gnu::noinline]] void sgd_into(const SgdCoef k, std::size_t n, const float* __restrict p, float* __restrict p_out, const float* __restrict gs,
              const float* __restrict m, float* __restrict m_out) {
  for (std::size_t i = 0; i < n; ++i) k(p[i], gs[i], m[i], p_out[i], m_out[i]);
}

[[gnu::noinline]] void adam_into(const AdamCoef k, std::size_t n, const float* __restrict p, float* __restrict p_out, const float* __restrict gs,
               const float* __restrict m, float* __restrict m_out, const float* __restrict v, float* __restrict v_out) {
  for (std::size_t i = 0; i < n; ++i) k(p[i], gs[i], m[i], v[i], p_out[i], m_out[i], v_out[i]);
}

}  // namespace

void Optimizer::step(std::span<float> params, std::span<const float> grad_sum, float grad_scale) {
  ++m_t;
  const std::size_t n = params.size();
  float* p = params.data();
  const float* gs = grad_sum.data();
  float* m = m_m.data();
  if (m_o.kind == OptimizerKind::kSgd) {
    const SgdCoef k{grad_scale, m_o.weight_decay, m_o.momentum, m_o.lr};
    for (std::size_t i = 0; i < n; ++i) k(p[i], gs[i], m[i], p[i], m[i]);
    return;
  }
  const AdamCoef k = adam_coef(m_o, grad_scale, m_t);
  float* v = m_v.data();
  for (std::size_t i = 0; i < n; ++i) k(p[i], gs[i], m[i], v[i], p[i], m[i], v[i]);
}

void Optimizer::update_into(std::span<const float> params, std::span<float> next_params, std::span<const float> grad_sum, float grad_scale,
                            std::size_t begin, std::size_t end) {
  if (m_m_next.size() != m_m.size()) throw std::logic_error("Optimizer::update_into: the optimizer was not made double-buffered");
  const std::size_t n = end - begin, b = begin;
  if (m_o.kind == OptimizerKind::kSgd) {
    sgd_into({grad_scale, m_o.weight_decay, m_o.momentum, m_o.lr}, n, params.data() + b, next_params.data() + b, grad_sum.data() + b,
             m_m.data() + b, m_m_next.data() + b);
    return;
  }
  adam_into(adam_coef(m_o, grad_scale, m_t + 1), n, params.data() + b, next_params.data() + b, grad_sum.data() + b, m_m.data() + b,
            m_m_next.data() + b, m_v.data() + b, m_v_next.data() + b);
}

void Optimizer::commit() noexcept {
  m_m.swap(m_m_next);
  m_v.swap(m_v_next);
  ++m_t;
}

}  // namespace stealbatch
