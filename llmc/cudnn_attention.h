// cudnn_attention.h: causal self-attention through cuDNN's fused SDPA ("flash") kernels, the optional
// USE_CUDNN=1 path (make USE_CUDNN=1 ...). The default path is our own flash attention
// (flash_attention.cuh); this one exists because cuDNN's Hopper kernels can be faster at head size 64
// and because users compare against it.
//
// Layouts are the trainer's, the same as flash_attention.cuh's:
//   qkv  (B, T, 3, NH, HS) BF16: Q, K and V of each token side by side; cuDNN reads them in place
//        as (B, NH, T, HS) tensors with strides (T*3C, HS, 3C, 1), C = NH*HS
//   out  (B, T, NH, HS) BF16: strides (T*C, HS, C, 1)
//   stats (B, NH, T) FP32: the natural-log log-sum-exp of each query row's scaled scores (cuDNN's
//        "Stats"), kept from forward for the backward (in the trainer's att_lse buffer)
//   dqkv like qkv: dQ, dK and dV written in place.
// The softmax scale is 1/sqrt(HS). The backward is cuDNN's deterministic algorithm, so that runs and
// resumed runs repeat their bits (as with our flash attention); LLMC_CUDNN_DETERMINISTIC=0 in the
// environment lets cuDNN sum dQ with atomics instead (what PyTorch's SDPA does).
//
// Implemented in cudnn_attention.cpp (a separate translation unit: the cuDNN frontend headers take
// a minute to compile) on the frontend's graph API; graphs are built once per shape and cached.
#pragma once
#include <cstddef>
#include <string>
#include <cuda_runtime.h>

// true when cuDNN's SDPA graphs for this shape build and are supported on this GPU (training graphs:
// forward with stats, and backward); the workspace is allocated here, outside the training steps.
// On false, *why says what cuDNN refused (the trainer then uses its own flash attention).
bool cudnn_attention_prepare(int B, int T, int NH, int HS, std::string* why);
// out, stats = attention(qkv); the graph of this shape is built on first use if prepare did not
void cudnn_attention_forward(void* out, float* stats, const void* qkv, int B, int T, int NH, int HS,
                             cudaStream_t stream);
// dqkv = the gradient of the attention given dout, from qkv, out and stats of the forward
void cudnn_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* stats,
                              int B, int T, int NH, int HS, cudaStream_t stream);
// the workspace's size in bytes (the largest any built graph needs)
size_t cudnn_attention_workspace_bytes();
void cudnn_attention_free();
