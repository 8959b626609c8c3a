// recipes/q115/recipe.h: the Q1.15 "true-forward" recipe, SF16. Built with -DENABLE_Q115
// -DSF16_TRUE_FORWARD=1 (make train_gpt_q115, train_gpt2q115cu, train_gpt2q115_constrainedcu,
// train_gpt3q115cu).
//
// SF16 is a simulation: tensors are stored in BF16 and the GEMMs run on BF16 tensor cores (cuBLASLt,
// compute type CUBLAS_COMPUTE_32F_FAST_16BF), while every forward boundary listed below passes
// through simulate_q115 (formats/number_formats.h: clamp to +-0.999, x 2^15, round to nearest even, x 2^-15):
//   matmul outputs    simulate_q131 then simulate_q115 after each forward GEMM: the four linears (a
//                     post-GEMM kernel below for qkv and fc; the residual add, for the attention and
//                     MLP projections: it reads them, quantizes them and stores them back), the
//                     attention scores q.k and att @ v, the LM head
//   attention         the expansion scale is 1.0 (the score GEMM's alpha); softmax reads its input
//                     through simulate_q115, times the usual 1/sqrt(head size), and stores
//                     simulate_q115(ev * norm). Head sizes 64 and 128 run it in the fused flash
//                     attention kernels (two passes over the keys: flash_attention.cuh), others
//                     in the materialized path (attention.cuh); the same values either way, up to
//                     the order of the fp32 sums
//   logits            read through simulate_q115, logit scale 1.0 (legacy builds: 24.0)
//   norm / residual   every LayerNorm output and every residual add, clamped to +-0.999 and quantized;
//                     residual branch scales 1.0 / 1.0 (legacy builds: 0.65 attention, 0.75 MLP)
//   GELU              reads through simulate_q115 and stores simulate_q115(gelu)
//   encoder           wte + wpe quantized before it is stored
// The backward pass is the BF16 one: every boundary is straight-through (its gradient is 1, also
// where it clamped), apart from the branch and logit scales, which scale the gradients too.
//
// How the boundaries reach the model: the four linears are this recipe's (recipe_linear_forward below);
// everything else goes through the hooks of llmc/boundaries.h (struct Q115Boundaries). Where SF16
// quantizes a GEMM output that only one kernel reads (the scores, att @ v, the LM head), that reader
// applies simulate_q131 then simulate_q115 to the GEMM's BF16 output on the way in: the same values
// as a separate post-GEMM pass, without writing the tensor twice.
//
// Storage is BF16, so a stored boundary value is BF16(simulate_q115(x)). That is simulate_q115(x)
// itself, a multiple of 2^-15, except at the clamp: 32735/32768 (0.99899...) has 15 significant bits
// and rounds to 1.0 in BF16. Every stored BF16 boundary therefore holds k/32768 with |k| <= 32768,
// and a reader that goes through simulate_q115 again (softmax, GELU, logits) sees 32735/32768. The
// residual stream is FP32 in this trainer and holds simulate_q115(x) exactly (|x| <= 0.999).
//
// Variants (compile-time):
//   SF16_TRUE_FORWARD=0         the legacy constants: logit scale Q115_LOGITS_SCALE (24), residual
//                               branch scales 0.65 / 0.75 (the boundaries stay)
//   Q115_CONSTRAIN_WEIGHTS=1    the optimizer keeps every parameter inside the Q1.15 range: the master
//                               weight is clamped to +-0.999 after each AdamW step (and at init/load)
//   Q115_RANGE_SCALES=1         NOT plain SF16: the fix doc/recipes/q115.md proposes for true-forward's
//                               failure to train. Each boundary b stores s_b * simulate_q115(x / s_b)
//                               with a fixed power-of-two range s_b (q115_range below): a 16-bit fixed
//                               point value with log2(s_b) integer bits (Q4.11 for s_b = 16), so that
//                               LayerNorm outputs, scores, residuals and logits are not clamped at +-1.
//                               make train_gpt_q115_scaled.
// -Q 115 checks that the binary is this recipe and runs q115_self_check: every hook on the GPU
// against the CPU codec for all 65536 BF16 inputs.
//
// Telemetry (-lq N): every N steps one main.log line per boundary, over the step's forward passes:
//   s:STEP lq:q115.BOUNDARY clamp:F ftz:F amax:A
// clamp = fraction of values with |x| > 0.999 (clamped), ftz = fraction of non-zero values that
// quantize to 0 (|x| < 2^-16), amax = the largest |x| before quantization.
#pragma once
#if defined(ENABLE_CUDNN)
#error "ENABLE_CUDNN is not supported with ENABLE_Q115. Disable USE_CUDNN for Q115/SF16 builds."
#endif
#if defined(ENABLE_FP32)
#error "the Q1.15 recipe stores BF16 (PRECISION=FP32 is the BF16 recipe's reference build)"
#endif
#ifndef SF16_TRUE_FORWARD
#define SF16_TRUE_FORWARD 0
#endif
#ifndef Q115_CONSTRAIN_WEIGHTS
#define Q115_CONSTRAIN_WEIGHTS 0
#endif
#ifndef Q115_RANGE_SCALES
#define Q115_RANGE_SCALES 0
#endif
#include <algorithm>
#include <vector>
#include "llmc/recipe_api.h"
#include "options.h"
#include "llmc/formats/number_formats.h"
#include "llmc/gelu.cuh"
#include "llmc/gemm_wgmma.cuh"

#define RECIPE_NAME "q115"
using RecipeOptions = Q115Options; // its flags (options.h)
#define RECIPE_CHECK_ALIAS "115"

// ---- the SF16 constants ----------------------------------------------------------------------
constexpr float Q115_ACTIVATION_CLAMP_MIN = -llmc::Q115_OVERFLOW_THRESHOLD;
constexpr float Q115_ACTIVATION_CLAMP_MAX = llmc::Q115_OVERFLOW_THRESHOLD;
constexpr float Q115_ATTENTION_EXPANSION_SCALE = 1.0f; // att_scale: the score GEMM's alpha
// legacy (non-true-forward) constants; SF16 also names Q115_EMBEDDING_SCALE, Q115_ATTENTION_SCALE
// and Q115_FFN_SCALE without giving their values, so they are not defined here
constexpr float Q115_LOGITS_SCALE = 24.0f;
constexpr float Q115_LEGACY_ATTENTION_RESIDUAL_SCALE = 0.65f;
constexpr float Q115_LEGACY_MLP_RESIDUAL_SCALE = 0.75f;
#if SF16_TRUE_FORWARD
constexpr float Q115_LOGIT_SCALE = 1.0f;
constexpr float Q115_ATTENTION_RESIDUAL_SCALE = 1.0f;
constexpr float Q115_MLP_RESIDUAL_SCALE = 1.0f;
#else
constexpr float Q115_LOGIT_SCALE = Q115_LOGITS_SCALE;
constexpr float Q115_ATTENTION_RESIDUAL_SCALE = Q115_LEGACY_ATTENTION_RESIDUAL_SCALE;
constexpr float Q115_MLP_RESIDUAL_SCALE = Q115_LEGACY_MLP_RESIDUAL_SCALE;
#endif

// ---- telemetry ---------------------------------------------------------------------------------
enum Q115Boundary {
    QB_EMBEDDING = 0, QB_NORM, QB_QKV, QB_SCORES, QB_SOFTMAX, QB_ATTN_OUT, QB_ATTPROJ, QB_RESIDUAL,
    QB_FC, QB_GELU, QB_FCPROJ, QB_LOGITS, NUM_Q115_BOUNDARIES
};
static const char* Q115_BOUNDARY_NAMES[NUM_Q115_BOUNDARIES] = {
    "embedding", "norm", "qkv", "scores", "softmax", "attn_out", "attproj", "residual",
    "fc", "gelu", "fcproj", "logits"};

// The range of each boundary: 1 (plain Q1.15) unless Q115_RANGE_SCALES. Powers of two, so
// x / s and s * q are exact.
LLMC_BD constexpr float q115_range(int which) {
#if Q115_RANGE_SCALES
    switch (which) {
        case QB_NORM: case QB_QKV: case QB_ATTN_OUT: case QB_ATTPROJ: case QB_FC: case QB_GELU: case QB_FCPROJ: return 16.0f;
        case QB_RESIDUAL: case QB_LOGITS: return 32.0f;
        case QB_SCORES: return 64.0f; // the raw q.k: up to +-8 after 1/sqrt(64)
        default: return 1.0f;         // embedding (|wte + wpe| << 1), softmax (probabilities)
    }
#else
    (void)which;
    return 1.0f;
#endif
}

// Counts per boundary (of x / range: "clamped" is |x| > 0.999 * range). A kernel may pass a value
// through its hook more than once (the materialized softmax reads each score three times, the
// classifier each logit twice; the flash attention counts each once, boundaries.h's Values); every
// count grows alike, so the fractions are unchanged.
struct Q115Counters {
    unsigned long long seen, clamped, flushed;
    unsigned int amax_bits; // |x| as float bits (non-negative floats order like their bits)
    unsigned int pad;
};
// Every boundary has Q115_COUNTER_SLOTS copies of its counters, [boundary][slot]; a warp adds into
// slot (its index in the grid) mod Q115_COUNTER_SLOTS, so the warps resident at one time (a few
// thousand on an H100) spread their atomics over as many addresses instead of queueing on one (which
// slowed a telemetry step several times over).
// q115_total adds the slots up on the host.
static const int Q115_COUNTER_SLOTS = 4096;
static const size_t Q115_COUNTERS_BYTES = (size_t)NUM_Q115_BOUNDARIES * Q115_COUNTER_SLOTS * sizeof(Q115Counters);
inline Q115Counters q115_total(const Q115Counters* slots, int which) {
    Q115Counters t = {0, 0, 0, 0, 0};
    for (int k = 0; k < Q115_COUNTER_SLOTS; k++) {
        const Q115Counters& c = slots[which * Q115_COUNTER_SLOTS + k];
        t.seen += c.seen;
        t.clamped += c.clamped;
        t.flushed += c.flushed;
        t.amax_bits = std::max(t.amax_bits, c.amax_bits);
    }
    return t;
}
// Where the hooks count: the recipe's counters during a telemetry step, else null (no counting).
// Constant memory: no store can alias it, so kernels load it once.
__constant__ Q115Counters* q115_counters;
// The host's copy of (q115_counters != nullptr), for launchers that pick their kernels by it
// (boundaries.h, observing()). q115_point_counters sets both.
inline bool q115_counting_now = false;
// Whether the qkv and fc linears quantize in the epilogue of our Hopper GEMM (gemm_wgmma.cuh) where it
// runs, instead of cuBLASLt's GEMM and a pass over its output. The same values but for the order of
// the FP32 sums (build/test_gemm_wgmma checks the two transforms bit for bit on the same GEMM output).
// LLMC_Q115_FUSED_GEMM=0 turns it off (A/B runs).
inline bool q115_fused_gemm = true;
inline void q115_point_counters(Q115Counters* p, cudaStream_t stream) {
    cudaCheck(cudaMemcpyToSymbolAsync(q115_counters, &p, sizeof(p), 0, cudaMemcpyHostToDevice, stream));
    q115_counting_now = p != nullptr;
}

// a warp's counts of one boundary into the warp's slot (called by one lane). The amax's atomic is
// skipped when it would not raise the slot's value (read first, through L2: the slot's other writers
// are atomics there), which after the first waves is nearly always.
__device__ __forceinline__ void q115_add_counts(Q115Counters* c, int which, unsigned seen, unsigned clamped,
                                                unsigned flushed, unsigned amax_bits) {
    // blocks are 1-D, multiples of 32 threads
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned slot = (block * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE) % Q115_COUNTER_SLOTS;
    Q115Counters& s = c[which * Q115_COUNTER_SLOTS + slot];
    atomicAdd(&s.seen, (unsigned long long)seen);
    if (clamped) atomicAdd(&s.clamped, (unsigned long long)clamped);
    if (flushed) atomicAdd(&s.flushed, (unsigned long long)flushed);
    if (amax_bits > __ldcg(&s.amax_bits)) atomicMax(&s.amax_bits, amax_bits);
}

// Warp-aggregated: one lane of the threads that reach this together adds their counts.
__device__ __forceinline__ void q115_observe(int which, float x, float q) {
    Q115Counters* c = q115_counters;
    if (c == nullptr) return;
    const unsigned mask = __activemask();
    const unsigned clamped = __ballot_sync(mask, llmc::abs_bits(x) > llmc::Q115_OVERFLOW_THRESHOLD);
    const unsigned flushed = __ballot_sync(mask, x != 0.0f && q == 0.0f);
    const unsigned amax = __reduce_max_sync(mask, __float_as_uint(llmc::abs_bits(x)));
    if ((int)(threadIdx.x % WARP_SIZE) == __ffs(mask) - 1)
        q115_add_counts(c, which, __popc(mask), __popc(clamped), __popc(flushed), amax);
}

// Q115Boundaries::Tally (boundaries.h): a thread's counts of the scores and of the probabilities in
// registers; commit() sums them over the warp and adds them with one lane. What is counted is what
// q115_matmul_output (scores) and q115_probability (probabilities) count.
struct Q115Tally {
    unsigned seen[2] = {0, 0}, clamped[2] = {0, 0}, flushed[2] = {0, 0}, amax_bits[2] = {0, 0};
    __device__ __forceinline__ void add(int k, float xs, float q) {
        seen[k] += 1;
        clamped[k] += llmc::abs_bits(xs) > llmc::Q115_OVERFLOW_THRESHOLD;
        flushed[k] += xs != 0.0f && q == 0.0f;
        amax_bits[k] = max(amax_bits[k], __float_as_uint(llmc::abs_bits(xs)));
    }
    __device__ __forceinline__ void score(float x) {
        const float xs = x * (1.0f / q115_range(QB_SCORES));
        add(0, xs, llmc::simulate_q115(xs));
    }
    __device__ __forceinline__ void prob(float p) { add(1, p, llmc::simulate_q115_of_probability(p)); }
    __device__ __forceinline__ void commit() {
        Q115Counters* c = q115_counters;
        if (c == nullptr) return;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const unsigned n = __reduce_add_sync(0xffffffffu, seen[k]);
            const unsigned nc = __reduce_add_sync(0xffffffffu, clamped[k]);
            const unsigned nf = __reduce_add_sync(0xffffffffu, flushed[k]);
            const unsigned am = __reduce_max_sync(0xffffffffu, amax_bits[k]);
            if (n > 0 && threadIdx.x % WARP_SIZE == 0) q115_add_counts(c, k == 0 ? QB_SCORES : QB_SOFTMAX, n, nc, nf, am);
        }
    }
};

// a boundary: simulate_q115 (counted on the device unless OBSERVE is false); range *
// simulate_q115(x / range) in general
template <bool OBSERVE = true>
LLMC_BD float q115_boundary(int which, float x) {
    const float s = q115_range(which), xs = x * (1.0f / s);
    const float q = llmc::simulate_q115(xs);
#if defined(__CUDA_ARCH__)
    if constexpr (OBSERVE) q115_observe(which, xs, q);
#endif
    return s * q;
}
// a forward GEMM's output: simulate_q131 (the FP32 register) then simulate_q115 (the SF16 store).
// x is always the BF16 value the GEMM stored (the post-GEMM kernels read it from memory; the flash
// attention rounds its scores and outputs to BF16 before the hook; the classifier reads BF16
// logits), and on a BF16 value simulate_q115 alone gives simulate_q115(simulate_q131(x)) bit for bit
// (formats/number_formats.h, simulate_q115_of_q131; a power-of-two range keeps xs a BF16 value). So one
// rounding: these hooks run on every score of the attention several times.
template <bool OBSERVE = true>
LLMC_BD float q115_matmul_output(int which, float x) {
    const float s = q115_range(which), xs = x * (1.0f / s);
    const float q = llmc::simulate_q115(xs);
#if defined(__CUDA_ARCH__)
    if constexpr (OBSERVE) q115_observe(which, xs, q);
#endif
    return s * q;
}
// the softmax output: an attention probability (>= 0, or NaN), whose range is always 1, through
// simulate_q115_of_probability: simulate_q115's bits there without the lower clamp (one instruction
// fewer per score in each of the flash attention's three passes over the scores)
static_assert(q115_range(QB_SOFTMAX) == 1.0f, "the probabilities are quantized in Q1.15 itself");
template <bool OBSERVE = true>
LLMC_BD float q115_probability(float p) {
    const float q = llmc::simulate_q115_of_probability(p);
#if defined(__CUDA_ARCH__)
    if constexpr (OBSERVE) q115_observe(QB_SOFTMAX, p, q);
#endif
    return q;
}
// a reader "through simulate_q115" of a value stored at boundary `which`
LLMC_BD float q115_read(int which, float x) {
    const float s = q115_range(which);
    return s * llmc::simulate_q115(x * (1.0f / s));
}

// The hooks of boundaries.h. A reader "through simulate_q115" of a GEMM output that it reads alone
// (scores, logits) applies the GEMM's post-quantization only: simulate_q115 returns the values it is
// idempotent on (k/32768, |k| <= 32735; with a range s, s * that), so reading through it again changes
// nothing. The GELU reads a stored BF16 tensor, where the clamp value became 1.0, so it re-reads.
struct Q115BoundaryValues;
struct Q115Boundaries {
    using Values = Q115BoundaryValues; // the same hooks, not counted (boundaries.h)
    using Tally = Q115Tally;
    static constexpr bool ACTIVE = true;
    static constexpr bool CONSTRAINS_WEIGHTS = Q115_CONSTRAIN_WEIGHTS != 0;
    static constexpr float ATTENTION_RESIDUAL_SCALE = Q115_ATTENTION_RESIDUAL_SCALE;
    static constexpr float MLP_RESIDUAL_SCALE = Q115_MLP_RESIDUAL_SCALE;
    static constexpr float LOGIT_SCALE = Q115_LOGIT_SCALE;
    // |attention_scores(x)| = range * |simulate_q115(x / range)| <= range * 32735/32768
    static constexpr float ATTENTION_SCORE_BOUND = llmc::Q115_OVERFLOW_THRESHOLD * q115_range(QB_SCORES);
    LLMC_BD static float embedding(float x) { return q115_boundary(QB_EMBEDDING, x); }
    LLMC_BD static float residual(float x) { return q115_boundary(QB_RESIDUAL, x); }
    LLMC_BD static float norm_output(float x) { return q115_boundary(QB_NORM, x); }
    LLMC_BD static float attention_scores(float x) { return q115_matmul_output(QB_SCORES, x); }
    LLMC_BD static float softmax_output(float x) { return q115_probability(x); }
    LLMC_BD static float attention_output(float x) { return q115_matmul_output(QB_ATTN_OUT, x); }
    // the pre-GELU tensor is the fc GEMM's output, already quantized (and counted) by linear_forward_gelu
    LLMC_BD static float gelu_input(float x) { return q115_read(QB_FC, x); }
    LLMC_BD static float gelu_output(float x) { return q115_boundary(QB_GELU, x); }
    LLMC_BD static float logits(float x) { return q115_matmul_output(QB_LOGITS, x); }
    // the attention / MLP projection's output: quantized (and stored back) by the residual add that reads it
    LLMC_BD static float branch_output(int branch, float x) {
        return q115_matmul_output(branch == ATTENTION_BRANCH ? QB_ATTPROJ : QB_FCPROJ, x);
    }
    LLMC_BD static float constrain_weight(float x) { return llmc::q_clamp(x); }
    LLMC_BD static bool observing() {
#if defined(__CUDA_ARCH__)
        return q115_counters != nullptr;
#else
        return q115_counting_now;
#endif
    }
};
// Q115Boundaries' hooks without the telemetry (the readers and constrain_weight count nothing anyway)
struct Q115BoundaryValues : Q115Boundaries {
    using Values = Q115BoundaryValues;
    LLMC_BD static float embedding(float x) { return q115_boundary<false>(QB_EMBEDDING, x); }
    LLMC_BD static float residual(float x) { return q115_boundary<false>(QB_RESIDUAL, x); }
    LLMC_BD static float norm_output(float x) { return q115_boundary<false>(QB_NORM, x); }
    LLMC_BD static float attention_scores(float x) { return q115_matmul_output<false>(QB_SCORES, x); }
    LLMC_BD static float softmax_output(float x) { return q115_probability<false>(x); }
    LLMC_BD static float attention_output(float x) { return q115_matmul_output<false>(QB_ATTN_OUT, x); }
    LLMC_BD static float gelu_output(float x) { return q115_boundary<false>(QB_GELU, x); }
    LLMC_BD static float logits(float x) { return q115_matmul_output<false>(QB_LOGITS, x); }
    LLMC_BD static float branch_output(int branch, float x) {
        return q115_matmul_output<false>(branch == ATTENTION_BRANCH ? QB_ATTPROJ : QB_FCPROJ, x);
    }
    LLMC_BD static bool observing() { return false; }
};
using RecipeBoundaries = Q115Boundaries;

// ---- kernels -----------------------------------------------------------------------------------
// A linear's output in place: x = BF16(simulate_q115(simulate_q131(x))). 8 BF16 per thread.
// OBSERVE: counted (a telemetry step; the launchers pick by q115_counting_now, so that the kernels of
// an ordinary step carry no counting code).
template <bool OBSERVE>
__global__ void q115_matmul_output_kernel(floatX* x, long long n_vec, int which) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vec) return;
    uint4 packed = reinterpret_cast<const uint4*>(x)[i];
    floatX* v = reinterpret_cast<floatX*>(&packed);
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = (floatX)q115_matmul_output<OBSERVE>(which, (float)v[k]);
    reinterpret_cast<uint4*>(x)[i] = packed;
}

// The fc output and its GELU: pre_gelu = BF16(matmul_output(pre_gelu)) in place, and
// gelu_out = BF16(gelu_output(gelu(gelu_input(the stored pre_gelu)))): the GELU reads the stored BF16
// value, so a recomputed GELU (gelu_forward<Q115Boundaries>, -r >= 1) equals this one bit for bit.
template <bool OBSERVE>
__global__ void q115_fc_gelu_kernel(floatX* gelu_out, floatX* pre_gelu, long long n_vec) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vec) return;
    uint4 packed = reinterpret_cast<const uint4*>(pre_gelu)[i];
    uint4 out;
    floatX* v = reinterpret_cast<floatX*>(&packed);
    floatX* g = reinterpret_cast<floatX*>(&out);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        v[k] = (floatX)q115_matmul_output<OBSERVE>(QB_FC, (float)v[k]);
        g[k] = (floatX)gelu_forward_value<std::conditional_t<OBSERVE, Q115Boundaries, Q115BoundaryValues>>((float)v[k]);
    }
    reinterpret_cast<uint4*>(pre_gelu)[i] = packed;
    reinterpret_cast<uint4*>(gelu_out)[i] = out;
}

// The same two transforms as epilogues of the Hopper GEMM (gemm_wgmma.cuh), which hands over the fp32
// sums (with the bias) of two neighbouring outputs: rounded to BF16 first, as the GEMM would have
// stored them, then exactly what the kernels above do with the stored values. One store instead of a
// store, a read and a store again.
template <bool OBSERVE>
struct Q115OutputEpilogue {
    static constexpr int OUTPUTS = 1;
    floatX* out[1];
    int which;
    __device__ __forceinline__ void operator()(float v0, float v1, __nv_bfloat162 (&r)[1]) const {
        const float s0 = __bfloat162float(__float2bfloat16_rn(v0)), s1 = __bfloat162float(__float2bfloat16_rn(v1));
        r[0] = __floats2bfloat162_rn(q115_matmul_output<OBSERVE>(which, s0), q115_matmul_output<OBSERVE>(which, s1));
    }
};
// out[0] = the quantized fc output (pre-GELU), out[1] = its GELU
template <bool OBSERVE>
struct Q115FcGeluEpilogue {
    static constexpr int OUTPUTS = 2;
    floatX* out[2];
    __device__ __forceinline__ void operator()(float v0, float v1, __nv_bfloat162 (&r)[2]) const {
        using Bd = std::conditional_t<OBSERVE, Q115Boundaries, Q115BoundaryValues>;
        const float s0 = __bfloat162float(__float2bfloat16_rn(v0)), s1 = __bfloat162float(__float2bfloat16_rn(v1));
        r[0] = __floats2bfloat162_rn(q115_matmul_output<OBSERVE>(QB_FC, s0), q115_matmul_output<OBSERVE>(QB_FC, s1));
        r[1] = __floats2bfloat162_rn(gelu_forward_value<Bd>(__bfloat162float(r[0].x)),
                                     gelu_forward_value<Bd>(__bfloat162float(r[0].y)));
    }
};

// Every hook on every BF16 bit pattern (for -Q 115): out[h * 65536 + bits].
constexpr int Q115_NUM_HOOKS = 10;
LLMC_BD float q115_hook(int h, float x) {
    using Bd = Q115Boundaries;
    switch (h) {
        case 0: return Bd::embedding(x);
        case 1: return Bd::residual(x);
        case 2: return Bd::norm_output(x);
        case 3: return Bd::attention_scores(x);
        case 4: return Bd::softmax_output(x);
        case 5: return Bd::attention_output(x);
        case 6: return Bd::gelu_input(x);
        case 7: return Bd::gelu_output(x);
        case 8: return Bd::logits(x);
        default: return q115_matmul_output(QB_QKV, x);
    }
}
__global__ void q115_self_check_kernel(float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Q115_NUM_HOOKS * 65536) return;
    const float x = llmc::bits_float((uint32_t)(i % 65536) << 16);
    out[i] = q115_hook(i / 65536, x);
}

// ---- the recipe ------------------------------------------------------------------------------
struct Recipe {
    RecipeOptions options;
    LinearScratch scratch;
    Q115Counters* counters = nullptr; // NUM_Q115_BOUNDARIES
    bool counting = false;            // q115_counters points at them
};

inline void q115_set_counting(Recipe& r, bool on, cudaStream_t stream) {
    if (on == r.counting) return;
    q115_point_counters(on ? r.counters : nullptr, stream);
    r.counting = on;
}

// The device's hooks against the CPU's for all 65536 BF16 inputs (NaN: both NaN). Exits on a mismatch.
inline void q115_self_check() {
    const int n = Q115_NUM_HOOKS * 65536;
    float* d = (float*)cuda_malloc_or_die(n * sizeof(float), "q115 self-check");
    q115_self_check_kernel<<<ceil_div(n, 256), 256>>>(d);
    cudaCheckLaunch();
    std::vector<float> got(n);
    cudaCheck(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d));
    for (int i = 0; i < n; i++) {
        const float x = llmc::bits_float((uint32_t)(i % 65536) << 16);
        const float want = q115_hook(i / 65536, x);
        const bool same = llmc::float_bits(want) == llmc::float_bits(got[i]) || (want != want && got[i] != got[i]);
        if (!same) {
            fprintf(stderr, "error: -Q 115: the device's Q1.15 hook %d maps %a to %a, the CPU codec to %a\n", i / 65536, x,
                    got[i], want);
            exit(1);
        }
    }
    printf("-Q 115: Q1.15 boundaries verified on the device: %d hooks x 65536 BF16 inputs bit-exact against the CPU "
           "codec (SF16_TRUE_FORWARD=%d%s)\n", Q115_NUM_HOOKS, SF16_TRUE_FORWARD,
           Q115_RANGE_SCALES ? ", Q115_RANGE_SCALES=1: not SF16 as specified" : "");
}

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int B, int T,
                        const RecipeContext& ctx = RecipeContext()) {
    (void)B; (void)T;
    r.options = o;
    // the post-GEMM kernels read 8 BF16 (16 bytes) at a time
    if (shape.channels % 8 != 0) input_error("q115: the model's channels (%d) must be a multiple of 8", shape.channels);
    linear_scratch_init(r.scratch, shape.channels);
    if (const char* e = getenv("LLMC_Q115_FUSED_GEMM")) q115_fused_gemm = atoi(e) != 0;
    r.counters = (Q115Counters*)cuda_malloc_or_die(Q115_COUNTERS_BYTES, "q115 telemetry");
    q115_point_counters(nullptr, 0);
    cudaCheck(cudaDeviceSynchronize());
    if (ctx.self_check) q115_self_check();
}

inline std::string recipe_describe(const Recipe&) {
    return strfmt("q115: SF16 (Q1.15) boundaries, %s (logit scale %g, residual scales %g/%g)%s%s; BF16 storage, "
                  "GEMMs and backward%s",
                  SF16_TRUE_FORWARD ? "true-forward" : "legacy", Q115_LOGIT_SCALE, Q115_ATTENTION_RESIDUAL_SCALE,
                  Q115_MLP_RESIDUAL_SCALE, Q115_CONSTRAIN_WEIGHTS ? ", weights constrained to +-0.999" : "",
                  Q115_RANGE_SCALES ? ", RANGE-SCALED boundaries (not SF16 as specified: doc/recipes/q115.md)" : "",
                  q115_fused_gemm && gemm_wgmma::available() ? "; qkv/fc quantized in the GEMM epilogue (gemm_wgmma)" : "");
}
// (nothing random, nothing that the processes of a data-parallel run must combine, no state beyond the
// weights: the boundaries are pure functions. The defaults of recipe_api.h.)

inline int q115_linear_boundary(LinearKind k) {
    return k == LIN_QKV ? QB_QKV : k == LIN_ATTPROJ ? QB_ATTPROJ : k == LIN_FC ? QB_FC : QB_FCPROJ;
}

// The qkv and fc layers' forward: out = simulate_q115(simulate_q131(inp W^T + bias)), the GEMM's BF16
// output quantized in place. The two projections (attproj, fcproj) are the plain linear, their output
// left as the GEMM stored it: the residual add, the one kernel that reads it, quantizes it there and
// stores it back (Q115Boundaries::branch_output, layernorm.cuh), one pass over the tensor instead of
// two. The backward pass is the plain linear's (straight-through boundaries).
inline bool recipe_quantizes(const Recipe&, LinearId id, int, int, int, LinearPass pass) {
    return pass != PASS_BACKWARD && id.kind != LIN_ATTPROJ && id.kind != LIN_FCPROJ;
}
inline void recipe_linear_forward(Recipe&, LinearId id, floatX* out, const floatX* inp, const floatX* weight,
                                  const floatX* bias, int N, int C, int OC, bool, cudaStream_t stream) {
    // on Hopper: the quantization in the GEMM's epilogue (gemm_wgmma.cuh), no pass over the output
    if (q115_fused_gemm && gemm_wgmma::supported(out, inp, weight, bias, N, OC, C)) {
        const int which = q115_linear_boundary(id.kind);
        if (q115_counting_now) gemm_wgmma::gemm(inp, weight, bias, N, OC, C, Q115OutputEpilogue<true>{{out}, which}, stream);
        else gemm_wgmma::gemm(inp, weight, bias, N, OC, C, Q115OutputEpilogue<false>{{out}, which}, stream);
        return;
    }
    plain_linear_forward(out, inp, weight, bias, N, C, OC, stream);
    const long long n_vec = (long long)N * OC / 8; // OC is a multiple of 8 for every model (C % 8 == 0)
    if (q115_counting_now) q115_matmul_output_kernel<true><<<ceil_div(n_vec, 256), 256, 0, stream>>>(out, n_vec, q115_linear_boundary(id.kind));
    else q115_matmul_output_kernel<false><<<ceil_div(n_vec, 256), 256, 0, stream>>>(out, n_vec, q115_linear_boundary(id.kind));
    cudaCheckLaunch();
}
inline void recipe_linear_forward_gelu(Recipe&, LinearId, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                       const floatX* weight, const floatX* bias, int N, int C, int OC, bool,
                                       cudaStream_t stream) {
    if (q115_fused_gemm && gemm_wgmma::supported(pre_gelu, inp, weight, bias, N, OC, C) && ((uintptr_t)gelu_out % 16) == 0) {
        if (q115_counting_now) gemm_wgmma::gemm(inp, weight, bias, N, OC, C, Q115FcGeluEpilogue<true>{{pre_gelu, gelu_out}}, stream);
        else gemm_wgmma::gemm(inp, weight, bias, N, OC, C, Q115FcGeluEpilogue<false>{{pre_gelu, gelu_out}}, stream);
        return;
    }
    plain_linear_forward(pre_gelu, inp, weight, bias, N, C, OC, stream);
    const long long n_vec = (long long)N * OC / 8;
    if (q115_counting_now) q115_fc_gelu_kernel<true><<<ceil_div(n_vec, 256), 256, 0, stream>>>(gelu_out, pre_gelu, n_vec);
    else q115_fc_gelu_kernel<false><<<ceil_div(n_vec, 256), 256, 0, stream>>>(gelu_out, pre_gelu, n_vec);
    cudaCheckLaunch();
}
inline bool recipe_begin_step(Recipe& r, int step) {
    const bool due = r.options.telemetry_every > 0 && step % r.options.telemetry_every == 0;
    if (due) cudaCheck(cudaMemset(r.counters, 0, Q115_COUNTERS_BYTES));
    q115_set_counting(r, due, 0);
    return due;
}
inline void recipe_log_telemetry(Recipe& r, FILE* log, int step) {
    std::vector<Q115Counters> slots(Q115_COUNTERS_BYTES / sizeof(Q115Counters));
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(slots.data(), r.counters, Q115_COUNTERS_BYTES, cudaMemcpyDeviceToHost));
    q115_set_counting(r, false, 0);
    for (int b = 0; b < NUM_Q115_BOUNDARIES; b++) {
        const Q115Counters c = q115_total(slots.data(), b);
        const double seen = c.seen > 0 ? (double)c.seen : 1.0;
        fprintf(log, "s:%d lq:q115.%s clamp:%.6e ftz:%.6e amax:%.6e\n", step, Q115_BOUNDARY_NAMES[b],
                c.clamped / seen, c.flushed / seen, (double)llmc::bits_float(c.amax_bits) * q115_range(b));
    }
    fflush(log);
}
