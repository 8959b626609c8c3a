// test_gemm_wgmma.cu: the Hopper GEMM with our own epilogue (llmc/gemm_wgmma.cuh).
//   1. out = inp W^T + bias stored as BF16 (StoreBf16) against a float64 product of the same BF16
//      operands, every element: |ours - ref| <= 2^-8 |ref| + 2^-20 sum|terms| (one BF16 rounding and
//      FP32 accumulation), at small shapes and at d12's forward shapes (a slice of rows);
//   2. the same against cuBLASLt's BF16 GEMM (llmc/matmul.cuh): at most one BF16 ulp apart anywhere;
//   3. without a bias; a shape the kernel does not take is reported unsupported;
//   4. the Q1.15 recipe's epilogues (llmc/recipes/q115/recipe.h): the quantized output, and the quantized fc
//      output with its GELU, equal bit for bit what the recipe's post-GEMM kernels make of this GEMM's
//      BF16 output (the fused path differs from cuBLASLt + those kernels only by the order of the sums);
//   5. timing (printed, not asserted): ours against cuBLASLt at d12's forward linears (M = 65536), and
//      the Q1.15 qkv / fc linears fused against cuBLASLt + the post-GEMM pass.
//
//   make build/test_gemm_wgmma && ./build/test_gemm_wgmma
// Prints [PASS]/[FAIL] lines and "gemm_wgmma tests: N passed, N failed"; exit 0 iff all pass. Without a
// CUDA device: "skipped: no CUDA device", exit 77. The kernel runs on sm_90 only: unavailable on a Hopper
// GPU is a failure, on another GPU a "skipped:" line (and 0 passed, 0 failed).
#include <cmath>
#include <random>
#include <vector>
#define SF16_TRUE_FORWARD 1
#include "dev/test/gpu/gpu_check.h"
#include "llmc/matmul.cuh"
#include "llmc/gemm_wgmma.cuh"
#include "llmc/recipes/q115/recipe.h"

static std::vector<floatX> random_bf16(size_t n, std::mt19937& rng, float scale) {
    return random_floatx(n, rng, -scale, scale);
}

// one BF16 ulp of |x| (x a BF16 value)
static double bf16_ulp(double x) {
    x = std::fabs(x);
    if (x < 1e-30) return std::ldexp(1.0, -133);
    return std::ldexp(1.0, std::ilogb(x) - 7);
}

static void test_shape(int M, int N, int K, bool with_bias, int check_rows, std::mt19937& rng) {
    const auto h_inp = random_bf16((size_t)M * K, rng, 1.0f);
    const auto h_w = random_bf16((size_t)N * K, rng, 0.1f);
    const auto h_bias = random_bf16(N, rng, 0.5f);
    floatX* inp = to_device(h_inp);
    floatX* w = to_device(h_w);
    floatX* bias = with_bias ? to_device(h_bias) : nullptr;
    floatX *out = nullptr, *out_ref = nullptr;
    cudaCheck(cudaMalloc(&out, (size_t)M * N * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out_ref, (size_t)M * N * sizeof(floatX)));
    cudaCheck(cudaMemset(out, 0xFF, (size_t)M * N * sizeof(floatX))); // NaN: an element never written shows

    const bool ok = gemm_wgmma::supported(out, inp, w, bias, M, N, K);
    check(ok, "gemm_wgmma supports M=%d N=%d K=%d", M, N, K);
    if (!ok) return;
    gemm_wgmma::gemm(inp, w, bias, M, N, K, gemm_wgmma::StoreBf16{{out}}, 0);
    matmul(out_ref, w, inp, bias, N, M, K, true, false, 1.0f, 0.0f, false, 0);
    const auto ours = to_host(out, (size_t)M * N);
    const auto cub = to_host(out_ref, (size_t)M * N);

    // against float64, on check_rows rows spread over M (all rows when check_rows >= M)
    double worst = 0.0;
    long long worst_at = -1, checked = 0;
    const int stride = check_rows >= M ? 1 : M / check_rows;
    for (int m = 0; m < M; m += stride) {
        for (int n = 0; n < N; n++) {
            double v = with_bias ? bf2f(h_bias[n]) : 0.0, mag = std::fabs(v);
            for (int k = 0; k < K; k++) {
                const double t = (double)bf2f(h_inp[(size_t)m * K + k]) * (double)bf2f(h_w[(size_t)n * K + k]);
                v += t;
                mag += std::fabs(t);
            }
            const double got = bf2f(ours[(size_t)m * N + n]);
            const double r = std::fabs(got - v) / (std::ldexp(std::fabs(v), -8) + std::ldexp(mag, -20) + 1e-30);
            if (!(r <= worst)) { worst = r; worst_at = (long long)m * N + n; }
            checked++;
        }
    }
    check(worst <= 1.0, "M=%d N=%d K=%d%s: %lld outputs against float64 within one BF16 rounding + FP32 accumulation "
          "(worst %.3f of the bound at %lld)", M, N, K, with_bias ? " +bias" : "", checked, worst, worst_at);

    // against cuBLASLt, every element
    long long differ = 0, beyond_ulp = 0, first_bad = -1;
    for (size_t i = 0; i < ours.size(); i++) {
        const double a = bf2f(ours[i]), b = bf2f(cub[i]);
        if (bfbits(ours[i]) != bfbits(cub[i])) differ++;
        if (!(std::fabs(a - b) <= bf16_ulp(b))) { beyond_ulp++; if (first_bad < 0) first_bad = (long long)i; }
    }
    check(beyond_ulp == 0, "M=%d N=%d K=%d%s: all %zu outputs within one BF16 ulp of cuBLASLt's (%lld differ in the "
          "last bit; first beyond: %lld)", M, N, K, with_bias ? " +bias" : "", ours.size(), differ, first_bad);
    cudaCheck(cudaFree(inp));
    cudaCheck(cudaFree(w));
    if (bias) cudaCheck(cudaFree(bias));
    cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(out_ref));
}

static void time_shape(const char* name, int M, int N, int K) {
    std::mt19937 rng(7);
    const auto h_inp = random_bf16((size_t)M * K, rng, 1.0f);
    const auto h_w = random_bf16((size_t)N * K, rng, 0.05f);
    const auto h_bias = random_bf16(N, rng, 0.5f);
    floatX* inp = to_device(h_inp);
    floatX* w = to_device(h_w);
    floatX* bias = to_device(h_bias);
    floatX* out = nullptr;
    cudaCheck(cudaMalloc(&out, (size_t)M * N * sizeof(floatX)));
    const double flop = 2.0 * M * N * K;
    const double t_ours = median_ms([&] { gemm_wgmma::gemm(inp, w, bias, M, N, K, gemm_wgmma::StoreBf16{{out}}, 0); });
    const double t_cub = median_ms([&] { matmul(out, w, inp, bias, N, M, K, true, false, 1.0f, 0.0f, false, 0); });
    printf("  %-22s M=%d N=%d K=%d: ours %.4f ms (%.0f TFLOP/s), cuBLASLt %.4f ms (%.0f TFLOP/s), ours/cuBLASLt %.3f\n",
           name, M, N, K, t_ours, flop / t_ours / 1e9, t_cub, flop / t_cub / 1e9, t_ours / t_cub);
    cudaCheck(cudaFree(inp));
    cudaCheck(cudaFree(w));
    cudaCheck(cudaFree(bias));
    cudaCheck(cudaFree(out));
}

// 4. the Q1.15 epilogues against the recipe's kernels applied to this GEMM's own BF16 output
static void test_q115_epilogues(int M, int N, int K, std::mt19937& rng) {
    const auto h_inp = random_bf16((size_t)M * K, rng, 1.0f);
    const auto h_w = random_bf16((size_t)N * K, rng, 0.08f);   // outputs around +-1: some clamp, some tiny
    const auto h_bias = random_bf16(N, rng, 0.3f);
    floatX* inp = to_device(h_inp);
    floatX* w = to_device(h_w);
    floatX* bias = to_device(h_bias);
    const size_t n = (size_t)M * N;
    floatX *plain, *fused, *pre, *gelu, *gelu_ref;
    cudaCheck(cudaMalloc(&plain, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&fused, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&pre, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&gelu, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&gelu_ref, n * sizeof(floatX)));
    const long long n_vec = (long long)n / 8;
    // the quantized output (qkv's boundary)
    gemm_wgmma::gemm(inp, w, bias, M, N, K, gemm_wgmma::StoreBf16{{plain}}, 0);
    gemm_wgmma::gemm(inp, w, bias, M, N, K, Q115OutputEpilogue<false>{{fused}, QB_QKV}, 0);
    q115_matmul_output_kernel<false><<<ceil_div(n_vec, 256LL), 256>>>(plain, n_vec, QB_QKV);
    cudaCheckLaunch();
    auto a = to_host(plain, n), b = to_host(fused, n);
    long long differ = 0, clamped = 0;
    for (size_t i = 0; i < n; i++) {
        differ += bfbits(a[i]) != bfbits(b[i]);
        clamped += std::fabs(bf2f(b[i])) >= 0.999f;
    }
    check(differ == 0 && clamped > 0, "M=%d N=%d K=%d: the Q1.15 output epilogue equals the post-GEMM kernel on this "
          "GEMM's output, all %zu values bit for bit (%lld differ; %lld clamped)", M, N, K, n, differ, clamped);
    // the fc output and its GELU
    gemm_wgmma::gemm(inp, w, bias, M, N, K, gemm_wgmma::StoreBf16{{plain}}, 0);
    gemm_wgmma::gemm(inp, w, bias, M, N, K, Q115FcGeluEpilogue<false>{{pre, gelu}}, 0);
    q115_fc_gelu_kernel<false><<<ceil_div(n_vec, 256LL), 256>>>(gelu_ref, plain, n_vec);
    cudaCheckLaunch();
    a = to_host(plain, n); b = to_host(pre, n);
    auto c = to_host(gelu_ref, n), d = to_host(gelu, n);
    long long differ_pre = 0, differ_gelu = 0;
    for (size_t i = 0; i < n; i++) {
        differ_pre += bfbits(a[i]) != bfbits(b[i]);
        differ_gelu += bfbits(c[i]) != bfbits(d[i]);
    }
    check(differ_pre == 0 && differ_gelu == 0, "M=%d N=%d K=%d: the Q1.15 fc + GELU epilogue equals the fc + GELU kernel "
          "on this GEMM's output, bit for bit (pre-GELU: %lld differ, GELU: %lld differ, of %zu)", M, N, K, differ_pre,
          differ_gelu, n);
    for (floatX* p : {inp, w, bias, plain, fused, pre, gelu, gelu_ref}) cudaCheck(cudaFree(p));
}

// 5. the Q1.15 forward linears: fused against cuBLASLt + the pass (what the recipe ran before)
static void time_q115(const char* name, int M, int N, int K, bool with_gelu) {
    std::mt19937 rng(9);
    floatX* inp = to_device(random_bf16((size_t)M * K, rng, 1.0f));
    floatX* w = to_device(random_bf16((size_t)N * K, rng, 0.05f));
    floatX* bias = to_device(random_bf16(N, rng, 0.3f));
    floatX *out, *out2;
    cudaCheck(cudaMalloc(&out, (size_t)M * N * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out2, (size_t)M * N * sizeof(floatX)));
    const long long n_vec = (long long)M * N / 8;
    double fused, split;
    if (with_gelu) {
        fused = median_ms([&] { gemm_wgmma::gemm(inp, w, bias, M, N, K, Q115FcGeluEpilogue<false>{{out, out2}}, 0); });
        split = median_ms([&] {
            matmul(out, w, inp, bias, N, M, K, true, false, 1.0f, 0.0f, false, 0);
            q115_fc_gelu_kernel<false><<<ceil_div(n_vec, 256LL), 256>>>(out2, out, n_vec);
        });
    } else {
        fused = median_ms([&] { gemm_wgmma::gemm(inp, w, bias, M, N, K, Q115OutputEpilogue<false>{{out}, QB_QKV}, 0); });
        split = median_ms([&] {
            matmul(out, w, inp, bias, N, M, K, true, false, 1.0f, 0.0f, false, 0);
            q115_matmul_output_kernel<false><<<ceil_div(n_vec, 256LL), 256>>>(out, n_vec, QB_QKV);
        });
    }
    printf("  q115 %-17s M=%d N=%d K=%d: fused %.4f ms, cuBLASLt + pass %.4f ms, fused/split %.3f\n", name, M, N, K,
           fused, split, fused / split);
    for (floatX* p : {inp, w, bias, out, out2}) cudaCheck(cudaFree(p));
}

int main() {
    if (!gpu_present()) return 77;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (!gemm_wgmma::available()) {
        if (prop.major == 9 && prop.minor == 0) {
            check(false, "gemm_wgmma is available on %s (sm_90a build)", prop.name);
            printf("gemm_wgmma tests: %d passed, %d failed\n", g_passed, g_failed);
            return 1;
        }
        printf("skipped: gemm_wgmma needs an sm_90 GPU and an sm_90a build (%s is sm_%d%d)\n", prop.name, prop.major,
               prop.minor);
        printf("gemm_wgmma tests: 0 passed, 0 failed\n");
        return 0;
    }
    matmul_init();
    std::mt19937 rng(1234);
    for (int tile_n : {128, 256}) { // the default tiles, and the 128 x 256 experiment (gemm_wgmma::Tile256)
        gemm_wgmma::g_tile_n = tile_n;
        printf("-- %d x %d tiles\n", gemm_wgmma::BM, tile_n);
        test_shape(128, 128, 64, true, 1 << 30, rng);
        test_shape(256, 512, 320, true, 1 << 30, rng);   // several tiles, more K steps than slots in the ring
        test_shape(512, 384, 768, false, 1 << 30, rng);  // (not a multiple of 256: 128-wide tiles)
        test_shape(8192, 2304, 768, true, 64, rng);      // d12's qkv (a slice of the rows against float64)
        test_shape(8192, 3072, 768, true, 64, rng);      // fc
        test_shape(8192, 768, 3072, true, 64, rng);      // fcproj
        test_q115_epilogues(1024, 768, 768, rng);
    }
    gemm_wgmma::g_tile_n = 128;
    {
        floatX* p = nullptr;
        cudaCheck(cudaMalloc(&p, 1 << 20));
        check(!gemm_wgmma::supported(p, p, p, nullptr, 100, 128, 64), "M = 100 is reported unsupported");
        check(!gemm_wgmma::supported(p, p, p, nullptr, 128, 96, 64), "N = 96 is reported unsupported");
        check(!gemm_wgmma::supported(p, p, p, nullptr, 128, 128, 48), "K = 48 is reported unsupported");
        check(!gemm_wgmma::supported(p + 1, p, p, nullptr, 128, 128, 64), "a misaligned output is reported unsupported");
        cudaCheck(cudaFree(p));
    }
    test_q115_epilogues(512, 3072, 768, rng);
    for (int tile_n : {128, 256}) {
        gemm_wgmma::g_tile_n = tile_n;
        printf("timing on %s (median of 20), %d x %d tiles:\n", prop.name, gemm_wgmma::BM, tile_n);
        time_shape("qkv", 65536, 2304, 768);
        time_shape("fc", 65536, 3072, 768);
        time_shape("attproj", 65536, 768, 768);
        time_shape("fcproj", 65536, 768, 3072);
        time_q115("qkv", 65536, 2304, 768, false);
        time_q115("fc + GELU", 65536, 3072, 768, true);
    }
    gemm_wgmma::g_tile_n = 128;
    printf("gemm_wgmma tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
