// fp8_quantize.cuh: BF16 -> FP8 quantization kernels (E4M3 / E5M2), with the tensor's amax and,
// on request, saturation / flush-to-zero counts recorded in the same pass.
//
//   q = fp8(x * s)   round to nearest even, saturating (|x * s| above FP8_MAX -> +-FP8_MAX)
//
// The conversion is the hardware's cvt.rn.satfinite (cuda_fp8.h). It is the same function as the
// CPU codec fp8e4m3_encode / fp8e5m2_encode(x, Overflow::Saturate) of number_formats.h for every
// non-NaN input; build/test_fp8 checks that bit for bit over every BF16 value and several scales
// (a NaN becomes a NaN code, whose bits may differ).
//
// Layouts. Hopper's FP8 GEMMs read both operands K-major, so a linear layer needs its activations
// and gradients in two layouts: (N x K) row-major for the forward and dgrad GEMMs and (K x N) for
// the weight gradient. fp8_quantize_transpose writes both from one read of the input.
#pragma once
#include <cuda_fp8.h>
#include "cuda_common.h"
#include "fp8_scaling.h"
#include "gelu.cuh"

enum class Fp8Kind { E4M3, E5M2 };

// per tensor, when telemetry is on: [0] values, [1] saturated (|x*s| > FP8_MAX, inf included),
// [2] flushed to zero (x != 0 but q = +-0)
struct Fp8Stats {
    unsigned long long* counts = nullptr; // 3 counters, or null (not counted)
};

template <Fp8Kind K>
__device__ __forceinline__ float fp8_max_value() { return K == Fp8Kind::E4M3 ? 448.0f : 57344.0f; }

// two values -> two FP8 codes (low byte = first)
template <Fp8Kind K>
__device__ __forceinline__ uint16_t fp8_pack2(float a, float b) {
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, K == Fp8Kind::E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// One value's contribution to amax and the telemetry counts.
template <Fp8Kind K>
__device__ __forceinline__ void fp8_account(float x, float s, uint8_t code, uint32_t& amax, uint32_t& sat, uint32_t& ftz) {
    amax = max(amax, llmc::amax_bits(x));
    float y = fabsf(x * s);
    sat += (y > fp8_max_value<K>()) ? 1u : 0u;
    // x != 0 tested on the bits: with fast math a float32 subnormal compares equal to 0
    ftz += (llmc::amax_bits(x) != 0u && (code & 0x7F) == 0) ? 1u : 0u;
}

// Combines a block's amax and counts into the tensor's: a warp reduction, then one atomic per block
// (the kernels loop over many tiles per block, so the atomics on the tensor's few addresses stay rare).
__device__ __forceinline__ void fp8_commit(uint32_t amax, uint32_t sat, uint32_t ftz, uint32_t count,
                                          uint32_t* amax_out, Fp8Stats stats) {
    __shared__ uint32_t s_amax[32], s_sat[32], s_ftz[32], s_count[32];
    for (int o = 16; o > 0; o >>= 1) {
        amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sat += __shfl_xor_sync(0xffffffffu, sat, o);
        ftz += __shfl_xor_sync(0xffffffffu, ftz, o);
        count += __shfl_xor_sync(0xffffffffu, count, o);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) { s_amax[warp] = amax; s_sat[warp] = sat; s_ftz[warp] = ftz; s_count[warp] = count; }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long tot_sat = 0, tot_ftz = 0, tot_count = 0;
        for (int w = 0; w < warps; w++) {
            amax = max(amax, s_amax[w]);
            tot_sat += s_sat[w]; tot_ftz += s_ftz[w]; tot_count += s_count[w];
        }
        if (amax_out && amax) atomicMax(amax_out, amax);
        if (stats.counts) {
            atomicAdd(&stats.counts[0], tot_count);
            atomicAdd(&stats.counts[1], tot_sat);
            atomicAdd(&stats.counts[2], tot_ftz);
        }
    }
}

// Row-major quantization of n values, 8 per thread (n % 8 == 0, 16-byte aligned input, 8-byte
// aligned output: the caller checks). scale: device pointer to s. amax_out may be null.
template <Fp8Kind K>
__global__ void fp8_quantize_kernel(uint8_t* out, const floatX* in, long long n8, const float* scale,
                                    uint32_t* amax_out, Fp8Stats stats) {
    const float s = *scale;
    uint32_t amax = 0, sat = 0, ftz = 0, count = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
        uint4 packed = reinterpret_cast<const uint4*>(in)[i];
        const floatX* v = reinterpret_cast<const floatX*>(&packed);
        uint16_t pairs[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float a = (float)v[2 * j], b = (float)v[2 * j + 1];
            pairs[j] = fp8_pack2<K>(a * s, b * s);
            fp8_account<K>(a, s, (uint8_t)(pairs[j] & 0xFF), amax, sat, ftz);
            fp8_account<K>(b, s, (uint8_t)(pairs[j] >> 8), amax, sat, ftz);
        }
        count += 8;
        reinterpret_cast<uint2*>(out)[i] = make_uint2(pairs[0] | ((uint32_t)pairs[1] << 16), pairs[2] | ((uint32_t)pairs[3] << 16));
    }
    fp8_commit(amax, sat, ftz, count, amax_out, stats);
}

// Quantization of a (rows x cols) row-major tensor into out (rows x cols, may be null) and out_t
// (cols x rows, may be null), through 64 x 64 tiles in shared memory; each block of 256 threads
// walks over tiles (tile = blockIdx.x, + gridDim.x, ...). Any rows and cols: partial tiles at the
// edges take a guarded path.
// col_partials (may be null): the column sums of the unquantized input, per 64-row tile:
// col_partials[tile_row * cols + c] = sum of in[r][c] over the tile's rows, in a fixed order (so
// the bias gradient built from them is deterministic; fp8_column_sums_reduce finishes it).
// gelu_pre (may be null, same layout as in): the input is a gradient w.r.t. a GELU's output and the
// tensor to quantize is the gradient w.r.t. its input, in * gelu'(gelu_pre), rounded to floatX exactly
// as gelu_backward would have stored it, so the codes, amax and sums equal those of gelu_backward
// followed by this kernel, without writing and re-reading that tensor.
#define FP8_TILE 64
template <Fp8Kind K>
__global__ void __launch_bounds__(256) fp8_quantize_transpose_kernel(uint8_t* out, uint8_t* out_t, const floatX* in,
                                                                     int rows, int cols, const float* scale,
                                                                     uint32_t* amax_out, Fp8Stats stats,
                                                                     float* col_partials, const floatX* gelu_pre) {
    __shared__ uint8_t tile[FP8_TILE][FP8_TILE + 4]; // +4: column reads of 16 rows spread over banks
    __shared__ float warp_sums[8][FP8_TILE];
    const float s = *scale;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int tiles_x = (cols + FP8_TILE - 1) / FP8_TILE, tiles_y = (rows + FP8_TILE - 1) / FP8_TILE;
    const long long num_tiles = (long long)tiles_x * tiles_y;
    uint32_t amax = 0, sat = 0, ftz = 0, count = 0;
    // load + quantize: thread -> rows (tid / 8) and (tid / 8 + 32), 8 consecutive columns at (tid % 8) * 8
    const int tc = (tid % 8) * 8;
    for (long long tile_id = blockIdx.x; tile_id < num_tiles; tile_id += gridDim.x) {
        const int r0 = (int)(tile_id / tiles_x) * FP8_TILE, c0 = (int)(tile_id % tiles_x) * FP8_TILE;
        const bool full = r0 + FP8_TILE <= rows && c0 + FP8_TILE <= cols && cols % 8 == 0;
        float colsum[8];
#pragma unroll
        for (int j = 0; j < 8; j++) colsum[j] = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int tr = tid / 8 + half * 32;
            const int r = r0 + tr;
            uint8_t codes[8];
            if (full) {
                uint4 packed = *reinterpret_cast<const uint4*>(in + (size_t)r * cols + c0 + tc);
                floatX* v = reinterpret_cast<floatX*>(&packed);
                if (gelu_pre) {
                    uint4 pre = *reinterpret_cast<const uint4*>(gelu_pre + (size_t)r * cols + c0 + tc);
                    const floatX* pv = reinterpret_cast<const floatX*>(&pre);
#pragma unroll
                    for (int j = 0; j < 8; j++) v[j] = (floatX)((float)v[j] * gelu_derivative((float)pv[j]));
                }
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    float a = (float)v[j], b = (float)v[j + 1];
                    colsum[j] += a; colsum[j + 1] += b;
                    uint16_t p = fp8_pack2<K>(a * s, b * s);
                    codes[j] = (uint8_t)(p & 0xFF); codes[j + 1] = (uint8_t)(p >> 8);
                    fp8_account<K>(a, s, codes[j], amax, sat, ftz);
                    fp8_account<K>(b, s, codes[j + 1], amax, sat, ftz);
                }
                count += 8;
                if (out) {
                    uint2 w = make_uint2(codes[0] | (codes[1] << 8) | (codes[2] << 16) | ((uint32_t)codes[3] << 24),
                                         codes[4] | (codes[5] << 8) | (codes[6] << 16) | ((uint32_t)codes[7] << 24));
                    *reinterpret_cast<uint2*>(out + (size_t)r * cols + c0 + tc) = w;
                }
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int c = c0 + tc + j;
                    codes[j] = 0;
                    if (r < rows && c < cols) {
                        float a = (float)in[(size_t)r * cols + c];
                        if (gelu_pre) a = (float)(floatX)(a * gelu_derivative((float)gelu_pre[(size_t)r * cols + c]));
                        colsum[j] += a;
                        codes[j] = (uint8_t)(fp8_pack2<K>(a * s, 0.0f) & 0xFF);
                        fp8_account<K>(a, s, codes[j], amax, sat, ftz);
                        count += 1;
                        if (out) out[(size_t)r * cols + c] = codes[j];
                    }
                }
            }
            if (out_t) {
#pragma unroll
                for (int j = 0; j < 8; j++) tile[tr][tc + j] = codes[j];
            }
        }
        if (col_partials) {
            // lanes l, l+8, l+16, l+24 of a warp share columns: a fixed shuffle tree, then the 8 warps in order
#pragma unroll
            for (int j = 0; j < 8; j++) {
                colsum[j] += __shfl_xor_sync(0xffffffffu, colsum[j], 8);
                colsum[j] += __shfl_xor_sync(0xffffffffu, colsum[j], 16);
            }
            if (lane < 8) {
#pragma unroll
                for (int j = 0; j < 8; j++) warp_sums[warp][lane * 8 + j] = colsum[j];
            }
        }
        __syncthreads();
        if (col_partials && tid < FP8_TILE && c0 + tid < cols) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < 8; w++) sum += warp_sums[w][tid];
            col_partials[(size_t)(r0 / FP8_TILE) * cols + c0 + tid] = sum;
        }
        if (out_t) {
            // transposed store: thread -> output row (column of the input) tid / 4, 16 input rows at (tid % 4) * 16
            const int oc = tid / 4, orow0 = (tid % 4) * 16;
            const int c = c0 + oc;
            if (full && rows % 16 == 0) {
                uint32_t w[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    w[q] = tile[orow0 + 4 * q][oc] | (tile[orow0 + 4 * q + 1][oc] << 8) |
                           (tile[orow0 + 4 * q + 2][oc] << 16) | ((uint32_t)tile[orow0 + 4 * q + 3][oc] << 24);
                }
                *reinterpret_cast<uint4*>(out_t + (size_t)c * rows + r0 + orow0) = make_uint4(w[0], w[1], w[2], w[3]);
            } else if (c < cols) {
                for (int j = 0; j < 16; j++) {
                    const int r = r0 + orow0 + j;
                    if (r < rows) out_t[(size_t)c * rows + r] = tile[orow0 + j][oc];
                }
            }
        }
        __syncthreads(); // the tile and the warp sums are rewritten by the next tile
    }
    fp8_commit(amax, sat, ftz, count, amax_out, stats);
}

// dbias[c] += sum over the tile rows of col_partials (in order: deterministic)
__global__ void fp8_column_sums_reduce_kernel(float* dbias, const float* col_partials, int tile_rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float sum = 0.0f;
    for (int t = 0; t < tile_rows; t++) sum += col_partials[(size_t)t * cols + c];
    dbias[c] += sum;
}

// max |x| over n values into *amax_out (atomicMax on the bits; the caller zeroes it first)
__global__ void amax_kernel(uint32_t* amax_out, const floatX* in, long long n) {
    uint32_t amax = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        amax = max(amax, llmc::amax_bits((float)in[i]));
    for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0 && amax) atomicMax(amax_out, amax);
}

// ---- host wrappers -------------------------------------------------------------------------------
inline int fp8_grid_size(long long work, int threads) {
    // enough blocks to fill the GPU several times over; the kernels stride over the rest
    return (int)std::max<long long>(1, std::min<long long>(ceil_div(work, threads), 132LL * 16));
}

template <Fp8Kind K>
inline void fp8_quantize(uint8_t* out, const floatX* in, long long n, const float* scale, uint32_t* amax_out,
                         Fp8Stats stats, cudaStream_t stream) {
    if (n % 8 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)out % 8 == 0) {
        fp8_quantize_kernel<K><<<fp8_grid_size(n / 8, 256), 256, 0, stream>>>(out, in, n / 8, scale, amax_out, stats);
    } else {
        // unaligned: the tile kernel treats the tensor as one row
        fp8_quantize_transpose_kernel<K><<<fp8_grid_size(ceil_div(n, FP8_TILE), 1), 256, 0, stream>>>(
            out, nullptr, in, 1, (int)n, scale, amax_out, stats, nullptr, nullptr);
    }
    cudaCheckLaunch();
}

// out (rows x cols, may be null) and out_t (cols x rows, may be null) from in (rows x cols); with
// col_sums (and col_partials: ceil(rows / 64) * cols floats of scratch), col_sums[c] += sum of
// column c of the input (the bias gradient, from the same read). With gelu_pre, the input is first
// multiplied by gelu'(gelu_pre) (see the kernel).
template <Fp8Kind K>
inline void fp8_quantize_transpose(uint8_t* out, uint8_t* out_t, const floatX* in, int rows, int cols,
                                   const float* scale, uint32_t* amax_out, Fp8Stats stats, cudaStream_t stream,
                                   float* col_sums = nullptr, float* col_partials = nullptr,
                                   const floatX* gelu_pre = nullptr) {
    const long long tiles = (long long)ceil_div(cols, FP8_TILE) * ceil_div(rows, FP8_TILE);
    const int grid = (int)std::min<long long>(tiles, 132LL * 8);
    fp8_quantize_transpose_kernel<K><<<grid, 256, 0, stream>>>(out, out_t, in, rows, cols, scale, amax_out, stats,
                                                               col_sums ? col_partials : nullptr, gelu_pre);
    cudaCheckLaunch();
    if (col_sums) {
        fp8_column_sums_reduce_kernel<<<ceil_div(cols, 256), 256, 0, stream>>>(col_sums, col_partials,
                                                                               ceil_div(rows, FP8_TILE), cols);
        cudaCheckLaunch();
    }
}

// The same with 16-byte loads (8 values per thread and iteration) and one atomic per block: the
// recipes that scale afresh (tcfp12) run it before every quantization, so it must run at memory speed.
__global__ void __launch_bounds__(256) amax_vec_kernel(uint32_t* amax_out, const floatX* in, long long n8) {
    __shared__ uint32_t warp_max[8];
    uint32_t amax = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
        uint4 packed = reinterpret_cast<const uint4*>(in)[i];
        const floatX* v = reinterpret_cast<const floatX*>(&packed);
#pragma unroll
        for (int j = 0; j < 8; j++) amax = max(amax, llmc::amax_bits((float)v[j]));
    }
    for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)blockDim.x / 32; w++) amax = max(amax, warp_max[w]);
        if (amax) atomicMax(amax_out, amax);
    }
}

inline void tensor_amax(uint32_t* amax_out, const floatX* in, long long n, cudaStream_t stream) {
    if (n % 8 == 0 && (uintptr_t)in % 16 == 0) {
        amax_vec_kernel<<<fp8_grid_size(n / 8, 256), 256, 0, stream>>>(amax_out, in, n / 8);
    } else {
        amax_kernel<<<fp8_grid_size(n, 256), 256, 0, stream>>>(amax_out, in, n);
    }
    cudaCheckLaunch();
}
