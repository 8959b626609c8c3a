#!/usr/bin/env bash
# Data-parallel scaling of scripts/run_gpt2_124M.sh: the same STEPS optimizer steps (524,288 tokens each)
# on NPROC GPUs (ZeRO-1, through scripts/launch.sh) and on 1 GPU, for each recipe, then one table of tok/s,
# scaling, per-GPU memory and the N-GPU losses against the 1-GPU ones (dev/bench/scaling_report.py).
#
#   NPROC=4 RECIPES="bf16 fp8" STEPS=200 bash dev/bench/scaling_124M.sh WORK_DIR
#
# Data: the FineWeb shards under dev/data/fineweb10B when they are there; otherwise tiny-shakespeare repeated
# to 2.1M tokens (dev/data/tinyshakespeare.py --repeat-to), because a 524,288-token step needs more tokens
# than the text has. The repeated text gives a memorization curve: the losses compare the runs with one
# another, not with FineWeb's.
# ONE_GPU_SIDE_BY_SIDE=1 (default 0) runs the recipes' 1-GPU runs at the same time, recipe i on GPU i, to
# save time; each still has its GPU to itself (the host's CPUs, disk and links are shared).
# Writes into WORK_DIR: <recipe>_<n>gpu.log (process 0's output), <recipe>_<n>gpu_smi.csv (nvidia-smi
# memory samples), report.md and losses.png. The runs' checkpoints go to WORK_DIR/ckpt_* (-o). A run whose
# log in WORK_DIR shows it finished is not made again (so an interrupted invocation can be completed).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $# -ne 1 ]]; then echo "usage: NPROC=4 RECIPES=\"bf16 fp8\" STEPS=200 $0 WORK_DIR" >&2; exit 2; fi
work=$1
NPROC=${NPROC:-4}
RECIPES=${RECIPES:-bf16 fp8}
STEPS=${STEPS:-200}
ONE_GPU_SIDE_BY_SIDE=${ONE_GPU_SIDE_BY_SIDE:-0}
for v in NPROC STEPS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "error: $v='${!v}' must be a positive number" >&2; exit 2; }
done
mkdir -p "$work"
export NCCL_NVLS_ENABLE=0 # never NVLink multicast (see scripts/launch.sh)

data=()
if ! compgen -G "dev/data/fineweb10B/fineweb_train_*.bin" > /dev/null; then
    ts=dev/data/tinyshakespeare_2M
    [[ -f $ts/tiny_shakespeare_train.bin ]] || python3 dev/data/tinyshakespeare.py --repeat-to 2100000 --out-dir $ts
    data=(-i "$ts/tiny_shakespeare_train.bin" -j "$ts/tiny_shakespeare_val.bin")
    echo "no FineWeb shards under dev/data/fineweb10B: training on $ts (tiny-shakespeare, repeated)"
fi
for r in $RECIPES; do make -j"$(nproc)" "train_gpt_$r" > /dev/null; done

# run RECIPE GPUS [CUDA_VISIBLE_DEVICES]: one run of the script (its logs named <recipe>_<gpus>gpu), with
# nvidia-smi sampling memory meanwhile
run() {
    local recipe=$1 gpus=$2 devices=${3:-} name=${1}_${2}gpu
    if [[ -f $work/$name.log ]] && grep -q '^GPU memory in use at the end' "$work/$name.log"; then
        echo "$name: finished in an earlier invocation; kept"; return 0
    fi
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$work/${name}_smi.csv" &
    local smi=$!
    local rc=0
    env ${devices:+CUDA_VISIBLE_DEVICES=$devices} RECIPE=$recipe NPROC=$gpus OUT_DIR="$work/ckpt_$name" MAX_RESTARTS=0 \
        bash scripts/run_gpt2_124M.sh "${data[@]}" -x "$STEPS" > "$work/$name.log" 2>&1 || rc=$?
    kill $smi 2>/dev/null; wait $smi 2>/dev/null || true
    # a 1-GPU run on GPU d: keep that GPU's samples only, renumbered 0 like the run saw it
    if [[ -n $devices ]]; then awk -F', ' -v d="$devices" '$1 == d { print "0, " $2 }' "$work/${name}_smi.csv" \
        > "$work/${name}_smi.tmp" && mv "$work/${name}_smi.tmp" "$work/${name}_smi.csv"; fi
    echo "$name: exit $rc; $(grep -E '^average step' "$work/$name.log" || echo 'no average step line')"
    return $rc
}

# every run is made even if one fails; the report covers the recipes whose two runs both finished
failed=()
for r in $RECIPES; do run "$r" "$NPROC" || failed+=("${r}_${NPROC}gpu"); done
n_recipes=$(wc -w <<<"$RECIPES")
n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [[ $ONE_GPU_SIDE_BY_SIDE == 1 && $n_recipes -gt $n_gpus ]]; then
    echo "ONE_GPU_SIDE_BY_SIDE: $n_recipes recipes but $n_gpus GPUs; the 1-GPU runs go one after another"
    ONE_GPU_SIDE_BY_SIDE=0
fi
if [[ $ONE_GPU_SIDE_BY_SIDE == 1 ]]; then
    i=0; pids=(); names=()
    for r in $RECIPES; do run "$r" 1 $i & pids+=($!); names+=("${r}_1gpu"); i=$((i + 1)); done
    for k in "${!pids[@]}"; do wait "${pids[$k]}" || failed+=("${names[$k]}"); done
else
    for r in $RECIPES; do run "$r" 1 0 || failed+=("${r}_1gpu"); done
fi
report=()
for r in $RECIPES; do
    [[ " ${failed[*]} " == *" ${r}_${NPROC}gpu "* || " ${failed[*]} " == *" ${r}_1gpu "* ]] && continue
    report+=(--run "$r" "$NPROC" "$work/${r}_${NPROC}gpu.log" "$work/${r}_${NPROC}gpu_smi.csv")
    report+=(--run "$r" 1 "$work/${r}_1gpu.log" "$work/${r}_1gpu_smi.csv")
done
[[ ${#report[@]} -gt 0 ]] && python3 dev/bench/scaling_report.py "${report[@]}" --out "$work/report.md" --plot "$work/losses.png"
if [[ ${#failed[@]} -gt 0 ]]; then echo "failed: ${failed[*]} (their logs are in $work)" >&2; exit 1; fi
