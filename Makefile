# Makefile: one binary per precision recipe.
#   make train_gpt_<recipe>      the trainer of a recipe: bf16 (the baseline), fp8 (FP8-hybrid), nvfp4 (also
#                                holds sm_100a code: native FP4 GEMMs on Blackwell, chosen at run time),
#                                vcast (any TensorCast datatype: -qw -qa -qg), tcfp12 (W = W_hi + W_lo, two FP8 GEMMs),
#                                q115 (SF16: Q1.15 true-forward boundaries, -DENABLE_Q115 -DSF16_TRUE_FORWARD=1),
#                                example (weight-only FP8: the smallest recipe, doc/architecture.md)
#   make train_gpt2q115cu / train_gpt2q115_constrainedcu / train_gpt3q115cu
#                                the Q1.15 targets under SF16's own names: GPT-2; GPT-2 with the weights
#                                kept inside the Q1.15 range; GPT-3 (default model gpt3:c768)
#   make train_gpt_q115_scaled   NOT SF16 as specified: Q1.15 with a power-of-two range per boundary
#                                (doc/recipes/q115.md: the fix for true-forward's failure to train)
#   make test_gpt_<recipe>       the GPU test binary for it
#   make train_gpt_fp32 / test_gpt_fp32   the FP32 reference-precision build (same as PRECISION=FP32)
#   make test                    every test: CPU tests always, GPU tests when a CUDA device is present
#   make all                     every target
#   make fuzz                    the libFuzzer harnesses of the host parsers (clang; bash dev/test/fuzz/run.sh runs them)
# Variables: GPU_ARCH (default sm_90a), PRECISION=FP32 (for the bf16 targets), CUDA_HOME, NVCC,
# SF16_TRUE_FORWARD (default 1; 0 = the Q1.15 targets with SF16's legacy constants), USE_CUDNN
# (default 0; 1 = attention through cuDNN's fused SDPA kernels, llmc/cudnn_attention.cpp: needs the cuDNN
# library and headers, and the header-only cuDNN frontend, which `bash dev/setup_cudnn_frontend.sh`
# puts in .deps/cudnn_frontend (or set CUDNN_FRONTEND_INC); Q1.15 refuses it). After switching
# USE_CUDNN, rebuild with make -B (the binaries keep their names).

SHELL := /bin/bash
comma := ,
# the recipes, one folder each under llmc/recipes/ (a new recipe: its folder, and its name here)
RECIPES := bf16 fp8 nvfp4 vcast tcfp12 q115 example

# ---- toolchain discovery -----------------------------------------------------------------------
CUDA_HOME ?= $(shell dirname $$(dirname $$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)))
NVCC ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(wildcard $(NVCC)),)
  $(info [make] nvcc not found (looked at $(NVCC)); set CUDA_HOME. CPU tests still build.)
  HAVE_NVCC := 0
else
  HAVE_NVCC := 1
endif
CUDA_LIB_DIRS := $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib $(CUDA_HOME)/targets/sbsa-linux/lib)
CUBLASLT_FOUND := $(firstword $(wildcard $(addsuffix /libcublasLt.so,$(CUDA_LIB_DIRS)) /usr/lib/x86_64-linux-gnu/libcublasLt.so))
NCCL_FOUND := $(firstword $(wildcard $(addsuffix /libnccl.so,$(CUDA_LIB_DIRS)) /usr/lib/x86_64-linux-gnu/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so.2))
CUDNN_FOUND := $(firstword $(wildcard $(addsuffix /libcudnn.so,$(CUDA_LIB_DIRS)) /usr/lib/x86_64-linux-gnu/libcudnn.so /usr/lib/x86_64-linux-gnu/libcudnn.so.9))
# doctest (CPU unit tests): the system's, or a copy in .deps/doctest/doctest.h (git-ignored)
DOCTEST_INC := $(if $(wildcard /usr/include/doctest/doctest.h),,$(if $(wildcard .deps/doctest/doctest.h),-I.deps,))

ifneq ($(filter-out clean print-recipes,$(MAKECMDGOALS)),)
  $(info [make] nvcc:      $(if $(filter 1,$(HAVE_NVCC)),$(NVCC) ($(shell $(NVCC) --version | grep -o 'release [0-9.]*')),not found))
  $(info [make] cuBLASLt:  $(or $(CUBLASLT_FOUND),not found))
  $(info [make] NCCL:      $(or $(NCCL_FOUND),not found: the trainers link it; install libnccl-dev or set CUDA_HOME))
  $(info [make] cuDNN:     $(or $(CUDNN_FOUND),not found) (optional, off by default))
endif

# ---- flags ---------------------------------------------------------------------------------------
GPU_ARCH ?= sm_90a
GENCODE := -gencode arch=compute_$(subst sm_,,$(GPU_ARCH)),code=$(GPU_ARCH)
# flash attention at head size 64: wgmma (sm_90a) kernels (1, default) or the mma.sync ones (0);
# builds for other targets fall back to mma.sync at run time
FLASH_WGMMA ?= 1
NVCC_FLAGS := -O3 -std=c++17 -I. $(GENCODE) -Xcompiler -Wall -lineinfo -DFLASH_ATTENTION_WGMMA=$(FLASH_WGMMA)
NVCC_LDFLAGS := $(addprefix -L,$(CUDA_LIB_DIRS)) -lcublasLt -lcublas
# NCCL: multi-GPU data parallelism (llmc/multi_gpu.cuh); every trainer links it
ifneq ($(NCCL_FOUND),)
  NVCC_LDFLAGS += -L$(dir $(NCCL_FOUND)) -lnccl
else
  NVCC_LDFLAGS += -lnccl
endif
FAST_MATH := --use_fast_math
PRECISION ?= BF16
ifeq ($(PRECISION),FP32)
  PRECISION_FLAGS := -DENABLE_FP32
  FAST_MATH :=
else ifneq ($(PRECISION),BF16)
  $(error PRECISION must be BF16 or FP32, got '$(PRECISION)')
endif
HEADERS := $(wildcard llmc/*.h llmc/*.cuh llmc/formats/*.h llmc/formats/*.cuh llmc/recipes/*/*.h llmc/recipes/*/*.cuh)
# The NVFP4 binaries also hold Blackwell code (sm_100a): there its FP4 tensor cores run the native FP4
# GEMMs, and the binary picks the path by compute capability at run time (llmc/recipes/nvfp4/recipe.h). Added
# where this nvcc knows sm_100 (CUDA 12.8 and newer) and GPU_ARCH is not sm_100a already.
BLACKWELL_GENCODE := $(if $(filter 1,$(HAVE_NVCC)),$(if $(filter sm_100a,$(GPU_ARCH)),,$(if $(shell $(NVCC) --list-gpu-code 2>/dev/null | grep -x sm_100),-gencode arch=compute_100a$(comma)code=sm_100a)))
# (--threads 2: nvcc compiles the two architectures side by side, so these binaries are not the build's long pole)
blackwell_for = $(if $(filter nvfp4,$(1)),$(BLACKWELL_GENCODE)$(if $(BLACKWELL_GENCODE), --threads 2))
SF16_TRUE_FORWARD ?= 1
USE_CUDNN ?= 0
CUDNN_OBJ :=
# the cuDNN attention's link line: wanted by USE_CUDNN=1 builds and by the train_gpt_<recipe>_cudnn targets
WANT_CUDNN := $(if $(filter 1,$(USE_CUDNN))$(filter %_cudnn build/cudnn_attention.o,$(MAKECMDGOALS)),1,)
ifeq ($(WANT_CUDNN),1)
  # the library: the CUDA toolkit's, the system's, or the one PyTorch's wheels carry (nvidia.cudnn)
  PY_CUDNN_DIR := $(shell python3 -c "import nvidia.cudnn as m; print(m.__path__[0])" 2>/dev/null)
  CUDNN_LIB := $(firstword $(CUDNN_FOUND) $(wildcard $(PY_CUDNN_DIR)/lib/libcudnn.so $(PY_CUDNN_DIR)/lib/libcudnn.so.9))
  CUDNN_INC := $(firstword $(patsubst %/cudnn.h,%,$(wildcard $(CUDA_HOME)/include/cudnn.h /usr/include/cudnn.h \
                 /usr/include/x86_64-linux-gnu/cudnn.h $(PY_CUDNN_DIR)/include/cudnn.h)))
  CUDNN_FRONTEND_INC ?= .deps/cudnn_frontend/include
  ifeq ($(CUDNN_LIB),)
    $(error cuDNN attention: no libcudnn found (looked in $(CUDA_LIB_DIRS), /usr/lib/x86_64-linux-gnu, python's nvidia.cudnn))
  endif
  ifeq ($(CUDNN_INC),)
    $(error cuDNN attention: no cudnn.h found (looked in $(CUDA_HOME)/include, /usr/include, python's nvidia.cudnn))
  endif
  ifeq ($(wildcard $(CUDNN_FRONTEND_INC)/cudnn_frontend.h),)
    $(error cuDNN attention: the cuDNN frontend headers are missing in $(CUDNN_FRONTEND_INC): run bash dev/setup_cudnn_frontend.sh)
  endif
  $(info [make] cuDNN attention: $(CUDNN_LIB), headers $(CUDNN_INC), frontend $(CUDNN_FRONTEND_INC))
  # (nvrtc: the frontend's runtime-compiled engines reference it) DT_RPATH (not RUNPATH), so that the
  # sub-libraries cuDNN opens at run time are found beside it too
  CUDNN_LINK := build/cudnn_attention.o $(CUDNN_LIB) -lnvrtc -Xlinker --disable-new-dtags \
                -Xlinker -rpath=$(abspath $(dir $(CUDNN_LIB)))
endif
ifeq ($(USE_CUDNN),1)
  NVCC_FLAGS += -DENABLE_CUDNN
  CUDNN_OBJ := build/cudnn_attention.o
  NVCC_LDFLAGS += $(CUDNN_LINK)
endif

# ---- targets -------------------------------------------------------------------------------------
.PHONY: all test test_cpu clean print-recipes
all: $(addprefix train_gpt_,$(RECIPES)) $(addprefix test_gpt_,$(RECIPES)) train_gpt_fp32 test_gpt_fp32 build/test_cpu \
     train_gpt2q115cu train_gpt2q115_constrainedcu train_gpt3q115cu train_gpt_q115_scaled \
     build/test_attention build/test_fp8 build/test_nvfp4 build/test_vcast build/test_tcfp12 \
     build/test_linear build/test_layernorm build/test_classifier build/test_q115_attention build/test_gemm_wgmma build/gemm_bench \
     build/tcfp12_gemm_bench build/libkernel_trace.so

# one binary per recipe: RECIPE_HEADER names its llmc/recipes/<name>/recipe.h, and RECIPE_DEFINES_<name> adds
# what a recipe's own build needs (Q1.15: SF16's -DENABLE_Q115)
Q115_DEFINES := -DRECIPE_HEADER='"llmc/recipes/q115/recipe.h"' -DRECIPE_TOLERANCES='"llmc/recipes/q115/test_tolerances.h"' -DENABLE_Q115 -DSF16_TRUE_FORWARD=$(SF16_TRUE_FORWARD)
RECIPE_DEFINES_q115 := $(Q115_DEFINES)
recipe_define = $(if $(RECIPE_DEFINES_$(1)),$(RECIPE_DEFINES_$(1)),-DRECIPE_HEADER='"llmc/recipes/$(1)/recipe.h"' \
                -DRECIPE_TOLERANCES='"llmc/recipes/$(1)/test_tolerances.h"')
$(addprefix train_gpt_,$(RECIPES)): train_gpt_%: train_gpt.cu $(HEADERS) $(CUDNN_OBJ)
	$(NVCC) $(NVCC_FLAGS) $(call blackwell_for,$*) $(FAST_MATH) $(if $(filter bf16,$*),$(PRECISION_FLAGS)) $(call recipe_define,$*) $< $(NVCC_LDFLAGS) -o $@

$(addprefix test_gpt_,$(RECIPES)): test_gpt_%: test_gpt.cu train_gpt.cu $(HEADERS) $(CUDNN_OBJ)
	$(NVCC) $(NVCC_FLAGS) $(call blackwell_for,$*) $(FAST_MATH) $(if $(filter bf16,$*),$(PRECISION_FLAGS)) $(call recipe_define,$*) $< $(NVCC_LDFLAGS) -o $@

# a recipe's trainer with cuDNN's attention instead of our flash kernels (what USE_CUDNN=1 builds, under
# its own name, so that dev/bench can run both: --recipes bf16,bf16_cudnn)
train_gpt_%_cudnn: train_gpt.cu $(HEADERS) build/cudnn_attention.o
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) -DENABLE_CUDNN $(call recipe_define,$*) $< $(NVCC_LDFLAGS) $(if $(CUDNN_OBJ),,$(CUDNN_LINK)) -o $@
test_gpt_%_cudnn: test_gpt.cu train_gpt.cu $(HEADERS) build/cudnn_attention.o
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) -DENABLE_CUDNN $(call recipe_define,$*) $< $(NVCC_LDFLAGS) $(if $(CUDNN_OBJ),,$(CUDNN_LINK)) -o $@
# the attention test with cuDNN's kernels checked beside ours
build/test_attention_cudnn: dev/test/gpu/test_attention.cu dev/test/gpu/gpu_check.h $(HEADERS) build/cudnn_attention.o
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) -DENABLE_CUDNN -I. $< $(NVCC_LDFLAGS) $(if $(CUDNN_OBJ),,$(CUDNN_LINK)) -o $@

# the Q1.15 recipe under SF16's target names
train_gpt2q115cu: train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) $(Q115_DEFINES) $< $(NVCC_LDFLAGS) -o $@
train_gpt2q115_constrainedcu: train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) $(Q115_DEFINES) -DQ115_CONSTRAIN_WEIGHTS=1 $< $(NVCC_LDFLAGS) -o $@
train_gpt3q115cu: train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) $(Q115_DEFINES) -DLLMC_DEFAULT_MODEL='"gpt3:c768"' $< $(NVCC_LDFLAGS) -o $@
# NOT SF16 as specified: the range-scaled boundaries doc/recipes/q115.md proposes as the fix for true-forward
train_gpt_q115_scaled: train_gpt.cu $(HEADERS)
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) $(Q115_DEFINES) -DQ115_RANGE_SCALES=1 $< $(NVCC_LDFLAGS) -o $@

# the FP32 reference-precision build of the BF16 recipe (no fast math, no TF32)
train_gpt_fp32: train_gpt.cu $(HEADERS) $(CUDNN_OBJ)
	$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 $(call recipe_define,bf16) $< $(NVCC_LDFLAGS) -o $@

test_gpt_fp32: test_gpt.cu train_gpt.cu $(HEADERS) $(CUDNN_OBJ)
	$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 $(call recipe_define,bf16) $< $(NVCC_LDFLAGS) -o $@

# the standalone GPU tests, dev/test/gpu/test_<name>.cu -> build/test_<name>:
#   attention  flash attention against a float64 CPU reference, and its speed against the materialized path
#   fp8        quantization against the CPU codec, FP8 GEMMs against float64, delayed scaling
#   nvfp4      bit-exact against the CPU reference (formats/nvfp4.h), the emulated GEMM against float64
#   vcast      bit-exact against the CPU reference (formats/vcast.h), and against the FP8 kernels
#   tcfp12     the split bit-exact against formats/tcfp12.h, the dual GEMMs against float64
#   linear     the plain linear layer (recipe_api.h) against float64: forward, GELU/DGELU epilogues, dW, the fused bias gradient
#   layernorm  the LayerNorm kernels against float64 at every width the dispatch distinguishes, and their speed
#   classifier the fused softmax + cross-entropy kernel against float64 (losses, dlogits, evaluation), its two forms bit for bit, their speed
#   q115_attention  the Q1.15 attention in the flash kernels against float64, the materialized path, the reality check
build/test_%: dev/test/gpu/test_%.cu dev/test/gpu/gpu_check.h $(HEADERS) $(CUDNN_OBJ)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) $(call blackwell_for,$*) $(FAST_MATH) -I. $< $(NVCC_LDFLAGS) -o $@

# every GEMM of a BF16 micro-step, each cuBLASLt candidate algorithm timed (dev/bench/gemm_bench.cu)
build/gemm_bench: dev/bench/gemm_bench.cu dev/bench/bench_timer.h dev/test/gpu/gpu_check.h $(HEADERS) $(CUDNN_OBJ)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) -I. $< $(NVCC_LDFLAGS) -o $@

# TCFP-12's dual FP8 GEMM against one K-concatenated block-scaled GEMM (dev/bench/tcfp12_gemm_bench.cu)
build/tcfp12_gemm_bench: dev/bench/tcfp12_gemm_bench.cu dev/bench/bench_timer.h dev/test/gpu/gpu_check.h $(HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) -I. $< $(NVCC_LDFLAGS) -o $@

# the quantize-kernel benches (dev/bench/<name>_quantize_bench.cu): ms per call and bandwidth at d12 shapes
build/%_quantize_bench: dev/bench/%_quantize_bench.cu dev/bench/bench_timer.h $(HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) -I. $< $(NVCC_LDFLAGS) -o $@

# the NVFP4 kernels on extreme values, looking for faults (dev/bench/nvfp4_stress.cu)
build/nvfp4_stress: dev/bench/nvfp4_stress.cu $(HEADERS)
	@mkdir -p build
	$(NVCC) $(NVCC_FLAGS) $(FAST_MATH) -I. $< $(NVCC_LDFLAGS) -o $@

# a CUPTI injection library: every kernel's start and end in the stream, for trace_gaps.py (dev/bench/kernel_trace.cpp)
build/libkernel_trace.so: dev/bench/kernel_trace.cpp
	@mkdir -p build
	$(NVCC) -O2 -std=c++17 -Xcompiler -fPIC,-Wall -shared $< $(addprefix -L,$(CUDA_LIB_DIRS) $(CUDA_HOME)/lib $(CUDA_HOME)/extras/CUPTI/lib64) -lcupti \
	    -Xlinker -rpath,$(CUDA_HOME)/lib64:$(CUDA_HOME)/lib:$(CUDA_HOME)/extras/CUPTI/lib64 -o $@

# cuDNN's attention (USE_CUDNN=1 only): its own object, since the frontend headers take a minute to compile
build/cudnn_attention.o: llmc/cudnn_attention.cpp llmc/cudnn_attention.h
	@mkdir -p build
	$(NVCC) -O3 -std=c++17 -Xcompiler -Wall -I$(CUDNN_FRONTEND_INC) -I$(CUDNN_INC) -c $< -o $@

# CPU unit tests (no GPU, no CUDA): every dev/test/cpu/*.cpp
CPU_TEST_SOURCES := $(wildcard dev/test/cpu/*.cpp)
build/test_cpu: $(CPU_TEST_SOURCES) dev/test/cpu/test_util.h $(HEADERS)
	@mkdir -p build
	g++ -std=c++17 -O1 -Wall -I. $(DOCTEST_INC) $(CPU_TEST_SOURCES) -o $@

test_cpu: build/test_cpu
	./build/test_cpu

# The README's test command: CPU tests, the trainer's bad-input checks, and the GPU tests when a
# CUDA device is present ("skipped: no CUDA device" otherwise). ONLY=<suite or recipe>[,...] runs a part
# (dev/test/run_tests.sh --help lists the names; doc/testing.md).
test:
	$(if $(ONLY),ONLY='$(ONLY)') bash dev/test/run_tests.sh

# the recipe list, for dev/test/run_tests.sh
print-recipes:
	@echo $(RECIPES)

clean:
	rm -rf build $(addprefix train_gpt_,$(RECIPES)) $(addprefix test_gpt_,$(RECIPES)) train_gpt_fp32 test_gpt_fp32 \
	    train_gpt2q115cu train_gpt2q115_constrainedcu train_gpt3q115cu

# libFuzzer harnesses of the host-side parsers (dev/test/fuzz/fuzz_<name>.cpp -> build/fuzz/fuzz_<name>), built
# with clang++ and AddressSanitizer + UndefinedBehaviorSanitizer; not part of `all`.
# bash dev/test/fuzz/run.sh [SECONDS] builds and runs them (doc/testing.md, Fuzzing).
FUZZ_CXX ?= clang++
FUZZ_HARNESSES := $(patsubst dev/test/fuzz/fuzz_%.cpp,build/fuzz/fuzz_%,$(wildcard dev/test/fuzz/fuzz_*.cpp))
.PHONY: fuzz
fuzz: $(FUZZ_HARNESSES)
build/fuzz/fuzz_%: dev/test/fuzz/fuzz_%.cpp dev/test/fuzz/fuzz_util.h $(HEADERS)
	@mkdir -p build/fuzz
	$(FUZZ_CXX) -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. $< -o $@
