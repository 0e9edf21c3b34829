// Gradient-check cases for compositions: the LoRA linear, one llama-style transformer block (every linear a frozen
// Q4_0 weight with a LoRA adapter), and the per-head q/k norm.
#include "autograd/gradcheck.h"
#include "autograd/lora.h"
#include "autograd/ops.h"

namespace q4t::ag {

namespace {

// A LoRA linear with random (non-zero) A and B, so that both receive a non-trivial gradient.
LoraLinear random_lora(Graph& g, std::mt19937& r, Var w, int64_t rank, const std::string& name, double dropout = 0) {
  Var a = random_param(g, r, {rank, w.shape()[1]}, name + ".lora_a", -0.5, 0.5);
  Var b = random_param(g, r, {w.shape()[0], rank}, name + ".lora_b", -0.5, 0.5);
  return LoraLinear(w, a, b, 0.75, dropout, 17);
}

Var lora_case(Graph& g, std::mt19937& r) {
  Var w = random_q4_0(g, r, 9, 64, "w");
  Var x = random_param(g, r, {5, 64}, "x");
  return random_lora(g, r, w, 3, "w", 0.25)(x);
}

// x -> x + o(attention(rope(q(n1(x))), rope(k(n1(x))), v(n1(x)))) -> + down(swiglu(gate(n2), up(n2))).
Var transformer_block_case(Graph& g, std::mt19937& r) {
  const int64_t T = 6, C = 32, H = 2, Hkv = 1, D = 16, F = 64, rank = 2;
  Var x = random_param(g, r, {T, C}, "x");
  Var attn_norm = random_constant(g, r, {C}, "attn_norm", 0.5, 1.5);
  Var ffn_norm = random_constant(g, r, {C}, "ffn_norm", 0.5, 1.5);
  auto proj = [&](int64_t n_out, int64_t n_in, const std::string& name) {
    return random_lora(g, r, random_q4_0(g, r, n_out, n_in, name), rank, name);
  };
  const LoraLinear q = proj(H * D, C, "q"), k = proj(Hkv * D, C, "k"), v = proj(Hkv * D, C, "v"),
                   o = proj(C, H * D, "o"), gate = proj(F, C, "gate"), up = proj(F, C, "up"),
                   down = proj(C, F, "down");
  Var h = rms_norm(x, attn_norm, 1e-5);
  Var qr = rope(q(h), H, D, RopeMode::Norm, 10000.0, 3);
  Var kr = rope(k(h), Hkv, D, RopeMode::Norm, 10000.0, 3);
  Var x2 = add(x, o(attention(qr, kr, v(h), H, Hkv)));
  Var h2 = rms_norm(x2, ffn_norm, 1e-5);
  return add(x2, down(swiglu(gate(h2), up(h2))));
}

// qwen3's and gemma3's per-head q/k norm, then scaled RoPE: x [T, H*D] as [T*H, D] rows, RMSNorm with a [D] weight,
// back to [T, H*D], rotated by a table with per-pair factors and mscale != 1.
Var qk_norm_case(Graph& g, std::mt19937& r) {
  const int64_t T = 4, H = 3, D = 8;
  Var x = random_param(g, r, {T, H * D}, "q");
  Var w = random_param(g, r, {D}, "q_norm", 0.5, 1.5);
  Var n = reshape(rms_norm(reshape(x, {T * H, D}), w, 1e-6), {T, H * D});
  RopeFreqs f = RopeFreqs::plain(D, 1e6);
  f.freq[3] /= 8.0;
  f.mscale = 1.2;
  return rope(n, H, D, RopeMode::Neox, f, 5);
}

void add_cases(std::vector<GradcheckCase>& out) {
  out.push_back({"q/k norm per head, then scaled rope (qwen3)", qk_norm_case});
  out.push_back({"lora_linear (q4_0, dropout 0.25)", lora_case});
  out.push_back({"transformer_block (llama, q4_0 + LoRA on all 7 targets)", transformer_block_case});
}

const OpRegistration kRegistration({}, add_cases);

}  // namespace

}  // namespace q4t::ag
