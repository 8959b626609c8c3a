// gemm_bench.cu: every GEMM of one micro-step of the BF16 trainer, timed alone, for each algorithm
// cuBLASLt's heuristic offers (llmc/matmul.cuh keeps up to MATMUL_CANDIDATES per shape; the trainer
// runs the first). It answers two questions the per-phase profile cannot: how far the heuristic's
// first choice is from the fastest of its list, and what the bias gradient costs inside the
// weight-gradient GEMM (EPI_BGRADB) against a separate bias_backward pass.
//
//   make build/gemm_bench && ./build/gemm_bench [-c 768] [-n 65536] [-v 50304] [-r 8192] [-i 20] [-q 1] [-k 0]
// -c channels, -n rows per micro-step (B*T), -v padded vocabulary, -r classifier chunk rows, -i timed
// repetitions per algorithm (after 3 warm-up runs), -q 0 the heuristic's list under the whole workspace
// only (default 1: every preference of matmul.cuh's MATMUL_QUERIES, as the autotuning trainer), -k 1 also
// times the split-k variants of each GEMM's candidates. Operands are random BF16 in [-1, 1).
// Prints one line per GEMM: shape, the first choice's ms and TFLOP/s, the fastest candidate's ms and
// index, and the ratio; then the four linears' bias gradient both ways, the GELU and its derivative in
// the epilogue against the plain GEMM + a separate pass, the fc layer's bias gradient from the fc
// projection's dgrad (cuBLASLt's DGELU_BGRAD, FP32 and BF16 vector) against DGELU + a separate pass, and
// the sums per micro-step.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "dev/test/gpu/gpu_check.h"
#include "llmc/matmul.cuh"
#include "dev/bench/bench_timer.h"
#include "llmc/gelu.cuh"

// ---- Split-K variants (-k 1) -------------------------------------------------------------------
// A weight-gradient GEMM has a small output (C x 4C at most) and a long reduction (k = B*T rows): at
// d36 (C = 1280) the fc wgrad's 1280 x 5120 output is 200 tiles of 128 x 256, 1.5 waves on 132 SMs, so
// a quarter of the GPU idles in the second wave. Splitting k over s CTAs per tile fills the waves at the
// price of a reduction of s partial tiles. cuBLASLt's heuristic rarely offers split-k for these shapes;
// an algorithm that supports it can still be configured by hand. This derives, from each of a plan's
// candidates that allows it, the variants with s in {2, 3, 4, 6, 8} under each reduction scheme the
// algorithm offers, keeping those cuBLASLt accepts within the workspace. (Every scheme sums the parts in
// a fixed order: INPLACE orders them with counters in the workspace, the others reduce out of place.)
// With cuBLASLt 13.1 on Hopper the kernels the heuristic ranks first (algorithm id 66) offer split-k only
// for some wgrad shapes, and no variant beats the unsplit kernels; this is why the trainer does not try them.
inline std::string matmul_algo_config(const cublasLtMatmulAlgo_t& a) {
    int32_t id = 0;
    uint32_t tile = 0, stages = 0, splitk = 0, scheme = 0, swizzle = 0, cluster = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &w);
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), &w);
    char buf[160];
    snprintf(buf, sizeof(buf), "id %d tile %u stages %u splitk %u scheme %u swizzle %u cluster %u", id, tile, stages,
             splitk, scheme, swizzle, cluster);
    return buf;
}
inline std::vector<cublasLtMatmulAlgo_t> matmul_split_k_variants(const MatmulPlan& p) {
    static const uint32_t splits[] = {2, 3, 4, 6, 8};
    static const uint32_t schemes[] = {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                       CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
    std::vector<cublasLtMatmulAlgo_t> out;
    auto known = [&](const cublasLtMatmulAlgo_t& a) {
        for (const auto& c : p.candidates) if (memcmp(&c, &a, sizeof(a)) == 0) return true;
        for (const auto& c : out) if (memcmp(&c, &a, sizeof(a)) == 0) return true;
        return false;
    };
    for (const cublasLtMatmulAlgo_t& c : p.candidates) {
        int32_t support = 0;
        uint32_t mask = 0, current = 1;
        size_t w = 0;
        if (cublasLtMatmulAlgoCapGetAttribute(&c, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof(support), &w) !=
                CUBLAS_STATUS_SUCCESS || !support) continue;
        cublasLtMatmulAlgoCapGetAttribute(&c, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &mask, sizeof(mask), &w);
        cublasLtMatmulAlgoConfigGetAttribute(&c, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &current, sizeof(current), &w);
        if (current > 1) continue; // already split: the heuristic chose its own
        for (uint32_t s : splits) {
            for (uint32_t scheme : schemes) {
                if (!(mask & scheme)) continue;
                cublasLtMatmulAlgo_t v = c;
                if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s, sizeof(s)) != CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)) != CUBLAS_STATUS_SUCCESS)
                    continue;
                cublasLtMatmulHeuristicResult_t r;
                memset(&r, 0, sizeof(r));
                if (cublasLtMatmulAlgoCheck(g_cublaslt, p.desc, p.la, p.lb, p.ld, p.ld, &v, &r) != CUBLAS_STATUS_SUCCESS) continue;
                if (r.workspaceSize > CUBLASLT_WORKSPACE_BYTES || known(v)) continue;
                out.push_back(v);
            }
        }
    }
    return out;
}

// (bench only) d (m x n, floatX) = (op(A) op(B)) * gelu'(pre_gelu), and vec (length m) = the sums of d's rows over n,
// from one GEMM (cuBLASLt's DGELU_BGRAD epilogue): the fc projection's dgrad gives the fc layer's input
// gradient and its bias gradient (vec: FP32, or floatX when narrow). False, with nothing launched, when
// cuBLASLt has no algorithm for it.
inline bool matmul_dgelu_bgrad(floatX* d, void* vec, bool narrow, const floatX* a, const floatX* b, const floatX* pre_gelu,
                               int m, int n, int k, bool transA, bool transB, cudaStream_t stream) {
    const MatmulKey key = matmul_key(m, n, k, transA, transB, false, false, false, MatmulBatch(),
                                     narrow ? EPI_DGELU_BGRAD_NARROW : EPI_DGELU_BGRAD);
    MatmulPlan* plan = matmul_plan(key);
    if (!plan) return false;
    MatmulPlan& p = *plan;
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &pre_gelu, sizeof(pre_gelu)));
    const float one = 1.0f, zero = 0.0f;
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(g_cublaslt, p.desc, &one, a, p.la, b, p.lb, &zero, d, p.ld, d, p.ld, &algo,
                              g_cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream);
    };
    if (!p.chosen) matmul_choose(key, p, d, 0, stream, run);
    return matmul_run_candidates(p, run);
}

static floatX* random_bf16(size_t n, unsigned seed) {
    std::vector<floatX> h(n);
    unsigned s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = (floatX)((float)(s >> 8) / 8388608.0f - 1.0f);
    }
    floatX* d = (floatX*)cuda_malloc_or_die(n * sizeof(floatX), "bench operand");
    cudaCheck(cudaMemcpy(d, h.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    return d;
}

struct Gemm {
    std::string name;
    void* d; const floatX* a; const floatX* b; const floatX* bias;
    int m, n, k; bool transA, transB; float beta; bool d_fp32;
    MatmulEpilogue epilogue; void* aux;
};

struct Timing { float first_ms, best_ms; int best, candidates; };

// times every candidate algorithm of g's plan; leaves the plan on its first choice
static Timing time_candidates(const Gemm& g, int reps) {
    const float one = 1.0f;
    auto run = [&]() {
        matmul_launch(g.d, g.a, g.b, g.bias, g.m, g.n, g.k, g.transA, g.transB, &one, &g.beta, false, g.d_fp32, 0,
                      MatmulBatch(), g.epilogue, g.aux);
    };
    run(); // builds the plan
    MatmulPlan* plan = matmul_plan(matmul_key(g.m, g.n, g.k, g.transA, g.transB, g.bias != nullptr, false, g.d_fp32,
                                              MatmulBatch(), g.epilogue));
    Timing t{0.0f, 1e30f, 0, (int)plan->candidates.size()};
    for (int i = 0; i < t.candidates; i++) {
        plan->algo = plan->candidates[i];
        const float ms = mean_ms(run, reps);
        if (i == 0) t.first_ms = ms;
        if (ms < t.best_ms) { t.best_ms = ms; t.best = i; }
    }
    plan->algo = plan->candidates[0];
    return t;
}

// -k 1: the split-k variants of the plan's candidates (matmul_split_k_variants), each timed; prints the
// fastest candidate's and the fastest variant's configuration, and the variant's largest difference from
// the candidate's result (both from a zeroed D, relative to the largest |D|)
static void time_split_k_variants(const Gemm& g, const Timing& t, int reps) {
    MatmulPlan* plan = matmul_plan(matmul_key(g.m, g.n, g.k, g.transA, g.transB, g.bias != nullptr, false, g.d_fp32,
                                              MatmulBatch(), g.epilogue));
    const std::vector<cublasLtMatmulAlgo_t> variants = matmul_split_k_variants(*plan);
    const float one = 1.0f;
    const cublasLtMatmulAlgo_t best_candidate = plan->candidates[t.best];
    auto run = [&]() {
        matmul_launch(g.d, g.a, g.b, g.bias, g.m, g.n, g.k, g.transA, g.transB, &one, &g.beta, false, g.d_fp32, 0,
                      MatmulBatch(), g.epilogue, g.aux);
    };
    float best_ms = 1e30f;
    int best = -1;
    for (size_t i = 0; i < variants.size(); i++) {
        plan->algo = variants[i];
        const float ms = mean_ms(run, reps);
        if (ms < best_ms) { best_ms = ms; best = (int)i; }
    }
    printf("    best candidate: %s\n", matmul_algo_config(best_candidate).c_str());
    if (best < 0) {
        printf("    split-k: no variant\n");
        plan->algo = plan->candidates[0];
        return;
    }
    // the variant's result against the best candidate's, both from a zeroed D
    const size_t count = (size_t)g.m * g.n, bytes = count * (g.d_fp32 ? 4 : sizeof(floatX));
    std::vector<float> ref(count), got(count);
    auto result = [&](const cublasLtMatmulAlgo_t& algo, std::vector<float>& host) {
        plan->algo = algo;
        cudaCheck(cudaMemset(g.d, 0, bytes));
        run();
        if (g.d_fp32) {
            cudaCheck(cudaMemcpy(host.data(), g.d, bytes, cudaMemcpyDeviceToHost));
        } else {
            std::vector<floatX> h(count);
            cudaCheck(cudaMemcpy(h.data(), g.d, bytes, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < count; i++) host[i] = (float)h[i];
        }
    };
    result(best_candidate, ref);
    result(variants[best], got);
    double max_abs = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < count; i++) {
        max_abs = std::max(max_abs, (double)fabsf(ref[i]));
        max_diff = std::max(max_diff, (double)fabsf(ref[i] - got[i]));
    }
    printf("    split-k: %zu variants, fastest %.3f ms (%+.1f%% against the fastest candidate's %.3f), %s, max diff %.2e of max |D| %.2e\n",
           variants.size(), best_ms, 100.0 * (best_ms - t.best_ms) / t.best_ms, t.best_ms,
           matmul_algo_config(variants[best]).c_str(), max_diff, max_abs);
    plan->algo = plan->candidates[0];
}

static size_t find_gemm(const std::vector<Gemm>& gemms, const std::string& name) {
    for (size_t i = 0; i < gemms.size(); i++)
        if (gemms[i].name == name) return i;
    fprintf(stderr, "gemm_bench: no GEMM named '%s'\n", name.c_str());
    exit(1);
}

int main(int argc, char** argv) {
    int C = 768, N = 65536, V = 50304, rows = 8192, reps = 20, explore = 1, splitk = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string f = argv[i];
        const int v = atoi(argv[i + 1]);
        if (f == "-c") C = v; else if (f == "-n") N = v; else if (f == "-v") V = v; else if (f == "-r") rows = v;
        else if (f == "-i") reps = v;
        else if (f == "-q" && (v == 0 || v == 1)) explore = v;
        else if (f == "-k" && (v == 0 || v == 1)) splitk = v;
        else { fprintf(stderr, "usage: gemm_bench [-c C] [-n rows] [-v vocab] [-r chunk rows] [-i reps] [-q 0|1] [-k 0|1]\n"); return 1; }
    }
    if (!gpu_present()) return 77;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("gemm_bench: %s, cuBLASLt %zu (built against %d), C=%d N=%d V=%d chunk rows=%d, %d reps per algorithm\n",
           prop.name, cublasLtGetVersion(), CUBLAS_VERSION, C, N, V, rows, reps);
    matmul_init();
    // -q 1 (default): the candidates of every preference in MATMUL_QUERIES, as the autotuning trainer
    // has them; -q 0: the first query's alone (a single heuristic query)
    g_matmul_explore_preferences = explore == 1;

    const size_t big = (size_t)N * 4 * C;
    floatX* x = random_bf16(big, 1);        // a layer input (N x C or N x 4C)
    floatX* dy = random_bf16(big, 2);       // an output gradient (N x OC)
    floatX* pre = random_bf16(big, 3);      // the GELU pre-activation
    floatX* w = random_bf16((size_t)4 * C * C, 4);
    floatX* bias = random_bf16((size_t)4 * C, 5);
    floatX* wte = random_bf16((size_t)V * C, 6);
    floatX* out = (floatX*)cuda_malloc_or_die(std::max(big, (size_t)rows * V) * sizeof(floatX), "bench output");
    floatX* logits = random_bf16((size_t)rows * V, 7);
    float* dw = (float*)cuda_malloc_or_die((size_t)V * C * sizeof(float), "bench dW");
    cudaCheck(cudaMemset(dw, 0, (size_t)V * C * sizeof(float)));
    float* dbias = (float*)cuda_malloc_or_die((size_t)4 * C * sizeof(float), "bench dbias");
    float* bias_part = (float*)cuda_malloc_or_die((size_t)4 * C * sizeof(float), "bench bias part");
    float* partials = (float*)cuda_malloc_or_die((size_t)BIAS_ROW_GROUPS * 4 * C * sizeof(float), "bench partials");

    const char* kinds[4] = {"qkv", "attproj", "fc", "fcproj"};
    const int in_f[4] = {C, C, C, 4 * C}, out_f[4] = {3 * C, C, 4 * C, C};
    std::vector<Gemm> gemms;
    for (int l = 0; l < 4; l++) {
        const std::string k = kinds[l];
        const bool fc = l == 2, fcproj = l == 3;
        gemms.push_back({k + " forward" + (fc ? " (GELU)" : ""), out, w, x, bias, out_f[l], N, in_f[l], true, false, 0.0f,
                         false, fc ? EPI_GELU_BIAS : EPI_NONE, fc ? (void*)pre : nullptr});
        gemms.push_back({k + " dgrad" + (fcproj ? " (DGELU)" : ""), out, w, dy, nullptr, in_f[l], N, out_f[l], false, false,
                         0.0f, false, fcproj ? EPI_DGELU : EPI_NONE, fcproj ? (void*)pre : nullptr});
        if (fc) // the split form's GEMM: bias only, the GELU as its own pass
            gemms.push_back({k + " forward (bias only)", out, w, x, bias, out_f[l], N, in_f[l], true, false, 0.0f, false,
                             EPI_NONE, nullptr});
        if (fcproj) // the split form's GEMM: plain, the GELU derivative as its own pass
            gemms.push_back({k + " dgrad (plain)", out, w, dy, nullptr, in_f[l], N, out_f[l], false, false, 0.0f, false,
                             EPI_NONE, nullptr});
        gemms.push_back({k + " wgrad", dw, x, dy, nullptr, in_f[l], out_f[l], N, false, true, 1.0f, true, EPI_NONE, nullptr});
        gemms.push_back({k + " wgrad + bias (BGRADB)", dw, x, dy, nullptr, in_f[l], out_f[l], N, false, true, 1.0f, true,
                         EPI_BGRADB, bias_part});
    }
    gemms.push_back({"lm head logits (chunk)", out, wte, x, nullptr, V, rows, C, true, false, 0.0f, false, EPI_NONE, nullptr});
    gemms.push_back({"lm head wgrad (chunk)", dw, x, logits, nullptr, C, V, rows, false, true, 1.0f, true, EPI_NONE, nullptr});
    gemms.push_back({"lm head dgrad (chunk)", out, wte, logits, nullptr, C, rows, V, false, false, 0.0f, false, EPI_NONE, nullptr});

    printf("%-28s %6s %6s %6s | %9s %8s | %9s %4s %6s\n", "gemm", "m", "n", "k", "first ms", "TFLOP/s", "best ms",
           "idx", "gain");
    float first_sum = 0.0f, best_sum = 0.0f;
    std::vector<Timing> timings;
    for (const Gemm& g : gemms) {
        if (!matmul_plan(matmul_key(g.m, g.n, g.k, g.transA, g.transB, g.bias != nullptr, false, g.d_fp32, MatmulBatch(),
                                    g.epilogue))) {
            printf("%-28s %6d %6d %6d | no algorithm\n", g.name.c_str(), g.m, g.n, g.k);
            timings.push_back({0.0f, 0.0f, -1, 0});
            continue;
        }
        const Timing t = time_candidates(g, reps);
        timings.push_back(t);
        const double tflops = 2.0 * g.m * g.n * (double)g.k / (t.first_ms * 1e-3) / 1e12;
        printf("%-28s %6d %6d %6d | %9.3f %8.1f | %9.3f %2d/%d %5.1f%%\n", g.name.c_str(), g.m, g.n, g.k, t.first_ms, tflops,
               t.best_ms, t.best, t.candidates, 100.0 * (t.first_ms - t.best_ms) / t.first_ms);
        if (splitk) time_split_k_variants(g, t, reps);
        const bool split_form = g.name.find("(bias only)") != std::string::npos || g.name.find("(plain)") != std::string::npos;
        if (g.epilogue != EPI_BGRADB && !split_form) { first_sum += t.first_ms; best_sum += t.best_ms; }
    }
    printf("\nbias gradient of each linear, per micro-step call:\n");
    float separate_sum = 0.0f, fused_sum = 0.0f;
    for (int l = 0; l < 4; l++) {
        const float bias_ms = mean_ms([&]() { bias_backward(dbias, partials, dy, N, out_f[l], 0); }, reps);
        const Timing& plain = timings[find_gemm(gemms, std::string(kinds[l]) + " wgrad")];
        const Timing& fused = timings[find_gemm(gemms, std::string(kinds[l]) + " wgrad + bias (BGRADB)")];
        separate_sum += plain.first_ms + bias_ms;
        fused_sum += fused.best >= 0 ? fused.first_ms : plain.first_ms + bias_ms;
        if (fused.best < 0) {
            printf("  %-8s wgrad %.3f + bias_backward %.3f ms; BGRADB: no algorithm\n", kinds[l], plain.first_ms, bias_ms);
        } else {
            printf("  %-8s wgrad %.3f + bias_backward %.3f = %.3f ms; wgrad with BGRADB %.3f ms (%+.3f)\n", kinds[l],
                   plain.first_ms, bias_ms, plain.first_ms + bias_ms, fused.first_ms,
                   fused.first_ms - plain.first_ms - bias_ms);
        }
    }
    // the GELU and its derivative in the epilogue, or the plain GEMM and a separate pass
    // (matmul_prefer_split in llmc/matmul.cuh decides this per shape in the trainer)
    {
        const size_t n_fc = (size_t)N * 4 * C;
        const float gelu_ms = mean_ms([&]() { gelu_forward(out, pre, (long long)n_fc, 0); }, reps);
        const float dgelu_ms = mean_ms([&]() { gelu_backward(out, pre, (long long)n_fc, 0); }, reps);
        const Timing& f_fused = timings[find_gemm(gemms, "fc forward (GELU)")];
        const Timing& f_plain = timings[find_gemm(gemms, "fc forward (bias only)")];
        const Timing& d_fused = timings[find_gemm(gemms, "fcproj dgrad (DGELU)")];
        const Timing& d_plain = timings[find_gemm(gemms, "fcproj dgrad (plain)")];
        printf("\nGELU epilogue or separate pass (fastest candidates):\n");
        printf("  fc forward:   GELU_AUX_BIAS %.3f ms; bias GEMM %.3f + gelu_forward %.3f = %.3f ms (%+.3f)\n",
               f_fused.best_ms, f_plain.best_ms, gelu_ms, f_plain.best_ms + gelu_ms, f_plain.best_ms + gelu_ms - f_fused.best_ms);
        printf("  fcproj dgrad: DGELU %.3f ms; plain GEMM %.3f + gelu_backward %.3f = %.3f ms (%+.3f)\n",
               d_fused.best_ms, d_plain.best_ms, dgelu_ms, d_plain.best_ms + dgelu_ms, d_plain.best_ms + dgelu_ms - d_fused.best_ms);
    }
    // the fc layer's bias gradient from the fc projection's dgrad (DGELU_BGRAD), against DGELU + the
    // fc wgrad's own bias gradient (the separate pass or BGRADB, whichever is faster)
    {
        const int m = 4 * C, k = C;
        float* vec = (float*)cuda_malloc_or_die((size_t)m * sizeof(float), "bench bgrad vector");
        const Timing& d_fused = timings[find_gemm(gemms, "fcproj dgrad (DGELU)")];
        const float fc_bias_ms = mean_ms([&]() { bias_backward(dbias, partials, dy, N, m, 0); }, reps);
        printf("\nfc bias gradient from the fc projection's dgrad (DGELU_BGRAD):\n");
        for (int narrow = 0; narrow < 2; narrow++) {
            auto run = [&]() { matmul_dgelu_bgrad(out, vec, narrow, w, dy, pre, m, N, k, false, false, 0); };
            run();
            MatmulPlan* plan = matmul_plan(matmul_key(m, N, k, false, false, false, false, false, MatmulBatch(),
                                                      narrow ? EPI_DGELU_BGRAD_NARROW : EPI_DGELU_BGRAD));
            if (!plan || plan->candidates.empty()) { printf("  %s vector: no algorithm\n", narrow ? "BF16" : "FP32"); continue; }
            float best_ms = 1e30f; int best = 0;
            for (size_t i = 0; i < plan->candidates.size(); i++) {
                plan->algo = plan->candidates[i];
                const float ms = mean_ms(run, reps);
                if (ms < best_ms) { best_ms = ms; best = (int)i; }
            }
            plan->algo = plan->candidates[best];
            run();
            // the vector against float64 sums of D's rows (D: m x n column-major = n rows of m)
            std::vector<floatX> hd((size_t)m * N);
            std::vector<float> hv(m);
            cudaCheck(cudaMemcpy(hd.data(), out, hd.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
            if (narrow) {
                std::vector<floatX> hb(m);
                cudaCheck(cudaMemcpy(hb.data(), vec, m * sizeof(floatX), cudaMemcpyDeviceToHost));
                for (int i = 0; i < m; i++) hv[i] = (float)hb[i];
            } else {
                cudaCheck(cudaMemcpy(hv.data(), vec, m * sizeof(float), cudaMemcpyDeviceToHost));
            }
            double max_err = 0.0, max_abs_sum = 0.0;
            for (int i = 0; i < m; i++) {
                double sum = 0.0, abs_sum = 0.0;
                for (int j = 0; j < N; j++) { const double v = (double)(float)hd[(size_t)j * m + i]; sum += v; abs_sum += fabs(v); }
                max_err = std::max(max_err, fabs(sum - hv[i]) / std::max(abs_sum, 1e-30));
                max_abs_sum = std::max(max_abs_sum, abs_sum);
            }
            printf("  %s vector: %zu candidates, fastest %.3f ms (idx %d), against DGELU %.3f + the fc bias pass %.3f = %.3f ms (%+.3f); "
                   "vector error max %.2e of the row's sum of |D|\n", narrow ? "BF16" : "FP32", plan->candidates.size(), best_ms,
                   best, d_fused.best_ms, fc_bias_ms, d_fused.best_ms + fc_bias_ms, best_ms - d_fused.best_ms - fc_bias_ms, max_err);
        }
    }
    printf("\nper micro-step, one layer's linears + one classifier chunk: heuristic's first %.3f ms, fastest candidates %.3f ms\n",
           first_sum, best_sum);
    printf("per layer, wgrad + bias: separate %.3f ms, BGRADB %.3f ms\n", separate_sum, fused_sum);
    matmul_free();
    return 0;
}
