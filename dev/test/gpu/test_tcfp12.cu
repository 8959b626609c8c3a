// test_tcfp12.cu: the TCFP-12 recipe's GPU pieces against the CPU reference of llmc/formats/tcfp12.h.
//   1. The split kernels, bit for bit against tcfp12_split_matrix: per tensor and per block of
//      32/64/128, with error feedback, SRR, PDDS and none, over several consecutive splits of
//      changing weights (the EF buffer and the PDDS state carry over), BF16 and FP32 input: W_hi and
//      W_lo codes, both scale codes (the zero-residual sentinel included), EF', the PDDS state and
//      the split's counts. A PDDS run whose weights grow faster than the EMA clips, and the clipped
//      counts agree too.
//   2. Reconstruction: on N(0,1) 4096 x 4096, the SNR of deq(W_hi) + deq(W_lo) from the GPU split is
//      >= 45 dB (one E4M3 tensor: about 31.5 dB).
//   3. The recipe's linear layer (recipes/tcfp12/recipe.h, as the trainer calls it) under each option set:
//      the split it made equals the CPU's; forward (bias, GELU epilogue), dgrad (both halves, or W_hi
//      alone under ABD) and wgrad (BF16 or FP8) against float64 products of the dequantized
//      operands, with x and dy quantized on the CPU with the fresh power-of-two scales; and the
//      dual GEMM against the unquantized product, within FP8's error.
//   4. ZeRO-1 on one GPU (test_ef_pieces): 2, 3 or 4 threads play as many processes that each keep a
//      piece of the EF buffer and split only their pieces; everything they end up with equals the
//      whole split's.
//
//   make build/test_tcfp12 && ./build/test_tcfp12
// Prints [PASS]/[FAIL] lines and "tcfp12 tests: N passed, N failed"; exit 0 iff all pass. Without a
// CUDA device: "skipped: no CUDA device", exit 77.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <random>
#include <string>
#include <vector>
#include "dev/test/gpu/gpu_check.h"
#include "llmc/recipes/tcfp12/recipe.h"
#include "llmc/layernorm.cuh"

using llmc::strfmt;
using llmc::Tcfp12Options;
using llmc::Tcfp12Matrix;

static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

// Weights of a (rows x cols) matrix for split t: rows of different magnitudes, an all-zero row, rows
// of small multiples of 1/8 (exact in W_hi: their blocks get the zero-residual sentinel), and a
// drift with t as an optimizer would make. grow: split t is scaled by 8^t (a PDDS EMA then lags).
static std::vector<float> make_weights(int rows, int cols, int t, bool grow, bool bf16, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> w((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const float base = nd(rng), drift = nd(rng);
            float v;
            if (r % 11 == 3) v = 0.0f;
            else if (r % 11 == 5) v = (float)((r + c) % 9 - 4) * 0.125f;
            else v = (base + 0.01f * t * drift) * std::ldexp(1.0f, r % 7 - 6);
            if (grow) v *= std::ldexp(1.0f, 3 * t);
            w[(size_t)r * cols + c] = bf16 ? bf2f(f2bf(v)) : v;
        }
    return w;
}

template <typename T>
static size_t count_diff(const std::vector<T>& a, const std::vector<T>& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); i++) n += memcmp(&a[i], &b[i], sizeof(T)) != 0;
    return n;
}
static size_t count_diff_bits(const std::vector<float>& a, const std::vector<float>& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); i++) n += fbits(a[i]) != fbits(b[i]);
    return n;
}

static std::string describe(const Tcfp12Options& o) { return llmc::tcfp12_describe(o); }

// 1. Consecutive splits on the GPU and the CPU, compared after each.
template <typename InT>
static void test_split(int rows, int cols, Tcfp12Options o, int splits, bool grow) {
    const bool bf16 = sizeof(InT) == 2;
    const bool use_ef = llmc::tcfp12_uses_ef(o);
    const int64_t groups = llmc::tcfp12_num_groups(rows, cols, o.block_size);
    const size_t n = (size_t)rows * cols;
    std::vector<float> ef_h(n, 0.0f), pdds_h(groups, 0.0f);
    float* ef_d = use_ef ? to_device(ef_h) : nullptr;
    float* pdds_d = o.pdds ? to_device(pdds_h) : nullptr;
    uint8_t *hi, *lo, *hs, *ls;
    cudaCheck(cudaMalloc(&hi, n)); cudaCheck(cudaMalloc(&lo, n));
    cudaCheck(cudaMalloc(&hs, groups)); cudaCheck(cudaMalloc(&ls, groups));
    Tcfp12SplitStats* st;
    cudaCheck(cudaMalloc(&st, sizeof(Tcfp12SplitStats)));
    const std::string what = strfmt("%s, %s input %dx%d%s", describe(o).c_str(), bf16 ? "BF16" : "FP32", rows, cols,
                                    grow ? ", weights growing 8x per split" : "");
    size_t bad = 0;
    int64_t sentinels = 0, clipped = 0;
    for (int t = 0; t < splits; t++) {
        const std::vector<float> w = make_weights(rows, cols, t, grow, bf16, 1000 + rows + cols);
        const uint32_t seed = 77 + t;
        const Tcfp12Matrix m = llmc::tcfp12_split_matrix(w.data(), rows, cols, o, use_ef ? ef_h.data() : nullptr,
                                                         o.pdds ? pdds_h.data() : nullptr, seed);
        InT* wd;
        if (bf16) {
            std::vector<floatX> wb(n);
            for (size_t i = 0; i < n; i++) wb[i] = f2bf(w[i]);
            wd = (InT*)to_device(wb);
        } else {
            wd = (InT*)to_device(w);
        }
        tcfp12_split(wd, rows, cols, o, ef_d, pdds_d, seed, hi, lo, hs, ls, st, 0);
        const auto ghi = to_host(hi, n), glo = to_host(lo, n), ghs = to_host(hs, groups), gls = to_host(ls, groups);
        const Tcfp12SplitStats gs = to_host(st, 1)[0];
        size_t d = count_diff(ghi, m.hi) + count_diff(glo, m.lo) + count_diff(ghs, m.hi_scale) + count_diff(gls, m.lo_scale);
        if (use_ef) d += count_diff_bits(to_host(ef_d, n), ef_h);
        if (o.pdds) d += count_diff_bits(to_host(pdds_d, groups), pdds_h);
        const bool counts_ok = (int64_t)gs.hi_saturated == m.hi_saturated && (int64_t)gs.lo_saturated == m.lo_saturated &&
                               (int64_t)gs.lo_nonzero == m.lo_nonzero &&
                               (int64_t)gs.zero_residual_groups == m.zero_residual_groups && gs.amax_bits == fbits(m.amax);
        if ((d || !counts_ok) && bad < 3)
            printf("    split %d: %zu values differ; counts gpu/cpu: hi sat %llu/%lld lo sat %llu/%lld nonzero %llu/%lld "
                   "sentinels %llu/%lld\n", t, d, gs.hi_saturated, (long long)m.hi_saturated, gs.lo_saturated,
                   (long long)m.lo_saturated, gs.lo_nonzero, (long long)m.lo_nonzero, gs.zero_residual_groups,
                   (long long)m.zero_residual_groups);
        bad += d + (counts_ok ? 0 : 1);
        sentinels += m.zero_residual_groups;
        clipped += m.hi_saturated + m.lo_saturated;
        cudaFree(wd);
    }
    check(bad == 0, "split %s, %d splits: codes, scale codes, EF, PDDS state and counts equal the CPU's (%lld sentinel "
          "groups, %lld clipped values)", what.c_str(), splits, (long long)sentinels, (long long)clipped);
    if (grow && o.pdds) check(clipped > 0, "split %s: the lagging PDDS scale clipped values (%lld), and EF carried them",
                              what.c_str(), (long long)clipped);
    cudaFree(hi); cudaFree(lo); cudaFree(hs); cudaFree(ls); cudaFree(st);
    if (ef_d) cudaFree(ef_d);
    if (pdds_d) cudaFree(pdds_d);
}

// 2. SNR of the reconstruction on N(0,1) 4096 x 4096 (FP32 input, no EF: one split)
static void test_snr(int block_size) {
    const int rows = 4096, cols = 4096;
    const size_t n = (size_t)rows * cols;
    std::mt19937_64 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> w(n);
    for (auto& v : w) v = nd(rng);
    Tcfp12Options o;
    o.block_size = block_size;
    o.error_feedback = 0;
    const int64_t groups = llmc::tcfp12_num_groups(rows, cols, block_size);
    float* wd = to_device(w);
    uint8_t *hi, *lo, *hs, *ls;
    cudaCheck(cudaMalloc(&hi, n)); cudaCheck(cudaMalloc(&lo, n));
    cudaCheck(cudaMalloc(&hs, groups)); cudaCheck(cudaMalloc(&ls, groups));
    Tcfp12SplitStats* st;
    cudaCheck(cudaMalloc(&st, sizeof(Tcfp12SplitStats)));
    tcfp12_split(wd, rows, cols, o, nullptr, nullptr, 0, hi, lo, hs, ls, st, 0);
    Tcfp12Matrix m;
    m.rows = rows; m.cols = cols; m.block_size = block_size;
    m.hi = to_host(hi, n); m.lo = to_host(lo, n); m.hi_scale = to_host(hs, groups); m.lo_scale = to_host(ls, groups);
    const std::vector<float> both = llmc::tcfp12_dequantize_matrix(m), hi_only = llmc::tcfp12_dequantize_matrix(m, true);
    double sig = 0, e2 = 0, e1 = 0;
    for (size_t i = 0; i < n; i++) {
        sig += (double)w[i] * w[i];
        e2 += ((double)w[i] - both[i]) * ((double)w[i] - both[i]);
        e1 += ((double)w[i] - hi_only[i]) * ((double)w[i] - hi_only[i]);
    }
    const double snr = 10 * std::log10(sig / e2), snr1 = 10 * std::log10(sig / e1);
    const Tcfp12SplitStats gs = to_host(st, 1)[0];
    const double err = std::sqrt(gs.err2 / gs.weff2), err_host = std::sqrt(e2 / sig);
    check(snr >= 45.0 && snr1 < 35.0, "reconstruction SNR on N(0,1) 4096x4096, %s: %.1f dB (W_hi alone: %.1f dB; seed: 46.0 / 31.5)",
          block_size ? strfmt("block %d", block_size).c_str() : "per tensor", snr, snr1);
    check(std::fabs(err - err_host) <= 1e-6 * err_host, "the split's telemetry error sqrt(sum EF'^2 / sum W^2) = %.6e equals the host's %.6e",
          err, err_host);
    cudaFree(wd); cudaFree(hi); cudaFree(lo); cudaFree(hs); cudaFree(ls); cudaFree(st);
}

// ---- 3. the recipe's linear layer -------------------------------------------------------------------
static double rel_l2(const std::vector<double>& a, const std::vector<double>& ref) {
    double e = 0, n = 0;
    for (size_t i = 0; i < a.size(); i++) { e += (a[i] - ref[i]) * (a[i] - ref[i]); n += ref[i] * ref[i]; }
    return std::sqrt(e / std::max(n, 1e-300));
}
static double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// x quantized as the recipe does: fresh power-of-two scale from amax, nearest even, saturating
static std::vector<double> host_quantize(const std::vector<float>& x, bool e5m2) {
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const uint8_t code = tcfp12_act_scale_code(amax, e5m2);
    const float q = llmc::tcfp12_inv_scale(code), s = llmc::tcfp12_scale(code);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const float v = x[i] * q;
        const float d = e5m2 ? llmc::fp8e5m2_decode(llmc::fp8e5m2_encode(v, llmc::Overflow::Saturate))
                             : llmc::fp8e4m3_decode(llmc::fp8e4m3_encode(v, llmc::Overflow::Saturate));
        out[i] = (double)d * s;
    }
    return out;
}

static std::vector<float> bf16_values(int n, float scale, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(n);
    for (int i = 0; i < n; i++) v[i] = bf2f(f2bf(nd(rng) * scale * (1.0f + (i % 5))));
    return v;
}
static std::vector<floatX> to_bf(const std::vector<float>& v) {
    std::vector<floatX> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = f2bf(v[i]);
    return b;
}
static std::vector<double> host_bf(const floatX* d, size_t n) {
    const auto h = to_host(d, n);
    std::vector<double> v(n);
    for (size_t i = 0; i < n; i++) v[i] = bf2f(h[i]);
    return v;
}

// The four weight matrices of a one-layer model of `channels` channels, BF16 on the device (values
// bf16_values(..., 0.02, seed0 + kind)), also set in lw
static std::vector<floatX*> layer_weights(int channels, int seed0, LinearWeights& lw) {
    std::vector<floatX*> wd(NUM_LINEAR_KINDS);
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
        const int ic = linear_in_features((LinearKind)k, channels), oc = linear_out_features((LinearKind)k, channels);
        wd[k] = to_device(to_bf(bf16_values(oc * ic, 0.02f, seed0 + k)));
        lw.weight[k] = wd[k];
    }
    return wd;
}

// the four linears' BF16 biases, bf16_values(out features, 0.1, seed0 + kind)
static std::vector<floatX*> layer_biases(int channels, int seed0) {
    std::vector<floatX*> bd(NUM_LINEAR_KINDS);
    for (int k = 0; k < NUM_LINEAR_KINDS; k++)
        bd[k] = to_device(to_bf(bf16_values(linear_out_features((LinearKind)k, channels), 0.1f, seed0 + k)));
    return bd;
}

// The two recipes the speculative-scale tests compare, on the same weights: rs[0] speculates, rs[1] takes the
// amax passes first (Recipe::speculate)
static void init_speculating_and_not(Recipe (&rs)[2], const RecipeOptions& ro, const ModelShape& shape, int B, int T,
                                     int concat_mode, const LinearWeights& lw) {
    for (int way = 0; way < 2; way++) {
        recipe_init(rs[way], ro, shape, B, T);
        rs[way].concat_mode = concat_mode;
        rs[way].speculate = way == 0;
        recipe_weights_changed(rs[way], lw, 0);
    }
}

// the largest relative L2 difference between a[k] and b[k] over the vectors k (bias gradients summed in two orders)
static double worst_rel_l2(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    double worst = 0.0;
    for (size_t k = 0; k < a.size(); k++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < a[k].size(); i++) {
            const double u = a[k][i], v = b[k][i];
            num += (u - v) * (u - v); den += v * v;
        }
        worst = std::max(worst, std::sqrt(num / std::max(den, 1e-300)));
    }
    return worst;
}

// the bytes of a device buffer, appended to a list of what a run produced (the speculative-scale tests
// compare such lists between the speculating and the non-speculating recipe)
static void keep_bytes(std::vector<std::vector<uint8_t>>& got, const void* d, size_t bytes) {
    std::vector<uint8_t> b(bytes);
    cudaCheck(cudaMemcpy(b.data(), d, bytes, cudaMemcpyDeviceToHost));
    got.push_back(b);
}

// concat_mode: the recipe's form of the dual GEMM (Recipe::concat_mode; -1 = the two GEMMs here, since
// autotuning is off); the K-concatenated form needs channels that are a multiple of 128
static void test_recipe(const char* label, RecipeOptions ro, int channels = 64, int concat_mode = -1) {
    ModelShape shape;
    shape.num_layers = 1; shape.channels = channels; shape.num_heads = 1;
    const int B = 2, T = 96, N = B * T, C0 = shape.channels;
    Recipe r;
    recipe_init(r, ro, shape, B, T);
    r.concat_mode = concat_mode;
    if (concat_mode == 1) check(r.concat, "%s: the K-concatenated form is built at %d channels", label, channels);
    // weights of the four linears of the one layer, in BF16
    std::vector<std::vector<float>> w(NUM_LINEAR_KINDS);
    LinearWeights lw;
    std::vector<floatX*> wd(NUM_LINEAR_KINDS);
    std::vector<uint32_t> seeds(NUM_LINEAR_KINDS);
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
        const int C = linear_in_features((LinearKind)k, C0), OC = linear_out_features((LinearKind)k, C0);
        w[k] = bf16_values(OC * C, 0.02f, 500 + k);
        wd[k] = to_device(to_bf(w[k]));
        lw.weight[k] = wd[k];
        seeds[k] = tcfp12_split_seed(r, k);
    }
    recipe_weights_changed(r, lw, 0);
    const Tcfp12Options o = r.options.split;
    for (int k : {(int)LIN_FC, (int)LIN_FCPROJ}) {
        const LinearId id{0, (LinearKind)k};
        const int C = linear_in_features(id.kind, C0), OC = linear_out_features(id.kind, C0);
        const std::string what = strfmt("%s: %s (N=%d C=%d OC=%d)", label, LINEAR_NAMES[k], N, C, OC);
        // the split the recipe made equals the CPU's
        std::vector<float> ef(r.use_ef ? (size_t)OC * C : 0, 0.0f), pd(o.pdds ? llmc::tcfp12_num_groups(OC, C, o.block_size) : 0, 0.0f);
        const Tcfp12Matrix m = llmc::tcfp12_split_matrix(w[k].data(), OC, C, o, r.use_ef ? ef.data() : nullptr,
                                                         o.pdds ? pd.data() : nullptr, seeds[k]);
        const size_t ng = m.hi_scale.size();
        size_t d = count_diff(to_host(r.hi + r.elem_offset[k], (size_t)OC * C), m.hi) +
                   count_diff(to_host(r.lo + r.elem_offset[k], (size_t)OC * C), m.lo) +
                   count_diff(to_host(r.hi_scale + r.group_offset[k], ng), m.hi_scale) +
                   count_diff(to_host(r.lo_scale + r.group_offset[k], ng), m.lo_scale);
        check(d == 0, "%s: the recipe's split equals the CPU reference (%zu differences)", what.c_str(), d);
        const std::vector<float> wfull = llmc::tcfp12_dequantize_matrix(m), whi = llmc::tcfp12_dequantize_matrix(m, true);
        // inputs
        const std::vector<float> x = bf16_values(N * C, 0.5f, 600 + k), dy = bf16_values(N * OC, 1e-3f, 700 + k);
        std::vector<float> bias(OC);
        for (int i = 0; i < OC; i++) bias[i] = bf2f(f2bf(0.05f * (i % 7) - 0.15f));
        floatX *xd = to_device(to_bf(x)), *dyd = to_device(to_bf(dy)), *bd = to_device(to_bf(bias));
        floatX *out, *pre, *dinp;
        cudaCheck(cudaMalloc(&out, (size_t)N * OC * sizeof(floatX)));
        cudaCheck(cudaMalloc(&pre, (size_t)N * OC * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dinp, (size_t)N * C * sizeof(floatX)));
        float *dw, *db;
        cudaCheck(cudaMalloc(&dw, (size_t)OC * C * sizeof(float)));
        cudaCheck(cudaMalloc(&db, (size_t)OC * sizeof(float)));
        cudaCheck(cudaMemset(dw, 0, (size_t)OC * C * sizeof(float)));
        cudaCheck(cudaMemset(db, 0, (size_t)OC * sizeof(float)));
        const std::vector<double> xq = host_quantize(x, false), dyq = host_quantize(dy, true);
        // float64 references
        std::vector<double> y_ref((size_t)N * OC), y_true((size_t)N * OC), dx_ref((size_t)N * C), dw_ref((size_t)OC * C),
            db_ref(OC, 0.0);
        for (int n = 0; n < N; n++)
            for (int oc = 0; oc < OC; oc++) {
                double s = 0, t = 0;
                for (int c = 0; c < C; c++) {
                    s += xq[(size_t)n * C + c] * wfull[(size_t)oc * C + c];
                    t += (double)x[(size_t)n * C + c] * w[k][(size_t)oc * C + c];
                }
                y_ref[(size_t)n * OC + oc] = s + bias[oc];
                y_true[(size_t)n * OC + oc] = t + bias[oc];
            }
        const std::vector<float>& wdg = o.abd ? whi : wfull;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int oc = 0; oc < OC; oc++) s += dyq[(size_t)n * OC + oc] * wdg[(size_t)oc * C + c];
                dx_ref[(size_t)n * C + c] = s;
            }
        for (int oc = 0; oc < OC; oc++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int n = 0; n < N; n++)
                    s += ro.tcfp_fp8_wgrad ? dyq[(size_t)n * OC + oc] * xq[(size_t)n * C + c]
                                           : (double)dy[(size_t)n * OC + oc] * x[(size_t)n * C + c];
                dw_ref[(size_t)oc * C + c] = s;
            }
        for (int n = 0; n < N; n++)
            for (int oc = 0; oc < OC; oc++) db_ref[oc] += dy[(size_t)n * OC + oc];
        // forward, plain and with the GELU epilogue
        linear_forward(r, id, out, xd, wd[k], bd, N, C, OC, true, 0);
        const std::vector<double> y = host_bf(out, (size_t)N * OC);
        double e = rel_l2(y, y_ref);
        check(e < 4e-3, "%s: forward (x W_lo^T + x W_hi^T + bias) against float64 of the dequantized operands: rel L2 %.2e",
              what.c_str(), e);
        e = rel_l2(y, y_true);
        check(e < 0.06, "%s: forward against the unquantized product: rel L2 %.3f (E4M3 x, near-exact W)", what.c_str(), e);
        linear_forward_gelu(r, id, out, pre, xd, wd[k], bd, N, C, OC, true, 0);
        // (with an FP8 wgrad the fc layer leaves its GELU output to the fc projection's forward: written
        // here for the check, as any other recipe call would)
        check((r.pending_gelu_out.out == out) == tcfp12_leaves_gelu_out(r, id, N, true),
              "%s: the GELU output is left unwritten exactly where the fc projection takes it over", what.c_str());
        tcfp12_write_gelu_out(r, 0);
        const std::vector<double> g = host_bf(out, (size_t)N * OC), p = host_bf(pre, (size_t)N * OC);
        std::vector<double> g_ref(y_ref.size());
        for (size_t i = 0; i < g_ref.size(); i++) g_ref[i] = gelu_tanh(y_ref[i]);
        e = std::max(rel_l2(g, g_ref), rel_l2(p, y_ref));
        check(e < 4e-3, "%s: forward with the GELU epilogue (output and pre-activation): rel L2 %.2e", what.c_str(), e);
        // backward (no GELU derivative: pre_gelu null)
        linear_backward(r, id, dinp, dw, db, dyd, xd, wd[k], nullptr, N, C, OC, 0);
        e = rel_l2(host_bf(dinp, (size_t)N * C), dx_ref);
        check(e < 4e-3, "%s: dgrad (%s) against float64: rel L2 %.2e", what.c_str(), o.abd ? "dy W_hi, ABD" : "dy W_lo + dy W_hi", e);
        const std::vector<float> dwh = to_host(dw, (size_t)OC * C), dbh = to_host(db, (size_t)OC);
        e = rel_l2(std::vector<double>(dwh.begin(), dwh.end()), dw_ref);
        check(e < (ro.tcfp_fp8_wgrad ? 5e-4 : 1e-4), "%s: wgrad (%s) against float64: rel L2 %.2e", what.c_str(), ro.tcfp_fp8_wgrad ? "E5M2 x E4M3" : "BF16", e);
        e = rel_l2(std::vector<double>(dbh.begin(), dbh.end()), db_ref);
        check(e < 1e-5, "%s: bias gradient: rel L2 %.2e", what.c_str(), e);
        cudaFree(xd); cudaFree(dyd); cudaFree(bd); cudaFree(out); cudaFree(pre); cudaFree(dinp); cudaFree(dw); cudaFree(db);
    }
    for (auto p : wd) cudaFree(p);
}

// The fc projection's backward with the GELU derivative, then the fc layer's backward, as the model runs
// them: the fused pass (gelu_backward_bias_partials: the derivative, the fc layer's dy column sums and
// amax in one pass) must give the same bits as gelu_backward and the fc layer reading its dy itself.
static void test_gelu_chain(const char* label, RecipeOptions ro, int channels) {
    ModelShape shape;
    shape.num_layers = 1; shape.channels = channels; shape.num_heads = 1;
    const int B = 2, T = 96, N = B * T, C = channels, H = 4 * channels;
    Recipe r;
    recipe_init(r, ro, shape, B, T);
    // (the amax passes first: with speculative scales and an FP8 wgrad the fc projection writes the fc
    // layer's dy codes instead, which test_speculative_scales covers)
    r.speculate = false;
    LinearWeights lw;
    const std::vector<floatX*> wd = layer_weights(C, 800, lw);
    recipe_weights_changed(r, lw, 0);
    floatX* x = to_device(to_bf(bf16_values(N * C, 0.5f, 901)));      // the fc layer's input
    floatX* pre = to_device(to_bf(bf16_values(N * H, 1.5f, 902)));    // its pre-activation
    floatX* h = to_device(to_bf(bf16_values(N * H, 0.3f, 903)));      // the GELU output (the fc projection's input)
    floatX* dy = to_device(to_bf(bf16_values(N * C, 1e-3f, 904)));   // the fc projection's output gradient
    floatX *dh, *dx;
    float *dw_proj, *dw_fc, *db_fc;
    cudaCheck(cudaMalloc(&dh, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dx, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dw_proj, (size_t)H * C * sizeof(float)));
    cudaCheck(cudaMalloc(&dw_fc, (size_t)H * C * sizeof(float)));
    cudaCheck(cudaMalloc(&db_fc, (size_t)H * sizeof(float)));
    std::vector<floatX> out_dh[2], out_dx[2];
    std::vector<float> out_dw[2], out_db[2];
    for (int way = 0; way < 2; way++) {
        cudaCheck(cudaMemset(dw_proj, 0, (size_t)H * C * sizeof(float)));
        cudaCheck(cudaMemset(dw_fc, 0, (size_t)H * C * sizeof(float)));
        cudaCheck(cudaMemset(db_fc, 0, (size_t)H * sizeof(float)));
        // the forward passes first (the recipe keeps their x scales for the FP8 wgrad)
        floatX *y, *g;
        cudaCheck(cudaMalloc(&y, (size_t)N * H * sizeof(floatX)));
        cudaCheck(cudaMalloc(&g, (size_t)N * C * sizeof(floatX)));
        linear_forward(r, {0, LIN_FC}, y, x, wd[LIN_FC], nullptr, N, C, H, true, 0);
        linear_forward(r, {0, LIN_FCPROJ}, g, h, wd[LIN_FCPROJ], nullptr, N, H, C, true, 0);
        if (way == 0) {
            linear_backward(r, {0, LIN_FCPROJ}, dh, dw_proj, nullptr, dy, h, wd[LIN_FCPROJ], pre, N, H, C, 0);
        } else {
            linear_backward(r, {0, LIN_FCPROJ}, dh, dw_proj, nullptr, dy, h, wd[LIN_FCPROJ], nullptr, N, H, C, 0);
            gelu_backward(dh, pre, (long long)N * H, 0);
        }
        linear_backward(r, {0, LIN_FC}, dx, dw_fc, db_fc, dh, x, wd[LIN_FC], nullptr, N, C, H, 0);
        out_dh[way] = to_host(dh, (size_t)N * H);
        out_dx[way] = to_host(dx, (size_t)N * C);
        out_dw[way] = to_host(dw_fc, (size_t)H * C);
        out_db[way] = to_host(db_fc, (size_t)H);
        cudaFree(y); cudaFree(g);
    }
    auto same = [](const void* a, const void* b, size_t bytes) { return memcmp(a, b, bytes) == 0; };
    check(same(out_dh[0].data(), out_dh[1].data(), out_dh[0].size() * sizeof(floatX)),
          "%s: the fused GELU pass writes gelu_backward's bits (fc dy, %d x %d)", label, N, H);
    check(same(out_db[0].data(), out_db[1].data(), out_db[0].size() * sizeof(float)),
          "%s: the fc bias gradient from the fused pass's sums equals bias_backward's, bit for bit", label);
    check(same(out_dx[0].data(), out_dx[1].data(), out_dx[0].size() * sizeof(floatX)),
          "%s: the fc dgrad with the fused pass's amax (dy scale) equals the unfused one, bit for bit", label);
    check(same(out_dw[0].data(), out_dw[1].data(), out_dw[0].size() * sizeof(float)),
          "%s: the fc wgrad equals the unfused one, bit for bit", label);
    for (auto p : wd) cudaFree(p);
    cudaFree(x); cudaFree(pre); cudaFree(h); cudaFree(dy); cudaFree(dh); cudaFree(dx);
    cudaFree(dw_proj); cudaFree(dw_fc); cudaFree(db_fc);
}

// The fc layer's GELU output left to the fc projection's forward (Recipe::pending_gelu_out: -tfw 1 in
// training, and evaluation): the fc projection's output, its E4M3 codes (rows, or both K-halves) and x^T
// codes where saved, and its input amax, bit for bit those of writing the GELU output first
// (gelu_forward) and quantizing that. expect_left: whether this setting leaves the GELU output.
static void test_gelu_forward_chain(const char* label, RecipeOptions ro, int channels, int concat_mode, bool training,
                                    bool expect_left) {
    ModelShape shape;
    shape.num_layers = 1; shape.channels = channels; shape.num_heads = 1;
    const int B = 2, T = 96, N = B * T, C = channels, H = 4 * channels;
    Recipe r;
    recipe_init(r, ro, shape, B, T);
    r.concat_mode = concat_mode;
    LinearWeights lw;
    const std::vector<floatX*> wd = layer_weights(C, 810, lw);
    recipe_weights_changed(r, lw, 0);
    floatX* x = to_device(to_bf(bf16_values(N * C, 1.0f, 911)));     // the fc layer's input
    floatX* bias = to_device(to_bf(bf16_values(H, 0.1f, 912)));
    floatX *h, *pre, *y;
    cudaCheck(cudaMalloc(&h, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&pre, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&y, (size_t)N * C * sizeof(floatX)));
    const LinearId fc{0, LIN_FC}, proj{0, LIN_FCPROJ};
    const int li = tcfp_linear_index(proj);
    const bool cat = concat_mode == 1 && r.concat, saves_xt = training && tcfp12_saves_xt(r, proj, N);
    std::vector<floatX> ys[2];
    std::vector<uint8_t> codes[2], xt[2];
    std::vector<uint32_t> amax[2];
    bool left = false, consumed = false;
    for (int way = 0; way < 2; way++) {
        cudaCheck(cudaMemset(h, 0xFF, (size_t)N * H * sizeof(floatX))); // NaN: a read of an unwritten GELU output shows
        linear_forward_gelu(r, fc, h, pre, x, wd[LIN_FC], bias, N, C, H, training, 0);
        if (way == 0) left = r.pending_gelu_out.out == h;
        else tcfp12_write_gelu_out(r, 0); // the GELU output written first: the plain path
        linear_forward(r, proj, y, h, wd[LIN_FCPROJ], nullptr, N, H, C, training, 0);
        if (way == 0) consumed = r.pending_gelu_out.out == nullptr;
        cudaCheck(cudaDeviceSynchronize());
        ys[way] = to_host(y, (size_t)N * C);
        if (r.emulated) { // (the block modes: x as the BF16 values of its codes)
            const std::vector<floatX> q = to_host(r.xq, (size_t)N * H);
            codes[way].assign((const uint8_t*)q.data(), (const uint8_t*)q.data() + q.size() * sizeof(floatX));
        } else {
            codes[way] = cat ? to_host(r.xcat, (size_t)N * 2 * H) : to_host(r.x8, (size_t)N * H);
        }
        if (saves_xt) xt[way] = to_host(tcfp12_saved_xt(r, li), (size_t)N * H);
        amax[way] = to_host(tcfp_act_amax(r, li, TCFP_X, training), 1);
    }
    check(left == expect_left && consumed, "%s: the fc layer %s its GELU output to the fc projection", label,
          expect_left ? "leaves" : "does not leave");
    check(memcmp(ys[0].data(), ys[1].data(), ys[0].size() * sizeof(floatX)) == 0 && codes[0] == codes[1] &&
              xt[0] == xt[1] && amax[0] == amax[1] && amax[0][0] != 0u,
          "%s: the fc projection quantizing GELU(pre) itself = gelu_forward + the plain passes, bit for bit (output, "
          "%s codes%s, amax)", label, cat ? "K-concatenated" : "row", saves_xt ? ", x^T codes" : "");
    for (auto p : wd) cudaFree(p);
    cudaFree(x); cudaFree(bias); cudaFree(h); cudaFree(pre); cudaFree(y);
}

// Speculative fresh scales (recipes/tcfp12/recipe.h): a recipe that speculates and one that runs the amax passes
// first (Recipe::speculate false) give the same bits for every output, gradient, scale and amax of the four
// linears of a layer run as the model runs them, on three calls: the first misses (the slots are empty),
// the second hits (the same data), the third misses again (the data 8x larger: a new power of two). The
// bias gradients, whose column sums come from other passes, agree to float rounding. The speculating
// recipe counts one speculative pass per tensor and call, and a second pass on exactly the misses.
static void test_speculative_scales(const char* label, RecipeOptions ro, int channels, int concat_mode) {
    ModelShape shape;
    shape.num_layers = 1; shape.channels = channels; shape.num_heads = 1;
    const int B = 2, T = 96, N = B * T, C = channels, H = 4 * channels;
    LinearWeights lw;
    const std::vector<floatX*> wd = layer_weights(C, 820, lw);
    const std::vector<floatX*> bd = layer_biases(C, 830);
    Recipe rs[2];
    init_speculating_and_not(rs, ro, shape, B, T, concat_mode, lw);
    const int OCs[NUM_LINEAR_KINDS] = {3 * C, C, H, C}; // qkv, attproj, fc, fcproj
    const int ICs[NUM_LINEAR_KINDS] = {C, C, C, H};
    floatX *xin, *h, *pre, *d_h;
    cudaCheck(cudaMalloc(&xin, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&h, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&pre, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_h, (size_t)N * H * sizeof(floatX)));
    std::vector<floatX*> out(NUM_LINEAR_KINDS), dy(NUM_LINEAR_KINDS), dx(NUM_LINEAR_KINDS);
    std::vector<float*> dw(NUM_LINEAR_KINDS), db(NUM_LINEAR_KINDS);
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
        cudaCheck(cudaMalloc(&out[k], (size_t)N * OCs[k] * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dy[k], (size_t)N * OCs[k] * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dx[k], (size_t)N * ICs[k] * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dw[k], (size_t)OCs[k] * ICs[k] * sizeof(float)));
        cudaCheck(cudaMalloc(&db[k], (size_t)OCs[k] * sizeof(float)));
    }
    const std::vector<float> x_host = bf16_values(N * C, 1.0f, 840);
    std::vector<std::vector<float>> dy_host(NUM_LINEAR_KINDS);
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) dy_host[k] = bf16_values(N * OCs[k], 1e-3f, 850 + k);
    const char* call_names[3] = {"first call (miss)", "same data (hit)", "data x8 (miss)"};
    for (int call = 0; call < 3; call++) {
        const float scale = call == 2 ? 8.0f : 1.0f; // (a power of two: the BF16 inputs stay exact)
        std::vector<float> xs = x_host;
        for (auto& v : xs) v *= scale;
        const std::vector<floatX> xs_bf = to_bf(xs);
        std::vector<std::vector<uint8_t>> got[2]; // per way: every output's bytes, in one order
        std::vector<std::vector<float>> bias[2];
        for (int way = 0; way < 2; way++) {
            Recipe& r = rs[way];
            cudaCheck(cudaMemcpy(xin, xs_bf.data(), xs_bf.size() * sizeof(floatX), cudaMemcpyHostToDevice));
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                std::vector<float> d = dy_host[k];
                for (auto& v : d) v *= scale;
                const std::vector<floatX> d_bf = to_bf(d);
                cudaCheck(cudaMemcpy(dy[k], d_bf.data(), d_bf.size() * sizeof(floatX), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemset(dw[k], 0, (size_t)OCs[k] * ICs[k] * sizeof(float)));
                cudaCheck(cudaMemset(db[k], 0, (size_t)OCs[k] * sizeof(float)));
            }
            // the model's order: forward qkv, attproj, fc (GELU), fcproj; backward fcproj, fc, attproj, qkv
            linear_forward(r, {0, LIN_QKV}, out[LIN_QKV], xin, wd[LIN_QKV], bd[LIN_QKV], N, C, 3 * C, true, 0);
            linear_forward(r, {0, LIN_ATTPROJ}, out[LIN_ATTPROJ], xin, wd[LIN_ATTPROJ], bd[LIN_ATTPROJ], N, C, C, true, 0);
            linear_forward_gelu(r, {0, LIN_FC}, h, pre, xin, wd[LIN_FC], bd[LIN_FC], N, C, H, true, 0);
            linear_forward(r, {0, LIN_FCPROJ}, out[LIN_FCPROJ], h, wd[LIN_FCPROJ], bd[LIN_FCPROJ], N, H, C, true, 0);
            linear_backward(r, {0, LIN_FCPROJ}, d_h, dw[LIN_FCPROJ], db[LIN_FCPROJ], dy[LIN_FCPROJ], h, wd[LIN_FCPROJ], pre,
                            N, H, C, 0);
            linear_backward(r, {0, LIN_FC}, dx[LIN_FC], dw[LIN_FC], db[LIN_FC], d_h, xin, wd[LIN_FC], nullptr, N, C, H, 0);
            linear_backward(r, {0, LIN_ATTPROJ}, dx[LIN_ATTPROJ], dw[LIN_ATTPROJ], db[LIN_ATTPROJ], dy[LIN_ATTPROJ], xin,
                            wd[LIN_ATTPROJ], nullptr, N, C, C, 0);
            linear_backward(r, {0, LIN_QKV}, dx[LIN_QKV], dw[LIN_QKV], db[LIN_QKV], dy[LIN_QKV], xin, wd[LIN_QKV], nullptr,
                            N, C, 3 * C, 0);
            cudaCheck(cudaDeviceSynchronize());
            auto add = [&](const void* d, size_t bytes) { keep_bytes(got[way], d, bytes); };
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                add(out[k], (size_t)N * OCs[k] * sizeof(floatX));
                if (k != LIN_FC) add(dx[k], (size_t)N * ICs[k] * sizeof(floatX)); // (fc's dx: below, with the others)
                add(dw[k], (size_t)OCs[k] * ICs[k] * sizeof(float));
                for (int role = 0; role < NUM_TCFP_ACT_ROLES; role++) {
                    add(tcfp_act_slot(r, k, (TcfpActRole)role, true), TCFP_SCALE_SLOT * sizeof(float));
                    add(tcfp_act_amax(r, k, (TcfpActRole)role, true), sizeof(uint32_t));
                }
                bias[way].push_back(to_host(db[k], (size_t)OCs[k]));
            }
            add(dx[LIN_FC], (size_t)N * C * sizeof(floatX));
            add(pre, (size_t)N * H * sizeof(floatX));
        }
        size_t bad = 0;
        for (size_t i = 0; i < got[0].size(); i++) bad += got[0][i] != got[1][i];
        check(bad == 0, "%s, %s: speculative scales = the amax passes first, bit for bit (outputs, dx, dW, scales, amax; "
              "%zu of %zu tensors differ)", label, call_names[call], bad, got[0].size());
        const double worst = worst_rel_l2(bias[0], bias[1]);
        check(worst < 1e-5, "%s, %s: the bias gradients agree (worst rel L2 %.2e)", label, call_names[call], worst);
        const std::vector<unsigned long long> c =
            to_host(rs[0].spec_counts, (size_t)rs[0].num_linears * NUM_TCFP_ACT_ROLES * 2);
        // (the qkv layer's dy guesses its scale from the attention projection's dy, times the last ratio of the
        // two, tcfp12_predict_scale: both grow 8x exactly, so the third call is no miss for it. The fc layer's
        // dy guesses from the fc projection's, but its GELU derivative moves with the 8x input and the bias:
        // either may happen there.)
        int speculated = 0;
        bool counted = true;
        for (size_t i = 0; i + 1 < c.size(); i += 2) {
            if (c[i] == 0) continue;
            const int k = (int)(i / 2) / NUM_TCFP_ACT_ROLES, role = (int)(i / 2) % NUM_TCFP_ACT_ROLES;
            const unsigned long long misses = call < 2 || (role == TCFP_DY && k == LIN_QKV) ? 1 : 2;
            const bool either = call == 2 && role == TCFP_DY && k == LIN_FC;
            speculated += 1;
            counted = counted && c[i] == (unsigned long long)(call + 1) && (c[i + 1] == misses || (either && c[i + 1] == 1));
        }
        check(counted && speculated >= 4, "%s, %s: %d tensors speculated, each once per call, redone exactly on the misses "
              "(the qkv layer's guessed dy: only on the first call)", label, call_names[call], speculated);
    }
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
        cudaFree(wd[k]); cudaFree(bd[k]); cudaFree(out[k]); cudaFree(dy[k]); cudaFree(dx[k]); cudaFree(dw[k]); cudaFree(db[k]);
    }
    cudaFree(xin); cudaFree(h); cudaFree(pre); cudaFree(d_h);
}

// The qkv layer's input written by the LayerNorm as E4M3 codes under a speculative scale
// (recipe_site_output, then recipe_site_again and the LayerNorm once more under the flag), against
// the LayerNorm writing BF16 and the linear quantizing it (Recipe::speculate false): the same forward output,
// weight gradient (from the saved x^T codes), input scale and amax, bit for bit, on a first call (a miss),
// the same data (a hit) and LayerNorm weights 8x larger (a miss); the BF16 output is never read.
static void test_layernorm_input_codes(const char* label, RecipeOptions ro, int channels, int concat_mode) {
    ModelShape shape;
    shape.num_layers = 1; shape.channels = channels; shape.num_heads = 1;
    const int B = 2, T = 96, N = B * T, C = channels, OC = 3 * C;
    const LinearId id{0, LIN_QKV};
    LinearWeights lw;
    const std::vector<floatX*> wd = layer_weights(C, 860, lw);
    Recipe rs[2];
    init_speculating_and_not(rs, ro, shape, B, T, concat_mode, lw);
    check(tcfp12_input_as_codes(rs[0], id, N, true) && !tcfp12_input_as_codes(rs[1], id, N, true),
          "%s: the LayerNorm writes the qkv input's codes exactly where the recipe speculates", label);
    std::vector<float> resid_h = bf16_values(N * C, 1.0f, 870);
    for (size_t i = 0; i < resid_h.size(); i++) resid_h[i] += 0.25f * (float)(i % 7);
    float* resid = to_device(resid_h);
    floatX *bq = to_device(to_bf(bf16_values(OC, 0.1f, 871))), *dy = to_device(to_bf(bf16_values(N * OC, 1e-3f, 872)));
    floatX *ln, *out, *dx;
    float *mean, *rstd, *dw, *db;
    cudaCheck(cudaMalloc(&ln, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out, (size_t)N * OC * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dx, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&mean, N * sizeof(float)));
    cudaCheck(cudaMalloc(&rstd, N * sizeof(float)));
    cudaCheck(cudaMalloc(&dw, (size_t)OC * C * sizeof(float)));
    cudaCheck(cudaMalloc(&db, OC * sizeof(float)));
    const char* call_names[3] = {"first call (miss)", "same data (hit)", "LayerNorm weights x8 (miss)"};
    for (int call = 0; call < 3; call++) {
        const float wscale = call == 2 ? 8.0f : 1.0f;
        std::vector<float> lnw = bf16_values(C, 0.2f, 873), lnb = bf16_values(C, 0.1f, 874);
        for (int c = 0; c < C; c++) { lnw[c] = (1.0f + lnw[c]) * wscale; lnb[c] *= wscale; }
        floatX *w = to_device(to_bf(lnw)), *b = to_device(to_bf(lnb));
        std::vector<std::vector<uint8_t>> got[2];
        for (int way = 0; way < 2; way++) {
            Recipe& r = rs[way];
            cudaCheck(cudaMemset(ln, 0xFF, (size_t)N * C * sizeof(floatX))); // NaN: a read of an unwritten x shows
            cudaCheck(cudaMemset(dw, 0, (size_t)OC * C * sizeof(float)));
            cudaCheck(cudaMemset(db, 0, OC * sizeof(float)));
            layernorm_forward(ln, mean, rstd, resid, w, b, N, C, 0, recipe_site_output(r, SITE_LAYERNORM_OUTPUT, id, N, C, true, 0));
            const Fp8Target redo = recipe_site_again(r, SITE_LAYERNORM_OUTPUT, id, 0);
            check(redo.active() == (way == 0), "%s, %s: a redo target exactly where the LayerNorm wrote codes", label,
                  call_names[call]);
            if (redo.active()) layernorm_forward(ln, mean, rstd, resid, w, b, N, C, 0, redo);
            linear_forward(r, id, out, ln, wd[LIN_QKV], bq, N, C, OC, true, 0);
            linear_backward(r, id, dx, dw, db, dy, ln, wd[LIN_QKV], nullptr, N, C, OC, 0);
            cudaCheck(cudaDeviceSynchronize());
            auto add = [&](const void* d, size_t bytes) { keep_bytes(got[way], d, bytes); };
            add(out, (size_t)N * OC * sizeof(floatX));
            add(dx, (size_t)N * C * sizeof(floatX));
            add(dw, (size_t)OC * C * sizeof(float));
            add(tcfp_act_slot(r, 0, TCFP_X, true), TCFP_SCALE_SLOT * sizeof(float));
            add(tcfp_act_amax(r, 0, TCFP_X, true), sizeof(uint32_t));
            add(mean, N * sizeof(float));
            add(rstd, N * sizeof(float));
        }
        size_t bad = 0;
        for (size_t i = 0; i < got[0].size(); i++) bad += got[0][i] != got[1][i];
        const std::vector<unsigned long long> c = to_host(tcfp_spec_counts(rs[0], 0, TCFP_X), 2);
        const unsigned long long misses = call == 0 ? 1 : call == 1 ? 1 : 2;
        check(bad == 0 && c[0] == (unsigned long long)(call + 1) && c[1] == misses,
              "%s, %s: the LayerNorm's speculative E4M3 codes = the BF16 LayerNorm + the quantize pass, bit for bit "
              "(output, dx, dW from x^T, scale, amax, mean, rstd: %zu of %zu differ); %llu checks, %llu redone", label,
              call_names[call], bad, got[0].size(), c[0], c[1]);
        cudaFree(w); cudaFree(b);
    }
    for (auto p : wd) cudaFree(p);
    cudaFree(resid); cudaFree(bq); cudaFree(dy); cudaFree(ln); cudaFree(out); cudaFree(dx); cudaFree(mean); cudaFree(rstd);
    cudaFree(dw); cudaFree(db);
}

// The attention and fc projections' output gradient written by the LayerNorm backward as E5M2 codes under a
// speculative scale (recipe_site_output, then recipe_site_again and layernorm_backward_codes_again
// under the flag), against the LayerNorm backward writing BF16 and the linear quantizing it (Recipe::speculate
// false). One layer, in the model's order: the final LayerNorm's backward hands the fc projection its dy (no
// guess: it keeps its last use's scale), the fc projection and fc layer run backward, the second LayerNorm's
// backward hands the attention projection its dy (guessed from the fc projection's times the last ratio), then
// the attention projection and the qkv layer. Every output, dx, dW, the residual gradient, the LayerNorms' and
// the projections' bias gradients, scale and amax agree bit for bit, on a first call (a miss), the same data
// (a hit) and the gradients 8x larger (a miss for the fc projection; the guessed one moves with its reference).
// with_codes: whether the options let the LayerNorm write codes (an FP8 wgrad, and ABD or no K-concatenated form).
static void test_layernorm_gradient_codes(const char* label, RecipeOptions ro, int channels, int concat_mode, bool with_codes) {
    ModelShape shape;
    shape.num_layers = 1; shape.channels = channels; shape.num_heads = 1;
    const int B = 2, T = 96, N = B * T, C = channels, H = 4 * channels;
    const LinearId attproj{0, LIN_ATTPROJ}, fcproj{0, LIN_FCPROJ};
    LinearWeights lw;
    const std::vector<floatX*> wd = layer_weights(C, 880, lw);
    const std::vector<floatX*> bd = layer_biases(C, 890);
    Recipe rs[2];
    init_speculating_and_not(rs, ro, shape, B, T, concat_mode, lw);
    check(tcfp12_projection_dy_as_codes(rs[0], attproj, N) == with_codes &&
          tcfp12_projection_dy_as_codes(rs[0], fcproj, N) == with_codes &&
          !tcfp12_projection_dy_as_codes(rs[1], attproj, N) && !tcfp12_projection_dy_as_codes(rs[0], {0, LIN_FC}, N),
          "%s: the LayerNorm backward writes the projections' dy codes exactly where the recipe speculates with an FP8 "
          "wgrad (%s here)", label, with_codes ? "codes" : "no codes");
    const int OCs[NUM_LINEAR_KINDS] = {3 * C, C, H, C}; // qkv, attproj, fc, fcproj
    const int ICs[NUM_LINEAR_KINDS] = {C, C, C, H};
    floatX *xin, *h, *pre, *d_h, *ln, *dres_x, *lnw, *lnb, *dln[2];
    float *resid, *mean, *rstd, *dres, *scratch, *lndw, *lndb;
    cudaCheck(cudaMalloc(&xin, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&h, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&pre, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_h, (size_t)N * H * sizeof(floatX)));
    cudaCheck(cudaMalloc(&ln, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dres_x, (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dln[0], (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dln[1], (size_t)N * C * sizeof(floatX)));
    cudaCheck(cudaMalloc(&mean, N * sizeof(float)));
    cudaCheck(cudaMalloc(&rstd, N * sizeof(float)));
    cudaCheck(cudaMalloc(&dres, (size_t)N * C * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, layernorm_backward_scratch_floats(C) * sizeof(float)));
    cudaCheck(cudaMalloc(&lndw, 2 * C * sizeof(float)));
    cudaCheck(cudaMalloc(&lndb, 2 * C * sizeof(float)));
    std::vector<float> resid_h = bf16_values(N * C, 1.0f, 895);
    for (size_t i = 0; i < resid_h.size(); i++) resid_h[i] += 0.25f * (float)(i % 5);
    resid = to_device(resid_h);
    lnw = to_device(to_bf(bf16_values(C, 0.2f, 896)));
    lnb = to_device(to_bf(bf16_values(C, 0.1f, 897)));
    layernorm_forward(ln, mean, rstd, resid, lnw, lnb, N, C, 0); // (mean and rstd for the backward)
    std::vector<floatX*> out(NUM_LINEAR_KINDS), dx(NUM_LINEAR_KINDS);
    std::vector<float*> dw(NUM_LINEAR_KINDS), db(NUM_LINEAR_KINDS);
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
        cudaCheck(cudaMalloc(&out[k], (size_t)N * OCs[k] * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dx[k], (size_t)N * ICs[k] * sizeof(floatX)));
        cudaCheck(cudaMalloc(&dw[k], (size_t)OCs[k] * ICs[k] * sizeof(float)));
        cudaCheck(cudaMalloc(&db[k], (size_t)OCs[k] * sizeof(float)));
    }
    const std::vector<floatX> x_bf = to_bf(bf16_values(N * C, 1.0f, 898));
    const std::vector<float> dres0 = bf16_values(N * C, 1e-3f, 899);
    const std::vector<float> dln0[2] = {bf16_values(N * C, 1e-3f, 900), bf16_values(N * C, 1e-3f, 901)};
    const char* call_names[3] = {"first call (miss)", "same data (hit)", "gradients x8 (miss)"};
    for (int call = 0; call < 3; call++) {
        const float scale = call == 2 ? 8.0f : 1.0f; // (a power of two: every gradient scales exactly)
        std::vector<std::vector<uint8_t>> got[2];
        std::vector<std::vector<float>> bias[2];
        for (int way = 0; way < 2; way++) {
            Recipe& r = rs[way];
            cudaCheck(cudaMemcpy(xin, x_bf.data(), x_bf.size() * sizeof(floatX), cudaMemcpyHostToDevice));
            std::vector<float> d = dres0;
            for (auto& v : d) v *= scale;
            cudaCheck(cudaMemcpy(dres, d.data(), d.size() * sizeof(float), cudaMemcpyHostToDevice));
            for (int j = 0; j < 2; j++) {
                std::vector<float> e = dln0[j];
                for (auto& v : e) v *= scale;
                const std::vector<floatX> e_bf = to_bf(e);
                cudaCheck(cudaMemcpy(dln[j], e_bf.data(), e_bf.size() * sizeof(floatX), cudaMemcpyHostToDevice));
            }
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                cudaCheck(cudaMemset(dw[k], 0, (size_t)OCs[k] * ICs[k] * sizeof(float)));
                cudaCheck(cudaMemset(db[k], 0, (size_t)OCs[k] * sizeof(float)));
            }
            cudaCheck(cudaMemset(lndw, 0, 2 * C * sizeof(float)));
            cudaCheck(cudaMemset(lndb, 0, 2 * C * sizeof(float)));
            linear_forward(r, {0, LIN_QKV}, out[LIN_QKV], xin, wd[LIN_QKV], bd[LIN_QKV], N, C, 3 * C, true, 0);
            linear_forward(r, attproj, out[LIN_ATTPROJ], xin, wd[LIN_ATTPROJ], bd[LIN_ATTPROJ], N, C, C, true, 0);
            linear_forward_gelu(r, {0, LIN_FC}, h, pre, xin, wd[LIN_FC], bd[LIN_FC], N, C, H, true, 0);
            linear_forward(r, fcproj, out[LIN_FCPROJ], h, wd[LIN_FCPROJ], bd[LIN_FCPROJ], N, H, C, true, 0);
            // backward; dres_x is NaN before each LayerNorm backward: a read of an unwritten dy shows
            for (int j = 0; j < 2; j++) {
                const LinearId proj = j == 0 ? fcproj : attproj;
                cudaCheck(cudaMemset(dres_x, 0xFF, (size_t)N * C * sizeof(floatX)));
                const Fp8Target t = recipe_site_output(r, SITE_LAYERNORM_BACKWARD_OUTPUT, proj, N, C, true, 0);
                check(t.active() == (with_codes && way == 0), "%s, %s: codes asked of the LayerNorm backward exactly where "
                      "they should be (%s)", label, call_names[call], LINEAR_NAMES[proj.kind]);
                layernorm_backward(dres, dres_x, lndw + j * C, lndb + j * C, scratch, dln[j], resid, lnw, mean, rstd, N, C, 0,
                                   1.0f, db[proj.kind], t);
                const Fp8Target redo = recipe_site_again(r, SITE_LAYERNORM_BACKWARD_OUTPUT, proj, 0);
                check(redo.active() == t.active(), "%s, %s: a redo target exactly where the LayerNorm backward wrote codes",
                      label, call_names[call]);
                if (redo.active()) layernorm_backward_codes_again(redo, dres, N, C, 1.0f, 0);
                if (j == 0) {
                    linear_backward(r, fcproj, d_h, dw[LIN_FCPROJ], nullptr, dres_x, h, wd[LIN_FCPROJ], pre, N, H, C, 0);
                    linear_backward(r, {0, LIN_FC}, dx[LIN_FC], dw[LIN_FC], db[LIN_FC], d_h, xin, wd[LIN_FC], nullptr, N, C, H, 0);
                } else {
                    linear_backward(r, attproj, dx[LIN_ATTPROJ], dw[LIN_ATTPROJ], nullptr, dres_x, xin, wd[LIN_ATTPROJ], nullptr,
                                    N, C, C, 0);
                    linear_backward(r, {0, LIN_QKV}, dx[LIN_QKV], dw[LIN_QKV], db[LIN_QKV], out[LIN_QKV], xin, wd[LIN_QKV],
                                    nullptr, N, C, 3 * C, 0);
                }
            }
            cudaCheck(cudaDeviceSynchronize());
            auto add = [&](const void* d, size_t bytes) { keep_bytes(got[way], d, bytes); };
            for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
                add(out[k], (size_t)N * OCs[k] * sizeof(floatX));
                if (k != LIN_FC) add(dx[k], (size_t)N * ICs[k] * sizeof(floatX));
                add(dw[k], (size_t)OCs[k] * ICs[k] * sizeof(float));
                // (the projections' bias gradients come from the LayerNorm backward both ways; the qkv and fc
                // layers' are summed in another order by the speculative passes: compared below, to rounding)
                if (k == LIN_ATTPROJ || k == LIN_FCPROJ) add(db[k], (size_t)OCs[k] * sizeof(float));
                else bias[way].push_back(to_host(db[k], (size_t)OCs[k]));
                for (int role = 0; role < NUM_TCFP_ACT_ROLES; role++) {
                    add(tcfp_act_slot(r, k, (TcfpActRole)role, true), TCFP_SCALE_SLOT * sizeof(float));
                    add(tcfp_act_amax(r, k, (TcfpActRole)role, true), sizeof(uint32_t));
                }
            }
            add(dx[LIN_FC], (size_t)N * C * sizeof(floatX));
            add(dres, (size_t)N * C * sizeof(float));
            add(lndw, 2 * C * sizeof(float));
            add(lndb, 2 * C * sizeof(float));
        }
        size_t bad = 0;
        for (size_t i = 0; i < got[0].size(); i++) bad += got[0][i] != got[1][i];
        check(bad == 0, "%s, %s: the LayerNorm backward's speculative E5M2 codes = its BF16 output + the quantize pass, bit "
              "for bit (outputs, dx, dW, bias gradients, residual gradient, LayerNorm dw / db, scales, amax: %zu of %zu "
              "differ)", label, call_names[call], bad, got[0].size());
        const double worst = worst_rel_l2(bias[0], bias[1]);
        check(worst < 1e-5, "%s, %s: the qkv and fc bias gradients agree (worst rel L2 %.2e)", label, call_names[call], worst);
        if (with_codes) {
            const std::vector<unsigned long long> f = to_host(tcfp_spec_counts(rs[0], LIN_FCPROJ, TCFP_DY), 2);
            const std::vector<unsigned long long> a = to_host(tcfp_spec_counts(rs[0], LIN_ATTPROJ, TCFP_DY), 2);
            const unsigned long long n = call + 1, fc_misses = call == 0 ? 1 : call == 1 ? 1 : 2;
            check(f[0] == n && f[1] == fc_misses && a[0] == n && a[1] == 1,
                  "%s, %s: each projection's dy checked once per call; the fc projection's (the last use's scale) redone "
                  "on the misses (%llu of %llu), the attention projection's (guessed) only on the first call (%llu of %llu)",
                  label, call_names[call], f[1], f[0], a[1], a[0]);
        }
    }
    for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
        cudaFree(wd[k]); cudaFree(bd[k]); cudaFree(out[k]); cudaFree(dx[k]); cudaFree(dw[k]); cudaFree(db[k]);
    }
    for (void* p : {(void*)xin, (void*)h, (void*)pre, (void*)d_h, (void*)ln, (void*)dres_x, (void*)lnw, (void*)lnb, (void*)dln[0],
                    (void*)dln[1], (void*)resid, (void*)mean, (void*)rstd, (void*)dres, (void*)scratch, (void*)lndw, (void*)lndb})
        cudaFree(p);
}

// ---- ZeRO-1 on one GPU: the EF buffer in pieces ----------------------------------------------------
// P host threads (2 to 4) play P processes, each with its own stream and its own recipe (owner q of P,
// recipes/tcfp12/recipe.h: tcfp12_split_pieces); recipe_api.h's CrossProcess collectives meet in host memory: each
// thread copies its buffer out, waits for the others, combines them in rank order and copies the result
// back. Against one recipe that owns everything, over consecutive splits of changing weights, the codes
// and scale codes of both processes, each process's EF pieces, the PDDS state and the split's statistics
// must be bit-identical (the two sums of doubles within 1e-12); a process's state file round-trips, and
// a whole buffer's state is refused by a process that keeps a piece.
struct HostGroup {
    int size = 2;                   // the threads (set before they start)
    std::mutex m;
    std::condition_variable cv;
    int arrived = 0;
    long long generation = 0;
    std::vector<std::vector<uint8_t>> slot = std::vector<std::vector<uint8_t>>(4); // per thread (at most 4)
    void wait() { // every thread arrives before any leaves
        std::unique_lock<std::mutex> lock(m);
        const long long g = generation;
        if (++arrived == size) { arrived = 0; generation++; cv.notify_all(); }
        else cv.wait(lock, [&] { return generation != g; });
    }
};
static HostGroup g_host_group;
static thread_local int t_rank = 0;
static thread_local int t_collectives = 0;

template <typename T, typename Combine>
static void host_all_reduce(T* x, size_t n, cudaStream_t st, Combine combine) {
    HostGroup& g = g_host_group;
    t_collectives++;
    g.slot[t_rank].resize(n * sizeof(T));
    cudaCheck(cudaMemcpyAsync(g.slot[t_rank].data(), x, n * sizeof(T), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaStreamSynchronize(st));
    g.wait();
    std::vector<T> out(n);
    memcpy(out.data(), g.slot[0].data(), n * sizeof(T));
    for (int q = 1; q < g.size; q++)
        for (size_t i = 0; i < n; i++) out[i] = combine(out[i], ((const T*)g.slot[q].data())[i]);
    g.wait(); // (all have read the slots)
    cudaCheck(cudaMemcpyAsync(x, out.data(), n * sizeof(T), cudaMemcpyHostToDevice, st));
    cudaCheck(cudaStreamSynchronize(st));
}

static void host_all_gather_pieces(void*, uint8_t* const* bufs, const size_t* piece_bytes, int count, cudaStream_t st) {
    HostGroup& g = g_host_group;
    t_collectives++;
    size_t total = 0;
    for (int i = 0; i < count; i++) total += piece_bytes[i];
    g.slot[t_rank].resize(total);
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        cudaCheck(cudaMemcpyAsync(g.slot[t_rank].data() + at, bufs[i] + (size_t)t_rank * piece_bytes[i], piece_bytes[i],
                                  cudaMemcpyDeviceToHost, st));
        at += piece_bytes[i];
    }
    cudaCheck(cudaStreamSynchronize(st));
    g.wait();
    for (int q = 0; q < g.size; q++) {
        if (q == t_rank) continue;
        at = 0;
        for (int i = 0; i < count; i++) {
            cudaCheck(cudaMemcpyAsync(bufs[i] + (size_t)q * piece_bytes[i], g.slot[q].data() + at, piece_bytes[i],
                                      cudaMemcpyHostToDevice, st));
            at += piece_bytes[i];
        }
    }
    cudaCheck(cudaStreamSynchronize(st));
    g.wait();
}

static void test_ef_pieces(const char* label, RecipeOptions ro, int channels, int layers, int splits, int P = 2) {
    ModelShape shape;
    shape.num_layers = layers; shape.channels = channels; shape.num_heads = 1;
    const int B = 2, T = 64;
    if (P < 2 || P > 4 || channels % P != 0) { check(false, "%s: internal: %d processes for %d channels", label, P, channels); return; }
    g_host_group.size = P;
    g_cross_process.all_reduce_max_u32 = [](void*, uint32_t* x, size_t n, cudaStream_t st) {
        host_all_reduce(x, n, st, [](uint32_t a, uint32_t b) { return std::max(a, b); });
    };
    g_cross_process.all_reduce_sum_f64 = [](void*, double* x, size_t n, cudaStream_t st) {
        host_all_reduce(x, n, st, [](double a, double b) { return a + b; });
    };
    g_cross_process.all_gather_pieces = host_all_gather_pieces;
    Recipe whole;
    std::vector<Recipe> piece(P);
    recipe_init(whole, ro, shape, B, T);
    for (int q = 0; q < P; q++) {
        RecipeContext owner_q;
        owner_q.state_owner = q;
        owner_q.state_owners = P;
        recipe_init(piece[q], ro, shape, B, T, owner_q);
    }
    const bool ef = whole.use_ef;
    bool owners_ok = true;
    for (int q = 0; q < P; q++) owners_ok = owners_ok && piece[q].owners == (ef ? P : 1) && piece[q].owner == (ef ? q : 0);
    check(owners_ok, "%s: %s", label, ef ? strfmt("each of %d processes keeps its piece of the EF buffer", P).c_str()
                                           : "without an EF buffer nothing is cut into pieces");
    const size_t ne = whole.total_elems, ng = whole.total_groups, nl = (size_t)whole.num_linears;
    std::vector<floatX*> wd(NUM_LINEAR_KINDS, nullptr);
    size_t bad_codes = 0, bad_ef = 0, bad_pdds = 0, bad_stats = 0;
    double worst_sum = 0.0;
    std::vector<int> collectives(P, 0);
    for (int t = 0; t < splits; t++) {
        // every process holds the same (whole) BF16 weights, as after ZeRO-1's parameter all-gather
        LinearWeights lw;
        for (int k = 0; k < NUM_LINEAR_KINDS; k++) {
            const int C = linear_in_features((LinearKind)k, channels), OC = linear_out_features((LinearKind)k, channels);
            if (wd[k]) cudaCheck(cudaFree(wd[k]));
            wd[k] = to_device(to_bf(make_weights(layers * OC, C, t, false, true, 900 + k)));
            lw.weight[k] = wd[k];
        }
        recipe_weights_changed(whole, lw, 0);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<std::thread> threads(P);
        for (int q = 0; q < P; q++) {
            threads[q] = std::thread([&, q] {
                t_rank = q;
                t_collectives = 0;
                cudaCheck(cudaSetDevice(0));
                cudaStream_t st;
                cudaCheck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
                recipe_weights_changed(piece[q], lw, st);
                cudaCheck(cudaStreamSynchronize(st));
                cudaCheck(cudaStreamDestroy(st));
                collectives[q] = t_collectives;
            });
        }
        for (std::thread& th : threads) th.join();
        const auto hi = to_host(whole.hi, ne), lo = to_host(whole.lo, ne);
        const auto hs = to_host(whole.hi_scale, ng), ls = to_host(whole.lo_scale, ng);
        const auto ss = to_host(whole.split_stats, nl);
        const auto wef = ef ? to_host(whole.ef, ne) : std::vector<float>();
        const auto wpd = ro.split.pdds ? to_host(whole.pdds, ng) : std::vector<float>();
        for (int q = 0; q < P; q++) {
            const Recipe& r = piece[q];
            bad_codes += count_diff(to_host(r.hi, ne), hi) + count_diff(to_host(r.lo, ne), lo) +
                         count_diff(to_host(r.hi_scale, ng), hs) + count_diff(to_host(r.lo_scale, ng), ls);
            const auto pef = ef ? to_host(r.ef, ne / r.owners) : std::vector<float>();
            const auto ppd = ro.split.pdds ? to_host(r.pdds, ng) : std::vector<float>();
            const auto ps = to_host(r.split_stats, nl);
            for (size_t li = 0; li < nl; li++) {
                const int k = (int)(li % NUM_LINEAR_KINDS);
                const size_t n = (size_t)linear_in_features((LinearKind)k, channels) * linear_out_features((LinearKind)k, channels);
                const size_t e0 = whole.elem_offset[li], g0 = whole.group_offset[li];
                if (ef) {
                    const size_t pc = n / r.owners, p0 = (size_t)r.owner * pc;
                    for (size_t j = 0; j < pc; j++) bad_ef += fbits(pef[e0 / r.owners + j]) != fbits(wef[e0 + p0 + j]);
                }
                if (ro.split.pdds) { // per tensor the one EMA; per block the owner's blocks
                    const int bs = ro.split.block_size;
                    const size_t groups = bs ? n / bs : 1, mine0 = bs && ef ? (size_t)r.owner * groups / r.owners : 0;
                    const size_t mine = bs && ef ? groups / r.owners : groups;
                    for (size_t j = mine0; j < mine0 + mine; j++) bad_pdds += fbits(ppd[g0 + j]) != fbits(wpd[g0 + j]);
                }
                const Tcfp12SplitStats &a = ps[li], &b = ss[li];
                bad_stats += a.amax_bits != b.amax_bits || a.lo_amax_bits != b.lo_amax_bits || a.hi_saturated != b.hi_saturated ||
                             a.lo_saturated != b.lo_saturated || a.lo_nonzero != b.lo_nonzero ||
                             a.zero_residual_groups != b.zero_residual_groups;
                worst_sum = std::max({worst_sum, std::fabs(a.err2 - b.err2) / std::max(b.err2, 1e-300),
                                      std::fabs(a.weff2 - b.weff2) / std::max(b.weff2, 1e-300)});
            }
        }
    }
    check(bad_codes == 0, "%s: every process holds the codes and scale codes of the whole split (%d splits, %zu differences)",
          label, splits, bad_codes);
    if (ef) {
        check(bad_ef == 0, "%s: each process's EF pieces are the whole buffer's, bit for bit (%zu differences)", label, bad_ef);
        const int expect = ro.split.block_size ? 3 : 4; // per block: maxima, sums, gather; per tensor: two maxima, sums, gather
        const bool all = std::all_of(collectives.begin(), collectives.end(), [&](int c) { return c == expect; });
        check(all, "%s: %d collectives per split (process 0: %d, last: %d)", label, expect, collectives[0], collectives[P - 1]);
    }
    if (ro.split.pdds) check(bad_pdds == 0, "%s: the PDDS state each process keeps is the whole run's (%zu differences)", label, bad_pdds);
    check(bad_stats == 0 && worst_sum <= 1e-12, "%s: the split's statistics describe the whole tensor (%zu differ; sums within %.1e)",
          label, bad_stats, worst_sum);
    if (ef) { // process 1's state file: round trip, and the whole buffer's is refused
        const std::string dir = strfmt("/tmp/test_tcfp12_pieces_%d", (int)getpid());
        const std::string pfile = dir + "_piece.bin", wfile = dir + "_whole.bin";
        StateWriter wp(1, 1, P, RECIPE_NAME), ww(1, 0, 1, RECIPE_NAME);
        recipe_save(piece[1], wp);
        recipe_save(whole, ww);
        wp.write_atomic(pfile);
        ww.write_atomic(wfile);
        RecipeContext owner_1;
        owner_1.state_owner = 1;
        owner_1.state_owners = P;
        Recipe back;
        recipe_init(back, ro, shape, B, T, owner_1);
        StateReader rd;
        rd.open(pfile);
        recipe_load(back, rd);
        const size_t nef = ne / P;
        check(count_diff_bits(to_host(back.ef, nef), to_host(piece[1].ef, nef)) == 0 && back.splits == piece[1].splits,
              "%s: a process's EF pieces survive save and load bit for bit", label);
        bool refused = false;
        try {
            StateReader rw;
            rw.open(wfile);
            recipe_load(back, rw);
        } catch (const llmc::InputError& e) { refused = strstr(e.what(), "process count") != nullptr; }
        check(refused, "%s: a process that keeps a piece refuses the whole buffer's state, naming the process count", label);
        std::remove(pfile.c_str());
        std::remove(wfile.c_str());
    }
    for (floatX* p : wd) cudaCheck(cudaFree(p));
    g_cross_process = CrossProcess();
}

int main() {
    if (!gpu_present()) return 77;
    matmul_init();
    for (int block : {0, 32, 64, 128}) {
        Tcfp12Options o;
        o.block_size = block;
        test_split<floatX>(88, 384, o, 3, false);                 // EF (the default)
        Tcfp12Options plain = o; plain.error_feedback = 0;
        test_split<floatX>(88, 384, plain, 2, false);             // neither EF nor SRR
        Tcfp12Options srr = o; srr.srr = 1;
        test_split<floatX>(88, 384, srr, 3, false);
        Tcfp12Options pdds = o; pdds.pdds = 1; pdds.abd = 1;
        test_split<floatX>(88, 384, pdds, 3, false);
        test_split<floatX>(88, 384, pdds, 3, true);               // a lagging EMA clips; EF carries it
        test_split<float>(40, 256, o, 2, false);                  // FP32 input
    }
    test_snr(0);
    test_snr(128);
    RecipeOptions ro;
    // ZeRO-1: the EF buffer in two pieces, against the whole buffer (a layer of 128 and two of 64 channels)
    test_ef_pieces("pieces, per tensor, EF", ro, 128, 1, 3);
    RecipeOptions pieces_pdds = ro; pieces_pdds.split.pdds = 1; pieces_pdds.split.abd = 1;
    test_ef_pieces("pieces, per tensor, PDDS + ABD", pieces_pdds, 64, 2, 3);
    RecipeOptions pieces_b32 = ro; pieces_b32.split.block_size = 32;
    test_ef_pieces("pieces, block 32, EF", pieces_b32, 64, 2, 3);
    RecipeOptions pieces_b128 = ro; pieces_b128.split.block_size = 128; pieces_b128.split.pdds = 1;
    test_ef_pieces("pieces, block 128, PDDS", pieces_b128, 128, 1, 3);
    RecipeOptions pieces_srr = ro; pieces_srr.split.srr = 1;
    test_ef_pieces("pieces, per tensor, SRR (no EF buffer)", pieces_srr, 64, 1, 2);
    test_ef_pieces("pieces, per tensor, EF, 3 processes", ro, 192, 1, 3, 3);
    RecipeOptions pieces_b64 = ro; pieces_b64.split.block_size = 64; pieces_b64.split.pdds = 1;
    test_ef_pieces("pieces, block 64, PDDS, 3 processes", pieces_b64, 192, 2, 3, 3);
    test_ef_pieces("pieces, per tensor, EF, 4 processes", ro, 128, 2, 2, 4);
    test_recipe("per tensor, EF", ro);
    RecipeOptions fast = ro; fast.split.abd = 1; fast.tcfp_fp8_wgrad = 1; fast.tcfp_fast_accum = 1;
    test_recipe("per tensor, ABD, FP8 wgrad, fast accumulation", fast);
    RecipeOptions srr = ro; srr.split.srr = 1;
    test_recipe("per tensor, SRR", srr);
    RecipeOptions pdds = ro; pdds.split.pdds = 1;
    test_recipe("per tensor, PDDS", pdds);
    RecipeOptions b32 = ro; b32.split.block_size = 32;
    test_recipe("block 32 (emulated), EF", b32);
    RecipeOptions b64 = ro; b64.split.block_size = 64; b64.split.abd = 1; b64.tcfp_fp8_wgrad = 1;
    test_recipe("block 64 (emulated), ABD, FP8 wgrad", b64);
    // the K-concatenated form of the dual GEMM (one block-scaled FP8 GEMM of depth 2K), forced, at 128 channels
    test_recipe("per tensor, EF, K-concatenated", ro, 128, 1);
    test_recipe("per tensor, EF, two GEMMs at 128 channels", ro, 128, 0);
    RecipeOptions fw = ro; fw.tcfp_fp8_wgrad = 1;
    test_recipe("per tensor, FP8 wgrad, K-concatenated", fw, 128, 1);
    test_recipe("per tensor, ABD, FP8 wgrad, fast accumulation, K-concatenated", fast, 128, 1);
    // the GELU derivative fused with the fc layer's dy sums
    test_gelu_chain("per tensor, EF", ro, 64);
    test_gelu_chain("per tensor, ABD, FP8 wgrad", fast, 128);
    test_gelu_chain("block 64 (emulated)", b64, 64);
    // the fc layer's GELU output left to the fc projection's forward
    test_gelu_forward_chain("per tensor, ABD, FP8 wgrad, fast accumulation, training", fast, 64, -1, true, true);
    test_gelu_forward_chain("per tensor, FP8 wgrad, K-concatenated, training", fw, 128, 1, true, true);
    test_gelu_forward_chain("per tensor, EF, evaluation", ro, 64, -1, false, true);
    test_gelu_forward_chain("per tensor, EF, K-concatenated, evaluation", ro, 128, 1, false, true);
    test_gelu_forward_chain("per tensor, EF (BF16 wgrad), training", ro, 64, -1, true, false);
    test_gelu_forward_chain("block 64 (emulated), FP8 wgrad, training", b64, 64, -1, true, false);
    // speculative fresh scales against the amax passes first
    test_speculative_scales("per tensor, ABD, FP8 wgrad, fast accumulation", fast, 64, -1);
    test_speculative_scales("per tensor, FP8 wgrad, K-concatenated", fw, 128, 1);
    test_speculative_scales("per tensor, EF (BF16 wgrad), two GEMMs", ro, 128, 0);
    test_layernorm_input_codes("LayerNorm codes, per tensor, ABD, FP8 wgrad, fast accumulation", fast, 64, -1);
    test_layernorm_input_codes("LayerNorm codes, per tensor, FP8 wgrad, K-concatenated", fw, 128, 1);
    test_layernorm_gradient_codes("LayerNorm backward codes, per tensor, ABD, FP8 wgrad, fast accumulation", fast, 64, -1, true);
    test_layernorm_gradient_codes("LayerNorm backward codes, per tensor, ABD, FP8 wgrad, K-concatenated", fast, 128, 1, true);
    test_layernorm_gradient_codes("LayerNorm backward, per tensor, FP8 wgrad, K-concatenated (no codes)", fw, 128, 1, false);
    test_layernorm_gradient_codes("LayerNorm backward, per tensor, EF, BF16 wgrad (no codes)", ro, 64, -1, false);
    matmul_free();
    printf("tcfp12 tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
