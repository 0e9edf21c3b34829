#!/usr/bin/env bash
# Mixed precision measured on a GPU with cooperative matrices, in four parts that each fit one call of a lent
# machine; CI does not run this (it has no such GPU). From the repository root, with q4tune on PATH and, for the
# training parts, python3 with torch, transformers and peft:
#   tests/device/mixed_precision.sh kernels   OUT  # every format's GEMM and dx at T = 512 against f16_coop_gemm
#   tests/device/mixed_precision.sh numerics  OUT  # logits, the demo's loss curve and gradcheck: mixed against f32
#   tests/device/mixed_precision.sh tinyllama OUT  # bench train against PyTorch + PEFT, 3 rounds interleaved
#   tests/device/mixed_precision.sh llama-7b  OUT
# PEFT=path/to/peft_lora_bench.py names the peer's script (default .dev/peft_lora_bench.py). For a quick check of
# the numerics part elsewhere: DEVICE (default vulkan), MODEL_DIMS (init-model's shape flags) and DEMO_STEPS. To
# split a training part over calls: SIZES (batch sizes, "1 4 8 16" for tinyllama, "1 4" for llama-7b), TYPES
# (default "q4_0 q4_k_m") and ROUNDS (default 3).
set -euo pipefail
part=${1:?usage: mixed_precision.sh kernels|numerics|tinyllama|llama-7b OUT}
out=${2:?usage: mixed_precision.sh kernels|numerics|tinyllama|llama-7b OUT}
peft=${PEFT:-.dev/peft_lora_bench.py}
device=${DEVICE:-vulkan}
dims=${MODEL_DIMS:---dim 2048 --layers 22 --heads 32 --kv-heads 4 --ff 5632}
demo_steps=${DEMO_STEPS:-300}
mkdir -p "$out"

case "$part" in
kernels)
  q4tune bench --device vulkan --precision mixed --shapes 16384x16384,4096x14336 --seconds 0.3 \
    --kernels q4_0_gemm,q4_0_dx,q4_k_gemm,q4_k_dx,q6_k_gemm,q6_k_dx,q8_0_gemm,q8_0_dx,f16_gemm,f16_dx \
    --json "$out/kernels.json" | grep -v " T=1 "
  ;;

numerics)
  # Logits of tinyllama-shaped random models at 128 tokens, mixed against f32: max |difference| / max |logit|.
  python3 -c 'import json, random; random.seed(3); print(json.dumps([random.randrange(260) for _ in range(128)]))' \
    > "$out/ids.json"
  for type in q4_0 q4_k_m; do
    q4tune init-model --out "$out/m.gguf" $dims --type $type --seed 7 > /dev/null
    for p in f32 mixed; do
      q4tune logits "$out/m.gguf" --device "$device" --precision $p --ids-file "$out/ids.json" --out "$out/$p.json"
    done
    python3 - "$out" $type <<'PY'
import json, sys
d, t = sys.argv[1], sys.argv[2]
a = json.load(open(d + "/f32.json"))["logits"]
b = json.load(open(d + "/mixed.json"))["logits"]
diff = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
top = max(abs(x) for r in a for x in r)
print(f"logits {t}: max |mixed - f32| = {diff:.3e}, max |logit| = {top:.3e}, ratio {diff / top:.2e} (bound 1e-2)")
PY
  done
  rm -f "$out/m.gguf"
  # The demo (configs/demo.toml, 300 steps) in either precision.
  for p in f32 mixed; do
    rm -rf "$out/demo-$p"
    q4tune train --device "$device" --precision $p --steps "$demo_steps" --out "$out/demo-$p" > "$out/demo-$p.log"
    head -1 "$out/demo-$p.log"
  done
  python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
def losses(p):
    rows = [json.loads(l) for l in open(f"{d}/demo-{p}/metrics.jsonl")]
    return {r["step"]: r["loss"] for r in rows if r.get("type") == "train"}
a, b = losses("f32"), losses("mixed")
last = max(a)
print(f"demo: final train loss f32 {a[last]:.4f}, mixed {b[last]:.4f}, relative {abs(b[last] - a[last]) / a[last]:.2%} (bound 3%)")
worst = max(abs(b[s] - a[s]) / a[s] for s in a if s > 20)
print(f"demo: largest relative difference of the curves after step 20: {worst:.2%} (bound 5%)")
for s in (1, 10, 20, 50, 100, 150, 200, 250, 300):
    if s in a: print(f"  step {s:3d}: f32 {a[s]:.4f}  mixed {b[s]:.4f}")
PY
  q4tune gradcheck --device "$device" --precision mixed > "$out/gradcheck.log" || true
  grep -E "mixed fwd [0-9.e+-]+ bwd [0-9.e+-]+" "$out/gradcheck.log" | grep -v "mixed fwd 0.0e+00 bwd 0.0e+00" | \
    sed -E 's/ +fd .* (mixed fwd)/  \1/'
  tail -1 "$out/gradcheck.log"
  ;;

tinyllama | llama-7b)
  shape=$part
  if [ "$shape" = tinyllama ]; then shape=tinyllama-1.1b; sizes=${SIZES:-1 4 8 16}; else sizes=${SIZES:-1 4}; fi
  types=${TYPES:-q4_0 q4_k_m}
  # The ffn outputs kept per batch size under --grad-checkpoint (memory against speed, at most 40% of PEFT's).
  keep() { case "$shape:$1" in tinyllama-1.1b:1) echo 11;; tinyllama-1.1b:4) echo 9;; tinyllama-1.1b:8) echo 8;;
                               tinyllama-1.1b:16) echo 6;; *) echo 0;; esac; }
  for round in $(seq "${ROUNDS:-3}"); do
    for bs in $sizes; do
      PYTHONUNBUFFERED=1 python3 "$peft" "$shape" 512 "$bs" 10 | tee -a "$out/peft-$bs.log"
      for type in $types; do
        q4tune bench train --device vulkan --shape "$shape" --type $type --batch-sizes "$bs" --steps 5 \
          --grad-checkpoint --keep-ffn-layers "$(keep "$bs")" --json "$out/q-$type-$bs-$round.json" | \
          sed -n "s/^\(bs .*\)/q4tune $type \1/p"
      done
    done
  done
  python3 - "$out" "$shape" "$types" $sizes <<'PY'
import glob, json, re, statistics, sys
d, shape, types, sizes = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
print(f"== medians over the rounds ({shape}, seq 512, LoRA r=16 on all seven targets)")
for bs in sizes:
    peft = [re.search(r": (\d+) tok/s, peak ([\d.]+) GiB", l) for l in open(f"{d}/peft-{bs}.log")]
    p_tok = statistics.median(float(m[1]) for m in peft if m)
    p_mem = statistics.median(float(m[2]) for m in peft if m)
    for t in types:
        rows = [json.load(open(f))[0] for f in sorted(glob.glob(f"{d}/q-{t}-{bs}-*.json"))]
        q_tok = statistics.median(r["tokens_per_s"] for r in rows)
        q_mem = statistics.median(r["peak_bytes"] / 2**30 for r in rows)
        print(f"bs {bs:<3} {t:<7} q4tune {q_tok:8.0f} tok/s (peak {q_mem:.2f} GiB)  PEFT {p_tok:8.0f} tok/s "
              f"(peak {p_mem:.2f} GiB)  speed {q_tok / p_tok:.2f}x  memory {100 * q_mem / p_mem:.0f}%")
PY
  ;;

*)
  echo "mixed_precision.sh: unknown part '$part' (kernels, numerics, tinyllama or llama-7b)" >&2
  exit 2
  ;;
esac
