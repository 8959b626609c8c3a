// recipes/fp8/fp8_gemm.cuh: FP8 GEMMs of the MLP whose epilogue writes the next GEMM's FP8 operands itself (Hopper,
// sm_90a), on the FP8 operands of gemm_wgmma.cuh (its TMA ring, mbarriers and wgmma wrappers).
//
// Why: with cuBLASLt's FP8 GEMMs, the FP8 recipe's fc layer writes its BF16 pre-activation and a pass
// then reads it back to write the fc projection's input as E4M3 codes of gelu(pre) in both layouts (2 + 2
// + 1 + 1 bytes a value), and at d12 that pass takes longer than the GEMM itself. Here the GEMM's
// epilogue writes the pre-activation and both layouts of the
// codes from its accumulators (2 + 1 + 1 bytes a value).
//
// The fc forward (fc_gelu_ws): x (M x K E4M3 codes, row-major) and W (N x K E4M3 codes, the fc weight),
// dequantization factors x_inv and w_inv (1 / their scales), bias (N):
//     pre[m][n]     = bf16(x_inv w_inv sum_k x[m][k] W[n][k] + bias[n])
//     g             = bf16(gelu(pre[m][n]))                    (as gelu_forward stores it)
//     stored:         pre[m][n], or bf16(gelu'(pre[m][n])) for the backward (FcPreOut)
//     codes[m][n]   = e4m3(g * s)      codes_t[n][m] = the same code      (s: the fc projection's input scale)
//     amax         |= max |g|          (atomicMax on the float bits)
// Exactly what cuBLASLt's GEMM followed by fp8_quantize_transpose(gelu_of_input) computes from the same
// pre-activation; the pre-activation itself may differ from cuBLASLt's in its last bit (other order of
// the sums), like any two GEMMs. Fast accumulation (the FP8 recipe's forward GEMMs have it).
//
// Shapes: M % 128 == 0, N % 128 == 0, K % 16 == 0 (a last partial K step reads zeros), pointers 16-byte
// aligned (supported()); every GPT-2/3 MLP at B*T a multiple of 128.
//
// Both kernels are exact (the checks above; build/test_fp8) and faster than cuBLASLt's GEMM followed by
// the pass at d12's shapes (build/test_fp8 times them); the FP8 recipe uses them in its training steps
// (recipes/fp8/recipe.h, Recipe::fused_gemm). At d12 the epilogue warps are the slower side; at d48 the
// mainloop is, bound by its loads, which a 2-CTA cluster multicasting A could halve. The epilogue runs in
// warps of its own (warp specialization) because an epilogue between each CTA's MMAs, with two CTAs an
// SM, does not hide one CTA's epilogue under the other's MMAs.
#pragma once
#include "llmc/gemm_wgmma.cuh"
#include "llmc/formats/fp8_quantize.cuh" // fp8_pack2, Fp8Kind
#include "llmc/gelu.cuh"

namespace fp8_gemm {

constexpr int PRE_LD = 128 + 8; // BF16 per staged pre-activation row (16 bytes of padding: conflict-free pairs)
constexpr int PRE_BYTES = 128 * PRE_LD * 2;

// ---- The kernel: persistent and warp-specialized -----------------------------------------------------
// One CTA per SM walks over tiles (tile b, b + gridDim.x, ...; columns fastest, so
// that the CTAs running together read the same rows of x) with three roles:
//   producer   warp 8: the TMA loads of every K step of every tile, into a ring of 3 slots (as above),
//              running on into the next tile while the consumers finish one;
//   consumers  warps 0-7, two warpgroups of 64 rows: the MMAs of a tile; then each thread writes its
//              BF16 pre-activations, bf16(acc x_inv w_inv + bias), into one of two shared pre tiles and
//              goes on with the next tile;
//   epilogue   warps 9-16 (256 threads): each reads its 4 x 4 blocks of the pre tile once and stores
//              them to global memory as the pre-activation, then gelu, the E4M3 codes (rows staged,
//              columns staged through byte permutes, as the quantize kernels do) and the amax; both code
//              layouts to global memory;
//   transposer warp 17, when asked: x^T for the backward from the A tiles in the ring (ws_transpose_x_block).
// The consumers build their wgmma descriptors once and move them on by offsets (desc_advance), and every
// shared-memory pointer derives from smem_raw by pointer arithmetic (WsShared), so that the compiler emits
// LDS/STS rather than generic loads and stores: the epilogue is bound by its instruction issue slots.
// Two mbarriers a pre tile hand it over: pre_full (256 consumer arrivals) and pre_empty (256 epilogue
// arrivals); the epilogue warps sync among themselves with named barrier 2. Shared memory: the ring
// 96 KB, two pre tiles 68 KB, the staged codes 32 KB.
constexpr int WS_STAGES = 3, WS_EPI_THREAD0 = 288, WS_EPI_THREADS = 256, WS_THREADS = WS_EPI_THREAD0 + WS_EPI_THREADS;
constexpr int WS_CODES_T_STRIDE = 33; // words per staged code column (32 row groups + 1: fewer bank conflicts)
constexpr int WS_RING_BYTES = WS_STAGES * 32768;
constexpr int WS_CODES_BYTES = 128 * 128, WS_CODES_T_BYTES = 128 * WS_CODES_T_STRIDE * 4;
constexpr int WS_SMEM_BYTES = WS_RING_BYTES + 2 * PRE_BYTES + WS_CODES_BYTES + WS_CODES_T_BYTES + 1024 + 256;

template <int EPI_THREADS>
__device__ __forceinline__ void epilogue_barrier() { asm volatile("bar.sync 2, %0;\n" :: "n"(EPI_THREADS) : "memory"); }

#if GEMM_WGMMA_DEVICE
// What both persistent kernels share: their grid of 128 x 128 output tiles (M x N, K steps of
// Ops::ELEMS_PER_STEP), and their shared memory, in this order: the TMA ring (WS_STAGES slots of 32 KB), two
// staged BF16 tiles (128 x PRE_LD: the consumers' output, handed to the epilogue), the staged codes (rows,
// then columns), the mbarriers, then the kernel's own scratch (`extra`).
struct WsShared {
    int tiles_n, num_tiles, k_steps; // tile t: rows 128 (t / tiles_n), columns 128 (t % tiles_n)
    unsigned char* ring;
    __nv_bfloat16* tiles;  // tile b at tiles + b * 128 * PRE_LD
    uint8_t* codes;        // 128 x 128, row-major
    uint32_t* codes_t;     // 128 columns of WS_CODES_T_STRIDE words
    uint64_t *full, *empty;            // the ring's slots: loaded / free again (both warpgroups)
    uint64_t *tile_full, *tile_empty;  // the staged tiles: written by the consumers / read by the epilogue
    unsigned char* extra;
    __device__ __forceinline__ WsShared(unsigned char* smem_raw, int M, int N, int K, int elems_per_step)
        : tiles_n(N / 128), num_tiles((M / 128) * (N / 128)), k_steps((K + elems_per_step - 1) / elems_per_step) {
        // pointer arithmetic on smem_raw, not a round trip through an integer: the compiler then knows
        // every pointer below is shared memory and emits LDS/STS (through an integer it emitted generic
        // LD/ST, with 64-bit address arithmetic, for every staged-tile access)
        const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem_raw);
        ring = smem_raw + (((a + 1023) & ~1023u) - a);
        tiles = reinterpret_cast<__nv_bfloat16*>(ring + WS_RING_BYTES);
        codes = ring + WS_RING_BYTES + 2 * PRE_BYTES;
        codes_t = reinterpret_cast<uint32_t*>(codes + WS_CODES_BYTES);
        full = reinterpret_cast<uint64_t*>(codes + WS_CODES_BYTES + WS_CODES_T_BYTES);
        empty = full + WS_STAGES;
        tile_full = empty + WS_STAGES;
        tile_empty = tile_full + 2;
        extra = reinterpret_cast<unsigned char*>(full) + 256;
    }
    __device__ __forceinline__ __nv_bfloat16* tile(int b) const { return tiles + b * (128 * PRE_LD); }
    // the wgmma descriptors of ring slot 0's tiles: warpgroup g's 64 rows of A, all of B (slot s: + s * 32 KB)
    __device__ __forceinline__ uint64_t a_desc0(int g) const { return gemm_wgmma::tile_desc(ring + g * (64 * 128), 0); }
    __device__ __forceinline__ uint64_t b_desc0() const { return gemm_wgmma::tile_desc(ring + gemm_wgmma::A_TILE_BYTES, 0); }
    // thread 0 initializes the barriers (epi_threads: how many epilogue threads free a staged tile), then
    // the whole CTA syncs
    // (empty_arrivals: the warps that free a ring slot: the two consumer warpgroups, and fc_gelu_ws's
    // transposer warp when it runs)
    __device__ __forceinline__ void init_barriers(int epi_threads, int empty_arrivals = 2) const {
        if (threadIdx.x == 0) {
            for (int s = 0; s < WS_STAGES; s++) {
                gemm_wgmma::bar_init(&full[s], 1);
                gemm_wgmma::bar_init(&empty[s], empty_arrivals);
            }
            for (int b = 0; b < 2; b++) {
                gemm_wgmma::bar_init(&tile_full[b], gemm_wgmma::CONSUMER_THREADS);
                gemm_wgmma::bar_init(&tile_empty[b], epi_threads);
            }
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }
};

// The producer of both persistent kernels (warp 8, lane 0): every K step of every tile of this CTA into
// the ring; `it` counts the K steps over all tiles, so that each slot's barrier phases carry on across tiles.
template <class Ops>
__device__ __forceinline__ void ws_produce(const WsShared& sh, const CUtensorMap* map_a, const CUtensorMap* map_b) {
    int it = 0;
    for (int tile = blockIdx.x; tile < sh.num_tiles; tile += gridDim.x) {
        const int m0 = (tile / sh.tiles_n) * 128, n0 = (tile % sh.tiles_n) * 128;
        for (int kt = 0; kt < sh.k_steps; kt++, it++) {
            const int s = it % WS_STAGES;
            if (it >= WS_STAGES) gemm_wgmma::bar_wait(&sh.empty[s], ((it / WS_STAGES) + 1) & 1);
            unsigned char* slot = sh.ring + s * 32768;
            gemm_wgmma::bar_expect_bytes(&sh.full[s], 32768);
            gemm_wgmma::tma_load_2d(slot, map_a, kt * Ops::ELEMS_PER_STEP, m0, &sh.full[s]);
            gemm_wgmma::tma_load_2d(slot + gemm_wgmma::A_TILE_BYTES, map_b, kt * Ops::ELEMS_PER_STEP, n0, &sh.full[s]);
        }
    }
}

// A consumer thread's share of a finished tile, scaled by ab (and + bias when given), as BF16 into the
// staged tile (128 x PRE_LD): rows r_lo and r_lo + 8, columns 8c + 2q and 8c + 2q + 1
__device__ __forceinline__ void ws_stage_bf16(__nv_bfloat16* tile, const float (&d)[64], float ab,
                                              const __nv_bfloat162 (&bias2)[16], int r_lo, int q) {
#pragma unroll
    for (int c = 0; c < 16; c++) {
        const int col = 8 * c + 2 * q;
        const float b0 = __low2float(bias2[c]), b1 = __high2float(bias2[c]);
        *reinterpret_cast<__nv_bfloat162*>(tile + r_lo * PRE_LD + col) = __floats2bfloat162_rn(d[4 * c] * ab + b0, d[4 * c + 1] * ab + b1);
        *reinterpret_cast<__nv_bfloat162*>(tile + (r_lo + 8) * PRE_LD + col) =
            __floats2bfloat162_rn(d[4 * c + 2] * ab + b0, d[4 * c + 3] * ab + b1);
    }
}

// The staged codes of a tile to global memory: rows (M x N, at m0, n0) and columns (N x M, at n0, m0), by
// the EPI_THREADS epilogue threads (et: this one)
template <int EPI_THREADS>
__device__ __forceinline__ void ws_store_codes(uint8_t* codes, uint8_t* codes_t, const WsShared& sh, int m0, int n0, int M,
                                               int N, int et) {
    const uint8_t* s_codes = sh.codes;
    const uint32_t* s_codes_t = sh.codes_t;
#pragma unroll 4
    for (int chunk = et; chunk < 1024; chunk += EPI_THREADS) {
        const int r = chunk / 8, part = chunk % 8;
        const uint4 v = *reinterpret_cast<const uint4*>(s_codes + r * 128 + 16 * part);
        *reinterpret_cast<uint4*>(codes + (size_t)(m0 + r) * N + n0 + 16 * part) = v;
        const uint32_t* w = s_codes_t + r * WS_CODES_T_STRIDE + 4 * part; // column r, rows 16 part ..
        *reinterpret_cast<uint4*>(codes_t + (size_t)(n0 + r) * M + m0 + 16 * part) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// A BF16 tile (128 x PRE_LD staged) to global memory (M x N row-major, at m0, n0), 16 bytes a thread at a time
template <int EPI_THREADS>
__device__ __forceinline__ void ws_store_bf16(floatX* out, const __nv_bfloat16* tile, int m0, int n0, int N, int et) {
#pragma unroll 4
    for (int chunk = et; chunk < 2048; chunk += EPI_THREADS) {
        const int r = chunk / 16, c8 = chunk % 16;
        const uint4 v = *reinterpret_cast<const uint4*>(tile + r * PRE_LD + 8 * c8);
        *reinterpret_cast<uint4*>(out + (size_t)(m0 + r) * N + n0 + 8 * c8) = v;
    }
}

// The two BF16 values of a 32-bit word as floats: one instruction each (__bfloat1622float2 spends two on the
// high half, a byte permute and a shift)
__device__ __forceinline__ float2 ws_bf16x2_to_float2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
}
// Two values rounded to BF16 as one 32-bit word (the first in the low half)
__device__ __forceinline__ uint32_t ws_float2_to_bf16x2(float a, float b) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&p);
}
// Two values rounded to BF16 as a pair (as the passes store them), the bits of their magnitudes raised into
// amax2 (two 16-bit lanes, one VIMNMX for both; the order of |bf16| bits is that of the magnitudes, NaN above
// infinity), and the pair back as floats. ws_amax_bits turns the lanes into llmc::amax_bits of the largest.
__device__ __forceinline__ float2 ws_round_bf16_amax(float a, float b, uint32_t& amax2) {
    const uint32_t w = ws_float2_to_bf16x2(a, b);
    amax2 = __vmaxu2(amax2, w & 0x7FFF7FFFu);
    return ws_bf16x2_to_float2(w);
}
__device__ __forceinline__ uint32_t ws_amax_bits(uint32_t amax2) { return max(amax2 & 0xFFFFu, amax2 >> 16) << 16; }
#endif

// fc_gelu_ws's transposer warp (warp 17, when x_t is given): the fc layer's x^T (K x M), which the backward's
// wgrad reads, from the A tiles this kernel loads anyway, instead of a separate fp8_transpose pass over x
// (1 byte read and 1 written a value). Tile (row block m0, column block n) transposes x's 32 columns
// kc = 32 n .. kc + 31 of rows m0 .. m0 + 127, from the ring slot of the K step that holds them; for the fc layer
// N = 4K, so the N / 128 tiles of a row block cover x's K columns once, and every tile has the same small share
// (4 KB), whichever CTA runs it. Lane (p, q): rows 16 p .. 16 p + 15 of the tile, columns 8 q .. 8 q + 7 of the 32:
// 16 8-byte loads (TMA stored the tile with the 128-byte swizzle: 16-byte chunk c of row r sits at chunk
// c ^ (r % 8)), 8 4 x 4 byte transposes, and 8 16-byte stores, one a row of x_t (the warp's 32 stores of one
// pass fill 4 rows x 128 bytes: whole lines).
__device__ __forceinline__ void ws_gather_transposed(uint32_t (&out)[8][4], const unsigned char* a_tile, int col_in_slot, int lane) {
    const int p = lane % 8, q = lane / 8;
    const int col = col_in_slot + 8 * q, chunk = col / 16, half = col % 16;
    uint32_t lo[16], hi[16]; // rows 16 p + i: columns col .. col + 3, col + 4 .. col + 7
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int r = 16 * p + i;
        const uint2 v = *reinterpret_cast<const uint2*>(a_tile + r * 128 + ((chunk ^ (r & 7)) * 16) + half);
        lo[i] = v.x;
        hi[i] = v.y;
    }
#pragma unroll
    for (int w = 0; w < 4; w++) { // out[c][w]: column col + c, rows 16 p + 4 w .. + 3
        const uint32_t rl[4] = {lo[4 * w], lo[4 * w + 1], lo[4 * w + 2], lo[4 * w + 3]};
        const uint32_t rh[4] = {hi[4 * w], hi[4 * w + 1], hi[4 * w + 2], hi[4 * w + 3]};
        uint32_t cl[4], ch[4];
        fp8_transpose4x4(rl, cl);
        fp8_transpose4x4(rh, ch);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            out[c][w] = cl[c];
            out[4 + c][w] = ch[c];
        }
    }
}
__device__ __forceinline__ void ws_store_transposed(uint8_t* __restrict__ x_t, const uint32_t (&out)[8][4], int m0, int kc, int M, int lane) {
    const int p = lane % 8, q = lane / 8;
#pragma unroll
    for (int c = 0; c < 8; c++)
        *reinterpret_cast<uint4*>(x_t + (size_t)(kc + 8 * q + c) * M + m0 + 16 * p) = make_uint4(out[c][0], out[c][1], out[c][2], out[c][3]);
}
__device__ __forceinline__ void ws_transpose_x_block(uint8_t* __restrict__ x_t, const unsigned char* a_tile, int col_in_slot,
                                                     int m0, int kc, int M, int lane) {
    uint32_t out[8][4];
    ws_gather_transposed(out, a_tile, col_in_slot, lane);
    ws_store_transposed(x_t, out, m0, kc, M, lane);
}
#if GEMM_WGMMA_DEVICE
// A CTA's walk over its K steps (tiles blockIdx.x, + gridDim.x, ...; k_steps each), by increments: the tile's
// row block m0 and column block n_block (one division a tile), the K step kt, and the ring slot s with its
// mbarrier phase parity (phase = (step / WS_STAGES) & 1)
struct WsStepCursor {
    int tile, kt = 0, s = 0, phase = 0, m0 = 0, n_block = 0;
    __device__ __forceinline__ explicit WsStepCursor(const WsShared& sh) : tile(blockIdx.x) { locate(sh); }
    __device__ __forceinline__ void locate(const WsShared& sh) {
        m0 = (tile / sh.tiles_n) * 128;
        n_block = tile % sh.tiles_n;
    }
    __device__ __forceinline__ void advance(const WsShared& sh) {
        if (++kt == sh.k_steps) {
            kt = 0;
            tile += gridDim.x;
            locate(sh);
        }
        if (++s == WS_STAGES) { s = 0; phase ^= 1; }
    }
};
// fc_dy_ws's producer warp when a_t is given: lane 0 loads every K step into the ring as ws_produce does,
// and the whole warp, WS_STAGES - 1 steps behind, transposes each tile's 32-column share of the A operand
// into a_t (as fc_gelu_ws's transposer warp does for x, ws_transpose_x_block) and frees the slot (the
// third arrival on empty). fc_dy_ws has no registers for a 17th warp: 17 warps put 5 on one scheduler and
// cap every thread at 96 registers (ptxas then spilled its consumers' 96 accumulators), so
// the producer warp's 31 idle lanes do it. Lagging by WS_STAGES - 1 adds no wait to the ring's protocol:
// loading step it + 1 needs slot (it + 1) % WS_STAGES freed from step it + 1 - WS_STAGES = it - 2, so the
// producer waits for that step's data anyway. Step it - 2's arrival comes after step it is loaded, and loading
// step it + 1 waits for it: no cycle. The transposes do take the producer's time between two loads, which
// shows where the main loop bounds the kernel (fc_dy_writes_dy_t_pays). Steps without the tile's columns are freed without waiting for their data (their
// empty phase is the one after step u - WS_STAGES's, which completed before step u + 1 was loaded).
template <class Ops>
__device__ __forceinline__ void ws_produce_transpose_a(const WsShared& sh, const CUtensorMap* map_a, const CUtensorMap* map_b,
                                                       uint8_t* __restrict__ a_t, int M, int K, int lane) {
    constexpr int LAG = WS_STAGES - 1;
    const int my_tiles = sh.num_tiles > (int)blockIdx.x ? (sh.num_tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = my_tiles * sh.k_steps; // this CTA's K steps over all its tiles
    // Two cursors walk the CTA's K steps: the one loaded next (l) and the one transposed and freed next (u).
    // They advance by increments, with one division a tile: divisions in every step (it / k_steps, then
    // tile / tiles_n) put ~100 dependent integer instructions between a slot's release and its refill.
    WsStepCursor l(sh), u(sh);
    for (int it = 0; it < total + LAG; it++) {
        if (it < total) {
            if (lane == 0) { // load step it
                if (it >= WS_STAGES) gemm_wgmma::bar_wait(&sh.empty[l.s], l.phase ^ 1);
                unsigned char* slot = sh.ring + l.s * 32768;
                gemm_wgmma::bar_expect_bytes(&sh.full[l.s], 32768);
                gemm_wgmma::tma_load_2d(slot, map_a, l.kt * Ops::ELEMS_PER_STEP, l.m0, &sh.full[l.s]);
                gemm_wgmma::tma_load_2d(slot + gemm_wgmma::A_TILE_BYTES, map_b, l.kt * Ops::ELEMS_PER_STEP, 128 * l.n_block,
                                        &sh.full[l.s]);
            }
            l.advance(sh);
        }
        __syncwarp();
        if (it < LAG) continue;
        // step it - LAG: transposed if it holds the tile's 32 columns of A (kc; their generic-proxy reads done
        // and ordered before the TMA that refills the slot), freed, then the transposed columns stored
        const int kc = 32 * u.n_block, col_in_slot = kc - u.kt * Ops::ELEMS_PER_STEP;
        const bool mine = kc < K && col_in_slot >= 0 && col_in_slot < Ops::ELEMS_PER_STEP;
        uint32_t out[8][4];
        if (mine) {
            gemm_wgmma::bar_wait(&sh.full[u.s], u.phase);
            ws_gather_transposed(out, sh.ring + u.s * 32768, col_in_slot, lane);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
        }
        if (lane == 0) gemm_wgmma::bar_arrive(&sh.empty[u.s]);
        if (mine) ws_store_transposed(a_t, out, u.m0, kc, M, lane);
        u.advance(sh);
    }
}
#endif

constexpr int WS_GELU_THREADS = WS_THREADS + 32, WS_TRANSPOSER_WARP = WS_THREADS / 32;

template <bool STORE_DERIVATIVE>
__global__ void __launch_bounds__(WS_GELU_THREADS, 1)
fc_gelu_ws_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w, int M, int N, int K,
                  const float* __restrict__ x_inv, const float* __restrict__ w_inv, const floatX* __restrict__ bias,
                  floatX* __restrict__ pre, uint8_t* __restrict__ codes, uint8_t* __restrict__ codes_t,
                  const float* __restrict__ scale, uint32_t* __restrict__ amax, uint8_t* __restrict__ x_t) {
#if GEMM_WGMMA_DEVICE
    using namespace gemm_wgmma;
    using Ops = Fp8Operands<false, false>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const WsShared sh(smem_raw, M, N, K, Ops::ELEMS_PER_STEP); // its staged tiles hold the pre-activation
    const int tiles_n = sh.tiles_n, num_tiles = sh.num_tiles;
    uint64_t *full = sh.full, *empty = sh.empty, *pre_full = sh.tile_full, *pre_empty = sh.tile_empty;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    sh.init_barriers(WS_EPI_THREADS, x_t != nullptr ? 3 : 2);

    if (warp == 8) {
        if (lane == 0) ws_produce<Ops>(sh, &map_x, &map_w);
    } else if (warp < 8) {
        // consumers: warpgroup g computes rows 64g..64g+63 of each tile
        const int g = warp / 4, wq = warp % 4, gq = lane / 4, q = lane % 4;
        const int r_lo = 64 * g + 16 * wq + gq;
        const float ab = __ldg(x_inv) * __ldg(w_inv);
        const uint64_t a_desc0 = sh.a_desc0(g), b_desc0 = sh.b_desc0();
        int it = 0, j = 0;
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, j++) {
            const int n0 = (tile % tiles_n) * 128;
            float d[64];
#pragma unroll
            for (int i = 0; i < 64; i++) d[i] = 0.0f;
            for (int kt = 0; kt < sh.k_steps; kt++, it++) {
                const int s = it % WS_STAGES;
                bar_wait(&full[s], (it / WS_STAGES) & 1);
                reg_fence(d);
                wgmma_fence();
                mma_k_step<Ops, 128>(d, desc_advance(a_desc0, s * 32768), desc_advance(b_desc0, s * 32768));
                wgmma_commit();
                wgmma_wait<1>();
                reg_fence(d);
                if (kt > 0 && threadIdx.x % 128 == 0) bar_arrive(&empty[(it - 1) % WS_STAGES]);
            }
            // the bias loads land while the last K step's MMAs run (loaded here, not before the K loop, they
            // take no registers in it)
            __nv_bfloat162 bias2[16];
#pragma unroll
            for (int c = 0; c < 16; c++) {
                bias2[c] = bias != nullptr ? __ldg(reinterpret_cast<const __nv_bfloat162*>(bias + n0 + 8 * c + 2 * q))
                                           : __floats2bfloat162_rn(0.0f, 0.0f);
            }
            wgmma_wait<0>();
            reg_fence(d);
            if (threadIdx.x % 128 == 0) bar_arrive(&empty[(it - 1) % WS_STAGES]);
            // the pre-activation into pre tile j % 2, once the epilogue has finished with tile j - 2
            const int b = j % 2;
            if (j >= 2) bar_wait(&pre_empty[b], ((j / 2) + 1) & 1);
            ws_stage_bf16(sh.tile(b), d, ab, bias2, r_lo, q);
            bar_arrive(&pre_full[b]);
        }
    } else if (warp == WS_TRANSPOSER_WARP) {
        if (x_t == nullptr) return;
        // the transposer: every K step's slot waited for and freed (it is the third arrival on empty), the
        // tile's 32 columns of x transposed from the slot that holds them
        int it = 0;
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
            const int m0 = (tile / tiles_n) * 128, kc = 32 * (tile % tiles_n);
            for (int kt = 0; kt < sh.k_steps; kt++, it++) {
                const int s = it % WS_STAGES;
                bar_wait(&full[s], (it / WS_STAGES) & 1);
                const int col_in_slot = kc - kt * Ops::ELEMS_PER_STEP;
                if (kc < K && col_in_slot >= 0 && col_in_slot < Ops::ELEMS_PER_STEP)
                    ws_transpose_x_block(x_t, sh.ring + s * 32768, col_in_slot, m0, kc, M, lane);
                // (the slot's generic-proxy reads ordered before the TMA that refills it)
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncwarp();
                if (lane == 0) bar_arrive(&empty[s]);
            }
        }
    } else {
        // epilogue warpgroup: thread et handles the 4 x 4 blocks (row group br, column group bc = et % 32)
        const int et = threadIdx.x - WS_EPI_THREAD0, bc = et % 32;
        const float s = __ldg(scale);
        uint32_t amax2 = 0; // (ws_round_bf16_amax)
        int j = 0;
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, j++) {
            const int m0 = (tile / tiles_n) * 128, n0 = (tile % tiles_n) * 128;
            const int b = j % 2;
            bar_wait(&pre_full[b], (j / 2) & 1);
            const __nv_bfloat16* tile_pre = sh.tile(b);
            epilogue_barrier<WS_EPI_THREADS>(); // the staged codes of the tile before are stored
#pragma unroll 2
            for (int i = 0; i < 1024 / WS_EPI_THREADS; i++) {
                const int br = et / 32 + (WS_EPI_THREADS / 32) * i; // rows 4 br .. 4 br + 3, columns 4 bc .. 4 bc + 3
                uint32_t row_word[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int r = 4 * br + k;
                    const uint2 raw = *reinterpret_cast<const uint2*>(tile_pre + r * PRE_LD + 4 * bc);
                    const float2 p01 = ws_bf16x2_to_float2(raw.x), p23 = ws_bf16x2_to_float2(raw.y);
                    float2 g01, g23;
                    uint2 out = raw; // (a warp stores 256 contiguous bytes of row r)
                    if constexpr (STORE_DERIVATIVE) {
                        // gelu and its derivative from one tanh; the derivative, rounded to BF16, is what the
                        // backward multiplies by (gelu.cuh, GeluFactor::GIVEN)
                        float d0, d1, d2, d3;
                        g01 = ws_round_bf16_amax(gelu_value_and_derivative(p01.x, d0), gelu_value_and_derivative(p01.y, d1), amax2);
                        g23 = ws_round_bf16_amax(gelu_value_and_derivative(p23.x, d2), gelu_value_and_derivative(p23.y, d3), amax2);
                        out = make_uint2(ws_float2_to_bf16x2(d0, d1), ws_float2_to_bf16x2(d2, d3));
                    } else {
                        g01 = ws_round_bf16_amax(gelu_value(p01.x), gelu_value(p01.y), amax2);
                        g23 = ws_round_bf16_amax(gelu_value(p23.x), gelu_value(p23.y), amax2);
                    }
                    *reinterpret_cast<uint2*>(pre + (size_t)(m0 + r) * N + n0 + 4 * bc) = out;
                    row_word[k] = fp8_pack2<Fp8Kind::E4M3>(g01.x * s, g01.y * s) |
                                  ((uint32_t)fp8_pack2<Fp8Kind::E4M3>(g23.x * s, g23.y * s) << 16);
                    *reinterpret_cast<uint32_t*>(sh.codes + r * 128 + 4 * bc) = row_word[k];
                }
                fp8_tile_stage_columns<WS_CODES_T_STRIDE>(sh.codes_t, row_word, 4 * br, 4 * bc);
            }
            bar_arrive(&pre_empty[b]); // this thread is done reading the pre tile
            epilogue_barrier<WS_EPI_THREADS>(); // every code staged
            ws_store_codes<WS_EPI_THREADS>(codes, codes_t, sh, m0, n0, M, N, et);
        }
        uint32_t amax_bits = ws_amax_bits(amax2);
        for (int o = 16; o > 0; o >>= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, o));
        if (lane == 0 && amax_bits) atomicMax(amax, amax_bits);
    }
#else
    __trap();
#endif
}

// Whether fc_gelu_ws can write x^T as well (x_t): its tiles' 32-column shares must cover K (N >= 4K; the fc
// layer has N = 4K)
inline bool writes_x_t_supported(int N, int K) { return K % 32 == 0 && (N / 128) * 32 >= K; }
// Whether fc_dy_ws's producer warp should write dy^T (it can where writes_x_t_supported): the transposes sit
// in the producer's path between a slot's release and its refill, so they pay where the kernel waits on its
// epilogue, with few K steps a tile, and cost where it waits on its main loop: at K = 768 (6 steps a tile)
// writing dy^T beats the kernel without it plus the transpose pass, at K = 1600 (13 steps) it loses. K = 1024
// and 1280 lie between; up to 8 steps a tile counts as epilogue-bound.
inline bool fc_dy_writes_dy_t_pays(int N, int K) { return writes_x_t_supported(N, K) && K <= 8 * 128; }

// What fc_gelu_ws stores in its BF16 output: the pre-activation, or bf16(gelu'(pre)), the GELU factor of the
// backward (gelu.cuh, GeluFactor::GIVEN), which the FP8 recipe keeps in place of the pre-activation: fc_dy_ws
// then multiplies by it instead of evaluating gelu'; fc_gelu_ws has the tanh at hand already, so the
// factor costs it less than it saves fc_dy_ws
enum class FcPreOut { PRE_ACTIVATION, GELU_DERIVATIVE };

// The fc forward above: x (M x K), W (N x K) E4M3 codes; pre (M x N) BF16 (what `what` says), codes (M x N)
// and codes_t (N x M) E4M3 at *scale; amax raised; when x_t is given, x's codes transposed into it (K x M).
// The caller checked supported() (and writes_x_t_supported() for x_t).
inline void fc_gelu_ws(floatX* pre, FcPreOut what, uint8_t* codes, uint8_t* codes_t, const uint8_t* x, const float* x_inv,
                       const uint8_t* w, const float* w_inv, const floatX* bias, const float* scale, uint32_t* amax, int M,
                       int N, int K, cudaStream_t stream, uint8_t* x_t = nullptr) {
    using Ops = gemm_wgmma::Fp8Operands<false, false>;
    const bool derivative = what == FcPreOut::GELU_DERIVATIVE;
    auto kernel = derivative ? with_dynamic_smem<fc_gelu_ws_kernel<true>>(WS_SMEM_BYTES)
                             : with_dynamic_smem<fc_gelu_ws_kernel<false>>(WS_SMEM_BYTES);
    if (x_t != nullptr && (!writes_x_t_supported(N, K) || (uintptr_t)x_t % 16 != 0)) {
        fprintf(stderr, "error: fc_gelu_ws cannot write x^T for N=%d K=%d (needs K %% 32 == 0, N >= 4K, 16-byte alignment)\n", N, K);
        exit(1);
    }
    const CUtensorMap map_x = gemm_wgmma::tensor_map<Ops>(x, M, K, 128);
    const CUtensorMap map_w = gemm_wgmma::tensor_map<Ops>(w, N, K, 128);
    const int tiles = (M / 128) * (N / 128);
    const int grid = std::min(tiles, device_sm_count());
    kernel<<<grid, WS_GELU_THREADS, WS_SMEM_BYTES, stream>>>(map_x, map_w, M, N, K, x_inv, w_inv, bias, pre, codes, codes_t,
                                                             scale, amax, x_t);
    cudaCheckLaunch();
}

// ---- The fc projection's dgrad with the fc layer's output gradient in its epilogue --------------------
// The backward counterpart (fc_dy_ws): the fc projection's dgrad, d(gelu output) = dy W (dy: M x K E5M2 codes
// of the fc projection's output gradient, W^T: N x K E4M3 codes, K = C, N = 4C), and the fc layer's dy pass
// after it (GELU', E5M2 in both layouts, the bias gradient's column sums), in one persistent kernel:
//     g[m][n]       = bf16(dy_inv w_inv sum_k dy[m][k] Wt[n][k])     (what cuBLASLt's dgrad writes, BF16)
//     dyf[m][n]     = bf16(g * bf16(gelu'(pre[m][n])))                 (as gelu_backward stores it, GeluFactor
//                                                                        ROUNDED; or the stored factor, GIVEN)
//     codes[m][n]   = e5m2(dyf * s)    codes_t[n][m] = the same code    amax |= max |dyf|
//     col_partials[m / 128][n] = sum of dyf over the tile's 128 rows   (bias_backward_reduce finishes them)
// Its sums are not "fast": the FP8 recipe's backward GEMMs accumulate in FP32. Each K step's MMAs (four
// k32) go into a fresh 64 x 64 partial sum (one half of the tile's columns at a time, so that the partial
// sums take 32 registers), which the consumer then adds into its FP32 accumulators: the tensor cores'
// reduced-precision sums span 128 products at most. d(gelu output) itself is never written (dgelu_out,
// for tests, writes it). It replaces cuBLASLt's dgrad followed by the dy quantize pass, which reads the
// BF16 d(gelu output) back.
// Same roles, ring and hand-over as fc_gelu_ws (7 epilogue warps); the epilogue reads the pre-activation
// from global memory (8 bytes a row of a 4 x 4 block, a warp's 32 blocks side by side). When dy_t is given,
// the producer warp also writes dy^T (the fc projection's wgrad operand) from the dy tiles in the ring
// (ws_produce_transpose_a), in place of an fp8_transpose pass over dy.
// Seven epilogue warps, not eight: the consumers hold 96 accumulators (64 + the 32 of a K step's partial sums),
// and 16 warps (4 a scheduler) leave them 128 registers, where 17 leave 96 (ptxas spilled there).
constexpr int WS_DY_EPI_THREADS = 224, WS_DY_THREADS = WS_EPI_THREAD0 + WS_DY_EPI_THREADS;
constexpr int WS_DY_SMEM_BYTES = WS_SMEM_BYTES + WS_DY_EPI_THREADS / 32 * 128 * 4; // + the column sums of each epilogue warp

template <GeluFactor FACTOR>
__global__ void __launch_bounds__(WS_DY_THREADS, 1)
fc_dy_ws_kernel(const __grid_constant__ CUtensorMap map_dy, const __grid_constant__ CUtensorMap map_wt, int M, int N, int K,
                const float* __restrict__ dy_inv, const float* __restrict__ w_inv, const floatX* __restrict__ pre,
                uint8_t* __restrict__ codes, uint8_t* __restrict__ codes_t, float* __restrict__ col_partials,
                const float* __restrict__ scale, uint32_t* __restrict__ amax, floatX* __restrict__ dgelu_out,
                uint8_t* __restrict__ dy_t) {
#if GEMM_WGMMA_DEVICE
    using namespace gemm_wgmma;
    using Ops = Fp8Operands<true, false>; // A: dy (E5M2), B: W^T (E4M3)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const WsShared sh(smem_raw, M, N, K, Ops::ELEMS_PER_STEP); // its staged tiles hold d(gelu output)
    const int tiles_n = sh.tiles_n, num_tiles = sh.num_tiles;
    uint64_t *full = sh.full, *empty = sh.empty, *dg_full = sh.tile_full, *dg_empty = sh.tile_empty;
    float* s_colsum = reinterpret_cast<float*>(sh.extra); // [epilogue warp][128]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    sh.init_barriers(WS_DY_EPI_THREADS, dy_t != nullptr ? 3 : 2);

    if (warp == 8) {
        if (dy_t != nullptr) ws_produce_transpose_a<Ops>(sh, &map_dy, &map_wt, dy_t, M, K, lane);
        else if (lane == 0) ws_produce<Ops>(sh, &map_dy, &map_wt);
    } else if (warp < 8) {
        // consumers: warpgroup g computes rows 64g..64g+63 of each tile, promoting each K step's sums
        const int g = warp / 4, wq = warp % 4, gq = lane / 4, q = lane % 4;
        const int r_lo = 64 * g + 16 * wq + gq;
        const float ab = __ldg(dy_inv) * __ldg(w_inv);
        const uint64_t a_desc0 = sh.a_desc0(g), b_desc0 = sh.b_desc0();
        __nv_bfloat162 no_bias[16];
#pragma unroll
        for (int c = 0; c < 16; c++) no_bias[c] = __floats2bfloat162_rn(0.0f, 0.0f);
        int it = 0, j = 0;
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, j++) {
            float d[64], t[32];
#pragma unroll
            for (int i = 0; i < 64; i++) d[i] = 0.0f;
#pragma unroll
            for (int i = 0; i < 32; i++) t[i] = 0.0f;
            for (int kt = 0; kt < sh.k_steps; kt++, it++) {
                const int s = it % WS_STAGES;
                bar_wait(&full[s], (it / WS_STAGES) & 1);
                const uint64_t a_desc = desc_advance(a_desc0, s * 32768), b_desc = desc_advance(b_desc0, s * 32768);
#pragma unroll
                for (int h = 0; h < 2; h++) { // columns 64h .. 64h + 63: rows 64h.. of the W^T tile
                    reg_fence(t);
                    wgmma_fence();
#pragma unroll
                    for (int ks = 0; ks < 4; ks++)
                        wgmma_m64n64k32_fp8<true, false>(t, desc_advance(a_desc, 32 * ks), desc_advance(b_desc, 64 * 128 * h + 32 * ks), ks);
                    wgmma_commit();
                    wgmma_wait<0>();
                    reg_fence(t);
                    // register 4j + x of the 64-wide half is register 32h + 4j + x of the 128-wide layout
#pragma unroll
                    for (int i = 0; i < 32; i++) d[32 * h + i] += t[i];
                }
                if (threadIdx.x % 128 == 0) bar_arrive(&empty[s]); // this warpgroup is done with the slot
            }
            const int b = j % 2;
            if (j >= 2) bar_wait(&dg_empty[b], ((j / 2) + 1) & 1);
            ws_stage_bf16(sh.tile(b), d, ab, no_bias, r_lo, q);
            bar_arrive(&dg_full[b]);
        }
    } else {
        // epilogue warps: thread et handles the 4 x 4 blocks (row group br, column group bc = et % 32)
        // The pre-activation comes from global memory into registers one tile ahead: the loads of tile
        // j + 1 are issued once tile j's codes are staged, and land while they are stored and the MMAs run.
        constexpr int EPI_WARPS = WS_DY_EPI_THREADS / 32, ROW_ITERS = (32 + EPI_WARPS - 1) / EPI_WARPS;
        const int et = threadIdx.x - WS_EPI_THREAD0, bc = et % 32, ew = et / 32;
        const float s = __ldg(scale);
        uint2 pre_regs[ROW_ITERS][4]; // row group br = ew + EPI_WARPS i: rows 4 br + k, columns 4 bc .. 4 bc + 3
        auto load_pre = [&](int tile) {
            const int m0 = (tile / tiles_n) * 128, n0 = (tile % tiles_n) * 128;
#pragma unroll
            for (int i = 0; i < ROW_ITERS; i++) {
                const int br = ew + EPI_WARPS * i;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (br < 32) pre_regs[i][k] = __ldg(reinterpret_cast<const uint2*>(pre + (size_t)(m0 + 4 * br + k) * N + n0 + 4 * bc));
                }
            }
        };
        if (blockIdx.x < num_tiles) load_pre(blockIdx.x);
        uint32_t amax2 = 0; // (ws_round_bf16_amax)
        int j = 0;
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, j++) {
            const int m0 = (tile / tiles_n) * 128, n0 = (tile % tiles_n) * 128;
            const int b = j % 2;
            bar_wait(&dg_full[b], (j / 2) & 1);
            const __nv_bfloat16* tile_dg = sh.tile(b);
            if (dgelu_out != nullptr) ws_store_bf16<WS_DY_EPI_THREADS>(dgelu_out, tile_dg, m0, n0, N, et);
            epilogue_barrier<WS_DY_EPI_THREADS>(); // the staged codes and column sums of the tile before are stored
            float colsum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < ROW_ITERS; i++) { // rows 4 br .. 4 br + 3, columns 4 bc .. 4 bc + 3
                const int br = ew + EPI_WARPS * i;
                if (br >= 32) continue; // (ew >= 4 has 4 row groups, the others 5)
                const uint2* pre4 = pre_regs[i];
                uint32_t row_word[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int r = 4 * br + k;
                    const uint2 raw = *reinterpret_cast<const uint2*>(tile_dg + r * PRE_LD + 4 * bc);
                    const float2 g01 = ws_bf16x2_to_float2(raw.x), g23 = ws_bf16x2_to_float2(raw.y);
                    const float2 p01 = ws_bf16x2_to_float2(pre4[k].x), p23 = ws_bf16x2_to_float2(pre4[k].y);
                    const float2 a01 = ws_round_bf16_amax(g01.x * gelu_backward_factor<FACTOR>(p01.x),
                                                          g01.y * gelu_backward_factor<FACTOR>(p01.y), amax2);
                    const float2 a23 = ws_round_bf16_amax(g23.x * gelu_backward_factor<FACTOR>(p23.x),
                                                          g23.y * gelu_backward_factor<FACTOR>(p23.y), amax2);
                    colsum[0] += a01.x;
                    colsum[1] += a01.y;
                    colsum[2] += a23.x;
                    colsum[3] += a23.y;
                    row_word[k] = fp8_pack2<Fp8Kind::E5M2>(a01.x * s, a01.y * s) |
                                  ((uint32_t)fp8_pack2<Fp8Kind::E5M2>(a23.x * s, a23.y * s) << 16);
                    *reinterpret_cast<uint32_t*>(sh.codes + r * 128 + 4 * bc) = row_word[k];
                }
                fp8_tile_stage_columns<WS_CODES_T_STRIDE>(sh.codes_t, row_word, 4 * br, 4 * bc);
            }
            bar_arrive(&dg_empty[b]); // this thread is done reading the d(gelu output) tile
#pragma unroll
            for (int x = 0; x < 4; x++) s_colsum[ew * 128 + 4 * bc + x] = colsum[x];
            if (tile + gridDim.x < num_tiles) load_pre(tile + gridDim.x);
            epilogue_barrier<WS_DY_EPI_THREADS>(); // every code and column sum staged
            ws_store_codes<WS_DY_EPI_THREADS>(codes, codes_t, sh, m0, n0, M, N, et);
            if (et < 128) { // the tile's column sums: the epilogue warps' in a fixed order
                float sum = 0.0f;
#pragma unroll
                for (int w = 0; w < WS_DY_EPI_THREADS / 32; w++) sum += s_colsum[w * 128 + et];
                col_partials[(size_t)(m0 / 128) * N + n0 + et] = sum;
            }
        }
        uint32_t amax_bits = ws_amax_bits(amax2);
        for (int o = 16; o > 0; o >>= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, o));
        if (lane == 0 && amax_bits) atomicMax(amax, amax_bits);
    }
#else
    __trap();
#endif
}

// The fc layer's output gradient from the fc projection's dgrad, as above: dy (M x K E5M2), Wt (N x K E4M3,
// the fc projection's W^T), pre (M x N: the fc pre-activation, or the GELU factor itself, as `factor` says:
// GeluFactor ROUNDED or GIVEN, the FP8 recipe's two forms); codes (M x N) and codes_t (N x M) E5M2 at
// *scale, col_partials (M / 128 x N), amax raised; dgelu_out (may be null) gets d(gelu output); dy_t (may be
// null) gets dy's codes transposed (K x M: the fc projection's wgrad operand; its producer warp writes it,
// ws_produce_transpose_a). The caller checked supported() (and writes_x_t_supported(N, K) for dy_t) and
// finishes the bias gradient with bias_backward_reduce(.., col_partials, N, M / 128).
inline void fc_dy_ws(uint8_t* codes, uint8_t* codes_t, float* col_partials, const uint8_t* dy, const float* dy_inv,
                     const uint8_t* wt, const float* w_inv, const floatX* pre, GeluFactor factor, const float* scale,
                     uint32_t* amax, int M, int N, int K, cudaStream_t stream, floatX* dgelu_out = nullptr,
                     uint8_t* dy_t = nullptr) {
    using Ops = gemm_wgmma::Fp8Operands<true, false>;
    if (factor == GeluFactor::EXACT) {
        fprintf(stderr, "error: fc_dy_ws takes the FP8 recipe's GELU factor (GeluFactor ROUNDED or GIVEN)\n");
        exit(1);
    }
    const bool given = factor == GeluFactor::GIVEN;
    auto kernel = given ? with_dynamic_smem<fc_dy_ws_kernel<GeluFactor::GIVEN>>(WS_DY_SMEM_BYTES)
                        : with_dynamic_smem<fc_dy_ws_kernel<GeluFactor::ROUNDED>>(WS_DY_SMEM_BYTES);
    if (dy_t != nullptr && (!writes_x_t_supported(N, K) || (uintptr_t)dy_t % 16 != 0)) {
        fprintf(stderr, "error: fc_dy_ws cannot write dy^T for N=%d K=%d (needs K %% 32 == 0, N >= 4K, 16-byte alignment)\n", N, K);
        exit(1);
    }
    const CUtensorMap map_dy = gemm_wgmma::tensor_map<Ops>(dy, M, K, 128);
    const CUtensorMap map_wt = gemm_wgmma::tensor_map<Ops>(wt, N, K, 128);
    const int tiles = (M / 128) * (N / 128);
    const int grid = std::min(tiles, device_sm_count());
    kernel<<<grid, WS_DY_THREADS, WS_DY_SMEM_BYTES, stream>>>(map_dy, map_wt, M, N, K, dy_inv, w_inv, pre, codes, codes_t,
                                                             col_partials, scale, amax, dgelu_out, dy_t);
    cudaCheckLaunch();
}

// whether the fused kernels take this product: Hopper with sm_90a code, the shapes above
inline bool supported(int M, int N, int K, std::initializer_list<const void*> pointers) {
    for (const void* p : pointers) {
        if ((uintptr_t)p % 16 != 0) return false;
    }
    return M % gemm_wgmma::BM == 0 && N % 128 == 0 && K % 16 == 0 && gemm_wgmma::available();
}


} // namespace fp8_gemm
