#!/usr/bin/env bash
# Data-parallel training measured on a machine with several GPUs; CI does not run this (it has none). q4tune over
# Open MPI (`mpirun -np N q4tune bench train`) against PyTorch + PEFT under DistributedDataParallel
# (tests/device/peft_ddp_bench.py through torchrun), tinyllama-1.1b, seq 512, batch 4 per GPU, 10 timed steps,
# rounds interleaved. Stage here with ../shared/device/prepare.sh build/q4tune and tests/device/stage_mpi.sh; then,
# from the repository root of the device machine, with python3 with torch, transformers and peft:
#   source .dev/env.sh; source .dev/mpi/env.sh; tests/device/data_parallel.sh OUT
# Per N it prints the medians over the rounds: q4tune's global tokens/s, its scaling efficiency (tokens/s at N over
# N times those at 1), the same for q4tune summing the gradients after the backward instead of during it
# (--grad-bucket-mb 0), PEFT DDP's global tokens/s and efficiency, and q4tune's speed over PEFT's. GPUS (default
# "1 2 4"; counts above the machine's GPUs are skipped) and ROUNDS (default 3) split it over calls: the summary
# reads every round in OUT (ROUND_LIST="2 3" numbers the rounds of a later call). PEFT=path names the peer's script.
set -euo pipefail
out=${1:?usage: data_parallel.sh OUT}
peft=${PEFT:-tests/device/peft_ddp_bench.py}
mkdir -p "$out"

have=$(nvidia-smi -L | grep -c '^GPU ' || true)
gpus=()
for n in ${GPUS:-1 2 4}; do
  if [ "$n" -le "$have" ]; then gpus+=("$n"); else echo "gpus=$n skipped: this machine has $have GPUs"; fi
done

# A failed run is reported with its log's end and left out of the medians; the other runs go on.
q4tune_run() {  # N ROUND [NAME BUCKET_MB]
  local name=${3:-q4tune} log="$out/${3:-q4tune}-$1-$2.log"
  if mpirun -np "$1" q4tune bench train --device vulkan --shape tinyllama-1.1b --batch-sizes 4 --grad-checkpoint \
       --steps 10 --grad-bucket-mb "${4:-4}" --json "$out/$name-$1-$2.json" > "$log" 2>&1; then
    sed -n "s/^\(bs .*\)/$name gpus=$1 round $2: \1/p" "$log"
  else
    echo "$name gpus=$1 round $2 failed (exit $?); the end of $log:"
    tail -5 "$log"
    rm -f "$out/$name-$1-$2.json"
  fi
}
peft_run() {  # N ROUND
  local log="$out/peft-$1-$2.log"
  if python3 -m torch.distributed.run --standalone --nproc_per_node "$1" "$peft" tinyllama-1.1b 512 4 10 \
       > "$log" 2>&1; then
    grep '^PEFT-LoRA-DDP' "$log" | sed "s/$/ (round $2)/" || echo "PEFT DDP gpus=$1 round $2: no result in $log"
  else
    echo "PEFT DDP gpus=$1 round $2 failed (exit $?); the end of $log:"
    tail -5 "$log"
  fi
}

for round in ${ROUND_LIST:-$(seq "${ROUNDS:-3}")}; do
  for n in "${gpus[@]}"; do
    q4tune_run "$n" "$round"
    # The same ranks summing every gradient after the backward: what the overlap saves.
    [ "$n" -gt 1 ] && q4tune_run "$n" "$round" q4after 0
    peft_run "$n" "$round"
  done
done

python3 - "$out" <<'PY'
import glob, json, os, re, statistics, sys
d = sys.argv[1]
def rounds(pattern, read):
    values = {}
    for f in glob.glob(os.path.join(d, pattern)):
        n = int(re.search(r"-(\d+)-\d+\.\w+$", f)[1])
        try:
            v = read(f)
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            v = None
        if v is not None:
            values.setdefault(n, []).append(v)
    return values
tok = lambda f: json.load(open(f))[0]["tokens_per_s"]
q4, after = rounds("q4tune-*-*.json", tok), rounds("q4after-*-*.json", tok)
def peft_tok(f):
    m = re.search(r"^PEFT-LoRA-DDP .*: ([\d.]+) tok/s", open(f).read(), re.M)
    return float(m[1]) if m else None
pt = rounds("peft-*-*.log", peft_tok)
med = lambda v, n: statistics.median(v[n]) if n in v else None
cell = lambda x, width, form: f"{form.format(x) if x is not None else '-':>{width}}"
def eff(v, n):
    one, at = med(v, 1), med(v, n)
    return 100 * at / (n * one) if one and at else None
print("== medians over the rounds (tinyllama-1.1b, seq 512, batch 4 per GPU, LoRA r=16 on all seven targets)")
print("q4tune sums the gradients during the backward (4 MB buckets); 'after': the same ranks summing them after it")
print("gpus  q4tune tok/s  efficiency  rounds   after tok/s  efficiency   PEFT DDP tok/s  efficiency  rounds   q4tune/PEFT")
for n in sorted(set(q4) | set(pt)):
    q, p = med(q4, n), med(pt, n)
    one = med(q4, 1)
    a = med(after, n)
    a_eff = 100 * a / (n * one) if a and one else None
    print(f"{n:<4}  {cell(q, 12, '{:.0f}')}  {cell(eff(q4, n), 10, '{:.1f}%')}  {len(q4.get(n, [])):6}   "
          f"{cell(a, 11, '{:.0f}')}  {cell(a_eff, 10, '{:.1f}%')}   "
          f"{cell(p, 14, '{:.0f}')}  {cell(eff(pt, n), 10, '{:.1f}%')}  {len(pt.get(n, [])):6}   "
          f"{cell(q / p if q and p else None, 11, '{:.2f}x')}")
PY
