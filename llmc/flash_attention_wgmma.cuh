// flash_attention_wgmma.cuh: the flash attention kernels at HS = 64 on Hopper's warpgroup MMA: the
// forward (flash_fwd_wgmma_kernel), the backward's dQ kernel (flash_bwd_dq_wgmma_kernel) and its dK/dV
// kernel (flash_bwd_dkv_wgmma_kernel), the same tiling and arithmetic as flash_attention_mma.cuh's,
// with the FP8 epilogues (Fp8Target) and the backward's qkv bias partial sums, which only these have.
// flash_attention.cuh runs them where FLASH_ATTENTION_WGMMA is set and the device code has them.
//
// wgmma.mma_async (sm_90a): a warpgroup (4 consecutive warps, 128 threads) computes a 64 x 64 x 16
// product per instruction; B always comes from shared memory
// through a descriptor and is read once for the 64 rows of the warpgroup (mma.sync re-reads it per
// 16-row warp through ldmatrix, which is what bounds those kernels). A comes from shared memory
// too, or from registers in the mma.sync A-fragment layout (warp w of the warpgroup holds rows
// 16w..16w+15). The accumulator of m64n64 holds, for warp w, rows 16w + g, 16w + g + 8 and in
// registers 4n..4n+3 exactly the C fragment of n-tile n of mma.sync, so the S -> P -> A re-packing
// and the masks are those of the mma.sync kernels (flash_attention_mma.cuh).
//
// Operand tiles (K, V, and in the dK/dV kernel Q and dO) are 64-column bf16 tiles without padding,
// in the 128-byte swizzle wgmma reads: row r at byte 128*r, its 16-byte chunk c at chunk c ^ (r % 8),
// tile base 1024-byte aligned. The same tile serves as a K-major operand (rows = M or N, columns =
// the reduction: K in S = Q K^T) and as an MN-major one (rows = the reduction: V in O = P V), by
// the descriptor and the instruction's transpose-B bit. Tiles that only feed ldmatrix (Q and dO
// held in registers) keep the padded layout.
//
// Register A operands (Q, dO, P, dS) are read by wgmma asynchronously, until wgmma_wait: the kernels
// re-read the Q (dO) fragments from shared memory at every tile rather than keep them in registers
// across tiles, since ptxas may give such long-lived registers to the packed P (dS) operand of a
// later batch while an earlier one still reads them.
//
// Only device code built for sm_90a (the Makefile's default) has these instructions: for another
// target (GPU_ARCH=sm_80, or plain sm_90) the three kernels compile to a trap, g_wgmma_built is 0,
// and the host side, which reads it once, runs the mma.sync kernels at HS = 64 too.
#pragma once
#include "flash_attention_tiles.cuh"
#include "wgmma.cuh"        // smem_addr, the swizzled-tile descriptor, the wgmma fences

#if !defined(ENABLE_FP32)

namespace flash_detail {

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
    if (out8.rows != nullptr || out8.amax_only()) {
        // the FP8 recipe's input of the attention projection: E4M3 codes of the output in both layouts, or its
        // amax alone (current scaling), from the CTA's 128 staged rows (written by every warp: hence the barrier)
        cp_async_wait<0>();
        __syncthreads();
        const bf16* tiles[1] = {sQ};
        const int col0[1] = {h * HS};
        if (out8.rows != nullptr)
            tiles_to_fp8<Fp8Kind::E4M3, 1, FWG_QR>(out8, fp8_in, tiles, col0, (long long)b * T + q0,
                                                   min(FWG_QR, T - q0), (long long)(gridDim.y / NH) * T, C, tid);
        else
            tiles_amax<1>(out8, fp8_in, tiles, min(FWG_QR, T - q0), tid);
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
        load_lse_and_d<QB, WG_THREADS>(sL + st * QB, sD + st * QB, lse_bh, D_bh, qs, T, tid);
    };
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

} // namespace flash_detail

#endif // !defined(ENABLE_FP32)
