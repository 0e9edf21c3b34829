#include "autograd/optim.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "autograd/ops/vk_util.h"

namespace q4t::ag {

namespace {

// Block of gradient values one grad_norm_partial.comp workgroup sums (256 invocations x 16).
constexpr int64_t kNormBlock = 4096;

struct AdamWPush {
  uint32_t n;
  float b1, one_minus_b1, b2, one_minus_b2, eps;
};
// The device buffer adamw_step.comp reads the step-dependent scalars from.
struct StepScalars {
  float lr, decay, bc1, bc2;
};
struct NormPartialPush {
  uint32_t n, offset, groups;
};
struct NormReducePush {
  uint32_t count;
};
struct ClipPush {
  uint32_t n;
  float max_norm;
};

void check_config(const AdamWConfig& c) {
  auto bad = [](const std::string& field, double v, const char* want) {
    throw std::invalid_argument("AdamW " + field + " = " + std::to_string(v) + ": must be " + want);
  };
  if (!(c.lr >= 0)) bad("lr", c.lr, ">= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) bad("beta1", c.beta1, "in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) bad("beta2", c.beta2, "in [0, 1)");
  if (!(c.eps >= 0)) bad("eps", c.eps, ">= 0");
  if (!(c.weight_decay >= 0)) bad("weight_decay", c.weight_decay, ">= 0");
}

template <class T>
void adamw_cpu(const Tensor& p_t, const Tensor& g_t, const Tensor& m_t, const Tensor& v_t, const AdamWConfig& c,
               double lr, double bc1, double bc2) {
  T* p = p_t.data<T>();
  const T* g = g_t.data<T>();
  T* m = m_t.data<T>();
  T* v = v_t.data<T>();
  const T b1 = T(c.beta1), omb1 = T(1.0 - c.beta1), b2 = T(c.beta2), omb2 = T(1.0 - c.beta2), eps = T(c.eps);
  const T decay = T(1.0 - lr * c.weight_decay), lr_t = T(lr), bc1_t = T(bc1), bc2_t = T(bc2);
  for (int64_t i = 0, n = p_t.numel(); i < n; ++i) {
    m[i] = b1 * m[i] + omb1 * g[i];
    v[i] = b2 * v[i] + omb2 * g[i] * g[i];
    p[i] = p[i] * decay - lr_t * (m[i] / bc1_t) / (std::sqrt(v[i] / bc2_t) + eps);
  }
}

template <class T>
double sum_squares_cpu(const Tensor& g_t) {
  const T* g = g_t.data<T>();
  double s = 0;
  for (int64_t i = 0, n = g_t.numel(); i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}

template <class T>
void scale_cpu(const Tensor& g_t, double s) {
  T* g = g_t.data<T>();
  for (int64_t i = 0, n = g_t.numel(); i < n; ++i) g[i] *= T(s);
}

}  // namespace

struct AdamW::VkState {
  explicit VkState(vk::Device& dev, int64_t partials)
      : scalars(dev, sizeof(StepScalars)), partial(dev, size_t(std::max<int64_t>(partials, 1)) * 4), sumsq(dev, 4) {}
  vk::Buffer scalars;  // StepScalars, rewritten before each step
  vk::Buffer partial;  // [Σ over params of ceil(numel / kNormBlock)] per-block sums of squares
  vk::Buffer sumsq;    // [1] Σ g² over all gradients
  std::unique_ptr<vk::Sequence> step_seq, norm_seq, clip_seq;
  double clip_recorded = std::numeric_limits<double>::quiet_NaN();  // max_norm clip_seq was recorded with
};

AdamW::AdamW(Graph& g, const AdamWConfig& cfg) : g_(g), cfg_(cfg), params_(g.params()) {
  check_config(cfg_);
  Backend& be = g_.backend();
  int64_t partials = 0;
  for (const Var& p : params_) {
    m_.push_back(be.zeros(p.shape(), be.real()));
    v_.push_back(be.zeros(p.shape(), be.real()));
    partials += (p.value().numel() + kNormBlock - 1) / kNormBlock;
  }
  if (!be.is_cpu()) vk_ = std::make_unique<VkState>(be.device(), partials);
}

AdamW::~AdamW() = default;

void AdamW::step(double lr) {
  if (!(lr >= 0)) throw std::invalid_argument("AdamW step: lr = " + std::to_string(lr) + " must be >= 0");
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, double(t_)), bc2 = 1.0 - std::pow(cfg_.beta2, double(t_));
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    for (size_t k = 0; k < params_.size(); ++k) {
      const Tensor &p = params_[k].value(), &g = g_.grad(params_[k]);
      if (be.real() == DType::F64) adamw_cpu<double>(p, g, m_[k], v_[k], cfg_, lr, bc1, bc2);
      else adamw_cpu<float>(p, g, m_[k], v_[k], cfg_, lr, bc1, bc2);
    }
    return;
  }
  const StepScalars s{float(lr), float(1.0 - lr * cfg_.weight_decay), float(bc1), float(bc2)};
  vk_->scalars.upload(&s, sizeof(s));
  if (!vk_->step_seq) {
    vk_->step_seq = std::make_unique<vk::Sequence>(be.device());
    vk::Sequence& seq = *vk_->step_seq;
    seq.begin();
    seq.begin_independent();  // each parameter's update touches its own buffers only
    for (size_t k = 0; k < params_.size(); ++k) {
      const Tensor &p = params_[k].value(), &g = g_.grad(params_[k]);
      if (p.numel() == 0) continue;
      const AdamWPush push{uint32_t(p.numel()), float(cfg_.beta1), float(1.0 - cfg_.beta1), float(cfg_.beta2),
                           float(1.0 - cfg_.beta2), float(cfg_.eps)};
      const auto& pipe = be.pipeline("adamw_step", 5, sizeof(push));
      seq.dispatch(pipe, {&p.buffer(), &g.buffer(), &m_[k].buffer(), &v_[k].buffer(), &vk_->scalars}, push,
                   groups_for(p.numel(), 256));
    }
    seq.end_independent();
    seq.end();
  }
  vk_->step_seq->run();
}

// Records the two-pass sum of squares of every gradient into vk_->sumsq.
void AdamW::record_norm(vk::Sequence& seq) {
  Backend& be = g_.backend();
  uint32_t offset = 0;
  seq.begin_independent();  // each gradient's partial sums go to their own range of vk_->partial
  for (const Var& p : params_) {
    const Tensor& g = g_.grad(p);
    if (g.numel() == 0) continue;
    const int64_t groups = (g.numel() + kNormBlock - 1) / kNormBlock;
    const NormPartialPush push{uint32_t(g.numel()), offset, uint32_t(groups)};
    seq.dispatch(be.pipeline("grad_norm_partial", 2, sizeof(push)), {&vk_->partial, &g.buffer()}, push,
                 groups_for(groups, 1));
    offset += uint32_t(groups);
  }
  seq.end_independent();
  const NormReducePush push{offset};
  seq.dispatch(be.pipeline("grad_norm_reduce", 2, sizeof(push)), {&vk_->sumsq, &vk_->partial}, push, {1, 1, 1});
}

double AdamW::grad_norm() {
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    double s = 0;
    for (const Var& p : params_)
      s += be.real() == DType::F64 ? sum_squares_cpu<double>(g_.grad(p)) : sum_squares_cpu<float>(g_.grad(p));
    return std::sqrt(s);
  }
  if (!vk_->norm_seq) {
    vk_->norm_seq = std::make_unique<vk::Sequence>(be.device());
    vk_->norm_seq->begin();
    record_norm(*vk_->norm_seq);
    vk_->norm_seq->end();
  }
  vk_->norm_seq->run();
  float s = 0;
  vk_->sumsq.download(&s, 4);
  return std::sqrt(double(s));
}

double AdamW::clip(double max_norm) {
  if (!(max_norm > 0)) throw std::invalid_argument("clip: max_norm = " + std::to_string(max_norm) + " must be > 0");
  Backend& be = g_.backend();
  if (be.is_cpu()) {
    const double norm = grad_norm();
    if (norm > max_norm)
      for (const Var& p : params_)
        be.real() == DType::F64 ? scale_cpu<double>(g_.grad(p), max_norm / norm)
                                : scale_cpu<float>(g_.grad(p), max_norm / norm);
    return norm;
  }
  // Norm and scaling in one submit: grad_norm_clip.comp reads the norm the reduce pass just wrote.
  if (!vk_->clip_seq || vk_->clip_recorded != max_norm) {
    vk_->clip_seq = std::make_unique<vk::Sequence>(be.device());
    vk::Sequence& seq = *vk_->clip_seq;
    seq.begin();
    record_norm(seq);
    seq.begin_independent();
    for (const Var& p : params_) {
      const Tensor& g = g_.grad(p);
      if (g.numel() == 0) continue;
      const ClipPush push{uint32_t(g.numel()), float(max_norm)};
      seq.dispatch(be.pipeline("grad_norm_clip", 2, sizeof(push)), {&g.buffer(), &vk_->sumsq}, push,
                   groups_for(g.numel(), 256));
    }
    seq.end_independent();
    seq.end();
    vk_->clip_recorded = max_norm;
  }
  vk_->clip_seq->run();
  float s = 0;
  vk_->sumsq.download(&s, 4);
  return std::sqrt(double(s));
}

std::vector<std::vector<float>> AdamW::export_moments(const std::vector<Tensor>& ts) const {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : ts) {
    const std::vector<double> d = g_.backend().to_host(t);
    out.emplace_back(d.begin(), d.end());
  }
  return out;
}

std::vector<std::vector<float>> AdamW::moments_m() const { return export_moments(m_); }
std::vector<std::vector<float>> AdamW::moments_v() const { return export_moments(v_); }

void AdamW::load_state(const std::vector<std::vector<float>>& m, const std::vector<std::vector<float>>& v,
                       int64_t t) {
  if (m.size() != params_.size() || v.size() != params_.size())
    throw std::invalid_argument("AdamW state: " + std::to_string(m.size()) + " m and " + std::to_string(v.size()) +
                                " v moments for " + std::to_string(params_.size()) + " parameters");
  if (t < 0) throw std::invalid_argument("AdamW state: step count t = " + std::to_string(t) + " must be >= 0");
  for (size_t k = 0; k < params_.size(); ++k) {
    const int64_t n = params_[k].value().numel();
    if (int64_t(m[k].size()) != n || int64_t(v[k].size()) != n)
      throw std::invalid_argument("AdamW state: parameter " + std::to_string(k) + " '" +
                                  g_.node(params_[k].id).name + "' has " + std::to_string(n) + " values, the state " +
                                  std::to_string(m[k].size()) + " (m) and " + std::to_string(v[k].size()) + " (v)");
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    g_.backend().upload(m_[k], m[k]);
    g_.backend().upload(v_[k], v[k]);
  }
  t_ = t;
}

}  // namespace q4t::ag
