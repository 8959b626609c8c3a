#!/usr/bin/env bash
# resume_cli.sh TRAINER: the trainer's own checkpoint/resume path, end to end (needs a GPU).
# Run B trains 20 steps with a checkpoint every 5; its step-20 checkpoint is then deleted (as if the
# job had died after step 15) and B is resumed with -y 1. The resumed steps 15..19 must log exactly
# the losses and norms B logged the first time (main.log keeps both). The comparison is within B
# because a fresh run autotunes its GEMM algorithms (-ga 1) and two fresh runs may choose differently;
# the checkpoint carries B's choices. Run A (-ga 0: the heuristic's algorithms) must log exactly the
# same for a fresh run with -ga 0 (run A0): bit-reproducible runs from scratch. Also checks -nk pruning.
set -u
TRAINER=${1:?usage: resume_cli.sh path/to/train_gpt_bf16}
passed=0; failed=0
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
ok() { echo "[PASS] $1"; passed=$((passed + 1)); }
bad() { echo "[FAIL] $1"; failed=$((failed + 1)); }
args=(-e d6 -b 4 -t 64 -x 20 -u 5 -v 10 -m 2 -s 0)
"$TRAINER" "${args[@]}" -ga 0 -o "$work/a" > "$work/a.out" 2>&1 || bad "run A failed: $(tail -n 2 "$work/a.out")"
"$TRAINER" "${args[@]}" -ga 0 -x 5 -v 0 -o "$work/a0" > "$work/a0.out" 2>&1 || bad "run A0 failed: $(tail -n 2 "$work/a0.out")"
[[ -n "$(grep -E '^s:[0-4] trl' "$work/a0/main.log")" && "$(grep -E '^s:[0-4] trl' "$work/a/main.log")" == "$(grep -E '^s:[0-4] trl' "$work/a0/main.log")" ]] \
    && ok "two fresh runs with -ga 0 log the same 5 losses, bit for bit" || bad "fresh -ga 0 runs differ"
"$TRAINER" "${args[@]}" -o "$work/b" -n 5 -nk 2 > "$work/b.out" 2>&1 || bad "run B failed: $(tail -n 2 "$work/b.out")"
kept=$(ls "$work/b" | grep -c '^DONE_')
[[ $kept -eq 2 && -f "$work/b/DONE_00000020" && -f "$work/b/DONE_00000015" ]] && ok "-nk 2 keeps the newest 2 checkpoints" || bad "-nk 2 left: $(ls "$work/b" | tr '\n' ' ')"
rm -f "$work/b/DONE_00000020" "$work/b/model_00000020.bin" "$work/b/state_00000020_00000.bin"
"$TRAINER" "${args[@]}" -o "$work/b" -y 1 > "$work/b2.out" 2>&1 || bad "resume failed: $(tail -n 2 "$work/b2.out")"
grep -q "from 15" "$work/b2.out" && ok "resumed from the newest complete checkpoint (step 15)" || bad "did not resume from step 15: $(grep steps "$work/b2.out")"
want=$(grep -E '^s:(1[5-9]) trl' "$work/b/main.log" | head -n 5)
got=$(grep -E '^s:(1[5-9]) trl' "$work/b/main.log" | tail -n 5)
if [[ $(grep -cE '^s:(1[5-9]) trl' "$work/b/main.log") -eq 10 && "$want" == "$got" ]]; then
    ok "resumed steps 15-19 log the same losses, norms and lr as before the interruption"
else bad "resumed losses differ:"$'\n'"$want"$'\n'"---"$'\n'"$got"; fi
[[ $(grep -cE '^s:20 tel' "$work/b/main.log") -eq 2 && "$(grep -E '^s:20 tel' "$work/b/main.log" | head -n 1)" == "$(grep -E '^s:20 tel' "$work/b/main.log" | tail -n 1)" ]] \
    && ok "final validation loss identical" || bad "final validation loss differs"
# an llm.c model file as the starting point (-e path): the reference's FP32 model file, if present
if [[ -f dev/reference/out/ref_model.bin ]]; then
    "$TRAINER" -e dev/reference/out/ref_model.bin -b 4 -t 64 -x 2 -v 0 -s 0 > "$work/e.out" 2>&1 \
        && ok "trains from an llm.c model file (-e ref_model.bin)" || bad "-e ref_model.bin failed: $(tail -n 2 "$work/e.out")"
else
    echo "[SKIP] training from an llm.c model file (-e): dev/reference/out/ref_model.bin is missing" \
         "(dev/reference/gpt_reference.py --write-reference writes it; make test does so first)"
fi
# a checkpoint of another recipe: refused, unless -cr 1 asks for the conversion
other=""
case "$(basename "$TRAINER")" in
    *_bf16) other=$(dirname "$TRAINER")/train_gpt_fp8 ;;
    *) other=$(dirname "$TRAINER")/train_gpt_bf16 ;;
esac
if [[ -n "$other" && -x "$other" ]]; then
    cp -r "$work/b" "$work/c"
    rm -f "$work/c/DONE_00000020" "$work/c/model_00000020.bin" "$work/c/state_00000020_00000.bin"
    out=$("$other" "${args[@]}" -o "$work/c" -y 1 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q "recipe" <<<"$out" && grep -q -- "-cr 1" <<<"$out" \
        && ok "$(basename "$other") refuses this recipe's checkpoint, naming -cr 1" || bad "cross-recipe resume not refused (exit $rc): $(tail -n 2 <<<"$out")"
    "$other" "${args[@]}" -o "$work/c" -y 1 -cr 1 > "$work/c.out" 2>&1 && grep -q "from 15" "$work/c.out" \
        && ok "$(basename "$other") -cr 1 continues this recipe's checkpoint" || bad "-cr 1 failed: $(tail -n 2 "$work/c.out")"
fi
# quantization telemetry: -lq N writes one line per quantized tensor every N steps (quantized recipes)
if [[ "$(basename "$TRAINER")" == *_fp8 ]]; then
    "$TRAINER" "${args[@]}" -x 4 -v 0 -lq 2 -o "$work/t" > "$work/t.out" 2>&1 || bad "-lq run failed: $(tail -n 2 "$work/t.out")"
    # d6: 6 layers x 4 linears x 3 tensors (w, x, dy), at steps 0 and 2
    n=$(grep -cE '^s:[02] lq:l[0-9]+\.(qkv|attproj|fc|fcproj)\.(w|x|dy) amax:[0-9.e+-]+ scale:[0-9.e+-]+ sat:[0-9.e+-]+ ftz:[0-9.e+-]+$' "$work/t/main.log")
    [[ $n -eq 144 ]] && ok "-lq 2 logs 72 tensors at steps 0 and 2 (144 lines)" || bad "-lq 2 logged $n telemetry lines, expected 144"
    "$TRAINER" "${args[@]}" -x 2 -v 0 -lq 1 -sqf 2 -sql 1 -o "$work/u" > "$work/u.out" 2>&1 || bad "-sqf/-sql run failed"
    layers=$(grep -oE '^s:0 lq:l[0-9]+' "$work/u/main.log" | sort -u | sed 's/.*lq:l//' | tr '\n' ' ')
    [[ "$layers" == "2 3 4 " ]] && ok "-sqf 2 -sql 1 quantizes layers 2-4 of 6" || bad "-sqf 2 -sql 1 quantized layers: $layers"
fi
if [[ "$(basename "$TRAINER")" == *_nvfp4 ]]; then
    "$TRAINER" "${args[@]}" -x 4 -v 0 -lq 2 -o "$work/t" > "$work/t.out" 2>&1 || bad "-lq run failed: $(tail -n 2 "$work/t.out")"
    # d6 keeps its last layer in BF16 by default: 5 layers x 4 linears x 5 tensors, at steps 0 and 2
    n=$(grep -cE '^s:[02] lq:l[0-4]\.(qkv|attproj|fc|fcproj)\.(w|x|x_wgrad|dy|dy_wgrad) amax:[0-9.e+-]+ err:[0-9.e+-]+ ftz:[0-9.e+-]+$' "$work/t/main.log")
    [[ $n -eq 200 ]] && ok "-lq 2 logs 100 NVFP4 tensors at steps 0 and 2 (200 lines)" || bad "-lq 2 logged $n telemetry lines, expected 200"
    # every tensor's relative quantization error lies in the range FP4 gives (0 < err < 0.5)
    awk '/ lq:/ { split($4, e, ":"); if (!(e[2] > 0.0 && e[2] < 0.5)) bad++ } END { exit bad > 0 }' "$work/t/main.log" \
        && ok "every NVFP4 tensor's relative error lies in (0, 0.5)" || bad "NVFP4 telemetry errors out of range: $(grep ' lq:' "$work/t/main.log" | head -n 3)"
    "$TRAINER" "${args[@]}" -x 2 -v 0 -lq 1 -sqf 2 -sql 1 -o "$work/u" > "$work/u.out" 2>&1 || bad "-sqf/-sql run failed"
    layers=$(grep -oE '^s:0 lq:l[0-9]+' "$work/u/main.log" | sort -u | sed 's/.*lq:l//' | tr '\n' ' ')
    [[ "$layers" == "2 3 4 " ]] && ok "-sqf 2 -sql 1 quantizes layers 2-4 of 6" || bad "-sqf 2 -sql 1 quantized layers: $layers"
    # resuming with other NVFP4 options is refused, naming them
    out=$("$TRAINER" "${args[@]}" -o "$work/b" -y 1 -rht 0 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q -- "-rht" <<<"$out" && ok "resuming with another -rht is refused, naming it" \
        || bad "resume with -rht 0 not refused (exit $rc): $(tail -n 2 <<<"$out")"
fi
if [[ "$(basename "$TRAINER")" == *_vcast ]]; then
    # the datatypes are recorded in main.log
    grep -q "weights mxfp8e4" "$work/a/main.log" && grep -q "gradients mxfp8e5" "$work/a/main.log" \
        && ok "main.log records the vcast datatypes" || bad "main.log lacks the datatypes: $(grep '^# vcast' "$work/a/main.log")"
    "$TRAINER" "${args[@]}" -x 2 -v 0 -lq 1 -qw mxfp4e2 -qa bfp16 -qg mxfp8e5 -o "$work/t" > "$work/t.out" 2>&1 || bad "-lq run failed: $(tail -n 2 "$work/t.out")"
    # d6: 6 layers x 4 linears x 6 cast tensors, at steps 0 and 1
    n=$(grep -cE '^s:[01] lq:l[0-5]\.(qkv|attproj|fc|fcproj)\.(w|w_dgrad|x|x_wgrad|dy|dy_wgrad) err:[0-9.e+-]+ ftz:[0-9.e+-]+$' "$work/t/main.log")
    [[ $n -eq 288 ]] && ok "-lq 1 logs 144 cast tensors at steps 0 and 1 (288 lines)" || bad "-lq 1 logged $n telemetry lines, expected 288"
    # E2M1 weights (2 significant bits) err more than E5M2 gradients (3), which err more than BFP16
    # activations (8-bit integers sharing a scale per 8 values)
    mean() { grep -E "^s:1 lq:.*\.$1 " "$work/t/main.log" | sed -E 's/.* err:([^ ]+).*/\1/' | awk '{s+=$1} END {print s/NR}'; }
    w=$(mean w); x=$(mean x); g=$(mean dy)
    awk -v w="$w" -v x="$x" -v g="$g" 'BEGIN { exit !(w > g && g > x && x > 0) }' \
        && ok "relative errors order as the formats do: mxfp4e2 $w > mxfp8e5 $g > bfp16 $x" || bad "error order: w $w, dy $g, x $x"
    out=$("$TRAINER" "${args[@]}" -o "$work/b" -y 1 -qw mxfp6e2 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q -- "-qw" <<<"$out" && ok "resuming with another -qw is refused, naming it" \
        || bad "resume with -qw mxfp6e2 not refused (exit $rc): $(tail -n 2 <<<"$out")"
    out=$("$TRAINER" -qw mxfp9e9 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q "mxfp9e9" <<<"$out" && ok "a bad datatype is a clear error naming it" || bad "bad -qw accepted (exit $rc)"
fi
# Q1.15: -Q 115 verifies the binary (its device boundaries against the CPU codec), and -lq logs
# the clamp fractions of every boundary
if [[ "$(basename "$TRAINER")" == *_q115 ]]; then
    "$TRAINER" -e d6 -b 4 -t 64 -x 2 -v 0 -s 0 -Q 115 -lq 1 -o "$work/q" > "$work/q.out" 2>&1 \
        && grep -q "boundaries verified on the device" "$work/q.out" \
        && ok "-Q 115 verifies the device's Q1.15 boundaries" || bad "-Q 115 failed: $(tail -n 2 "$work/q.out")"
    n=$(grep -c "^s:[0-9]* lq:q115\.[a-z_]* clamp:" "$work/q/main.log")
    [[ "$n" -eq 24 ]] && ok "-lq 1 logs the 12 Q1.15 boundaries at each of 2 steps" || bad "-lq 1 logged $n Q1.15 lines, not 24"
fi
if [[ "$(basename "$TRAINER")" == *_tcfp12 ]]; then
    grep -q "^# tcfp12: TCFP-12 per tensor, EF" "$work/a/main.log" && ok "main.log records the TCFP-12 options" \
        || bad "main.log lacks the TCFP-12 options: $(grep '^# tcfp12' "$work/a/main.log")"
    "$TRAINER" "${args[@]}" -x 4 -v 0 -lq 2 -o "$work/t" > "$work/t.out" 2>&1 || bad "-lq run failed: $(tail -n 2 "$work/t.out")"
    # d6: 6 layers x 4 linears: the weight split and x, dy, at steps 0 and 2
    nw=$(grep -cE '^s:[02] lq:l[0-5]\.(qkv|attproj|fc|fcproj)\.w amax:[0-9.e+-]+ lo_amax:[0-9.e+-]+ hi_scale:[0-9.e+-]+ lo_scale:[0-9.e+-]+ lo_zero:[0-9.e+-]+ err:[0-9.e+-]+ sat:[0-9.e+-]+$' "$work/t/main.log")
    na=$(grep -cE '^s:[02] lq:l[0-5]\.(qkv|attproj|fc|fcproj)\.(x|dy) amax:[0-9.e+-]+ scale:[0-9.e+-]+ sat:[0-9.e+-]+ ftz:[0-9.e+-]+ spec:[0-9]+ redo:[0-9.e+-]+$' "$work/t/main.log")
    [[ $nw -eq 48 && $na -eq 96 ]] && ok "-lq 2 logs the split of 24 weights and 48 operands at steps 0 and 2" \
        || bad "-lq 2 logged $nw weight and $na operand lines, expected 48 and 96"
    # speculative fresh scales: step 1 (no telemetry) quantized the two projections' inputs speculatively
    ns=$(grep -cE '^s:2 lq:l[0-5]\.(attproj|fcproj)\.x .* spec:[1-9][0-9]* redo:' "$work/t/main.log")
    [[ $ns -eq 12 ]] && ok "the step-2 telemetry counts the speculative passes of step 1 (12 projection inputs)" \
        || bad "$ns of 12 projection inputs logged speculative passes at step 2"
    # the split error of a BF16 weight: W_hi + W_lo hold it to well under 1% (E4M3 alone: ~3%)
    awk '/ lq:.*\.w / { split($8, e, ":"); if (!(e[2] > 0.0 && e[2] < 0.01)) bad++ } END { exit bad > 0 }' "$work/t/main.log" \
        && ok "every weight's relative split error lies in (0, 1%)" || bad "split errors out of range: $(grep ' lq:.*\.w ' "$work/t/main.log" | head -n 2)"
    out=$("$TRAINER" "${args[@]}" -o "$work/b" -y 1 -tabd 1 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q -- "-tabd" <<<"$out" && ok "resuming with another -tabd is refused, naming it" \
        || bad "resume with -tabd 1 not refused (exit $rc): $(tail -n 2 <<<"$out")"
    out=$("$TRAINER" -tsrr 1 -tpdds 1 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q "mutually exclusive" <<<"$out" && ok "-tsrr 1 -tpdds 1 is refused (the two exclude each other)" \
        || bad "-tsrr 1 -tpdds 1 accepted (exit $rc)"
    # resume is bit-exact under the other options too: per block with PDDS (state per group), SRR, and
    # per tensor with ABD, FP8 wgrad and fast accumulation (no W_lo^T under ABD)
    for opts in "-tb 64 -tpdds 1 -tabd 1" "-tsrr 1 -tfw 1" "-tabd 1 -tfw 1 -tfa 1"; do
        d=$work/o${opts// /}
        "$TRAINER" "${args[@]}" $opts -x 12 -v 0 -o "$d.b" -n 6 > "$d.b.out" 2>&1 || bad "run with $opts failed: $(tail -n 2 "$d.b.out")"
        rm -f "$d.b/DONE_00000012" "$d.b/model_00000012.bin" "$d.b/state_00000012_00000.bin"
        "$TRAINER" "${args[@]}" $opts -x 12 -v 0 -o "$d.b" -y 1 > "$d.b2.out" 2>&1 || bad "resume with $opts failed: $(tail -n 2 "$d.b2.out")"
        want=$(grep -E '^s:(6|7|8|9|10|11) trl' "$d.b/main.log" | head -n 6); got=$(grep -E '^s:(6|7|8|9|10|11) trl' "$d.b/main.log" | tail -n 6)
        [[ $(grep -cE '^s:(6|7|8|9|10|11) trl' "$d.b/main.log") -eq 12 ]] || got="(not logged twice)"
        [[ -n "$want" && "$want" == "$got" ]] && ok "$opts: resumed steps 6-11 are bit-identical" \
            || bad "$opts: resumed losses differ:"$'\n'"$want"$'\n'"---"$'\n'"$got"
    done
fi
# one trainer per -o, and a kill -9 in the middle of checkpointing loses nothing (a checkpoint every step,
# so the kill lands in or near a write)
if [[ "$(basename "$TRAINER")" == *_bf16 ]]; then
    "$TRAINER" "${args[@]}" -x 100000 -v 0 -n 1 -nk 3 -o "$work/k" > "$work/k.out" 2>&1 &
    first=$!
    for _ in $(seq 1200); do [[ $(ls "$work/k"/DONE_* 2>/dev/null | wc -l) -ge 2 ]] && break; sleep 0.1; done
    out=$("$TRAINER" "${args[@]}" -o "$work/k" -y 1 2>&1); rc=$?
    [[ $rc -ne 0 ]] && grep -q "in use by another trainer (pid $first on " <<<"$out" \
        && ok "a second trainer on a busy -o is refused at once, naming the first" \
        || bad "a second trainer on a busy -o: exit $rc, $(tail -n 2 <<<"$out")"
    sleep "0.$((RANDOM % 10))"; kill -9 "$first"; wait "$first" 2>/dev/null
    newest=$(ls "$work/k" | sed -nE 's/^DONE_0*([0-9]+)$/\1/p' | sort -n | tail -n 1)
    logged=$(grep -c '^s:[0-9]* trl' "$work/k/main.log")
    "$TRAINER" "${args[@]}" -x $((newest + 2)) -v 0 -n 1 -nk 3 -o "$work/k" -y 1 > "$work/k2.out" 2>&1; rc=$?
    [[ $rc -eq 0 && -n "$newest" ]] && grep -q "(from $newest)" "$work/k2.out" \
        && ok "after kill -9 the run resumes from its newest complete checkpoint (step $newest)" \
        || bad "resume after kill -9 (newest DONE: ${newest:-none}): exit $rc, $(tail -n 2 "$work/k2.out")"
    [[ $(grep -c '^s:[0-9]* trl' "$work/k/main.log") -eq $((logged + 2)) && "$(head -c 9 "$work/k/main.log")" == "# recipe:" ]] \
        && ok "main.log keeps the killed run's lines and goes on after them" || bad "main.log lost lines after kill -9 and resume"
fi
echo "resume tests: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
