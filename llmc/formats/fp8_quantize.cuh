// formats/fp8_quantize.cuh: BF16 -> FP8 quantization kernels (E4M3 / E5M2), with the tensor's amax and,
// on request, saturation / flush-to-zero counts recorded in the same pass.
//
//   q = fp8(x * s)   round to nearest even, saturating (|x * s| above FP8_MAX -> +-FP8_MAX)
//
// The conversion is the hardware's cvt.rn.satfinite (cuda_fp8.h). It is the same function as the
// CPU codec fp8e4m3_encode / fp8e5m2_encode(x, Overflow::Saturate) of formats/number_formats.h for every
// non-NaN input; build/test_fp8 checks that bit for bit over every BF16 value and several scales
// (a NaN becomes a NaN code, whose bits may differ).
//
// Layouts. Hopper's FP8 GEMMs read both operands K-major, so a linear layer needs its activations
// and gradients in two layouts: (N x K) row-major for the forward and dgrad GEMMs and (K x N) for
// the weight gradient. fp8_quantize_transpose writes both from one read of the input.
#pragma once
#include <cuda_fp8.h>
#include <map>
#include "llmc/cuda_common.h"
#include "fp8_scaling.h"
#include "llmc/gelu.cuh"
#include "llmc/matmul.cuh" // bias_backward_reduce

enum class Fp8Kind { E4M3, E5M2 };

// per tensor, when telemetry is on: [0] values, [1] saturated (|x*s| > FP8_MAX, inf included),
// [2] flushed to zero (x != 0 but q = +-0)
struct Fp8Stats {
    unsigned long long* counts = nullptr; // 3 counters, or null (not counted)
};

// Where a kernel that produces a tensor also writes its FP8 codes in the two layouts the FP8 GEMMs read
// (the flash attention backward for the qkv layer's output gradient, see recipe_api.h): row-major rows
// (n x m), its transpose cols (m x n), the scale s of q = fp8(x * s), the tensor's amax (atomicMax on
// the bits) and, on telemetry steps, its counts. With amax alone (rows null: amax_only), the kernel
// writes its usual output and records that output's amax (a recipe with fresh scales, TCFP-12).
struct Fp8Target {
    uint8_t* rows = nullptr; // null: no FP8 output wanted
    uint8_t* cols = nullptr;
    const float* scale = nullptr;
    uint32_t* amax = nullptr;
    Fp8Stats stats;
    const int* run_only_if = nullptr; // (the LayerNorm forward) a device flag: the kernel does nothing unless it is set
    __host__ __device__ bool active() const { return rows != nullptr; }
    __host__ __device__ bool amax_only() const { return rows == nullptr && amax != nullptr; }
};

template <Fp8Kind K>
__device__ __forceinline__ float fp8_max_value() { return K == Fp8Kind::E4M3 ? 448.0f : 57344.0f; }

// two values -> two FP8 codes (low byte = first)
template <Fp8Kind K>
__device__ __forceinline__ uint16_t fp8_pack2(float a, float b) {
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, K == Fp8Kind::E4M3 ? __NV_E4M3 : __NV_E5M2);
}

// One value's contribution to amax and, when COUNT (a telemetry step, -lq), to the counts of values
// saturated and flushed to zero. Steps without telemetry skip the counting arithmetic altogether.
template <Fp8Kind K, bool COUNT>
__device__ __forceinline__ void fp8_account(float x, float s, uint8_t code, uint32_t& amax, uint32_t& sat, uint32_t& ftz) {
    amax = max(amax, llmc::amax_bits(x));
    if (COUNT) {
        float y = fabsf(x * s);
        sat += (y > fp8_max_value<K>()) ? 1u : 0u;
        // x != 0 tested on the bits: with fast math a float32 subnormal compares equal to 0
        ftz += (llmc::amax_bits(x) != 0u && (code & 0x7F) == 0) ? 1u : 0u;
    }
}

// Combines a block's amax and counts into the tensor's: a warp reduction, then one atomic per block
// (the kernels loop over many tiles per block, so the atomics on the tensor's few addresses stay rare).
// amax_seen (thread 0's value counts): a value *amax_out had before, read by a kernel whose blocks are
// many and short (a LayerNorm, the attention backward's tiles): the atomic is skipped where it would
// not raise that value, since atomics from every block on one address serialize. Every thread of the
// block calls it; its barrier also publishes what the block wrote to shared memory before.
__device__ __forceinline__ void fp8_commit(uint32_t amax, uint32_t sat, uint32_t ftz, uint32_t count,
                                          uint32_t* amax_out, Fp8Stats stats, uint32_t amax_seen = 0) {
    __shared__ uint32_t s_amax[32], s_sat[32], s_ftz[32], s_count[32];
    for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (stats.counts) { // (the sums are read only on telemetry steps; the branch is the same for the whole CTA)
        for (int o = 16; o > 0; o >>= 1) {
            sat += __shfl_xor_sync(0xffffffffu, sat, o);
            ftz += __shfl_xor_sync(0xffffffffu, ftz, o);
            count += __shfl_xor_sync(0xffffffffu, count, o);
        }
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
        if (amax_out && amax > amax_seen) atomicMax(amax_out, amax);
        if (stats.counts) {
            atomicAdd(&stats.counts[0], tot_count);
            atomicAdd(&stats.counts[1], tot_sat);
            atomicAdd(&stats.counts[2], tot_ftz);
        }
    }
}

// Eight BF16 values (one 16-byte load) -> their eight codes (8 bytes, first value in the low byte),
// with their contributions to amax and the counts
template <Fp8Kind K, bool COUNT>
__device__ __forceinline__ uint2 fp8_quantize8(uint4 packed, float s, uint32_t& amax, uint32_t& sat, uint32_t& ftz) {
    const floatX* v = reinterpret_cast<const floatX*>(&packed);
    uint16_t pairs[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float a = (float)v[2 * j], b = (float)v[2 * j + 1];
        pairs[j] = fp8_pack2<K>(a * s, b * s);
        fp8_account<K, COUNT>(a, s, (uint8_t)(pairs[j] & 0xFF), amax, sat, ftz);
        fp8_account<K, COUNT>(b, s, (uint8_t)(pairs[j] >> 8), amax, sat, ftz);
    }
    return make_uint2(pairs[0] | ((uint32_t)pairs[1] << 16), pairs[2] | ((uint32_t)pairs[3] << 16));
}

// Row-major quantization of n values, 8 per thread (n % 8 == 0, 16-byte aligned input, 8-byte
// aligned output: the caller checks). scale: device pointer to s. amax_out may be null.
template <Fp8Kind K, bool COUNT>
__global__ void fp8_quantize_kernel(uint8_t* out, const floatX* in, long long n8, const float* scale,
                                    uint32_t* amax_out, Fp8Stats stats, const int* run_only_if) {
    if (run_only_if && *run_only_if == 0) return; // (a second, conditional pass: see fp8_quantize)
    const float s = *scale;
    uint32_t amax = 0, sat = 0, ftz = 0, count = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
        const uint2 codes = fp8_quantize8<K, COUNT>(reinterpret_cast<const uint4*>(in)[i], s, amax, sat, ftz);
        count += 8;
        reinterpret_cast<uint2*>(out)[i] = codes;
    }
    fp8_commit(amax, sat, ftz, count, amax_out, stats);
}

// Quantization of a (rows x cols) row-major tensor into out (rows x cols, may be null) and out_t
// (cols x rows, may be null), through 64 x 64 tiles; each block of 256 threads walks over tiles
// (tile = blockIdx.x, + gridDim.x, ...). Any rows and cols: partial tiles at the edges, and tensors
// whose widths or pointers do not allow the vector accesses, take a guarded path.
// col_partials (may be null): the column sums of the unquantized input, per 64-row tile:
// col_partials[tile_row * cols + c] = sum of in[r][c] over the tile's rows, in a fixed order (so
// the bias gradient built from them is deterministic; bias_backward_reduce finishes it).
// gelu_pre (may be null, same layout as in): the input is a gradient w.r.t. a GELU's output and the
// tensor to quantize is the gradient w.r.t. its input, in * (the GELU factor of gelu_pre: gelu.cuh's
// GeluFactor, gelu_factor), rounded to floatX exactly as gelu_backward would have stored it, so the codes,
// amax and sums equal those of gelu_backward followed by this kernel, without writing and re-reading that
// tensor.
// gelu_of_input: the input is a GELU's input (pre-activation) and the tensor to quantize is its output,
// gelu(in) rounded to floatX exactly as gelu_forward would have stored it (the FP8 recipe's fc layer
// leaves its GELU output to the fc projection's quantize pass, which reads the pre-activation instead).
//
// Work of thread t in a tile: the 4 x 4 block at rows 4 (t / 16) .. +3 and columns 4 (t % 16) .. +3.
//   load      its 4 rows as 8-byte vectors (a warp reads 2 rows x 128 bytes), and their gelu_pre;
//   quantize  each row's 4 codes form one 32-bit word (byte j = column j), stored to `out`;
//   transpose the 4 row words become 4 column words (byte i = row i; 8 byte permutes), stored to the
//             transposed tile in shared memory, tile_t[column][row group] (17 words per column: the
//             padding spreads a warp's stores over 16 banks);
//   out_t     after the barrier, thread t reads rows 16 (t % 4) .. +15 of column t / 4 (4 words) and
//             writes them to out_t with one 16-byte store.
// The loads of a block's next tile are issued before the current tile is processed (register double
// buffering), so that every block keeps loads in flight while it computes and stores; the transposed
// tile and the column sums are double-buffered in shared memory, so one barrier per tile suffices.
#define FP8_TILE 64
#define FP8_TILE_T_STRIDE 17 // words per column of the transposed tile (16 + 1 padding)

// Tile order: tile ids run down groups of FP8_TILE_GROUP tile rows, column by column, so that blocks
// running at the same time (consecutive ids) write adjacent 64-byte pieces of both outputs. Groups of 2
// tile rows copy faster than row-by-row order and no slower than 4 or 8 (build/fp8_quantize_bench
// measures the orders at the d12 shapes).
#define FP8_TILE_GROUP 2
__device__ __forceinline__ void fp8_tile_origin(long long tile, int tiles_x, int tiles_y, int& r0, int& c0) {
    const long long group_tiles = (long long)FP8_TILE_GROUP * tiles_x;
    const long long g = tile / group_tiles, w = tile % group_tiles;
    int rt, ct;
    if ((g + 1) * FP8_TILE_GROUP <= tiles_y) {
        rt = (int)(g * FP8_TILE_GROUP + w % FP8_TILE_GROUP);
        ct = (int)(w / FP8_TILE_GROUP);
    } else { // the last, incomplete group: row by row
        rt = (int)(g * FP8_TILE_GROUP + w / tiles_x);
        ct = (int)(w % tiles_x);
    }
    r0 = rt * FP8_TILE;
    c0 = ct * FP8_TILE;
}

// The transposed tile (shared by the quantize-transpose and the transpose kernels, and recipes/fp8/fp8_gemm.cuh's
// epilogue). Thread (br, bc) holds the codes of its 4 x 4 block as 4 row words (byte j = column bc + j);
// 8 byte permutes make them 4 column words (byte i = row br + i), stored at tile_t[column][row group],
// STRIDE words a column.
// A 4 x 4 block of bytes transposed in registers: row_word[i] byte j -> col_word[j] byte i (8 byte permutes:
// first the byte pairs of rows 0-1 and 2-3, then the halfword pairs).
__device__ __forceinline__ void fp8_transpose4x4(const uint32_t (&row_word)[4], uint32_t (&col_word)[4]) {
    const uint32_t lo01 = __byte_perm(row_word[0], row_word[1], 0x5140), hi01 = __byte_perm(row_word[0], row_word[1], 0x7362);
    const uint32_t lo23 = __byte_perm(row_word[2], row_word[3], 0x5140), hi23 = __byte_perm(row_word[2], row_word[3], 0x7362);
    col_word[0] = __byte_perm(lo01, lo23, 0x5410);
    col_word[1] = __byte_perm(lo01, lo23, 0x7632);
    col_word[2] = __byte_perm(hi01, hi23, 0x5410);
    col_word[3] = __byte_perm(hi01, hi23, 0x7632);
}
template <int STRIDE = FP8_TILE_T_STRIDE>
__device__ __forceinline__ void fp8_tile_stage_columns(uint32_t* tile_t, const uint32_t (&row_word)[4], int br, int bc) {
    uint32_t col_word[4];
    fp8_transpose4x4(row_word, col_word);
    uint32_t* col = tile_t + bc * STRIDE + br / 4;
#pragma unroll
    for (int j = 0; j < 4; j++) col[j * STRIDE] = col_word[j];
}
// After the barrier: column c0 + tid / 4 of the tile is row c0 + tid / 4 of out_t (rows x cols input,
// cols x rows output); thread tid writes its 16 bytes at r0 + 16 (tid % 4), in one store when vec
// (a full tile, rows % 16 == 0, out_t 16-byte aligned), else byte by byte inside the matrix.
__device__ __forceinline__ void fp8_tile_store_columns(uint8_t* out_t, const uint32_t* tile_t, int r0, int c0, int rows,
                                                       int cols, bool vec, int tid) {
    const int oc = tid / 4, chunk = tid % 4;
    const uint32_t* src = tile_t + oc * FP8_TILE_T_STRIDE + chunk * 4;
    const int c = c0 + oc, r = r0 + chunk * 16;
    if (vec) {
        *reinterpret_cast<uint4*>(out_t + (size_t)c * rows + r) = make_uint4(src[0], src[1], src[2], src[3]);
    } else if (c < cols) {
        for (int j = 0; j < 16; j++) {
            if (r + j < rows) out_t[(size_t)c * rows + r + j] = (uint8_t)(src[j / 4] >> (8 * (j % 4)));
        }
    }
}

// one full tile's loads for thread (br, bc): 4 rows of 4 values, and their GELU inputs
__device__ __forceinline__ void fp8_tile_load(uint2 (&v)[4], uint2 (&p)[4], const floatX* in, const floatX* gelu_pre,
                                              int cols, int r, int c) {
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = *reinterpret_cast<const uint2*>(in + (size_t)(r + i) * cols + c);
    if (gelu_pre) {
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = *reinterpret_cast<const uint2*>(gelu_pre + (size_t)(r + i) * cols + c);
    }
}

template <Fp8Kind K, bool COUNT>
__global__ void __launch_bounds__(256, 4) fp8_quantize_transpose_kernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                                                                     const floatX* __restrict__ in, int rows, int cols,
                                                                     const float* scale, uint32_t* amax_out, Fp8Stats stats,
                                                                     float* __restrict__ col_partials,
                                                                     const floatX* __restrict__ gelu_pre, bool gelu_of_input,
                                                                     const int* run_only_if, GeluFactor gelu_factor) {
    __shared__ uint32_t tile_t[2][FP8_TILE * FP8_TILE_T_STRIDE];
    __shared__ float warp_sums[2][8][FP8_TILE];
    if (run_only_if && *run_only_if == 0) return; // (a second, conditional pass: see fp8_quantize_transpose)
    const float s = *scale;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int br = 4 * (tid / 16), bc = 4 * (tid % 16); // this thread's 4 x 4 block in the tile
    const int tiles_x = (cols + FP8_TILE - 1) / FP8_TILE, tiles_y = (rows + FP8_TILE - 1) / FP8_TILE;
    const long long num_tiles = (long long)tiles_x * tiles_y;
    // vector accesses: 8-byte loads and 4-byte stores along rows, 16-byte stores along out_t's rows
    const bool vec = cols % 4 == 0 && (uintptr_t)in % 8 == 0 && (uintptr_t)gelu_pre % 8 == 0 && (uintptr_t)out % 4 == 0;
    const bool vec_t = rows % 16 == 0 && (uintptr_t)out_t % 16 == 0;
    auto is_full = [&](long long tile) {
        int r0, c0;
        fp8_tile_origin(tile, tiles_x, tiles_y, r0, c0);
        return vec && r0 + FP8_TILE <= rows && c0 + FP8_TILE <= cols;
    };
    uint32_t amax = 0, sat = 0, ftz = 0, count = 0;
    uint2 v[4], p[4];
#pragma unroll
    for (int i = 0; i < 4; i++) { v[i] = make_uint2(0, 0); p[i] = make_uint2(0, 0); }
    long long tile = blockIdx.x;
    if (tile < num_tiles && is_full(tile)) {
        int r0, c0;
        fp8_tile_origin(tile, tiles_x, tiles_y, r0, c0);
        fp8_tile_load(v, p, in, gelu_pre, cols, r0 + br, c0 + bc);
    }
    for (int buf = 0; tile < num_tiles; tile += gridDim.x, buf ^= 1) {
        int r0, c0;
        fp8_tile_origin(tile, tiles_x, tiles_y, r0, c0);
        const bool full = is_full(tile);
        // the next tile's loads first
        uint2 nv[4], np[4];
#pragma unroll
        for (int i = 0; i < 4; i++) { nv[i] = make_uint2(0, 0); np[i] = make_uint2(0, 0); }
        const long long next = tile + gridDim.x;
        if (next < num_tiles && is_full(next)) {
            int nr0, nc0;
            fp8_tile_origin(next, tiles_x, tiles_y, nr0, nc0);
            fp8_tile_load(nv, np, in, gelu_pre, cols, nr0 + br, nc0 + bc);
        }
        uint32_t row_word[4];
        float colsum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (full) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                floatX x[4];
                memcpy(x, &v[i], 8);
                if (gelu_of_input) {
#pragma unroll
                    for (int j = 0; j < 4; j++) x[j] = (floatX)gelu_value((float)x[j]);
                }
                if (gelu_pre) {
                    floatX pre[4];
                    memcpy(pre, &p[i], 8);
#pragma unroll
                    for (int j = 0; j < 4; j++) x[j] = (floatX)((float)x[j] * gelu_backward_factor(gelu_factor, (float)pre[j]));
                }
                float a[4];
#pragma unroll
                for (int j = 0; j < 4; j++) { a[j] = (float)x[j]; colsum[j] += a[j]; }
                const uint32_t w = fp8_pack2<K>(a[0] * s, a[1] * s) | ((uint32_t)fp8_pack2<K>(a[2] * s, a[3] * s) << 16);
#pragma unroll
                for (int j = 0; j < 4; j++) fp8_account<K, COUNT>(a[j], s, (uint8_t)(w >> (8 * j)), amax, sat, ftz);
                row_word[i] = w;
                if (out) *reinterpret_cast<uint32_t*>(out + (size_t)(r0 + br + i) * cols + c0 + bc) = w;
            }
            if (COUNT) count += 16;
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                row_word[i] = 0;
                const int r = r0 + br + i;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int c = c0 + bc + j;
                    if (r < rows && c < cols) {
                        float a = (float)in[(size_t)r * cols + c];
                        if (gelu_of_input) a = (float)(floatX)gelu_value(a);
                        if (gelu_pre) a = (float)(floatX)(a * gelu_backward_factor(gelu_factor, (float)gelu_pre[(size_t)r * cols + c]));
                        colsum[j] += a;
                        const uint8_t code = (uint8_t)(fp8_pack2<K>(a * s, 0.0f) & 0xFF);
                        fp8_account<K, COUNT>(a, s, code, amax, sat, ftz);
                        if (COUNT) count += 1;
                        if (out) out[(size_t)r * cols + c] = code;
                        row_word[i] |= (uint32_t)code << (8 * j);
                    }
                }
            }
        }
        if (out_t) fp8_tile_stage_columns(tile_t[buf], row_word, br, bc);
        if (col_partials) {
            // lanes l and l + 16 of a warp hold the same columns (row groups 2w, 2w + 1); then the 8 warps in order
#pragma unroll
            for (int j = 0; j < 4; j++) colsum[j] += __shfl_xor_sync(0xffffffffu, colsum[j], 16);
            if (lane < 16) {
#pragma unroll
                for (int j = 0; j < 4; j++) warp_sums[buf][warp][bc + j] = colsum[j];
            }
        }
        __syncthreads();
        if (col_partials && tid < FP8_TILE && c0 + tid < cols) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < 8; w++) sum += warp_sums[buf][w][tid];
            col_partials[(size_t)(r0 / FP8_TILE) * cols + c0 + tid] = sum;
        }
        if (out_t) fp8_tile_store_columns(out_t, tile_t[buf], r0, c0, rows, cols, full && vec_t, tid);
#pragma unroll
        for (int i = 0; i < 4; i++) { v[i] = nv[i]; p[i] = np[i]; }
    }
    fp8_commit(amax, sat, ftz, count, amax_out, stats);
}

// out_t (cols x rows) = the transpose of the FP8 codes in (rows x cols): what a kernel that wrote a
// tensor's row-major codes leaves to make the second layout (1 byte read and 1 written per value,
// against 2 + 2 for quantizing the BF16 tensor again). The tiles, order and stores of the quantize-transpose kernel.
__global__ void __launch_bounds__(256) fp8_transpose_kernel(uint8_t* __restrict__ out_t, const uint8_t* __restrict__ in,
                                                            int rows, int cols) {
    __shared__ uint32_t tile_t[2][FP8_TILE * FP8_TILE_T_STRIDE];
    const int tid = threadIdx.x;
    const int br = 4 * (tid / 16), bc = 4 * (tid % 16);
    const int tiles_x = (cols + FP8_TILE - 1) / FP8_TILE, tiles_y = (rows + FP8_TILE - 1) / FP8_TILE;
    const long long num_tiles = (long long)tiles_x * tiles_y;
    const bool vec = cols % 4 == 0 && (uintptr_t)in % 4 == 0;
    const bool vec_t = rows % 16 == 0 && (uintptr_t)out_t % 16 == 0;
    int buf = 0;
    for (long long tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, buf ^= 1) {
        int r0, c0;
        fp8_tile_origin(tile, tiles_x, tiles_y, r0, c0);
        const bool full = vec && r0 + FP8_TILE <= rows && c0 + FP8_TILE <= cols;
        uint32_t row_word[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + br + i;
            if (full) {
                row_word[i] = *reinterpret_cast<const uint32_t*>(in + (size_t)r * cols + c0 + bc);
            } else {
                row_word[i] = 0;
                for (int j = 0; j < 4; j++) {
                    if (r < rows && c0 + bc + j < cols) row_word[i] |= (uint32_t)in[(size_t)r * cols + c0 + bc + j] << (8 * j);
                }
            }
        }
        fp8_tile_stage_columns(tile_t[buf], row_word, br, bc);
        __syncthreads();
        fp8_tile_store_columns(out_t, tile_t[buf], r0, c0, rows, cols, full && vec_t, tid);
    }
}

// The same transpose in 128 x 128 tiles, for rows and cols multiples of 16 and 16-byte aligned buffers (the
// trainer's shapes): the 64 x 64 kernel above moves 16 bytes a thread a tile in 4-byte loads, too few bytes
// in flight to reach the memory bandwidth; here each thread moves 64 bytes a tile in 16-byte loads and stores, and loads the
// next tile before it stages the current one, so that more bytes are in flight.
//   load:  thread t: rows 4 rg .. 4 rg + 3 (rg = t / 8), columns 16 cc .. 16 cc + 15 (cc = t % 8): one uint4 a row;
//          a warp's load instruction reads 4 rows x 128 bytes, whole lines
//   stage: the 4 x 4 byte blocks transposed in registers (fp8_transpose4x4); column c's word of rows 4 rg .. + 3
//          at tile_t[c][4 (g ^ (c / 16 % 8)) + rg % 4], g = rg / 4: the XOR spreads a warp's 32 words of one
//          store over all 32 banks (without it, its 8 column chunks fall on 2 banks)
//   store: thread t: chunk q = t % 8 (rows 16 q .. 16 q + 15 of the tile) of tile columns t / 8 + 32 i,
//          one uint4 from shared memory (still contiguous under the XOR, which moves whole 16-byte groups)
//          and one to out_t; a warp writes 4 lines of 128 bytes
// Partial tiles (the last row or column block): loads outside the matrix read zeros, stores outside it are
// skipped, whole 16-byte chunks either way.
constexpr int FP8_WIDE_TILE = 128;
inline bool fp8_transpose_wide_supported(const uint8_t* out_t, const uint8_t* in, int rows, int cols) {
    return rows % 16 == 0 && cols % 16 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)out_t % 16 == 0;
}
__global__ void __launch_bounds__(256) fp8_transpose_wide_kernel(uint8_t* __restrict__ out_t, const uint8_t* __restrict__ in,
                                                                 int rows, int cols) {
    __shared__ __align__(16) uint32_t tile_t[2][FP8_WIDE_TILE * FP8_WIDE_TILE / 4];
    const int tid = threadIdx.x, rg = tid / 8, cc = tid % 8;
    const int tiles_x = (cols + FP8_WIDE_TILE - 1) / FP8_WIDE_TILE, tiles_y = (rows + FP8_WIDE_TILE - 1) / FP8_WIDE_TILE;
    const long long num_tiles = (long long)tiles_x * tiles_y;
    auto origin = [&](long long tile, int& r0, int& c0) { // down each column of tiles, then the next column
        r0 = (int)(tile % tiles_y) * FP8_WIDE_TILE;
        c0 = (int)(tile / tiles_y) * FP8_WIDE_TILE;
    };
    auto load = [&](long long tile, uint4 (&v)[4]) {
        int r0, c0;
        origin(tile, r0, c0);
        const int c = c0 + 16 * cc;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + 4 * rg + i;
            v[i] = (r < rows && c < cols) ? *reinterpret_cast<const uint4*>(in + (size_t)r * cols + c) : make_uint4(0, 0, 0, 0);
        }
    };
    uint4 next[4];
    if (blockIdx.x < num_tiles) load(blockIdx.x, next);
    int buf = 0;
    for (long long tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, buf ^= 1) {
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = next[i];
        if (tile + gridDim.x < num_tiles) load(tile + gridDim.x, next); // in flight while this tile is staged and stored
        uint32_t* t = tile_t[buf];
        const int g = rg / 4, within = rg % 4;
#pragma unroll
        for (int k = 0; k < 4; k++) { // columns 16 cc + 4 k .. + 3
            const uint32_t row_word[4] = {(&v[0].x)[k], (&v[1].x)[k], (&v[2].x)[k], (&v[3].x)[k]};
            uint32_t col_word[4];
            fp8_transpose4x4(row_word, col_word);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = 16 * cc + 4 * k + j;
                t[c * 32 + 4 * (g ^ (cc % 8)) + within] = col_word[j];
            }
        }
        __syncthreads();
        int r0, c0;
        origin(tile, r0, c0);
        const int q = tid % 8;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = tid / 8 + 32 * i; // the tile's column c: row c0 + c of out_t
            const uint4 w = *reinterpret_cast<const uint4*>(t + c * 32 + 4 * (q ^ (c / 16 % 8)));
            if (c0 + c < cols && r0 + 16 * q < rows) *reinterpret_cast<uint4*>(out_t + (size_t)(c0 + c) * rows + r0 + 16 * q) = w;
        }
    }
}

// max |x| over n values into *amax_out (atomicMax on the bits; the caller zeroes it first)
__global__ void amax_kernel(uint32_t* amax_out, const floatX* in, long long n, bool gelu_of_input) {
    uint32_t amax = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        amax = max(amax, llmc::amax_bits(gelu_of_input ? (float)(floatX)gelu_value((float)in[i]) : (float)in[i]));
    for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0 && amax) atomicMax(amax_out, amax);
}

// ---- host wrappers -------------------------------------------------------------------------------
// how many blocks of `kernel` (threads each, static shared memory only) the whole GPU holds at once;
// asked once per kernel (a process uses one GPU)
template <typename Kernel>
inline long long resident_blocks(Kernel kernel, int threads) {
    static std::map<std::pair<const void*, int>, long long> known;
    const auto key = std::make_pair((const void*)kernel, threads);
    auto it = known.find(key);
    if (it != known.end()) return it->second;
    int device = 0, sms = 0, per_sm = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    return known[key] = (long long)sms * std::max(per_sm, 1);
}

inline int fp8_grid_size(long long work, int threads) {
    // enough blocks to fill the GPU several times over (16 per SM); the kernels stride over the rest
    return (int)std::max<long long>(1, std::min<long long>(ceil_div(work, threads), 16LL * device_sm_count()));
}

// run_only_if (may be null): a device flag; the pass does nothing unless it is non-zero (a redone pass
// after a speculative one, recipes/tcfp12/recipe.h's speculative fresh scales), decided on the GPU with no sync.
template <Fp8Kind K>
inline void fp8_quantize(uint8_t* out, const floatX* in, long long n, const float* scale, uint32_t* amax_out,
                         Fp8Stats stats, cudaStream_t stream, const int* run_only_if = nullptr) {
    const bool count = stats.counts != nullptr;
    if (n % 8 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)out % 8 == 0) {
        auto kernel = count ? fp8_quantize_kernel<K, true> : fp8_quantize_kernel<K, false>;
        kernel<<<fp8_grid_size(n / 8, 256), 256, 0, stream>>>(out, in, n / 8, scale, amax_out, stats, run_only_if);
    } else {
        // unaligned: the tile kernel treats the tensor as one row
        auto kernel = count ? fp8_quantize_transpose_kernel<K, true> : fp8_quantize_transpose_kernel<K, false>;
        kernel<<<fp8_grid_size(ceil_div(n, FP8_TILE), 1), 256, 0, stream>>>(out, nullptr, in, 1, (int)n, scale, amax_out,
                                                                           stats, nullptr, nullptr, false, run_only_if,
                                                                           GeluFactor::EXACT);
    }
    cudaCheckLaunch();
}

// out (rows x cols, may be null) and out_t (cols x rows, may be null) from in (rows x cols); with
// col_partials (ceil(rows / 64) * cols floats), the column sums of the input per 64-row tile (the bias
// gradient's partial sums, from the same read), and with col_sums as well, col_sums[c] += their total.
// With gelu_pre, the input is first multiplied by the GELU factor of gelu_pre (gelu_factor: gelu'(gelu_pre) in
// FP32 by default; the FP8 recipe's rounded or stored one); with gelu_of_input, the tensor quantized is gelu(in)
// (see the kernel). run_only_if: as fp8_quantize's.
template <Fp8Kind K>
inline void fp8_quantize_transpose(uint8_t* out, uint8_t* out_t, const floatX* in, int rows, int cols,
                                   const float* scale, uint32_t* amax_out, Fp8Stats stats, cudaStream_t stream,
                                   float* col_sums = nullptr, float* col_partials = nullptr,
                                   const floatX* gelu_pre = nullptr, bool gelu_of_input = false,
                                   const int* run_only_if = nullptr, GeluFactor gelu_factor = GeluFactor::EXACT) {
    const long long tiles = (long long)ceil_div(cols, FP8_TILE) * ceil_div(rows, FP8_TILE);
    auto kernel = stats.counts ? fp8_quantize_transpose_kernel<K, true> : fp8_quantize_transpose_kernel<K, false>;
    // as many blocks as are resident at once (each walks over tiles, prefetching the next)
    const int grid = (int)std::min<long long>(tiles, resident_blocks(kernel, 256));
    kernel<<<grid, 256, 0, stream>>>(out, out_t, in, rows, cols, scale, amax_out, stats, col_partials, gelu_pre,
                                     gelu_of_input, run_only_if, gelu_factor);
    cudaCheckLaunch();
    if (col_sums) {
        // the per-tile rows added in a fixed order (matmul.cuh; not one thread per column walking them all)
        bias_backward_reduce(col_sums, col_partials, cols, ceil_div(rows, FP8_TILE), stream);
    }
}

// small_tiles: the 64 x 64 kernel even where the 128 x 128 one applies (for tests and timings)
inline void fp8_transpose(uint8_t* out_t, const uint8_t* in, int rows, int cols, cudaStream_t stream, bool small_tiles = false) {
    if (!small_tiles && fp8_transpose_wide_supported(out_t, in, rows, cols)) {
        const long long tiles = (long long)ceil_div(cols, FP8_WIDE_TILE) * ceil_div(rows, FP8_WIDE_TILE);
        const int grid = (int)std::min<long long>(tiles, resident_blocks(fp8_transpose_wide_kernel, 256));
        fp8_transpose_wide_kernel<<<grid, 256, 0, stream>>>(out_t, in, rows, cols);
        cudaCheckLaunch();
        return;
    }
    const long long tiles = (long long)ceil_div(cols, FP8_TILE) * ceil_div(rows, FP8_TILE);
    const int grid = (int)std::min<long long>(tiles, resident_blocks(fp8_transpose_kernel, 256));
    fp8_transpose_kernel<<<grid, 256, 0, stream>>>(out_t, in, rows, cols);
    cudaCheckLaunch();
}

// The same with 16-byte loads (8 values per thread and iteration) and one atomic per block: the
// recipes that scale afresh (tcfp12) run it before every quantization, so it must run at memory speed.
// gelu_of_input: the amax of gelu(in) rounded to floatX, as gelu_forward stores it (TCFP-12's fc
// projection input, which the fc layer leaves unwritten; fp8_quantize_transpose's gelu_of_input).
__global__ void __launch_bounds__(256) amax_vec_kernel(uint32_t* amax_out, const floatX* in, long long n8, bool gelu_of_input) {
    uint32_t amax = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
        uint4 packed = reinterpret_cast<const uint4*>(in)[i];
        const floatX* v = reinterpret_cast<const floatX*>(&packed);
        if (gelu_of_input) {
#pragma unroll
            for (int j = 0; j < 8; j++) amax = max(amax, llmc::amax_bits((float)(floatX)gelu_value((float)v[j])));
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) amax = max(amax, llmc::amax_bits((float)v[j]));
        }
    }
    block_max_atomic(amax, amax_out);
}

inline void tensor_amax(uint32_t* amax_out, const floatX* in, long long n, cudaStream_t stream, bool gelu_of_input = false) {
    if (n % 8 == 0 && (uintptr_t)in % 16 == 0) {
        amax_vec_kernel<<<fp8_grid_size(n / 8, 256), 256, 0, stream>>>(amax_out, in, n / 8, gelu_of_input);
    } else {
        amax_kernel<<<fp8_grid_size(n, 256), 256, 0, stream>>>(amax_out, in, n, gelu_of_input);
    }
    cudaCheckLaunch();
}
