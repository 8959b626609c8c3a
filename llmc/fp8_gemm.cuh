// fp8_gemm.cuh: FP8 GEMMs of the MLP whose epilogue writes the next GEMM's FP8 operands itself (Hopper,
// sm_90a), on the FP8 operands of gemm_wgmma.cuh (its TMA ring, mbarriers and wgmma wrappers).
//
// Why: with cuBLASLt's FP8 GEMMs, the FP8 recipe's fc layer writes its BF16 pre-activation and a pass
// then reads it back to write the fc projection's input as E4M3 codes of gelu(pre) in both layouts (2 + 2
// + 1 + 1 bytes a value). At d12 (B = 64, H100) that pass takes 0.32 ms against the GEMM's 0.27 ms
// (doc/perf.md, 2026-11-27). Here the GEMM's epilogue writes the pre-activation and both layouts of the
// codes from its accumulators (2 + 1 + 1 bytes a value).
//
// The fc forward (fc_gelu_ws): x (M x K E4M3 codes, row-major) and W (N x K E4M3 codes, the fc weight),
// dequantization factors x_inv and w_inv (1 / their scales), bias (N):
//     pre[m][n]     = bf16(x_inv w_inv sum_k x[m][k] W[n][k] + bias[n])
//     g             = bf16(gelu(pre[m][n]))                    (as gelu_forward stores it)
//     codes[m][n]   = e4m3(g * s)      codes_t[n][m] = the same code      (s: the fc projection's input scale)
//     amax         |= max |g|          (atomicMax on the float bits)
// Exactly what cuBLASLt's GEMM followed by fp8_quantize_transpose(gelu_of_input) computes from the same
// pre-activation; the pre-activation itself may differ from cuBLASLt's in its last bit (other order of
// the sums), like any two GEMMs. Fast accumulation (the FP8 recipe's forward GEMMs have it).
//
// Shapes: M % 128 == 0, N % 128 == 0, K % 16 == 0 (a last partial K step reads zeros), pointers 16-byte
// aligned (supported()); every GPT-2/3 MLP at B*T a multiple of 128.
//
// Status (H100, 2026-11-27, build/test_fp8; doc/perf.md): exact (the checks above); d12's fc (M = 65536,
// N = 3072, K = 768) in 0.488 ms against cuBLASLt's GEMM + the pass, 0.291 + 0.319 ms (0.80x), d48's
// (16384, 6400, 1600) in 0.434 against 0.271 + 0.165 ms (parity); the epilogue warps are still the slower
// side at d12. The FP8 recipe does not use it yet (its model-level tests and step times are the next step).
// A first form, gemm_wgmma's kernel itself with the epilogue between each CTA's MMAs (two CTAs an SM),
// was exact too but no faster than cuBLASLt + the pass (0.611 against 0.609 ms at d12, 0.463 against 0.433
// at d48: the two CTAs did not hide one's epilogue under the other's MMAs), and is gone.
#pragma once
#include "gemm_wgmma.cuh"
#include "fp8_quantize.cuh" // fp8_pack2, Fp8Kind
#include "gelu.cuh"

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
//   epilogue   warps 9-16 (256 threads): from the pre tile, the pre-activation to global memory, then
//              gelu, the E4M3 codes (rows staged, columns staged through byte permutes, as the quantize
//              kernels do) and the amax; both code layouts to global memory.
// Two mbarriers a pre tile hand it over: pre_full (256 consumer arrivals) and pre_empty (256 epilogue
// arrivals); the epilogue warps sync among themselves with named barrier 2. Shared memory: the ring
// 96 KB, two pre tiles 68 KB, the staged codes 32 KB.
constexpr int WS_STAGES = 3, WS_EPI_THREAD0 = 288, WS_EPI_THREADS = 256, WS_THREADS = WS_EPI_THREAD0 + WS_EPI_THREADS;
constexpr int WS_CODES_T_STRIDE = 33; // words per staged code column (32 row groups + 1: fewer bank conflicts)
constexpr int WS_RING_BYTES = WS_STAGES * 32768;
constexpr int WS_CODES_BYTES = 128 * 128, WS_CODES_T_BYTES = 128 * WS_CODES_T_STRIDE * 4;
constexpr int WS_SMEM_BYTES = WS_RING_BYTES + 2 * PRE_BYTES + WS_CODES_BYTES + WS_CODES_T_BYTES + 1024 + 256;

__device__ __forceinline__ void epilogue_barrier() { asm volatile("bar.sync 2, %0;\n" :: "n"(WS_EPI_THREADS) : "memory"); }

__global__ void __launch_bounds__(WS_THREADS, 1)
fc_gelu_ws_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w, int M, int N, int K,
                  const float* __restrict__ x_inv, const float* __restrict__ w_inv, const floatX* __restrict__ bias,
                  floatX* __restrict__ pre, uint8_t* __restrict__ codes, uint8_t* __restrict__ codes_t,
                  const float* __restrict__ scale, uint32_t* __restrict__ amax) {
#if GEMM_WGMMA_DEVICE
    using namespace gemm_wgmma;
    using Ops = Fp8Operands<false, false>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __nv_bfloat16* s_pre = reinterpret_cast<__nv_bfloat16*>(smem + WS_RING_BYTES); // two tiles of 128 x PRE_LD
    uint8_t* s_codes = smem + WS_RING_BYTES + 2 * PRE_BYTES;
    uint32_t* s_codes_t = reinterpret_cast<uint32_t*>(s_codes + WS_CODES_BYTES);
    uint64_t* full = reinterpret_cast<uint64_t*>(s_codes + WS_CODES_BYTES + WS_CODES_T_BYTES);
    uint64_t* empty = full + WS_STAGES;
    uint64_t* pre_full = empty + WS_STAGES;
    uint64_t* pre_empty = pre_full + 2;
    const int tiles_n = N / 128, num_tiles = (M / 128) * tiles_n;
    const int k_steps = (K + Ops::ELEMS_PER_STEP - 1) / Ops::ELEMS_PER_STEP;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WS_STAGES; s++) {
            bar_init(&full[s], 1);
            bar_init(&empty[s], 2);
        }
        for (int b = 0; b < 2; b++) {
            bar_init(&pre_full[b], CONSUMER_THREADS);
            bar_init(&pre_empty[b], WS_EPI_THREADS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == 8) {
        // producer
        if (lane == 0) {
            int it = 0; // K steps issued so far, over all of this CTA's tiles
            for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
                const int m0 = (tile / tiles_n) * 128, n0 = (tile % tiles_n) * 128;
                for (int kt = 0; kt < k_steps; kt++, it++) {
                    const int s = it % WS_STAGES;
                    if (it >= WS_STAGES) bar_wait(&empty[s], ((it / WS_STAGES) + 1) & 1);
                    unsigned char* slot = smem + s * 32768;
                    bar_expect_bytes(&full[s], 32768);
                    tma_load_2d(slot, &map_x, kt * Ops::ELEMS_PER_STEP, m0, &full[s]);
                    tma_load_2d(slot + A_TILE_BYTES, &map_w, kt * Ops::ELEMS_PER_STEP, n0, &full[s]);
                }
            }
        }
    } else if (warp < 8) {
        // consumers: warpgroup g computes rows 64g..64g+63 of each tile
        const int g = warp / 4, wq = warp % 4, gq = lane / 4, q = lane % 4;
        const int r_lo = 64 * g + 16 * wq + gq;
        const float ab = __ldg(x_inv) * __ldg(w_inv);
        int it = 0, j = 0;
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, j++) {
            const int n0 = (tile % tiles_n) * 128;
            __nv_bfloat162 bias2[16];
#pragma unroll
            for (int c = 0; c < 16; c++) {
                bias2[c] = bias != nullptr ? __ldg(reinterpret_cast<const __nv_bfloat162*>(bias + n0 + 8 * c + 2 * q))
                                           : __floats2bfloat162_rn(0.0f, 0.0f);
            }
            float d[64];
#pragma unroll
            for (int i = 0; i < 64; i++) d[i] = 0.0f;
            for (int kt = 0; kt < k_steps; kt++, it++) {
                const int s = it % WS_STAGES;
                bar_wait(&full[s], (it / WS_STAGES) & 1);
                const unsigned char* slot = smem + s * 32768;
                reg_fence(d);
                wgmma_fence();
                mma_k_step<Ops, 128>(d, slot + g * (64 * 128), slot + A_TILE_BYTES);
                wgmma_commit();
                wgmma_wait<1>();
                reg_fence(d);
                if (kt > 0 && threadIdx.x % 128 == 0) bar_arrive(&empty[(it - 1) % WS_STAGES]);
            }
            wgmma_wait<0>();
            reg_fence(d);
            if (threadIdx.x % 128 == 0) bar_arrive(&empty[(it - 1) % WS_STAGES]);
            // the pre-activation into pre tile j % 2, once the epilogue has finished with tile j - 2
            const int b = j % 2;
            if (j >= 2) bar_wait(&pre_empty[b], ((j / 2) + 1) & 1);
            __nv_bfloat16* tile_pre = s_pre + b * (128 * PRE_LD);
#pragma unroll
            for (int c = 0; c < 16; c++) {
                const int col = 8 * c + 2 * q;
                const float b0 = __low2float(bias2[c]), b1 = __high2float(bias2[c]);
                *reinterpret_cast<__nv_bfloat162*>(tile_pre + r_lo * PRE_LD + col) =
                    __floats2bfloat162_rn(d[4 * c] * ab + b0, d[4 * c + 1] * ab + b1);
                *reinterpret_cast<__nv_bfloat162*>(tile_pre + (r_lo + 8) * PRE_LD + col) =
                    __floats2bfloat162_rn(d[4 * c + 2] * ab + b0, d[4 * c + 3] * ab + b1);
            }
            bar_arrive(&pre_full[b]);
        }
    } else {
        // epilogue warpgroup: thread et handles the 4 x 4 blocks (row group br, column group bc = et % 32)
        const int et = threadIdx.x - WS_EPI_THREAD0, bc = et % 32;
        const float s = __ldg(scale);
        uint32_t amax_bits = 0;
        int j = 0;
        for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x, j++) {
            const int m0 = (tile / tiles_n) * 128, n0 = (tile % tiles_n) * 128;
            const int b = j % 2;
            bar_wait(&pre_full[b], (j / 2) & 1);
            const __nv_bfloat16* tile_pre = s_pre + b * (128 * PRE_LD);
            // the pre-activation: 128 rows x 256 bytes, 16 bytes a thread at a time
#pragma unroll 4
            for (int i = 0; i < 2048 / WS_EPI_THREADS; i++) {
                const int chunk = et + i * WS_EPI_THREADS, r = chunk / 16, c8 = chunk % 16;
                const uint4 v = *reinterpret_cast<const uint4*>(tile_pre + r * PRE_LD + 8 * c8);
                *reinterpret_cast<uint4*>(pre + (size_t)(m0 + r) * N + n0 + 8 * c8) = v;
            }
            epilogue_barrier(); // the staged codes of the tile before are stored
#pragma unroll 2
            for (int i = 0; i < 1024 / WS_EPI_THREADS; i++) {
                const int br = et / 32 + (WS_EPI_THREADS / 32) * i; // rows 4 br .. 4 br + 3, columns 4 bc .. 4 bc + 3
                uint32_t row_word[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int r = 4 * br + k;
                    const uint2 raw = *reinterpret_cast<const uint2*>(tile_pre + r * PRE_LD + 4 * bc);
                    const __nv_bfloat162 p01 = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
                    const __nv_bfloat162 p23 = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
                    const float g0 = (float)(floatX)gelu_value(__low2float(p01));
                    const float g1 = (float)(floatX)gelu_value(__high2float(p01));
                    const float g2 = (float)(floatX)gelu_value(__low2float(p23));
                    const float g3 = (float)(floatX)gelu_value(__high2float(p23));
                    amax_bits = max(amax_bits, max(max(llmc::amax_bits(g0), llmc::amax_bits(g1)),
                                                   max(llmc::amax_bits(g2), llmc::amax_bits(g3))));
                    row_word[k] = fp8_pack2<Fp8Kind::E4M3>(g0 * s, g1 * s) | ((uint32_t)fp8_pack2<Fp8Kind::E4M3>(g2 * s, g3 * s) << 16);
                    *reinterpret_cast<uint32_t*>(s_codes + r * 128 + 4 * bc) = row_word[k];
                }
                // the 4 row words -> 4 column words (byte k = row 4 br + k), at s_codes_t[column][br]
                fp8_tile_stage_columns<WS_CODES_T_STRIDE>(s_codes_t, row_word, 4 * br, 4 * bc);
            }
            bar_arrive(&pre_empty[b]); // this thread is done reading the pre tile
            epilogue_barrier();        // every code staged
#pragma unroll 4
            for (int i = 0; i < 1024 / WS_EPI_THREADS; i++) {
                const int chunk = et + i * WS_EPI_THREADS, r = chunk / 8, part = chunk % 8;
                const uint4 v = *reinterpret_cast<const uint4*>(s_codes + r * 128 + 16 * part);
                *reinterpret_cast<uint4*>(codes + (size_t)(m0 + r) * N + n0 + 16 * part) = v;
                const uint32_t* w = s_codes_t + r * WS_CODES_T_STRIDE + 4 * part; // column r, rows 16 part ..
                *reinterpret_cast<uint4*>(codes_t + (size_t)(n0 + r) * M + m0 + 16 * part) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
        for (int o = 16; o > 0; o >>= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, o));
        if (lane == 0 && amax_bits) atomicMax(amax, amax_bits);
    }
#else
    __trap();
#endif
}

// The fc forward above: x (M x K), W (N x K) E4M3 codes; pre (M x N) BF16, codes (M x N) and codes_t
// (N x M) E4M3 at *scale; amax raised. The caller checked supported().
inline void fc_gelu_ws(floatX* pre, uint8_t* codes, uint8_t* codes_t, const uint8_t* x, const float* x_inv, const uint8_t* w,
                       const float* w_inv, const floatX* bias, const float* scale, uint32_t* amax, int M, int N, int K,
                       cudaStream_t stream) {
    using Ops = gemm_wgmma::Fp8Operands<false, false>;
    static bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(fc_gelu_ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WS_SMEM_BYTES));
        configured = true;
    }
    const CUtensorMap map_x = gemm_wgmma::tensor_map<Ops>(x, M, K, 128);
    const CUtensorMap map_w = gemm_wgmma::tensor_map<Ops>(w, N, K, 128);
    const int tiles = (M / 128) * (N / 128);
    const int grid = std::min(tiles, device_sm_count());
    fc_gelu_ws_kernel<<<grid, WS_THREADS, WS_SMEM_BYTES, stream>>>(map_x, map_w, M, N, K, x_inv, w_inv, bias, pre, codes,
                                                                   codes_t, scale, amax);
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
