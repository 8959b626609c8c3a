// formats/fp8_block_quantize.cuh: BF16 -> FP8 quantization with block scales (formats/fp8_block_scaling.h),
// the kernels of the FP8 recipe's -fs block. Each kernel computes its blocks' scales from the values it
// quantizes (no amax pass before it, no history), writes the codes and the dequantization factors 1/s in
// the layouts cuBLASLt's block-scaled GEMMs read, and matches the CPU reference quantizers of
// fp8_block_scaling.h bit for bit (build/test_fp8).
//
// One kernel, two kinds of blocks, over a (rows x cols) row-major BF16 tensor in 128 x 128 tiles:
//   activation (weight = false)  rows:  codes (rows x cols), one scale per 1 x 128 block of a row (K = cols)
//                                cols:  codes (cols x rows), the transpose, one scale per 128 values of a
//                                       column (K = rows: the weight gradient's reduction over tokens)
//   weight (weight = true)       one scale per 128 x 128 block, the same codes in both layouts (W and W^T),
//                                and the factors in the 128 x 128 layout of each
// Either layout may be skipped (null). A tile lies in shared memory as BF16 (128 x 136: 16 bytes of padding
// a row); each warp then owns 16 rows (rows pass) or 16 columns (cols pass), one at a time, a lane holding 4
// consecutive values of it: the block's amax is a warp's max reduction, and the lane writes its 4 codes as
// one 32-bit word. Values past the tensor's edge load as zeros and are neither stored nor part of a block's
// amax beyond what zeros add (nothing), which is the reference's tail-block rule.
#pragma once
#include <cuda_fp8.h>
#include "llmc/cuda_common.h"
#include "fp8_block_scaling.h"
#include "fp8_quantize.cuh"

#define FP8_BLOCK_TILE_STRIDE 136 // floatX per row of the staged tile (128 + 8: 16-byte aligned rows)

// where a block quantization writes (any field may be null; a layout is written when its codes are given)
struct Fp8BlockOutput {
    uint8_t* rows = nullptr;     // (rows x cols) codes
    float* rows_inv = nullptr;   // their factors: 1 x 128 layout of (rows x cols), or 128 x 128 for a weight
    uint8_t* cols = nullptr;     // (cols x rows) codes, the transpose
    float* cols_inv = nullptr;   // their factors: 1 x 128 layout of (cols x rows), or 128 x 128 for a weight
};

template <Fp8Kind K>
__device__ __forceinline__ uint8_t fp8_block_code(float v) { return (uint8_t)(fp8_pack2<K>(v, 0.0f) & 0xFF); }

template <Fp8Kind K, bool COUNT>
__global__ void __launch_bounds__(256) fp8_block_quantize_kernel(const floatX* __restrict__ in, int rows, int cols, bool weight,
                                                                 bool pow2, Fp8BlockOutput o, uint32_t* amax_out, Fp8Stats stats) {
    __shared__ __align__(16) floatX tile[llmc::FP8_BLOCK * FP8_BLOCK_TILE_STRIDE];
    __shared__ uint32_t warp_amax[8];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int tiles_x = llmc::fp8_blocks(cols), tiles_y = llmc::fp8_blocks(rows);
    const long long num_tiles = (long long)tiles_x * tiles_y;
    const bool vec_in = cols % 8 == 0 && (uintptr_t)in % 16 == 0;
    const float fp8_max = fp8_max_value<K>();
    uint32_t amax_all = 0, sat = 0, ftz = 0, count = 0;
    for (long long tile_id = blockIdx.x; tile_id < num_tiles; tile_id += gridDim.x) {
        const int rb = (int)(tile_id / tiles_x), kb = (int)(tile_id % tiles_x);
        const int r0 = rb * llmc::FP8_BLOCK, c0 = kb * llmc::FP8_BLOCK;
        // stage the tile: 128 rows of 16 chunks of 8 values
        uint32_t tile_amax = 0;
        for (int i = tid; i < llmc::FP8_BLOCK * 16; i += blockDim.x) {
            const int r = i / 16, c = (i % 16) * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r0 + r < rows) {
                if (vec_in && c0 + c + 8 <= cols) {
                    v = *reinterpret_cast<const uint4*>(in + (size_t)(r0 + r) * cols + c0 + c);
                } else {
                    floatX x[8];
                    for (int j = 0; j < 8; j++) x[j] = (floatX)0.0f;
                    for (int j = 0; j < 8 && c0 + c + j < cols; j++) x[j] = in[(size_t)(r0 + r) * cols + c0 + c + j];
                    memcpy(&v, x, 16);
                }
            }
            *reinterpret_cast<uint4*>(tile + r * FP8_BLOCK_TILE_STRIDE + c) = v;
            const floatX* x = reinterpret_cast<const floatX*>(&v);
#pragma unroll
            for (int j = 0; j < 8; j++) tile_amax = max(tile_amax, llmc::amax_bits((float)x[j]));
        }
        // the tile's amax (a weight's block scale); also the tensor's
        for (int s = 16; s > 0; s >>= 1) tile_amax = max(tile_amax, __shfl_xor_sync(0xffffffffu, tile_amax, s));
        if (lane == 0) warp_amax[warp] = tile_amax;
        __syncthreads();
        tile_amax = 0;
        for (int w = 0; w < 8; w++) tile_amax = max(tile_amax, warp_amax[w]);
        amax_all = max(amax_all, tile_amax);
        const float s_tile = llmc::fp8_block_scale(__uint_as_float(tile_amax), fp8_max, pow2);
        if (weight && tid == 0) {
            if (o.rows_inv) o.rows_inv[llmc::fp8_blk128_scale_index(rb, kb, cols)] = llmc::fp8_inverse(s_tile);
            if (o.cols_inv) o.cols_inv[llmc::fp8_blk128_scale_index(kb, rb, rows)] = llmc::fp8_inverse(s_tile);
        }
        // rows pass: row r's 128 values of this tile are one block (or the weight's tile scale)
        if (o.rows) {
            for (int rr = 0; rr < 16; rr++) {
                const int r = warp * 16 + rr;
                if (r0 + r >= rows) break; // (the same for the whole warp)
                float v[4];
                uint32_t a = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    v[j] = (float)tile[r * FP8_BLOCK_TILE_STRIDE + lane * 4 + j];
                    a = max(a, llmc::amax_bits(v[j]));
                }
                float s = s_tile;
                if (!weight) {
                    for (int sh = 16; sh > 0; sh >>= 1) a = max(a, __shfl_xor_sync(0xffffffffu, a, sh));
                    s = llmc::fp8_block_scale(__uint_as_float(a), fp8_max, pow2);
                    if (lane == 0 && o.rows_inv) o.rows_inv[llmc::fp8_vec128_scale_index(r0 + r, kb, rows)] = llmc::fp8_inverse(s);
                }
                uint32_t word = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint8_t q = fp8_block_code<K>(v[j] * s);
                    word |= (uint32_t)q << (8 * j);
                    if (COUNT && c0 + lane * 4 + j < cols) {
                        uint32_t unused = 0;
                        fp8_account<K, true>(v[j], s, q, unused, sat, ftz);
                        count += 1;
                    }
                }
                const int c = c0 + lane * 4;
                uint8_t* dst = o.rows + (size_t)(r0 + r) * cols + c;
                if (c + 4 <= cols && cols % 4 == 0 && (uintptr_t)o.rows % 4 == 0) {
                    *reinterpret_cast<uint32_t*>(dst) = word;
                } else {
                    for (int j = 0; j < 4; j++)
                        if (c + j < cols) dst[j] = (uint8_t)(word >> (8 * j));
                }
            }
        }
        // cols pass: column c's 128 values of this tile (rows r0 ..) are one block of the transpose's row c
        if (o.cols) {
            const bool count_here = COUNT && (!weight || !o.rows); // (a weight's codes are the same in both layouts)
            for (int cc = 0; cc < 16; cc++) {
                const int c = warp * 16 + cc;
                if (c0 + c >= cols) break;
                float v[4];
                uint32_t a = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    v[j] = (float)tile[(lane * 4 + j) * FP8_BLOCK_TILE_STRIDE + c];
                    a = max(a, llmc::amax_bits(v[j]));
                }
                float s = s_tile;
                if (!weight) {
                    for (int sh = 16; sh > 0; sh >>= 1) a = max(a, __shfl_xor_sync(0xffffffffu, a, sh));
                    s = llmc::fp8_block_scale(__uint_as_float(a), fp8_max, pow2);
                    if (lane == 0 && o.cols_inv) o.cols_inv[llmc::fp8_vec128_scale_index(c0 + c, rb, cols)] = llmc::fp8_inverse(s);
                }
                uint32_t word = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint8_t q = fp8_block_code<K>(v[j] * s);
                    word |= (uint32_t)q << (8 * j);
                    if (count_here && r0 + lane * 4 + j < rows) {
                        uint32_t unused = 0;
                        fp8_account<K, true>(v[j], s, q, unused, sat, ftz);
                        count += 1;
                    }
                }
                const int r = r0 + lane * 4;
                uint8_t* dst = o.cols + (size_t)(c0 + c) * rows + r;
                if (r + 4 <= rows && rows % 4 == 0 && (uintptr_t)o.cols % 4 == 0) {
                    *reinterpret_cast<uint32_t*>(dst) = word;
                } else {
                    for (int j = 0; j < 4; j++)
                        if (r + j < rows) dst[j] = (uint8_t)(word >> (8 * j));
                }
            }
        }
        __syncthreads(); // (the tile and warp_amax are staged again)
    }
    fp8_commit(amax_all, sat, ftz, count, amax_out, stats);
}

// The block quantization of in (rows x cols): activation blocks (1 x 128 along the rows for o.rows, along the
// columns for o.cols) or, with weight, 128 x 128 blocks. amax_out (may be null): the tensor's amax (atomicMax
// on the bits); stats (when counting, -lq): values, saturated, flushed to zero, over the codes written (both
// layouts of an activation, so its values count twice).
template <Fp8Kind K>
inline void fp8_block_quantize(const floatX* in, int rows, int cols, bool weight, bool pow2, Fp8BlockOutput o, uint32_t* amax_out,
                               Fp8Stats stats, cudaStream_t stream) {
    const long long tiles = (long long)llmc::fp8_blocks(rows) * llmc::fp8_blocks(cols);
    auto kernel = stats.counts ? fp8_block_quantize_kernel<K, true> : fp8_block_quantize_kernel<K, false>;
    const int grid = (int)std::max<long long>(1, std::min<long long>(tiles, resident_blocks(kernel, 256)));
    kernel<<<grid, 256, 0, stream>>>(in, rows, cols, weight, pow2, o, amax_out, stats);
    cudaCheckLaunch();
}

// Telemetry of block scales: a histogram of floor(log2 s) over the n dequantization factors 1/s in inv, into
// hist[0 .. 255] (bin floor(log2 s) + 128, clamped), atomicAdd. floor(log2 s) = -ceil(log2 (1/s)), from the
// factor's exponent and whether its mantissa is zero. Padding slots (0: never written) are skipped.
__global__ void fp8_scale_log2_histogram_kernel(const float* inv, long long n, uint32_t* hist) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const uint32_t b = __float_as_uint(inv[i]);
        if ((b & 0x7FFFFFFFu) == 0 || (b & 0x7F800000u) == 0x7F800000u) continue;
        const int e = (int)((b >> 23) & 0xFF) - 127 + ((b & 0x7FFFFFu) != 0 ? 1 : 0); // ceil(log2 inv) for normal inv
        const int bin = min(255, max(0, -e + 128));
        atomicAdd(&hist[bin], 1u);
    }
}
inline void fp8_scale_log2_histogram(const float* inv, long long n, uint32_t* hist, cudaStream_t stream) {
    fp8_scale_log2_histogram_kernel<<<fp8_grid_size(n, 256), 256, 0, stream>>>(inv, n, hist);
    cudaCheckLaunch();
}
