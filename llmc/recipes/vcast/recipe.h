// recipes/vcast/recipe.h: the virtual-cast recipe (TensorCast): any datatype that
// llmc/formats/vcast.h parses (MXFP8/6/4, MXINT, BFP, minifloats eXmY[bZ][fn|fnuz], intK/uintK with float or
// exponent scales, tiles, zero points) becomes the training format of the transformer linears,
// one datatype per role:
//   -qw  weights        (default mxfp8e4)     -qr   rounding of weights and activations (even)
//   -qa  activations    (default mxfp8e4)     -qgr  rounding of the gradients (even)
//   -qg  gradients      (default mxfp8e5)     -qs   scale selection max | midmax (max)
//                                             -qsp  M:N sparsity of the weights ("" = off)
// Every operand is cast virtually (quantized, then dequantized: recipes/vcast/vcast_kernels.cuh) and the GEMMs
// run on BF16 tensor cores. Tiles run along each GEMM's K dimension, as the MX formats specify (a
// tile dimension written in the spec, tXdY, is not used: the GEMM decides it):
//   forward  y  = x W^T     x: along C (its rows)      W: along C (its rows)
//   dgrad    dx = dy W      dy: along OC (its rows)    W: along OC (its columns)
//   wgrad    dW += dy^T x   dy and x: along N (their columns)
// A datatype without tiles (a tensor scale, or none) casts alike in both directions, once.
// The bias gradient is summed from the BF16 output gradient; embeddings, LM head, attention and
// norms stay BF16, and so do the layers -sqf / -sql keep (default none).
//
// Stochastic rounding draws counter-based bits (vcast_random_bits) from a seed per cast: -sd mixed
// with (optimizer step, the micro-step's data slice, cast number in the micro-step) for activations
// and gradients, so that a resumed or data-parallel run draws the same bits for the same data, and
// with the optimizer step count (kept by the checkpoint) for the weights. Evaluation uses a fixed
// seed and leaves the counters alone.
//
// Telemetry (-lq N): every N steps one main.log line per cast tensor: amax, the relative error
// sqrt(sum (x' - x)^2 / sum x^2) and the fraction of non-zero values cast to zero, over the step.
#pragma once
#include <cmath>
#include <vector>
#include "llmc/recipe_api.h"
#include "options.h"
#include "llmc/rand.h"
#include "vcast_kernels.cuh"
#include "llmc/profiler.h"

#define RECIPE_NAME "vcast"
using RecipeOptions = VcastRecipeOptions; // its flags (options.h)
using RecipeBoundaries = IdentityBoundaries; // no boundaries outside the linears (boundaries.h)

#if defined(ENABLE_FP32)
#error "the vcast recipe is a BF16 build (PRECISION=FP32 is the BF16 recipe's reference build)"
#endif

enum VcastRole { VC_W = 0, VC_A = 1, VC_G = 2, NUM_VC_ROLES = 3 };
// the cast tensors of one linear, for telemetry
enum VcastTensor { VT_W = 0, VT_W_DGRAD, VT_X, VT_X_WGRAD, VT_DY, VT_DY_WGRAD, NUM_VT = 6 };
static const char* VT_NAMES[NUM_VT] = {"w", "w_dgrad", "x", "x_wgrad", "dy", "dy_wgrad"};

struct Recipe {
    RecipeOptions options;
    LinearScratch scratch;
    int L = 0, C = 0, B = 0, T = 0;
    int num_linears = 0;
    vc::DataType dt[NUM_VC_ROLES];
    vc::VcastOptions vo[NUM_VC_ROLES];
    // cast weights per quantized linear: along rows (forward) and along columns (dgrad; the same
    // buffer when the weights' datatype has no tiles)
    floatX* weights_rows = nullptr;
    floatX* weights_cols = nullptr;
    std::vector<size_t> weight_offset;
    // scratch, N x 4C each: x (forward, then wgrad), dy (dgrad), dy (wgrad)
    floatX *xq = nullptr, *dyq = nullptr, *dyq_cols = nullptr;
    VcastTensorStats* tensor_stats = nullptr;
    double* stats = nullptr;            // per linear and tensor: VCAST_STATS sums
    uint64_t seed = 0;
    int step = 0, slice = 0;            // the activation and gradient casts' random streams: the step,
    long long casts = 0;                // the micro-step's data slice and the casts so far in it
    long long weight_version = 0;       // optimizer steps so far (the weights' random streams' counter)
    bool count_stats = false;
};

inline int vc_linear_index(LinearId id) { return id.layer * NUM_LINEAR_KINDS + id.kind; }
inline double* vc_stats(const Recipe& r, LinearId id, VcastTensor t) {
    return r.stats + ((size_t)vc_linear_index(id) * NUM_VT + t) * VCAST_STATS;
}
inline floatX* vc_weight_rows(const Recipe& r, LinearId id) { return r.weights_rows + r.weight_offset[vc_linear_index(id)]; }
inline floatX* vc_weight_cols(const Recipe& r, LinearId id) { return r.weights_cols + r.weight_offset[vc_linear_index(id)]; }

// 64 bits from the counter-based hash: the seed of cast number `counter`
inline uint64_t vc_mix_seed(uint64_t seed, uint64_t counter) {
    return ((uint64_t)vc::vcast_random_bits(seed, 2 * counter) << 32) | vc::vcast_random_bits(seed, 2 * counter + 1);
}
// the seed of the next cast: a fresh one per training cast, from (step, data slice, cast number in
// the micro-step), below 2^61 so that it never meets the fixed one of evaluation
inline uint64_t vc_next_seed(Recipe& r, bool training) {
    if (!training) return vc_mix_seed(r.seed, ~0ULL >> 2);
    const uint64_t counter = llmc::mix64(llmc::mix64((uint64_t)(uint32_t)r.step, (uint64_t)(uint32_t)r.slice), (uint64_t)r.casts++);
    return vc_mix_seed(r.seed, counter >> 3);
}

// every cast of this linear fits its shape (tiles divide the lines); otherwise the plain linear
inline bool vcast_applies(const Recipe& r, LinearId id, int N, int C, int OC) {
    if (!layer_is_quantized(r.options, id.layer, r.L)) return false;
    const vc::DataType &w = r.dt[VC_W], &a = r.dt[VC_A], &g = r.dt[VC_G];
    return vcast_shape_ok(w, r.vo[VC_W], OC, C, false) && vcast_shape_ok(w, r.vo[VC_W], OC, C, true) &&
           vcast_shape_ok(a, r.vo[VC_A], N, C, false) && vcast_shape_ok(a, r.vo[VC_A], N, C, true) &&
           vcast_shape_ok(g, r.vo[VC_G], N, OC, false) && vcast_shape_ok(g, r.vo[VC_G], N, OC, true);
}

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int B, int T,
                        const RecipeContext& ctx = RecipeContext()) {
    r.options = o;
    resolve_skip_defaults(r.options, 0, 0);
    r.L = shape.num_layers; r.C = shape.channels; r.B = B; r.T = T;
    r.num_linears = r.L * NUM_LINEAR_KINDS;
    linear_scratch_init(r.scratch, r.C);
    r.dt[VC_W] = vc::parse_datatype(o.vcast_weights);
    r.dt[VC_A] = vc::parse_datatype(o.vcast_activations);
    r.dt[VC_G] = vc::parse_datatype(o.vcast_gradients);
    for (int k = 0; k < NUM_VC_ROLES; k++) {
        r.vo[k].round = vc::parse_round_mode(k == VC_G ? o.vcast_grad_round : o.vcast_round);
        r.vo[k].scale = vc::parse_scale_mode(o.vcast_scale_mode);
    }
    vc::parse_sparsity(o.vcast_sparsity, &r.vo[VC_W].sparse_m, &r.vo[VC_W].sparse_n);
    vc::check_options(r.dt[VC_W], r.vo[VC_W]);
    r.weight_offset.assign(r.num_linears, 0);
    size_t total = 0;
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            r.weight_offset[l * NUM_LINEAR_KINDS + k] = total;
            total += (size_t)linear_in_features((LinearKind)k, r.C) * linear_out_features((LinearKind)k, r.C);
        }
    }
    if (total) {
        r.weights_rows = (floatX*)cuda_malloc_or_die(total * sizeof(floatX), "vcast weights");
        r.weights_cols = vcast_is_tiled(r.dt[VC_W]) ? (floatX*)cuda_malloc_or_die(total * sizeof(floatX), "vcast weights")
                                                    : r.weights_rows;
    }
    const size_t widest = (size_t)B * T * 4 * r.C;
    r.xq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "vcast activations");
    r.dyq = (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "vcast gradients");
    r.dyq_cols = vcast_is_tiled(r.dt[VC_G]) ? (floatX*)cuda_malloc_or_die(widest * sizeof(floatX), "vcast gradients") : r.dyq;
    r.tensor_stats = (VcastTensorStats*)cuda_malloc_or_die(sizeof(VcastTensorStats), "vcast statistics");
    const size_t ns = (size_t)r.num_linears * NUM_VT * VCAST_STATS;
    r.stats = (double*)cuda_malloc_or_die(ns * sizeof(double), "vcast telemetry");
    cudaCheck(cudaMemset(r.stats, 0, ns * sizeof(double)));
    r.seed = vc_mix_seed(ctx.seed, 0x5643415354ULL);
    r.casts = 0;
}

inline std::string recipe_describe(const Recipe& r) {
    const RecipeOptions& o = r.options;
    int q0 = o.skip_first, q1 = r.L - o.skip_last;
    std::string layers = q1 > q0 ? strfmt("layers %d-%d cast", q0, q1 - 1) : std::string("no layer cast");
    return strfmt("vcast: weights %s, activations %s, gradients %s (virtual casts, BF16 GEMMs); rounding %s, gradients "
                  "%s, scales %s%s; %s, -sqf %d -sql %d",
                  vc::describe(r.dt[VC_W]).c_str(), vc::describe(r.dt[VC_A]).c_str(), vc::describe(r.dt[VC_G]).c_str(),
                  o.vcast_round.c_str(), o.vcast_grad_round.c_str(), o.vcast_scale_mode.c_str(),
                  o.vcast_sparsity.empty() ? "" : (", weight sparsity " + o.vcast_sparsity).c_str(), layers.c_str(),
                  o.skip_first, o.skip_last);
}

inline void recipe_weights_changed(Recipe& r, const LinearWeights& w, cudaStream_t st) {
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            LinearId id{l, (LinearKind)k};
            const int C = linear_in_features(id.kind, r.C), OC = linear_out_features(id.kind, r.C);
            if (!vcast_applies(r, id, r.B * r.T, C, OC)) continue;
            const floatX* W = w.weight[k] + (size_t)l * OC * C;
            // a function of the weights' version, not of how often this is called (a resumed run
            // casts its loaded weights once more, and must draw the same bits)
            const uint64_t seed = vc_mix_seed(r.seed ^ 0x57454947ULL,
                                              (uint64_t)r.weight_version * r.num_linears + l * NUM_LINEAR_KINDS + k);
            vcast_tensor_both(vc_weight_rows(r, id), vc_weight_cols(r, id), W, OC, C, r.dt[VC_W], r.vo[VC_W], seed,
                              r.tensor_stats, nullptr, nullptr, 0, st);
            // the weights' telemetry describes the weights now in use (always measured: once per step)
            for (VcastTensor t : {VT_W, VT_W_DGRAD}) {
                double* s = vc_stats(r, id, t);
                cudaCheck(cudaMemsetAsync(s, 0, VCAST_STATS * sizeof(double), st));
                vcast_error(s, W, t == VT_W ? vc_weight_rows(r, id) : vc_weight_cols(r, id), (long long)OC * C, st);
            }
        }
    }
}

inline void recipe_step_end(Recipe& r, cudaStream_t) { r.weight_version++; }
inline void recipe_begin_micro_step(Recipe& r, int slice) { r.slice = slice; r.casts = 0; }
// the scales are the casts' own (no delayed state): nothing the processes must combine

inline void vc_cast_input(Recipe& r, LinearId id, const floatX* inp, int N, int C, bool training, cudaStream_t st) {
    vcast_tensor(r.xq, inp, N, C, false, r.dt[VC_A], r.vo[VC_A], vc_next_seed(r, training), r.tensor_stats, st);
    if (training && r.count_stats) vcast_error(vc_stats(r, id, VT_X), inp, r.xq, (long long)N * C, st);
}

// the layers kept in BF16 and the shapes the casts cannot take run the plain linear (vcast_applies)
inline bool recipe_quantizes(const Recipe& r, LinearId id, int N, int C, int OC, LinearPass) { return vcast_applies(r, id, N, C, OC); }

inline void recipe_linear_forward(Recipe& r, LinearId id, floatX* out, const floatX* inp, const floatX*,
                                  const floatX* bias, int N, int C, int OC, bool training, cudaStream_t st) {
    PHASE("vcast: cast x");
    vc_cast_input(r, id, inp, N, C, training, st);
    PHASE("vcast: gemm forward");
    plain_linear_forward(out, r.xq, vc_weight_rows(r, id), bias, N, C, OC, st);
}

inline void recipe_linear_forward_gelu(Recipe& r, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                       const floatX*, const floatX* bias, int N, int C, int OC, bool training,
                                       cudaStream_t st) {
    PHASE("vcast: cast x");
    vc_cast_input(r, id, inp, N, C, training, st);
    PHASE("vcast: gemm forward");
    plain_linear_forward_gelu(gelu_out, pre_gelu, r.xq, vc_weight_rows(r, id), bias, N, C, OC, st);
}

inline void recipe_linear_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                   const floatX* inp, const floatX*, const floatX* pre_gelu, int N, int C, int OC,
                                   cudaStream_t st) {
    PHASE("vcast: cast dy (+ bias grad)");
    const vc::DataType &a = r.dt[VC_A], &g = r.dt[VC_G];
    const uint64_t seed_dy = vc_next_seed(r, true);
    // both directions of dy (one read where the MX kernel applies) and dbias from the same read
    vcast_tensor_both(r.dyq, r.dyq_cols, dout, N, OC, g, r.vo[VC_G], seed_dy, r.tensor_stats, dbias,
                      r.scratch.bias_partials, (long long)BIAS_ROW_GROUPS * 4 * r.C, st);
    PHASE("vcast: cast x (wgrad)");
    // x along N (a datatype without tiles: the forward's cast again, with a fresh seed)
    vcast_tensor(r.xq, inp, N, C, vcast_is_tiled(a), a, r.vo[VC_A], vc_next_seed(r, true), r.tensor_stats, st);
    if (r.count_stats) {
        vcast_error(vc_stats(r, id, VT_DY), dout, r.dyq, (long long)N * OC, st);
        vcast_error(vc_stats(r, id, VT_DY_WGRAD), dout, r.dyq_cols, (long long)N * OC, st);
        vcast_error(vc_stats(r, id, VT_X_WGRAD), inp, r.xq, (long long)N * C, st);
    }
    PHASE("vcast: gemm wgrad");
    plain_linear_backward_dw(dweight, r.dyq_cols, r.xq, N, C, OC, st);
    PHASE("vcast: gemm dgrad");
    plain_linear_backward_dx(dinp, r.dyq, vc_weight_cols(r, id), pre_gelu, N, C, OC, st);
}

// ---- checkpoint state -----------------------------------------------------------------------------
// The datatypes and options (a resume must cast alike) and the random streams' counter.
inline std::string vc_settings(const RecipeOptions& o) {
    return strfmt("-qw %s -qa %s -qg %s -qr %s -qgr %s -qs %s -qsp '%s' -sqf %d -sql %d", o.vcast_weights.c_str(),
                  o.vcast_activations.c_str(), o.vcast_gradients.c_str(), o.vcast_round.c_str(),
                  o.vcast_grad_round.c_str(), o.vcast_scale_mode.c_str(), o.vcast_sparsity.c_str(), o.skip_first,
                  o.skip_last);
}

inline void recipe_save(const Recipe& r, StateWriter& w) {
    const std::string s = vc_settings(r.options);
    // (counters[0] is unused: the activation casts are seeded from the step)
    int64_t counters[2] = {0, r.weight_version}, len = (int64_t)s.size();
    w.add_copy("vcast_settings_len", &len, sizeof(len));
    w.add_copy("vcast_settings", s.data(), s.size());
    w.add_copy("vcast_counters", counters, sizeof(counters));
}

inline void recipe_load(Recipe& r, StateReader& rd) {
    int64_t len = 0;
    rd.read("vcast_settings_len", &len, sizeof(len));
    if (len < 0 || len > 4096) input_error("the checkpoint's vcast settings are corrupt (length %lld)", (long long)len);
    std::string s((size_t)len, '\0');
    rd.read("vcast_settings", &s[0], (size_t)len);
    const std::string mine = vc_settings(r.options);
    if (s != mine)
        input_error("the checkpoint was written with %s, this run has %s; resume with the checkpoint's settings",
                    s.c_str(), mine.c_str());
    int64_t counters[2];
    rd.read("vcast_counters", counters, sizeof(counters));
    r.weight_version = counters[1];
}

// ---- telemetry ----------------------------------------------------------------------------------
inline bool recipe_begin_step(Recipe& r, int step) {
    r.step = step;
    r.slice = 0;
    r.casts = 0;
    r.count_stats = r.options.telemetry_every > 0 && step % r.options.telemetry_every == 0;
    if (r.count_stats) {
        // the activations' and gradients' sums start afresh (the weights' are reset with the weights)
        std::vector<double> zero((size_t)(NUM_VT - VT_X) * VCAST_STATS, 0.0);
        cudaCheck(cudaDeviceSynchronize());
        for (int i = 0; i < r.num_linears; i++)
            cudaCheck(cudaMemcpy(r.stats + ((size_t)i * NUM_VT + VT_X) * VCAST_STATS, zero.data(),
                                 zero.size() * sizeof(double), cudaMemcpyHostToDevice));
    }
    return r.count_stats;
}

// One line per cast tensor:  s:STEP lq:l3.fc.dy err:... ftz:...
inline void recipe_log_telemetry(Recipe& r, FILE* log, int step) {
    std::vector<double> stats((size_t)r.num_linears * NUM_VT * VCAST_STATS);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(stats.data(), r.stats, stats.size() * sizeof(double), cudaMemcpyDeviceToHost));
    for (int t = 0; t < NUM_VT; t++) {
        for (int l = 0; l < r.L; l++) {
            if (!layer_is_quantized(r.options, l, r.L)) continue;
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                const double* s = &stats[((size_t)(l * NUM_LINEAR_KINDS + k) * NUM_VT + t) * VCAST_STATS];
                const double err = s[1] > 0 ? std::sqrt(s[0] / s[1]) : 0.0, n = s[2] > 0 ? s[2] : 1.0;
                fprintf(log, "s:%d lq:l%d.%s.%s err:%.6e ftz:%.6e\n", step, l, LINEAR_NAMES[k], VT_NAMES[t], err, s[3] / n);
            }
        }
    }
    fflush(log);
}
