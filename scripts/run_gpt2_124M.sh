#!/usr/bin/env bash
# GPT-2 124M (d12) on FineWeb-10B with llm.c's published hyperparameters:
# 524,288 tokens per step (B=64 x T=1024 x accumulation), lr 6e-4 with 700 warmup steps, cosine to 0,
# weight decay 0.1, one epoch of the 10B-token sample (~19,073 steps).
# Usage: RECIPE=bf16 NPROC=8 bash scripts/run_gpt2_124M.sh [extra trainer flags, which override these]
# NPROC (default 1) processes, one GPU each, through scripts/launch.sh (ZeRO-1; -z 0 to all-reduce);
# -d stays 524288, so the accumulation shrinks as NPROC grows (8 GPUs: none).
# A checkpoint every 5,000 steps (the newest 2 kept); scripts/resume_loop.sh reruns the trainer with -y 1
# after a crash (MAX_RESTARTS, default 20), so the run continues from its newest checkpoint.
# Make the data first: python3 dev/data/fineweb.py
source "$(dirname "$0")/setup_run.sh"   # launch (NPROC), hellaswag (-h 1); runs from the checkout
RECIPE=${RECIPE:-bf16}
OUT_DIR=${OUT_DIR:-log_gpt2_124M_$RECIPE}
make -j"$(nproc)" "train_gpt_$RECIPE"
exec bash scripts/resume_loop.sh "${launch[@]}" "./train_gpt_$RECIPE" \
    -i "dev/data/fineweb10B/fineweb_train_*.bin" -j "dev/data/fineweb10B/fineweb_val_*.bin" \
    -o "$OUT_DIR" -e d12 -b 64 -t 1024 -d 524288 -r 1 \
    -l 0.0006 -u 700 -k cosine -q 0.0 -c 0.1 -gc 1.0 -x -1 \
    -v 250 -m 20 -s 20000 -g 144 -n 5000 -nk 2 "${hellaswag[@]}" "$@"
