// flash_attention_mma.cuh: the flash attention kernels on mma.sync m16n8k16 (bf16 in, fp32
// accumulators): the forward (flash_fwd_kernel), the backward's dQ kernel (flash_bwd_dq_kernel, which
// also computes D = rowsum(dO * O)) and its dK/dV kernel (flash_bwd_dkv_kernel). They run at every
// head size (64 and 128) where the wgmma kernels do not (flash_attention.cuh picks). Layouts, the
// backward's math and the boundary policies: flash_attention.cuh; the routines used here:
// flash_attention_tiles.cuh.
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
#pragma once
#include "flash_attention_tiles.cuh"

#if !defined(ENABLE_FP32)

namespace flash_detail {

// ---------------------------------------------------------------------------------------------
// Configurations of the mma.sync kernels (all of HS = 128; HS = 64 where wgmma is not built, see
// flash_attention_wgmma.cuh). MT: 16-row m-tiles per warp; NW: warps per CTA; STAGES: cp.async ring depth
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
// HS = 64: two m-tiles per warp (half the shared-memory reads per mma; the registers allow it)
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
// Forward. Grid (ceil(T/QR), B*NH) (FLASH GRID ORDER: flash_attention.cuh), QR = 16*MT*NW query rows per CTA; blockIdx.x counts query
// blocks from the last (the longest) down, so the heaviest CTAs start first. Each warp: 16*MT
// query rows, Q fragments in registers; per key tile of KB rows S = Q K^T (16*MT x KB), online
// softmax, O += P V. The K/V tiles of a step are shared by the NW warps; each warp skips the
// tiles above its own rows (the CTA's last tile only concerns its last warps).
// PASS (flash_attention.cuh's opening comment): FWD_ONE_PASS for plain boundaries; FWD_STATS (writes lse only,
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
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(s[mt], 2 * np, qf[mt][ks], kf);
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
                    for (int mt = 0; mt < MT; mt++) mma_16816_x2(o[mt], 2 * dp, pa[mt], vf);
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
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(s[mt], 2 * np, a_q[mt], bfr);
                ldsm_x4(bfr, v_s + off_b<HS>(np * 16, ks * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(dp[mt], 2 * np, a_do[mt], bfr);
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
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(dq[mt], 2 * dd, da[mt], bfr);
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
        load_lse_and_d<QB, NTH>(sL + st * QB, sD + st * QB, lse_bh, D_bh, qs, T, tid);
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
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(dpt[mt], 2 * np, af[mt], bfr);
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
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(sT[mt], 2 * np, af[mt], bfr);
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
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(dv[mt], 2 * dp, pa[mt], bfr);
                ldsm_x4_trans(bfr, q_s + off_a<HS>(kk * 16, dp * 16, lane));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) mma_16816_x2(dk[mt], 2 * dp, da[mt], bfr);
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


} // namespace flash_detail

#endif // !defined(ENABLE_FP32)
