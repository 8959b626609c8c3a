#!/usr/bin/env bash
# resume_cli.sh TRAINER: the trainer's own checkpoint/resume path, end to end (needs a GPU).
# Run A trains 20 steps. Run B trains the same 20 steps with a checkpoint every 10; its step-20
# checkpoint is then deleted (as if the job had died after step 10) and B is resumed with -y 1.
# The resumed steps 10..19 must log exactly the losses and norms of run A. Also checks -nk pruning.
set -u
TRAINER=${1:?usage: resume_cli.sh path/to/train_gpt_bf16}
passed=0; failed=0
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ok() { echo "[PASS] $1"; passed=$((passed + 1)); }
bad() { echo "[FAIL] $1"; failed=$((failed + 1)); }
args=(-e d6 -b 4 -t 64 -x 20 -u 5 -v 10 -m 2 -s 0)
"$TRAINER" "${args[@]}" -o "$work/a" > "$work/a.out" 2>&1 || bad "run A failed: $(tail -n 2 "$work/a.out")"
"$TRAINER" "${args[@]}" -o "$work/b" -n 5 -nk 2 > "$work/b.out" 2>&1 || bad "run B failed: $(tail -n 2 "$work/b.out")"
kept=$(ls "$work/b" | grep -c '^DONE_')
[[ $kept -eq 2 && -f "$work/b/DONE_00000020" && -f "$work/b/DONE_00000015" ]] && ok "-nk 2 keeps the newest 2 checkpoints" || bad "-nk 2 left: $(ls "$work/b" | tr '\n' ' ')"
rm -f "$work/b/DONE_00000020" "$work/b/model_00000020.bin" "$work/b/state_00000020_00000.bin"
"$TRAINER" "${args[@]}" -o "$work/b" -y 1 > "$work/b2.out" 2>&1 || bad "resume failed: $(tail -n 2 "$work/b2.out")"
grep -q "from 15" "$work/b2.out" && ok "resumed from the newest complete checkpoint (step 15)" || bad "did not resume from step 15: $(grep steps "$work/b2.out")"
want=$(grep -E '^s:(1[5-9]) trl' "$work/a/main.log")
got=$(grep -E '^s:(1[5-9]) trl' "$work/b/main.log" | tail -n 5)
if [[ -n "$want" && "$want" == "$got" ]]; then ok "resumed steps 15-19 log the same losses, norms and lr as the uninterrupted run"
else bad "resumed losses differ:"$'\n'"$want"$'\n'"---"$'\n'"$got"; fi
[[ "$(grep -E '^s:20 tel' "$work/a/main.log")" == "$(grep -E '^s:20 tel' "$work/b/main.log" | tail -n 1)" ]] \
    && ok "final validation loss identical" || bad "final validation loss differs"
# an llm.c model file as the starting point (-e path): the reference's FP32 model file, if present
if [[ -f dev/reference/out/ref_model.bin ]]; then
    "$TRAINER" -e dev/reference/out/ref_model.bin -b 4 -t 64 -x 2 -v 0 -s 0 > "$work/e.out" 2>&1 \
        && ok "trains from an llm.c model file (-e ref_model.bin)" || bad "-e ref_model.bin failed: $(tail -n 2 "$work/e.out")"
fi
echo "resume tests: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
