// flash_attention_tiles.cuh: the device routines that both flash attention kernel families share
// (flash_attention_mma.cuh, flash_attention_wgmma.cuh); layouts, math and the boundary policies are
// described in flash_attention.cuh.
//   - PTX wrappers of the mma.sync path (ldmatrix, mma m16n8k16) and the fragment re-packing
//     (c_to_a: two C fragments, fp32, to one A fragment, bf16). The C fragment of m16n8: lane
//     (g = lane / 4, t4 = lane % 4) holds rows g, g + 8 and columns 2 t4, 2 t4 + 1, in the order
//     [row g: col, col + 1, row g + 8: col, col + 1]; the wgmma m64n64 accumulator holds, for each
//     warp of the warpgroup, the same fragments of 16 of its rows, 4 registers per 8-column n-tile.
//   - The softmax under a boundary policy Bd: scores read through the hooks, probabilities
//     recomputed in the backward from the forward's lse, bit for bit what the forward used.
//   - Padded shared-memory tiles (rows of HS + 8 bf16: ldmatrix without bank conflicts): loads by
//     cp.async (rows past T zero-filled), accumulators into tile rows as bf16, tile rows to global.
//   - The backward's per-row values: D = rowsum(dO * O) of a row (quad_row_dot), and the lse and D of
//     a query tile for the dK/dV kernels (load_lse_and_d).
//   - The epilogues on tiles the kernels staged in shared memory (the backward's 64-row tiles of dqkv,
//     the wgmma forward's 128 output rows): column sums (the qkv bias gradient's partial rows), FP8
//     codes in both layouts of a linear's operand, the amax alone.
// Every device routine is __forceinline__: the kernels' machine code is what inlining them gives.
#pragma once
#include <type_traits>
#include "cuda_common.h"
#include "boundaries.h"
#include "formats/fp8_quantize.cuh" // Fp8Target: the FP8 recipe's E5M2 copy of dqkv

#if !defined(ENABLE_FP32)

namespace flash_detail {

typedef __nv_bfloat16 bf16;

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

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
// n-tiles n and n + 1 of acc += a * the two B fragments of one ldmatrix.x4 (b[0..1]: n-tile n,
// b[2..3]: n-tile n + 1; off_b and the .trans use of off_a give them in that order)
template <int N>
__device__ __forceinline__ void mma_16816_x2(float (&acc)[N][4], int n, const uint32_t (&a)[4], const uint32_t (&b)[4]) {
    mma_16816(acc[n], a, b[0], b[1]);
    mma_16816(acc[n + 1], a, b[2], b[3]);
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
// The softmax under a boundary policy Bd (flash_attention.cuh's opening comment)

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

// The dK/dV kernels' per-query values of the query tile qs .. qs + QB - 1, by cp.async: lse into
// lse_tile[0..QB) (threads 0 .. QB - 1) and D into d_tile[0..QB) (threads QB .. 2 QB - 1; the further
// threads of a CTA of NTH > 2 QB copy nothing); zero-filled past T.
template <int QB, int NTH>
__device__ __forceinline__ void load_lse_and_d(float* lse_tile, float* d_tile, const float* lse_bh, const float* D_bh, int qs,
                                               int T, int tid) {
    static_assert(2 * QB <= NTH, "one thread per lse/D element");
    if (tid < QB) {
        const bool valid = qs + tid < T;
        cp_async4(lse_tile + tid, valid ? lse_bh + qs + tid : lse_bh, valid);
    } else if (NTH == 2 * QB || tid < 2 * QB) {
        const int r = tid - QB;
        const bool valid = qs + r < T;
        cp_async4(d_tile + r, valid ? D_bh + qs + r : D_bh, valid);
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

// D = rowsum(dO * O) of one row (the dQ kernels' first step), from global memory: the 4 lanes of a
// quad (same row) each take HS/4 consecutive columns, then the quad adds its partial sums (a fixed
// order, so the result is deterministic). valid is quad-uniform.
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

// The FP8 epilogue's scale and the tensor's amax so far, which the kernels load at their start: loaded in the
// epilogue, their latency (an L2 round trip) would come after the main loop, with every thread of the CTA waiting.
struct Fp8EpilogueInputs {
    float scale = 1.0f;
    uint32_t amax_seen = 0; // (thread 0's only: fp8_commit's test)
    __device__ __forceinline__ void load(const Fp8Target& t, int tid) {
        if (t.active()) scale = __ldg(t.scale);
        if (tid == 0 && t.amax) amax_seen = __ldcg(t.amax);
    }
};

// The amax alone of NT staged tiles of 64 columns (Fp8Target::amax_only: the backward's dqkv, 64-row tiles, for
// TCFP-12's fresh scales and the FP8 recipe's current scaling; the forward's output, one 128-row tile, for the
// latter), where the kernel stores the BF16 tiles as usual: one atomic per CTA, where it would raise the
// tensor's (fp8_commit). By the CTA's threads, two a row (128 for 64 rows, 256 for 128), after a barrier;
// rows from nvalid on are skipped.
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
// and 8 lanes write a column's 32 contiguous codes (no trip through shared memory, no byte stores).
// The codes are those the recipe's quantize pass makes from the BF16 values stored otherwise (fp8_pack2, the
// same saturating conversion): the two agree bit for bit (build/test_attention). The amax of all NT tiles
// goes to the tensor's with one atomic per CTA, and only where it would raise it (fp8_commit: atomics of
// every warp and tile on one address would serialize). The dK/dV kernel hands
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


} // namespace flash_detail

#endif // !defined(ENABLE_FP32)
