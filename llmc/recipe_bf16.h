// recipe_bf16.h: the BF16 precision recipe (the baseline every other recipe is compared with).
//
// A recipe touches the model in one place: the linear-layer API below (forward, backward-dx,
// backward-dw), used for every transformer linear (qkv, attention projection, fc, fc projection).
// The LM head, embeddings, attention and norms are not linears of the recipe and stay in the
// build's precision. BF16 is the identity recipe: plain cuBLASLt GEMMs with BF16 operands and
// FP32 accumulation (FP32 operands in the PRECISION=FP32 reference build).
#pragma once
#include "cuda_common.h"
#include "matmul.cuh"

#define RECIPE_NAME "bf16"

struct LinearScratch {
    float* bias_partials; // BIAS_ROW_GROUPS * max OC floats, for the bias gradient
};

// out (N x OC) = inp (N x C) W^T + bias;  W is (OC x C) row-major as in the checkpoint
inline void linear_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, cudaStream_t stream) {
    matmul(out, weight, inp, bias, OC, N, C, true, false, 1.0f, 0.0f, false, stream);
}

// The fc layer with its GELU: gelu_out = gelu(inp W^T + bias), pre_gelu = inp W^T + bias (kept for
// backward). BF16 fuses the GELU into the GEMM's epilogue (cuBLASLt, tanh approximation).
inline void linear_forward_gelu(floatX* gelu_out, floatX* pre_gelu, const floatX* inp, const floatX* weight,
                                const floatX* bias, int N, int C, int OC, cudaStream_t stream) {
    matmul(gelu_out, weight, inp, bias, OC, N, C, true, false, 1.0f, 0.0f, false, stream, MatmulBatch(),
           EPI_GELU_BIAS, pre_gelu);
}

// dinp (N x C) = (dout W) * gelu'(pre_gelu): the fc projection's input gradient through the GELU
inline void linear_backward_dx_dgelu(floatX* dinp, const floatX* dout, const floatX* weight, const floatX* pre_gelu,
                                     int N, int C, int OC, cudaStream_t stream) {
    matmul(dinp, weight, dout, nullptr, C, N, OC, false, false, 1.0f, 0.0f, false, stream, MatmulBatch(),
           EPI_DGELU, (void*)pre_gelu);
}

// dinp (N x C) = dout (N x OC) W   (overwrites dinp)
inline void linear_backward_dx(floatX* dinp, const floatX* dout, const floatX* weight,
                               int N, int C, int OC, cudaStream_t stream) {
    matmul(dinp, weight, dout, nullptr, C, N, OC, false, false, 1.0f, 0.0f, false, stream);
}

// dweight (OC x C, FP32) += dout^T inp;  dbias (OC, FP32) += column sums of dout
inline void linear_backward_dw(float* dweight, float* dbias, const floatX* dout, const floatX* inp,
                               const LinearScratch& scratch, int N, int C, int OC, cudaStream_t stream) {
    matmul(dweight, inp, dout, nullptr, C, OC, N, false, true, 1.0f, 1.0f, true, stream);
    if (dbias) bias_backward(dbias, scratch.bias_partials, dout, N, OC, stream);
}
