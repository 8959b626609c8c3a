// recipe_nvfp4.h: the NVFP4 precision recipe (seed 004's FP4 recipe, issue #6), emulated exactly on
// Hopper's BF16 tensor cores.
//
// Format (nvfp4.h): E2M1 values, one UE4M3 scale per block of 16 and one FP32 global scale per
// tensor (g = amax / (448 * 6)). Blocks run along each GEMM's K dimension; weights use 16x16 tiles so
// that W and W^T share one quantization. Per transformer linear (x the input, W the weight, dy the
// output gradient, N tokens):
//   forward  y  = x W^T     x: 1x16 blocks along C, round to nearest even; W: 16x16 tiles, RNE
//   dgrad    dx = dy W      dy: 1x16 blocks along OC, stochastic rounding (-sr); W as in forward
//   wgrad    dW += dy^T x   dy and x: 16-blocks along N after the 16-point random Hadamard transform
//                           (-rht; fixed random signs from -sd); dy stochastic, x RNE
// Four Over Six (-fos) picks, per block, the block max mapped to 6 or to 4, whichever quantizes the
// block with the lower squared error (always with RNE errors, so that SR stays unbiased).
//
// Emulation (nvfp4_quantize.cuh): the quantize kernels write e2m1 * ue4m3 per element, exact in
// BF16, and the BF16 GEMM multiplies by alpha = g_a * g_b read from device memory. The products are
// then those of an FP4 tensor core; only the FP32 accumulation order differs. The bias, GELU and
// GELU-derivative epilogues apply to the scaled product, as in the plain linear.
//
// Which layers: the four linears of layers [-sqf, L - -sql); embeddings, LM head, attention and
// norms stay BF16. Default: the last ceil(15% of L) layers in BF16 (2 of 12 at d12; NVIDIA keeps
// about the last 15% of layers in higher precision), the first none (doc/nvfp4.md has the runs).
//
// Cost per linear and micro-step: x is read 3 times (amax, quantize for forward, quantize for
// wgrad) and written twice; dy is read twice (amax, one quantize for both directions) and written
// twice; the weights are quantized once per optimizer step.
//
// Randomness: stochastic rounding uses counter-based bits (nvfp4_sr_bits) seeded per backward call
// from -sd, the optimizer step, the micro-step's data slice and the call's place in the micro-step:
// a resumed run draws the same bits, and so does a data-parallel run for the same slice.
//
// Telemetry (-lq N): every N steps one main.log line per quantized tensor: its amax, the relative
// quantization error sqrt(sum (x' - x)^2 / sum x^2) and the fraction of values flushed to zero
// (non-zero x, x' = 0), over all micro-steps of the step (weights: as quantized for the step).
#pragma once
#include <cmath>
#include <vector>
#include "recipe.h"
#include "nvfp4_quantize.cuh"
#include "profiler.h"

#define RECIPE_NAME "nvfp4"
using RecipeBoundaries = IdentityBoundaries; // no boundaries outside the linears (boundaries.h)

#if defined(ENABLE_FP32)
#error "the nvfp4 recipe is a BF16 build (PRECISION=FP32 is the BF16 recipe's reference build)"
#endif

// The quantized tensors of one linear
enum Nvfp4Role { NV_W = 0, NV_X = 1, NV_X_WGRAD = 2, NV_DY = 3, NV_DY_WGRAD = 4, NUM_NV_ROLES = 5 };
static const char* NV_ROLE_NAMES[NUM_NV_ROLES] = {"w", "x", "x_wgrad", "dy", "dy_wgrad"};
// The GEMMs of one linear, each with its alpha = g_a * g_b (16-byte stride: cuBLASLt's pointers)
enum Nvfp4Gemm { NV_FORWARD = 0, NV_DGRAD = 1, NV_WGRAD = 2, NUM_NV_GEMMS = 3 };
static const int NV_ALPHA_STRIDE = 4;

struct Recipe {
    RecipeOptions options;
    LinearScratch scratch;
    int L = 0, C = 0, B = 0, T = 0;
    int num_linears = 0;                  // 4 L
    // the quantized weights (block-dequantized BF16), per quantized linear: W (OC x C)
    floatX* weights_q = nullptr;
    std::vector<size_t> weight_offset;    // per linear, in elements
    // device state: per linear NUM_NV_ROLES amaxes (bits), NUM_NV_GEMMS alphas, telemetry sums
    uint32_t* amax = nullptr;
    float* alpha = nullptr;
    double* stats = nullptr;              // per linear and role: NVFP4_STATS
    // scratch (N x 4C each): x for the forward GEMM and then for wgrad; dy for dgrad; dy for wgrad
    floatX *xq = nullptr, *dyq = nullptr, *dyq_wgrad = nullptr;
    uint16_t rht_signs = 0;
    uint64_t sr_seed = 0;                 // base seed of the stochastic rounding
    int sr_step = 0, sr_slice = 0;        // the random streams' position: step, data slice,
    long long sr_calls = 0;               // and backward calls so far in this micro-step
    bool count_stats = false;             // this step's activations and gradients are measured (-lq)
};

inline int nv_linear_index(LinearId id) { return id.layer * NUM_LINEAR_KINDS + id.kind; }
inline uint32_t* nv_amax(const Recipe& r, LinearId id, Nvfp4Role role) {
    return r.amax + (size_t)nv_linear_index(id) * NUM_NV_ROLES + role;
}
inline float* nv_alpha(const Recipe& r, LinearId id, Nvfp4Gemm g) {
    return r.alpha + ((size_t)nv_linear_index(id) * NUM_NV_GEMMS + g) * NV_ALPHA_STRIDE;
}
inline double* nv_stats(const Recipe& r, LinearId id, Nvfp4Role role) {
    return r.stats + ((size_t)nv_linear_index(id) * NUM_NV_ROLES + role) * NVFP4_STATS;
}
inline floatX* nv_weight(const Recipe& r, LinearId id) { return r.weights_q + r.weight_offset[nv_linear_index(id)]; }

// The kernels need N a multiple of 16 and both widths multiples of 64; other shapes (and the
// layers kept in BF16) take the plain linear
inline bool nvfp4_applies(const Recipe& r, LinearId id, int N, int C, int OC) {
    return layer_is_quantized(r.options, id.layer, r.L) && nvfp4_shape_ok(N, C) && nvfp4_shape_ok(N, OC);
}

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int B, int T) {
    r.options = o;
    r.L = shape.num_layers; r.C = shape.channels; r.B = B; r.T = T;
    resolve_skip_defaults(r.options, 0, (int)std::ceil(0.15 * r.L - 1e-9));
    linear_scratch_init(r.scratch, r.C);
    r.num_linears = r.L * NUM_LINEAR_KINDS;
    const size_t nl = r.num_linears;
    r.amax = (uint32_t*)cuda_malloc_or_die(nl * NUM_NV_ROLES * sizeof(uint32_t), "nvfp4 amax");
    r.alpha = (float*)cuda_malloc_or_die(nl * NUM_NV_GEMMS * NV_ALPHA_STRIDE * sizeof(float), "nvfp4 alphas");
    r.stats = (double*)cuda_malloc_or_die(nl * NUM_NV_ROLES * NVFP4_STATS * sizeof(double), "nvfp4 telemetry");
    cudaCheck(cudaMemset(r.amax, 0, nl * NUM_NV_ROLES * sizeof(uint32_t)));
    cudaCheck(cudaMemset(r.alpha, 0, nl * NUM_NV_GEMMS * NV_ALPHA_STRIDE * sizeof(float)));
    cudaCheck(cudaMemset(r.stats, 0, nl * NUM_NV_ROLES * NVFP4_STATS * sizeof(double)));
    r.weight_offset.assign(nl, 0);
    size_t total = 0;
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            r.weight_offset[l * NUM_LINEAR_KINDS + k] = total;
            total += (size_t)linear_in_features((LinearKind)k, r.C) * linear_out_features((LinearKind)k, r.C);
        }
    }
    r.weights_q = total ? (floatX*)cuda_malloc_or_die(total * sizeof(floatX), "nvfp4 weights") : nullptr;
    const size_t widest = (size_t)B * T * 4 * r.C;
    r.xq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "nvfp4 activations");
    r.dyq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "nvfp4 gradients");
    r.dyq_wgrad = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "nvfp4 gradients");
    r.rht_signs = llmc::nvfp4_rht_signs(o.seed ^ 0x52485453494E4753ULL);
    r.sr_seed = llmc::nvfp4_mix64(o.seed ^ 0x4E56465034535253ULL);
    r.sr_calls = 0;
}

inline std::string recipe_describe(const Recipe& r) {
    const RecipeOptions& o = r.options;
    int q0 = o.skip_first, q1 = r.L - o.skip_last;
    std::string layers = q1 > q0 ? strfmt("layers %d-%d in NVFP4", q0, q1 - 1) : std::string("no layer in NVFP4");
    return strfmt("nvfp4: E2M1 + UE4M3 block scales (1x16, weights 16x16) + FP32 global scale, emulated on BF16 "
                  "tensor cores; RHT %s, stochastic rounding %s, Four Over Six %s; %s, -sqf %d -sql %d",
                  o.fp4_rht ? "on" : "off", o.fp4_stochastic ? "on" : "off", o.fp4_four_over_six ? "on" : "off",
                  layers.c_str(), o.skip_first, o.skip_last);
}

inline void recipe_weights_changed(Recipe& r, const LinearWeights& w, cudaStream_t st) {
    // the weights' telemetry describes the weights now in use (always measured: once per step)
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            LinearId id{l, (LinearKind)k};
            const int C = linear_in_features(id.kind, r.C), OC = linear_out_features(id.kind, r.C);
            double* stats = nv_stats(r, id, NV_W);
            cudaCheck(cudaMemsetAsync(stats, 0, NVFP4_STATS * sizeof(double), st));
            nvfp4_quantize_weight(w.weight[k] + (size_t)l * OC * C, OC, C, nv_weight(r, id), nv_amax(r, id, NV_W),
                                  r.options.fp4_four_over_six, stats, st);
        }
    }
}

inline void recipe_step_end(Recipe&, cudaStream_t) {}
inline void recipe_begin_micro_step(Recipe& r, int slice) { r.sr_slice = slice; r.sr_calls = 0; }
// the scales are current (each tensor's own amax): nothing the processes must combine
inline RecipeMaxState recipe_cross_process_max(Recipe&) { return RecipeMaxState(); }

// The BF16 input is read again in backward (the wgrad operand is quantized there)
inline bool recipe_needs_input_in_backward(const Recipe&, LinearId, int) { return true; }

// x -> r.xq (1x16 blocks along C, RNE) and the forward GEMM's alpha; in training also the amax of
// the rotated x, for the wgrad operand of the backward pass
inline void nvfp4_quantize_input(Recipe& r, LinearId id, const floatX* inp, int N, int C, bool training, cudaStream_t st) {
    const bool rht = r.options.fp4_rht;
    nvfp4_amax(inp, N, C, nv_amax(r, id, NV_X), training ? nv_amax(r, id, NV_X_WGRAD) : nullptr, rht, r.rht_signs, st);
    Nvfp4Direction rows;
    rows.out = r.xq;
    rows.amax = nv_amax(r, id, NV_X);
    rows.alpha = nv_alpha(r, id, NV_FORWARD);
    rows.other_amax = nv_amax(r, id, NV_W);
    rows.stats = training && r.count_stats ? nv_stats(r, id, NV_X) : nullptr;
    nvfp4_quantize(inp, N, C, rows, Nvfp4Direction(), r.options.fp4_four_over_six, r.rht_signs, st);
}

inline void linear_forward(Recipe& r, LinearId id, floatX* out, const floatX* inp, const floatX* weight,
                           const floatX* bias, int N, int C, int OC, bool training, cudaStream_t st) {
    if (!nvfp4_applies(r, id, N, C, OC)) { plain_linear_forward(out, inp, weight, bias, N, C, OC, st); return; }
    PHASE("nvfp4: quantize x");
    nvfp4_quantize_input(r, id, inp, N, C, training, st);
    PHASE("nvfp4: gemm forward");
    matmul_alpha_on_device(out, nv_weight(r, id), r.xq, bias, OC, N, C, true, false, nv_alpha(r, id, NV_FORWARD),
                           false, false, st);
}

inline void linear_forward_gelu(Recipe& r, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                const floatX* weight, const floatX* bias, int N, int C, int OC, bool training,
                                cudaStream_t st) {
    if (!nvfp4_applies(r, id, N, C, OC)) {
        plain_linear_forward_gelu(gelu_out, pre_gelu, inp, weight, bias, N, C, OC, st);
        return;
    }
    PHASE("nvfp4: quantize x");
    nvfp4_quantize_input(r, id, inp, N, C, training, st);
    PHASE("nvfp4: gemm forward");
    matmul_alpha_on_device(gelu_out, nv_weight(r, id), r.xq, bias, OC, N, C, true, false, nv_alpha(r, id, NV_FORWARD),
                           false, false, st, EPI_GELU_BIAS, pre_gelu);
}

inline void linear_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                            const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC,
                            cudaStream_t st) {
    if (!nvfp4_applies(r, id, N, C, OC)) {
        plain_linear_backward(dweight, dbias, dinp, dout, inp, weight, pre_gelu, r.scratch, N, C, OC, st);
        return;
    }
    const RecipeOptions& o = r.options;
    PHASE("nvfp4: bias grad");
    if (dbias) bias_backward(dbias, r.scratch.bias_partials, dout, N, OC, st);
    // dy: 1x16 blocks along OC for dgrad and rotated 16-blocks along N for wgrad, from one read
    PHASE("nvfp4: quantize dy");
    nvfp4_amax(dout, N, OC, nv_amax(r, id, NV_DY), nv_amax(r, id, NV_DY_WGRAD), o.fp4_rht, r.rht_signs, st);
    const uint64_t call = llmc::nvfp4_mix64(llmc::nvfp4_mix64(((uint64_t)(uint32_t)r.sr_step << 32) | (uint32_t)r.sr_slice) ^
                                            (uint64_t)r.sr_calls++);
    Nvfp4Direction rows, cols;
    rows.out = r.dyq;
    rows.amax = nv_amax(r, id, NV_DY);
    rows.stochastic = o.fp4_stochastic;
    rows.seed = llmc::nvfp4_mix64(r.sr_seed ^ (2 * call));
    rows.alpha = nv_alpha(r, id, NV_DGRAD);
    rows.other_amax = nv_amax(r, id, NV_W);
    rows.stats = r.count_stats ? nv_stats(r, id, NV_DY) : nullptr;
    cols.out = r.dyq_wgrad;
    cols.amax = nv_amax(r, id, NV_DY_WGRAD);
    cols.rht = o.fp4_rht;
    cols.stochastic = o.fp4_stochastic;
    cols.seed = llmc::nvfp4_mix64(r.sr_seed ^ (2 * call + 1));
    cols.alpha = nv_alpha(r, id, NV_WGRAD);
    cols.other_amax = nv_amax(r, id, NV_X_WGRAD);
    cols.stats = r.count_stats ? nv_stats(r, id, NV_DY_WGRAD) : nullptr;
    nvfp4_quantize(dout, N, OC, rows, cols, o.fp4_four_over_six, r.rht_signs, st);
    // x: rotated 16-blocks along N (its amax was taken in the forward pass), round to nearest even
    PHASE("nvfp4: quantize x (wgrad)");
    Nvfp4Direction xcols;
    xcols.out = r.xq;
    xcols.amax = nv_amax(r, id, NV_X_WGRAD);
    xcols.rht = o.fp4_rht;
    xcols.stats = r.count_stats ? nv_stats(r, id, NV_X_WGRAD) : nullptr;
    nvfp4_quantize(inp, N, C, Nvfp4Direction(), xcols, o.fp4_four_over_six, r.rht_signs, st);
    PHASE("nvfp4: gemm wgrad");
    // dW (OC x C) += alpha * dy_q^T x_q: the rotation Q^T Q = I cancels along N
    matmul_alpha_on_device(dweight, r.xq, r.dyq_wgrad, nullptr, C, OC, N, false, true, nv_alpha(r, id, NV_WGRAD), true,
                           true, st);
    PHASE("nvfp4: gemm dgrad");
    if (pre_gelu) {
        matmul_alpha_on_device(dinp, nv_weight(r, id), r.dyq, nullptr, C, N, OC, false, false, nv_alpha(r, id, NV_DGRAD),
                               false, false, st, EPI_DGELU, (void*)pre_gelu);
    } else {
        matmul_alpha_on_device(dinp, nv_weight(r, id), r.dyq, nullptr, C, N, OC, false, false, nv_alpha(r, id, NV_DGRAD),
                               false, false, st);
    }
}

// ---- checkpoint state -----------------------------------------------------------------------------
// The options that change the numbers. The quantized weights are derived from the weights
// (recipe_weights_changed after loading); the random streams from the step.
inline void recipe_save(const Recipe& r, StateWriter& w) {
    const RecipeOptions& o = r.options;
    int32_t opts[5] = {o.skip_first, o.skip_last, o.fp4_rht, o.fp4_stochastic, o.fp4_four_over_six};
    w.add_copy("nvfp4_options", opts, sizeof(opts));
}

inline void recipe_load(Recipe& r, StateReader& rd) {
    const RecipeOptions& o = r.options;
    int32_t opts[5];
    rd.read("nvfp4_options", opts, sizeof(opts));
    const int32_t mine[5] = {o.skip_first, o.skip_last, o.fp4_rht, o.fp4_stochastic, o.fp4_four_over_six};
    if (memcmp(opts, mine, sizeof(opts)) != 0) {
        input_error("the checkpoint was written with -sqf %d -sql %d -rht %d -sr %d -fos %d, this run has -sqf %d -sql %d "
                    "-rht %d -sr %d -fos %d; resume with the checkpoint's settings", opts[0], opts[1], opts[2], opts[3],
                    opts[4], mine[0], mine[1], mine[2], mine[3], mine[4]);
    }
}

// ---- telemetry ----------------------------------------------------------------------------------
inline bool recipe_begin_step(Recipe& r, int step) {
    r.sr_step = step;
    r.sr_slice = 0;
    r.sr_calls = 0;
    r.count_stats = r.options.telemetry_every > 0 && step % r.options.telemetry_every == 0;
    if (r.count_stats) {
        // the activations' and gradients' sums start afresh (the weights' are reset with the weights)
        std::vector<double> zero((size_t)NUM_NV_ROLES * NVFP4_STATS, 0.0);
        cudaCheck(cudaDeviceSynchronize());
        for (int i = 0; i < r.num_linears; i++)
            cudaCheck(cudaMemcpy(r.stats + ((size_t)i * NUM_NV_ROLES + NV_X) * NVFP4_STATS, zero.data(),
                                 (size_t)(NUM_NV_ROLES - NV_X) * NVFP4_STATS * sizeof(double), cudaMemcpyHostToDevice));
    }
    return r.count_stats;
}

// One line per quantized tensor:  s:STEP lq:l3.fc.dy amax:... err:... ftz:...
//   err: relative RMS quantization error sqrt(sum (x' - x)^2 / sum x^2); ftz: non-zero values
//   quantized to zero, as a fraction of all values
inline void recipe_log_telemetry(Recipe& r, FILE* log, int step) {
    const size_t nl = r.num_linears;
    std::vector<uint32_t> amax(nl * NUM_NV_ROLES);
    std::vector<double> stats(nl * NUM_NV_ROLES * NVFP4_STATS);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(amax.data(), r.amax, amax.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(stats.data(), r.stats, stats.size() * sizeof(double), cudaMemcpyDeviceToHost));
    for (int role = 0; role < NUM_NV_ROLES; role++) {
        for (int l = 0; l < r.L; l++) {
            if (!layer_is_quantized(r.options, l, r.L)) continue;
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                const size_t i = (size_t)(l * NUM_LINEAR_KINDS + k) * NUM_NV_ROLES + role;
                const double* s = &stats[i * NVFP4_STATS];
                float a;
                memcpy(&a, &amax[i], 4);
                const double err = s[1] > 0 ? std::sqrt(s[0] / s[1]) : 0.0, n = s[2] > 0 ? s[2] : 1.0;
                fprintf(log, "s:%d lq:l%d.%s.%s amax:%.6e err:%.6e ftz:%.6e\n", step, l, LINEAR_NAMES[k],
                        NV_ROLE_NAMES[role], a, err, s[3] / n);
            }
        }
    }
    fflush(log);
}
