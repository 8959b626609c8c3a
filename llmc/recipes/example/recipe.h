// recipes/example/recipe.h: the smallest recipe that quantizes something, written to be copied.
//
// Weight-only FP8: each transformer linear's weight W is rounded to FP8 (E4M3 by default, -wf e5m2) with one
// per-tensor scale s = FP8_MAX / amax(W), and the forward and the input gradient use the rounded copy
//     Wq = decode(encode(W * s)) / s          (BF16, the same shape as W)
// while the weight gradient dW = dy^T x does not read W at all. The gradient reaches W unchanged as if the
// rounding were the identity (the straight-through estimator), and AdamW updates the FP32 master weights,
// so the rounding never accumulates. Activations, gradients and every GEMM stay BF16: this recipe measures
// what FP8 weight storage alone costs in loss, which is the first question to ask of a weight format.
//
// What it shows of the recipe API (llmc/recipe_api.h):
//   options.h                  its flags, parsed and checked on the CPU before the GPU is touched
//   recipe_init                its state: one BF16 copy of every quantized linear's weight
//   recipe_weights_changed     called after every change of the weights: derive Wq from W
//   recipe_quantizes           which linears it runs itself (the others, and -sqf/-sql layers, run BF16)
//   recipe_linear_*            its forward and backward: the plain linear with Wq in place of W
// Every other hook keeps the API's default (no checkpoint state, no telemetry, nothing per step).
#pragma once
#include <vector>
#include "llmc/recipe_api.h"
#include "llmc/formats/fp8_quantize.cuh" // tensor_amax
#include "llmc/formats/number_formats.h"
#include "options.h"

#define RECIPE_NAME "example"
using RecipeOptions = ExampleOptions;
using RecipeBoundaries = IdentityBoundaries; // nothing outside the linears changes

struct Recipe {
    RecipeOptions options;
    LinearScratch scratch;            // the plain linear's backward scratch (recipe_api.h)
    int L = 0, C = 0;
    bool e5m2 = false;
    floatX* rounded = nullptr;        // Wq of every quantized linear, at weight_offset[layer * 4 + kind]
    std::vector<size_t> weight_offset;
    uint32_t* amax = nullptr;         // one amax per linear, as the bits of a non-negative float
};

// Wq = decode(encode(W * s)) / s with s = FP8_MAX / amax (rounded to nearest even, saturating). A zero or
// non-finite amax keeps Wq = W: there is no scale that says anything about such a tensor.
template <bool E5M2>
__global__ void example_round_weights_kernel(floatX* out, const floatX* w, long long n, const uint32_t* amax_bits) {
    const float amax = llmc::bits_float(*amax_bits);
    const float fp8_max = E5M2 ? llmc::FP8_E5M2_MAX : llmc::FP8_E4M3_MAX;
    const bool scaled = amax > 0.0f && amax <= 3.4028235e38f;
    const float s = scaled ? llmc::rn_div(fp8_max, amax) : 1.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float x = (float)w[i];
        if (!scaled) { out[i] = w[i]; continue; }
        const float q = E5M2 ? llmc::fp8e5m2_decode(llmc::fp8e5m2_encode(x * s, llmc::Overflow::Saturate))
                             : llmc::fp8e4m3_decode(llmc::fp8e4m3_encode(x * s, llmc::Overflow::Saturate));
        out[i] = (floatX)llmc::rn_div(q, s);
    }
}

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int, int, const RecipeContext&) {
    r.options = o;
    resolve_skip_defaults(r.options, 0, 0);
    r.L = shape.num_layers;
    r.C = shape.channels;
    r.e5m2 = o.weight_format == "e5m2";
    linear_scratch_init(r.scratch, r.C);
    const size_t elements = quantized_linears_layout(r.options, r.L, r.C, r.weight_offset,
                                                     [](int K, int OC) { return (size_t)K * OC; });
    r.rounded = (floatX*)cuda_malloc_or_die(std::max<size_t>(elements, 1) * sizeof(floatX), "example: rounded weights");
    r.amax = (uint32_t*)cuda_malloc_or_die((size_t)r.L * NUM_LINEAR_KINDS * sizeof(uint32_t), "example: weight amax");
}

inline std::string recipe_describe(const Recipe& r) {
    return strfmt("example: weights rounded to %s (per-tensor scale), BF16 GEMMs; BF16 layers: first %d, last %d",
                  r.e5m2 ? "E5M2" : "E4M3", r.options.skip_first, r.options.skip_last);
}

inline floatX* example_rounded(const Recipe& r, LinearId id) {
    return r.rounded + r.weight_offset[(size_t)id.layer * NUM_LINEAR_KINDS + id.kind];
}

inline void recipe_weights_changed(Recipe& r, const LinearWeights& w, cudaStream_t st) {
    cudaCheck(cudaMemsetAsync(r.amax, 0, (size_t)r.L * NUM_LINEAR_KINDS * sizeof(uint32_t), st));
    for (int l = 0; l < r.L; l++) {
        if (!layer_is_quantized(r.options, l, r.L)) continue;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            const long long n = (long long)linear_in_features((LinearKind)k, r.C) * linear_out_features((LinearKind)k, r.C);
            const floatX* W = w.weight[k] + (size_t)l * n;
            uint32_t* amax = r.amax + l * NUM_LINEAR_KINDS + k;
            tensor_amax(amax, W, n, st);
            floatX* out = example_rounded(r, {l, (LinearKind)k});
            if (r.e5m2) example_round_weights_kernel<true><<<fp8_grid_size(n, 256), 256, 0, st>>>(out, W, n, amax);
            else example_round_weights_kernel<false><<<fp8_grid_size(n, 256), 256, 0, st>>>(out, W, n, amax);
            cudaCheckLaunch();
        }
    }
}

inline bool recipe_quantizes(const Recipe& r, LinearId id, int, int, int, LinearPass) {
    return layer_is_quantized(r.options, id.layer, r.L);
}

inline void recipe_linear_forward(Recipe& r, LinearId id, floatX* out, const floatX* inp, const floatX*, const floatX* bias,
                                  int N, int C, int OC, bool, cudaStream_t st) {
    plain_linear_forward(out, inp, example_rounded(r, id), bias, N, C, OC, st);
}
inline void recipe_linear_forward_gelu(Recipe& r, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                       const floatX*, const floatX* bias, int N, int C, int OC, bool, cudaStream_t st) {
    plain_linear_forward_gelu(gelu_out, pre_gelu, inp, example_rounded(r, id), bias, N, C, OC, st);
}
// dW += dy^T x reads no weight; dx = dy Wq
inline void recipe_linear_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                                   const floatX* inp, const floatX*, const floatX* pre_gelu, int N, int C, int OC,
                                   cudaStream_t st) {
    plain_linear_backward(dweight, dbias, dinp, dout, inp, example_rounded(r, id), pre_gelu, r.scratch, N, C, OC, st);
}
