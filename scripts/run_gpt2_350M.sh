#!/usr/bin/env bash
# GPT-2 350M (d24) on FineWeb-100B with llm.c's published hyperparameters (llm.c scripts/run_gpt2_350M.sh):
# 524,288 tokens per step (B=64 x T=1024 x accumulation), lr 3e-4 with 700 warmup steps, cosine to 0,
# weight decay 0.1, 60,000 steps = 31.5B tokens (about 10x the 124M run's compute).
# Usage: RECIPE=bf16 NPROC=8 bash scripts/run_gpt2_350M.sh [extra trainer flags, which override these]
# NPROC (default 1) processes, one GPU each, through scripts/launch.sh (ZeRO-1; -z 0 to all-reduce);
# -d stays 524288, so the accumulation shrinks as NPROC grows. Out of GPU memory: a smaller -b (same -d,
# same training) or -r 2.
# A checkpoint every 2,000 steps (the newest 2 kept); scripts/resume_loop.sh reruns the trainer with -y 1
# after a crash (MAX_RESTARTS, default 20), so the run continues from its newest checkpoint.
# Make the data first (30B tokens need more than the 10B sample): python3 dev/data/fineweb.py --name sample-100BT
source "$(dirname "$0")/setup_run.sh"   # launch (NPROC), hellaswag (-h 1); runs from the checkout
RECIPE=${RECIPE:-bf16}
OUT_DIR=${OUT_DIR:-log_gpt2_350M_$RECIPE}
make -j"$(nproc)" "train_gpt_$RECIPE"
exec bash scripts/resume_loop.sh "${launch[@]}" "./train_gpt_$RECIPE" \
    -i "dev/data/fineweb100B/fineweb_train_*.bin" -j "dev/data/fineweb100B/fineweb_val_*.bin" \
    -o "$OUT_DIR" -e d24 -b 64 -t 1024 -d 524288 -r 1 \
    -l 0.0003 -u 700 -k cosine -q 0.0 -c 0.1 -gc 1.0 -x 60000 \
    -v 250 -m 20 -s 100000 -g 144 -n 2000 -nk 2 "${hellaswag[@]}" "$@"
