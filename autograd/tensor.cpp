#include "autograd/tensor.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/quant/f16.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/q4_0.h"
#include "kernels/quant/q8_0.h"
#include "kernels/shapes.h"

namespace q4t::ag {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::Q4_0: return "q4_0";
    case DType::Q8_0: return "q8_0";
    case DType::F16: return "f16";
    case DType::Q4_K: return "q4_k";
    case DType::Q6_K: return "q6_k";
  }
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
  switch (t) {
    case DType::Q4_0: return kQ4_0BlockElems;
    case DType::Q8_0: return kQ8_0BlockElems;
    case DType::Q4_K:
    case DType::Q6_K: return kQK_KBlockElems;
    default: return 1;
  }
}

size_t storage_bytes(DType t, const Shape& s) {
  switch (t) {
    case DType::F32:
    case DType::I32: return size_t(numel(s)) * 4;
    case DType::F64: return size_t(numel(s)) * 8;
    case DType::Q4_0:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q6_K: {
      const int64_t block = block_elems(t);
      if (s.size() != 2 || s[1] % block != 0)
        throw GraphError(std::string("a ") + dtype_name(t) + " tensor must be a matrix [rows, cols] with cols a " +
                         "multiple of " + std::to_string(block) + ", not " + shape_str(s));
      const int64_t row = t == DType::Q4_0   ? q4_0_row_bytes(s[1])
                          : t == DType::Q8_0 ? q8_0_row_bytes(s[1])
                          : t == DType::Q4_K ? q4_k_row_bytes(s[1])
                                             : q6_k_row_bytes(s[1]);
      return size_t(s[0] * row);
    }
    case DType::F16: return size_t(numel(s)) * 2;
  }
  return 0;
}

Tensor Tensor::view(Shape shape) const {
  if (is_frozen_storage(dtype_))
    throw GraphError(std::string("cannot reshape a frozen ") + dtype_name(dtype_) + " weight tensor");
  if (ag::numel(shape) != numel())
    throw GraphError("cannot view " + shape_str(shape_) + " as " + shape_str(shape) + ": element counts differ");
  return Tensor(std::move(shape), dtype_, storage_);
}

Format frozen_format(DType t) {
  switch (t) {
    case DType::Q4_0: return Format::Q4_0;
    case DType::Q8_0: return Format::Q8_0;
    case DType::Q4_K: return Format::Q4_K;
    case DType::Q6_K: return Format::Q6_K;
    case DType::F16: return Format::F16;
    default: throw GraphError(std::string("frozen_format: ") + dtype_name(t) + " is not a frozen storage type");
  }
}

int64_t frozen_row_bytes(DType t, int64_t cols) {
  switch (t) {
    case DType::Q4_0: return q4_0_row_bytes(cols);
    case DType::Q8_0: return q8_0_row_bytes(cols);
    case DType::Q4_K: return q4_k_row_bytes(cols);
    case DType::Q6_K: return q6_k_row_bytes(cols);
    case DType::F16: return f16_row_bytes(cols);
    default: throw GraphError(std::string("frozen_row_bytes: ") + dtype_name(t) + " is not a frozen storage type");
  }
}

namespace {

// The row's bytes copied into real blocks first: rows carry no alignment.
template <class Block, class T>
void dequantize_blocks(T* out, const uint8_t* row, int64_t cols, int64_t block_elems,
                       void (*dequantize)(T*, const Block*, int64_t)) {
  std::vector<Block> blocks(size_t(cols / block_elems));
  std::memcpy(blocks.data(), row, blocks.size() * sizeof(Block));
  dequantize(out, blocks.data(), cols);
}

template <class T>
void matrix_row_as(T* out, const Tensor& m, int64_t r) {
  const int64_t cols = m.dim(1);
  const DType t = m.dtype();
  if (!is_frozen_storage(t)) {
    const T* src = m.data<T>() + r * cols;
    std::copy(src, src + cols, out);
    return;
  }
  const uint8_t* row = m.data<uint8_t>() + r * frozen_row_bytes(t, cols);
  using namespace quant;
  switch (t) {
    case DType::Q4_0: return dequantize_blocks<BlockQ4_0, T>(out, row, cols, kQ4_0BlockElems, dequantize_row_q4_0);
    case DType::Q8_0: return dequantize_blocks<BlockQ8_0, T>(out, row, cols, kQ8_0BlockElems, dequantize_row_q8_0);
    case DType::Q4_K: return dequantize_blocks<BlockQ4_K, T>(out, row, cols, kQK_KBlockElems, dequantize_row_q4_k);
    case DType::Q6_K: return dequantize_blocks<BlockQ6_K, T>(out, row, cols, kQK_KBlockElems, dequantize_row_q6_k);
    default:
      if constexpr (std::is_same_v<T, double>)
        return f16_row_to_f64(out, row, cols);
      else
        return f16_row_to_f32(out, row, cols);
  }
}

}  // namespace

void matrix_row(float* out, const Tensor& m, int64_t r) { matrix_row_as(out, m, r); }
void matrix_row(double* out, const Tensor& m, int64_t r) { matrix_row_as(out, m, r); }

}  // namespace q4t::ag
