// 8-bit integer dot products (SPV_KHR_integer_dot_product, "4x8 packed": four bytes of each 32-bit operand
// multiplied pairwise and summed in one instruction), declared through GL_EXT_spirv_intrinsics because Debian's
// glslang 12 has no GL_EXT_integer_dot_product. Only devices with Device::integer_dot run these shaders.
// The activations they take are "limbs" (x_limbs.comp): each float of a group of x becomes a 24-bit integer A
// at the group's scale s = max|x| / (2^23 - 1), so |x - s·A| <= s / 2 (the rounding of f32 at the group's
// largest element), kept as three byte planes: A = L0 + 2^8·L1 + 2^16·L2 with L0, L1 unsigned and L2 signed.
// A dot product of weights q (bytes 0..15) with x is then s·(Σ q·L0 + 2^8·Σ q·L1 + 2^16·Σ q·L2).
// Under the mixed precision the limbs are two (LIMBS = 2, the same specialisation constant in x_limbs.comp and
// the GEMV): A is a 16-bit integer at s = max|x| / (2^15 - 1), A = L0 + 2^8·L1 with L1 signed, which keeps more
// of x than f16 does wherever the group's values are within 2^5 of its largest, and the products take one dot
// instruction in three fewer. The functions below then leave the third sum 0.

spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4451)
uint dot_u8x4(uint a, uint b, spirv_literal int packed_format);  // OpUDotKHR
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int dot_s8x4_u8x4(uint a, uint b, spirv_literal int packed_format);  // OpSUDotKHR: a signed, b unsigned

spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dot_s8x4(uint a, uint b, spirv_literal int packed_format);  // OpSDotKHR: both signed

const int PACKED_4X8 = 0;  // PackedVectorFormat4x8BitKHR

// The scratch buffer of a limb set for n_in activations, in 32-bit words (P = n_in / 4 words per plane):
//   [0, 3P)                  the planes L0, L1, L2, one byte per activation, in the format's order;
//   [3P, 3P + n_in/32)       the group scales s (Q4_0: one per 32 activations; Q4_K: one per 256);
//   [3P + n_in/32, + n_in/16) Σ x of each piece (Q4_0: per 32; Q4_K: per 16, in slot order) as f32.
// Q4_0 keeps x's order. Q4_K reorders each 256-block into 16 slots of 16 bytes: slot 2c + h holds x[64c + 16h
// .. + 16) (the low nibbles of the block's uvec4 1 + 2c + h), slot 8 + 2c + h holds x[64c + 32 + 16h .. + 16)
// (its high nibbles), so the invocations of q4_k_gemv_dot.comp read neighbouring uvec4s. Q6_K reorders each
// 256-block into the 8 units of q6_k_gemv_dot.comp, 32 bytes each: unit 4h + g holds x[128h + 32·k4 + 8g ..
// + 8) for k4 = 0..3 (Q6_K needs no sums).

layout(constant_id = 3) const uint LIMBS = 3u;  // ids 0-2: the GEMVs' workgroup and rows

// Σ q·L for weights q (4 bytes 0..15) against limb plane words l0, l1, l2: the three partial sums.
ivec3 limb_dot(uint q, uint l0, uint l1, uint l2) {
  if (LIMBS == 2u) return ivec3(int(dot_u8x4(q, l0, PACKED_4X8)), dot_s8x4_u8x4(l1, q, PACKED_4X8), 0);
  return ivec3(int(dot_u8x4(q, l0, PACKED_4X8)), int(dot_u8x4(q, l1, PACKED_4X8)),
               dot_s8x4_u8x4(l2, q, PACKED_4X8));
}

// The same for signed weights (bytes -128..127).
ivec3 limb_dot_signed(uint q, uint l0, uint l1, uint l2) {
  if (LIMBS == 2u) return ivec3(dot_s8x4_u8x4(q, l0, PACKED_4X8), dot_s8x4(q, l1, PACKED_4X8), 0);
  return ivec3(dot_s8x4_u8x4(q, l0, PACKED_4X8), dot_s8x4_u8x4(q, l1, PACKED_4X8), dot_s8x4(q, l2, PACKED_4X8));
}

// i.x + 2^8·i.y + 2^16·i.z as a float, for 0 <= i.x, i.y < 2^23 and |i.z| < 2^22 (the callers' sums stay
// there; with two limbs i.y is the signed one, |i.y| < 2^22, and i.z is 0): each part exact through the mantissa
// of 2^23 (2^23 + 2^22 for a signed one), one add each.
float limb_value(ivec3 i) {
  const float lo = uintBitsToFloat(uint(i.x) | 0x4B000000u) - 8388608.0;
  const float mid = LIMBS == 2u ? uintBitsToFloat(uint(i.y + 0x4B400000)) - 12582912.0
                                : uintBitsToFloat(uint(i.y) | 0x4B000000u) - 8388608.0;
  const float hi = uintBitsToFloat(uint(i.z + 0x4B400000)) - 12582912.0;
  return (lo + 256.0 * mid) + 65536.0 * hi;
}

// The same for sums of either sign, |i.x|, |i.y|, |i.z| < 2^22 (weights times signed scales): each part exact.
float limb_value_signed22(ivec3 i) {
  const float lo = uintBitsToFloat(uint(i.x + 0x4B400000)) - 12582912.0;
  const float mid = uintBitsToFloat(uint(i.y + 0x4B400000)) - 12582912.0;
  const float hi = uintBitsToFloat(uint(i.z + 0x4B400000)) - 12582912.0;
  return (lo + 256.0 * mid) + 65536.0 * hi;
}
