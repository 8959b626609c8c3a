#!/usr/bin/env bash
# bad_input.sh TRAINER: runs the trainer binary on bad input and checks that each case exits
# non-zero with one clear message, and that nothing on disk was touched. These checks all happen
# before the GPU is used, so they run on machines without one. Prints "N passed, N failed".
set -u
TRAINER=${1:?usage: bad_input.sh path/to/train_gpt_bf16}
passed=0; failed=0
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

# write_shard FILE NTOKENS [MAGIC] [VERSION] [MAXTOKEN] [CLAIMED]: an llm.c token shard
write_shard() {
    python3 - "$@" <<'PY'
import struct, sys, random
path, n = sys.argv[1], int(sys.argv[2])
magic = int(sys.argv[3]) if len(sys.argv) > 3 else 20240520
version = int(sys.argv[4]) if len(sys.argv) > 4 else 1
maxtok = int(sys.argv[5]) if len(sys.argv) > 5 else 50256
claimed = int(sys.argv[6]) if len(sys.argv) > 6 else n
header = [0] * 256
header[0], header[1], header[2] = magic, version, claimed
rng = random.Random(0)
tokens = [rng.randrange(0, 50257) for _ in range(n)]
if maxtok > 50256: tokens[n // 2] = maxtok
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%dH" % n, *tokens))
PY
}

# expect_error NAME FRAGMENT ARGS...: non-zero exit and FRAGMENT in the output
expect_error() {
    local name=$1 fragment=$2; shift 2
    local out rc
    out=$("$TRAINER" "$@" 2>&1); rc=$?
    if [[ $rc -ne 0 ]] && grep -qF -- "$fragment" <<<"$out"; then
        echo "[PASS] $name (exit $rc): $(grep -F -- "$fragment" <<<"$out" | head -n 1 | cut -c1-150)"
        passed=$((passed + 1))
    else
        echo "[FAIL] $name: exit $rc, expected '$fragment' in: $(tail -n 2 <<<"$out")"
        failed=$((failed + 1))
    fi
}

good="$work/good.bin"; write_shard "$good" 20000
write_shard "$work/badmagic.bin" 20000 12345
write_shard "$work/badversion.bin" 20000 20240520 7
write_shard "$work/badtoken.bin" 20000 20240520 1 60000
write_shard "$work/truncated.bin" 20000 20240520 1 50256 30000
write_shard "$work/tiny.bin" 100
base=(-i "$good" -j "$good" -b 2 -t 64 -x 1 -s 0)

# flags
expect_error "unknown flag" "unknown flag" "${base[@]}" -zz 1
expect_error "unknown flag prints the usage" "usage:" "${base[@]}" -zz 1
expect_error "flag without a value" "-b" "${base[@]}" -b
expect_error "non-numeric value" "expected an integer" "${base[@]}" -b 4x
expect_error "bad float" "-l" "${base[@]}" -l abc
expect_error "unknown schedule" "-k" "${base[@]}" -k triangle
expect_error "-q out of range" "-q" "${base[@]}" -q 1.5
expect_error "-r out of range" "-r" "${base[@]}" -r 3
expect_error "-d not divisible by B*T" "-d" "${base[@]}" -d 1000
expect_error "-t longer than the model's maxT" "maximum sequence length" "${base[@]}" -t 2048
expect_error "unknown model descriptor" "d13" "${base[@]}" -e d13
expect_error "-y without -o" "-o" "${base[@]}" -y 1
# a recipe name other than the binary's own (its name is the suffix of train_gpt_<recipe>)
other_recipe=fp8; [[ "$(basename "$TRAINER")" == *_fp8 ]] && other_recipe=bf16
expect_error "-Q of another recipe" "recipe" "${base[@]}" -Q "$other_recipe"
[[ "$(basename "$TRAINER")" != *_q115 ]] && expect_error "-Q 115 on a binary that is not Q1.15" "recipe" "${base[@]}" -Q 115
expect_error "-cr not 0/1" "-cr" "${base[@]}" -cr 2
# the recipe's flags: its own are checked by the recipe; another recipe's flag is refused, naming this one
recipe=$(basename "$TRAINER"); recipe=${recipe#train_gpt_}
case "$recipe" in
    fp8)
        expect_error "-fh out of range" "-fh 0: the amax history" "${base[@]}" -fh 0
        expect_error "-lq without -o" "-lq 10: the telemetry goes to main.log" "${base[@]}" -lq 10 ;;
    nvfp4) expect_error "-rht not 0/1" "-rht 2: must be 0 or 1" "${base[@]}" -rht 2 ;;
    vcast) expect_error "vcast: unknown datatype" "mxfp9e9" "${base[@]}" -qw mxfp9e9 ;;
    q115) expect_error "-lq without -o" "-lq 10: the telemetry goes to main.log" "${base[@]}" -lq 10 ;;
    tcfp12)
        expect_error "tcfp12: SRR with PDDS" "mutually exclusive" -tsrr 1 -tpdds 1
        expect_error "tcfp12: bad block size" "-tb 48" -tb 48 ;;
    example) expect_error "example: unknown weight format" "-wf e3m4: the weight format must be e4m3 or e5m2" "${base[@]}" -wf e3m4 ;;
esac
other_flag=-fh; [[ "$recipe" == fp8 ]] && other_flag=-tb
expect_error "a flag of another recipe" "unknown flag '$other_flag': not a flag of the $recipe recipe (train_gpt_$recipe -h lists them)" \
    "${base[@]}" "$other_flag" 1
# several processes
expect_error "-pn 2 without a way to exchange the NCCL id" "-pf DIR" "${base[@]}" -pn 2 -pr 0
expect_error "-pr outside [0, -pn)" "-pr 2" "${base[@]}" -pn 2 -pr 2 -pf "$work"
expect_error "-z out of range" "-z 2" "${base[@]}" -z 2
expect_error "unknown -pi" "-pi mpi" "${base[@]}" -pi mpi
expect_error "-ps without a port" "HOST:PORT" "${base[@]}" -pn 2 -pr 1 -ps localhost -pt 1
LLMC_WORLD_SIZE=x LLMC_RANK=0 expect_error "a launcher's environment that is not a number" "LLMC_WORLD_SIZE='x'" "${base[@]}"
expect_error "ZeRO-1 over a process count that does not divide C" "divide" "${base[@]}" -pn 5 -pr 0 -pf "$work"
# data
expect_error "missing shard" "no file matches" -i "$work/nothing_*.bin" -j "$good" -b 2 -t 64
expect_error "wrong magic" "not a token shard" -i "$work/badmagic.bin" -j "$good" -b 2 -t 64
expect_error "wrong version" "version" -i "$work/badversion.bin" -j "$good" -b 2 -t 64
expect_error "truncated shard" "truncated" -i "$work/truncated.bin" -j "$good" -b 2 -t 64
expect_error "token id >= vocab" "vocab size" -i "$work/badtoken.bin" -j "$good" -b 2 -t 64
expect_error "bad validation shard" "badmagic.bin" -i "$good" -j "$work/badmagic.bin" -b 2 -t 64
expect_error "shard smaller than one batch" "fewer than one batch" -i "$work/tiny.bin" -j "$good" -b 2 -t 64
# checkpoints and output
head -c 4096 /dev/urandom > "$work/garbage.bin"
expect_error "-e file that is not a model" "not an llm.c model file" "${base[@]}" -e "$work/garbage.bin"
expect_error "-e missing file" "cannot open" "${base[@]}" -e "$work/missing_model.bin"
expect_error "unwritable -o" "not writable" "${base[@]}" -o /proc/llmc_cannot_write_here
# a complete checkpoint of a smaller model in -o, resumed with -e d12
ck="$work/ck"; mkdir -p "$ck"
python3 - "$ck/model_00000010.bin" <<'PY'
import struct, sys
maxT, V, L, NH, C, Vp = 64, 50257, 1, 1, 64, 50304
n = Vp*C + maxT*C + L*(12*C*C + 13*C) + 2*C
h = [0]*256; h[0:8] = [20240326, 5, maxT, V, L, NH, C, Vp]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *h)); f.write(bytes(2*n))
PY
touch "$ck/state_00000010_00000.bin" "$ck/DONE_00000010"
echo "keep me" > "$ck/main.log"
expect_error "resume from a checkpoint of another shape" "shape" "${base[@]}" -o "$ck" -y 1
if [[ "$(cat "$ck/main.log")" == "keep me" ]]; then
    echo "[PASS] a failed start leaves main.log untouched"; passed=$((passed + 1))
else
    echo "[FAIL] a failed start overwrote main.log"; failed=$((failed + 1))
fi
# a truncated model file given with -e
head -c 5000 "$ck/model_00000010.bin" > "$work/truncated_model.bin"
expect_error "truncated model file" "truncated_model.bin" "${base[@]}" -e "$work/truncated_model.bin"

# sizes whose products overflow: each flag has a limit, each product is checked (once a SIGFPE)
expect_error "-b -t -pn -d whose product overflows 64 bits" "-b 1073741824: the micro-batch size must be between 1 and" \
    "${base[@]}" -b 1073741824 -t 1073741824 -pn 16 -pr 0 -pf "$work" -d 5
expect_error "-b and -t each in range, B*T not" "a micro-batch of B*T = 1099511627776 tokens" "${base[@]}" -b 1048576 -t 1048576
expect_error "-d past its limit" "-d 9223372036854775807: the total batch size must be between 1 and" \
    "${base[@]}" -d 9223372036854775807
# a bad tokenizer is a warning (samples print token ids); these runs then stop at the GPU choice: rank 0 of
# two is told by the launcher's environment to use GPU 99, which no machine has
python3 - "$work/huge_vocab_tokenizer.bin" <<'PY'
import struct, sys
# a tokenizer header (magic, version 2, vocab 2^32-1, end-of-text 0) and one token, "a"
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256I", 20240328, 2, 0xFFFFFFFF, 0, *([0] * 252)) + b"\x01a")
PY
LLMC_WORLD_SIZE=2 LLMC_RANK=0 LLMC_LOCAL_RANK=99 expect_error "-tk /dev/zero is refused, not read forever" \
    "warning: tokenizer file /dev/zero is not a regular file" "${base[@]}" -s 1 -pf "$work" -tk /dev/zero
LLMC_WORLD_SIZE=2 LLMC_RANK=0 LLMC_LOCAL_RANK=99 expect_error "-tk with a huge vocab in its header" \
    "warning: tokenizer file $work/huge_vocab_tokenizer.bin is truncated" "${base[@]}" -s 1 -pf "$work" \
    -tk "$work/huge_vocab_tokenizer.bin"

echo "bad-input tests: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
