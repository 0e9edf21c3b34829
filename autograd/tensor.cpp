#include "autograd/tensor.h"

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

size_t storage_bytes(DType t, const Shape& s) {
  switch (t) {
    case DType::F32:
    case DType::I32: return size_t(numel(s)) * 4;
    case DType::F64: return size_t(numel(s)) * 8;
    case DType::Q4_0:
    case DType::Q8_0: {
      if (s.size() != 2 || s[1] % kQ4_0BlockElems != 0)  // Q8_0 blocks are 32 wide too
        throw GraphError(std::string("a ") + dtype_name(t) +
                         " tensor must be a matrix [rows, cols] with cols a multiple of 32, not " + shape_str(s));
      return size_t(s[0] * (t == DType::Q4_0 ? q4_0_row_bytes(s[1]) : q8_0_row_bytes(s[1])));
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

}  // namespace q4t::ag
