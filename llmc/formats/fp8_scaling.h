// formats/fp8_scaling.h: per-tensor delayed scaling for FP8 (the FP8-hybrid recipe).
//
// A tensor x is stored in FP8 as q = fp8(x * s) and read back as q * (1/s). Delayed scaling picks s
// from the amax (max |x|) of the same tensor in earlier optimizer steps:
//     s = FP8_MAX / max(amax history) / 2^margin
// with FP8_MAX = 448 (E4M3) or 57344 (E5M2), a history of the last H steps' amaxes (-fh H, default
// 1024) and a margin in powers of two (-fm). Within one optimizer step s is constant, so the forward
// and the backward pass quantize a tensor identically; the amax of the step is the max over its
// micro-steps, recorded by the pass that quantizes the tensor, and pushed into the history when the
// step ends (fp8_history_push). A history with nothing positive and finite in it keeps the previous
// scale (a tensor of zeros says nothing about the next one).
//
// Host and device code (no CUDA headers needed): the GPU's scale update runs exactly this function,
// and the CPU tests check it.
#pragma once
#include <cmath>
#include <cstdint>
#include "number_formats.h"

namespace llmc {

static const float FP8_E4M3_MAX = 448.0f;
static const float FP8_E5M2_MAX = 57344.0f;

// IEEE round-to-nearest reciprocal on host and device alike (rn_div: see formats/number_formats.h)
LLMC_HD inline float fp8_inverse(float s) { return rn_div(1.0f, s); }

// The delayed scale for a history maximum `amax`. Keeps `previous` when amax is zero, negative,
// NaN or infinite, and when the scale itself would not be a finite positive float.
LLMC_HD inline float fp8_delayed_scale(float amax, float fp8_max, int margin, float previous) {
    if (!(amax > 0.0f) || !(amax <= 3.4028235e38f)) return previous; // not positive, or inf/NaN
    float s = rn_div(fp8_max, amax);
    // dividing by 2^margin is exact while s stays a normal float; ldexp-style via repeated halving
    // keeps the code free of libm differences between host and device
    for (int i = 0; i < margin; i++) s *= 0.5f;
    if (!(s > 0.0f) || !(s <= 3.4028235e38f)) return previous;
    return s;
}

// A scale fixed in advance by a bound on the tensor's values (the FP8 LM head's dlogits: |dlogit| <= |dloss|):
// the largest power of two s with bound * s <= fp8_max, so that nothing saturates and 1 / s is exact. 0 where
// the bound is not a positive finite float or s would not be a normal float (then there is no such scale).
LLMC_HD inline float fp8_bound_scale(float bound, float fp8_max) {
    if (!(bound > 0.0f) || !(bound <= 3.4028235e38f)) return 0.0f;
    const float q = rn_div(fp8_max, bound);
    if (!(q >= 1.1754944e-38f) || !(q <= 3.4028235e38f)) return 0.0f; // (s would be subnormal or inf)
    float s = bits_float(float_bits(q) & 0x7F800000u);                 // the power of two at or below q
    if (s * bound > fp8_max) s *= 0.5f; // q rounded up past the true quotient (s * bound is exact: s is 2^k)
    return s >= 1.1754944e-38f ? s : 0.0f;
}

// One tensor's history update at the end of an optimizer step: store this step's amax at slot
// `step % H` of the ring buffer, reset the running amax, and derive the next scale from the max of
// the whole window. `steps` is the number of steps pushed before this one. NaN amaxes are stored
// (telemetry shows them) but ignored by the max.
LLMC_HD inline void fp8_history_push(float* history, int H, long long steps, float* amax_now, float* scale,
                                     float* inv_scale, float fp8_max, int margin) {
    history[steps % H] = *amax_now;
    *amax_now = 0.0f;
    float m = 0.0f;
    for (int i = 0; i < H; i++) {
        float h = history[i];
        if (h > m && h <= 3.4028235e38f) m = h; // skips NaN and inf
    }
    *scale = fp8_delayed_scale(m, fp8_max, margin, *scale);
    *inv_scale = fp8_inverse(*scale);
}

// The running amax is kept as the bits of a non-negative float in a uint32, so that the quantize
// kernels can combine it with atomicMax on unsigned integers: for non-negative floats the integer
// order of the bits is the float order, and NaN's bits (> 0x7F800000) compare above +inf, so a NaN
// in the tensor shows up as a NaN amax.
LLMC_HD inline uint32_t amax_bits(float x) { return float_bits(x) & 0x7FFFFFFFu; }

} // namespace llmc
