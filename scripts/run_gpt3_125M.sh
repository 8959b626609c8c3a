#!/usr/bin/env bash
# GPT-3 Small (gpt3:c768, 125M, T=2048) on FineWeb with the GPT-3 paper's hyperparameters:
# 524,288 tokens per step, lr 6e-4, warmup over 375M tokens (715 steps), cosine decay to 10% of the
# peak, weight decay 0.1, clip 1.0, 300B tokens (572,204 steps; lower -x for a shorter run).
#
# By default this builds and runs the Q1.15 true-forward trainer, train_gpt3q115cu (as the SF16
# specification runs it, doc/recipes/q115.md): cuDNN stays off (USE_CUDNN=0; Q1.15 refuses it) and -Q 115 verifies the binary and its
# device boundaries at start. RECIPE=<name> runs train_gpt_<name> instead (bf16, fp8, nvfp4, vcast,
# tcfp12, q115), without -Q. True-forward Q1.15 does not train this model (its logits and
# activations are clamped to +-1); RECIPE=bf16 is the baseline.
# A checkpoint every 5,000 steps (the newest 2 kept); scripts/resume_loop.sh reruns the trainer with -y 1
# after a crash (MAX_RESTARTS, default 20), so the run continues from its newest checkpoint.
# Usage: [RECIPE=bf16] [NPROC=8] bash scripts/run_gpt3_125M.sh [extra trainer flags, which override these]
# Make the data first: python3 dev/data/fineweb.py
source "$(dirname "$0")/setup_run.sh"   # launch (NPROC), hellaswag (-h 1); runs from the checkout
RECIPE=${RECIPE:-}
if [[ -z "$RECIPE" ]]; then
    TRAINER=train_gpt3q115cu
    CHECK=(-Q 115)
    make -j"$(nproc)" USE_CUDNN=0 "$TRAINER"
else
    TRAINER=train_gpt_$RECIPE
    CHECK=()
    make -j"$(nproc)" "$TRAINER"
fi
OUT_DIR=${OUT_DIR:-log_gpt3_125M_${RECIPE:-q115}}
exec bash scripts/resume_loop.sh "${launch[@]}" "./$TRAINER" "${CHECK[@]}" \
    -i "dev/data/fineweb10B/fineweb_train_*.bin" -j "dev/data/fineweb10B/fineweb_val_*.bin" \
    -o "$OUT_DIR" -e gpt3:c768 -b 32 -t 2048 -d 524288 -r 1 \
    -l 0.0006 -u 715 -k cosine -q 0.1 -c 0.1 -gc 1.0 -x 572204 \
    -v 250 -m 20 -s 20000 -g 144 -n 5000 -nk 2 "${hellaswag[@]}" "$@"
