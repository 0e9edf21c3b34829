#!/usr/bin/env bash
# Every architecture on a GPU, in two parts; CI does not run this (the interop tests cover lavapipe and the CPU).
#   tests/device/architectures.sh refs DIR   # here, with node-llama-cpp (tests/interop/install_node_llama.sh):
#                                            # small f32 models of each architecture and llama.cpp's logits
#   tests/device/architectures.sh gpu DIR    # on the GPU machine, with q4tune on PATH and python3 with torch,
#                                            # transformers and peft: q4tune's logits against those, and each
#                                            # architecture trained, exported and loaded by PEFT
# The sequences are 96 tokens: longer than every sliding window and than the 32 rows where attention takes the
# tensor cores. Agreement is max |q4tune - llama.cpp| / max |llama.cpp| over the positions (the interop tests'
# measure, 1e-3 their bound).
set -euo pipefail
part=${1:?usage: architectures.sh refs|gpu DIR}
dir=${2:?usage: architectures.sh refs|gpu DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
q4tune=${Q4TUNE:-q4tune}

# name | init-model options
variants=(
  "llama_ropefreqs|--arch llama --rope-freqs"
  "llama_yarn4|--arch llama --rope-scaling yarn:4 --tied"
  "qwen2_linear4|--arch qwen2 --rope-scaling linear:4"
  "qwen3_hd32|--arch qwen3 --head-dim 32"
  "gemma2_caps|--arch gemma2 --tied --attn-softcap 2 --final-softcap 3 --sliding-window 40"
  "gemma3_swa|--arch gemma3 --swa-pattern 2 --sliding-window 37 --final-softcap 5"
  "phi3_fused|--arch phi3"
  "phi3_longrope|--arch phi3 --longrope 64"
)

case "$part" in
refs)
  mkdir -p "$dir"
  python3 -c "import json, random; random.seed(7); json.dump([random.randrange(3, 260) for _ in range(96)], open('$dir/ids.json', 'w'))"
  for v in "${variants[@]}"; do
    name=${v%%|*}
    $q4tune init-model ${v#*|} --type f32 --dim 128 --heads 4 --kv-heads 2 --layers 3 --ff 256 --seed 5 \
      --out "$dir/$name.gguf" >/dev/null
    node "$here/interop/llama_ref.mjs" --model "$dir/$name.gguf" --ids-file "$dir/ids.json" --out "$dir/$name.llama.json"
    echo "$name: llama.cpp logits written"
  done
  ;;

gpu)
  compare() {
    python3 - "$1" "$2" <<'PY'
import json, sys
got = json.load(open(sys.argv[1]))["logits"]
want = json.load(open(sys.argv[2]))["logits"]
assert len(got) == len(want), (len(got), len(want))
print(f"{max(max(abs(a - b) for a, b in zip(g, w)) / max(abs(b) for b in w) for g, w in zip(got, want)):.3g}")
PY
  }
  for v in "${variants[@]}"; do
    name=${v%%|*}
    for precision in f32 mixed; do
      $q4tune logits "$dir/$name.gguf" --ids-file "$dir/ids.json" --device vulkan --precision $precision \
        --out "$dir/$name.$precision.json" 2>/dev/null
      echo "$name vulkan $precision: $(compare "$dir/$name.$precision.json" "$dir/$name.llama.json") of llama.cpp's largest logit"
    done
  done
  # Trained on the GPU (30 steps of the demo data, the default mixed precision), exported, loaded by PEFT into the
  # Hugging Face class of its architecture built from the same weights: the f32 logits of q4tune with the run's
  # adapter.gguf.
  # llama: a plain q4_0 one (Hugging Face's LlamaForCausalLM is built without llama 3.1's per-pair factors).
  for name in llama_plain qwen3_hd32 gemma2_caps gemma3_swa phi3_fused; do
    case $name in
      llama_plain) model=$dir/llama_plain.gguf; $q4tune init-model --arch llama --type q4_0 --seed 9 --out "$model" >/dev/null ;;
      *) model=$dir/$name.gguf ;;
    esac
    run=$dir/run_$name
    rm -rf "$run"
    $q4tune train --model "$model" --data "$here/../configs/demo.jsonl" --out "$run" --device vulkan --steps 30 \
      --seq-len 64 --pack --batch-size 2 --lr 1e-2 --lora-rank 8 --lora-alpha 12 >"$run.log" 2>&1 || { tail -5 "$run.log"; exit 1; }
    $q4tune logits "$model" --ids-file "$dir/ids.json" --device vulkan --precision f32 --out "$dir/$name.base.json" 2>/dev/null
    $q4tune logits "$model" --ids-file "$dir/ids.json" --device vulkan --precision f32 --adapter "$run/adapter.gguf" \
      --out "$dir/$name.adapted.json" 2>/dev/null
    echo "$(basename "$model" .gguf) PEFT: $(python3 "$here/interop/peft_check.py" --model "$model" --peft "$run/peft" \
      --ids-file "$dir/ids.json" --logits "$dir/$name.adapted.json" --base-logits "$dir/$name.base.json" 2>&1 | tail -1)"
  done
  ;;
*)
  echo "architectures.sh: unknown part '$part' (refs or gpu)" >&2
  exit 2
  ;;
esac
