// Tests for llmc/formats/number_formats.h: the FP8/FP4/scale/fixed-point codecs.
//
// The expected values are computed here from first principles, never by the code under test:
// every format's table of values comes from the spec formula (sign, exponent field, mantissa
// field, bias) evaluated in double, anchored by the spec's stated constants (448, 57344, the
// E2M1 value list, ...), and the reference rounding is a search over that table.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "llmc/formats/number_formats.h"
#include "dev/test/cpu/test_util.h"

using llmc::Overflow;
using llmc::Rounding;

namespace {


// ---------------------------------------------------------------------------------------------
// Reference description of a small float format, and the code under test for it.

enum class Sp { IEEE, NanOnly, Finite };

struct Spec {
    const char* name;
    int e, m, bias;
    Sp specials;
    bool is_signed;
    bool always_saturates;     // the encoder ignores Overflow (E2M1, UE4M3, FP6)
    uint32_t nan_in_code;      // what a NaN input must encode to
    uint32_t nonsat_code;      // non-saturating overflow result for a positive input
    bool nonsat_keeps_sign;    // E5M2: -inf; E4M3: the canonical NaN has no sign
    uint32_t (*encode)(float, Overflow, Rounding, uint32_t);
    float (*decode)(uint32_t);

    int mag_bits() const { return e + m; }
    int total_bits() const { return e + m + (is_signed ? 1 : 0); }
    uint32_t sign_bit() const { return is_signed ? 1u << mag_bits() : 0u; }
};

// The value of a code by the spec formula: (-1)^s * 2^(E - bias) * (1 + M / 2^m) for E > 0,
// (-1)^s * 2^(1 - bias) * (M / 2^m) for E == 0, with the format's special codes.
double spec_value(const Spec& s, uint32_t code) {
    const uint32_t mag = code & ((1u << s.mag_bits()) - 1u);
    const bool neg = s.is_signed && ((code >> s.mag_bits()) & 1u);
    const uint32_t E = mag >> s.m, M = mag & ((1u << s.m) - 1u);
    const uint32_t e_all = (1u << s.e) - 1u, m_all = (1u << s.m) - 1u;
    double v;
    if (s.specials == Sp::IEEE && E == e_all) v = M != 0 ? NAN : INFINITY;
    else if (s.specials == Sp::NanOnly && E == e_all && M == m_all) v = NAN;
    else if (E == 0) v = std::ldexp((double)M, 1 - s.bias - s.m);
    else v = std::ldexp(1.0 + std::ldexp((double)M, -s.m), (int)E - s.bias);
    return neg ? -v : v;
}

uint32_t enc_e4m3(float x, Overflow o, Rounding r, uint32_t b) { return llmc::fp8e4m3_encode(x, o, r, b); }
uint32_t enc_e5m2(float x, Overflow o, Rounding r, uint32_t b) { return llmc::fp8e5m2_encode(x, o, r, b); }
uint32_t enc_e2m1(float x, Overflow, Rounding r, uint32_t b) { return llmc::fp4e2m1_encode(x, r, b); }
uint32_t enc_ue4m3(float x, Overflow, Rounding r, uint32_t b) { return llmc::ue4m3_encode(x, r, b); }
float dec_e4m3(uint32_t c) { return llmc::fp8e4m3_decode((uint8_t)c); }
float dec_e5m2(uint32_t c) { return llmc::fp8e5m2_decode((uint8_t)c); }
float dec_e2m1(uint32_t c) { return llmc::fp4e2m1_decode((uint8_t)c); }
float dec_ue4m3(uint32_t c) { return llmc::ue4m3_decode((uint8_t)c); }

// The MX FP6 formats, through the generic routine (the virtual-cast recipe's path).
constexpr llmc::MinifloatFormat kE2M3{2, 3, 1, llmc::Specials::FiniteOnly, true};
constexpr llmc::MinifloatFormat kE3M2{3, 2, 3, llmc::Specials::FiniteOnly, true};
uint32_t enc_e2m3(float x, Overflow o, Rounding r, uint32_t b) { return llmc::minifloat_encode(x, kE2M3, o, r, b); }
uint32_t enc_e3m2(float x, Overflow o, Rounding r, uint32_t b) { return llmc::minifloat_encode(x, kE3M2, o, r, b); }
float dec_e2m3(uint32_t c) { return llmc::minifloat_decode(c, kE2M3); }
float dec_e3m2(uint32_t c) { return llmc::minifloat_decode(c, kE3M2); }

const Spec kE4M3Spec{"E4M3", 4, 3, 7, Sp::NanOnly, true, false, 0x7F, 0x7F, false, enc_e4m3, dec_e4m3};
const Spec kE5M2Spec{"E5M2", 5, 2, 15, Sp::IEEE, true, false, 0x7E, 0x7C, true, enc_e5m2, dec_e5m2};
const Spec kE2M1Spec{"E2M1", 2, 1, 1, Sp::Finite, true, true, 0x7, 0x7, true, enc_e2m1, dec_e2m1};
const Spec kUE4M3Spec{"UE4M3", 4, 3, 7, Sp::NanOnly, false, true, 0x7F, 0x7E, false, enc_ue4m3, dec_ue4m3};
const Spec kE2M3Spec{"FP6 E2M3", 2, 3, 1, Sp::Finite, true, true, 0x1F, 0x1F, true, enc_e2m3, dec_e2m3};
const Spec kE3M2Spec{"FP6 E3M2", 3, 2, 3, Sp::Finite, true, true, 0x1F, 0x1F, true, enc_e3m2, dec_e3m2};
const Spec* const kAllSpecs[] = {&kE4M3Spec, &kE5M2Spec, &kE2M1Spec, &kUE4M3Spec, &kE2M3Spec, &kE3M2Spec};

// The non-negative finite values of a format in increasing order, with their codes, plus the
// "virtual" value above max (the next value if the exponent range were unbounded above).
struct Grid {
    std::vector<double> v;
    std::vector<uint32_t> code;
    double max = 0, next = 0;
    uint32_t max_code = 0;
};

Grid make_grid(const Spec& s) {
    Grid g;
    for (uint32_t c = 0; c < (1u << s.mag_bits()); c++) { // sign bit clear
        const double v = spec_value(s, c);
        if (std::isfinite(v)) {
            g.v.push_back(v);
            g.code.push_back(c);
        }
    }
    for (size_t i = 1; i < g.v.size(); i++) REQUIRE(g.v[i] > g.v[i - 1]); // monotone codes
    g.max = g.v.back();
    g.max_code = g.code.back();
    g.next = g.max + (g.max - g.v[g.v.size() - 2]); // the top binade's spacing
    return g;
}

const double kTwo32 = 4294967296.0;

// Reference encoder: RNE or SR (with the documented rule "round up iff r < floor(2^32 * frac)")
// from the table, then the documented overflow rule.
uint32_t ref_encode(const Spec& s, const Grid& g, float xf, Overflow ov, Rounding rnd, uint32_t r) {
    const double x = xf;
    if (std::isnan(x)) return s.nan_in_code;
    const bool neg = std::signbit(x);
    if (neg && !s.is_signed) return 0;
    const uint32_t sign = neg ? s.sign_bit() : 0u;
    const double a = std::fabs(x);
    bool overflow = false;
    uint32_t mag = 0;
    if (std::isinf(a)) {
        overflow = true;
    } else {
        double lo, hi;
        uint32_t lo_code, hi_code; // hi_code == max_code + 1 means the virtual value above max
        if (a >= g.max) {
            lo = g.max, hi = g.next, lo_code = g.max_code, hi_code = g.max_code + 1;
        } else {
            const size_t i = (size_t)(std::upper_bound(g.v.begin(), g.v.end(), a) - g.v.begin()) - 1;
            lo = g.v[i], hi = g.v[i + 1], lo_code = g.code[i], hi_code = g.code[i + 1];
        }
        bool up;
        if (a > hi) up = true; // beyond the virtual value: overflow for sure
        else if (rnd == Rounding::NearestEven) {
            const double dlo = a - lo, dhi = hi - a;
            up = dhi < dlo || (dhi == dlo && (lo_code & 1u));
        } else {
            const double F = std::floor((a - lo) / (hi - lo) * kTwo32);
            up = (double)r < F;
        }
        mag = up ? hi_code : lo_code;
        overflow = mag > g.max_code;
    }
    if (overflow) {
        if (ov == Overflow::Saturate || s.always_saturates) return sign | g.max_code;
        return (s.nonsat_keeps_sign ? sign : 0u) | s.nonsat_code;
    }
    return sign | mag;
}

bool same_float(double want, float got) {
    if (std::isnan(want)) return std::isnan(got);
    return want == (double)got && std::signbit(want) == std::signbit(got);
}

// ---------------------------------------------------------------------------------------------
// Decoding

TEST_CASE("number formats: spec tables match the stated constants") {
    const Grid e4 = make_grid(kE4M3Spec), e5 = make_grid(kE5M2Spec), e2 = make_grid(kE2M1Spec);
    CHECK(e4.max == 448.0);
    CHECK(e4.max_code == 0x7E);
    CHECK(e4.v[1] == std::ldexp(1.0, -9));  // smallest subnormal
    CHECK(e4.v[8] == std::ldexp(1.0, -6));  // smallest normal
    CHECK(e4.v.size() == 127);              // 0..0x7E
    CHECK(e5.max == 57344.0);
    CHECK(e5.max_code == 0x7B);
    CHECK(e5.v[1] == std::ldexp(1.0, -16));
    CHECK(e5.v[4] == std::ldexp(1.0, -14));
    CHECK(e5.v.size() == 124);              // 0..0x7B
    const std::vector<double> e2m1_values = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    CHECK(e2.v == e2m1_values);
    CHECK(make_grid(kE2M3Spec).max == 7.5);
    CHECK(make_grid(kE3M2Spec).max == 28.0);
    CHECK(llmc::kFP8E4M3.max_finite() == 448.0);
    CHECK(llmc::kFP8E5M2.max_finite() == 57344.0);
    CHECK(llmc::kFP4E2M1.max_finite() == 6.0);
    CHECK(llmc::kFP8E4M3Max == 448.0f);
    CHECK(llmc::kFP8E5M2Max == 57344.0f);
    CHECK(llmc::kFP4E2M1Max == 6.0f);
}

TEST_CASE("number formats: every code decodes to its spec value") {
    for (const Spec* s : kAllSpecs) {
        INFO(s->name);
        int fails = 0;
        for (uint32_t c = 0; c < (1u << s->total_bits()) && fails < 10; c++) {
            const double want = spec_value(*s, c);
            const float got = s->decode(c);
            EXPECT_IN_LOOP(same_float(want, got), "code " << c << ": want " << want << " got " << got);
        }
    }
    // explicit special codes
    CHECK(std::isnan(llmc::fp8e4m3_decode(0x7F)));
    CHECK(std::isnan(llmc::fp8e4m3_decode(0xFF)));
    CHECK(llmc::fp8e4m3_decode(0x7E) == 448.0f);
    CHECK(llmc::fp8e4m3_decode(0xFE) == -448.0f);
    CHECK(llmc::fp8e4m3_decode(0x01) == std::ldexp(1.0f, -9));
    CHECK(std::signbit(llmc::fp8e4m3_decode(0x80)));
    CHECK(llmc::fp8e4m3_decode(0x80) == 0.0f);
    CHECK(llmc::fp8e5m2_decode(0x7C) == INFINITY);
    CHECK(llmc::fp8e5m2_decode(0xFC) == -INFINITY);
    for (uint32_t c : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu, 0xFEu, 0xFFu}) CHECK(std::isnan(llmc::fp8e5m2_decode((uint8_t)c)));
    CHECK(llmc::fp8e5m2_decode(0x7B) == 57344.0f);
    CHECK(llmc::fp8e5m2_decode(0x01) == std::ldexp(1.0f, -16));
    CHECK(llmc::fp4e2m1_decode(0x7) == 6.0f);
    CHECK(llmc::fp4e2m1_decode(0xF) == -6.0f);
    CHECK(std::signbit(llmc::fp4e2m1_decode(0x8)));
    // E2M1 decodes the low nibble only; UE4M3 ignores bit 7
    for (uint32_t c = 0; c < 256; c++) {
        CHECK(same_float(spec_value(kE2M1Spec, c & 0xF), llmc::fp4e2m1_decode((uint8_t)c)));
        CHECK(same_float(spec_value(kE4M3Spec, c & 0x7F), llmc::ue4m3_decode((uint8_t)c)));
    }
}

TEST_CASE("number formats: E8M0 decodes every code to 2^(code-127), 0xFF to NaN") {
    for (uint32_t c = 0; c < 255; c++) {
        CAPTURE(c);
        CHECK((double)llmc::e8m0_decode((uint8_t)c) == std::ldexp(1.0, (int)c - 127));
    }
    CHECK(std::isnan(llmc::e8m0_decode(0xFF)));
}

// ---------------------------------------------------------------------------------------------
// Encoding: exact values, ties, subnormals, overflow (all against the table)

TEST_CASE("number formats: every representable value encodes to its own code") {
    std::mt19937 gen(12345);
    for (const Spec* s : kAllSpecs) {
        INFO(s->name);
        int fails = 0;
        for (uint32_t c = 0; c < (1u << s->total_bits()); c++) {
            const double v = spec_value(*s, c);
            if (!std::isfinite(v)) continue;
            for (Overflow ov : {Overflow::Saturate, Overflow::NonSaturate}) {
                const uint32_t rne = s->encode((float)v, ov, Rounding::NearestEven, 0);
                EXPECT_IN_LOOP(rne == c, "value " << v << ": want code " << c << " got " << rne);
                for (uint32_t r : {0u, 1u, 0x80000000u, 0xFFFFFFFFu, (uint32_t)gen()}) {
                    const uint32_t sr = s->encode((float)v, ov, Rounding::Stochastic, r);
                    EXPECT_IN_LOOP(sr == c, "SR value " << v << " r " << r << ": want " << c << " got " << sr);
                }
            }
        }
    }
    // +0 and -0 are distinct codes where the format has a sign
    CHECK(llmc::fp8e4m3_encode(-0.0f, Overflow::Saturate) == 0x80);
    CHECK(llmc::fp8e5m2_encode(-0.0f, Overflow::Saturate) == 0x80);
    CHECK(llmc::fp4e2m1_encode(-0.0f) == 0x8);
    CHECK(llmc::fp8e4m3_encode(0.0f, Overflow::Saturate) == 0x00);
    CHECK(llmc::ue4m3_encode(-0.0f) == 0x00);
}

TEST_CASE("number formats: midpoints round to the even neighbour, nextafter to the nearer") {
    for (const Spec* s : kAllSpecs) {
        INFO(s->name);
        const Grid g = make_grid(*s);
        int fails = 0;
        for (size_t i = 0; i + 1 < g.v.size(); i++) {
            const double lo = g.v[i], hi = g.v[i + 1], mid = 0.5 * (lo + hi);
            const float midf = (float)mid;
            REQUIRE((double)midf == mid);
            const uint32_t even = (g.code[i] & 1u) == 0 ? g.code[i] : g.code[i + 1];
            const float above = std::nextafter(midf, INFINITY), below = std::nextafter(midf, 0.0f);
            for (int sg : {1, -1}) {
                if (sg < 0 && !s->is_signed) continue;
                const uint32_t sb = sg < 0 ? s->sign_bit() : 0u;
                for (Overflow ov : {Overflow::Saturate, Overflow::NonSaturate}) {
                    const uint32_t t = s->encode(sg * midf, ov, Rounding::NearestEven, 0);
                    const uint32_t a = s->encode(sg * above, ov, Rounding::NearestEven, 0);
                    const uint32_t b = s->encode(sg * below, ov, Rounding::NearestEven, 0);
                    EXPECT_IN_LOOP(t == (sb | even), "tie " << sg * mid << " -> " << t);
                    EXPECT_IN_LOOP(a == (sb | g.code[i + 1]), "above tie " << sg * above << " -> " << a);
                    EXPECT_IN_LOOP(b == (sb | g.code[i]), "below tie " << sg * below << " -> " << b);
                }
            }
        }
    }
}

TEST_CASE("number formats: subnormal edge cases") {
    // E4M3: smallest subnormal 2^-9
    const float e4_min = std::ldexp(1.0f, -9);
    CHECK(llmc::fp8e4m3_encode(e4_min, Overflow::Saturate) == 0x01);
    CHECK(llmc::fp8e4m3_encode(-e4_min, Overflow::Saturate) == 0x81);
    CHECK(llmc::fp8e4m3_encode(0.5f * e4_min, Overflow::Saturate) == 0x00);   // tie -> even 0
    CHECK(llmc::fp8e4m3_encode(-0.5f * e4_min, Overflow::Saturate) == 0x80);  // -> -0
    CHECK(llmc::fp8e4m3_encode(std::nextafter(0.5f * e4_min, 1.0f), Overflow::Saturate) == 0x01);
    CHECK(llmc::fp8e4m3_encode(std::nextafter(0.5f * e4_min, 0.0f), Overflow::Saturate) == 0x00);
    CHECK(llmc::fp8e4m3_encode(1.5f * e4_min, Overflow::Saturate) == 0x02);   // tie 1|2 -> 2
    CHECK(llmc::fp8e4m3_encode(7.5f * e4_min, Overflow::Saturate) == 0x08);   // tie 7|8 -> min normal
    CHECK(llmc::fp8e4m3_encode(1e-30f, Overflow::Saturate) == 0x00);
    CHECK(llmc::fp8e4m3_encode(-1e-30f, Overflow::Saturate) == 0x80);
    CHECK(llmc::fp8e4m3_encode(1e-7f, Overflow::Saturate) == 0x00);            // below half the smallest subnormal: flushed to zero
    CHECK(llmc::fp8e4m3_encode(std::ldexp(1.0f, -140), Overflow::Saturate) == 0x00); // float subnormal in
    // E5M2: smallest subnormal 2^-16
    const float e5_min = std::ldexp(1.0f, -16);
    CHECK(llmc::fp8e5m2_encode(e5_min, Overflow::Saturate) == 0x01);
    CHECK(llmc::fp8e5m2_encode(0.5f * e5_min, Overflow::Saturate) == 0x00);
    CHECK(llmc::fp8e5m2_encode(std::nextafter(0.5f * e5_min, 1.0f), Overflow::Saturate) == 0x01);
    CHECK(llmc::fp8e5m2_encode(3.5f * e5_min, Overflow::Saturate) == 0x04);   // tie 3|4 -> min normal
    CHECK(llmc::fp8e5m2_encode(-2.5f * e5_min, Overflow::Saturate) == 0x82);  // tie 2|3 -> 2
    // E2M1: smallest subnormal 0.5
    CHECK(llmc::fp4e2m1_encode(0.25f) == 0x0);
    CHECK(llmc::fp4e2m1_encode(std::nextafter(0.25f, 1.0f)) == 0x1);
    CHECK(llmc::fp4e2m1_encode(-0.25f) == 0x8);
    CHECK(llmc::fp4e2m1_encode(0.75f) == 0x2);   // tie 0.5|1 -> 1.0 (even)
    CHECK(llmc::fp4e2m1_encode(2.5f) == 0x4);    // tie 2|3 -> 2
    CHECK(llmc::fp4e2m1_encode(3.5f) == 0x6);    // tie 3|4 -> 4
    CHECK(llmc::fp4e2m1_encode(5.0f) == 0x6);    // tie 4|6 -> 4
    // SR of a float32 subnormal input into E4M3: only 0 or the smallest subnormal
    CHECK(llmc::fp8e4m3_encode(std::ldexp(1.0f, -140), Overflow::Saturate, Rounding::Stochastic, 0xFFFFFFFFu) == 0x00);
    CHECK(llmc::fp8e4m3_encode(std::ldexp(1.0f, -140), Overflow::Saturate, Rounding::Stochastic, 0u) == 0x00);
    // 2^-10 is half the E4M3 smallest subnormal: F = 2^31
    CHECK(llmc::fp8e4m3_encode(std::ldexp(1.0f, -10), Overflow::Saturate, Rounding::Stochastic, 0x7FFFFFFFu) == 0x01);
    CHECK(llmc::fp8e4m3_encode(std::ldexp(1.0f, -10), Overflow::Saturate, Rounding::Stochastic, 0x80000000u) == 0x00);
}

TEST_CASE("number formats: overflow, infinities and NaN") {
    const Overflow S = Overflow::Saturate, N = Overflow::NonSaturate;
    const Rounding SR = Rounding::Stochastic;
    // E4M3: max 448, unbounded neighbour 480, midpoint 464 ties to even 448
    CHECK(llmc::fp8e4m3_encode(448.0f, N) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(std::nextafter(448.0f, 1e9f), N) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(464.0f, N) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(-464.0f, N) == 0xFE);
    CHECK(llmc::fp8e4m3_encode(std::nextafter(464.0f, 1e9f), N) == 0x7F);  // NaN
    CHECK(llmc::fp8e4m3_encode(-std::nextafter(464.0f, 1e9f), N) == 0x7F); // canonical NaN, no sign
    CHECK(llmc::fp8e4m3_encode(std::nextafter(464.0f, 1e9f), S) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(-std::nextafter(464.0f, 1e9f), S) == 0xFE);
    CHECK(llmc::fp8e4m3_encode(1e6f, S) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(-1e6f, S) == 0xFE);
    CHECK(llmc::fp8e4m3_encode(1e6f, N) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(FLT_MAX, N) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(FLT_MAX, S) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(INFINITY, S) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(-INFINITY, S) == 0xFE);
    CHECK(llmc::fp8e4m3_encode(INFINITY, N) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(-INFINITY, N) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(NAN, S) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(-NAN, N) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(NAN, S, SR, 123u) == 0x7F);
    // SR between 448 and 480: rounds up (overflow) iff r < F; 456 is 1/4 of the way: F = 2^30
    CHECK(llmc::fp8e4m3_encode(456.0f, N, SR, 0x3FFFFFFFu) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(456.0f, N, SR, 0x40000000u) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(456.0f, S, SR, 0u) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(480.0f, N, SR, 0xFFFFFFFFu) == 0x7F);  // at/above 480: always overflow
    CHECK(llmc::fp8e4m3_encode(480.0f, S, SR, 0xFFFFFFFFu) == 0x7E);
    CHECK(llmc::fp8e4m3_encode(INFINITY, N, SR, 0xFFFFFFFFu) == 0x7F);
    CHECK(llmc::fp8e4m3_encode(INFINITY, S, SR, 0u) == 0x7E);

    // E5M2: max 57344, unbounded neighbour 65536, midpoint 61440 ties to 65536 (even) = overflow
    CHECK(llmc::fp8e5m2_encode(57344.0f, N) == 0x7B);
    CHECK(llmc::fp8e5m2_encode(std::nextafter(61440.0f, 0.0f), N) == 0x7B);
    CHECK(llmc::fp8e5m2_encode(61440.0f, N) == 0x7C);
    CHECK(llmc::fp8e5m2_encode(-61440.0f, N) == 0xFC);
    CHECK(llmc::fp8e5m2_encode(61440.0f, S) == 0x7B);
    CHECK(llmc::fp8e5m2_encode(-61440.0f, S) == 0xFB);
    CHECK(llmc::fp8e5m2_encode(1e9f, N) == 0x7C);
    CHECK(llmc::fp8e5m2_encode(1e9f, S) == 0x7B);
    CHECK(llmc::fp8e5m2_encode(INFINITY, N) == 0x7C);
    CHECK(llmc::fp8e5m2_encode(-INFINITY, N) == 0xFC);
    CHECK(llmc::fp8e5m2_encode(INFINITY, S) == 0x7B);   // OCP saturating: inf -> max
    CHECK(llmc::fp8e5m2_encode(-INFINITY, S) == 0xFB);
    CHECK(llmc::fp8e5m2_encode(NAN, S) == 0x7E);
    CHECK(llmc::fp8e5m2_encode(-NAN, N) == 0x7E);
    CHECK(llmc::fp8e5m2_encode(NAN, N, SR, 5u) == 0x7E);
    CHECK(llmc::fp8e5m2_encode(59392.0f, N, SR, 0x3FFFFFFFu) == 0x7C); // 1/4 of 57344..65536
    CHECK(llmc::fp8e5m2_encode(59392.0f, N, SR, 0x40000000u) == 0x7B);

    // E2M1 and UE4M3 always saturate
    CHECK(llmc::fp4e2m1_encode(6.5f) == 0x7);
    CHECK(llmc::fp4e2m1_encode(7.0f) == 0x7);
    CHECK(llmc::fp4e2m1_encode(1e30f) == 0x7);
    CHECK(llmc::fp4e2m1_encode(-1e30f) == 0xF);
    CHECK(llmc::fp4e2m1_encode(INFINITY) == 0x7);
    CHECK(llmc::fp4e2m1_encode(-INFINITY) == 0xF);
    CHECK(llmc::fp4e2m1_encode(NAN) == 0x7);   // NaN -> +6 (documented)
    CHECK(llmc::fp4e2m1_encode(-NAN) == 0x7);
    CHECK(llmc::fp4e2m1_encode(7.0f, SR, 0u) == 0x7);
    CHECK(llmc::ue4m3_encode(1e6f) == 0x7E);
    CHECK(llmc::ue4m3_encode(INFINITY) == 0x7E);
    CHECK(llmc::ue4m3_encode(NAN) == 0x7F);
    CHECK(llmc::ue4m3_encode(-1.0f) == 0x00);
    CHECK(llmc::ue4m3_encode(-INFINITY) == 0x00);
    CHECK(llmc::ue4m3_encode(448.0f) == 0x7E);
    CHECK(llmc::ue4m3_encode(3.0f) == 0x44); // 1.5 * 2^1: exponent field 8, mantissa 4
}

// Random floats over each format's range (and beyond), against the reference, both roundings.
TEST_CASE("number formats: random inputs match the reference rounding") {
    std::mt19937 gen(2024);
    for (const Spec* s : kAllSpecs) {
        INFO(s->name);
        const Grid g = make_grid(*s);
        const int emin = 1 - s->bias, emax = (int)std::ceil(std::log2(g.max));
        std::uniform_int_distribution<int> exp_dist(emin - s->m - 12, emax + 3);
        int fails = 0;
        for (int it = 0; it < 200000 && fails < 10; it++) {
            // random sign, random 23-bit mantissa, random exponent in range; sometimes exact/edge
            const uint32_t mant = gen() & 0x7FFFFFu;
            float x = std::ldexp(1.0f + (float)mant / 8388608.0f, exp_dist(gen));
            if (gen() & 1u) x = -x;
            const uint32_t r = (uint32_t)gen();
            for (Overflow ov : {Overflow::Saturate, Overflow::NonSaturate}) {
                for (Rounding rnd : {Rounding::NearestEven, Rounding::Stochastic}) {
                    const uint32_t want = ref_encode(*s, g, x, ov, rnd, r);
                    const uint32_t got = s->encode(x, ov, rnd, r);
                    EXPECT_IN_LOOP(want == got, "x " << x << " ov " << (int)ov << " rnd " << (int)rnd
                                                     << " r " << r << ": want " << want << " got " << got);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Stochastic rounding

TEST_CASE("number formats: SR threshold is exactly floor(2^32 * (x - lo) / (hi - lo))") {
    std::mt19937 gen(77);
    for (const Spec* s : kAllSpecs) {
        INFO(s->name);
        const Grid g = make_grid(*s);
        int fails = 0;
        // points at random fractions between each pair of neighbours
        for (size_t i = 0; i + 1 < g.v.size() && fails < 10; i++) {
            const double lo = g.v[i], hi = g.v[i + 1];
            for (int k = 0; k < 20; k++) {
                const float x = (float)(lo + (hi - lo) * ((gen() & 0xFFFFFFu) / 16777216.0));
                if ((double)x <= lo || (double)x >= hi) continue;
                const double F = std::floor(((double)x - lo) / (hi - lo) * kTwo32);
                REQUIRE(F >= 1.0);
                const uint32_t f = (uint32_t)F;
                const uint32_t up = s->encode(x, Overflow::Saturate, Rounding::Stochastic, f - 1u);
                const uint32_t down = s->encode(x, Overflow::Saturate, Rounding::Stochastic, f);
                EXPECT_IN_LOOP(up == g.code[i + 1], "x " << x << " r=F-1 -> " << up);
                EXPECT_IN_LOOP(down == g.code[i], "x " << x << " r=F -> " << down);
            }
        }
    }
}

TEST_CASE("number formats: SR is unbiased (1e6 draws) and only produces the two neighbours") {
    struct Case {
        const Spec* s;
        float x;
    };
    const Case cases[] = {
        {&kE4M3Spec, 0.3f},     {&kE4M3Spec, -5.3f},     {&kE4M3Spec, 300.7f},
        {&kE4M3Spec, 0.003f},   {&kE4M3Spec, -0.0009f},  // subnormal range, and below the smallest
        {&kE5M2Spec, 0.3f},     {&kE5M2Spec, -1000.3f},  {&kE5M2Spec, 3e-5f}, {&kE5M2Spec, 5e-6f},
        {&kE2M1Spec, 0.3f},     {&kE2M1Spec, 0.7f},      {&kE2M1Spec, -2.6f}, {&kE2M1Spec, 5.1f},
        {&kUE4M3Spec, 0.3f},    {&kUE4M3Spec, 250.0f},   {&kUE4M3Spec, 0.0031f},
    };
    std::mt19937 gen(31337);
    const int n = 1000000;
    for (const Case& c : cases) {
        INFO(c.s->name << " x=" << c.x);
        const Grid g = make_grid(*c.s);
        const double a = std::fabs((double)c.x);
        const size_t i = (size_t)(std::upper_bound(g.v.begin(), g.v.end(), a) - g.v.begin()) - 1;
        const double lo = g.v[i], hi = g.v[i + 1];
        REQUIRE(lo < a);
        REQUIRE(a < hi);
        const uint32_t sb = c.x < 0 ? c.s->sign_bit() : 0u;
        const uint32_t lo_code = sb | g.code[i], hi_code = sb | g.code[i + 1];
        double sum = 0;
        long others = 0;
        for (int k = 0; k < n; k++) {
            const uint32_t code = c.s->encode(c.x, Overflow::Saturate, Rounding::Stochastic, (uint32_t)gen());
            if (code != lo_code && code != hi_code) others++;
            sum += (double)c.s->decode(code);
        }
        CHECK(others == 0);
        const double p = (a - lo) / (hi - lo);
        const double se = (hi - lo) * std::sqrt(p * (1 - p) / n);
        const double mean = sum / n;
        CHECK(std::fabs(mean - (double)c.x) < 5 * se);
    }
}

// ---------------------------------------------------------------------------------------------
// The generic routine on other IEEE formats: BF16 (E8M7) and FP16 (E5M10).

TEST_CASE("number formats: generic minifloat matches BF16 and FP16 round-to-nearest-even") {
    const llmc::MinifloatFormat bf16{8, 7, 127, llmc::Specials::IEEE, true};
    std::mt19937 gen(99);
    int fails = 0;
    for (int it = 0; it < 300000 && fails < 10; it++) {
        uint32_t u = (uint32_t)gen();
        if (it < 1000) u &= 0x807FFFFFu; // float32 subnormals too
        float x;
        std::memcpy(&x, &u, 4);
        if (std::isnan(x)) continue;
        // the classic bit formula: add 0x7FFF plus the kept LSB, truncate (overflows to inf)
        const uint32_t want = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        const uint32_t got = llmc::minifloat_encode(x, bf16, Overflow::NonSaturate);
        EXPECT_IN_LOOP(want == got, "bf16 of bits " << u << ": want " << want << " got " << got);
        const uint32_t back = want << 16;
        float bf;
        std::memcpy(&bf, &back, 4);
        EXPECT_IN_LOOP(same_float(bf, llmc::minifloat_decode(want, bf16)), "bf16 decode " << want);
    }
    CHECK(std::isnan(llmc::minifloat_decode(0x7FC1u, bf16)));
    CHECK(llmc::minifloat_encode(NAN, bf16, Overflow::NonSaturate) == 0x7FC0u);
#if defined(__FLT16_MAX__)
    const llmc::MinifloatFormat fp16{5, 10, 15, llmc::Specials::IEEE, true};
    for (int it = 0; it < 300000 && fails < 10; it++) {
        const uint32_t mant = (uint32_t)gen() & 0x7FFFFFu;
        float x = std::ldexp(1.0f + (float)mant / 8388608.0f, (int)(gen() % 48) - 30);
        if (gen() & 1u) x = -x;
        const _Float16 h = (_Float16)x; // the compiler's conversion: RNE, overflow to inf
        uint16_t hb;
        std::memcpy(&hb, &h, 2);
        const uint32_t got = llmc::minifloat_encode(x, fp16, Overflow::NonSaturate);
        EXPECT_IN_LOOP(got == hb, "fp16 of " << x << ": want " << hb << " got " << got);
        EXPECT_IN_LOOP(same_float((float)h, llmc::minifloat_decode(hb, fp16)), "fp16 decode " << hb);
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// E8M0 encoders

TEST_CASE("number formats: E8M0 floor / ceil / nearest") {
    // powers of two: exact for every variant
    for (int c = 0; c < 255; c++) {
        CAPTURE(c);
        const float p = std::ldexp(1.0f, c - 127);
        CHECK(llmc::e8m0_encode_floor(p) == c);
        CHECK(llmc::e8m0_encode_ceil(p) == c);
        CHECK(llmc::e8m0_encode_nearest(p) == c);
        CHECK(llmc::e8m0_encode_floor(-p) == c); // the sign is ignored
    }
    // values between 2^k and 2^(k+1)
    for (int c = 0; c < 254; c++) {
        CAPTURE(c);
        const float p = std::ldexp(1.0f, c - 127);
        const float x125 = 1.25f * p, x15 = 1.5f * p, below2 = std::nextafter(2.0f * p, 0.0f);
        CHECK(llmc::e8m0_encode_floor(x125) == c);
        CHECK(llmc::e8m0_encode_ceil(x125) == c + 1);
        CHECK(llmc::e8m0_encode_nearest(x125) == c);
        CHECK(llmc::e8m0_encode_floor(x15) == c);
        CHECK(llmc::e8m0_encode_nearest(x15) == c + 1); // tie: up
        CHECK(llmc::e8m0_encode_nearest(std::nextafter(x15, 0.0f)) == c);
        CHECK(llmc::e8m0_encode_floor(below2) == c);
        CHECK(llmc::e8m0_encode_ceil(below2) == c + 1);
        CHECK(llmc::e8m0_encode_nearest(below2) == c + 1);
        CHECK(llmc::e8m0_encode_ceil(std::nextafter(p, INFINITY)) == c + 1);
    }
    // tiny, zero, huge, inf, NaN
    for (float x : {0.0f, -0.0f, std::ldexp(1.0f, -149), std::ldexp(1.0f, -128), 1e-45f}) {
        CAPTURE(x);
        CHECK(llmc::e8m0_encode_floor(x) == 0);
        CHECK(llmc::e8m0_encode_ceil(x) == 0);
        CHECK(llmc::e8m0_encode_nearest(x) == 0);
    }
    CHECK(llmc::e8m0_encode_nearest(std::ldexp(1.0f, -128) * 3.0f) == 1); // 1.5 * 2^-127: tie, up
    CHECK(llmc::e8m0_encode_ceil(std::nextafter(std::ldexp(1.0f, -127), 1.0f)) == 1);
    for (float x : {FLT_MAX, -FLT_MAX, std::ldexp(1.5f, 127), INFINITY, -INFINITY}) {
        CAPTURE(x);
        CHECK(llmc::e8m0_encode_floor(x) == 254);
        CHECK(llmc::e8m0_encode_ceil(x) == 254);
        CHECK(llmc::e8m0_encode_nearest(x) == 254);
    }
    CHECK(llmc::e8m0_encode_nearest(std::nextafter(std::ldexp(1.5f, 127), 0.0f)) == 254);
    CHECK(llmc::e8m0_encode_floor(NAN) == 0xFF);
    CHECK(llmc::e8m0_encode_ceil(NAN) == 0xFF);
    CHECK(llmc::e8m0_encode_nearest(-NAN) == 0xFF);
    // floor(x) <= x < 2 floor(x) and ceil(x) / 2 < x <= ceil(x) for random normal x
    std::mt19937 gen(5);
    int fails = 0;
    for (int it = 0; it < 100000 && fails < 10; it++) {
        const float x = std::ldexp(1.0f + (float)(gen() & 0x7FFFFFu) / 8388608.0f, (int)(gen() % 252) - 125);
        const double f = llmc::e8m0_decode(llmc::e8m0_encode_floor(x));
        const double c = llmc::e8m0_decode(llmc::e8m0_encode_ceil(x));
        const double nr = llmc::e8m0_decode(llmc::e8m0_encode_nearest(x));
        EXPECT_IN_LOOP(f <= x && x < 2 * f, "floor " << x);
        EXPECT_IN_LOOP(c >= x && x > 0.5 * c, "ceil " << x);
        EXPECT_IN_LOOP(std::fabs(nr - x) <= std::fabs(x - f) && std::fabs(nr - x) <= std::fabs(c - x), "nearest " << x);
    }
}

// ---------------------------------------------------------------------------------------------
// Q1.15 and Q1.31

TEST_CASE("number formats: Q1.15 decode, fixed points, clamp, ties, sign symmetry") {
    // every code decodes to k / 32768
    for (int k = -32768; k <= 32767; k++) {
        if (llmc::q115_decode((int16_t)k) != (float)((double)k / 32768.0)) {
            FAIL_CHECK("decode " << k);
            break;
        }
    }
    // the clamp: 0.999f * 32768 = 32735.232... -> 32735
    CHECK(std::floor((double)0.999f * 32768.0) == 32735.0);
    CHECK(llmc::Q115_OVERFLOW_THRESHOLD == 0.999f);
    CHECK(llmc::q115_encode(0.999f) == 32735);
    CHECK(llmc::q115_encode(-0.999f) == -32735);
    CHECK(llmc::simulate_q115(0.999f) == 32735.0f / 32768.0f);
    for (float x : {0.9995f, 1.0f, 2.0f, 1e30f, FLT_MAX, INFINITY}) {
        CAPTURE(x);
        CHECK(llmc::q115_encode(x) == 32735);
        CHECK(llmc::q115_encode(-x) == -32735);
        CHECK(llmc::simulate_q115(x) == 32735.0f / 32768.0f);
        CHECK(llmc::simulate_q115(-x) == -32735.0f / 32768.0f);
    }
    // k / 32768 is a fixed point for |k| <= 32735; above the clamp it goes to +-32735
    for (int k = -32768; k <= 32767; k++) {
        const float x = (float)k / 32768.0f;
        const int want = k > 32735 ? 32735 : (k < -32735 ? -32735 : k);
        if (llmc::q115_encode(x) != want || llmc::simulate_q115(x) != (float)want / 32768.0f) {
            FAIL_CHECK("k " << k);
            break;
        }
    }
    // ties (k + 0.5) / 32768 -> even k; just above/below -> nearer
    for (int k : {0, 1, 2, 3, 100, 101, 32733, 32734, -1, -2, -3, -32734, -32735}) {
        CAPTURE(k);
        const float tie = ((float)k + 0.5f) / 32768.0f;
        const int even = (k % 2 == 0) ? k : k + 1;
        CHECK(llmc::q115_encode(tie) == even);
        CHECK(llmc::q115_encode(std::nextafter(tie, 2.0f)) == k + 1);
        CHECK(llmc::q115_encode(std::nextafter(tie, -2.0f)) == k);
    }
    CHECK(llmc::q115_encode(1e-6f) == 0);
    CHECK(llmc::simulate_q115(-1e-6f) == 0.0f);
    // NaN: code 0, but simulate keeps it a NaN, always 0x7FFFFFFF (the device's NaN-propagating min/max)
    CHECK(llmc::q115_encode(NAN) == 0);
    for (uint32_t nan_bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
        CAPTURE(nan_bits);
        CHECK(llmc::float_bits(llmc::simulate_q115(llmc::bits_float(nan_bits))) == llmc::Q115_NAN_BITS);
        CHECK(llmc::float_bits(llmc::simulate_q115_of_probability(llmc::bits_float(nan_bits))) == llmc::Q115_NAN_BITS);
    }
    // sign symmetry
    std::mt19937 gen(8);
    std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
    int fails = 0;
    for (int it = 0; it < 100000 && fails < 10; it++) {
        const float x = dist(gen);
        EXPECT_IN_LOOP(llmc::simulate_q115(-x) == -llmc::simulate_q115(x), "x " << x);
        // reference in double: clamp to +-0.999f, scale, round half to even, scale back
        const double c = std::max(-(double)0.999f, std::min((double)0.999f, (double)x));
        const double want = std::nearbyint(c * 32768.0) / 32768.0;
        EXPECT_IN_LOOP((double)llmc::simulate_q115(x) == want, "x " << x);
    }
}

TEST_CASE("number formats: Q1.31 clamp, fixed points, ties, decode") {
    const double two31 = 2147483648.0;
    // 0.999f * 2^31 is an integer: the clamp value is exact
    CHECK((double)0.999f * two31 == 2145336192.0);
    CHECK(llmc::q131_encode(0.999f) == 2145336192);
    CHECK(llmc::q131_encode(-0.999f) == -2145336192);
    for (float x : {0.9995f, 1.0f, 3.0f, FLT_MAX, INFINITY}) {
        CAPTURE(x);
        CHECK(llmc::q131_encode(x) == 2145336192);
        CHECK(llmc::q131_encode(-x) == -2145336192);
        CHECK((double)llmc::simulate_q131(x) == (double)0.999f);
        CHECK((double)llmc::simulate_q131(-x) == -(double)0.999f);
    }
    // ties at the bottom: (k + 0.5) * 2^-31 -> even k
    for (int k : {0, 1, 2, 3, 1000, 1001, -1, -2, -1001}) {
        CAPTURE(k);
        const float tie = (float)(((double)k + 0.5) / two31);
        const int even = (k % 2 == 0) ? k : k + 1;
        CHECK(llmc::q131_encode(tie) == even);
        CHECK(llmc::q131_encode(std::nextafter(tie, 2.0f)) == k + 1);
        CHECK(llmc::q131_encode(std::nextafter(tie, -2.0f)) == k);
    }
    CHECK(llmc::q131_encode(std::ldexp(1.0f, -33)) == 0);
    CHECK(llmc::q131_encode(std::ldexp(3.0f, -33)) == 1);
    // fixed points: k / 2^31 for k with at most 24 significant bits; |x| >= 2^-8 in float is
    // always a multiple of 2^-31, so simulate_q131 is the identity there (below the clamp)
    std::mt19937 gen(3);
    int fails = 0;
    for (int it = 0; it < 100000 && fails < 10; it++) {
        const int32_t k = (int32_t)(((gen() & 0xFFFFFFu) | 1u) << (gen() % 7)) * ((gen() & 1u) ? -1 : 1);
        const float x = (float)((double)k / two31);
        REQUIRE((double)x * two31 == (double)k);
        EXPECT_IN_LOOP(llmc::q131_encode(x) == k, "k " << k);
        EXPECT_IN_LOOP(llmc::simulate_q131(x) == x, "k " << k);
        const float y = std::ldexp(1.0f + (float)(gen() & 0x7FFFFFu) / 8388608.0f, -(int)(gen() % 8) - 1);
        if (std::fabs(y) <= 0.999f) EXPECT_IN_LOOP(llmc::simulate_q131(y) == y, "y " << y);
        EXPECT_IN_LOOP(llmc::simulate_q131(-y) == -llmc::simulate_q131(y), "sym " << y);
    }
    // decode: k * 2^-31 rounded to float
    for (int32_t k : {0, 1, -1, 12345, -12345, 16777217, 2145336192, INT32_MAX, INT32_MIN}) {
        CAPTURE(k);
        CHECK(llmc::q131_decode(k) == (float)((double)k / two31));
    }
    CHECK(llmc::q131_decode(INT32_MIN) == -1.0f);
    CHECK(llmc::q131_encode(NAN) == 0);
    CHECK(std::isnan(llmc::simulate_q131(NAN)));
}

// simulate_q115 / simulate_q131 compute decode(encode(x)) in FP32 arithmetic (formats/number_formats.h):
// the same bits as the integer codec for every BF16 input, a stride through all float bit patterns
// (both signs, zeros, subnormals, infinities, NaNs) and the neighbourhood of every Q1.15 tie
TEST_CASE("number formats: simulate_q115 and simulate_q131 equal decode(encode(x)) bit for bit") {
    auto same = [](float a, float b) { return llmc::float_bits(a) == llmc::float_bits(b) || (a != a && b != b); };
    auto check_x = [&](float x, int& fails) {
        const float q15 = std::isnan(x) ? x : llmc::q115_decode(llmc::q115_encode(x));
        const float q31 = std::isnan(x) ? x : llmc::q131_decode(llmc::q131_encode(x));
        EXPECT_IN_LOOP(same(llmc::simulate_q115(x), q15), "q115 x " << x << " bits " << llmc::float_bits(x));
        EXPECT_IN_LOOP(same(llmc::simulate_q131(x), q31), "q131 x " << x << " bits " << llmc::float_bits(x));
    };
    int fails = 0;
    for (uint32_t b = 0; b < 65536 && fails < 10; b++) check_x(llmc::bits_float(b << 16), fails);
    for (uint64_t b = 0; b < (1ull << 32) && fails < 10; b += 251) check_x(llmc::bits_float((uint32_t)b), fails);
    for (int k = -32768; k <= 32767 && fails < 10; k++) {
        const float tie = ((float)k + 0.5f) / 32768.0f;
        float lo = tie, hi = tie;
        for (int i = 0; i < 4; i++) { lo = std::nextafter(lo, -2.0f); hi = std::nextafter(hi, 2.0f); }
        for (float x = lo; x <= hi && fails < 10; x = std::nextafter(x, 2.0f)) check_x(x, fails);
    }
    for (int e = -40; e <= -8 && fails < 10; e++) {   // Q1.31 ties near the bottom, where it rounds
        for (int k = 0; k < 64; k++) {
            const float tie = (float)(((double)k + 0.5) / 2147483648.0);
            for (float x : {tie, std::nextafter(tie, 1.0f), std::nextafter(tie, -1.0f), -tie, std::ldexp(1.0f + k / 64.0f, e)})
                check_x(x, fails);
        }
    }
    CHECK(fails == 0);
}

// the softmax output's shortcut (no lower clamp) is simulate_q115 bit for bit wherever it may be used:
// every x >= -0.999 (every BF16 value and a stride through all floats there, both zeros, +inf, the
// neighbourhood of every Q1.15 tie and of the clamp); below -0.999 it is not (the check that the
// test can fail)
TEST_CASE("number formats: simulate_q115_of_probability equals simulate_q115 for x >= -0.999") {
    const float lowest = -llmc::Q115_OVERFLOW_THRESHOLD;
    int fails = 0, checked = 0;
    auto check_x = [&](float x) {
        if (!(x >= lowest) && !std::isnan(x)) return;
        checked++;
        EXPECT_IN_LOOP(llmc::float_bits(llmc::simulate_q115_of_probability(x)) == llmc::float_bits(llmc::simulate_q115(x)),
                       "x " << x << " bits " << llmc::float_bits(x));
    };
    for (uint32_t b = 0; b < 65536 && fails < 10; b++) check_x(llmc::bits_float(b << 16));
    for (uint64_t b = 0; b < (1ull << 32) && fails < 10; b += 241) check_x(llmc::bits_float((uint32_t)b));
    for (int k = -32735; k <= 32767 && fails < 10; k++) {
        const float tie = ((float)k + 0.5f) / 32768.0f;
        float lo = tie, hi = tie;
        for (int i = 0; i < 3; i++) { lo = std::nextafter(lo, -2.0f); hi = std::nextafter(hi, 2.0f); }
        for (float x = lo; x <= hi && fails < 10; x = std::nextafter(x, 2.0f)) check_x(x);
    }
    for (float x : {lowest, std::nextafter(lowest, 0.0f), llmc::Q115_OVERFLOW_THRESHOLD, 1.0f, INFINITY, 0.0f, -0.0f})
        check_x(x);
    CHECK(checked > 10000000);
    CHECK(fails == 0);
    CHECK(llmc::simulate_q115_of_probability(-1.0f) != llmc::simulate_q115(-1.0f));
}

// the shortcut for BF16 inputs is the composition, bit for bit, for every BF16 value (the device's
// GEMM outputs) and for other floats (which take the full road)
TEST_CASE("number formats: simulate_q115_of_q131 equals simulate_q115(simulate_q131(x))") {
    auto same = [](float a, float b) { return llmc::float_bits(a) == llmc::float_bits(b) || (a != a && b != b); };
    int fails = 0;
    auto check_x = [&](float x) {
        EXPECT_IN_LOOP(same(llmc::simulate_q115_of_q131(x), llmc::simulate_q115(llmc::simulate_q131(x))),
                       "x " << x << " bits " << llmc::float_bits(x));
    };
    for (uint32_t b = 0; b < 65536 && fails < 10; b++) check_x(llmc::bits_float(b << 16));
    for (uint64_t b = 0; b < (1ull << 32) && fails < 10; b += 509) check_x(llmc::bits_float((uint32_t)b));
    // the double rounding that only non-BF16 floats meet, so the full road matters there: just below a
    // Q1.15 tie, within half a Q1.31 step, q131 lands on the tie and q115 rounds it to even (up, for an
    // odd k), where q115 alone rounds down
    int double_rounded = 0;
    for (int k = 1; k < 64 && fails < 10; k += 2) {
        const float tie = ((float)k + 0.5f) / 32768.0f;   // below 2^-8: Q1.31 rounds there
        float x = tie;
        for (int i = 0; i < 16; i++) {
            x = std::nextafter(x, 0.0f);
            check_x(x);
            check_x(-x);
            double_rounded += llmc::simulate_q115(llmc::simulate_q131(x)) != llmc::simulate_q115(x);
        }
    }
    CHECK(double_rounded > 0);
    CHECK(fails == 0);
}

// float -> BF16 -> float, round to nearest even (finite inputs)
float bf16_round(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    float y;
    std::memcpy(&y, &u, 4);
    return y;
}

TEST_CASE("number formats: Q1.15 on BF16 values (the identities llmc/recipes/q115/recipe.h relies on)") {
    // over every finite BF16 value v (a GEMM's BF16 output, or a stored BF16 boundary):
    //  1. simulate_q115(simulate_q131(v)) == simulate_q115(v): a reader that applies the GEMM's
    //     post-quantization and then its own simulate_q115 sees what a separate post-GEMM pass gives
    //  2. BF16(simulate_q115(v)) == simulate_q115(v) unless v clamps: storing the quantized value in
    //     BF16 loses nothing below the clamp; at the clamp, 32735/32768 is stored as 1.0
    //  3. reading a stored value through simulate_q115 again changes only +-1.0 (to +-32735/32768)
    //  4. simulate_q115 is idempotent (a reader of an unstored GEMM output need not apply it twice)
    int fails = 0, clamped = 0;
    for (uint32_t bits = 0; bits < 65536 && fails < 10; bits++) {
        const float v = llmc::bits_float(bits << 16);
        if (!std::isfinite(v)) continue;
        const float q = llmc::simulate_q115(v);
        // (bit for bit: the recipe's matmul-output hook applies simulate_q115 alone to BF16 values)
        EXPECT_IN_LOOP(llmc::float_bits(llmc::simulate_q115(llmc::simulate_q131(v))) == llmc::float_bits(q), "v " << v);
        if (std::fabs(v) <= 0.999f) {
            EXPECT_IN_LOOP(bf16_round(q) == q, "v " << v << " q " << q);
        } else {
            clamped++;
            EXPECT_IN_LOOP(std::fabs(bf16_round(q)) == 1.0f, "v " << v);
        }
        EXPECT_IN_LOOP(llmc::simulate_q115(q) == q, "v " << v);
        const float stored = bf16_round(q);
        const float reread = llmc::simulate_q115(stored);
        if (std::fabs(stored) == 1.0f) {
            EXPECT_IN_LOOP(std::fabs(reread) == 32735.0f / 32768.0f, "v " << v);
        } else {
            EXPECT_IN_LOOP(reread == stored, "v " << v);
        }
    }
    CHECK(clamped > 30000); // every BF16 value of magnitude >= 1, both signs
    CHECK(bf16_round(32735.0f / 32768.0f) == 1.0f);
    CHECK(bf16_round(32640.0f / 32768.0f) == 32640.0f / 32768.0f); // the largest BF16 below 0.999
}

} // namespace

TEST_CASE("number formats: the UE4M3 fast codec equals the generic minifloat codec") {
    int fails = 0;
    for (int code = 0; code < 256; code++) {
        const float want = llmc::minifloat_decode((uint32_t)code, llmc::kUE4M3), have = llmc::ue4m3_decode((uint8_t)code);
        EXPECT_IN_LOOP(llmc::float_bits(have) == llmc::float_bits(want) || (want != want && have != have),
                       "code " << code << ": fast " << have << " generic " << want);
    }
    // every 256th float32 bit pattern, plus every pattern within 4096 ulps of each UE4M3 value and
    // midpoint (where rounding decides), both signs; NaNs, infinities, zeros and float subnormals too
    auto check_one = [&](uint32_t u) {
        const float x = llmc::bits_float(u);
        const uint32_t want = llmc::minifloat_encode(x, llmc::kUE4M3, Overflow::Saturate, Rounding::NearestEven);
        EXPECT_IN_LOOP(llmc::ue4m3_encode_nearest(x) == want && llmc::ue4m3_encode(x) == want,
                       "x bits " << u << ": fast " << (int)llmc::ue4m3_encode_nearest(x) << " generic " << want);
    };
    for (uint64_t u = 0; u < (1ull << 32) && fails < 5; u += 256) check_one((uint32_t)u);
    for (uint32_t u : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x00000001u, 0x007FFFFFu})
        check_one(u);
    int points = 0;
    for (int code = 0; code <= 0x7E; code++) {
        const float v = llmc::minifloat_decode((uint32_t)code, llmc::kUE4M3);
        const float next = code < 0x7E ? llmc::minifloat_decode((uint32_t)code + 1u, llmc::kUE4M3) : 480.0f;
        for (float p : {v, (float)(((double)v + (double)next) / 2.0)}) {
            points++;
            for (int sign = 0; sign < 2; sign++)
                for (int d = -4096; d <= 4096 && fails < 5; d++) {
                    const int64_t u = (int64_t)llmc::float_bits(p) + d;
                    if (u >= 0 && u < 0x7F800000) check_one((uint32_t)u | (sign ? 0x80000000u : 0u));
                }
        }
    }
    CHECK(points == 254);
    CHECK(fails == 0);
}

TEST_CASE("number formats: the E2M1 fast paths equal the generic minifloat codec") {
    // every 256th float32 bit pattern, plus every pattern within 4096 ulps of each E2M1 midpoint
    // and value (the places where rounding decides), both signs
    int fails = 0;
    auto check_one = [&](uint32_t u) {
        const float x = llmc::bits_float(u);
        const uint32_t want = llmc::minifloat_encode(x, llmc::kFP4E2M1, Overflow::Saturate, Rounding::NearestEven);
        EXPECT_IN_LOOP(llmc::fp4e2m1_encode_nearest(x) == want, "x bits " << u << ": fast "
                       << (int)llmc::fp4e2m1_encode_nearest(x) << " generic " << want);
    };
    for (uint64_t u = 0; u < (1ull << 32) && fails < 5; u += 256) check_one((uint32_t)u);
    const float points[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
    for (float p : points)
        for (int sign = 0; sign < 2; sign++)
            for (int d = -4096; d <= 4096 && fails < 5; d++) {
                const int64_t u = (int64_t)(llmc::float_bits(p) & 0x7FFFFFFFu) + d;
                if (u < 0) continue;
                check_one((uint32_t)u | (sign ? 0x80000000u : 0u));
            }
    for (uint32_t c = 0; c < 16; c++)
        EXPECT_IN_LOOP(llmc::float_bits(llmc::fp4e2m1_decode((uint8_t)c)) ==
                           llmc::float_bits(llmc::minifloat_decode(c, llmc::kFP4E2M1)), "decode of code " << c);
    CHECK(fails == 0);
}

TEST_CASE("number formats: the E2M1 stochastic encoder equals the generic one, at every decision boundary") {
    // Inputs: every sign, exponent and top 12 mantissa bits, with the low 11 bits 0, 1, 0x400 and
    // 0x7FF (8M patterns: NaNs, infinities, zeros, float32 subnormals among them). For each, the
    // fraction that decides the rounding, floor(2^32 f), is computed independently in double
    // (|x| / quantum is exact there), and the random words frac - 1, frac, frac + 1, 0 and 2^32 - 1
    // go to both encoders: they must agree with each other, and the generic one with the rule
    // "away from zero iff rbits < frac" (the unbiasedness test of SR is elsewhere).
    int fails = 0;
    long long boundaries = 0;
    const uint32_t lows[] = {0u, 1u, 0x400u, 0x7FFu};
    for (uint32_t top = 0; top < (1u << 21) && fails < 5; top++) {
        for (uint32_t low : lows) {
            const uint32_t u = (top << 11) | low;
            const float x = llmc::bits_float(u);
            std::vector<uint32_t> words = {0u, 0xFFFFFFFFu};
            const double a = std::fabs((double)x);
            if (std::isfinite(x) && a < 6.0) {
                const double quantum = a < 2.0 ? 0.5 : (a < 4.0 ? 1.0 : 2.0);
                const double t = a / quantum;
                const double frac = std::floor((t - std::floor(t)) * 4294967296.0);
                const uint32_t f = (uint32_t)frac;
                words.push_back(f);
                if (f > 0) words.push_back(f - 1);
                if (f < 0xFFFFFFFFu) words.push_back(f + 1);
                boundaries++;
                // the rule itself, on the generic encoder: up for f - 1, not for f
                if (f > 0) {
                    const uint32_t down = llmc::minifloat_encode(x, llmc::kFP4E2M1, Overflow::Saturate, Rounding::Stochastic, f);
                    const uint32_t up = llmc::minifloat_encode(x, llmc::kFP4E2M1, Overflow::Saturate, Rounding::Stochastic, f - 1);
                    EXPECT_IN_LOOP((up & 7u) == std::min(7u, (down & 7u) + 1u), "x bits " << u << ": frac " << f
                                   << " rounds to " << down << " at frac, " << up << " below it");
                }
            }
            for (uint32_t r : words) {
                const uint32_t want = llmc::minifloat_encode(x, llmc::kFP4E2M1, Overflow::Saturate, Rounding::Stochastic, r);
                const uint8_t got = llmc::fp4e2m1_encode_stochastic(x, r);
                EXPECT_IN_LOOP(got == want, "x bits " << u << " rbits " << r << ": fast " << (int)got << " generic " << want);
            }
        }
    }
    CHECK(boundaries > 3000000);
    CHECK(fails == 0);
}

TEST_CASE("number formats: minifloat_round_even equals decode(encode(x)) with saturation, every float that matters") {
    // The formats of the virtual-cast MX fast path and a few more eXmY with moderate biases. The
    // inputs: every sign, exponent and top 11 mantissa bits (the rounding position of a format with
    // at most 11 mantissa bits, and its guard bit, are among them) with the low 12 bits 0, 1, 0x7FF,
    // 0x800, 0x801 and 0xFFF (no sticky bit, a lowest one, a tie of one more bit, the rest): 6 * 2^20
    // patterns per format, NaNs, infinities, zeros and float32 subnormals among them.
    const llmc::MinifloatFormat formats[] = {
        llmc::kFP8E4M3, llmc::kFP8E5M2, llmc::kFP4E2M1, llmc::kUE4M3,
        {3, 2, 3, llmc::Specials::FiniteOnly, true},  // FP6 E3M2
        {2, 3, 1, llmc::Specials::FiniteOnly, true},  // FP6 E2M3
        {5, 6, 15, llmc::Specials::IEEE, true},       // e5m6
        {6, 3, 31, llmc::Specials::IEEE, true},       // e6m3
        {4, 3, 8, llmc::Specials::NanOnly, true},     // e4m3 with the fnuz bias
        {5, 10, 15, llmc::Specials::IEEE, true},      // FP16
        {3, 11, 3, llmc::Specials::FiniteOnly, false} // unsigned, 11 mantissa bits
    };
    const uint32_t lows[] = {0x000u, 0x001u, 0x7FFu, 0x800u, 0x801u, 0xFFFu};
    int fails = 0;
    size_t checked = 0;
    for (const llmc::MinifloatFormat& f : formats) {
        REQUIRE(llmc::minifloat_round_even_ok(f));
        for (uint32_t hi = 0; hi < (1u << 20) && fails < 5; hi++)
            for (uint32_t lo : lows) {
                const uint32_t u = (hi << 12) | lo;
                const float x = llmc::bits_float(u);
                const float got = llmc::minifloat_round_even(x, f);
                checked++;
                if (x != x) {
                    EXPECT_IN_LOOP(llmc::float_bits(got) == u, "NaN bits " << u << " not passed through");
                    continue;
                }
                const float want = llmc::minifloat_decode(
                    llmc::minifloat_encode(x, f, Overflow::Saturate, Rounding::NearestEven), f);
                EXPECT_IN_LOOP(llmc::float_bits(got) == llmc::float_bits(want),
                               "format e" << f.exp_bits << "m" << f.man_bits << "b" << f.bias << ", x bits " << u
                                          << ": value path " << got << ", codec " << want);
            }
    }
    CHECK(fails == 0);
    CHECK(checked == 11ull * 6 * (1u << 20));
    // and it can fail: a format that rounds elsewhere gives other values
    CHECK(llmc::minifloat_round_even(1.0625f, llmc::kFP8E4M3) == 1.0f);   // a tie to even
    CHECK(llmc::minifloat_round_even(1.1875f, llmc::kFP8E4M3) == 1.25f);  // a tie up to even
    CHECK(llmc::minifloat_round_even(464.0f, llmc::kFP8E4M3) == 448.0f);  // the tie below 480 stays
    CHECK(llmc::minifloat_round_even(-1e30f, llmc::kFP8E5M2) == -57344.0f);
    CHECK(llmc::minifloat_round_even(0.25f, llmc::kFP4E2M1) == 0.0f);
}
