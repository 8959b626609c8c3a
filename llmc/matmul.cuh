// matmul.cuh: GEMMs through cuBLASLt, and the bias gradient.
//
// cuBLASLt is column-major. We keep row-major tensors, so a row-major (rows x cols) array is a
// column-major (cols x rows) matrix. The wrapper takes the column-major view:
//     D (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * D      [optional + bias[m] per row of D]
// with A stored (k x m) when transA, else (m x k); B stored (n x k) when transB, else (k x n).
// How the model's row-major products map onto it (inp: BT x C, W: OC x C, out: BT x OC):
//     out = inp W^T + b     -> m=OC, n=BT, k=C,  A=W (transA),  B=inp,          bias epilogue
//     dinp = dout W         -> m=C,  n=BT, k=OC, A=W,           B=dout
//     dW += dout^T inp      -> m=C,  n=OC, k=BT, A=inp,         B=dout (transB), beta=1, FP32 output
#pragma once
#include <map>
#include <cstring>
#include "cuda_common.h"

static cublasLtHandle_t g_cublaslt = nullptr;
static void* g_cublaslt_workspace = nullptr;
static const size_t CUBLASLT_WORKSPACE_BYTES = 32ull << 20;

// Accumulation is FP32 in every build. In the PRECISION=FP32 reference build the operands are FP32
// and CUBLAS_COMPUTE_32F keeps the products in true FP32 (no TF32).
static const cublasComputeType_t MATMUL_COMPUTE = CUBLAS_COMPUTE_32F;

inline void matmul_init() {
    cublasCheck(cublasLtCreate(&g_cublaslt));
    g_cublaslt_workspace = cuda_malloc_or_die(CUBLASLT_WORKSPACE_BYTES, "cuBLASLt workspace");
}

struct MatmulBatch { int count = 1; long long stride_a = 0, stride_b = 0, stride_d = 0; };

// A cuBLASLt plan (descriptors + the heuristic's algorithm) for one GEMM shape. Building one costs
// tens of microseconds of CPU time, and a training step runs the same few dozen shapes hundreds of
// times, so plans are cached by shape.
// Epilogues fused into the GEMM (cuBLASLt's GELU is the tanh approximation, as GPT-2's):
//   EPI_GELU_BIAS: D = gelu(AB + bias), and aux = AB + bias (the pre-activation, for backward)
//   EPI_DGELU:     D = (AB) * gelu'(aux)   (aux: the pre-activation saved in forward)
enum MatmulEpilogue { EPI_NONE = 0, EPI_GELU_BIAS = 1, EPI_DGELU = 2 };

struct MatmulKey {
    int m, n, k, transA, transB, has_bias, d_fp32, batch, epilogue, pad_;
    long long stride_a, stride_b, stride_d;
    bool operator<(const MatmulKey& o) const {
        return memcmp(this, &o, sizeof(MatmulKey)) < 0;
    }
};
struct MatmulPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};
static std::map<MatmulKey, MatmulPlan> g_matmul_plans;

inline MatmulPlan& matmul_plan(const MatmulKey& key) {
    auto it = g_matmul_plans.find(key);
    if (it != g_matmul_plans.end()) return it->second;
    MatmulPlan p;
    const int m = key.m, n = key.n, k = key.k;
    const bool transA = key.transA, transB = key.transB;
    cublasCheck(cublasLtMatmulDescCreate(&p.desc, MATMUL_COMPUTE, CUDA_R_32F));
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (key.epilogue == EPI_GELU_BIAS) epi = key.has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (key.epilogue == EPI_DGELU) epi = CUBLASLT_EPILOGUE_DGELU;
    else if (key.has_bias) epi = CUBLASLT_EPILOGUE_BIAS;
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (key.has_bias) {
        cudaDataType_t bias_type = CUDA_R_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    if (key.epilogue != EPI_NONE) {
        // aux has D's shape and leading dimension, in floatX
        int64_t aux_ld = m;
        cudaDataType_t aux_type = CUDA_R_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
    }
    cudaDataType_t d_type = key.d_fp32 ? CUDA_R_32F : CUDA_R_FLOATX;
    cublasCheck(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_FLOATX, transA ? k : m, transA ? m : k, transA ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_FLOATX, transB ? n : k, transB ? k : n, transB ? n : k));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.ld, d_type, m, n, m));
    if (key.batch > 1) {
        cublasLtMatrixLayout_t layouts[3] = {p.la, p.lb, p.ld};
        long long strides[3] = {key.stride_a, key.stride_b, key.stride_d};
        for (int i = 0; i < 3; i++) {
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &key.batch, sizeof(int)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(long long)));
        }
    }
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &CUBLASLT_WORKSPACE_BYTES, sizeof(CUBLASLT_WORKSPACE_BYTES)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(g_cublaslt, p.desc, p.la, p.lb, p.ld, p.ld, pref, 1, &heuristic, &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0) {
        fprintf(stderr, "error: cuBLASLt has no algorithm for m=%d n=%d k=%d transA=%d transB=%d bias=%d epilogue=%d\n",
                m, n, k, (int)transA, (int)transB, key.has_bias, key.epilogue);
        exit(1);
    }
    p.algo = heuristic.algo;
    return g_matmul_plans.emplace(key, p).first->second;
}

// The general entry point. d_fp32 selects an FP32 output (parameter gradients); otherwise D is floatX.
// bias (floatX, length m) may be null. aux: the epilogue's extra (m x n) floatX matrix, see above.
inline void matmul(void* d, const floatX* a, const floatX* b, const floatX* bias,
                   int m, int n, int k, bool transA, bool transB, float alpha, float beta,
                   bool d_fp32, cudaStream_t stream, MatmulBatch batch = MatmulBatch(),
                   MatmulEpilogue epilogue = EPI_NONE, void* aux = nullptr) {
    MatmulKey key;
    memset(&key, 0, sizeof(key)); // the key is compared bytewise
    key.m = m; key.n = n; key.k = k; key.transA = transA; key.transB = transB;
    key.has_bias = bias != nullptr; key.d_fp32 = d_fp32; key.batch = batch.count; key.epilogue = epilogue;
    if (batch.count > 1) { key.stride_a = batch.stride_a; key.stride_b = batch.stride_b; key.stride_d = batch.stride_d; }
    MatmulPlan& p = matmul_plan(key);
    if (bias) cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (epilogue != EPI_NONE) cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    cublasCheck(cublasLtMatmul(g_cublaslt, p.desc, &alpha, a, p.la, b, p.lb, &beta, d, p.ld, d, p.ld, &p.algo,
                               g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream));
}

inline void matmul_free() {
    for (auto& kv : g_matmul_plans) {
        cublasLtMatrixLayoutDestroy(kv.second.la);
        cublasLtMatrixLayoutDestroy(kv.second.lb);
        cublasLtMatrixLayoutDestroy(kv.second.ld);
        cublasLtMatmulDescDestroy(kv.second.desc);
    }
    g_matmul_plans.clear();
    if (g_cublaslt) cublasLtDestroy(g_cublaslt);
    if (g_cublaslt_workspace) cudaFree(g_cublaslt_workspace);
    g_cublaslt = nullptr; g_cublaslt_workspace = nullptr;
}

// ---------------------------------------------------------------------------------------------
// Bias gradient: dbias[oc] += sum over rows of dout[row][oc]. Deterministic two-stage sum:
// blockIdx.y picks one of BIAS_ROW_GROUPS fixed row ranges, each thread one column; the partial
// sums go to scratch and a second kernel adds them in order.
#define BIAS_ROW_GROUPS 128

__global__ void bias_backward_partial_kernel(float* scratch, const floatX* dout, int N, int OC) {
    int oc = blockIdx.x * blockDim.x + threadIdx.x;
    if (oc >= OC) return;
    int rows_per_group = (N + BIAS_ROW_GROUPS - 1) / BIAS_ROW_GROUPS;
    int r0 = blockIdx.y * rows_per_group, r1 = min(N, r0 + rows_per_group);
    float sum = 0.0f;
    for (int r = r0; r < r1; r++) sum += (float)dout[(long long)r * OC + oc];
    scratch[(long long)blockIdx.y * OC + oc] = sum;
}

// The same with 16-byte loads: each thread owns 16/sizeof(floatX) consecutive columns (OC must be a
// multiple of that). Per column the rows are added in the same order, so the sums are identical.
__global__ void bias_backward_partial_vec_kernel(float* scratch, const floatX* dout, int N, int OC) {
    constexpr int PER = 16 / sizeof(floatX);
    int oc0 = (blockIdx.x * blockDim.x + threadIdx.x) * PER;
    if (oc0 >= OC) return;
    int rows_per_group = (N + BIAS_ROW_GROUPS - 1) / BIAS_ROW_GROUPS;
    int r0 = blockIdx.y * rows_per_group, r1 = min(N, r0 + rows_per_group);
    float sum[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) sum[k] = 0.0f;
#pragma unroll 4
    for (int r = r0; r < r1; r++) {
        uint4 packed = *reinterpret_cast<const uint4*>(dout + (long long)r * OC + oc0);
        const floatX* v = reinterpret_cast<const floatX*>(&packed);
#pragma unroll
        for (int k = 0; k < PER; k++) sum[k] += (float)v[k];
    }
#pragma unroll
    for (int k = 0; k < PER; k++) scratch[(long long)blockIdx.y * OC + oc0 + k] = sum[k];
}

__global__ void bias_backward_reduce_kernel(float* dbias, const float* scratch, int OC) {
    int oc = blockIdx.x * blockDim.x + threadIdx.x;
    if (oc >= OC) return;
    float sum = 0.0f;
    for (int g = 0; g < BIAS_ROW_GROUPS; g++) sum += scratch[(long long)g * OC + oc];
    dbias[oc] += sum;
}

// scratch: at least BIAS_ROW_GROUPS * OC floats
inline void bias_backward(float* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream) {
    constexpr int PER = 16 / sizeof(floatX);
    if (OC % PER == 0 && ((uintptr_t)dout % 16) == 0) {
        bias_backward_partial_vec_kernel<<<dim3(ceil_div(OC / PER, 64), BIAS_ROW_GROUPS), 64, 0, stream>>>(scratch, dout, N, OC);
    } else {
        bias_backward_partial_kernel<<<dim3(ceil_div(OC, 128), BIAS_ROW_GROUPS), 128, 0, stream>>>(scratch, dout, N, OC);
    }
    cudaCheckLaunch();
    bias_backward_reduce_kernel<<<ceil_div(OC, 256), 256, 0, stream>>>(dbias, scratch, OC);
    cudaCheckLaunch();
}
