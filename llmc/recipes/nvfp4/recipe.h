// recipes/nvfp4/recipe.h: the NVFP4 precision recipe, emulated exactly on
// Hopper's BF16 tensor cores.
//
// Format (formats/nvfp4.h): E2M1 values, one UE4M3 scale per block of 16 and one FP32 global scale per
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
// Emulation (recipes/nvfp4/nvfp4_kernels.cuh): the quantize kernels write e2m1 * ue4m3 per element, exact in
// BF16, and the BF16 GEMM multiplies by alpha = g_a * g_b read from device memory. The products are
// then those of an FP4 tensor core; only the FP32 accumulation order differs. The bias, GELU and
// GELU-derivative epilogues apply to the scaled product, as in the plain linear. The wgrad GEMM
// writes its unscaled FP32 product to scratch and a small kernel adds alpha times it to dW
// (nvfp4_scaled_accumulate: a cuBLASLt kernel of the device-alpha form faulted on a shared GPU).
//
// Native FP4 GEMMs (Blackwell, compute capability 10.0 and newer; chosen at run time). The quantize
// kernels write the operands as packed E2M1 codes with tiled UE4M3 scales (recipes/nvfp4/nvfp4_kernels.cuh) and
// cuBLASLt's block-scaled FP4 GEMM (matmul_fp4) multiplies them, with the same alphas. The codes,
// scales and alphas are those of the emulation, so only the accumulation order differs. The recipe
// takes this path when the GPU has FP4 tensor cores and cuBLASLt has an algorithm for every GEMM of
// the model (checked when the recipe starts), unless LLMC_NVFP4_EMULATE=1; the banner says which.
// No Blackwell GPU was available to this project: this path compiles (the nvfp4 binaries hold sm_100a
// code, and CI builds them) and its operands are checked against the CPU reference on Hopper
// (build/test_nvfp4), but its GEMMs have never run.
//
// Which layers: the four linears of layers [-sqf, L - -sql); embeddings, LM head, attention and
// norms stay BF16. Default: the last ceil(15% of L) layers in BF16 (2 of 12 at d12; NVIDIA keeps
// about the last 15% of layers in higher precision), the first none (doc/recipes/nvfp4.md).
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
#include "llmc/recipe_api.h"
#include "options.h"
#include "nvfp4_kernels.cuh"
#include "llmc/profiler.h"

#define RECIPE_NAME "nvfp4"
using RecipeOptions = Nvfp4Options; // its flags (options.h)
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
    float* wgrad_product = nullptr;       // the emulated wgrad GEMM's unscaled FP32 product (4C x C)
    // native FP4 GEMMs (Blackwell): the operands as packed codes + tiled scales, instead of xq / dyq /
    // dyq_wgrad / weights_q. x's buffer holds x for the forward GEMM, then x^T for wgrad, as xq does.
    bool native = false;
    std::string native_note;              // why the native path is (not) taken, for the banner
    uint8_t *x_codes = nullptr, *x_scales = nullptr;
    uint8_t *dy_codes = nullptr, *dy_scales = nullptr, *dyt_codes = nullptr, *dyt_scales = nullptr;
    uint8_t *w_native = nullptr;          // per quantized linear: W codes, W scales, W^T codes, W^T scales
    std::vector<Nvfp4WeightNative> w_operands;
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

// The kernels need N a multiple of 16 and both widths multiples of 64, the native GEMMs N a multiple
// of 128; other shapes (and the layers kept in BF16) take the plain linear
inline bool nvfp4_applies(const Recipe& r, LinearId id, int N, int C, int OC) {
    return layer_is_quantized(r.options, id.layer, r.L) && nvfp4_shape_ok(N, C) && nvfp4_shape_ok(N, OC) &&
           (!r.native || N % 128 == 0);   // (the native GEMMs' shapes, checked when the recipe starts)
}

// Whether the native FP4 GEMMs can run every GEMM of the model (N tokens per micro-step): a GPU with
// FP4 tensor cores, and a cuBLASLt algorithm for each form the linears use (the plans are built now
// and cached). note: the reason, for the banner.
inline bool nvfp4_native_possible(const Recipe& r, int N, std::string& note) {
    const char* env = getenv("LLMC_NVFP4_EMULATE");
    if (env && strcmp(env, "1") == 0) { note = "LLMC_NVFP4_EMULATE=1"; return false; }
    int device = 0, major = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major < 10) { note = strfmt("compute capability %d.x has no FP4 tensor cores", major); return false; }
    if (!LLMC_HAVE_FP4_GEMM) { note = "this cuBLASLt has no FP4 GEMMs"; return false; }
    if (N % 128 != 0 || r.C % 128 != 0) { note = strfmt("N = %d and C = %d must be multiples of 128", N, r.C); return false; }
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
        const int C = linear_in_features((LinearKind)k, r.C), OC = linear_out_features((LinearKind)k, r.C);
        const bool gelu_out = k == LIN_FC, gelu_in = k == LIN_FCPROJ;   // fc's GELU, fcproj's GELU derivative
        const bool ok = matmul_fp4_available(OC, N, C, true, false, EPI_NONE) &&
                        (!gelu_out || matmul_fp4_available(OC, N, C, true, false, EPI_GELU_BIAS)) &&
                        matmul_fp4_available(C, N, OC, false, false, gelu_in ? EPI_DGELU : EPI_NONE) &&
                        matmul_fp4_available(C, OC, N, false, true, EPI_NONE);
        if (!ok) { note = strfmt("cuBLASLt has no FP4 algorithm for the %s layer's GEMMs", LINEAR_NAMES[k]); return false; }
    }
    note = "native FP4 tensor-core GEMMs";
    return true;
}

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int B, int T,
                        const RecipeContext& ctx = RecipeContext()) {
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
    const size_t total = quantized_linears_layout(r.options, r.L, r.C, r.weight_offset,
                                                  [](int K, int OC) { return (size_t)K * OC; });
    const int N = B * T;
    const size_t widest = (size_t)N * 4 * r.C;
    r.native = nvfp4_native_possible(r, N, r.native_note);
    if (!r.native) {
        r.weights_q = total ? (floatX*)cuda_malloc_or_die(total * sizeof(floatX), "nvfp4 weights") : nullptr;
        r.xq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "nvfp4 activations");
        r.dyq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "nvfp4 gradients");
        r.dyq_wgrad = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "nvfp4 gradients");
        r.wgrad_product = (float*)cuda_malloc_or_die((size_t)4 * r.C * r.C * sizeof(float), "nvfp4 wgrad product");
    } else {
        // the widest operand of each buffer: K = 4C or N, rows N or 4C (N and C are multiples of 128,
        // so no tiled scale array has padding)
        const size_t scale_bytes = std::max(llmc::nvfp4_tiled_scale_bytes(N, 4 * r.C / kNvfp4Block),
                                            llmc::nvfp4_tiled_scale_bytes(4 * r.C, N / kNvfp4Block));
        uint8_t** codes[3] = {&r.x_codes, &r.dy_codes, &r.dyt_codes};
        uint8_t** scales[3] = {&r.x_scales, &r.dy_scales, &r.dyt_scales};
        for (int i = 0; i < 3; i++) {
            *codes[i] = (uint8_t*)cuda_malloc_or_die(widest / 2, "nvfp4 operands (FP4 codes)");
            *scales[i] = (uint8_t*)cuda_malloc_or_die(scale_bytes, "nvfp4 operands (block scales)");
        }
        // per quantized linear: W and W^T, codes (OC * C / 2 bytes each) and tiled scales
        r.w_operands.assign(nl, Nvfp4WeightNative());
        size_t bytes = 0;
        std::vector<size_t> offset(nl, 0);
        auto w_bytes = [&](int k) {
            const size_t C = linear_in_features((LinearKind)k, r.C), OC = linear_out_features((LinearKind)k, r.C);
            return C * OC + llmc::nvfp4_tiled_scale_bytes((int)OC, (int)C / kNvfp4Block) +
                   llmc::nvfp4_tiled_scale_bytes((int)C, (int)OC / kNvfp4Block);
        };
        for (int l = 0; l < r.L; l++)
            for (int k = 0; k < NUM_LINEAR_KINDS; k++)
                if (layer_is_quantized(r.options, l, r.L)) { offset[l * NUM_LINEAR_KINDS + k] = bytes; bytes += w_bytes(k); }
        r.w_native = bytes ? (uint8_t*)cuda_malloc_or_die(bytes, "nvfp4 weights (FP4 codes and scales)") : nullptr;
        for (int l = 0; l < r.L; l++) {
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                if (!layer_is_quantized(r.options, l, r.L)) continue;
                const size_t C = linear_in_features((LinearKind)k, r.C), OC = linear_out_features((LinearKind)k, r.C);
                Nvfp4WeightNative& w = r.w_operands[l * NUM_LINEAR_KINDS + k];
                w.codes = r.w_native + offset[l * NUM_LINEAR_KINDS + k];
                w.codes_t = w.codes + C * OC / 2;
                w.scales = w.codes_t + C * OC / 2;
                w.scales_t = w.scales + llmc::nvfp4_tiled_scale_bytes((int)OC, (int)C / kNvfp4Block);
            }
        }
    }
    r.rht_signs = llmc::nvfp4_rht_signs(ctx.seed ^ 0x52485453494E4753ULL);
    r.sr_seed = llmc::nvfp4_mix64(ctx.seed ^ 0x4E56465034535253ULL);
    r.sr_calls = 0;
}

inline std::string recipe_describe(const Recipe& r) {
    const RecipeOptions& o = r.options;
    int q0 = o.skip_first, q1 = r.L - o.skip_last;
    std::string layers = q1 > q0 ? strfmt("layers %d-%d in NVFP4", q0, q1 - 1) : std::string("no layer in NVFP4");
    const std::string gemms = r.native ? r.native_note : "emulated on BF16 tensor cores (" + r.native_note + ")";
    return strfmt("nvfp4: E2M1 + UE4M3 block scales (1x16, weights 16x16) + FP32 global scale, %s; "
                  "RHT %s, stochastic rounding %s, Four Over Six %s; %s, -sqf %d -sql %d", gemms.c_str(),
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
            nvfp4_quantize_weight(w.weight[k] + (size_t)l * OC * C, OC, C, r.native ? nullptr : nv_weight(r, id),
                                  nv_amax(r, id, NV_W), r.options.fp4_four_over_six, stats, st,
                                  r.native ? r.w_operands[nv_linear_index(id)] : Nvfp4WeightNative());
        }
    }
}

inline void recipe_begin_micro_step(Recipe& r, int slice) { r.sr_slice = slice; r.sr_calls = 0; }
// the scales are current (each tensor's own amax): nothing the processes must combine

// The BF16 input is read again in backward (the wgrad operand is quantized there)

// x -> r.xq (1x16 blocks along C, RNE) and the forward GEMM's alpha; in training also the amax of
// the rotated x, for the wgrad operand of the backward pass
inline void nvfp4_quantize_input(Recipe& r, LinearId id, const floatX* inp, int N, int C, bool training, cudaStream_t st) {
    const bool rht = r.options.fp4_rht;
    nvfp4_amax(inp, N, C, nv_amax(r, id, NV_X), training ? nv_amax(r, id, NV_X_WGRAD) : nullptr, rht, r.rht_signs, st);
    Nvfp4Direction rows;
    rows.out = r.xq;
    rows.codes = r.x_codes;
    rows.scales = r.x_scales;
    rows.amax = nv_amax(r, id, NV_X);
    rows.alpha = nv_alpha(r, id, NV_FORWARD);
    rows.other_amax = nv_amax(r, id, NV_W);
    rows.stats = training && r.count_stats ? nv_stats(r, id, NV_X) : nullptr;
    nvfp4_quantize(inp, N, C, rows, Nvfp4Direction(), r.options.fp4_four_over_six, r.rht_signs, st);
}

// A native GEMM that cuBLASLt refused at run time although it offered algorithms for it when the
// recipe started: the emulation's operands were never made, so there is no way on.
inline void nvfp4_native_gemm(bool launched, const char* what) {
    if (launched) return;
    fprintf(stderr, "error: nvfp4: cuBLASLt refused the native FP4 %s GEMM at run time; run with LLMC_NVFP4_EMULATE=1 "
            "to emulate the FP4 GEMMs on BF16 tensor cores\n", what);
    exit(1);
}
inline Fp4Operand nv_weight_operand(const Recipe& r, LinearId id, bool transposed) {
    const Nvfp4WeightNative& w = r.w_operands[nv_linear_index(id)];
    return transposed ? Fp4Operand{w.codes_t, w.scales_t} : Fp4Operand{w.codes, w.scales};
}

// The forward GEMM out = alpha x_q W_q^T (+ bias) (the emulated or the native one), and its epilogue
inline void nvfp4_forward_gemm(Recipe& r, LinearId id, floatX* out, const floatX* bias, int N, int C, int OC,
                               cudaStream_t st, MatmulEpilogue epilogue = EPI_NONE, void* aux = nullptr) {
    PHASE("nvfp4: gemm forward");
    if (r.native) {
        nvfp4_native_gemm(matmul_fp4(out, false, nv_weight_operand(r, id, false), Fp4Operand{r.x_codes, r.x_scales}, bias,
                                     OC, N, C, nv_alpha(r, id, NV_FORWARD), false, st, epilogue, aux), "forward");
        return;
    }
    matmul_alpha_on_device(out, nv_weight(r, id), r.xq, bias, OC, N, C, true, false, nv_alpha(r, id, NV_FORWARD),
                           false, false, st, epilogue, aux);
}

// the layers kept in BF16 and the shapes the kernels cannot take run the plain linear (nvfp4_applies)
inline bool recipe_quantizes(const Recipe& r, LinearId id, int N, int C, int OC, LinearPass) { return nvfp4_applies(r, id, N, C, OC); }

inline void recipe_linear_forward(Recipe& r, LinearId id, floatX* out, const floatX* inp, const floatX*,
                                  const floatX* bias, int N, int C, int OC, bool training, cudaStream_t st) {
    PHASE("nvfp4: quantize x");
    nvfp4_quantize_input(r, id, inp, N, C, training, st);
    nvfp4_forward_gemm(r, id, out, bias, N, C, OC, st);
}

inline void recipe_linear_forward_gelu(Recipe& r, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                       const floatX*, const floatX* bias, int N, int C, int OC, bool training,
                                       cudaStream_t st) {
    PHASE("nvfp4: quantize x");
    nvfp4_quantize_input(r, id, inp, N, C, training, st);
    nvfp4_forward_gemm(r, id, gelu_out, bias, N, C, OC, st, EPI_GELU_BIAS, pre_gelu);
}

inline void recipe_linear_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                   const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC,
                                   cudaStream_t st) {
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
    rows.codes = r.dy_codes;
    rows.scales = r.dy_scales;
    rows.amax = nv_amax(r, id, NV_DY);
    rows.stochastic = o.fp4_stochastic;
    rows.seed = llmc::nvfp4_mix64(r.sr_seed ^ (2 * call));
    rows.alpha = nv_alpha(r, id, NV_DGRAD);
    rows.other_amax = nv_amax(r, id, NV_W);
    rows.stats = r.count_stats ? nv_stats(r, id, NV_DY) : nullptr;
    cols.out = r.dyq_wgrad;
    cols.codes = r.dyt_codes;
    cols.scales = r.dyt_scales;
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
    xcols.codes = r.x_codes;
    xcols.scales = r.x_scales;
    xcols.amax = nv_amax(r, id, NV_X_WGRAD);
    xcols.rht = o.fp4_rht;
    xcols.stats = r.count_stats ? nv_stats(r, id, NV_X_WGRAD) : nullptr;
    nvfp4_quantize(inp, N, C, Nvfp4Direction(), xcols, o.fp4_four_over_six, r.rht_signs, st);
    PHASE("nvfp4: gemm wgrad");
    // dW (OC x C) += alpha * dy_q^T x_q: the rotation Q^T Q = I cancels along N
    if (r.native) {
        // the TN forms: A = x^T (C x N), B = dy^T (OC x N); A = W^T (C x OC), B = dy (N x OC)
        nvfp4_native_gemm(matmul_fp4(dweight, true, Fp4Operand{r.x_codes, r.x_scales}, Fp4Operand{r.dyt_codes, r.dyt_scales},
                                     nullptr, C, OC, N, nv_alpha(r, id, NV_WGRAD), true, st), "wgrad");
        PHASE("nvfp4: gemm dgrad");
        nvfp4_native_gemm(matmul_fp4(dinp, false, nv_weight_operand(r, id, true), Fp4Operand{r.dy_codes, r.dy_scales},
                                     nullptr, C, N, OC, nv_alpha(r, id, NV_DGRAD), false, st,
                                     pre_gelu ? EPI_DGELU : EPI_NONE, (void*)pre_gelu), "dgrad");
        return;
    }
    // the product with alpha = 1 from the host, then dW += alpha * product (nvfp4_scaled_accumulate says why)
    matmul(r.wgrad_product, r.xq, r.dyq_wgrad, nullptr, C, OC, N, false, true, 1.0f, 0.0f, true, st);
    nvfp4_scaled_accumulate(dweight, r.wgrad_product, nv_alpha(r, id, NV_WGRAD), (long long)C * OC, st);
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
