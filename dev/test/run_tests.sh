#!/usr/bin/env bash
# run_tests.sh: every test of the project (what `make test` runs).
#   1. CPU unit tests (doctest): number formats, data, tokenizer, checkpoints, CLI, schedules.
#   2. The trainer's bad-input checks: the real binary, on any machine (they fail before the GPU).
#   3. GPU tests when a CUDA device is present: the PyTorch reference is written first, then the
#      FP32 and BF16 builds are compared against it. Without a device: "skipped: no CUDA device".
# The last line is "tests: N passed, N failed, N skipped"; the exit status is non-zero on any failure.
set -u -o pipefail
cd "$(dirname "$0")/../.."
passed=0; failed=0; skipped=0
JOBS=${JOBS:-$(nproc)}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# add the counts from a "... N passed, N failed" line of a suite's output
count_suite() { # $1 = name, $2 = exit status, $3 = output file
    local line p f
    line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$3" | tail -n 1)
    p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
    if [[ -z "$line" ]]; then p=0; f=1; echo "$1: no summary line (exit $2)"; fi
    if [[ "$2" -ne 0 && "$f" -eq 0 ]]; then f=1; echo "$1: exit status $2"; fi
    passed=$((passed + p)); failed=$((failed + f))
    echo "== $1: $p passed, $f failed"
}

# the tiny-shakespeare shards and tokenizer file (also used by the CPU tests that read real data)
# (offline it needs ../shared/data or $LLMC_SHARED_DATA; with neither and no network it is skipped, saying so)
if [[ ! -f dev/data/tinyshakespeare/tiny_shakespeare_val.bin || ! -f dev/data/gpt2_tokenizer.bin ]]; then
    echo "== preparing tiny-shakespeare"
    local_data=""
    for d in "${LLMC_SHARED_DATA:-}" ../shared/data shared/data; do
        [[ -n "$d" && -f "$d/tinyshakespeare.txt" && -f "$d/encoder.json" ]] && local_data=$d && break
    done
    if python3 dev/data/tinyshakespeare.py > "$tmp/data.log" 2>&1; then
        tail -n 3 "$tmp/data.log"
    elif [[ -z "$local_data" ]]; then
        echo "skipped: tiny-shakespeare data (no ../shared/data, no \$LLMC_SHARED_DATA and no network); the tests that read real shards do not run"
        skipped=$((skipped + 1))
    else
        tail -n 5 "$tmp/data.log"; echo "== preparing tiny-shakespeare from $local_data failed"; failed=$((failed + 1))
    fi
fi

echo "== building CPU tests"
if make -s build/test_cpu; then
    ./build/test_cpu 2>&1 | tee "$tmp/cpu.log"; rc=$?
    # doctest prints "[doctest] test cases: N | P passed | F failed | S skipped"
    line=$(grep -E '^\[doctest\] test cases:' "$tmp/cpu.log" | tail -n 1)
    p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
    echo "cpu unit tests: ${p:-0} passed, ${f:-1} failed" > "$tmp/cpu.sum"
    count_suite "cpu unit tests" $rc "$tmp/cpu.sum"
else
    echo "== cpu unit tests: build failed"; failed=$((failed + 1))
fi

# Python tools: the bench harness's parsers and maths, the loss-protocol report and its runner over seeds, the SASS counter, the scaling report,
# the kernel tables (ncu's, and the in-stream trace's gaps)
for t in dev/bench/test_bench.py dev/test/test_plot_logs.py dev/test/test_loss_seeds.py dev/test/test_gpu_coredump.py dev/bench/test_sass_counts.py dev/bench/test_scaling_report.py dev/bench/test_kernel_table.py dev/bench/test_trace_gaps.py; do
    python3 "$t" > "$tmp/py.log" 2>&1; rc=$?
    n=$(grep -oE '^Ran [0-9]+ test' "$tmp/py.log" | grep -oE '[0-9]+' || echo 0)
    if [[ $rc -eq 0 ]]; then echo "$t: $n passed, 0 failed" > "$tmp/py.sum"
    else tail -n 20 "$tmp/py.log"; echo "$t: 0 passed, ${n:-1} failed" > "$tmp/py.sum"; fi
    count_suite "$t" $rc "$tmp/py.sum"
done

# the Q1.15 build as its seed specifies it: the make targets carry its defines, and cuDNN with Q1.15 is a
# compile-time error (preprocessing is enough to see it)
if command -v nvcc > /dev/null || [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
    nvcc_bin=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
    for t in train_gpt_q115 train_gpt2q115cu train_gpt2q115_constrainedcu train_gpt3q115cu; do
        # (outputs captured first: under pipefail a pipeline takes the status of nvcc's expected failure)
        cmd=$(make -s -n -B "$t" 2>/dev/null)
        if grep -q -- "-DENABLE_Q115 -DSF16_TRUE_FORWARD=1" <<<"$cmd"; then
            echo "[PASS] make -n $t shows -DENABLE_Q115 -DSF16_TRUE_FORWARD=1"; passed=$((passed + 1))
        else
            echo "[FAIL] make -n $t lacks -DENABLE_Q115 -DSF16_TRUE_FORWARD=1"; failed=$((failed + 1))
        fi
    done
    # the NVFP4 binaries hold Blackwell code (sm_100a) for the native FP4 GEMMs, where this nvcc knows sm_100
    # (CUDA 12.8+); `make all` then compiles it, so a break in that path fails the build
    if "$nvcc_bin" --list-gpu-code 2>/dev/null | grep -qx sm_100; then
        for t in train_gpt_nvfp4 test_gpt_nvfp4 build/test_nvfp4; do
            cmd=$(make -s -n -B "$t" 2>/dev/null)
            if grep -q -- "-gencode arch=compute_90a,code=sm_90a" <<<"$cmd" && grep -q -- "-gencode arch=compute_100a,code=sm_100a" <<<"$cmd"; then
                echo "[PASS] make -n $t builds for sm_90a and sm_100a"; passed=$((passed + 1))
            else
                echo "[FAIL] make -n $t does not build for both sm_90a and sm_100a"; failed=$((failed + 1))
            fi
        done
    else
        echo "skipped: this nvcc does not know sm_100 (the NVFP4 binaries' Blackwell code)"; skipped=$((skipped + 1))
    fi
    out=$("$nvcc_bin" -E -x cu -I. -DRECIPE_HEADER='"llmc/recipes/q115/recipe.h"' -DENABLE_Q115 -DSF16_TRUE_FORWARD=1 -DENABLE_CUDNN train_gpt.cu -o /dev/null 2>&1); rc=$?
    if [[ $rc -ne 0 ]] && grep -q "ENABLE_CUDNN is not supported with ENABLE_Q115" <<<"$out"; then
        echo "[PASS] Q1.15 with cuDNN stops the build with the seed's #error"; passed=$((passed + 1))
    else
        echo "[FAIL] Q1.15 with cuDNN builds"; failed=$((failed + 1))
    fi
else
    echo "skipped: no nvcc (the Q1.15 build checks)"; skipped=$((skipped + 1))
fi

# the optional cuDNN attention (make USE_CUDNN=1 / train_gpt_<recipe>_cudnn): it must keep building. It
# needs the cuDNN frontend headers (dev/setup_cudnn_frontend.sh fetches them once from PyPI) and cuDNN.
cudnn_ready=0
if bash dev/setup_cudnn_frontend.sh > "$tmp/cudnn_setup.log" 2>&1; then
    if make -s -j"$JOBS" train_gpt_bf16_cudnn > "$tmp/cudnn_build.log" 2>&1; then
        echo "[PASS] the cuDNN attention path builds (train_gpt_bf16_cudnn)"; passed=$((passed + 1)); cudnn_ready=1
    elif grep -q "no libcudnn found\|no cudnn.h found" "$tmp/cudnn_build.log"; then
        echo "skipped: cuDNN attention (cuDNN not installed: $(grep -o 'no [a-z.]* found' "$tmp/cudnn_build.log" | head -n 1))"
        skipped=$((skipped + 1))
    else
        tail -n 20 "$tmp/cudnn_build.log"; echo "[FAIL] the cuDNN attention path does not build"; failed=$((failed + 1))
    fi
else
    tail -n 3 "$tmp/cudnn_setup.log"
    echo "skipped: cuDNN attention (the cuDNN frontend headers could not be fetched; bash dev/setup_cudnn_frontend.sh)"
    skipped=$((skipped + 1))
fi

echo "== building the trainer for the bad-input tests"
if make -s -j"$JOBS" train_gpt_bf16; then
    bash dev/test/bad_input.sh ./train_gpt_bf16 2>&1 | tee "$tmp/bad.log"; rc=$?
    count_suite "bad-input tests" $rc "$tmp/bad.log"
else
    echo "== bad-input tests: trainer build failed"; failed=$((failed + 1))
fi

if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "== GPU tests on: $(nvidia-smi -L | head -n 1)"
    REF=${REF_DIR:-dev/reference/out}
    REF_Q115=${REF_DIR_Q115:-dev/reference/out_q115}
    # the plain reference, and the same under the Q1.15 recipe's boundaries (test_gpt_q115 reads both)
    if python3 dev/reference/gpt_reference.py --write-reference --out "$REF" &&
       python3 dev/reference/gpt_reference.py --write-reference --boundaries q115 --out "$REF_Q115"; then
        for v in fp32 bf16 fp8 nvfp4 vcast tcfp12 q115; do
            refs=("$REF"); [[ $v == q115 ]] && refs=("$REF_Q115" "$REF")
            if make -s test_gpt_$v; then
                ./test_gpt_$v "${refs[@]}" 2>&1 | tee "$tmp/gpu_$v.log"; rc=$?
                count_suite "gpu tests ($v)" $rc "$tmp/gpu_$v.log"
            else
                echo "== gpu tests ($v): build failed"; failed=$((failed + 1))
            fi
        done
        # standalone kernel tests: the plain linear layer, LayerNorm, flash attention, the Hopper GEMM with our
        # epilogues, each recipe's quantization kernels
        for k in linear layernorm classifier attention q115_attention gemm_wgmma fp8 nvfp4 vcast tcfp12; do
            name="$k kernel tests"; [[ $k == attention || $k == linear || $k == layernorm || $k == classifier || $k == q115_attention || $k == gemm_wgmma ]] && name="${k/_/ } tests"
            if make -s build/test_$k; then
                ./build/test_$k 2>&1 | tee "$tmp/$k.log"; rc=$?
                count_suite "$name" $rc "$tmp/$k.log"
            else
                echo "== $name: build failed"; failed=$((failed + 1))
            fi
        done
        # cuDNN's attention: its kernels against float64 and ours, and the whole BF16 model on it
        if [[ $cudnn_ready -eq 1 ]]; then
            for t in build/test_attention_cudnn test_gpt_bf16_cudnn; do
                if make -s "$t"; then
                    args=(); [[ $t == test_gpt_bf16_cudnn ]] && args=("$REF")
                    ./$t "${args[@]}" 2>&1 | tee "$tmp/cudnn_test.log"; rc=$?
                    count_suite "$t" $rc "$tmp/cudnn_test.log"
                else
                    echo "== $t: build failed"; failed=$((failed + 1))
                fi
            done
        fi
        for v in bf16 fp8 nvfp4 vcast tcfp12 q115; do
            if make -s train_gpt_$v; then
                bash dev/test/resume_cli.sh ./train_gpt_$v 2>&1 | tee "$tmp/resume_$v.log"; rc=$?
                count_suite "resume tests ($v)" $rc "$tmp/resume_$v.log"
            else
                echo "== resume tests ($v): build failed"; failed=$((failed + 1))
            fi
        done
        # data parallelism through NCCL: one process on any GPU machine; two processes (losses against
        # one process, ZeRO-1 memory, resume, killed process) where there are two GPUs
        bash dev/test/multi_gpu.sh "${MULTI_GPU_RECIPES:-bf16 fp8 tcfp12}" 2>&1 | tee "$tmp/multi_gpu.log"; rc=$?
        count_suite "multi-gpu tests" $rc "$tmp/multi_gpu.log"
        grep -q "^skipped: the 2-process tests" "$tmp/multi_gpu.log" && skipped=$((skipped + 1))
        # out-of-memory is a clear message and a non-zero exit
        # (1.5B parameters fit; the activations of B=1024, T=256 do not)
        out=$(./train_gpt_bf16 -e d48 -b 1024 -t 256 -x 1 -v 0 -s 0 2>&1); rc=$?
        if [[ $rc -ne 0 ]] && grep -q "out of GPU memory" <<<"$out" && grep -q -- "-r 2" <<<"$out"; then
            echo "[PASS] out-of-memory: clear message, exit $rc"; passed=$((passed + 1))
        else
            echo "[FAIL] out-of-memory: exit $rc, output: $(tail -n 3 <<<"$out")"; failed=$((failed + 1))
        fi
        # a recipe's setup error (here a bad LLMC_FP8_FUSED_GEMM, read when the FP8 recipe sets itself up on the
        # GPU) is a clear message and exit 1, not an abort on an uncaught exception
        if make -s train_gpt_fp8; then
            out=$(LLMC_FP8_FUSED_GEMM=2 ./train_gpt_fp8 -e d12 -b 4 -t 256 -x 1 -v 0 -s 0 -o "" 2>&1); rc=$?
            if [[ $rc -eq 1 ]] && grep -q "^error: .*LLMC_FP8_FUSED_GEMM must be 0" <<<"$out"; then
                echo "[PASS] a recipe's setup error: clear message, exit 1"; passed=$((passed + 1))
            else
                echo "[FAIL] a recipe's setup error: exit $rc, output: $(tail -n 3 <<<"$out")"; failed=$((failed + 1))
            fi
        else
            echo "== recipe setup error test: build failed"; failed=$((failed + 1))
        fi
    else
        echo "== GPU tests: writing the reference failed"; failed=$((failed + 1))
    fi
else
    echo "skipped: no CUDA device (GPU tests: reference comparison FP32/BF16/FP8/NVFP4/VCAST/TCFP12/Q115, linear layer, LayerNorm, classifier, attention, Q1.15 attention, the Hopper GEMM with our epilogues, FP8, NVFP4, vcast and TCFP-12 kernels, resume, multi-GPU, out-of-memory, a recipe setup error)"
    skipped=$((skipped + 1))
fi

echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
