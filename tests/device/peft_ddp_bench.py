# PyTorch + PEFT LoRA training throughput over N GPUs under DistributedDataParallel (NCCL), one process per GPU:
# the peer of `mpirun -np N q4tune bench train`. A random Llama-shaped model in bf16 (sdpa attention), LoRA r=16,
# alpha 32 on q, k, v, o, gate, up and down, AdamW; every rank trains on a random batch of its own. Rank 0 prints
# one line: the global tokens/s (all ranks' tokens over the slowest rank's time), its own peak memory and the loss
# averaged over the ranks.
#   torchrun --standalone --nproc_per_node N tests/device/peft_ddp_bench.py SHAPE SEQ BATCH_PER_GPU STEPS
# (SHAPE: small, tinyllama-1.1b or llama-7b; `python3 tests/device/peft_ddp_bench.py ...` runs one rank alone.)
import os
import sys
import time

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.nn.parallel import DistributedDataParallel
from transformers import LlamaConfig, LlamaForCausalLM

# As q4tune bench train's --shape.
SHAPES = {
    "small": (512, 1408, 8, 8, 4),
    "tinyllama-1.1b": (2048, 5632, 22, 32, 4),
    "llama-7b": (4096, 11008, 32, 32, 32),
}
WARMUP = 3


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: peft_ddp_bench.py {'|'.join(SHAPES)} SEQ BATCH_PER_GPU STEPS")
    shape, seq, bs, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")

    dim, ff, layers, heads, kv_heads = SHAPES[shape]
    cfg = LlamaConfig(hidden_size=dim, intermediate_size=ff, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, vocab_size=32000, max_position_embeddings=4096,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with dev:  # random weights made on the GPU, then cast to bf16 (quicker than on the host, the same model)
        base = LlamaForCausalLM(cfg).to(torch.bfloat16)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    # The buffers (rotary frequencies) are constants: no broadcast of them before every forward.
    model = DistributedDataParallel(get_peft_model(base, lora), device_ids=[dev.index], broadcast_buffers=False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    gen = torch.Generator(device=dev).manual_seed(1000 + rank)
    ids = torch.randint(0, cfg.vocab_size, (bs, seq), device=dev, generator=gen)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()  # DDP averages the LoRA gradients over the ranks here
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    dist.all_reduce(torch.zeros(1, device=dev))  # all ranks start the clock together
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = torch.tensor([time.perf_counter() - t0], device=dev, dtype=torch.float64)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    if rank == 0:
        tok_s = world * steps * bs * seq / seconds.item()
        print(f"PEFT-LoRA-DDP {shape} gpus={world} seq={seq} bs_per_gpu={bs}: {tok_s:.0f} tok/s, "
              f"peak {peak:.2f} GiB, loss {loss.item() / world:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
