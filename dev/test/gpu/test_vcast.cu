// test_vcast.cu: the virtual-cast kernels (llmc/recipes/vcast/vcast_kernels.cuh) against the CPU reference of
// llmc/formats/vcast.h (vcast_matrix), and against the FP8 recipe's kernels.
//   1. Every predefined datatype and a grid of custom ones (the MX formats, which take the kernels
//      with a compile-time format, among them), cast along rows and along columns, all four round
//      modes, scale modes max and midmax, with and without M-of-N sparsity: the GPU's BF16 output
//      equals the reference's value rounded to BF16, bit for bit.
//   2. E4M3 / E5M2 as vcast datatypes reproduce the FP8-hybrid recipe's quantized operands exactly:
//      unscaled against fp8_quantize with scale 1, and with a power-of-two tensor scale (e8m0)
//      against fp8_quantize with the same power of two.
//   3. The telemetry sums (relative error) against the CPU's.
//
//   make build/test_vcast && ./build/test_vcast
// Prints [PASS]/[FAIL] lines and "vcast tests: N passed, N failed"; exit 0 iff all pass. Without a
// CUDA device: "skipped: no CUDA device", exit 77.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "dev/test/gpu/gpu_check.h"
#include "llmc/recipes/vcast/vcast_kernels.cuh"
#include "llmc/formats/fp8_quantize.cuh"

using llmc::strfmt;


static floatX bfloat_from_bits(uint16_t u) {
    __nv_bfloat16_raw raw;
    raw.x = u;
    return floatX(raw);
}

// BF16 test data: normal values with a spread of magnitudes per row (so tiles see different
// scales), some exact zeros, negative rows for the unsigned types, rare outliers
static std::vector<float> make_input(int rows, int cols, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float v = nd(rng) * std::ldexp(1.0f, (r * 7 + c / 32) % 9 - 4);
            if ((r + c) % 37 == 0) v = 0.0f;
            if ((r * 31 + c) % 997 == 0) v *= 64.0f;
            x[(size_t)r * cols + c] = bf2f(f2bf(v));
        }
    return x;
}

// GPU against vcast_matrix for one tensor x (BF16 values), one direction: every value's bits
// (any NaN matches any NaN)
static void compare_cast(const vc::DataType& dt, const vc::VcastOptions& o, bool along_cols, const std::vector<float>& x,
                         int rows, int cols, const std::string& what) {
    if (!vcast_shape_ok(dt, o, rows, cols, along_cols)) { check(false, "shape refused: %s", what.c_str()); return; }
    std::vector<floatX> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = f2bf(x[i]);
    floatX* dx = to_device(xb);
    floatX* dq;
    cudaCheck(cudaMalloc(&dq, x.size() * sizeof(floatX)));
    VcastTensorStats* ds;
    cudaCheck(cudaMalloc(&ds, sizeof(VcastTensorStats)));
    const uint64_t seed = 0xC0FFEE;
    vcast_tensor(dq, dx, rows, cols, along_cols, dt, o, seed, ds, 0);
    const std::vector<floatX> got = to_host(dq, x.size());
    // the reference: tiles along dim 0 for the column direction
    vc::DataType ref_dt = dt;
    if (vcast_is_tiled(dt)) ref_dt.scale.dim = along_cols ? 0 : -1;
    std::vector<float> want(x.size());
    vc::vcast_matrix(x.data(), want.data(), rows, cols, ref_dt, o, seed);
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); i++) {
        const floatX w = f2bf(want[i]);
        const bool same = bfbits(w) == bfbits(got[i]) || (want[i] != want[i] && bf2f(got[i]) != bf2f(got[i]));
        if (!same && bad++ < 3)
            printf("    element %zu (x %.9g): gpu %.9g, reference %.9g\n", i, x[i], bf2f(got[i]), want[i]);
    }
    const bool mx32 = vcast_mx32_applies(dt, o, rows, cols, dx, dq);
    check(bad == 0, "vcast %s%s: %zu of %zu values differ from the CPU reference", what.c_str(),
          mx32 ? " [one-read MX kernel]" : "", bad, x.size());
    cudaFree(dx); cudaFree(dq); cudaFree(ds);
}

// 1. One datatype, one direction, one set of options: GPU against vcast_matrix.
static void test_cast(const std::string& spec, bool along_cols, vc::RoundMode round, vc::ScaleMode scale,
                      int sparse_m, int sparse_n, int rows, int cols) {
    vc::DataType dt = vc::parse_datatype(spec);
    vc::VcastOptions o;
    o.round = round;
    o.scale = scale;
    o.sparse_m = sparse_m;
    o.sparse_n = sparse_n;
    const std::string what = strfmt("%s along %s, round %s, scale %s%s, %dx%d", spec.c_str(), along_cols ? "columns" : "rows",
                                    vc::round_mode_name(round), vc::scale_mode_name(scale),
                                    sparse_n ? strfmt(", sparsity %d:%d", sparse_m, sparse_n).c_str() : "", rows, cols);
    compare_cast(dt, o, along_cols, make_input(rows, cols, std::hash<std::string>()(spec) + along_cols), rows, cols, what);
}

// 1b. Both directions of an output gradient at once, with the bias gradient (vcast_tensor_both):
// each direction equal to the CPU reference, dbias += the column sums (against a float64 sum), the
// same bits on a second run. bias_groups: the scratch's room in row groups (a small number makes
// each block walk many patches).
static void test_both(const std::string& spec, vc::RoundMode round, int rows, int cols, int bias_groups) {
    const vc::DataType dt = vc::parse_datatype(spec);
    vc::VcastOptions o;
    o.round = round;
    const std::string what = strfmt("%s both directions + bias, round %s, %dx%d, %d bias groups%s", spec.c_str(),
                                    vc::round_mode_name(round), rows, cols, bias_groups,
                                    vcast_mx32_applies(dt, o, rows, cols, nullptr, nullptr) ? " (one-read MX kernel)" : "");
    const std::vector<float> x = make_input(rows, cols, 77 + rows + cols);
    std::vector<floatX> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = f2bf(x[i]);
    floatX *dx = to_device(xb), *dr, *dc;
    cudaCheck(cudaMalloc(&dr, x.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dc, x.size() * sizeof(floatX)));
    VcastTensorStats* ds;
    cudaCheck(cudaMalloc(&ds, sizeof(VcastTensorStats)));
    const long long capacity = std::max((long long)bias_groups * cols, (long long)BIAS_ROW_GROUPS * cols);
    float* scratch;
    cudaCheck(cudaMalloc(&scratch, capacity * sizeof(float)));
    std::vector<float> dbias0(cols);
    for (int c = 0; c < cols; c++) dbias0[c] = 0.25f * (c % 5); // dbias accumulates
    float* db = to_device(dbias0);
    const uint64_t seed = 0xBEEF;
    vcast_tensor_both(dr, dc, dx, rows, cols, dt, o, seed, ds, db, scratch, (long long)bias_groups * cols, 0);
    const std::vector<floatX> got_r = to_host(dr, x.size()), got_c = to_host(dc, x.size());
    const std::vector<float> got_b = to_host(db, cols);
    size_t bad = 0;
    for (int along_cols = 0; along_cols < 2; along_cols++) {
        vc::DataType ref_dt = dt;
        ref_dt.scale.dim = along_cols ? 0 : -1;
        std::vector<float> want(x.size());
        vc::vcast_matrix(x.data(), want.data(), rows, cols, ref_dt, o, seed);
        const std::vector<floatX>& got = along_cols ? got_c : got_r;
        for (size_t i = 0; i < x.size(); i++)
            if (bfbits(f2bf(want[i])) != bfbits(got[i]) && bad++ < 3)
                printf("    %s element %zu (x %.9g): gpu %.9g, reference %.9g\n", along_cols ? "column" : "row", i, x[i],
                       bf2f(got[i]), want[i]);
    }
    double worst = 0.0;
    for (int c = 0; c < cols; c++) {
        double sum = 0.0, mag = 0.0;
        for (int r = 0; r < rows; r++) sum += x[(size_t)r * cols + c], mag += std::fabs(x[(size_t)r * cols + c]);
        worst = std::max(worst, std::fabs(got_b[c] - (dbias0[c] + sum)) / (mag + 1.0));
    }
    // a second run from the same dbias: the same bits
    cudaCheck(cudaMemcpy(db, dbias0.data(), cols * sizeof(float), cudaMemcpyHostToDevice));
    vcast_tensor_both(dr, dc, dx, rows, cols, dt, o, seed, ds, db, scratch, (long long)bias_groups * cols, 0);
    const std::vector<float> again = to_host(db, cols);
    const bool same = std::memcmp(again.data(), got_b.data(), cols * sizeof(float)) == 0;
    check(bad == 0 && worst < 1e-4 && same, "vcast %s: %zu values differ from the CPU reference; bias error %.2e "
          "(relative to sum |x|, bound 1e-4); rerun %s", what.c_str(), bad, worst, same ? "bit-identical" : "DIFFERS");
    cudaFree(dx); cudaFree(dr); cudaFree(dc); cudaFree(ds); cudaFree(scratch); cudaFree(db);
}

// 1c. Every BF16 value through each MX format: tiles whose first value is the largest BF16 below
// 2^(emax + 1) (so the tile's scale is 2^0 and the other 31 values are cast as they are), the rest
// of the tile every finite BF16 value up to it and every inf and NaN (which do not set scales), in
// turn; both directions (the column test casts the transpose); all four round modes.
static void test_every_bf16(const std::string& spec) {
    const vc::DataType dt = vc::parse_datatype(spec);
    const float anchor = std::ldexp(2.0f - 1.0f / 128.0f, dt.num.emax); // 1.1111111b * 2^emax, BF16
    std::vector<float> values;
    for (uint32_t b = 0; b < 65536; b++) {
        const float v = bf2f(bfloat_from_bits((uint16_t)b));
        if (!(std::fabs(v) <= anchor) && std::isfinite(v)) continue; // larger finite values would set the scale
        values.push_back(v);
    }
    const int cols = 128, tiles_per_row = cols / 32;
    const int rows = (int)((values.size() / 31 / tiles_per_row + 1 + 127) / 128 * 128);
    std::vector<float> x((size_t)rows * cols, 0.0f);
    size_t next = 0;
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < tiles_per_row; t++) {
            x[(size_t)r * cols + t * 32] = (r + t) % 2 ? anchor : -anchor;
            for (int i = 1; i < 32 && next < values.size(); i++) x[(size_t)r * cols + t * 32 + i] = values[next++];
        }
    std::vector<float> xt((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) xt[(size_t)c * rows + r] = x[(size_t)r * cols + c];
    const vc::RoundMode rounds[] = {vc::RoundMode::Even, vc::RoundMode::Nearest, vc::RoundMode::Zero, vc::RoundMode::Stochastic};
    for (vc::RoundMode rm : rounds) {
        vc::VcastOptions o;
        o.round = rm;
        compare_cast(dt, o, false, x, rows, cols,
                     strfmt("%s every BF16 value (%zu) along rows, round %s", spec.c_str(), values.size(), vc::round_mode_name(rm)));
        compare_cast(dt, o, true, xt, cols, rows,
                     strfmt("%s every BF16 value (%zu) along columns, round %s", spec.c_str(), values.size(), vc::round_mode_name(rm)));
    }
}

// 2. E4M3 / E5M2 through vcast equal the FP8 recipe's quantize kernel (dequantized).
template <Fp8Kind K>
static void test_fp8_equivalence(const char* unscaled, const char* scaled) {
    const int rows = 64, cols = 256;
    const std::vector<float> x = make_input(rows, cols, 5);
    std::vector<floatX> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = f2bf(x[i]);
    floatX *dx = to_device(xb), *dq;
    cudaCheck(cudaMalloc(&dq, x.size() * sizeof(floatX)));
    VcastTensorStats* ds;
    cudaCheck(cudaMalloc(&ds, sizeof(VcastTensorStats)));
    uint8_t* d8;
    cudaCheck(cudaMalloc(&d8, x.size()));
    float* dscale;
    cudaCheck(cudaMalloc(&dscale, 16));
    const float fmax = K == Fp8Kind::E4M3 ? 448.0f : 57344.0f;
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    for (int scaled_case = 0; scaled_case < 2; scaled_case++) {
        const vc::DataType dt = vc::parse_datatype(scaled_case ? scaled : unscaled);
        vc::VcastOptions o;
        vcast_tensor(dq, dx, rows, cols, false, dt, o, 0, ds, 0);
        const std::vector<floatX> v = to_host(dq, x.size());
        // the FP8 recipe's scale s multiplies: q = fp8(x * s), x' = q / s. vcast's exponent scale is
        // 2^e with e = floor(log2 amax) - emax, x' = fp8(x / 2^e) * 2^e: the same for s = 2^-e.
        const int e = scaled_case ? (int)std::floor(std::log2(amax)) - (int)std::floor(std::log2(fmax)) : 0;
        const float s = std::ldexp(1.0f, -e);
        cudaCheck(cudaMemcpy(dscale, &s, sizeof(float), cudaMemcpyHostToDevice));
        fp8_quantize<K>(d8, dx, (long long)x.size(), dscale, nullptr, Fp8Stats(), 0);
        const std::vector<uint8_t> q = to_host(d8, x.size());
        size_t bad = 0;
        for (size_t i = 0; i < x.size(); i++) {
            const float deq = (K == Fp8Kind::E4M3 ? llmc::fp8e4m3_decode(q[i]) : llmc::fp8e5m2_decode(q[i])) / s;
            if (bfbits(f2bf(deq)) != bfbits(v[i]) && bad++ < 3)
                printf("    element %zu (x %.9g): vcast %.9g, fp8 recipe %.9g\n", i, x[i], bf2f(v[i]), deq);
        }
        check(bad == 0, "vcast '%s' reproduces the FP8 recipe's quantized operand (scale 2^%d): %zu of %zu differ",
              scaled_case ? scaled : unscaled, -e, bad, x.size());
    }
    cudaFree(dx); cudaFree(dq); cudaFree(ds); cudaFree(d8); cudaFree(dscale);
}

// 3. Telemetry: the relative error of a cast, against the CPU.
static void test_error_sums() {
    const int rows = 128, cols = 256;
    const std::vector<float> x = make_input(rows, cols, 9);
    std::vector<floatX> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = f2bf(x[i]);
    const vc::DataType dt = vc::parse_datatype("mxfp4e2");
    floatX *dx = to_device(xb), *dq;
    cudaCheck(cudaMalloc(&dq, x.size() * sizeof(floatX)));
    VcastTensorStats* ds;
    cudaCheck(cudaMalloc(&ds, sizeof(VcastTensorStats)));
    double* dsum = to_device(std::vector<double>(VCAST_STATS, 0.0));
    vcast_tensor(dq, dx, rows, cols, false, dt, vc::VcastOptions(), 0, ds, 0);
    vcast_error(dsum, dx, dq, (long long)x.size(), 0);
    const std::vector<double> s = to_host(dsum, VCAST_STATS);
    std::vector<float> want(x.size());
    vc::vcast_matrix(x.data(), want.data(), rows, cols, dt, vc::VcastOptions(), 0);
    double e2 = 0, x2 = 0, ftz = 0;
    for (size_t i = 0; i < x.size(); i++) {
        const double q = bf2f(f2bf(want[i])), d = q - x[i];
        e2 += d * d;
        x2 += (double)x[i] * x[i];
        ftz += (x[i] != 0.0f && q == 0.0) ? 1 : 0;
    }
    const double have = std::sqrt(s[0] / s[1]), ref = std::sqrt(e2 / x2);
    check(std::fabs(have - ref) <= 1e-9 * ref && s[2] == (double)x.size() && s[3] == ftz,
          "vcast telemetry (mxfp4e2): relative error %.6f (reference %.6f), %g flushed (reference %g)", have, ref, s[3], ftz);
    cudaFree(dx); cudaFree(dq); cudaFree(ds); cudaFree(dsum);
}

// 4. Speed (printed, not checked): the casts of one d12 micro-step's fc layer at B = 64, T = 1024
// (65,536 rows), default datatypes, against the bytes they must move
static void report_speed() {
    const int N = 65536, C = 768, OC = 3072;
    std::vector<floatX> h((size_t)N * OC);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : h) v = f2bf(nd(rng));
    floatX *x = to_device(h), *a, *b;
    cudaCheck(cudaMalloc(&a, h.size() * sizeof(floatX)));
    cudaCheck(cudaMalloc(&b, h.size() * sizeof(floatX)));
    VcastTensorStats* ds;
    cudaCheck(cudaMalloc(&ds, sizeof(VcastTensorStats)));
    float *scratch, *db;
    cudaCheck(cudaMalloc(&scratch, (size_t)BIAS_ROW_GROUPS * 4 * C * sizeof(float)));
    cudaCheck(cudaMalloc(&db, OC * sizeof(float)));
    const vc::DataType e4 = vc::parse_datatype("mxfp8e4"), e5 = vc::parse_datatype("mxfp8e5");
    const vc::VcastOptions o;
    const double gb_x = 2.0 * N * C * 2 / 1e9, gb_dy = 3.0 * N * OC * 2 / 1e9;
    const double t_rows = median_ms([&] { vcast_tensor(a, x, N, C, false, e4, o, 1, ds, 0); });
    const double t_cols = median_ms([&] { vcast_tensor(a, x, N, C, true, e4, o, 1, ds, 0); });
    const double t_both = median_ms([&] {
        vcast_tensor_both(a, b, x, N, OC, e5, o, 1, ds, db, scratch, (long long)BIAS_ROW_GROUPS * 4 * C, 0);
    });
    printf("speed: x %dx%d mxfp8e4 along rows %.3f ms (%.0f GB/s), along columns %.3f ms (%.0f GB/s); dy %dx%d mxfp8e5 both "
           "directions + bias %.3f ms (%.0f GB/s)\n", N, C, t_rows, gb_x / t_rows * 1e3, t_cols, gb_x / t_cols * 1e3, N, OC,
           t_both, gb_dy / t_both * 1e3);
    cudaFree(x); cudaFree(a); cudaFree(b); cudaFree(ds); cudaFree(scratch); cudaFree(db);
}

int main() {
    if (!gpu_present()) return 77;
    // every predefined datatype, both directions, nearest even
    for (const std::string& name : vc::predefined_names())
        for (int along_cols = 0; along_cols < 2; along_cols++)
            test_cast(name, along_cols, vc::RoundMode::Even, vc::ScaleMode::Max, 0, 0, 128, 192);
    // custom datatypes, all round modes and both scale modes
    const char* custom[] = {"e5m6", "e5m6_e8m0_t32", "e4m3fn_e5m0_t32", "e2m1fnuz_float8_e4m3fn_t16", "int4_f32",
                            "int8_e8m0_t0", "e3m2fnuz_e8m0_t64", "uint8_float16_e5m6", "uint4_float16_t32", "e6m3_e8m0_t16",
                            // the MX fast path (a compile-time format) under every round mode, and per channel
                            "mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp6e2", "mxfp4e2", "e4m3fn_e8m0_t0"};
    const vc::RoundMode rounds[] = {vc::RoundMode::Nearest, vc::RoundMode::Even, vc::RoundMode::Zero, vc::RoundMode::Stochastic};
    for (const char* spec : custom)
        for (vc::RoundMode rm : rounds)
            for (int along_cols = 0; along_cols < 2; along_cols++)
                test_cast(spec, along_cols, rm, rm == vc::RoundMode::Even ? vc::ScaleMode::MidMax : vc::ScaleMode::Max, 0, 0,
                          128, 192);
    // the one-read MX kernel (32-value tiles, rows % 32 == 0, cols % 128 == 0): every MX format,
    // every round mode, both scale modes, both directions, and more patches than blocks
    const char* mx[] = {"mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp6e2", "mxfp4e2", "e4m3fn_e5m0_t32", "e2m1fnuz_e8m0_t32"};
    for (const char* spec : mx)
        for (vc::RoundMode rm : rounds)
            for (int along_cols = 0; along_cols < 2; along_cols++)
                for (vc::ScaleMode sm : {vc::ScaleMode::Max, vc::ScaleMode::MidMax})
                    test_cast(spec, along_cols, rm, sm, 0, 0, 96, 256);
    for (const char* spec : {"mxfp8e4", "mxfp8e5", "mxfp6e3", "mxfp6e2", "mxfp4e2"}) test_every_bf16(spec);
    test_cast("mxfp8e4", false, vc::RoundMode::Even, vc::ScaleMode::Max, 0, 0, 32 * 600, 128);
    test_cast("mxfp8e5", true, vc::RoundMode::Stochastic, vc::ScaleMode::Max, 0, 0, 32 * 600, 128);
    // both directions at once with the bias gradient: the one-read kernel (few and many row groups)
    // and the fallback (columns not a multiple of 128; a datatype of the general path)
    for (vc::RoundMode rm : {vc::RoundMode::Even, vc::RoundMode::Stochastic}) {
        test_both("mxfp8e5", rm, 256, 384, 128);
        test_both("mxfp8e5", rm, 32 * 40, 256, 3);
        test_both("mxfp6e2", rm, 128, 192, 128);
        test_both("int8_e8m0_t32", rm, 128, 256, 128);
    }
    // M-of-N sparsity (the recipe's weights), tiled and tensor-scaled
    test_cast("mxfp8e4", false, vc::RoundMode::Even, vc::ScaleMode::Max, 2, 4, 64, 256);
    test_cast("mxfp8e4", true, vc::RoundMode::Even, vc::ScaleMode::Max, 2, 4, 64, 256);
    test_cast("int8_e", false, vc::RoundMode::Stochastic, vc::ScaleMode::Max, 4, 8, 64, 256);
    test_fp8_equivalence<Fp8Kind::E4M3>("float8_e4m3fn", "e4m3fn_e8m0");
    test_fp8_equivalence<Fp8Kind::E5M2>("float8_e5m2", "e5m2_e8m0");
    test_error_sums();
    report_speed();
    printf("vcast tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
