#include "autograd/tensor.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>


namespace q4t::ag {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
  }
  if (const FormatTraits* f = find_format(uint32_t(t))) return f->name;
  return "?";
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t block_elems(DType t) {
  const FormatTraits* f = find_format(uint32_t(t));
  return f ? f->block_elems : 1;
}

size_t storage_bytes(DType t, const Shape& s) {
  switch (t) {
    case DType::F32:
    case DType::I32: return size_t(numel(s)) * 4;
    case DType::F64: return size_t(numel(s)) * 8;
  }
  const Format f = frozen_format(t);
  const int64_t block = block_elems(t);
  if (s.size() != 2 || s[1] % block != 0)
    throw GraphError(std::string("a ") + dtype_name(t) + " tensor must be a matrix [rows, cols] with cols a " +
                     "multiple of " + std::to_string(block) + ", not " + shape_str(s));
  return size_t(s[0] * row_bytes(f, s[1]));
}

Tensor Tensor::view(Shape shape) const {
  if (is_frozen_storage(dtype_))
    throw GraphError(std::string("cannot reshape a frozen ") + dtype_name(dtype_) + " weight tensor");
  if (ag::numel(shape) != numel())
    throw GraphError("cannot view " + shape_str(shape_) + " as " + shape_str(shape) + ": element counts differ");
  return Tensor(std::move(shape), dtype_, storage_);
}

Format frozen_format(DType t) {
  if (!is_frozen_storage(t))
    throw GraphError(std::string("frozen_format: ") + dtype_name(t) + " is not a frozen storage type");
  return Format(uint32_t(t));
}

int64_t frozen_row_bytes(DType t, int64_t cols) { return row_bytes(frozen_format(t), cols); }

namespace {

template <class T>
void matrix_row_as(T* out, const Tensor& m, int64_t r) {
  const int64_t cols = m.dim(1);
  const DType t = m.dtype();
  if (!is_frozen_storage(t)) {
    const T* src = m.data<T>() + r * cols;
    std::copy(src, src + cols, out);
    return;
  }
  // A copy of the row first: rows carry no alignment.
  const Format f = frozen_format(t);
  const int64_t rb = frozen_row_bytes(t, cols);
  const uint8_t* row = m.data<uint8_t>() + r * rb;
  std::vector<uint8_t> bytes(row, row + rb);
  if constexpr (std::is_same_v<T, double>)
    format_traits(f).dequantize_row_f64(out, bytes.data(), cols);
  else
    format_traits(f).dequantize_row(out, bytes.data(), cols);
}

}  // namespace

void matrix_row(float* out, const Tensor& m, int64_t r) { matrix_row_as(out, m, r); }
void matrix_row(double* out, const Tensor& m, int64_t r) { matrix_row_as(out, m, r); }

}  // namespace q4t::ag
