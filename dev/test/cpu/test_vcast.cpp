// Tests for llmc/formats/vcast.h: TensorCast-style datatype specs and the CPU reference of the virtual cast.
//
// Expected values come from the format definitions, evaluated here in double (value tables built
// from sign / exponent / mantissa / bias, rounding by a search over the table), or are worked out
// by hand in the comments; the code under test never computes its own expectations.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "llmc/formats/number_formats.h"
#include "dev/test/cpu/test_util.h"
#include "llmc/formats/vcast.h"

using namespace llmc::vcast;
using llmc::InputError;

namespace {


uint32_t fbits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
float bitsf(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
bool same_bits(float a, float b) { return fbits(a) == fbits(b); }

// The message of the InputError that parse_datatype throws for spec ("" if none).
std::string parse_error(const std::string& spec) {
    try {
        parse_datatype(spec);
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Reference float formats: the non-negative finite values, from the definition.

enum class RefInf { IEEE, FN, FNUZ };

struct RefFormat {
    const char* spec;
    int X, Y, bias;
    RefInf inf;
};

std::vector<double> ref_values(const RefFormat& f) {
    std::vector<double> v;
    const int top = (1 << f.X) - 1, mtop = (1 << f.Y) - 1;
    for (int ef = 0; ef <= top; ef++)
        for (int m = 0; m <= mtop; m++) {
            if (f.inf == RefInf::IEEE && ef == top) continue;
            if (f.inf == RefInf::FN && ef == top && m == mtop) continue;
            v.push_back(ef == 0 ? std::ldexp((double)m, 1 - f.bias - f.Y)
                                : std::ldexp(1.0 + std::ldexp((double)m, -f.Y), ef - f.bias));
        }
    return v;
}

// Rounds x >= 0 onto the table (saturating). Ties to even look at the integer significand of the
// lower neighbour in units of its quantum 2^(max(exponent, emin) - Y).
double ref_round(const RefFormat& f, const std::vector<double>& g, double x, RoundMode rm) {
    if (x >= g.back()) return g.back();
    const size_t i = (size_t)(std::upper_bound(g.begin(), g.end(), x) - g.begin()) - 1;
    const double lo = g[i], hi = g[i + 1];
    if (x == lo) return lo;
    if (rm == RoundMode::Zero) return lo;
    const double dlo = x - lo, dhi = hi - x;
    if (dlo < dhi) return lo;
    if (dhi < dlo) return hi;
    if (rm == RoundMode::Nearest) return hi;
    const int emin = 1 - f.bias;
    const int e = lo < std::ldexp(1.0, emin) ? emin : std::ilogb(lo);
    const double q = lo / std::ldexp(1.0, e - f.Y);
    return std::fmod(q, 2.0) == 0.0 ? lo : hi;
}

const RefFormat kSmallFormats[] = {
    {"e2m1fnuz", 2, 1, 1, RefInf::FNUZ},     {"e3m2fnuz", 3, 2, 3, RefInf::FNUZ},
    {"e2m3fnuz", 2, 3, 1, RefInf::FNUZ},     {"e2m1", 2, 1, 1, RefInf::IEEE},
    {"e3m2", 3, 2, 3, RefInf::IEEE},         {"e2m1fn", 2, 1, 1, RefInf::FN},
    {"e4m3fn", 4, 3, 7, RefInf::FN},         {"e5m2", 5, 2, 15, RefInf::IEEE},
    {"e4m3", 4, 3, 7, RefInf::IEEE},         {"e4m3fnuz", 4, 3, 7, RefInf::FNUZ},
    {"float8_e4m3fnuz", 4, 3, 8, RefInf::FNUZ}, {"float8_e5m2fnuz", 5, 2, 16, RefInf::FNUZ},
    {"e1m2fnuz", 1, 2, 0, RefInf::FNUZ},     {"e1m6fn", 1, 6, 0, RefInf::FN},
    {"e3m0fn", 3, 0, 3, RefInf::FN},         {"e3m0fnuz", 3, 0, 3, RefInf::FNUZ},
    {"e2m1b3fnuz", 2, 1, 3, RefInf::FNUZ},   {"e4m3b0fn", 4, 3, 0, RefInf::FN},
    {"e5m6", 5, 6, 15, RefInf::IEEE},        {"e3m4b1", 3, 4, 1, RefInf::IEEE},
};

} // namespace

// =============================================================================================
// Parsing

TEST_CASE("vcast parse: the specification's predefined datatypes") {
    struct Want {
        const char* name;
        NumKind kind;
        int ebits, mbits, bias, bits; // number format (Int: 1, K-2, 1, K; UInt: 0, K, 0, K)
        InfNan inf;
        bool scaled;
        NumKind scale_kind;
        int scale_ebits, scale_mbits; // the scale format
        bool has_zero;
        NumKind zero_kind;
        int zero_bits;
        TileKind tile_kind;
        int tile;
    };
    const NumKind F = NumKind::Float, I = NumKind::Int, U = NumKind::UInt, E = NumKind::Exponent;
    const InfNan ie = InfNan::IEEE, fn = InfNan::FN, uz = InfNan::FNUZ;
    const TileKind T = TileKind::Tensor, Ti = TileKind::Tile;
    const Want want[] = {
        {"float32", F, 8, 23, 127, 32, ie, false, F, 0, 0, false, F, 0, T, 0},
        {"float16", F, 5, 10, 15, 16, ie, false, F, 0, 0, false, F, 0, T, 0},
        {"bfloat16", F, 8, 7, 127, 16, ie, false, F, 0, 0, false, F, 0, T, 0},
        {"float8_e5m2", F, 5, 2, 15, 8, ie, false, F, 0, 0, false, F, 0, T, 0},
        {"float8_e4m3fn", F, 4, 3, 7, 8, fn, false, F, 0, 0, false, F, 0, T, 0},
        {"float8_e5m2fnuz", F, 5, 2, 16, 8, uz, false, F, 0, 0, false, F, 0, T, 0},
        {"float8_e4m3fnuz", F, 4, 3, 8, 8, uz, false, F, 0, 0, false, F, 0, T, 0},
        {"e3m2fnuz", F, 3, 2, 3, 6, uz, false, F, 0, 0, false, F, 0, T, 0},
        {"e2m3fnuz", F, 2, 3, 1, 6, uz, false, F, 0, 0, false, F, 0, T, 0},
        {"e2m1fnuz", F, 2, 1, 1, 4, uz, false, F, 0, 0, false, F, 0, T, 0},
        {"uint16_ff", U, 0, 16, 0, 16, ie, true, F, 5, 10, true, F, 16, T, 0},
        {"uint16_bb", U, 0, 16, 0, 16, ie, true, F, 8, 7, true, F, 16, T, 0},
        {"int16_f", I, 1, 14, 1, 16, uz, true, F, 5, 10, false, F, 0, T, 0},
        {"int16_b", I, 1, 14, 1, 16, uz, true, F, 8, 7, false, F, 0, T, 0},
        {"int16_e", I, 1, 14, 1, 16, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"uint8_ff", U, 0, 8, 0, 8, ie, true, F, 5, 10, true, F, 16, T, 0},
        {"uint8_bb", U, 0, 8, 0, 8, ie, true, F, 8, 7, true, F, 16, T, 0},
        {"uint8_fi", U, 0, 8, 0, 8, ie, true, F, 5, 10, true, I, 8, T, 0},
        {"uint8_bi", U, 0, 8, 0, 8, ie, true, F, 8, 7, true, I, 8, T, 0},
        {"int8_f", I, 1, 6, 1, 8, uz, true, F, 5, 10, false, F, 0, T, 0},
        {"int8_b", I, 1, 6, 1, 8, uz, true, F, 8, 7, false, F, 0, T, 0},
        {"int8_e", I, 1, 6, 1, 8, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e5m2_e", F, 5, 2, 15, 8, ie, true, E, 8, 0, false, F, 0, T, 0},
        {"e5m2fnuz_e", F, 5, 2, 15, 8, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e5m2z_e", F, 5, 2, 15, 8, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e4m3fn_e", F, 4, 3, 7, 8, fn, true, E, 8, 0, false, F, 0, T, 0},
        {"e4m3_e", F, 4, 3, 7, 8, fn, true, E, 8, 0, false, F, 0, T, 0},
        {"e4m3fnuz_e", F, 4, 3, 7, 8, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e4m3z_e", F, 4, 3, 7, 8, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e3m2fnuz_e", F, 3, 2, 3, 6, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e3m2_e", F, 3, 2, 3, 6, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e2m3fnuz_e", F, 2, 3, 1, 6, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"e2m3_e", F, 2, 3, 1, 6, uz, true, E, 8, 0, false, F, 0, T, 0},
        {"mxfp8e5", F, 5, 2, 15, 8, ie, true, E, 8, 0, false, F, 0, Ti, 32},
        {"mxfp8e4", F, 4, 3, 7, 8, fn, true, E, 8, 0, false, F, 0, Ti, 32},
        {"mxfp6e3", F, 3, 2, 3, 6, uz, true, E, 8, 0, false, F, 0, Ti, 32},
        {"mxfp6e2", F, 2, 3, 1, 6, uz, true, E, 8, 0, false, F, 0, Ti, 32},
        {"mxfp4e2", F, 2, 1, 1, 4, uz, true, E, 8, 0, false, F, 0, Ti, 32},
        {"mxint8", I, 1, 6, 1, 8, uz, true, E, 8, 0, false, F, 0, Ti, 32},
        {"mxint4", I, 1, 2, 1, 4, uz, true, E, 8, 0, false, F, 0, Ti, 32},
        {"bfp16", I, 1, 6, 1, 8, uz, true, E, 8, 0, false, F, 0, Ti, 8},
        {"uint8_ff32", U, 0, 8, 0, 8, ie, true, F, 5, 10, true, F, 16, Ti, 32},
        {"uint8_bb32", U, 0, 8, 0, 8, ie, true, F, 8, 7, true, F, 16, Ti, 32},
        {"uint8_fi32", U, 0, 8, 0, 8, ie, true, F, 5, 10, true, I, 8, Ti, 32},
        {"uint8_bi32", U, 0, 8, 0, 8, ie, true, F, 8, 7, true, I, 8, Ti, 32},
        {"uint4_ff32", U, 0, 4, 0, 4, ie, true, F, 5, 10, true, F, 16, Ti, 32},
        {"uint4_bb32", U, 0, 4, 0, 4, ie, true, F, 8, 7, true, F, 16, Ti, 32},
        {"uint4_fi32", U, 0, 4, 0, 4, ie, true, F, 5, 10, true, I, 8, Ti, 32},
        {"uint4_bi32", U, 0, 4, 0, 4, ie, true, F, 8, 7, true, I, 8, Ti, 32},
        {"int8_f32", I, 1, 6, 1, 8, uz, true, F, 5, 10, false, F, 0, Ti, 32},
        {"int8_b32", I, 1, 6, 1, 8, uz, true, F, 8, 7, false, F, 0, Ti, 32},
        {"int4_f32", I, 1, 2, 1, 4, uz, true, F, 5, 10, false, F, 0, Ti, 32},
        {"int4_b32", I, 1, 2, 1, 4, uz, true, F, 8, 7, false, F, 0, Ti, 32},
    };
    // every predefined name is covered, and every name above is predefined
    const std::vector<std::string> names = predefined_names();
    CHECK(names.size() == sizeof(want) / sizeof(want[0]));
    for (const Want& w : want) {
        INFO(w.name);
        CHECK(std::find(names.begin(), names.end(), std::string(w.name)) != names.end());
        const DataType dt = parse_datatype(w.name);
        CHECK(std::string(dt.name) == w.name);
        CHECK(dt.num.kind == w.kind);
        CHECK(dt.num.ebits == w.ebits);
        CHECK(dt.num.mbits == w.mbits);
        CHECK(dt.num.bias == w.bias);
        CHECK(dt.num.bits == w.bits);
        if (w.kind == F) CHECK(dt.num.infnan == w.inf);
        CHECK(dt.scale.present == w.scaled);
        if (!w.scaled) continue;
        CHECK(dt.scale.scale.kind == w.scale_kind);
        CHECK(dt.scale.scale.ebits == w.scale_ebits);
        CHECK(dt.scale.scale.mbits == w.scale_mbits);
        CHECK(dt.scale.has_zero == w.has_zero);
        if (w.has_zero) {
            CHECK(dt.scale.zero.kind == w.zero_kind);
            CHECK(dt.scale.zero.bits == w.zero_bits);
        }
        CHECK(dt.scale.tile_kind == w.tile_kind);
        CHECK(dt.scale.tile == w.tile);
        CHECK(dt.scale.dim == -1);
        // the canonical spec parses back to the same fields
        const DataType back = parse_datatype(spec_string(dt));
        CHECK(back.num.kind == dt.num.kind);
        CHECK(back.num.bias == dt.num.bias);
        CHECK(back.num.infnan == dt.num.infnan);
        CHECK(back.scale.tile == dt.scale.tile);
        CHECK(back.scale.has_zero == dt.scale.has_zero);
    }
    // the derived constants of the MX element formats (OCP MX / OFP8 values)
    CHECK(parse_datatype("mxfp8e4").num.maxval == 448.0f);
    CHECK(parse_datatype("mxfp8e5").num.maxval == 57344.0f);
    CHECK(parse_datatype("mxfp6e3").num.maxval == 28.0f);
    CHECK(parse_datatype("mxfp6e2").num.maxval == 7.5f);
    CHECK(parse_datatype("mxfp4e2").num.maxval == 6.0f);
    CHECK(parse_datatype("mxint8").num.maxint == 127);
    CHECK(parse_datatype("mxint4").num.maxint == 7);
    CHECK(parse_datatype("uint4_ff32").num.maxint == 15);
    CHECK(parse_datatype("float8_e4m3fnuz").num.maxval == 240.0f);
    CHECK(parse_datatype("float8_e5m2fnuz").num.maxval == 57344.0f);
    CHECK(parse_datatype("float32").num.maxval == std::numeric_limits<float>::max());
    CHECK(parse_datatype("bfloat16").num.maxval == 0x1.FEp127f);
    CHECK(parse_datatype("float16").num.maxval == 65504.0f);
    // E8M0 scale: exponents -127..127 (code 255 is NaN)
    CHECK(parse_datatype("mxfp4e2").scale.scale.emin == -127);
    CHECK(parse_datatype("mxfp4e2").scale.scale.emax == 127);
    // midmax: midway between max and 2^(emax+1) (the specification's definition)
    const NumberSpec e4 = parse_datatype("mxfp8e4").num;
    CHECK(e4.emax == 8);
    CHECK(e4.midmax == 480.0f);
    CHECK(e4.midmax_norm == 1.875f);
    CHECK(parse_datatype("mxfp4e2").num.midmax == 7.0f);
    CHECK(parse_datatype("mxfp8e5").num.midmax == 61440.0f);
    CHECK(parse_datatype("mxfp6e2").num.midmax == 7.75f);
}

TEST_CASE("vcast parse: a grid of eXmY[bZ][fn|fnuz] number formats") {
    int fails = 0;
    const char* suffixes[] = {"", "fn", "fnuz"};
    for (int X = 1; X <= 8 && fails < 10; X++)
        for (int Y = 0; Y <= 23; Y++)
            for (int s = 0; s < 3; s++)
                for (int bsel = 0; bsel < 3; bsel++) { // default bias, b0, b(2^(X-1))
                    const RefInf inf = (RefInf)s;
                    const int dbias = (1 << (X - 1)) - 1;
                    const int bias = bsel == 0 ? dbias : bsel == 1 ? 0 : 1 << (X - 1);
                    std::string spec = "e" + std::to_string(X) + "m" + std::to_string(Y);
                    if (bsel) spec += "b" + std::to_string(bias);
                    spec += suffixes[s];
                    // expected: exponent type, error, or a float with this largest value
                    const int top = (1 << X) - 1;
                    double maxv; // by the definition of each inf/NaN mode
                    if (inf == RefInf::IEEE) maxv = std::ldexp(2.0 - std::ldexp(1.0, -Y), top - 1 - bias);
                    else if (inf == RefInf::FNUZ) maxv = std::ldexp(2.0 - std::ldexp(1.0, -Y), top - bias);
                    else if (Y > 0) maxv = std::ldexp(2.0 - std::ldexp(1.0, 1 - Y), top - bias);
                    else maxv = top >= 2 ? std::ldexp(1.0, top - 1 - bias) : 0.0;
                    const bool exponent_type = Y == 0 && inf == RefInf::IEEE;
                    bool ok;
                    if (exponent_type) ok = X >= 4 && -bias >= -127 && top - 1 - bias <= 127;
                    else ok = !(X == 1 && inf == RefInf::IEEE) && bias <= 127 && maxv > 0.0 && maxv < std::ldexp(1.0, 128);
                    INFO(spec);
                    NumberSpec n;
                    std::string err;
                    try {
                        n = parse_number(spec);
                    } catch (const InputError& e) {
                        err = e.what();
                    }
                    EXPECT_IN_LOOP(ok == err.empty(), spec << ": " << err);
                    if (!ok) {
                        EXPECT_IN_LOOP(err.find("'" + spec + "'") != std::string::npos, err);
                        continue;
                    }
                    if (!err.empty()) continue;
                    EXPECT_IN_LOOP(n.kind == (exponent_type ? NumKind::Exponent : NumKind::Float), spec);
                    EXPECT_IN_LOOP(n.ebits == X && n.mbits == Y && n.bias == bias, spec);
                    if (exponent_type) {
                        EXPECT_IN_LOOP(n.emin == -bias && n.emax == top - 1 - bias, spec);
                        continue;
                    }
                    EXPECT_IN_LOOP(n.bits == 1 + X + Y, spec);
                    EXPECT_IN_LOOP(n.infnan == (InfNan)s, spec);
                    EXPECT_IN_LOOP((double)n.maxval == maxv, spec << " max " << n.maxval << " want " << maxv);
                    EXPECT_IN_LOOP(std::ldexp(1.0, n.emax) <= maxv && maxv < std::ldexp(1.0, n.emax + 1), spec);
                    std::string canonical = "e" + std::to_string(X) + "m" + std::to_string(Y) +
                                            (bias != dbias ? "b" + std::to_string(bias) : "") + suffixes[s];
                    if (canonical == "e8m23") canonical = "float32";
                    if (canonical == "e5m10") canonical = "float16";
                    if (canonical == "e8m7") canonical = "bfloat16";
                    EXPECT_IN_LOOP(number_name(n) == canonical, spec << " -> " << number_name(n));
                    const NumberSpec back = parse_number(number_name(n));
                    EXPECT_IN_LOOP(back.bias == n.bias && back.infnan == n.infnan && back.maxval == n.maxval, spec);
                }
    // integers
    for (int K = 0; K <= 40; K++) {
        for (int u = 0; u < 2; u++) {
            const std::string spec = std::string(u ? "uint" : "int") + std::to_string(K);
            INFO(spec);
            if (K < 2 || K > 16) {
                CHECK_THROWS_AS(parse_number(spec), InputError);
                continue;
            }
            const NumberSpec n = parse_number(spec);
            CHECK(n.kind == (u ? NumKind::UInt : NumKind::Int));
            CHECK(n.bits == K);
            CHECK(n.maxint == (u ? (1 << K) - 1 : (1 << (K - 1)) - 1));
            CHECK(n.maxval == (float)n.maxint);
            CHECK(number_name(n) == spec);
        }
    }
    // torch names and prefixes
    CHECK(parse_number("torch.bfloat16").mbits == 7);
    CHECK(parse_number("torch.float8_e4m3fn").infnan == InfNan::FN);
    CHECK(parse_number("torch.float8_e4m3fnuz").bias == 8);
    CHECK(parse_number("float8_e4m3b11fnuz").bias == 11); // an explicit bias wins
    CHECK(parse_number("e4m3fnuz").bias == 7);           // the EMB string's default bias
    CHECK(parse_number("torch.int8").kind == NumKind::Int);
    CHECK(parse_number("E4M3FN").infnan == InfNan::FN);  // case-insensitive
    CHECK(number_name(parse_number("float8_e5m2fnuz")) == "e5m2b16fnuz");
    CHECK(number_name(parse_number("e5m10")) == "float16");
    CHECK(spec_string(parse_datatype("uint8_bi32")) == "uint8_bfloat16_int8_t32");
}

TEST_CASE("vcast parse: scale specs, tiles, dimensions") {
    const DataType a = parse_datatype("e5m6_e8m0_t32");
    CHECK(a.num.ebits == 5);
    CHECK(a.num.mbits == 6);
    CHECK(a.scale.scale.kind == NumKind::Exponent);
    CHECK(a.scale.tile_kind == TileKind::Tile);
    CHECK(a.scale.tile == 32);
    CHECK(a.scale.dim == -1);
    const DataType c = parse_datatype("int8_e8m0_t0");
    CHECK(c.scale.tile_kind == TileKind::Channel);
    CHECK(c.scale.tile == 0);
    const DataType cd = parse_datatype("int8_e8m0_t0d0");
    CHECK(cd.scale.tile_kind == TileKind::Channel);
    CHECK(cd.scale.dim == 0);
    const DataType t = parse_datatype("int8_e8m0");
    CHECK(t.scale.present);
    CHECK(t.scale.tile_kind == TileKind::Tensor);
    const DataType z = parse_datatype("uint4_bfloat16_int8_t64d1");
    CHECK(z.scale.has_zero);
    CHECK(z.scale.zero.kind == NumKind::Int);
    CHECK(z.scale.tile == 64);
    CHECK(z.scale.dim == 1);
    const DataType fz = parse_datatype("uint8_float16_e5m6");
    CHECK(fz.scale.zero.kind == NumKind::Float);
    CHECK(fz.scale.zero.mbits == 6);
    const DataType nv = parse_datatype("e2m1fnuz_float8_e4m3fn_t16"); // float scale for float data
    CHECK(nv.scale.scale.kind == NumKind::Float);
    CHECK(nv.scale.scale.infnan == InfNan::FN);
    CHECK(nv.scale.tile == 16);
    CHECK(parse_datatype("e4m3fn_e5m0_t32").scale.scale.emax == 15);
    CHECK(parse_datatype("e4m3fn_e5m0_t32").scale.scale.emin == -15);
    CHECK(parse_datatype("e4m3fn_e4m0").scale.scale.emax == 7);
    CHECK(std::string(parse_datatype("MXFP4E2").name) == "mxfp4e2");
    // parse_scale / make_datatype
    const ScaleSpec ss = parse_scale("e8m0_t16", parse_number("e2m1fnuz"));
    CHECK(ss.present);
    CHECK(ss.tile == 16);
    CHECK(!parse_scale("", parse_number("e2m1fnuz")).present);
    CHECK(make_datatype("e5m6", "e8m0_t32").scale.tile == 32);
    CHECK(make_datatype("float8_e4m3fn", "").num.infnan == InfNan::FN);
    CHECK_THROWS_AS(make_datatype("e5m6_e8m0", "t32"), InputError);
    // every tile size
    for (int size = 0; size <= 4096; size++) {
        const std::string s = "int4_e8m0_t" + std::to_string(size);
        const bool ok = size == 0 || (size >= 2 && size <= 1024 && (size & (size - 1)) == 0);
        const std::string err = parse_error(s);
        if (ok != err.empty()) FAIL_CHECK(s << ": " << err);
        if (!ok && err.find("'t" + std::to_string(size) + "'") == std::string::npos) FAIL_CHECK(err);
    }
    // describe() and the mode names
    CHECK(describe(parse_datatype("mxfp4e2")).find("e2m1fnuz_e8m0_t32") != std::string::npos);
    CHECK(parse_round_mode("nearest") == RoundMode::Nearest);
    CHECK(parse_round_mode("EVEN") == RoundMode::Even);
    CHECK(parse_round_mode("zero") == RoundMode::Zero);
    CHECK(parse_round_mode("stochastic") == RoundMode::Stochastic);
    CHECK(parse_scale_mode("max") == ScaleMode::Max);
    CHECK(parse_scale_mode("midmax") == ScaleMode::MidMax);
    CHECK(parse_scale_mode("auto") == ScaleMode::MidMax);
    CHECK(std::string(round_mode_name(RoundMode::Zero)) == "zero");
    CHECK(std::string(scale_mode_name(ScaleMode::MidMax)) == "midmax");
    CHECK_THROWS_AS(parse_round_mode("up"), InputError);
    CHECK_THROWS_AS(parse_scale_mode("ceil"), InputError);
    int m = -1, n = -1;
    parse_sparsity("2:4", &m, &n);
    CHECK(m == 2);
    CHECK(n == 4);
    parse_sparsity("", &m, &n);
    CHECK(m == 0);
    CHECK(n == 0);
    CHECK_THROWS_AS(parse_sparsity("4:4", &m, &n), InputError);
    CHECK_THROWS_AS(parse_sparsity("2:6", &m, &n), InputError);
    CHECK_THROWS_AS(parse_sparsity("2of4", &m, &n), InputError);
}

TEST_CASE("vcast parse: malformed specs name the offending part") {
    struct Bad {
        const char* spec;
        const char* must_contain; // the offending part, quoted, or the problem
    };
    const Bad bad[] = {
        {"e9m2", "exponent width 9"},
        {"e0m3", "exponent width 0"},
        {"e4m24", "mantissa width 24"},
        {"e4m3fnx", "'fnx'"},
        {"e4m3x", "'x'"},
        {"e4m", "'e4m'"},
        {"e4m3b", "'e4m3b'"},
        {"e4m3b200", "bias 200"},
        {"e1m3", "'e1m3'"},            // IEEE with one exponent bit
        {"e8m7fn", "'e8m7fn'"},        // beyond float32
        {"e1m0fn", "no nonzero"},      // only zero
        {"int1", "'int1'"},
        {"int17", "'int17'"},
        {"uint0", "'uint0'"},
        {"intx", "'intx'"},
        {"mxfp9", "'mxfp9'"},
        {"fp8", "'fp8'"},
        {"float8_e4m3fx", "'float8_e4m3fx'"},
        {"e8m0", "exponent (scale) type"},       // exponent type as data
        {"int8", "needs a scale"},                // unscaled integers
        {"uint8", "needs a scale"},
        {"int8_e8m0_t33", "'t33'"},
        {"int8_e8m0_t1", "'t1'"},
        {"int8_e8m0_t2048", "'t2048'"},
        {"int8_e8m0_t48", "'t48'"},
        {"int8_e8m0_t32d", "'t32d'"},
        {"int8_e8m0_t32x", "'t32x'"},
        {"int8_t32", "'t32'"},                    // a tile without a scale format
        {"int8_float16_int8", "'int8'"},          // zero point on signed data
        {"e4m3fn_e8m0_int8_t32", "zero point"},   // zero point on float data
        {"uint8_e8m0", "'e8m0'"},                 // exponent scale on unsigned data
        {"uint8_float16_e8m0", "'e8m0'"},         // exponent zero point
        {"int8_int8", "'int8'"},                  // an integer scale
        {"e5m2_uint8_t32", "'uint8'"},
        {"e4m3fn_e8m0_t32junk", "'t32junk'"},
        {"e4m3fn_e8m0_t32_x", "'x'"},
        {"e4m3fn_e8m0_t32_t32", "'t32'"},
        {"e4m3fn_", "ends with '_'"},
        {"_e4m3fn", "starts with '_'"},
        {"e4m3fn__e8m0", "empty part"},
        {"", "empty"},
        {"e4m3fn e8m0", "unexpected character ' '"},
        {"e2m1fnuz_e3m0_t32", "'e3m0'"},          // exponent types need X >= 4
        {"e2m1fnuz_e8m0b0_t32", "'e8m0b0'"},      // scale exponents beyond float32
    };
    for (const Bad& b : bad) {
        INFO(b.spec);
        const std::string err = parse_error(b.spec);
        CHECK(!err.empty());
        CHECK(err.find(b.must_contain) != std::string::npos);
        CHECK(err.find("'" + std::string(b.spec) + "'") != std::string::npos); // the whole spec is quoted
    }
    std::string err;
    DataType dt;
    CHECK(!try_parse_datatype("e9m2", &dt, &err));
    CHECK(err.find("e9m2") != std::string::npos);
    CHECK(try_parse_datatype("mxfp4e2", &dt, &err));
    // sparsity against the tile
    VcastOptions o;
    o.sparse_m = 2;
    o.sparse_n = 16;
    CHECK_THROWS_AS(check_options(parse_datatype("bfp16"), o), InputError);
    CHECK_NOTHROW(check_options(parse_datatype("mxint8"), o));
}

// =============================================================================================
// Helpers under the casts

TEST_CASE("vcast helpers: power-of-two scaling, log2, significand, integer rounding") {
    int fails = 0;
    const float xs[] = {1.0f, 1.5f, 3.0f, 0.7f, 1e-30f, 1e30f, 0x1p-149f, 0x1.8p-140f, 0x1.FFFFFEp127f, 0x1.234p-126f, -5.25f};
    for (float x : xs)
        for (int k = -189; k <= 190 && fails < 10; k++) {
            const float want = std::ldexp(x, k); // exact, rounded once (to nearest even)
            EXPECT_IN_LOOP(same_bits(vc_mul_pow2(x, k), want), x << " * 2^" << k);
        }
    for (int k = -149; k <= 127; k++) CHECK(pow2_any(k) == std::ldexp(1.0f, k));
    for (float x : {1.0f, 1.75f, 0.3f, 1e-40f, 0x1p-149f, 3e38f, 1e-38f}) {
        int e;
        const double m = std::frexp((double)x, &e); // x = m * 2^e, m in [0.5, 1)
        CHECK(vc_floor_log2(x) == e - 1);
        CHECK((double)vc_significand(x) == 2.0 * m);
    }
    struct R {
        float y, even, nearest, zero;
    };
    const R rs[] = {{2.5f, 2, 3, 2},   {-2.5f, -2, -3, -2}, {3.5f, 4, 4, 3},   {0.5f, 0, 1, 0},
                    {-0.5f, 0, -1, 0}, {2.4f, 2, 2, 2},     {-2.6f, -3, -3, -2}, {0.49999997f, 0, 0, 0},
                    {7.0f, 7, 7, 7},   {1e-30f, 0, 0, 0},   {65535.5f, 65536, 65536, 65535}};
    for (const R& r : rs) {
        INFO(r.y);
        CHECK(same_bits(vcast_round_int(r.y, RoundMode::Even, 0), r.even));
        CHECK(same_bits(vcast_round_int(r.y, RoundMode::Nearest, 0), r.nearest));
        CHECK(same_bits(vcast_round_int(r.y, RoundMode::Zero, 0), r.zero));
    }
    CHECK(vcast_round_int(1e9f, RoundMode::Even, 0) == 262143.0f); // saturates (callers clamp to maxint)
    CHECK(vcast_round_int(-kInf, RoundMode::Even, 0) == -262143.0f);
}

// =============================================================================================
// Unscaled casts: every code, every midpoint, all deterministic round modes

TEST_CASE("vcast casts: every code and midpoint of small float formats, nearest / even / zero") {
    const RoundMode modes[] = {RoundMode::Even, RoundMode::Nearest, RoundMode::Zero};
    for (const RefFormat& f : kSmallFormats) {
        INFO(f.spec);
        const DataType dt = parse_datatype(f.spec);
        const std::vector<double> g = ref_values(f);
        CHECK((double)dt.num.maxval == g.back());
        int fails = 0;
        std::vector<double> probes;
        for (size_t i = 0; i < g.size(); i++) {
            probes.push_back(g[i]);
            if (i + 1 < g.size()) {
                const double lo = g[i], hi = g[i + 1];
                for (double t : {0.25, 0.5, 0.75}) probes.push_back(lo + t * (hi - lo));
                const float mid = (float)(0.5 * (lo + hi));
                probes.push_back(std::nextafter(mid, 0.0f));
                probes.push_back(std::nextafter(mid, kInf));
            }
        }
        const double top_step = g.back() - g[g.size() - 2];
        for (double t : {0.25, 0.5, 1.0, 3.0, 1e6}) probes.push_back(g.back() + t * top_step);
        for (double p : probes) {
            for (int sgn = 0; sgn < 2; sgn++)
                for (RoundMode rm : modes) {
                    const float x = sgn ? -(float)p : (float)p;
                    if ((double)std::fabs(x) != p && p < 1e30) continue; // probe not a float: skip
                    double want = ref_round(f, g, std::fabs((double)x), rm);
                    float wantf = (float)want;
                    if (sgn && !(f.inf == RefInf::FNUZ && want == 0.0)) wantf = -wantf;
                    const float got = vcast_element(x, dt, TileScale{}, rm, 0);
                    EXPECT_IN_LOOP(same_bits(got, wantf), f.spec << " x=" << x << " mode " << round_mode_name(rm)
                                                                  << " got " << got << " want " << wantf);
                }
            if (fails > 10) break;
        }
        // specials: saturation, inf, NaN, signed zero
        for (RoundMode rm : modes) {
            CHECK(vcast_element(kInf, dt, TileScale{}, rm, 0) == dt.num.maxval);
            CHECK(vcast_element(-kInf, dt, TileScale{}, rm, 0) == -dt.num.maxval);
            CHECK(std::isnan(vcast_element(kNaN, dt, TileScale{}, rm, 0)));
            CHECK(same_bits(vcast_element(-0.0f, dt, TileScale{}, rm, 0), f.inf == RefInf::FNUZ ? 0.0f : -0.0f));
        }
    }
}

TEST_CASE("vcast casts: hand-worked ties and truncation (e2m1fnuz, e4m3fn)") {
    const DataType e2 = parse_datatype("e2m1fnuz"); // 0 0.5 1 1.5 2 3 4 6
    const TileScale none;
    struct T {
        float x, even, nearest, zero;
    };
    const T ts[] = {
        {2.5f, 2.0f, 3.0f, 2.0f},   // tie: 2 (mantissa 0) is even
        {3.5f, 4.0f, 4.0f, 3.0f},   // tie: 4 is even
        {5.0f, 4.0f, 6.0f, 4.0f},   // tie between 4 and 6
        {0.25f, 0.0f, 0.5f, 0.0f},  // tie between 0 and the smallest subnormal
        {0.75f, 1.0f, 1.0f, 0.5f},  // tie: 1 (code 2) is even
        {1.25f, 1.0f, 1.5f, 1.0f},
        {5.9f, 6.0f, 6.0f, 4.0f},
        {7.0f, 6.0f, 6.0f, 6.0f},   // above max: saturate
        {-2.5f, -2.0f, -3.0f, -2.0f},
        {-0.2f, 0.0f, 0.0f, 0.0f},  // fnuz: no -0
    };
    for (const T& t : ts) {
        INFO(t.x);
        CHECK(same_bits(vcast_element(t.x, e2, none, RoundMode::Even, 0), t.even));
        CHECK(same_bits(vcast_element(t.x, e2, none, RoundMode::Nearest, 0), t.nearest));
        CHECK(same_bits(vcast_element(t.x, e2, none, RoundMode::Zero, 0), t.zero));
    }
    const DataType e4 = parse_datatype("float8_e4m3fn");
    CHECK(vcast_element(464.0f, e4, none, RoundMode::Even, 0) == 448.0f);   // tie, 448 even
    CHECK(vcast_element(1000.0f, e4, none, RoundMode::Even, 0) == 448.0f);  // saturates
    CHECK(vcast_element(-1e30f, e4, none, RoundMode::Nearest, 0) == -448.0f);
    CHECK(vcast_element(17.0f, e4, none, RoundMode::Even, 0) == 16.0f);     // tie 16 / 18: 16 even
    CHECK(vcast_element(17.0f, e4, none, RoundMode::Nearest, 0) == 18.0f);
    CHECK(vcast_element(17.9f, e4, none, RoundMode::Zero, 0) == 16.0f);
    CHECK(vcast_element(0x1p-10f, e4, none, RoundMode::Even, 0) == 0.0f);   // half the smallest subnormal
    CHECK(vcast_element(0x1p-10f, e4, none, RoundMode::Nearest, 0) == 0x1p-9f);
    CHECK(same_bits(vcast_element(-0x1p-11f, e4, none, RoundMode::Even, 0), -0.0f)); // fn keeps -0
    const DataType e5m6 = parse_datatype("e5m6"); // fp12: 6 mantissa bits, IEEE
    CHECK(vcast_element(1.0f + 0x1p-7f, e5m6, none, RoundMode::Even, 0) == 1.0f);
    CHECK(vcast_element(1.0f + 0x1p-7f, e5m6, none, RoundMode::Nearest, 0) == 1.0f + 0x1p-6f);
    CHECK(vcast_element(1e6f, e5m6, none, RoundMode::Even, 0) == 65024.0f); // max 2^15 * (2 - 2^-6)
}

// =============================================================================================
// Integer data: every code, zero points

TEST_CASE("vcast casts: every code of int4 with an exponent tile scale (mxint4)") {
    const DataType dt = parse_datatype("mxint4");
    // a tile with amax 1.75: floor(log2 1.75) = 0, emax 0 -> scale 2^0, grid k / 4 for |k| <= 7
    std::vector<float> tile(32, 0.0f);
    tile[0] = 1.75f;
    TileStats st;
    for (float v : tile) vcast_stats_add(st, v);
    const TileScale ts = vcast_select_scale(dt, st, ScaleMode::Max);
    CHECK(ts.exp == 0);
    CHECK(ts.scale == 1.0f);
    for (int k = -7; k <= 7; k++) {
        INFO(k);
        CHECK(vcast_element(k / 4.0f, dt, ts, RoundMode::Even, 0) == k / 4.0f); // every code exact
        CHECK(vcast_element(k / 4.0f, dt, ts, RoundMode::Zero, 0) == k / 4.0f);
    }
    CHECK(vcast_element(-2.0f, dt, ts, RoundMode::Even, 0) == -1.75f); // symmetric: no -8
    CHECK(vcast_element(1.9f, dt, ts, RoundMode::Even, 0) == 1.75f);
    CHECK(vcast_element(0.125f, dt, ts, RoundMode::Even, 0) == 0.0f);     // tie -> even 0
    CHECK(vcast_element(0.125f, dt, ts, RoundMode::Nearest, 0) == 0.25f);
    CHECK(vcast_element(0.375f, dt, ts, RoundMode::Even, 0) == 0.5f);     // tie 1/4, 2/4 -> 2/4
    CHECK(vcast_element(0.375f, dt, ts, RoundMode::Zero, 0) == 0.25f);
    CHECK(vcast_element(-0.375f, dt, ts, RoundMode::Zero, 0) == -0.25f);
    CHECK(same_bits(vcast_element(-0.1f, dt, ts, RoundMode::Even, 0), 0.0f)); // integers: +0
    // midmax does not apply to integers (one exponent bit): amax 1.99 keeps the same scale
    tile[0] = 1.99f;
    st = TileStats{};
    for (float v : tile) vcast_stats_add(st, v);
    CHECK(vcast_select_scale(dt, st, ScaleMode::MidMax).exp == 0);
    CHECK(vcast_element(1.99f, dt, vcast_select_scale(dt, st, ScaleMode::MidMax), RoundMode::Even, 0) == 1.75f);
}

TEST_CASE("vcast casts: every code of uint4 with float16 scale and zero point (float and int zero)") {
    // tile min -1.5, max 6: scale = fp16(7.5 / 15) = 0.5, float zero = fp16(1.5) = 1.5
    std::vector<float> in(32, 0.0f), out(32);
    in[0] = -1.5f;
    in[1] = 6.0f;
    const DataType ff = parse_datatype("uint4_ff32");
    VcastOptions o;
    const TileScale ts = vcast_tile(in.data(), out.data(), 32, 1, ff, o, 0, 0, 1);
    CHECK(ts.scale == 0.5f);
    CHECK(ts.zero == 1.5f);
    for (int q = 0; q <= 15; q++) { // every code q: value q * 0.5 - 1.5
        const float v = q * 0.5f - 1.5f;
        CHECK(vcast_element(v, ff, ts, RoundMode::Even, 0) == v);
    }
    CHECK(vcast_element(-1.25f, ff, ts, RoundMode::Even, 0) == -1.5f);   // (x+1.5)/0.5 = 0.5: tie -> 0
    CHECK(vcast_element(-1.25f, ff, ts, RoundMode::Nearest, 0) == -1.0f);
    CHECK(vcast_element(-1.0f + 0.4f, ff, ts, RoundMode::Zero, 0) == -1.0f);
    CHECK(vcast_element(100.0f, ff, ts, RoundMode::Even, 0) == 6.0f);     // saturate at code 15
    CHECK(vcast_element(-100.0f, ff, ts, RoundMode::Even, 0) == -1.5f);   // and at code 0
    // int zero: z = round_even(1.5 / 0.5) = 3, values (q - 3) * 0.5
    const DataType fi = parse_datatype("uint4_fi32");
    const TileScale tsi = vcast_tile(in.data(), out.data(), 32, 1, fi, o, 0, 0, 1);
    CHECK(tsi.scale == 0.5f);
    CHECK(tsi.zero == 3.0f);
    for (int q = 0; q <= 15; q++) CHECK(vcast_element((q - 3) * 0.5f, fi, tsi, RoundMode::Even, 0) == (q - 3) * 0.5f);
    // a zero point that is not a whole number of steps: min -1.25, max 6.25 -> scale 0.5,
    // float zero 1.25, int zero round_even(2.5) = 2. Only the int zero point represents 0 exactly.
    in[0] = -1.25f;
    in[1] = 6.25f;
    const TileScale tf2 = vcast_tile(in.data(), out.data(), 32, 1, ff, o, 0, 0, 1);
    CHECK(tf2.zero == 1.25f);
    CHECK(out[2] == -0.25f); // x = 0: (0 + 1.25) / 0.5 = 2.5 -> 2 -> 2 * 0.5 - 1.25
    const TileScale ti2 = vcast_tile(in.data(), out.data(), 32, 1, fi, o, 0, 0, 1);
    CHECK(ti2.zero == 2.0f);
    CHECK(out[2] == 0.0f);
    CHECK(out[0] == -1.0f);  // round_even(-2.5) = -2, + 2 = 0 -> (0 - 2) * 0.5
    // uint8 with an inexact scale: min -1, max 2 -> 3 / 255 in fp16 = 1542 * 2^-17, zero = 1
    const DataType u8 = parse_datatype("uint8_ff");
    std::vector<float> v8 = {-1.0f, 2.0f, 0.5f, 0.0f};
    std::vector<float> o8(4);
    const std::vector<TileScale> s8 = vcast_matrix(v8.data(), o8.data(), 1, 4, u8, o, 0);
    REQUIRE(s8.size() == 1);
    CHECK(s8[0].scale == 1542.0f / 131072.0f);
    CHECK(s8[0].zero == 1.0f);
    CHECK(o8[1] == 1.9999542236328125f); // (2 + 1) / s = 255.0039 -> 255 -> 255 * s - 1
    CHECK(o8[0] == -1.0f);
    // no zero point: negatives clamp to 0, scale from the max alone
    const DataType u4 = parse_datatype("uint4_float16_t32");
    std::vector<float> n4(32, 0.0f), m4(32);
    n4[0] = 7.5f;
    n4[1] = -3.0f;
    n4[2] = 2.2f;
    const TileScale t4 = vcast_tile(n4.data(), m4.data(), 32, 1, u4, o, 0, 0, 1);
    CHECK(t4.scale == 0.5f);
    CHECK(m4[0] == 7.5f);
    CHECK(m4[1] == 0.0f);
    CHECK(m4[2] == 2.0f);
}

TEST_CASE("vcast casts: signed integers with float scales") {
    VcastOptions o;
    // int8_f: scale = fp16(amax / 127)
    std::vector<float> in = {127.0f, 2.5f, -3.5f, 126.6f}, out(4);
    std::vector<TileScale> s = vcast_matrix(in.data(), out.data(), 1, 4, parse_datatype("int8_f"), o, 0);
    CHECK(s[0].scale == 1.0f);
    CHECK(out[0] == 127.0f);
    CHECK(out[1] == 2.0f);
    CHECK(out[2] == -4.0f);
    CHECK(out[3] == 127.0f);
    in[0] = 254.0f;
    s = vcast_matrix(in.data(), out.data(), 1, 4, parse_datatype("int8_b"), o, 0);
    CHECK(s[0].scale == 2.0f);
    CHECK(out[1] == 2.0f); // 2.5 / 2 = 1.25 -> 1
    CHECK(out[2] == -4.0f);
    // a zero tile: scale 0, everything 0
    std::vector<float> zin(32, 0.0f), zout(32, 1.0f);
    const TileScale zt = vcast_tile(zin.data(), zout.data(), 32, 1, parse_datatype("int4_f32"), o, 0, 0, 1);
    CHECK(zt.scale == 0.0f);
    CHECK(zout[5] == 0.0f);
}

// =============================================================================================
// Tile scales: shared exponents, max vs midmax, clamping, channels

TEST_CASE("vcast tiles: the shared exponent, max vs midmax") {
    std::vector<float> in(32, 0.0f), out(32);
    VcastOptions mx, mid;
    mid.scale = ScaleMode::MidMax;
    const DataType fp4 = parse_datatype("mxfp4e2"); // emax 2, midmax 7 (norm 1.75)
    // amax 5: floor(log2 5) - 2 = 0 either way; 5 is a tie between 4 and 6
    in[0] = 5.0f;
    in[1] = 1.0f;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp4, mx, 0, 0, 1).exp == 0);
    CHECK(out[0] == 4.0f);
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp4, mid, 0, 0, 1).exp == 0);
    // amax 7.5 = 1.875 * 4: max keeps exponent 0 (7.5 saturates to 6); midmax bumps it to 1
    in[0] = 7.5f;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp4, mx, 0, 0, 1).exp == 0);
    CHECK(out[0] == 6.0f);
    CHECK(out[1] == 1.0f);
    const TileScale tm = vcast_tile(in.data(), out.data(), 32, 1, fp4, mid, 0, 0, 1);
    CHECK(tm.exp == 1);
    CHECK(tm.scale == 2.0f);
    CHECK(out[0] == 8.0f); // 7.5 / 2 = 3.75 -> 4 -> 8
    CHECK(out[1] == 1.0f); // 0.5 -> 0.5 -> 1
    // amax exactly at midmax (7 = 1.75 * 4): not above, no bump
    in[0] = 7.0f;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp4, mid, 0, 0, 1).exp == 0);
    CHECK(out[0] == 6.0f);
    // a negative amax works the same
    in[0] = -7.5f;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp4, mid, 0, 0, 1).exp == 1);
    CHECK(out[0] == -8.0f);
}

TEST_CASE("vcast tiles: worked values for MXFP8, MXINT8, BFP16, clamped scale exponents") {
    std::vector<float> in(32, 0.0f), out(32);
    VcastOptions mx, mid;
    mid.scale = ScaleMode::MidMax;
    // MXFP4 amax 0.3: exponent floor(log2 0.3) - 2 = -4; 0.3 * 16 = 4.8 -> 4 -> 0.25
    in[0] = 0.3f;
    in[1] = 0.1f; // 1.6 -> 1.5 -> 0.09375
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, parse_datatype("mxfp4e2"), mx, 0, 0, 1).exp == -4);
    CHECK(out[0] == 0.25f);
    CHECK(out[1] == 0.09375f);
    // MXFP8 E4M3: emax 8, midmax 480 (norm 1.875)
    const DataType fp8 = parse_datatype("mxfp8e4");
    in[0] = 470.0f; // 470 / 256 = 1.836 < 1.875: exponent 0 both ways, saturates to 448
    in[1] = 0.0f;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp8, mid, 0, 0, 1).exp == 0);
    CHECK(out[0] == 448.0f);
    in[0] = 490.0f; // 1.914 > 1.875: midmax exponent 1, 245 -> 240 -> 480
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp8, mid, 0, 0, 1).exp == 1);
    CHECK(out[0] == 480.0f);
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, fp8, mx, 0, 0, 1).exp == 0);
    CHECK(out[0] == 448.0f);
    // MXINT8: amax 3 -> exponent 1, grid 2^(1-6) = 1/32
    const DataType i8 = parse_datatype("mxint8");
    in[0] = 3.0f;
    in[1] = 1.0f / 64.0f; // a tie between 0 and 1/32
    in[2] = 0.3f;         // 9.6 -> 10 -> 0.3125
    in[3] = -3.0f;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, i8, mx, 0, 0, 1).exp == 1);
    CHECK(out[0] == 3.0f);
    CHECK(out[1] == 0.0f);
    CHECK(out[2] == 0.3125f);
    CHECK(out[3] == -3.0f);
    VcastOptions nearest;
    nearest.round = RoundMode::Nearest;
    vcast_tile(in.data(), out.data(), 32, 1, i8, nearest, 0, 0, 1);
    CHECK(out[1] == 1.0f / 32.0f);
    in[0] = 1.999f; // 1.999 * 64 = 127.94 -> 128 -> saturates at 127 / 64
    in[3] = 0.0f;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, i8, mx, 0, 0, 1).exp == 0);
    CHECK(out[0] == 127.0f / 64.0f);
    // BFP16: int8, tile 8: amax 0.3 -> exponent -2, grid 2^-8: 0.3 * 256 = 76.8 -> 77
    std::vector<float> b(8, 0.0f), bo(8);
    b[3] = 0.3f;
    b[4] = -0.01f; // -2.56 -> -3
    CHECK(vcast_tile(b.data(), bo.data(), 8, 1, parse_datatype("bfp16"), mx, 0, 0, 1).exp == -2);
    CHECK(bo[3] == 77.0f / 256.0f);
    CHECK(bo[4] == -3.0f / 256.0f);
    // E8M0 clamps the exponent at -127: a tile of 2^-140 values
    in.assign(32, 0x1p-140f);
    const TileScale lo = vcast_tile(in.data(), out.data(), 32, 1, parse_datatype("e2m1fnuz_e8m0_t32"), mx, 0, 0, 1);
    CHECK(lo.exp == -127);
    CHECK(lo.scale == 0x1p-127f);
    CHECK(out[0] == 0.0f); // 2^-140 / 2^-127 = 2^-13, below half of e2m1's smallest value 0.5
    // an E4M0 scale (exponents -7..7) clamps at 7: values saturate at 6 * 2^7 = 768
    in.assign(32, 0.0f);
    in[0] = 1e4f;
    in[1] = 300.0f; // 300 / 128 = 2.34 -> 2 -> 256
    const TileScale hi = vcast_tile(in.data(), out.data(), 32, 1, parse_datatype("e2m1fnuz_e4m0_t32"), mx, 0, 0, 1);
    CHECK(hi.exp == 7);
    CHECK(out[0] == 768.0f);
    CHECK(out[1] == 256.0f);
    // an all-zero tile takes the smallest exponent and stays zero
    in.assign(32, 0.0f);
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, parse_datatype("mxfp8e5"), mx, 0, 0, 1).exp == -127);
    CHECK(out[7] == 0.0f);
    // NaN stays NaN and does not set the scale; inf saturates
    in[0] = kNaN;
    in[1] = 2.0f;
    in[2] = kInf;
    CHECK(vcast_tile(in.data(), out.data(), 32, 1, parse_datatype("mxfp4e2"), mx, 0, 0, 1).exp == -1);
    CHECK(std::isnan(out[0]));
    CHECK(out[1] == 2.0f);
    CHECK(out[2] == 3.0f); // 6 * 2^-1
}

TEST_CASE("vcast tiles: tensor, channel (t0) and column (d0) scales over a matrix") {
    // 2 x 4 matrix; int8 with E8M0 scales
    const std::vector<float> m = {1.0f, 0.3f, -0.5f, 0.01f, //
                                  100.0f, 2.4f, -7.7f, 0.2f};
    std::vector<float> out(8);
    VcastOptions o;
    // channel along the last dim: one scale per row. Row 0: amax 1 -> grid 2^-6; row 1: amax 100
    // -> floor(log2 100) = 6 -> grid 2^0.
    std::vector<TileScale> s = vcast_matrix(m.data(), out.data(), 2, 4, parse_datatype("int8_e8m0_t0"), o, 0);
    REQUIRE(s.size() == 2);
    CHECK(s[0].exp == 0);
    CHECK(s[1].exp == 6);
    CHECK(out[1] == 19.0f / 64.0f); // 0.3 * 64 = 19.2
    CHECK(out[3] == 1.0f / 64.0f);  // 0.64 -> 1
    CHECK(out[4] == 100.0f);
    CHECK(out[5] == 2.0f);
    CHECK(out[6] == -8.0f);
    CHECK(out[7] == 0.0f);
    // channel along dim 0: one scale per column
    s = vcast_matrix(m.data(), out.data(), 2, 4, parse_datatype("int8_e8m0_t0d0"), o, 0);
    REQUIRE(s.size() == 4);
    CHECK(s[0].exp == 6);  // column 0: amax 100
    CHECK(s[1].exp == 1);  // column 1: amax 2.4
    CHECK(s[2].exp == 2);  // column 2: amax 7.7
    CHECK(s[3].exp == -3); // column 3: amax 0.2
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 10.0f / 32.0f); // 0.3 * 32 = 9.6 -> 10
    CHECK(out[5] == 77.0f / 32.0f); // 2.4 * 32 = 76.8 -> 77
    CHECK(out[3] == 5.0f / 512.0f); // 0.01 * 512 = 5.12 -> 5
    // one scale for the whole tensor: amax 100 -> grid 1
    s = vcast_matrix(m.data(), out.data(), 2, 4, parse_datatype("int8_e8m0"), o, 0);
    REQUIRE(s.size() == 1);
    CHECK(s[0].exp == 6);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 0.0f);
    CHECK(out[6] == -8.0f);
    // tiles of 2 along the rows
    s = vcast_matrix(m.data(), out.data(), 2, 4, parse_datatype("int8_e8m0_t2"), o, 0);
    REQUIRE(s.size() == 4);
    CHECK(s[0].exp == 0);  // {1, 0.3}
    CHECK(s[1].exp == -1); // {-0.5, 0.01}
    CHECK(s[2].exp == 6);  // {100, 2.4}
    CHECK(s[3].exp == 2);  // {-7.7, 0.2}
    CHECK(out[3] == 1.0f / 128.0f); // 0.01 * 128 = 1.28 -> 1
    // shapes that do not divide
    CHECK_THROWS_AS(vcast_matrix(m.data(), out.data(), 2, 4, parse_datatype("int8_e8m0_t8"), o, 0), InputError);
    CHECK_THROWS_AS(vcast_matrix(m.data(), out.data(), 2, 4, parse_datatype("int8_e8m0_t2d2"), o, 0), InputError);
}

// =============================================================================================
// Sparsity

TEST_CASE("vcast sparsity: M of N keeps the M largest magnitudes per group") {
    VcastOptions o;
    o.sparse_m = 2;
    o.sparse_n = 4;
    const DataType e4 = parse_datatype("float8_e4m3fn");
    std::vector<float> in = {1.0f, -5.0f, 3.0f, 2.0f, /**/ 0.5f, 0.5f, 0.5f, -0.25f, /**/ kNaN, 1.0f, 2.0f, 3.0f,
                             /**/ -0.0f, 0.0f, 0.0f, 0.0f};
    std::vector<float> out(in.size());
    vcast_tile(in.data(), out.data(), (int)in.size(), 1, e4, o, 0, 0, 1);
    const float want[] = {0, -5, 3, 0, 0.5f, 0.5f, 0, 0, kNaN, 0, 0, 3, -0.0f, 0.0f, 0, 0};
    for (size_t i = 0; i < in.size(); i++) {
        INFO(i);
        if (std::isnan(want[i])) CHECK(std::isnan(out[i]));
        else CHECK(same_bits(out[i], want[i]));
    }
    // 1 of 2, and a partial last group (5 values: {4, -9}, {1, 1}, {7})
    o.sparse_m = 1;
    o.sparse_n = 2;
    std::vector<float> p = {4.0f, -9.0f, 1.0f, 1.0f, 7.0f}, po(5);
    vcast_tile(p.data(), po.data(), 5, 1, e4, o, 0, 0, 1);
    CHECK(po[0] == 0.0f);
    CHECK(po[1] == -9.0f);
    CHECK(po[2] == 1.0f);
    CHECK(po[3] == 0.0f);
    CHECK(po[4] == 7.0f);
    // the scale comes from the kept values: uint8 with zero point, groups {-0.5, 2}, {-0.25, 1}
    // keep 2 and 1, so the minimum is 0 and the zero point 0 (without sparsity: fp16(0.5))
    const DataType u8 = parse_datatype("uint8_ff32");
    std::vector<float> u(32, 0.0f), uo(32);
    u[0] = -0.5f;
    u[1] = 2.0f;
    u[2] = -0.25f;
    u[3] = 1.0f;
    CHECK(vcast_tile(u.data(), uo.data(), 32, 1, u8, o, 0, 0, 1).zero == 0.0f);
    CHECK(uo[0] == 0.0f);
    VcastOptions dense;
    CHECK(vcast_tile(u.data(), uo.data(), 32, 1, u8, dense, 0, 0, 1).zero == 0.5f);
    // strided groups (a column) and in-place casting give the same result as a copy
    o.sparse_m = 2;
    o.sparse_n = 4;
    std::vector<float> col = {3, 0, 1, 0, -4, 0, 2, 0}; // column 0 of a 4 x 2 matrix: {3, 1, -4, 2}
    std::vector<float> colo(8, 9.0f);
    vcast_tile(col.data(), colo.data(), 4, 2, e4, o, 0, 0, 2);
    CHECK(colo[0] == 3.0f);
    CHECK(colo[2] == 0.0f);
    CHECK(colo[4] == -4.0f);
    CHECK(colo[6] == 0.0f);
    CHECK(colo[1] == 9.0f); // untouched
    std::vector<float> r(64), copy_out(64);
    for (int i = 0; i < 64; i++) r[i] = std::sin(0.37f * (float)i) * (float)(i % 7 + 1);
    VcastOptions so;
    so.sparse_m = 3;
    so.sparse_n = 8;
    so.round = RoundMode::Stochastic;
    const DataType fp4 = parse_datatype("mxfp4e2");
    const TileScale a = vcast_tile(r.data(), copy_out.data(), 32, 1, fp4, so, 42, 0, 1);
    std::vector<float> inplace = r;
    const TileScale b2 = vcast_tile(inplace.data(), inplace.data(), 32, 1, fp4, so, 42, 0, 1);
    CHECK(a.exp == b2.exp);
    for (int i = 0; i < 32; i++) CHECK(same_bits(copy_out[i], inplace[i]));
    int kept = 0;
    for (int i = 0; i < 32; i++) kept += copy_out[i] != 0.0f ? 1 : 0;
    CHECK(kept <= 12); // at most 3 of every 8
}

// =============================================================================================
// Stochastic rounding

TEST_CASE("vcast stochastic rounding: unbiased over 1e6 draws, only the two neighbours") {
    const int N = 1000000;
    struct Case {
        const char* spec;
        float x, lo, hi; // lo, hi: the neighbours of x (as cast values)
    };
    const Case cases[] = {
        {"e2m1fnuz", 2.3f, 2.0f, 3.0f},
        {"e2m1fnuz", -4.9f, -4.0f, -6.0f},
        {"e2m1fnuz", 0.1f, 0.0f, 0.5f},
        {"float8_e4m3fn", 300.0f, 288.0f, 320.0f},
        {"e5m6", 1.0f + 0x1p-8f, 1.0f, 1.0f + 0x1p-6f},
    };
    for (const Case& c : cases) {
        INFO(c.spec << " " << c.x);
        const DataType dt = parse_datatype(c.spec);
        double sum = 0.0;
        int others = 0;
        for (int i = 0; i < N; i++) {
            const float v = vcast_element(c.x, dt, TileScale{}, RoundMode::Stochastic, vcast_random_bits(7, (uint64_t)i));
            if (v != c.lo && v != c.hi) others++;
            sum += v;
        }
        const double p = ((double)c.x - c.lo) / ((double)c.hi - c.lo);
        const double sigma = std::fabs((double)c.hi - c.lo) * std::sqrt(p * (1.0 - p) / N);
        CHECK(others == 0);
        CHECK(std::fabs(sum / N - (double)c.x) < 5.0 * sigma);
    }
    // integers through a tile: int8 with a float16 scale of 1 (amax 127): 10.37 -> 10 or 11
    const DataType i8 = parse_datatype("int8_f");
    TileStats st;
    vcast_stats_add(st, 127.0f);
    const TileScale ts = vcast_select_scale(i8, st, ScaleMode::Max);
    REQUIRE(ts.scale == 1.0f);
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += vcast_element(-10.37f, i8, ts, RoundMode::Stochastic, vcast_random_bits(99, (uint64_t)i));
    const double sigma = std::sqrt(0.37 * 0.63 / N);
    CHECK(std::fabs(sum / N - (double)-10.37f) < 5.0 * sigma);
    // the tile function: a tensor of 1e6 copies of 2.3, one random index per element
    std::vector<float> big(N, 2.3f), bo(N);
    VcastOptions so;
    so.round = RoundMode::Stochastic;
    vcast_tile(big.data(), bo.data(), N, 1, parse_datatype("e2m1fnuz"), so, 5, 0, 1);
    double s2 = 0.0;
    for (float v : bo) s2 += v;
    CHECK(std::fabs(s2 / N - (double)2.3f) < 5.0 * std::sqrt(0.3 * 0.7 / N));
    // a different seed gives different draws; the same seed the same
    std::vector<float> bo2(1000), bo3(1000);
    vcast_tile(big.data(), bo2.data(), 1000, 1, parse_datatype("e2m1fnuz"), so, 6, 0, 1);
    vcast_tile(big.data(), bo3.data(), 1000, 1, parse_datatype("e2m1fnuz"), so, 6, 0, 1);
    CHECK(bo2 == bo3);
    CHECK(!std::equal(bo2.begin(), bo2.end(), bo.begin()));
}

// =============================================================================================
// The FP8 recipe's operands: E4M3 / E5M2 per-tensor casts equal formats/number_formats.h's codecs

TEST_CASE("vcast casts: e4m3fn / e5m2 equal the fp8e4m3 / fp8e5m2 codecs") {
    const DataType e4 = parse_datatype("float8_e4m3fn"), e5 = parse_datatype("e5m2");
    int fails = 0;
    auto check_one = [&](float x) {
        if (std::isnan(x)) return;
        const float w4 = llmc::fp8e4m3_decode(llmc::fp8e4m3_encode(x, llmc::Overflow::Saturate));
        const float w5 = llmc::fp8e5m2_decode(llmc::fp8e5m2_encode(x, llmc::Overflow::Saturate));
        EXPECT_IN_LOOP(same_bits(vcast_element(x, e4, TileScale{}, RoundMode::Even, 0), w4), "e4m3 x=" << x);
        EXPECT_IN_LOOP(same_bits(vcast_element(x, e5, TileScale{}, RoundMode::Even, 0), w5), "e5m2 x=" << x);
        const uint32_t r = vcast_random_bits(3, fbits(x));
        const float s4 = llmc::fp8e4m3_decode(llmc::fp8e4m3_encode(x, llmc::Overflow::Saturate, llmc::Rounding::Stochastic, r));
        EXPECT_IN_LOOP(same_bits(vcast_element(x, e4, TileScale{}, RoundMode::Stochastic, r), s4), "e4m3 SR x=" << x);
    };
    for (uint32_t b = 0; b < 0x10000u && fails < 10; b++) check_one(bitsf(b << 16)); // every BF16 value
    for (uint64_t i = 0; i < 300000 && fails < 10; i++) check_one(bitsf(vcast_random_bits(11, i)));
    // the FP8 recipe's delayed scale s (not a power of two): vcast of x * s is its operand
    const float s = 448.0f / 3.7f;
    for (int i = -2000; i <= 2000; i++) {
        const float x = (float)i * 0.00191f;
        const float xs = x * s;
        EXPECT_IN_LOOP(same_bits(vcast_element(xs, e4, TileScale{}, RoundMode::Even, 0),
                                 llmc::fp8e4m3_decode(llmc::fp8e4m3_encode(xs, llmc::Overflow::Saturate))), x);
    }
    // a per-tensor E8M0 scale: exponent floor(log2 amax) - emax, then the codec on x / 2^e
    std::vector<float> t = {3.0f, -0.07f, 1.5e-3f, 2.9f, -1.1f, 0.0f, 0.5f, 2.0f};
    std::vector<float> out(t.size());
    VcastOptions o;
    const std::vector<TileScale> ts = vcast_matrix(t.data(), out.data(), 2, 4, parse_datatype("float8_e4m3fn_e8m0"), o, 0);
    REQUIRE(ts.size() == 1);
    CHECK(ts[0].exp == 1 - 8); // floor(log2 3) = 1, emax 8
    for (size_t i = 0; i < t.size(); i++) {
        const float want = llmc::fp8e4m3_decode(llmc::fp8e4m3_encode(t[i] * 128.0f, llmc::Overflow::Saturate)) / 128.0f;
        CHECK(same_bits(out[i], want));
    }
}
