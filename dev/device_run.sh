#!/usr/bin/env bash
# device_run.sh: the build -> test -> train -> measure sequence for one call on a lent GPU machine.
# Logs go to $OUT (or ./device_out). Carry .deps (doctest + the shared data files) with the call.
set -u
OUT=${OUT:-device_out}; mkdir -p "$OUT"
export LLMC_SHARED_DATA=$PWD/.deps/shared_data PYTHONUNBUFFERED=1
STEPS=${STEPS:-500}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
echo "== build"; time make -j16 all > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "== make test"; timeout 300 make test 2>&1 | tee "$OUT/test.log" | grep -E "FAIL|passed|skipped|error" | tail -40
grep -A12 "step   ours" "$OUT/test.log"
echo "== quickstart: d12 on tiny-shakespeare, $STEPS steps"
rm -rf /tmp/run_d12
timeout 200 bash scripts/quickstart.sh -x "$STEPS" -o /tmp/run_d12 -n 250 -s 250 > "$OUT/train.log" 2>&1
grep -E "val loss|^step +(1|50|100|150|200|250|300|350|400|450|500)/|average|error" "$OUT/train.log" | head -40
cp /tmp/run_d12/main.log "$OUT/main.log" 2>/dev/null
echo "== speed: d12 B=64 T=1024, 524288 tokens per step"
timeout 150 ./train_gpt_bf16 -b 64 -t 1024 -d 524288 -x 12 -v 0 -s 0 > "$OUT/speed.log" 2>&1
tail -5 "$OUT/speed.log"
echo "== other sizes: 3 steps each"
for spec in "d24 -b 8 -t 1024" "d48 -b 4 -t 1024" "gpt3:c768 -b 8 -t 2048"; do
    timeout 120 ./train_gpt_bf16 -e $spec -x 3 -v 0 -s 0 > "$OUT/size.log" 2>&1
    echo "$spec: $(grep -E '^step +3/' "$OUT/size.log") $(grep -E 'memory in use at the end|error' "$OUT/size.log")"
done
