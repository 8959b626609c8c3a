#!/usr/bin/env bash
# gpu_run.sh [DIR]: build, test, train and measure on this machine's GPU, with every log in DIR
# (default ./gpu_run):
#   DIR/build.log, DIR/data.log   the build and the tiny-shakespeare shards
#   DIR/test.log                  make test
#   DIR/loss_<name>.log           main.log of each loss protocol run (LOSS_STEPS > 0), its stdout in DIR/logs/
#   DIR/profile.log               LLMC_PROFILE=1 per-phase table of each recipe, d12 B=64 T=1024
#   DIR/bench_<size>.md           dev/bench tables (BENCH_SIZES), against the PyTorch peers (BF16, torchao FP8)
# Variables: RECIPES (default "bf16 fp8 nvfp4"), LOSS_STEPS (default 0 = no loss runs; the protocol's
# is 1000), LOSS_RUNS (default: one run per recipe; else "name:recipe:flags;name:recipe:flags..."),
# LQ (the quantized runs' -lq, default 100), BENCH_SIZES (default d12; "" = none), TESTS=0 skips make
# test, PROFILE=0 skips the profiles, BUILD_TARGETS (default all) what to build first.
# Offline, point LLMC_SHARED_DATA at a folder with tinyshakespeare.txt, encoder.json and vocab.bpe.
set -u
cd "$(dirname "$0")/.."
DIR=${1:-gpu_run}; mkdir -p "$DIR"
LOGS=$DIR/logs; mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
RECIPES=${RECIPES:-bf16 fp8 nvfp4}
LOSS_STEPS=${LOSS_STEPS:-0}
LQ=${LQ:-100}
BENCH_SIZES=${BENCH_SIZES-d12}
if ! nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null; then
    echo "error: gpu_run.sh needs an NVIDIA GPU and its driver (nvidia-smi found none); without one, make test runs the CPU tests" >&2
    exit 1
fi
date -u
echo "== build"; time make -j"$(nproc)" ${BUILD_TARGETS:-all} > "$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log"; exit 1; }
python3 dev/data/tinyshakespeare.py > "$DIR/data.log" 2>&1 || tail -3 "$DIR/data.log"
if [[ "${TESTS:-1}" == 1 ]]; then
    echo "== make test"; timeout 420 make test 2>&1 | tee "$DIR/test.log" | grep -E "FAIL|== |tests:|skipped|error" | grep -v "^\[PASS" | tail -30
fi
if [[ "$LOSS_STEPS" -gt 0 ]]; then
    if [[ -z "${LOSS_RUNS:-}" ]]; then LOSS_RUNS=""; for r in $RECIPES; do LOSS_RUNS+="$r:$r:;"; done; fi
    IFS=';' read -ra runs <<<"$LOSS_RUNS"
    for run in "${runs[@]}"; do
        [[ -z "$run" ]] && continue
        IFS=':' read -r name r flags <<<"$run"
        echo "== loss protocol: $name ($r $flags), d12 on tiny-shakespeare, $LOSS_STEPS steps"
        extra=(); [[ "$r" != bf16 ]] && extra=(-lq "$LQ")
        rm -rf "$LOGS/loss_$name"
        # shellcheck disable=SC2086
        timeout 300 "./train_gpt_$r" -x "$LOSS_STEPS" -s 0 -o "$LOGS/loss_$name" "${extra[@]}" $flags > "$LOGS/loss_$name.out" 2>&1
        grep -E "average|error" "$LOGS/loss_$name.out"
        cp "$LOGS/loss_$name/main.log" "$DIR/loss_$name.log" 2>/dev/null
    done
fi
: > "$DIR/profile.log"
# (a synthetic shard: a 524,288-token step needs one shard of at least that many tokens, more than
# tiny-shakespeare's training split has)
[[ "${PROFILE:-1}" == 1 ]] && python3 -c "import sys; sys.path.insert(0, 'dev/bench'); import bench; bench.write_shard('$LOGS/synthetic.bin', 4200000)"
[[ "${PROFILE:-1}" == 1 ]] && for r in $RECIPES; do
    echo "== per-phase profile: $r, d12 B=64 T=1024" | tee -a "$DIR/profile.log"
    LLMC_PROFILE=1 timeout 120 "./train_gpt_$r" -i "$LOGS/synthetic.bin" -j "" -b 64 -t 1024 -d 524288 -x 8 -v 0 -s 0 > "$LOGS/profile_$r.log" 2>&1
    sed -n '/per-phase/,$p' "$LOGS/profile_$r.log" | tee -a "$DIR/profile.log" | grep -E "total|average"
done
for size in $BENCH_SIZES; do
    echo "== bench: $size against the PyTorch peers"
    timeout 900 python3 dev/bench/bench.py --sizes "$size" --no-build --out "$DIR/bench_$size.md" > "$LOGS/bench_$size.out" 2>&1
    grep -E "^\| $size" "$LOGS/bench_$size.out" || tail -5 "$LOGS/bench_$size.out"
done
