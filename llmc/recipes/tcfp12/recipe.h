// recipes/tcfp12/recipe.h: the TCFP-12 precision recipe: every transformer weight is
// split as W ~= deq(W_hi) + deq(W_lo), both FP8 E4M3 (formats/tcfp12.h), so that two FP8 tensor-core GEMMs
// see about 8 significant bits of the weight.
//
// Per transformer linear (x the input, W the weight, dy the output gradient, N tokens):
//   forward  y  = x W_lo^T + x W_hi^T   x: E4M3 with a fresh power-of-two scale (its current amax);
//                                        the W_lo GEMM writes y, the W_hi GEMM adds onto it (beta=1)
//                                        and applies the bias / GELU epilogue
//   dgrad    dx = dy W_lo + dy W_hi     dy: E5M2, fresh scale; -tabd 1: dy W_hi alone (ABD)
//   wgrad    dW += dy^T x               BF16 operands by default (a high-precision weight gradient);
//                                        -tfw 1: E5M2 dy^T x E4M3 x^T on FP8 tensor cores
// The small W_lo product goes first so that the BF16 rounding of the partial result is 2^-9 of a
// term about 16 times smaller than y: the sum is rounded essentially once. The W_lo GEMMs use
// Hopper's fast FP8 accumulation (its error is scaled down with the term); the W_hi GEMMs
// accumulate in full FP32 unless -tfa 1.
//
// The split runs once per optimizer step (recipe_weights_changed), on the BF16 weights the BF16
// recipe's GEMMs would read, with the options -tb (per tensor, or per block of 32/64/128 along K),
// -tef (error feedback, default), -tsrr (stochastic W_lo instead of EF), -tpdds (EMA W_hi scale,
// predicted W_lo scale); tcfp12_validate enforces the exclusions TCFP-12 specifies.
//
// GEMMs. Per tensor (-tb 0, the default): cuBLASLt FP8 GEMMs with the power-of-two scales as the
// operands' scale factors; W^T codes for dgrad are transposed once per split (Hopper's FP8 GEMMs
// take both operands K-major). The two GEMMs of a product can also run as one GEMM over
// K-concatenated operands, [x | x] [W_hi | W_lo]^T with block scales (recipes/tcfp12/tcfp12_kernels.cuh), where the
// channels are a multiple of 128: with autotuning on (-ga 1, the default) the first call of each
// shape times both forms and keeps the faster (the decision is saved in checkpoints, as the GEMM
// algorithms are); -ga 0 keeps the two GEMMs. Per block (-tb 32/64/128): Hopper's FP8 GEMMs have one scale per
// operand (cuBLASLt's block-scaled modes are 1x128/128x128 FP32 scales, not 32/64 E8M0), so the
// block modes are emulated exactly: deq(W_hi), deq(W_lo) and the quantized x / dy are written as
// BF16 (exact: at most 4 significant bits each), and BF16 GEMMs form the same products (up to
// FP32 accumulation order). Correct numbers, BF16 speed or below: doc/recipes/tcfp12.md.
//
// Speculative fresh scales (training with FP8 codes, not on -lq steps; LLMC_TCFP12_SPECULATE=0 turns them
// off). A fresh scale needs the tensor's amax before any code is written: where the kernel that made the
// tensor did not record it (the attention output, the GELU output, the fc layer's output gradient; the
// LayerNorms and the flash attention backward record theirs), that costs a read of the tensor of its own.
// Instead, the quantize pass runs with the scale the
// same tensor had at its last use (the previous micro-step's) and records the amax as it goes; a one-thread
// kernel then sets the fresh scale from that amax and, only where it differs from the one used, raises a
// device flag under which the same pass runs again (fp8_quantize's run_only_if: its blocks return at once
// when the flag is down). The codes, the scale and the amax are those of the two-pass order in every case,
// bit for bit (build/test_tcfp12); the redone passes are counted in the telemetry (redo:). With an FP8
// wgrad, the fc layer's output gradient goes further: the fc projection's backward quantizes dL/d(GELU
// output) * gelu'(pre) straight to the fc layer's E5M2 codes (rows and transposed, with the amax and the
// bias gradient's column sums), as FP8-hybrid does, so the BF16 gradient is never written; and the
// LayerNorms in front of the qkv and fc layers write their E4M3 input under the speculative scale instead of
// their BF16 output, run again over the stored residual stream where it missed (tcfp12_input_again); and
// the LayerNorm backward writes the attention and fc projections' E5M2 dy instead of its BF16 output, made
// again from the FP32 residual gradient it stored where it missed (tcfp12_gradient_again).
//
// Which layers: the four linears of layers [-sqf, L - -sql) (default: all); embeddings, LM head,
// attention and norms stay BF16; master weights and AdamW stay FP32.
//
// State in the checkpoint: the options, the split counter, the EF buffers, the PDDS state and the
// current split itself (codes and scale codes), so that a resumed run uses exactly the W_hi / W_lo
// the uninterrupted run used (re-splitting the loaded weights would apply the EF buffer twice).
//
// Telemetry (-lq N): per quantized linear, the weight split (amax, the residual's amax, the scales,
// the fraction of zero W_lo codes, the relative split error ||EF'|| / ||W_eff||, saturation) and
// for x and dy the amax, scale, saturated and flushed-to-zero fractions.
#pragma once
// FP8 tensor-core GEMMs and the E4M3 / E5M2 conversions exist from sm_89 (Ada) on: a build for an older GPU stops
// here, not at run time
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "the tcfp12 recipe needs an sm_89 or newer GPU: build with GPU_ARCH=sm_89, sm_90a (the default) or newer"
#endif
#include <cmath>
#include <vector>
#include "llmc/recipe_api.h"
#include "options.h"
#include "tcfp12_kernels.cuh"
#include "llmc/gelu.cuh"
#include "llmc/profiler.h"

#define RECIPE_NAME "tcfp12"
using RecipeOptions = Tcfp12RecipeOptions; // its flags (options.h)
using RecipeBoundaries = IdentityBoundaries; // no boundaries outside the linears (boundaries.h)

#if defined(ENABLE_FP32)
#error "the tcfp12 recipe is a BF16 build (PRECISION=FP32 is the BF16 recipe's reference build)"
#endif

enum TcfpActRole { TCFP_X = 0, TCFP_DY = 1, NUM_TCFP_ACT_ROLES = 2 };
static const char* TCFP_ACT_NAMES[NUM_TCFP_ACT_ROLES] = {"x", "dy"};

struct Recipe {
    RecipeOptions options;
    LinearScratch scratch;
    bool use_ef = false;
    bool emulated = false;                  // block scales: BF16 GEMMs on the exact dequantized values
    int L = 0, C = 0, B = 0, T = 0;
    int num_linears = 0;
    // per quantized linear: offsets of its elements and of its scale groups
    std::vector<size_t> elem_offset, group_offset;
    size_t total_elems = 0, total_groups = 0;
    uint8_t *hi = nullptr, *lo = nullptr;         // the split: codes (OC x C), per linear at elem_offset
    uint8_t *hi_scale = nullptr, *lo_scale = nullptr; // scale codes, per linear at group_offset
    uint8_t *hi_t = nullptr, *lo_t = nullptr;     // per tensor: the codes transposed (C x OC), for dgrad
                                                  // (lo_t not under ABD, whose dgrad reads W_hi alone)
    floatX *hi_bf = nullptr, *lo_bf = nullptr;    // per block: deq(W_hi), deq(W_lo) as BF16
    float* ef = nullptr;                          // EF buffers (with error feedback; only this process's pieces
                                                  // under ZeRO-1, tcfp12_split_pieces)
    // ZeRO-1 over several processes, with error feedback: this process's place among the owners of the
    // EF buffer and their number (1: the whole buffer here), and the statistics they exchange
    int owner = 0, owners = 1;
    uint32_t* exchange_maxima = nullptr;          // 2 per linear (tcfp12_stats_pack_kernel)
    double* exchange_sums = nullptr;              // 6 per linear
    float* pdds = nullptr;                        // PDDS state, one float per group (with PDDS)
    float* weight_slots = nullptr;                // per linear: W_hi and W_lo scale slots
    Tcfp12SplitStats* split_stats = nullptr;      // per linear
    // activations and gradients: per linear and role a scale slot, an amax and telemetry counts;
    // one more slot pair for evaluation (which must leave the state untouched)
    float* act_slots = nullptr;
    uint32_t* act_amax = nullptr;
    unsigned long long* act_stats = nullptr;      // per linear and role: values, saturated, flushed
    uint8_t *x8 = nullptr, *dy8 = nullptr, *dyt8 = nullptr; // FP8 scratch
    // -tfw 1 (per tensor): x^T of every quantized linear, written by the training forward pass with the
    // forward's scale (the codes the wgrad GEMM reads), so that the backward reads no BF16 x: (K x N) per
    // linear at saved_xt_offset
    uint8_t* saved_xt = nullptr;
    std::vector<size_t> saved_xt_offset;
    floatX *xq = nullptr, *dyq = nullptr;         // emulated: the quantized values as BF16
    // the K-concatenated form (per tensor, channels % 128 == 0): [W_hi | W_lo] (OC x 2C) per linear at
    // 2 * elem_offset, [W_hi^T | W_lo^T] (C x 2 OC; without ABD), their 1 x 128 block scales (elem / 64
    // floats per linear, at elem_offset / 64), and the activations' codes twice with their block scales
    bool concat = false;
    int concat_mode = -1; // -1: autotuning decides; 0: two GEMMs; 1: concatenated (LLMC_TCFP12_CONCAT=0/1)
    uint8_t *wcat = nullptr, *wcat_t = nullptr, *xcat = nullptr, *dycat = nullptr;
    float *wcat_scales = nullptr, *wcat_t_scales = nullptr, *xcat_scales = nullptr, *dycat_scales = nullptr;
    // the fc projection's backward applied the GELU derivative to the fc layer's dy and took its column
    // partial sums (scratch.bias_partials) and amax in the same pass: the fc layer's call takes them
    LinearId dy_sums_given{-1, LIN_QKV};
    // the linear whose input's amax the LayerNorm before it recorded (tcfp12_input_target), and the
    // one whose output gradient's amax the LayerNorm backward recorded (tcfp12_gradient_target): their
    // next call takes the amax instead of reading the tensor for it
    LinearId x_amax_given{-1, LIN_QKV}, dy_amax_given{-1, LIN_QKV};
    // The fc layer's GELU output left unwritten (recipe_api.h) where only the fc projection's forward reads
    // it: with -tfw 1 in training (the backward's FP8 wgrad takes the x^T codes saved by that forward)
    // and in evaluation. The fc GEMMs write the pre-activation with the bias only (no GELU_AUX_BIAS
    // epilogue and its second N x 4C output); the fc projection takes the amax of gelu(pre) and
    // quantizes gelu(pre). Any other recipe call writes the GELU output first (tcfp12_write_gelu_out).
    PendingGeluOut pending_gelu_out;
    // speculative fresh scales (the top of the file): the flag of the conditional second pass, and per
    // linear and role the speculative passes and how many of them ran again, since the last -lq line
    bool speculate = true;                        // LLMC_TCFP12_SPECULATE=0: an amax pass before every quantization
    int* redo_flag = nullptr;
    unsigned long long* spec_counts = nullptr;
    float* spec_ratio = nullptr;                  // per linear and role: tcfp12_predict_scale's ratio
    float* dy_partials = nullptr;                 // ceil(N / 64) x 4C: dy's column sums per 64-row tile
    // the fc layer's dy as E5M2 codes (r.dy8, r.dyt8), its scale, amax and column sums (dy_partials), made by
    // the fc projection's backward: the fc layer's call takes them
    LinearId dy_codes_given{-1, LIN_QKV};
    // ... or the attention or fc projection's dy as row-major E5M2 codes (r.dy8), written by the LayerNorm
    // backward under a speculative scale (tcfp12_gradient_target), checked and redone if need be by
    // tcfp12_gradient_again (dy_codes_checked); the projection's call transposes them for its wgrad
    // (dy_codes_reference: the projection whose dy the scale was guessed from, tcfp12_projection_dy_reference;
    // layer -1: not guessed, the scale of the last use)
    bool dy_codes_rows_only = false, dy_codes_checked = true;
    LinearId dy_codes_reference{-1, LIN_QKV};
    // the qkv or fc layer's input as E4M3 codes (r.x8) written by the LayerNorm before it under a speculative
    // scale (tcfp12_input_target), checked and redone if need be by tcfp12_input_again (x_codes_checked)
    LinearId x_codes_given{-1, LIN_QKV};
    bool x_codes_checked = false;
    long long splits = 0;                         // splits so far (the SRR streams' counter)
    uint64_t srr_seed = 0;
    bool skip_next_split = false;                 // the checkpoint restored the split
    bool gelu_epilogue = true;
    bool count_stats = false;
};

inline int tcfp_linear_index(LinearId id) { return id.layer * NUM_LINEAR_KINDS + id.kind; }
inline float* tcfp_hi_slot(const Recipe& r, int li) { return r.weight_slots + (size_t)(2 * li) * TCFP_SCALE_SLOT; }
inline float* tcfp_lo_slot(const Recipe& r, int li) { return r.weight_slots + (size_t)(2 * li + 1) * TCFP_SCALE_SLOT; }
// slot index num_linears * 2 + role is evaluation's
inline float* tcfp_act_slot(const Recipe& r, int li, TcfpActRole role, bool training) {
    const size_t i = training ? (size_t)li * NUM_TCFP_ACT_ROLES + role : (size_t)r.num_linears * NUM_TCFP_ACT_ROLES + role;
    return r.act_slots + i * TCFP_SCALE_SLOT;
}
inline uint32_t* tcfp_act_amax(const Recipe& r, int li, TcfpActRole role, bool training) {
    return r.act_amax + (training ? (size_t)li * NUM_TCFP_ACT_ROLES + role : (size_t)r.num_linears * NUM_TCFP_ACT_ROLES + role);
}
inline unsigned long long* tcfp_spec_counts(const Recipe& r, int li, TcfpActRole role) {
    return r.spec_counts + ((size_t)li * NUM_TCFP_ACT_ROLES + role) * 2;
}
inline float* tcfp_spec_ratio(const Recipe& r, int li, TcfpActRole role) {
    return r.spec_ratio + (size_t)li * NUM_TCFP_ACT_ROLES + role;
}
inline Fp8Stats tcfp_act_stats(const Recipe& r, int li, TcfpActRole role) {
    Fp8Stats s;
    if (r.count_stats) s.counts = r.act_stats + ((size_t)li * NUM_TCFP_ACT_ROLES + role) * 3;
    return s;
}

// Whether a quantization of this call may run speculatively (the top of the file): training (evaluation
// shares one scale slot among all linears, so the last use predicts nothing), FP8 codes (the emulated
// block modes write BF16 values), and not on a telemetry step (the redone pass would count twice)
inline bool tcfp12_speculates(const Recipe& r, bool training) {
    return training && r.speculate && !r.emulated && !r.count_stats;
}

// FP8 GEMMs need 16-byte leading dimensions, the blocks whole rows of groups
inline bool tcfp12_applies(const Recipe& r, LinearId id, int N, int C, int OC) {
    if (!layer_is_quantized(r.options, id.layer, r.L)) return false;
    return N % 16 == 0 && C % 16 == 0 && OC % 16 == 0; // (recipe_init refuses a -tb that does not divide C)
}

// The EF buffer's elements in this process: every quantized weight's, or its piece of each under ZeRO-1
// (at least one, so that a model with no quantized layer still allocates something)
inline size_t tcfp12_ef_elements(const Recipe& r) { return std::max<size_t>(r.total_elems / (size_t)r.owners, 1); }

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int B, int T,
                        const RecipeContext& ctx = RecipeContext()) {
    r.options = o;
    resolve_skip_defaults(r.options, 0, 0);
    const std::string err = llmc::tcfp12_validate(r.options.split);
    if (!err.empty()) input_error("%s", err.c_str());
    if (r.options.split.block_size != 0 && shape.channels % r.options.split.block_size != 0)
        input_error("-tb %d: the model's channels (%d) are not a multiple of the block size; use -tb 0 or a block "
                    "size that divides %d", r.options.split.block_size, shape.channels, shape.channels);
    r.use_ef = llmc::tcfp12_uses_ef(r.options.split);
    r.emulated = r.options.split.block_size != 0;
    r.L = shape.num_layers; r.C = shape.channels; r.B = B; r.T = T;
    r.num_linears = r.L * NUM_LINEAR_KINDS;
    linear_scratch_init(r.scratch, r.C);
    const int nl = r.num_linears;
    r.elem_offset.assign(nl, 0);
    r.group_offset.assign(nl, 0);
    r.total_elems = r.total_groups = 0;
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            const size_t n = (size_t)linear_in_features((LinearKind)k, r.C) * linear_out_features((LinearKind)k, r.C);
            r.elem_offset[l * NUM_LINEAR_KINDS + k] = r.total_elems;
            r.group_offset[l * NUM_LINEAR_KINDS + k] = r.total_groups;
            r.total_elems += n;
            r.total_groups += r.options.split.block_size ? n / r.options.split.block_size : 1;
        }
    }
    const size_t ne = std::max<size_t>(r.total_elems, 1), ng = std::max<size_t>(r.total_groups, 1);
    r.hi = (uint8_t*)cuda_malloc_or_die(ne, "tcfp12 W_hi");
    r.lo = (uint8_t*)cuda_malloc_or_die(ne, "tcfp12 W_lo");
    r.hi_scale = (uint8_t*)cuda_malloc_or_die(ng, "tcfp12 scales");
    r.lo_scale = (uint8_t*)cuda_malloc_or_die(ng, "tcfp12 scales");
    if (r.emulated) {
        r.hi_bf = (floatX*)cuda_malloc_or_die(ne * sizeof(floatX), "tcfp12 deq(W_hi)");
        r.lo_bf = (floatX*)cuda_malloc_or_die(ne * sizeof(floatX), "tcfp12 deq(W_lo)");
    } else {
        r.hi_t = (uint8_t*)cuda_malloc_or_die(ne, "tcfp12 W_hi^T");
        // ABD's dgrad reads W_hi^T alone (and there is no [W_hi^T | W_lo^T] to build): no W_lo^T, one byte
        // per weight less (1.37 GiB at d48) and one transpose per weight and split less
        if (!r.options.split.abd) r.lo_t = (uint8_t*)cuda_malloc_or_die(ne, "tcfp12 W_lo^T");
    }
    // ZeRO-1 (-z 1 over several processes): the EF buffer is cut like the AdamW state, into one piece per
    // process (tcfp12_split_pieces). Without processes to exchange the pieces (the one-GPU tests of
    // test_gpt.cu that play two owners in turn) each owner keeps the whole buffer.
    r.owner = 0;
    r.owners = 1;
    if (r.use_ef && ctx.state_owners > 1 && g_cross_process.shares_pieces()) {
        r.owner = ctx.state_owner;
        r.owners = ctx.state_owners;
        if (r.owner < 0 || r.owner >= r.owners) input_error("internal: tcfp12: EF owner %d of %d", r.owner, r.owners);
        // (every weight is a multiple of C elements, and zero.h already refused a process count that does not divide C)
        r.exchange_maxima = (uint32_t*)cuda_malloc_or_die((size_t)2 * nl * sizeof(uint32_t), "tcfp12 scratch");
        r.exchange_sums = (double*)cuda_malloc_or_die((size_t)6 * nl * sizeof(double), "tcfp12 scratch");
    }
    if (r.use_ef) {
        const size_t nef = tcfp12_ef_elements(r);
        r.ef = (float*)cuda_malloc_or_die(nef * sizeof(float), "tcfp12 error-feedback buffer");
        cudaCheck(cudaMemset(r.ef, 0, nef * sizeof(float)));
    }
    if (r.options.split.pdds) {
        r.pdds = (float*)cuda_malloc_or_die(ng * sizeof(float), "tcfp12 PDDS state");
        cudaCheck(cudaMemset(r.pdds, 0, ng * sizeof(float))); // 0 = no history yet
    }
    r.weight_slots = (float*)cuda_malloc_or_die((size_t)2 * nl * TCFP_SCALE_SLOT * sizeof(float), "tcfp12 scales");
    cudaCheck(cudaMemset(r.weight_slots, 0, (size_t)2 * nl * TCFP_SCALE_SLOT * sizeof(float)));
    r.split_stats = (Tcfp12SplitStats*)cuda_malloc_or_die((size_t)nl * sizeof(Tcfp12SplitStats), "tcfp12 telemetry");
    cudaCheck(cudaMemset(r.split_stats, 0, (size_t)nl * sizeof(Tcfp12SplitStats)));
    const size_t act = (size_t)(nl + 1) * NUM_TCFP_ACT_ROLES;
    r.act_slots = (float*)cuda_malloc_or_die(act * TCFP_SCALE_SLOT * sizeof(float), "tcfp12 scales");
    r.act_amax = (uint32_t*)cuda_malloc_or_die(act * sizeof(uint32_t), "tcfp12 amax");
    r.act_stats = (unsigned long long*)cuda_malloc_or_die(act * 3 * sizeof(unsigned long long), "tcfp12 telemetry");
    cudaCheck(cudaMemset(r.act_slots, 0, act * TCFP_SCALE_SLOT * sizeof(float)));
    cudaCheck(cudaMemset(r.act_amax, 0, act * sizeof(uint32_t)));
    cudaCheck(cudaMemset(r.act_stats, 0, act * 3 * sizeof(unsigned long long)));
    const size_t widest = (size_t)B * T * 4 * r.C;
    if (r.emulated) {
        r.xq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "tcfp12 activations");
        r.dyq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "tcfp12 gradients");
    } else {
        r.x8 = (uint8_t*)cuda_malloc_or_die(widest, "tcfp12 activations");
        r.dy8 = (uint8_t*)cuda_malloc_or_die(widest, "tcfp12 gradients");
        if (o.tcfp_fp8_wgrad) {
            r.dyt8 = (uint8_t*)cuda_malloc_or_die(widest, "tcfp12 gradients");
            const size_t saved = quantized_linears_layout(r.options, r.L, r.C, r.saved_xt_offset,
                                                          [&](int K, int) { return (size_t)B * T * K; });
            if (saved) r.saved_xt = (uint8_t*)cuda_malloc_or_die(saved, "tcfp12 activations (x^T for backward)");
        }
    }
    r.redo_flag = (int*)cuda_malloc_or_die(sizeof(int), "tcfp12 flag");
    r.spec_counts = (unsigned long long*)cuda_malloc_or_die((size_t)nl * NUM_TCFP_ACT_ROLES * 2 * sizeof(unsigned long long),
                                                            "tcfp12 telemetry");
    cudaCheck(cudaMemset(r.spec_counts, 0, (size_t)nl * NUM_TCFP_ACT_ROLES * 2 * sizeof(unsigned long long)));
    r.spec_ratio = (float*)cuda_malloc_or_die((size_t)nl * NUM_TCFP_ACT_ROLES * sizeof(float), "tcfp12 scales");
    cudaCheck(cudaMemset(r.spec_ratio, 0, (size_t)nl * NUM_TCFP_ACT_ROLES * sizeof(float)));
    if (const char* e = getenv("LLMC_TCFP12_SPECULATE")) {
        if (strcmp(e, "0") && strcmp(e, "1")) input_error("LLMC_TCFP12_SPECULATE must be 0 (an amax pass before every quantization) or 1 (speculative fresh scales), got '%s'", e);
        r.speculate = atoi(e) != 0;
    }
    if (!r.emulated) {
        r.dy_partials = (float*)cuda_malloc_or_die((size_t)ceil_div((long long)B * T, FP8_TILE) * 4 * r.C * sizeof(float),
                                                   "tcfp12 bias gradient partial sums");
    }
    r.concat = !r.emulated && r.C % 128 == 0 && r.total_elems > 0;
    if (const char* e = getenv("LLMC_TCFP12_CONCAT")) {
        if (strcmp(e, "0") && strcmp(e, "1")) input_error("LLMC_TCFP12_CONCAT must be 0 (two GEMMs) or 1 (one K-concatenated GEMM), got '%s'", e);
        r.concat_mode = atoi(e);
    }
    if (r.concat) {
        r.wcat = (uint8_t*)cuda_malloc_or_die(2 * ne, "tcfp12 [W_hi | W_lo]");
        r.wcat_scales = (float*)cuda_malloc_or_die(ne / 64 * sizeof(float), "tcfp12 block scales");
        if (!r.options.split.abd) {
            r.wcat_t = (uint8_t*)cuda_malloc_or_die(2 * ne, "tcfp12 [W_hi^T | W_lo^T]");
            r.wcat_t_scales = (float*)cuda_malloc_or_die(ne / 64 * sizeof(float), "tcfp12 block scales");
        }
        r.xcat = (uint8_t*)cuda_malloc_or_die(2 * widest, "tcfp12 activations");
        r.dycat = (uint8_t*)cuda_malloc_or_die(2 * widest, "tcfp12 gradients");
        const size_t act_scales = (size_t)tcfp12_concat_act_scale_count(B * T, 2 * 4 * r.C);
        r.xcat_scales = (float*)cuda_malloc_or_die(act_scales * sizeof(float), "tcfp12 block scales");
        r.dycat_scales = (float*)cuda_malloc_or_die(act_scales * sizeof(float), "tcfp12 block scales");
    }
    r.srr_seed = ctx.seed ^ 0x5443465031325352ULL;
    r.splits = 0;
}

inline std::string recipe_describe(const Recipe& r) {
    const RecipeOptions& o = r.options;
    const int q0 = o.skip_first, q1 = r.L - o.skip_last;
    std::string layers = q1 > q0 ? strfmt("layers %d-%d in TCFP-12", q0, q1 - 1) : std::string("no layer in TCFP-12");
    return strfmt("tcfp12: %s; W_hi + W_lo E4M3 (%s), x E4M3 / dy E5M2 fresh power-of-two scales%s, %s wgrad; %s, "
                  "-sqf %d -sql %d", llmc::tcfp12_describe(r.options.split).c_str(),
                  r.emulated ? "block scales emulated exactly on BF16 tensor cores"
                             : strfmt("%s%s", o.tcfp_fast_accum ? "two FP8 GEMMs, fast accumulation" : "two FP8 GEMMs",
                                      !r.concat ? "" : r.concat_mode == 0 ? " (LLMC_TCFP12_CONCAT=0)"
                                                     : r.concat_mode == 1 ? ", one K-concatenated where cuBLASLt has it (LLMC_TCFP12_CONCAT=1)"
                                                                          : " or one K-concatenated, the faster per shape").c_str(),
                  r.emulated ? "" : r.speculate ? " (speculative)" : " (LLMC_TCFP12_SPECULATE=0)",
                  o.tcfp_fp8_wgrad ? "FP8" : "BF16", layers.c_str(), o.skip_first, o.skip_last) +
           (r.owners > 1 ? strfmt("; the EF buffer in %d pieces, one per process (ZeRO-1)", r.owners) : std::string());
}

// The split's seed for SRR: the run's seed, the split counter and the linear, mixed
inline uint32_t tcfp12_split_seed(const Recipe& r, int li) {
    uint64_t z = r.srr_seed + 0x9E3779B97F4A7C15ULL * (uint64_t)(r.splits * 1024 + li + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

// What the GEMMs read, derived from the split: the scale factors and transposes (per tensor) or
// the BF16 dequantized halves (per block)
inline void tcfp12_derive(Recipe& r, int li, int OC, int C, cudaStream_t st) {
    uint8_t* hi = r.hi + r.elem_offset[li];
    uint8_t* lo = r.lo + r.elem_offset[li];
    const uint8_t* hs = r.hi_scale + r.group_offset[li];
    const uint8_t* ls = r.lo_scale + r.group_offset[li];
    if (r.emulated) {
        tcfp12_dequantize_blocks(r.hi_bf + r.elem_offset[li], r.lo_bf + r.elem_offset[li], hi, lo, hs, ls, (long long)OC * C,
                                 r.options.split.block_size, st);
    } else {
        tcfp12_tensor_factors_kernel<<<1, 1, 0, st>>>(tcfp_hi_slot(r, li), tcfp_lo_slot(r, li), hs, ls);
        cudaCheckLaunch();
        tcfp12_transpose_codes(r.hi_t + r.elem_offset[li], hi, OC, C, st);
        if (r.lo_t) tcfp12_transpose_codes(r.lo_t + r.elem_offset[li], lo, OC, C, st);
        if (r.concat) {
            const size_t off = r.elem_offset[li];
            tcfp12_concat_codes(r.wcat + 2 * off, hi, lo, OC, C, st);
            tcfp12_concat_weight_scales(r.wcat_scales + off / 64, tcfp_hi_slot(r, li), tcfp_lo_slot(r, li), OC, C, st);
            if (r.wcat_t) {
                tcfp12_concat_codes(r.wcat_t + 2 * off, r.hi_t + off, r.lo_t + off, C, OC, st);
                tcfp12_concat_weight_scales(r.wcat_t_scales + off / 64, tcfp_hi_slot(r, li), tcfp_lo_slot(r, li), C, OC, st);
            }
        }
    }
}

// The processes of a sharded split combine their statistics: the maxima (sums = false) or the sums
inline void tcfp12_exchange_stats(Recipe& r, bool sums, cudaStream_t st) {
    const int nl = r.num_linears;
    uint32_t* maxima = sums ? nullptr : r.exchange_maxima;
    double* s = sums ? r.exchange_sums : nullptr;
    tcfp12_stats_pack_kernel<<<ceil_div(nl, 128), 128, 0, st>>>(r.split_stats, nl, maxima, s, false);
    cudaCheckLaunch();
    if (sums) g_cross_process.all_reduce_sum_f64(g_cross_process.ctx, s, (size_t)6 * nl, st);
    else g_cross_process.all_reduce_max_u32(g_cross_process.ctx, maxima, (size_t)2 * nl, st);
    tcfp12_stats_pack_kernel<<<ceil_div(nl, 128), 128, 0, st>>>(r.split_stats, nl, maxima, s, true);
    cudaCheckLaunch();
}

// ZeRO-1 over P processes (r.owners > 1): process p owns the piece [p n/P, (p+1) n/P) of each weight's n
// elements (OC/P whole rows of the OC x C matrix), the piece zero.h gives it of the master weights, and
// keeps only that piece of the EF buffer (at elem_offset / P). It splits its pieces only; in between,
// the processes combine what the scales of a whole tensor depend on, so that every piece gets the codes
// that the split of the whole tensor gives it, bit for bit:
//   per tensor: the amax of W + EF (after phase 0) and of the residual (after phase 1) are maxima
//     over the processes, then the W_lo pass, then the counts (the zero-residual sentinel reads
//     lo_nonzero) are sums; then the scale codes;
//   per block (-tb): blocks run along a row, so each lies inside one piece and needs nothing from the
//     others (the PDDS state of a block lives with its owner); the maxima and sums are combined only
//     for the telemetry, which then describes the whole tensor as without ZeRO-1.
// Then one all-gather gives every process all the codes (and per block the scale codes): 2 bytes per
// weight, against the 4 x (P - 1) / P of the EF buffer it saves.
inline void tcfp12_split_pieces(Recipe& r, const LinearWeights& w, cudaStream_t st) {
    const size_t P = (size_t)r.owners, me = (size_t)r.owner;
    const int B = r.options.split.block_size;
    std::vector<uint8_t*> bufs;
    std::vector<size_t> piece_bytes;
    for (int phase = 0; phase < (B ? 1 : 4); phase++) {
        for (int l = 0; l < r.L; l++) {
            if (!layer_is_quantized(r.options, l, r.L)) continue;
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                const int li = l * NUM_LINEAR_KINDS + k;
                const int C = linear_in_features((LinearKind)k, r.C), OC = linear_out_features((LinearKind)k, r.C);
                const size_t piece = (size_t)OC * C / P, p0 = me * piece, e0 = r.elem_offset[li];
                const floatX* wp = w.weight[k] + (size_t)l * OC * C + p0;
                float* ef = r.ef + e0 / P;
                uint8_t *hi = r.hi + e0 + p0, *lo = r.lo + e0 + p0;
                if (B) {
                    const size_t g0 = r.group_offset[li] + p0 / B;
                    tcfp12_split(wp, (int)((size_t)OC / P), C, r.options.split, ef, r.options.split.pdds ? r.pdds + g0 : nullptr,
                                 tcfp12_split_seed(r, li), hi, lo, r.hi_scale + g0, r.lo_scale + g0, r.split_stats + li, st);
                } else {
                    const size_t g0 = r.group_offset[li];
                    tcfp12_split_tensor_phase(phase, wp, (long long)piece, r.options.split, ef, r.options.split.pdds ? r.pdds + g0 : nullptr,
                                              tcfp12_split_seed(r, li), hi, lo, r.hi_scale + g0, r.lo_scale + g0,
                                              r.split_stats + li, st);
                }
                if (phase == 0) { // what the all-gather fills in: this linear's codes (and per block its scale codes)
                    bufs.push_back(r.hi + e0); piece_bytes.push_back(piece);
                    bufs.push_back(r.lo + e0); piece_bytes.push_back(piece);
                    if (B) {
                        bufs.push_back(r.hi_scale + r.group_offset[li]); piece_bytes.push_back(piece / B);
                        bufs.push_back(r.lo_scale + r.group_offset[li]); piece_bytes.push_back(piece / B);
                    }
                }
            }
        }
        if (B) { tcfp12_exchange_stats(r, false, st); tcfp12_exchange_stats(r, true, st); }
        else if (phase <= 1) tcfp12_exchange_stats(r, false, st);
        else if (phase == 2) tcfp12_exchange_stats(r, true, st);
    }
    g_cross_process.all_gather_pieces(g_cross_process.ctx, bufs.data(), piece_bytes.data(), (int)bufs.size(), st);
}

inline void recipe_weights_changed(Recipe& r, const LinearWeights& w, cudaStream_t st) {
    const bool split = !r.skip_next_split;
    r.skip_next_split = false;
    if (split && r.owners > 1) tcfp12_split_pieces(r, w, st);
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            const int li = l * NUM_LINEAR_KINDS + k;
            const int C = linear_in_features((LinearKind)k, r.C), OC = linear_out_features((LinearKind)k, r.C);
            if (split && r.owners == 1) {
                tcfp12_split(w.weight[k] + (size_t)l * OC * C, OC, C, r.options.split, r.use_ef ? r.ef + r.elem_offset[li] : nullptr,
                             r.options.split.pdds ? r.pdds + r.group_offset[li] : nullptr, tcfp12_split_seed(r, li),
                             r.hi + r.elem_offset[li], r.lo + r.elem_offset[li], r.hi_scale + r.group_offset[li],
                             r.lo_scale + r.group_offset[li], r.split_stats + li, st);
            }
            tcfp12_derive(r, li, OC, C, st);
        }
    }
    if (split) r.splits += 1;
}

// (recipe_step_end, recipe_begin_micro_step, recipe_cross_process_max: the defaults.) TCFP-12 keeps no
// per-step scale state: the weights' scales come with each split, the others fresh. The split of the
// weights (and its SRR bits, seeded by the split counter) is the same in every process of a data-parallel
// run, as the weights are; x and dy are scaled from their own amax (current scaling): nothing to combine,
// nothing seeded by the data

// The BF16 input is read in backward by the BF16 weight gradient (and by the emulated block modes);
// an FP8 weight gradient reads the x^T codes its forward saved
inline bool tcfp12_saves_xt(const Recipe& r, LinearId id, int N) {
    return r.saved_xt != nullptr && !r.emulated &&
           tcfp12_applies(r, id, N, linear_in_features(id.kind, r.C), linear_out_features(id.kind, r.C));
}
inline bool recipe_needs_input_in_backward(const Recipe& r, LinearId id, int N) { return !tcfp12_saves_xt(r, id, N); }
inline uint8_t* tcfp12_saved_xt(const Recipe& r, int li) { return r.saved_xt + r.saved_xt_offset[li]; }

// Whether a kernel recorded linear id's amax in the slot (Recipe::x_amax_given, ::dy_amax_given)
inline bool tcfp12_take_given(LinearId& slot, LinearId id, const char* what) { return take_given_for(slot, id, "tcfp12", what); }

// The LayerNorm in front of the qkv and fc layers records the amax of the output it writes (recipe_api.h: a
// target with no rows), so that x's fresh scale needs no pass over x of its own (d12, B=64: one read of
// 2 x N x C BF16 values per layer and micro-step, ~19 GB per step). The same scale, bit for bit: the
// amax of the same stored BF16 values.
//
// With speculative scales (tcfp12_speculates) and an FP8 wgrad (nothing reads the BF16 x after the forward
// GEMMs: the backward takes the saved x^T codes), the LayerNorm writes x's E4M3 codes instead, under the scale
// x had at its last use, and its amax; tcfp12_input_again, right after it, checks that scale and has the
// LayerNorm run again where it was not the fresh one. Per value the LayerNorm then writes 1 byte instead of 2,
// and the linear transposes codes (1 + 1 bytes) instead of quantizing x (2 + 1 + 1).
inline bool tcfp12_input_as_codes(const Recipe& r, LinearId id, int N, bool training) {
    return tcfp12_speculates(r, training) && tcfp12_saves_xt(r, id, N);
}
inline Fp8Target tcfp12_input_target(Recipe& r, LinearId id, int N, int C, bool training, cudaStream_t st) {
    Fp8Target t;
    if (!tcfp12_applies(r, id, N, C, linear_out_features(id.kind, r.C))) return t;
    const int li = tcfp_linear_index(id);
    t.amax = tcfp_act_amax(r, li, TCFP_X, training);
    cudaCheck(cudaMemsetAsync(t.amax, 0, sizeof(uint32_t), st));
    if (tcfp12_input_as_codes(r, id, N, training)) {
        t.rows = r.x8;
        t.scale = tcfp_act_slot(r, li, TCFP_X, true); // ([0]: 1/s, the factor the codes are made with)
        r.x_codes_given = id;
        r.x_codes_checked = false;
    } else {
        r.x_amax_given = id;
    }
    return t;
}

// After that LayerNorm: the fresh scale from the amax it recorded, and the LayerNorm again (under the flag,
// with the fresh scale) where the guess differed
inline Fp8Target tcfp12_input_again(Recipe& r, LinearId id, cudaStream_t st) {
    Fp8Target t;
    if (r.x_codes_given.layer != id.layer || r.x_codes_given.kind != id.kind || r.x_codes_checked) return t;
    const int li = tcfp_linear_index(id);
    float* slot = tcfp_act_slot(r, li, TCFP_X, true);
    tcfp12_check_scale(slot, tcfp_act_amax(r, li, TCFP_X, true), false, r.redo_flag, tcfp_spec_counts(r, li, TCFP_X), st);
    r.x_codes_checked = true;
    t.rows = r.x8;
    t.scale = slot;
    t.run_only_if = r.redo_flag;
    return t;
}

// Whether the LayerNorm backward writes the attention or fc projection's dy as E5M2 codes (rows_only, below)
// under a speculative scale: as tcfp12_fc_dy_as_codes, since the projection's wgrad must read codes (an FP8
// wgrad) and its dgrad the rows (ABD, or no K-concatenated form)
inline bool tcfp12_projection_dy_as_codes(const Recipe& r, LinearId id, int N) {
    return (id.kind == LIN_ATTPROJ || id.kind == LIN_FCPROJ) && tcfp12_speculates(r, true) && r.options.tcfp_fp8_wgrad &&
           (r.options.split.abd || !r.concat) && tcfp12_applies(r, id, N, linear_in_features(id.kind, r.C), r.C);
}

// The reference of that guess (tcfp12_gradient_target, below): the projection whose dy the LayerNorm
// backward handed over just before, in the same micro-step, where there is one in TCFP-12
inline bool tcfp12_projection_dy_reference(const Recipe& r, LinearId id, int N, LinearId& ref) {
    ref = id.kind == LIN_ATTPROJ ? LinearId{id.layer, LIN_FCPROJ} : LinearId{id.layer + 1, LIN_ATTPROJ};
    return ref.layer < r.L && tcfp12_applies(r, ref, N, linear_in_features(ref.kind, r.C), r.C);
}

// The same for the attention and fc projections' output gradient, which the LayerNorm backward writes
// (rows_only), and for the qkv layer's, which the flash attention backward writes (its amax from the dq, dk,
// dv tiles it stages: Fp8Target::amax_only).
//
// The LayerNorm backward records the amax of the BF16 dy it writes. Where tcfp12_projection_dy_as_codes, it
// writes dy's E5M2 codes instead, under a guessed scale, and the amax; tcfp12_gradient_again, right after
// it, checks that scale and has the codes made again from the FP32 residual gradient the kernel stored, where
// the guess missed (layernorm_backward_codes_again). Per value: 1 byte written by the LayerNorm and 1 + 1 by
// the transpose, against 2 (BF16 dy) + 2 + 1 + 1 for the quantize pass. The guess: the projection's dy is the
// residual stream's gradient at the block's output, one branch further down from the last one the LayerNorm
// backward handed over (the fc projection's of the same layer, for the attention projection; the attention
// projection's of the layer above, for an fc projection), so its amax is that one's times the ratio of the two
// at the last check (tcfp12_predict_scale); the last fc projection (after the final LayerNorm) keeps its last
// use's scale.
inline Fp8Target tcfp12_gradient_target(Recipe& r, LinearId id, int N, int OC, bool rows_only, cudaStream_t st) {
    Fp8Target t;
    if (!tcfp12_applies(r, id, N, linear_in_features(id.kind, r.C), OC)) return t;
    const int li = tcfp_linear_index(id);
    t.amax = tcfp_act_amax(r, li, TCFP_DY, true);
    cudaCheck(cudaMemsetAsync(t.amax, 0, sizeof(uint32_t), st));
    if (rows_only && tcfp12_projection_dy_as_codes(r, id, N)) {
        LinearId ref;
        float* slot = tcfp_act_slot(r, li, TCFP_DY, true);
        r.dy_codes_reference = tcfp12_projection_dy_reference(r, id, N, ref) ? ref : LinearId{-1, LIN_QKV};
        if (r.dy_codes_reference.layer >= 0)
            tcfp12_predict_scale(slot, tcfp_spec_ratio(r, li, TCFP_DY), tcfp_act_amax(r, tcfp_linear_index(ref), TCFP_DY, true),
                                 true, st);
        t.rows = r.dy8;
        t.scale = slot; // ([0]: 1/s, the factor the codes are made with)
        r.dy_codes_given = id;
        r.dy_codes_rows_only = true;
        r.dy_codes_checked = false;
        return t;
    }
    r.dy_amax_given = id;
    return t;
}

// After that LayerNorm backward: the fresh scale from the amax it recorded (and the guess's ratio), and the codes
// again (under the flag, with the fresh scale) where the guess differed
inline Fp8Target tcfp12_gradient_again(Recipe& r, LinearId id, cudaStream_t st) {
    Fp8Target t;
    if (!same_linear(r.dy_codes_given, id) || !r.dy_codes_rows_only ||
        r.dy_codes_checked)
        return t;
    const int li = tcfp_linear_index(id);
    const LinearId ref = r.dy_codes_reference;
    const bool guessed = ref.layer >= 0;
    float* slot = tcfp_act_slot(r, li, TCFP_DY, true);
    tcfp12_check_scale(slot, tcfp_act_amax(r, li, TCFP_DY, true), true, r.redo_flag, tcfp_spec_counts(r, li, TCFP_DY), st,
                       guessed ? tcfp_spec_ratio(r, li, TCFP_DY) : nullptr,
                       guessed ? tcfp_act_amax(r, tcfp_linear_index(ref), TCFP_DY, true) : nullptr);
    r.dy_codes_checked = true;
    t.rows = r.dy8;
    t.scale = slot;
    t.run_only_if = r.redo_flag;
    return t;
}

// The sites of recipe_api.h: the LayerNorm output as the next linear's input, the LayerNorm backward's
// output and the attention backward's dqkv as output gradients (above); the attention output is not taken
inline Fp8Target recipe_site_output(Recipe& r, RecipeSite site, LinearId id, int rows, int cols, bool training, cudaStream_t st) {
    switch (site) {
    case SITE_LAYERNORM_OUTPUT: return tcfp12_input_target(r, id, rows, cols, training, st);
    case SITE_LAYERNORM_BACKWARD_OUTPUT: return tcfp12_gradient_target(r, id, rows, cols, true, st);
    case SITE_ATTENTION_BACKWARD_DQKV: return tcfp12_gradient_target(r, id, rows, cols, false, st);
    default: return Fp8Target();
    }
}
inline Fp8Target recipe_site_again(Recipe& r, RecipeSite site, LinearId id, cudaStream_t st) {
    switch (site) {
    case SITE_LAYERNORM_OUTPUT: return tcfp12_input_again(r, id, st);
    case SITE_LAYERNORM_BACKWARD_OUTPUT: return tcfp12_gradient_again(r, id, st);
    default: return Fp8Target();
    }
}

// Runs quantize(amax_out, run_only_if), the quantization of one tensor with the scale in slot: once when
// the scale is known (spec false), or speculatively: with the slot's scale, recording the amax into *amax
// (zeroed by the caller), then the fresh scale from it (tcfp12_check_scale) and the same pass again only
// if that scale differs (under Recipe::redo_flag). The second call gets no amax to record (it is known).
// ratio, ref_amax (may be null): guess the scale from ref_amax, the amax of a gradient measured just before
// (tcfp12_predict_scale), instead of keeping the last use's.
template <class Quantize>
inline void tcfp12_quantize_speculative(Recipe& r, bool spec, float* slot, uint32_t* amax, bool e5m2,
                                        unsigned long long* counts, cudaStream_t st, Quantize quantize,
                                        float* ratio = nullptr, const uint32_t* ref_amax = nullptr) {
    if (!spec) {
        quantize((uint32_t*)nullptr, (const int*)nullptr);
        return;
    }
    if (ratio) tcfp12_predict_scale(slot, ratio, ref_amax, e5m2, st);
    quantize(amax, (const int*)nullptr);
    tcfp12_check_scale(slot, amax, e5m2, r.redo_flag, counts, st, ratio, ref_amax);
    quantize((uint32_t*)nullptr, (const int*)r.redo_flag);
}

// Whether the fc projection's backward makes the fc layer's dy codes itself (the top of the file): the
// fc layer's wgrad must read codes (an FP8 wgrad) and its dgrad the rows (ABD, or no K-concatenated form)
inline bool tcfp12_fc_dy_as_codes(const Recipe& r) {
    return tcfp12_speculates(r, true) && r.options.tcfp_fp8_wgrad && (r.options.split.abd || !r.concat);
}

// writes the GELU output an fc layer's forward left pending (Recipe::pending_gelu_out), if any
inline void tcfp12_write_gelu_out(Recipe& r, cudaStream_t st) { r.pending_gelu_out.write(st); }

// Whether the fc layer `id` (N tokens) leaves its GELU output to the fc projection's forward: that
// linear runs in TCFP-12 with FP8 codes (not the emulated block modes) and, in training, saves its x^T
// codes for the backward, so that nothing reads the BF16 GELU output
inline bool tcfp12_leaves_gelu_out(const Recipe& r, LinearId id, int N, bool training) {
    const LinearId proj{id.layer, LIN_FCPROJ};
    return id.kind == LIN_FC && !r.emulated && tcfp12_applies(r, proj, N, 4 * r.C, r.C) &&
           (!training || tcfp12_saves_xt(r, proj, N));
}

[[noreturn]] inline void tcfp12_no_gemm(const char* what, int m, int n, int k) {
    fprintf(stderr, "error: cuBLASLt has no FP8 GEMM for the TCFP-12 %s (m=%d n=%d k=%d)\n", what, m, n, k);
    exit(1);
}

// Whether the product whose K-concatenated GEMM has plan key `key` runs as that one GEMM (true) or as the
// two GEMMs (false). LLMC_TCFP12_CONCAT=0 / 1 forces the one or the other (where built). Otherwise, with
// autotuning on, the first call of the shape times both, each with the quantization of its activation
// operand, since the concatenated form writes the codes twice (two(), concat(): quantize and multiply;
// matmul_prefer_split), and the decision is kept like an algorithm choice, checkpoints included. Two
// GEMMs where the form is not built (block modes, channels not a multiple of 128), where cuBLASLt has
// no block-scaled algorithm for the shape or epilogue, and with -ga 0.
template <class Two, class Concat>
inline bool tcfp12_use_concat(const Recipe& r, const MatmulKey& key, cudaStream_t st, Two two, Concat concat) {
    if (!r.concat || r.concat_mode == 0) return false;
    const MatmulPlan* plan = matmul_plan(key);
    if (!plan || plan->candidates.empty()) return false;
    if (r.concat_mode == 1) return true;
    return matmul_prefer_split(key, st, two, concat); // ("split" is the concatenated form here)
}

// x's scale slot and amax for one forward call, and where its fresh scale comes from (tcfp12_forward_x_scale)
struct Tcfp12InputScale {
    float* slot;
    uint32_t* amax;
    bool codes_given; // the LayerNorm wrote x's codes, and tcfp12_input_again checked their scale
    bool spec;        // speculative: the slot's scale now, checked after the quantization
};

// x's fresh scale: from the amax the LayerNorm that wrote x recorded, or speculated (checked after the
// quantization, tcfp12_quantize_speculative), or from a pass over x for its amax first. With gelu_of_input,
// x = gelu(inp). Or the LayerNorm wrote x's codes and its scale is checked already (tcfp12_input_again).
inline Tcfp12InputScale tcfp12_forward_x_scale(Recipe& r, LinearId id, const floatX* inp, int N, int C, bool training,
                                               bool gelu_of_input, cudaStream_t st) {
    const int li = tcfp_linear_index(id);
    float* xs = tcfp_act_slot(r, li, TCFP_X, training);
    uint32_t* xamax = tcfp_act_amax(r, li, TCFP_X, training);
    const bool codes_given = tcfp12_take_given(r.x_codes_given, id, "input codes");
    if (codes_given && !r.x_codes_checked) {
        fprintf(stderr, "error: tcfp12: the E4M3 input the LayerNorm wrote for layer %d's %s was not checked "
                        "(recipe_site_again after the LayerNorm)\n", id.layer, LINEAR_NAMES[id.kind]);
        exit(1);
    }
    const bool amax_given = tcfp12_take_given(r.x_amax_given, id, "input amax");
    const bool spec = !amax_given && !codes_given && tcfp12_speculates(r, training);
    if (codes_given) {}
    else if (amax_given) tcfp12_scale_from_amax(xs, xamax, false, st);
    else if (spec) cudaCheck(cudaMemsetAsync(xamax, 0, sizeof(uint32_t), st));
    else tcfp12_fresh_scale(xs, xamax, inp, (long long)N * C, false, st, gelu_of_input);
    return Tcfp12InputScale{xs, xamax, codes_given, spec};
}

// The emulated block modes' forward: x -> the exact BF16 values of its FP8 codes (never gelu_of_input:
// tcfp12_leaves_gelu_out), then out = x deq(W_lo)^T and out = x deq(W_hi)^T + out + bias as BF16 GEMMs
inline void tcfp12_forward_emulated(Recipe& r, LinearId id, floatX* out, floatX* pre_gelu, const floatX* inp,
                                    const floatX* bias, const float* xs, int N, int C, int OC, cudaStream_t st) {
    const int li = tcfp_linear_index(id);
    const MatmulEpilogue epi = pre_gelu ? EPI_GELU_BIAS : EPI_NONE;
    tcfp12_fake_quantize<Fp8Kind::E4M3>(r.xq, inp, (long long)N * C, xs, st);
    PHASE("tcfp12: gemm forward");
    const size_t off = r.elem_offset[li];
    matmul(out, r.lo_bf + off, r.xq, nullptr, OC, N, C, true, false, 1.0f, 0.0f, false, st);
    matmul(out, r.hi_bf + off, r.xq, bias, OC, N, C, true, false, 1.0f, 1.0f, false, st, MatmulBatch(), epi, pre_gelu);
}

// The forward on FP8 codes: the GEMMs' form first (the two GEMMs, or the one K-concatenated GEMM: it decides
// which codes are made), then x's codes under the scale x_scale gives (speculatively where x_scale.spec), and
// x^T for the backward's FP8 wgrad, then the GEMMs
inline void tcfp12_forward_fp8(Recipe& r, LinearId id, floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* bias,
                               const Tcfp12InputScale& x_scale, bool gelu_of_input, int N, int C, int OC, bool training,
                               cudaStream_t st) {
    const int li = tcfp_linear_index(id);
    float* xs = x_scale.slot;
    uint32_t* xamax = x_scale.amax;
    const bool codes_given = x_scale.codes_given, spec = x_scale.spec;
    const MatmulEpilogue epi = pre_gelu ? EPI_GELU_BIAS : EPI_NONE;
    const Fp8Stats stats = training ? tcfp_act_stats(r, li, TCFP_X) : Fp8Stats();
    // (-tfw 1, training: x^T for the backward's FP8 wgrad from the same read as the rows, or from a read of
    // its own next to the K-concatenated codes)
    uint8_t* xt = training && tcfp12_saves_xt(r, id, N) ? tcfp12_saved_xt(r, li) : nullptr;
    // (amax: where to record x's amax, or null; run_if: tcfp12_quantize_speculative's flag, or null)
    auto quantize_rows = [&](Fp8Stats s, uint32_t* amax, const int* run_if) {
        if (xt || gelu_of_input)
            fp8_quantize_transpose<Fp8Kind::E4M3>(r.x8, xt, inp, N, C, xs, amax, s, st, nullptr, nullptr, nullptr, gelu_of_input,
                                                  run_if);
        else fp8_quantize<Fp8Kind::E4M3>(r.x8, inp, (long long)N * C, xs, amax, s, st, run_if);
    };
    auto quantize_cat = [&](Fp8Stats s, uint32_t* amax, const int* run_if) {
        tcfp12_quantize_twice<Fp8Kind::E4M3>(r.xcat, inp, N, C, xs, s, st, gelu_of_input, amax, run_if);
    };
    auto cat_scales_and_xt = [&]() { // (after the scale is final)
        tcfp12_fill_scale(r.xcat_scales, tcfp12_concat_act_scale_count(N, 2 * C), xs, st);
        if (xt && codes_given) fp8_transpose(xt, r.x8, N, C, st);
        else if (xt)
            fp8_quantize_transpose<Fp8Kind::E4M3>(nullptr, xt, inp, N, C, xs, nullptr, Fp8Stats(), st, nullptr, nullptr, nullptr,
                                                  gelu_of_input);
    };
    // (the LayerNorm's codes: x^T and the K-concatenated copy made from them; the BF16 x was not written)
    auto rows_from_codes = [&]() { if (xt) fp8_transpose(xt, r.x8, N, C, st); };
    auto cat_from_codes = [&]() { tcfp12_concat_codes(r.xcat, r.x8, r.x8, N, C, st); };
    const bool fast = r.options.tcfp_fast_accum != 0; // the W_lo GEMM always accumulates fast: its terms are ~16x smaller
    Fp8Operand x{r.x8, CUDA_R_8F_E4M3, xs + 4};
    Fp8Operand wlo{r.lo + r.elem_offset[li], CUDA_R_8F_E4M3, tcfp_lo_slot(r, li) + 4};
    Fp8Operand whi{r.hi + r.elem_offset[li], CUDA_R_8F_E4M3, tcfp_hi_slot(r, li) + 4};
    auto two_gemms = [&]() {
        if (pre_gelu && r.gelu_epilogue) {
            if (!matmul_fp8(out, false, wlo, x, nullptr, OC, N, C, 0.0f, true, st)) tcfp12_no_gemm("forward", OC, N, C);
            if (matmul_fp8(out, false, whi, x, bias, OC, N, C, 1.0f, fast, st, epi, pre_gelu)) return;
            r.gelu_epilogue = false; // probed once: take the unfused path from now on
        }
        if (pre_gelu) {
            // no fused GELU for FP8 operands here: both GEMMs into pre_gelu, then the GELU kernel
            if (!matmul_fp8(pre_gelu, false, wlo, x, nullptr, OC, N, C, 0.0f, true, st)) tcfp12_no_gemm("forward", OC, N, C);
            if (!matmul_fp8(pre_gelu, false, whi, x, bias, OC, N, C, 1.0f, fast, st)) tcfp12_no_gemm("forward", OC, N, C);
            gelu_forward(out, pre_gelu, (long long)N * OC, st);
            return;
        }
        if (!matmul_fp8(out, false, wlo, x, nullptr, OC, N, C, 0.0f, true, st)) tcfp12_no_gemm("forward", OC, N, C);
        if (!matmul_fp8(out, false, whi, x, bias, OC, N, C, 1.0f, fast, st)) tcfp12_no_gemm("forward", OC, N, C);
    };
    auto concat_gemm = [&]() {
        if (!matmul_fp8_block_scaled(out, r.wcat + 2 * r.elem_offset[li], CUDA_R_8F_E4M3, r.wcat_scales + r.elem_offset[li] / 64,
                                     r.xcat, CUDA_R_8F_E4M3, r.xcat_scales, bias, OC, N, 2 * C, st, epi, pre_gelu))
            tcfp12_no_gemm("forward (K-concatenated)", OC, N, 2 * C);
    };
    const MatmulKey key = matmul_fp8_block_scaled_key(OC, N, 2 * C, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, bias != nullptr, epi);
    const bool use_concat =
        codes_given ? tcfp12_use_concat(r, key, st, [&]() { rows_from_codes(); two_gemms(); },
                                        [&]() { cat_from_codes(); cat_scales_and_xt(); concat_gemm(); })
                    : tcfp12_use_concat(r, key, st, [&]() { quantize_rows(Fp8Stats(), nullptr, nullptr); two_gemms(); },
                                        [&]() { quantize_cat(Fp8Stats(), nullptr, nullptr); cat_scales_and_xt(); concat_gemm(); });
    // (the codes the timing made, with whatever scale the slot held, were not counted: the real ones now)
    unsigned long long* counts = tcfp_spec_counts(r, li, TCFP_X);
    if (codes_given) {
        if (use_concat) {
            cat_from_codes();
            cat_scales_and_xt();
        } else {
            rows_from_codes();
        }
    } else if (use_concat) {
        tcfp12_quantize_speculative(r, spec, xs, xamax, false, counts, st,
                                    [&](uint32_t* amax, const int* run_if) { quantize_cat(stats, amax, run_if); });
        cat_scales_and_xt();
    } else {
        tcfp12_quantize_speculative(r, spec, xs, xamax, false, counts, st,
                                    [&](uint32_t* amax, const int* run_if) { quantize_rows(stats, amax, run_if); });
    }
    PHASE("tcfp12: gemm forward");
    if (use_concat) concat_gemm();
    else two_gemms();
}

// out = x W_lo^T, then out = x W_hi^T + out + bias (and the GELU epilogue when asked); or the same as one
// K-concatenated GEMM. First the GELU output's hand-over between the fc layer and the fc projection, then x's
// scale (tcfp12_forward_x_scale), then the emulated block modes' BF16 GEMMs or the FP8 ones.
inline void tcfp12_forward(Recipe& r, LinearId id, floatX* out, floatX* pre_gelu, const floatX* inp, const floatX* bias,
                           int N, int C, int OC, bool training, cudaStream_t st) {
    // the fc projection whose input, the GELU output, the fc layer left unwritten: x = gelu(pre)
    const bool gelu_of_input = r.pending_gelu_out.is_for(id, inp);
    if (gelu_of_input) {
        inp = r.pending_gelu_out.take();
    } else {
        tcfp12_write_gelu_out(r, st);
    }
    // the fc layer that leaves its GELU output to the fc projection: its GEMMs write pre_gelu + bias
    const bool leave_gelu = pre_gelu && tcfp12_leaves_gelu_out(r, id, N, training);
    if (leave_gelu) {
        r.pending_gelu_out.leave(out, pre_gelu, (long long)N * OC, id.layer);
        out = pre_gelu;
        pre_gelu = nullptr;
    }
    PHASE("tcfp12: quantize x");
    const Tcfp12InputScale x_scale = tcfp12_forward_x_scale(r, id, inp, N, C, training, gelu_of_input, st);
    if (r.emulated) tcfp12_forward_emulated(r, id, out, pre_gelu, inp, bias, x_scale.slot, N, C, OC, st);
    else tcfp12_forward_fp8(r, id, out, pre_gelu, inp, bias, x_scale, gelu_of_input, N, C, OC, training, st);
}

// The linears the recipe keeps in BF16 (and the shapes FP8 GEMMs cannot take) run the plain linear, once
// a GELU output this recipe left pending is written
inline bool recipe_quantizes(const Recipe& r, LinearId id, int N, int C, int OC, LinearPass) { return tcfp12_applies(r, id, N, C, OC); }
inline void recipe_before_plain_linear(Recipe& r, LinearId, LinearPass, cudaStream_t st) { tcfp12_write_gelu_out(r, st); }

inline void recipe_linear_forward(Recipe& r, LinearId id, floatX* out, const floatX* inp, const floatX*,
                                  const floatX* bias, int N, int C, int OC, bool training, cudaStream_t st) {
    tcfp12_forward(r, id, out, nullptr, inp, bias, N, C, OC, training, st);
}

inline void recipe_linear_forward_gelu(Recipe& r, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                       const floatX*, const floatX* bias, int N, int C, int OC, bool training,
                                       cudaStream_t st) {
    tcfp12_forward(r, id, gelu_out, pre_gelu, inp, bias, N, C, OC, training, st);
}

// ---- backward ----------------------------------------------------------------------------------
// One quantized linear's backward as its steps share it (recipe_linear_backward, below): the shape, the
// options that pick the kernels, dy's scale slot and amax, x's scale from the forward pass, what earlier
// passes gave for dy, and the dgrad's form
struct Tcfp12Backward {
    LinearId id;
    int li, N, C, OC;
    bool fp8_wgrad, abd;
    float* dys;
    uint32_t* dy_amax;
    const float* xs; // the forward pass's x scale
    // What earlier passes gave: dy's codes (the fc layer's, made by the fc projection's backward with an FP8
    // wgrad; or a projection's rows, written by the LayerNorm backward: Recipe::dy_codes_given), or its column
    // sums and amax (the fc projection's GELU pass: Recipe::dy_sums_given), or the amax (the LayerNorm or the
    // flash attention backward that wrote dy: Recipe::dy_amax_given)
    bool codes_given, sums_given, amax_given;
    bool use_concat; // the dgrad as one K-concatenated GEMM (tcfp12_backward_dgrad_form)
};

// The call's operands and slots, and what earlier passes gave for dy (taken here: each is given to one call)
inline Tcfp12Backward tcfp12_backward_begin(Recipe& r, LinearId id, const float* dbias, int N, int C, int OC) {
    Tcfp12Backward b;
    b.id = id;
    b.li = tcfp_linear_index(id);
    b.N = N;
    b.C = C;
    b.OC = OC;
    b.fp8_wgrad = r.options.tcfp_fp8_wgrad != 0;
    b.abd = r.options.split.abd != 0;
    b.dys = tcfp_act_slot(r, b.li, TCFP_DY, true);
    b.dy_amax = tcfp_act_amax(r, b.li, TCFP_DY, true);
    b.xs = tcfp_act_slot(r, b.li, TCFP_X, true);
    b.codes_given = tcfp12_take_given(r.dy_codes_given, id, "output gradient codes");
    b.sums_given = same_linear(r.dy_sums_given, id);
    if (r.dy_sums_given.layer >= 0 && !b.sums_given) {
        fprintf(stderr, "error: tcfp12: the output gradient sums of layer %d's %s were not taken by the next call\n",
                r.dy_sums_given.layer, LINEAR_NAMES[r.dy_sums_given.kind]);
        exit(1);
    }
    r.dy_sums_given.layer = -1;
    b.amax_given = tcfp12_take_given(r.dy_amax_given, id, "output gradient amax");
    if (b.amax_given && (dbias || b.sums_given)) {
        fprintf(stderr, "error: tcfp12: a linear whose output gradient's amax was recorded gets no bias gradient here\n");
        exit(1);
    }
    b.use_concat = false;
    return b;
}

// dy's fresh scale and the bias gradient: from the column sums and amax the fc projection's GELU pass gave,
// from the amax the LayerNorm backward gave (no bias there), or from one read of dy
inline void tcfp12_dy_scale_and_bias_grad(Recipe& r, const Tcfp12Backward& b, float* dbias, const floatX* dout,
                                          cudaStream_t st) {
    if (b.sums_given) tcfp12_dy_scale_from_partials(b.dys, b.dy_amax, dbias, r.scratch.bias_partials, b.OC, st);
    else if (b.amax_given) tcfp12_scale_from_amax(b.dys, b.dy_amax, true, st);
    else tcfp12_dy_scale_and_bias(b.dys, b.dy_amax, dbias, r.scratch.bias_partials, dout, b.N, b.OC, st);
}

// dy's E5M2 rows for the two dgrad GEMMs, and dy^T for an FP8 wgrad from the same read (amax: where to record
// dy's amax, or null; partials: dy's column sums per 64-row tile, or null; run_if: tcfp12_quantize_speculative's
// flag, or null)
inline void tcfp12_quantize_dy_rows(Recipe& r, const Tcfp12Backward& b, const floatX* dout, Fp8Stats s, uint32_t* amax,
                                    float* partials, const int* run_if, cudaStream_t st) {
    if (b.fp8_wgrad || partials)
        fp8_quantize_transpose<Fp8Kind::E5M2>(r.dy8, b.fp8_wgrad ? r.dyt8 : nullptr, dout, b.N, b.OC, b.dys, amax, s, st,
                                              nullptr, partials, nullptr, false, run_if);
    else fp8_quantize<Fp8Kind::E5M2>(r.dy8, dout, (long long)b.N * b.OC, b.dys, amax, s, st, run_if);
}

// dy's E5M2 codes twice along K, for the K-concatenated dgrad, with their scales; dy^T for an FP8 wgrad on a
// read of its own
inline void tcfp12_quantize_dy_cat(Recipe& r, const Tcfp12Backward& b, const floatX* dout, Fp8Stats s, cudaStream_t st) {
    tcfp12_quantize_twice<Fp8Kind::E5M2>(r.dycat, dout, b.N, b.OC, b.dys, s, st);
    tcfp12_fill_scale(r.dycat_scales, tcfp12_concat_act_scale_count(b.N, 2 * b.OC), b.dys, st);
    if (b.fp8_wgrad) fp8_quantize_transpose<Fp8Kind::E5M2>(nullptr, r.dyt8, dout, b.N, b.OC, b.dys, nullptr, Fp8Stats(), st);
}

// dinp = dy W_lo (fast accumulation: its terms are about 16 times smaller), then dinp = dy W_hi + dinp; under
// ABD dinp = dy W_hi alone. Both read dy's rows and the W^T codes the split transposed.
inline void tcfp12_dgrad_two_gemms(Recipe& r, const Tcfp12Backward& b, floatX* dinp, cudaStream_t st) {
    const bool fast = r.options.tcfp_fast_accum != 0;
    const bool abd = b.abd;
    const int li = b.li, N = b.N, C = b.C, OC = b.OC;
    Fp8Operand dy{r.dy8, CUDA_R_8F_E5M2, b.dys + 4};
    Fp8Operand wlo{abd ? nullptr : r.lo_t + r.elem_offset[li], CUDA_R_8F_E4M3, tcfp_lo_slot(r, li) + 4};
    Fp8Operand whi{r.hi_t + r.elem_offset[li], CUDA_R_8F_E4M3, tcfp_hi_slot(r, li) + 4};
    if (!abd && !matmul_fp8(dinp, false, wlo, dy, nullptr, C, N, OC, 0.0f, true, st)) tcfp12_no_gemm("input gradient", C, N, OC);
    if (!matmul_fp8(dinp, false, whi, dy, nullptr, C, N, OC, abd ? 0.0f : 1.0f, fast, st)) tcfp12_no_gemm("input gradient", C, N, OC);
}

// dinp = [dy | dy] times the split's K-concatenated W^T codes, as one GEMM with block scales (dy's codes from
// tcfp12_quantize_dy_cat)
inline void tcfp12_dgrad_concat_gemm(Recipe& r, const Tcfp12Backward& b, floatX* dinp, cudaStream_t st) {
    const int li = b.li, N = b.N, C = b.C, OC = b.OC;
    if (!matmul_fp8_block_scaled(dinp, r.wcat_t + 2 * r.elem_offset[li], CUDA_R_8F_E4M3, r.wcat_t_scales + r.elem_offset[li] / 64,
                                 r.dycat, CUDA_R_8F_E5M2, r.dycat_scales, nullptr, C, N, 2 * OC, st))
        tcfp12_no_gemm("input gradient (K-concatenated)", C, N, 2 * OC);
}

// Whether the dgrad runs as the one K-concatenated GEMM (tcfp12_use_concat), decided before dy is quantized since
// it decides which codes are made. Never under ABD (W_hi alone: one GEMM, nothing to concatenate), nor for codes
// an earlier pass made (rows: tcfp12_fc_dy_as_codes). Its timing, on the first call of a shape, quantizes and
// multiplies with whatever scale the slot holds; the real codes come after.
inline bool tcfp12_backward_dgrad_form(Recipe& r, const Tcfp12Backward& b, const floatX* dout, floatX* dinp, cudaStream_t st) {
    if (b.abd || b.codes_given) return false;
    const MatmulKey key = matmul_fp8_block_scaled_key(b.C, b.N, 2 * b.OC, CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, false, EPI_NONE);
    return tcfp12_use_concat(
        r, key, st,
        [&]() { tcfp12_quantize_dy_rows(r, b, dout, Fp8Stats(), nullptr, nullptr, nullptr, st); tcfp12_dgrad_two_gemms(r, b, dinp, st); },
        [&]() { tcfp12_quantize_dy_cat(r, b, dout, Fp8Stats(), st); tcfp12_dgrad_concat_gemm(r, b, dinp, st); });
}

// dy quantized once for both GEMMs, with its fresh scale and the bias gradient. Emulated block modes: the exact
// BF16 values of dy's codes. FP8: the dgrad's form first (b.use_concat), then dy's E5M2 codes: the rows (or the
// K-concatenated copy) the dgrad reads and, for an FP8 wgrad, dy^T. The scale comes from what an earlier pass
// gave, or speculatively from the last use's (tcfp12_quantize_speculative), or from a read of dy of its own.
inline void tcfp12_backward_quantize_dy(Recipe& r, Tcfp12Backward& b, float* dbias, const floatX* dout, floatX* dinp,
                                        cudaStream_t st) {
    const int li = b.li, N = b.N, OC = b.OC;
    if (r.emulated) {
        tcfp12_dy_scale_and_bias_grad(r, b, dbias, dout, st);
        tcfp12_fake_quantize<Fp8Kind::E5M2>(r.dyq, dout, (long long)N * OC, b.dys, st);
        return;
    }
    const Fp8Stats stats = tcfp_act_stats(r, li, TCFP_DY);
    b.use_concat = tcfp12_backward_dgrad_form(r, b, dout, dinp, st);
    const bool spec = !b.codes_given && !b.sums_given && !b.amax_given && !b.use_concat && tcfp12_speculates(r, true);
    if (b.codes_given && r.dy_codes_rows_only) {
        // (the LayerNorm backward's rows: its column sums were this linear's bias gradient already)
        if (!r.dy_codes_checked || dbias || !b.fp8_wgrad) {
            fprintf(stderr, "error: tcfp12: the E5M2 output gradient the LayerNorm backward wrote for layer %d's %s was "
                            "not checked (tcfp12_gradient_again after it), or a bias gradient is asked here\n",
                    b.id.layer, LINEAR_NAMES[b.id.kind]);
            exit(1);
        }
        fp8_transpose(r.dyt8, r.dy8, N, OC, st);
    } else if (b.codes_given) {
        if (dbias) bias_backward_reduce(dbias, r.dy_partials, OC, ceil_div(N, FP8_TILE), st);
    } else if (spec) {
        // speculative: codes, amax and the column sums from one read of dy (the sums do not depend on the
        // scale: the second pass, if any, leaves them)
        cudaCheck(cudaMemsetAsync(b.dy_amax, 0, sizeof(uint32_t), st));
        float* partials = dbias ? r.dy_partials : nullptr;
        // (the qkv layer's guess: from the attention projection's dy amax, measured before the attention
        // backward made this dy, times the ratio of the two last time)
        const LinearId proj{b.id.layer, LIN_ATTPROJ};
        const bool guess = b.id.kind == LIN_QKV && tcfp12_applies(r, proj, N, r.C, r.C);
        tcfp12_quantize_speculative(r, true, b.dys, b.dy_amax, true, tcfp_spec_counts(r, li, TCFP_DY), st,
                                    [&](uint32_t* amax, const int* run_if) {
                                        tcfp12_quantize_dy_rows(r, b, dout, Fp8Stats(), amax, run_if ? nullptr : partials,
                                                                run_if, st);
                                    },
                                    guess ? tcfp_spec_ratio(r, li, TCFP_DY) : nullptr,
                                    guess ? tcfp_act_amax(r, tcfp_linear_index(proj), TCFP_DY, true) : nullptr);
        if (dbias) bias_backward_reduce(dbias, r.dy_partials, OC, ceil_div(N, FP8_TILE), st);
    } else {
        // dy's amax and the bias gradient from one read (or from what an earlier pass gave), then the codes
        // (the codes the timing made were not counted: the real ones now)
        tcfp12_dy_scale_and_bias_grad(r, b, dbias, dout, st);
        if (b.use_concat) tcfp12_quantize_dy_cat(r, b, dout, stats, st);
        else tcfp12_quantize_dy_rows(r, b, dout, stats, nullptr, nullptr, nullptr, st);
    }
}

// dweight += dy^T x. -tfw 1: dy^T's E5M2 codes times the x^T codes the training forward saved (its scale, the codes
// its GEMM read), or in the emulated block modes the exact BF16 values of both; otherwise BF16 dy and x.
inline void tcfp12_backward_wgrad(Recipe& r, const Tcfp12Backward& b, float* dweight, const floatX* dout, const floatX* inp,
                                  cudaStream_t st) {
    const int li = b.li, N = b.N, C = b.C, OC = b.OC;
    if (!b.fp8_wgrad) {
        plain_linear_backward_dw(dweight, dout, inp, N, C, OC, st);
    } else if (r.emulated) {
        tcfp12_fake_quantize<Fp8Kind::E4M3>(r.xq, inp, (long long)N * C, b.xs, st);
        matmul(dweight, r.xq, r.dyq, nullptr, C, OC, N, false, true, 1.0f, 1.0f, true, st);
    } else {
        Fp8Operand xt{tcfp12_saved_xt(r, li), CUDA_R_8F_E4M3, b.xs + 4}, dyt{r.dyt8, CUDA_R_8F_E5M2, b.dys + 4};
        if (!matmul_fp8(dweight, true, xt, dyt, nullptr, C, OC, N, 1.0f, false, st)) tcfp12_no_gemm("weight gradient", C, OC, N);
    }
}

// dinp = dy (W_lo + W_hi), or dy W_hi under ABD: BF16 GEMMs on the exact values (emulated block modes), the two
// FP8 GEMMs, or the one K-concatenated GEMM (b.use_concat)
inline void tcfp12_backward_dgrad(Recipe& r, const Tcfp12Backward& b, floatX* dinp, cudaStream_t st) {
    const int N = b.N, C = b.C, OC = b.OC;
    if (r.emulated) {
        const size_t off = r.elem_offset[b.li];
        if (!b.abd) matmul(dinp, r.lo_bf + off, r.dyq, nullptr, C, N, OC, false, false, 1.0f, 0.0f, false, st);
        matmul(dinp, r.hi_bf + off, r.dyq, nullptr, C, N, OC, false, false, 1.0f, b.abd ? 0.0f : 1.0f, false, st);
    } else if (b.use_concat) {
        tcfp12_dgrad_concat_gemm(r, b, dinp, st);
    } else {
        tcfp12_dgrad_two_gemms(r, b, dinp, st);
    }
}

// The fc projection's input gradient dinp goes back through the GELU to the fc layer's dy = dinp * gelu'(pre_gelu).
// With FP8 codes for the fc layer (tcfp12_fc_dy_as_codes) straight to its E5M2 codes; otherwise in place, with
// its column sums and amax where the fc layer quantizes it next (Recipe::dy_sums_given).
inline void tcfp12_backward_gelu(Recipe& r, LinearId id, floatX* dinp, const floatX* pre_gelu, const uint32_t* dy_amax,
                                 int N, int C, int OC, cudaStream_t st) {
    const LinearId fc{id.layer, LIN_FC};
    if (id.kind == LIN_FCPROJ && tcfp12_applies(r, fc, N, OC, C) && tcfp12_fc_dy_as_codes(r)) {
        // the fc layer's dy = bf16(dinp * gelu'(pre_gelu)), as gelu_backward would store it, straight to the
        // E5M2 codes (rows and transposed) the fc layer's GEMMs read, with its amax and column sums, under a
        // speculative scale; this linear's dy codes are dead by now, so the fc layer's take their place
        PHASE("tcfp12: quantize dy + bias grad");
        const int lf = tcfp_linear_index(fc);
        float* fc_slot = tcfp_act_slot(r, lf, TCFP_DY, true);
        uint32_t* fc_amax = tcfp_act_amax(r, lf, TCFP_DY, true);
        cudaCheck(cudaMemsetAsync(fc_amax, 0, sizeof(uint32_t), st));
        // (the guess: from this linear's dy amax, known by now, times the ratio of the two last time)
        tcfp12_quantize_speculative(r, true, fc_slot, fc_amax, true, tcfp_spec_counts(r, lf, TCFP_DY), st,
                                    [&](uint32_t* amax, const int* run_if) {
                                        fp8_quantize_transpose<Fp8Kind::E5M2>(r.dy8, r.dyt8, dinp, N, C, fc_slot, amax, Fp8Stats(),
                                                                              st, nullptr, run_if ? nullptr : r.dy_partials,
                                                                              pre_gelu, false, run_if);
                                    },
                                    tcfp_spec_ratio(r, lf, TCFP_DY), dy_amax);
        r.dy_codes_given = fc;
        r.dy_codes_rows_only = false;
        return;
    }
    PHASE("tcfp12: gelu backward");
    // the fc layer's dy = dinp * gelu'(pre_gelu): when its linear_backward (the next call) quantizes it,
    // this pass also takes the column sums (its bias gradient) and the amax (its scale) of the result,
    // so that the fc layer need not read dy once more for them
    if (id.kind == LIN_FCPROJ && tcfp12_applies(r, fc, N, OC, C)) {
        uint32_t* fc_amax = tcfp_act_amax(r, tcfp_linear_index(fc), TCFP_DY, true);
        cudaCheck(cudaMemsetAsync(fc_amax, 0, sizeof(uint32_t), st));
        if (gelu_backward_bias_partials(dinp, pre_gelu, r.scratch.bias_partials, fc_amax, N, C, st)) {
            r.dy_sums_given = fc;
            return;
        }
    }
    gelu_backward(dinp, pre_gelu, (long long)N * C, st);
}

// The backward of one linear, in these steps:
//   1. what earlier passes gave for dy (tcfp12_backward_begin): its codes, its column sums and amax, or its amax;
//   2. dy quantized once, for both GEMMs (tcfp12_backward_quantize_dy): its fresh scale, the bias gradient and
//      the codes: dy's rows (or their K-concatenated copy) for the dgrad, dy^T for an FP8 wgrad; the dgrad's
//      form is chosen before, since it decides which codes are made;
//   3. the wgrad (tcfp12_backward_wgrad): dy^T with the x^T codes the forward saved, or the BF16 dy and x;
//   4. the dgrad (tcfp12_backward_dgrad): dy's rows with the W^T codes of the split;
//   5. for the fc projection, dinp back through the GELU (tcfp12_backward_gelu).
// The emulated block modes run the same steps on the exact BF16 values of the codes.
// Once dy is quantized, the wgrad and the dgrad write different outputs from their own copies of dy (dy^T and
// the rows); the wgrad goes first, as in plain_linear_backward. The dgrad goes last because the step after it
// (tcfp12_backward_gelu, the fc projection only) reads its dinp and may write the fc layer's dy codes over this
// linear's: both GEMMs have read them by then.
inline void recipe_linear_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                   const floatX* inp, const floatX*, const floatX* pre_gelu, int N, int C, int OC,
                                   cudaStream_t st) {
    tcfp12_write_gelu_out(r, st);
    PHASE("tcfp12: quantize dy + bias grad");
    Tcfp12Backward b = tcfp12_backward_begin(r, id, dbias, N, C, OC);
    tcfp12_backward_quantize_dy(r, b, dbias, dout, dinp, st);
    PHASE("tcfp12: gemm wgrad");
    tcfp12_backward_wgrad(r, b, dweight, dout, inp, st);
    PHASE("tcfp12: gemm dgrad");
    tcfp12_backward_dgrad(r, b, dinp, st);
    if (pre_gelu) tcfp12_backward_gelu(r, id, dinp, pre_gelu, b.dy_amax, N, C, OC, st);
}

// ---- checkpoint state -----------------------------------------------------------------------------
static const int TCFP_NUM_OPTIONS = 9;
inline void tcfp12_option_values(const Recipe& r, int32_t* v) {
    const RecipeOptions& o = r.options;
    const int32_t vals[TCFP_NUM_OPTIONS] = {o.split.block_size, r.use_ef ? 1 : 0, o.split.srr, o.split.pdds, o.split.abd,
                                            o.tcfp_fp8_wgrad, o.skip_first, o.skip_last, o.tcfp_fast_accum};
    memcpy(v, vals, sizeof(vals));
}

template <typename T>
inline std::vector<T> tcfp12_download(const T* d, size_t n) {
    std::vector<T> h(n);
    if (n) cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

inline void recipe_save(const Recipe& r, StateWriter& w) {
    int32_t opts[TCFP_NUM_OPTIONS];
    tcfp12_option_values(r, opts);
    const int64_t splits = r.splits;
    w.add_copy("tcfp12_options", opts, sizeof(opts));
    w.add_copy("tcfp12_splits", &splits, sizeof(splits));
    const size_t ne = r.total_elems, ng = r.total_groups;
    auto hi = tcfp12_download(r.hi, ne), lo = tcfp12_download(r.lo, ne);
    auto hs = tcfp12_download(r.hi_scale, ng), ls = tcfp12_download(r.lo_scale, ng);
    w.add_copy("tcfp12_w_hi", hi.data(), ne);
    w.add_copy("tcfp12_w_lo", lo.data(), ne);
    w.add_copy("tcfp12_hi_scale", hs.data(), ng);
    w.add_copy("tcfp12_lo_scale", ls.data(), ng);
    if (r.use_ef) { // (under ZeRO-1 this process's pieces: each process writes its own state file)
        const size_t nef = r.total_elems / (size_t)r.owners;
        auto ef = tcfp12_download(r.ef, nef);
        w.add_copy("tcfp12_error_feedback", ef.data(), nef * sizeof(float));
    }
    if (r.options.split.pdds) {
        auto pd = tcfp12_download(r.pdds, ng);
        w.add_copy("tcfp12_pdds", pd.data(), ng * sizeof(float));
    }
}

inline void recipe_load(Recipe& r, StateReader& rd) {
    int32_t opts[TCFP_NUM_OPTIONS], mine[TCFP_NUM_OPTIONS];
    rd.read("tcfp12_options", opts, sizeof(opts));
    tcfp12_option_values(r, mine);
    if (memcmp(opts, mine, sizeof(opts)) != 0) {
        input_error("the checkpoint was written with -tb %d -tef %d -tsrr %d -tpdds %d -tabd %d -tfw %d -sqf %d -sql %d "
                    "-tfa %d, this run has -tb %d -tef %d -tsrr %d -tpdds %d -tabd %d -tfw %d -sqf %d -sql %d -tfa %d; "
                    "resume with the checkpoint's settings", opts[0], opts[1], opts[2], opts[3], opts[4], opts[5], opts[6],
                    opts[7], opts[8], mine[0], mine[1], mine[2], mine[3], mine[4], mine[5], mine[6], mine[7], mine[8]);
    }
    int64_t splits = 0;
    rd.read("tcfp12_splits", &splits, sizeof(splits));
    r.splits = splits;
    const size_t ne = r.total_elems, ng = r.total_groups;
    std::vector<uint8_t> b(ne);
    rd.read("tcfp12_w_hi", b.data(), ne);
    if (ne) cudaCheck(cudaMemcpy(r.hi, b.data(), ne, cudaMemcpyHostToDevice));
    rd.read("tcfp12_w_lo", b.data(), ne);
    if (ne) cudaCheck(cudaMemcpy(r.lo, b.data(), ne, cudaMemcpyHostToDevice));
    std::vector<uint8_t> s(ng);
    rd.read("tcfp12_hi_scale", s.data(), ng);
    if (ng) cudaCheck(cudaMemcpy(r.hi_scale, s.data(), ng, cudaMemcpyHostToDevice));
    rd.read("tcfp12_lo_scale", s.data(), ng);
    if (ng) cudaCheck(cudaMemcpy(r.lo_scale, s.data(), ng, cudaMemcpyHostToDevice));
    if (r.use_ef) {
        const size_t nef = r.total_elems / (size_t)r.owners;
        if (rd.size_of("tcfp12_error_feedback") != nef * sizeof(float))
            input_error("the checkpoint's TCFP-12 error-feedback buffer holds %zu values, this process keeps %zu (%s); "
                        "resume with the process count and -z the checkpoint was written with",
                        rd.size_of("tcfp12_error_feedback") / sizeof(float), nef,
                        r.owners > 1 ? strfmt("its piece under ZeRO-1 over %d processes", r.owners).c_str() : "the whole buffer");
        std::vector<float> ef(nef);
        rd.read("tcfp12_error_feedback", ef.data(), nef * sizeof(float));
        if (nef) cudaCheck(cudaMemcpy(r.ef, ef.data(), nef * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (r.options.split.pdds) {
        std::vector<float> pd(ng);
        rd.read("tcfp12_pdds", pd.data(), ng * sizeof(float));
        if (ng) cudaCheck(cudaMemcpy(r.pdds, pd.data(), ng * sizeof(float), cudaMemcpyHostToDevice));
    }
    // the split of the loaded weights is the one just restored (train_gpt.cu calls
    // recipe_weights_changed next: it then only derives the GEMMs' operands from it)
    r.skip_next_split = true;
}

// ---- telemetry ----------------------------------------------------------------------------------
inline bool recipe_begin_step(Recipe& r, int step) {
    r.count_stats = r.options.telemetry_every > 0 && step % r.options.telemetry_every == 0;
    if (r.count_stats) {
        cudaCheck(cudaMemset(r.act_stats, 0, (size_t)r.num_linears * NUM_TCFP_ACT_ROLES * 3 * sizeof(unsigned long long)));
    }
    return r.count_stats;
}

// Per quantized linear, the weight split and the two quantized operands:
//   s:STEP lq:l3.fc.w amax:... lo_amax:... hi_scale:... lo_scale:... lo_zero:... err:... sat:...
//   s:STEP lq:l3.fc.x amax:... scale:... sat:... ftz:... spec:... redo:...   (and .dy)
// Weights: hi_scale / lo_scale are the tensor's scales (per block: those of the block holding the
// largest value and the largest residual), lo_zero the fraction of W_lo codes that are zero, err
// the relative split error sqrt(sum EF'^2 / sum W_eff^2), sat the fraction clipped (W_hi or W_lo).
// x and dy: the last micro-step's amax and scale; counts over the step's micro-steps (the emulated
// block modes do not count them: sat and ftz read 0 there); spec, the speculative quantizations since
// the previous telemetry line (telemetry steps run none), and redo, the fraction of them that ran again
// because the fresh scale differed from the speculated one.
inline void recipe_log_telemetry(Recipe& r, FILE* log, int step) {
    const int nl = r.num_linears;
    cudaCheck(cudaDeviceSynchronize());
    auto ss = tcfp12_download(r.split_stats, (size_t)nl);
    auto amax = tcfp12_download(r.act_amax, (size_t)nl * NUM_TCFP_ACT_ROLES);
    auto slots = tcfp12_download(r.act_slots, (size_t)nl * NUM_TCFP_ACT_ROLES * TCFP_SCALE_SLOT);
    auto counts = tcfp12_download(r.act_stats, (size_t)nl * NUM_TCFP_ACT_ROLES * 3);
    auto spec = tcfp12_download(r.spec_counts, (size_t)nl * NUM_TCFP_ACT_ROLES * 2);
    cudaCheck(cudaMemset(r.spec_counts, 0, (size_t)nl * NUM_TCFP_ACT_ROLES * 2 * sizeof(unsigned long long)));
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            const int li = l * NUM_LINEAR_KINDS + k;
            const Tcfp12SplitStats& s = ss[li];
            const double n = (double)linear_in_features((LinearKind)k, r.C) * linear_out_features((LinearKind)k, r.C);
            const float a = llmc::bits_float(s.amax_bits), la = llmc::bits_float(s.lo_amax_bits);
            float hs, lsc;
            if (r.options.split.block_size == 0) {
                hs = llmc::tcfp12_scale((uint8_t)s.hi_code);
                lsc = s.zero_residual_groups ? 0.0f : llmc::tcfp12_scale((uint8_t)s.lo_code); // the sentinel: 0
            } else {
                hs = llmc::tcfp12_scale(llmc::tcfp12_scale_code(a));
                lsc = llmc::tcfp12_scale(llmc::tcfp12_scale_code(la));
            }
            const double err = s.weff2 > 0 ? std::sqrt(s.err2 / s.weff2) : 0.0;
            fprintf(log, "s:%d lq:l%d.%s.w amax:%.6e lo_amax:%.6e hi_scale:%.6e lo_scale:%.6e lo_zero:%.6e err:%.6e sat:%.6e\n",
                    step, l, LINEAR_NAMES[k], a, la, hs, lsc, 1.0 - s.lo_nonzero / n, err,
                    (s.hi_saturated + s.lo_saturated) / n);
            for (int role = 0; role < NUM_TCFP_ACT_ROLES; role++) {
                const size_t i = (size_t)li * NUM_TCFP_ACT_ROLES + role;
                const unsigned long long* c = &counts[i * 3];
                const double cnt = c[0] ? (double)c[0] : 1.0;
                float am;
                memcpy(&am, &amax[i], 4);
                fprintf(log, "s:%d lq:l%d.%s.%s amax:%.6e scale:%.6e sat:%.6e ftz:%.6e spec:%llu redo:%.6e\n", step, l,
                        LINEAR_NAMES[k], TCFP_ACT_NAMES[role], am, slots[i * TCFP_SCALE_SLOT], c[1] / cnt, c[2] / cnt,
                        spec[i * 2], spec[i * 2] ? (double)spec[i * 2 + 1] / spec[i * 2] : 0.0);
            }
        }
    }
    fflush(log);
}
