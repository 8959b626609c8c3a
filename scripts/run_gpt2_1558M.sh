#!/usr/bin/env bash
# GPT-2 1558M (d48) on FineWeb-Edu-100B with llm.c's published hyperparameters (llm.c
# scripts/run_gpt2_1558M.sh): 1,048,576 tokens per step (B=16 x T=1024 x accumulation), lr 6e-4 with 700
# warmup steps, cosine to 10% of the peak, weight decay 0.1, 32,000 steps = 33.6B tokens.
# Usage: RECIPE=bf16 NPROC=8 bash scripts/run_gpt2_1558M.sh [extra trainer flags, which override these]
# NPROC (default 1) processes, one GPU each, through scripts/launch.sh (ZeRO-1; -z 0 to all-reduce);
# -d stays 1048576, so the accumulation shrinks as NPROC grows. Out of GPU memory: a smaller -b (same -d,
# same training) or -r 2.
# A checkpoint every 2,000 steps (the newest 2 kept); scripts/resume_loop.sh reruns the trainer with -y 1
# after a crash (MAX_RESTARTS, default 20), so the run continues from its newest checkpoint.
# Make the data first: python3 dev/data/fineweb.py --edu --name sample-100BT
source "$(dirname "$0")/setup_run.sh"   # launch (NPROC), hellaswag (-h 1); runs from the checkout
RECIPE=${RECIPE:-bf16}
OUT_DIR=${OUT_DIR:-log_gpt2_1558M_$RECIPE}
make -j"$(nproc)" "train_gpt_$RECIPE"
exec bash scripts/resume_loop.sh "${launch[@]}" "./train_gpt_$RECIPE" \
    -i "dev/data/edu_fineweb100B/edu_fineweb_train_*.bin" -j "dev/data/edu_fineweb100B/edu_fineweb_val_*.bin" \
    -o "$OUT_DIR" -e d48 -b 16 -t 1024 -d 1048576 -r 1 \
    -l 0.0006 -u 700 -k cosine -q 0.1 -c 0.1 -gc 1.0 -x 32000 \
    -v 250 -m 20 -s 300000 -g 384 -n 2000 -nk 2 "${hellaswag[@]}" "$@"
