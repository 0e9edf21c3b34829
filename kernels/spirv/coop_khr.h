#pragma once
// Rewrites a SPIR-V module's SPV_NV_cooperative_matrix instructions as their SPV_KHR_cooperative_matrix twins, so
// that shaders written for Debian 12's glslang (which compiles GL_NV_cooperative_matrix but rejects
// GL_KHR_cooperative_matrix) run on VK_KHR_cooperative_matrix. What changes:
//   - the capability and the extension name;
//   - each matrix type gains its use (A, B or accumulator), read off the operands of the multiply-adds that take
//     its values; a type that no multiply-add takes is an accumulator. One type serving as both A and B is an error
//     (give B's rows a specialization constant, so that its type is another id);
//   - loads and stores take their layout as a constant (row-major 0, column-major 1) before the stride, where NV
//     takes a boolean after it; multiply-add and length change only their opcodes;
//   - a length that glslang wrote as a specialization constant (OpSpecConstantOp, which the NVIDIA driver's
//     compiler does not survive in KHR form) becomes an instruction at the top of the module's one function, with
//     the OpSpecConstantOps computed from it.
// Everything else passes through word for word. Errors name what was found (std::runtime_error).
#include <cstdint>
#include <span>
#include <vector>

namespace q4t::spirv {

std::vector<uint32_t> nv_to_khr_coopmat(std::span<const uint32_t> module);

}  // namespace q4t::spirv
