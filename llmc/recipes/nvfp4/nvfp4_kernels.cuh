// recipes/nvfp4/nvfp4_kernels.cuh: the NVFP4 quantization kernels of the nvfp4 recipe, and the
// emulated NVFP4 GEMM of Hopper.
//
// Every kernel here calls the __host__ __device__ functions of formats/nvfp4.h for each block, so its
// codes and scales are those of the CPU reference bit for bit (build/test_nvfp4 checks it).
//
// Emulation on Hopper (no FP4 tensor cores). An NVFP4 value is e2m1(q) * ue4m3(s) * g. The product
// e2m1 * ue4m3 has at most 2 + 4 significant bits and lies in [2^-10, 2688], so it is exact in
// BF16. The kernels therefore write the operand as BF16 "block-dequantized" values e2m1(q) * ue4m3(s)
// and leave the FP32 global scales out; the GEMM multiplies by alpha = g_a * g_b (a device
// pointer, computed by the quantize kernel). The BF16 GEMM then computes exactly the products an
// FP4 tensor core computes; only the FP32 accumulation order differs.
//
// Layouts. A GEMM operand is quantized in blocks of 16 along the GEMM's K dimension:
//   forward  y = x W^T   x (N x C): blocks along C, i.e. along the rows of the row-major x
//   dgrad    dx = dy W   dy (N x OC): blocks along OC (rows of dy)
//   wgrad    dW = dy^T x dy and x: blocks along N, i.e. down the columns of the row-major tensors,
//                        after a 16-point random Hadamard transform along N (the recipe's RHT)
//   weights  W (OC x C): 16x16 tiles, so W and W^T share one quantization (forward and dgrad)
// nvfp4_quantize_kernel does both directions from one read of a 16 x 64 patch: every thread owns
// one 1x16 row block and one 16x1 column block of the patch. (One kernel per direction, with the
// options as template parameters, is slower: it reads the tensor twice; dev/bench/nvfp4_quantize_bench.cu
// times the kernels.) The column numbering of the CPU
// reference is that of the transposed matrix (x^T quantized by rows).
//
// Native FP4 GEMMs (Blackwell, sm_100 and newer). The same kernels can also write each direction as
// the operand of cuBLASLt's block-scaled FP4 GEMM (Nvfp4Direction::codes / scales; the weight kernel's
// Nvfp4WeightNative): the E2M1 codes packed two per byte, K-major, and the UE4M3 block scales in
// cuBLAS's 128 x 4 tiled layout (formats/nvfp4.h, "native operands"). A row direction's operand is x itself
// (K = cols); a column direction's is x^T (K = rows), the layout wgrad's TN GEMM reads; the weights
// give W (K = C, forward) and W^T (K = OC, dgrad). The codes and scales are the very ones whose
// products the emulation writes in BF16, so the two paths differ only in the GEMM's accumulation order.
//
// Global scales need the tensor's amax before any block is encoded, so every activation and
// gradient is read twice: nvfp4_amax_kernel (the plain amax and, for the wgrad operands, the amax
// after the Hadamard transform), then the quantize kernel.
#pragma once
#include "llmc/cuda_common.h"
#include "llmc/formats/nvfp4.h"
#include "llmc/formats/fp8_quantize.cuh" // tensor_amax (the weights' amax)

using llmc::kNvfp4Block;

static const int NVFP4_PATCH_COLS = 64; // columns of one quantize patch (and block): 4 row blocks wide
static const int NVFP4_TILE_STRIP = 32; // 16x16 weight tiles per block of the weight kernel

// Telemetry of one quantized tensor (-lq): sums over its elements, in double.
//   [0] sum (x' - x)^2   [1] sum x^2   [2] elements   [3] non-zero x quantized to zero
static const int NVFP4_STATS = 4;

// One direction of nvfp4_quantize_kernel: where it writes and how it rounds.
struct Nvfp4Direction {
    floatX* out = nullptr;            // block-dequantized values e2m1 * ue4m3, x's shape; null = skip
    uint8_t* codes = nullptr;         // the native FP4 operand (x, or x^T for a column direction): packed
    uint8_t* scales = nullptr;        // K-major codes and tiled UE4M3 scales; null = skip
    const uint32_t* amax = nullptr;   // bits of the amax behind the global scale
    bool rht = false;                 // columns only: rotate each 16-block first
    bool stochastic = false;          // stochastic rounding (gradients)
    uint64_t seed = 0;                // the random bits' seed (nvfp4_sr_bits)
    float* alpha = nullptr;           // if set: *alpha = g * g_other, the GEMM's alpha
    const uint32_t* other_amax = nullptr; // the other GEMM operand's amax (for alpha)
    double* stats = nullptr;          // NVFP4_STATS sums, or null
};

__device__ __forceinline__ float nvfp4_global_of(const uint32_t* amax) {
    return llmc::nvfp4_global_scale(__uint_as_float(*amax));
}

// e2m1 * ue4m3, exact in BF16
__device__ __forceinline__ float nvfp4_block_value(uint8_t code, uint8_t scale_code) {
    return llmc::fp4e2m1_decode(code) * llmc::ue4m3_decode(scale_code);
}

// 8 floats -> 8 BF16 in one 16-byte word (exact here: the values are e2m1 * ue4m3)
__device__ __forceinline__ uint4 nvfp4_pack8(const float* v) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<uint32_t*>(&pair);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// One 16-value block of one direction: quantize x (formats/nvfp4.h), overwrite it with the
// block-dequantized values, and add the block's telemetry terms to tele. index0: the CPU
// reference's flat index of the block's first element (its elements follow at +1), the counter of
// the stochastic-rounding bits.
// codes, sc: the block's E2M1 codes and UE4M3 scale code.
__device__ __forceinline__ void nvfp4_block(float* x, const Nvfp4Direction& d, float g, bool four_over_six,
                                            uint64_t index0, float4& tele, uint8_t* codes, uint8_t& sc) {
    uint32_t bits[kNvfp4Block];
    if (d.stochastic) {
        llmc::nvfp4_sr_bits16(llmc::nvfp4_sr_key(d.seed), index0, bits);
    }
    // two calls rather than one with a conditional pointer: the bits then stay in registers
    if (d.stochastic)
        llmc::nvfp4_quantize_block16(x, g, llmc::Rounding::Stochastic, bits, four_over_six, codes, &sc);
    else
        llmc::nvfp4_quantize_block16(x, g, llmc::Rounding::NearestEven, nullptr, four_over_six, codes, &sc);
    if (d.stats) {
        // in units of g, so that tiny tensors do not underflow the squares
        const float inv_g = 1.0f / g;
#pragma unroll
        for (int i = 0; i < kNvfp4Block; i++) {
            const float q = nvfp4_block_value(codes[i], sc), xs = x[i] * inv_g, e = q - xs;
            tele.x += e * e;
            tele.y += xs * xs;
            tele.z += 1.0f;
            tele.w += (x[i] != 0.0f && q == 0.0f) ? 1.0f : 0.0f;
        }
    }
#pragma unroll
    for (int i = 0; i < kNvfp4Block; i++) x[i] = nvfp4_block_value(codes[i], sc);
}

// One block of a native operand: its 16 codes packed into 8 bytes at byte (row * k + k0) / 2 of
// d.codes (k0 a multiple of 16, so the store is 8-byte aligned), its scale at the tiled position.
__device__ __forceinline__ void nvfp4_store_native(const Nvfp4Direction& d, long long row, long long k0, long long k,
                                                   const uint8_t* codes, uint8_t sc) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < kNvfp4Block; i++) w[i / 8] |= (uint32_t)(codes[i] & 0xFu) << (4 * (i % 8));
    *reinterpret_cast<uint2*>(d.codes + (row * k + k0) / 2) = make_uint2(w[0], w[1]);
    d.scales[llmc::nvfp4_tiled_scale_offset((int)row, (int)(k0 / kNvfp4Block), (int)(k / kNvfp4Block))] = sc;
}

// Block-wide sums of the telemetry terms, one atomic per block and term. Every thread calls it.
__device__ __forceinline__ void nvfp4_commit_stats(double* stats, float4 t) {
    float v[NVFP4_STATS] = {t.x, t.y, t.z, t.w};
    __shared__ float s_part[NVFP4_STATS][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    __syncthreads(); // s_part may still be read by a previous call
#pragma unroll
    for (int k = 0; k < NVFP4_STATS; k++) {
        for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
        if (lane == 0) s_part[k][warp] = v[k];
    }
    __syncthreads();
    if (threadIdx.x < NVFP4_STATS) {
        double sum = 0.0;
        for (int w = 0; w < warps; w++) sum += s_part[threadIdx.x][w];
        atomicAdd(stats + threadIdx.x, sum);
    }
}

// ---------------------------------------------------------------------------------------------
// Amax: max |x| over a (rows x cols) tensor and, for the wgrad operands, max |Q x| over its 16-row
// column blocks (Q the Hadamard rotation). Each thread reads a 16 x 8 patch (16 16-byte loads).
// rows % 16 == 0, cols % 8 == 0. The amaxes are bits of non-negative floats combined with
// atomicMax (a NaN's bits exceed inf's: NaN stays sticky, as in nvfp4_amax_merge).
__global__ void nvfp4_amax_kernel(const floatX* x, int rows, int cols, uint32_t* amax_plain, uint32_t* amax_rot,
                                  bool rht, uint16_t signs) {
    const long long patches_per_row = cols / 8, patches = (long long)(rows / 16) * patches_per_row;
    uint32_t plain = 0u, rot = 0u;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < patches; p += (long long)gridDim.x * blockDim.x) {
        const long long r0 = p / patches_per_row * 16, c0 = p % patches_per_row * 8;
        float v[8][kNvfp4Block];
#pragma unroll
        for (int i = 0; i < kNvfp4Block; i++) {
            const uint4 packed = *reinterpret_cast<const uint4*>(x + (r0 + i) * cols + c0);
            const floatX* e = reinterpret_cast<const floatX*>(&packed);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                v[j][i] = (float)e[j];
                plain = max(plain, llmc::amax_bits(v[j][i]));
            }
        }
        if (rht) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                llmc::nvfp4_rht16(v[j], signs);
#pragma unroll
                for (int i = 0; i < kNvfp4Block; i++) rot = max(rot, llmc::amax_bits(v[j][i]));
            }
        }
    }
    if (!rht) rot = plain;
    for (int o = 16; o > 0; o >>= 1) {
        plain = max(plain, __shfl_xor_sync(0xffffffffu, plain, o));
        rot = max(rot, __shfl_xor_sync(0xffffffffu, rot, o));
    }
    if (threadIdx.x % 32 == 0) {
        atomicMax(amax_plain, plain);
        if (amax_rot) atomicMax(amax_rot, rot);
    }
}

// amax_plain and amax_rot are set (not accumulated): the kernel's atomics run on zeroed slots
inline void nvfp4_amax(const floatX* x, int rows, int cols, uint32_t* amax_plain, uint32_t* amax_rot, bool rht,
                       uint16_t signs, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(amax_plain, 0, sizeof(uint32_t), stream));
    if (amax_rot) cudaCheck(cudaMemsetAsync(amax_rot, 0, sizeof(uint32_t), stream));
    const long long patches = (long long)(rows / 16) * (cols / 8);
    nvfp4_amax_kernel<<<fp8_grid_size(patches, 128), 128, 0, stream>>>(x, rows, cols, amax_plain, amax_rot, rht, signs);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// Activations and gradients: 1x16 row blocks and/or 16x1 column blocks (with the optional RHT) of
// a (rows x cols) row-major tensor, from one read of each 16 x 64 patch. rows % 16 == 0 and
// cols % 64 == 0. 64 threads: thread t owns row block (t / 4, t % 4) and column t of the patch.
// At least 16 resident blocks of 64 threads per SM: that caps the kernel at 64 registers (ptxas spills
// 168 bytes a thread to L1) against the 96 it takes unbounded (10 blocks, 31% occupancy). The d12 step
// is faster with the bound than without; 20 or 24 blocks (48 registers or fewer) spill so much more
// that they are slower than 16.
static const int NVFP4_QUANTIZE_MIN_BLOCKS = 16;
// kValuesOnly: neither direction writes native codes or telemetry (every training step of the Hopper
// emulation but the -lq ones). Each block then goes through nvfp4_block16_values, which computes the
// block-dequantized values without codes (formats/nvfp4.h, "The emulation's hot path"); the other launches
// take nvfp4_block, the code path. Both give the same values bit for bit.
template <bool kValuesOnly>
__global__ void __launch_bounds__(NVFP4_PATCH_COLS, NVFP4_QUANTIZE_MIN_BLOCKS) nvfp4_quantize_kernel(const floatX* x, int rows, int cols,
                                                                          Nvfp4Direction rowd, Nvfp4Direction cold,
                                                                          bool four_over_six, uint16_t signs) {
    __shared__ float tile[kNvfp4Block][NVFP4_PATCH_COLS + 1];
    const int t = threadIdx.x;
    const long long r0 = (long long)blockIdx.y * kNvfp4Block, c0 = (long long)blockIdx.x * NVFP4_PATCH_COLS;
    // 16 rows x 64 columns = 128 16-byte loads, two per thread
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int i = t + k * NVFP4_PATCH_COLS, row = i / 8, col = i % 8 * 8;
        const uint4 packed = *reinterpret_cast<const uint4*>(x + (r0 + row) * cols + c0 + col);
        const floatX* e = reinterpret_cast<const floatX*>(&packed);
#pragma unroll
        for (int j = 0; j < 8; j++) tile[row][col + j] = (float)e[j];
    }
    __syncthreads();
    // Rows (1x16 blocks along a row), then columns (16x1 blocks down a column, after the optional RHT).
    // kValuesOnly: each block through nvfp4_block16_values, which computes the block-dequantized values
    // without codes; otherwise through nvfp4_block, the code path (native operands and/or telemetry).
    if (kValuesOnly ? rowd.out != nullptr : (rowd.out || rowd.codes)) {
        const int row = t / 4, b = t % 4;
        float v[kNvfp4Block];
#pragma unroll
        for (int i = 0; i < kNvfp4Block; i++) v[i] = tile[row][b * kNvfp4Block + i];
        const float g = nvfp4_global_of(rowd.amax);
        const long long off = (r0 + row) * cols + c0 + b * kNvfp4Block;
        if constexpr (kValuesOnly) {
            const uint64_t key = rowd.stochastic ? llmc::nvfp4_sr_key(rowd.seed) : 0u;
            llmc::nvfp4_block16_values(v, g, rowd.stochastic, key, (uint64_t)off, four_over_six, v);
            *reinterpret_cast<uint4*>(rowd.out + off) = nvfp4_pack8(v);
            *reinterpret_cast<uint4*>(rowd.out + off + 8) = nvfp4_pack8(v + 8);
        } else {
            float4 tele = make_float4(0.f, 0.f, 0.f, 0.f);
            uint8_t codes[kNvfp4Block], sc;
            nvfp4_block(v, rowd, g, four_over_six, (uint64_t)off, tele, codes, sc);
            if (rowd.out) {
                *reinterpret_cast<uint4*>(rowd.out + off) = nvfp4_pack8(v);
                *reinterpret_cast<uint4*>(rowd.out + off + 8) = nvfp4_pack8(v + 8);
            }
            if (rowd.codes) nvfp4_store_native(rowd, r0 + row, c0 + b * kNvfp4Block, cols, codes, sc);
            if (rowd.stats) nvfp4_commit_stats(rowd.stats, tele);
        }
        if (rowd.alpha && blockIdx.x == 0 && blockIdx.y == 0 && t == 0)
            *rowd.alpha = llmc::rn_mul(g, nvfp4_global_of(rowd.other_amax));
    }
    if (kValuesOnly ? cold.out != nullptr : (cold.out || cold.codes)) {
        float v[kNvfp4Block];
#pragma unroll
        for (int i = 0; i < kNvfp4Block; i++) v[i] = tile[i][t];
        if (cold.rht) llmc::nvfp4_rht16(v, signs);
        const float g = nvfp4_global_of(cold.amax);
        // the reference quantizes x^T by rows: element (r, c) of x is (c, r) of x^T, index c * rows + r
        const uint64_t index0 = (uint64_t)(c0 + t) * rows + r0;
        if constexpr (kValuesOnly) {
            const uint64_t key = cold.stochastic ? llmc::nvfp4_sr_key(cold.seed) : 0u;
            llmc::nvfp4_block16_values(v, g, cold.stochastic, key, index0, four_over_six, v);
#pragma unroll
            for (int i = 0; i < kNvfp4Block; i++) cold.out[(r0 + i) * cols + c0 + t] = (floatX)v[i];
        } else {
            float4 tele = make_float4(0.f, 0.f, 0.f, 0.f);
            uint8_t codes[kNvfp4Block], sc;
            nvfp4_block(v, cold, g, four_over_six, index0, tele, codes, sc);
            if (cold.out) {
#pragma unroll
                for (int i = 0; i < kNvfp4Block; i++) cold.out[(r0 + i) * cols + c0 + t] = (floatX)v[i];
            }
            // the operand is x^T: row c0 + t, K = rows
            if (cold.codes) nvfp4_store_native(cold, c0 + t, r0, rows, codes, sc);
            if (cold.stats) nvfp4_commit_stats(cold.stats, tele);
        }
        if (cold.alpha && blockIdx.x == 0 && blockIdx.y == 0 && t == 0)
            *cold.alpha = llmc::rn_mul(g, nvfp4_global_of(cold.other_amax));
    }
}

inline bool nvfp4_shape_ok(int rows, int cols) { return rows % kNvfp4Block == 0 && cols % NVFP4_PATCH_COLS == 0; }

inline void nvfp4_quantize(const floatX* x, int rows, int cols, const Nvfp4Direction& rowd, const Nvfp4Direction& cold,
                           bool four_over_six, uint16_t signs, cudaStream_t stream) {
    if (!nvfp4_shape_ok(rows, cols) || ((uintptr_t)x % 16) != 0) {
        fprintf(stderr, "error: nvfp4_quantize: %d x %d (rows must be a multiple of 16, columns of 64)\n", rows, cols);
        exit(1);
    }
    // a native operand whose tiled scales have padding (rows not a multiple of 128, K/16 not of 4):
    // zero them first, so the padding holds no earlier tensor's scales (the kernel writes only real blocks)
    auto clear_padding = [&](const Nvfp4Direction& d, int op_rows, int op_k) {
        if (d.codes && (op_rows % 128 != 0 || (op_k / kNvfp4Block) % 4 != 0))
            cudaCheck(cudaMemsetAsync(d.scales, 0, llmc::nvfp4_tiled_scale_bytes(op_rows, op_k / kNvfp4Block), stream));
    };
    clear_padding(rowd, rows, cols);
    clear_padding(cold, cols, rows);
    dim3 grid(cols / NVFP4_PATCH_COLS, rows / kNvfp4Block);
    const bool values_only = !rowd.codes && !cold.codes && !rowd.stats && !cold.stats;
    if (values_only)
        nvfp4_quantize_kernel<true><<<grid, NVFP4_PATCH_COLS, 0, stream>>>(x, rows, cols, rowd, cold, four_over_six, signs);
    else
        nvfp4_quantize_kernel<false><<<grid, NVFP4_PATCH_COLS, 0, stream>>>(x, rows, cols, rowd, cold, four_over_six, signs);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// The emulated wgrad's scaling: dw += alpha * p, with alpha = g_x * g_dy read from device memory and p the
// unscaled BF16 GEMM's FP32 product (one rounding for the product with alpha, one for the sum, as a
// GEMM's alpha * acc + beta * C epilogue). n % 4 == 0.
// Why not alpha in the GEMM (cuBLASLt's pointer mode DEVICE, as the forward and dgrad GEMMs do): with
// several processes time-sharing one GPU, the wgrad GEMM that cuBLASLt picked for that form
// (nvjet_sm90_tss_128x128_64x6_2x4_h_bx_NTT, FP32 output with beta = 1 from device memory) stopped with an
// illegal instruction at an mbarrier arrive, about once per thousand steps (doc/recipes/nvfp4.md, "Known limits").
__global__ void nvfp4_scaled_accumulate_kernel(float* dw, const float* p, const float* alpha, long long n4) {
    const float a = *alpha;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        const float4 v = reinterpret_cast<const float4*>(p)[i];
        float4 d = reinterpret_cast<float4*>(dw)[i];
        d.x = __fmaf_rn(a, v.x, d.x);
        d.y = __fmaf_rn(a, v.y, d.y);
        d.z = __fmaf_rn(a, v.z, d.z);
        d.w = __fmaf_rn(a, v.w, d.w);
        reinterpret_cast<float4*>(dw)[i] = d;
    }
}

inline void nvfp4_scaled_accumulate(float* dw, const float* p, const float* alpha, long long n, cudaStream_t stream) {
    nvfp4_scaled_accumulate_kernel<<<fp8_grid_size(n / 4, 256), 256, 0, stream>>>(dw, p, alpha, n / 4);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// Weights: 16x16 tiles of a (rows x cols) row-major W (rows % 16 == 0, cols % 16 == 0), round to
// nearest even. A block of 32 threads stages a 16 x 512 strip in shared memory; each thread runs
// nvfp4_quantize_tile16x16 on one tile (Four Over Six's tile error is a fixed sequential sum, so
// one thread per tile reproduces the reference's order).
// The native operands of the weights (null members: not written): W itself (rows x cols, K = cols,
// the forward GEMM's) and W^T (cols x rows, K = rows, dgrad's). A 16x16 tile's scale is the scale of
// each of its 16 row blocks in W and of its 16 column blocks in W^T.
struct Nvfp4WeightNative {
    uint8_t* codes = nullptr;
    uint8_t* scales = nullptr;
    uint8_t* codes_t = nullptr;
    uint8_t* scales_t = nullptr;
};

__global__ void __launch_bounds__(NVFP4_TILE_STRIP) nvfp4_weight_kernel(const floatX* w, int rows, int cols, floatX* out,
                                                                        Nvfp4WeightNative native,
                                                                        const uint32_t* amax, bool four_over_six,
                                                                        double* stats) {
    constexpr int W = NVFP4_TILE_STRIP * kNvfp4Block;
    __shared__ float tile[kNvfp4Block][W + 1];
    __shared__ uint8_t codes[kNvfp4Block][W];
    __shared__ uint8_t scales[NVFP4_TILE_STRIP];
    const int t = threadIdx.x;
    const long long r0 = (long long)blockIdx.y * kNvfp4Block, c0 = (long long)blockIdx.x * W;
    const int width = (int)min((long long)W, cols - c0);
    for (int i = t; i < kNvfp4Block * width; i += NVFP4_TILE_STRIP) {
        const int r = i / width, c = i % width;
        tile[r][c] = (float)w[(r0 + r) * cols + c0 + c];
    }
    __syncthreads();
    const float g = nvfp4_global_of(amax);
    if (t * kNvfp4Block < width)
        llmc::nvfp4_quantize_tile16x16(&tile[0][t * kNvfp4Block], W + 1, g, llmc::Rounding::NearestEven, nullptr,
                                       four_over_six, &codes[0][t * kNvfp4Block], W, &scales[t]);
    __syncthreads();
    float4 tele = make_float4(0.f, 0.f, 0.f, 0.f);
    const float inv_g = 1.0f / g; // telemetry in units of g (no underflow for tiny weights)
    for (int i = t; i < kNvfp4Block * width; i += NVFP4_TILE_STRIP) {
        const int r = i / width, c = i % width;
        const float q = nvfp4_block_value(codes[r][c], scales[c / kNvfp4Block]);
        if (out) out[(r0 + r) * cols + c0 + c] = (floatX)q;
        if (stats) {
            const float x = tile[r][c], xs = x * inv_g, e = q - xs;
            tele.x += e * e;
            tele.y += xs * xs;
            tele.z += 1.0f;
            tele.w += (x != 0.0f && q == 0.0f) ? 1.0f : 0.0f;
        }
    }
    if (native.codes) {
        // W: two neighbours along a row share a byte; W^T: two neighbours down a column
        for (int i = t; i < kNvfp4Block * width / 2; i += NVFP4_TILE_STRIP) {
            const int r = i / (width / 2), c = 2 * (i % (width / 2));
            native.codes[((r0 + r) * cols + c0 + c) / 2] = llmc::nvfp4_pack2(codes[r][c], codes[r][c + 1]);
        }
        for (int i = t; i < kNvfp4Block / 2 * width; i += NVFP4_TILE_STRIP) {
            const int c = i % width, r = 2 * (i / width);
            native.codes_t[((c0 + c) * rows + r0 + r) / 2] = llmc::nvfp4_pack2(codes[r][c], codes[r + 1][c]);
        }
        if (t * kNvfp4Block < width) {
            const int tc = (int)(c0 / kNvfp4Block) + t, tr = (int)(r0 / kNvfp4Block);
            for (int i = 0; i < kNvfp4Block; i++) {
                native.scales[llmc::nvfp4_tiled_scale_offset(tr * kNvfp4Block + i, tc, cols / kNvfp4Block)] = scales[t];
                native.scales_t[llmc::nvfp4_tiled_scale_offset(tc * kNvfp4Block + i, tr, rows / kNvfp4Block)] = scales[t];
            }
        }
    }
    if (stats) nvfp4_commit_stats(stats, tele);
}

// W -> out (block-dequantized; null: not written) and/or its native operands, with W's amax computed
// first into *amax
inline void nvfp4_quantize_weight(const floatX* w, int rows, int cols, floatX* out, uint32_t* amax, bool four_over_six,
                                  double* stats, cudaStream_t stream, const Nvfp4WeightNative& native = Nvfp4WeightNative()) {
    if (rows % kNvfp4Block != 0 || cols % kNvfp4Block != 0) {
        fprintf(stderr, "error: nvfp4_quantize_weight: %d x %d is not a multiple of 16 x 16\n", rows, cols);
        exit(1);
    }
    cudaCheck(cudaMemsetAsync(amax, 0, sizeof(uint32_t), stream));
    tensor_amax(amax, w, (long long)rows * cols, stream);
    if (native.codes) {   // the tiled scales' padding, if any, stays zero (see nvfp4_quantize)
        if (rows % 128 != 0 || (cols / kNvfp4Block) % 4 != 0)
            cudaCheck(cudaMemsetAsync(native.scales, 0, llmc::nvfp4_tiled_scale_bytes(rows, cols / kNvfp4Block), stream));
        if (cols % 128 != 0 || (rows / kNvfp4Block) % 4 != 0)
            cudaCheck(cudaMemsetAsync(native.scales_t, 0, llmc::nvfp4_tiled_scale_bytes(cols, rows / kNvfp4Block), stream));
    }
    dim3 grid(ceil_div(cols, NVFP4_TILE_STRIP * kNvfp4Block), rows / kNvfp4Block);
    nvfp4_weight_kernel<<<grid, NVFP4_TILE_STRIP, 0, stream>>>(w, rows, cols, out, native, amax, four_over_six, stats);
    cudaCheckLaunch();
}
