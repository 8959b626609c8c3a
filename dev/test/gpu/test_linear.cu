// test_linear.cu: the plain linear layer of llmc/recipe_api.h (what BF16 is, and what every recipe falls
// back to for the layers it keeps in BF16) against float64 products of the same BF16 operands:
//   1. forward out = x W^T + b, and with the GELU (gelu_out and the kept pre-activation);
//   2. backward dx = dy W, and times gelu'(pre);
//   the GELU and its derivative both ways: in the GEMM's epilogue and as the plain GEMM + a separate
//   pass (matmul_prefer_split; forced through the decision record a checkpoint would carry), and the
//   way autotuning picks;
//   3. backward dW += dy^T x and db += column sums of dy over two micro-steps on top of non-zero
//      gradients (BGRADB or the plain GEMM + bias_backward, forced each way and as autotuning decides,
//      whose timing runs must leave the accumulated gradients as they were): the bias gradient from
//      the weight-gradient GEMM's BGRADB epilogue (which overwrites
//      its vector, so it goes through scratch and is added), at a row count large enough for
//      cuBLASLt to split k; the same sums by bias_backward, the fallback path; dW without a bias.
// Everything twice: with the heuristic's first algorithm, and autotuned (matmul.cuh: the first call
// of a shape times every candidate, saving and restoring D when the GEMM accumulates into it).
//
//   make build/test_linear && ./build/test_linear
// Prints [PASS]/[FAIL] lines and "linear tests: N passed, N failed"; exit 0 iff all pass. Without a
// CUDA device: "skipped: no CUDA device", exit 77.
#include <cmath>
#include <random>
#include <vector>
#include "dev/test/gpu/gpu_check.h"
#include "llmc/recipe_api.h"

static std::vector<floatX> random_bf16(size_t n, std::mt19937& rng, float scale) {
    return random_floatx(n, rng, -scale, scale);
}
static double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_grad(double x) {
    const double k = 0.7978845608028654, u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// max over i of |ours - ref| / (rel * |ref| + abs_scale[i]): <= 1 passes
struct Bound { double worst = 0.0; size_t at = 0; };
static Bound bound_ratio(const std::vector<double>& ours, const std::vector<double>& ref, const std::vector<double>& abs_scale,
                         double rel, double abs_rel) {
    Bound b;
    for (size_t i = 0; i < ref.size(); i++) {
        const double r = std::fabs(ours[i] - ref[i]) / (rel * std::fabs(ref[i]) + abs_rel * abs_scale[i] + 1e-30);
        if (!(r <= b.worst)) { b.worst = r; b.at = i; }
    }
    return b;
}
static std::vector<double> widen(const std::vector<floatX>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); i++) d[i] = bf2f(v[i]);
    return d;
}
static std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// C (rows x cols) = sum over k of A(rows, k) B(cols, k) (both row-major, k contiguous): the value and
// sum |terms| (the scale of FP32 accumulation error)
static void product_nt(const std::vector<double>& A, const std::vector<double>& B, int rows, int cols, int K,
                       std::vector<double>& val, std::vector<double>& mag) {
    val.assign((size_t)rows * cols, 0.0); mag.assign((size_t)rows * cols, 0.0);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double s = 0.0, m = 0.0;
            for (int k = 0; k < K; k++) {
                const double t = A[(size_t)i * K + k] * B[(size_t)j * K + k];
                s += t; m += std::fabs(t);
            }
            val[(size_t)i * cols + j] = s; mag[(size_t)i * cols + j] = m;
        }
}
static std::vector<double> transposed(const std::vector<double>& a, int rows, int cols) {
    std::vector<double> t(a.size());
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = a[(size_t)i * cols + j];
    return t;
}

// a BF16 output: one rounding of the FP32 result (2^-8 relative) plus FP32 accumulation
static const double BF16_OUT = 1.0 / 256, FP32_ACC = 1e-5;

// force: -1 leaves the fused-or-split decision to matmul_prefer_split, 0 / 1 records fused / split
static void force_split_decision(const MatmulKey& fused_key, int force) {
    if (force >= 0) g_matmul_choice[matmul_split_decision_key(fused_key)] = force;
}
static const char* way_name(int force) { return force < 0 ? "as chosen" : force == 0 ? "fused" : "split"; }

static void test_forward(int N, int C, int OC, std::mt19937& rng, int force = -1) {
    auto x = random_bf16((size_t)N * C, rng, 1.0f), w = random_bf16((size_t)OC * C, rng, 0.2f), b = random_bf16(OC, rng, 0.5f);
    floatX *dx = to_device(x), *dw = to_device(w), *db = to_device(b);
    floatX *out, *gout, *pre;
    cudaCheck(cudaMalloc(&out, (size_t)N * OC * 2)); cudaCheck(cudaMalloc(&gout, (size_t)N * OC * 2));
    cudaCheck(cudaMalloc(&pre, (size_t)N * OC * 2));
    force_split_decision(matmul_key(OC, N, C, true, false, true, false, false, MatmulBatch(), EPI_GELU_BIAS), force);
    plain_linear_forward(out, dx, dw, db, N, C, OC, 0);
    plain_linear_forward_gelu(gout, pre, dx, dw, db, N, C, OC, 0);
    std::vector<double> ref, mag;
    product_nt(widen(x), widen(w), N, OC, C, ref, mag); // (N x OC): rows of x against rows of W
    const auto bd = widen(b);
    std::vector<double> ref_pre(ref.size()), ref_gelu(ref.size()), gelu_mag(ref.size());
    for (int i = 0; i < N; i++)
        for (int j = 0; j < OC; j++) {
            const size_t at = (size_t)i * OC + j;
            ref_pre[at] = ref[at] + bd[j];
            mag[at] += std::fabs(bd[j]);
            ref_gelu[at] = gelu(ref_pre[at]);
            // the epilogue's GELU uses a fast tanh; the split form applies the GELU to the BF16-rounded
            // pre-activation: another 2^-9 |pre| |gelu'| (in units of the 1e-3 allowance below)
            gelu_mag[at] = mag[at] * std::fabs(gelu_grad(ref_pre[at])) + 1e-3 +
                           (force != 0 ? std::fabs(ref_pre[at] * gelu_grad(ref_pre[at])) / 512.0 / 1e-3 : 0.0);
        }
    Bound b1 = bound_ratio(widen(to_host(out, (size_t)N * OC)), ref_pre, mag, BF16_OUT, FP32_ACC);
    check(b1.worst <= 1.0, "forward N=%d C=%d OC=%d: x W^T + b within BF16 rounding (worst %.2f of the bound)", N, C, OC, b1.worst);
    Bound b2 = bound_ratio(widen(to_host(pre, (size_t)N * OC)), ref_pre, mag, BF16_OUT, FP32_ACC);
    check(b2.worst <= 1.0, "forward+GELU (%s): the kept pre-activation (worst %.2f)", way_name(force), b2.worst);
    Bound b3 = bound_ratio(widen(to_host(gout, (size_t)N * OC)), ref_gelu, gelu_mag, BF16_OUT, 1e-3);
    check(b3.worst <= 1.0, "forward+GELU (%s): gelu(x W^T + b) (worst %.2f)", way_name(force), b3.worst);
    cudaFree(dx); cudaFree(dw); cudaFree(db); cudaFree(out); cudaFree(gout); cudaFree(pre);
}

static void test_backward_dx(int N, int C, int OC, std::mt19937& rng, int force = -1) {
    auto dy = random_bf16((size_t)N * OC, rng, 1.0f), w = random_bf16((size_t)OC * C, rng, 0.2f);
    auto pre = random_bf16((size_t)N * C, rng, 3.0f);
    floatX *ddy = to_device(dy), *dw = to_device(w), *dpre = to_device(pre), *dx, *dxg;
    cudaCheck(cudaMalloc(&dx, (size_t)N * C * 2)); cudaCheck(cudaMalloc(&dxg, (size_t)N * C * 2));
    force_split_decision(matmul_key(C, N, OC, false, false, false, false, false, MatmulBatch(), EPI_DGELU), force);
    plain_linear_backward_dx(dx, ddy, dw, nullptr, N, C, OC, 0);
    plain_linear_backward_dx(dxg, ddy, dw, dpre, N, C, OC, 0);
    std::vector<double> ref, mag;
    product_nt(widen(dy), transposed(widen(w), OC, C), N, C, OC, ref, mag); // dy (N x OC) W (OC x C)
    Bound b1 = bound_ratio(widen(to_host(dx, (size_t)N * C)), ref, mag, BF16_OUT, FP32_ACC);
    check(b1.worst <= 1.0, "backward dx N=%d C=%d OC=%d: dy W (worst %.2f)", N, C, OC, b1.worst);
    const auto pd = widen(pre);
    // allowance: the BF16 output's rounding, FP32 accumulation (scaled by |gelu'|), and gelu' evaluated
    // to BF16-like precision in the epilogue (4e-3 |dy W|; measured worst 1.2x of 1e-3 on an H100); the
    // split form's extra rounding of dy W to BF16 (2^-9 |dy W gelu'|) fits in the same allowance
    std::vector<double> refg(ref.size()), magg(ref.size());
    for (size_t i = 0; i < ref.size(); i++) {
        const double g = gelu_grad(pd[i]);
        refg[i] = ref[i] * g;
        magg[i] = mag[i] * std::fabs(g) + 4e-3 / FP32_ACC * std::fabs(ref[i]);
    }
    Bound b2 = bound_ratio(widen(to_host(dxg, (size_t)N * C)), refg, magg, BF16_OUT, FP32_ACC);
    check(b2.worst <= 1.0, "backward dx with the GELU derivative (%s): (dy W) * gelu'(pre) (worst %.2f)", way_name(force),
          b2.worst);
    cudaFree(ddy); cudaFree(dw); cudaFree(dpre); cudaFree(dx); cudaFree(dxg);
}

static void test_backward_dw_bias(int N, int C, int OC, std::mt19937& rng, int force = -1) {
    force_split_decision(matmul_key(C, OC, N, false, true, false, false, true, MatmulBatch(), EPI_BGRADB), force);
    LinearScratch scratch;
    linear_scratch_init(scratch, std::max(C, OC)); // (sized by the widest output, 4x the argument)
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> dw0((size_t)OC * C), db0(OC);
    for (auto& v : dw0) v = u(rng);
    for (auto& v : db0) v = u(rng);
    float *ddw = to_device(dw0), *ddb = to_device(db0), *ddw_plain = to_device(dw0), *ddb_sep = to_device(db0);
    std::vector<double> ref_w = widen(dw0), ref_b = widen(db0), mag_w(ref_w.size()), mag_b(OC);
    for (size_t i = 0; i < ref_w.size(); i++) mag_w[i] = std::fabs(ref_w[i]);
    for (int j = 0; j < OC; j++) mag_b[j] = std::fabs(ref_b[j]);
    for (int micro = 0; micro < 2; micro++) {
        auto x = random_bf16((size_t)N * C, rng, 1.0f), dy = random_bf16((size_t)N * OC, rng, 1.0f);
        floatX *dx = to_device(x), *ddy = to_device(dy);
        plain_linear_backward_dw_bias(ddw, ddb, ddy, dx, scratch, N, C, OC, 0);      // BGRADB, or as decided
        plain_linear_backward_dw_bias(ddw_plain, nullptr, ddy, dx, scratch, N, C, OC, 0); // no bias: dW alone
        bias_backward(ddb_sep, scratch.bias_partials, ddy, N, OC, 0);                   // the fallback's sums
        std::vector<double> val, mag;
        product_nt(transposed(widen(dy), N, OC), transposed(widen(x), N, C), OC, C, N, val, mag);
        for (size_t i = 0; i < val.size(); i++) { ref_w[i] += val[i]; mag_w[i] += mag[i]; }
        const auto dyd = widen(dy);
        for (int r = 0; r < N; r++)
            for (int j = 0; j < OC; j++) { ref_b[j] += dyd[(size_t)r * OC + j]; mag_b[j] += std::fabs(dyd[(size_t)r * OC + j]); }
        cudaFree(dx); cudaFree(ddy);
    }
    const double FP32_OUT = 1e-6; // FP32 outputs: the accumulation is the error
    Bound bw = bound_ratio(widen(to_host(ddw, (size_t)OC * C)), ref_w, mag_w, FP32_OUT, FP32_ACC);
    check(bw.worst <= 1.0, "dW += dy^T x (bias gradient %s), two micro-steps on a non-zero dW, N=%d C=%d OC=%d (worst %.2f)",
          force < 0 ? "as chosen" : force == 0 ? "from BGRADB" : "by bias_backward", N, C, OC, bw.worst);
    Bound bb = bound_ratio(widen(to_host(ddb, OC)), ref_b, mag_b, FP32_OUT, FP32_ACC);
    check(bb.worst <= 1.0, "db += column sums of dy with the wgrad GEMM, two micro-steps on a non-zero db (worst %.2f)", bb.worst);
    Bound bs = bound_ratio(widen(to_host(ddb_sep, OC)), ref_b, mag_b, FP32_OUT, FP32_ACC);
    check(bs.worst <= 1.0, "the same by bias_backward, the fallback (worst %.2f)", bs.worst);
    Bound bp = bound_ratio(widen(to_host(ddw_plain, (size_t)OC * C)), ref_w, mag_w, FP32_OUT, FP32_ACC);
    check(bp.worst <= 1.0, "dW without a bias (worst %.2f)", bp.worst);
    cudaFree(ddw); cudaFree(ddb); cudaFree(ddw_plain); cudaFree(ddb_sep);
    cudaFree(scratch.bias_partials); cudaFree(scratch.bias_grad);
}

int main() {
    if (!gpu_present()) return 77;
    std::mt19937 rng(1234);
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    for (int tune = 0; tune < 2; tune++) {
    matmul_init();
    matmul_set_autotune(tune == 1);
    printf("-- %s\n", tune ? "autotuned algorithms" : "the heuristic's first algorithms");
#if !defined(ENABLE_FP32)
    // the fused bias gradient is the path the trainer takes on Hopper: say so if cuBLASLt stops offering it
    if (prop.major == 9) {
        const MatmulKey key = matmul_key(64, 192, 4096, false, true, false, false, true, MatmulBatch(), EPI_BGRADB);
        check(matmul_plan(key) != nullptr, "cuBLASLt has a BGRADB (bias gradient) algorithm for the BF16 wgrad GEMM on %s",
              prop.name);
    }
#endif
    test_forward(333, 64, 192, rng);
    test_forward(64, 128, 256, rng);
    test_backward_dx(333, 64, 256, rng);
    test_backward_dx(200, 128, 64, rng);
    for (int force = 0; force < 2; force++) { // both ways, whatever the decision would be
        test_forward(136, 64, 320, rng, force);
        test_backward_dx(136, 64, 320, rng, force);
    }
    test_backward_dw_bias(333, 64, 192, rng);
    test_backward_dw_bias(16384, 32, 96, rng); // long k: split-k reductions
    for (int force = 0; force < 2; force++) test_backward_dw_bias(520, 96, 160, rng, force); // both ways
    if (tune) check(!matmul_choices().empty(), "autotuning recorded its choices (%zu shapes)", matmul_choices().size());
    if (tune) {
        // the first GELU GEMM of an untuned shape timed both ways and recorded its decision
        const MatmulKey key = matmul_key(320, 96, 64, true, false, true, false, false, MatmulBatch(), EPI_GELU_BIAS);
        std::vector<floatX> zeros(96 * 320);
        floatX *x = to_device(random_bf16(96 * 64, rng, 1.0f)), *w = to_device(random_bf16(320 * 64, rng, 0.2f));
        floatX *b = to_device(random_bf16(320, rng, 0.5f)), *g = to_device(zeros), *pre = to_device(zeros);
        plain_linear_forward_gelu(g, pre, x, w, b, 96, 64, 320, 0);
        for (const auto& kv : g_matmul_choice)
            if (kv.first.epilogue >= EPI_SPLIT_DECISION)
                printf("       decision m=%d n=%d k=%d bias=%d epilogue=%d: %s\n", kv.first.m, kv.first.n, kv.first.k,
                       kv.first.has_bias, kv.first.epilogue - EPI_SPLIT_DECISION, way_name(kv.second));
        check(g_matmul_choice.count(matmul_split_decision_key(key)) == 1,
              "autotuning decided fused or split for the GELU GEMM and recorded it (%s)",
              g_matmul_choice.count(matmul_split_decision_key(key)) ? way_name(g_matmul_choice[matmul_split_decision_key(key)]) : "none");
        cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(g); cudaFree(pre);
    }
    matmul_free();
    }
    printf("linear tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
