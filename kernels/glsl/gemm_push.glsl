// Push constants shared by every tiled GEMM (kernels/vulkan/linear_kernels.cpp: GemmPush).
layout(push_constant) uniform Push {
  uint M;
  uint N;
  uint k_begin;  // K range [k_begin, k_end): the dx kernels use it for the output-row tile j_start..j_end
  uint k_end;
  uint lda;      // row stride of A as stored
  uint ldb;      // row stride of B as stored (f32 B only); q4_0_gemm_coop.comp with A_SPLIT: where A starts (uvec4s)
  uint accumulate;
  uint k_slice;  // 0, or split K: workgroup z covers [k_begin + z·k_slice, +k_slice) into C + z·M·N (see gemm_tiled.glsl)
  uint row0;     // the tensor-core Q4_0 GEMM's first row of W (a window of rows: the vocab-tiled loss); 0 elsewhere
  float alpha;   // gemm_tiled.glsl: C = (accumulate ? C : 0) + alpha·A·B (LoRA's scale); 1 for the frozen GEMMs
} p;
#define GEMM_ALPHA p.alpha
