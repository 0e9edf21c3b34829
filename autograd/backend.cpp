#include "autograd/backend.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/quant/k_quants.h"
#include "kernels/shapes.h"

namespace q4t::ag {

std::unique_ptr<Backend> Backend::cpu(DType real, Precision precision) {
  if (!is_real(real)) throw GraphError("a CPU backend computes in f32 or f64");
  if (real == DType::F64 && precision == Precision::Mixed) throw GraphError("a CPU backend in f64 has no mixed precision");
  std::unique_ptr<Backend> b(new Backend());
  b->real_ = real;
  b->cpu_precision_ = precision;
  return b;
}

std::unique_ptr<Backend> Backend::vulkan(vk::Device& dev, Precision precision) {
  std::unique_ptr<Backend> b(new Backend());
  b->vk_ = &dev;
  b->linear_ = std::make_unique<vk::LinearKernels>(dev);
  b->linear_->set_precision(precision);
  return b;
}

std::string Backend::name() const {
  if (vk_) return vk_->name();
  return real_ == DType::F64 ? "cpu (f64)" : cpu_precision_ == Precision::Mixed ? "cpu (mixed)" : "cpu";
}

namespace {
std::shared_ptr<Storage> new_storage(const vk::Device* dev, const Shape& shape, DType dtype) {
  if (dtype == DType::F64 && dev) throw GraphError("f64 tensors exist only on the CPU");
  for (int64_t d : shape)
    if (d <= 0) throw GraphError("tensor shape " + shape_str(shape) + " has a non-positive dimension");
  auto st = std::make_shared<Storage>();
  st->bytes = storage_bytes(dtype, shape);
  // A frozen matrix on the device: its format's device layout (kernels/formats.h).
  if (dev && is_frozen_storage(dtype))
    st->bytes = size_t(device_weight_bytes(frozen_format(dtype), shape[0], shape[1]));
  return st;
}
constexpr size_t kHostAlignment = 64;
}  // namespace

Tensor Backend::empty(const Shape& shape, DType dtype) {
  auto st = new_storage(vk_, shape, dtype);
  if (vk_)
    st->buffer = std::make_unique<vk::Buffer>(*vk_, st->bytes);
  else
    st->host.resize(st->bytes);
  return Tensor(shape, dtype, std::move(st));
}

Tensor Backend::unplaced(const Shape& shape, DType dtype) {
  auto st = new_storage(vk_, shape, dtype);
  if (vk_) st->buffer = std::make_unique<vk::Buffer>(*vk_, st->bytes, vk::Buffer::Unplaced{});
  return Tensor(shape, dtype, std::move(st));
}

size_t Backend::placement_alignment(const Tensor& t) const {
  return vk_ ? size_t(t.buffer().requirements().alignment) : kHostAlignment;
}

void Backend::place(const std::vector<std::pair<Tensor, size_t>>& at, size_t bytes) {
  if (!vk_) {
    // Over-allocated by the alignment, the base rounded up to it: every offset the plan gives is a multiple.
    auto arena = std::make_shared<std::vector<std::max_align_t>>((bytes + sizeof(std::max_align_t) - 1) /
                                                                   sizeof(std::max_align_t) + kHostAlignment);
    auto* base = reinterpret_cast<std::byte*>(arena->data());
    base += (kHostAlignment - reinterpret_cast<uintptr_t>(base) % kHostAlignment) % kHostAlignment;
    for (const auto& [t, offset] : at) {
      Storage& st = t.storage();
      if (st.placed || !st.host.empty()) throw std::logic_error("Backend::place: tensor already has memory");
      st.placed = base + offset;
      st.arena = arena;
    }
    return;
  }
  uint32_t type_bits = ~0u;
  for (const auto& [t, offset] : at) type_bits &= t.buffer().requirements().memoryTypeBits;
  auto arena = std::make_shared<vk::Arena>(*vk_, bytes, type_bits);
  for (const auto& [t, offset] : at) {
    Storage& st = t.storage();
    st.buffer->place(*arena, offset);
    st.arena = arena;
  }
}

Tensor Backend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (vk_)
    const_cast<vk::Buffer&>(t.buffer()).fill_zero();
  else
    std::memset(t.data<std::byte>(), 0, t.bytes());
  return t;
}

namespace {
template <class Src>
void write_real(Backend& be, Tensor& t, std::span<const Src> v) {
  if (size_t(t.numel()) != v.size())
    throw GraphError("upload of " + std::to_string(v.size()) + " values into a tensor of shape " +
                     shape_str(t.shape()));
  if (t.dtype() == DType::F64) {
    double* d = t.data<double>();
    for (size_t i = 0; i < v.size(); ++i) d[i] = double(v[i]);
    return;
  }
  if (t.dtype() != DType::F32) throw GraphError(std::string("cannot upload reals into a ") + dtype_name(t.dtype()) + " tensor");
  std::vector<float> f(v.begin(), v.end());
  if (t.on_host())
    std::memcpy(t.data<float>(), f.data(), f.size() * 4);
  else
    const_cast<vk::Buffer&>(t.buffer()).upload(f.data(), f.size() * 4);
  (void)be;
}
}  // namespace

Tensor Backend::from_host(std::span<const float> v, const Shape& shape) {
  Tensor t = empty(shape, real_);
  write_real(*this, t, v);
  return t;
}

Tensor Backend::from_host(std::span<const double> v, const Shape& shape) {
  Tensor t = empty(shape, real_);
  write_real(*this, t, v);
  return t;
}

void Backend::upload(Tensor& t, std::span<const float> v) { write_real(*this, t, v); }

Tensor Backend::from_host_i32(std::span<const int32_t> v, const Shape& shape) {
  Tensor t = empty(shape, DType::I32);
  upload_i32(t, v);
  return t;
}

void Backend::upload_i32(Tensor& t, std::span<const int32_t> v) {
  if (t.dtype() != DType::I32 || size_t(t.numel()) != v.size())
    throw GraphError("upload of " + std::to_string(v.size()) + " ids into a " + dtype_name(t.dtype()) + " tensor " +
                     shape_str(t.shape()));
  if (t.on_host())
    std::memcpy(t.data<int32_t>(), v.data(), v.size_bytes());
  else
    const_cast<vk::Buffer&>(t.buffer()).upload(v.data(), v.size_bytes());
}

Tensor Backend::quantized(std::span<const uint8_t> bytes, const Shape& shape, DType dtype) {
  if (!is_frozen_storage(dtype))
    throw GraphError(std::string("Backend::quantized: ") + dtype_name(dtype) +
                     " is not a frozen weight storage (a format of kernels/formats.h)");
  Tensor t = empty(shape, dtype);
  if (bytes.size() != t.bytes())
    throw GraphError(std::string(dtype_name(dtype)) + " tensor " + shape_str(shape) + " needs " +
                     std::to_string(t.bytes()) + " bytes, got " + std::to_string(bytes.size()));
  if (t.on_host()) {
    std::memcpy(t.data<uint8_t>(), bytes.data(), bytes.size());
  } else if (format_traits(frozen_format(dtype)).grouped) {
    const std::vector<uint8_t> grouped = to_device_layout(frozen_format(dtype), bytes);
    const_cast<vk::Buffer&>(t.buffer()).upload(grouped.data(), grouped.size());
  } else {
    const_cast<vk::Buffer&>(t.buffer()).upload(bytes.data(), bytes.size());
  }
  return t;
}

std::vector<uint8_t> Backend::raw_bytes(const Tensor& t) const {
  std::vector<uint8_t> out(t.bytes());
  if (t.on_host()) {
    std::memcpy(out.data(), t.data<uint8_t>(), out.size());
  } else if (is_frozen_storage(t.dtype()) && format_traits(frozen_format(t.dtype())).grouped) {
    const FormatTraits& f = format_traits(frozen_format(t.dtype()));
    std::vector<uint8_t> grouped(t.storage().bytes);
    t.buffer().download(grouped.data(), grouped.size());
    out = from_device_layout(f.format, grouped, int64_t(out.size()) / f.block_bytes);
  } else {
    t.buffer().download(out.data(), out.size());
  }
  return out;
}

std::vector<double> Backend::to_host(const Tensor& t) const {
  const size_t n = size_t(t.numel());
  std::vector<double> out(n);
  if (t.dtype() == DType::F64) {
    std::memcpy(out.data(), t.data<double>(), n * 8);
    return out;
  }
  if (t.dtype() == DType::I32) {
    std::vector<int32_t> v(n);
    if (t.on_host()) std::memcpy(v.data(), t.data<int32_t>(), n * 4);
    else t.buffer().download(v.data(), n * 4);
    for (size_t i = 0; i < n; ++i) out[i] = v[i];
    return out;
  }
  if (t.dtype() != DType::F32) throw GraphError(std::string("to_host of a ") + dtype_name(t.dtype()) + " tensor");
  std::vector<float> f(n);
  if (t.on_host()) std::memcpy(f.data(), t.data<float>(), n * 4);
  else t.buffer().download(f.data(), n * 4);
  for (size_t i = 0; i < n; ++i) out[i] = f[i];
  return out;
}

const vk::Pipeline& Backend::pipeline(const std::string& shader, uint32_t n_buffers, uint32_t push_bytes,
                                      const std::vector<uint32_t>& spec) {
  std::string key = shader;
  for (uint32_t v : spec) key += ":" + std::to_string(v);
  auto& slot = pipelines_[key];
  if (!slot) slot = std::make_unique<vk::Pipeline>(*vk_, shader, n_buffers, push_bytes, spec);
  return *slot;
}

}  // namespace q4t::ag
