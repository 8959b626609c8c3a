// fp8_gemm.cuh: FP8 GEMMs of the MLP whose epilogue writes the next GEMM's FP8 operands itself (Hopper,
// sm_90a): the kernel of gemm_wgmma.cuh with FP8 operands and a tile epilogue of its own.
//
// Why: with cuBLASLt's FP8 GEMMs, the FP8 recipe's fc layer writes its BF16 pre-activation and a pass
// then reads it back to write the fc projection's input as E4M3 codes of gelu(pre) in both layouts (2 + 2
// + 1 + 1 bytes a value). At d12 (B = 64, H100) that pass takes 0.32 ms against the GEMM's 0.27 ms
// (doc/perf.md, 2026-11-27). Here the GEMM's epilogue writes the pre-activation and both layouts of the
// codes from its accumulators (2 + 1 + 1 bytes a value), while the other CTA on the SM keeps the tensor
// cores busy.
//
// The fc forward (fp8_gemm_fc_gelu): x (M x K E4M3 codes, row-major) and W (N x K E4M3 codes, the fc
// weight), dequantization factors x_inv and w_inv (1 / their scales), bias (N):
//     pre[m][n]     = bf16(x_inv w_inv sum_k x[m][k] W[n][k] + bias[n])
//     g             = bf16(gelu(pre[m][n]))                    (as gelu_forward stores it)
//     codes[m][n]   = e4m3(g * s)      codes_t[n][m] = the same code      (s: the fc projection's input scale)
//     amax         |= max |g|          (atomicMax on the float bits)
// Exactly what cuBLASLt's GEMM followed by fp8_quantize_transpose(gelu_of_input) computes from the same
// pre-activation; the pre-activation itself may differ from cuBLASLt's in its last bit (other order of
// the sums), like any two GEMMs. Fast accumulation (the FP8 recipe's forward GEMMs have it), so the
// mainloop is gemm_wgmma's.
//
// Tile epilogue (128 x 128 outputs a CTA, 256 consumer threads): each thread computes its 64 values
// (gemm_wgmma::TilePosition says where), stages the BF16 pre-activation, the codes and the transposed
// codes in shared memory (the ring's slots, free by then), and after one barrier every thread stores 16
// bytes at a time: whole rows of pre and codes, and whole rows of codes_t (128 consecutive tokens of
// one feature). Shared memory: 128 x 136 x 2 + 2 x 128 x 144 = 70 KB of the ring's 96 KB.
//
// Shapes: M % 128 == 0, N % 128 == 0, K % 16 == 0 (a last partial K step reads zeros), pointers 16-byte
// aligned (supported()); every GPT-2/3 MLP at B*T a multiple of 128.
//
// Status (H100, 2026-11-27, build/test_fp8; doc/perf.md): exact, but not yet faster, so the FP8 recipe
// does not use it. d12's fc (M = 65536, N = 3072, K = 768): 0.611 ms against cuBLASLt's GEMM + the pass,
// 0.289 + 0.320 ms; d48's (16384, 6400, 1600): 0.463 against 0.269 + 0.163 ms. The same kernel with the
// plain BF16 store takes 0.327 / 0.333 ms: the epilogue adds about what the pass costs, which means the
// two CTAs of an SM do not hide one's epilogue under the other's MMAs (ncu, d12: issue slots 45% busy,
// no warp eligible 56% of the cycles, DRAM 36%). An epilogue of its own warps, running while the
// consumers compute the next tile (a persistent, warp-specialized kernel), is what it needs next.
#pragma once
#include "gemm_wgmma.cuh"
#include "fp8_quantize.cuh" // fp8_pack2, Fp8Kind
#include "gelu.cuh"

namespace fp8_gemm {

constexpr int PRE_LD = 128 + 8;   // BF16 per staged pre-activation row (16 bytes of padding: conflict-free pairs)
constexpr int CODE_LD = 128 + 16; // bytes per staged code row
constexpr int PRE_BYTES = 128 * PRE_LD * 2, CODE_BYTES = 128 * CODE_LD;

struct FcGeluEpilogue : gemm_wgmma::TileEpilogue {
    const float* x_inv;    // dequantization factors (device pointers)
    const float* w_inv;
    const floatX* bias;    // N entries, or null
    floatX* pre;           // M x N
    uint8_t* codes;        // M x N
    uint8_t* codes_t;      // N x M
    const float* scale;    // s of the codes
    uint32_t* amax;        // the codes' tensor amax (bits), raised with atomicMax

    template <class Cfg>
    __device__ __forceinline__ void tile(const float (&d)[Cfg::BN / 2], const gemm_wgmma::TilePosition& at,
                                         unsigned char* smem) const {
        static_assert(Cfg::BN == 128, "128-wide tiles");
        static_assert(PRE_BYTES + 2 * CODE_BYTES + 64 <= Cfg::STAGES * Cfg::STAGE_BYTES, "the staged tiles fit in the ring");
        __nv_bfloat16* s_pre = reinterpret_cast<__nv_bfloat16*>(smem);
        uint8_t* s_codes = smem + PRE_BYTES;
        uint8_t* s_codes_t = s_codes + CODE_BYTES;
        uint32_t* s_amax = reinterpret_cast<uint32_t*>(s_codes_t + CODE_BYTES);
        // every global load first, before any shared-memory store: the compiler cannot move a load across a
        // store it might alias, and one L2 round trip per column pair, in turn, stalled the whole epilogue
        // (ncu, d12: 38% of the cycles between instructions waited on those loads)
        const float ab = __ldg(x_inv) * __ldg(w_inv), s = __ldg(scale);
        __nv_bfloat162 bias2[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            bias2[j] = bias != nullptr ? __ldg(reinterpret_cast<const __nv_bfloat162*>(bias + at.n0 + 8 * j + 2 * at.q))
                                       : __floats2bfloat162_rn(0.0f, 0.0f);
        }
        uint32_t amax_bits = 0;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int c = 8 * j + 2 * at.q;
            const float b0 = __low2float(bias2[j]), b1 = __high2float(bias2[j]);
#pragma unroll
            for (int h = 0; h < 2; h++) { // rows r_lo and r_lo + 8
                const int row = at.r_lo + 8 * h;
                const __nv_bfloat162 p = __floats2bfloat162_rn(d[4 * j + 2 * h] * ab + b0, d[4 * j + 2 * h + 1] * ab + b1);
                *reinterpret_cast<__nv_bfloat162*>(s_pre + row * PRE_LD + c) = p;
                const float g0 = (float)(floatX)gelu_value(__low2float(p));
                const float g1 = (float)(floatX)gelu_value(__high2float(p));
                amax_bits = max(amax_bits, max(llmc::amax_bits(g0), llmc::amax_bits(g1)));
                const uint16_t two = fp8_pack2<Fp8Kind::E4M3>(g0 * s, g1 * s);
                *reinterpret_cast<uint16_t*>(s_codes + row * CODE_LD + c) = two;
                s_codes_t[c * CODE_LD + row] = (uint8_t)(two & 0xFF);
                s_codes_t[(c + 1) * CODE_LD + row] = (uint8_t)(two >> 8);
            }
        }
        for (int o = 16; o > 0; o >>= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, o));
        const int tid = threadIdx.x, warp = tid / 32;
        if (tid % 32 == 0) s_amax[warp] = amax_bits;
        gemm_wgmma::consumer_barrier();
        // pre: 128 rows x 256 bytes; codes: 128 rows x 128 bytes; codes_t: 128 feature rows x 128 tokens
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int chunk = tid + i * gemm_wgmma::CONSUMER_THREADS, r = chunk / 16, c8 = chunk % 16;
            const uint4 v = *reinterpret_cast<const uint4*>(s_pre + r * PRE_LD + 8 * c8);
            *reinterpret_cast<uint4*>(pre + (size_t)(at.m0 + r) * at.N + at.n0 + 8 * c8) = v;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int chunk = tid + i * gemm_wgmma::CONSUMER_THREADS, r = chunk / 8, c16 = chunk % 8;
            const uint4 v = *reinterpret_cast<const uint4*>(s_codes + r * CODE_LD + 16 * c16);
            *reinterpret_cast<uint4*>(codes + (size_t)(at.m0 + r) * at.N + at.n0 + 16 * c16) = v;
            const uint4 t = *reinterpret_cast<const uint4*>(s_codes_t + r * CODE_LD + 16 * c16);
            *reinterpret_cast<uint4*>(codes_t + (size_t)(at.n0 + r) * at.M + at.m0 + 16 * c16) = t;
        }
        if (tid == 0) {
            uint32_t m = 0;
            for (int w = 0; w < gemm_wgmma::CONSUMER_THREADS / 32; w++) m = max(m, s_amax[w]);
            if (m) atomicMax(amax, m);
        }
    }
};

// whether the fused kernels take this product: Hopper with sm_90a code, the shapes above
inline bool supported(int M, int N, int K, std::initializer_list<const void*> pointers) {
    for (const void* p : pointers) {
        if ((uintptr_t)p % 16 != 0) return false;
    }
    return M % gemm_wgmma::BM == 0 && N % 128 == 0 && K % 16 == 0 && gemm_wgmma::available();
}

// The fc forward above: x (M x K), W (N x K) E4M3 codes; pre (M x N) BF16, codes (M x N) and codes_t
// (N x M) E4M3 at *scale; amax raised. The caller checked supported().
inline void fc_gelu(floatX* pre, uint8_t* codes, uint8_t* codes_t, const uint8_t* x, const float* x_inv, const uint8_t* w,
                    const float* w_inv, const floatX* bias, const float* scale, uint32_t* amax, int M, int N, int K,
                    cudaStream_t stream) {
    FcGeluEpilogue epi;
    epi.x_inv = x_inv; epi.w_inv = w_inv; epi.bias = bias;
    epi.pre = pre; epi.codes = codes; epi.codes_t = codes_t; epi.scale = scale; epi.amax = amax;
    gemm_wgmma::launch<gemm_wgmma::Fp8Operands<false, false>, FcGeluEpilogue, gemm_wgmma::Tile128>(x, w, nullptr, M, N, K,
                                                                                                    epi, stream);
}

} // namespace fp8_gemm
