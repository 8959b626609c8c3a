// flash_attention.cuh: fused causal attention, forward and backward, for Hopper (sm_90) in BF16.
//
// Nothing of size T x T reaches device memory. Scores are computed a tile at a time on the tensor
// cores (mma.sync m16n8k16 bf16 -> fp32), the softmax is done online (running max and sum in FP32),
// and the forward keeps only the log-sum-exp of each query row for the backward pass, which
// recomputes the probabilities from Q, K and the log-sum-exp.
//
// Layouts (as in attention.cuh): qkv is (B, T, 3C), C = NH*HS, [q | k | v] along the last dim:
//   q[b,t,h,d] = qkv[(b*T+t)*3C + h*HS + d], k at +C, v at +2C.
// out and dout are (B, T, C); lse is (B, NH, T) FP32, natural log of sum_t2 exp(scale * q.k).
// dqkv is (B, T, 3C) in the layout of qkv, every element written.
//
// Tiling: tiles of 64 query rows and 64 key rows, 4 warps per CTA, each warp owning 16 rows of
// the tile (query rows in the forward and in the dQ kernel, key rows in the dK/dV kernel, whose
// inner loop steps over query tiles of 64 rows for HS=64 and 32 rows for HS=128 to fit). Tiles
// sit in shared memory with rows padded by 16 bytes so that ldmatrix reads are free of bank
// conflicts; global -> shared copies are 16-byte cp.async, double-buffered over the inner loop.
// Causal tiles strictly above the diagonal are never visited; the diagonal tile (and a tile that
// runs past T) is masked element by element.
//
// Backward (the FlashAttention-2 scheme), with P = softmax(S), dP = dO V^T, D = rowsum(dO * O):
//   dS = P * (dP - D);  dV = P^T dO;  dK = scale * dS^T Q;  dQ = scale * dS K.
// It is deterministic: no atomics. One kernel owns a key block and loops over the query blocks
// that see it (dK, dV in registers); a second owns a query block and loops over its key blocks
// (dQ in registers), recomputing P and dP. Every output element is written by one thread, once.
//
// Only the BF16 build uses it; the FP32 reference build keeps the materialized path.
#pragma once
#include "cuda_common.h"

#if !defined(ENABLE_FP32)

namespace flash_detail {

typedef __nv_bfloat16 bf16;

constexpr int BLOCK = 64;            // rows of a query tile and of a key tile
constexpr int NWARPS = 4;
constexpr int NTHREADS = NWARPS * WARP_SIZE;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
// CTAs per SM the HS=64 dQ kernel is compiled for: 3 caps it at 168 registers with no spills
// (measured on an H200 it is as fast as the uncapped 226-register build, within noise)
constexpr int DQ64_MIN_BLOCKS = 3;

// ---------------------------------------------------------------------------------------------
// PTX wrappers

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

// four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i gets it
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}

// D (16x8 fp32) += A (16x16 bf16, row) * B (16x8 bf16, col)
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x, the same instruction in every build (fast-math or not); 2^-inf = 0
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// two floats -> bf16x2 (round to nearest even), lo in the low half
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// ---------------------------------------------------------------------------------------------
// Shared-memory tiles: ROWS x HS bf16, row stride HS + 8 elements (16 bytes of padding makes the
// 8 row addresses of each ldmatrix phase fall in 8 different 16-byte bank groups).

template <int HS> struct Tile { static constexpr int LDS = HS + 8; };

// Offsets (in elements) of this lane's row address for ldmatrix.x4 over a 16x16 block of a tile
// whose top-left element is (r0, c0).
// "A" pattern, also the ".trans B" pattern: matrices (r0+0..7, c0), (r0+8..15, c0), (r0+0..7, c0+8),
// (r0+8..15, c0+8). As an A operand (rows = M, cols = K) these are a[0..3] of mma m16n8k16; with
// .trans over a tile whose rows are K and columns N, registers {0,1} are the B fragment of n-tile
// c0 and {2,3} that of n-tile c0+8.
template <int HS>
__device__ __forceinline__ int off_a(int r0, int c0, int lane) {
    return (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * Tile<HS>::LDS + c0 + (lane >> 4) * 8;
}
// "B" pattern (no .trans) over a tile whose rows are N and columns K: matrices (r0+0..7, c0),
// (r0+0..7, c0+8), (r0+8..15, c0), (r0+8..15, c0+8): registers {0,1} are the B fragment of n-tile r0,
// {2,3} that of n-tile r0+8, for the k-step starting at column c0.
template <int HS>
__device__ __forceinline__ int off_b(int r0, int c0, int lane) {
    return (r0 + (lane & 7) + (lane >> 4) * 8) * Tile<HS>::LDS + c0 + ((lane >> 3) & 1) * 8;
}

// Copy ROWS rows (row0.. of a (T x HS) matrix with row stride `stride` elements) into a tile.
// Rows at or past T are zero-filled.
template <int ROWS, int HS>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* g, int row0, int T, long long stride, int tid) {
    constexpr int CHUNKS_PER_ROW = HS / 8;
    constexpr int TOTAL = ROWS * CHUNKS_PER_ROW;
    static_assert(TOTAL % NTHREADS == 0, "tile copy must divide evenly");
#pragma unroll
    for (int i = 0; i < TOTAL / NTHREADS; i++) {
        int c = tid + i * NTHREADS;
        int r = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        int t = row0 + r;
        bool valid = t < T;
        const bf16* src = valid ? g + (long long)t * stride + col : g;
        cp_async16(tile + r * Tile<HS>::LDS + col, src, valid);
    }
}

// Write a warp's 16 x HS fp32 accumulator (C fragments, n-tiles of 8 columns) into its 16 rows of
// a tile as bf16, row g scaled by mul0 and row g+8 by mul1.
template <int HS>
__device__ __forceinline__ void acc_to_tile(bf16* rows16, const float (&acc)[HS / 8][4], float mul0, float mul1, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        *reinterpret_cast<uint32_t*>(rows16 + g * Tile<HS>::LDS + n * 8 + 2 * t) = pack_bf16(acc[n][0] * mul0, acc[n][1] * mul0);
        *reinterpret_cast<uint32_t*>(rows16 + (g + 8) * Tile<HS>::LDS + n * 8 + 2 * t) = pack_bf16(acc[n][2] * mul1, acc[n][3] * mul1);
    }
}

// Copy a warp's 16 tile rows to global memory (16-byte stores); rows at or past nvalid are skipped.
template <int HS>
__device__ __forceinline__ void tile_rows_to_global(bf16* g, long long stride, const bf16* rows16, int nvalid, int lane) {
    constexpr int CHUNKS_PER_ROW = HS / 8;
#pragma unroll
    for (int c = lane; c < 16 * CHUNKS_PER_ROW; c += WARP_SIZE) {
        int r = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        if (r < nvalid) {
            *reinterpret_cast<uint4*>(g + (long long)r * stride + col) =
                *reinterpret_cast<const uint4*>(rows16 + r * Tile<HS>::LDS + col);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Forward. Grid (B*NH, ceil(T/64)); blockIdx.y counts query blocks from the last (the longest)
// down, so the heaviest CTAs start first. Each warp: 16 query rows, Q fragments in registers,
// S = Q K^T (16 x 64) per key tile, online softmax, O += P V.

template <int HS>
__global__ void __launch_bounds__(NTHREADS)
flash_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                 int T, int NH, float scale_log2) {
    constexpr int LDS = Tile<HS>::LDS;
    constexpr int TILE = BLOCK * LDS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);   // [64][LDS]
    bf16* sK = sQ + TILE;                            // [2][64][LDS]
    bf16* sV = sK + 2 * TILE;                        // [2][64][LDS]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qb = gridDim.y - 1 - blockIdx.y;
    const int q0 = qb * BLOCK;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;

    load_tile<BLOCK, HS>(sQ, qg, q0, T, stride, tid);
    load_tile<BLOCK, HS>(sK, kg, 0, T, stride, tid);
    load_tile<BLOCK, HS>(sV, vg, 0, T, stride, tid);
    cp_async_commit();

    uint32_t qf[HS / 16][4];            // this warp's 16 x HS query rows as A fragments
    float o[HS / 8][4];                 // output accumulator, 16 x HS
#pragma unroll
    for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY;   // running max (log2 domain) of rows g and g+8
    float l0 = 0.0f, l1 = 0.0f;             // this thread's part of the running sums

    const int nkb = qb + 1;             // key tiles 0..qb (tiles are the same size)
    for (int j = 0; j < nkb; j++) {
        const int buf = j & 1;
        if (j + 1 < nkb) {
            load_tile<BLOCK, HS>(sK + (buf ^ 1) * TILE, kg, (j + 1) * BLOCK, T, stride, tid);
            load_tile<BLOCK, HS>(sV + (buf ^ 1) * TILE, vg, (j + 1) * BLOCK, T, stride, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int ks = 0; ks < HS / 16; ks++) ldsm_x4(qf[ks], sQ + off_a<HS>(warp * 16, ks * 16, lane));
        }
        const bf16* k_s = sK + buf * TILE;
        const bf16* v_s = sV + buf * TILE;

        // S = Q K^T
        float s[BLOCK / 8][4];
#pragma unroll
        for (int n = 0; n < BLOCK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
#pragma unroll
            for (int np = 0; np < BLOCK / 16; np++) {
                uint32_t kf[4];
                ldsm_x4(kf, k_s + off_b<HS>(np * 16, ks * 16, lane));
                mma_16816(s[2 * np], qf[ks], kf[0], kf[1]);
                mma_16816(s[2 * np + 1], qf[ks], kf[2], kf[3]);
            }
        }
        // causal mask on the diagonal tile (key > query -> -inf); no other tile needs one
        if (j == qb) {
            const int r0 = warp * 16 + g, r1 = r0 + 8;
#pragma unroll
            for (int n = 0; n < BLOCK / 8; n++) {
                const int c = n * 8 + 2 * t4;
                if (c > r0) s[n][0] = -INFINITY;
                if (c + 1 > r0) s[n][1] = -INFINITY;
                if (c > r1) s[n][2] = -INFINITY;
                if (c + 1 > r1) s[n][3] = -INFINITY;
            }
        }
        // online softmax: every row keeps at least one unmasked key (the first key of tile 0 or
        // its own diagonal element), so the maxima are finite
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < BLOCK / 8; n++) {
            mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 2));
        const float mn0 = fmaxf(m0, mx0 * scale_log2), mn1 = fmaxf(m1, mx1 * scale_log2);
        const float alpha0 = fast_exp2(m0 - mn0), alpha1 = fast_exp2(m1 - mn1);
        m0 = mn0; m1 = mn1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int n = 0; n < BLOCK / 8; n++) {
            s[n][0] = fast_exp2(fmaf(s[n][0], scale_log2, -mn0));
            s[n][1] = fast_exp2(fmaf(s[n][1], scale_log2, -mn0));
            s[n][2] = fast_exp2(fmaf(s[n][2], scale_log2, -mn1));
            s[n][3] = fast_exp2(fmaf(s[n][3], scale_log2, -mn1));
            sum0 += s[n][0] + s[n][1];
            sum1 += s[n][2] + s[n][3];
        }
        l0 = l0 * alpha0 + sum0;
        l1 = l1 * alpha1 + sum1;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            o[n][0] *= alpha0; o[n][1] *= alpha0;
            o[n][2] *= alpha1; o[n][3] *= alpha1;
        }
        // O += P V: the C fragments of S are re-packed as A fragments (k = key)
#pragma unroll
        for (int kk = 0; kk < BLOCK / 16; kk++) {
            uint32_t pa[4];
            pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t vf[4];
                ldsm_x4_trans(vf, v_s + off_a<HS>(kk * 16, dp * 16, lane));
                mma_16816(o[2 * dp], pa, vf[0], vf[1]);
                mma_16816(o[2 * dp + 1], pa, vf[2], vf[3]);
            }
        }
        __syncthreads();   // this buffer is refilled by the next iteration's copy
    }

    // finish: full row sums, O / l, lse = ln(sum exp(scale * q.k))
    l0 += __shfl_xor_sync(0xffffffff, l0, 1);
    l0 += __shfl_xor_sync(0xffffffff, l0, 2);
    l1 += __shfl_xor_sync(0xffffffff, l1, 1);
    l1 += __shfl_xor_sync(0xffffffff, l1, 2);
    bf16* rows16 = sQ + warp * 16 * LDS;   // this warp's Q rows are in registers; reuse them
    acc_to_tile<HS>(rows16, o, 1.0f / l0, 1.0f / l1, lane);
    __syncwarp();
    const int row_base = q0 + warp * 16;
    tile_rows_to_global<HS>(out + ((long long)b * T + row_base) * C + (long long)h * HS, C, rows16, T - row_base, lane);
    if (t4 == 0) {
        float* lse_bh = lse + (long long)bh * T;
        if (row_base + g < T) lse_bh[row_base + g] = (m0 + log2f(l0)) * LN2;
        if (row_base + g + 8 < T) lse_bh[row_base + g + 8] = (m1 + log2f(l1)) * LN2;
    }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: D[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d]. One warp per (b, t, h).

template <int HS>
__global__ void flash_bwd_dot_kernel(float* __restrict__ Dvec, const bf16* __restrict__ dout, const bf16* __restrict__ out,
                                     int B, int T, int NH) {
    const long long row = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= (long long)B * T * NH) return;
    const int h = row % NH;
    const long long bt = row / NH;
    const int t = bt % T, b = bt / T;
    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(out + row * HS);
    const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(dout + row * HS);
    float sum = 0.0f;
#pragma unroll
    for (int i = lane; i < HS / 2; i += WARP_SIZE) {
        float2 o = __bfloat1622float2(o2[i]);
        float2 d = __bfloat1622float2(d2[i]);
        sum += o.x * d.x + o.y * d.y;
    }
    sum = warp_sum(sum);
    if (lane == 0) Dvec[((long long)b * NH + h) * T + t] = sum;
}

// ---------------------------------------------------------------------------------------------
// Backward, step 2: dK and dV. Grid (B*NH, ceil(T/64)); key tile kb = blockIdx.y (tile 0 sees the
// most query tiles, so it starts first). Each warp owns 16 keys and computes, per query tile of
// QB rows, the transposed products S^T = K Q^T and dP^T = V dO^T (keys as rows), so that P^T and
// dS^T come out as C fragments that re-pack into A fragments for dV += P^T dO and dK += dS^T Q.

template <int HS, int QB>
__global__ void __launch_bounds__(NTHREADS)
flash_bwd_dkv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                     const float* __restrict__ lse, const float* __restrict__ Dvec,
                     int T, int NH, float scale_log2, float scale) {
    constexpr int LDS = Tile<HS>::LDS;
    constexpr int KTILE = BLOCK * LDS;
    constexpr int QTILE = QB * LDS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [64][LDS]
    bf16* sV = sK + KTILE;                          // [64][LDS]
    bf16* sQ = sV + KTILE;                          // [2][QB][LDS]
    bf16* sdO = sQ + 2 * QTILE;                     // [2][QB][LDS]
    float* sL = reinterpret_cast<float*>(sdO + 2 * QTILE);   // [2][QB] lse
    float* sD = sL + 2 * QB;                                  // [2][QB] D

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * BLOCK;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;
    const bf16* dog = dout + (long long)b * T * C + (long long)h * HS;
    const float* lse_bh = lse + (long long)bh * T;
    const float* D_bh = Dvec + (long long)bh * T;

    auto load_q_block = [&](int i, int buf) {
        const int qs = i * QB;
        load_tile<QB, HS>(sQ + buf * QTILE, qg, qs, T, stride, tid);
        load_tile<QB, HS>(sdO + buf * QTILE, dog, qs, T, C, tid);
        if (tid < QB) {
            const bool valid = qs + tid < T;
            cp_async4(sL + buf * QB + tid, valid ? lse_bh + qs + tid : lse_bh, valid);
        } else if (tid < 2 * QB) {
            const int r = tid - QB;
            const bool valid = qs + r < T;
            cp_async4(sD + buf * QB + r, valid ? D_bh + qs + r : D_bh, valid);
        }
    };
    static_assert(2 * QB <= NTHREADS, "one thread per lse/D element");

    const int i0 = k0 / QB;                 // first query tile with a row >= k0
    const int nqb = (T + QB - 1) / QB;
    load_tile<BLOCK, HS>(sK, kg, k0, T, stride, tid);
    load_tile<BLOCK, HS>(sV, vg, k0, T, stride, tid);
    load_q_block(i0, 0);
    cp_async_commit();

    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
        dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
    }
    const int key0 = k0 + warp * 16 + g, key1 = key0 + 8;   // this thread's two key rows
    const bf16* k_rows = sK + warp * 16 * LDS;
    const bf16* v_rows = sV + warp * 16 * LDS;

    for (int i = i0; i < nqb; i++) {
        const int buf = (i - i0) & 1;
        if (i + 1 < nqb) load_q_block(i + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* q_s = sQ + buf * QTILE;
        const bf16* do_s = sdO + buf * QTILE;
        const float* l_s = sL + buf * QB;
        const float* d_s = sD + buf * QB;
        const int qs = i * QB;

        // dP^T = V dO^T (16 keys x QB queries)
        float dpt[QB / 8][4];
#pragma unroll
        for (int n = 0; n < QB / 8; n++) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t af[4];
            ldsm_x4(af, v_rows + off_a<HS>(0, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < QB / 16; np++) {
                uint32_t bfr[4];
                ldsm_x4(bfr, do_s + off_b<HS>(np * 16, ks * 16, lane));
                mma_16816(dpt[2 * np], af, bfr[0], bfr[1]);
                mma_16816(dpt[2 * np + 1], af, bfr[2], bfr[3]);
            }
        }
        // S^T = K Q^T (16 keys x QB queries)
        float st[QB / 8][4];
#pragma unroll
        for (int n = 0; n < QB / 8; n++) st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t af[4];
            ldsm_x4(af, k_rows + off_a<HS>(0, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < QB / 16; np++) {
                uint32_t bfr[4];
                ldsm_x4(bfr, q_s + off_b<HS>(np * 16, ks * 16, lane));
                mma_16816(st[2 * np], af, bfr[0], bfr[1]);
                mma_16816(st[2 * np + 1], af, bfr[2], bfr[3]);
            }
        }
        // P^T = exp(scale * S^T - lse[query]); dS^T = P^T * (dP^T - D[query]).
        // Masked: key > query (causal), and query rows past T (their lse/D were zero-filled).
        const bool need_mask = (qs < k0 + BLOCK) || (qs + QB > T);
#pragma unroll
        for (int n = 0; n < QB / 8; n++) {
            const int c = n * 8 + 2 * t4;               // query column within the tile
            const float2 lq = *reinterpret_cast<const float2*>(l_s + c);
            const float2 dq = *reinterpret_cast<const float2*>(d_s + c);
            const float nl0 = -lq.x * LOG2E, nl1 = -lq.y * LOG2E;
            float p00 = fast_exp2(fmaf(st[n][0], scale_log2, nl0));   // key0, query c
            float p01 = fast_exp2(fmaf(st[n][1], scale_log2, nl1));   // key0, query c+1
            float p10 = fast_exp2(fmaf(st[n][2], scale_log2, nl0));   // key1, query c
            float p11 = fast_exp2(fmaf(st[n][3], scale_log2, nl1));   // key1, query c+1
            if (need_mask) {
                const int qa = qs + c, qb1 = qa + 1;
                if (key0 > qa || qa >= T) p00 = 0.0f;
                if (key0 > qb1 || qb1 >= T) p01 = 0.0f;
                if (key1 > qa || qa >= T) p10 = 0.0f;
                if (key1 > qb1 || qb1 >= T) p11 = 0.0f;
            }
            st[n][0] = p00; st[n][1] = p01; st[n][2] = p10; st[n][3] = p11;
            dpt[n][0] = p00 * (dpt[n][0] - dq.x);
            dpt[n][1] = p01 * (dpt[n][1] - dq.y);
            dpt[n][2] = p10 * (dpt[n][2] - dq.x);
            dpt[n][3] = p11 * (dpt[n][3] - dq.y);
        }
        // dV += P^T dO and dK += dS^T Q (k = query); B fragments by ldmatrix.trans of dO / Q tiles
#pragma unroll
        for (int kk = 0; kk < QB / 16; kk++) {
            uint32_t pa[4], da[4];
            pa[0] = pack_bf16(st[2 * kk][0], st[2 * kk][1]);
            pa[1] = pack_bf16(st[2 * kk][2], st[2 * kk][3]);
            pa[2] = pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]);
            pa[3] = pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3]);
            da[0] = pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]);
            da[1] = pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]);
            da[2] = pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
            da[3] = pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t bfr[4];
                ldsm_x4_trans(bfr, do_s + off_a<HS>(kk * 16, dp * 16, lane));
                mma_16816(dv[2 * dp], pa, bfr[0], bfr[1]);
                mma_16816(dv[2 * dp + 1], pa, bfr[2], bfr[3]);
                ldsm_x4_trans(bfr, q_s + off_a<HS>(kk * 16, dp * 16, lane));
                mma_16816(dk[2 * dp], da, bfr[0], bfr[1]);
                mma_16816(dk[2 * dp + 1], da, bfr[2], bfr[3]);
            }
        }
        __syncthreads();   // this buffer is refilled by the next iteration's copy
    }

    // write dK (times scale) and dV through this warp's own rows of the K / V tiles
    bf16* krows = sK + warp * 16 * LDS;
    bf16* vrows = sV + warp * 16 * LDS;
    acc_to_tile<HS>(krows, dk, scale, scale, lane);
    acc_to_tile<HS>(vrows, dv, 1.0f, 1.0f, lane);
    __syncwarp();
    const int row_base = k0 + warp * 16;
    bf16* dk_g = dqkv + ((long long)b * T + row_base) * stride + C + (long long)h * HS;
    tile_rows_to_global<HS>(dk_g, stride, krows, T - row_base, lane);
    tile_rows_to_global<HS>(dk_g + C, stride, vrows, T - row_base, lane);
}

// ---------------------------------------------------------------------------------------------
// Backward, step 3: dQ. Grid (B*NH, ceil(T/64)), query tiles from the last down. Each warp owns 16
// query rows; per key tile it recomputes S = Q K^T and dP = dO V^T, forms dS, and adds dS K.
// Q and dO fragments are kept in registers when they fit (HS = 64), else re-read from shared memory.

template <int HS>
__global__ void __launch_bounds__(NTHREADS, HS == 64 ? DQ64_MIN_BLOCKS : 1)
flash_bwd_dq_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                    const float* __restrict__ lse, const float* __restrict__ Dvec,
                    int T, int NH, float scale_log2, float scale) {
    constexpr bool A_IN_REGS = (HS <= 64);
    constexpr int NA = A_IN_REGS ? HS / 16 : 1;
    constexpr int LDS = Tile<HS>::LDS;
    constexpr int TILE = BLOCK * LDS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);   // [64][LDS]
    bf16* sdO = sQ + TILE;                           // [64][LDS]
    bf16* sK = sdO + TILE;                           // [2][64][LDS]
    bf16* sV = sK + 2 * TILE;                        // [2][64][LDS]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qb = gridDim.y - 1 - blockIdx.y;
    const int q0 = qb * BLOCK;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;
    const bf16* dog = dout + (long long)b * T * C + (long long)h * HS;

    load_tile<BLOCK, HS>(sQ, qg, q0, T, stride, tid);
    load_tile<BLOCK, HS>(sdO, dog, q0, T, C, tid);
    load_tile<BLOCK, HS>(sK, kg, 0, T, stride, tid);
    load_tile<BLOCK, HS>(sV, vg, 0, T, stride, tid);
    cp_async_commit();

    // this thread's two query rows: lse (log2 domain, +inf past T so that P = 0) and D
    const int r0 = warp * 16 + g, r1 = r0 + 8;       // within the tile
    const float* lse_bh = lse + (long long)bh * T;
    const float* D_bh = Dvec + (long long)bh * T;
    const float nl0 = q0 + r0 < T ? -lse_bh[q0 + r0] * LOG2E : -INFINITY;
    const float nl1 = q0 + r1 < T ? -lse_bh[q0 + r1] * LOG2E : -INFINITY;
    const float D0 = q0 + r0 < T ? D_bh[q0 + r0] : 0.0f;
    const float D1 = q0 + r1 < T ? D_bh[q0 + r1] : 0.0f;

    uint32_t qf[NA][4], dof[NA][4];
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    const bf16* q_rows = sQ + warp * 16 * LDS;
    const bf16* do_rows = sdO + warp * 16 * LDS;

    const int nkb = qb + 1;
    for (int j = 0; j < nkb; j++) {
        const int buf = j & 1;
        if (j + 1 < nkb) {
            load_tile<BLOCK, HS>(sK + (buf ^ 1) * TILE, kg, (j + 1) * BLOCK, T, stride, tid);
            load_tile<BLOCK, HS>(sV + (buf ^ 1) * TILE, vg, (j + 1) * BLOCK, T, stride, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (A_IN_REGS && j == 0) {
#pragma unroll
            for (int ks = 0; ks < NA; ks++) {
                ldsm_x4(qf[ks], q_rows + off_a<HS>(0, ks * 16, lane));
                ldsm_x4(dof[ks], do_rows + off_a<HS>(0, ks * 16, lane));
            }
        }
        const bf16* k_s = sK + buf * TILE;
        const bf16* v_s = sV + buf * TILE;

        // S = Q K^T and dP = dO V^T (16 queries x 64 keys)
        float s[BLOCK / 8][4], dp[BLOCK / 8][4];
#pragma unroll
        for (int n = 0; n < BLOCK / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
        }
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t a_q[4], a_do[4];
            if constexpr (A_IN_REGS) {
#pragma unroll
                for (int x = 0; x < 4; x++) { a_q[x] = qf[ks % NA][x]; a_do[x] = dof[ks % NA][x]; }
            } else {
                ldsm_x4(a_q, q_rows + off_a<HS>(0, ks * 16, lane));
                ldsm_x4(a_do, do_rows + off_a<HS>(0, ks * 16, lane));
            }
#pragma unroll
            for (int np = 0; np < BLOCK / 16; np++) {
                uint32_t bfr[4];
                ldsm_x4(bfr, k_s + off_b<HS>(np * 16, ks * 16, lane));
                mma_16816(s[2 * np], a_q, bfr[0], bfr[1]);
                mma_16816(s[2 * np + 1], a_q, bfr[2], bfr[3]);
                ldsm_x4(bfr, v_s + off_b<HS>(np * 16, ks * 16, lane));
                mma_16816(dp[2 * np], a_do, bfr[0], bfr[1]);
                mma_16816(dp[2 * np + 1], a_do, bfr[2], bfr[3]);
            }
        }
        // P and dS; only the diagonal tile needs the causal mask (its key offset equals q0)
        const bool diag = (j == qb);
#pragma unroll
        for (int n = 0; n < BLOCK / 8; n++) {
            const int c = n * 8 + 2 * t4;
            float p00 = fast_exp2(fmaf(s[n][0], scale_log2, nl0));
            float p01 = fast_exp2(fmaf(s[n][1], scale_log2, nl0));
            float p10 = fast_exp2(fmaf(s[n][2], scale_log2, nl1));
            float p11 = fast_exp2(fmaf(s[n][3], scale_log2, nl1));
            if (diag) {
                if (c > r0) p00 = 0.0f;
                if (c + 1 > r0) p01 = 0.0f;
                if (c > r1) p10 = 0.0f;
                if (c + 1 > r1) p11 = 0.0f;
            }
            dp[n][0] = p00 * (dp[n][0] - D0);
            dp[n][1] = p01 * (dp[n][1] - D0);
            dp[n][2] = p10 * (dp[n][2] - D1);
            dp[n][3] = p11 * (dp[n][3] - D1);
        }
        // dQ += dS K (k = key): B fragments by ldmatrix.trans of the K tile
#pragma unroll
        for (int kk = 0; kk < BLOCK / 16; kk++) {
            uint32_t da[4];
            da[0] = pack_bf16(dp[2 * kk][0], dp[2 * kk][1]);
            da[1] = pack_bf16(dp[2 * kk][2], dp[2 * kk][3]);
            da[2] = pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
            da[3] = pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
            for (int dd = 0; dd < HS / 16; dd++) {
                uint32_t bfr[4];
                ldsm_x4_trans(bfr, k_s + off_a<HS>(kk * 16, dd * 16, lane));
                mma_16816(dq[2 * dd], da, bfr[0], bfr[1]);
                mma_16816(dq[2 * dd + 1], da, bfr[2], bfr[3]);
            }
        }
        __syncthreads();
    }

    // write dQ (times scale) through this warp's own rows of the Q tile
    bf16* rows16 = sQ + warp * 16 * LDS;
    acc_to_tile<HS>(rows16, dq, scale, scale, lane);
    __syncwarp();
    const int row_base = q0 + warp * 16;
    tile_rows_to_global<HS>(dqkv + ((long long)b * T + row_base) * stride + (long long)h * HS, stride, rows16,
                            T - row_base, lane);
}

// ---------------------------------------------------------------------------------------------
// Host side

template <int HS> constexpr int fwd_smem_bytes() { return 5 * BLOCK * Tile<HS>::LDS * (int)sizeof(bf16); }
template <int HS> constexpr int dq_smem_bytes() { return 6 * BLOCK * Tile<HS>::LDS * (int)sizeof(bf16); }
template <int HS> constexpr int dkv_q_block() { return HS <= 64 ? 64 : 32; }
template <int HS> constexpr int dkv_smem_bytes() {
    return (2 * BLOCK + 4 * dkv_q_block<HS>()) * Tile<HS>::LDS * (int)sizeof(bf16) + 4 * dkv_q_block<HS>() * (int)sizeof(float);
}

inline void check_args(const void* a, const void* b, const void* c, int T, int HS, const char* what) {
    if (HS != 64 && HS != 128) {
        fprintf(stderr, "error: %s: flash attention supports head sizes 64 and 128, got %d\n", what, HS);
        exit(1);
    }
    if (T < 1) {
        fprintf(stderr, "error: %s: sequence length must be >= 1, got %d\n", what, T);
        exit(1);
    }
    if (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) {
        fprintf(stderr, "error: %s: tensors must be 16-byte aligned\n", what);
        exit(1);
    }
}

template <int HS>
void forward_launch(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, cudaStream_t stream) {
    constexpr int smem = fwd_smem_bytes<HS>();
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(flash_fwd_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        configured = true;
    }
    const float scale_log2 = LOG2E / sqrtf((float)HS);
    dim3 grid(B * NH, ceil_div(T, BLOCK));
    flash_fwd_kernel<HS><<<grid, NTHREADS, smem, stream>>>(out, lse, qkv, T, NH, scale_log2);
    cudaCheckLaunch();
}

template <int HS>
void backward_launch(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                     float* Dvec, int B, int T, int NH, cudaStream_t stream) {
    constexpr int QB = dkv_q_block<HS>();
    constexpr int smem_dkv = dkv_smem_bytes<HS>();
    constexpr int smem_dq = dq_smem_bytes<HS>();
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(flash_bwd_dkv_kernel<HS, QB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dkv));
        cudaCheck(cudaFuncSetAttribute(flash_bwd_dq_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dq));
        configured = true;
    }
    const float scale = 1.0f / sqrtf((float)HS);
    const float scale_log2 = LOG2E * scale;
    const long long rows = (long long)B * T * NH;
    const int warps_per_block = 8;
    flash_bwd_dot_kernel<HS><<<ceil_div(rows, warps_per_block), warps_per_block * WARP_SIZE, 0, stream>>>(
        Dvec, dout, out, B, T, NH);
    cudaCheckLaunch();
    dim3 grid(B * NH, ceil_div(T, BLOCK));
    flash_bwd_dkv_kernel<HS, QB><<<grid, NTHREADS, smem_dkv, stream>>>(dqkv, dout, qkv, lse, Dvec, T, NH, scale_log2, scale);
    cudaCheckLaunch();
    flash_bwd_dq_kernel<HS><<<grid, NTHREADS, smem_dq, stream>>>(dqkv, dout, qkv, lse, Dvec, T, NH, scale_log2, scale);
    cudaCheckLaunch();
}

} // namespace flash_detail

// ---------------------------------------------------------------------------------------------
// API

// out: (B,T,C); lse: (B,NH,T) FP32 log-sum-exp of each query row's scaled scores (kept for backward)
inline void flash_attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int HS,
                                    cudaStream_t stream) {
    flash_detail::check_args(out, qkv, qkv, T, HS, "flash_attention_forward");
    if (HS == 64) flash_detail::forward_launch<64>(out, lse, qkv, B, T, NH, stream);
    else flash_detail::forward_launch<128>(out, lse, qkv, B, T, NH, stream);
}

// bytes of device scratch flash_attention_backward needs: D = rowsum(dout * out), (B,NH,T) FP32
inline size_t flash_attention_backward_scratch_bytes(int B, int T, int NH, int HS) {
    (void)HS;
    return ((size_t)B * NH * T * sizeof(float) + 255) / 256 * 256;
}

// dqkv: (B,T,3C) written in full (dq | dk | dv in the layout of qkv); dout: (B,T,C); out, lse from
// the forward pass; scratch: flash_attention_backward_scratch_bytes(B,T,NH,HS) bytes of device memory.
inline void flash_attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, void* scratch, int B, int T, int NH, int HS,
                                     cudaStream_t stream) {
    flash_detail::check_args(dqkv, dout, qkv, T, HS, "flash_attention_backward");
    flash_detail::check_args(out, out, out, T, HS, "flash_attention_backward");
    float* Dvec = static_cast<float*>(scratch);
    if (HS == 64) flash_detail::backward_launch<64>(dqkv, dout, qkv, out, lse, Dvec, B, T, NH, stream);
    else flash_detail::backward_launch<128>(dqkv, dout, qkv, out, lse, Dvec, B, T, NH, stream);
}

#endif // !defined(ENABLE_FP32)
