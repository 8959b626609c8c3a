#!/usr/bin/env bash
# fp8_modes.sh TRAINER: the FP8 recipe's scaling modes other than the default (-fs current, -fs block, and
# -fs block -fbg e5m2 -fp2 1) end to end through the trainer (needs a GPU; resume_cli.sh covers -fs delayed).
# Per mode: main.log names the mode; a run with a checkpoint every 5 steps, its step-20 checkpoint deleted and
# resumed (-y 1), logs steps 15-19 again bit for bit; resuming its checkpoint under the default mode is refused,
# naming -fs and -cr 1, and -cr 1 continues it; -lq 2 logs every quantized tensor at steps 0 and 2 in the
# mode's format (block scaling: no per-tensor scale, the spread of the block scales instead). Then the FP8 LM
# head (-flh 1) the same way, below.
set -u
TRAINER=${1:?usage: fp8_modes.sh path/to/train_gpt_fp8}
passed=0; failed=0
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ok() { echo "[PASS] $1"; passed=$((passed + 1)); }
bad() { echo "[FAIL] $1"; failed=$((failed + 1)); }
args=(-e d6 -b 4 -t 64 -x 20 -u 5 -v 10 -m 2 -s 0)
num='[0-9.e+-]+'
for mode in "current" "block" "block -fbg e5m2 -fp2 1"; do
    read -ra flags <<<"-fs $mode"
    name=${mode// /_}
    d="$work/$name"
    "$TRAINER" "${args[@]}" "${flags[@]}" -o "$d" -n 5 > "$d.out" 2>&1 || bad "-fs $mode: run failed: $(tail -n 2 "$d.out")"
    grep -q "^# fp8: .*${mode%% *} scaling" "$d/main.log" && ok "-fs $mode: main.log names the scaling mode" \
        || bad "-fs $mode: main.log lacks the mode: $(grep '^# fp8' "$d/main.log")"
    # resume bit for bit
    cp -r "$d" "$d.other"
    rm -f "$d/DONE_00000020" "$d/model_00000020.bin" "$d/state_00000020_00000.bin"
    "$TRAINER" "${args[@]}" "${flags[@]}" -o "$d" -y 1 > "$d.resume.out" 2>&1 || bad "-fs $mode: resume failed: $(tail -n 2 "$d.resume.out")"
    want=$(grep -E '^s:(1[5-9]) trl' "$d/main.log" | head -n 5)
    got=$(grep -E '^s:(1[5-9]) trl' "$d/main.log" | tail -n 5)
    if [[ $(grep -cE '^s:(1[5-9]) trl' "$d/main.log") -eq 10 && "$want" == "$got" ]]; then
        ok "-fs $mode: resumed steps 15-19 log the same losses, norms and lr as before the interruption"
    else bad "-fs $mode: resumed losses differ:"$'\n'"$want"$'\n'"---"$'\n'"$got"; fi
    # another mode: refused unless -cr 1
    o="$d.other"
    rm -f "$o/DONE_00000020" "$o/model_00000020.bin" "$o/state_00000020_00000.bin"
    out=$("$TRAINER" "${args[@]}" -o "$o" -y 1 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q -- "-fs" <<<"$out" && grep -q -- "-cr 1" <<<"$out" \
        && ok "-fs $mode: resuming its checkpoint under -fs delayed is refused, naming -fs and -cr 1" \
        || bad "-fs $mode: resume under another mode not refused (exit $rc): $(tail -n 2 <<<"$out")"
    "$TRAINER" "${args[@]}" -o "$o" -y 1 -cr 1 > "$o.out" 2>&1 && grep -q "from 15" "$o.out" \
        && ok "-fs $mode: -cr 1 continues its checkpoint under -fs delayed" || bad "-fs $mode: -cr 1 failed: $(tail -n 2 "$o.out")"
    # telemetry: d6, 6 layers x 4 linears x 3 tensors (w, x, dy), at steps 0 and 2
    "$TRAINER" "${args[@]}" "${flags[@]}" -x 4 -v 0 -lq 2 -o "$d.t" > "$d.t.out" 2>&1 || bad "-fs $mode: -lq run failed: $(tail -n 2 "$d.t.out")"
    if [[ $mode == current ]]; then
        line="amax:$num scale:$num sat:$num ftz:$num"
    else
        line="amax:$num sat:$num ftz:$num log2s:-?[0-9]+/-?[0-9]+/-?[0-9]+"
    fi
    n=$(grep -cE "^s:[02] lq:l[0-9]+\.(qkv|attproj|fc|fcproj)\.(w|x|dy) $line\$" "$d.t/main.log")
    [[ $n -eq 144 ]] && ok "-fs $mode: -lq 2 logs 72 tensors at steps 0 and 2 (144 lines)" \
        || bad "-fs $mode: -lq 2 logged $n telemetry lines in its format, expected 144: $(grep ' lq:' "$d.t/main.log" | head -n 2)"
    if [[ $mode != current ]]; then
        # block scales fit each block: at most a block's largest value lands past FP8_MAX, by the rounding of
        # s = FP8_MAX / amax (under 1% of the values; a misplaced scale saturates far more)
        awk '/ lq:/ { split($4, e, ":"); if (!(e[2] + 0 < 0.01)) bad++ } END { exit bad > 0 }' "$d.t/main.log" \
            && ok "-fs $mode: under 1% of the values saturate under block scales" || bad "-fs $mode: saturated values: $(grep ' lq:' "$d.t/main.log" | head -n 2)"
    fi
done
# The FP8 LM head (-flh 1): main.log says so; its losses are not the BF16 head's (the FP8 GEMMs ran) but stay
# within FP8's reach of them; a resume from its step-15 checkpoint logs steps 15-19 again bit for bit.
d="$work/head"
"$TRAINER" "${args[@]}" -flh 1 -o "$d" -n 5 > "$d.out" 2>&1 || bad "-flh 1: run failed: $(tail -n 2 "$d.out")"
grep -q "^# fp8: .*LM head's forward and input gradient in FP8" "$d/main.log" && ok "-flh 1: main.log names the FP8 LM head" \
    || bad "-flh 1: main.log lacks the FP8 LM head: $(grep '^# fp8' "$d/main.log")"
"$TRAINER" "${args[@]}" -o "$d.bf16head" > "$d.bf16head.out" 2>&1 || bad "-flh 0: run failed: $(tail -n 2 "$d.bf16head.out")"
l8=$(grep -E '^s:19 trl' "$d/main.log" | sed -E 's/.*trl:([0-9.]+).*/\1/')
l16=$(grep -E '^s:19 trl' "$d.bf16head/main.log" | sed -E 's/.*trl:([0-9.]+).*/\1/')
awk -v a="${l8:-x}" -v b="${l16:-y}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a + 0 > 0 && a != b && d < 0.05 * b) }' \
    && ok "-flh 1: step 19's loss $l8 differs from the BF16 head's $l16, by under 5%" \
    || bad "-flh 1: step 19's loss '$l8' against the BF16 head's '$l16' (want different, within 5%)"
rm -f "$d/DONE_00000020" "$d/model_00000020.bin" "$d/state_00000020_00000.bin"
"$TRAINER" "${args[@]}" -flh 1 -o "$d" -y 1 > "$d.resume.out" 2>&1 || bad "-flh 1: resume failed: $(tail -n 2 "$d.resume.out")"
want=$(grep -E '^s:(1[5-9]) trl' "$d/main.log" | head -n 5)
got=$(grep -E '^s:(1[5-9]) trl' "$d/main.log" | tail -n 5)
if [[ $(grep -cE '^s:(1[5-9]) trl' "$d/main.log") -eq 10 && "$want" == "$got" ]]; then
    ok "-flh 1: resumed steps 15-19 log the same losses, norms and lr as before the interruption"
else bad "-flh 1: resumed losses differ:"$'\n'"$want"$'\n'"---"$'\n'"$got"; fi
echo "fp8 scaling modes: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
