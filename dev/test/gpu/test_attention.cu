// test_attention.cu: the fused flash attention (llmc/flash_attention.cuh) against a float64 CPU
// reference, plus its determinism, the qkv bias gradient's partial sums (HS = 64 wgmma kernels: their
// sum against dqkv's column sums, every partial written), and timings next to the materialized path
// (llmc/attention.cuh).
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. dev/test/gpu/test_attention.cu
//        -lcublasLt -lcublas -o build/test_attention && ./build/test_attention
//
// Prints [PASS]/[FAIL] lines and "attention tests: N passed, N failed"; exit 0 iff all pass.
// Without a CUDA device: "skipped: no CUDA device", exit 77. --timing-only skips the accuracy cases;
// --small runs only the short accuracy cases (for compute-sanitizer).
// Built with make USE_CUDNN=1, it checks cuDNN's attention (llmc/cudnn_attention.cpp) the same way
// (accuracy against float64, bit-identical reruns, agreement with our kernels) and times it beside ours.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include "dev/test/gpu/gpu_check.h"
#include "llmc/cuda_common.h"
#include "llmc/matmul.cuh"
#include "llmc/attention.cuh"
#include "llmc/flash_attention.cuh"
#include "llmc/formats/fp8_quantize.cuh"
#if defined(ENABLE_CUDNN)
#include "llmc/cudnn_attention.h"
#endif

#if defined(ENABLE_FP32)
#error "test_attention.cu tests the BF16 build"
#endif


// ---- host bf16 ----------------------------------------------------------------------------------
static uint16_t bf16_bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0x7F800000u) return (uint16_t)((u >> 16) | ((u & 0xFFFF) ? 0x40 : 0));
    u += 0x7FFFu + ((u >> 16) & 1u);   // round to nearest even
    return (uint16_t)(u >> 16);
}
static float float_of_bf16_bits(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---- float64 reference ---------------------------------------------------------------------------
struct Ref {
    std::vector<double> out, lse, dq, dk, dv;   // out, dq, dk, dv: (B,T,C); lse: (B,NH,T)
};

static Ref reference(const std::vector<uint16_t>& qkv, const std::vector<uint16_t>& dout, int B, int T, int NH, int HS) {
    const int C = NH * HS;
    Ref r;
    r.out.assign((size_t)B * T * C, 0.0);
    r.lse.assign((size_t)B * NH * T, 0.0);
    r.dq.assign((size_t)B * T * C, 0.0);
    r.dk.assign((size_t)B * T * C, 0.0);
    r.dv.assign((size_t)B * T * C, 0.0);
    const double scale = 1.0 / std::sqrt((double)HS);
    std::atomic<int> next(0);
    auto worker = [&]() {
        std::vector<double> q((size_t)T * HS), k((size_t)T * HS), v((size_t)T * HS), dO((size_t)T * HS);
        std::vector<double> dk((size_t)T * HS), dv((size_t)T * HS), p(T), dp(T), acc(HS);
        for (int bh; (bh = next.fetch_add(1)) < B * NH;) {
            const int b = bh / NH, h = bh % NH;
            for (int t = 0; t < T; t++) {
                for (int d = 0; d < HS; d++) {
                    size_t base = ((size_t)b * T + t) * 3 * C + (size_t)h * HS + d;
                    q[(size_t)t * HS + d] = float_of_bf16_bits(qkv[base]);
                    k[(size_t)t * HS + d] = float_of_bf16_bits(qkv[base + C]);
                    v[(size_t)t * HS + d] = float_of_bf16_bits(qkv[base + 2 * C]);
                    dO[(size_t)t * HS + d] = float_of_bf16_bits(dout[((size_t)b * T + t) * C + (size_t)h * HS + d]);
                }
            }
            std::fill(dk.begin(), dk.end(), 0.0);
            std::fill(dv.begin(), dv.end(), 0.0);
            for (int t1 = 0; t1 < T; t1++) {
                const double* qr = &q[(size_t)t1 * HS];
                const double* dor = &dO[(size_t)t1 * HS];
                double m = -INFINITY;
                for (int t2 = 0; t2 <= t1; t2++) {
                    const double* kr = &k[(size_t)t2 * HS];
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) s += qr[d] * kr[d];
                    p[t2] = s * scale;
                    m = std::max(m, p[t2]);
                }
                double l = 0.0;
                for (int t2 = 0; t2 <= t1; t2++) { p[t2] = std::exp(p[t2] - m); l += p[t2]; }
                r.lse[(size_t)bh * T + t1] = m + std::log(l);
                for (int t2 = 0; t2 <= t1; t2++) p[t2] /= l;
                std::fill(acc.begin(), acc.end(), 0.0);
                double Dsum = 0.0;
                for (int t2 = 0; t2 <= t1; t2++) {
                    const double* vr = &v[(size_t)t2 * HS];
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) { acc[d] += p[t2] * vr[d]; s += dor[d] * vr[d]; }
                    dp[t2] = s;
                    Dsum += p[t2] * s;
                }
                double* outr = &r.out[((size_t)b * T + t1) * C + (size_t)h * HS];
                for (int d = 0; d < HS; d++) outr[d] = acc[d];
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int t2 = 0; t2 <= t1; t2++) {
                    const double ds = p[t2] * (dp[t2] - Dsum) * scale;
                    const double* kr = &k[(size_t)t2 * HS];
                    double* dkr = &dk[(size_t)t2 * HS];
                    double* dvr = &dv[(size_t)t2 * HS];
                    for (int d = 0; d < HS; d++) {
                        acc[d] += ds * kr[d];
                        dkr[d] += ds * qr[d];
                        dvr[d] += p[t2] * dor[d];
                    }
                }
                double* dqr = &r.dq[((size_t)b * T + t1) * C + (size_t)h * HS];
                for (int d = 0; d < HS; d++) dqr[d] = acc[d];
            }
            for (int t = 0; t < T; t++) {
                for (int d = 0; d < HS; d++) {
                    size_t o = ((size_t)b * T + t) * C + (size_t)h * HS + d;
                    r.dk[o] = dk[(size_t)t * HS + d];
                    r.dv[o] = dv[(size_t)t * HS + d];
                }
            }
        }
    };
    int nthreads = (int)std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
    std::vector<std::thread> pool;
    for (int i = 0; i < nthreads; i++) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
    return r;
}

// ---- comparisons ---------------------------------------------------------------------------------
// relative L2 error of a bf16 GPU tensor against the reference; the strided view picks (B,T,C)
// out of (B,T,3C) with a column offset. nan_count counts non-finite GPU values.
static double rel_l2(const std::vector<uint16_t>& gpu, size_t gpu_row_stride, size_t gpu_col0,
                     const std::vector<double>& ref, size_t rows, size_t cols, size_t* nan_count) {
    double num = 0.0, den = 0.0;
    size_t nans = 0;
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++) {
            double g = float_of_bf16_bits(gpu[r * gpu_row_stride + gpu_col0 + c]);
            double x = ref[r * cols + c];
            if (!std::isfinite(g)) { nans++; continue; }
            num += (g - x) * (g - x);
            den += x * x;
        }
    }
    *nan_count = nans;
    return std::sqrt(num / std::max(den, 1e-300));
}

// ---- device helpers ------------------------------------------------------------------------------
// fill with approximately N(0,1) bf16 (Box-Muller over the stateless hash): the timing inputs
__global__ void fill_normal_kernel(floatX* x, long long n, uint32_t seed) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t a = hash_u32(seed, (uint32_t)(2 * i)), b = hash_u32(seed, (uint32_t)(2 * i + 1));
    float u1 = ((a >> 8) + 1) * (1.0f / 16777217.0f), u2 = (b >> 8) * (1.0f / 16777216.0f);
    x[i] = (floatX)(sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2));
}

template <typename T>
static T* dalloc(size_t n) {
    return static_cast<T*>(cuda_malloc_or_die(n * sizeof(T), "test buffer"));
}

// ---- the FP8 outputs' check (Fp8Target) ----------------------------------------------------------------
// A kernel's FP8 copy of a BF16 output (n_rows x m_cols, `plain` = the BF16 output of the plain run) against
// the recipe's quantize pass over that output: the kernel's codes in both layouts (set to 0xAA first, so that
// a value not written shows), the pass's, the scale (the format's maximum / amax / 2, as the recipe's delayed
// scale with margin 1), two amax slots (kernel, pass) and six telemetry counters (kernel's three, pass's three).
template <Fp8Kind K>
struct Fp8OutputCheck {
    const std::vector<uint16_t>& plain;
    const int n_rows, m_cols;
    const size_t n;
    float plain_amax = 0.0f;
    uint8_t *rows, *cols, *ref_rows, *ref_cols;
    float* scale;
    uint32_t* amax;
    unsigned long long* counts;
    floatX* ref;
    Fp8OutputCheck(const std::vector<uint16_t>& plain_, int n_rows_, int m_cols_)
        : plain(plain_), n_rows(n_rows_), m_cols(m_cols_), n((size_t)n_rows_ * m_cols_) {
        for (size_t i = 0; i < n; i++) plain_amax = std::max(plain_amax, std::fabs(float_of_bf16_bits(plain[i])));
        const float s = (K == Fp8Kind::E4M3 ? llmc::kFP8E4M3Max : llmc::kFP8E5M2Max) / plain_amax / 2.0f;
        rows = dalloc<uint8_t>(n); cols = dalloc<uint8_t>(n); ref_rows = dalloc<uint8_t>(n); ref_cols = dalloc<uint8_t>(n);
        scale = dalloc<float>(1); amax = dalloc<uint32_t>(2); counts = dalloc<unsigned long long>(6); ref = dalloc<floatX>(n);
        cudaCheck(cudaMemcpy(scale, &s, 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(amax, 0, 8));
        cudaCheck(cudaMemset(counts, 0, 48));
        cudaCheck(cudaMemset(rows, 0xAA, n));
        cudaCheck(cudaMemset(cols, 0xAA, n));
    }
    ~Fp8OutputCheck() {
        for (void* p : {(void*)rows, (void*)cols, (void*)ref_rows, (void*)ref_cols, (void*)scale, (void*)amax, (void*)counts, (void*)ref})
            cudaCheck(cudaFree(p));
    }
    // the training form: both layouts, the amax and the counts
    Fp8Target target() const {
        Fp8Target t;
        t.rows = rows; t.cols = cols; t.scale = scale; t.amax = amax; t.stats.counts = counts;
        return t;
    }
    // after the kernel ran with target(): the pass over `plain`, then whether the codes (both layouts), the amax
    // and the counts are the pass's and every value was counted; `got` gets the kernel's counts (values,
    // saturated, flushed) and want_rows the pass's row-major codes
    bool same_as_pass(std::vector<unsigned long long>& got, std::vector<uint8_t>& want_rows) const {
        cudaCheck(cudaMemcpy(ref, plain.data(), n * 2, cudaMemcpyHostToDevice));
        Fp8Stats ref_stats;
        ref_stats.counts = counts + 3;
        fp8_quantize_transpose<K>(ref_rows, ref_cols, ref, n_rows, m_cols, scale, amax + 1, ref_stats, 0);
        cudaCheck(cudaDeviceSynchronize());
        want_rows = to_host(ref_rows, n);
        const std::vector<uint32_t> a = to_host(amax, 2);
        got = to_host(counts, 6);
        return to_host(rows, n) == want_rows && to_host(cols, n) == to_host(ref_cols, n) && a[0] == a[1] &&
               got[0] == got[3] && got[1] == got[4] && got[2] == got[5] && got[0] == n;
    }
};

// ---- one accuracy case ---------------------------------------------------------------------------
static void test_case(int B, int NH, int T, int HS, uint32_t seed, bool compare_old) {
    const int C = NH * HS;
    const size_t n_qkv = (size_t)B * T * 3 * C, n_btc = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    char tag[96];
    snprintf(tag, sizeof(tag), "B=%d NH=%d T=%d HS=%d", B, NH, T, HS);

    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> h_qkv(n_qkv), h_dout(n_btc);
    for (auto& x : h_qkv) x = bf16_bits_of(nd(rng));
    for (auto& x : h_dout) x = bf16_bits_of(nd(rng));
    Ref ref = reference(h_qkv, h_dout, B, T, NH, HS);

    floatX* d_qkv = dalloc<floatX>(n_qkv);
    floatX* d_dout = dalloc<floatX>(n_btc);
    floatX* d_out = dalloc<floatX>(n_btc);
    floatX* d_dqkv = dalloc<floatX>(n_qkv);
    float* d_lse = dalloc<float>(n_lse);
    size_t scratch_bytes = flash_attention_backward_scratch_bytes(B, T, NH, HS);
    void* d_scratch = cuda_malloc_or_die(scratch_bytes, "flash scratch");
    cudaCheck(cudaMemcpy(d_qkv, h_qkv.data(), n_qkv * 2, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_dout, h_dout.data(), n_btc * 2, cudaMemcpyHostToDevice));

    // forward twice on NaN-poisoned outputs (0xFFFF is a bf16 NaN, 0xFFFFFFFF an FP32 NaN)
    std::vector<uint16_t> out1(n_btc), out2(n_btc);
    std::vector<float> lse1(n_lse), lse2(n_lse);
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(d_out, 0xFF, n_btc * 2));
        cudaCheck(cudaMemset(d_lse, 0xFF, n_lse * 4));
        flash_attention_forward(d_out, d_lse, d_qkv, B, T, NH, HS, 0);
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy((rep ? out2 : out1).data(), d_out, n_btc * 2, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy((rep ? lse2 : lse1).data(), d_lse, n_lse * 4, cudaMemcpyDeviceToHost));
    }
    size_t nan_out = 0;
    double e_out = rel_l2(out1, C, 0, ref.out, (size_t)B * T, C, &nan_out);
    double e_lse = 0.0;
    size_t nan_lse = 0;
    for (size_t i = 0; i < n_lse; i++) {
        if (!std::isfinite(lse1[i])) { nan_lse++; continue; }
        e_lse = std::max(e_lse, std::fabs((double)lse1[i] - ref.lse[i]));
    }
    check(nan_out == 0 && nan_lse == 0, "%s forward: every out/lse element written, no NaN (%zu, %zu bad)", tag, nan_out, nan_lse);
    check(e_out < 2e-2, "%s forward: out rel L2 error %.3e (tol 2e-2)", tag, e_out);
    check(e_lse < 1e-3, "%s forward: lse max abs error %.3e (tol 1e-3)", tag, e_lse);
    check(memcmp(out1.data(), out2.data(), n_btc * 2) == 0 && memcmp(lse1.data(), lse2.data(), n_lse * 4) == 0,
          "%s forward: bit-identical run to run", tag);

    if (flash_attention_forward_gives_fp8(HS)) {
        // the FP8 recipe's E4M3 input of the attention projection (Fp8Target): both layouts, the amax and the
        // telemetry counts bit for bit those of fp8_quantize_transpose over the BF16 out of the plain run; out
        // and lse still written, bit for bit the plain run's. Then evaluation's form: the row-major codes alone,
        // nothing recorded, no transposed codes written.
        const Fp8OutputCheck<Fp8Kind::E4M3> f(out1, B * T, C);
        cudaCheck(cudaMemset(d_out, 0xFF, n_btc * 2));
        cudaCheck(cudaMemset(d_lse, 0xFF, n_lse * 4));
        flash_attention_forward(d_out, d_lse, d_qkv, B, T, NH, HS, 0, nullptr, f.target());
        std::vector<uint16_t> out3 = to_host(reinterpret_cast<uint16_t*>(d_out), n_btc);
        std::vector<float> lse3 = to_host(d_lse, n_lse);
        std::vector<unsigned long long> counts;
        std::vector<uint8_t> want_rows;
        // (its own statement: the check's arguments below read counts, and their order of evaluation is unspecified)
        const bool same = f.same_as_pass(counts, want_rows);
        check(same,
              "%s forward with the FP8 input of the attention projection: E4M3 codes (both layouts), amax, counts "
              "(%llu values, %llu saturated, %llu flushed) = the quantize pass over the plain out, bit for bit", tag,
              counts[0], counts[1], counts[2]);
        check(out3 == out1 && memcmp(lse3.data(), lse1.data(), n_lse * 4) == 0,
              "%s forward with the FP8 input: out and lse still written, bit for bit the plain run's", tag);
        // evaluation: rows only, no amax, no counts
        Fp8Target te;
        te.rows = f.rows; te.scale = f.scale;
        cudaCheck(cudaMemset(f.rows, 0xAA, n_btc));
        cudaCheck(cudaMemset(f.cols, 0xAA, n_btc));
        cudaCheck(cudaMemset(f.amax, 0, 8));
        flash_attention_forward(d_out, d_lse, d_qkv, B, T, NH, HS, 0, nullptr, te);
        cudaCheck(cudaDeviceSynchronize());
        size_t cols_written = 0;
        for (uint8_t v : to_host(f.cols, n_btc)) cols_written += v != 0xAA;
        check(to_host(f.rows, n_btc) == want_rows && cols_written == 0 && to_host(f.amax, 1)[0] == 0u,
              "%s forward with the row-major E4M3 codes alone (evaluation): rows = the quantize pass's, no transposed "
              "code written (%zu), no amax recorded", tag, cols_written);
        // the amax alone (Fp8Target::amax_only, the FP8 recipe's current scaling): out and lse written as the plain
        // run wrote them, bit for bit, and max |out| over those stored values recorded; no code written
        Fp8Target ta;
        ta.amax = f.amax;
        cudaCheck(cudaMemset(f.rows, 0xAA, n_btc));
        cudaCheck(cudaMemset(f.amax, 0, 8));
        cudaCheck(cudaMemset(d_out, 0xFF, n_btc * 2));
        cudaCheck(cudaMemset(d_lse, 0xFF, n_lse * 4));
        flash_attention_forward(d_out, d_lse, d_qkv, B, T, NH, HS, 0, nullptr, ta);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<uint16_t> out4 = to_host(reinterpret_cast<uint16_t*>(d_out), n_btc);
        const std::vector<float> lse4 = to_host(d_lse, n_lse);
        size_t rows_written = 0;
        for (uint8_t v : to_host(f.rows, n_btc)) rows_written += v != 0xAA;
        uint32_t plain_amax_bits;
        memcpy(&plain_amax_bits, &f.plain_amax, 4);
        const uint32_t got_amax_bits = to_host(f.amax, 1)[0];
        float got_amax;
        memcpy(&got_amax, &got_amax_bits, 4);
        check(out4 == out1 && memcmp(lse4.data(), lse1.data(), n_lse * 4) == 0 && got_amax_bits == plain_amax_bits &&
                  rows_written == 0,
              "%s forward with the amax alone: out and lse = the plain run's, bit for bit; amax %g = max |out| %g; no "
              "code written (%zu)", tag, (double)got_amax, (double)f.plain_amax, rows_written);
    }

    // backward twice, from the first forward's out/lse (the second forward is bitwise the same)
    std::vector<uint16_t> dqkv1(n_qkv), dqkv2(n_qkv);
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(d_dqkv, 0xFF, n_qkv * 2));
        cudaCheck(cudaMemset(d_scratch, 0xFF, scratch_bytes));
        flash_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_scratch, B, T, NH, HS, 0);
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy((rep ? dqkv2 : dqkv1).data(), d_dqkv, n_qkv * 2, cudaMemcpyDeviceToHost));
    }
    size_t nan_q = 0, nan_k = 0, nan_v = 0;
    double e_dq = rel_l2(dqkv1, 3 * C, 0, ref.dq, (size_t)B * T, C, &nan_q);
    double e_dk = rel_l2(dqkv1, 3 * C, C, ref.dk, (size_t)B * T, C, &nan_k);
    double e_dv = rel_l2(dqkv1, 3 * C, 2 * C, ref.dv, (size_t)B * T, C, &nan_v);
    check(nan_q + nan_k + nan_v == 0, "%s backward: every dqkv element written, no NaN (%zu, %zu, %zu bad)", tag, nan_q, nan_k, nan_v);
    check(e_dq < 2e-2, "%s backward: dq rel L2 error %.3e (tol 2e-2)", tag, e_dq);
    check(e_dk < 2e-2, "%s backward: dk rel L2 error %.3e (tol 2e-2)", tag, e_dk);
    check(e_dv < 2e-2, "%s backward: dv rel L2 error %.3e (tol 2e-2)", tag, e_dv);
    check(memcmp(dqkv1.data(), dqkv2.data(), n_qkv * 2) == 0, "%s backward: dqkv bit-identical run to run", tag);
    {   // the qkv bias gradient's partial sums (NaN-poisoned first): their sum against dqkv's column sums
        const size_t n_part = (size_t)flash_attention_bias_partial_rows(B, T) * 3 * C;
        float* d_part = dalloc<float>(n_part);
        cudaCheck(cudaMemset(d_part, 0xFF, n_part * 4));
        cudaCheck(cudaMemset(d_dqkv, 0xFF, n_qkv * 2));
        const bool wrote = flash_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_scratch, B, T, NH, HS, 0, d_part);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<uint16_t> dqkv3(n_qkv);
        cudaCheck(cudaMemcpy(dqkv3.data(), d_dqkv, n_qkv * 2, cudaMemcpyDeviceToHost));
        check(memcmp(dqkv1.data(), dqkv3.data(), n_qkv * 2) == 0, "%s backward with the bias partial sums: same dqkv", tag);
        if (wrote) {
            std::vector<float> part(n_part);
            cudaCheck(cudaMemcpy(part.data(), d_part, n_part * 4, cudaMemcpyDeviceToHost));
            // error per column relative to the sum of |dqkv| (the sums cancel; FP32 rounding scales with |x|)
            std::vector<double> got(3 * C, 0.0), want(3 * C, 0.0), mag(3 * C, 0.0);
            for (size_t r = 0; r < n_part / (3 * C); r++)
                for (int c = 0; c < 3 * C; c++) got[c] += part[r * 3 * C + c];
            for (size_t r = 0; r < (size_t)B * T; r++)
                for (int c = 0; c < 3 * C; c++) {
                    const double x = float_of_bf16_bits(dqkv1[r * 3 * C + c]);
                    want[c] += x;
                    mag[c] += std::fabs(x);
                }
            double err = 0.0;
            for (int c = 0; c < 3 * C; c++) err = std::max(err, std::fabs(got[c] - want[c]) / std::max(mag[c], 1e-300));
            check(std::isfinite(err) && err < 1e-5, "%s backward: qkv bias gradient from the partial sums against dqkv's "
                  "column sums, max error %.2e of the column's sum of |dqkv| (every partial written)", tag, err);
        } else {
            printf("       (no bias partial sums at HS=%d: the caller sums dqkv)\n", HS);
        }
        cudaCheck(cudaFree(d_part));
    }
    if (flash_attention_backward_gives_fp8(HS)) {
        // the FP8 recipe's E5M2 copy of dqkv (Fp8Target): both layouts, the amax and the telemetry counts bit
        // for bit those of fp8_quantize_transpose over the BF16 dqkv of the plain run; dqkv left unwritten
        const Fp8OutputCheck<Fp8Kind::E5M2> f(dqkv1, B * T, 3 * C);
        const float amax1 = f.plain_amax;
        const size_t n_part = (size_t)flash_attention_bias_partial_rows(B, T) * 3 * C;
        float* d_part = dalloc<float>(n_part);
        cudaCheck(cudaMemset(d_dqkv, 0xFF, n_qkv * 2));
        flash_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_scratch, B, T, NH, HS, 0, d_part, f.target());
        // the reference: the recipe's quantize pass over the plain run's dqkv
        std::vector<unsigned long long> counts;
        std::vector<uint8_t> want_rows;
        const bool same = f.same_as_pass(counts, want_rows);
        std::vector<uint16_t> dqkv4(n_qkv);
        cudaCheck(cudaMemcpy(dqkv4.data(), d_dqkv, n_qkv * 2, cudaMemcpyDeviceToHost));
        size_t written = 0;
        for (uint16_t v : dqkv4) written += v != 0xFFFF;
        check(same && written == 0,
              "%s backward with the FP8 copy: E5M2 codes (both layouts), amax, counts (%llu values, %llu flushed) = the "
              "quantize pass over the plain dqkv, bit for bit; dqkv itself not written (%zu written)", tag, counts[0],
              counts[2], written);
        // the amax alone (Fp8Target::amax_only, TCFP-12's fresh scales): dqkv written as the plain run
        // wrote it, bit for bit, and its amax recorded
        Fp8Target ta;
        ta.amax = f.amax;
        cudaCheck(cudaMemset(f.amax, 0, 8));
        cudaCheck(cudaMemset(d_dqkv, 0xFF, n_qkv * 2));
        flash_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_scratch, B, T, NH, HS, 0, d_part, ta);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<uint16_t> dqkv5(n_qkv);
        cudaCheck(cudaMemcpy(dqkv5.data(), d_dqkv, n_qkv * 2, cudaMemcpyDeviceToHost));
        uint32_t amax1_bits;
        memcpy(&amax1_bits, &amax1, 4);
        const uint32_t got_amax = to_host(f.amax, 1)[0];
        float got_amax_f;
        memcpy(&got_amax_f, &got_amax, 4);
        check(dqkv5 == dqkv1 && got_amax == amax1_bits, "%s backward with the amax alone: dqkv = the plain run's, bit for "
              "bit; amax %g = max |dqkv| %g", tag, (double)got_amax_f, (double)amax1);
        cudaCheck(cudaFree(d_part));
    }

#if defined(ENABLE_CUDNN)
    {   // cuDNN's SDPA on the same inputs: the same tolerances, determinism, and closeness to ours
        std::string why;
        const bool ok = cudnn_attention_prepare(B, T, NH, HS, &why);
        check(ok, "%s cuDNN: graphs built and supported (%s)", tag, ok ? "yes" : why.c_str());
        if (ok) {
            std::vector<uint16_t> c_out(n_btc), c_out2(n_btc), c_dqkv(n_qkv), c_dqkv2(n_qkv);
            std::vector<float> c_lse(n_lse);
            for (int rep = 0; rep < 2; rep++) {
                cudaCheck(cudaMemset(d_out, 0xFF, n_btc * 2));
                cudaCheck(cudaMemset(d_lse, 0xFF, n_lse * 4));
                cudaCheck(cudaMemset(d_dqkv, 0xFF, n_qkv * 2));
                cudnn_attention_forward(d_out, d_lse, d_qkv, B, T, NH, HS, 0);
                cudnn_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, NH, HS, 0);
                cudaCheck(cudaDeviceSynchronize());
                cudaCheck(cudaMemcpy((rep ? c_out2 : c_out).data(), d_out, n_btc * 2, cudaMemcpyDeviceToHost));
                cudaCheck(cudaMemcpy((rep ? c_dqkv2 : c_dqkv).data(), d_dqkv, n_qkv * 2, cudaMemcpyDeviceToHost));
                if (rep == 0) cudaCheck(cudaMemcpy(c_lse.data(), d_lse, n_lse * 4, cudaMemcpyDeviceToHost));
            }
            size_t bad_o = 0, bad_q = 0, bad_k = 0, bad_v = 0, bad_l = 0;
            const double c_eo = rel_l2(c_out, C, 0, ref.out, (size_t)B * T, C, &bad_o);
            const double c_eq = rel_l2(c_dqkv, 3 * C, 0, ref.dq, (size_t)B * T, C, &bad_q);
            const double c_ek = rel_l2(c_dqkv, 3 * C, C, ref.dk, (size_t)B * T, C, &bad_k);
            const double c_ev = rel_l2(c_dqkv, 3 * C, 2 * C, ref.dv, (size_t)B * T, C, &bad_v);
            double c_el = 0.0;
            for (size_t i = 0; i < n_lse; i++) {
                if (!std::isfinite(c_lse[i])) { bad_l++; continue; }
                c_el = std::max(c_el, std::fabs((double)c_lse[i] - ref.lse[i]));
            }
            check(bad_o + bad_q + bad_k + bad_v + bad_l == 0, "%s cuDNN: every out/lse/dqkv element written, no NaN", tag);
            check(c_eo < 2e-2, "%s cuDNN forward: out rel L2 error %.3e (tol 2e-2; ours %.3e)", tag, c_eo, e_out);
            check(c_el < 1e-3, "%s cuDNN forward: its statistics are the natural-log lse, max abs error %.3e (tol 1e-3)", tag, c_el);
            check(c_eq < 2e-2 && c_ek < 2e-2 && c_ev < 2e-2,
                  "%s cuDNN backward: dq / dk / dv rel L2 errors %.3e / %.3e / %.3e (tol 2e-2; ours %.3e / %.3e / %.3e)",
                  tag, c_eq, c_ek, c_ev, e_dq, e_dk, e_dv);
            check(memcmp(c_out.data(), c_out2.data(), n_btc * 2) == 0 && memcmp(c_dqkv.data(), c_dqkv2.data(), n_qkv * 2) == 0,
                  "%s cuDNN: forward and (deterministic) backward bit-identical run to run", tag);
            // our backward from cuDNN's forward (out, lse): the statistics mean the same to both
            cudaCheck(cudaMemset(d_dqkv, 0xFF, n_qkv * 2));
            flash_attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, d_scratch, B, T, NH, HS, 0);
            cudaCheck(cudaDeviceSynchronize());
            cudaCheck(cudaMemcpy(c_dqkv2.data(), d_dqkv, n_qkv * 2, cudaMemcpyDeviceToHost));
            const double x_eq = rel_l2(c_dqkv2, 3 * C, 0, ref.dq, (size_t)B * T, C, &bad_q);
            check(x_eq < 2e-2 && bad_q == 0, "%s our flash backward from cuDNN's out and lse: dq rel L2 error %.3e", tag, x_eq);
        }
    }
#endif

    if (compare_old) {   // for context: the materialized path's error against the same reference
        AttentionScratch s;
        s.q = dalloc<floatX>(n_btc); s.k = dalloc<floatX>(n_btc); s.v = dalloc<floatX>(n_btc); s.y = dalloc<floatX>(n_btc);
        s.scores = dalloc<floatX>((size_t)B * NH * T * T);
        floatX* att = dalloc<floatX>((size_t)B * NH * T * T);
        floatX *dq = dalloc<floatX>(n_btc), *dk = dalloc<floatX>(n_btc), *dv = dalloc<floatX>(n_btc);
        attention_forward(d_out, att, d_qkv, s, B, T, NH, HS, 0);
        attention_backward(d_dqkv, d_dout, d_qkv, att, s, dq, dk, dv, B, T, NH, HS, 0);
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(out1.data(), d_out, n_btc * 2, cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(dqkv1.data(), d_dqkv, n_qkv * 2, cudaMemcpyDeviceToHost));
        size_t dummy;
        printf("       (materialized path, same inputs: out %.3e, dq %.3e, dk %.3e, dv %.3e)\n",
               rel_l2(out1, C, 0, ref.out, (size_t)B * T, C, &dummy),
               rel_l2(dqkv1, 3 * C, 0, ref.dq, (size_t)B * T, C, &dummy),
               rel_l2(dqkv1, 3 * C, C, ref.dk, (size_t)B * T, C, &dummy),
               rel_l2(dqkv1, 3 * C, 2 * C, ref.dv, (size_t)B * T, C, &dummy));
        cudaCheck(cudaFree(s.q)); cudaCheck(cudaFree(s.k)); cudaCheck(cudaFree(s.v)); cudaCheck(cudaFree(s.y));
        cudaCheck(cudaFree(s.scores)); cudaCheck(cudaFree(att));
        cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(dk)); cudaCheck(cudaFree(dv));
    }
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_dqkv)); cudaCheck(cudaFree(d_lse)); cudaCheck(cudaFree(d_scratch));
}

// ---- timing ----------------------------------------------------------------------------------------
// An FP8 output of n values in both layouts for the timings (scale 1, amax from 0): t() is the training form
struct Fp8TimingTarget {
    uint8_t *rows, *cols;
    float* scale;
    uint32_t* amax;
    explicit Fp8TimingTarget(size_t n) : rows(dalloc<uint8_t>(n)), cols(dalloc<uint8_t>(n)), scale(dalloc<float>(1)), amax(dalloc<uint32_t>(1)) {
        const float one = 1.0f;
        cudaCheck(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(amax, 0, 4));
    }
    ~Fp8TimingTarget() {
        for (void* p : {(void*)rows, (void*)cols, (void*)scale, (void*)amax}) cudaCheck(cudaFree(p));
    }
    Fp8Target t() const {
        Fp8Target x;
        x.rows = rows; x.cols = cols; x.scale = scale; x.amax = amax;
        return x;
    }
};

static void time_case(int B, int NH, int T, int HS) {
    const int C = NH * HS;
    const size_t n_qkv = (size_t)B * T * 3 * C, n_btc = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    floatX* qkv = dalloc<floatX>(n_qkv);
    floatX* dout = dalloc<floatX>(n_btc);
    floatX* out = dalloc<floatX>(n_btc);
    floatX* dqkv = dalloc<floatX>(n_qkv);
    float* lse = dalloc<float>(n_lse);
    void* scratch = cuda_malloc_or_die(flash_attention_backward_scratch_bytes(B, T, NH, HS), "flash scratch");
    fill_normal_kernel<<<ceil_div(n_qkv, 256), 256>>>(qkv, n_qkv, 1234);
    cudaCheckLaunch();
    fill_normal_kernel<<<ceil_div(n_btc, 256), 256>>>(dout, n_btc, 5678);
    cudaCheckLaunch();

    const double fwd_flop = 4.0 * B * NH * (double)T * T * HS / 2.0, bwd_flop = 2.5 * fwd_flop;
    double f_fwd = median_ms([&] { flash_attention_forward(out, lse, qkv, B, T, NH, HS, 0); });
    if (flash_attention_forward_gives_fp8(HS)) {
        // the FP8 recipe's attention projection input: the quantize-transpose pass after the forward, against
        // the codes from the forward's epilogue
        const Fp8TimingTarget f(n_btc);
        const double t_pass = median_ms([&] {
            flash_attention_forward(out, lse, qkv, B, T, NH, HS, 0);
            fp8_quantize_transpose<Fp8Kind::E4M3>(f.rows, f.cols, out, B * T, C, f.scale, f.amax, Fp8Stats(), 0);
        });
        const double t_fused = median_ms([&] { flash_attention_forward(out, lse, qkv, B, T, NH, HS, 0, nullptr, f.t()); });
        printf("  FP8 input of the attention projection: forward + quantize-transpose pass %.3f ms, the forward writing the "
               "codes %.3f ms (%.2fx)\n", t_pass, t_fused, t_pass / t_fused);
    }
    double f_bwd = median_ms([&] { flash_attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, HS, 0); });
    if (flash_attention_backward_gives_fp8(HS)) {
        // the backward as the recipes run it in training, with the qkv bias's column sums: BF16 dqkv (bf16) against
        // the E5M2 copy in both layouts in place of it (fp8, tiles_to_fp8), and dqkv with its amax (tcfp12)
        const size_t n_part = (size_t)flash_attention_bias_partial_rows(B, T) * 3 * C;
        float* part = dalloc<float>(n_part);
        const Fp8TimingTarget f(n_qkv);
        const Fp8Target t8 = f.t();
        Fp8Target ta;
        ta.amax = f.amax;
        const double t_bf16 = median_ms([&] { flash_attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, HS, 0, part); });
        const double t_fp8 = median_ms([&] { flash_attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, HS, 0, part, t8); });
        const double t_amax = median_ms([&] { flash_attention_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, HS, 0, part, ta); });
        printf("  backward with the bias sums: BF16 dqkv %.3f ms, its E5M2 copy in both layouts instead %.3f ms (%.2fx), "
               "BF16 dqkv and its amax %.3f ms\n", t_bf16, t_fp8, t_fp8 / t_bf16, t_amax);
        cudaCheck(cudaFree(part));
    }
    // the backward's two kernels alone (step 1 writes the D that step 2 reads; both see the same inputs)
    float* Dvec = static_cast<float*>(scratch);
    double f_dq = median_ms([&] {
        if (HS == 64) flash_detail::backward_dq_launch<IdentityBoundaries, 64>(dqkv, Dvec, dout, qkv, out, lse, B, T, NH, 0);
        else flash_detail::backward_dq_launch<IdentityBoundaries, 128>(dqkv, Dvec, dout, qkv, out, lse, B, T, NH, 0);
    });
    double f_dkv = median_ms([&] {
        if (HS == 64) flash_detail::backward_dkv_launch<IdentityBoundaries, 64>(dqkv, dout, qkv, lse, Dvec, B, T, NH, 0);
        else flash_detail::backward_dkv_launch<IdentityBoundaries, 128>(dqkv, dout, qkv, lse, Dvec, B, T, NH, 0);
    });
    cudaCheck(cudaDeviceSynchronize());

    AttentionScratch s;
    s.q = dalloc<floatX>(n_btc); s.k = dalloc<floatX>(n_btc); s.v = dalloc<floatX>(n_btc); s.y = dalloc<floatX>(n_btc);
    s.scores = dalloc<floatX>((size_t)B * NH * T * T);
    floatX* att = dalloc<floatX>((size_t)B * NH * T * T);
    floatX *dq = dalloc<floatX>(n_btc), *dk = dalloc<floatX>(n_btc), *dv = dalloc<floatX>(n_btc);
    double m_fwd = median_ms([&] { attention_forward(out, att, qkv, s, B, T, NH, HS, 0); });
    double m_bwd = median_ms([&] { attention_backward(dqkv, dout, qkv, att, s, dq, dk, dv, B, T, NH, HS, 0); });
    cudaCheck(cudaDeviceSynchronize());

    printf("timing B=%d NH=%d T=%d HS=%d (median of 20, causal FLOPs):\n", B, NH, T, HS);
    printf("  flash        forward %8.3f ms %7.1f TFLOP/s   backward %8.3f ms %7.1f TFLOP/s   total %8.3f ms\n",
           f_fwd, fwd_flop / f_fwd * 1e-9, f_bwd, bwd_flop / f_bwd * 1e-9, f_fwd + f_bwd);
    printf("  flash backward = dQ (and D) %.3f ms + dK/dV %.3f ms\n", f_dq, f_dkv);
    printf("  materialized forward %8.3f ms %7.1f TFLOP/s   backward %8.3f ms %7.1f TFLOP/s   total %8.3f ms\n",
           m_fwd, fwd_flop / m_fwd * 1e-9, m_bwd, bwd_flop / m_bwd * 1e-9, m_fwd + m_bwd);
    check(f_fwd + f_bwd < m_fwd + m_bwd, "B=%d NH=%d T=%d HS=%d: flash forward+backward faster than materialized (%.2fx)",
          B, NH, T, HS, (m_fwd + m_bwd) / (f_fwd + f_bwd));
#if defined(ENABLE_CUDNN)
    std::string why;
    if (cudnn_attention_prepare(B, T, NH, HS, &why)) {
        double c_fwd = median_ms([&] { cudnn_attention_forward(out, lse, qkv, B, T, NH, HS, 0); });
        double c_bwd = median_ms([&] { cudnn_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, HS, 0); });
        printf("  cuDNN        forward %8.3f ms %7.1f TFLOP/s   backward %8.3f ms %7.1f TFLOP/s   total %8.3f ms"
               " (%.2fx ours)\n", c_fwd, fwd_flop / c_fwd * 1e-9, c_bwd, bwd_flop / c_bwd * 1e-9, c_fwd + c_bwd,
               (f_fwd + f_bwd) / (c_fwd + c_bwd));
    } else {
        printf("  cuDNN        not available for this shape: %s\n", why.c_str());
    }
#endif

    cudaCheck(cudaFree(s.q)); cudaCheck(cudaFree(s.k)); cudaCheck(cudaFree(s.v)); cudaCheck(cudaFree(s.y));
    cudaCheck(cudaFree(s.scores)); cudaCheck(cudaFree(att));
    cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(dk)); cudaCheck(cudaFree(dv));
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dqkv)); cudaCheck(cudaFree(lse)); cudaCheck(cudaFree(scratch));
}

int main(int argc, char** argv) {
    const bool timing_only = argc > 1 && strcmp(argv[1], "--timing-only") == 0;
    const bool small_only = argc > 1 && strcmp(argv[1], "--small") == 0;   // for compute-sanitizer
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    matmul_init();

    struct Case { int B, NH, T, HS; };
    const Case cases[] = {{2, 3, 64, 64}, {1, 2, 100, 64}, {2, 2, 257, 64}, {1, 2, 1000, 128}, {2, 12, 1024, 64}, {1, 4, 2048, 128}};
    uint32_t seed = 42;
    if (!timing_only) {
        for (const Case& c : cases) {
            if (small_only && c.T > 300) continue;
            test_case(c.B, c.NH, c.T, c.HS, seed++, !small_only);
        }
    }
    if (!small_only) {
        time_case(64, 12, 1024, 64);
        time_case(32, 12, 2048, 64);
        time_case(32, 12, 1024, 128);
    }

    matmul_free();
#if defined(ENABLE_CUDNN)
    cudnn_attention_free();
#endif
    printf("attention tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
