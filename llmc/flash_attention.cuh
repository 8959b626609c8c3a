// flash_attention.cuh: fused causal attention, forward and backward, for Hopper (sm_90) in BF16:
// the public API (flash_attention_forward, flash_attention_backward and their queries) and the host
// side that picks a kernel family and launches it. The kernels and what they share live in:
//   flash_attention_tiles.cuh   device routines of both families: PTX wrappers, the softmax under a
//                               boundary policy, padded shared-memory tiles, the FP8 epilogue
//   flash_attention_mma.cuh     the mma.sync m16n8k16 kernels (every head size)
//   flash_attention_wgmma.cuh   the wgmma kernels (HS = 64 on sm_90a)
//
// Nothing of size T x T reaches device memory. Scores are computed a tile at a time on the tensor
// cores (bf16 -> fp32), the softmax is done online (running max and sum in FP32), and the forward
// keeps only the log-sum-exp of each query row for the backward pass, which recomputes the
// probabilities from Q, K and the log-sum-exp.
//
// Two implementations of the same tiling and arithmetic: kernels on mma.sync m16n8k16, described
// in flash_attention_mma.cuh (all head sizes), and, at HS = 64 on sm_90a where built with
// -DFLASH_ATTENTION_WGMMA=1 (the Makefile's default), kernels on Hopper's warpgroup MMA (wgmma, one
// warpgroup per 64 rows) in flash_attention_wgmma.cuh.
//
// Layouts (as in attention.cuh): qkv is (B, T, 3C), C = NH*HS, [q | k | v] along the last dim:
//   q[b,t,h,d] = qkv[(b*T+t)*3C + h*HS + d], k at +C, v at +2C.
// out and dout are (B, T, C); lse is (B, NH, T) FP32, natural log of sum_t2 exp(scale * q.k).
// dqkv is (B, T, 3C) in the layout of qkv, every element written.
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
// FLASH GRID ORDER. Every kernel's grid is (blocks along T, B*NH): x, which the hardware hands out
// fastest, walks the query (key) blocks of one (batch, head), so the CTAs resident at a time cover a
// few heads, all of whose blocks stream the same K/V (Q/dO) tiles: those come from L2 after the
// first read. The transposed grid, (B*NH, blocks along T), would make the resident CTAs one block of
// each of hundreds of heads, each streaming its own head's tiles, evicted again before the next block
// of that head runs: the tiles would come from HBM once per CTA, and the backward would be bound by
// memory bandwidth. B*NH is then limited to 65535 (check_heads).
//
// Only the BF16 build uses it; the FP32 reference build keeps the materialized path.
#pragma once
#pragma once
#include "flash_attention_mma.cuh"
#include "flash_attention_wgmma.cuh"

#if !defined(ENABLE_FP32)

namespace flash_detail {


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
// With its amax alone (Fp8Target::amax_only, the FP8 recipe's current scaling): out written as usual and its
// amax recorded (tiles_amax), the max of |out| over the stored BF16 values.
template <class Bd = IdentityBoundaries>
inline void flash_attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int HS,
                                    cudaStream_t stream, floatX* probs = nullptr, Fp8Target out8 = Fp8Target()) {
    flash_detail::check_args(out, qkv, qkv, T, HS, "flash_attention_forward");
    flash_detail::check_heads(B, NH, "flash_attention_forward");
    if (probs != nullptr && !Bd::ACTIVE) {
        fprintf(stderr, "error: flash_attention_forward: probs is only written under active boundaries\n");
        exit(1);
    }
    if (out8.amax_only() && !flash_attention_forward_gives_fp8(HS)) {
        fprintf(stderr, "error: flash_attention_forward: no amax output at head size %d on this build / GPU\n", HS);
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
