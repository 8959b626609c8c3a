// test_layernorm.cu: the LayerNorm kernels of llmc/layernorm.cuh against float64, at every width the
// dispatch distinguishes: the register kernels (C % 4 == 0, forward up to C = 2048; backward up to
// 1024 with the partial sums in registers, up to 2048 with them in shared memory) and the generic
// kernels (C % 4 != 0, C > 2048). Per width:
//   1. forward: out = LN(x) * w + b (BF16), mean and rstd; the fused residual form (residual = a + b
//      in FP32, exactly, then its LayerNorm);
//   2. backward: dinp += dx (FP32, onto a non-zero dinp), dinp_x = dinp in BF16, dw += sum dy * xhat
//      and db += sum dy (onto non-zero dw, db); and the dispatched kernel against the generic one,
//      which computes the same sums in the same order (the 16-byte wide kernel, 1024 < C <= 2048 with
//      C % 4 == 0, sums each row's means in its own order: there dw and db are bit-identical and dinp
//      agrees to the last bits);
//   outputs poisoned with NaN first, so an unwritten element fails.
// Then the time of the dispatched backward against the generic one at d36's and d48's widths.
//
//   make build/test_layernorm && ./build/test_layernorm
// Prints [PASS]/[FAIL] lines and "layernorm tests: N passed, N failed"; exit 0 iff all pass. Without a
// CUDA device: "skipped: no CUDA device", exit 77.
#include <cmath>
#include <random>
#include <vector>
#include "dev/test/gpu/gpu_check.h"
#include "llmc/layernorm.cuh"
#include "llmc/formats/fp8_quantize.cuh"

#if defined(ENABLE_FP32)
#error "test_layernorm.cu tests the BF16 build"
#endif

static std::vector<float> random_f32(size_t n, std::mt19937& rng, float scale) {
    std::normal_distribution<float> g(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = g(rng);
    return v;
}
template <typename T>
static double value(T v) { return (double)v; }
template <>
double value<floatX>(floatX v) { return (double)bf2f(v); }

// ||got - ref|| / ||ref|| (NaN or Inf in got: infinity)
template <typename T>
static double rel_l2(const std::vector<T>& got, const std::vector<double>& ref) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double g = value(got[i]);
        if (!std::isfinite(g)) return INFINITY;
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}
static double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = std::fabs((double)a[i] - b[i]) / (std::fabs((double)b[i]) + 1e-6);
        if (!std::isfinite(d)) return INFINITY;
        worst = std::max(worst, d);
    }
    return worst;
}

static void poison(void* p, size_t bytes) { cudaCheck(cudaMemset(p, 0xFF, bytes)); } // NaN in FP32 and BF16

static void test_width(int N, int C, std::mt19937& rng) {
    const size_t NC = (size_t)N * C;
    const char* fpath = C % 4 != 0 || C > 2048 ? "generic" : "registers";
    const char* path = layernorm_backward_path(C);
    const bool vec4 = C > 1024 && C <= 2048 && C % 4 == 0; // the 16-byte kernel: its own order of the row sums
    // inputs: a residual stream with a per-row offset and spread (LayerNorm must remove them)
    std::vector<float> x = random_f32(NC, rng, 1.0f);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) x[(size_t)r * C + c] = x[(size_t)r * C + c] * (0.5f + (r % 7)) + 0.1f * (r % 5);
    auto w = random_floatx(C, rng, 0.5f, 1.5f), b = random_floatx(C, rng, -0.2f, 0.2f);
    auto branch = random_floatx(NC, rng, -1.0f, 1.0f);
    auto dout = random_floatx(NC, rng, -1.0f, 1.0f);
    std::vector<float> dinp0 = random_f32(NC, rng, 0.5f), dw0 = random_f32(C, rng, 1.0f), db0 = random_f32(C, rng, 1.0f);
    std::vector<float> bb0 = random_f32(C, rng, 1.0f);   // the branch bias gradient it adds into

    // float64 reference: the forward of x, the residual a + branch, and the backward of x
    std::vector<double> ref_out(NC), ref_mean(N), ref_rstd(N), ref_res(NC), ref_res_out(NC);
    std::vector<double> ref_dinp(NC), ref_dinp_x(NC), ref_dw(C), ref_db(C);
    for (int c = 0; c < C; c++) { ref_dw[c] = dw0[c]; ref_db[c] = db0[c]; }
    auto ln_row = [&](const double* xr, double* out, double& mean, double& rstd) {
        double s = 0.0, sq = 0.0;
        for (int c = 0; c < C; c++) s += xr[c];
        mean = s / C;
        for (int c = 0; c < C; c++) sq += (xr[c] - mean) * (xr[c] - mean);
        rstd = 1.0 / std::sqrt(sq / C + 1e-5);
        for (int c = 0; c < C; c++) out[c] = (xr[c] - mean) * rstd * value(w[c]) + value(b[c]);
    };
    std::vector<double> row(C), row2(C);
    for (int r = 0; r < N; r++) {
        const size_t o = (size_t)r * C;
        for (int c = 0; c < C; c++) row[c] = x[o + c];
        ln_row(row.data(), &ref_out[o], ref_mean[r], ref_rstd[r]);
        for (int c = 0; c < C; c++) ref_res[o + c] = (double)(x[o + c] + bf2f(branch[o + c])); // FP32 sum, as the kernel
        double m2, r2;
        ln_row(&ref_res[o], &ref_res_out[o], m2, r2);
        double mean_g = 0.0, mean_gx = 0.0;
        for (int c = 0; c < C; c++) {
            const double xhat = (row[c] - ref_mean[r]) * ref_rstd[r], g = value(dout[o + c]) * value(w[c]);
            mean_g += g; mean_gx += g * xhat;
        }
        mean_g /= C; mean_gx /= C;
        for (int c = 0; c < C; c++) {
            const double xhat = (row[c] - ref_mean[r]) * ref_rstd[r], dy = value(dout[o + c]);
            const double dx = ref_rstd[r] * (dy * value(w[c]) - mean_g - xhat * mean_gx);
            ref_dinp[o + c] = dinp0[o + c] + dx;
            ref_dinp_x[o + c] = ref_dinp[o + c];
            ref_dw[c] += dy * xhat;
            ref_db[c] += dy;
        }
    }

    float *d_x = to_device(x), *d_mean, *d_rstd, *d_res, *d_scratch;
    floatX *d_w = to_device(w), *d_b = to_device(b), *d_branch = to_device(branch), *d_dout = to_device(dout), *d_out;
    cudaCheck(cudaMalloc(&d_mean, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d_rstd, N * sizeof(float)));
    cudaCheck(cudaMalloc(&d_res, NC * sizeof(float)));
    cudaCheck(cudaMalloc(&d_out, NC * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_scratch, layernorm_backward_scratch_floats(C) * sizeof(float)));

    // 1. forward
    poison(d_out, NC * sizeof(floatX)); poison(d_mean, N * sizeof(float)); poison(d_rstd, N * sizeof(float));
    layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 0);
    const double e_out = rel_l2(to_host(d_out, NC), ref_out);
    const double e_mean = rel_l2(to_host(d_mean, N), ref_mean), e_rstd = rel_l2(to_host(d_rstd, N), ref_rstd);
    check(e_out < 4e-3 && e_mean < 1e-5 && e_rstd < 1e-5,
          "N=%d C=%d (%s) forward: out / mean / rstd rel L2 errors %.2e / %.2e / %.2e (tol 4e-3, 1e-5, 1e-5)", N, C, fpath,
          e_out, e_mean, e_rstd);
    poison(d_out, NC * sizeof(floatX)); poison(d_res, NC * sizeof(float));
    fused_residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_x, d_branch, d_w, d_b, N, C, 0, MLP_BRANCH);
    const auto res = to_host(d_res, NC);
    bool res_exact = true;
    for (size_t i = 0; i < NC; i++) res_exact &= res[i] == (float)ref_res[i];
    const double e_res_out = rel_l2(to_host(d_out, NC), ref_res_out);
    check(res_exact && e_res_out < 4e-3, "N=%d C=%d (%s) fused residual forward: residual exact (%s), out rel L2 %.2e", N, C,
          fpath, res_exact ? "yes" : "no", e_res_out);

    // 1b. the FP8 recipe's E4M3 output (Fp8Target, register kernels only): the codes and amax of quantizing
    // the BF16 output (fp8_quantize), bit for bit, the BF16 output left unwritten; both kernels
    if (layernorm_gives_fp8(C)) {
        const auto out_bf16 = to_host(d_out, NC); // the fused kernel's, just written
        float amax_bf16 = 0.0f;
        for (size_t i = 0; i < NC; i++) amax_bf16 = std::max(amax_bf16, std::fabs(bf2f(out_bf16[i])));
        const float s = 448.0f / amax_bf16 / 2.0f;
        uint8_t *d_q, *d_want;
        float* d_s = to_device(std::vector<float>{s});
        uint32_t* d_amax = to_device(std::vector<uint32_t>{0, 0});
        cudaCheck(cudaMalloc(&d_q, NC)); cudaCheck(cudaMalloc(&d_want, NC));
        for (int fused = 0; fused < 2; fused++) {
            cudaCheck(cudaMemset(d_amax, 0, 8));
            poison(d_out, NC * sizeof(floatX));
            if (fused) fused_residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_x, d_branch, d_w, d_b, N, C, 0, MLP_BRANCH);
            else layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 0);
            fp8_quantize<Fp8Kind::E4M3>(d_want, d_out, (long long)NC, d_s, d_amax + 1, Fp8Stats(), 0);
            Fp8Target q;
            q.rows = d_q; q.scale = d_s; q.amax = d_amax;
            poison(d_out, NC * sizeof(floatX));
            if (fused) fused_residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_x, d_branch, d_w, d_b, N, C, 0, MLP_BRANCH, q);
            else layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 0, q);
            const auto got = to_host(d_q, NC), want = to_host(d_want, NC);
            const auto amax = to_host(d_amax, 2);
            const auto untouched = to_host(reinterpret_cast<uint16_t*>(d_out), NC);
            size_t written = 0;
            for (uint16_t v : untouched) written += v != 0xFFFF;
            check(got == want && amax[0] == amax[1] && amax[0] != 0 && written == 0,
                  "N=%d C=%d (%s) %s forward with the E4M3 output: codes and amax = the quantize pass over the BF16 "
                  "output, bit for bit; BF16 output not written (%zu written)", N, C, fpath, fused ? "fused residual" : "plain",
                  written);
        }
        cudaFree(d_q); cudaFree(d_want); cudaFree(d_s); cudaFree(d_amax);
        // 1c. a target with no rows but an amax (TCFP-12's fresh scales): the BF16 output as without it, bit for
        // bit, and its amax (tensor_amax over that output)
        uint32_t* d_amax2 = to_device(std::vector<uint32_t>{0, 0});
        floatX* d_out2;
        cudaCheck(cudaMalloc(&d_out2, NC * sizeof(floatX)));
        for (int fused = 0; fused < 2; fused++) {
            cudaCheck(cudaMemset(d_amax2, 0, 8));
            if (fused) fused_residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_x, d_branch, d_w, d_b, N, C, 0, MLP_BRANCH);
            else layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, 0);
            tensor_amax(d_amax2 + 1, d_out, (long long)NC, 0);
            Fp8Target q;
            q.amax = d_amax2;
            poison(d_out2, NC * sizeof(floatX));
            if (fused) fused_residual_layernorm_forward(d_res, d_out2, d_mean, d_rstd, d_x, d_branch, d_w, d_b, N, C, 0, MLP_BRANCH, q);
            else layernorm_forward(d_out2, d_mean, d_rstd, d_x, d_w, d_b, N, C, 0, q);
            const auto amax = to_host(d_amax2, 2);
            const bool same = to_host(reinterpret_cast<uint16_t*>(d_out2), NC) == to_host(reinterpret_cast<uint16_t*>(d_out), NC);
            check(same && amax[0] == amax[1] && amax[0] != 0,
                  "N=%d C=%d (%s) %s forward recording its amax only: the BF16 output bit-identical (%s), amax %s tensor_amax's",
                  N, C, fpath, fused ? "fused residual" : "plain", same ? "yes" : "no", amax[0] == amax[1] ? "=" : "!=");
        }
        cudaFree(d_amax2); cudaFree(d_out2);
    }

    // 2. backward, dispatched, from the float64 mean / rstd rounded to FP32
    std::vector<float> mean_f(N), rstd_f(N);
    for (int r = 0; r < N; r++) { mean_f[r] = (float)ref_mean[r]; rstd_f[r] = (float)ref_rstd[r]; }
    cudaCheck(cudaMemcpy(d_mean, mean_f.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_rstd, rstd_f.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    float *d_dinp = to_device(dinp0), *d_dw = to_device(dw0), *d_db = to_device(db0), *d_bb = to_device(bb0);
    floatX* d_dinp_x;
    cudaCheck(cudaMalloc(&d_dinp_x, NC * sizeof(floatX)));
    poison(d_dinp_x, NC * sizeof(floatX)); poison(d_scratch, layernorm_backward_scratch_floats(C) * sizeof(float));
    layernorm_backward(d_dinp, d_dinp_x, d_dw, d_db, d_scratch, d_dout, d_x, d_w, d_mean, d_rstd, N, C, 0, 1.0f, d_bb);
    const auto dinp = to_host(d_dinp, NC), dw = to_host(d_dw, C), db = to_host(d_db, C), bb = to_host(d_bb, C);
    const double e_dinp = rel_l2(dinp, ref_dinp), e_dinp_x = rel_l2(to_host(d_dinp_x, NC), ref_dinp_x);
    const double e_dw = rel_l2(dw, ref_dw), e_db = rel_l2(db, ref_db);
    check(e_dinp < 1e-5 && e_dinp_x < 4e-3, "N=%d C=%d (%s) backward: dinp (FP32) / dinp_x (BF16) rel L2 %.2e / %.2e", N, C,
          path, e_dinp, e_dinp_x);
    check(e_dw < 1e-5 && e_db < 1e-5, "N=%d C=%d (%s) backward: dw / db accumulated, rel L2 %.2e / %.2e", N, C, path, e_dw,
          e_db);
    {   // the branch bias gradient: bb0 + the column sums of the dinp_x it wrote, in float64
        const auto dx = to_host(d_dinp_x, NC);
        std::vector<double> ref_bb(C);
        for (int c = 0; c < C; c++) ref_bb[c] = bb0[c];
        for (int r = 0; r < N; r++)
            for (int c = 0; c < C; c++) ref_bb[c] += bf2f(dx[(size_t)r * C + c]);
        const double e_bb = rel_l2(bb, ref_bb);
        check(e_bb < 1e-5, "N=%d C=%d (%s) backward: the branch bias gradient (column sums of dinp_x) accumulated, rel L2 %.2e",
              N, C, path, e_bb);
    }

    // 2b. the FP8 recipe's E5M2 output gradient (Fp8Target, every kernel but the generic one): the codes and
    // amax of quantizing the BF16 dinp_x (fp8_quantize), bit for bit, dinp_x left unwritten, and dinp, dw,
    // db and the branch bias gradient (the column sums of the values it would have written) unchanged
    if (layernorm_backward_gives_fp8(C)) {
        const float s = 1024.0f; // E5M2: small gradients need a large scale
        float* d_s = to_device(std::vector<float>{s});
        uint32_t* d_amax = to_device(std::vector<uint32_t>{0, 0});
        uint8_t *d_q, *d_want;
        cudaCheck(cudaMalloc(&d_q, NC)); cudaCheck(cudaMalloc(&d_want, NC));
        fp8_quantize<Fp8Kind::E5M2>(d_want, d_dinp_x, (long long)NC, d_s, d_amax + 1, Fp8Stats(), 0);
        float *q_dinp = to_device(dinp0), *q_dw = to_device(dw0), *q_db = to_device(db0), *q_bb = to_device(bb0);
        floatX* q_dinp_x;
        cudaCheck(cudaMalloc(&q_dinp_x, NC * sizeof(floatX)));
        poison(q_dinp_x, NC * sizeof(floatX));
        Fp8Target q;
        q.rows = d_q; q.scale = d_s; q.amax = d_amax;
        layernorm_backward(q_dinp, q_dinp_x, q_dw, q_db, d_scratch, d_dout, d_x, d_w, d_mean, d_rstd, N, C, 0, 1.0f, q_bb, q);
        const auto got = to_host(d_q, NC), want = to_host(d_want, NC);
        const auto amax = to_host(d_amax, 2);
        const auto untouched = to_host(reinterpret_cast<uint16_t*>(q_dinp_x), NC);
        size_t written = 0;
        for (uint16_t v : untouched) written += v != 0xFFFF;
        const bool same = to_host(q_dinp, NC) == dinp && to_host(q_dw, C) == dw && to_host(q_db, C) == db &&
                          to_host(q_bb, C) == bb;
        size_t nonzero = 0;
        for (uint8_t v : got) nonzero += (v & 0x7F) != 0;
        check(got == want && amax[0] == amax[1] && amax[0] != 0 && written == 0 && same && nonzero > NC / 2,
              "N=%d C=%d (%s) backward with the E5M2 output: codes and amax = the quantize pass over dinp_x, bit for bit "
              "(%zu of %zu codes non-zero); dinp_x not written (%zu written); dinp, dw, db, branch bias gradient %s",
              N, C, path, nonzero, NC, written, same ? "bit-identical" : "DIFFERENT");
        cudaFree(d_q); cudaFree(d_want); cudaFree(d_s); cudaFree(d_amax); cudaFree(q_dinp); cudaFree(q_dw);
        cudaFree(q_db); cudaFree(q_bb); cudaFree(q_dinp_x);
        // 2c. a target with no rows but an amax (TCFP-12): dinp_x written as without it and its amax recorded;
        // dinp, dw, db, the branch bias gradient unchanged
        uint32_t* a_amax = to_device(std::vector<uint32_t>{0, 0});
        tensor_amax(a_amax + 1, d_dinp_x, (long long)NC, 0);
        float *a_dinp = to_device(dinp0), *a_dw = to_device(dw0), *a_db = to_device(db0), *a_bb = to_device(bb0);
        floatX* a_dinp_x;
        cudaCheck(cudaMalloc(&a_dinp_x, NC * sizeof(floatX)));
        poison(a_dinp_x, NC * sizeof(floatX));
        Fp8Target qa;
        qa.amax = a_amax;
        layernorm_backward(a_dinp, a_dinp_x, a_dw, a_db, d_scratch, d_dout, d_x, d_w, d_mean, d_rstd, N, C, 0, 1.0f, a_bb, qa);
        const auto aa = to_host(a_amax, 2);
        const bool same_x = to_host(reinterpret_cast<uint16_t*>(a_dinp_x), NC) == to_host(reinterpret_cast<uint16_t*>(d_dinp_x), NC);
        const bool same_rest = to_host(a_dinp, NC) == dinp && to_host(a_dw, C) == dw && to_host(a_db, C) == db && to_host(a_bb, C) == bb;
        check(same_x && same_rest && aa[0] == aa[1] && aa[0] != 0,
              "N=%d C=%d (%s) backward recording its amax only: dinp_x bit-identical (%s), dinp, dw, db, branch bias "
              "gradient bit-identical (%s), amax %s tensor_amax's", N, C, path, same_x ? "yes" : "no", same_rest ? "yes" : "no",
              aa[0] == aa[1] ? "=" : "!=");
        cudaFree(a_amax); cudaFree(a_dinp); cudaFree(a_dw); cudaFree(a_db); cudaFree(a_bb); cudaFree(a_dinp_x);
    }

    // the generic kernel on the same inputs: the same sums in the same order
    float *g_dinp = to_device(dinp0), *g_dw = to_device(dw0), *g_db = to_device(db0), *g_bb = to_device(bb0);
    layernorm_backward_kernel<<<LN_BACKWARD_WARPS / 8, 256>>>(g_dinp, d_dinp_x, d_scratch, d_dout, d_x, d_w, d_mean, d_rstd,
                                                              N, C, 1.0f);
    cudaCheckLaunch();
    layernorm_backward_reduce(g_dw, g_db, g_bb, d_scratch, C, 0);
    const auto gd = to_host(g_dinp, NC), gw = to_host(g_dw, C), gb = to_host(g_db, C), gbb = to_host(g_bb, C);
    const double diff = std::max({max_rel_diff(dinp, gd), max_rel_diff(dw, gw), max_rel_diff(db, gb), max_rel_diff(bb, gbb)});
    const bool identical = memcmp(dinp.data(), gd.data(), NC * 4) == 0 && memcmp(dw.data(), gw.data(), C * 4) == 0 &&
                           memcmp(db.data(), gb.data(), C * 4) == 0 && memcmp(bb.data(), gbb.data(), C * 4) == 0;
    if (!vec4) {
        check(diff < 1e-5, "N=%d C=%d (%s) backward equals the generic kernel's (max rel difference %.2e, %s)", N, C, path, diff,
              identical ? "bit-identical" : "not bit-identical");
    } else {
        // dw and db: the same products added in the same row order, so bit for bit; dinp: the row means
        // are summed in another order (last bits); the branch bias gradient sums dinp_x, whose BF16
        // rounding that last bit can flip: within a few BF16 steps of one value per column
        const bool dwdb = memcmp(dw.data(), gw.data(), C * 4) == 0 && memcmp(db.data(), gb.data(), C * 4) == 0;
        const auto dx = to_host(d_dinp_x, NC);
        double worst_bb = 0.0;
        for (int c = 0; c < C; c++) {
            double abs_sum = std::fabs(bb0[c]);
            for (int r = 0; r < N; r++) abs_sum += std::fabs(bf2f(dx[(size_t)r * C + c]));
            worst_bb = std::max(worst_bb, std::fabs((double)bb[c] - gbb[c]) / (abs_sum + 1e-6));
        }
        // (dinp: the largest difference against the largest |dinp|; per element it can be large where
        // old + dx cancels to near zero)
        double max_diff = 0.0, max_abs = 0.0;
        for (size_t i = 0; i < NC; i++) {
            max_diff = std::max(max_diff, std::fabs((double)dinp[i] - gd[i]));
            max_abs = std::max(max_abs, std::fabs((double)gd[i]));
        }
        check(dwdb && max_diff <= 1e-6 * max_abs && worst_bb < 1e-4,
              "N=%d C=%d (%s) backward against the generic kernel: dw, db bit-identical (%s), dinp max difference %.2e of "
              "max |dinp| %.2e, branch bias gradient %.2e of its column's sum of |dinp_x|", N, C, path, dwdb ? "yes" : "no",
              max_diff, max_abs, worst_bb);
    }

    cudaFree(d_x); cudaFree(d_mean); cudaFree(d_rstd); cudaFree(d_res); cudaFree(d_scratch); cudaFree(d_w); cudaFree(d_b);
    cudaFree(d_branch); cudaFree(d_dout); cudaFree(d_out); cudaFree(d_dinp); cudaFree(d_dw); cudaFree(d_db);
    cudaFree(d_dinp_x); cudaFree(g_dinp); cudaFree(g_dw); cudaFree(g_db); cudaFree(d_bb); cudaFree(g_bb);
}

// the dispatched backward and forward against the generic kernels at a training width
static void time_width(int N, int C) {
    const size_t NC = (size_t)N * C;
    std::mt19937 rng(7);
    float *x = to_device(random_f32(NC, rng, 1.0f)), *dinp = to_device(random_f32(NC, rng, 0.1f));
    floatX *dout = to_device(random_floatx(NC, rng, -1.0f, 1.0f)), *w = to_device(random_floatx(C, rng, 0.5f, 1.5f));
    floatX *b = to_device(random_floatx(C, rng, -0.2f, 0.2f)), *dinp_x, *out;
    float *mean, *rstd, *scratch, *dw, *db, *bb;
    cudaCheck(cudaMalloc(&dinp_x, NC * sizeof(floatX))); cudaCheck(cudaMalloc(&out, NC * sizeof(floatX)));
    cudaCheck(cudaMalloc(&mean, N * sizeof(float))); cudaCheck(cudaMalloc(&rstd, N * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, layernorm_backward_scratch_floats(C) * sizeof(float)));
    cudaCheck(cudaMalloc(&dw, C * sizeof(float))); cudaCheck(cudaMalloc(&db, C * sizeof(float)));
    cudaCheck(cudaMalloc(&bb, C * sizeof(float)));
    const int grid = ceil_div(N, 8);
    const double f_new = median_ms([&] { layernorm_forward(out, mean, rstd, x, w, b, N, C, 0); });
    const double f_old = median_ms([&] { layernorm_forward_kernel<IdentityBoundaries><<<grid, 256>>>(out, mean, rstd, x, w, b, N, C); });
    // (with the branch bias gradient, as the trainer calls it)
    const double b_new = median_ms([&] { layernorm_backward(dinp, dinp_x, dw, db, scratch, dout, x, w, mean, rstd, N, C, 0, 1.0f, bb); });
    const double b_old = median_ms([&] {
        layernorm_backward_kernel<<<LN_BACKWARD_WARPS / 8, 256>>>(dinp, dinp_x, scratch, dout, x, w, mean, rstd, N, C, 1.0f);
        layernorm_backward_reduce(dw, db, bb, scratch, C, 0);
    });
    // bytes: forward reads x (4) and writes out (2); backward reads dout (2), x (4), dinp (4), writes dinp (4), dinp_x (2)
    printf("  N=%d C=%d: forward %.3f ms (generic %.3f, %.2f TB/s), backward %.3f ms (generic %.3f, %.2f TB/s)\n", N, C, f_new,
           f_old, NC * 6.0 / (f_new * 1e-3) / 1e12, b_new, b_old, NC * 16.0 / (b_new * 1e-3) / 1e12);
    if (C > 1024 && C <= 2048 && C % 4 == 0) {
        // the scalar wide kernel the 16-byte one replaced at these widths (still the path for C % 4 != 0)
        const double b_scalar = median_ms([&] {
            if (C <= 1280) layernorm_backward_wide<40>(dinp, dinp_x, scratch, dout, x, w, mean, rstd, N, C, 1.0f, 0);
            else if (C <= 1664) layernorm_backward_wide<52>(dinp, dinp_x, scratch, dout, x, w, mean, rstd, N, C, 1.0f, 0);
            else layernorm_backward_wide<64>(dinp, dinp_x, scratch, dout, x, w, mean, rstd, N, C, 1.0f, 0);
            layernorm_backward_reduce(dw, db, bb, scratch, C, 0);
        });
        printf("    backward with the scalar wide kernel: %.3f ms (%.2f TB/s); the 16-byte kernel takes %.2fx its time\n",
               b_scalar, NC * 16.0 / (b_scalar * 1e-3) / 1e12, b_new / b_scalar);
    }
    if (C % 4 == 0 && C <= 2048)
        check(b_new < b_old && f_new <= f_old * 1.05, "N=%d C=%d: the register kernels are faster than the generic ones "
              "(backward %.2fx, forward %.2fx)", N, C, b_old / b_new, f_old / f_new);
    cudaFree(x); cudaFree(dinp); cudaFree(dout); cudaFree(w); cudaFree(b); cudaFree(dinp_x); cudaFree(out);
    cudaFree(mean); cudaFree(rstd); cudaFree(scratch); cudaFree(dw); cudaFree(db); cudaFree(bb);
}

int main() {
    if (!gpu_present()) return 77;
    std::mt19937 rng(20261125);
    const int widths[] = {768, 1024, 1280, 1600, 2048, 1100, 1282, 2304};
    for (int C : widths) test_width(C == 768 ? 1031 : 517, C, rng);
    printf("timing (median of 20):\n");
    time_width(32768, 1280); // d36, B = 32 (the bench's): one micro-step's rows
    time_width(16384, 1280); // d36, B = 16
    time_width(8192, 1600);  // d48, B = 8
    time_width(65536, 768);  // d12, B = 64
    time_width(65536, 1024); // d24, B = 64
    printf("layernorm tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
