// adamw.cuh: global gradient norm (for clipping) and the AdamW update.
// AdamW with decoupled weight decay, step t >= 1, as torch.optim.AdamW:
//   g = grad * clip_scale,  clip_scale = min(1, clip / (norm + 1e-6))
//   m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
//   master -= lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * master )
//   param = round(master)   (stochastic rounding to BF16, seeded per step: unbiased, reproducible)
// Master weights, moments and gradients are FP32. Under ZeRO-1 (zero.h) a process updates only its
// pieces of each tensor: the moments and master weights are its packed shard, the parameters and
// gradients are read at the full index of each shard element (every block's owned piece), and the
// stochastic rounding draws the bits of that full index, so the update of an element does not
// depend on how the state is sharded. A recipe whose boundaries constrain the weights
// (boundaries.h: Bd::constrain_weight, the Q1.15 "constrained" build) maps the new master weight
// through it before the rounding.
#pragma once
#include "cuda_common.h"
#include "boundaries.h"

#define NORM_BLOCKS 512

// partial[block] = sum of squares over a fixed grid-stride slice: deterministic
__global__ void sum_squares_kernel(float* partial, const float* x, long long n) {
    float s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float v = x[i];
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials_kernel(float* out, const float* partial, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *out = s;
}

// partial[block] += sum of squares of the owned pieces of one tensor (zero.h): rows blocks of `row`
// elements, `piece` of them from piece_offset on; n = rows * piece
__global__ void sum_squares_pieces_kernel(float* partial, const float* x, long long n, long long piece, long long row,
                                          long long piece_offset) {
    float s = 0.0f;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x) {
        float v = x[(j / piece) * row + piece_offset + j % piece];
        s += v * v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] += s;
}

// out (device): the sum of squares of x[0..n). scratch: NORM_BLOCKS floats.
inline void global_norm_squared(float* out, float* scratch, const float* x, long long n, cudaStream_t stream) {
    sum_squares_kernel<<<NORM_BLOCKS, 512, 0, stream>>>(scratch, x, n);
    cudaCheckLaunch();
    sum_partials_kernel<<<1, 512, 0, stream>>>(out, scratch, NORM_BLOCKS);
    cudaCheckLaunch();
}

// One tensor: shard element j (master, m, v) is element full(j) of params and grads, where
// full(j) = (j / piece) * row + piece_offset + j % piece (zero.h; the whole tensor: piece = row = n).
template <class Bd>
__global__ void adamw_kernel(floatX* params, float* master, const float* grads, float* m, float* v, long long n,
                             long long piece, long long row, long long piece_offset,
                             float lr, float beta1, float beta2, float bias_corr1, float bias_corr2, float eps,
                             float weight_decay, float grad_scale, uint32_t seed) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    // (a block owned whole, the one-process case: the shard index is the full index)
    const long long i = piece == row ? j : (j / piece) * row + piece_offset + j % piece;
    float g = grads[i] * grad_scale;
    float mi = beta1 * m[j] + (1.0f - beta1) * g;
    float vi = beta2 * v[j] + (1.0f - beta2) * g * g;
    m[j] = mi;
    v[j] = vi;
    float p = master[j];
    float update = (mi / bias_corr1) / (sqrtf(vi / bias_corr2) + eps);
    p -= lr * (update + weight_decay * p);
    if constexpr (Bd::CONSTRAINS_WEIGHTS) p = Bd::constrain_weight(p);
    master[j] = p;
    store_rounded(&params[i], p, hash_u32(seed, (uint32_t)i));
}

// The owned pieces of one tensor (zero.h): params and grads point at the tensor's first element,
// master, m and v at its first shard element; n = rows * piece shard elements (a process that owns
// the whole tensor: piece = row = n)
template <class Bd = IdentityBoundaries>
inline void adamw_update_pieces(floatX* params, float* master, const float* grads, float* m, float* v, long long n,
                                long long piece, long long row, long long piece_offset, float lr, float beta1,
                                float beta2, int t, float eps, float weight_decay, float grad_scale, uint32_t seed,
                                cudaStream_t stream) {
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    adamw_kernel<Bd><<<ceil_div(n, 512), 512, 0, stream>>>(params, master, grads, m, v, n, piece, row, piece_offset, lr,
                                                           beta1, beta2, bc1, bc2, eps, weight_decay, grad_scale, seed);
    cudaCheckLaunch();
}
