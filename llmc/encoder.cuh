// encoder.cuh: token + position embedding, forward and (deterministic) backward.
//   out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
// Backward: dwpe[t,:] += sum_b dout[b,t,:] and dwte[v,:] += sum over positions holding token v.
// Atomics would make the order of additions (and so the bits of dwte) vary between runs, so the
// host groups positions by token first (EmbeddingBuckets) and one thread sums each (token, channel)
// over its positions in increasing order.
#pragma once
#include <vector>
#include <algorithm>
#include <cstring>
#include "cuda_common.h"
#include "boundaries.h"

template <class Bd>
__global__ void encoder_forward_kernel(float* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       int B, int T, int C) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)B * T * C) return;
    int c = idx % C;
    int bt = idx / C;
    int t = bt % T;
    int token = inp[bt];
    out[idx] = Bd::embedding((float)wte[(long long)token * C + c] + (float)wpe[(long long)t * C + c]);
}

// out: the FP32 residual stream; Bd::embedding applies to each sum (boundaries.h)
template <class Bd = IdentityBoundaries>
inline void encoder_forward(float* out, const int* inp, const floatX* wte, const floatX* wpe,
                            int B, int T, int C, cudaStream_t stream) {
    const int block = 256;
    long long n = (long long)B * T * C;
    encoder_forward_kernel<Bd><<<ceil_div(n, block), block, 0, stream>>>(out, inp, wte, wpe, B, T, C);
    cudaCheckLaunch();
}

// The positions of a micro-batch grouped by token id, built on the host from the input tokens.
// tokens[u] is the u-th distinct token, its positions are positions[offsets[u] .. offsets[u+1]).
struct EmbeddingBuckets {
    std::vector<int> tokens, offsets, positions;
    void build(const int* inp, int BT) {
        std::vector<int> order(BT);
        for (int i = 0; i < BT; i++) order[i] = i;
        // stable sort by token keeps positions increasing within a token: a fixed summation order
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return inp[a] < inp[b]; });
        tokens.clear(); offsets.clear(); positions.assign(order.begin(), order.end());
        for (int i = 0; i < BT; i++) {
            if (i == 0 || inp[order[i]] != inp[order[i - 1]]) {
                tokens.push_back(inp[order[i]]);
                offsets.push_back(i);
            }
        }
        offsets.push_back(BT);
    }
};

// one thread per (distinct token, channel); blockIdx.y picks the token
__global__ void wte_backward_kernel(float* dwte, const float* dout, const int* tokens, const int* offsets,
                                    const int* positions, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int u = blockIdx.y;
    if (c >= C) return;
    float sum = 0.0f;
    for (int i = offsets[u]; i < offsets[u + 1]; i++) sum += (float)dout[(long long)positions[i] * C + c];
    dwte[(long long)tokens[u] * C + c] += sum;
}

// one thread per (t, channel), summing over the batch in order
__global__ void wpe_backward_kernel(float* dwpe, const float* dout, int B, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int t = blockIdx.y;
    if (c >= C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += (float)dout[((long long)b * T + t) * C + c];
    dwpe[(long long)t * C + c] += sum;
}

// bucket_dev: device buffer of 3*BT+1 ints receiving tokens | offsets | positions, uploaded from
// bucket_pinned (page-locked host memory of the same size) so that the copy is truly asynchronous;
// `uploaded` guards the pinned buffer: it is rewritten only once the previous upload has finished.
inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const EmbeddingBuckets& buckets,
                             int* bucket_dev, int* bucket_pinned, cudaEvent_t uploaded, int B, int T, int C,
                             cudaStream_t stream) {
    const int BT = B * T;
    const int U = (int)buckets.tokens.size();
    cudaCheck(cudaEventSynchronize(uploaded));
    memcpy(bucket_pinned, buckets.tokens.data(), U * sizeof(int));
    memcpy(bucket_pinned + BT, buckets.offsets.data(), (U + 1) * sizeof(int));
    memcpy(bucket_pinned + 2 * BT + 1, buckets.positions.data(), BT * sizeof(int));
    cudaCheck(cudaMemcpyAsync(bucket_dev, bucket_pinned, (3 * BT + 1) * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(uploaded, stream));
    const int* d_tokens = bucket_dev;
    const int* d_offsets = bucket_dev + BT;
    const int* d_positions = bucket_dev + 2 * BT + 1;
    const int block = 256;
    wte_backward_kernel<<<dim3(ceil_div(C, block), U), block, 0, stream>>>(dwte, dout, d_tokens, d_offsets, d_positions, C);
    cudaCheckLaunch();
    wpe_backward_kernel<<<dim3(ceil_div(C, block), T), block, 0, stream>>>(dwpe, dout, B, T, C);
    cudaCheckLaunch();
}
