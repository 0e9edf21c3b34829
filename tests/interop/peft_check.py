#!/usr/bin/env python3
"""Loads q4tune's PEFT export into PyTorch and compares the logits with q4tune's.

  python3 peft_check.py --model M.gguf --peft DIR --ids-file ids.json --logits q4tune.json
                        [--base-logits q4tune_base.json] [--out result.json]

Builds a LlamaForCausalLM (or Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM) from the GGUF's weights, dequantised here (f32, f16, q8_0,
q4_0; a small reader of its own, no gguf package), with llama's q/k weight rows un-permuted back to HF order
(llama.cpp's converter permuted them for RoPE on adjacent pairs; qwen2 is not permuted). With --base-logits,
first checks the bare model against q4tune without an adapter. Then loads DIR with peft.PeftModel and prints
max|torch - q4tune| / max|q4tune| (worst position) as one JSON line, also written to --out.
ids.json: a JSON array of ids (or {"ids": [...]}); logits files: {"logits": [[n_vocab] per position]}.
"""
import argparse
import json
import struct

import numpy as np
import torch

# GGUF metadata value types: struct format of the scalars; 8 = string, 9 = array.
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def take(self, fmt):
        (v,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8")
        self.at += n
        return s

    def value(self, t):
        if t in SCALAR:
            return self.take(SCALAR[t])
        if t == 8:
            return self.string()
        if t == 9:
            elem, n = self.take("<I"), self.take("<Q")
            return [self.value(elem) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")


def dequantize(raw, ggml_type, n):
    if ggml_type == 0:  # f32
        return np.frombuffer(raw, dtype="<f4", count=n).copy()
    if ggml_type == 1:  # f16
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32)
    if ggml_type == 2:  # q4_0: f16 d, 16 bytes; weight j < 16 = (lo nibble of byte j - 8)·d, j >= 16 the hi nibble
        blocks = np.frombuffer(raw, dtype=np.uint8, count=n // 32 * 18).reshape(-1, 18)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        qs = blocks[:, 2:]
        q = np.concatenate([(qs & 0xF).astype(np.float32) - 8, (qs >> 4).astype(np.float32) - 8], axis=1)
        return (q * d).reshape(-1)
    if ggml_type == 8:  # q8_0: f16 d, 32 int8
        blocks = np.frombuffer(raw, dtype=np.uint8, count=n // 32 * 34).reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        return (blocks[:, 2:].copy().view(np.int8).astype(np.float32) * d).reshape(-1)
    raise ValueError(f"no dequantiser for GGML type {ggml_type}")


BLOCK_BYTES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34)}  # type: (elements, bytes) per block


def read_gguf(path):
    buf = memoryview(open(path, "rb").read())
    r = Reader(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.at = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kv[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, ne, r.take("<I"), r.take("<Q")))
    align = kv.get("general.alignment", 32)
    data_start = (r.at + align - 1) // align * align
    tensors = {}
    for name, ne, t, offset in infos:
        n = int(np.prod(ne))
        per_block, block_bytes = BLOCK_BYTES[t]
        begin = data_start + offset
        raw = buf[begin:begin + n // per_block * block_bytes]
        tensors[name] = torch.from_numpy(dequantize(raw, t, n).reshape(list(reversed(ne))))
    return kv, tensors


def unpermute_rows(w, n_head):
    # GGUF row h·hd + 2j + s holds HF row h·hd + s·hd/2 + j: undo reshape(n_head, 2, hd/2, ...).swapaxes(1, 2).
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def build_model(path):
    import transformers
    kv, t = read_gguf(path)
    arch = kv["general.architecture"]
    a = lambda k, d=None: kv.get(f"{arch}.{k}", d)
    n_head = a("attention.head_count")
    n_head_kv = a("attention.head_count_kv", n_head)
    n_embd = a("embedding_length")
    tied = "output.weight" not in t
    common = dict(vocab_size=t["token_embd.weight"].shape[0], hidden_size=n_embd,
                  intermediate_size=a("feed_forward_length"), num_hidden_layers=a("block_count"),
                  num_attention_heads=n_head, num_key_value_heads=n_head_kv,
                  max_position_embeddings=a("context_length", 2048), rms_norm_eps=a("attention.layer_norm_rms_epsilon"),
                  rope_theta=a("rope.freq_base", 10000.0), tie_word_embeddings=tied, hidden_act="silu",
                  torch_dtype=torch.float32, attn_implementation="eager")
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, attention_bias=False))
    elif arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, use_sliding_window=False))
    elif arch == "qwen3":
        head_dim = a("attention.key_length", n_embd // n_head)
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=head_dim, attention_bias=False,
                                                                       use_sliding_window=False))
    elif arch in ("gemma2", "gemma3"):
        head_dim = a("attention.key_length", n_embd // n_head)
        n_layer = a("block_count")
        window = a("attention.sliding_window", 4096 if arch == "gemma2" else 0)
        pattern = a("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
        local = [window > 0 and (pattern == 0 or l % pattern < pattern - 1) for l in range(n_layer)]
        g = dict(common, head_dim=head_dim, hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                 query_pre_attn_scalar=head_dim, sliding_window=max(window, 1),
                 layer_types=["sliding_attention" if x else "full_attention" for x in local])
        g.pop("hidden_act")
        if arch == "gemma2":
            model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
                **g, attn_logit_softcapping=a("attn_logit_softcapping", 50.0),
                final_logit_softcapping=a("final_logit_softcapping", 30.0)))
        else:
            if a("rope.freq_base_swa", 10000.0) != a("rope.freq_base", 10000.0) or a("rope.scaling.type"):
                raise ValueError("this check builds gemma3 with one RoPE base and no scaling")
            cfg = transformers.Gemma3TextConfig(**g, final_logit_softcapping=a("final_logit_softcapping"),
                                                attn_logit_softcapping=None)
            model = transformers.Gemma3ForCausalLM(cfg)
    elif arch == "phi3":
        if "rope_factors_long.weight" in t or "rope_factors_short.weight" in t:
            raise ValueError("this check builds phi3 without LongRoPE factors")
        model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**common, sliding_window=None, pad_token_id=None))
    else:
        raise ValueError(f"architecture {arch} is not supported")
    sd = {"model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"]}
    if not tied:
        sd["lm_head.weight"] = t["output.weight"]
    gemma = arch in ("gemma2", "gemma3")
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    if arch == "phi3":  # the fused projections: q, k, v rows in one matrix, the gate then the up half in another
        names.update({"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"})
    if gemma:  # gemma's norm after the attention is HF's post_attention_layernorm, its ffn_norm pre_feedforward_
        names.update({"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"})
        # HF's Gemma RMSNorm multiplies by 1 + w; the GGUF converter stored 1 + w.
        for name in list(t):
            if name.endswith("norm.weight"):
                t[name] = t[name] - 1.0
        sd["model.norm.weight"] = t["output_norm.weight"]
    for name, w in t.items():
        parts = name.split(".")  # blk.N.attn_q.weight
        if parts[0] != "blk":
            continue
        if arch == "llama" and parts[2] in ("attn_q", "attn_k") and parts[3] == "weight":
            w = unpermute_rows(w, n_head if parts[2] == "attn_q" else n_head_kv)
        sd[f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"] = w
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or [k for k in missing if not (tied and k == "lm_head.weight")]:
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()
    return model.eval()


def worst_ratio(got, want):
    diff = (got - want).abs().max(dim=1).values
    scale = want.abs().max(dim=1).values
    ratios = diff / scale
    p = int(ratios.argmax())
    return float(ratios[p]), p


def load_logits(path):
    return torch.tensor(json.load(open(path))["logits"], dtype=torch.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--peft", required=True)
    ap.add_argument("--ids-file", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--base-logits")
    ap.add_argument("--out")
    args = ap.parse_args()
    ids = json.load(open(args.ids_file))
    ids = ids["ids"] if isinstance(ids, dict) else ids
    x = torch.tensor([ids], dtype=torch.long)
    torch.manual_seed(0)
    model = build_model(args.model)
    result = {}
    with torch.no_grad():
        if args.base_logits:
            result["base_ratio"], result["base_position"] = worst_ratio(
                model(input_ids=x).logits[0].double(), load_logits(args.base_logits))
        import peft
        adapted = peft.PeftModel.from_pretrained(model, args.peft, is_trainable=False).eval()
        result["ratio"], result["position"] = worst_ratio(adapted(input_ids=x).logits[0].double(),
                                                          load_logits(args.logits))
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
