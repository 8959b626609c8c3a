#!/usr/bin/env bash
# export_hf.sh TRAINER: a checkpoint exported to Hugging Face (dev/eval/export_hf.py) computes, in transformers,
# the validation loss the trainer logged for it. A d6 trains 10 steps on tiny-shakespeare and validates on the first
# 8 batches of the validation shard; export_hf_check.py reads the same batches and loads the exported directory
# with GPT2LMHeadModel (no custom code). The trainer computes in BF16 and transformers in FP32 on the same BF16
# weights, so the two losses agree to the BF16 rounding of the activations: within 2e-3.
# Needs python3 with torch and transformers; without them the suite says it is skipped.
set -u
TRAINER=${1:?usage: export_hf.sh path/to/train_gpt_bf16}
if ! python3 -c "import torch, transformers" 2>/dev/null; then
    echo "skipped: export to Hugging Face (needs python3 with torch and transformers)"; exit 0
fi
passed=0; failed=0
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ok() { echo "[PASS] $1"; passed=$((passed + 1)); }
bad() { echo "[FAIL] $1"; failed=$((failed + 1)); }
val=dev/data/tinyshakespeare/tiny_shakespeare_val.bin
"$TRAINER" -e d6 -b 4 -t 128 -x 10 -u 2 -v 10 -m 8 -s 0 -o "$work/run" > "$work/train.out" 2>&1 \
    || bad "training failed: $(tail -n 2 "$work/train.out")"
loss=$(sed -nE 's/^val loss ([0-9.]+) \(step 10, 8 batches\)$/\1/p' "$work/train.out")
if [[ -z "$loss" ]]; then
    bad "no step-10 validation loss over 8 batches in the trainer's output"
elif ! python3 dev/eval/export_hf.py "$work/run/model_00000010.bin" "$work/hf" --dtype fp32 > "$work/export.out" 2>&1; then
    bad "export_hf.py failed: $(tail -n 2 "$work/export.out")"
else
    ok "the step-10 checkpoint exports to a Hugging Face directory"
    out=$(python3 dev/test/gpu/export_hf_check.py "$work/hf" "$val" -b 4 -t 128 --batches 8 --expect "$loss" --tol 2e-3 2>&1); rc=$?
    line=$(grep "^HF loss" <<<"$out")
    [[ $rc -eq 0 ]] && ok "transformers computes the trainer's validation loss: $line" \
        || bad "transformers' validation loss: exit $rc, $(tail -n 2 <<<"$out")"
fi
echo "export to Hugging Face: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
