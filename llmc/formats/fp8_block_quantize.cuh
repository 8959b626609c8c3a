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
// Either layout may be skipped (null). The values quantized may be a function of the tensor read, applied to
// each value as it is staged and rounded to BF16 as the separate pass would store it (Fp8BlockInput): the GELU
// of a pre-activation (the fc projection's input, which the fc layer then need not write), or the product with
// the GELU derivative of a pre-activation (the fc layer's output gradient, from the fc projection's input
// gradient). The cols pass can also leave each column's sum over the tile's 128 rows (the bias gradient's
// partial sums, of the values quantized). Values past the tensor's edge load as zeros and are neither stored nor
// part of a block's amax beyond what zeros add (nothing), which is the reference's tail-block rule.
//
// Work layout. A tile lies in shared memory as BF16 pairs, one 32-bit word holding two neighbouring values of a
// row, 65 words a row (64 for the 128 values, 1 of padding): word w of row r sits in bank (r + w) mod 32. Each
// 128-value block (a row's or a column's) belongs to a group of 8 lanes, 16 values a lane: a warp works on 4
// blocks at once, the block's amax is 3 shuffles within the group, and the scale's divisions are computed once
// for the 4 blocks. Which words a lane reads is chosen so that the warp's 32 reads of one instruction fall into
// 32 different banks (the rows and cols passes below say how). The costs that matter are those per block (a
// reduction and two IEEE divisions), not per value: a whole warp to each block, one block after another, would
// spend its time on those, far from the memory's speed.
#pragma once
#include <cuda_fp8.h>
#include "llmc/cuda_common.h"
#include "fp8_block_scaling.h"
#include "fp8_quantize.cuh"

#define FP8_BLOCK_THREADS 256   // 8 warps; a tile's 2048 chunks of 8 values are 8 a thread
#define FP8_BLOCK_ROW_WORDS 65  // 32-bit words per staged row (odd: see above)
#define FP8_BLOCK_ROWS_PER_WARP (128 / (FP8_BLOCK_THREADS / 32))   // the rows pass's rows of a warp
#define FP8_BLOCK_PAIRS_PER_WARP (64 / (FP8_BLOCK_THREADS / 32))   // the cols pass's column pairs of a warp

// where a block quantization writes (any field may be null; a layout is written when its codes are given)
struct Fp8BlockOutput {
    uint8_t* rows = nullptr;     // (rows x cols) codes
    float* rows_inv = nullptr;   // their factors: 1 x 128 layout of (rows x cols), or 128 x 128 for a weight
    uint8_t* cols = nullptr;     // (cols x rows) codes, the transpose
    float* cols_inv = nullptr;   // their factors: 1 x 128 layout of (cols x rows), or 128 x 128 for a weight
};

// what a block quantization reads besides the tensor (all optional)
struct Fp8BlockInput {
    bool gelu_of_input = false;              // quantize gelu(x), as gelu_forward stores it
    const floatX* gelu_pre = nullptr;        // quantize x * gelu'(pre), as gelu_backward stores it (same shape as x)
    GeluFactor gelu_factor = GeluFactor::EXACT; // (how gelu_pre gives the derivative: gelu.cuh)
    float* col_partials = nullptr;           // (ceil(rows / 128) x cols) the column sums of each 128-row tile;
                                             // needs the cols layout
};

__device__ __forceinline__ float bf16_low(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_high(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// 8 staged values after the input's function (Fp8BlockInput), each rounded to BF16
__device__ __forceinline__ uint4 fp8_block_transform(uint4 v, uint4 pre, const Fp8BlockInput& fn) {
    floatX x[8], p[8];
    memcpy(x, &v, 16);
    memcpy(p, &pre, 16);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (fn.gelu_of_input) x[j] = (floatX)gelu_value((float)x[j]);
        if (fn.gelu_pre) x[j] = (floatX)((float)x[j] * gelu_backward_factor(fn.gelu_factor, (float)p[j]));
    }
    memcpy(&v, x, 16);
    return v;
}

// the max of a over a group of 8 lanes (the block's amax) and the scale it gives
__device__ __forceinline__ float fp8_block_group_scale(uint32_t a, float fp8_max, bool pow2) {
    for (int sh = 1; sh < 8; sh <<= 1) a = max(a, __shfl_xor_sync(0xffffffffu, a, sh));
    return llmc::fp8_block_scale(__uint_as_float(a), fp8_max, pow2);
}

template <Fp8Kind K, bool COUNT>
__global__ void __launch_bounds__(FP8_BLOCK_THREADS, 3) fp8_block_quantize_kernel(const floatX* __restrict__ in, int rows, int cols,
                                                                                bool weight, bool pow2, Fp8BlockOutput o,
                                                                                uint32_t* amax_out, Fp8Stats stats, Fp8BlockInput fn) {
    static_assert(sizeof(floatX) == 2, "the staged tile holds BF16 pairs");
    __shared__ uint32_t tile[llmc::FP8_BLOCK * FP8_BLOCK_ROW_WORDS];
    __shared__ uint32_t warp_amax[FP8_BLOCK_THREADS / 32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, group = lane / 8, sub = lane % 8;
    const int tiles_x = llmc::fp8_blocks(cols), tiles_y = llmc::fp8_blocks(rows);
    const long long num_tiles = (long long)tiles_x * tiles_y;
    const bool vec_in = cols % 8 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)fn.gelu_pre % 16 == 0;
    const bool transform = fn.gelu_of_input || fn.gelu_pre;
    const bool rows_u64 = cols % 8 == 0 && (uintptr_t)o.rows % 8 == 0; // (8-byte stores of a row's codes)
    const bool cols_u32 = rows % 4 == 0 && (uintptr_t)o.cols % 4 == 0; // (4-byte stores of the transpose's)
    const float fp8_max = fp8_max_value<K>();
    uint32_t amax_all = 0, sat = 0, ftz = 0, count = 0;
    // one value's telemetry
    auto account = [&](float v, float s, uint8_t q) {
        if (COUNT) {
            uint32_t unused = 0;
            fp8_account<K, true>(v, s, q, unused, sat, ftz);
            count += 1;
        }
    };
    for (long long tile_id = blockIdx.x; tile_id < num_tiles; tile_id += gridDim.x) {
        const int rb = (int)(tile_id / tiles_x), kb = (int)(tile_id % tiles_x);
        const int r0 = rb * llmc::FP8_BLOCK, c0 = kb * llmc::FP8_BLOCK;
        // stage the tile: 128 rows of 16 chunks of 8 values, every load issued before the first store
        // (8 values of a row from src, zeros past the tensor's edge)
        auto load8 = [&](const floatX* src, int r, int c) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r0 + r < rows) {
                if (vec_in && c0 + c + 8 <= cols) {
                    v = *reinterpret_cast<const uint4*>(src + (size_t)(r0 + r) * cols + c0 + c);
                } else {
                    floatX x[8];
                    for (int j = 0; j < 8; j++) x[j] = (floatX)0.0f;
                    for (int j = 0; j < 8 && c0 + c + j < cols; j++) x[j] = src[(size_t)(r0 + r) * cols + c0 + c + j];
                    memcpy(&v, x, 16);
                }
            }
            return v;
        };
        // (two rounds of 4 chunks a thread: 4 loads in flight, or 8 with gelu_pre, in few enough registers for 3
        // blocks an SM)
        uint32_t tile_amax = 0;
#pragma unroll
        for (int round = 0; round < 2; round++) {
            uint4 chunk[4], pre[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int id = tid + (4 * round + i) * FP8_BLOCK_THREADS;
                chunk[i] = load8(in, id / 16, (id % 16) * 8);
                pre[i] = fn.gelu_pre ? load8(fn.gelu_pre, id / 16, (id % 16) * 8) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if (transform) chunk[i] = fp8_block_transform(chunk[i], pre[i], fn); // (past the edge: gelu(0) = 0,
                                                                                    // and 0 times any derivative is 0)
                const int id = tid + (4 * round + i) * FP8_BLOCK_THREADS, r = id / 16, w = (id % 16) * 4;
                const uint32_t words[4] = {chunk[i].x, chunk[i].y, chunk[i].z, chunk[i].w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    tile[r * FP8_BLOCK_ROW_WORDS + w + k] = words[k];
                    tile_amax = max(tile_amax, max(llmc::amax_bits(bf16_low(words[k])), llmc::amax_bits(bf16_high(words[k]))));
                }
            }
        }
        // the tile's amax (a weight's block scale); also the tensor's
        for (int s = 16; s > 0; s >>= 1) tile_amax = max(tile_amax, __shfl_xor_sync(0xffffffffu, tile_amax, s));
        if (lane == 0) warp_amax[warp] = tile_amax;
        __syncthreads();
        tile_amax = 0;
        for (int w = 0; w < FP8_BLOCK_THREADS / 32; w++) tile_amax = max(tile_amax, warp_amax[w]);
        amax_all = max(amax_all, tile_amax);
        const float s_tile = llmc::fp8_block_scale(__uint_as_float(tile_amax), fp8_max, pow2);
        if (weight && tid == 0) {
            if (o.rows_inv) o.rows_inv[llmc::fp8_blk128_scale_index(rb, kb, cols)] = llmc::fp8_inverse(s_tile);
            if (o.cols_inv) o.cols_inv[llmc::fp8_blk128_scale_index(kb, rb, rows)] = llmc::fp8_inverse(s_tile);
        }
        // rows pass: row r's 128 values of this tile are one block (or the weight's tile scale). A warp takes
        // 4 rows at a time, 8 lanes a row: lane sub of the group holds words 4 sub .. 4 sub + 3 and 32 + 4 sub ..
        // 32 + 4 sub + 3 (values 8 sub .. 8 sub + 7 and 64 + 8 sub .. 64 + 8 sub + 7), in banks (row + 4 sub + j)
        // mod 32: distinct over the warp's 4 rows and 8 subs. The block's amax is then 3 shuffles within the
        // group, and its scale is computed once for 4 blocks.
        if (o.rows) {
            for (int it = 0; it < FP8_BLOCK_ROWS_PER_WARP / 4; it++) {
                const int r = warp * FP8_BLOCK_ROWS_PER_WARP + it * 4 + group;
                const bool row_in = r0 + r < rows; // (rows past the edge are zeros: they go through, unstored)
                float v[16];
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const uint32_t w = tile[r * FP8_BLOCK_ROW_WORDS + 32 * h + 4 * sub + j];
                        v[8 * h + 2 * j] = bf16_low(w);
                        v[8 * h + 2 * j + 1] = bf16_high(w);
                    }
                float s = s_tile;
                if (!weight) {
                    uint32_t a = 0;
#pragma unroll
                    for (int j = 0; j < 16; j++) a = max(a, llmc::amax_bits(v[j]));
                    s = fp8_block_group_scale(a, fp8_max, pow2);
                    if (sub == 0 && row_in && o.rows_inv) o.rows_inv[llmc::fp8_vec128_scale_index(r0 + r, kb, rows)] = llmc::fp8_inverse(s);
                }
                uint8_t* dst = o.rows + (size_t)(r0 + r) * cols;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int c = c0 + 64 * h + 8 * sub;
                    uint32_t word[2];
#pragma unroll
                    for (int k = 0; k < 2; k++) {
                        const float* x = v + 8 * h + 4 * k;
                        word[k] = fp8_pack2<K>(x[0] * s, x[1] * s) | ((uint32_t)fp8_pack2<K>(x[2] * s, x[3] * s) << 16);
                    }
                    if (!row_in) continue;
                    if (rows_u64 && c + 8 <= cols) {
                        *reinterpret_cast<uint2*>(dst + c) = make_uint2(word[0], word[1]);
                    } else {
                        for (int j = 0; j < 8 && c + j < cols; j++) dst[c + j] = (uint8_t)(word[j / 4] >> (8 * (j % 4)));
                    }
                    if (COUNT) {
                        for (int j = 0; j < 8 && c + j < cols; j++) account(v[8 * h + j], s, (uint8_t)(word[j / 4] >> (8 * (j % 4))));
                    }
                }
            }
        }
        // cols pass: column c's 128 values of this tile (rows r0 ..) are one block of the transpose's row c. A warp
        // takes 4 column pairs (2p, 2p + 1) at a time, 8 lanes a pair: lane sub of the group holds the pair's word
        // of rows 32 h + 4 sub + j (h, j = 0 .. 3), in banks (4 sub + j + p) mod 32: distinct over the warp's 4
        // pairs and 8 subs. Each lane then writes 4 consecutive codes of the transpose's row as one word.
        if (o.cols) {
            const bool count_here = COUNT && (!weight || !o.rows); // (a weight's codes are the same in both layouts)
            for (int it = 0; it < FP8_BLOCK_PAIRS_PER_WARP / 4; it++) {
                const int p = warp * FP8_BLOCK_PAIRS_PER_WARP + it * 4 + group;
                uint32_t w[16];
#pragma unroll
                for (int h = 0; h < 4; h++)
#pragma unroll
                    for (int j = 0; j < 4; j++) w[4 * h + j] = tile[(32 * h + 4 * sub + j) * FP8_BLOCK_ROW_WORDS + p];
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int c = c0 + 2 * p + half;
                    const bool col_in = c < cols;
                    float v[16];
                    uint32_t a = 0;
#pragma unroll
                    for (int j = 0; j < 16; j++) {
                        v[j] = half ? bf16_high(w[j]) : bf16_low(w[j]);
                        a = max(a, llmc::amax_bits(v[j]));
                    }
                    float s = s_tile;
                    if (!weight) {
                        s = fp8_block_group_scale(a, fp8_max, pow2);
                        if (sub == 0 && col_in && o.cols_inv) o.cols_inv[llmc::fp8_vec128_scale_index(c, rb, cols)] = llmc::fp8_inverse(s);
                    }
                    if (fn.col_partials) { // (the lane's 16 rows in order, then the group's 8 lanes in a fixed tree)
                        float sum = 0.0f;
#pragma unroll
                        for (int j = 0; j < 16; j++) sum += v[j];
                        for (int sh = 1; sh < 8; sh <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, sh);
                        if (sub == 0 && col_in) fn.col_partials[(size_t)rb * cols + c] = sum;
                    }
                    if (!col_in) continue;
                    uint8_t* dst = o.cols + (size_t)c * rows;
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        const float* x = v + 4 * h;
                        const uint32_t word = fp8_pack2<K>(x[0] * s, x[1] * s) | ((uint32_t)fp8_pack2<K>(x[2] * s, x[3] * s) << 16);
                        const int r = r0 + 32 * h + 4 * sub;
                        if (cols_u32 && r + 4 <= rows) {
                            *reinterpret_cast<uint32_t*>(dst + r) = word;
                        } else {
                            for (int j = 0; j < 4 && r + j < rows; j++) dst[r + j] = (uint8_t)(word >> (8 * j));
                        }
                        if (count_here) {
                            for (int j = 0; j < 4 && r + j < rows; j++) account(x[j], s, (uint8_t)(word >> (8 * j)));
                        }
                    }
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
// layouts of an activation, so its values count twice), of the values quantized (after fn's function). fn: what
// else it reads and writes (Fp8BlockInput); with fn.col_partials and col_sums, col_sums[c] += the column sums
// (bias_backward_reduce over the tiles' partial sums, in a fixed order).
template <Fp8Kind K>
inline void fp8_block_quantize(const floatX* in, int rows, int cols, bool weight, bool pow2, Fp8BlockOutput o, uint32_t* amax_out,
                               Fp8Stats stats, cudaStream_t stream, const Fp8BlockInput& fn = Fp8BlockInput(),
                               float* col_sums = nullptr) {
    if ((fn.col_partials || col_sums) && (!o.cols || weight || !fn.col_partials)) {
        fprintf(stderr, "error: fp8_block_quantize: column sums need the cols layout of an activation and a partials buffer\n");
        exit(1);
    }
    const long long tiles = (long long)llmc::fp8_blocks(rows) * llmc::fp8_blocks(cols);
    auto kernel = stats.counts ? fp8_block_quantize_kernel<K, true> : fp8_block_quantize_kernel<K, false>;
    const int grid = (int)std::max<long long>(1, std::min<long long>(tiles, resident_blocks(kernel, FP8_BLOCK_THREADS)));
    kernel<<<grid, FP8_BLOCK_THREADS, 0, stream>>>(in, rows, cols, weight, pow2, o, amax_out, stats, fn);
    cudaCheckLaunch();
    if (col_sums) bias_backward_reduce(col_sums, fn.col_partials, cols, llmc::fp8_blocks(rows), stream);
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
