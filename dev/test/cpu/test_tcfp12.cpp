// Tests for llmc/formats/tcfp12.h: the TCFP-12 split W ~= deq(W_hi) + deq(W_lo), its scales, the
// zero-residual sentinel, error feedback, SRR, PDDS and the options' exclusions, on the CPU.
//
// Expected values are derived independently of the code under test wherever possible: the E4M3
// value set comes from the format's formula evaluated in double, scales from a search for the
// smallest power of two, and a double-precision reference split (nearest-even by table search)
// must agree with tcfp12_split_group code for code.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/rand.h"
#include "llmc/formats/tcfp12.h"

using llmc::Tcfp12GroupStats;
using llmc::Tcfp12Matrix;
using llmc::Tcfp12Options;

namespace {

// ---------------------------------------------------------------------------------------------
// Independent reference

// The non-negative finite E4M3 values, code 0..126 in order (the code's low 7 bits), from the
// formula: E = 0: M * 2^-9; E > 0: (1 + M/8) * 2^(E - 7); 0x7F is NaN.
const std::vector<double>& e4m3_table() {
    static std::vector<double> t = [] {
        std::vector<double> v;
        for (int c = 0; c < 127; c++) {
            const int E = c >> 3, M = c & 7;
            v.push_back(E == 0 ? std::ldexp((double)M, -9) : std::ldexp(1.0 + M / 8.0, E - 7));
        }
        return v;
    }();
    return t;
}

// Nearest-even E4M3 code of x (saturating at 448): a search over the table; ties go to the even
// code (the even mantissa).
uint8_t ref_e4m3_rne(double x) {
    const std::vector<double>& t = e4m3_table();
    const double a = std::fabs(x);
    int best = 0;
    for (int c = 1; c < 127; c++) {
        const double dc = std::fabs(t[c] - a), db = std::fabs(t[best] - a);
        if (dc < db || (dc == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)(best | (std::signbit(x) ? 0x80 : 0));
}

double ref_e4m3_value(uint8_t code) {
    const double v = e4m3_table()[code & 0x7F];
    return (code & 0x80) ? -v : v;
}

// The smallest k with amax <= 448 * 2^k, clamped to [-126, 126] (a search, in double).
int ref_scale_exp(double amax) {
    int k = -126;
    while (k < 126 && amax > std::ldexp(448.0, k)) k++;
    return k;
}

struct RefSplit {
    std::vector<uint8_t> hi, lo;
    int k_hi = 0, k_lo = 0;
    bool sentinel = false;
    std::vector<double> ef; // exact
};

// The split of one group with fresh scales and nearest-even rounding, in double.
RefSplit ref_split(const std::vector<float>& w, const std::vector<float>& ef_in) {
    RefSplit s;
    const size_t n = w.size();
    std::vector<double> we(n), r(n);
    double amax = 0.0;
    for (size_t i = 0; i < n; i++) {
        we[i] = ef_in.empty() ? (double)w[i] : (double)(float)(w[i] + ef_in[i]); // W + EF in float
        amax = std::max(amax, std::fabs(we[i]));
    }
    s.k_hi = ref_scale_exp(amax);
    double ramax = 0.0;
    for (size_t i = 0; i < n; i++) {
        s.hi.push_back(ref_e4m3_rne(std::ldexp(we[i], -s.k_hi)));
        r[i] = we[i] - std::ldexp(ref_e4m3_value(s.hi[i]), s.k_hi);
        ramax = std::max(ramax, std::fabs(r[i]));
    }
    s.k_lo = ref_scale_exp(ramax);
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        s.lo.push_back(ref_e4m3_rne(std::ldexp(r[i], -s.k_lo)));
        any = any || (s.lo[i] & 0x7F) != 0;
        s.ef.push_back(r[i] - std::ldexp(ref_e4m3_value(s.lo[i]), s.k_lo));
    }
    s.sentinel = !any;
    return s;
}

// ---------------------------------------------------------------------------------------------
// Helpers

struct Group {
    std::vector<uint8_t> hi, lo;
    uint8_t hi_scale = 0, lo_scale = 0;
    std::vector<float> ef_out;
    Tcfp12GroupStats st;
};

Group split(const std::vector<float>& w, const float* ef_in = nullptr, float* ema = nullptr, bool srr = false,
            uint32_t seed = 0) {
    Group g;
    const int64_t n = (int64_t)w.size();
    g.hi.assign(n, 0xAA);
    g.lo.assign(n, 0xAA);
    g.ef_out.assign(n, -1.0f);
    g.st = llmc::tcfp12_split_group(w.data(), ef_in, n, srr, seed, 0, ema, g.hi.data(), g.lo.data(),
                                    &g.hi_scale, &g.lo_scale, g.ef_out.data());
    return g;
}

std::vector<float> deq(const Group& g) {
    std::vector<float> out(g.hi.size());
    llmc::tcfp12_dequantize_group(g.hi.data(), g.lo.data(), (int64_t)g.hi.size(), g.hi_scale, g.lo_scale,
                                  out.data());
    return out;
}

std::vector<float> gaussian(size_t n, float std, uint64_t seed) {
    std::vector<float> v(n);
    llmc::Rng rng(seed);
    rng.fill_normal(v.data(), n, 0.0f, std);
    return v;
}

double snr_db(const std::vector<float>& w, const std::vector<float>& approx) {
    double sig = 0.0, err = 0.0;
    for (size_t i = 0; i < w.size(); i++) {
        const double d = (double)w[i] - (double)approx[i];
        sig += (double)w[i] * w[i];
        err += d * d;
    }
    return 10.0 * std::log10(sig / err);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

// =============================================================================================

TEST_CASE("tcfp12: the scale is the smallest power of two with amax <= 448 s, as an E8M0 code") {
    using llmc::tcfp12_scale_code;
    // by hand: 1/448 is in (2^-9, 2^-8]; 448 = 448 * 2^0; 224 = 448 * 2^-1
    CHECK(tcfp12_scale_code(1.0f) == 127 - 8);
    CHECK(tcfp12_scale_code(448.0f) == 127);
    CHECK(tcfp12_scale_code(std::nextafter(448.0f, 1e9f)) == 128);
    CHECK(tcfp12_scale_code(449.0f) == 128);
    CHECK(tcfp12_scale_code(224.0f) == 126);
    CHECK(tcfp12_scale_code(std::nextafter(224.0f, 1e9f)) == 127);
    CHECK(tcfp12_scale_code(256.0f) == 127);
    CHECK(tcfp12_scale_code(3.5f) == 127 - 7);
    // clamps: zero, float32 subnormals and tiny values -> code 1 (2^-126); inf and NaN -> 253
    CHECK(tcfp12_scale_code(0.0f) == 1);
    CHECK(tcfp12_scale_code(1e-40f) == 1);
    CHECK(tcfp12_scale_code(1e-36f) == 1);
    CHECK(tcfp12_scale_code(std::numeric_limits<float>::infinity()) == 253);
    CHECK(tcfp12_scale_code(std::numeric_limits<float>::quiet_NaN()) == 253);
    CHECK(tcfp12_scale_code(3.4e38f) == 127 + ref_scale_exp(3.4e38));

    // a sweep against the search: log-uniform values, and every 448 * 2^k with its float neighbours
    std::vector<float> xs;
    llmc::Rng rng(7);
    for (int i = 0; i < 20000; i++)
        xs.push_back((float)std::ldexp(1.0 + rng.next_double01(), (int)rng.next_below(240) - 120));
    for (int k = -120; k <= 119; k++) {
        const float b = (float)std::ldexp(448.0, k);
        xs.push_back(b);
        xs.push_back(std::nextafter(b, 0.0f));
        xs.push_back(std::nextafter(b, 3e38f));
        xs.push_back((float)std::ldexp(1.0, k)); // powers of two (mantissa 1.0 < 1.75)
    }
    int fails = 0;
    for (float x : xs) {
        const uint8_t c = tcfp12_scale_code(x);
        const int k = (int)c - 127;
        if (c != 127 + ref_scale_exp(x) && ++fails <= 5) FAIL_CHECK("amax " << x << ": code " << (int)c);
        // the decoded scale is that power of two, and its inverse is exact
        const float s = llmc::tcfp12_scale(c);
        int e;
        if ((std::frexp(s, &e) != 0.5f || e - 1 != k) && ++fails <= 5) FAIL_CHECK("scale " << s);
        if (s * llmc::tcfp12_inv_scale(c) != 1.0f && ++fails <= 5) FAIL_CHECK("inverse of " << s);
    }
    CHECK(fails == 0);
    // the sentinel decodes to 0 (E8M0 0xFF would be NaN)
    CHECK(llmc::tcfp12_scale(llmc::kTcfp12ZeroResidual) == 0.0f);
    CHECK(std::isnan(llmc::e8m0_decode(llmc::kTcfp12ZeroResidual)));
}

TEST_CASE("tcfp12: a hand-made split (1.1 = 288/256 - 416/2^14 + EF)") {
    // 1.1 / 2^-8 = 281.6 -> 288 (E4M3 steps of 32 in [256, 512)); R = 1.1f - 1.125;
    // |R| / 448 is in (2^-15, 2^-14]; R / 2^-14 = -409.6 -> -416 (midpoint 400 lies below)
    const std::vector<float> w = {1.1f};
    const Group g = split(w);
    CHECK(g.hi_scale == 127 - 8);
    CHECK(g.hi[0] == 0x79); // exponent field 15, mantissa 1: 1.125 * 2^8
    CHECK(g.lo_scale == 127 - 14);
    CHECK(g.lo[0] == 0xFD); // negative, exponent field 15, mantissa 5: 1.625 * 2^8
    CHECK(deq(g)[0] == 1.099609375f);
    const double r = (double)1.1f - 1.125;
    CHECK((double)g.ef_out[0] == r + 416.0 / 16384.0);
    CHECK(g.st.amax == 1.1f);
    CHECK(g.st.lo_nonzero == 1);
    CHECK(g.st.hi_saturated == 0);
    CHECK(g.st.lo_saturated == 0);
}

TEST_CASE("tcfp12: code for code against a double-precision reference split, with EF") {
    llmc::Rng rng(11);
    int fails = 0, groups = 0, sentinels = 0;
    for (int n : {1, 7, 32, 64, 128, 1000}) {
        for (int trial = 0; trial < 60; trial++) {
            // magnitudes over a wide range; some groups with exactly representable values (sentinel),
            // some with an outlier
            const float scale = (float)std::ldexp(1.0, (int)rng.next_below(60) - 40);
            std::vector<float> w(n), ef(n);
            llmc::Rng g2(1000 + trial * 17 + n);
            g2.fill_normal(w.data(), n, 0.0f, scale);
            if (trial % 10 == 3)
                for (float& x : w) x = (float)ref_e4m3_value(ref_e4m3_rne(x / scale * 16.0)) * scale / 16.0f;
            if (trial % 10 == 5) w[n / 2] *= 40.0f;
            for (float& e : ef) e = (trial % 3 == 0) ? 0.0f : (float)(rng.next_double01() - 0.5) * scale * 0.01f;
            const std::vector<float> ef_used = (trial % 10 == 3) ? std::vector<float>() : ef;
            const Group g = split(w, ef_used.empty() ? nullptr : ef_used.data());
            const RefSplit ref = ref_split(w, ef_used);
            groups++;
            sentinels += ref.sentinel ? 1 : 0;
            bool ok = g.hi == ref.hi && g.lo == ref.lo && g.hi_scale == 127 + ref.k_hi;
            ok = ok && g.lo_scale == (ref.sentinel ? llmc::kTcfp12ZeroResidual : 127 + ref.k_lo);
            for (int i = 0; i < n && ok; i++) ok = (double)g.ef_out[i] == ref.ef[i]; // EF' exact
            if (!ok && ++fails <= 5) FAIL_CHECK("n " << n << " trial " << trial);
            // exactness: deq(W_hi) + deq(W_lo) + EF' == W + EF (as rounded to float), exactly
            for (int i = 0; i < n; i++) {
                const double we = ef_used.empty() ? (double)w[i] : (double)(float)(w[i] + ef_used[i]);
                const double parts = ref_e4m3_value(g.hi[i]) * llmc::tcfp12_scale(g.hi_scale) +
                                     ref_e4m3_value(g.lo[i]) * llmc::tcfp12_scale(g.lo_scale) + g.ef_out[i];
                if (parts != we && ++fails <= 5) FAIL_CHECK("not exact: n " << n << " i " << i);
            }
        }
    }
    CHECK(fails == 0);
    CHECK(groups == 360);
    CHECK(sentinels >= 30); // the exactly representable groups did get the sentinel
}

TEST_CASE("tcfp12: the zero-residual sentinel, the all-zero group, NaN") {
    SUBCASE("exactly representable group: W_lo all zero -> sentinel, deq == W, EF' == 0") {
        // amax 3.5 -> s_hi = 2^-7: 3.5 -> 448, 1 -> 128, -0.5 -> -64, 0.75 -> 96, 0.0078125 -> 1
        std::vector<float> w = {1.0f, -0.5f, 0.75f, 3.5f, 0.0f, 0.0078125f, -2.25f, 0.125f};
        w.resize(32, 0.25f);
        const Group g = split(w);
        CHECK(g.hi_scale == 127 - 7);
        CHECK(g.lo_scale == llmc::kTcfp12ZeroResidual);
        CHECK(g.st.lo_nonzero == 0);
        CHECK(g.st.lo_amax == 0.0f);
        const std::vector<float> d = deq(g);
        for (size_t i = 0; i < w.size(); i++) {
            CHECK((g.lo[i] & 0x7F) == 0);
            CHECK(d[i] == w[i]);
            CHECK(g.ef_out[i] == 0.0f);
        }
    }
    SUBCASE("one element off the W_hi grid: no sentinel") {
        std::vector<float> w(32, 0.25f);
        w[5] = 0.26f;
        const Group g = split(w);
        CHECK(g.lo_scale != llmc::kTcfp12ZeroResidual);
        CHECK(g.st.lo_nonzero == 1);
    }
    SUBCASE("all-zero group: W_hi scale code 1, sentinel, zero codes, zero EF") {
        const std::vector<float> w(64, 0.0f);
        const Group g = split(w);
        CHECK(g.hi_scale == 1);
        CHECK(g.lo_scale == llmc::kTcfp12ZeroResidual);
        CHECK(g.st.amax == 0.0f);
        const std::vector<float> d = deq(g);
        for (size_t i = 0; i < w.size(); i++) {
            CHECK(g.hi[i] == 0);
            CHECK(g.lo[i] == 0);
            CHECK(d[i] == 0.0f);
            CHECK(g.ef_out[i] == 0.0f);
        }
    }
    SUBCASE("a NaN weight becomes a NaN code; the rest of the group is split as without it") {
        std::vector<float> w = gaussian(32, 0.02f, 5);
        std::vector<float> w0 = w;
        w[9] = std::numeric_limits<float>::quiet_NaN();
        w0[9] = 0.0f;
        const Group g = split(w), g0 = split(w0);
        CHECK(g.hi[9] == 0x7F);
        CHECK(std::isnan(deq(g)[9]));
        CHECK(std::isnan(g.ef_out[9]));
        CHECK(g.lo_scale != llmc::kTcfp12ZeroResidual); // the GEMM must not skip the NaN
        CHECK(g.hi_scale == g0.hi_scale);
        CHECK(g.lo_scale == g0.lo_scale);
        for (int i = 0; i < 32; i++)
            if (i != 9) {
                CHECK(g.hi[i] == g0.hi[i]);
                CHECK(g.lo[i] == g0.lo[i]);
            }
    }
}

TEST_CASE("tcfp12: saturation (only a delayed PDDS scale can clip), and EF keeps what was clipped") {
    // fresh scales never clip: the scaled amax is in (224, 448]
    {
        const std::vector<float> w = gaussian(4096, 3.0f, 9);
        const Group g = split(w);
        CHECK(g.st.hi_saturated == 0);
        CHECK(g.st.lo_saturated == 0);
        const float top = g.st.amax * llmc::tcfp12_inv_scale(g.hi_scale);
        CHECK(top > 224.0f);
        CHECK(top <= 448.0f);
    }
    // PDDS with a history of 0.5 while the group's amax is now 1.0:
    //   ema' = 0.999 * 0.5 + 0.001 * 1.0 = 0.5005 -> s_hi = 2^-9 (448 s_hi = 0.875 < 1: clips)
    //   t = ema' / s_hi = 256.3 -> b = 8 -> s_lo = 2^(-9 + 8 - 12) = 2^-13 (448 s_lo = 0.0546875)
    //   1.0 -> W_hi 448 (0.875), R = 0.125 -> W_lo 448 (clipped again), EF' = 0.125 - 0.0546875
    std::vector<float> w = gaussian(32, 0.1f, 3);
    for (float& x : w) x = std::max(-0.4f, std::min(0.4f, x));
    w[4] = 1.0f;
    w[20] = -1.0f;
    float ema = 0.5f;
    const Group g = split(w, nullptr, &ema);
    CHECK(ema == llmc::rn_fma(0.999f, 0.5f, llmc::kTcfp12PddsGain * 1.0f));
    CHECK(g.hi_scale == 127 - 9);
    CHECK(g.lo_scale == 127 - 13);
    CHECK(g.hi[4] == 0x7E); // +448
    CHECK(g.hi[20] == 0xFE); // -448
    CHECK(g.lo[4] == 0x7E);
    CHECK(g.lo[20] == 0xFE);
    CHECK(g.st.hi_saturated == 2);
    CHECK(g.st.lo_saturated == 2);
    CHECK(g.ef_out[4] == 0.125f - 0.0546875f);
    CHECK(g.ef_out[20] == -(0.125f - 0.0546875f));
    // the others are within range: their EF' is at most half a W_lo ulp at W_lo's top (16 s_lo)
    for (int i = 0; i < 32; i++)
        if (i != 4 && i != 20) CHECK(std::fabs(g.ef_out[i]) <= 16.0f * llmc::tcfp12_scale(g.lo_scale));
}

TEST_CASE("tcfp12: reconstruction SNR on N(0,1) 4096 x 4096 (seed 1234)") {
    const int R = 4096, C = 4096;
    const std::vector<float> w = gaussian((size_t)R * C, 1.0f, 1234);
    struct Mode {
        const char* name;
        int block;
    };
    const Mode modes[] = {{"per tensor", 0}, {"block 32", 32}, {"block 64", 64}, {"block 128", 128}};
    std::vector<double> snr_rne;
    for (const Mode& m : modes) {
        Tcfp12Options o;
        o.block_size = m.block;
        o.error_feedback = 0;
        const Tcfp12Matrix s = llmc::tcfp12_split_matrix(w.data(), R, C, o, nullptr, nullptr);
        const double snr = snr_db(w, llmc::tcfp12_dequantize_matrix(s));
        const double snr_hi = snr_db(w, llmc::tcfp12_dequantize_matrix(s, true));
        MESSAGE("TCFP-12 " << std::string(m.name) << ": SNR deq(W_hi) + deq(W_lo) = " << snr
                           << " dB; W_hi alone (one E4M3) = " << snr_hi << " dB; zero-residual groups "
                           << s.zero_residual_groups);
        CHECK(snr >= 45.0); // the reconstruction quality TCFP-12 promises
        CHECK(snr > 62.0);  // two E4M3 halves: ~8 significant bits, ~32 dB above one E4M3
        CHECK(snr_hi > 30.5);
        CHECK(snr_hi < 32.5);
        CHECK(s.hi_saturated == 0);
        CHECK(s.lo_saturated == 0);
        snr_rne.push_back(snr);
    }
    // PDDS (first split: ema = amax, W_lo scale predicted) and SRR, per tensor and block 128
    for (int block : {0, 128}) {
        Tcfp12Options o;
        o.block_size = block;
        o.pdds = 1;
        std::vector<float> ef((size_t)R * C, 0.0f), ema(llmc::tcfp12_num_groups(R, C, block), 0.0f);
        const Tcfp12Matrix p = llmc::tcfp12_split_matrix(w.data(), R, C, o, ef.data(), ema.data());
        const double snr_p = snr_db(w, llmc::tcfp12_dequantize_matrix(p));
        Tcfp12Options so;
        so.block_size = block;
        so.srr = 1;
        const Tcfp12Matrix s = llmc::tcfp12_split_matrix(w.data(), R, C, so, nullptr, nullptr, 99);
        const double snr_s = snr_db(w, llmc::tcfp12_dequantize_matrix(s));
        const double ref = snr_rne[block ? 3 : 0];
        MESSAGE("TCFP-12 " << std::string(block ? "block 128" : "per tensor") << ": SNR with PDDS " << snr_p
                           << " dB, with SRR " << snr_s << " dB");
        CHECK(snr_p >= 45.0);
        CHECK(snr_p > ref - 1.0); // a coarser W_lo scale costs only where residuals go subnormal
        CHECK(p.lo_saturated == 0); // ema = amax: the prediction bounds every residual
        // stochastic rounding's error variance is twice nearest's (q^2/6 vs q^2/12): 3 dB
        CHECK(snr_s >= 45.0);
        CHECK(std::fabs(snr_s - (ref - 10.0 * std::log10(2.0))) < 0.5);
    }
}

TEST_CASE("tcfp12: per-block scales keep rows of very different magnitude (per-row SNR)") {
    // with power-of-two scales E4M3 rounding is scale invariant, so on N(0,1) every mode gives the
    // same SNR; blocks matter when magnitudes differ: row r is N(0,1) * 2^-(r % 25)
    const int R = 500, C = 512;
    std::vector<float> w = gaussian((size_t)R * C, 1.0f, 55);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) w[(size_t)r * C + c] = std::ldexp(w[(size_t)r * C + c], -(r % 25));
    for (int block : {0, 32, 128}) {
        Tcfp12Options o;
        o.block_size = block;
        o.error_feedback = 0;
        const Tcfp12Matrix s = llmc::tcfp12_split_matrix(w.data(), R, C, o, nullptr, nullptr);
        const std::vector<float> d = llmc::tcfp12_dequantize_matrix(s);
        double worst = 1e9;
        for (int r = 0; r < R; r++) {
            const std::vector<float> wr(w.begin() + (size_t)r * C, w.begin() + (size_t)(r + 1) * C);
            const std::vector<float> dr(d.begin() + (size_t)r * C, d.begin() + (size_t)(r + 1) * C);
            worst = std::min(worst, snr_db(wr, dr));
        }
        MESSAGE("rows scaled 2^0 .. 2^-24, " << (block ? "block " + std::to_string(block) : std::string("per tensor"))
                                             << ": worst per-row SNR " << worst << " dB");
        if (block) CHECK(worst > 60.0);
        else CHECK(worst < 20.0); // per tensor, the smallest rows fall below W_lo's subnormals
    }
}

TEST_CASE("tcfp12: error feedback makes the time-averaged effective weight converge to W") {
    const int R = 8, C = 256, T = 1000;
    const std::vector<float> w = gaussian((size_t)R * C, 0.02f, 77); // GPT-2's init scale
    for (int block : {0, 32}) {
        CAPTURE(block);
        Tcfp12Options o;
        o.block_size = block;
        std::vector<float> ef((size_t)R * C, 0.0f);
        std::vector<double> sum((size_t)R * C, 0.0);
        std::vector<float> first;
        double ef_max = 0.0;
        int bound_fails = 0, exact_fails = 0;
        for (int t = 0; t < T; t++) {
            std::vector<float> weff(w.size());
            for (size_t i = 0; i < w.size(); i++) weff[i] = w[i] + ef[i];
            const Tcfp12Matrix s = llmc::tcfp12_split_matrix(w.data(), R, C, o, ef.data(), nullptr);
            const std::vector<float> d = llmc::tcfp12_dequantize_matrix(s);
            if (t == 0) first = d;
            const int64_t glen = block ? block : (int64_t)R * C;
            for (size_t i = 0; i < w.size(); i++) {
                sum[i] += d[i];
                // bounded: |EF'| <= half a W_lo ulp at W_lo's top binade = 16 s_lo of the group
                const float s_lo = llmc::tcfp12_scale(s.lo_scale[i / glen]);
                if (std::fabs(ef[i]) > 16.0f * s_lo && ++bound_fails <= 5) FAIL_CHECK("t " << t << " i " << i);
                ef_max = std::max(ef_max, (double)std::fabs(ef[i]));
                // the EF identity, exactly: deq + EF' == W + EF (as rounded to float)
                if ((double)d[i] + ef[i] != (double)weff[i] && ++exact_fails <= 5) FAIL_CHECK("t " << t);
            }
        }
        CHECK(bound_fails == 0);
        CHECK(exact_fails == 0);
        // sum_t deq_t = T W + EF_0 - EF_T + (roundings of W + EF): the mean error is <= |EF_T| / T
        // plus float32 rounding of W + EF (<= 2^-24 |W + EF| per step)
        double avg_err = 0.0, first_err = 0.0;
        int fails = 0;
        for (size_t i = 0; i < w.size(); i++) {
            const double e = std::fabs(sum[i] / T - w[i]);
            const double bound = std::fabs(ef[i]) / T + std::ldexp(std::fabs(w[i]) + ef_max, -24) + 1e-12;
            if (e > bound && ++fails <= 5) FAIL_CHECK("i " << i << ": " << e << " > " << bound);
            avg_err = std::max(avg_err, e);
            first_err = std::max(first_err, (double)std::fabs(first[i] - w[i]));
        }
        CHECK(fails == 0);
        MESSAGE("EF, block " << block << ": max |deq - W| of one split " << first_err << ", of the " << T
                             << "-step average " << avg_err << ", max |EF| " << ef_max);
        CHECK(avg_err * 200.0 < first_err);
    }
    // without EF the split is deterministic: its average stays one split's error away (biased)
    {
        Tcfp12Options o;
        o.error_feedback = 0;
        const Tcfp12Matrix s = llmc::tcfp12_split_matrix(w.data(), R, C, o, nullptr, nullptr);
        const std::vector<float> d = llmc::tcfp12_dequantize_matrix(s);
        int biased = 0;
        for (size_t i = 0; i < w.size(); i++) biased += d[i] != w[i];
        CHECK(biased > (int)w.size() / 2);
    }
}

TEST_CASE("tcfp12: PDDS + EF recovers from a lagging EMA that clips W_hi") {
    // the group's amax is 1.0 but the EMA remembers 0.6: s_hi = 2^-9 clips 1.0 to 0.875 + W_lo's max.
    // EF accumulates the clipped part, which raises W_eff's amax and with it the EMA, until s_hi
    // doubles; then EF drains and stays bounded, and the time average still converges to W.
    std::vector<float> w = gaussian(64, 0.2f, 21);
    for (float& x : w) x = std::max(-0.8f, std::min(0.8f, x));
    w[10] = 1.0f;
    std::vector<float> ef(64, 0.0f);
    float ema = 0.6f;
    const int T = 3000;
    std::vector<double> sum(64, 0.0);
    int first_clip_free = -1, clipped_late = 0;
    uint8_t lo_code = 0;
    for (int t = 0; t < T; t++) {
        const std::vector<float> ef_in = ef;
        Group g;
        g.hi.resize(64);
        g.lo.resize(64);
        g.st = llmc::tcfp12_split_group(w.data(), ef_in.data(), 64, false, 0, 0, &ema, g.hi.data(), g.lo.data(),
                                        &g.hi_scale, &g.lo_scale, ef.data());
        if (t == 0) CHECK(g.st.hi_saturated == 1);
        if (g.st.hi_saturated == 0 && first_clip_free < 0) first_clip_free = t;
        if (t >= T / 2) clipped_late += g.st.hi_saturated + g.st.lo_saturated;
        const std::vector<float> d = deq(g);
        for (int i = 0; i < 64; i++) sum[i] += d[i];
        lo_code = g.lo_scale;
    }
    MESSAGE("PDDS: first split without clipping at step " << first_clip_free << ", EMA after " << T << " steps "
                                                           << ema);
    CHECK(first_clip_free > 0);
    CHECK(first_clip_free < 500);
    CHECK(clipped_late == 0);
    double avg_err = 0.0;
    for (int i = 0; i < 64; i++) {
        CHECK(std::fabs(ef[i]) <= 16.0f * llmc::tcfp12_scale(lo_code)); // drained back to rounding size
        avg_err = std::max(avg_err, std::fabs(sum[i] / T - w[i]));
    }
    CHECK(avg_err <= 1e-5);
}

TEST_CASE("tcfp12: SRR is unbiased: each W_lo rounds up with probability (x - lo) / (hi - lo)") {
    const int n = 64, T = 4000;
    const std::vector<float> w = gaussian(n, 0.02f, 31);
    // the deterministic part: W_hi, both scales (the fresh W_lo scale comes from |R|, not from rounding)
    const Group rne = split(w);
    const float s_lo = llmc::tcfp12_scale(rne.lo_scale);
    std::vector<int> ups(n, 0);
    std::vector<double> sum(n, 0.0);
    std::vector<double> x(n), dn(n), up(n);
    for (int i = 0; i < n; i++) {
        const double r = (double)w[i] - ref_e4m3_value(rne.hi[i]) * llmc::tcfp12_scale(rne.hi_scale);
        x[i] = r / s_lo;
        // the two E4M3 neighbours of x (magnitudes), from the table
        const std::vector<double>& t = e4m3_table();
        const double a = std::fabs(x[i]);
        int c = 0;
        while (c + 1 < 127 && t[c + 1] <= a) c++;
        dn[i] = t[c];
        up[i] = t[c] == a ? t[c] : t[c + 1];
    }
    for (int k = 0; k < T; k++) {
        const Group g = split(w, nullptr, nullptr, true, 1000u + (uint32_t)k);
        REQUIRE(g.hi == rne.hi);
        REQUIRE(g.hi_scale == rne.hi_scale);
        REQUIRE(g.lo_scale == rne.lo_scale);
        const std::vector<float> d = deq(g);
        for (int i = 0; i < n; i++) {
            const double m = std::fabs(ref_e4m3_value(g.lo[i]));
            REQUIRE((m == dn[i] || m == up[i])); // only the two neighbours
            ups[i] += (m == up[i] && up[i] != dn[i]) ? 1 : 0;
            sum[i] += d[i];
        }
    }
    int fails = 0, rne_outside = 0;
    double z2 = 0.0;
    for (int i = 0; i < n; i++) {
        if (up[i] == dn[i]) continue;
        const double p = (std::fabs(x[i]) - dn[i]) / (up[i] - dn[i]);
        const double sd = std::sqrt(p * (1 - p) / T);
        if (std::fabs((double)ups[i] / T - p) > 5 * sd + 1.0 / T && ++fails <= 5)
            FAIL_CHECK("i " << i << ": " << ups[i] << " / " << T << " vs p " << p);
        // unbiased: the mean effective weight is W within the statistical error of T draws
        const double q = (up[i] - dn[i]) * s_lo;
        const double mean_err = sum[i] / T - w[i];
        const double tol = 5 * q * sd + 1e-9 * std::fabs(w[i]);
        if (std::fabs(mean_err) > tol && ++fails <= 5) FAIL_CHECK("i " << i << ": mean error " << mean_err);
        if (sd > 0) z2 += ((double)ups[i] / T - p) * ((double)ups[i] / T - p) / (sd * sd);
        // nearest-even is deterministic and biased: its error is outside that tolerance
        if (std::fabs((double)deq(rne)[i] - w[i]) > tol) rne_outside++;
    }
    CHECK(fails == 0);
    CHECK(z2 / n < 2.0); // chi-square per element ~ 1
    CHECK(rne_outside > n / 2);
    // reproducible: the same seed gives the same codes; another seed other codes
    CHECK(split(w, nullptr, nullptr, true, 5).lo == split(w, nullptr, nullptr, true, 5).lo);
    CHECK(split(w, nullptr, nullptr, true, 5).lo != split(w, nullptr, nullptr, true, 6).lo);
}

TEST_CASE("tcfp12: SRR random bits: a stateless hash of (seed, index), uniform bits") {
    CHECK(llmc::tcfp12_srr_bits(1, 2) == llmc::tcfp12_srr_bits(1, 2));
    CHECK(llmc::tcfp12_srr_bits(1, 2) != llmc::tcfp12_srr_bits(2, 1));
    CHECK(llmc::tcfp12_srr_bits(0, 0) != llmc::tcfp12_srr_bits(0, 1));
    const int N = 200000;
    std::vector<int> ones(32, 0);
    double mean = 0.0;
    for (int i = 0; i < N; i++) {
        const uint32_t b = llmc::tcfp12_srr_bits(42, (uint32_t)i);
        for (int k = 0; k < 32; k++) ones[k] += (b >> k) & 1u;
        mean += b / 4294967296.0;
    }
    for (int k = 0; k < 32; k++) CHECK(std::fabs(ones[k] / (double)N - 0.5) < 0.006); // 5 sigma = 0.0056
    CHECK(std::fabs(mean / N - 0.5) < 0.0033);                                       // 5 sigma = 0.0032
    // the bits depend on the flat index only: a per-block and a per-tensor SRR split of the same
    // matrix draw the same bits (equal codes wherever the two modes have the same scales)
    const int R = 4, C = 128;
    const std::vector<float> w = gaussian((size_t)R * C, 1.0f, 8);
    Tcfp12Options a, b;
    a.srr = b.srr = 1;
    a.block_size = 128; // one block per row
    const Tcfp12Matrix ma = llmc::tcfp12_split_matrix(w.data(), R, C, a, nullptr, nullptr, 3);
    // row 0 alone as a 1 x 128 tensor: the same data, flat indices and scales as block (0, 0) of ma
    const std::vector<float> row0(w.begin(), w.begin() + C);
    const Tcfp12Matrix mb = llmc::tcfp12_split_matrix(row0.data(), 1, C, b, nullptr, nullptr, 3);
    CHECK(mb.lo_scale[0] == ma.lo_scale[0]);
    CHECK(std::equal(mb.lo.begin(), mb.lo.end(), ma.lo.begin()));
    // row 1 alone starts at flat index 0, not 128: other bits, so (almost surely) other codes
    const std::vector<float> row1(w.begin() + C, w.begin() + 2 * C);
    const Tcfp12Matrix mc = llmc::tcfp12_split_matrix(row1.data(), 1, C, b, nullptr, nullptr, 3);
    CHECK(mc.lo_scale[0] == ma.lo_scale[1]);
    CHECK(!std::equal(mc.lo.begin(), mc.lo.end(), ma.lo.begin() + C));
}

TEST_CASE("tcfp12: PDDS: the EMA of the W_hi amax and the predicted W_lo scale") {
    using llmc::tcfp12_pdds_ema_update;
    using llmc::tcfp12_pdds_lo_code;
    // no history (0, negative, NaN): this split's amax
    CHECK(tcfp12_pdds_ema_update(0.0f, 3.0f) == 3.0f);
    CHECK(tcfp12_pdds_ema_update(-1.0f, 3.0f) == 3.0f);
    CHECK(tcfp12_pdds_ema_update(std::numeric_limits<float>::quiet_NaN(), 3.0f) == 3.0f);
    // a constant amax is a fixed point, exactly
    for (float a : {0.1f, 1.0f, 3.7f, 1e-20f, 1e20f}) {
        float e = a;
        for (int t = 0; t < 100; t++) e = tcfp12_pdds_ema_update(e, a);
        CHECK(e == a);
    }
    // a step from 1 to 2: ema_k = 2 - 0.999^k (decay 0.999, as a double recursion)
    float e = 1.0f;
    double ref = 1.0;
    for (int t = 1; t <= 2000; t++) {
        e = tcfp12_pdds_ema_update(e, 2.0f);
        ref = 0.999 * ref + 0.001 * 2.0;
        if (t == 693) CHECK(std::fabs(e - 1.5) < 0.001); // the half-life
    }
    CHECK(std::fabs(e - ref) < 1e-4 * ref);
    CHECK(std::fabs(ref - (2.0 - std::pow(0.999, 2000))) < 1e-9);

    // the prediction by hand (s_hi = 2^(120 - 127) = 2^-7)
    const float s = std::ldexp(1.0f, -7);
    CHECK(tcfp12_pdds_lo_code(120, 300.0f * s) == 120 + 8 - 12); // t in [256, 448]: s_hi / 16
    CHECK(tcfp12_pdds_lo_code(120, 448.0f * s) == 120 - 4);
    CHECK(tcfp12_pdds_lo_code(120, 256.0f * s) == 120 - 4);
    CHECK(tcfp12_pdds_lo_code(120, 230.0f * s) == 120 + 7 - 12); // t in (224, 256): s_hi / 32
    CHECK(tcfp12_pdds_lo_code(120, 900.0f * s) == 120 - 4);      // above 448 (clipping): as 448
    CHECK(tcfp12_pdds_lo_code(120, 0.001f * s) == 120 - 6 - 12); // subnormal range: quantum 2^-9
    CHECK(tcfp12_pdds_lo_code(120, 0.0f) == 120 - 18);
    CHECK(tcfp12_pdds_lo_code(10, 1.0f) == 10 + 8 - 12); // t = 2^117 is clipped to 448
    CHECK(tcfp12_pdds_lo_code(5, 0.0f) == 1);            // 5 - 18 is clamped to the smallest code

    // on Gaussian groups (first split: ema = amax), the predicted scale is never finer than the fresh
    // one, so W_lo never clips, and it is usually the same
    int same = 0, total = 0, fails = 0;
    for (int n : {32, 64, 128}) {
        for (int k = 0; k < 300; k++) {
            const std::vector<float> w = gaussian(n, 0.02f, 500 + k * 3 + n);
            float ema = 0.0f;
            const Group p = split(w, nullptr, &ema);
            const Group f = split(w);
            if (ema != f.st.amax && ++fails <= 5) FAIL_CHECK("ema");
            if (p.hi != f.hi || p.hi_scale != f.hi_scale) ++fails; // W_hi is the fresh one
            if (p.st.lo_saturated != 0 || p.lo_scale < f.lo_scale) ++fails;
            // the bound behind the prediction holds: |R| <= 2^(b-4) s_hi = 256 s_lo
            if (f.st.lo_amax > 256.0f * llmc::tcfp12_scale(p.lo_scale)) ++fails;
            same += p.lo_scale == f.lo_scale;
            total++;
        }
    }
    CHECK(fails == 0);
    MESSAGE("PDDS: predicted W_lo scale == fresh scale in " << same << " of " << total << " Gaussian blocks");
    CHECK(same > total / 4);
    // the PDDS W_hi scale follows the EMA, not this split's amax
    {
        const std::vector<float> w = gaussian(32, 1.0f, 4);
        float ema = 0.0f;
        const Group f = split(w, nullptr, &ema); // ema = amax
        const float amax = ema;
        ema = 4.0f * amax;                       // history: 4x larger
        const Group p = split(w, nullptr, &ema);
        CHECK(ema == llmc::rn_fma(0.999f, 4.0f * amax, llmc::kTcfp12PddsGain * amax));
        CHECK(p.hi_scale == llmc::tcfp12_scale_code(ema));
        CHECK(p.hi_scale == f.hi_scale + 2);
    }
}

TEST_CASE("tcfp12: matrix layout: row-major codes, one scale per block of a row, or per tensor") {
    const int R = 4, C = 256, B = 64, NB = C / B;
    // block (r, j) holds values of amax exactly 2^(r*NB + j) * 448 * 2^-20, so its W_hi scale code
    // is 127 - 20 + r*NB + j
    std::vector<float> w((size_t)R * C);
    llmc::Rng rng(2);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            const int j = c / B;
            const float top = std::ldexp(448.0f, r * NB + j - 20);
            w[(size_t)r * C + c] = (c % B == 5) ? -top : top * (float)(rng.next_double01() * 0.9);
        }
    Tcfp12Options o;
    o.block_size = B;
    std::vector<float> ef(w.size(), 0.0f);
    const Tcfp12Matrix m = llmc::tcfp12_split_matrix(w.data(), R, C, o, ef.data(), nullptr);
    REQUIRE(m.hi_scale.size() == (size_t)R * NB);
    REQUIRE(m.hi.size() == (size_t)R * C);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NB; j++) CHECK(m.hi_scale[r * NB + j] == 127 - 20 + r * NB + j);
    // each group equals the per-group function on that slice, and the dequantized matrix matches
    const std::vector<float> d = llmc::tcfp12_dequantize_matrix(m);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NB; j++) {
            const std::vector<float> slice(w.begin() + r * C + j * B, w.begin() + r * C + j * B + B);
            const Group g = split(slice);
            CHECK(std::equal(g.hi.begin(), g.hi.end(), m.hi.begin() + r * C + j * B));
            CHECK(std::equal(g.lo.begin(), g.lo.end(), m.lo.begin() + r * C + j * B));
            CHECK(g.lo_scale == m.lo_scale[r * NB + j]);
            CHECK(std::equal(g.ef_out.begin(), g.ef_out.end(), ef.begin() + r * C + j * B));
            const std::vector<float> dg = deq(g);
            CHECK(std::equal(dg.begin(), dg.end(), d.begin() + r * C + j * B));
        }
    // per tensor: one scale pair, set by the largest block
    o.block_size = 0;
    std::fill(ef.begin(), ef.end(), 0.0f);
    const Tcfp12Matrix t = llmc::tcfp12_split_matrix(w.data(), R, C, o, ef.data(), nullptr);
    REQUIRE(t.hi_scale.size() == 1);
    CHECK(t.hi_scale[0] == 127 - 20 + R * NB - 1);
    CHECK(t.amax == std::ldexp(448.0f, R * NB - 1 - 20));
    CHECK(llmc::tcfp12_num_groups(R, C, 0) == 1);
    CHECK(llmc::tcfp12_num_groups(R, C, 32) == R * C / 32);
}

TEST_CASE("tcfp12: options: the specification's exclusions are rejected with a message naming the flags") {
    using llmc::tcfp12_validate;
    Tcfp12Options o;
    CHECK(tcfp12_validate(o) == "");
    CHECK(llmc::tcfp12_uses_ef(o)); // EF is the default
    for (int b : {0, 32, 64, 128}) {
        o.block_size = b;
        CHECK(tcfp12_validate(o) == "");
    }
    for (int b : {16, 48, 256, -1}) {
        o.block_size = b;
        const std::string e = tcfp12_validate(o);
        CHECK(contains(e, "-tb " + std::to_string(b)));
        CHECK(contains(e, "32, 64 or 128"));
    }
    o = Tcfp12Options();
    // SRR replaces EF: on its own it is valid and keeps no buffer
    o.srr = 1;
    CHECK(tcfp12_validate(o) == "");
    CHECK(!llmc::tcfp12_uses_ef(o));
    // SRR with PDDS
    o.pdds = 1;
    std::string e = tcfp12_validate(o);
    CHECK(contains(e, "-tsrr 1"));
    CHECK(contains(e, "-tpdds 1"));
    CHECK(contains(e, "mutually exclusive"));
    // SRR with EF asked for explicitly
    o = Tcfp12Options();
    o.srr = 1;
    o.error_feedback = 1;
    e = tcfp12_validate(o);
    CHECK(contains(e, "-tsrr 1"));
    CHECK(contains(e, "-tef 1"));
    o.error_feedback = 0; // SRR with EF off explicitly: fine
    CHECK(tcfp12_validate(o) == "");
    // PDDS without EF
    o = Tcfp12Options();
    o.pdds = 1;
    CHECK(tcfp12_validate(o) == "");
    CHECK(llmc::tcfp12_uses_ef(o));
    o.error_feedback = 0;
    e = tcfp12_validate(o);
    CHECK(contains(e, "-tpdds 1"));
    CHECK(contains(e, "-tef 0"));
    // EF off alone, ABD with anything: fine
    o = Tcfp12Options();
    o.error_feedback = 0;
    o.abd = 1;
    CHECK(tcfp12_validate(o) == "");
    o.srr = 1;
    CHECK(tcfp12_validate(o) == "");
    // out-of-range switches
    o = Tcfp12Options();
    o.error_feedback = 2;
    CHECK(contains(tcfp12_validate(o), "-tef 2"));
    o = Tcfp12Options();
    o.abd = 3;
    CHECK(contains(tcfp12_validate(o), "-tabd 3"));
    CHECK(llmc::tcfp12_describe(Tcfp12Options()) == "TCFP-12 per tensor, EF");

    // the matrix reference enforces them (throws, does not exit), and checks shapes and buffers
    const std::vector<float> w(2 * 64, 0.5f);
    std::vector<float> ef(w.size(), 0.0f), ema(4, 0.0f);
    o = Tcfp12Options();
    o.srr = 1;
    o.pdds = 1;
    try {
        llmc::tcfp12_split_matrix(w.data(), 2, 64, o, nullptr, ema.data());
        FAIL("SRR + PDDS accepted");
    } catch (const std::invalid_argument& ex) {
        CHECK(contains(ex.what(), "-tsrr 1"));
        CHECK(contains(ex.what(), "-tpdds 1"));
    }
    o = Tcfp12Options();
    o.block_size = 128;
    CHECK_THROWS_AS(llmc::tcfp12_split_matrix(w.data(), 2, 64, o, ef.data(), nullptr), std::invalid_argument);
    o.block_size = 32;
    CHECK_THROWS_AS(llmc::tcfp12_split_matrix(w.data(), 2, 64, o, nullptr, nullptr), std::invalid_argument); // EF
    o.error_feedback = 0;
    CHECK_THROWS_AS(llmc::tcfp12_split_matrix(w.data(), 2, 64, o, ef.data(), nullptr), std::invalid_argument);
    o = Tcfp12Options();
    o.pdds = 1;
    CHECK_THROWS_AS(llmc::tcfp12_split_matrix(w.data(), 2, 64, o, ef.data(), nullptr), std::invalid_argument);
    CHECK_NOTHROW(llmc::tcfp12_split_matrix(w.data(), 2, 64, o, ef.data(), ema.data()));
}
