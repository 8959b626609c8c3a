// gelu.cuh: GELU with the tanh approximation (as GPT-2), forward and backward.
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
#pragma once
#include "cuda_common.h"
#include "boundaries.h"
#include "formats/fp8_scaling.h" // llmc::amax_bits

#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
// sqrt(2/pi) 0.044715 and 3 sqrt(2/pi) 0.044715, rounded to float
#define GELU_K_C 0.035677408136300125f
#define GELU_3K_C 0.10703222440890037f

// Evaluation order, chosen for few instructions (the FP8 recipe's fused GEMM epilogues run these per value):
//   u = x (k + k c x^2)                      one FMUL for x^2, one FFMA, one FMUL
//   gelu  = h + h tanh(u),  h = x / 2         MUFU.TANH, one FMUL, one FFMA
//   gelu' = (1 + t) / 2 + x (k + 3 k c x^2) / 2 (1 - t^2),  t = tanh(u)
// Every kernel that applies GELU calls these, so fused and separate passes agree bit for bit. One body:
// gelu_value and gelu_derivative are gelu_value_and_derivative with the other result unused (dead code the
// compiler drops), so the three agree by construction; the fused fc forward takes both from one tanh and stores
// the derivative for the backward (the FP8 recipe, recipes/fp8/fp8_gemm.cuh).
__device__ __forceinline__ float gelu_value_and_derivative(float x, float& derivative) {
    const float x2 = x * x;
    const float u = x * fmaf(x2, GELU_K_C, GELU_SQRT_2_OVER_PI);
    const float t = tanhf(u);
    // du/dx / 2 with the halves folded into the constants: bit for bit (x / 2) (du/dx), one multiply fewer
    const float half_du = fmaf(x2, 0.5f * GELU_3K_C, 0.5f * GELU_SQRT_2_OVER_PI);
    const float half_one_plus_t = fmaf(0.5f, t, 0.5f);
    const float one_minus_t2 = fmaf(-t, t, 1.0f);
    derivative = fmaf(x * half_du, one_minus_t2, half_one_plus_t);
    const float h = 0.5f * x;
    return fmaf(h, t, h);
}
__device__ __forceinline__ float gelu_value(float x) {
    float unused;
    return gelu_value_and_derivative(x, unused);
}
__device__ __forceinline__ float gelu_derivative(float x) {
    float derivative;
    gelu_value_and_derivative(x, derivative);
    return derivative;
}

// The factor that takes a gradient w.r.t. the GELU's output to one w.r.t. its input, from `src`:
//   EXACT:   gelu'(src), src the pre-activation (the BF16 recipe, cuBLASLt's DGELU alike)
//   ROUNDED: gelu'(src) rounded to floatX, src the pre-activation (the FP8 recipe)
//   GIVEN:   src itself, which holds that rounded derivative (the FP8 recipe's fused fc forward stores it in
//            place of the pre-activation: the backward then multiplies instead of evaluating gelu')
// ROUNDED and GIVEN give the same factor, so the FP8 recipe's paths agree bit for bit whichever the forward took.
enum class GeluFactor { EXACT, ROUNDED, GIVEN };
template <GeluFactor F>
__device__ __forceinline__ float gelu_backward_factor(float src) {
    if constexpr (F == GeluFactor::GIVEN) return src;
    else if constexpr (F == GeluFactor::ROUNDED) return (float)(floatX)gelu_derivative(src);
    else return gelu_derivative(src);
}

// the same with the kind known only at run time (uniform across a kernel), as selects rather than branches: a
// branch per kind made the quantize pass that uses it (fp8_quantize_transpose_kernel) compile each unrolled
// loop three times over (4,176 -> 7,680 instructions). GIVEN evaluates gelu' for nothing, but only the FP8
// recipe's unfused dy pass after a fused forward takes it, which a training step does not combine.
__device__ __forceinline__ float gelu_backward_factor(GeluFactor f, float src) {
    const float d = gelu_derivative(src);
    const float factor = f == GeluFactor::EXACT ? d : (float)(floatX)d;
    return f == GeluFactor::GIVEN ? src : factor;
}

// the forward through the boundary hooks (boundaries.h): read through gelu_input, store through gelu_output
template <class Bd>
__device__ __forceinline__ float gelu_forward_value(float x) {
    return Bd::gelu_output(gelu_value(Bd::gelu_input(x)));
}

template <class Bd>
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (floatX)gelu_forward_value<Bd>((float)inp[i]);
}
// dinout: gradient w.r.t. the GELU output in, w.r.t. its input out (in place); src: see GeluFactor
template <GeluFactor F>
__global__ void gelu_backward_kernel(floatX* dinout, const floatX* src, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dinout[i] = (floatX)((float)dinout[i] * gelu_backward_factor<F>((float)src[i]));
}

// 16 bytes per thread (8 BF16 or 4 FP32 values): the form used when n and the pointers allow it
template <class Bd>
__global__ void gelu_forward_vec_kernel(floatX* out, const floatX* inp, long long n_vec) {
    constexpr int PER = 16 / sizeof(floatX);
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vec) return;
    uint4 packed = reinterpret_cast<const uint4*>(inp)[i];
    floatX* v = reinterpret_cast<floatX*>(&packed);
#pragma unroll
    for (int j = 0; j < PER; j++) v[j] = (floatX)gelu_forward_value<Bd>((float)v[j]);
    reinterpret_cast<uint4*>(out)[i] = packed;
}

template <class Bd = IdentityBoundaries>
inline void gelu_forward(floatX* out, const floatX* inp, long long n, cudaStream_t stream) {
    constexpr int PER = 16 / sizeof(floatX);
    if (n % PER == 0 && ((uintptr_t)out % 16) == 0 && ((uintptr_t)inp % 16) == 0) {
        gelu_forward_vec_kernel<Bd><<<ceil_div(n / PER, 256), 256, 0, stream>>>(out, inp, n / PER);
    } else {
        gelu_forward_kernel<Bd><<<ceil_div(n, 256), 256, 0, stream>>>(out, inp, n);
    }
    cudaCheckLaunch();
}
template <GeluFactor F>
__global__ void gelu_backward_vec_kernel(floatX* dinout, const floatX* src, long long n_vec) {
    constexpr int PER = 16 / sizeof(floatX);
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vec) return;
    uint4 d = reinterpret_cast<const uint4*>(dinout)[i];
    uint4 x = reinterpret_cast<const uint4*>(src)[i];
    floatX* dv = reinterpret_cast<floatX*>(&d);
    const floatX* xv = reinterpret_cast<const floatX*>(&x);
#pragma unroll
    for (int j = 0; j < PER; j++) dv[j] = (floatX)((float)dv[j] * gelu_backward_factor<F>((float)xv[j]));
    reinterpret_cast<uint4*>(dinout)[i] = d;
}

template <GeluFactor F>
inline void gelu_backward_launch(floatX* dinout, const floatX* src, long long n, cudaStream_t stream) {
    constexpr int PER = 16 / sizeof(floatX);
    if (n % PER == 0 && ((uintptr_t)dinout % 16) == 0 && ((uintptr_t)src % 16) == 0) {
        gelu_backward_vec_kernel<F><<<ceil_div(n / PER, 256), 256, 0, stream>>>(dinout, src, n / PER);
    } else {
        gelu_backward_kernel<F><<<ceil_div(n, 256), 256, 0, stream>>>(dinout, src, n);
    }
    cudaCheckLaunch();
}

// The same product, recording the amax of what it stores as well: max |dinout| over the values after their
// rounding to floatX, as the bits of a non-negative float (llmc::amax_bits) combined into *amax_out with
// atomicMax (the caller zeroes it first), the value a tensor_amax pass over the stored result would find.
// For the FP8 recipe's current scaling, whose next quantize pass needs that amax before it can scale the
// tensor: recording it here saves that pass its own read of the tensor. Each block strides over the tensor
// (gelu_backward_amax_grid), reduces its maximum through its warps, and makes one atomic (block_max_atomic).
template <GeluFactor F>
__global__ void gelu_backward_amax_kernel(floatX* dinout, const floatX* src, long long n, uint32_t* amax_out) {
    uint32_t amax = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const floatX d = (floatX)((float)dinout[i] * gelu_backward_factor<F>((float)src[i]));
        dinout[i] = d;
        amax = max(amax, llmc::amax_bits((float)d));
    }
    block_max_atomic(amax, amax_out);
}
template <GeluFactor F>
__global__ void gelu_backward_amax_vec_kernel(floatX* dinout, const floatX* src, long long n_vec, uint32_t* amax_out) {
    constexpr int PER = 16 / sizeof(floatX);
    uint32_t amax = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += (long long)gridDim.x * blockDim.x) {
        uint4 d = reinterpret_cast<const uint4*>(dinout)[i];
        uint4 x = reinterpret_cast<const uint4*>(src)[i];
        floatX* dv = reinterpret_cast<floatX*>(&d);
        const floatX* xv = reinterpret_cast<const floatX*>(&x);
#pragma unroll
        for (int j = 0; j < PER; j++) {
            dv[j] = (floatX)((float)dv[j] * gelu_backward_factor<F>((float)xv[j]));
            amax = max(amax, llmc::amax_bits((float)dv[j]));
        }
        reinterpret_cast<uint4*>(dinout)[i] = d;
    }
    block_max_atomic(amax, amax_out);
}
// enough blocks to fill the GPU (8 per SM: 2048 threads an SM, each block strides over the rest), and so
// few that their atomics on the one address stay rare
inline int gelu_backward_amax_grid(long long work) {
    const long long blocks = (work + 255) / 256, cap = 8LL * device_sm_count();
    return (int)(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}
template <GeluFactor F>
inline void gelu_backward_amax_launch(floatX* dinout, const floatX* src, long long n, uint32_t* amax_out, cudaStream_t stream) {
    constexpr int PER = 16 / sizeof(floatX);
    if (n % PER == 0 && ((uintptr_t)dinout % 16) == 0 && ((uintptr_t)src % 16) == 0) {
        gelu_backward_amax_vec_kernel<F><<<gelu_backward_amax_grid(n / PER), 256, 0, stream>>>(dinout, src, n / PER, amax_out);
    } else {
        gelu_backward_amax_kernel<F><<<gelu_backward_amax_grid(n), 256, 0, stream>>>(dinout, src, n, amax_out);
    }
    cudaCheckLaunch();
}

// dinout *= the GELU factor of src (GeluFactor; EXACT: src is the pre-activation, gelu' in FP32); with amax_out,
// also max |result| into *amax_out (gelu_backward_amax_kernel; the products are the same either way)
inline void gelu_backward(floatX* dinout, const floatX* src, long long n, cudaStream_t stream,
                          GeluFactor factor = GeluFactor::EXACT, uint32_t* amax_out = nullptr) {
    if (amax_out) {
        if (factor == GeluFactor::GIVEN) gelu_backward_amax_launch<GeluFactor::GIVEN>(dinout, src, n, amax_out, stream);
        else if (factor == GeluFactor::ROUNDED) gelu_backward_amax_launch<GeluFactor::ROUNDED>(dinout, src, n, amax_out, stream);
        else gelu_backward_amax_launch<GeluFactor::EXACT>(dinout, src, n, amax_out, stream);
        return;
    }
    if (factor == GeluFactor::GIVEN) gelu_backward_launch<GeluFactor::GIVEN>(dinout, src, n, stream);
    else if (factor == GeluFactor::ROUNDED) gelu_backward_launch<GeluFactor::ROUNDED>(dinout, src, n, stream);
    else gelu_backward_launch<GeluFactor::EXACT>(dinout, src, n, stream);
}
