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
        expect_error "-fs not a mode" "-fs tensor: the scaling must be delayed, current or block" "${base[@]}" -fs tensor
        expect_error "-fbg without -fs block" "-fbg and -fp2 are block scaling's" "${base[@]}" -fbg e5m2
        expect_error "-fh without -fs delayed" "-fh 16: the amax history is delayed scaling's" "${base[@]}" -fs current -fh 16
        expect_error "-fm with -fs block" "-fm 2: the scale margin is delayed and current scaling's" "${base[@]}" -fs block -fm 2
        expect_error "-fp2 not 0/1" "-fp2 2: must be 0 or 1" "${base[@]}" -fs block -fp2 2
        expect_error "-flh not 0/1" "-flh 2: must be 0 or 1" "${base[@]}" -flh 2
        expect_error "-lq without -o" "-lq 10: the telemetry goes to main.log" "${base[@]}" -lq 10 ;;
    nvfp4) expect_error "-rht not 0/1" "-rht 2: must be 0 or 1" "${base[@]}" -rht 2 ;;
    vcast) expect_error "vcast: unknown datatype" "mxfp9e9" "${base[@]}" -qw mxfp9e9 ;;
    q115) expect_error "-lq without -o" "-lq 10: the telemetry goes to main.log" "${base[@]}" -lq 10 ;;
    tcfp12)
        expect_error "tcfp12: SRR with PDDS" "mutually exclusive" -tsrr 1 -tpdds 1
        expect_error "tcfp12: bad block size" "-tb 48" -tb 48 ;;
    example) expect_error "example: unknown weight format" "-wf e3m4: the weight format must be e4m3 or e5m2" "${base[@]}" -wf e3m4 ;;
esac
# -sqf / -sql that leave no layer to quantize (the recipes that have them)
case "$recipe" in fp8 | nvfp4 | vcast | tcfp12 | example)
    expect_error "-sqf beyond the model's layers" "but the model has 12, so no layer would be quantized" "${base[@]}" -sqf 100 ;;
esac
# environment switches: a bad value stops the run before the GPU (the recipe's own, and the trainer's)
case "$recipe" in
    fp8) LLMC_FP8_FUSED_GEMM=2 expect_error "bad LLMC_FP8_FUSED_GEMM" "LLMC_FP8_FUSED_GEMM must be 0" "${base[@]}" ;;
    nvfp4) LLMC_NVFP4_EMULATE=yes expect_error "bad LLMC_NVFP4_EMULATE" "LLMC_NVFP4_EMULATE must be 0" "${base[@]}" ;;
    tcfp12) LLMC_TCFP12_CONCAT=2 expect_error "bad LLMC_TCFP12_CONCAT" "LLMC_TCFP12_CONCAT must be 0" "${base[@]}" ;;
    q115) LLMC_Q115_FUSED_GEMM=on expect_error "bad LLMC_Q115_FUSED_GEMM" "LLMC_Q115_FUSED_GEMM must be 0" "${base[@]}" ;;
esac
LLMC_PROFILE=3 expect_error "bad LLMC_PROFILE" "LLMC_PROFILE must be 0 (off), 1" "${base[@]}"
# update skipping: the -sl / -sg thresholds, and the test switch LLMC_TEST_NAN_AT (kind:step, comma-separated)
expect_error "-sl below 0" "-sl -1: the z-score threshold must be a finite number >= 0 (0 = off)" "${base[@]}" -sl -1
expect_error "-sg below 0" "-sg -0.5: the z-score threshold must be a finite number >= 0" "${base[@]}" -sg -0.5
expect_error "-sg not a number" "-sg: expected a number, got '4x'" "${base[@]}" -sg 4x
expect_error "-sl nan" "-sl: expected a finite number, got 'nan'" "${base[@]}" -sl nan
expect_error "-sg inf" "-sg: expected a finite number, got 'inf'" "${base[@]}" -sg inf
for v in loss loss: grad:-1 grad:3x weights:3 "loss:5," ",grad:2" "loss:2;grad:3" LOSS:1; do
    LLMC_TEST_NAN_AT=$v expect_error "bad LLMC_TEST_NAN_AT='$v'" "LLMC_TEST_NAN_AT must be a comma-separated list of loss:STEP or grad:STEP" "${base[@]}"
done
other_flag=-fh; [[ "$recipe" == fp8 ]] && other_flag=-tb
expect_error "a flag of another recipe" "unknown flag '$other_flag': not a flag of the $recipe recipe (train_gpt_$recipe -h lists them)" \
    "${base[@]}" "$other_flag" 1
# a bad value of a flag prints the usage too
expect_error "-e of an unknown size prints the usage" "usage:" "${base[@]}" -e d13
expect_error "-t above the model's maxT prints the usage" "usage:" "${base[@]}" -t 2048
expect_error "-Q of another recipe prints the usage" "usage:" "${base[@]}" -Q "$other_recipe"
expect_error "a malformed -ps prints the usage" "usage:" "${base[@]}" -pn 2 -pr 0 -ps "nocolon"
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
# HellaSwag (-h 1): the eval file is read whole and checked before the GPU
# write_eval FILE [KIND]: three examples of four endings in llm.c's eval-file format (dev/data/hellaswag.py);
# KIND badmagic | truncated | badtoken (an id >= 50257) | long (a context of 70 tokens, for -t 64)
write_eval() {
    python3 - "$@" <<'PY'
import struct, sys
path, kind = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "good"
runs = []
for i in range(3):
    ctx = [10 + i] * (70 if kind == "long" and i == 1 else 5)
    ends = [[20 + e] * (1 + e) for e in range(4)]
    if kind == "badtoken" and i == 2: ends[3][0] = 60000
    body = [i % 4, 4, len(ctx), *ctx]
    for e in ends: body += [len(e), *e]
    runs.append([65535, 2 * (3 + len(body)), i, *body])
header = [20240522 if kind != "badmagic" else 12345, 1, 3, max(2 * len(r) for r in runs)] + [0] * 252
data = struct.pack("<256i", *header) + b"".join(struct.pack("<%dH" % len(r), *r) for r in runs)
with open(path, "wb") as f: f.write(data[:-2] if kind == "truncated" else data)
PY
}
write_eval "$work/hs_good.bin"
for kind in badmagic truncated badtoken long; do write_eval "$work/hs_$kind.bin" "$kind"; done
hs=(-i "$good" -j "$good" -b 4 -t 64 -x 1 -s 0 -h 1)
expect_error "-h 1 without the eval file" "-h 1: cannot open eval file $work/hs_missing.bin" "${hs[@]}" -hf "$work/hs_missing.bin"
expect_error "-h 1: eval file of another magic" "-h 1: $work/hs_badmagic.bin is not an eval file (magic 12345" "${hs[@]}" -hf "$work/hs_badmagic.bin"
expect_error "-h 1: truncated eval file" "-h 1: eval file $work/hs_truncated.bin, example 2" "${hs[@]}" -hf "$work/hs_truncated.bin"
expect_error "-h 1: eval token id >= vocab" "example 2: token id 60000 in its ending is >= vocab size 50257" "${hs[@]}" -hf "$work/hs_badtoken.bin"
expect_error "-h 1: an example longer than -t" "example 1: its context and ending 0 are 71 tokens, longer than -t 64" "${hs[@]}" -hf "$work/hs_long.bin"
expect_error "-h 1 with fewer rows than endings" "has 4 endings, one row each, but a batch has -b 2 rows; use -b 4 or more" \
    "${hs[@]}" -hf "$work/hs_good.bin" -b 2
expect_error "-h 1 -v 0" "-h 1: HellaSwag is scored at the validation steps" "${hs[@]}" -hf "$work/hs_good.bin" -v 0
expect_error "-h 2" "-h 2: HellaSwag is 0 (off) or 1 (on)" "${base[@]}" -h 2
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    expect_error "-h 1 with a good eval file passes every check before the GPU" "no CUDA device" "${hs[@]}" -hf "$work/hs_good.bin"
fi
# a bare -h (and --help) is the help: exit 0, the usage on stdout; -h followed by a flag is bare too
for help in "-h" "--help" "-h -b 4"; do
    out=$("$TRAINER" $help 2>/dev/null); rc=$?
    if [[ $rc -eq 0 ]] && grep -q "^usage:" <<<"$out" && grep -q -- "-h 1 is HellaSwag" <<<"$out"; then
        echo "[PASS] '$help' prints the usage and exits 0"; passed=$((passed + 1))
    else
        echo "[FAIL] '$help': exit $rc, $(head -n 1 <<<"$out")"; failed=$((failed + 1))
    fi
done
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

# expect_untouched NAME DIR LISTING: DIR's files and contents are as LISTING (from `listing DIR`) says (the
# lock file a trainer takes on an existing -o, .lock, aside)
listing() { (cd "$1" 2>/dev/null && find . \( -type f -o -type l \) ! -name .lock | sort | xargs -r md5sum) ; }
expect_untouched() {
    if [[ "$(listing "$2")" == "$3" ]]; then echo "[PASS] $1"; passed=$((passed + 1))
    else echo "[FAIL] $1: the directory's files changed"; failed=$((failed + 1)); fi
}

# ---- the output directory: one run per directory, one trainer at a time ----
# (the old run's main.log holds a loss no fresh model logs, so a replaced main.log cannot hold it by chance)
run="$work/run"; mkdir -p "$run"; echo "s:0 trl:99.25" > "$run/main.log"; touch "$run/DONE_00000005" "$run/notes.txt"
before=$(listing "$run")
expect_error "-y 0 into a directory that holds a run" "holds a run already" "${base[@]}" -o "$run"
expect_untouched "a refused -y 0 leaves the old run's files as they were" "$run" "$before"
expect_error "-ow 1 with -y 1" "-ow 1 -y 1" "${base[@]}" -o "$run" -ow 1 -y 1
# -ow 1 deletes the old run only once every check has passed, the GPU's included
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    cp -r "$run" "$work/run_ow"
    out=$("$TRAINER" "${base[@]}" -o "$work/run_ow" -ow 1 2>&1); rc=$?
    if [[ $rc -eq 0 && ! -e "$work/run_ow/DONE_00000005" && -f "$work/run_ow/notes.txt" ]] && ! grep -q "trl:99.25" "$work/run_ow/main.log"; then
        echo "[PASS] -ow 1 replaces the run in -o (its main.log and checkpoints), keeping other files"; passed=$((passed + 1))
    else
        echo "[FAIL] -ow 1: exit $rc, $(tail -n 2 <<<"$out")"; failed=$((failed + 1))
    fi
else
    expect_error "-ow 1 without a GPU" "no CUDA device" "${base[@]}" -o "$run" -ow 1
    expect_untouched "-ow 1 deletes nothing when a check fails (here: no GPU)" "$run" "$before"
    expect_error "a new -o without a GPU" "no CUDA device" "${base[@]}" -o "$work/fresh/run"
    if [[ ! -e "$work/fresh" ]]; then echo "[PASS] a run that does not start leaves no -o directory"; passed=$((passed + 1))
    else echo "[FAIL] a run that did not start left $work/fresh"; failed=$((failed + 1)); fi
fi
# a directory another trainer holds: its lock file names the holder
locked="$work/locked"; mkdir -p "$locked"
python3 - "$locked/.lock" <<'PY' &
import fcntl, sys, time
f = open(sys.argv[1], "w"); f.write("pid 4242 on the-other-host\n"); f.flush()
fcntl.flock(f, fcntl.LOCK_EX); open(sys.argv[1] + ".held", "w").close(); time.sleep(60)
PY
holder=$!
for _ in $(seq 100); do [[ -f "$locked/.lock.held" ]] && break; sleep 0.1; done
rm -f "$locked/.lock.held"
expect_error "a second trainer on a locked -o" "in use by another trainer (pid 4242 on the-other-host)" "${base[@]}" -o "$locked"
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
# nothing is created when a later check fails
expect_error "-o not created when a check fails" "badmagic.bin" -i "$good" -j "$work/badmagic.bin" -b 2 -t 64 -o "$work/new/run"
if [[ ! -e "$work/new" ]]; then echo "[PASS] a refused start creates no -o directory"; passed=$((passed + 1))
else echo "[FAIL] a refused start created $work/new"; failed=$((failed + 1)); fi
ln -s "$work/nowhere" "$work/dangling"
expect_error "-o a dangling symbolic link" "symbolic link to something that does not exist" "${base[@]}" -o "$work/dangling"
expect_error "-e a directory" "is a directory, not a model file" "${base[@]}" -e "$work"
expect_error "-pf a missing directory" "-pf $work/no_such_dir: not a directory" "${base[@]}" -pn 2 -pr 0 -pf "$work/no_such_dir"
# the second shard in sorted order holds a token id >= vocab: refused at start-up, not mid-run
mkdir -p "$work/shards"; cp "$good" "$work/shards/a.bin"; cp "$work/badtoken.bin" "$work/shards/b.bin"
expect_error "a bad token in a later shard" "shards/b.bin is >= vocab size" -i "$work/shards/*.bin" -j "$good" -b 2 -t 64

# ---- checkpoints that fail a check before the GPU: a tiny model (V = Vp = 64, C = 8, L = 1) and its state ----
# make_checkpoint DIR [field=value ...]: model and state files (state file version 1: FNV-1a) and DONE of step 10
make_checkpoint() {
    python3 - "$@" <<'PY'
import struct, sys
d, over = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
maxT, V, L, NH, C, Vp = 64, 64, 1, 1, 8, 64
n = Vp*C + maxT*C + L*(12*C*C + 13*C) + 2*C
version = int(over.get("version", 5))
h = [0]*256; h[0:8] = [20240326, version, maxT, V, L, NH, C, Vp]
if "model" not in over:
    with open(f"{d}/model_00000010.bin", "wb") as f:
        f.write(struct.pack("<256i", *h)); f.write(bytes((4 if version == 3 else 2)*n))
nopt = int(over.get("nopt", n))
sections = [("adam_m", bytes(4*nopt)), ("adam_v", bytes(4*nopt)), ("master_weights", bytes(4*nopt)),
            ("optimizer_sharding", struct.pack("<2i", 1, 0)),
            ("dataloader", struct.pack("<3Q", 0, int(over.get("shard_pos", 0)), 0)),
            ("adam_steps", struct.pack("<q", 10)), ("batch_shape", struct.pack("<2i", 2, 64)),
            ("seed", struct.pack("<Q", 7)), ("grad_accum_steps", struct.pack("<i", 1)), ("recompute", struct.pack("<i", 1))]
if "spike_window" in over:
    sections.append(("spike_window", bytes(int(over["spike_window"]))))
if "fp8_options" in over:
    sections.append(("fp8_options", struct.pack("<4i", *[int(x) for x in over["fp8_options"].split(",")])))
if "fp8_scaling" in over:
    sections.append(("fp8_scaling", struct.pack("<3i", *[int(x) for x in over["fp8_scaling"].split(",")])))
recipe = over.get("recipe", "bf16").encode()
body = struct.pack("<IIqii32sII", 20241122, 1, 10, int(over.get("rank", 0)), 1, recipe, len(sections), 0)
for name, data in sections: body += struct.pack("<32sQ", name.encode(), len(data)) + data
fnv = 0xcbf29ce484222325
for byte in body: fnv = ((fnv ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
with open(f"{d}/state_00000010_00000.bin", "wb") as f: f.write(body + struct.pack("<Q", fnv))
open(f"{d}/DONE_00000010", "w").close()
PY
}
python3 - "$work/small.bin" <<'PY'
import struct, sys, random
rng = random.Random(1); n = 4000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0]*253))); f.write(struct.pack("<%dH" % n, *[rng.randrange(64) for _ in range(n)]))
PY
mkdir -p "$work/ckmodel"; make_checkpoint "$work/ckmodel"
small=(-e "$work/ckmodel/model_00000010.bin" -i "$work/small.bin" -j "$work/small.bin" -b 2 -t 64 -x 1 -s 0 -sd 7 -cr 1 -y 1)
ck_case() { # NAME FRAGMENT field=value...: a checkpoint with the fields given, resumed (cr=0: without -cr 1)
    local name=$1 fragment=$2; shift 2
    local d; d=$(mktemp -d "$work/ck_XXXX"); make_checkpoint "$d" "$@"
    local logbefore; echo "keep" > "$d/main.log"; logbefore=$(listing "$d")
    local args=("${small[@]}"); [[ " $* " == *" cr=0 "* ]] && args=("${args[@]:0:${#args[@]}-4}" -y 1)
    expect_error "$name" "$fragment" "${args[@]}" -o "$d"
    expect_untouched "$name: the checkpoint is left as it was" "$d" "$logbefore"
}
ck_case "resume: data position out of range" "data position (epoch 0, shard 5, chunk 0) is out of range" shard_pos=5
ck_case "resume: a state file of another process" "not process 0's" rank=1
ck_case "resume: optimizer state of another size" "the file does not belong to this checkpoint" nopt=100
ck_case "resume: a complete checkpoint whose model file is gone" "is marked complete" model=none
ck_case "resume: a checkpoint of FP32 parameters into a BF16 build" "stores fp32 parameters, this build keeps them in bf16" version=3
other_ck=fp8; [[ "$recipe" == fp8 ]] && other_ck=bf16
ck_case "resume: another recipe's checkpoint without -cr 1" "was written by the '$other_ck' recipe" recipe=$other_ck cr=0
ck_case "resume: a spike-window section of another size" "section 'spike_window' holds 100 bytes, not the" spike_window=100
# the FP8 recipe's state under other -fh/-fm/-sqf/-sql or another scaling mode: refused before the GPU (unless
# -cr 1, which starts the recipe state afresh)
if [[ "$recipe" == fp8 ]]; then
    ck_case "resume: an FP8 checkpoint of other -fh/-fm/-sqf/-sql" "written with -fh 16 -fm 0 -sqf 0 -sql 0, this run has -fh 1024" \
        recipe=fp8 fp8_options=16,0,0,0 cr=0
    ck_case "resume: an FP8 checkpoint of -fs block under -fs delayed" "written with -fs block -fbg e4m3 -fp2 0, this run has -fs delayed" \
        recipe=fp8 fp8_options=1024,0,0,0 fp8_scaling=2,0,0 cr=0
fi
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
