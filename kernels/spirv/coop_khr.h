#pragma once
// Rewrites a SPIR-V module's SPV_NV_cooperative_matrix instructions as SPV_KHR_cooperative_matrix ones, so that
// shaders written for Debian 12's glslang (GL_NV_cooperative_matrix only) run on VK_KHR_cooperative_matrix:
//   - the capability and the extension name;
//   - each matrix type gains its use (A, B or accumulator) from the multiply-adds that take its values (none: an
//     accumulator). One type as both A and B is an error: give B's rows a specialization constant;
//   - loads and stores take their layout as a constant before the stride (NV: a boolean after it); multiply-add
//     and length change opcodes;
//   - a length written as OpSpecConstantOp (the NVIDIA driver's compiler crashes on it in KHR form) becomes an
//     instruction at the top of the module's one function, with the OpSpecConstantOps computed from it.
// Everything else passes word for word. Errors (std::runtime_error) name what was found.
#include <cstdint>
#include <span>
#include <vector>

namespace q4t::spirv {

std::vector<uint32_t> nv_to_khr_coopmat(std::span<const uint32_t> module);

}  // namespace q4t::spirv
