// layernorm.cuh: LayerNorm forward, the fused residual-add + LayerNorm forward, and backward.
//   y = (x - mean) * rstd * w + b,   rstd = 1 / sqrt(var + 1e-5),   var the biased variance over C.
// One warp per row (a row is one token's C channels); statistics in FP32. mean and rstd are kept
// per row for the backward pass.
// The residual stream (the input of every LayerNorm) is FP32 in every build, as under PyTorch's
// autocast: rounding it to BF16 after each of the 2L residual adds costs ~0.2% per add, which
// dominated the BF16 build's error against the reference. LayerNorm outputs are floatX (they feed GEMMs).
// Boundaries (boundaries.h): the residual add is residual + branch_scale * branch, stored through
// Bd::residual (its LayerNorm reads the stored value); outputs are stored through Bd::norm_output.
// The branch (the attention or MLP projection's output) is read through Bd::branch_output, and under
// active boundaries the value read is stored back into the branch tensor, as BF16 (the residual add
// then uses that stored value): the recipe's post-GEMM quantization of these two outputs, fused
// here, where they are read anyway (one pass over the tensor instead of two).
// Backward, with xhat = (x - mean) * rstd and g = dy * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dw += sum_rows dy * xhat,   db += sum_rows dy
// The dw/db sums over rows are made deterministic: each warp accumulates a fixed set of rows into
// its own FP32 scratch row, and a second kernel adds the scratch rows in order.
#pragma once
#include <type_traits>
#include "cuda_common.h"
#include "boundaries.h"
#include "formats/fp8_quantize.cuh" // Fp8Target: the FP8 recipe's E4M3 copy of the output

#define LN_EPS 1e-5f

// x is the row to normalize; out, mean, rstd get written. w/b: C. One warp per row.
template <class Bd>
__device__ __forceinline__ void layernorm_row(floatX* out, float* mean_out, float* rstd_out, const float* x,
                                              const floatX* w, const floatX* b, int C, int lane) {
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) sum += (float)x[c];
    float mean = warp_sum(sum) / C;
    float sq = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) { float d = (float)x[c] - mean; sq += d * d; }
    float rstd = rsqrtf(warp_sum(sq) / C + LN_EPS);
    for (int c = lane; c < C; c += WARP_SIZE) {
        float n = ((float)x[c] - mean) * rstd;
        out[c] = (floatX)Bd::norm_output(n * (float)w[c] + (float)b[c]);
    }
    if (lane == 0) { *mean_out = mean; *rstd_out = rstd; }
}

template <class Bd>
__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const float* inp,
                                         const floatX* w, const floatX* b, int N, int C) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    long long off = (long long)row * C;
    layernorm_row<Bd>(out + off, mean + row, rstd + row, inp + off, w, b, C, threadIdx.x % WARP_SIZE);
}

// residual = a + branch_scale * b in FP32 (a: the residual stream, b: a projection's output), then
// LayerNorm of it
template <class Bd>
__global__ void fused_residual_layernorm_forward_kernel(float* residual, floatX* out, float* mean, float* rstd,
                                                        const float* a, floatX* b_in, const floatX* w,
                                                        const floatX* b, int N, int C, float branch_scale, int branch) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= N) return;
    int lane = threadIdx.x % WARP_SIZE;
    long long off = (long long)row * C;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float bv = (float)b_in[off + c];
        if constexpr (Bd::ACTIVE) {
            const floatX stored = (floatX)Bd::branch_output(branch, bv);
            b_in[off + c] = stored;
            bv = (float)stored;
        }
        residual[off + c] = Bd::residual(a[off + c] + branch_scale * bv);
    }
    __syncwarp();
    layernorm_row<Bd>(out + off, mean + row, rstd + row, residual + off, w, b, C, lane);
}

// ---- the same with the row in registers, for C % 4 == 0 and C <= 2048 -------------------------
// Lane l owns the float4 chunks l, l+32, ... (N4 of them), so a row is read from memory once, in
// 16-byte loads, and normalized from registers. The plain and the fused kernel share the row
// routine, so a LayerNorm recomputed in backward (-r 2) equals the forward's bit for bit.
// out8 (may be null): the row's E4M3 codes of out * s8 are written there instead of out (the FP8
// recipe's input of the next linear, Fp8Target); amax8 (may be null) gets max |out| of the lane's values
// (out8's, or with out8 null those of the BF16 out written: TCFP-12's fresh scale).
template <class Bd, int N4>
__device__ __forceinline__ void layernorm_row_registers(floatX* out, float* mean_out, float* rstd_out,
                                                        const float4 (&x)[N4], const floatX* w, const floatX* b,
                                                        int C, int lane, uint8_t* out8 = nullptr, float s8 = 0.0f,
                                                        uint32_t* amax8 = nullptr) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < N4; i++) {
        if ((lane + i * WARP_SIZE) * 4 < C) sum += (x[i].x + x[i].y) + (x[i].z + x[i].w);
    }
    const float mean = warp_sum(sum) / C;
    float sq = 0.0f;
#pragma unroll
    for (int i = 0; i < N4; i++) {
        if ((lane + i * WARP_SIZE) * 4 < C) {
            float dx = x[i].x - mean, dy = x[i].y - mean, dz = x[i].z - mean, dw = x[i].w - mean;
            sq += (dx * dx + dy * dy) + (dz * dz + dw * dw);
        }
    }
    const float rstd = rsqrtf(warp_sum(sq) / C + LN_EPS);
#pragma unroll
    for (int i = 0; i < N4; i++) {
        const int c = (lane + i * WARP_SIZE) * 4;
        if (c < C) {
            const float xs[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
            floatX o[4];
#pragma unroll
            for (int k = 0; k < 4; k++) o[k] = (floatX)Bd::norm_output((xs[k] - mean) * rstd * (float)w[c + k] + (float)b[c + k]);
            if (out8) {
                // the codes the quantize pass would make of the stored BF16 values (formats/fp8_quantize.cuh)
                float a[4];
#pragma unroll
                for (int k = 0; k < 4; k++) { a[k] = (float)o[k]; *amax8 = max(*amax8, llmc::amax_bits(a[k])); }
                *reinterpret_cast<uint32_t*>(out8 + c) = fp8_pack2<Fp8Kind::E4M3>(a[0] * s8, a[1] * s8) |
                                                         ((uint32_t)fp8_pack2<Fp8Kind::E4M3>(a[2] * s8, a[3] * s8) << 16);
                continue;
            }
            if (amax8) {
#pragma unroll
                for (int k = 0; k < 4; k++) *amax8 = max(*amax8, llmc::amax_bits((float)o[k]));
            }
            if constexpr (sizeof(floatX) == 2) {
                // 4 outputs in one store (8 bytes for BF16, 16 for FP32)
                *reinterpret_cast<uint2*>(out + c) = *reinterpret_cast<const uint2*>(o);
            } else {
                *reinterpret_cast<float4*>(out + c) = *reinterpret_cast<const float4*>(o);
            }
        }
    }
    if (lane == 0) { *mean_out = mean; *rstd_out = rstd; }
}

// With an active Fp8Target q (FP8 recipe), the E4M3 codes go to q.rows instead of out, and the block's
// amax to *q.amax (fp8_commit: one atomic per block, only where it raises the value thread 0 read when
// the block started; q.amax null: evaluation, nothing recorded). q.cols is not written: the recipe
// transposes q.rows. With q.rows null and q.amax given (TCFP-12), out is written as usual and its amax
// recorded. With q.run_only_if (TCFP-12's speculative scale, redone), the kernel runs only if the flag is set.
template <class Bd, int N4>
__global__ void layernorm_forward_registers_kernel(floatX* out, float* mean, float* rstd, const float* inp,
                                                   const floatX* w, const floatX* b, int N, int C, Fp8Target q) {
    if (q.run_only_if && *q.run_only_if == 0) return;
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const uint32_t amax_seen = q.amax && threadIdx.x == 0 ? __ldcg(q.amax) : 0u;
    uint32_t amax = 0;
    if (row < N) {
        const long long off = (long long)row * C;
        float4 x[N4];
#pragma unroll
        for (int i = 0; i < N4; i++) {
            const int c = (lane + i * WARP_SIZE) * 4;
            x[i] = c < C ? *reinterpret_cast<const float4*>(inp + off + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        layernorm_row_registers<Bd, N4>(out + off, mean + row, rstd + row, x, w, b, C, lane,
                                        q.rows ? q.rows + off : nullptr, q.rows ? *q.scale : 0.0f,
                                        q.rows || q.amax ? &amax : nullptr);
    }
    if (q.rows || q.amax) fp8_commit(amax, 0, 0, 0, q.amax, Fp8Stats(), amax_seen);
}

template <class Bd, int N4>
__global__ void fused_residual_layernorm_registers_kernel(float* residual, floatX* out, float* mean, float* rstd,
                                                          const float* a, floatX* b_in, const floatX* w,
                                                          const floatX* b, int N, int C, float branch_scale, int branch,
                                                          Fp8Target q) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const uint32_t amax_seen = q.amax && threadIdx.x == 0 ? __ldcg(q.amax) : 0u;
    uint32_t amax = 0;
    if (row < N) {
        const int lane = threadIdx.x % WARP_SIZE;
        const long long off = (long long)row * C;
        float4 x[N4];
#pragma unroll
        for (int i = 0; i < N4; i++) {
            const int c = (lane + i * WARP_SIZE) * 4;
            if (c < C) {
                float4 av = *reinterpret_cast<const float4*>(a + off + c);
                floatX bv[4];
                if constexpr (sizeof(floatX) == 2) *reinterpret_cast<uint2*>(bv) = *reinterpret_cast<const uint2*>(b_in + off + c);
                else *reinterpret_cast<float4*>(bv) = *reinterpret_cast<const float4*>(b_in + off + c);
                if constexpr (Bd::ACTIVE) {   // the branch through its hook, stored back (BF16: 4 values in 8 bytes)
#pragma unroll
                    for (int k = 0; k < 4; k++) bv[k] = (floatX)Bd::branch_output(branch, (float)bv[k]);
                    static_assert(sizeof(floatX) == 2 || !Bd::ACTIVE, "active boundaries store BF16");
                    *reinterpret_cast<uint2*>(b_in + off + c) = *reinterpret_cast<const uint2*>(bv);
                    x[i] = make_float4(Bd::residual(av.x + branch_scale * (float)bv[0]), Bd::residual(av.y + branch_scale * (float)bv[1]),
                                       Bd::residual(av.z + branch_scale * (float)bv[2]), Bd::residual(av.w + branch_scale * (float)bv[3]));
                } else {
                    x[i] = make_float4(av.x + (float)bv[0], av.y + (float)bv[1], av.z + (float)bv[2], av.w + (float)bv[3]);
                }
                *reinterpret_cast<float4*>(residual + off + c) = x[i];
            } else {
                x[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
        layernorm_row_registers<Bd, N4>(out + off, mean + row, rstd + row, x, w, b, C, lane,
                                        q.rows ? q.rows + off : nullptr, q.rows ? *q.scale : 0.0f,
                                        q.rows || q.amax ? &amax : nullptr);
    }
    if (q.rows || q.amax) fp8_commit(amax, 0, 0, 0, q.amax, Fp8Stats(), amax_seen);
}

// which register kernel fits C (0 = none: use the generic kernels). Up to 16 float4 chunks per lane
// (C = 2048, 64 registers of row), so that d36's C = 1280 and d48's 1600 get them too: the generic kernels
// re-read the row from memory, the register kernels hold it.
inline int layernorm_chunks_per_lane(int C) {
    if (C % 4 != 0 || C > 2048) return 0;
    return (C + 127) / 128; // 1..16
}

#define LN_DISPATCH_N4(n4, KERNEL, grid, block, stream, ...)                                       \
    switch (n4) {                                                                                  \
        case 1: KERNEL<Bd, 1><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 2: KERNEL<Bd, 2><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 3: KERNEL<Bd, 3><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 4: KERNEL<Bd, 4><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 5: KERNEL<Bd, 5><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 6: KERNEL<Bd, 6><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 7: KERNEL<Bd, 7><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 8: KERNEL<Bd, 8><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                     \
        case 9: case 10: KERNEL<Bd, 10><<<grid, block, 0, stream>>>(__VA_ARGS__); break;           \
        case 11: case 12: KERNEL<Bd, 12><<<grid, block, 0, stream>>>(__VA_ARGS__); break;          \
        case 13: case 14: KERNEL<Bd, 14><<<grid, block, 0, stream>>>(__VA_ARGS__); break;          \
        default: KERNEL<Bd, 16><<<grid, block, 0, stream>>>(__VA_ARGS__); break;                   \
    }

// whether the LayerNorm kernels can write E4M3 codes of their output (an Fp8Target): the register kernels
inline bool layernorm_gives_fp8(int C) { return layernorm_chunks_per_lane(C) > 0; }
inline void layernorm_check_fp8(const Fp8Target& q, int C) {
    if ((q.active() || q.amax) && (!layernorm_gives_fp8(C) || (uintptr_t)q.rows % 16 != 0)) {
        fprintf(stderr, "error: layernorm: no E4M3 output at C = %d (needs C %% 4 == 0 and C <= 2048) or unaligned\n", C);
        exit(1);
    }
}

// q (FP8 recipe; layernorm_gives_fp8(C)): the E4M3 codes of the output go to q.rows instead of out; with
// q.rows null and q.amax given (TCFP-12), the output's amax goes to *q.amax
template <class Bd = IdentityBoundaries>
inline void layernorm_forward(floatX* out, float* mean, float* rstd, const float* inp, const floatX* w,
                              const floatX* b, int N, int C, cudaStream_t stream, Fp8Target q = Fp8Target()) {
    if constexpr (!std::is_same<Bd, typename Bd::Values>::value) {
        // a counting policy counts only in a telemetry step; otherwise the kernels without the
        // counting code (boundaries.h, observing()): the same values
        if (!Bd::observing()) return layernorm_forward<typename Bd::Values>(out, mean, rstd, inp, w, b, N, C, stream, q);
    }
    layernorm_check_fp8(q, C);
    const int block = 256, rows_per_block = block / WARP_SIZE;
    const int grid = ceil_div(N, rows_per_block);
    const int n4 = layernorm_chunks_per_lane(C);
    if (n4 > 0) {
        LN_DISPATCH_N4(n4, layernorm_forward_registers_kernel, grid, block, stream, out, mean, rstd, inp, w, b, N, C, q);
    } else {
        layernorm_forward_kernel<Bd><<<grid, block, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
    }
    cudaCheckLaunch();
}

// branch: which branch b_in is (ATTENTION_BRANCH or MLP_BRANCH): its scale, Bd::ATTENTION_RESIDUAL_SCALE or
// Bd::MLP_RESIDUAL_SCALE (1 in every recipe but legacy Q1.15), and its boundary (Bd::branch_output; under
// active boundaries b_in is written: it ends holding the values the residual add used)
template <class Bd = IdentityBoundaries>
inline void fused_residual_layernorm_forward(float* residual, floatX* out, float* mean, float* rstd,
                                             const float* a, floatX* b_in, const floatX* w,
                                             const floatX* b, int N, int C, cudaStream_t stream,
                                             ResidualBranch branch, Fp8Target q = Fp8Target()) {
    if constexpr (!std::is_same<Bd, typename Bd::Values>::value) {   // (as layernorm_forward)
        if (!Bd::observing())
            return fused_residual_layernorm_forward<typename Bd::Values>(residual, out, mean, rstd, a, b_in, w, b, N, C,
                                                                         stream, branch, q);
    }
    const float branch_scale = branch == ATTENTION_BRANCH ? Bd::ATTENTION_RESIDUAL_SCALE : Bd::MLP_RESIDUAL_SCALE;
    layernorm_check_fp8(q, C);
    const int block = 256, rows_per_block = block / WARP_SIZE;
    const int grid = ceil_div(N, rows_per_block);
    const int n4 = layernorm_chunks_per_lane(C);
    if (n4 > 0) {
        LN_DISPATCH_N4(n4, fused_residual_layernorm_registers_kernel, grid, block, stream, residual, out, mean, rstd,
                       a, b_in, w, b, N, C, branch_scale, (int)branch, q);
    } else {
        fused_residual_layernorm_forward_kernel<Bd><<<grid, block, 0, stream>>>(residual, out, mean, rstd, a, b_in, w, b, N, C,
                                                                                branch_scale, (int)branch);
    }
    cudaCheckLaunch();
}

// Number of FP32 scratch rows (one per warp) used for the partial sums. Each row holds three
// per-column sums of the warp's rows: dw (dy * xhat), db (dy), and the branch bias gradient (the
// column sums of dinp_x, see below). The scratch is layernorm_backward_scratch_floats(C) floats.
#define LN_BACKWARD_WARPS 1024
inline size_t layernorm_backward_scratch_floats(int C) { return (size_t)LN_BACKWARD_WARPS * 3 * C; }

// dinp += dx in FP32 (the gradient of the residual stream accumulates over 2L+1 LayerNorms), and
// dinp_x = branch_scale * dinp rounded to floatX: the copy the next GEMMs read (the gradient of the
// residual branch that feeds this residual stream: residual = a + branch_scale * branch). That
// branch ends in a linear layer whose bias gradient is the column sums of dinp_x: the kernels sum
// the values they write, so the linear layer's backward need not read dinp_x again for it. Warp w
// handles rows w, w + W, w + 2W, ... and accumulates dy*xhat, dy and dinp_x into its scratch row
// (zeroed here first).
__global__ void layernorm_backward_kernel(float* dinp, floatX* dinp_x, float* scratch, const floatX* dout, const float* inp,
                                          const floatX* w, const float* mean, const float* rstd, int N, int C,
                                          float branch_scale) {
    const int num_warps = gridDim.x * (blockDim.x / WARP_SIZE);
    const int warp_id = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    float* dw_acc = scratch + (long long)warp_id * 3 * C;
    float* db_acc = dw_acc + C;
    float* bb_acc = db_acc + C;
    for (int c = lane; c < C; c += WARP_SIZE) { dw_acc[c] = 0.0f; db_acc[c] = 0.0f; bb_acc[c] = 0.0f; }
    for (int row = warp_id; row < N; row += num_warps) {
        long long off = (long long)row * C;
        float m = mean[row], r = rstd[row];
        // the two row means needed by dx
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int c = lane; c < C; c += WARP_SIZE) {
            float xhat = ((float)inp[off + c] - m) * r;
            float g = (float)dout[off + c] * (float)w[c];
            sum_g += g;
            sum_gx += g * xhat;
        }
        float mean_g = warp_sum(sum_g) / C;
        float mean_gx = warp_sum(sum_gx) / C;
        for (int c = lane; c < C; c += WARP_SIZE) {
            float xhat = ((float)inp[off + c] - m) * r;
            float dy = (float)dout[off + c];
            float g = dy * (float)w[c];
            float dx = r * (g - mean_g - xhat * mean_gx);
            float acc = dinp[off + c] + dx;
            const floatX bx = (floatX)(branch_scale * acc);
            dinp[off + c] = acc;
            dinp_x[off + c] = bx;
            dw_acc[c] += dy * xhat;
            db_acc[c] += dy;
            bb_acc[c] += (float)bx;
        }
    }
}

// One row of the register and wide backward kernels below: lane l owns columns l, l+32, ..., l+32(CPL-1).
// dy, x and the old dinp of the whole row are loaded before the first use; w_at(i, c) is w[c] (0 past
// C), and accumulate(i, c, dy, xhat, bx) adds the column's partial sums (bx: the dinp_x value
// written) where the kernel keeps them (registers or shared memory). Same arithmetic and per-column order as the generic kernel.
// out8 (may be null): the E5M2 codes of dinp_x * s8 are written there instead of dinp_x (the FP8 recipe's
// output gradient of the branch's last linear, Fp8Target); amax8 (may be null) gets max |dinp_x| of the
// lane's values (with out8 null, of the dinp_x written: TCFP-12's fresh scale).
template <int CPL, typename WeightAt, typename Accumulate>
__device__ __forceinline__ void layernorm_backward_row(float* dinp, floatX* dinp_x, const floatX* dout, const float* inp,
                                                       const float* mean, const float* rstd, int row, int lane, int C,
                                                       float branch_scale, WeightAt w_at, Accumulate accumulate,
                                                       uint8_t* out8 = nullptr, float s8 = 0.0f, uint32_t* amax8 = nullptr) {
    const long long off = (long long)row * C;
    const float m = mean[row], r = rstd[row];
    float dy[CPL], xh[CPL], old[CPL];
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        int c = lane + i * WARP_SIZE;
        dy[i] = c < C ? (float)dout[off + c] : 0.0f;
        xh[i] = c < C ? inp[off + c] : 0.0f;
        old[i] = c < C ? dinp[off + c] : 0.0f;
    }
    float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        xh[i] = (xh[i] - m) * r;
        float g = dy[i] * w_at(i, lane + i * WARP_SIZE);
        sum_g += g;
        sum_gx += g * xh[i];
    }
    const float mean_g = warp_sum(sum_g) / C;
    const float mean_gx = warp_sum(sum_gx) / C;
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        int c = lane + i * WARP_SIZE;
        if (c < C) {
            float dx = r * (dy[i] * w_at(i, c) - mean_g - xh[i] * mean_gx);
            float acc = old[i] + dx;
            const floatX bx = (floatX)(branch_scale * acc);
            dinp[off + c] = acc;
            if (amax8) *amax8 = max(*amax8, llmc::amax_bits((float)bx));
            if (out8) {
                // the code the quantize pass would make of the stored BF16 value (formats/fp8_quantize.cuh)
                out8[off + c] = (uint8_t)(fp8_pack2<Fp8Kind::E5M2>((float)bx * s8, 0.0f) & 0xFFu);
            } else {
                dinp_x[off + c] = bx;
            }
            accumulate(i, c, dy[i], xh[i], (float)bx);
        }
    }
}

// The same for C <= 32 * CPL, with everything a warp needs in registers: lane l owns the columns
// l, l+32, ..., so each row's dy, x, w and old dinp are loaded once (all loads issued before the
// first use) and the dw/db partial sums stay in registers until the warp's last row. The scratch
// row is written once at the end. Same arithmetic, same summation order per column as the generic
// kernel above, so the two give identical results.
// With an active Fp8Target q, the E5M2 codes go to q.rows instead of dinp_x and the amax to *q.amax
// (as the forward's register kernels: one atomic per block, fp8_commit).
template <int CPL>
__global__ void __launch_bounds__(256) layernorm_backward_registers_kernel(
        float* dinp, floatX* dinp_x, float* scratch, const floatX* dout, const float* inp, const floatX* w,
        const float* mean, const float* rstd, int N, int C, float branch_scale, Fp8Target q) {
    const uint32_t amax_seen = q.amax && threadIdx.x == 0 ? __ldcg(q.amax) : 0u;
    const float s8 = q.rows ? *q.scale : 0.0f;
    uint32_t amax8 = 0;
    const int num_warps = gridDim.x * (blockDim.x / WARP_SIZE);
    const int warp_id = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    // w in registers, or at CPL = 32 (C = 1024) in shared memory: there the four per-column arrays
    // and the row's three would need more than 255 registers
    constexpr bool W_SHARED = CPL >= 32;
    __shared__ float w_s[W_SHARED ? 32 * CPL : 1];
    float dw_acc[CPL], db_acc[CPL], bb_acc[CPL], wv[W_SHARED ? 1 : CPL];
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        int c = lane + i * WARP_SIZE;
        dw_acc[i] = 0.0f; db_acc[i] = 0.0f; bb_acc[i] = 0.0f;
        if constexpr (!W_SHARED) wv[i] = c < C ? (float)w[c] : 0.0f;
    }
    if constexpr (W_SHARED) {
        for (int c = threadIdx.x; c < 32 * CPL; c += blockDim.x) w_s[c] = c < C ? (float)w[c] : 0.0f;
        __syncthreads();
    }
    for (int row = warp_id; row < N; row += num_warps)
        layernorm_backward_row<CPL>(dinp, dinp_x, dout, inp, mean, rstd, row, lane, C, branch_scale,
                                    [&](int i, int c) { if constexpr (W_SHARED) return w_s[c]; else return wv[i]; },
                                    [&](int i, int, float d, float xhat, float bx) {
                                        dw_acc[i] += d * xhat; db_acc[i] += d; bb_acc[i] += bx;
                                    }, q.rows, s8, q.rows || q.amax ? &amax8 : nullptr);
    float* dw_row = scratch + (long long)warp_id * 3 * C;
#pragma unroll
    for (int i = 0; i < CPL; i++) {
        int c = lane + i * WARP_SIZE;
        if (c < C) { dw_row[c] = dw_acc[i]; dw_row[C + c] = db_acc[i]; dw_row[2 * C + c] = bb_acc[i]; }
    }
    if (q.rows || q.amax) fp8_commit(amax8, 0, 0, 0, q.amax, Fp8Stats(), amax_seen);
}

// The same for 1024 < C <= 32 * CPL when C % 4 != 0 (C % 4 == 0, as d36's 1280 and d48's 1600, takes the
// 16-byte kernel below, layernorm_backward_wide4_kernel): 6 * CPL registers would
// spill, so the warp's dw/db partial sums live in shared memory (each lane updates only its own
// columns: no conflicts, no atomics) and w is staged there once per block; dy, x and the old dinp are
// loaded for the whole row before the first use (loading dinp in the last loop instead left each
// warp waiting on one load at a time: 0.97 TB/s at d36). Same arithmetic and summation order per
// column as the generic kernel.
#define LN_WIDE_THREADS 128
inline size_t layernorm_backward_wide_smem(int C) {
    return ((size_t)(LN_WIDE_THREADS / WARP_SIZE) * 3 * C + C) * sizeof(float);
}
template <int CPL>
__global__ void __launch_bounds__(LN_WIDE_THREADS) layernorm_backward_wide_kernel(
        float* dinp, floatX* dinp_x, float* scratch, const floatX* dout, const float* inp, const floatX* w,
        const float* mean, const float* rstd, int N, int C, float branch_scale, Fp8Target q) {
    extern __shared__ float ln_smem[];
    const uint32_t amax_seen = q.amax && threadIdx.x == 0 ? __ldcg(q.amax) : 0u;
    const float s8 = q.rows ? *q.scale : 0.0f;
    uint32_t amax8 = 0;
    const int num_warps = gridDim.x * (blockDim.x / WARP_SIZE);
    const int warp_in_block = threadIdx.x / WARP_SIZE;
    const int warp_id = blockIdx.x * (blockDim.x / WARP_SIZE) + warp_in_block;
    const int lane = threadIdx.x % WARP_SIZE;
    float* wv = ln_smem;                                  // C
    float* dw_acc = ln_smem + C + (size_t)warp_in_block * 3 * C;
    float* db_acc = dw_acc + C;
    float* bb_acc = db_acc + C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) wv[c] = (float)w[c];
    for (int c = lane; c < C; c += WARP_SIZE) { dw_acc[c] = 0.0f; db_acc[c] = 0.0f; bb_acc[c] = 0.0f; }
    __syncthreads();
    for (int row = warp_id; row < N; row += num_warps)
        layernorm_backward_row<CPL>(dinp, dinp_x, dout, inp, mean, rstd, row, lane, C, branch_scale,
                                    [&](int, int c) { return c < C ? wv[c] : 0.0f; },
                                    [&](int, int c, float d, float xhat, float bx) {
                                        dw_acc[c] += d * xhat; db_acc[c] += d; bb_acc[c] += bx;
                                    }, q.rows, s8, q.rows || q.amax ? &amax8 : nullptr);
    float* dw_row = scratch + (long long)warp_id * 3 * C;
    for (int c = lane; c < C; c += WARP_SIZE) {
        dw_row[c] = dw_acc[c]; dw_row[C + c] = db_acc[c]; dw_row[2 * C + c] = bb_acc[c];
    }
    if (q.rows || q.amax) fp8_commit(amax8, 0, 0, 0, q.amax, Fp8Stats(), amax_seen);
}
// Launches one of the wide backward kernels (KERNEL handles C up to MAX_C): LN_BACKWARD_WARPS warps,
// the shared memory of layernorm_backward_wide_smem(C)
template <auto KERNEL, int MAX_C>
inline void layernorm_backward_wide_launch(float* dinp, floatX* dinp_x, float* scratch, const floatX* dout,
                                           const float* inp, const floatX* w, const float* mean, const float* rstd,
                                           int N, int C, float branch_scale, cudaStream_t stream, Fp8Target q = Fp8Target()) {
    allow_dynamic_smem<KERNEL>((int)layernorm_backward_wide_smem(MAX_C));
    const int grid = LN_BACKWARD_WARPS / (LN_WIDE_THREADS / WARP_SIZE);
    KERNEL<<<grid, LN_WIDE_THREADS, layernorm_backward_wide_smem(C), stream>>>(dinp, dinp_x, scratch, dout, inp, w,
                                                                              mean, rstd, N, C, branch_scale, q);
}
template <int CPL>
inline void layernorm_backward_wide(float* dinp, floatX* dinp_x, float* scratch, const floatX* dout, const float* inp,
                                    const floatX* w, const float* mean, const float* rstd, int N, int C,
                                    float branch_scale, cudaStream_t stream, Fp8Target q = Fp8Target()) {
    layernorm_backward_wide_launch<layernorm_backward_wide_kernel<CPL>, 32 * CPL>(dinp, dinp_x, scratch, dout, inp, w,
                                                                                 mean, rstd, N, C, branch_scale, stream, q);
}

// The wide kernel with 16-byte accesses (C % 4 == 0, 1024 < C <= 2048; the dispatcher's choice there):
// lane l owns the float4 chunks of columns 4(l + 32i) .. 4(l + 32i) + 3, as the forward's register
// kernels, so each row costs a lane N4 loads of dy (8 bytes of BF16), x and the old dinp (16 bytes each),
// N4 stores of each output, and its shared-memory partial sums move a float4 at a time: a quarter of the
// scalar wide kernel's instructions, which at d36 (C = 1280) spent more time issuing its 40 scalar
// shared-memory updates per lane and row than its loads took (2.26 TB/s in the trainer). The per-column
// sums dw and db are the scalar kernels' bit for bit (the same products, added in the same row order);
// the row means of g and g * xhat are added in another order (a lane's own columns first), so dinp
// may differ from theirs in the last bit, and dinp_x (and its column sums) where that bit changes the
// BF16 rounding.
// (q: the E5M2 output, as the register kernel's)
template <int N4>
__global__ void __launch_bounds__(LN_WIDE_THREADS) layernorm_backward_wide4_kernel(
        float* dinp, floatX* dinp_x, float* scratch, const floatX* dout, const float* inp, const floatX* w,
        const float* mean, const float* rstd, int N, int C, float branch_scale, Fp8Target q) {
    extern __shared__ float ln_smem[];
    const uint32_t amax_seen = q.amax && threadIdx.x == 0 ? __ldcg(q.amax) : 0u;
    const float s8 = q.rows ? *q.scale : 0.0f;
    uint32_t amax8 = 0;
    const int num_warps = gridDim.x * (blockDim.x / WARP_SIZE);
    const int warp_in_block = threadIdx.x / WARP_SIZE;
    const int warp_id = blockIdx.x * (blockDim.x / WARP_SIZE) + warp_in_block;
    const int lane = threadIdx.x % WARP_SIZE;
    float* wv = ln_smem;                                  // C (C % 4 == 0: every array below stays 16-byte aligned)
    float* dw_acc = ln_smem + C + (size_t)warp_in_block * 3 * C;
    float* db_acc = dw_acc + C;
    float* bb_acc = db_acc + C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) wv[c] = (float)w[c];
    for (int c = lane * 4; c < C; c += WARP_SIZE * 4) {
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(dw_acc + c) = zero;
        *reinterpret_cast<float4*>(db_acc + c) = zero;
        *reinterpret_cast<float4*>(bb_acc + c) = zero;
    }
    __syncthreads();
    for (int row = warp_id; row < N; row += num_warps) {
        const long long off = (long long)row * C;
        const float m = mean[row], r = rstd[row];
        float dy[N4][4], xh[N4][4], old[N4][4];
#pragma unroll
        for (int i = 0; i < N4; i++) {
            const int c = (lane + i * WARP_SIZE) * 4;
            if (c < C) {
                floatX d[4];
                if constexpr (sizeof(floatX) == 2) *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(dout + off + c);
                else *reinterpret_cast<float4*>(d) = *reinterpret_cast<const float4*>(dout + off + c);
                const float4 xv = *reinterpret_cast<const float4*>(inp + off + c);
                const float4 ov = *reinterpret_cast<const float4*>(dinp + off + c);
#pragma unroll
                for (int k = 0; k < 4; k++) dy[i][k] = (float)d[k];
                xh[i][0] = xv.x; xh[i][1] = xv.y; xh[i][2] = xv.z; xh[i][3] = xv.w;
                old[i][0] = ov.x; old[i][1] = ov.y; old[i][2] = ov.z; old[i][3] = ov.w;
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) { dy[i][k] = 0.0f; xh[i][k] = 0.0f; old[i][k] = 0.0f; }
            }
        }
        float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
        for (int i = 0; i < N4; i++) {
            const int c = (lane + i * WARP_SIZE) * 4;
            if (c < C) {
                const float4 wq = *reinterpret_cast<const float4*>(wv + c);
                const float ws[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    xh[i][k] = (xh[i][k] - m) * r;
                    const float g = dy[i][k] * ws[k];
                    sum_g += g;
                    sum_gx += g * xh[i][k];
                }
            }
        }
        const float mean_g = warp_sum(sum_g) / C;
        const float mean_gx = warp_sum(sum_gx) / C;
#pragma unroll
        for (int i = 0; i < N4; i++) {
            const int c = (lane + i * WARP_SIZE) * 4;
            if (c < C) {
                const float4 wq = *reinterpret_cast<const float4*>(wv + c);
                const float ws[4] = {wq.x, wq.y, wq.z, wq.w};
                float acc[4];
                floatX bx[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float dx = r * (dy[i][k] * ws[k] - mean_g - xh[i][k] * mean_gx);
                    acc[k] = old[i][k] + dx;
                    bx[k] = (floatX)(branch_scale * acc[k]);
                }
                *reinterpret_cast<float4*>(dinp + off + c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
                if (q.rows || q.amax) {
#pragma unroll
                    for (int k = 0; k < 4; k++) amax8 = max(amax8, llmc::amax_bits((float)bx[k]));
                }
                if (q.rows) {
                    float a[4];
#pragma unroll
                    for (int k = 0; k < 4; k++) a[k] = (float)bx[k];
                    *reinterpret_cast<uint32_t*>(q.rows + off + c) =
                        fp8_pack2<Fp8Kind::E5M2>(a[0] * s8, a[1] * s8) | ((uint32_t)fp8_pack2<Fp8Kind::E5M2>(a[2] * s8, a[3] * s8) << 16);
                } else if constexpr (sizeof(floatX) == 2) {
                    *reinterpret_cast<uint2*>(dinp_x + off + c) = *reinterpret_cast<const uint2*>(bx);
                } else {
                    *reinterpret_cast<float4*>(dinp_x + off + c) = *reinterpret_cast<const float4*>(bx);
                }
                float4 a = *reinterpret_cast<float4*>(dw_acc + c);
                a.x += dy[i][0] * xh[i][0]; a.y += dy[i][1] * xh[i][1]; a.z += dy[i][2] * xh[i][2]; a.w += dy[i][3] * xh[i][3];
                *reinterpret_cast<float4*>(dw_acc + c) = a;
                a = *reinterpret_cast<float4*>(db_acc + c);
                a.x += dy[i][0]; a.y += dy[i][1]; a.z += dy[i][2]; a.w += dy[i][3];
                *reinterpret_cast<float4*>(db_acc + c) = a;
                a = *reinterpret_cast<float4*>(bb_acc + c);
                a.x += (float)bx[0]; a.y += (float)bx[1]; a.z += (float)bx[2]; a.w += (float)bx[3];
                *reinterpret_cast<float4*>(bb_acc + c) = a;
            }
        }
    }
    float* dw_row = scratch + (long long)warp_id * 3 * C;
    for (int c = lane * 4; c < C; c += WARP_SIZE * 4) {
        *reinterpret_cast<float4*>(dw_row + c) = *reinterpret_cast<const float4*>(dw_acc + c);
        *reinterpret_cast<float4*>(dw_row + C + c) = *reinterpret_cast<const float4*>(db_acc + c);
        *reinterpret_cast<float4*>(dw_row + 2 * C + c) = *reinterpret_cast<const float4*>(bb_acc + c);
    }
    if (q.rows || q.amax) fp8_commit(amax8, 0, 0, 0, q.amax, Fp8Stats(), amax_seen);
}
template <int N4>
inline void layernorm_backward_wide4(float* dinp, floatX* dinp_x, float* scratch, const floatX* dout, const float* inp,
                                     const floatX* w, const float* mean, const float* rstd, int N, int C,
                                     float branch_scale, cudaStream_t stream, Fp8Target q = Fp8Target()) {
    layernorm_backward_wide_launch<layernorm_backward_wide4_kernel<N4>, 128 * N4>(dinp, dinp_x, scratch, dout, inp, w,
                                                                                  mean, rstd, N, C, branch_scale, stream, q);
}
// whether the backward kernels can write E5M2 codes of dinp_x (an Fp8Target): every kernel but the generic one
inline bool layernorm_backward_gives_fp8(int C) { return C <= 64 * WARP_SIZE; }
// which kernel the dispatcher runs at C (the tests name it)
inline const char* layernorm_backward_path(int C) {
    if (C <= 32 * WARP_SIZE) return "registers";
    if (C > 64 * WARP_SIZE) return "generic";
    return C % 4 == 0 ? "16-byte accesses, partial sums in shared memory" : "registers, partial sums in shared memory";
}

// dw[c] += sum_k scratch[k][c], db and (when given) dbranch_bias likewise: blockIdx.y picks which of
// the three sums (so the three run on separate SMs). Block (32, 32): x picks the channel, y a residue
// class of k; the 32 partial sums are then added in a fixed order, so the result is deterministic.
__global__ void layernorm_backward_reduce_kernel(float* dw, float* db, float* dbranch_bias, const float* scratch,
                                                 int num_rows, int C) {
    __shared__ float part[32][33];
    float* out = blockIdx.y == 0 ? dw : blockIdx.y == 1 ? db : dbranch_bias;
    if (out == nullptr) return;   // (block-uniform)
    const float* src = scratch + (size_t)blockIdx.y * C;
    int c = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (c < C)
        for (int k = threadIdx.y; k < num_rows; k += 32) sum += src[(long long)k * 3 * C + c];
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int k = 0; k < 32; k++) total += part[k][threadIdx.x];
        out[c] += total;
    }
}
inline void layernorm_backward_reduce(float* dw, float* db, float* dbranch_bias, const float* scratch, int C,
                                      cudaStream_t stream) {
    layernorm_backward_reduce_kernel<<<dim3(ceil_div(C, 32), 3), dim3(32, 32), 0, stream>>>(dw, db, dbranch_bias, scratch,
                                                                                        LN_BACKWARD_WARPS, C);
    cudaCheckLaunch();
}

// scratch: at least layernorm_backward_scratch_floats(C) floats. branch_scale: the residual branch
// scale of the block whose output gradient dinp_x becomes (boundaries.h; 1 in every recipe but legacy
// Q1.15). dbranch_bias (may be null): += the column sums of dinp_x, the bias gradient of the linear
// layer that ends that block (FP32 sums of the BF16 values that layer's backward reads).
// q (FP8 recipe; layernorm_backward_gives_fp8(C)): the E5M2 codes of dinp_x go to q.rows instead of
// dinp_x (which is then left unwritten; its column sums are still taken), the amax to *q.amax; with
// q.rows null and q.amax given (TCFP-12), dinp_x is written as usual and its amax recorded.
inline void layernorm_backward(float* dinp, floatX* dinp_x, float* dw, float* db, float* scratch, const floatX* dout,
                               const float* inp, const floatX* w, const float* mean, const float* rstd,
                               int N, int C, cudaStream_t stream, float branch_scale = 1.0f,
                               float* dbranch_bias = nullptr, Fp8Target q = Fp8Target()) {
    if ((q.active() || q.amax) && (!layernorm_backward_gives_fp8(C) || (uintptr_t)q.rows % 16 != 0)) {
        fprintf(stderr, "error: layernorm_backward: no E5M2 output at C = %d (needs C <= 2048) or unaligned\n", C);
        exit(1);
    }
    const int block = 256, warps_per_block = block / WARP_SIZE;
    const int grid = LN_BACKWARD_WARPS / warps_per_block;
    if (C <= 12 * WARP_SIZE) {
        layernorm_backward_registers_kernel<12><<<grid, block, 0, stream>>>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, q);
    } else if (C <= 24 * WARP_SIZE) {
        layernorm_backward_registers_kernel<24><<<grid, block, 0, stream>>>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, q);
    } else if (C <= 32 * WARP_SIZE) {
        layernorm_backward_registers_kernel<32><<<grid, block, 0, stream>>>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, q);
    } else if (C <= 64 * WARP_SIZE && C % 4 == 0) {
        // 16-byte accesses: N4 = ceil(C / 128) float4 chunks per lane
        switch ((C + 127) / 128) {
            case 9: layernorm_backward_wide4<9>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
            case 10: layernorm_backward_wide4<10>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
            case 11: layernorm_backward_wide4<11>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
            case 12: layernorm_backward_wide4<12>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
            case 13: layernorm_backward_wide4<13>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
            case 14: layernorm_backward_wide4<14>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
            case 15: layernorm_backward_wide4<15>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
            default: layernorm_backward_wide4<16>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q); break;
        }
    } else if (C <= 40 * WARP_SIZE) {
        layernorm_backward_wide<40>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q);
    } else if (C <= 52 * WARP_SIZE) {
        layernorm_backward_wide<52>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q);
    } else if (C <= 64 * WARP_SIZE) {
        layernorm_backward_wide<64>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale, stream, q);
    } else {
        layernorm_backward_kernel<<<grid, block, 0, stream>>>(dinp, dinp_x, scratch, dout, inp, w, mean, rstd, N, C, branch_scale);
    }
    cudaCheckLaunch();
    layernorm_backward_reduce(dw, db, dbranch_bias, scratch, C, stream);
}

// The E5M2 codes of a LayerNorm backward's dinp_x once more, from the residual gradient dinp it stored
// (TCFP-12's speculative fresh scales: the backward wrote q.rows with a guessed scale, and the fresh one,
// known only once its amax is, differed). Each code is made as the backward kernels make it: the stored
// FP32 sum, times branch_scale, rounded to floatX, times the scale *q.scale, to E5M2 (saturating). So the
// codes equal those of a backward run with the fresh scale, bit for bit. Must run before anything adds
// to dinp again. Runs only while *q.run_only_if is non-zero (decided on the GPU, no host sync); nothing
// else is written (the column sums and the amax do not depend on the scale). 8 values per thread where
// the row width allows 16-byte loads and 8-byte stores.
__global__ void __launch_bounds__(256) layernorm_backward_codes_kernel(uint8_t* codes, const float* dinp, long long n,
                                                                       float branch_scale, const float* scale,
                                                                       const int* run_only_if, bool vec8) {
    if (*run_only_if == 0) return;
    const float s8 = *scale;
    const long long stride = (long long)gridDim.x * blockDim.x;
    auto code_of = [&](float acc) {
        const float bx = (float)(floatX)(branch_scale * acc);
        return (uint8_t)(fp8_pack2<Fp8Kind::E5M2>(bx * s8, 0.0f) & 0xFFu);
    };
    if (vec8) {
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n / 8; i += stride) {
            const float4 a = reinterpret_cast<const float4*>(dinp)[2 * i];
            const float4 b = reinterpret_cast<const float4*>(dinp)[2 * i + 1];
            const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            uint32_t word[2] = {0u, 0u};
#pragma unroll
            for (int k = 0; k < 8; k++) word[k / 4] |= (uint32_t)code_of(v[k]) << (8 * (k % 4));
            reinterpret_cast<uint2*>(codes)[i] = make_uint2(word[0], word[1]);
        }
    } else {
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) codes[i] = code_of(dinp[i]);
    }
}
inline void layernorm_backward_codes_again(const Fp8Target& q, const float* dinp, int N, int C, float branch_scale,
                                           cudaStream_t stream) {
    if (!q.active() || !q.scale || !q.run_only_if) {
        fprintf(stderr, "error: layernorm_backward_codes_again: needs the codes, their scale and the flag\n");
        exit(1);
    }
    const long long n = (long long)N * C;
    const bool vec8 = n % 8 == 0 && (uintptr_t)dinp % 16 == 0 && (uintptr_t)q.rows % 8 == 0;
    const long long work = vec8 ? n / 8 : n;
    const int grid = (int)std::max<long long>(1, std::min<long long>(ceil_div(work, 256LL), 16LL * device_sm_count()));
    layernorm_backward_codes_kernel<<<grid, 256, 0, stream>>>(q.rows, dinp, n, branch_scale, q.scale, q.run_only_if, vec8);
    cudaCheckLaunch();
}
