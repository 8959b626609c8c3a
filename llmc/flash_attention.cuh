// flash_attention.cuh: fused causal attention, forward and backward, for Hopper (sm_90) in BF16.
//
// Nothing of size T x T reaches device memory. Scores are computed a tile at a time on the tensor
// cores (bf16 -> fp32), the softmax is done online (running max and sum in FP32), and the forward
// keeps only the log-sum-exp of each query row for the backward pass, which recomputes the
// probabilities from Q, K and the log-sum-exp.
//
// Two implementations of the same tiling and arithmetic: kernels on mma.sync m16n8k16, described
// next (the default, all head sizes), and, opt-in at HS = 64 on sm_90a (-DFLASH_ATTENTION_WGMMA=1,
// see its section below), kernels on Hopper's warpgroup MMA (wgmma, one warpgroup per 64 rows).
//
// Layouts (as in attention.cuh): qkv is (B, T, 3C), C = NH*HS, [q | k | v] along the last dim:
//   q[b,t,h,d] = qkv[(b*T+t)*3C + h*HS + d], k at +C, v at +2C.
// out and dout are (B, T, C); lse is (B, NH, T) FP32, natural log of sum_t2 exp(scale * q.k).
// dqkv is (B, T, 3C) in the layout of qkv, every element written.
//
// Tiling (mma.sync kernels). Every kernel gives each warp MT m-tiles of 16 rows (query rows in the
// forward and in the dQ kernel, key rows in the dK/dV kernel), so a warp owns M = 16*MT consecutive
// rows and a CTA of NW warps owns 16*MT*NW rows; the inner loop steps over tiles of the other
// operand (keys, or queries for dK/dV). Each B fragment read from shared memory by ldmatrix feeds MT mma's: with
// MT = 2 a warp reads half the shared-memory bytes per mma of MT = 1, which is what bounds these
// loops (an ldmatrix.x4 moves 512 bytes for 2 mma's at MT = 1), and the two m-tiles are
// independent instruction streams for the scheduler. The price is registers (the accumulators
// double), hence MT = 2 only at HS = 64. Tiles sit in shared memory with rows padded by 16 bytes
// so that ldmatrix reads are free of bank conflicts; global -> shared copies are 16-byte cp.async
// through a ring of STAGES buffers with one __syncthreads per step. Causal tiles strictly above
// the diagonal are never visited (per warp: a warp skips a tile that none of its rows can see);
// a tile that straddles the diagonal of a warp's rows (or runs past T) is masked element by element.
//
// Backward (the FlashAttention-2 scheme), with P = softmax(S), dP = dO V^T, D = rowsum(dO * O):
//   dS = P * (dP - D);  dV = P^T dO;  dK = scale * dS^T Q;  dQ = scale * dS K.
// It is deterministic: no atomics. A first kernel owns a query block and loops over its key
// blocks (dQ in registers), recomputing P and dP; it also computes D for its rows and stores it.
// A second kernel owns a key block and loops over the query blocks that see it (dK, dV in
// registers). Every output element is written by one thread, once. The wgmma kernels (HS = 64) can
// also give the qkv bias gradient: each stages its 64-row tile of dq (or dk and dv) in shared memory
// before the store, sums the tile's columns there, and writes one partial-sum row per (sequence,
// 64-row block); the caller adds the rows in a fixed order (flash_attention_backward).
//
// Recipes with forward boundaries (boundaries.h, Bd::ACTIVE: Q1.15) run the same kernels with the
// softmax the boundaries prescribe: the score is read through attention_scores(BF16(q.k)), each
// probability is stored through softmax_output after the normalization, and the output through
// attention_output (as the materialized path, attention.cuh). A probability quantized after the
// normalization cannot be accumulated online (O is rescaled by the final sum at the end), so the
// forward makes two passes over the keys: FWD_STATS computes the log-sum-exp of each row (the sum
// of the exponentials, no V; with a fixed maximum where the boundaries bound the scores, else an
// online one), FWD_OUTPUT recomputes the scores and accumulates O = sum_k P V with the final,
// quantized P = softmax_output(exp2(x * scale * log2(e) - lse * log2(e))), rounded to BF16 for the
// tensor cores. The backward recomputes P with that same expression, so forward and backward see
// the same probabilities bit for bit (dV from their BF16 values, dS from the fp32 ones: see
// recompute_probs2).
// The hooks see exactly the visible positions (key <= query < T), as in the materialized path. A
// counting hook (Q1.15 telemetry) counts each value once: the scores in FWD_STATS, the probabilities
// and outputs in FWD_OUTPUT. The per-tile loops over the scores take the hooks without the counting
// (Bd::Values), as straight-line code for every position. The forward's launcher runs the kernels
// instantiated with Bd::Values unless the policy is counting right now (Bd::observing(), a
// telemetry step): those carry no counting code at all. The counting instantiation adds each
// visible score (FWD_STATS) or probability (FWD_OUTPUT) to the thread's tally (Bd::Tally, in
// registers) in a loop of its own, before the values are computed, and commits the tally once after
// the key loop; the outputs go through the counting hook as they are stored.
//
// Only the BF16 build uses it; the FP32 reference build keeps the materialized path.
#pragma once
#include <type_traits>
#include "cuda_common.h"
#include "boundaries.h"
#include "formats/fp8_quantize.cuh" // Fp8Target: the FP8 recipe's E5M2 copy of dqkv
#include "wgmma.cuh"        // smem_addr, the swizzled-tile descriptor, the wgmma fences

#if !defined(ENABLE_FP32)

namespace flash_detail {

typedef __nv_bfloat16 bf16;

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------------------------
// Configurations of the mma.sync kernels (all of HS = 128; HS = 64 where wgmma is not built, see
// the wgmma section). MT: 16-row m-tiles per warp; NW: warps per CTA; STAGES: cp.async ring depth
// of the inner loop (>= 2); MINB: CTAs per SM asked of ptxas through __launch_bounds__ (it caps
// the registers at 65536 / (MINB * 32 * NW)). The forward and the dQ kernel step over key tiles of
// KB rows, the dK/dV kernel over query tiles of QB rows.

template <int MT_, int NW_, int STAGES_, int MINB_>
struct FwdCfg {
    static constexpr int MT = MT_, NW = NW_, STAGES = STAGES_, MINB = MINB_;
    static constexpr int KB = 64;
};
template <int QB_, int MT_, int NW_, int STAGES_, int MINB_>
struct DkvCfg {
    static constexpr int QB = QB_, MT = MT_, NW = NW_, STAGES = STAGES_, MINB = MINB_;
};
template <int KB_, int MT_, int NW_, int STAGES_, int MINB_, bool A_IN_REGS_>
struct DqCfg {
    static constexpr int KB = KB_, MT = MT_, NW = NW_, STAGES = STAGES_, MINB = MINB_;
    static constexpr bool A_IN_REGS = A_IN_REGS_;   // Q and dO A fragments kept in registers
};

template <int HS> struct Config;
// HS = 64: two m-tiles per warp (measured on an H200 against one: forward 1.2x, backward 1.1x)
template <> struct Config<64> {
    typedef FwdCfg<2, 4, 3, 2> Fwd;
    typedef DkvCfg<32, 2, 4, 3, 2> Dkv;
    typedef DqCfg<32, 2, 4, 3, 2, true> Dq;
};
// HS = 128: one m-tile per warp (the accumulators of two would not fit in 255 registers)
template <> struct Config<128> {
    typedef FwdCfg<1, 4, 2, 1> Fwd;
    typedef DkvCfg<32, 1, 4, 2, 1> Dkv;
    typedef DqCfg<64, 1, 4, 2, 1, false> Dq;
};

// ---------------------------------------------------------------------------------------------
// PTX wrappers

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

// The C fragments of two adjacent n-tiles (columns 16*kk .. 16*kk+15 of a 16-row accumulator)
// re-packed as the A fragment of the k-step kk (the column index becomes k).
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

template <int N>
__device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// ---------------------------------------------------------------------------------------------
// The softmax under a boundary policy Bd (see the top of the file)

enum FwdPass { FWD_ONE_PASS = 0, FWD_STATS = 1, FWD_OUTPUT = 2 };

__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Two floats rounded to BF16 (returned as floats) by one packed conversion: Hopper's conversion
// instructions run at a small fraction of the FP32 rate, and the Q1.15 attention rounds every score
// and every probability to BF16 in each of its four kernels, so one conversion per pair of values
// instead of one per value matters there. Round to nearest even, as __float2bfloat16_rn.
__device__ __forceinline__ void bf16_round2(float& a, float& b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);   // .x = a (the low half), .y = b
    const uint32_t u = *reinterpret_cast<const uint32_t*>(&h);
    a = __uint_as_float(u << 16);
    b = __uint_as_float(u & 0xFFFF0000u);
}

// Two scores q.k (fp32 accumulators) as the softmax reads them under active boundaries (FWD_STATS):
// BF16 (the score GEMM's storage), then the hook; -inf where the position is not visible. The
// inner loops take the hooks without counting (Bd::Values) and as straight-line code, the value
// computed for every position and selected; a telemetry step counts in a loop of its own
// (count_score, count_prob), each visible value once.
template <class Bd>
__device__ __forceinline__ void read_scores2(float& s0, float& s1, bool visible0, bool visible1) {
    static_assert(Bd::ACTIVE, "plain boundaries read the scores as they are (FWD_ONE_PASS)");
    using Values = typename Bd::Values;
    float x0 = s0, x1 = s1;
    bf16_round2(x0, x1);
    x0 = Values::attention_scores(x0);
    x1 = Values::attention_scores(x1);
    s0 = visible0 ? x0 : -INFINITY;
    s1 = visible1 ? x1 : -INFINITY;
}

// P[query, key] of two positions, recomputed from their scores s = q.k and nl = -lse[query] *
// log2(e). Plain: exp(scale * s - lse), in fp32. Active boundaries: softmax_output(p), p from the
// score as read_scores2 reads it (the probability the forward stored, a multiple of 2^-15, before
// the BF16 rounding of its storage). The forward's P V and the backward's P^T dO round it to BF16 on
// the way to the tensor cores (the stored values, bit for bit); the backward's dS = P * (dP - D)
// takes the fp32 value, as the plain build takes its fp32 exp (the backward is BF16's, and BF16
// does not round P there either; the difference, at most 2^-9 relative, is of the order of the BF16
// rounding that dS gets before its GEMMs). 0 where not visible.
template <class Bd>
__device__ __forceinline__ void recompute_probs2(float s0, float s1, float scale_log2, float nl0, float nl1,
                                                 bool visible0, bool visible1, float& p0, float& p1) {
    if constexpr (Bd::ACTIVE) {
        using Values = typename Bd::Values;
        bf16_round2(s0, s1);
        const float q0 = Values::softmax_output(fast_exp2(fmaf(Values::attention_scores(s0), scale_log2, nl0)));
        const float q1 = Values::softmax_output(fast_exp2(fmaf(Values::attention_scores(s1), scale_log2, nl1)));
        p0 = visible0 ? q0 : 0.0f;
        p1 = visible1 ? q1 : 0.0f;
    } else {
        const float e0 = fast_exp2(fmaf(s0, scale_log2, nl0)), e1 = fast_exp2(fmaf(s1, scale_log2, nl1));
        p0 = visible0 ? e0 : 0.0f;
        p1 = visible1 ? e1 : 0.0f;
    }
}

// The statistics pass (FWD_STATS) under boundaries that bound the scores (Bd::ATTENTION_SCORE_BOUND,
// Q1.15: |x| <= 0.999) needs no running maximum: M = bound * scale * log2(e) is at least every
// row's maximum of x * scale * log2(e), so the row sum of exp2(x * scale * log2(e) - M) has terms in
// [2^(-2M), 1] and lse = (M + log2(sum)) * ln(2). That saves the per-tile max, its shuffles and the
// rescaling of the sum. The terms stay normal floats while 2M < 126; with the flash head sizes
// (scale <= 1/8) that holds for every bound up to 256 (Q1.15: 0.999; the range-scaled variant 64).
template <class Bd, int PASS>
__host__ __device__ constexpr bool fixed_row_max() {
    static_assert(Bd::ATTENTION_SCORE_BOUND <= 256.0f, "exp2 of -2M would leave the normal floats");
    return PASS == FWD_STATS && Bd::ATTENTION_SCORE_BOUND > 0.0f;
}

// whether the kernels instantiated with Bd count (a counting policy; its Values, or a policy without
// telemetry, do not)
template <class Bd>
__host__ __device__ constexpr bool counts_values() { return !std::is_same<Bd, typename Bd::Values>::value; }

// Telemetry (counting policies only): a visible score into the thread's tally (FWD_STATS counts
// the scores), and a visible probability (FWD_OUTPUT counts the probabilities); the values are the
// ones read_scores2 and recompute_probs2 compute. The tally is committed once, after the key loop.
template <class Bd>
using TallyOf = std::conditional_t<counts_values<Bd>(), typename Bd::Tally, NoTally>;
template <class Bd>
__device__ __forceinline__ void count_score(TallyOf<Bd>& tally, float s) { tally.score(bf16_round(s)); }
template <class Bd>
__device__ __forceinline__ void count_prob(TallyOf<Bd>& tally, float s, float scale_log2, float nl) {
    tally.prob(fast_exp2(fmaf(Bd::Values::attention_scores(bf16_round(s)), scale_log2, nl)));
}

// fn(mt, n, e) for each score of this thread's fragments whose position is visible (key <= query < T;
// every position when !need_mask): fragment element e of n-tile n of m-tile mt sits at row
// row0 + 16 mt + 8 (e >> 1), column col0 + 8 n + (e & 1) (row0 = the thread's first row, g below the
// warp's first; col0 = the tile's first key + 2 t4). The telemetry and the tests' probability store
// visit the scores this way.
template <int MT, int NT, typename Fn>
__device__ __forceinline__ void for_each_visible(int row0, int col0, int T, bool need_mask, Fn&& fn) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = row0 + mt * 16 + 8 * (e >> 1);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const int c = col0 + n * 8 + (e & 1);
                if (!need_mask || (c <= row && row < T)) fn(mt, n, e, row, c);
            }
        }
}

// an output element (att @ v, fp32) as stored: plain, as is; active, BF16 (the GEMM's storage) then
// attention_output (rows past T are never stored: not seen by the hook)
template <class Bd>
__device__ __forceinline__ float output_value(float o, bool row_valid) {
    if constexpr (Bd::ACTIVE) return row_valid ? Bd::attention_output(bf16_round(o)) : 0.0f;
    else return o;
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

// Copy ROWS rows (row0.. of a (T x HS) matrix with row stride `stride` elements) into a tile,
// NTH threads sharing the 16-byte chunks. Rows at or past T are zero-filled.
template <int ROWS, int HS, int NTH>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* g, int row0, int T, long long stride, int tid) {
    constexpr int CHUNKS_PER_ROW = HS / 8;
    constexpr int TOTAL = ROWS * CHUNKS_PER_ROW;
    static_assert(TOTAL % NTH == 0, "tile copy must divide evenly");
#pragma unroll
    for (int i = 0; i < TOTAL / NTH; i++) {
        int c = tid + i * NTH;
        int r = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        int t = row0 + r;
        bool valid = t < T;
        const bf16* src = valid ? g + (long long)t * stride + col : g;
        cp_async16(tile + r * Tile<HS>::LDS + col, src, valid);
    }
}

// Write a warp's 16 x HS fp32 accumulator (C fragments, n-tiles of 8 columns) into its 16 rows of
// a tile as bf16, row g scaled by mul0 and row g+8 by mul1.
// Bd: the forward's output through output_value (valid0 / valid1: rows g / g+8 are before T).
template <int HS, class Bd = IdentityBoundaries>
__device__ __forceinline__ void acc_to_tile(bf16* rows16, const float (&acc)[HS / 8][4], float mul0, float mul1, int lane,
                                            bool valid0 = true, bool valid1 = true) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        *reinterpret_cast<uint32_t*>(rows16 + g * Tile<HS>::LDS + n * 8 + 2 * t) =
            pack_bf16(output_value<Bd>(acc[n][0] * mul0, valid0), output_value<Bd>(acc[n][1] * mul0, valid0));
        *reinterpret_cast<uint32_t*>(rows16 + (g + 8) * Tile<HS>::LDS + n * 8 + 2 * t) =
            pack_bf16(output_value<Bd>(acc[n][2] * mul1, valid1), output_value<Bd>(acc[n][3] * mul1, valid1));
    }
}

// Copy a warp's ROWS tile rows to global memory (16-byte stores); rows at or past nvalid are skipped.
template <int ROWS, int HS>
__device__ __forceinline__ void tile_rows_to_global(bf16* g, long long stride, const bf16* rows, int nvalid, int lane) {
    constexpr int CHUNKS_PER_ROW = HS / 8;
#pragma unroll
    for (int c = lane; c < ROWS * CHUNKS_PER_ROW; c += WARP_SIZE) {
        int r = c / CHUNKS_PER_ROW, col = (c % CHUNKS_PER_ROW) * 8;
        if (r < nvalid) {
            *reinterpret_cast<uint4*>(g + (long long)r * stride + col) =
                *reinterpret_cast<const uint4*>(rows + r * Tile<HS>::LDS + col);
        }
    }
}

// The column sums of a staged 64-row tile (bf16, padded rows: what tile_rows_to_global writes),
// rows below nvalid only, into out[0..63], by a CTA of 128 threads: thread t sums column t % 64
// over half of the rows, then the two halves are added (a fixed order: deterministic). Every
// thread of the CTA calls it; it has its own barriers.
__device__ __forceinline__ void tile_column_sums64(float* out, const bf16* tile, int nvalid, int tid) {
    __shared__ float upper_half[64];
    const int c = tid & 63, half = tid >> 6;
    const int r_end = min(nvalid, 32 * half + 32);
    float sum = 0.0f;
    for (int r = 32 * half; r < r_end; r++) sum += __bfloat162float(tile[r * Tile<64>::LDS + c]);
    __syncthreads();   // (a previous call's readers are done with upper_half)
    if (half == 1) upper_half[c] = sum;
    __syncthreads();
    if (half == 0) out[c] = sum + upper_half[c];
}

// The scale and the tensor's amax so far come from Fp8EpilogueInputs, which the kernels load at their start:
// loaded here, their latency (an L2 round trip) came after the main loop, with every thread of the CTA waiting.
struct Fp8EpilogueInputs {
    float scale = 1.0f;
    uint32_t amax_seen = 0; // (thread 0's only: fp8_commit's test)
    __device__ __forceinline__ void load(const Fp8Target& t, int tid) {
        if (t.active()) scale = __ldg(t.scale);
        if (tid == 0 && t.amax) amax_seen = __ldcg(t.amax);
    }
};

// The amax alone of NT staged 64-row tiles (the backward's dqkv under Fp8Target::amax_only, TCFP-12's fresh
// scales), where the kernel stores the BF16 tiles as usual: one atomic per CTA, where it would raise the
// tensor's (fp8_commit). By the 128 threads, after a barrier.
template <int NT>
__device__ __forceinline__ void tiles_amax(const Fp8Target& t, const Fp8EpilogueInputs& in, const bf16* const (&tiles)[NT],
                                           int nvalid, int tid) {
    constexpr int LDS = Tile<64>::LDS;
    const uint32_t amax_seen = in.amax_seen;
    const int half = tid & 1, line = tid >> 1;
    uint32_t amax = 0;
    if (line < nvalid) {
#pragma unroll
        for (int i = 0; i < NT; i++) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint4 v = *reinterpret_cast<const uint4*>(tiles[i] + line * LDS + 32 * half + 8 * q);
                const bf16* x = reinterpret_cast<const bf16*>(&v);
#pragma unroll
                for (int j = 0; j < 8; j++) amax = max(amax, llmc::amax_bits(__bfloat162float(x[j])));
            }
        }
    }
    fp8_commit(amax, 0u, 0u, 0u, t.amax, Fp8Stats(), amax_seen); // (the kernel's last use of its shared sums)
}

// The FP8 codes (kind K: E5M2 for the backward's gradient tiles, E4M3 for the forward's output) of NT staged
// tiles of ROWS rows (bf16, padded rows, HS = 64 columns; tile i at column col0[i]), rows below nvalid only,
// into the FP8 recipe's two layouts of a linear's operand (Fp8Target): row grow0 + r, column col0[i] + c of
// t.rows (n_rows x m_cols) and row col0[i] + c, column grow0 + r of t.cols (m_cols x n_rows; not written when
// t.cols is null); and the tiles' amax (and telemetry counts) into the tensor's (t.amax null: evaluation,
// nothing recorded). Uses: the backward's dqkv (the qkv layer's output gradient, 64-row tiles, 128 threads)
// and the forward's output (the attention projection's input, one 128-row tile, 256 threads). By a CTA of
// 2 * ROWS threads, after a barrier (the tiles are complete).
//
// Each thread quantizes a 4 x 8 patch: rows r0 .. r0 + 3, columns c0 .. c0 + 7. A warp covers 32 rows x 32
// columns (lane % 4 picks the 8 columns, lane / 4 the 4 rows), so that both layouts are written in whole
// 32-byte sectors: in t.rows, 4 lanes write a row's 32 contiguous codes (8 bytes each); in t.cols, the 4
// rows' codes of one column are one 32-bit word (a 4 x 4 byte transpose in registers, fp8_transpose4x4),
// and 8 lanes write a column's 32 contiguous codes. (Until 2026-11-28 the codes went through shared memory
// byte by byte for the transposed layout: +12% on the dK/dV kernel against its BF16 store, ncu on an H200.)
// The codes are those the recipe's quantize pass makes from the BF16 values stored otherwise (fp8_pack2, the
// same saturating conversion): the two agree bit for bit (build/test_attention). The amax of all NT tiles
// goes to the tensor's with one atomic per CTA, and only where it would raise it (fp8_commit; an atomic per
// warp and tile on one address serialized: +30 ms per d12 step in a first version). The dK/dV kernel hands
// over both its tiles at once, so that the CTA syncs once for both, not twice each. The kernels call this
// last (nothing reuses fp8_commit's shared sums after it, so no barrier at its end).
template <Fp8Kind K, int NT, int ROWS = 64>
__device__ __forceinline__ void tiles_to_fp8(const Fp8Target& t, const Fp8EpilogueInputs& in, const bf16* const (&tiles)[NT],
                                             const int (&col0)[NT], long long grow0, int nvalid, long long n_rows, int m_cols,
                                             int tid) {
    constexpr int LDS = Tile<64>::LDS, ROW_BLOCKS = ROWS / 32;
    static_assert(ROWS % 32 == 0, "warps of 32 rows x 32 columns: 2 * ROWS threads");
    const float s = in.scale;
    const uint32_t amax_seen = in.amax_seen;
    const int warp = tid >> 5, lane = tid & 31;
    const int r0 = 32 * (warp % ROW_BLOCKS) + 4 * (lane >> 2); // this thread's rows r0 .. r0 + 3
    const int c0 = 32 * (warp / ROW_BLOCKS) + 8 * (lane & 3);  // and columns c0 .. c0 + 7 of each tile
    const int nrows = min(4, nvalid - r0);                     // how many of the 4 rows are in the matrix
    // t.cols in 32-bit words: all 4 rows present and the words aligned; else byte by byte
    const bool words = nrows == 4 && n_rows % 4 == 0 && grow0 % 4 == 0 && ((uintptr_t)t.cols & 3) == 0;
    uint32_t amax = 0, sat = 0, ftz = 0, count = 0;
    if (nrows > 0) {
#pragma unroll
        for (int i = 0; i < NT; i++) {
            uint32_t codes[2][4] = {}; // codes[h][k]: row r0 + k, columns c0 + 4h .. + 3 (first column in the low byte)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (k < nrows) {
                    const uint4 v = *reinterpret_cast<const uint4*>(tiles[i] + (r0 + k) * LDS + c0);
                    const bf16* x = reinterpret_cast<const bf16*>(&v);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float a[4];
#pragma unroll
                        for (int j = 0; j < 4; j++) a[j] = __bfloat162float(x[4 * h + j]);
                        const uint32_t code = fp8_pack2<K>(a[0] * s, a[1] * s) | ((uint32_t)fp8_pack2<K>(a[2] * s, a[3] * s) << 16);
                        if (t.stats.counts) {
#pragma unroll
                            for (int j = 0; j < 4; j++) fp8_account<K, true>(a[j], s, (uint8_t)(code >> (8 * j)), amax, sat, ftz);
                        } else {
#pragma unroll
                            for (int j = 0; j < 4; j++) amax = max(amax, llmc::amax_bits(a[j]));
                        }
                        codes[h][k] = code;
                    }
                    count += 8;
                    *reinterpret_cast<uint2*>(t.rows + (grow0 + r0 + k) * m_cols + col0[i] + c0) = make_uint2(codes[0][k], codes[1][k]);
                }
            }
            if (t.cols != nullptr) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t col_word[4]; // col_word[j]: column c0 + 4h + j, rows r0 .. r0 + 3
                    fp8_transpose4x4(codes[h], col_word);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        uint8_t* dst = t.cols + (long long)(col0[i] + c0 + 4 * h + j) * n_rows + grow0 + r0;
                        if (words) {
                            *reinterpret_cast<uint32_t*>(dst) = col_word[j];
                        } else {
                            for (int k = 0; k < nrows; k++) dst[k] = (uint8_t)(col_word[j] >> (8 * k));
                        }
                    }
                }
            }
        }
    }
    fp8_commit(amax, sat, ftz, count, t.amax, t.stats, amax_seen);
}

// ---------------------------------------------------------------------------------------------
// FLASH GRID ORDER. Every kernel's grid is (blocks along T, B*NH): x, which the hardware hands out
// fastest, walks the query (key) blocks of one (batch, head), so the CTAs resident at a time cover a
// few heads, all of whose blocks stream the same K/V (Q/dO) tiles: those come from L2 after the
// first read. With (B*NH, blocks along T), as before, the resident CTAs were one block of each of
// hundreds of heads, each streaming its own head's tiles, which were evicted again before the next
// block of that head ran: the tiles came from HBM once per CTA (~1.7 GB per layer and kernel at
// B=64, NH=12, T=1024), which bound the backward on an H100 (it ran ~1.4x faster on an H200, whose
// compute is the same). B*NH is then limited to 65535 (check_args).
//
// Forward. Grid (ceil(T/QR), B*NH) (see FLASH GRID ORDER), QR = 16*MT*NW query rows per CTA; blockIdx.x counts query
// blocks from the last (the longest) down, so the heaviest CTAs start first. Each warp: 16*MT
// query rows, Q fragments in registers; per key tile of KB rows S = Q K^T (16*MT x KB), online
// softmax, O += P V. The K/V tiles of a step are shared by the NW warps; each warp skips the
// tiles above its own rows (the CTA's last tile only concerns its last warps).
// PASS (see the top of the file): FWD_ONE_PASS for plain boundaries; FWD_STATS (writes lse only,
// reads no V) then FWD_OUTPUT (reads lse, writes out and, when probs is not null, every visible
// probability into probs (B, NH, T, T), for tests) for active ones.

template <class Bd, int PASS, int HS, int MT, int NW, int STAGES, int MINB>
__global__ void __launch_bounds__(NW * WARP_SIZE, MINB)
flash_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                 int T, int NH, float scale_log2, bf16* __restrict__ probs) {
    constexpr int NTH = NW * WARP_SIZE;
    constexpr int QR = 16 * MT * NW;
    constexpr int KB = FwdCfg<MT, NW, STAGES, MINB>::KB;
    constexpr int LDS = Tile<HS>::LDS;
    constexpr int KTILE = KB * LDS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);   // [QR][LDS]
    bf16* sK = sQ + QR * LDS;                        // [STAGES][KB][LDS]
    bf16* sV = sK + STAGES * KTILE;                  // [STAGES][KB][LDS]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * QR;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;

    const int wr0 = warp * 16 * MT;                  // this warp's first row within the CTA's block
    const int wq_lo = q0 + wr0, wq_hi = wq_lo + 16 * MT - 1;   // its first and last query row
    const int nkb = (min(q0 + QR, T) + KB - 1) / KB; // key tiles 0 .. nkb-1 hold keys <= the last row

    auto load_kv = [&](int j) {
        const int st = j % STAGES;
        load_tile<KB, HS, NTH>(sK + st * KTILE, kg, j * KB, T, stride, tid);
        if (PASS != FWD_STATS) load_tile<KB, HS, NTH>(sV + st * KTILE, vg, j * KB, T, stride, tid);
    };
    // cp.async groups: Q with the first key tile, then one group per key tile (empty ones too,
    // so that "all but the newest STAGES-2 groups are done" always means "tile j has landed")
    load_tile<QR, HS, NTH>(sQ, qg, q0, T, stride, tid);
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < nkb) load_kv(st);
        cp_async_commit();
    }

    uint32_t qf[MT][HS / 16][4];        // this warp's query rows as A fragments
    float o[MT][HS / 8][4];             // output accumulators, 16 x HS per m-tile
    float m[MT][2], l[MT][2];           // running max (log2 domain) of rows g and g+8; this thread's part of the sums
    float nl[MT][2];                    // FWD_OUTPUT: -lse * log2(e) of rows g and g+8
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        zero_acc(o[mt]);
        m[mt][0] = m[mt][1] = fixed_row_max<Bd, PASS>() ? Bd::ATTENTION_SCORE_BOUND * scale_log2 : -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
        if constexpr (PASS == FWD_OUTPUT) {
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = wq_lo + mt * 16 + g + 8 * hf;
                nl[mt][hf] = row < T ? -lse[(long long)bh * T + row] * LOG2E : -INFINITY;
            }
        }
    }

    TallyOf<Bd> tally;   // telemetry (the counting instantiation): the visible scores or probabilities
    for (int j = 0; j < nkb; j++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // tile j visible to all; every warp is done with tile j-1, whose buffer is refilled next
        if (j + STAGES - 1 < nkb) load_kv(j + STAGES - 1);
        cp_async_commit();
        if (j == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int ks = 0; ks < HS / 16; ks++) ldsm_x4(qf[mt][ks], sQ + off_a<HS>(wr0 + mt * 16, ks * 16, lane));
        }
        if (j * KB > wq_hi || wq_lo >= T) continue;   // the whole tile is above this warp's rows (warp-uniform)
        const bf16* k_s = sK + (j % STAGES) * KTILE;
        const bf16* v_s = sV + (j % STAGES) * KTILE;

        // S = Q K^T; each K fragment serves the MT m-tiles
        float s[MT][KB / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) zero_acc(s[mt]);
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
#pragma unroll
            for (int np = 0; np < KB / 16; np++) {
                uint32_t kf[4];
                ldsm_x4(kf, k_s + off_b<HS>(np * 16, ks * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(s[mt][2 * np], qf[mt][ks], kf[0], kf[1]);
                    mma_16816(s[mt][2 * np + 1], qf[mt][ks], kf[2], kf[3]);
                }
            }
        }
        if constexpr (PASS == FWD_ONE_PASS) {
            // causal mask (key > query -> -inf) where the tile reaches past this warp's first row;
            // keys at or past T are past every valid row, so they are masked too
            if (j * KB + KB - 1 > wq_lo) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int r0 = wq_lo + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
                    for (int n = 0; n < KB / 8; n++) {
                        const int c = j * KB + n * 8 + 2 * t4;
                        if (c > r0) s[mt][n][0] = -INFINITY;
                        if (c + 1 > r0) s[mt][n][1] = -INFINITY;
                        if (c > r1) s[mt][n][2] = -INFINITY;
                        if (c + 1 > r1) s[mt][n][3] = -INFINITY;
                    }
                }
            }
        } else {
            // active boundaries: every visible score (key <= query < T) through the hooks; FWD_STATS
            // keeps the score as read, FWD_OUTPUT turns it into the stored probability
            const bool need_mask = j * KB + KB - 1 > wq_lo || wq_hi >= T;
            if constexpr (counts_values<Bd>()) {   // telemetry: each visible value counted once, before the loop below
                for_each_visible<MT, KB / 8>(wq_lo + g, j * KB + 2 * t4, T, need_mask, [&](int mt, int n, int e, int, int) {
                    if constexpr (PASS == FWD_STATS) count_score<Bd>(tally, s[mt][n][e]);
                    else count_prob<Bd>(tally, s[mt][n][e], scale_log2, nl[mt][e >> 1]);
                });
            }
            // tiles off the diagonal: a loop without the visibility tests (as in the wgmma kernel)
            auto through_hooks = [&](auto masked) {
                constexpr bool MASKED = decltype(masked)::value;
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {   // elements 2h, 2h + 1: one row, columns c, c + 1
                        const int row = wq_lo + mt * 16 + g + 8 * h;
#pragma unroll
                        for (int n = 0; n < KB / 8; n++) {
                            const int c = j * KB + n * 8 + 2 * t4;
                            const bool vis0 = !MASKED || (c <= row && row < T), vis1 = !MASKED || (c + 1 <= row && row < T);
                            float& x0 = s[mt][n][2 * h];
                            float& x1 = s[mt][n][2 * h + 1];
                            if constexpr (PASS == FWD_STATS) read_scores2<Bd>(x0, x1, vis0, vis1);
                            else recompute_probs2<Bd>(x0, x1, scale_log2, nl[mt][h], nl[mt][h], vis0, vis1, x0, x1);
                        }
                    }
                }
            };
            if (need_mask) through_hooks(std::true_type());
            else through_hooks(std::false_type());
            if (PASS == FWD_OUTPUT && probs != nullptr) {   // tests: every visible stored probability
                for_each_visible<MT, KB / 8>(wq_lo + g, j * KB + 2 * t4, T, need_mask, [&](int mt, int n, int e, int row, int c) {
                    probs[((long long)bh * T + row) * T + c] = __float2bfloat16_rn(s[mt][n][e]);
                });
            }
        }
        // online softmax: every row sees key 0 in tile 0, so after tile 0 the maxima are finite
        // (a row whose keys in a later tile are all masked keeps its max: alpha = 1, P = 0). Under
        // active boundaries the rows past T see nothing; their sums become NaN and are never stored.
        if constexpr (fixed_row_max<Bd, PASS>()) {   // the bound as the maximum of every row
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
                for (int n = 0; n < KB / 8; n++) {
                    sum0 += fast_exp2(fmaf(s[mt][n][0], scale_log2, -m[mt][0])) + fast_exp2(fmaf(s[mt][n][1], scale_log2, -m[mt][0]));
                    sum1 += fast_exp2(fmaf(s[mt][n][2], scale_log2, -m[mt][1])) + fast_exp2(fmaf(s[mt][n][3], scale_log2, -m[mt][1]));
                }
                l[mt][0] += sum0;
                l[mt][1] += sum1;
            }
        } else if constexpr (PASS != FWD_OUTPUT) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
                for (int n = 0; n < KB / 8; n++) {
                    mx0 = fmaxf(mx0, fmaxf(s[mt][n][0], s[mt][n][1]));
                    mx1 = fmaxf(mx1, fmaxf(s[mt][n][2], s[mt][n][3]));
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffff, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffff, mx1, 2));
                const float mn0 = fmaxf(m[mt][0], mx0 * scale_log2), mn1 = fmaxf(m[mt][1], mx1 * scale_log2);
                const float alpha0 = fast_exp2(m[mt][0] - mn0), alpha1 = fast_exp2(m[mt][1] - mn1);
                m[mt][0] = mn0; m[mt][1] = mn1;
                float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
                for (int n = 0; n < KB / 8; n++) {
                    s[mt][n][0] = fast_exp2(fmaf(s[mt][n][0], scale_log2, -mn0));
                    s[mt][n][1] = fast_exp2(fmaf(s[mt][n][1], scale_log2, -mn0));
                    s[mt][n][2] = fast_exp2(fmaf(s[mt][n][2], scale_log2, -mn1));
                    s[mt][n][3] = fast_exp2(fmaf(s[mt][n][3], scale_log2, -mn1));
                    sum0 += s[mt][n][0] + s[mt][n][1];
                    sum1 += s[mt][n][2] + s[mt][n][3];
                }
                l[mt][0] = l[mt][0] * alpha0 + sum0;
                l[mt][1] = l[mt][1] * alpha1 + sum1;
                if constexpr (PASS == FWD_ONE_PASS) {
#pragma unroll
                    for (int n = 0; n < HS / 8; n++) {
                        o[mt][n][0] *= alpha0; o[mt][n][1] *= alpha0;
                        o[mt][n][2] *= alpha1; o[mt][n][3] *= alpha1;
                    }
                }
            }
        }
        // O += P V (not in FWD_STATS: no V): the C fragments of S are re-packed as A fragments
        // (k = key); each V fragment (ldmatrix.trans of the key-major V tile) serves the MT m-tiles
        if constexpr (PASS != FWD_STATS) {
#pragma unroll
            for (int kk = 0; kk < KB / 16; kk++) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) c_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
                for (int dp = 0; dp < HS / 16; dp++) {
                    uint32_t vf[4];
                    ldsm_x4_trans(vf, v_s + off_a<HS>(kk * 16, dp * 16, lane));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_16816(o[mt][2 * dp], pa[mt], vf[0], vf[1]);
                        mma_16816(o[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
                    }
                }
            }
        }
    }

    tally.commit();
    // finish: full row sums, O / l, lse = ln(sum exp(scale * q.k)); the output goes through this
    // warp's own rows of the Q tile (its Q is in registers), then out with 16-byte stores.
    // FWD_STATS: lse only; FWD_OUTPUT: O as accumulated (P was final), through the output hook.
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int row0 = wq_lo + mt * 16 + g;
        if constexpr (PASS == FWD_OUTPUT) {
            acc_to_tile<HS, Bd>(sQ + (wr0 + mt * 16) * LDS, o[mt], 1.0f, 1.0f, lane, row0 < T, row0 + 8 < T);
            continue;
        }
        float l0 = l[mt][0], l1 = l[mt][1];
        l0 += __shfl_xor_sync(0xffffffff, l0, 1);
        l0 += __shfl_xor_sync(0xffffffff, l0, 2);
        l1 += __shfl_xor_sync(0xffffffff, l1, 1);
        l1 += __shfl_xor_sync(0xffffffff, l1, 2);
        if constexpr (PASS == FWD_ONE_PASS) acc_to_tile<HS>(sQ + (wr0 + mt * 16) * LDS, o[mt], 1.0f / l0, 1.0f / l1, lane);
        if (t4 == 0) {
            float* lse_bh = lse + (long long)bh * T;
            if (row0 < T) lse_bh[row0] = (m[mt][0] + log2f(l0)) * LN2;
            if (row0 + 8 < T) lse_bh[row0 + 8] = (m[mt][1] + log2f(l1)) * LN2;
        }
    }
    if constexpr (PASS == FWD_STATS) return;
    __syncwarp();
    tile_rows_to_global<16 * MT, HS>(out + ((long long)b * T + wq_lo) * C + (long long)h * HS, C, sQ + wr0 * LDS,
                                     T - wq_lo, lane);
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: dQ (and D). Grid (ceil(T/QR), B*NH), QR = 16*MT*NW query rows per CTA, query
// blocks from the last down. Each warp owns 16*MT query rows. It first computes D = rowsum(dO * O)
// of its rows (straight from global memory, while the first tiles are in flight) and stores it for
// the dK/dV kernel. Then, per key tile of KB rows, it recomputes S = Q K^T and dP = dO V^T, forms
// dS, and adds dS K. Q and dO fragments are kept in registers when A_IN_REGS, else re-read from
// shared memory at every k-step.

// D of one row: the 4 lanes of a quad (same row) each take HS/4 consecutive columns, then the quad
// adds its partial sums (a fixed order, so the result is deterministic). valid is quad-uniform.
template <int HS>
__device__ __forceinline__ float quad_row_dot(const bf16* a, const bf16* b, bool valid, int t4) {
    float sum = 0.0f;
    if (valid) {
#pragma unroll
        for (int c = 0; c < HS / 32; c++) {
            const uint4 x = *reinterpret_cast<const uint4*>(a + t4 * (HS / 4) + c * 8);
            const uint4 y = *reinterpret_cast<const uint4*>(b + t4 * (HS / 4) + c * 8);
            const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&x);
            const __nv_bfloat162* y2 = reinterpret_cast<const __nv_bfloat162*>(&y);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 xf = __bfloat1622float2(x2[e]), yf = __bfloat1622float2(y2[e]);
                sum = fmaf(xf.x, yf.x, sum);
                sum = fmaf(xf.y, yf.y, sum);
            }
        }
    }
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    return sum;
}

template <class Bd, int HS, int KB, int MT, int NW, int STAGES, int MINB, bool A_IN_REGS>
__global__ void __launch_bounds__(NW * WARP_SIZE, MINB)
flash_bwd_dq_kernel(bf16* __restrict__ dqkv, float* __restrict__ Dvec, const bf16* __restrict__ dout,
                    const bf16* __restrict__ qkv, const bf16* __restrict__ o_in, const float* __restrict__ lse,
                    int T, int NH, float scale_log2, float scale) {
    constexpr int NTH = NW * WARP_SIZE;
    constexpr int QR = 16 * MT * NW;
    constexpr int NA = A_IN_REGS ? HS / 16 : 1;
    constexpr int LDS = Tile<HS>::LDS;
    constexpr int KTILE = KB * LDS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sQ = reinterpret_cast<bf16*>(smem_raw);   // [QR][LDS]
    bf16* sdO = sQ + QR * LDS;                       // [QR][LDS]
    bf16* sK = sdO + QR * LDS;                       // [STAGES][KB][LDS]
    bf16* sV = sK + STAGES * KTILE;                  // [STAGES][KB][LDS]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * QR;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;
    const bf16* dog = dout + (long long)b * T * C + (long long)h * HS;
    const bf16* og = o_in + (long long)b * T * C + (long long)h * HS;

    const int wr0 = warp * 16 * MT;
    const int wq_lo = q0 + wr0, wq_hi = wq_lo + 16 * MT - 1;
    const int nkb = (min(q0 + QR, T) + KB - 1) / KB;

    auto load_kv = [&](int j) {
        const int st = j % STAGES;
        load_tile<KB, HS, NTH>(sK + st * KTILE, kg, j * KB, T, stride, tid);
        load_tile<KB, HS, NTH>(sV + st * KTILE, vg, j * KB, T, stride, tid);
    };
    load_tile<QR, HS, NTH>(sQ, qg, q0, T, stride, tid);
    load_tile<QR, HS, NTH>(sdO, dog, q0, T, C, tid);
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < nkb) load_kv(st);
        cp_async_commit();
    }

    // this thread's query rows wq_lo + 16*mt + g (+8): -lse in the log2 domain (-inf past T, so
    // that P = 0 there) and D, which is also stored for the dK/dV kernel
    float nl[MT][2], Dr[MT][2];
    const float* lse_bh = lse + (long long)bh * T;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = wq_lo + mt * 16 + g + 8 * hf;
            const bool valid = row < T;
            nl[mt][hf] = valid ? -lse_bh[row] * LOG2E : -INFINITY;
            Dr[mt][hf] = quad_row_dot<HS>(og + (long long)row * C, dog + (long long)row * C, valid, t4);
            if (valid && t4 == 0) Dvec[(long long)bh * T + row] = Dr[mt][hf];
        }
    }

    uint32_t qf[MT][NA][4], dof[MT][NA][4];
    float dq[MT][HS / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) zero_acc(dq[mt]);

    for (int j = 0; j < nkb; j++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // tile j visible to all; every warp is done with tile j-1
        if (j + STAGES - 1 < nkb) load_kv(j + STAGES - 1);
        cp_async_commit();
        if (A_IN_REGS && j == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int ks = 0; ks < NA; ks++) {
                    ldsm_x4(qf[mt][ks], sQ + off_a<HS>(wr0 + mt * 16, ks * 16, lane));
                    ldsm_x4(dof[mt][ks], sdO + off_a<HS>(wr0 + mt * 16, ks * 16, lane));
                }
        }
        if (j * KB > wq_hi || wq_lo >= T) continue;   // the whole tile is above this warp's rows
        const bf16* k_s = sK + (j % STAGES) * KTILE;
        const bf16* v_s = sV + (j % STAGES) * KTILE;

        // S = Q K^T and dP = dO V^T (16*MT queries x KB keys)
        float s[MT][KB / 8][4], dp[MT][KB / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) { zero_acc(s[mt]); zero_acc(dp[mt]); }
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t a_q[MT][4], a_do[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if constexpr (A_IN_REGS) {
#pragma unroll
                    for (int x = 0; x < 4; x++) { a_q[mt][x] = qf[mt][ks % NA][x]; a_do[mt][x] = dof[mt][ks % NA][x]; }
                } else {
                    ldsm_x4(a_q[mt], sQ + off_a<HS>(wr0 + mt * 16, ks * 16, lane));
                    ldsm_x4(a_do[mt], sdO + off_a<HS>(wr0 + mt * 16, ks * 16, lane));
                }
            }
#pragma unroll
            for (int np = 0; np < KB / 16; np++) {
                uint32_t bfr[4];
                ldsm_x4(bfr, k_s + off_b<HS>(np * 16, ks * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(s[mt][2 * np], a_q[mt], bfr[0], bfr[1]);
                    mma_16816(s[mt][2 * np + 1], a_q[mt], bfr[2], bfr[3]);
                }
                ldsm_x4(bfr, v_s + off_b<HS>(np * 16, ks * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(dp[mt][2 * np], a_do[mt], bfr[0], bfr[1]);
                    mma_16816(dp[mt][2 * np + 1], a_do[mt], bfr[2], bfr[3]);
                }
            }
        }
        // P and dS (in place of dP); the causal mask where the tile reaches past the warp's first
        // row (keys past T are past every valid row; rows past T have P = 0 through nl = -inf, and
        // under active boundaries are masked too, so that the hooks never see them)
        const bool need_mask = j * KB + KB - 1 > wq_lo || (Bd::ACTIVE && wq_hi >= T);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int r0 = wq_lo + mt * 16 + g, r1 = r0 + 8;
            const bool v0 = !Bd::ACTIVE || r0 < T, v1 = !Bd::ACTIVE || r1 < T;
#pragma unroll
            for (int n = 0; n < KB / 8; n++) {
                const int c = j * KB + n * 8 + 2 * t4;
                float p00, p01;
                recompute_probs2<Bd>(s[mt][n][0], s[mt][n][1], scale_log2, nl[mt][0], nl[mt][0],
                                     !need_mask || (c <= r0 && v0), !need_mask || (c + 1 <= r0 && v0), p00, p01);
                float p10, p11;
                recompute_probs2<Bd>(s[mt][n][2], s[mt][n][3], scale_log2, nl[mt][1], nl[mt][1],
                                     !need_mask || (c <= r1 && v1), !need_mask || (c + 1 <= r1 && v1), p10, p11);
                dp[mt][n][0] = p00 * (dp[mt][n][0] - Dr[mt][0]);
                dp[mt][n][1] = p01 * (dp[mt][n][1] - Dr[mt][0]);
                dp[mt][n][2] = p10 * (dp[mt][n][2] - Dr[mt][1]);
                dp[mt][n][3] = p11 * (dp[mt][n][3] - Dr[mt][1]);
            }
        }
        // dQ += dS K (k = key): B fragments by ldmatrix.trans of the K tile, each serving MT m-tiles
#pragma unroll
        for (int kk = 0; kk < KB / 16; kk++) {
            uint32_t da[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) c_to_a(da[mt], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
#pragma unroll
            for (int dd = 0; dd < HS / 16; dd++) {
                uint32_t bfr[4];
                ldsm_x4_trans(bfr, k_s + off_a<HS>(kk * 16, dd * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(dq[mt][2 * dd], da[mt], bfr[0], bfr[1]);
                    mma_16816(dq[mt][2 * dd + 1], da[mt], bfr[2], bfr[3]);
                }
            }
        }
    }

    // write dQ (times scale) through this warp's own rows of the Q tile (nobody else reads them;
    // with !A_IN_REGS this warp's last reads of them are done, in program order)
#pragma unroll
    for (int mt = 0; mt < MT; mt++) acc_to_tile<HS>(sQ + (wr0 + mt * 16) * LDS, dq[mt], scale, scale, lane);
    __syncwarp();
    tile_rows_to_global<16 * MT, HS>(dqkv + ((long long)b * T + wq_lo) * stride + (long long)h * HS, stride,
                                     sQ + wr0 * LDS, T - wq_lo, lane);
}

// ---------------------------------------------------------------------------------------------
// Backward, step 2: dK and dV. Grid (ceil(T/KR), B*NH), KR = 16*MT*NW keys per CTA; key block
// kb = blockIdx.x (block 0 sees the most query tiles, so it starts first). Each warp owns 16*MT
// keys and computes, per query tile of QB rows, the transposed products S^T = K Q^T and
// dP^T = V dO^T (keys as rows), so that P^T and dS^T come out as C fragments that re-pack into A
// fragments for dV += P^T dO and dK += dS^T Q. Every Q / dO fragment read from shared memory
// serves the MT m-tiles. lse and D of the query tile ride along in the same cp.async group.

template <class Bd, int HS, int QB, int MT, int NW, int STAGES, int MINB>
__global__ void __launch_bounds__(NW * WARP_SIZE, MINB)
flash_bwd_dkv_kernel(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                     const float* __restrict__ lse, const float* __restrict__ Dvec,
                     int T, int NH, float scale_log2, float scale) {
    constexpr int NTH = NW * WARP_SIZE;
    constexpr int KR = 16 * MT * NW;
    constexpr int LDS = Tile<HS>::LDS;
    constexpr int QTILE = QB * LDS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [KR][LDS]
    bf16* sV = sK + KR * LDS;                       // [KR][LDS]
    bf16* sQ = sV + KR * LDS;                       // [STAGES][QB][LDS]
    bf16* sdO = sQ + STAGES * QTILE;                // [STAGES][QB][LDS]
    float* sL = reinterpret_cast<float*>(sdO + STAGES * QTILE);   // [STAGES][QB] lse
    float* sD = sL + STAGES * QB;                                  // [STAGES][QB] D
    static_assert(2 * QB <= NTH, "one thread per lse/D element");

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.x * KR;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;
    const bf16* dog = dout + (long long)b * T * C + (long long)h * HS;
    const float* lse_bh = lse + (long long)bh * T;
    const float* D_bh = Dvec + (long long)bh * T;

    const int wr0 = warp * 16 * MT;                  // this warp's first key row within the CTA's block
    const int wk_lo = k0 + wr0, wk_hi = wk_lo + 16 * MT - 1;
    const int i0 = k0 / QB;                          // first query tile with a row >= k0
    const int nq = (T + QB - 1) / QB - i0;           // query tiles visited by the CTA

    auto load_q_block = [&](int it) {                // the it-th visited query tile
        const int qs = (i0 + it) * QB, st = it % STAGES;
        load_tile<QB, HS, NTH>(sQ + st * QTILE, qg, qs, T, stride, tid);
        load_tile<QB, HS, NTH>(sdO + st * QTILE, dog, qs, T, C, tid);
        if (tid < QB) {
            const bool valid = qs + tid < T;
            cp_async4(sL + st * QB + tid, valid ? lse_bh + qs + tid : lse_bh, valid);
        } else if (tid < 2 * QB) {
            const int r = tid - QB;
            const bool valid = qs + r < T;
            cp_async4(sD + st * QB + r, valid ? D_bh + qs + r : D_bh, valid);
        }
    };
    load_tile<KR, HS, NTH>(sK, kg, k0, T, stride, tid);
    load_tile<KR, HS, NTH>(sV, vg, k0, T, stride, tid);
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < nq) load_q_block(st);
        cp_async_commit();
    }

    float dk[MT][HS / 8][4], dv[MT][HS / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) { zero_acc(dk[mt]); zero_acc(dv[mt]); }

    for (int it = 0; it < nq; it++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // tile it visible to all; every warp is done with tile it-1
        if (it + STAGES - 1 < nq) load_q_block(it + STAGES - 1);
        cp_async_commit();
        const int qs = (i0 + it) * QB;
        if (qs + QB - 1 < wk_lo || wk_lo >= T) continue;   // no query of the tile sees this warp's keys
        const int st = it % STAGES;
        const bf16* q_s = sQ + st * QTILE;
        const bf16* do_s = sdO + st * QTILE;
        const float* l_s = sL + st * QB;
        const float* d_s = sD + st * QB;

        // dP^T = V dO^T and S^T = K Q^T (16*MT keys x QB queries)
        float dpt[MT][QB / 8][4], sT[MT][QB / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) { zero_acc(dpt[mt]); zero_acc(sT[mt]); }
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) ldsm_x4(af[mt], sV + off_a<HS>(wr0 + mt * 16, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < QB / 16; np++) {
                uint32_t bfr[4];
                ldsm_x4(bfr, do_s + off_b<HS>(np * 16, ks * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(dpt[mt][2 * np], af[mt], bfr[0], bfr[1]);
                    mma_16816(dpt[mt][2 * np + 1], af[mt], bfr[2], bfr[3]);
                }
            }
        }
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) ldsm_x4(af[mt], sK + off_a<HS>(wr0 + mt * 16, ks * 16, lane));
#pragma unroll
            for (int np = 0; np < QB / 16; np++) {
                uint32_t bfr[4];
                ldsm_x4(bfr, q_s + off_b<HS>(np * 16, ks * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(sT[mt][2 * np], af[mt], bfr[0], bfr[1]);
                    mma_16816(sT[mt][2 * np + 1], af[mt], bfr[2], bfr[3]);
                }
            }
        }
        // P^T = exp(scale * S^T - lse[query]); dS^T = P^T * (dP^T - D[query]).
        // Masked: key > query (causal), and query rows past T (their lse/D were zero-filled).
        const bool need_mask = (qs < wk_hi) || (qs + QB > T);
#pragma unroll
        for (int n = 0; n < QB / 8; n++) {
            const int c = n * 8 + 2 * t4;               // query column within the tile
            const float2 lq = *reinterpret_cast<const float2*>(l_s + c);
            const float2 dq = *reinterpret_cast<const float2*>(d_s + c);
            const float nl0 = -lq.x * LOG2E, nl1 = -lq.y * LOG2E;
            const int qa = qs + c, qb1 = qa + 1;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int key0 = wk_lo + mt * 16 + g, key1 = key0 + 8;   // this thread's two key rows
                float p00, p01;   // key0, query c; key0, query c+1
                recompute_probs2<Bd>(sT[mt][n][0], sT[mt][n][1], scale_log2, nl0, nl1,
                                     !need_mask || (key0 <= qa && qa < T), !need_mask || (key0 <= qb1 && qb1 < T), p00, p01);
                float p10, p11;   // key1, query c; key1, query c+1
                recompute_probs2<Bd>(sT[mt][n][2], sT[mt][n][3], scale_log2, nl0, nl1,
                                     !need_mask || (key1 <= qa && qa < T), !need_mask || (key1 <= qb1 && qb1 < T), p10, p11);
                sT[mt][n][0] = p00; sT[mt][n][1] = p01; sT[mt][n][2] = p10; sT[mt][n][3] = p11;
                dpt[mt][n][0] = p00 * (dpt[mt][n][0] - dq.x);
                dpt[mt][n][1] = p01 * (dpt[mt][n][1] - dq.y);
                dpt[mt][n][2] = p10 * (dpt[mt][n][2] - dq.x);
                dpt[mt][n][3] = p11 * (dpt[mt][n][3] - dq.y);
            }
        }
        // dV += P^T dO and dK += dS^T Q (k = query); B fragments by ldmatrix.trans of dO / Q tiles
#pragma unroll
        for (int kk = 0; kk < QB / 16; kk++) {
            uint32_t pa[MT][4], da[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                c_to_a(pa[mt], sT[mt][2 * kk], sT[mt][2 * kk + 1]);
                c_to_a(da[mt], dpt[mt][2 * kk], dpt[mt][2 * kk + 1]);
            }
#pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t bfr[4];
                ldsm_x4_trans(bfr, do_s + off_a<HS>(kk * 16, dp * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(dv[mt][2 * dp], pa[mt], bfr[0], bfr[1]);
                    mma_16816(dv[mt][2 * dp + 1], pa[mt], bfr[2], bfr[3]);
                }
                ldsm_x4_trans(bfr, q_s + off_a<HS>(kk * 16, dp * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_16816(dk[mt][2 * dp], da[mt], bfr[0], bfr[1]);
                    mma_16816(dk[mt][2 * dp + 1], da[mt], bfr[2], bfr[3]);
                }
            }
        }
    }

    // write dK (times scale) and dV through this warp's own rows of the K / V tiles (only this
    // warp ever reads them, and its last reads are done, in program order)
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        acc_to_tile<HS>(sK + (wr0 + mt * 16) * LDS, dk[mt], scale, scale, lane);
        acc_to_tile<HS>(sV + (wr0 + mt * 16) * LDS, dv[mt], 1.0f, 1.0f, lane);
    }
    __syncwarp();
    bf16* dk_g = dqkv + ((long long)b * T + wk_lo) * stride + C + (long long)h * HS;
    tile_rows_to_global<16 * MT, HS>(dk_g, stride, sK + wr0 * LDS, T - wk_lo, lane);
    tile_rows_to_global<16 * MT, HS>(dk_g + C, stride, sV + wr0 * LDS, T - wk_lo, lane);
}

// ---------------------------------------------------------------------------------------------
// HS = 64 on Hopper's warpgroup MMA (wgmma.mma_async, sm_90a). A warpgroup (4 consecutive warps,
// 128 threads) computes a 64 x 64 x 16 product per instruction; B always comes from shared memory
// through a descriptor and is read once for the 64 rows of the warpgroup (mma.sync re-reads it per
// 16-row warp through ldmatrix, which is what bounds those kernels). A comes from shared memory
// too, or from registers in the mma.sync A-fragment layout (warp w of the warpgroup holds rows
// 16w..16w+15). The accumulator of m64n64 holds, for warp w, rows 16w + g, 16w + g + 8 and in
// registers 4n..4n+3 exactly the C fragment of n-tile n of mma.sync, so the S -> P -> A re-packing
// and the masks are those of the kernels above.
//
// Operand tiles (K, V, and in the dK/dV kernel Q and dO) are 64-column bf16 tiles without padding,
// in the 128-byte swizzle wgmma reads: row r at byte 128*r, its 16-byte chunk c at chunk c ^ (r % 8),
// tile base 1024-byte aligned. The same tile serves as a K-major operand (rows = M or N, columns =
// the reduction: K in S = Q K^T) and as an MN-major one (rows = the reduction: V in O = P V), by
// the descriptor and the instruction's transpose-B bit. Tiles that only feed ldmatrix (Q and dO
// held in registers) keep the padded layout.
//
// STATUS: the default (the Makefile passes FLASH_WGMMA=1; FLASH_WGMMA=0 selects the mma.sync kernels).
// Verified on an H200, 2026-11-22: dev/test/test_attention.cu 57/57 (accuracy against float64 at six
// shapes incl. T = 100, 257, 1000; every element written; bit-identical reruns) and the trainer's
// whole test suite (reference comparison, bit-identical resume). Timed at B=64 NH=12 T=1024:
// forward 0.369 ms (279 TFLOP/s), backward 1.067 ms (242 TFLOP/s counted); on an H100 after the grid
// order (FLASH GRID ORDER, 2026-11-25) 0.376 ms and 1.084 ms (1.523 ms before it). History: a first
// version failed every multi-tile case because, with the Q (dO) fragments loaded once at the first
// tile and kept in registers, ptxas reused those registers for the packed P (dS) operand of the
// second wgmma batch; the fragments are now re-read from shared memory at every tile.
//
// Only device code built for sm_90a (the Makefile's default) has these instructions: for another
// target (GPU_ARCH=sm_80, or plain sm_90) the three kernels compile to a trap, g_wgmma_built is 0,
// and the host side, which reads it once, runs the mma.sync kernels at HS = 64 too.

#ifndef FLASH_ATTENTION_WGMMA
#define FLASH_ATTENTION_WGMMA 0
#endif
#if FLASH_ATTENTION_WGMMA && (!defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define FLASH_WGMMA_DEVICE 1
#else
#define FLASH_WGMMA_DEVICE 0
#endif
__device__ int g_wgmma_built = FLASH_WGMMA_DEVICE;

constexpr int WG_THREADS = 128;

// element offset of chunk c8 (8 columns) of row r in a 128-byte-swizzled 64-column tile
__device__ __forceinline__ int sw_off(int r, int c8) { return r * 64 + ((c8 ^ (r & 7)) << 3); }

// Copy ROWS rows (row0.. of a (T x 64) matrix with row stride `stride`) into a swizzled tile.
template <int ROWS, int NTH>
__device__ __forceinline__ void load_tile_sw(bf16* tile, const bf16* g, int row0, int T, long long stride, int tid) {
    constexpr int TOTAL = ROWS * 8;
    static_assert(TOTAL % NTH == 0, "tile copy must divide evenly");
#pragma unroll
    for (int i = 0; i < TOTAL / NTH; i++) {
        const int c = tid + i * NTH;
        const int r = c >> 3, c8 = c & 7;
        const int t = row0 + r;
        const bool valid = t < T;
        cp_async16(tile + sw_off(r, c8), valid ? g + (long long)t * stride + c8 * 8 : g, valid);
    }
}

// (sw_desc, the descriptor of a swizzled tile: wgmma.cuh)
// K-major: the k-step ks is columns 16ks..16ks+15, 32 bytes into each row
__device__ __forceinline__ uint64_t desc_k(const bf16* tile, int ks) { return sw_desc(tile + ks * 16); }
// MN-major: the k-step ks is rows 16ks..16ks+15 (two 8-row groups, 2048 bytes)
__device__ __forceinline__ uint64_t desc_mn(const bf16* tile, int ks) { return sw_desc(tile + ks * 16 * 64); }

#if FLASH_WGMMA_DEVICE
#define FA_WG_ACC "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define FA_WG_ACC_OPS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// D (64 x 64 fp32) = A (64 x 16, registers) * B (16 x 64, descriptor) + (accumulate ? D : 0).
// TRANS_B = 0: B is K-major (the tile's rows are the N columns of B); 1: MN-major (rows are k).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FA_WG_ACC ", {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
                 : FA_WG_ACC_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
// D (64 x 64 fp32) = A (64 x 16, K-major descriptor) * B (16 x 64, descriptor) + (accumulate ? D : 0)
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FA_WG_ACC ", %32, %33, p, 1, 1, 0, %35;\n}\n"
                 : FA_WG_ACC_OPS(d)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}
#undef FA_WG_ACC
#undef FA_WG_ACC_OPS

// (wgmma_fence, wgmma_commit, wgmma_wait, reg_fence: wgmma.cuh)
// cp.async writes shared memory through the generic proxy, wgmma reads it through the async proxy:
// each thread fences its landed copies before the barrier that publishes them
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
#endif // FLASH_WGMMA_DEVICE

// the 64 x 64 accumulator's n-tiles 2kk, 2kk+1 (columns 16kk..16kk+15) as the A fragment of k-step kk
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&d)[32], int kk) {
    a[0] = pack_bf16(d[8 * kk + 0], d[8 * kk + 1]);
    a[1] = pack_bf16(d[8 * kk + 2], d[8 * kk + 3]);
    a[2] = pack_bf16(d[8 * kk + 4], d[8 * kk + 5]);
    a[3] = pack_bf16(d[8 * kk + 6], d[8 * kk + 7]);
}
// a warp's 16 rows of a 64 x 64 accumulator into a padded tile as bf16 (rows g and g+8 scaled;
// Bd: the forward's output through output_value, valid0 / valid1 as in acc_to_tile)
template <class Bd = IdentityBoundaries>
__device__ __forceinline__ void wg_acc_to_tile(bf16* rows16, const float (&d)[32], float mul0, float mul1, int lane,
                                               bool valid0 = true, bool valid1 = true) {
    const int g = lane >> 2, t = lane & 3;
    constexpr int LDS = Tile<64>::LDS;
#pragma unroll
    for (int n = 0; n < 8; n++) {
        *reinterpret_cast<uint32_t*>(rows16 + g * LDS + n * 8 + 2 * t) =
            pack_bf16(output_value<Bd>(d[4 * n] * mul0, valid0), output_value<Bd>(d[4 * n + 1] * mul0, valid0));
        *reinterpret_cast<uint32_t*>(rows16 + (g + 8) * LDS + n * 8 + 2 * t) =
            pack_bf16(output_value<Bd>(d[4 * n + 2] * mul1, valid1), output_value<Bd>(d[4 * n + 3] * mul1, valid1));
    }
}

// 1024-byte aligned start of the dynamic shared memory (the launch asks for 1 KB of slack)
__device__ __forceinline__ bf16* smem_base_1k() {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t a = smem_addr(smem_raw);
    return reinterpret_cast<bf16*>(smem_raw + (((a + 1023) & ~1023u) - a));
}

// Forward, HS = 64. Grid (ceil(T/128), B*NH), heaviest query blocks first; 2 warpgroups, each
// owning 64 query rows (Q as register A operand), share the K/V tiles of 64 keys (STAGES ring).
// Per tile: S = Q K^T (4 wgmma, K-major K), mask, online softmax, O += P V (4 wgmma, MN-major V).
// PASS and probs as in flash_fwd_kernel.
constexpr int FWG_QR = 128, FWG_KB = 64, FWG_STAGES = 3, FWG_NTH = 2 * WG_THREADS;
constexpr int FWG_TILE = FWG_KB * 64;   // elements of a swizzled K or V tile
constexpr int fwd_wg_smem_bytes() {
    return 1024 + 2 * FWG_STAGES * FWG_TILE * (int)sizeof(bf16) + FWG_QR * Tile<64>::LDS * (int)sizeof(bf16);
}

template <class Bd, int PASS>
__global__ void __launch_bounds__(FWG_NTH, 2)
flash_fwd_wgmma_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv,
                       int T, int NH, float scale_log2, bf16* __restrict__ probs, Fp8Target out8) {
#if FLASH_WGMMA_DEVICE
    constexpr int HS = 64, LDS = Tile<HS>::LDS;
    bf16* sK = smem_base_1k();                       // [STAGES][64 x 64] swizzled
    bf16* sV = sK + FWG_STAGES * FWG_TILE;           // [STAGES][64 x 64] swizzled
    bf16* sQ = sV + FWG_STAGES * FWG_TILE;           // [128][LDS] padded

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int wg = warp >> 2, wq = warp & 3;         // warpgroup, warp within it
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FWG_QR;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;

    const int g_lo = q0 + 64 * wg;                   // this warpgroup's first query row
    const int w_lo = g_lo + 16 * wq;                 // this warp's first query row
    const int r0 = w_lo + g, r1 = r0 + 8;            // this thread's rows
    const int nkb = (min(q0 + FWG_QR, T) + FWG_KB - 1) / FWG_KB;
    Fp8EpilogueInputs fp8_in;                        // (the FP8 epilogue's scale and amax, loaded now)
    fp8_in.load(out8, tid);

    auto load_kv = [&](int j) {
        const int st = j % FWG_STAGES;
        load_tile_sw<FWG_KB, FWG_NTH>(sK + st * FWG_TILE, kg, j * FWG_KB, T, stride, tid);
        if (PASS != FWD_STATS) load_tile_sw<FWG_KB, FWG_NTH>(sV + st * FWG_TILE, vg, j * FWG_KB, T, stride, tid);
    };
    load_tile<FWG_QR, HS, FWG_NTH>(sQ, qg, q0, T, stride, tid);
#pragma unroll
    for (int st = 0; st < FWG_STAGES - 1; st++) {
        if (st < nkb) load_kv(st);
        cp_async_commit();
    }

    uint32_t qf[HS / 16][4];
    float s[32], o[32];
#pragma unroll
    for (int i = 0; i < 32; i++) { s[i] = 0.0f; o[i] = 0.0f; }
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    if constexpr (fixed_row_max<Bd, PASS>()) m0 = m1 = Bd::ATTENTION_SCORE_BOUND * scale_log2;
    float nl0 = 0.0f, nl1 = 0.0f;                    // FWD_OUTPUT: -lse * log2(e) of rows r0, r1
    if constexpr (PASS == FWD_OUTPUT) {
        nl0 = r0 < T ? -lse[(long long)bh * T + r0] * LOG2E : -INFINITY;
        nl1 = r1 < T ? -lse[(long long)bh * T + r1] * LOG2E : -INFINITY;
    }

    TallyOf<Bd> tally;   // telemetry (the counting instantiation): the visible scores or probabilities
    for (int j = 0; j < nkb; j++) {
        cp_async_wait<FWG_STAGES - 2>();
        fence_proxy_async();
        __syncthreads();   // tile j visible to all (and to the async proxy); tile j-1 no longer read
        if (j + FWG_STAGES - 1 < nkb) load_kv(j + FWG_STAGES - 1);
        cp_async_commit();
        if (j * FWG_KB > g_lo + 63 || g_lo >= T) continue;   // warpgroup-uniform: nothing to see here
        const bf16* k_s = sK + (j % FWG_STAGES) * FWG_TILE;
        const bf16* v_s = sV + (j % FWG_STAGES) * FWG_TILE;

        // S = Q K^T. The Q fragments are re-read from shared memory at every tile (4 ldmatrix):
        // held in registers across iterations, ptxas (CUDA 13.0) reuses their registers for the
        // P operand of the PV wgmma, corrupting every tile after the first.
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) ldsm_x4(qf[ks], sQ + off_a<HS>(64 * wg + 16 * wq, ks * 16, lane));
        reg_fence(qf);
        reg_fence(s);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) wgmma_rs<0>(s, qf[ks], desc_k(k_s, ks), ks);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);

        if constexpr (PASS == FWD_ONE_PASS) {
            if (j * FWG_KB + FWG_KB - 1 > w_lo) {   // the tile reaches past this warp's first row
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    const int c = j * FWG_KB + n * 8 + 2 * t4;
                    if (c > r0) s[4 * n] = -INFINITY;
                    if (c + 1 > r0) s[4 * n + 1] = -INFINITY;
                    if (c > r1) s[4 * n + 2] = -INFINITY;
                    if (c + 1 > r1) s[4 * n + 3] = -INFINITY;
                }
            }
        } else {   // active boundaries: as in flash_fwd_kernel
            const bool need_mask = j * FWG_KB + FWG_KB - 1 > w_lo || w_lo + 15 >= T;
            if constexpr (counts_values<Bd>()) {   // telemetry: each visible value counted once, before the loop below
                for_each_visible<1, 8>(r0, j * FWG_KB + 2 * t4, T, need_mask, [&](int, int n, int e, int, int) {
                    if constexpr (PASS == FWD_STATS) count_score<Bd>(tally, s[4 * n + e]);
                    else count_prob<Bd>(tally, s[4 * n + e], scale_log2, e < 2 ? nl0 : nl1);
                });
            }
            // the tiles that need no mask (all but the diagonal ones) take a loop without the
            // visibility tests, whose 32 predicates would otherwise be spilled to registers
            auto through_hooks = [&](auto masked) {
                constexpr bool MASKED = decltype(masked)::value;
#pragma unroll
                for (int h = 0; h < 2; h++) {   // elements 2h, 2h + 1: one row, columns c, c + 1
                    const int row = h == 0 ? r0 : r1;
#pragma unroll
                    for (int n = 0; n < 8; n++) {
                        const int c = j * FWG_KB + n * 8 + 2 * t4;
                        const bool vis0 = !MASKED || (c <= row && row < T), vis1 = !MASKED || (c + 1 <= row && row < T);
                        float& x0 = s[4 * n + 2 * h];
                        float& x1 = s[4 * n + 2 * h + 1];
                        if constexpr (PASS == FWD_STATS) read_scores2<Bd>(x0, x1, vis0, vis1);
                        else recompute_probs2<Bd>(x0, x1, scale_log2, h == 0 ? nl0 : nl1, h == 0 ? nl0 : nl1, vis0, vis1, x0, x1);
                    }
                }
            };
            if (need_mask) through_hooks(std::true_type());
            else through_hooks(std::false_type());
            if (PASS == FWD_OUTPUT && probs != nullptr) {   // tests: every visible stored probability
                for_each_visible<1, 8>(r0, j * FWG_KB + 2 * t4, T, need_mask, [&](int, int n, int e, int row, int c) {
                    probs[((long long)bh * T + row) * T + c] = __float2bfloat16_rn(s[4 * n + e]);
                });
            }
        }
        if constexpr (fixed_row_max<Bd, PASS>()) {   // the bound as the maximum of every row
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int n = 0; n < 8; n++) {
                sum0 += fast_exp2(fmaf(s[4 * n], scale_log2, -m0)) + fast_exp2(fmaf(s[4 * n + 1], scale_log2, -m0));
                sum1 += fast_exp2(fmaf(s[4 * n + 2], scale_log2, -m1)) + fast_exp2(fmaf(s[4 * n + 3], scale_log2, -m1));
            }
            l0 += sum0;
            l1 += sum1;
        } else if constexpr (PASS != FWD_OUTPUT) {   // online softmax (rows past T: as in flash_fwd_kernel)
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int n = 0; n < 8; n++) {
                mx0 = fmaxf(mx0, fmaxf(s[4 * n], s[4 * n + 1]));
                mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
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
            for (int n = 0; n < 8; n++) {
                s[4 * n] = fast_exp2(fmaf(s[4 * n], scale_log2, -mn0));
                s[4 * n + 1] = fast_exp2(fmaf(s[4 * n + 1], scale_log2, -mn0));
                s[4 * n + 2] = fast_exp2(fmaf(s[4 * n + 2], scale_log2, -mn1));
                s[4 * n + 3] = fast_exp2(fmaf(s[4 * n + 3], scale_log2, -mn1));
                sum0 += s[4 * n] + s[4 * n + 1];
                sum1 += s[4 * n + 2] + s[4 * n + 3];
            }
            l0 = l0 * alpha0 + sum0;
            l1 = l1 * alpha1 + sum1;
            if constexpr (PASS == FWD_ONE_PASS) {
#pragma unroll
                for (int n = 0; n < 8; n++) {
                    o[4 * n] *= alpha0; o[4 * n + 1] *= alpha0;
                    o[4 * n + 2] *= alpha1; o[4 * n + 3] *= alpha1;
                }
            }
        }
        if constexpr (PASS != FWD_STATS) {   // O += P V (FWD_STATS reads no V)
            uint32_t pa[4][4];
#pragma unroll
            for (int kk = 0; kk < 4; kk++) acc_to_a(pa[kk], s, kk);
            reg_fence(pa);
            reg_fence(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wgmma_rs<1>(o, pa[kk], desc_mn(v_s, kk), 1);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(o);
        }
    }

    tally.commit();
    bf16* rows16 = sQ + (64 * wg + 16 * wq) * LDS;   // this warp's own Q rows (read only by this warp)
    if constexpr (PASS == FWD_OUTPUT) {
        wg_acc_to_tile<Bd>(rows16, o, 1.0f, 1.0f, lane, r0 < T, r1 < T);
    } else {
        l0 += __shfl_xor_sync(0xffffffff, l0, 1);
        l0 += __shfl_xor_sync(0xffffffff, l0, 2);
        l1 += __shfl_xor_sync(0xffffffff, l1, 1);
        l1 += __shfl_xor_sync(0xffffffff, l1, 2);
        if constexpr (PASS == FWD_ONE_PASS) wg_acc_to_tile(rows16, o, 1.0f / l0, 1.0f / l1, lane);
        if (t4 == 0) {
            float* lse_bh = lse + (long long)bh * T;
            if (r0 < T) lse_bh[r0] = (m0 + log2f(l0)) * LN2;
            if (r1 < T) lse_bh[r1] = (m1 + log2f(l1)) * LN2;
        }
        if constexpr (PASS == FWD_STATS) return;
    }
    __syncwarp();
    tile_rows_to_global<16, HS>(out + ((long long)b * T + w_lo) * C + (long long)h * HS, C, rows16, T - w_lo, lane);
    if (out8.rows != nullptr) {
        // the FP8 recipe's input of the attention projection: E4M3 codes of the output in both layouts, from
        // the CTA's 128 staged rows (written by every warp: hence the barrier)
        cp_async_wait<0>();
        __syncthreads();
        const bf16* tiles[1] = {sQ};
        const int col0[1] = {h * HS};
        tiles_to_fp8<Fp8Kind::E4M3, 1, FWG_QR>(out8, fp8_in, tiles, col0, (long long)b * T + q0,
                                               min(FWG_QR, T - q0), (long long)(gridDim.y / NH) * T, C, tid);
    }
#else
    __trap();
#endif
}

// Backward step 1 (dQ and D), HS = 64. Grid (ceil(T/64), B*NH), heaviest first; one warpgroup owns
// 64 query rows (Q, dO as register A operands) and steps over key tiles of 64 (STAGES ring):
// S = Q K^T and dP = dO V^T (8 wgmma, K-major K and V), dS, dQ += dS K (4 wgmma, MN-major K).
constexpr int DQWG_KB = 64, DQWG_STAGES = 3;
constexpr int DQWG_TILE = DQWG_KB * 64;
constexpr int dq_wg_smem_bytes() {
    return 1024 + 2 * DQWG_STAGES * DQWG_TILE * (int)sizeof(bf16) + 2 * 64 * Tile<64>::LDS * (int)sizeof(bf16);
}

template <class Bd>
__global__ void __launch_bounds__(WG_THREADS, 3)
flash_bwd_dq_wgmma_kernel(bf16* __restrict__ dqkv, float* __restrict__ Dvec, float* __restrict__ bias_part,
                          const bf16* __restrict__ dout, const bf16* __restrict__ qkv, const bf16* __restrict__ o_in,
                          const float* __restrict__ lse, int T, int NH, float scale_log2, float scale, Fp8Target dqkv8,
                          long long n_rows) {
#if FLASH_WGMMA_DEVICE
    constexpr int HS = 64, LDS = Tile<HS>::LDS;
    bf16* sK = smem_base_1k();                       // [STAGES][64 x 64] swizzled
    bf16* sV = sK + DQWG_STAGES * DQWG_TILE;         // [STAGES][64 x 64] swizzled
    bf16* sQ = sV + DQWG_STAGES * DQWG_TILE;         // [64][LDS] padded
    bf16* sdO = sQ + 64 * LDS;                       // [64][LDS] padded

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * 64;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;
    const bf16* dog = dout + (long long)b * T * C + (long long)h * HS;
    const bf16* og = o_in + (long long)b * T * C + (long long)h * HS;
    const int w_lo = q0 + 16 * warp;
    const int r0 = w_lo + g, r1 = r0 + 8;
    const int nkb = (min(q0 + 64, T) + DQWG_KB - 1) / DQWG_KB;
    Fp8EpilogueInputs fp8_in;                        // (the FP8 epilogue's scale and amax, loaded now)
    fp8_in.load(dqkv8, tid);

    auto load_kv = [&](int j) {
        const int st = j % DQWG_STAGES;
        load_tile_sw<DQWG_KB, WG_THREADS>(sK + st * DQWG_TILE, kg, j * DQWG_KB, T, stride, tid);
        load_tile_sw<DQWG_KB, WG_THREADS>(sV + st * DQWG_TILE, vg, j * DQWG_KB, T, stride, tid);
    };
    load_tile<64, HS, WG_THREADS>(sQ, qg, q0, T, stride, tid);
    load_tile<64, HS, WG_THREADS>(sdO, dog, q0, T, C, tid);
#pragma unroll
    for (int st = 0; st < DQWG_STAGES - 1; st++) {
        if (st < nkb) load_kv(st);
        cp_async_commit();
    }

    const float* lse_bh = lse + (long long)bh * T;
    const float nl0 = r0 < T ? -lse_bh[r0] * LOG2E : -INFINITY;
    const float nl1 = r1 < T ? -lse_bh[r1] * LOG2E : -INFINITY;
    const float D0 = quad_row_dot<HS>(og + (long long)r0 * C, dog + (long long)r0 * C, r0 < T, t4);
    const float D1 = quad_row_dot<HS>(og + (long long)r1 * C, dog + (long long)r1 * C, r1 < T, t4);
    if (t4 == 0) {
        if (r0 < T) Dvec[(long long)bh * T + r0] = D0;
        if (r1 < T) Dvec[(long long)bh * T + r1] = D1;
    }

    uint32_t qf[HS / 16][4], dof[HS / 16][4];
    float s[32], dp[32], dq[32];
#pragma unroll
    for (int i = 0; i < 32; i++) { s[i] = 0.0f; dp[i] = 0.0f; dq[i] = 0.0f; }

    for (int j = 0; j < nkb; j++) {
        cp_async_wait<DQWG_STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        if (j + DQWG_STAGES - 1 < nkb) load_kv(j + DQWG_STAGES - 1);
        cp_async_commit();
        const bf16* k_s = sK + (j % DQWG_STAGES) * DQWG_TILE;
        const bf16* v_s = sV + (j % DQWG_STAGES) * DQWG_TILE;

        // S = Q K^T, dP = dO V^T; Q and dO fragments re-read at every tile (see the forward)
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            ldsm_x4(qf[ks], sQ + off_a<HS>(16 * warp, ks * 16, lane));
            ldsm_x4(dof[ks], sdO + off_a<HS>(16 * warp, ks * 16, lane));
        }
        reg_fence(qf);
        reg_fence(dof);
        reg_fence(s);
        reg_fence(dp);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) wgmma_rs<0>(s, qf[ks], desc_k(k_s, ks), ks);
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) wgmma_rs<0>(dp, dof[ks], desc_k(v_s, ks), ks);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        reg_fence(dp);

        // dS = P * (dP - D) in place of dP; the causal mask where the tile reaches past the warp's
        // first row (and, under active boundaries, where the warp has rows past T: flash_bwd_dq_kernel)
        // The tiles that need no mask (all but the diagonal ones) take a copy of the loop without the
        // visibility tests (as the forward's through_hooks).
        const bool need_mask = j * DQWG_KB + DQWG_KB - 1 > w_lo || (Bd::ACTIVE && w_lo + 15 >= T);
        const bool v0 = !Bd::ACTIVE || r0 < T, v1 = !Bd::ACTIVE || r1 < T;
        auto ds_in_place = [&](auto masked) {
            constexpr bool MASKED = decltype(masked)::value;
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const int c = j * DQWG_KB + n * 8 + 2 * t4;
                float p00, p01;
                recompute_probs2<Bd>(s[4 * n], s[4 * n + 1], scale_log2, nl0, nl0,
                                     !MASKED || (c <= r0 && v0), !MASKED || (c + 1 <= r0 && v0), p00, p01);
                float p10, p11;
                recompute_probs2<Bd>(s[4 * n + 2], s[4 * n + 3], scale_log2, nl1, nl1,
                                     !MASKED || (c <= r1 && v1), !MASKED || (c + 1 <= r1 && v1), p10, p11);
                dp[4 * n] = p00 * (dp[4 * n] - D0);
                dp[4 * n + 1] = p01 * (dp[4 * n + 1] - D0);
                dp[4 * n + 2] = p10 * (dp[4 * n + 2] - D1);
                dp[4 * n + 3] = p11 * (dp[4 * n + 3] - D1);
            }
        };
        if (need_mask) ds_in_place(std::true_type());
        else ds_in_place(std::false_type());
        // dQ += dS K
        uint32_t da[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) acc_to_a(da[kk], dp, kk);
        reg_fence(da);
        reg_fence(dq);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_rs<1>(dq, da[kk], desc_mn(k_s, kk), 1);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dq);
    }

    bf16* rows16 = sQ + 16 * warp * LDS;
    wg_acc_to_tile(rows16, dq, scale, scale, lane);
    __syncwarp();
    if (!dqkv8.active())   // (with the FP8 copy, dqkv itself is not stored: nobody reads it)
        tile_rows_to_global<16, HS>(dqkv + ((long long)b * T + w_lo) * stride + (long long)h * HS, stride, rows16,
                                    T - w_lo, lane);
    if (bias_part != nullptr || dqkv8.active() || dqkv8.amax_only()) __syncthreads();
    if (bias_part != nullptr)   // this block's column sums of dq (the q part of the qkv bias gradient)
        tile_column_sums64(bias_part + ((long long)b * gridDim.x + q0 / 64) * 3 * C + (long long)h * HS, sQ, T - q0, tid);
    const bf16* const tiles[1] = {sQ};
    if (dqkv8.active()) {
        const int col0[1] = {h * HS};
        tiles_to_fp8<Fp8Kind::E5M2, 1>(dqkv8, fp8_in, tiles, col0, (long long)b * T + q0, T - q0, n_rows, 3 * C, tid);
    } else if (dqkv8.amax_only()) {
        tiles_amax<1>(dqkv8, fp8_in, tiles, T - q0, tid);
    }
#else
    __trap();
#endif
}

// Backward step 2 (dK, dV), HS = 64. Grid (ceil(T/64), B*NH), key block 0 first; one warpgroup owns
// 64 keys (K, V tiles as wgmma A operands from shared memory) and steps over query tiles of 64
// (Q, dO, lse, D; STAGES ring): S^T = K Q^T and dP^T = V dO^T (8 wgmma, K-major Q and dO), P^T and
// dS^T, dV += P^T dO and dK += dS^T Q (8 wgmma, MN-major dO and Q).
constexpr int DKVWG_QB = 64, DKVWG_STAGES = 3;
constexpr int DKVWG_TILE = DKVWG_QB * 64;
constexpr int dkv_wg_smem_bytes() {
    return 1024 + (2 * 64 * 64 + 2 * DKVWG_STAGES * DKVWG_TILE) * (int)sizeof(bf16) +
           2 * DKVWG_STAGES * DKVWG_QB * (int)sizeof(float);
}

template <class Bd>
__global__ void __launch_bounds__(WG_THREADS, 3)
flash_bwd_dkv_wgmma_kernel(bf16* __restrict__ dqkv, float* __restrict__ bias_part, const bf16* __restrict__ dout,
                           const bf16* __restrict__ qkv, const float* __restrict__ lse, const float* __restrict__ Dvec,
                           int T, int NH, float scale_log2, float scale, Fp8Target dqkv8, long long n_rows) {
#if FLASH_WGMMA_DEVICE
    constexpr int HS = 64, LDS = Tile<HS>::LDS, QB = DKVWG_QB;
    bf16* sK = smem_base_1k();                       // [64 x 64] swizzled
    bf16* sV = sK + 64 * 64;                         // [64 x 64] swizzled
    bf16* sQ = sV + 64 * 64;                         // [STAGES][QB x 64] swizzled
    bf16* sdO = sQ + DKVWG_STAGES * DKVWG_TILE;      // [STAGES][QB x 64] swizzled
    float* sL = reinterpret_cast<float*>(sdO + DKVWG_STAGES * DKVWG_TILE);   // [STAGES][QB]
    float* sD = sL + DKVWG_STAGES * QB;                                        // [STAGES][QB]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.x * 64;
    const int C = NH * HS;
    const long long stride = 3LL * C;
    const bf16* qg = qkv + (long long)b * T * stride + (long long)h * HS;
    const bf16* kg = qg + C;
    const bf16* vg = qg + 2 * C;
    const bf16* dog = dout + (long long)b * T * C + (long long)h * HS;
    const float* lse_bh = lse + (long long)bh * T;
    const float* D_bh = Dvec + (long long)bh * T;
    const int key0 = k0 + 16 * warp + g, key1 = key0 + 8;   // this thread's key rows
    const int w_hi = k0 + 16 * warp + 15;                   // this warp's last key
    const int i0 = k0 / QB;
    const int nq = (T + QB - 1) / QB - i0;
    Fp8EpilogueInputs fp8_in;                               // (the FP8 epilogue's scale and amax, loaded now)
    fp8_in.load(dqkv8, tid);

    auto load_q_block = [&](int it) {
        const int qs = (i0 + it) * QB, st = it % DKVWG_STAGES;
        load_tile_sw<QB, WG_THREADS>(sQ + st * DKVWG_TILE, qg, qs, T, stride, tid);
        load_tile_sw<QB, WG_THREADS>(sdO + st * DKVWG_TILE, dog, qs, T, C, tid);
        if (tid < QB) {
            const bool valid = qs + tid < T;
            cp_async4(sL + st * QB + tid, valid ? lse_bh + qs + tid : lse_bh, valid);
        } else {
            const int r = tid - QB;
            const bool valid = qs + r < T;
            cp_async4(sD + st * QB + r, valid ? D_bh + qs + r : D_bh, valid);
        }
    };
    static_assert(2 * QB == WG_THREADS, "one thread per lse/D element");
    load_tile_sw<64, WG_THREADS>(sK, kg, k0, T, stride, tid);
    load_tile_sw<64, WG_THREADS>(sV, vg, k0, T, stride, tid);
#pragma unroll
    for (int st = 0; st < DKVWG_STAGES - 1; st++) {
        if (st < nq) load_q_block(st);
        cp_async_commit();
    }

    float st_[32], dpt[32], dk[32], dv[32];
#pragma unroll
    for (int i = 0; i < 32; i++) { st_[i] = 0.0f; dpt[i] = 0.0f; dk[i] = 0.0f; dv[i] = 0.0f; }

    for (int it = 0; it < nq; it++) {
        cp_async_wait<DKVWG_STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        if (it + DKVWG_STAGES - 1 < nq) load_q_block(it + DKVWG_STAGES - 1);
        cp_async_commit();
        const int qs = (i0 + it) * QB, stg = it % DKVWG_STAGES;
        const bf16* q_s = sQ + stg * DKVWG_TILE;
        const bf16* do_s = sdO + stg * DKVWG_TILE;
        const float* l_s = sL + stg * QB;
        const float* d_s = sD + stg * QB;

        // S^T = K Q^T, dP^T = V dO^T (64 keys x 64 queries)
        reg_fence(st_);
        reg_fence(dpt);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) wgmma_ss<0>(st_, desc_k(sK, ks), desc_k(q_s, ks), ks);
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) wgmma_ss<0>(dpt, desc_k(sV, ks), desc_k(do_s, ks), ks);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(st_);
        reg_fence(dpt);

        // P^T and dS^T; masked: key > query, and queries past T (their lse / D were zero-filled).
        // P^T goes to the tensor cores as BF16 pairs (pp[2n] the row key0, pp[2n + 1] the row key1,
        // columns c, c + 1: the A fragment layout of acc_to_a). Tiles that need no mask take a copy
        // of the loop without the visibility tests.
        const bool need_mask = (qs < w_hi) || (qs + QB > T);
        uint32_t pp[16];
        auto ds_in_place = [&](auto masked) {
            constexpr bool MASKED = decltype(masked)::value;
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const int c = n * 8 + 2 * t4;
                const float2 lq = *reinterpret_cast<const float2*>(l_s + c);
                const float2 dq = *reinterpret_cast<const float2*>(d_s + c);
                const float nl0 = -lq.x * LOG2E, nl1 = -lq.y * LOG2E;
                const int qa = qs + c, qb1 = qa + 1;
                float p00, p01;   // key0, query c; key0, query c+1
                recompute_probs2<Bd>(st_[4 * n], st_[4 * n + 1], scale_log2, nl0, nl1,
                                     !MASKED || (key0 <= qa && qa < T), !MASKED || (key0 <= qb1 && qb1 < T), p00, p01);
                float p10, p11;   // key1, query c; key1, query c+1
                recompute_probs2<Bd>(st_[4 * n + 2], st_[4 * n + 3], scale_log2, nl0, nl1,
                                     !MASKED || (key1 <= qa && qa < T), !MASKED || (key1 <= qb1 && qb1 < T), p10, p11);
                pp[2 * n] = pack_bf16(p00, p01);
                pp[2 * n + 1] = pack_bf16(p10, p11);
                dpt[4 * n] = p00 * (dpt[4 * n] - dq.x);
                dpt[4 * n + 1] = p01 * (dpt[4 * n + 1] - dq.y);
                dpt[4 * n + 2] = p10 * (dpt[4 * n + 2] - dq.x);
                dpt[4 * n + 3] = p11 * (dpt[4 * n + 3] - dq.y);
            }
        };
        if (need_mask) ds_in_place(std::true_type());
        else ds_in_place(std::false_type());
        // dV += P^T dO, dK += dS^T Q (k = query)
        uint32_t pa[4][4], da[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
            for (int i = 0; i < 4; i++) pa[kk][i] = pp[4 * kk + i];
            acc_to_a(da[kk], dpt, kk);
        }
        reg_fence(pa);
        reg_fence(da);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_rs<1>(dv, pa[kk], desc_mn(do_s, kk), 1);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_rs<1>(dk, da[kk], desc_mn(q_s, kk), 1);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dv);
        reg_fence(dk);
    }

    // stage dK (times scale) and dV through the Q ring (no longer read by anyone after the barrier)
    cp_async_wait<0>();
    __syncthreads();
    bf16* kst = sQ;                                  // [64][LDS] padded
    bf16* vst = sQ + 64 * LDS;                       // [64][LDS] padded (fits: the ring has 3 x 64 x 64)
    wg_acc_to_tile(kst + 16 * warp * LDS, dk, scale, scale, lane);
    wg_acc_to_tile(vst + 16 * warp * LDS, dv, 1.0f, 1.0f, lane);
    __syncwarp();
    const int w_lo = k0 + 16 * warp;
    bf16* dk_g = dqkv + ((long long)b * T + w_lo) * stride + C + (long long)h * HS;
    if (!dqkv8.active()) {   // (with the FP8 copy, dqkv itself is not stored: nobody reads it)
        tile_rows_to_global<16, HS>(dk_g, stride, kst + 16 * warp * LDS, T - w_lo, lane);
        tile_rows_to_global<16, HS>(dk_g + C, stride, vst + 16 * warp * LDS, T - w_lo, lane);
    }
    if (bias_part != nullptr || dqkv8.active() || dqkv8.amax_only()) __syncthreads();
    if (bias_part != nullptr) {   // this block's column sums of dk and dv (the k and v parts of the qkv bias gradient)
        float* part = bias_part + ((long long)b * gridDim.x + blockIdx.x) * 3 * C + C + (long long)h * HS;
        tile_column_sums64(part, kst, T - k0, tid);
        tile_column_sums64(part + C, vst, T - k0, tid);
    }
    const bf16* const tiles[2] = {kst, vst};
    if (dqkv8.active()) {
        const int col0[2] = {C + h * HS, 2 * C + h * HS};
        tiles_to_fp8<Fp8Kind::E5M2, 2>(dqkv8, fp8_in, tiles, col0, (long long)b * T + k0, T - k0, n_rows, 3 * C, tid);
    } else if (dqkv8.amax_only()) {
        tiles_amax<2>(dqkv8, fp8_in, tiles, T - k0, tid);
    }
#else
    __trap();
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side

template <int HS> constexpr int fwd_rows() { typedef typename Config<HS>::Fwd F; return 16 * F::MT * F::NW; }
template <int HS> constexpr int fwd_smem_bytes() {
    typedef typename Config<HS>::Fwd F;
    return (fwd_rows<HS>() + 2 * F::STAGES * F::KB) * Tile<HS>::LDS * (int)sizeof(bf16);
}
template <int HS> constexpr int dq_rows() { typedef typename Config<HS>::Dq F; return 16 * F::MT * F::NW; }
template <int HS> constexpr int dq_smem_bytes() {
    typedef typename Config<HS>::Dq F;
    return (2 * dq_rows<HS>() + 2 * F::STAGES * F::KB) * Tile<HS>::LDS * (int)sizeof(bf16);
}
template <int HS> constexpr int dkv_rows() { typedef typename Config<HS>::Dkv F; return 16 * F::MT * F::NW; }
template <int HS> constexpr int dkv_smem_bytes() {
    typedef typename Config<HS>::Dkv F;
    return (2 * dkv_rows<HS>() + 2 * F::STAGES * F::QB) * Tile<HS>::LDS * (int)sizeof(bf16) +
           2 * F::STAGES * F::QB * (int)sizeof(float);
}

// the grid's y dimension holds B*NH (FLASH GRID ORDER)
inline void check_heads(int B, int NH, const char* what) {
    if ((long long)B * NH > 65535) {
        fprintf(stderr, "error: %s: batch size x heads = %lld exceeds the 65535 (batch, head) pairs one launch "
                        "takes; use a smaller micro-batch (-b)\n", what, (long long)B * NH);
        exit(1);
    }
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

// whether the loaded device code has the wgmma kernels (read once from the device)
inline bool wgmma_built() {
    static int built = -1;
    if (built < 0) cudaCheck(cudaMemcpyFromSymbol(&built, g_wgmma_built, sizeof(int)));
    return built == 1;
}
// whether the wgmma kernels run at head size HS (HS = 64, built in, and in the loaded device code)
inline bool wgmma_kernels_run(int HS) { return HS == 64 && FLASH_ATTENTION_WGMMA && wgmma_built(); }

// one forward pass (PASS) of the kernels
template <class Bd, int PASS, int HS>
void forward_pass_launch(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, bf16* probs,
                         cudaStream_t stream, Fp8Target out8 = Fp8Target()) {
    const float scale_log2 = LOG2E / sqrtf((float)HS);
    if (wgmma_kernels_run(HS)) {
        constexpr int smem = fwd_wg_smem_bytes();
        constexpr auto kernel = flash_fwd_wgmma_kernel<Bd, PASS>;
        allow_dynamic_smem<kernel>(smem);
        dim3 grid(ceil_div(T, FWG_QR), B * NH);
        kernel<<<grid, FWG_NTH, smem, stream>>>(out, lse, qkv, T, NH, scale_log2, probs, out8);
        cudaCheckLaunch();
        return;
    }
    typedef typename Config<HS>::Fwd F;
    constexpr int smem = fwd_smem_bytes<HS>();
    constexpr auto kernel = flash_fwd_kernel<Bd, PASS, HS, F::MT, F::NW, F::STAGES, F::MINB>;
    allow_dynamic_smem<kernel>(smem);
    dim3 grid(ceil_div(T, fwd_rows<HS>()), B * NH);
    kernel<<<grid, F::NW * WARP_SIZE, smem, stream>>>(out, lse, qkv, T, NH, scale_log2, probs);
    cudaCheckLaunch();
}

// plain: one pass; active boundaries: the statistics pass, then the output pass (top of the file)
template <class Bd, int HS>
void forward_launch(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, bf16* probs, cudaStream_t stream,
                    Fp8Target out8 = Fp8Target()) {
    if constexpr (counts_values<Bd>()) {   // the counting kernels only in a telemetry step (top of the file)
        if (!Bd::observing()) {
            forward_launch<typename Bd::Values, HS>(out, lse, qkv, B, T, NH, probs, stream, out8);
            return;
        }
    }
    if constexpr (Bd::ACTIVE) {
        forward_pass_launch<Bd, FWD_STATS, HS>(out, lse, qkv, B, T, NH, nullptr, stream);
        forward_pass_launch<Bd, FWD_OUTPUT, HS>(out, lse, qkv, B, T, NH, probs, stream, out8);
    } else {
        forward_pass_launch<Bd, FWD_ONE_PASS, HS>(out, lse, qkv, B, T, NH, nullptr, stream, out8);
    }
}

// backward step 1: dQ, and D = rowsum(dout * out) into Dvec (B, NH, T)
template <class Bd, int HS>
void backward_dq_launch(floatX* dqkv, float* Dvec, const floatX* dout, const floatX* qkv, const floatX* out,
                        const float* lse, int B, int T, int NH, cudaStream_t stream, float* bias_part = nullptr,
                        Fp8Target dqkv8 = Fp8Target()) {
    const float scale = 1.0f / sqrtf((float)HS);
    if (wgmma_kernels_run(HS)) {
        constexpr int smem = dq_wg_smem_bytes();
        constexpr auto kernel = flash_bwd_dq_wgmma_kernel<Bd>;
        allow_dynamic_smem<kernel>(smem);
        dim3 grid(ceil_div(T, 64), B * NH);
        kernel<<<grid, WG_THREADS, smem, stream>>>(dqkv, Dvec, bias_part, dout, qkv, out, lse, T, NH, LOG2E * scale, scale,
                                                   dqkv8, (long long)B * T);
        cudaCheckLaunch();
        return;
    }
    typedef typename Config<HS>::Dq F;
    constexpr int smem = dq_smem_bytes<HS>();
    constexpr auto kernel = flash_bwd_dq_kernel<Bd, HS, F::KB, F::MT, F::NW, F::STAGES, F::MINB, F::A_IN_REGS>;
    allow_dynamic_smem<kernel>(smem);
    dim3 grid(ceil_div(T, dq_rows<HS>()), B * NH);
    kernel<<<grid, F::NW * WARP_SIZE, smem, stream>>>(dqkv, Dvec, dout, qkv, out, lse, T, NH, LOG2E * scale, scale);
    cudaCheckLaunch();
}

// backward step 2: dK and dV; reads the Dvec written by step 1
template <class Bd, int HS>
void backward_dkv_launch(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse, const float* Dvec,
                         int B, int T, int NH, cudaStream_t stream, float* bias_part = nullptr,
                         Fp8Target dqkv8 = Fp8Target()) {
    const float scale = 1.0f / sqrtf((float)HS);
    if (wgmma_kernels_run(HS)) {
        constexpr int smem = dkv_wg_smem_bytes();
        constexpr auto kernel = flash_bwd_dkv_wgmma_kernel<Bd>;
        allow_dynamic_smem<kernel>(smem);
        dim3 grid(ceil_div(T, 64), B * NH);
        kernel<<<grid, WG_THREADS, smem, stream>>>(dqkv, bias_part, dout, qkv, lse, Dvec, T, NH, LOG2E * scale, scale,
                                                   dqkv8, (long long)B * T);
        cudaCheckLaunch();
        return;
    }
    typedef typename Config<HS>::Dkv F;
    constexpr int smem = dkv_smem_bytes<HS>();
    constexpr auto kernel = flash_bwd_dkv_kernel<Bd, HS, F::QB, F::MT, F::NW, F::STAGES, F::MINB>;
    allow_dynamic_smem<kernel>(smem);
    dim3 grid(ceil_div(T, dkv_rows<HS>()), B * NH);
    kernel<<<grid, F::NW * WARP_SIZE, smem, stream>>>(dqkv, dout, qkv, lse, Dvec, T, NH, LOG2E * scale, scale);
    cudaCheckLaunch();
}

// whether the backward runs the wgmma kernels, which can also give the qkv bias gradient's partial sums
inline bool backward_has_bias_partials(int HS) { return wgmma_kernels_run(HS); }

template <class Bd, int HS>
void backward_launch(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                     float* Dvec, int B, int T, int NH, cudaStream_t stream, float* bias_part, Fp8Target dqkv8) {
    backward_dq_launch<Bd, HS>(dqkv, Dvec, dout, qkv, out, lse, B, T, NH, stream, bias_part, dqkv8);
    backward_dkv_launch<Bd, HS>(dqkv, dout, qkv, lse, Dvec, B, T, NH, stream, bias_part, dqkv8);
}

} // namespace flash_detail

// ---------------------------------------------------------------------------------------------
// API

// whether flash_attention_forward can write FP8 codes of its output (an Fp8Target): the wgmma kernel
inline bool flash_attention_forward_gives_fp8(int HS) { return flash_detail::wgmma_kernels_run(HS); }

// out: (B,T,C); lse: (B,NH,T) FP32 log-sum-exp of each query row's scaled scores (kept for backward).
// Bd: the recipe's boundary policy (boundaries.h); with active boundaries, probs (tests only, may be
// null) receives every visible stored probability at [b, h, query, key] of a (B,NH,T,T) tensor
// (positions above the diagonal are not written).
// out8 (FP8 recipe; only where flash_attention_forward_gives_fp8(HS)): the E4M3 codes of out as well (out is
// still written: the backward reads it), row-major into out8.rows ((B*T) x C) and, when out8.cols is given,
// transposed into out8.cols (C x (B*T)), with out's amax into *out8.amax (when given) and the telemetry
// counts (when asked), by tiles_to_fp8: the attention projection's input, which the recipe then need not
// quantize. The codes are those fp8_quantize_transpose makes of out, bit for bit (build/test_attention).
template <class Bd = IdentityBoundaries>
inline void flash_attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int HS,
                                    cudaStream_t stream, floatX* probs = nullptr, Fp8Target out8 = Fp8Target()) {
    flash_detail::check_args(out, qkv, qkv, T, HS, "flash_attention_forward");
    flash_detail::check_heads(B, NH, "flash_attention_forward");
    if (probs != nullptr && !Bd::ACTIVE) {
        fprintf(stderr, "error: flash_attention_forward: probs is only written under active boundaries\n");
        exit(1);
    }
    if (out8.amax_only()) {
        fprintf(stderr, "error: flash_attention_forward: an amax-only FP8 target is not supported (give rows)\n");
        exit(1);
    }
    if (out8.active() && (!flash_attention_forward_gives_fp8(HS) || (NH * HS) % 16 != 0 || (uintptr_t)out8.rows % 16 != 0 ||
                          (uintptr_t)out8.cols % 16 != 0)) {
        fprintf(stderr, "error: flash_attention_forward: no FP8 output at head size %d on this build / GPU, "
                        "or its buffers are not 16-byte aligned\n", HS);
        exit(1);
    }
    if (HS == 64) flash_detail::forward_launch<Bd, 64>(out, lse, qkv, B, T, NH, probs, stream, out8);
    else flash_detail::forward_launch<Bd, 128>(out, lse, qkv, B, T, NH, probs, stream, Fp8Target());
}

// bytes of device scratch flash_attention_backward needs: D = rowsum(dout * out), (B,NH,T) FP32
inline size_t flash_attention_backward_scratch_bytes(int B, int T, int NH, int HS) {
    (void)HS;
    return ((size_t)B * NH * T * sizeof(float) + 255) / 256 * 256;
}

// rows of the qkv bias gradient's partial sums that flash_attention_backward can write (each 3C floats)
inline int flash_attention_bias_partial_rows(int B, int T) { return B * ceil_div(T, 64); }

// dqkv: (B,T,3C) written in full (dq | dk | dv in the layout of qkv); dout: (B,T,C); out, lse from
// the forward pass (of the same Bd); scratch: flash_attention_backward_scratch_bytes(B,T,NH,HS) bytes.
// qkv_bias_partials (may be null): flash_attention_bias_partial_rows(B,T) rows of 3C floats; row
// b*ceil(T/64) + j gets the column sums of dqkv over rows 64j..64j+63 of sequence b (of the BF16
// values written), so that the sum of the rows is the gradient of the qkv bias. Returns whether it
// wrote them (the wgmma kernels, HS = 64 on sm_90a, do; otherwise the caller sums dqkv itself).
// dqkv8 (FP8 recipe; only where flash_attention_backward_gives_fp8(HS)): the E5M2 codes of dqkv in
// both layouts, its amax and counts (Fp8Target, tiles_to_fp8), written from the staged tiles in place
// of dqkv itself, which is then left unwritten. With its amax alone (Fp8Target::amax_only, TCFP-12):
// dqkv written as usual and its amax recorded (tiles_amax).
inline bool flash_attention_backward_gives_fp8(int HS) { return flash_detail::backward_has_bias_partials(HS); }

template <class Bd = IdentityBoundaries>
inline bool flash_attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                     const float* lse, void* scratch, int B, int T, int NH, int HS,
                                     cudaStream_t stream, float* qkv_bias_partials = nullptr,
                                     Fp8Target dqkv8 = Fp8Target()) {
    flash_detail::check_args(dqkv, dout, qkv, T, HS, "flash_attention_backward");
    flash_detail::check_args(out, out, out, T, HS, "flash_attention_backward");
    flash_detail::check_heads(B, NH, "flash_attention_backward");
    if (dqkv8.amax_only() && !flash_attention_backward_gives_fp8(HS)) {
        fprintf(stderr, "error: flash_attention_backward: no amax output at head size %d on this build / GPU\n", HS);
        exit(1);
    }
    if (dqkv8.active() && (!flash_attention_backward_gives_fp8(HS) || (NH * HS) % 16 != 0 ||
                           (uintptr_t)dqkv8.rows % 16 != 0 || (uintptr_t)dqkv8.cols % 16 != 0)) {
        fprintf(stderr, "error: flash_attention_backward: no FP8 output at head size %d on this build / GPU, "
                        "or its buffers are not 16-byte aligned\n", HS);
        exit(1);
    }
    float* Dvec = static_cast<float*>(scratch);
    float* part = flash_detail::backward_has_bias_partials(HS) ? qkv_bias_partials : nullptr;
    if (HS == 64) flash_detail::backward_launch<Bd, 64>(dqkv, dout, qkv, out, lse, Dvec, B, T, NH, stream, part, dqkv8);
    else flash_detail::backward_launch<Bd, 128>(dqkv, dout, qkv, out, lse, Dvec, B, T, NH, stream, nullptr, Fp8Target());
    return part != nullptr;
}

#endif // !defined(ENABLE_FP32)
