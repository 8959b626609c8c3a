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
#include <initializer_list>
#include <map>
#include <set>
#include <vector>
#include <cstring>
#include "cuda_common.h"
#include "gelu.cuh"

static cublasLtHandle_t g_cublaslt = nullptr;
static void* g_cublaslt_workspace = nullptr;
static float* g_unit_scale = nullptr; // a device 1.0f: the FP8 scale pointers while plans are built
static float* g_device_beta = nullptr; // device 0.0f and 1.0f: beta of the GEMMs whose alpha is on the device
static const size_t CUBLASLT_WORKSPACE_BYTES = 32ull << 20;

// Accumulation is FP32 in every build. In the PRECISION=FP32 reference build the operands are FP32
// and CUBLAS_COMPUTE_32F keeps the products in true FP32 (no TF32). The Q1.15 true-forward build asks
// for CUBLAS_COMPUTE_32F_FAST_16BF, as its seed specifies (with BF16 operands the arithmetic is the
// same); a shape cuBLASLt has no such algorithm for falls back to CUBLAS_COMPUTE_32F.
#if defined(ENABLE_Q115) && SF16_TRUE_FORWARD
static const cublasComputeType_t MATMUL_COMPUTE = CUBLAS_COMPUTE_32F_FAST_16BF;
#else
static const cublasComputeType_t MATMUL_COMPUTE = CUBLAS_COMPUTE_32F;
#endif

inline void matmul_init() {
    cublasCheck(cublasLtCreate(&g_cublaslt));
    g_cublaslt_workspace = cuda_malloc_or_die(CUBLASLT_WORKSPACE_BYTES, "cuBLASLt workspace");
    const float one = 1.0f;
    g_unit_scale = (float*)cuda_malloc_or_die(sizeof(float), "cuBLASLt scale");
    cudaCheck(cudaMemcpy(g_unit_scale, &one, sizeof(float), cudaMemcpyHostToDevice));
    const float betas[2] = {0.0f, 1.0f};
    g_device_beta = (float*)cuda_malloc_or_die(sizeof(betas), "cuBLASLt beta");
    cudaCheck(cudaMemcpy(g_device_beta, betas, sizeof(betas), cudaMemcpyHostToDevice));
}

struct MatmulBatch { int count = 1; long long stride_a = 0, stride_b = 0, stride_d = 0; };

// A cuBLASLt plan (descriptors + the heuristic's algorithm) for one GEMM shape. Building one costs
// tens of microseconds of CPU time, and a training step runs the same few dozen shapes hundreds of
// times, so plans are cached by shape.
// Epilogues fused into the GEMM (cuBLASLt's GELU is the tanh approximation, as GPT-2's):
//   EPI_GELU_BIAS: D = gelu(AB + bias), and aux = AB + bias (the pre-activation, for backward)
//   EPI_DGELU:     D = (AB) * gelu'(aux)   (aux: the pre-activation saved in forward)
//   EPI_BGRADB:    D = AB (+ beta D) and aux[j] = sum over k of op(B)[k][j], a vector of length n in
//                  D's type: the bias gradient of a weight-gradient GEMM (B = dout, k = the rows), from
//                  the same read of dout; the vector is overwritten, never accumulated
//   EPI_DGELU_BGRAD: EPI_DGELU, and vec[i] = sum over j of D[i][j], a vector of length m: the bias gradient
//                  of the layer whose pre-activation aux is (the fc layer's, from the fc projection's dgrad),
//                  as FP32 (EPI_DGELU_BGRAD) or in D's type (EPI_DGELU_BGRAD_NARROW). The trainer does not
//                  use it: cuBLASLt 13.1 on Hopper has no algorithm with the FP32 vector, and the narrow one
//                  takes several times the DGELU GEMM's time (dev/bench/gemm_bench.cu measures both)
enum MatmulEpilogue { EPI_NONE = 0, EPI_GELU_BIAS = 1, EPI_DGELU = 2, EPI_BGRADB = 3, EPI_DGELU_BGRAD = 4,
                      EPI_DGELU_BGRAD_NARROW = 5 };
inline bool epilogue_has_aux_matrix(int e) {
    return e == EPI_GELU_BIAS || e == EPI_DGELU || e == EPI_DGELU_BGRAD || e == EPI_DGELU_BGRAD_NARROW;
}

struct MatmulKey {
    int m, n, k, transA, transB, has_bias, batch, epilogue;
    int a_type, b_type, d_type, fast_accum; // cudaDataType_t of A, B, D (C = D); FP8 fast accumulation
    int device_alpha;                       // alpha and beta are device pointers
    int block_scaled;                       // FP8 with block scales: a MatmulBlockScaling (matmul_fp8_block_scaled); 0 otherwise
                                            // (the field was unnamed padding before: old checkpoints hold 0)
    long long stride_a, stride_b, stride_d;
    bool operator<(const MatmulKey& o) const {
        return memcmp(this, &o, sizeof(MatmulKey)) < 0;
    }
};
// (checkpoints store keys byte for byte: the layout must not change)
static_assert(sizeof(MatmulKey) == 80, "MatmulKey's layout is part of the checkpoint format");
struct MatmulPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    // the heuristic's further candidates: an FP8 algorithm the heuristic offers can still be refused
    // at run time (CUBLAS_STATUS_NOT_SUPPORTED); matmul_fp8 then moves on to the next one
    // (dev/bench/gemm_bench.cu times them all)
    std::vector<cublasLtMatmulAlgo_t> candidates;
    size_t next_candidate = 1;
    bool chosen = false; // the algorithm is settled (tuned, taken from a checkpoint, or tuning is off)
};
// How many of the heuristic's algorithms a plan keeps; autotuning times them all. (Asked for 32 on
// Hopper, cuBLASLt 13.0 returns at most 8 for every shape of d12 and d24.)
static const int MATMUL_CANDIDATES = 8;
// The preferences a plan asks the heuristic under (matmul_build_plan). With autotuning on, all of them;
// off (-ga 0), the first alone, so that runs that must be bit-reproducible run the heuristic's first
// choice under the whole workspace, as they always did.
struct MatmulQuery { size_t workspace_bytes; uint32_t min_alignment; };
static const MatmulQuery MATMUL_QUERIES[] = {
    {CUBLASLT_WORKSPACE_BYTES, 0}, // the whole workspace, the default alignment promise (256 bytes)
    {0, 0},                        // no workspace: no split-K reduction through memory
    {4ull << 20, 0},
    {CUBLASLT_WORKSPACE_BYTES, 16},
};
static bool g_matmul_explore_preferences = false; // set with autotuning (matmul_set_autotune)
static std::map<MatmulKey, MatmulPlan> g_matmul_plans;
// cuBLASLt's block-scaled FP4 GEMMs (CUDA_R_4F_E2M1 with VEC16_UE4M3 scales) exist from cuBLAS 12.8 on;
// only Blackwell (sm_100 and newer) runs them
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120800
#define LLMC_HAVE_FP4_GEMM 1
#else
#define LLMC_HAVE_FP4_GEMM 0
#endif
// GEMM shapes that fell back from MATMUL_COMPUTE to CUBLAS_COMPUTE_32F (reported at the end of a run)
static int g_matmul_compute_fallbacks = 0;

// A new plan of `key` with the given compute type; null when cuBLASLt has no algorithm for it.
inline MatmulPlan* matmul_build_plan(const MatmulKey& key, cublasComputeType_t compute) {
    MatmulPlan p;
    const int m = key.m, n = key.n, k = key.k;
    const bool transA = key.transA, transB = key.transB;
    cublasCheck(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
    cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N, opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (key.epilogue == EPI_GELU_BIAS) epi = key.has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (key.epilogue == EPI_DGELU) epi = CUBLASLT_EPILOGUE_DGELU;
    else if (key.epilogue == EPI_BGRADB) epi = CUBLASLT_EPILOGUE_BGRADB; // its vector: D's type (the default)
    else if (key.epilogue == EPI_DGELU_BGRAD || key.epilogue == EPI_DGELU_BGRAD_NARROW) epi = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    else if (key.has_bias) epi = CUBLASLT_EPILOGUE_BIAS;
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (key.device_alpha) {
        cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)));
    }
    const bool fp8 = key.a_type == CUDA_R_8F_E4M3 || key.a_type == CUDA_R_8F_E5M2;
#if LLMC_HAVE_FP4_GEMM
    if (key.a_type == CUDA_R_4F_E2M1) {
        // block-scaled FP4: a UE4M3 scale per 16 values along K, for both operands (the pointers to the
        // tiled scale arrays are set per call; the heuristic is shown placeholders)
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g_unit_scale, sizeof(g_unit_scale)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g_unit_scale, sizeof(g_unit_scale)));
    }
#endif
    if (fp8) {
        // FP8 operands: fast accumulation (partial sums kept at lower precision inside the tensor
        // core) is the faster mode; the recipes ask for it in the forward pass only
        int8_t fast = (int8_t)key.fast_accum;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
        // the heuristic sees scaled operands (the real pointers are set per call)
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g_unit_scale, sizeof(g_unit_scale)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g_unit_scale, sizeof(g_unit_scale)));
        if (key.block_scaled) {
            // an FP32 scale per 1 x 128 block along k or per 128 x 128 block, per operand (MatmulBlockScaling)
            const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
            const int32_t mode_a = key.block_scaled == 2 ? blk : vec, mode_b = key.block_scaled == 1 ? blk : vec;
            cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
            cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
        }
    }
    if (key.has_bias) {
        cudaDataType_t bias_type = CUDA_R_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    if (key.epilogue == EPI_DGELU_BGRAD) {
        cudaDataType_t vec_type = CUDA_R_32F;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vec_type, sizeof(vec_type)));
    }
    if (epilogue_has_aux_matrix(key.epilogue)) {
        // aux has D's shape and leading dimension, in floatX
        int64_t aux_ld = m;
        cudaDataType_t aux_type = CUDA_R_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
    }
    cudaDataType_t d_type = (cudaDataType_t)key.d_type;
    cublasCheck(cublasLtMatrixLayoutCreate(&p.la, (cudaDataType_t)key.a_type, transA ? k : m, transA ? m : k, transA ? k : m));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.lb, (cudaDataType_t)key.b_type, transB ? n : k, transB ? k : n, transB ? n : k));
    cublasCheck(cublasLtMatrixLayoutCreate(&p.ld, d_type, m, n, m));
    if (key.batch > 1) {
        cublasLtMatrixLayout_t layouts[3] = {p.la, p.lb, p.ld};
        long long strides[3] = {key.stride_a, key.stride_b, key.stride_d};
        for (int i = 0; i < 3; i++) {
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &key.batch, sizeof(int)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(long long)));
        }
    }
    // The heuristic's ranked list under several preferences, concatenated without repeats. Its first
    // query (the whole workspace) comes first, in its order: candidate indices saved in checkpoints
    // before the other queries existed keep their meaning. The same heuristic with less workspace and
    // with looser alignment promises ranks other kernels first (the workspace-free ones that PyTorch's
    // calls often end up running), and autotuning times them all.
    for (const MatmulQuery& q : MATMUL_QUERIES) {
        cublasLtMatmulPreference_t pref;
        cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
        const size_t workspace = std::min(q.workspace_bytes, CUBLASLT_WORKSPACE_BYTES);
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
        if (q.min_alignment) {
            const cublasLtMatmulPreferenceAttributes_t aligns[4] = {
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
            for (auto a : aligns) cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, a, &q.min_alignment, sizeof(q.min_alignment)));
        }
        cublasLtMatmulHeuristicResult_t heuristics[MATMUL_CANDIDATES];
        int found = 0;
        // (a combination cuBLASLt does not support reads as "no algorithm": the caller may fall back)
        if (cublasLtMatmulAlgoGetHeuristic(g_cublaslt, p.desc, p.la, p.lb, p.ld, p.ld, pref, MATMUL_CANDIDATES, heuristics, &found) !=
            CUBLAS_STATUS_SUCCESS) found = 0;
        cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
        for (int i = 0; i < found; i++) {
            bool known = false;
            for (const cublasLtMatmulAlgo_t& c : p.candidates) known = known || memcmp(&c, &heuristics[i].algo, sizeof(c)) == 0;
            if (!known) p.candidates.push_back(heuristics[i].algo);
        }
        if (!g_matmul_explore_preferences) break; // the first query alone
    }
    if (p.candidates.empty()) {
        cublasLtMatrixLayoutDestroy(p.la); cublasLtMatrixLayoutDestroy(p.lb); cublasLtMatrixLayoutDestroy(p.ld);
        cublasLtMatmulDescDestroy(p.desc);
        return nullptr;
    }
    p.algo = p.candidates[0];
    return &g_matmul_plans.emplace(key, p).first->second;
}

// The cached plan of `key`; null when cuBLASLt has no algorithm for it (the caller then falls back;
// the answer is cached too, so asking again costs a lookup).
static std::set<MatmulKey> g_matmul_no_plan;
inline MatmulPlan* matmul_plan(const MatmulKey& key) {
    auto it = g_matmul_plans.find(key);
    if (it != g_matmul_plans.end()) return &it->second;
    if (g_matmul_no_plan.count(key)) return nullptr;
    const bool bf16_operands = key.a_type == CUDA_R_FLOATX; // (FP8, FP4: plain FP32 accumulation)
    const cublasComputeType_t compute = bf16_operands ? MATMUL_COMPUTE : CUBLAS_COMPUTE_32F;
    MatmulPlan* p = matmul_build_plan(key, compute);
    if (!p && compute != CUBLAS_COMPUTE_32F) {
        p = matmul_build_plan(key, CUBLAS_COMPUTE_32F);
        if (p) g_matmul_compute_fallbacks++;
    }
    if (!p) g_matmul_no_plan.insert(key);
    return p;
}

inline void matmul_no_algorithm(const MatmulKey& key) {
    fprintf(stderr, "error: cuBLASLt has no algorithm for m=%d n=%d k=%d transA=%d transB=%d bias=%d epilogue=%d "
            "types A=%d B=%d D=%d\n", key.m, key.n, key.k, key.transA, key.transB, key.has_bias, key.epilogue,
            key.a_type, key.b_type, key.d_type);
    exit(1);
}

// ---- Autotuning ---------------------------------------------------------------------------------
// cuBLASLt's heuristic ranks algorithms by a model, not a measurement: on the trainer's shapes its first
// choice can be well slower than the fastest of its own top eight (dev/bench/gemm_bench.cu times every
// candidate). With g_matmul_autotune on (the trainer's -ga 1, the default), the first call of each
// shape times every candidate on the call's own operands (one warm-up run, then three) and keeps the
// fastest; when the GEMM accumulates into D, D is saved first and put back after the timing runs.
// The choices (a candidate index per shape) go into checkpoints and come back on resume, so that a
// resumed run computes with the same algorithms, hence the same bits, as the run it continues. Two fresh
// runs can choose differently (timing noise) and then differ in the last bits; -ga 0 keeps the
// heuristic's first choice everywhere, for runs that must be bit-reproducible from scratch.
static bool g_matmul_autotune = false;
// autotuning on or off; on, the plans built from now on also hold the candidates of MATMUL_QUERIES' other preferences
inline void matmul_set_autotune(bool on) {
    g_matmul_autotune = on;
    g_matmul_explore_preferences = on;
}
static std::map<MatmulKey, int> g_matmul_choice; // candidate index per tuned shape (or from a checkpoint)

struct MatmulChoice { MatmulKey key; int32_t index; int32_t unused; }; // a checkpoint record
inline std::vector<MatmulChoice> matmul_choices() {
    std::vector<MatmulChoice> out;
    for (const auto& kv : g_matmul_choice) {
        MatmulChoice c;
        memset(&c, 0, sizeof(c));
        c.key = kv.first; c.index = kv.second;
        out.push_back(c);
    }
    return out;
}
// p runs candidate `index` from now on (an index its list lacks, from a checkpoint of another GPU or
// library version, leaves the algorithm as it is)
inline void matmul_take_choice(MatmulPlan& p, int index) {
    if (index >= 0 && (size_t)index < p.candidates.size()) p.algo = p.candidates[index];
    p.chosen = true;
}
// takes the choices of a checkpoint (plans built already switch at once)
inline void matmul_set_choices(const MatmulChoice* choices, size_t count) {
    for (size_t i = 0; i < count; i++) {
        g_matmul_choice[choices[i].key] = choices[i].index;
        auto it = g_matmul_plans.find(choices[i].key);
        if (it != g_matmul_plans.end()) matmul_take_choice(it->second, choices[i].index);
    }
}

// Settles p's algorithm before its first launch. launch(algo) runs the GEMM with that algorithm and
// returns cuBLASLt's status (an algorithm refused at run time is skipped). accumulate_bytes: D's size
// when the GEMM adds into D (it is saved and restored), else 0.
template <typename Launch>
inline void matmul_choose(const MatmulKey& key, MatmulPlan& p, void* d, size_t accumulate_bytes, cudaStream_t stream,
                          Launch launch) {
    p.chosen = true;
    auto preset = g_matmul_choice.find(key);
    if (preset != g_matmul_choice.end()) {
        matmul_take_choice(p, preset->second);
        return;
    }
    if (!g_matmul_autotune || p.candidates.size() < 2) return;
    void* saved = nullptr;
    if (accumulate_bytes > 0) {
        if (cudaMalloc(&saved, accumulate_bytes) != cudaSuccess) {
            (void)cudaGetLastError(); // no room for the copy: keep the heuristic's choice
            return;
        }
        cudaCheck(cudaMemcpyAsync(saved, d, accumulate_bytes, cudaMemcpyDeviceToDevice, stream));
    }
    cudaEvent_t t0, t1;
    cudaCheck(cudaEventCreate(&t0));
    cudaCheck(cudaEventCreate(&t1));
    float best_ms = 0.0f;
    int best = -1;
    for (size_t i = 0; i < p.candidates.size(); i++) {
        cublasStatus_t status = launch(p.candidates[i]);
        if (status == CUBLAS_STATUS_NOT_SUPPORTED) continue;
        cublasCheck(status);
        cudaCheck(cudaEventRecord(t0, stream));
        for (int r = 0; r < 3; r++) cublasCheck(launch(p.candidates[i]));
        cudaCheck(cudaEventRecord(t1, stream));
        cudaCheck(cudaEventSynchronize(t1));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, t0, t1));
        if (best < 0 || ms < best_ms) { best_ms = ms; best = (int)i; }
    }
    cudaCheck(cudaEventDestroy(t0));
    cudaCheck(cudaEventDestroy(t1));
    if (saved) {
        cudaCheck(cudaMemcpyAsync(d, saved, accumulate_bytes, cudaMemcpyDeviceToDevice, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(saved));
    }
    if (best >= 0) {
        matmul_take_choice(p, best);
        g_matmul_choice[key] = best;
    }
}

// ---- A fused epilogue, or the plain GEMM and a separate pass ------------------------------------
// An epilogue saves a pass over a tensor, but on some shapes cuBLASLt has only slow algorithms for it:
// d24's fc-projection dgrad with DGELU (m 4096, n 32768, k 1024) has a single candidate, slower than the
// plain GEMM and a separate GELU-derivative pass over the output together (dev/bench/gemm_bench.cu). So with autotuning on, the first call of such a
// GEMM times both ways (each with its own tuned algorithm) and keeps the faster. The decision is
// stored like an algorithm choice, under the fused GEMM's key with the epilogue moved by
// EPI_SPLIT_DECISION (index 0 fused, 1 split), so checkpoints carry it and a resumed run repeats it.
// Autotuning off: fused, as before.
// fused() and split() compute the same thing. Where they add into existing buffers (a weight
// gradient, beta = 1), name those in `accumulated`: they are saved before the timing runs and put
// back after them, so the caller's one real call afterwards adds exactly once. (No room for the
// copies: fused, recorded.)
static const int EPI_SPLIT_DECISION = 16;
inline MatmulKey matmul_split_decision_key(MatmulKey fused_key) {
    fused_key.epilogue += EPI_SPLIT_DECISION;
    return fused_key;
}
struct AccumulatedBuffer { void* ptr; size_t bytes; };
template <typename Fused, typename Split>
inline bool matmul_prefer_split(const MatmulKey& fused_key, cudaStream_t stream, Fused fused, Split split,
                                std::initializer_list<AccumulatedBuffer> accumulated = {}) {
    const MatmulKey key = matmul_split_decision_key(fused_key);
    auto preset = g_matmul_choice.find(key);
    if (preset != g_matmul_choice.end()) return preset->second == 1;
    if (!g_matmul_autotune) return false;
    std::vector<std::pair<AccumulatedBuffer, void*>> saved;
    for (const AccumulatedBuffer& buf : accumulated) {
        void* copy = nullptr;
        if (cudaMalloc(&copy, buf.bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            for (auto& s : saved) cudaCheck(cudaFree(s.second));
            g_matmul_choice[key] = 0;
            return false;
        }
        cudaCheck(cudaMemcpyAsync(copy, buf.ptr, buf.bytes, cudaMemcpyDeviceToDevice, stream));
        saved.push_back({buf, copy});
    }
    fused(); // the first call of each way settles (tunes) its own GEMM algorithm
    split();
    cudaEvent_t t0, t1;
    cudaCheck(cudaEventCreate(&t0));
    cudaCheck(cudaEventCreate(&t1));
    float ms[2] = {0.0f, 0.0f};
    for (int way = 0; way < 2; way++) {
        cudaCheck(cudaEventRecord(t0, stream));
        for (int r = 0; r < 3; r++) { if (way == 0) fused(); else split(); }
        cudaCheck(cudaEventRecord(t1, stream));
        cudaCheck(cudaEventSynchronize(t1));
        cudaCheck(cudaEventElapsedTime(&ms[way], t0, t1));
    }
    cudaCheck(cudaEventDestroy(t0));
    cudaCheck(cudaEventDestroy(t1));
    for (auto& s : saved) {
        cudaCheck(cudaMemcpyAsync(s.first.ptr, s.second, s.first.bytes, cudaMemcpyDeviceToDevice, stream));
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaFree(s.second));
    }
    const int choice = ms[1] < ms[0] ? 1 : 0;
    g_matmul_choice[key] = choice;
    return choice == 1;
}

// The general entry point. d_fp32 selects an FP32 output (parameter gradients); otherwise D is floatX.
// bias (floatX, length m) may be null. aux: the epilogue's extra (m x n) floatX matrix, or EPI_BGRADB's
// vector, see above. The bias and the epilogue apply to alpha * op(A) op(B) + beta * D.
inline MatmulKey matmul_key(int m, int n, int k, bool transA, bool transB, bool has_bias, bool device_alpha,
                            bool d_fp32, MatmulBatch batch, MatmulEpilogue epilogue) {
    MatmulKey key;
    memset(&key, 0, sizeof(key)); // the key is compared bytewise
    key.m = m; key.n = n; key.k = k; key.transA = transA; key.transB = transB;
    key.has_bias = has_bias; key.batch = batch.count; key.epilogue = epilogue;
    key.a_type = key.b_type = CUDA_R_FLOATX; key.d_type = d_fp32 ? CUDA_R_32F : CUDA_R_FLOATX;
    key.device_alpha = device_alpha;
    if (batch.count > 1) { key.stride_a = batch.stride_a; key.stride_b = batch.stride_b; key.stride_d = batch.stride_d; }
    return key;
}
// Launches the GEMM; when cuBLASLt has no algorithm for it, exits with an error if `required`, else
// returns false with nothing launched (the caller then takes another way).
inline bool matmul_launch(void* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                          bool transA, bool transB, const float* alpha, const float* beta, bool device_alpha,
                          bool d_fp32, cudaStream_t stream, MatmulBatch batch, MatmulEpilogue epilogue, void* aux,
                          bool required = true) {
    const MatmulKey key = matmul_key(m, n, k, transA, transB, bias != nullptr, device_alpha, d_fp32, batch, epilogue);
    MatmulPlan* plan = matmul_plan(key);
    if (!plan) {
        if (required) matmul_no_algorithm(key);
        return false;
    }
    MatmulPlan& p = *plan;
    if (bias) cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (epilogue == EPI_BGRADB) cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &aux, sizeof(aux)));
    if (epilogue_has_aux_matrix(epilogue)) cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(g_cublaslt, p.desc, alpha, a, p.la, b, p.lb, beta, d, p.ld, d, p.ld, &algo,
                              g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream);
    };
    if (!p.chosen) {
        const bool accumulates = device_alpha ? beta != g_device_beta : *beta != 0.0f;
        const size_t d_elems = batch.count > 1 ? (size_t)batch.stride_d * (batch.count - 1) + (size_t)m * n : (size_t)m * n;
        matmul_choose(key, p, d, accumulates ? d_elems * (d_fp32 ? 4 : sizeof(floatX)) : 0, stream, run);
    }
    cublasCheck(run(p.algo));
    return true;
}

inline void matmul(void* d, const floatX* a, const floatX* b, const floatX* bias,
                   int m, int n, int k, bool transA, bool transB, float alpha, float beta,
                   bool d_fp32, cudaStream_t stream, MatmulBatch batch = MatmulBatch(),
                   MatmulEpilogue epilogue = EPI_NONE, void* aux = nullptr) {
    matmul_launch(d, a, b, bias, m, n, k, transA, transB, &alpha, &beta, false, d_fp32, stream, batch, epilogue, aux);
}

// The same with alpha read from device memory when the GEMM runs (a scale computed on the GPU, as
// NVFP4's product of global scales); beta is 0 or 1.
inline void matmul_alpha_on_device(void* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                                   bool transA, bool transB, const float* alpha, bool accumulate, bool d_fp32,
                                   cudaStream_t stream, MatmulEpilogue epilogue = EPI_NONE, void* aux = nullptr) {
    matmul_launch(d, a, b, bias, m, n, k, transA, transB, alpha, g_device_beta + (accumulate ? 1 : 0), true, d_fp32,
                  stream, MatmulBatch(), epilogue, aux);
}

// Runs p's algorithm. An algorithm the heuristic offered can still be refused at run time
// (CUBLAS_STATUS_NOT_SUPPORTED, seen with FP8): p then moves on to its next candidate. False when
// none is left; the plan then forgets its candidates, so that later calls fail fast.
template <typename Run>
inline bool matmul_run_candidates(MatmulPlan& p, Run run) {
    for (;;) {
        const cublasStatus_t status = run(p.algo);
        if (status == CUBLAS_STATUS_SUCCESS) return true;
        if (status != CUBLAS_STATUS_NOT_SUPPORTED) cublasCheck(status);
        if (p.next_candidate >= p.candidates.size()) {
            p.candidates.clear();
            return false;
        }
        p.algo = p.candidates[p.next_candidate++];
    }
}

// FP8 GEMM (Hopper tensor cores). Hopper's FP8 GEMMs take both operands K-major only ("TN"): in
// the row-major terms of the model, A is (m x k) and B is (n x k), both with k contiguous, and
//     D (n x m, row-major) = a_scale * b_scale * (B A^T)  [+ bias[m] per row]   (+ beta * D)
// where a_scale / b_scale (device pointers, 16-byte aligned: cuBLASLt refuses others at run time)
// are the dequantization factors 1/s of the operands (x_fp8 = x * s). E5M2 x E5M2 is not supported by Hopper; the recipes never ask for it. D is
// floatX (beta = 0) or FP32 (beta = 1 accumulates, for weight gradients). Returns false, with
// nothing launched, when cuBLASLt has no algorithm for the combination (the caller falls back).
struct Fp8Operand {
    const void* data;
    cudaDataType_t type;      // CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2
    const float* scale;       // device pointer to the dequantization factor
};
inline bool matmul_fp8(void* d, bool d_fp32, Fp8Operand a, Fp8Operand b, const floatX* bias, int m, int n, int k,
                       float beta, bool fast_accum, cudaStream_t stream, MatmulEpilogue epilogue = EPI_NONE,
                       void* aux = nullptr) {
    MatmulKey key = matmul_key(m, n, k, true, false, bias != nullptr, false, d_fp32, MatmulBatch(), epilogue);
    key.a_type = a.type; key.b_type = b.type;
    key.fast_accum = fast_accum;
    if ((uintptr_t)a.scale % 16 != 0 || (uintptr_t)b.scale % 16 != 0) {
        // cuBLASLt 13.1 refuses 4-byte aligned scale pointers at run time
        fprintf(stderr, "error: matmul_fp8: the scale pointers must be 16-byte aligned\n");
        exit(1);
    }
    MatmulPlan* plan = matmul_plan(key);
    if (!plan || plan->candidates.empty()) return false;
    if (bias) cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (epilogue_has_aux_matrix(epilogue)) cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.scale, sizeof(a.scale)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.scale, sizeof(b.scale)));
    const float alpha = 1.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(g_cublaslt, plan->desc, &alpha, a.data, plan->la, b.data, plan->lb, &beta, d, plan->ld, d,
                              plan->ld, &algo, g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream);
    };
    if (!plan->chosen) matmul_choose(key, *plan, d, beta != 0.0f ? (size_t)m * n * (d_fp32 ? 4 : sizeof(floatX)) : 0, stream, run);
    return matmul_run_candidates(*plan, run);
}

// FP8 GEMM with block scales, as matmul_fp8 (TN, D floatX, optional bias / GELU epilogue, beta = 0) but
// with an FP32 scale per block instead of one per operand: A (m x k) has one per 1 x 128 block along k,
// a_scales[kb * m + row] (a column-major m x k/128 array); B (n x k) one per 128 x 128 block,
// b_scales: ceil(n / 128) * (k / 128) floats. k % 128 == 0. cuBLASLt offers these modes on Hopper from
// 12.9 on; the accumulator is promoted to FP32 at each 128-wide block, so there is no fast accumulation.
// What the 1 x 128 blocks of A buy (TCFP-12): one GEMM over K-concatenated operands [W_hi | W_lo] and
// [x | x], each half of A with its own scale (dev/bench/tcfp12_gemm_bench.cu checks the layout of
// a_scales: the other order gives relative errors ~1). Returns false, with nothing
// launched, where cuBLASLt has no algorithm.
// The pairs of block kinds (MatmulKey::block_scaled): which operand has 1 x 128 blocks (a_scales as above)
// and which 128 x 128 ones (the layout of formats/fp8_block_scaling.h: the K-block index fastest, rows of
// ceil(k / 128) rounded up to a multiple of 4). cuBLASLt's Hopper kernels take these three pairs. The
// FP8 recipe's -fs block: A = the weight (128 x 128), B = the activation or gradient (1 x 128) for the forward
// and dgrad GEMMs; both 1 x 128 for the weight gradient (formats/fp8_block_scaling.h, doc/recipes/fp8.md).
enum MatmulBlockScaling {
    MATMUL_BLOCKS_A1x128_B128x128 = 1, // (TCFP-12's K-concatenated GEMM)
    MATMUL_BLOCKS_A128x128_B1x128 = 2,
    MATMUL_BLOCKS_A1x128_B1x128 = 3,
};
// d_fp32: D in FP32 (a weight gradient, with beta = 1 to accumulate), else floatX
inline MatmulKey matmul_fp8_block_scaled_key(int m, int n, int k, cudaDataType_t a_type, cudaDataType_t b_type,
                                             bool has_bias, MatmulEpilogue epilogue,
                                             MatmulBlockScaling blocks = MATMUL_BLOCKS_A1x128_B128x128, bool d_fp32 = false) {
    MatmulKey key = matmul_key(m, n, k, true, false, has_bias, false, d_fp32, MatmulBatch(), epilogue);
    key.a_type = a_type; key.b_type = b_type;
    key.block_scaled = blocks;
    return key;
}
inline bool matmul_fp8_block_scaled(void* d, const void* a, cudaDataType_t a_type, const float* a_scales, const void* b,
                                    cudaDataType_t b_type, const float* b_scales, const floatX* bias, int m, int n, int k,
                                    cudaStream_t stream, MatmulEpilogue epilogue = EPI_NONE, void* aux = nullptr,
                                    MatmulBlockScaling blocks = MATMUL_BLOCKS_A1x128_B128x128, bool d_fp32 = false,
                                    float beta = 0.0f) {
    if (k % 128 != 0) return false;
    const MatmulKey key = matmul_fp8_block_scaled_key(m, n, k, a_type, b_type, bias != nullptr, epilogue, blocks, d_fp32);
    MatmulPlan* plan = matmul_plan(key);
    if (!plan || plan->candidates.empty()) return false;
    if (bias) cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (epilogue_has_aux_matrix(epilogue)) cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales, sizeof(a_scales)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales, sizeof(b_scales)));
    const float alpha = 1.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(g_cublaslt, plan->desc, &alpha, a, plan->la, b, plan->lb, &beta, d, plan->ld, d, plan->ld,
                              &algo, g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream);
    };
    if (!plan->chosen) matmul_choose(key, *plan, d, beta != 0.0f ? (size_t)m * n * (d_fp32 ? 4 : sizeof(floatX)) : 0, stream, run);
    return matmul_run_candidates(*plan, run);
}

// Block-scaled FP4 GEMM (cuBLASLt on Blackwell's FP4 tensor cores, sm_100 and newer; the NVFP4 recipe's
// native path). The operands are llmc/formats/nvfp4.h's "native operands": packed E2M1 codes, K-major, and
// their UE4M3 scales per 16 values of K in the 128 x 4 tiled layout. As matmul_fp8 (TN): A is (m x k)
// and B is (n x k) in row-major terms, both with k contiguous, and
//     D (n x m, row-major) = alpha * (B A^T)  [+ bias[m] per row]  (+ D when accumulate)
// alpha is a device pointer (the product of the operands' FP32 global scales, which the quantize kernels
// write). D is floatX, or FP32 for weight gradients. The epilogues are matmul's. Returns false, with
// nothing launched, where cuBLASLt has no algorithm (an older library, a GPU without FP4 tensor cores).
struct Fp4Operand {
    const uint8_t* codes;   // rows x k / 2 bytes
    const uint8_t* scales;  // nvfp4_tiled_scale_bytes(rows, k / 16) bytes
};
inline MatmulKey matmul_fp4_key(int m, int n, int k, bool has_bias, bool d_fp32, MatmulEpilogue epilogue) {
    MatmulKey key = matmul_key(m, n, k, true, false, has_bias, true, d_fp32, MatmulBatch(), epilogue);
#if LLMC_HAVE_FP4_GEMM
    key.a_type = key.b_type = CUDA_R_4F_E2M1;
#endif
    return key;
}
// whether cuBLASLt has an algorithm for this FP4 GEMM (builds and caches its plan)
inline bool matmul_fp4_available(int m, int n, int k, bool has_bias, bool d_fp32, MatmulEpilogue epilogue) {
    if (!LLMC_HAVE_FP4_GEMM) return false;
    MatmulPlan* plan = matmul_plan(matmul_fp4_key(m, n, k, has_bias, d_fp32, epilogue));
    return plan != nullptr && !plan->candidates.empty();
}
inline bool matmul_fp4(void* d, bool d_fp32, Fp4Operand a, Fp4Operand b, const floatX* bias, int m, int n, int k,
                       const float* alpha, bool accumulate, cudaStream_t stream, MatmulEpilogue epilogue = EPI_NONE,
                       void* aux = nullptr) {
    if (!LLMC_HAVE_FP4_GEMM) return false;
    const MatmulKey key = matmul_fp4_key(m, n, k, bias != nullptr, d_fp32, epilogue);
    MatmulPlan* plan = matmul_plan(key);
    if (!plan || plan->candidates.empty()) return false;
    cublasLtMatmulDesc_t desc = plan->desc;
    if (bias) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (epilogue_has_aux_matrix(epilogue)) cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.scales, sizeof(a.scales)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.scales, sizeof(b.scales)));
    const float* beta = g_device_beta + (accumulate ? 1 : 0);
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(g_cublaslt, desc, alpha, a.codes, plan->la, b.codes, plan->lb, beta, d, plan->ld, d,
                              plan->ld, &algo, g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream);
    };
    if (!plan->chosen) matmul_choose(key, *plan, d, accumulate ? (size_t)m * n * (d_fp32 ? 4 : sizeof(floatX)) : 0, stream, run);
    return matmul_run_candidates(*plan, run);
}

inline void matmul_free() {
    for (auto& kv : g_matmul_plans) {
        cublasLtMatrixLayoutDestroy(kv.second.la);
        cublasLtMatrixLayoutDestroy(kv.second.lb);
        cublasLtMatrixLayoutDestroy(kv.second.ld);
        cublasLtMatmulDescDestroy(kv.second.desc);
    }
    g_matmul_plans.clear();
    g_matmul_no_plan.clear();
    g_matmul_choice.clear();
    if (g_cublaslt) cublasLtDestroy(g_cublaslt);
    if (g_cublaslt_workspace) cudaFree(g_cublaslt_workspace);
    if (g_unit_scale) cudaFree(g_unit_scale);
    if (g_device_beta) cudaFree(g_device_beta);
    g_cublaslt = nullptr; g_cublaslt_workspace = nullptr; g_unit_scale = nullptr; g_device_beta = nullptr;
}

// ---------------------------------------------------------------------------------------------
// Bias gradient: dbias[oc] += sum over rows of dout[row][oc]. Deterministic two-stage sum:
// blockIdx.y picks one of BIAS_ROW_GROUPS fixed row ranges, each thread one column; the partial
// sums go to scratch and a second kernel adds them in a fixed order. 512 groups: with 128, a
// 768-column gradient (d12's attention and fc projections) ran only 12,288 threads and the whole
// bias_backward read its 100 MB at a fraction of the memory bandwidth (dev/bench/gemm_bench.cu).
#define BIAS_ROW_GROUPS 512

// AMAX: also max |dout| into *amax_out (atomicMax on the bits of a non-negative float, one per warp;
// the caller zeroes it), for recipes that scale dout from its current amax (tcfp12).
template <bool AMAX>
__device__ __forceinline__ void bias_amax_commit(uint32_t amax, uint32_t* amax_out) {
    if constexpr (AMAX) {
        for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if ((threadIdx.x & 31) == 0 && amax) atomicMax(amax_out, amax);
    }
}

// One 16-byte packet of a row into the running column sums (and max |.|) of its 16/sizeof(floatX) columns
template <bool AMAX>
__device__ __forceinline__ void bias_accumulate_packet(uint4 packed, float* sum, uint32_t& amax) {
    const floatX* v = reinterpret_cast<const floatX*>(&packed);
#pragma unroll
    for (int k = 0; k < 16 / (int)sizeof(floatX); k++) {
        const float f = (float)v[k];
        sum[k] += f;
        if (AMAX) amax = max(amax, __float_as_uint(f) & 0x7FFFFFFFu);
    }
}

template <bool AMAX>
__global__ void bias_backward_partial_kernel(float* scratch, uint32_t* amax_out, const floatX* dout, int N, int OC) {
    int oc = blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t amax = 0;
    if (oc < OC) {
        int rows_per_group = (N + BIAS_ROW_GROUPS - 1) / BIAS_ROW_GROUPS;
        int r0 = blockIdx.y * rows_per_group, r1 = min(N, r0 + rows_per_group);
        float sum = 0.0f;
        for (int r = r0; r < r1; r++) {
            const float v = (float)dout[(long long)r * OC + oc];
            sum += v;
            if (AMAX) amax = max(amax, __float_as_uint(v) & 0x7FFFFFFFu);
        }
        scratch[(long long)blockIdx.y * OC + oc] = sum;
    }
    bias_amax_commit<AMAX>(amax, amax_out);
}

// The same with 16-byte loads: each thread owns 16/sizeof(floatX) consecutive columns (OC must be a
// multiple of that). Per column the rows are added in the same order, so the sums are identical.
template <bool AMAX>
__global__ void bias_backward_partial_vec_kernel(float* scratch, uint32_t* amax_out, const floatX* dout, int N, int OC) {
    constexpr int PER = 16 / sizeof(floatX);
    int oc0 = (blockIdx.x * blockDim.x + threadIdx.x) * PER;
    uint32_t amax = 0;
    if (oc0 < OC) {
        int rows_per_group = (N + BIAS_ROW_GROUPS - 1) / BIAS_ROW_GROUPS;
        int r0 = blockIdx.y * rows_per_group, r1 = min(N, r0 + rows_per_group);
        float sum[PER];
#pragma unroll
        for (int k = 0; k < PER; k++) sum[k] = 0.0f;
#pragma unroll 4
        for (int r = r0; r < r1; r++) {
            const uint4 packed = *reinterpret_cast<const uint4*>(dout + (long long)r * OC + oc0);
            bias_accumulate_packet<AMAX>(packed, sum, amax);
        }
#pragma unroll
        for (int k = 0; k < PER; k++) scratch[(long long)blockIdx.y * OC + oc0 + k] = sum[k];
    }
    bias_amax_commit<AMAX>(amax, amax_out);
}

// A block owns 32 columns (threadIdx.x, coalesced) and splits the groups into BIAS_REDUCE_SLICES
// slices (threadIdx.y): slice y adds groups y, y + SLICES, ... in order, then the slices are added
// pairwise in a fixed tree. (One thread per column adding all groups in a row waited on one load at a
// time: 512 dependent loads.) The order is fixed, so the sums are the same bits on every run.
#define BIAS_REDUCE_SLICES 16
__global__ void bias_backward_reduce_kernel(float* dbias, const float* scratch, int OC, int groups) {
    __shared__ float part[BIAS_REDUCE_SLICES][33];
    const int oc = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (oc < OC) {
#pragma unroll 8
        for (int g = threadIdx.y; g < groups; g += BIAS_REDUCE_SLICES) sum += scratch[(long long)g * OC + oc];
    }
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    for (int half = BIAS_REDUCE_SLICES / 2; half > 0; half >>= 1) {
        if (threadIdx.y < half) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + half][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && oc < OC) dbias[oc] += part[0][threadIdx.x];
}
// dbias[oc] += the sum, in a fixed order, of `groups` partial sums scratch[g][oc] (row groups g)
inline void bias_backward_reduce(float* dbias, const float* scratch, int OC, int groups, cudaStream_t stream) {
    bias_backward_reduce_kernel<<<ceil_div(OC, 32), dim3(32, BIAS_REDUCE_SLICES), 0, stream>>>(dbias, scratch, OC, groups);
    cudaCheckLaunch();
}

// dbias[oc] += part[oc]: the bias gradient a GEMM epilogue wrote (EPI_BGRADB) into the running sum
__global__ void bias_grad_accumulate_kernel(float* dbias, const float* part, int OC) {
    int oc = blockIdx.x * blockDim.x + threadIdx.x;
    if (oc < OC) dbias[oc] += part[oc];
}
inline void bias_grad_accumulate(float* dbias, const float* part, int OC, cudaStream_t stream) {
    bias_grad_accumulate_kernel<<<ceil_div(OC, 256), 256, 0, stream>>>(dbias, part, OC);
    cudaCheckLaunch();
}

// The GELU backward and the column partial sums (and max |.|) of its result, from one pass: dinout
// (N x OC) holds the gradient w.r.t. the GELU output and gets the gradient w.r.t. its input,
// dinout * gelu'(pre), in place, exactly as gelu_backward writes it; scratch gets the partial sums
// that bias_backward_reduce(dbias, scratch, OC, BIAS_ROW_GROUPS) turns into the bias gradient of the
// linear whose output gradient that is (the same bits as gelu_backward + bias_backward), and *amax_out
// (when given; the caller zeroes it) max |result|. False, with nothing launched, unless OC and the
// pointers allow 16-byte accesses (the caller then runs the two passes).
// The kernel: bias_backward_partial_vec_kernel's threads and order of sums, with the derivative applied
// to each 16-byte packet (rounded to floatX) before it is summed and stored back. Each thread loads
// the packets of GELU_BIAS_ROWS rows before it stores any (the __restrict__ pointers let the compiler
// keep them in flight together): with stores between them the loads of successive rows would wait on
// one another.
#define GELU_BIAS_ROWS 4
template <bool AMAX>
__global__ void gelu_backward_bias_partial_kernel(float* __restrict__ scratch, uint32_t* __restrict__ amax_out,
                                                  floatX* __restrict__ dinout, const floatX* __restrict__ pre, int N, int OC) {
    constexpr int PER = 16 / sizeof(floatX);
    const int oc0 = (blockIdx.x * blockDim.x + threadIdx.x) * PER;
    uint32_t amax = 0;
    if (oc0 < OC) {
        const int rows_per_group = (N + BIAS_ROW_GROUPS - 1) / BIAS_ROW_GROUPS;
        const int r0 = blockIdx.y * rows_per_group, r1 = min(N, r0 + rows_per_group);
        float sum[PER];
#pragma unroll
        for (int k = 0; k < PER; k++) sum[k] = 0.0f;
        for (int r = r0; r < r1; r += GELU_BIAS_ROWS) {
            uint4 d[GELU_BIAS_ROWS], p[GELU_BIAS_ROWS];
#pragma unroll
            for (int u = 0; u < GELU_BIAS_ROWS; u++) {
                if (r + u < r1) {
                    d[u] = *reinterpret_cast<const uint4*>(dinout + (long long)(r + u) * OC + oc0);
                    p[u] = *reinterpret_cast<const uint4*>(pre + (long long)(r + u) * OC + oc0);
                }
            }
#pragma unroll
            for (int u = 0; u < GELU_BIAS_ROWS; u++) {
                if (r + u >= r1) break;
                floatX* v = reinterpret_cast<floatX*>(&d[u]);
                const floatX* x = reinterpret_cast<const floatX*>(&p[u]);
#pragma unroll
                for (int k = 0; k < PER; k++) v[k] = (floatX)((float)v[k] * gelu_derivative((float)x[k]));
                bias_accumulate_packet<AMAX>(d[u], sum, amax);
                *reinterpret_cast<uint4*>(dinout + (long long)(r + u) * OC + oc0) = d[u];
            }
        }
#pragma unroll
        for (int k = 0; k < PER; k++) scratch[(long long)blockIdx.y * OC + oc0 + k] = sum[k];
    }
    bias_amax_commit<AMAX>(amax, amax_out);
}
inline bool gelu_backward_bias_partials(floatX* dinout, const floatX* pre, float* scratch, uint32_t* amax_out, int N,
                                        int OC, cudaStream_t stream) {
    constexpr int PER = 16 / sizeof(floatX);
    if (OC % PER != 0 || (uintptr_t)dinout % 16 != 0 || (uintptr_t)pre % 16 != 0) return false;
    const dim3 grid(ceil_div(OC / PER, 64), BIAS_ROW_GROUPS);
    if (amax_out) gelu_backward_bias_partial_kernel<true><<<grid, 64, 0, stream>>>(scratch, amax_out, dinout, pre, N, OC);
    else gelu_backward_bias_partial_kernel<false><<<grid, 64, 0, stream>>>(scratch, nullptr, dinout, pre, N, OC);
    cudaCheckLaunch();
    return true;
}

// scratch: at least BIAS_ROW_GROUPS * OC floats. amax_out (optional): max |dout| from the same read.
inline void bias_backward(float* dbias, float* scratch, const floatX* dout, int N, int OC, cudaStream_t stream,
                          uint32_t* amax_out = nullptr) {
    constexpr int PER = 16 / sizeof(floatX);
    if (OC % PER == 0 && ((uintptr_t)dout % 16) == 0) {
        const dim3 grid(ceil_div(OC / PER, 64), BIAS_ROW_GROUPS);
        if (amax_out) bias_backward_partial_vec_kernel<true><<<grid, 64, 0, stream>>>(scratch, amax_out, dout, N, OC);
        else bias_backward_partial_vec_kernel<false><<<grid, 64, 0, stream>>>(scratch, nullptr, dout, N, OC);
    } else {
        const dim3 grid(ceil_div(OC, 128), BIAS_ROW_GROUPS);
        if (amax_out) bias_backward_partial_kernel<true><<<grid, 128, 0, stream>>>(scratch, amax_out, dout, N, OC);
        else bias_backward_partial_kernel<false><<<grid, 128, 0, stream>>>(scratch, nullptr, dout, N, OC);
    }
    cudaCheckLaunch();
    bias_backward_reduce(dbias, scratch, OC, BIAS_ROW_GROUPS, stream);
}
