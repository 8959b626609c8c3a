// cuda_common.h: the precision of the build, error checking, device allocation, and the small
// device helpers (warp reductions, hashing, stochastic rounding) every kernel header uses.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include "common.h"

// ---------------------------------------------------------------------------------------------
// Precision of parameters and activations. Gradients of parameters, AdamW moments and master
// weights are always FP32. PRECISION=FP32 builds the reference-test variant (FP32 everywhere,
// FP32 GEMMs without TF32); the default is BF16.
#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#define CUDA_R_FLOATX CUDA_R_32F
#define CHECKPOINT_VERSION 3
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#define CUDA_R_FLOATX CUDA_R_16BF
#define CHECKPOINT_VERSION 5
#endif

// ---------------------------------------------------------------------------------------------
// Error checking: a failing CUDA or cuBLAS call is a bug or a broken device, not user input, so
// it prints where it happened and exits.
// A kernel that faults is reported by whichever CUDA call comes next (often a synchronize far from
// the kernel), so for those errors the message says how to find the launch itself.
inline void cuda_check_impl(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "error: CUDA call failed at %s:%d: %s\n", file, line, cudaGetErrorString(err));
        if (err == cudaErrorLaunchFailure || err == cudaErrorIllegalAddress || err == cudaErrorMisalignedAddress ||
            err == cudaErrorIllegalInstruction || err == cudaErrorHardwareStackError || err == cudaErrorAssert)
            fprintf(stderr, "       (a kernel launched before this call failed; run with CUDA_LAUNCH_BLOCKING=1 to stop at "
                            "the launch itself, or rerun under python3 dev/gpu_coredump.py --sass --run COMMAND: it names the "
                            "kernel and the instruction from a GPU core dump)\n");
        exit(1);
    }
}
#define cudaCheck(err) cuda_check_impl((err), __FILE__, __LINE__)

inline void cublas_check_impl(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuBLAS call failed at %s:%d: status %d\n", file, line, (int)status);
        exit(1);
    }
}
#define cublasCheck(status) cublas_check_impl((status), __FILE__, __LINE__)

// after a kernel launch: catch bad launch configurations at once
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())

// Let KERNEL use `smem` bytes of dynamic shared memory (above the default 48 KB): the opt-in, once per kernel
template <auto KERNEL>
void allow_dynamic_smem(int smem) {
    static bool done = false;
    if (!done) {
        cudaCheck(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        done = true;
    }
}
// allow_dynamic_smem<KERNEL>(smem), then KERNEL itself: for choosing one of a kernel's instantiations at run time,
//   auto kernel = flag ? with_dynamic_smem<k<true>>(smem) : with_dynamic_smem<k<false>>(smem);
template <auto KERNEL>
auto with_dynamic_smem(int smem) {
    allow_dynamic_smem<KERNEL>(smem);
    return KERNEL;
}

// ---------------------------------------------------------------------------------------------
// Asynchronous copies into shared memory (cp.async, sm_80 and newer): the flash attention's tile ring,
// the classifier's staged row. A thread's copies are visible to that thread after cp_async_wait; to the
// others only after a barrier as well.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16-byte global -> shared copy; when !valid the destination is zero-filled and nothing is read
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes) : "memory");
}
// 4-byte global -> shared copy, zero-filled when !valid
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Device allocation. Running out of memory is something the user can fix, so it gets its own
// message: how much was asked for, what is free, and what to change.
inline void* cuda_malloc_or_die(size_t bytes, const char* what) {
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError(); // clear the sticky-free error
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        fprintf(stderr,
                "error: out of GPU memory allocating %s: asked for %.2f GiB, %.2f GiB free of %.2f GiB.\n"
                "       Use a smaller micro-batch (-b), recompute more in backward (-r 2), or a shorter -t.\n",
                what, bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
        exit(1);
    }
    cudaCheck(err);
    return ptr;
}

// ---------------------------------------------------------------------------------------------
// Device helpers.
#define WARP_SIZE 32

// 2^x by the special-function unit (MUFU.EX2: relative error about 2^-22, subnormal results flushed to 0), the
// same instruction in every build, fast-math or not; 2^-inf = 0. The softmaxes compute e^(x - m) as
// 2^(x log2(e) - m log2(e)): one FMA and this, where expf spends a range reduction on top.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}

// Block-wide sum, deterministic (fixed tree). All threads get the result. blockDim.x % 32 == 0.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads(); // partial may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < num_warps ? partial[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < num_warps ? partial[lane] : -INFINITY;
    return warp_max(v);
}

// The block's largest v combined into *out by atomicMax, one atomic per block (none for 0): the amax kernels,
// whose v are the bits of non-negative floats (ordered as the floats are). Every thread of the block calls it
// (it has a barrier); blockDim.x % 32 == 0.
__device__ __forceinline__ void block_max_atomic(uint32_t v, uint32_t* out) {
    __shared__ uint32_t partial[32];
    for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffff, v, off));
    if (threadIdx.x % WARP_SIZE == 0) partial[threadIdx.x / WARP_SIZE] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / WARP_SIZE; w++) v = max(v, partial[w]);
        if (v) atomicMax(out, v);
    }
}

// Stateless 32-bit hash of (seed, index): the random bits for stochastic rounding. Being a pure
// function of its inputs makes every rounding decision reproducible (and a resumed run identical).
__host__ __device__ __forceinline__ uint32_t hash_u32(uint32_t seed, uint32_t index) {
    uint32_t h = seed ^ (index * 0x9E3779B9u);
    h ^= h >> 16; h *= 0x85EBCA6Bu;
    h ^= h >> 13; h *= 0xC2B2AE35u;
    h ^= h >> 16;
    h += index;
    h ^= h >> 15; h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return h;
}

// Conversions to the storage type. For BF16, round-to-nearest-even, or stochastic rounding:
// add 16 random bits below BF16's last mantissa bit and truncate, so that E[rounded] = x.
__device__ __forceinline__ void store_rounded(float* dst, float x, uint32_t) { *dst = x; }
__device__ __forceinline__ void store_rounded(__nv_bfloat16* dst, float x, uint32_t random_bits) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7F800000u) != 0x7F800000u) { // leave inf/NaN to the normal conversion
        bits += (random_bits & 0xFFFFu);
        bits &= 0xFFFF0000u;
        *dst = __float2bfloat16_rn(__uint_as_float(bits));
    } else {
        *dst = __float2bfloat16_rn(x);
    }
}

inline int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// The current device's number of SMs, queried once per process (each process drives one GPU). The
// grid-stride kernels size their grids by it: a few blocks per SM, each striding over the rest.
inline int device_sm_count() {
    static int sms = 0;
    if (sms == 0) {
        int device = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    }
    return sms;
}
