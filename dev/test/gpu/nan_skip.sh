#!/usr/bin/env bash
# nan_skip.sh TRAINER: skipped optimizer updates, end to end (needs a GPU; bf16 and fp8 in make test).
# 1. LLMC_TEST_NAN_AT=loss:3,grad:7 (a NaN in step 3's loss, one in step 7's backward pass): the run ends with
#    exit 0, main.log has "s:3 skip:nan-loss" and "s:7 skip:nan-grad" and no train-loss line for those steps,
#    every logged loss and the final validation loss are finite, and the summary counts the two.
# 2. The same run resumed (-y 1) from its step-5 checkpoint (between the two NaNs) and, in a copy, from its
#    step-10 checkpoint (after both) logs exactly the lines it logged the first time (main.log keeps both).
# 3. -sl 0.1 / -sg 0.1 with -l 0 (the loss and the norm vary from batch to batch about a constant): nothing is
#    skipped for a spike before the window of 128 accepted steps is full, and afterwards only steps more than
#    0.1 standard deviations above the window's mean are; resumed from step 140, the same decisions (the
#    window is in the checkpoint).
# 4. FP8: the NaN of step 2's backward pass reaches the recipe's amaxes (-lq 1 shows nan at step 2), and the
#    skipped step leaves none of them behind (step 3's are all finite).
set -u
TRAINER=${1:?usage: nan_skip.sh path/to/train_gpt_bf16}
passed=0; failed=0
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ok() { echo "[PASS] $1"; passed=$((passed + 1)); }
bad() { echo "[FAIL] $1"; failed=$((failed + 1)); }
args=(-e d6 -b 4 -t 64 -u 5 -s 0)
# the main.log lines of steps in [lo, hi) that a resume must repeat: train losses and skips
steps_lines() { awk -v lo="$2" -v hi="$3" '/^s:[0-9]+ (trl|skip):/ { split($1, a, ":"); if (a[2] >= lo && a[2] < hi) print }' "$1"; }
drop_checkpoint() { rm -f "$1/DONE_$(printf %08d "$2")" "$1/model_$(printf %08d "$2").bin" "$1/state_$(printf %08d "$2")_00000.bin"; }

# ---- 1. a NaN in the loss at step 3, in the gradients at step 7 ----
nan_at="loss:3,grad:7"
LLMC_TEST_NAN_AT=$nan_at "$TRAINER" "${args[@]}" -x 20 -v 20 -m 2 -n 5 -o "$work/a" > "$work/a.out" 2>&1; rc=$?
[[ $rc -eq 0 ]] && ok "a run with NaNs injected at steps 3 and 7 ends with exit 0" || bad "the run failed (exit $rc): $(tail -n 3 "$work/a.out")"
log=$work/a/main.log
[[ "$(grep -E '^s:[0-9]+ skip:' "$log" | cut -d' ' -f1-2 | tr '\n' ' ')" == "s:3 skip:nan-loss s:7 skip:nan-grad " ]] \
    && ok "main.log: s:3 skip:nan-loss and s:7 skip:nan-grad, no other skip" || bad "skip lines: $(grep -E '^s:[0-9]+ skip:' "$log")"
grep -qE '^s:3 skip:nan-loss loss:-?nan lr:' "$log" && grep -qE '^s:7 skip:nan-grad loss:[0-9.]+ lr:[^ ]+ norm:-?nan$' "$log" \
    && ok "the skip lines show the NaN loss of step 3 and the NaN norm of step 7" || bad "skip lines: $(grep -E 'skip:' "$log")"
[[ $(grep -cE '^s:[0-9]+ trl:' "$log") -eq 18 ]] && ! grep -qE '^s:(3|7) trl:' "$log" \
    && ok "18 train-loss lines, none for the skipped steps" || bad "$(grep -cE '^s:[0-9]+ trl:' "$log") train-loss lines"
awk '/^s:[0-9]+ (trl|tel):/ { split($2, v, ":"); if (v[2] !~ /^[0-9]+\.[0-9]+$/) bad++ } END { exit bad > 0 }' "$log" \
    && grep -qE '^s:20 tel:[0-9]+\.[0-9]+$' "$log" \
    && ok "every train loss and the final validation loss are finite" || bad "a non-finite loss: $(grep -E 'trl|tel' "$log" | tail -n 3)"
grep -q "updates skipped: 2 of 20 steps (nan-loss 1, nan-grad 1, loss-spike 0, grad-spike 0)" "$work/a.out" \
    && grep -q "update skipped: nan-grad" "$work/a.out" \
    && ok "stdout marks the skipped steps and the summary counts them" || bad "summary: $(grep -i skipped "$work/a.out")"

# ---- 2. resumed from before the second NaN, and from after both ----
# (a10: the run up to its step-10 checkpoint; hard links, since a checkpoint file is replaced, never rewritten)
mkdir -p "$work/a10" && cp "$work/a/main.log" "$work/a10/" && ln "$work/a"/*_00000010[._]* "$work/a/DONE_00000010" "$work/a10/" \
    || bad "could not copy the step-10 checkpoint: $(ls "$work/a" | tr '\n' ' ')"
for s in 10 15 20; do drop_checkpoint "$work/a" $s; done
LLMC_TEST_NAN_AT=$nan_at "$TRAINER" "${args[@]}" -x 20 -v 20 -m 2 -n 5 -o "$work/a" -y 1 > "$work/a2.out" 2>&1 \
    || bad "the resume from step 5 failed: $(tail -n 3 "$work/a2.out")"
want=$(steps_lines "$log" 5 20 | head -n 15); got=$(steps_lines "$log" 5 20 | tail -n 15)
grep -q "(from 5)" "$work/a2.out" && [[ $(steps_lines "$log" 5 20 | wc -l) -eq 30 && "$want" == "$got" ]] \
    && ok "resumed from step 5 (before the grad NaN): steps 5-19 log the same losses, norms and skips, bit for bit" \
    || bad "resume from step 5 differs:"$'\n'"$want"$'\n'"---"$'\n'"$got"
grep -q "updates skipped: 2 of 20 steps (nan-loss 1, nan-grad 1" "$work/a2.out" \
    && ok "the resumed run's summary counts the skip before the checkpoint too" || bad "resumed summary: $(grep -i 'updates skipped' "$work/a2.out")"
LLMC_TEST_NAN_AT=$nan_at "$TRAINER" "${args[@]}" -x 20 -v 20 -m 2 -n 5 -o "$work/a10" -y 1 > "$work/a10.out" 2>&1 \
    || bad "the resume from step 10 failed: $(tail -n 3 "$work/a10.out")"
want=$(steps_lines "$work/a10/main.log" 10 20 | head -n 10); got=$(steps_lines "$work/a10/main.log" 10 20 | tail -n 10)
grep -q "(from 10)" "$work/a10.out" && [[ $(steps_lines "$work/a10/main.log" 10 20 | wc -l) -eq 20 && "$want" == "$got" ]] \
    && [[ "$(grep -E '^s:20 tel' "$work/a10/main.log" | sort -u | wc -l)" -eq 1 ]] \
    && ok "resumed from step 10 (after both NaNs): steps 10-19 and the final validation loss are bit-identical" \
    || bad "resume from step 10 differs:"$'\n'"$want"$'\n'"---"$'\n'"$got"

# ---- 3. spikes: judged only once the window (128 accepted steps) is full; the window survives a resume ----
for flag in -sl -sg; do
    kind=loss-spike; [[ $flag == -sg ]] && kind=grad-spike
    d=$work/spike$flag
    "$TRAINER" "${args[@]}" -l 0 -x 160 -v 0 -n 70 $flag 0.1 -o "$d" > "$d.out" 2>&1 || bad "$flag 0.1 run failed: $(tail -n 3 "$d.out")"
    first=$(grep -E '^s:[0-9]+ skip:' "$d/main.log" | head -n 1 | sed -E 's/^s:([0-9]+) .*/\1/')
    n=$(grep -cE "^s:[0-9]+ skip:$kind " "$d/main.log")
    [[ -n "$first" && $first -ge 128 && $n -ge 3 && $n -eq $(grep -cE '^s:[0-9]+ skip:' "$d/main.log") ]] \
        && ok "$flag 0.1: no skip before the window is full (first at step $first), then $n $kind skips" \
        || bad "$flag 0.1: first skip at step ${first:-none}, $n $kind skips: $(grep -E 'skip:' "$d/main.log" | head -n 3)"
    awk '/ skip:/ { z = $NF; sub(/^z:/, "", z); z += 0; if (!(z > 0.1)) bad++ } END { exit bad > 0 }' "$d/main.log" \
        && ok "$flag 0.1: every skipped step lies more than 0.1 std above the window's mean (z:... logged)" \
        || bad "$flag 0.1: a skip with z <= 0.1: $(grep 'skip:' "$d/main.log" | head -n 3)"
    drop_checkpoint "$d" 160
    "$TRAINER" "${args[@]}" -l 0 -x 160 -v 0 -n 70 $flag 0.1 -o "$d" -y 1 > "$d.2.out" 2>&1 || bad "$flag resume failed: $(tail -n 3 "$d.2.out")"
    want=$(steps_lines "$d/main.log" 140 160 | head -n 20); got=$(steps_lines "$d/main.log" 140 160 | tail -n 20)
    grep -q "(from 140)" "$d.2.out" && [[ $(steps_lines "$d/main.log" 140 160 | wc -l) -eq 40 && "$want" == "$got" ]] \
        && ok "$flag 0.1 resumed from step 140: the same losses and skip decisions, bit for bit" \
        || bad "$flag 0.1 resume differs:"$'\n'"$want"$'\n'"---"$'\n'"$got"
done

# ---- 4. FP8: the skipped step's amaxes do not outlive it ----
if [[ "$(basename "$TRAINER")" == *_fp8 ]]; then
    LLMC_TEST_NAN_AT=grad:2 "$TRAINER" "${args[@]}" -x 5 -v 0 -lq 1 -o "$work/f" > "$work/f.out" 2>&1 || bad "the -lq run failed: $(tail -n 3 "$work/f.out")"
    nan2=$(grep -cE '^s:2 lq:l[0-9]+\.[a-z]+\.dy amax:-?nan' "$work/f/main.log")
    bad3=$(grep -E '^s:[34] lq:' "$work/f/main.log" | grep -ciE 'amax:-?(nan|inf)')
    n3=$(grep -cE '^s:3 lq:' "$work/f/main.log")
    [[ $nan2 -gt 0 ]] && ok "the NaN of step 2's backward reaches the FP8 gradient amaxes ($nan2 of them nan)" \
        || bad "no nan dy amax at step 2: $(grep -E '^s:2 lq:.*\.dy ' "$work/f/main.log" | head -n 2)"
    [[ $n3 -eq 72 && $bad3 -eq 0 ]] && grep -qE '^s:2 skip:nan-grad' "$work/f/main.log" \
        && ok "after the skipped step 2, every FP8 amax of steps 3 and 4 is finite (72 tensors)" \
        || bad "step 3: $n3 telemetry lines, $bad3 non-finite amaxes at steps 3-4"
    awk '/^s:[0-9]+ trl:/ { split($2, v, ":"); if (v[2] !~ /^[0-9]+\.[0-9]+$/) bad++ } END { exit bad > 0 }' "$work/f/main.log" \
        && ok "FP8: every train loss after the skipped step is finite" || bad "FP8: a non-finite loss after the skip"
fi
echo "nan skip tests: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
