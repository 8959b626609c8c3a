#!/usr/bin/env bash
# run_tests.sh: the project's tests (what `make test` runs), all of them or a part.
#
#   bash dev/test/run_tests.sh                 every suite
#   ONLY=fp8 bash dev/test/run_tests.sh        every suite of the FP8 recipe (make test ONLY=fp8)
#   ONLY=cpu,attention bash dev/test/run_tests.sh
#   bash dev/test/run_tests.sh --help          the names ONLY takes
#
# Phases: 1. one parallel make of exactly the targets the chosen suites need (the cuDNN build, a make of its
# own, beside it), while the PyTorch reference is written where it is missing or older than its script, on
# cores of its own;
# 2. the suites, each into its own log, printed in the order below once it and the suites before it are
# done: the CPU suites in the background throughout; first, one at a time with the GPU to themselves, the
# suites whose assertions compare kernel times (the attention, LayerNorm and Q1.15 attention kernel tests,
# cuDNN's) and the out-of-memory check (which fills the GPU); then the other GPU suites, up to GPU_JOBS
# (default 8) at a time, longest first.
# Without a CUDA device the GPU suites say "skipped: no CUDA device".
# The last line is "tests: N passed, N failed, N skipped"; the exit status is non-zero on any failure.
# Environment: ONLY, JOBS (cores for make and the reference, default nproc), GPU_JOBS, REF_THREADS, REF_DIR,
# REF_DIR_Q115, MULTI_GPU_RECIPES.
set -u -o pipefail
cd "$(dirname "$0")/../.."
SECONDS=0  # (the "(... at N s)" lines: time since the start)
JOBS=${JOBS:-$(nproc)}
# (a d12 test_gpt holds about 16 GB of GPU memory and a few GB of host memory and /dev/shm; six leave an H200's
# 141 GB with room for the -r -1 check, which wants 1/16 of the GPU free. Most of a suite's time is host work.)
GPU_JOBS=${GPU_JOBS:-8}
REF=${REF_DIR:-dev/reference/out}
REF_Q115=${REF_DIR_Q115:-dev/reference/out_q115}
MULTI_GPU_RECIPES=${MULTI_GPU_RECIPES:-bf16 fp8 tcfp12}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# the recipes are the Makefile's (a new recipe's folder and its name there give it these suites)
read -ra MAKE_RECIPES <<<"$(make -s print-recipes)"
RECIPES=(fp32 "${MAKE_RECIPES[@]}")
RESUME_RECIPES=("${MAKE_RECIPES[@]}")
# the kernel tests (dev/test/gpu/test_<name>.cu); TIMED ones assert that a kernel is faster than another
KERNELS=(linear classifier gemm_wgmma fp8 nvfp4 vcast tcfp12)
TIMED_KERNELS=(attention layernorm q115_attention)

# ---- the suites: id, the names ONLY selects it by, whether it needs a GPU, what it builds ------------------
# (in the order they are printed; ONLY takes an id or any of its tags)
ids=(); declare -A tags gpu targets serial
suite() { # id "tags" gpu(0/1) "make targets" [serial]
    ids+=("$1"); tags[$1]="$1 $2"; gpu[$1]=$3; targets[$1]=$4; serial[$1]=${5:-0}
}
suite cpu_unit "cpu unit" 0 "build/test_cpu"
suite python "cpu py" 0 ""
suite build_flags "cpu q115 nvfp4" 0 ""
# (every recipe's trainer: the trainer's own checks, and each recipe's checks of its flags)
suite bad_input "cpu" 0 "$(printf 'train_gpt_%s ' "${MAKE_RECIPES[@]}")"
for r in "${RECIPES[@]}"; do suite "gpt_$r" "gpu gpt $r" 1 "test_gpt_$r"; done
# (the FP8 recipe's other scaling modes: the same binary, reference and tolerances, test_gpt --recipe "-fs MODE";
# and its FP8 LM head, test_gpt --recipe "-flh 1")
for m in current block head; do suite "gpt_fp8_$m" "gpu gpt fp8" 1 "test_gpt_fp8"; done
for k in "${KERNELS[@]}"; do suite "kernel_$k" "gpu kernels $k" 1 "build/test_$k"; done
for r in "${RESUME_RECIPES[@]}"; do
    other=train_gpt_bf16; [[ $r == bf16 ]] && other=train_gpt_fp8  # (resume_cli.sh resumes under another recipe too)
    suite "resume_$r" "gpu resume $r" 1 "train_gpt_$r $other"
done
# (skipped updates: a NaN injected into the loss and the gradient, spikes, resume through them)
for r in bf16 fp8; do suite "nan_skip_$r" "gpu nan $r" 1 "train_gpt_$r"; done
# (the whole BF16 model on cuDNN's attention; it waits for the cuDNN build)
suite gpt_bf16_cudnn "gpu gpt cudnn" 1 ""
suite multi_gpu "gpu" 1 "$(printf 'train_gpt_%s ' $MULTI_GPU_RECIPES)"
suite setup_error "gpu fp8" 1 "train_gpt_fp8"
suite fp8_modes "gpu fp8 resume" 1 "train_gpt_fp8"
suite export_hf "gpu bf16 export" 1 "train_gpt_bf16"
for k in "${TIMED_KERNELS[@]}"; do
    t="gpu kernels timed $k"; [[ $k == q115_attention ]] && t+=" q115"
    suite "kernel_$k" "$t" 1 "build/test_$k" 1
done
suite oom "gpu bf16" 1 "train_gpt_bf16" 1
# (the build check, and with a GPU its attention test, which compares kernel times too)
suite cudnn "cudnn" 0 "" 1

if [[ "${1:-}" == --help || "${1:-}" == -h ]]; then
    echo "ONLY=<name>[,<name>...] runs the suites that have the name as id or tag:"
    for id in "${ids[@]}"; do printf '  %-24s %s\n' "$id" "${tags[$id]#"$id "}"; done
    exit 0
fi

# ---- which suites run ----------------------------------------------------------------------------------
chosen=()
if [[ -z "${ONLY:-}" ]]; then
    chosen=("${ids[@]}")
else
    IFS=, read -r -a wanted <<<"$ONLY"
    for w in "${wanted[@]}"; do
        known=0
        for id in "${ids[@]}"; do [[ " ${tags[$id]} " == *" $w "* ]] && known=1; done
        [[ $known == 1 ]] || { echo "ONLY: no suite is called '$w' (bash dev/test/run_tests.sh --help lists them)"; exit 2; }
    done
    for id in "${ids[@]}"; do
        for w in "${wanted[@]}"; do [[ " ${tags[$id]} " == *" $w "* ]] && { chosen+=("$id"); break; }; done
    done
fi
has_gpu=0; nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && has_gpu=1
runnable=(); skipped_gpu=()
for id in "${chosen[@]}"; do
    if [[ ${gpu[$id]} == 1 && $has_gpu == 0 ]]; then skipped_gpu+=("$id"); else runnable+=("$id"); fi
done
is_chosen() { [[ " ${runnable[*]} " == *" $1 "* ]]; }
echo "== suites: ${runnable[*]:-none}"

passed=0; failed=0; skipped=0

# the tiny-shakespeare shards and tokenizer file (the CPU tests that read real data, multi_gpu.sh)
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

# ---- phase 1: the build (and the cuDNN build beside it), and the reference beside them ----------------------
# The reference is rewritten only when its files are missing or the scripts that write it changed (a stamp
# file beside it holds their hash). PyTorch's float64 work runs on a few cores of its own (REF_THREADS each,
# default 2) while make runs on the others: OpenMP threads that share a core with a compiler stall at every
# barrier, so the two are kept apart rather than both given every core.
REF_THREADS=${REF_THREADS:-2}
# (the eval file in the reference is written by dev/data/hellaswag.py's writer: its scripts count too)
reference_stamp() { echo "$(cat dev/reference/*.py dev/data/hellaswag.py dev/data/data_common.py | sha256sum | cut -d' ' -f1) $*"; }
reference_current() { # $1 = directory, $2... = extra arguments
    local dir=$1; shift
    [[ -f "$dir/ref_state.bin" && -f "$dir/ref_model.bin" && -f "$dir/ref_hellaswag_scores.bin" &&
       "$(cat "$dir/.stamp" 2>/dev/null)" == "$(reference_stamp "$@")" ]]
}
write_reference() { # $1 = directory, $2... = extra arguments
    local dir=$1; shift
    if reference_current "$dir" "$@"; then echo "reference $dir: up to date"; return 0; fi
    rm -f "$dir/.stamp"
    OMP_NUM_THREADS=$REF_THREADS python3 dev/reference/gpt_reference.py --write-reference "$@" --out "$dir" &&
        reference_stamp "$@" > "$dir/.stamp"
}
needs_ref=0; needs_ref_q115=0
for id in "${runnable[@]}"; do
    [[ $id == gpt_* || $id == resume_* ]] && needs_ref=1
    [[ $id == gpt_q115 ]] && needs_ref_q115=1
done
# the optional cuDNN attention (make USE_CUDNN=1 / train_gpt_<recipe>_cudnn): it must keep building. It needs
# the cuDNN frontend headers (dev/setup_cudnn_frontend.sh fetches them once from PyPI) and cuDNN; a missing
# cuDNN stops make while it reads the Makefile, so this is a make of its own.
cudnn_pid=""
if is_chosen cudnn || is_chosen gpt_bf16_cudnn; then
    cudnn_targets="train_gpt_bf16_cudnn"
    is_chosen cudnn && [[ $has_gpu == 1 ]] && cudnn_targets+=" build/test_attention_cudnn"
    is_chosen gpt_bf16_cudnn && cudnn_targets+=" test_gpt_bf16_cudnn"
    (
        if ! bash dev/setup_cudnn_frontend.sh > "$tmp/cudnn_setup.log" 2>&1; then echo setup > "$tmp/cudnn_build.rc"; exit; fi
        make -s -k -j"$JOBS" $cudnn_targets > "$tmp/cudnn_build.log" 2>&1; echo $? > "$tmp/cudnn_build.rc"
    ) & cudnn_pid=$!
fi

# the references (the plain one and Q1.15's) side by side, beside the build; the suites that need no
# reference start once the build is done
ref_pids=(); build_jobs=$JOBS
if [[ $needs_ref == 1 ]]; then
    reference_current "$REF" || build_jobs=$((build_jobs - REF_THREADS))
    (write_reference "$REF" > "$tmp/ref.log" 2>&1; echo $? > "$tmp/ref.rc"; echo "(done at ${SECONDS} s)" >> "$tmp/ref.log") &
    ref_pids+=($!)
fi
if [[ $needs_ref_q115 == 1 ]]; then
    reference_current "$REF_Q115" --boundaries q115 || build_jobs=$((build_jobs - REF_THREADS))
    (write_reference "$REF_Q115" --boundaries q115 > "$tmp/ref_q115.log" 2>&1; echo $? > "$tmp/ref_q115.rc"
     echo "(done at ${SECONDS} s)" >> "$tmp/ref_q115.log") & ref_pids+=($!)
fi
[[ $build_jobs -lt 2 ]] && build_jobs=2
build=()
for id in "${runnable[@]}"; do for t in ${targets[$id]}; do [[ " ${build[*]} " == *" $t "* ]] || build+=("$t"); done; done
if [[ ${#build[@]} -gt 0 ]]; then
    echo "== building (make -j$build_jobs): ${build[*]}"
    make -s -k -j"$build_jobs" "${build[@]}" > "$tmp/build.log" 2>&1 || { grep -E 'error|Error' "$tmp/build.log" | head -n 20; }
    echo "(built at ${SECONDS} s)"
fi
built() { make -s -q "$@" > /dev/null 2>&1; }

# ---- the suites: each writes its log, ending with "<name>: N passed, N failed" or a "skipped: ..." line -----
# the numbers of a doctest or unittest run as one summary line
run_suite() { # $1 = id
    local id=$1 t rc line p f n
    for t in ${targets[$id]}; do
        built "$t" || { echo "$id: $t did not build (make $t)"; echo "$id: 0 passed, 1 failed"; return; }
    done
    case $id in
    cpu_unit)
        ./build/test_cpu; rc=$?
        # doctest prints "[doctest] test cases: N | P passed | F failed | S skipped"
        line=$(grep -E '^\[doctest\] test cases:' "$tmp/$id.log" | tail -n 1)
        p=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<<"$line")
        echo "cpu unit tests: ${p:-0} passed, ${f:-1} failed" ;;
    python)
        # the Python tools: the bench harness's parsers and maths, the loss-protocol report and its runner over
        # seeds, the GPU core-dump reader, the SASS counter, the scaling report, the kernel tables
        p=0; f=0
        for t in dev/bench/test_bench.py dev/test/cpu/test_plot_logs.py dev/test/cpu/test_loss_seeds.py \
                 dev/test/cpu/test_gpu_coredump.py dev/bench/test_sass_counts.py dev/bench/test_scaling_report.py \
                 dev/bench/test_kernel_table.py dev/bench/test_trace_gaps.py dev/test/cpu/test_export_hf.py \
                 dev/test/cpu/test_fineweb_edu.py dev/test/cpu/test_resume_loop.py dev/test/cpu/test_hellaswag.py \
                 dev/test/cpu/test_data_common.py; do
            python3 "$t" > "$tmp/py_one.log" 2>&1; rc=$?
            n=$(grep -oE '^Ran [0-9]+ test' "$tmp/py_one.log" | grep -oE '[0-9]+' || echo 0)
            if [[ $rc -eq 0 ]]; then echo "[PASS] $t: $n tests"; p=$((p + n))
            else tail -n 20 "$tmp/py_one.log"; echo "[FAIL] $t"; f=$((f + 1)); fi
        done
        echo "python tools: $p passed, $f failed" ;;
    build_flags) build_flag_checks ;;
    bad_input)
        # (the trainers side by side: each case is a short process start, and the cases of one trainer follow
        # each other)
        p=0; f=0
        for r in "${MAKE_RECIPES[@]}"; do
            ( bash dev/test/cpu/bad_input.sh "./train_gpt_$r" > "$tmp/bad_$r.log" 2>&1; echo $? > "$tmp/bad_$r.rc" ) &
        done
        wait
        for r in "${MAKE_RECIPES[@]}"; do
            rc=$(cat "$tmp/bad_$r.rc")
            line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$tmp/bad_$r.log" | tail -n 1)
            n=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line"); m=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line")
            [[ -z "$line" || ( $rc -ne 0 && "${m:-0}" -eq 0 ) ]] && m=$(( ${m:-0} + 1 ))
            if [[ "${m:-1}" -eq 0 ]]; then echo "[PASS] train_gpt_$r: ${n:-0} bad inputs refused"
            else grep -E '^\[FAIL' "$tmp/bad_$r.log"; echo "[FAIL] train_gpt_$r: ${m} bad-input cases failed"; fi
            p=$((p + ${n:-0})); f=$((f + ${m:-0}))
        done
        echo "bad-input tests: $p passed, $f failed" ;;
    cudnn) cudnn_checks ;;
    gpt_bf16_cudnn)
        while [[ ! -f "$tmp/cudnn_build.rc" ]]; do sleep 1; done
        if [[ "$(cat "$tmp/cudnn_build.rc")" == setup ]] || grep -q "no libcudnn found\|no cudnn.h found" "$tmp/cudnn_build.log"; then
            echo "skipped: the BF16 model on cuDNN's attention (no cuDNN or no frontend headers: see the cudnn suite)"
        elif built test_gpt_bf16_cudnn; then
            ./test_gpt_bf16_cudnn "$REF"
        else
            tail -n 20 "$tmp/cudnn_build.log"; echo "gpt_bf16_cudnn: test_gpt_bf16_cudnn did not build"; echo "gpt_bf16_cudnn: 0 passed, 1 failed"
        fi ;;
    gpt_fp8_current | gpt_fp8_block) ./test_gpt_fp8 "$REF" --recipe "-fs ${id#gpt_fp8_}" ;;
    gpt_fp8_head) ./test_gpt_fp8 "$REF" --recipe "-flh 1" ;;
    gpt_*)
        r=${id#gpt_}
        if [[ $r == q115 ]]; then ./test_gpt_q115 "$REF_Q115" "$REF"; else ./test_gpt_"$r" "$REF"; fi ;;
    kernel_*) ./build/test_"${id#kernel_}" ;;
    resume_*) bash dev/test/gpu/resume_cli.sh ./train_gpt_"${id#resume_}" ;;
    nan_skip_*) bash dev/test/gpu/nan_skip.sh ./train_gpt_"${id#nan_skip_}" ;;
    fp8_modes) bash dev/test/gpu/fp8_modes.sh ./train_gpt_fp8 ;;
    multi_gpu)
        # data parallelism through NCCL: one process on any GPU machine; two processes (losses against one
        # process, ZeRO-1 memory, resume, killed process) where there are two GPUs
        bash dev/test/gpu/multi_gpu.sh "$MULTI_GPU_RECIPES" ;;
    export_hf) bash dev/test/gpu/export_hf.sh ./train_gpt_bf16 ;;
    setup_error)
        # a recipe's setup error (a bad LLMC_FP8_FUSED_GEMM, read when the FP8 recipe sets itself up on the GPU)
        # is a clear message and exit 1, not an abort on an uncaught exception
        out=$(LLMC_FP8_FUSED_GEMM=2 ./train_gpt_fp8 -e d12 -b 4 -t 256 -x 1 -v 0 -s 0 -o "" 2>&1); rc=$?
        if [[ $rc -eq 1 ]] && grep -q "^error: .*LLMC_FP8_FUSED_GEMM must be 0" <<<"$out"; then
            echo "[PASS] a recipe's setup error: clear message, exit 1"; echo "setup error: 1 passed, 0 failed"
        else
            echo "[FAIL] a recipe's setup error: exit $rc, output: $(tail -n 3 <<<"$out")"; echo "setup error: 0 passed, 1 failed"
        fi ;;
    oom)
        # out of memory is a clear message and a non-zero exit (1.5B parameters fit; the activations of
        # B=1024, T=256 do not)
        out=$(./train_gpt_bf16 -e d48 -b 1024 -t 256 -x 1 -v 0 -s 0 2>&1); rc=$?
        if [[ $rc -ne 0 ]] && grep -q "out of GPU memory" <<<"$out" && grep -q -- "-r 2" <<<"$out"; then
            echo "[PASS] out-of-memory: clear message, exit $rc"; echo "out of memory: 1 passed, 0 failed"
        else
            echo "[FAIL] out-of-memory: exit $rc, output: $(tail -n 3 <<<"$out")"; echo "out of memory: 0 passed, 1 failed"
        fi ;;
    esac
}

# the Q1.15 build as its seed specifies it: the make targets carry its defines, and cuDNN with Q1.15 is a
# compile-time error (preprocessing is enough to see it); the NVFP4 binaries hold Blackwell code
build_flag_checks() {
    local p=0 f=0 t cmd out msg rc nvcc_bin
    if ! command -v nvcc > /dev/null && [[ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
        echo "skipped: no nvcc (the Q1.15 build checks)"; return
    fi
    nvcc_bin=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
    for t in train_gpt_q115 train_gpt2q115cu train_gpt2q115_constrainedcu train_gpt3q115cu; do
        # (outputs captured first: under pipefail a pipeline takes the status of nvcc's expected failure)
        cmd=$(make -s -n -B "$t" 2>/dev/null)
        if grep -q -- "-DENABLE_Q115 -DSF16_TRUE_FORWARD=1" <<<"$cmd"; then
            echo "[PASS] make -n $t shows -DENABLE_Q115 -DSF16_TRUE_FORWARD=1"; p=$((p + 1))
        else
            echo "[FAIL] make -n $t lacks -DENABLE_Q115 -DSF16_TRUE_FORWARD=1"; f=$((f + 1))
        fi
    done
    # the NVFP4 binaries hold Blackwell code (sm_100a) for the native FP4 GEMMs, where this nvcc knows sm_100
    # (CUDA 12.8+); `make all` then compiles it, so a break in that path fails the build
    if "$nvcc_bin" --list-gpu-code 2>/dev/null | grep -qx sm_100; then
        for t in train_gpt_nvfp4 test_gpt_nvfp4 build/test_nvfp4; do
            cmd=$(make -s -n -B "$t" 2>/dev/null)
            if grep -q -- "-gencode arch=compute_90a,code=sm_90a" <<<"$cmd" && grep -q -- "-gencode arch=compute_100a,code=sm_100a" <<<"$cmd"; then
                echo "[PASS] make -n $t builds for sm_90a and sm_100a"; p=$((p + 1))
            else
                echo "[FAIL] make -n $t does not build for both sm_90a and sm_100a"; f=$((f + 1))
            fi
        done
    else
        echo "(this nvcc does not know sm_100: the NVFP4 binaries' Blackwell code is not checked)"
    fi
    out=$("$nvcc_bin" -E -x cu -I. -DRECIPE_HEADER='"llmc/recipes/q115/recipe.h"' -DENABLE_Q115 -DSF16_TRUE_FORWARD=1 -DENABLE_CUDNN train_gpt.cu -o /dev/null 2>&1); rc=$?
    if [[ $rc -ne 0 ]] && grep -q "ENABLE_CUDNN is not supported with ENABLE_Q115" <<<"$out"; then
        echo "[PASS] Q1.15 with cuDNN stops the build with the specification's #error"; p=$((p + 1))
    else
        echo "[FAIL] Q1.15 with cuDNN builds"; f=$((f + 1))
    fi
    # the FP8 recipes stop a build for a GPU without FP8 tensor cores (before sm_89) with their #error
    for t in fp8 tcfp12; do
        msg=$("$nvcc_bin" -E -x cu -I. -gencode arch=compute_80,code=sm_80 -DRECIPE_HEADER="\"llmc/recipes/$t/recipe.h\"" \
              train_gpt.cu -o /dev/null 2>&1); rc=$?
        if [[ $rc -ne 0 ]] && grep -q "the $t recipe needs an sm_89 or newer GPU" <<<"$msg"; then
            echo "[PASS] the $t recipe built for sm_80 stops with its #error"; p=$((p + 1))
        else
            echo "[FAIL] the $t recipe builds for sm_80"; f=$((f + 1))
        fi
    done
    echo "build flags: $p passed, $f failed"
}

# the cuDNN attention: it builds, and with a GPU its kernels against float64 and ours (build/test_attention_cudnn)
cudnn_checks() {
    local p=0 f=0 t=build/test_attention_cudnn rc line
    if [[ "$(cat "$tmp/cudnn_build.rc")" == setup ]]; then
        tail -n 3 "$tmp/cudnn_setup.log"
        echo "skipped: cuDNN attention (the cuDNN frontend headers could not be fetched; bash dev/setup_cudnn_frontend.sh)"; return
    fi
    if built train_gpt_bf16_cudnn; then
        echo "[PASS] the cuDNN attention path builds (train_gpt_bf16_cudnn)"; p=1
    elif grep -q "no libcudnn found\|no cudnn.h found" "$tmp/cudnn_build.log"; then
        echo "skipped: cuDNN attention (cuDNN not installed: $(grep -o 'no [a-z.]* found' "$tmp/cudnn_build.log" | head -n 1))"; return
    else
        tail -n 20 "$tmp/cudnn_build.log"; echo "[FAIL] the cuDNN attention path does not build"; echo "cudnn: 0 passed, 1 failed"; return
    fi
    if [[ $has_gpu == 1 ]]; then
        if built "$t"; then
            ./$t > "$tmp/cudnn_one.log" 2>&1; rc=$?; cat "$tmp/cudnn_one.log"
            line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$tmp/cudnn_one.log" | tail -n 1)
            p=$((p + $(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line" | grep . || echo 0)))
            f=$((f + $(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line" | grep . || echo 1)))
            [[ $rc -ne 0 && -n "$line" && "$line" == *" 0 failed"* ]] && f=$((f + 1))
        else
            echo "[FAIL] $t did not build"; f=$((f + 1))
        fi
    fi
    echo "cudnn: $p passed, $f failed"
}

# add a suite's counts from its log's last "... N passed, N failed" line (a "skipped:" line and no such line:
# one skipped suite)
count_suite() { # $1 = id, $2 = exit status
    local log="$tmp/$1.log" line p f
    line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [[ -z "$line" ]] && grep -q '^skipped:' "$log"; then skipped=$((skipped + 1)); echo "== $1: skipped"; return; fi
    p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
    if [[ -z "$line" ]]; then p=0; f=1; echo "$1: no summary line (exit $2)"; fi
    if [[ "$2" -ne 0 && "$f" -eq 0 ]]; then f=1; echo "$1: exit status $2"; fi
    passed=$((passed + p)); failed=$((failed + f))
    [[ $1 == multi_gpu ]] && grep -q "^skipped: the 2-process tests" "$log" && skipped=$((skipped + 1))
    echo "== $1: $p passed, $f failed"
}

start_suite() { # in the background: $tmp/<id>.log, then $tmp/<id>.rc
    local id=$1
    ( START=$SECONDS; run_suite "$id" > "$tmp/$id.log" 2>&1; rc=$?
      echo "($id: $((SECONDS - START)) s)" >> "$tmp/$id.log"; echo $rc > "$tmp/$id.rc" ) &
}
# print the finished suites in order, as far as every earlier one has finished
next_print=0
print_ready() {
    while [[ $next_print -lt ${#order[@]} && -f "$tmp/${order[$next_print]}.rc" ]]; do
        local id=${order[$next_print]}
        echo "== $id"; cat "$tmp/$id.log"; count_suite "$id" "$(cat "$tmp/$id.rc")"
        next_print=$((next_print + 1))
    done
}

# ---- phase 2: the suites -------------------------------------------------------------------------------
# (printed in this order: the ones that share the machine, then the ones that want the GPU to themselves)
order=(); for id in "${runnable[@]}"; do [[ ${serial[$id]} == 0 ]] && order+=("$id"); done
for id in "${runnable[@]}"; do [[ ${serial[$id]} == 1 ]] && order+=("$id"); done
refs_done=0
wait_refs() {
    [[ $refs_done == 1 ]] && return
    [[ ${#ref_pids[@]} -gt 0 ]] && wait "${ref_pids[@]}"
    refs_done=1
    for r in ref ref_q115; do
        [[ -f "$tmp/$r.rc" ]] || continue
        cat "$tmp/$r.log" | tail -n 3
        [[ "$(cat "$tmp/$r.rc")" == 0 ]] || { echo "== writing the reference ($r) failed"; failed=$((failed + 1)); }
    done
}
needs_reference() { [[ $1 == gpt_* || $1 == resume_* ]]; }
# 2a. the CPU suites, in the background for the whole phase (they use no GPU)
for id in "${order[@]}"; do [[ ${serial[$id]} == 0 && ${gpu[$id]} == 0 ]] && start_suite "$id"; done
# 2b. the timed kernel tests, the out-of-memory check (which fills the GPU) and cuDNN's tests, one at a time
# with the GPU to themselves
[[ -n "$cudnn_pid" ]] && wait "$cudnn_pid"
for id in "${order[@]}"; do
    [[ ${serial[$id]} == 1 ]] || continue
    start_suite "$id"; wait $!
done
# 2c. the GPU suites, up to GPU_JOBS at once, longest first (the multi-GPU, FP8 kernel, FP8 scaling-mode and
# TCFP-12 resume tests, then the other scripts that train, then the model tests, then the rest), so that no long
# one starts last
rank_of() {
    case $1 in
        multi_gpu | kernel_fp8 | fp8_modes | resume_tcfp12) echo 0 ;;
        resume_* | nan_skip_* | export_hf) echo 1 ;;
        gpt_*) echo 2 ;;
        *) echo 3 ;;
    esac
}
start_order=()
for rank in 0 1 2 3; do
    for id in "${order[@]}"; do
        [[ ${serial[$id]} == 0 && ${gpu[$id]} == 1 && $(rank_of "$id") == "$rank" ]] && start_order+=("$id")
    done
done
running_gpu=()
for id in "${start_order[@]}"; do
    needs_reference "$id" && wait_refs
    # at most GPU_JOBS GPU suites at once
    while :; do
        alive=(); for j in "${running_gpu[@]}"; do [[ -f "$tmp/$j.rc" ]] || alive+=("$j"); done
        running_gpu=("${alive[@]}")
        [[ ${#running_gpu[@]} -lt $GPU_JOBS ]] && break
        sleep 0.5; print_ready
    done
    running_gpu+=("$id")
    [[ $id == "${start_order[0]}" ]] && echo "(the GPU suites start at ${SECONDS} s)"
    start_suite "$id"
    print_ready
done
wait_refs
while [[ $next_print -lt ${#order[@]} ]]; do sleep 0.5; print_ready; done

if [[ ${#skipped_gpu[@]} -gt 0 ]]; then
    echo "skipped: no CUDA device (GPU suites: ${skipped_gpu[*]})"
    skipped=$((skipped + 1))
fi
echo "(all suites done at ${SECONDS} s)"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
