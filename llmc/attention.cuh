// attention.cuh: causal multi-head self-attention, forward and backward, through batched GEMMs.
//
// This is the simple, exact version: the (T x T) attention matrix of every (batch, head) is
// materialized, and the probabilities of each layer are kept for the backward pass. A fused
// flash-attention kernel replaces it for speed (flash_attention.cuh); this one stays the reference.
//
// Layouts: qkv is (B, T, 3C) with C = NH * HS, laid out [q | k | v] along the last dimension.
// Kernels permute it to q, k, v of shape (B, NH, T, HS) so that every (b, h) is one contiguous
// (T x HS) matrix for the batched GEMMs.
//   preatt = q k^T / sqrt(HS)        (B, NH, T, T)      scores, row t1 = query, column t2 = key
//   att    = causal_softmax(preatt)  (B, NH, T, T)      zeros above the diagonal
//   y      = att v                   (B, NH, T, HS)  -> unpermuted to (B, T, C)
// Boundaries (boundaries.h), for a recipe whose Bd::ACTIVE: the score GEMM computes the raw q.k
// (alpha 1, the "expansion scale" of the Q1.15 seed), softmax reads Bd::attention_scores(q.k) times
// 1/sqrt(HS) and stores Bd::softmax_output(p); att @ v is stored through Bd::attention_output. The
// backward treats the hooks as the identity; its 1/sqrt(HS) is the same in both forms.
// Backward, with dy given:
//   datt = dy v^T,  dv = att^T dy,  dpreatt = att * (datt - rowsum(att * datt)),
//   dq = dpreatt k / sqrt(HS),  dk = dpreatt^T q / sqrt(HS)
#pragma once
#include "cuda_common.h"
#include "matmul.cuh"
#include "boundaries.h"

// Element idx of a (B, NH, T, HS) tensor sits at this offset of the (B, T, width * NH * HS) layout,
// in its first block of NH * HS (width 3 for qkv = [q | k | v], 1 for the attention output).
__device__ __forceinline__ long long head_to_token_offset(long long idx, int T, int NH, int HS, int width) {
    const int d = idx % HS;
    const int t = (idx / HS) % T;
    const int h = (idx / ((long long)HS * T)) % NH;
    const int b = idx / ((long long)HS * T * NH);
    return ((long long)b * T + t) * width * NH * HS + (long long)h * HS + d;
}

// qkv (B,T,3,NH,HS) -> q, k, v each (B,NH,T,HS)
__global__ void attention_permute_kernel(floatX* q, floatX* k, floatX* v, const floatX* qkv,
                                         int B, int T, int NH, int HS) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)B * NH * T * HS;
    if (idx >= total) return;
    const int C = NH * HS;
    const long long src = head_to_token_offset(idx, T, NH, HS, 3);
    q[idx] = qkv[src];
    k[idx] = qkv[src + C];
    v[idx] = qkv[src + 2 * C];
}

// dq, dk, dv each (B,NH,T,HS) -> dqkv (B,T,3,NH,HS)
__global__ void attention_unpermute_qkv_kernel(floatX* dqkv, const floatX* dq, const floatX* dk, const floatX* dv,
                                               int B, int T, int NH, int HS) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)B * NH * T * HS;
    if (idx >= total) return;
    const int C = NH * HS;
    const long long dst = head_to_token_offset(idx, T, NH, HS, 3);
    dqkv[dst] = dq[idx];
    dqkv[dst + C] = dk[idx];
    dqkv[dst + 2 * C] = dv[idx];
}

// (B,NH,T,HS) <-> (B,T,NH*HS); to_btc selects the direction. Bd::attention_output applies to what
// it writes (the forward's att @ v).
template <class Bd = IdentityBoundaries>
__global__ void attention_heads_kernel(floatX* out, const floatX* inp, int B, int T, int NH, int HS, bool to_btc) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)B * NH * T * HS;
    if (idx >= total) return;
    const long long btc = head_to_token_offset(idx, T, NH, HS, 1);
    if (to_btc) out[btc] = (floatX)Bd::attention_output((float)inp[idx]);
    else out[idx] = inp[btc];
}

// One warp per row of one (b, h): att[t1, :] = softmax over t2 <= t1 of s[t1, t2]; zero for t2 > t1,
// where s = Bd::attention_scores(preatt) * inv_temperature.
template <class Bd>
__global__ void causal_softmax_forward_kernel(floatX* att, const floatX* preatt, int num_rows, int T,
                                              float inv_temperature) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= num_rows) return;
    int lane = threadIdx.x % WARP_SIZE;
    int t1 = row % T;
    const floatX* x = preatt + (long long)row * T;
    floatX* y = att + (long long)row * T;
    auto score = [&](int t2) {
        if constexpr (Bd::ACTIVE) return Bd::attention_scores((float)x[t2]) * inv_temperature;
        else return (float)x[t2];
    };
    float maxv = -INFINITY;
    for (int t2 = lane; t2 <= t1; t2 += WARP_SIZE) maxv = fmaxf(maxv, score(t2));
    maxv = warp_max(maxv);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t1; t2 += WARP_SIZE) sum += expf(score(t2) - maxv);
    float inv = 1.0f / warp_sum(sum);
    for (int t2 = lane; t2 < T; t2 += WARP_SIZE) {
        y[t2] = (floatX)(t2 <= t1 ? Bd::softmax_output(expf(score(t2) - maxv) * inv) : 0.0f);
    }
}

// dpreatt[t1, t2] = att[t1,t2] * (datt[t1,t2] - sum_j att[t1,j] datt[t1,j]) for t2 <= t1, else 0.
// Written in place over datt.
__global__ void causal_softmax_backward_kernel(floatX* datt_to_dpreatt, const floatX* att, int num_rows, int T) {
    int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= num_rows) return;
    int lane = threadIdx.x % WARP_SIZE;
    int t1 = row % T;
    const floatX* a = att + (long long)row * T;
    floatX* d = datt_to_dpreatt + (long long)row * T;
    float dot = 0.0f;
    for (int t2 = lane; t2 <= t1; t2 += WARP_SIZE) dot += (float)a[t2] * (float)d[t2];
    dot = warp_sum(dot);
    for (int t2 = lane; t2 < T; t2 += WARP_SIZE) {
        float v = t2 <= t1 ? (float)a[t2] * ((float)d[t2] - dot) : 0.0f;
        d[t2] = (floatX)v;
    }
}

// Scratch buffers, sized for the largest B*T the model runs with.
struct AttentionScratch {
    floatX* q; floatX* k; floatX* v;    // (B,NH,T,HS) each
    floatX* y;                          // (B,NH,T,HS)
    floatX* scores;                     // (B,NH,T,T): preatt in forward, datt/dpreatt in backward
};

// out: (B,T,C); att: (B,NH,T,T), kept for backward
template <class Bd = IdentityBoundaries>
inline void attention_forward(floatX* out, floatX* att, const floatX* qkv, const AttentionScratch& s,
                              int B, int T, int NH, int HS, cudaStream_t stream) {
    const int block = 256;
    long long n = (long long)B * NH * T * HS;
    attention_permute_kernel<<<ceil_div(n, block), block, 0, stream>>>(s.q, s.k, s.v, qkv, B, T, NH, HS);
    cudaCheckLaunch();
    const float scale = 1.0f / sqrtf((float)HS);
    // the 1/sqrt(HS) in the GEMM, or (active boundaries) in the softmax, after the score's hook
    const float gemm_scale = Bd::ACTIVE ? 1.0f : scale, softmax_scale = Bd::ACTIVE ? scale : 1.0f;
    MatmulBatch bt; bt.count = B * NH;
    // preatt: D (T x T) col-major = element (t2, t1) = k[t2] . q[t1]
    bt.stride_a = (long long)T * HS; bt.stride_b = (long long)T * HS; bt.stride_d = (long long)T * T;
    matmul(s.scores, s.k, s.q, nullptr, T, T, HS, true, false, gemm_scale, 0.0f, false, stream, bt);
    int rows = B * NH * T;
    causal_softmax_forward_kernel<Bd><<<ceil_div(rows, block / WARP_SIZE), block, 0, stream>>>(att, s.scores, rows, T,
                                                                                                softmax_scale);
    cudaCheckLaunch();
    // y: D (HS x T) col-major = element (d, t1) = sum_t2 v[t2, d] att[t1, t2]
    bt.stride_a = (long long)T * HS; bt.stride_b = (long long)T * T; bt.stride_d = (long long)T * HS;
    matmul(s.y, s.v, att, nullptr, HS, T, T, false, false, 1.0f, 0.0f, false, stream, bt);
    attention_heads_kernel<Bd><<<ceil_div(n, block), block, 0, stream>>>(out, s.y, B, T, NH, HS, true);
    cudaCheckLaunch();
}

// dqkv: (B,T,3C) written; dout: (B,T,C); att, qkv from the forward pass
inline void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* att,
                               const AttentionScratch& s, floatX* dq, floatX* dk, floatX* dv,
                               int B, int T, int NH, int HS, cudaStream_t stream) {
    const int block = 256;
    long long n = (long long)B * NH * T * HS;
    attention_permute_kernel<<<ceil_div(n, block), block, 0, stream>>>(s.q, s.k, s.v, qkv, B, T, NH, HS);
    cudaCheckLaunch();
    floatX* dy = s.y;
    attention_heads_kernel<<<ceil_div(n, block), block, 0, stream>>>(dy, dout, B, T, NH, HS, false);
    cudaCheckLaunch();
    const float scale = 1.0f / sqrtf((float)HS);
    MatmulBatch bt; bt.count = B * NH;
    // datt (row-major t1, t2) = dy[t1] . v[t2]: same form as preatt
    bt.stride_a = (long long)T * HS; bt.stride_b = (long long)T * HS; bt.stride_d = (long long)T * T;
    matmul(s.scores, s.v, dy, nullptr, T, T, HS, true, false, 1.0f, 0.0f, false, stream, bt);
    // dv: D (HS x T) col-major = element (d, t2) = sum_t1 dy[t1, d] att[t1, t2]
    bt.stride_a = (long long)T * HS; bt.stride_b = (long long)T * T; bt.stride_d = (long long)T * HS;
    matmul(dv, dy, att, nullptr, HS, T, T, false, true, 1.0f, 0.0f, false, stream, bt);
    int rows = B * NH * T;
    causal_softmax_backward_kernel<<<ceil_div(rows, block / WARP_SIZE), block, 0, stream>>>(s.scores, att, rows, T);
    cudaCheckLaunch();
    // dq: element (d, t1) = scale * sum_t2 k[t2, d] dpreatt[t1, t2]
    matmul(dq, s.k, s.scores, nullptr, HS, T, T, false, false, scale, 0.0f, false, stream, bt);
    // dk: element (d, t2) = scale * sum_t1 q[t1, d] dpreatt[t1, t2]
    matmul(dk, s.q, s.scores, nullptr, HS, T, T, false, true, scale, 0.0f, false, stream, bt);
    attention_unpermute_qkv_kernel<<<ceil_div(n, block), block, 0, stream>>>(dqkv, dq, dk, dv, B, T, NH, HS);
    cudaCheckLaunch();
}
