// test_nvfp4.cu: the NVFP4 recipe's GPU pieces against the CPU reference of llmc/formats/nvfp4.h.
//   1. The quantize kernels, bit for bit: 1x16 row blocks (forward / dgrad operands) and rotated
//      16-row column blocks (wgrad operands), round to nearest even and stochastic, with and without
//      Four Over Six; the amaxes (plain and after the Hadamard transform) and the GEMMs' alphas;
//      inputs with every E2M1 code, ties, zero and all-equal blocks, tiny and huge scales, outliers.
//   2. The 16x16 weight tiles, bit for bit, with and without Four Over Six.
//   3. Stochastic rounding is unbiased on the GPU (mean over many independent draws).
//   1b/2b. The native FP4 operands the same kernels write for Blackwell's FP4 GEMMs (packed codes,
//      K-major, and UE4M3 scales in the 128 x 4 tiled layout), byte for byte against the CPU
//      reference's nvfp4_native_operand: x and x^T, W and W^T, the tiled padding zeroed.
//   5. The native FP4 GEMMs (matmul_fp4) against float64, on compute capability 10.0 and newer only;
//      below that, that cuBLASLt offers none (so the recipe emulates).
//   4. The emulated GEMMs: BF16 GEMMs of the block-dequantized operands with alpha = g_a * g_b from
//      device memory equal a float64 product of the dequantized operands (forward with bias, with
//      the GELU epilogue, dgrad, and wgrad accumulating into FP32); the rotated wgrad equals the
//      unquantized product up to the quantization error, as the unrotated one does.
//
//   make build/test_nvfp4 && ./build/test_nvfp4
// Prints [PASS]/[FAIL] lines and "nvfp4 tests: N passed, N failed"; exit 0 iff all pass. Without a
// CUDA device: "skipped: no CUDA device", exit 77.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>
#include "dev/test/gpu/gpu_check.h"
#include "llmc/recipes/nvfp4/nvfp4_kernels.cuh"
#include "llmc/matmul.cuh"

using llmc::Nvfp4Config;
using llmc::Nvfp4Layout;
using llmc::Nvfp4Matrix;
using llmc::Rounding;

static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
using llmc::strfmt;


// A (rows x cols) test input, BF16-representable (the kernels read BF16). Kinds:
//   0 normal(0, 1)   1 normal with rare 1000x outliers   2 every E2M1 value times powers of two,
//   with ties between codes, zero rows and all-equal blocks   3 tiny values (1e-30 scale)
static std::vector<float> make_input(int rows, int cols, int kind, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 15);
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    std::vector<float> x((size_t)rows * cols);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            float v = nd(rng);
            if (kind == 1 && pick(rng) == 0 && pick(rng) == 0) v *= 1000.0f;
            if (kind == 2) {
                const int code = pick(rng);
                v = e2m1[code & 7] * ((code & 8) ? -1.0f : 1.0f) * std::ldexp(1.0f, (r % 7) - 3);
                if (r % 5 == 1) v = v + 0.25f * std::ldexp(1.0f, (r % 7) - 3); // between codes: ties and rounding
                if (r % 11 == 3) v = 0.0f;                                      // zero blocks
                if (r % 13 == 4) v = 1.75f;                                     // all-equal blocks
            }
            if (kind == 3) v *= 1e-30f;
            x[(size_t)r * cols + c] = bf2f(f2bf(v));
        }
    }
    return x;
}

static std::vector<float> transpose(const std::vector<float>& x, int rows, int cols) {
    std::vector<float> t((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = x[(size_t)r * cols + c];
    return t;
}

// e2m1 * ue4m3 of element (r, c): what the kernels write
static float block_value(const Nvfp4Matrix& q, int r, int c) {
    return llmc::fp4e2m1_decode(q.code(r, c)) * llmc::ue4m3_decode(q.scale_of(r, c));
}

// count the elements whose GPU value differs in bits from the reference's (NaN = NaN)
static size_t mismatches(const std::vector<floatX>& gpu, const Nvfp4Matrix& q, bool transposed, int rows, int cols) {
    size_t bad = 0;
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
            const float want = transposed ? block_value(q, c, r) : block_value(q, r, c);
            const float got = bf2f(gpu[(size_t)r * cols + c]);
            const bool same = (want != want && got != got) || fbits(want) == fbits(got);
            if (!same && bad++ < 3)
                printf("    (%d, %d): gpu %.9g, reference %.9g\n", r, c, got, want);
        }
    }
    return bad;
}

// A native operand's device buffers, filled with 0xAB first (bytes nobody writes show up)
struct NativeBuffers {
    uint8_t* codes = nullptr;
    uint8_t* scales = nullptr;
    size_t code_bytes = 0, scale_bytes = 0;
    NativeBuffers(int rows, int k) : code_bytes((size_t)rows * k / 2), scale_bytes(llmc::nvfp4_tiled_scale_bytes(rows, k / 16)) {
        cudaCheck(cudaMalloc(&codes, code_bytes));
        cudaCheck(cudaMalloc(&scales, scale_bytes));
        cudaCheck(cudaMemset(codes, 0xAB, code_bytes));
        cudaCheck(cudaMemset(scales, 0xAB, scale_bytes));
    }
    ~NativeBuffers() { cudaFree(codes); cudaFree(scales); }
    // bytes that differ from the reference operand's (codes, then scales)
    size_t mismatches(const llmc::Nvfp4NativeOperand& ref) const {
        const std::vector<uint8_t> c = to_host(codes, code_bytes), sc = to_host(scales, scale_bytes);
        if (c.size() != ref.codes.size() || sc.size() != ref.scales.size()) return (size_t)-1;
        size_t bad = 0;
        for (size_t i = 0; i < c.size(); i++) bad += c[i] != ref.codes[i];
        for (size_t i = 0; i < sc.size(); i++) bad += sc[i] != ref.scales[i];
        return bad;
    }
};

// 1. The activation / gradient kernel in both directions against the CPU reference.
static void test_quantize(int rows, int cols, int kind, bool rht, bool stochastic, bool fos) {
    const std::vector<float> x = make_input(rows, cols, kind, 1000 + kind * 7 + rows);
    std::vector<floatX> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = f2bf(x[i]);
    const uint16_t signs = llmc::nvfp4_rht_signs(77);
    const uint64_t seed_rows = 0x1234 + kind, seed_cols = 0x5678 + kind;
    floatX* dx = to_device(xb);
    floatX *drows, *dcols;
    cudaCheck(cudaMalloc(&drows, x.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dcols, x.size() * sizeof(floatX)));
    // slots: amax plain, amax rotated, the other operand's amax; alphas at 16-byte stride
    const float other = 3.25f;
    std::vector<uint32_t> slots = {0u, 0u, fbits(other)};
    uint32_t* damax = to_device(slots);
    float* dalpha = to_device(std::vector<float>(8, 0.0f));
    nvfp4_amax(dx, rows, cols, damax, damax + 1, rht, signs, 0);
    Nvfp4Direction rd, cd;
    rd.out = drows; rd.amax = damax; rd.stochastic = stochastic; rd.seed = seed_rows;
    rd.alpha = dalpha; rd.other_amax = damax + 2;
    cd.out = dcols; cd.amax = damax + 1; cd.rht = rht; cd.stochastic = stochastic; cd.seed = seed_cols;
    cd.alpha = dalpha + 4; cd.other_amax = damax + 2;
    // first the values alone (the training steps' launch: nvfp4_block16_values), then with the native
    // operands of both directions too, x (K = cols) and x^T (K = rows) (the code path)
    nvfp4_quantize(dx, rows, cols, rd, cd, fos, signs, 0);
    const std::vector<floatX> vrows = to_host(drows, x.size()), vcols = to_host(dcols, x.size());
    cudaCheck(cudaMemset(drows, 0xFF, x.size() * sizeof(floatX)));
    cudaCheck(cudaMemset(dcols, 0xFF, x.size() * sizeof(floatX)));
    NativeBuffers nrows(rows, cols), ncols(cols, rows);
    rd.codes = nrows.codes; rd.scales = nrows.scales;
    cd.codes = ncols.codes; cd.scales = ncols.scales;
    nvfp4_quantize(dx, rows, cols, rd, cd, fos, signs, 0);
    const std::vector<uint32_t> amax = to_host(damax, 3);
    const std::vector<float> alpha = to_host(dalpha, 8);
    const std::vector<floatX> grows = to_host(drows, x.size()), gcols = to_host(dcols, x.size());

    Nvfp4Config cfg;
    cfg.layout = Nvfp4Layout::Rows1x16;
    cfg.rounding = stochastic ? Rounding::Stochastic : Rounding::NearestEven;
    cfg.four_over_six = fos;
    cfg.sr_seed = seed_rows;
    const Nvfp4Matrix qr = llmc::nvfp4_quantize_matrix(x.data(), rows, cols, cfg);
    std::vector<float> xt = transpose(x, rows, cols);
    if (rht) llmc::nvfp4_rht_rows(xt.data(), cols, rows, signs);
    cfg.sr_seed = seed_cols;
    const Nvfp4Matrix qc = llmc::nvfp4_quantize_matrix(xt.data(), cols, rows, cfg);
    const float g_other = llmc::nvfp4_global_scale(other);
    const char* kinds[4] = {"normal", "outliers", "e2m1 grid/ties/zeros/equal", "tiny"};
    const std::string what = strfmt("%dx%d %s rht=%d sr=%d 4/6=%d", rows, cols, kinds[kind], rht, stochastic, fos);
    float a0, a1;
    memcpy(&a0, &amax[0], 4);
    memcpy(&a1, &amax[1], 4);
    check(fbits(a0) == fbits(qr.amax) && fbits(a1) == fbits(qc.amax), "amax %s: plain %g rotated %g (reference %g, %g)",
          what.c_str(), a0, a1, qr.amax, qc.amax);
    const size_t bad_vrows = mismatches(vrows, qr, false, rows, cols);
    check(bad_vrows == 0, "1x16 row blocks %s, values alone: %zu of %zu values differ from the CPU reference", what.c_str(),
          bad_vrows, x.size());
    const size_t bad_vcols = mismatches(vcols, qc, true, rows, cols);
    check(bad_vcols == 0, "16x1 column blocks %s, values alone: %zu of %zu values differ from the CPU reference", what.c_str(),
          bad_vcols, x.size());
    const size_t bad_rows = mismatches(grows, qr, false, rows, cols);
    check(bad_rows == 0, "1x16 row blocks %s, with the native operands: %zu of %zu values differ from the CPU reference",
          what.c_str(), bad_rows, x.size());
    const size_t bad_cols = mismatches(gcols, qc, true, rows, cols);
    check(bad_cols == 0, "16x1 column blocks %s, with the native operands: %zu of %zu values differ from the CPU reference",
          what.c_str(), bad_cols, x.size());
    check(fbits(alpha[0]) == fbits(llmc::rn_mul(qr.global, g_other)) && fbits(alpha[4]) == fbits(llmc::rn_mul(qc.global, g_other)),
          "alphas %s: %g, %g = g * g_other", what.c_str(), alpha[0], alpha[4]);
    const size_t bad_nr = nrows.mismatches(llmc::nvfp4_native_operand(qr, false));
    const size_t bad_nc = ncols.mismatches(llmc::nvfp4_native_operand(qc, false));
    check(bad_nr == 0 && bad_nc == 0, "native FP4 operands %s: x %zu, x^T %zu bytes (codes and tiled scales) differ from "
          "the CPU reference", what.c_str(), bad_nr, bad_nc);
    cudaFree(dx); cudaFree(drows); cudaFree(dcols); cudaFree(damax); cudaFree(dalpha);
}

// 2. Weight tiles.
static void test_weights(int rows, int cols, int kind, bool fos) {
    const std::vector<float> x = make_input(rows, cols, kind, 99 + kind);
    std::vector<floatX> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = f2bf(x[i]);
    floatX* dw = to_device(xb);
    floatX* dq;
    cudaCheck(cudaMalloc(&dq, x.size() * sizeof(floatX)));
    uint32_t* damax = to_device(std::vector<uint32_t>(1, 0u));
    double* dstats = to_device(std::vector<double>(NVFP4_STATS, 0.0));
    NativeBuffers nw(rows, cols), nwt(cols, rows);
    Nvfp4WeightNative native;
    native.codes = nw.codes; native.scales = nw.scales; native.codes_t = nwt.codes; native.scales_t = nwt.scales;
    nvfp4_quantize_weight(dw, rows, cols, dq, damax, fos, dstats, 0, native);
    const std::vector<floatX> got = to_host(dq, x.size());
    const std::vector<double> stats = to_host(dstats, NVFP4_STATS);
    Nvfp4Config cfg;
    cfg.layout = Nvfp4Layout::Tiles16x16;
    cfg.four_over_six = fos;
    const Nvfp4Matrix q = llmc::nvfp4_quantize_matrix(x.data(), rows, cols, cfg);
    const size_t bad = mismatches(got, q, false, rows, cols);
    check(bad == 0, "16x16 weight tiles %dx%d kind %d 4/6=%d: %zu of %zu values differ from the CPU reference", rows, cols,
          kind, fos, bad, x.size());
    const size_t bad_w = nw.mismatches(llmc::nvfp4_native_operand(q, false));
    const size_t bad_wt = nwt.mismatches(llmc::nvfp4_native_operand(q, true));
    check(bad_w == 0 && bad_wt == 0, "native FP4 weight operands %dx%d kind %d 4/6=%d: W %zu, W^T %zu bytes differ from the "
          "CPU reference", rows, cols, kind, fos, bad_w, bad_wt);
    // telemetry: the relative error of the dequantized weights
    double e2 = 0, x2 = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const double d = (double)q.value(r, c) - x[(size_t)r * cols + c];
            e2 += d * d;
            x2 += (double)x[(size_t)r * cols + c] * x[(size_t)r * cols + c];
        }
    const double want = std::sqrt(e2 / x2), have = std::sqrt(stats[0] / stats[1]);
    check(std::fabs(have - want) <= 1e-3 * want && stats[2] == (double)x.size(),
          "weight telemetry %dx%d: relative error %.5f (reference %.5f), %g values", rows, cols, have, want, stats[2]);
    cudaFree(dw); cudaFree(dq); cudaFree(damax); cudaFree(dstats);
}

// 3. Stochastic rounding is unbiased: 4096 identical rows of 64 values, rows direction, each row's
// elements drawn independently; the mean of the dequantized values must equal x within 5 sigma.
static void test_sr_unbiased() {
    const int rows = 4096, cols = 64;
    std::mt19937_64 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> row(cols);
    for (int c = 0; c < cols; c++) row[c] = bf2f(f2bf(nd(rng)));
    std::vector<floatX> xb((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) xb[(size_t)r * cols + c] = f2bf(row[c]);
    floatX* dx = to_device(xb);
    floatX* dq;
    cudaCheck(cudaMalloc(&dq, xb.size() * sizeof(floatX)));
    uint32_t* damax = to_device(std::vector<uint32_t>(2, 0u));
    nvfp4_amax(dx, rows, cols, damax, damax + 1, false, 0, 0);
    Nvfp4Direction rd;
    rd.out = dq; rd.amax = damax; rd.stochastic = true; rd.seed = 2024;
    nvfp4_quantize(dx, rows, cols, rd, Nvfp4Direction(), false, 0, 0);
    const std::vector<floatX> q = to_host(dq, xb.size());
    float amax;
    const std::vector<uint32_t> a = to_host(damax, 1);
    memcpy(&amax, &a[0], 4);
    const float g = llmc::nvfp4_global_scale(amax);
    // the block scales (deterministic: round to nearest even of block amax / 6 / g)
    Nvfp4Config cfg;
    const Nvfp4Matrix ref = llmc::nvfp4_quantize_matrix(row.data(), 1, cols, cfg);
    double worst = 0.0;
    int saturated = 0;
    for (int c = 0; c < cols; c++) {
        double sum = 0, sum2 = 0;
        for (int r = 0; r < rows; r++) {
            const double v = (double)bf2f(q[(size_t)r * cols + c]) * g;
            sum += v;
            sum2 += v * v;
        }
        const double mean = sum / rows, var = std::max(0.0, sum2 / rows - mean * mean);
        // an element whose |x / (s g)| exceeds 6 (the scale's E4M3 rounding went down) saturates
        // at 6 s g: no rounding happens there, so it is compared with that value exactly
        const double d = (double)llmc::ue4m3_decode(ref.scale_of(0, c)) * g;
        if (std::fabs(row[c]) / d >= 6.0) {
            saturated++;
            worst = std::max(worst, std::fabs(std::fabs(mean) - 6.0 * d) > 1e-9 * d ? 1e9 : 0.0);
            continue;
        }
        worst = std::max(worst, var > 0 ? std::fabs(mean - row[c]) / std::sqrt(var / rows)
                                         : (std::fabs(mean - row[c]) > 1e-6 * std::fabs(row[c]) ? 1e9 : 0.0));
    }
    check(worst < 5.0, "stochastic rounding is unbiased: largest |mean - x| = %.2f sigma over %d columns (%d saturated)",
          worst, cols, saturated);
    cudaFree(dx); cudaFree(dq); cudaFree(damax);
}

// relative L2 distance
static double rel_l2(const std::vector<double>& a, const std::vector<double>& ref) {
    double e = 0, n = 0;
    for (size_t i = 0; i < a.size(); i++) { e += (a[i] - ref[i]) * (a[i] - ref[i]); n += ref[i] * ref[i]; }
    return std::sqrt(e / std::max(n, 1e-300));
}

static double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// 4. The emulated GEMMs of one linear (N x C input, OC x C weight) against float64.
static void test_gemms(int N, int C, int OC) {
    const std::vector<float> x = make_input(N, C, 0, 11), w = make_input(OC, C, 0, 12), dy = make_input(N, OC, 1, 13);
    std::vector<float> bias(OC);
    for (int o = 0; o < OC; o++) bias[o] = bf2f(f2bf(0.1f * (o % 7) - 0.3f));
    auto bf = [](const std::vector<float>& v) { std::vector<floatX> b(v.size()); for (size_t i = 0; i < v.size(); i++) b[i] = f2bf(v[i]); return b; };
    floatX *dx = to_device(bf(x)), *dw = to_device(bf(w)), *ddy = to_device(bf(dy)), *dbias = to_device(bf(bias));
    floatX *xq, *wq, *dyq, *dyqw, *xqw, *out, *pre, *dinp;
    for (floatX** p : {&xq, &xqw, &out, &pre}) cudaCheck(cudaMalloc(p, (size_t)N * std::max(C, OC) * sizeof(floatX)));
    for (floatX** p : {&dyq, &dyqw, &dinp}) cudaCheck(cudaMalloc(p, (size_t)N * std::max(C, OC) * sizeof(floatX)));
    cudaCheck(cudaMalloc(&wq, (size_t)OC * C * sizeof(floatX)));
    // amax slots: w, x, x rotated, dy, dy rotated; alphas: forward, dgrad, wgrad
    uint32_t* amax = to_device(std::vector<uint32_t>(8, 0u));
    float* alpha = to_device(std::vector<float>(12, 0.0f));
    const uint16_t signs = llmc::nvfp4_rht_signs(3);
    nvfp4_quantize_weight(dw, OC, C, wq, amax + 0, true, nullptr, 0);
    nvfp4_amax(dx, N, C, amax + 1, amax + 2, true, signs, 0);
    Nvfp4Direction xr;
    xr.out = xq; xr.amax = amax + 1; xr.alpha = alpha; xr.other_amax = amax + 0;
    nvfp4_quantize(dx, N, C, xr, Nvfp4Direction(), true, signs, 0);
    nvfp4_amax(ddy, N, OC, amax + 3, amax + 4, true, signs, 0);
    Nvfp4Direction dr, dc, xc;
    dr.out = dyq; dr.amax = amax + 3; dr.stochastic = true; dr.seed = 1; dr.alpha = alpha + 4; dr.other_amax = amax + 0;
    dc.out = dyqw; dc.amax = amax + 4; dc.rht = true; dc.stochastic = true; dc.seed = 2; dc.alpha = alpha + 8; dc.other_amax = amax + 2;
    nvfp4_quantize(ddy, N, OC, dr, dc, true, signs, 0);
    xc.out = xqw; xc.amax = amax + 2; xc.rht = true;
    nvfp4_quantize(dx, N, C, Nvfp4Direction(), xc, true, signs, 0);
    // the GEMMs as the recipe runs them
    matmul_alpha_on_device(out, wq, xq, dbias, OC, N, C, true, false, alpha, false, false, 0);
    std::vector<double> y_gpu(N * (size_t)OC), gl_gpu(N * (size_t)OC), pre_gpu(N * (size_t)OC);
    { auto h = to_host(out, (size_t)N * OC); for (size_t i = 0; i < h.size(); i++) y_gpu[i] = bf2f(h[i]); }
    matmul_alpha_on_device(out, wq, xq, dbias, OC, N, C, true, false, alpha, false, false, 0, EPI_GELU_BIAS, pre);
    { auto h = to_host(out, (size_t)N * OC), p = to_host(pre, (size_t)N * OC);
      for (size_t i = 0; i < h.size(); i++) { gl_gpu[i] = bf2f(h[i]); pre_gpu[i] = bf2f(p[i]); } }
    matmul_alpha_on_device(dinp, wq, dyq, nullptr, C, N, OC, false, false, alpha + 4, false, false, 0);
    std::vector<double> dx_gpu(N * (size_t)C);
    { auto h = to_host(dinp, (size_t)N * C); for (size_t i = 0; i < h.size(); i++) dx_gpu[i] = bf2f(h[i]); }
    std::vector<float> dw0((size_t)OC * C);
    for (size_t i = 0; i < dw0.size(); i++) dw0[i] = 0.01f * (float)(i % 13);
    float* ddw = to_device(dw0);
    matmul_alpha_on_device(ddw, xqw, dyqw, nullptr, C, OC, N, false, true, alpha + 8, true, true, 0);
    const std::vector<float> dw_gpu_f = to_host(ddw, dw0.size());

    // float64 references from the GPU's own quantized operands (dequantized with the alphas)
    auto host = [](const floatX* d, size_t n) { auto h = to_host(d, n); std::vector<double> v(n); for (size_t i = 0; i < n; i++) v[i] = bf2f(h[i]); return v; };
    const std::vector<double> hx = host(xq, (size_t)N * C), hw = host(wq, (size_t)OC * C), hdy = host(dyq, (size_t)N * OC);
    const std::vector<double> hdyw = host(dyqw, (size_t)N * OC), hxw = host(xqw, (size_t)N * C);
    const std::vector<float> al = to_host(alpha, 12);
    std::vector<double> y_ref((size_t)N * OC), gl_ref((size_t)N * OC), dx_ref((size_t)N * C), dw_ref((size_t)OC * C);
    std::vector<double> y_true((size_t)N * OC), dw_true((size_t)OC * C), dw_plain((size_t)OC * C);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0, t = 0;
            for (int c = 0; c < C; c++) {
                s += hx[(size_t)n * C + c] * hw[(size_t)o * C + c];
                t += (double)x[(size_t)n * C + c] * w[(size_t)o * C + c];
            }
            y_ref[(size_t)n * OC + o] = s * al[0] + bias[o];
            gl_ref[(size_t)n * OC + o] = gelu_tanh(s * al[0] + bias[o]);
            y_true[(size_t)n * OC + o] = t + bias[o];
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += hdy[(size_t)n * OC + o] * hw[(size_t)o * C + c];
            dx_ref[(size_t)n * C + c] = s * al[4];
        }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double s = 0, t = 0;
            for (int n = 0; n < N; n++) {
                s += hdyw[(size_t)n * OC + o] * hxw[(size_t)n * C + c];
                t += (double)dy[(size_t)n * OC + o] * x[(size_t)n * C + c];
            }
            dw_ref[(size_t)o * C + c] = dw0[(size_t)o * C + c] + s * al[8];
            dw_true[(size_t)o * C + c] = dw0[(size_t)o * C + c] + t;
        }
    std::vector<double> dw_gpu(dw_gpu_f.begin(), dw_gpu_f.end());
    const std::string shape = strfmt("N=%d C=%d OC=%d", N, C, OC);
    double e = rel_l2(y_gpu, y_ref);
    check(e < 4e-3, "emulated forward GEMM (+bias, alpha on device) %s: rel L2 %.2e against float64 of the dequantized operands", shape.c_str(), e);
    e = rel_l2(gl_gpu, gl_ref);
    check(e < 4e-3, "emulated forward GEMM + GELU epilogue %s: rel L2 %.2e", shape.c_str(), e);
    e = rel_l2(pre_gpu, y_ref);
    check(e < 4e-3, "emulated forward GEMM: the GELU epilogue's pre-activation %s: rel L2 %.2e", shape.c_str(), e);
    e = rel_l2(dx_gpu, dx_ref);
    check(e < 4e-3, "emulated dgrad GEMM %s: rel L2 %.2e", shape.c_str(), e);
    e = rel_l2(dw_gpu, dw_ref);
    check(e < 1e-5, "emulated wgrad GEMM (FP32 +=, rotated operands) %s: rel L2 %.2e", shape.c_str(), e);
    // against the unquantized products: the NVFP4 error, bounded (and the rotation cancels in dW)
    const double ey = rel_l2(y_gpu, y_true), ew = rel_l2(dw_gpu, dw_true);
    check(ey < 0.2 && ew < 0.3, "NVFP4 against the unquantized products %s: forward %.3f, rotated wgrad %.3f", shape.c_str(), ey, ew);
    cudaFree(dx); cudaFree(dw); cudaFree(ddy); cudaFree(dbias); cudaFree(xq); cudaFree(xqw); cudaFree(out); cudaFree(pre);
    cudaFree(dyq); cudaFree(dyqw); cudaFree(dinp); cudaFree(wq); cudaFree(amax); cudaFree(alpha); cudaFree(ddw);
}

// The rotated wgrad against the unrotated one: both approximate dy^T x with similar error on
// normal data; the rotation must not add error of its own (a wrong sign or a missing inverse would).
static void test_rht_wgrad(int N, int C, int OC) {
    const std::vector<float> x = make_input(N, C, 1, 21), dy = make_input(N, OC, 1, 22);
    auto bf = [](const std::vector<float>& v) { std::vector<floatX> b(v.size()); for (size_t i = 0; i < v.size(); i++) b[i] = f2bf(v[i]); return b; };
    floatX *dx = to_device(bf(x)), *ddy = to_device(bf(dy)), *xq, *dyq;
    cudaCheck(cudaMalloc(&xq, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dyq, (size_t)N * OC * sizeof(floatX)));
    uint32_t* amax = to_device(std::vector<uint32_t>(4, 0u));
    float* alpha = to_device(std::vector<float>(4, 0.0f));
    float* ddw;
    cudaCheck(cudaMalloc(&ddw, (size_t)OC * C * sizeof(float)));
    std::vector<double> truth((size_t)OC * C, 0.0);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            for (int c = 0; c < C; c++) truth[(size_t)o * C + c] += (double)dy[(size_t)n * OC + o] * x[(size_t)n * C + c];
    double err[2];
    for (int rht = 0; rht < 2; rht++) {
        const uint16_t signs = llmc::nvfp4_rht_signs(9);
        nvfp4_amax(dx, N, C, amax + 0, amax + 1, rht, signs, 0);
        nvfp4_amax(ddy, N, OC, amax + 2, amax + 3, rht, signs, 0);
        Nvfp4Direction xc, dc;
        xc.out = xq; xc.amax = amax + 1; xc.rht = rht;
        dc.out = dyq; dc.amax = amax + 3; dc.rht = rht; dc.alpha = alpha; dc.other_amax = amax + 1;
        nvfp4_quantize(dx, N, C, Nvfp4Direction(), xc, false, signs, 0);
        nvfp4_quantize(ddy, N, OC, Nvfp4Direction(), dc, false, signs, 0);
        cudaCheck(cudaMemset(ddw, 0, (size_t)OC * C * sizeof(float)));
        matmul_alpha_on_device(ddw, xq, dyq, nullptr, C, OC, N, false, true, alpha, true, true, 0);
        const std::vector<float> h = to_host(ddw, (size_t)OC * C);
        err[rht] = rel_l2(std::vector<double>(h.begin(), h.end()), truth);
    }
    check(err[1] < 0.3 && err[1] < 1.5 * err[0], "wgrad with RHT: rel L2 %.3f against dy^T x (without RHT %.3f), N=%d", err[1],
          err[0], N);
    cudaFree(dx); cudaFree(ddy); cudaFree(xq); cudaFree(dyq); cudaFree(amax); cudaFree(alpha); cudaFree(ddw);
}

// 5. The native FP4 GEMMs of one linear against float64 of the dequantized operands (as the recipe
// runs them: TN, alpha on the device; forward with bias, dgrad, wgrad accumulating into FP32). On a GPU
// without FP4 tensor cores: cuBLASLt must offer no algorithm, which is what sends the recipe to the
// emulation.
static void test_native_gemms(int N, int C, int OC) {
    int device = 0, major = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const bool fwd = matmul_fp4_available(OC, N, C, true, false, EPI_NONE);
    if (major < 10) {
        check(!fwd, "compute capability %d.x: cuBLASLt offers no native FP4 GEMM, so the recipe emulates (the native "
              "GEMMs themselves need 10.0 or newer and are not run here)", major);
        return;
    }
    check(fwd, "compute capability %d.x: cuBLASLt offers the native FP4 forward GEMM (N=%d C=%d OC=%d)", major, N, C, OC);
    if (!fwd) return;
    const std::vector<float> x = make_input(N, C, 0, 31), w = make_input(OC, C, 0, 32), dy = make_input(N, OC, 1, 33);
    std::vector<float> bias(OC);
    for (int o = 0; o < OC; o++) bias[o] = bf2f(f2bf(0.05f * (o % 5) - 0.1f));
    auto bf = [](const std::vector<float>& v) { std::vector<floatX> b(v.size()); for (size_t i = 0; i < v.size(); i++) b[i] = f2bf(v[i]); return b; };
    floatX *dx = to_device(bf(x)), *dw = to_device(bf(w)), *ddy = to_device(bf(dy)), *dbias = to_device(bf(bias)), *out, *dinp;
    cudaCheck(cudaMalloc(&out, (size_t)N * OC * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dinp, (size_t)N * C * sizeof(floatX)));
    uint32_t* amax = to_device(std::vector<uint32_t>(8, 0u));
    float* alpha = to_device(std::vector<float>(12, 0.0f));
    const uint16_t signs = llmc::nvfp4_rht_signs(5);
    NativeBuffers nw(OC, C), nwt(C, OC), nx(N, C), nxt(C, N), ndy(N, OC), ndyt(OC, N);
    Nvfp4WeightNative wn;
    wn.codes = nw.codes; wn.scales = nw.scales; wn.codes_t = nwt.codes; wn.scales_t = nwt.scales;
    nvfp4_quantize_weight(dw, OC, C, nullptr, amax + 0, true, nullptr, 0, wn);
    nvfp4_amax(dx, N, C, amax + 1, amax + 2, true, signs, 0);
    nvfp4_amax(ddy, N, OC, amax + 3, amax + 4, true, signs, 0);
    Nvfp4Direction xr, xc, dr, dc;
    xr.codes = nx.codes; xr.scales = nx.scales; xr.amax = amax + 1; xr.alpha = alpha; xr.other_amax = amax + 0;
    xc.codes = nxt.codes; xc.scales = nxt.scales; xc.amax = amax + 2; xc.rht = true;
    dr.codes = ndy.codes; dr.scales = ndy.scales; dr.amax = amax + 3; dr.stochastic = true; dr.seed = 3;
    dr.alpha = alpha + 4; dr.other_amax = amax + 0;
    dc.codes = ndyt.codes; dc.scales = ndyt.scales; dc.amax = amax + 4; dc.rht = true; dc.stochastic = true; dc.seed = 4;
    dc.alpha = alpha + 8; dc.other_amax = amax + 2;
    nvfp4_quantize(dx, N, C, xr, xc, true, signs, 0);
    nvfp4_quantize(ddy, N, OC, dr, dc, true, signs, 0);
    std::vector<float> dw0((size_t)OC * C);
    for (size_t i = 0; i < dw0.size(); i++) dw0[i] = 0.01f * (float)(i % 11);
    float* ddw = to_device(dw0);
    const bool ok_f = matmul_fp4(out, false, {nw.codes, nw.scales}, {nx.codes, nx.scales}, dbias, OC, N, C, alpha, false, 0);
    const bool ok_d = matmul_fp4(dinp, false, {nwt.codes, nwt.scales}, {ndy.codes, ndy.scales}, nullptr, C, N, OC, alpha + 4, false, 0);
    const bool ok_w = matmul_fp4(ddw, true, {nxt.codes, nxt.scales}, {ndyt.codes, ndyt.scales}, nullptr, C, OC, N, alpha + 8, true, 0);
    check(ok_f && ok_d && ok_w, "native FP4 GEMMs launched: forward %d, dgrad %d, wgrad %d", ok_f, ok_d, ok_w);
    // float64 references from the operands as the CPU decodes them (codes and tiled scales from the GPU)
    auto decode = [](const NativeBuffers& b, int rows, int k) {
        llmc::Nvfp4NativeOperand op;
        op.rows = rows; op.k = k; op.codes = to_host(b.codes, b.code_bytes); op.scales = to_host(b.scales, b.scale_bytes);
        std::vector<double> v((size_t)rows * k);
        for (int r = 0; r < rows; r++)
            for (int kk = 0; kk < k; kk++)
                v[(size_t)r * k + kk] = (double)llmc::fp4e2m1_decode(op.code(r, kk)) * llmc::ue4m3_decode(op.scale(r, kk));
        return v;
    };
    const std::vector<double> hw = decode(nw, OC, C), hwt = decode(nwt, C, OC), hx = decode(nx, N, C), hxt = decode(nxt, C, N);
    const std::vector<double> hdy = decode(ndy, N, OC), hdyt = decode(ndyt, OC, N);
    const std::vector<float> al = to_host(alpha, 12);
    std::vector<double> y_ref((size_t)N * OC), dx_ref((size_t)N * C), dw_ref((size_t)OC * C);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += hx[(size_t)n * C + c] * hw[(size_t)o * C + c];
            y_ref[(size_t)n * OC + o] = s * al[0] + bias[o];
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += hdy[(size_t)n * OC + o] * hwt[(size_t)c * OC + o];
            dx_ref[(size_t)n * C + c] = s * al[4];
        }
    for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += hdyt[(size_t)o * N + n] * hxt[(size_t)c * N + n];
            dw_ref[(size_t)o * C + c] = dw0[(size_t)o * C + c] + s * al[8];
        }
    auto as_double = [](const std::vector<floatX>& h) { std::vector<double> v(h.size()); for (size_t i = 0; i < h.size(); i++) v[i] = bf2f(h[i]); return v; };
    const std::vector<float> dw_gpu = to_host(ddw, dw0.size());
    const std::string shape = strfmt("N=%d C=%d OC=%d", N, C, OC);
    double e = rel_l2(as_double(to_host(out, (size_t)N * OC)), y_ref);
    check(e < 4e-3, "native FP4 forward GEMM (+bias) %s: rel L2 %.2e against float64 of the dequantized operands", shape.c_str(), e);
    e = rel_l2(as_double(to_host(dinp, (size_t)N * C)), dx_ref);
    check(e < 4e-3, "native FP4 dgrad GEMM (W^T operand) %s: rel L2 %.2e", shape.c_str(), e);
    e = rel_l2(std::vector<double>(dw_gpu.begin(), dw_gpu.end()), dw_ref);
    check(e < 1e-5, "native FP4 wgrad GEMM (FP32 +=, x^T and dy^T operands) %s: rel L2 %.2e", shape.c_str(), e);
    cudaFree(dx); cudaFree(dw); cudaFree(ddy); cudaFree(dbias); cudaFree(out); cudaFree(dinp); cudaFree(amax);
    cudaFree(alpha); cudaFree(ddw);
}

int main() {
    if (!gpu_present()) return 77;
    matmul_init();
    for (int kind = 0; kind < 4; kind++)
        for (int variant = 0; variant < 8; variant++)
            test_quantize(kind == 2 ? 208 : 128, kind == 1 ? 320 : 192, kind, variant & 1, (variant >> 1) & 1, (variant >> 2) & 1);
    for (int kind = 0; kind < 4; kind++)
        for (int fos = 0; fos < 2; fos++) test_weights(kind == 1 ? 96 : 64, kind == 0 ? 784 : 1040, kind, fos);
    test_sr_unbiased();
    test_gemms(256, 192, 320);
    test_rht_wgrad(1024, 64, 128);
    test_native_gemms(256, 256, 384);
    matmul_free();
    printf("nvfp4 tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
