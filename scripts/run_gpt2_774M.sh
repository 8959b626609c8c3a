#!/usr/bin/env bash
# GPT-2 774M (d36) on FineWeb-100B with llm.c's published hyperparameters (llm.c scripts/run_gpt2_774M.sh):
# 524,288 tokens per step (B=32 x T=1024 x accumulation), lr 2.5e-4 with 700 warmup steps, cosine to 0,
# weight decay 0.1, 286,102 steps = 150B tokens (about 10x the 350M run's compute; lower -x for less).
# Usage: RECIPE=bf16 NPROC=8 bash scripts/run_gpt2_774M.sh [extra trainer flags, which override these]
# NPROC (default 1) processes, one GPU each, through scripts/launch.sh (ZeRO-1; -z 0 to all-reduce);
# -d stays 524288, so the accumulation shrinks as NPROC grows. Out of GPU memory: a smaller -b (same -d,
# same training) or -r 2.
# A checkpoint every 4,000 steps (the newest 2 kept); scripts/resume_loop.sh reruns the trainer with -y 1
# after a crash (MAX_RESTARTS, default 20), so the run continues from its newest checkpoint.
# Make the data first: python3 dev/data/fineweb.py --name sample-100BT
# (150B tokens are one and a half passes over the 100B sample; the dataloader starts a new epoch by itself)
source "$(dirname "$0")/setup_run.sh"   # launch (NPROC), hellaswag (-h 1); runs from the checkout
RECIPE=${RECIPE:-bf16}
OUT_DIR=${OUT_DIR:-log_gpt2_774M_$RECIPE}
make -j"$(nproc)" "train_gpt_$RECIPE"
exec bash scripts/resume_loop.sh "${launch[@]}" "./train_gpt_$RECIPE" \
    -i "dev/data/fineweb100B/fineweb_train_*.bin" -j "dev/data/fineweb100B/fineweb_val_*.bin" \
    -o "$OUT_DIR" -e d36 -b 32 -t 1024 -d 524288 -r 1 \
    -l 0.00025 -u 700 -k cosine -q 0.0 -c 0.1 -gc 1.0 -x 286102 \
    -v 250 -m 20 -s 300000 -g 144 -n 4000 -nk 2 "${hellaswag[@]}" "$@"
