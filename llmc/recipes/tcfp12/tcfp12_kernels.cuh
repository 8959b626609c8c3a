// recipes/tcfp12/tcfp12_kernels.cuh: the GPU side of the TCFP-12 format (formats/tcfp12.h): the weight split, the
// layouts the dual GEMMs read, and the fresh power-of-two quantization of activations and gradients.
//
// The split. Every kernel below composes the __host__ __device__ element functions of formats/tcfp12.h in
// the order tcfp12_split_group does, so the codes, scale codes, EF buffer and PDDS state equal the
// CPU reference bit for bit (build/test_tcfp12 checks every option). Maxima and counts are order-
// independent, so how the work is cut into threads does not matter.
//   * Per block (B = 32, 64, 128 consecutive values of a row): one warp per block, which holds the
//     block in registers: W (and the EF buffer) is read once and W_hi, W_lo, both scale codes and
//     EF' are written once (tcfp12_split_blocks). The SRR bits are drawn from the element's flat
//     index, as on the CPU.
//   * Per tensor: the scales depend on the whole tensor, so it takes three passes over it
//     (amax of W + EF; W_hi codes and the residual's amax; W_lo codes and EF'), with one-thread
//     kernels between them that turn the maxima into scale codes (and run the PDDS update). The
//     weights are split once per optimizer step, so the passes cost little next to the GEMMs.
//
// Telemetry of a split (Tcfp12SplitStats, one per weight matrix): the maxima, saturation counts,
// the W_lo codes that are not zero, the groups that got the zero-residual sentinel, and the sums
// of EF'^2 and W_eff^2 (the relative split error).
//
// Activations and gradients are quantized afresh for every GEMM with a power-of-two scale from
// their current amax: s = 2^ceil(log2(amax / FP8_MAX)) as an E8M0 code, the rule the weights use
// (tcfp12_scale_code; E5M2's 57344 = 448 * 2^7). The quantization itself is formats/fp8_quantize.cuh's.
#pragma once
#include "llmc/cuda_common.h"
#include "llmc/formats/fp8_quantize.cuh"
#include "llmc/matmul.cuh"
#include "llmc/formats/tcfp12.h"

struct Tcfp12SplitStats {
    uint32_t amax_bits;             // max |W_eff| (bits of a non-negative float)
    uint32_t lo_amax_bits;          // max |R|
    uint32_t hi_code, lo_code;      // per tensor: this split's scale codes (before the sentinel)
    unsigned long long hi_saturated, lo_saturated, lo_nonzero, zero_residual_groups;
    double err2, weff2;             // sum of EF'^2 and of W_eff^2
};

// A quantization scale slot: [0] the factor to quantize with (1/s), [4] the factor the GEMM
// dequantizes with (s). 16-byte aligned, as cuBLASLt wants its scale pointers.
static const int TCFP_SCALE_SLOT = 8; // floats

template <typename T> __device__ __forceinline__ float tcfp12_load(const T* p, long long i) { return (float)p[i]; }

// Block-level sums of the split's statistics, then one atomic each per block (one per warp made the
// per-tensor passes ~10x slower than their memory traffic: thousands of double atomics on one address)
// (a plain aggregate, so that it can live in shared memory; zero it with `Tcfp12Partial p = {};`)
struct Tcfp12Partial {
    float amax, lo_amax;
    uint32_t hi_sat, lo_sat, lo_nonzero, zero_groups;
    double err2, weff2;
};

__device__ inline void tcfp12_commit(Tcfp12Partial p, Tcfp12SplitStats* st) {
    for (int o = 16; o > 0; o >>= 1) {
        p.amax = llmc::tcfp12_amax_update(p.amax, __shfl_xor_sync(0xffffffffu, p.amax, o));
        p.lo_amax = llmc::tcfp12_amax_update(p.lo_amax, __shfl_xor_sync(0xffffffffu, p.lo_amax, o));
        p.hi_sat += __shfl_xor_sync(0xffffffffu, p.hi_sat, o);
        p.lo_sat += __shfl_xor_sync(0xffffffffu, p.lo_sat, o);
        p.lo_nonzero += __shfl_xor_sync(0xffffffffu, p.lo_nonzero, o);
        p.zero_groups += __shfl_xor_sync(0xffffffffu, p.zero_groups, o);
        p.err2 += __shfl_xor_sync(0xffffffffu, p.err2, o);
        p.weff2 += __shfl_xor_sync(0xffffffffu, p.weff2, o);
    }
    // then across the block's warps (blockDim.x <= 256), so that only one thread per block does atomics
    __shared__ Tcfp12Partial warp_part[8];
    const int warp = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) warp_part[warp] = p;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < (int)blockDim.x / 32; w++) {
        const Tcfp12Partial& q = warp_part[w];
        p.amax = llmc::tcfp12_amax_update(p.amax, q.amax);
        p.lo_amax = llmc::tcfp12_amax_update(p.lo_amax, q.lo_amax);
        p.hi_sat += q.hi_sat; p.lo_sat += q.lo_sat; p.lo_nonzero += q.lo_nonzero; p.zero_groups += q.zero_groups;
        p.err2 += q.err2; p.weff2 += q.weff2;
    }
    if (p.amax > 0.0f) atomicMax(&st->amax_bits, llmc::float_bits(p.amax));
    if (p.lo_amax > 0.0f) atomicMax(&st->lo_amax_bits, llmc::float_bits(p.lo_amax));
    if (p.hi_sat) atomicAdd(&st->hi_saturated, (unsigned long long)p.hi_sat);
    if (p.lo_sat) atomicAdd(&st->lo_saturated, (unsigned long long)p.lo_sat);
    if (p.lo_nonzero) atomicAdd(&st->lo_nonzero, (unsigned long long)p.lo_nonzero);
    if (p.zero_groups) atomicAdd(&st->zero_residual_groups, (unsigned long long)p.zero_groups);
    atomicAdd(&st->err2, p.err2);
    atomicAdd(&st->weff2, p.weff2);
}

// ---- per block: one warp per group of B values, held in registers ----------------------------
// Lane l holds elements base + j*32 + l (j < B/32): coalesced loads and stores.
template <typename InT, int B>
__global__ void __launch_bounds__(256) tcfp12_split_blocks_kernel(const InT* w, float* ef, float* pdds_ema,
                                                                  long long groups, bool srr, uint32_t srr_seed,
                                                                  uint8_t* hi, uint8_t* lo, uint8_t* hi_scale,
                                                                  uint8_t* lo_scale, Tcfp12SplitStats* st) {
    constexpr int V = B / 32;
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    Tcfp12Partial part = {};
    for (long long g = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; g < groups; g += warps) {
        const long long base = g * B;
        float we[V];
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            const long long e = base + j * 32 + lane;
            we[j] = ef ? tcfp12_load(w, e) + ef[e] : tcfp12_load(w, e);
            amax = llmc::tcfp12_amax_update(amax, we[j]);
        }
        for (int o = 16; o > 0; o >>= 1) amax = llmc::tcfp12_amax_update(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        uint8_t hi_code, lo_code = 0;
        if (pdds_ema) {
            const float ema = llmc::tcfp12_pdds_ema_update(pdds_ema[g], amax);
            hi_code = llmc::tcfp12_scale_code(ema);
            lo_code = llmc::tcfp12_pdds_lo_code(hi_code, ema);
            __syncwarp();
            if (lane == 0) pdds_ema[g] = ema;
        } else {
            hi_code = llmc::tcfp12_scale_code(amax);
        }
        const float inv_hi = llmc::tcfp12_inv_scale(hi_code);
        float r[V];
        uint8_t hc[V];
        float lo_amax = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            hc[j] = llmc::tcfp12_encode_hi(we[j], hi_code);
            part.hi_sat += (!(llmc::abs_bits(we[j] * inv_hi) <= llmc::kTcfp12Max) && we[j] == we[j]) ? 1u : 0u;
            r[j] = we[j] - llmc::tcfp12_decode(hc[j], hi_code);
            lo_amax = llmc::tcfp12_amax_update(lo_amax, r[j]);
        }
        for (int o = 16; o > 0; o >>= 1) lo_amax = llmc::tcfp12_amax_update(lo_amax, __shfl_xor_sync(0xffffffffu, lo_amax, o));
        if (!pdds_ema) lo_code = llmc::tcfp12_scale_code(lo_amax);
        const float inv_lo = llmc::tcfp12_inv_scale(lo_code);
        uint32_t nonzero = 0;
#pragma unroll
        for (int j = 0; j < V; j++) {
            const long long e = base + j * 32 + lane;
            const uint32_t bits = srr ? llmc::tcfp12_srr_bits(srr_seed, (uint32_t)e) : 0u;
            const uint8_t c = llmc::tcfp12_encode_lo(r[j], lo_code, srr, bits);
            part.lo_sat += (!(llmc::abs_bits(r[j] * inv_lo) <= llmc::kTcfp12Max) && r[j] == r[j]) ? 1u : 0u;
            nonzero += llmc::tcfp12_code_is_zero(c) ? 0u : 1u;
            const float err = r[j] - llmc::tcfp12_decode(c, lo_code);
            if (ef) ef[e] = err;
            part.err2 += (double)err * err;
            part.weff2 += (double)we[j] * we[j];
            hi[e] = hc[j];
            lo[e] = c;
        }
        part.lo_nonzero += nonzero;
        for (int o = 16; o > 0; o >>= 1) nonzero += __shfl_xor_sync(0xffffffffu, nonzero, o);
        if (lane == 0) {
            hi_scale[g] = hi_code;
            lo_scale[g] = nonzero == 0 ? llmc::kTcfp12ZeroResidual : lo_code;
            part.zero_groups += nonzero == 0 ? 1u : 0u;
        }
        part.amax = llmc::tcfp12_amax_update(part.amax, amax);
        part.lo_amax = llmc::tcfp12_amax_update(part.lo_amax, lo_amax);
    }
    tcfp12_commit(part, st);
}

// ---- per tensor: three passes, with the scale codes decided between them ------------------------
enum Tcfp12TensorPass { TCFP_PASS_AMAX = 0, TCFP_PASS_HI = 1, TCFP_PASS_LO = 2 };

template <typename InT, int PASS>
__global__ void __launch_bounds__(256) tcfp12_split_tensor_kernel(const InT* w, float* ef, long long n, bool srr,
                                                                  uint32_t srr_seed, uint8_t* hi, uint8_t* lo,
                                                                  Tcfp12SplitStats* st) {
    const uint8_t hi_code = PASS == TCFP_PASS_AMAX ? 0 : (uint8_t)st->hi_code;
    const uint8_t lo_code = PASS == TCFP_PASS_LO ? (uint8_t)st->lo_code : 0;
    const float inv_hi = llmc::tcfp12_inv_scale(hi_code), inv_lo = llmc::tcfp12_inv_scale(lo_code);
    Tcfp12Partial part = {};
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const float we = ef ? tcfp12_load(w, e) + ef[e] : tcfp12_load(w, e);
        if (PASS == TCFP_PASS_AMAX) {
            part.amax = llmc::tcfp12_amax_update(part.amax, we);
        } else if (PASS == TCFP_PASS_HI) {
            const uint8_t c = llmc::tcfp12_encode_hi(we, hi_code);
            hi[e] = c;
            part.hi_sat += (!(llmc::abs_bits(we * inv_hi) <= llmc::kTcfp12Max) && we == we) ? 1u : 0u;
            part.lo_amax = llmc::tcfp12_amax_update(part.lo_amax, we - llmc::tcfp12_decode(c, hi_code));
        } else {
            const float r = we - llmc::tcfp12_decode(hi[e], hi_code);
            const uint32_t bits = srr ? llmc::tcfp12_srr_bits(srr_seed, (uint32_t)e) : 0u;
            const uint8_t c = llmc::tcfp12_encode_lo(r, lo_code, srr, bits);
            lo[e] = c;
            part.lo_sat += (!(llmc::abs_bits(r * inv_lo) <= llmc::kTcfp12Max) && r == r) ? 1u : 0u;
            part.lo_nonzero += llmc::tcfp12_code_is_zero(c) ? 0u : 1u;
            const float err = r - llmc::tcfp12_decode(c, lo_code);
            if (ef) ef[e] = err;
            part.err2 += (double)err * err;
            part.weff2 += (double)we * we;
        }
    }
    tcfp12_commit(part, st);
}

// after the amax pass: the W_hi scale code (PDDS: from the updated EMA, which also predicts W_lo's)
__global__ void tcfp12_tensor_hi_scale_kernel(Tcfp12SplitStats* st, float* pdds_ema) {
    const float amax = llmc::bits_float(st->amax_bits);
    if (pdds_ema) {
        const float ema = llmc::tcfp12_pdds_ema_update(*pdds_ema, amax);
        *pdds_ema = ema;
        st->hi_code = llmc::tcfp12_scale_code(ema);
        st->lo_code = llmc::tcfp12_pdds_lo_code((uint8_t)st->hi_code, ema);
    } else {
        st->hi_code = llmc::tcfp12_scale_code(amax);
    }
}

// after the W_hi pass: the fresh W_lo scale code (PDDS predicted it already)
__global__ void tcfp12_tensor_lo_scale_kernel(Tcfp12SplitStats* st, bool pdds) {
    if (!pdds) st->lo_code = llmc::tcfp12_scale_code(llmc::bits_float(st->lo_amax_bits));
}

// after the W_lo pass: the scale codes, with the sentinel when every W_lo code is zero
__global__ void tcfp12_tensor_finish_kernel(Tcfp12SplitStats* st, uint8_t* hi_scale, uint8_t* lo_scale) {
    const bool zero = st->lo_nonzero == 0;
    hi_scale[0] = (uint8_t)st->hi_code;
    lo_scale[0] = zero ? llmc::kTcfp12ZeroResidual : (uint8_t)st->lo_code;
    st->zero_residual_groups = zero ? 1 : 0;
}

// ---- host wrappers of the split ------------------------------------------------------------------
// Per tensor, the split in its four phases: 0 the amax pass, 1 the W_hi scale and the W_hi pass, 2 the
// W_lo scale and the W_lo pass, 3 the scale codes with the sentinel. Under ZeRO-1 a process splits its
// own piece of a weight (recipes/tcfp12/recipe.h), and the processes combine st's maxima after phases 0 and 1
// and its counts after phase 2 (tcfp12_stats_pack_kernel), so that every piece is split with the
// scales of the whole tensor. st is zeroed in phase 0. (SRR draws its bits from the element's index in
// w, so a piece would draw other bits than the whole tensor; SRR keeps no EF buffer, and only the EF
// buffer is cut into pieces.)
template <typename InT>
inline void tcfp12_split_tensor_phase(int phase, const InT* w, long long n, const llmc::Tcfp12Options& o, float* ef,
                                      float* pdds_ema, uint32_t srr_seed, uint8_t* hi, uint8_t* lo, uint8_t* hi_scale,
                                      uint8_t* lo_scale, Tcfp12SplitStats* st, cudaStream_t stream) {
    const bool srr = o.srr != 0;
    const int grid = fp8_grid_size(n, 256);
    if (phase == 0) {
        cudaCheck(cudaMemsetAsync(st, 0, sizeof(Tcfp12SplitStats), stream));
        tcfp12_split_tensor_kernel<InT, TCFP_PASS_AMAX><<<grid, 256, 0, stream>>>(w, ef, n, srr, srr_seed, hi, lo, st);
    } else if (phase == 1) {
        tcfp12_tensor_hi_scale_kernel<<<1, 1, 0, stream>>>(st, o.pdds ? pdds_ema : nullptr);
        tcfp12_split_tensor_kernel<InT, TCFP_PASS_HI><<<grid, 256, 0, stream>>>(w, ef, n, srr, srr_seed, hi, lo, st);
    } else if (phase == 2) {
        tcfp12_tensor_lo_scale_kernel<<<1, 1, 0, stream>>>(st, o.pdds != 0);
        tcfp12_split_tensor_kernel<InT, TCFP_PASS_LO><<<grid, 256, 0, stream>>>(w, ef, n, srr, srr_seed, hi, lo, st);
    } else {
        tcfp12_tensor_finish_kernel<<<1, 1, 0, stream>>>(st, hi_scale, lo_scale);
    }
    cudaCheckLaunch();
}

// Split W (rows x cols, row-major; float or floatX) under the options o (valid: tcfp12_validate).
// ef: rows*cols floats (iff tcfp12_uses_ef), updated in place; pdds_ema: one float per group (iff
// o.pdds); hi, lo: rows*cols codes; hi_scale, lo_scale: one code per group; st: zeroed here.
template <typename InT>
inline void tcfp12_split(const InT* w, int rows, int cols, const llmc::Tcfp12Options& o, float* ef, float* pdds_ema,
                         uint32_t srr_seed, uint8_t* hi, uint8_t* lo, uint8_t* hi_scale, uint8_t* lo_scale,
                         Tcfp12SplitStats* st, cudaStream_t stream) {
    const long long n = (long long)rows * cols;
    if (o.block_size == 0) {
        for (int phase = 0; phase < 4; phase++)
            tcfp12_split_tensor_phase(phase, w, n, o, ef, pdds_ema, srr_seed, hi, lo, hi_scale, lo_scale, st, stream);
        return;
    }
    cudaCheck(cudaMemsetAsync(st, 0, sizeof(Tcfp12SplitStats), stream));
    const bool srr = o.srr != 0;
    const long long groups = n / o.block_size;
    const int grid = fp8_grid_size(groups * 32, 256);
    float* pd = o.pdds ? pdds_ema : nullptr;
    if (o.block_size == 32)
        tcfp12_split_blocks_kernel<InT, 32><<<grid, 256, 0, stream>>>(w, ef, pd, groups, srr, srr_seed, hi, lo, hi_scale, lo_scale, st);
    else if (o.block_size == 64)
        tcfp12_split_blocks_kernel<InT, 64><<<grid, 256, 0, stream>>>(w, ef, pd, groups, srr, srr_seed, hi, lo, hi_scale, lo_scale, st);
    else
        tcfp12_split_blocks_kernel<InT, 128><<<grid, 256, 0, stream>>>(w, ef, pd, groups, srr, srr_seed, hi, lo, hi_scale, lo_scale, st);
    cudaCheckLaunch();
}

// ZeRO-1: what the processes of a sharded split combine, per weight (n statistics): the two maxima
// (bits of non-negative floats, combined by maximum: maxima[i] = amax, maxima[n + i] = lo_amax) and
// the six sums (as doubles, combined by sum; the counts stay below 2^53, so they are exact:
// sums[6i ...] = hi_saturated, lo_saturated, lo_nonzero, zero_residual_groups, err2, weff2).
// unpack = false copies them out of the statistics, true back in.
__global__ void tcfp12_stats_pack_kernel(Tcfp12SplitStats* st, int n, uint32_t* maxima, double* sums, bool unpack) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Tcfp12SplitStats& s = st[i];
    if (maxima && !unpack) { maxima[i] = s.amax_bits; maxima[n + i] = s.lo_amax_bits; }
    if (maxima && unpack) { s.amax_bits = maxima[i]; s.lo_amax_bits = maxima[n + i]; }
    double* d = sums ? sums + 6 * (size_t)i : nullptr;
    if (d && !unpack) {
        d[0] = (double)s.hi_saturated; d[1] = (double)s.lo_saturated; d[2] = (double)s.lo_nonzero;
        d[3] = (double)s.zero_residual_groups; d[4] = s.err2; d[5] = s.weff2;
    }
    if (d && unpack) {
        s.hi_saturated = (unsigned long long)d[0]; s.lo_saturated = (unsigned long long)d[1];
        s.lo_nonzero = (unsigned long long)d[2]; s.zero_residual_groups = (unsigned long long)d[3];
        s.err2 = d[4]; s.weff2 = d[5];
    }
}

// ---- what the GEMMs read ---------------------------------------------------------------------------
// Per tensor: the dequantization factors s_hi and s_lo (0 under the sentinel) into two scale slots.
__global__ void tcfp12_tensor_factors_kernel(float* hi_slot, float* lo_slot, const uint8_t* hi_scale,
                                             const uint8_t* lo_scale) {
    hi_slot[4] = llmc::tcfp12_scale(hi_scale[0]);
    lo_slot[4] = llmc::tcfp12_scale(lo_scale[0]);
}

// Byte transpose of a (rows x cols) code matrix into (cols x rows), through 32 x 32 tiles
// (the dgrad GEMM wants W^T K-major). blockDim (32, 8).
__global__ void tcfp12_transpose_codes_kernel(uint8_t* out_t, const uint8_t* in, int rows, int cols) {
    __shared__ uint8_t tile[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = in[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out_t[(size_t)c * rows + r] = tile[threadIdx.x][i];
    }
}

inline void tcfp12_transpose_codes(uint8_t* out_t, const uint8_t* in, int rows, int cols, cudaStream_t stream) {
    tcfp12_transpose_codes_kernel<<<dim3(ceil_div(cols, 32), ceil_div(rows, 32)), dim3(32, 8), 0, stream>>>(out_t, in, rows, cols);
    cudaCheckLaunch();
}

// Block scales: deq(W_hi) and deq(W_lo) as BF16, exactly (an E4M3 value times a power of two has
// at most 4 significant bits), for the emulated dual GEMM. Group of element e: e / block_size.
__global__ void tcfp12_dequantize_blocks_kernel(floatX* hi_out, floatX* lo_out, const uint8_t* hi, const uint8_t* lo,
                                                const uint8_t* hi_scale, const uint8_t* lo_scale, long long n,
                                                int block_size) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const long long g = e / block_size;
        hi_out[e] = (floatX)llmc::tcfp12_decode(hi[e], hi_scale[g]);
        lo_out[e] = (floatX)llmc::tcfp12_decode(lo[e], lo_scale[g]);
    }
}

inline void tcfp12_dequantize_blocks(floatX* hi_out, floatX* lo_out, const uint8_t* hi, const uint8_t* lo,
                                     const uint8_t* hi_scale, const uint8_t* lo_scale, long long n, int block_size,
                                     cudaStream_t stream) {
    tcfp12_dequantize_blocks_kernel<<<fp8_grid_size(n, 256), 256, 0, stream>>>(hi_out, lo_out, hi, lo, hi_scale, lo_scale,
                                                                              n, block_size);
    cudaCheckLaunch();
}

// ---- activations and gradients: fresh power-of-two scales ----------------------------------------
// The E8M0 code of the smallest power of two s with amax <= FP8_MAX * s (E4M3: 448; E5M2: 57344 =
// 448 * 2^7, so amax * 2^-7 against 448; exact for amax >= 2^-119, below which everything
// quantizes to zero anyway).
LLMC_HD inline uint8_t tcfp12_act_scale_code(float amax, bool e5m2) {
    return llmc::tcfp12_scale_code(e5m2 ? amax * 0.0078125f : amax);
}

// slot[0] = 1/s (to quantize with), slot[4] = s (to dequantize with), for the scale code `code`
__device__ __forceinline__ void tcfp12_set_slot(float* slot, uint8_t code) {
    slot[0] = llmc::tcfp12_inv_scale(code);
    slot[4] = llmc::tcfp12_scale(code);
}

// the slot from the amax bits
__global__ void tcfp12_act_scale_kernel(float* slot, const uint32_t* amax_bits, bool e5m2) {
    tcfp12_set_slot(slot, tcfp12_act_scale_code(llmc::bits_float(*amax_bits), e5m2));
}

// Speculative fresh scales (recipes/tcfp12/recipe.h): a pass has just quantized with the scale the slot held (the
// one this tensor had at its last use) and recorded the tensor's amax. The slot gets the scale of that amax,
// as tcfp12_act_scale_kernel sets it, and *redo whether it differs from the one the pass used: the pass then
// runs again under the flag (fp8_quantize's run_only_if), so the codes are always those of the fresh scale.
// counts (may be null): [0] += 1 (a speculative pass), [1] += *redo (it had to run again).
// ratio, ref_amax (may be null): the predictor of tcfp12_predict_scale, whose ratio becomes amax / ref_amax.
__global__ void tcfp12_act_scale_check_kernel(float* slot, const uint32_t* amax_bits, bool e5m2, int* redo,
                                              unsigned long long* counts, float* ratio, const uint32_t* ref_amax) {
    const float amax = llmc::bits_float(*amax_bits);
    const uint8_t code = tcfp12_act_scale_code(amax, e5m2);
    const int changed = llmc::float_bits(slot[0]) != llmc::float_bits(llmc::tcfp12_inv_scale(code)) ||
                        llmc::float_bits(slot[4]) != llmc::float_bits(llmc::tcfp12_scale(code));
    tcfp12_set_slot(slot, code);
    *redo = changed;
    if (counts) {
        counts[0] += 1;
        counts[1] += (unsigned long long)changed;
    }
    if (ratio) {
        const float ref = llmc::bits_float(*ref_amax);
        *ratio = ref > 0.0f && ref < INFINITY && amax < INFINITY ? amax / ref : 0.0f;
    }
}
inline void tcfp12_check_scale(float* slot, const uint32_t* amax, bool e5m2, int* redo, unsigned long long* counts,
                               cudaStream_t stream, float* ratio = nullptr, const uint32_t* ref_amax = nullptr) {
    tcfp12_act_scale_check_kernel<<<1, 1, 0, stream>>>(slot, amax, e5m2, redo, counts, ratio, ref_amax);
    cudaCheckLaunch();
}

// A better guess than the last use's scale for a gradient whose size moves with another one measured just
// before it (the fc layer's dy with the fc projection's, the qkv layer's with the attention projection's:
// from one micro-step to the next the gradients grow and shrink together): the slot gets the scale of
// ratio * ref_amax, ratio = amax / ref_amax as the last check found them. Nothing happens while ratio is 0
// (no history yet, or a non-finite amax), and the slot keeps the last use's scale. A guess only: the check
// after the pass makes the result exact whatever it guessed.
__global__ void tcfp12_predict_scale_kernel(float* slot, const float* ratio, const uint32_t* ref_amax, bool e5m2) {
    const float q = *ratio;
    if (!(q > 0.0f)) return;
    tcfp12_set_slot(slot, tcfp12_act_scale_code(q * llmc::bits_float(*ref_amax), e5m2));
}
inline void tcfp12_predict_scale(float* slot, const float* ratio, const uint32_t* ref_amax, bool e5m2, cudaStream_t stream) {
    tcfp12_predict_scale_kernel<<<1, 1, 0, stream>>>(slot, ratio, ref_amax, e5m2);
    cudaCheckLaunch();
}

// x's scale slot from an amax another kernel recorded
inline void tcfp12_scale_from_amax(float* slot, const uint32_t* amax, bool e5m2, cudaStream_t stream) {
    tcfp12_act_scale_kernel<<<1, 1, 0, stream>>>(slot, amax, e5m2);
    cudaCheckLaunch();
}

// amax of x (n values) into *amax (zeroed here), then x's scale slot; with gelu_of_input, of gelu(x)
// as gelu_forward stores it (tensor_amax)
inline void tcfp12_fresh_scale(float* slot, uint32_t* amax, const floatX* x, long long n, bool e5m2, cudaStream_t stream,
                               bool gelu_of_input = false) {
    cudaCheck(cudaMemsetAsync(amax, 0, sizeof(uint32_t), stream));
    tensor_amax(amax, x, n, stream, gelu_of_input);
    tcfp12_act_scale_kernel<<<1, 1, 0, stream>>>(slot, amax, e5m2);
    cudaCheckLaunch();
}

// dy's scale slot (fresh, E5M2) and, when dbias is given, dbias += its column sums: bias_backward
// takes dy's amax in the same read
inline void tcfp12_dy_scale_and_bias(float* slot, uint32_t* amax, float* dbias, float* scratch, const floatX* dout, int N,
                                     int OC, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(amax, 0, sizeof(uint32_t), stream));
    if (dbias) bias_backward(dbias, scratch, dout, N, OC, stream, amax);
    else tensor_amax(amax, dout, (long long)N * OC, stream);
    tcfp12_act_scale_kernel<<<1, 1, 0, stream>>>(slot, amax, true);
    cudaCheckLaunch();
}

// The same from what another pass already gathered (gelu_backward_bias_partials): *amax holds max |dy|,
// scratch dy's column partial sums, which are added into dbias (when given) in bias_backward's order
inline void tcfp12_dy_scale_from_partials(float* slot, const uint32_t* amax, float* dbias, const float* scratch, int OC,
                                          cudaStream_t stream) {
    if (dbias) bias_backward_reduce(dbias, scratch, OC, BIAS_ROW_GROUPS, stream);
    tcfp12_act_scale_kernel<<<1, 1, 0, stream>>>(slot, amax, true);
    cudaCheckLaunch();
}

// x (n values) -> the BF16 values of its FP8 codes: decode(fp8(x / s)) * s, exact in BF16 (the
// emulated GEMMs' operands). n % 2 == 0.
template <Fp8Kind K>
__global__ void tcfp12_fake_quantize_kernel(floatX* out, const floatX* in, long long n2, const float* slot) {
    const float q = slot[0], s = slot[4];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += (long long)gridDim.x * blockDim.x) {
        const float a = (float)in[2 * i], b = (float)in[2 * i + 1];
        const uint16_t p = fp8_pack2<K>(a * q, b * q);
        const float da = K == Fp8Kind::E4M3 ? llmc::fp8e4m3_decode((uint8_t)(p & 0xFF)) : llmc::fp8e5m2_decode((uint8_t)(p & 0xFF));
        const float db = K == Fp8Kind::E4M3 ? llmc::fp8e4m3_decode((uint8_t)(p >> 8)) : llmc::fp8e5m2_decode((uint8_t)(p >> 8));
        out[2 * i] = (floatX)(da * s);
        out[2 * i + 1] = (floatX)(db * s);
    }
}

template <Fp8Kind K>
inline void tcfp12_fake_quantize(floatX* out, const floatX* in, long long n, const float* slot, cudaStream_t stream) {
    tcfp12_fake_quantize_kernel<K><<<fp8_grid_size(n / 2, 256), 256, 0, stream>>>(out, in, n / 2, slot);
    cudaCheckLaunch();
}

// ---- the K-concatenated form of the dual GEMM ------------------------------------------------------
// y = x W_hi^T s_x s_hi + x W_lo^T s_x s_lo is also ONE GEMM of depth 2K: [x | x] [W_hi | W_lo]^T, if each
// K-half of the weight operand carries its own scale. Hopper's FP8 GEMMs take block scales (cuBLASLt
// 12.9+: one FP32 scale per 1 x 128 block of A along K, one per 128 x 128 block of B), so with K a
// multiple of 128 the weight side gets s_hi on its first K/128 blocks and s_lo on the rest, and the
// activation side s_x everywhere (matmul_fp8_block_scaled). One GEMM instead of two saves the first
// GEMM's BF16 output and the second one's read of it, and its accumulation is FP32 throughout
// (promoted every 128 values of K); the price is writing the activation's codes twice. Which form is
// faster depends on the shape (dev/bench/tcfp12_gemm_bench.cu compares them), so the recipe times both
// per shape and keeps the faster (recipes/tcfp12/recipe.h).

// out (rows x 2k) = [a | b], a and b (rows x k) codes
__global__ void tcfp12_concat_codes_kernel(uint8_t* out, const uint8_t* a, const uint8_t* b, int rows, int k16) {
    // 16 bytes per thread (k % 16 == 0): k16 = k / 16 chunks per half-row
    const long long n = (long long)rows * 2 * k16;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / (2 * k16);
        const int c = (int)(i % (2 * k16));
        const uint8_t* src = c < k16 ? a + (r * k16 + c) * 16 : b + (r * k16 + c - k16) * 16;
        reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(src);
    }
}
inline void tcfp12_concat_codes(uint8_t* out, const uint8_t* a, const uint8_t* b, int rows, int k, cudaStream_t stream) {
    tcfp12_concat_codes_kernel<<<fp8_grid_size((long long)rows * 2 * (k / 16), 256), 256, 0, stream>>>(out, a, b, rows, k / 16);
    cudaCheckLaunch();
}

// The weight side's 1 x 128 block scales of [W_hi | W_lo] (m rows, 2k columns): a column-major
// (m x 2k/128) array, scales[kb * m + row]: the dequantization factor of W_hi (hi_slot[4]) on the
// first k/128 blocks, W_lo's (lo_slot[4]; 0 for the zero-residual sentinel) on the others.
__global__ void tcfp12_concat_weight_scales_kernel(float* scales, const float* hi_slot, const float* lo_slot, int m, int kb_half) {
    const float hi = hi_slot[4], lo = lo_slot[4];
    const long long n = (long long)m * 2 * kb_half;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        scales[i] = i / m < kb_half ? hi : lo;
}
inline void tcfp12_concat_weight_scales(float* scales, const float* hi_slot, const float* lo_slot, int m, int k, cudaStream_t stream) {
    tcfp12_concat_weight_scales_kernel<<<fp8_grid_size((long long)m * 2 * (k / 128), 256), 256, 0, stream>>>(scales, hi_slot, lo_slot, m, k / 128);
    cudaCheckLaunch();
}
// the activation side's 128 x 128 block scales: `count` copies of its one dequantization factor slot[4].
// All of them are equal, so their order does not matter, but how many cuBLASLt reads does: with exactly
// ceil(rows/128) * K/128 of them written, the products at rows = 192 / 256 and K = 256 came out wrong
// with cuBLASLt 13.1 (build/test_tcfp12 and dev/bench/tcfp12_gemm_bench.cu show it), as if the array's
// leading dimension were padded; both block counts are rounded up to a multiple of 4 here, with which
// every case is right.
inline int tcfp12_concat_act_scale_count(int rows, int k2) { return ceil_div(ceil_div(rows, 128), 4) * 4 * ceil_div(k2 / 128, 4) * 4; }
__global__ void tcfp12_fill_scale_kernel(float* scales, int count, const float* slot) {
    const float s = slot[4];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) scales[i] = s;
}
inline void tcfp12_fill_scale(float* scales, int count, const float* slot, cudaStream_t stream) {
    tcfp12_fill_scale_kernel<<<ceil_div(count, 256), 256, 0, stream>>>(scales, count, slot);
    cudaCheckLaunch();
}

// Quantization of a (rows x cols) tensor into both halves of out (rows x 2 cols): out[r] = [q(in[r]) |
// q(in[r])], q as fp8_quantize (scale: the slot, 1/s at [0]); 8 values per thread, cols % 8 == 0. The
// telemetry counts (when given) count each value once.
template <Fp8Kind K, bool COUNT>
__global__ void tcfp12_quantize_twice_kernel(uint8_t* out, const floatX* in, long long n8, int cols8, const float* scale,
                                             uint32_t* amax_out, Fp8Stats stats, bool gelu_of_input,
                                             const int* run_only_if) {
    if (run_only_if && *run_only_if == 0) return; // (fp8_quantize's conditional second pass)
    const float s = *scale;
    uint32_t amax = 0, sat = 0, ftz = 0, count = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
        uint4 packed = reinterpret_cast<const uint4*>(in)[i];
        if (gelu_of_input) { // gelu(in) as gelu_forward stores it (fp8_quantize_transpose's gelu_of_input)
            floatX* e = reinterpret_cast<floatX*>(&packed);
#pragma unroll
            for (int j = 0; j < 8; j++) e[j] = (floatX)gelu_value((float)e[j]);
        }
        const uint2 codes = fp8_quantize8<K, COUNT>(packed, s, amax, sat, ftz);
        count += 8;
        const long long r = i / cols8, c = i % cols8;
        uint2* row = reinterpret_cast<uint2*>(out) + r * 2 * cols8;
        row[c] = codes;
        row[cols8 + c] = codes;
    }
    if (COUNT || amax_out) fp8_commit(amax, sat, ftz, count, amax_out, stats);
}
// amax_out (may be null): max |x| of the values quantized, atomicMax on the bits (the caller zeroes it);
// run_only_if: as fp8_quantize's
template <Fp8Kind K>
inline void tcfp12_quantize_twice(uint8_t* out, const floatX* in, int rows, int cols, const float* scale, Fp8Stats stats,
                                  cudaStream_t stream, bool gelu_of_input = false, uint32_t* amax_out = nullptr,
                                  const int* run_only_if = nullptr) {
    const long long n8 = (long long)rows * cols / 8;
    auto kernel = stats.counts ? tcfp12_quantize_twice_kernel<K, true> : tcfp12_quantize_twice_kernel<K, false>;
    kernel<<<fp8_grid_size(n8, 256), 256, 0, stream>>>(out, in, n8, cols / 8, scale, amax_out, stats, gelu_of_input,
                                                       run_only_if);
    cudaCheckLaunch();
}
