// formats/vcast.h: virtual casts ("fake quantization") to TensorCast-style datatypes: parse a datatype
// string (TensorCast's grammar), then quantize-and-dequantize values to it on the CPU or the GPU.
//
//   DataType dt = llmc::vcast::parse_datatype("mxfp4e2");            // or "e5m6_e8m0_t32", ...
//   TileScale s = vcast_tile(in, out, 32, 1, dt, opts, seed, index0, 1); // one tile, in place ok
//
// Two halves:
//   * Host-only parsing (parse_number / parse_scale / parse_datatype, the predefined names,
//     round/scale mode names, sparsity "M:N"). A bad spec throws llmc::InputError whose message
//     quotes the whole spec and names the offending part.
//   * __host__ __device__ casts driven by the parsed spec. DataType is a plain struct (no
//     pointers, no std::string), so a kernel can take it by value. The GPU kernels call the same
//     functions: vcast_stats_add / vcast_stats_merge (a tile's or tensor's amax, min, max),
//     vcast_select_scale (the shared scale), vcast_element (one value), or vcast_tile (all three
//     for one tile or channel, with M-of-N sparsity).
//
// Every float format goes through formats/number_formats.h's minifloat_encode / minifloat_decode (with
// Overflow::Saturate); integers go through the same encoder on a fixed-point grid. The four round
// modes map onto that encoder exactly (see mf_encode). doc/formats.md has the grammar, the
// predefined names and the choices made where TensorCast is open.
//
// Exactness on the GPU: the arithmetic is written with rn_mul / rn_div / rn_add / rn_sub (formats/number_formats.h), which
// are __fmul_rn & co. on the device (never contracted into FMAs, IEEE division even under
// --use_fast_math) and plain operators on the host, so a kernel reproduces the CPU reference bit
// for bit, except that flush-to-zero builds (--use_fast_math) flush float32 subnormals (values
// below 2^-126) where the host keeps them.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/common.h"
#include "number_formats.h"

namespace llmc {
namespace vcast {

// ---------------------------------------------------------------------------------------------
// Parsed specs (plain structs: usable on the device)

enum class NumKind : uint8_t {
    Float,    // eXmY[bZ][fn|fnuz]: signed, implicit bit, subnormals
    Int,      // intK: symmetric, values -(2^(K-1)-1) .. 2^(K-1)-1 (the most negative code unused)
    UInt,     // uintK: 0 .. 2^K-1
    Exponent, // eXm0 (IEEE mode): an unsigned biased power of two, for scales only
};

enum class InfNan : uint8_t {
    IEEE, // top exponent field reserved for inf / NaN
    FN,   // no inf; the all-ones magnitude is NaN
    FNUZ, // no inf; "negative zero" is NaN, so every other code is a number and there is no -0
};

enum class RoundMode : uint8_t {
    Nearest,    // to nearest, ties away from zero
    Even,       // to nearest, ties to even (the default)
    Zero,       // toward zero (truncate)
    Stochastic, // away from zero with probability = the discarded fraction of an ulp
};

enum class ScaleMode : uint8_t {
    Max,    // exponent scale: 2^(floor(log2 amax) - emax) (OCP MX)
    MidMax, // as Max, +1 when amax scaled into the top binade lies above midmax (float data only)
};

enum class TileKind : uint8_t {
    Tensor,  // one scale for the whole tensor (scale spec without a tile part)
    Channel, // t0: one scale per channel along the tile dimension
    Tile,    // tN: one scale per N consecutive elements along the tile dimension
};

struct NumberSpec {
    NumKind kind = NumKind::Float;
    InfNan infnan = InfNan::IEEE;
    int8_t ebits = 0;   // Float / Exponent: X. Int: 1, UInt: 0 (TensorCast's fixed-point view)
    int8_t mbits = 0;   // Float: Y. Int: K-2, UInt: K. Exponent: 0
    int16_t bias = 0;   // Float / Exponent: the exponent bias. Int: 1. UInt: 0
    int8_t bits = 0;    // storage bits: Float 1+X+Y, Int / UInt K, Exponent X
    bool explicit_bias = false; // the spec had a bZ part (or a torch fnuz name's implied bias)
    MinifloatFormat mf = {1, 0, 1, Specials::FiniteOnly, true}; // Float: the codec format
    float maxval = 0.0f;      // Float: largest finite value; Int / UInt: maxint; Exponent: 2^emax
    int emax = 0;             // Float: exponent of maxval; Int: 0; Exponent: largest scale exponent
    int emin = 0;             // Float: 1 - bias; Exponent: smallest scale exponent (-bias)
    float midmax = 0.0f;      // Float: (maxval + 2^(emax+1)) / 2
    float midmax_norm = 0.0f; // Float: midmax / 2^emax (compared with amax's significand)
    int maxint = 0;           // Int: 2^(K-1)-1, UInt: 2^K-1
};

struct ScaleSpec {
    bool present = false;        // false: unscaled datatype
    NumberSpec scale;            // Exponent or Float
    bool has_zero = false;       // zero point (unsigned data only)
    NumberSpec zero;             // Float, Int or UInt
    TileKind tile_kind = TileKind::Tensor;
    int tile = 0;                // Tile: 2..1024 (power of two); otherwise 0
    int dim = -1;                // the dimension the tile / channel runs along (-1 = last)
};

struct DataType {
    NumberSpec num;
    ScaleSpec scale;
    char name[64] = {};          // the spec as given (lower case), or the predefined name
};

struct VcastOptions {
    RoundMode round = RoundMode::Even;
    ScaleMode scale = ScaleMode::Max;
    int sparse_m = 0;            // M-of-N sparsity: keep the M largest magnitudes of every N
    int sparse_n = 0;            // consecutive values along the tile dimension (0 = off)
};

// The scale chosen for one tile (or channel, or tensor).
struct TileScale {
    int exp = 0;        // exponent scales: the scale is 2^exp
    float scale = 1.0f; // the scale as a float (2^exp, or the float scale); 0 = everything is 0
    float zero = 0.0f;  // unsigned data: the zero point (float zero: in value units; int zero:
                        // an integer, in code units)
};

// The running statistics of a tile, over its finite, kept values.
struct TileStats {
    float amax = 0.0f; // max |x|
    float vmin = 0.0f; // min(0, min x)
    float vmax = 0.0f; // max(0, max x)
};


// 2^k for -149 <= k <= 127 (float32 subnormals below -126)
LLMC_HD inline float pow2_any(int k) {
    return k >= -126 ? pow2_normal(k) : bits_float(1u << (k + 149));
}

// x * 2^k, rounded once, for -189 <= k <= 190. Out-of-range powers are split in two steps that
// never round twice: a first step that leaves a subnormal makes the final result round to 0
// either way.
LLMC_HD inline float vc_mul_pow2(float x, int k) {
    if (k > 127) return rn_mul(rn_mul(x, pow2_normal(63)), pow2_normal(k - 63));
    if (k < -126) return rn_mul(rn_mul(x, pow2_normal(-63)), pow2_normal(k + 63));
    return rn_mul(x, pow2_normal(k));
}

// floor(log2 a) and a / 2^floor(log2 a) (in [1, 2)) for a finite a > 0, from the bits
LLMC_HD inline int vc_top_bit(uint32_t u) {
    int p = 31;
    while (p > 0 && ((u >> p) & 1u) == 0u) --p;
    return p;
}
LLMC_HD inline int vc_floor_log2(float a) {
    const uint32_t u = float_bits(a) & 0x7FFFFFFFu;
    if ((u >> 23) != 0u) return (int)(u >> 23) - 127;
    return vc_top_bit(u) - 149;
}
LLMC_HD inline float vc_significand(float a) {
    uint32_t u = float_bits(a) & 0x7FFFFFFFu;
    if ((u >> 23) == 0u) u <<= 23 - vc_top_bit(u); // subnormal: move the top bit to bit 23
    return bits_float((u & 0x7FFFFFu) | 0x3F800000u);
}

LLMC_HD inline float vc_clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// ---------------------------------------------------------------------------------------------
// Random bits for stochastic rounding: a counter-based hash of (seed, element index), so the
// bits of an element do not depend on how the work is split into tiles, threads or kernels.

LLMC_HD inline uint32_t vcast_random_bits(uint64_t seed, uint64_t index) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1u);
    z ^= z >> 31;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 29;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 32;
    return (uint32_t)z;
}

// ---------------------------------------------------------------------------------------------
// Rounding onto a minifloat grid, all four modes through formats/number_formats.h's encoder.
//
// minifloat_encode's stochastic path rounds |x| up iff rbits < F, with F = floor(2^32 * f) and f
// the discarded fraction of an ulp. With a fixed rbits it is a deterministic mode:
//   rbits = 2^31 - 1: up iff F >= 2^31 iff f >= 1/2   -> to nearest, ties away from zero
//   rbits = 2^32 - 1: never up                       -> toward zero
// (F is a floor, so comparing it with an integer is exact even where F is truncated.) Overflow
// is always Saturate: the virtual cast clamps to +-max, inf included.

LLMC_HD inline uint32_t mf_encode(float y, MinifloatFormat f, RoundMode rm, uint32_t rbits) {
    switch (rm) {
        case RoundMode::Even: return minifloat_encode(y, f, Overflow::Saturate, Rounding::NearestEven, 0u);
        case RoundMode::Nearest: return minifloat_encode(y, f, Overflow::Saturate, Rounding::Stochastic, 0x7FFFFFFFu);
        case RoundMode::Zero: return minifloat_encode(y, f, Overflow::Saturate, Rounding::Stochastic, 0xFFFFFFFFu);
        default: return minifloat_encode(y, f, Overflow::Saturate, Rounding::Stochastic, rbits);
    }
}

// y rounded onto float format n (saturating at +-n.maxval; NaN passes through; fnuz gives +0
// for every zero, since fnuz has no -0).
LLMC_HD inline float vcast_quantize_float(float y, const NumberSpec& n, RoundMode rm, uint32_t rbits) {
    if (is_nan_bits(y)) return y;
    const float v = minifloat_decode(mf_encode(y, n.mf, rm, rbits), n.mf);
    if (n.infnan == InfNan::FNUZ && v == 0.0f) return 0.0f;
    return v;
}

// y rounded to an integer (|result| <= 2^18 - 1, saturating), on the fixed-point grid k * 2^-17.
LLMC_HD constexpr MinifloatFormat vcast_int_grid() { return MinifloatFormat{1, 17, 1, Specials::FiniteOnly, true}; }
LLMC_HD inline float vcast_round_int(float y, RoundMode rm, uint32_t rbits) {
    const uint32_t code = mf_encode(vc_mul_pow2(y, -17), vcast_int_grid(), rm, rbits);
    const float q = vc_mul_pow2(minifloat_decode(code, vcast_int_grid()), 17);
    return q == 0.0f ? 0.0f : q; // integers have no -0
}

// ---------------------------------------------------------------------------------------------
// Statistics, scale selection, one element

LLMC_HD inline void vcast_stats_add(TileStats& s, float x) {
    if (!is_finite_bits(x)) return; // NaN and +-inf never set a scale
    const float a = bits_float(float_bits(x) & 0x7FFFFFFFu);
    if (a > s.amax) s.amax = a;
    if (x < s.vmin) s.vmin = x;
    if (x > s.vmax) s.vmax = x;
}

LLMC_HD inline TileStats vcast_stats_merge(TileStats a, const TileStats& b) {
    if (b.amax > a.amax) a.amax = b.amax;
    if (b.vmin < a.vmin) a.vmin = b.vmin;
    if (b.vmax > a.vmax) a.vmax = b.vmax;
    return a;
}

// The scale of a tile (channel, tensor) with statistics st.
//   Exponent scale: e = floor(log2 amax) - emax of the data format (Int: emax 0, its fixed-point
//     view k / 2^(K-2)); MidMax adds 1 when amax / 2^e > midmax (float data with X > 1 only);
//     e is clamped to the scale format's exponent range. An all-zero tile takes the smallest.
//   Float scale, signed data: s = RNE(amax / maxval) in the scale format (maxval = maxfloat, or
//     maxint for Int).
//   Unsigned data: s = RNE((vmax - vmin) / maxint), with vmin = min(0, min x) when there is a zero
//     point and 0 otherwise; zero = RNE(-vmin) in a float zero format, or round_even(-vmin / s)
//     clamped to [0, maxint] for an integer zero point.
LLMC_HD inline TileScale vcast_select_scale(const DataType& dt, const TileStats& st, ScaleMode sm) {
    TileScale ts;
    if (!dt.scale.present) return ts;
    const NumberSpec& n = dt.num;
    const NumberSpec& sc = dt.scale.scale;
    if (sc.kind == NumKind::Exponent) {
        int e = sc.emin;
        if (st.amax > 0.0f) {
            e = vc_floor_log2(st.amax) - n.emax;
            if (sm == ScaleMode::MidMax && n.kind == NumKind::Float && n.ebits > 1 &&
                vc_significand(st.amax) > n.midmax_norm)
                e += 1;
        }
        e = e < sc.emin ? sc.emin : (e > sc.emax ? sc.emax : e);
        ts.exp = e;
        ts.scale = pow2_any(e);
        return ts;
    }
    if (n.kind == NumKind::UInt) {
        const float lo = dt.scale.has_zero ? st.vmin : 0.0f;
        const float s = vcast_quantize_float(rn_div(rn_sub(st.vmax, lo), (float)n.maxint), sc, RoundMode::Even, 0u);
        ts.scale = s;
        if (dt.scale.has_zero) {
            const float neg_lo = lo == 0.0f ? 0.0f : -lo;
            if (dt.scale.zero.kind == NumKind::Float) {
                ts.zero = vcast_quantize_float(neg_lo, dt.scale.zero, RoundMode::Even, 0u);
            } else if (s > 0.0f) {
                ts.zero = vc_clamp(vcast_round_int(rn_div(neg_lo, s), RoundMode::Even, 0u), 0.0f, (float)n.maxint);
            }
        }
        return ts;
    }
    ts.scale = vcast_quantize_float(rn_div(st.amax, n.maxval), sc, RoundMode::Even, 0u);
    return ts;
}

// One value, cast virtually with the tile's scale: quantize, then dequantize. NaN stays NaN;
// +-inf saturates like any value above the format's range. rbits: 32 random bits (Stochastic only).
LLMC_HD inline float vcast_element(float x, const DataType& dt, const TileScale& ts, RoundMode rm, uint32_t rbits) {
    if (is_nan_bits(x)) return x;
    const NumberSpec& n = dt.num;
    if (!dt.scale.present) return vcast_quantize_float(x, n, rm, rbits); // Float only (parser)
    if (dt.scale.scale.kind == NumKind::Exponent) {
        if (n.kind == NumKind::Float)
            return vc_mul_pow2(vcast_quantize_float(vc_mul_pow2(x, -ts.exp), n, rm, rbits), ts.exp);
        // Int: the grid is k * 2^(exp - (K-2)), |k| <= maxint
        const int k = ts.exp - (n.bits - 2);
        const float m = (float)n.maxint;
        const float q = vc_clamp(vcast_round_int(vc_mul_pow2(x, -k), rm, rbits), -m, m);
        return vc_mul_pow2(q, k);
    }
    const float s = ts.scale;
    if (!(s > 0.0f)) return 0.0f; // a zero (underflowed) scale: the tile is all zero
    const float m = (float)n.maxint;
    switch (n.kind) {
        case NumKind::Float: return rn_mul(vcast_quantize_float(rn_div(x, s), n, rm, rbits), s);
        case NumKind::Int: return rn_mul(vc_clamp(vcast_round_int(rn_div(x, s), rm, rbits), -m, m), s);
        default: break; // UInt
    }
    if (dt.scale.has_zero && dt.scale.zero.kind == NumKind::Float) {
        const float q = vc_clamp(vcast_round_int(rn_div(rn_add(x, ts.zero), s), rm, rbits), 0.0f, m);
        return rn_sub(rn_mul(q, s), ts.zero);
    }
    const float z = dt.scale.has_zero ? ts.zero : 0.0f; // an integer
    const float q = vc_clamp(rn_add(vcast_round_int(rn_div(x, s), rm, rbits), z), 0.0f, m);
    return rn_mul(rn_sub(q, z), s);
}

// ---------------------------------------------------------------------------------------------
// M-of-N sparsity and whole tiles

LLMC_HD inline bool vcast_sparsity_on(const VcastOptions& o) { return o.sparse_n > 0 && o.sparse_m > 0 && o.sparse_m < o.sparse_n; }

// Marks (bit j of mask) the values of one group of len <= 1024 that M-of-N sparsity keeps: the m
// largest magnitudes; equal magnitudes keep the lower index first; NaN counts as the largest.
template <class TIn>
LLMC_HD inline void vcast_sparsity_mask(const TIn* g, int len, int64_t stride, int m, uint32_t* mask) {
    for (int w = 0; w < (len + 31) / 32; w++) mask[w] = 0u;
    for (int i = 0; i < len; i++) {
        const uint32_t ai = float_bits(static_cast<float>(g[i * stride])) & 0x7FFFFFFFu;
        int rank = 0; // how many values of the group go before value i
        for (int j = 0; j < len && rank < m; j++) {
            const uint32_t aj = float_bits(static_cast<float>(g[j * stride])) & 0x7FFFFFFFu;
            rank += (aj > ai || (aj == ai && j < i)) ? 1 : 0;
        }
        if (rank < m) mask[i / 32] |= 1u << (i % 32);
    }
}

// Statistics of n values (stride apart), over the values that M-of-N sparsity keeps (groups of
// o.sparse_n from the first value; a shorter last group keeps its m largest).
template <class TIn>
LLMC_HD inline TileStats vcast_tile_stats(const TIn* in, int n, int64_t stride, const VcastOptions& o) {
    TileStats st;
    const bool sparse = vcast_sparsity_on(o);
    const int gn = sparse ? o.sparse_n : n;
    uint32_t mask[32];
    for (int g0 = 0; g0 < n; g0 += gn) {
        const int len = n - g0 < gn ? n - g0 : gn;
        if (sparse) vcast_sparsity_mask(in + g0 * stride, len, stride, o.sparse_m, mask);
        for (int i = 0; i < len; i++)
            if (!sparse || ((mask[i / 32] >> (i % 32)) & 1u)) vcast_stats_add(st, static_cast<float>(in[(g0 + i) * stride]));
    }
    return st;
}

// Casts n values (stride apart) with a given scale; pruned values become +0. Element i uses the
// random bits of index index0 + i * index_step. in and out may be the same array.
template <class TIn, class TOut>
LLMC_HD inline void vcast_tile_apply(const TIn* in, TOut* out, int n, int64_t stride, const DataType& dt,
                                     const TileScale& ts, const VcastOptions& o, uint64_t seed,
                                     uint64_t index0, int64_t index_step) {
    const bool sparse = vcast_sparsity_on(o);
    const int gn = sparse ? o.sparse_n : n;
    uint32_t mask[32];
    for (int g0 = 0; g0 < n; g0 += gn) {
        const int len = n - g0 < gn ? n - g0 : gn;
        if (sparse) vcast_sparsity_mask(in + g0 * stride, len, stride, o.sparse_m, mask); // before writing
        for (int i = 0; i < len; i++) {
            const int64_t at = (int64_t)(g0 + i) * stride;
            float v = 0.0f;
            if (!sparse || ((mask[i / 32] >> (i % 32)) & 1u)) {
                const uint32_t r = o.round == RoundMode::Stochastic
                                       ? vcast_random_bits(seed, index0 + (uint64_t)((int64_t)(g0 + i) * index_step))
                                       : 0u;
                v = vcast_element(static_cast<float>(in[at]), dt, ts, o.round, r);
            }
            out[at] = static_cast<TOut>(v);
        }
    }
}

// One tile (or channel, or a whole tensor held in one array): statistics, scale, cast.
template <class TIn, class TOut>
LLMC_HD inline TileScale vcast_tile(const TIn* in, TOut* out, int n, int64_t stride, const DataType& dt,
                                    const VcastOptions& o, uint64_t seed, uint64_t index0, int64_t index_step) {
    const TileScale ts = vcast_select_scale(dt, vcast_tile_stats(in, n, stride, o), o.scale);
    vcast_tile_apply(in, out, n, stride, dt, ts, o, seed, index0, index_step);
    return ts;
}

// =============================================================================================
// Host only: parsing, names, the CPU reference for a whole matrix

namespace detail {

inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] inline void fail(const std::string& ctx, const std::string& msg) {
    throw InputError("vcast: " + ctx + msg);
}

// reads decimal digits at pos (at least one, at most 9); false if there are none
inline bool read_int(const std::string& s, size_t& pos, int& value) {
    size_t start = pos;
    long v = 0;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
        if (pos - start >= 9) return false;
        v = v * 10 + (s[pos] - '0');
        pos++;
    }
    value = (int)v;
    return pos > start;
}

inline bool all_digits(const std::string& s) {
    if (s.empty()) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    return true;
}

inline bool is_tile_token(const std::string& t) { return t.size() >= 2 && t[0] == 't' && t[1] >= '0' && t[1] <= '9'; }

inline std::string lower(const std::string& s) {
    std::string out = s;
    for (char& c : out)
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
    return out;
}

inline double ldexp2(double m, int e) {
    for (; e > 0; --e) m *= 2.0;
    for (; e < 0; ++e) m *= 0.5;
    return m;
}

inline NumberSpec make_float(int X, int Y, int bias, InfNan inf, bool explicit_bias, const std::string& ctx,
                             const std::string& tok) {
    const std::string where = "number format " + quoted(tok) + ": ";
    if (X < 1 || X > 8) fail(ctx, where + "exponent width " + std::to_string(X) + " is outside 1..8");
    if (Y < 0 || Y > 23) fail(ctx, where + "mantissa width " + std::to_string(Y) + " is outside 0..23");
    if (X == 1 && inf == InfNan::IEEE)
        fail(ctx, where + "one exponent bit with IEEE inf/NaN leaves no normal numbers; use " +
                      tok + "fn or " + tok + "fnuz");
    if (bias < 0 || bias > 127)
        fail(ctx, where + "bias " + std::to_string(bias) + " is outside 0..127 (float32 must hold the format's smallest values)");
    NumberSpec n;
    n.kind = NumKind::Float;
    n.infnan = inf;
    n.ebits = (int8_t)X;
    n.mbits = (int8_t)Y;
    n.bias = (int16_t)bias;
    n.bits = (int8_t)(1 + X + Y);
    n.explicit_bias = explicit_bias;
    n.mf = MinifloatFormat{X, Y, bias, inf == InfNan::IEEE ? Specials::IEEE : inf == InfNan::FN ? Specials::NanOnly : Specials::FiniteOnly, true};
    const uint32_t maxc = n.mf.max_code();
    const int ef = (int)(maxc >> Y);
    const uint32_t man = maxc & ((1u << Y) - 1u);
    if (ef == 0) fail(ctx, where + "has no nonzero finite value");
    const double maxd = ldexp2(1.0 + (double)man / (double)(1u << Y), ef - bias);
    if (maxd >= ldexp2(1.0, 128))
        fail(ctx, where + "its largest value (2^" + std::to_string(ef - bias) + " x " +
                      std::to_string(1.0 + (double)man / (double)(1u << Y)) +
                      ") is beyond float32; raise the bias (at most 127) or use IEEE inf/NaN");
    n.maxval = (float)maxd;
    n.emax = ef - bias;
    n.emin = 1 - bias;
    const double midmax = (maxd + ldexp2(1.0, n.emax + 1)) / 2.0;
    n.midmax = (float)midmax;
    n.midmax_norm = (float)ldexp2(midmax, -n.emax);
    return n;
}

// One number token (lower case, no '_' except a "float8_" prefix). ctx prefixes every message.
inline NumberSpec number_from_token(const std::string& token, const std::string& ctx) {
    std::string t = token;
    if (t.compare(0, 6, "torch.") == 0) t = t.substr(6);
    bool torch8 = false;
    if (t.compare(0, 7, "float8_") == 0) {
        t = t.substr(7);
        torch8 = true;
    }
    if (t.empty()) fail(ctx, "empty number format in " + quoted(token));
    if (!torch8) {
        if (t == "float32") return make_float(8, 23, 127, InfNan::IEEE, false, ctx, token);
        if (t == "float16") return make_float(5, 10, 15, InfNan::IEEE, false, ctx, token);
        if (t == "bfloat16") return make_float(8, 7, 127, InfNan::IEEE, false, ctx, token);
        const bool is_u = t.compare(0, 4, "uint") == 0;
        if (is_u || t.compare(0, 3, "int") == 0) {
            const std::string digits = t.substr(is_u ? 4 : 3);
            if (!all_digits(digits))
                fail(ctx, "number format " + quoted(token) + ": expected " + (is_u ? "uint" : "int") + "K with K in 2..16");
            const int K = digits.size() > 3 ? 99 : std::stoi(digits);
            if (K < 2 || K > 16)
                fail(ctx, "number format " + quoted(token) + ": integer width " + digits + " is outside 2..16");
            NumberSpec n;
            n.kind = is_u ? NumKind::UInt : NumKind::Int;
            n.infnan = is_u ? InfNan::IEEE : InfNan::FNUZ;
            n.bits = (int8_t)K;
            n.ebits = (int8_t)(is_u ? 0 : 1);
            n.mbits = (int8_t)(is_u ? K : K - 2);
            n.bias = (int16_t)(is_u ? 0 : 1);
            n.maxint = is_u ? (1 << K) - 1 : (1 << (K - 1)) - 1;
            n.maxval = (float)n.maxint;
            return n;
        }
    }
    // eXmY[bZ][fn|fnuz]
    size_t pos = 0;
    int X = 0, Y = 0, Z = -1;
    const std::string expect = "number format " + quoted(token) +
                               ": expected eXmY[bZ][fn|fnuz], intK, uintK, float32, float16, bfloat16 or a float8_ name";
    if (t[pos] != 'e') fail(ctx, expect);
    pos++;
    if (!read_int(t, pos, X)) fail(ctx, expect);
    if (pos >= t.size() || t[pos] != 'm') fail(ctx, expect);
    pos++;
    if (!read_int(t, pos, Y)) fail(ctx, expect);
    if (pos < t.size() && t[pos] == 'b') {
        pos++;
        if (!read_int(t, pos, Z)) fail(ctx, "number format " + quoted(token) + ": 'b' must be followed by the bias (digits)");
    }
    const std::string rest = t.substr(pos);
    InfNan inf = InfNan::IEEE;
    if (rest == "fn") inf = InfNan::FN;
    else if (rest == "fnuz") inf = InfNan::FNUZ;
    else if (!rest.empty())
        fail(ctx, "number format " + quoted(token) + ": unexpected " + quoted(rest) + " after " +
                      quoted(t.substr(0, pos)) + " (expected fn, fnuz or nothing)");
    if (X < 1 || X > 8)
        fail(ctx, "number format " + quoted(token) + ": exponent width " + std::to_string(X) + " is outside 1..8");
    const int default_bias = (1 << (X - 1)) - 1;
    if (Y == 0 && inf == InfNan::IEEE) { // exponent type
        if (X < 4)
            fail(ctx, "number format " + quoted(token) + ": exponent (scale) types eXm0 need 4 <= X <= 8");
        const int bias = Z >= 0 ? Z : default_bias;
        NumberSpec n;
        n.kind = NumKind::Exponent;
        n.ebits = (int8_t)X;
        n.bits = (int8_t)X;
        n.bias = (int16_t)bias;
        n.explicit_bias = Z >= 0;
        n.emin = -bias;
        n.emax = (1 << X) - 2 - bias; // the all-ones code is NaN, as in E8M0
        if (n.emin < -127 || n.emax > 127)
            fail(ctx, "number format " + quoted(token) + ": scale exponents " + std::to_string(n.emin) + ".." +
                          std::to_string(n.emax) + " exceed float32's -127..127; choose a bias in " +
                          std::to_string((1 << X) - 129 > 0 ? (1 << X) - 129 : 0) + "..127");
        n.maxval = pow2_any(n.emax);
        return n;
    }
    int bias = Z >= 0 ? Z : default_bias + ((torch8 && inf == InfNan::FNUZ) ? 1 : 0);
    return make_float(X, Y, bias, inf, Z >= 0 || (torch8 && inf == InfNan::FNUZ), ctx, token);
}

struct Predefined {
    const char* name;
    const char* number;
    const char* scale; // "" = unscaled
};

// The specification's predefined datatypes (TensorCast V1). Unscaled float names parse by the grammar
// too; they are listed so that predefined_names() covers the specification's whole list.
inline const std::vector<Predefined>& predefined_table() {
    static const std::vector<Predefined> table = {
        // unscaled
        {"float32", "float32", ""},
        {"float16", "float16", ""},
        {"bfloat16", "bfloat16", ""},
        {"float8_e5m2", "float8_e5m2", ""},
        {"float8_e4m3fn", "float8_e4m3fn", ""},
        {"float8_e5m2fnuz", "float8_e5m2fnuz", ""},
        {"float8_e4m3fnuz", "float8_e4m3fnuz", ""},
        {"e3m2fnuz", "e3m2fnuz", ""},
        {"e2m3fnuz", "e2m3fnuz", ""},
        {"e2m1fnuz", "e2m1fnuz", ""},
        // tensor scaled: f = float16, b = bfloat16, e = e8m0; uint: scale then zero point (i = int8)
        {"uint16_ff", "uint16", "float16_float16"},
        {"uint16_bb", "uint16", "bfloat16_bfloat16"},
        {"int16_f", "int16", "float16"},
        {"int16_b", "int16", "bfloat16"},
        {"int16_e", "int16", "e8m0"},
        {"uint8_ff", "uint8", "float16_float16"},
        {"uint8_bb", "uint8", "bfloat16_bfloat16"},
        {"uint8_fi", "uint8", "float16_int8"},
        {"uint8_bi", "uint8", "bfloat16_int8"},
        {"int8_f", "int8", "float16"},
        {"int8_b", "int8", "bfloat16"},
        {"int8_e", "int8", "e8m0"},
        {"e5m2_e", "e5m2", "e8m0"},
        {"e5m2fnuz_e", "e5m2fnuz", "e8m0"},
        {"e5m2z_e", "e5m2fnuz", "e8m0"},
        {"e4m3fn_e", "e4m3fn", "e8m0"},
        {"e4m3_e", "e4m3fn", "e8m0"},
        {"e4m3fnuz_e", "e4m3fnuz", "e8m0"},
        {"e4m3z_e", "e4m3fnuz", "e8m0"},
        {"e3m2fnuz_e", "e3m2fnuz", "e8m0"},
        {"e3m2_e", "e3m2fnuz", "e8m0"},
        {"e2m3fnuz_e", "e2m3fnuz", "e8m0"},
        {"e2m3_e", "e2m3fnuz", "e8m0"},
        // tile scaled: OCP MX (tile 32) and BFP16 (tile 8)
        {"mxfp8e5", "e5m2", "e8m0_t32"},
        {"mxfp8e4", "e4m3fn", "e8m0_t32"},
        {"mxfp6e3", "e3m2fnuz", "e8m0_t32"},
        {"mxfp6e2", "e2m3fnuz", "e8m0_t32"},
        {"mxfp4e2", "e2m1fnuz", "e8m0_t32"},
        {"mxint8", "int8", "e8m0_t32"},
        {"mxint4", "int4", "e8m0_t32"},
        {"bfp16", "int8", "e8m0_t8"},
        // tile scaled integers with float scales, tile 32
        {"uint8_ff32", "uint8", "float16_float16_t32"},
        {"uint8_bb32", "uint8", "bfloat16_bfloat16_t32"},
        {"uint8_fi32", "uint8", "float16_int8_t32"},
        {"uint8_bi32", "uint8", "bfloat16_int8_t32"},
        {"uint4_ff32", "uint4", "float16_float16_t32"},
        {"uint4_bb32", "uint4", "bfloat16_bfloat16_t32"},
        {"uint4_fi32", "uint4", "float16_int8_t32"},
        {"uint4_bi32", "uint4", "bfloat16_int8_t32"},
        {"int8_f32", "int8", "float16_t32"},
        {"int8_b32", "int8", "bfloat16_t32"},
        {"int4_f32", "int4", "float16_t32"},
        {"int4_b32", "int4", "bfloat16_t32"},
    };
    return table;
}

// Splits at '_' and rejoins a "float8" (or "torch.float8") part with the part after it.
inline std::vector<std::string> split_parts(const std::string& s, const std::string& ctx) {
    std::vector<std::string> raw, parts;
    size_t start = 0;
    while (true) {
        const size_t u = s.find('_', start);
        raw.push_back(s.substr(start, u == std::string::npos ? std::string::npos : u - start));
        if (u == std::string::npos) break;
        start = u + 1;
    }
    for (size_t i = 0; i < raw.size(); i++) {
        if (raw[i].empty())
            fail(ctx, i == 0 ? "starts with '_'" : (i + 1 == raw.size() ? "ends with '_'" : "has an empty part ('__')"));
        if ((raw[i] == "float8" || raw[i] == "torch.float8") && i + 1 < raw.size() && !raw[i + 1].empty()) {
            parts.push_back(raw[i] + "_" + raw[i + 1]);
            i++;
        } else {
            parts.push_back(raw[i]);
        }
    }
    return parts;
}

inline void parse_tile(const std::string& tok, const std::string& ctx, ScaleSpec& sc) {
    size_t pos = 1;
    int size = 0;
    const std::string expect = "tile " + quoted(tok) + ": expected tN or tNdD (N = 0 for channel scaling, or a power of two in 2..1024)";
    if (!read_int(tok, pos, size)) fail(ctx, expect);
    int dim = -1;
    if (pos < tok.size()) {
        if (tok[pos] != 'd') fail(ctx, expect);
        pos++;
        if (!read_int(tok, pos, dim) || pos != tok.size())
            fail(ctx, "tile " + quoted(tok) + ": 'd' must be followed by the dimension (digits)");
    }
    if (size != 0 && (size < 2 || size > 1024 || (size & (size - 1)) != 0))
        fail(ctx, "tile " + quoted(tok) + ": tile size " + std::to_string(size) +
                      " is not a power of two in 2..1024 (or 0 for channel scaling)");
    sc.tile_kind = size == 0 ? TileKind::Channel : TileKind::Tile;
    sc.tile = size;
    sc.dim = dim;
}

// The scale parts [scale, zero?, tile?] for data format num.
inline ScaleSpec scale_from_parts(const std::vector<std::string>& p, size_t first, const NumberSpec& num,
                                  const std::string& ctx) {
    ScaleSpec sc;
    if (first >= p.size()) return sc;
    if (is_tile_token(p[first]))
        fail(ctx, "tile " + quoted(p[first]) + " needs a scale format before it (e.g. e8m0_" + p[first] + ")");
    sc.present = true;
    sc.scale = number_from_token(p[first], ctx);
    size_t i = first + 1;
    if (i < p.size() && !is_tile_token(p[i])) {
        sc.has_zero = true;
        sc.zero = number_from_token(p[i], ctx);
        i++;
    }
    if (i < p.size() && is_tile_token(p[i])) {
        parse_tile(p[i], ctx, sc);
        i++;
    }
    if (i < p.size()) fail(ctx, "unexpected " + quoted(p[i]) + " after " + quoted(p[i - 1]));
    // combinations
    const std::string& sname = p[first];
    if (sc.scale.kind == NumKind::Int || sc.scale.kind == NumKind::UInt)
        fail(ctx, "scale format " + quoted(sname) + " is an integer; a scale is an exponent type (e8m0, ...) or a float");
    if (num.kind == NumKind::UInt && sc.scale.kind == NumKind::Exponent)
        fail(ctx, "scale format " + quoted(sname) + " is an exponent type; unsigned data takes a float scale (float16, bfloat16, ...)");
    if (sc.has_zero) {
        const std::string& zname = p[first + 1];
        if (num.kind != NumKind::UInt)
            fail(ctx, "zero point " + quoted(zname) + " is only for unsigned (uintK) data, not " + quoted(p[0]));
        if (sc.zero.kind == NumKind::Exponent)
            fail(ctx, "zero point " + quoted(zname) + " is an exponent type; use a float or an integer format");
    }
    return sc;
}

} // namespace detail

// A number format alone ("e5m6", "int8", "float8_e4m3fnuz", "e8m0", ...).
inline NumberSpec parse_number(const std::string& spec) {
    const std::string s = detail::lower(spec);
    return detail::number_from_token(s, "");
}

// The datatype "number[_scale[_zero]][_tile]", or a predefined name ("mxfp4e2", "bfp16", ...).
inline DataType parse_datatype(const std::string& spec) {
    const std::string s = detail::lower(spec);
    const std::string ctx = "datatype " + detail::quoted(spec) + ": ";
    if (s.empty()) detail::fail(ctx, "empty spec");
    for (char c : s)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.'))
            detail::fail(ctx, std::string("unexpected character '") + c + "'");
    if (s.size() >= sizeof(DataType{}.name)) detail::fail(ctx, "longer than 63 characters");
    std::string expanded = s;
    for (const detail::Predefined& p : detail::predefined_table())
        if (s == p.name) expanded = std::string(p.number) + (p.scale[0] ? "_" : "") + p.scale;
    const std::vector<std::string> parts = detail::split_parts(expanded, ctx);
    DataType dt;
    dt.num = detail::number_from_token(parts[0], ctx);
    if (dt.num.kind == NumKind::Exponent)
        detail::fail(ctx, "number format " + detail::quoted(parts[0]) +
                              " is an exponent (scale) type; data needs a float or integer format");
    dt.scale = detail::scale_from_parts(parts, 1, dt.num, ctx);
    if (!dt.scale.present && dt.num.kind != NumKind::Float)
        detail::fail(ctx, "integer data " + detail::quoted(parts[0]) + " needs a scale (e.g. " + parts[0] +
                              (dt.num.kind == NumKind::UInt ? "_float16_float16)" : "_e8m0_t32)"));
    std::memcpy(dt.name, s.c_str(), s.size() + 1);
    return dt;
}

// The datatype of a number spec and a scale spec given apart (scale "" = unscaled).
inline DataType make_datatype(const std::string& number, const std::string& scale) {
    if (number.find('_') != std::string::npos && detail::lower(number).compare(0, 7, "float8_") != 0 &&
        detail::lower(number).compare(0, 13, "torch.float8_") != 0)
        detail::fail("number format " + detail::quoted(number) + ": ", "a number format has no '_' part");
    return parse_datatype(scale.empty() ? number : number + "_" + scale);
}

// The scale spec alone ("e8m0_t32", "float16_int8_t0", ...), for data format data.
inline ScaleSpec parse_scale(const std::string& spec, const NumberSpec& data) {
    const std::string s = detail::lower(spec);
    const std::string ctx = "scale " + detail::quoted(spec) + ": ";
    if (s.empty()) return ScaleSpec{};
    const std::vector<std::string> parts = detail::split_parts(s, ctx);
    return detail::scale_from_parts(parts, 0, data, ctx);
}

// Non-throwing form: false and *error = the message for a bad spec.
inline bool try_parse_datatype(const std::string& spec, DataType* out, std::string* error) {
    try {
        *out = parse_datatype(spec);
        return true;
    } catch (const InputError& e) {
        if (error) *error = e.what();
        return false;
    }
}

inline std::vector<std::string> predefined_names() {
    std::vector<std::string> names;
    for (const detail::Predefined& p : detail::predefined_table()) names.push_back(p.name);
    return names;
}

// The number format's canonical spec ("e4m3fn", "e5m2b16fnuz", "int8", "e8m0", "bfloat16").
inline std::string number_name(const NumberSpec& n) {
    switch (n.kind) {
        case NumKind::Int: return "int" + std::to_string(n.bits);
        case NumKind::UInt: return "uint" + std::to_string(n.bits);
        default: break;
    }
    const bool default_bias = n.bias == (1 << (n.ebits - 1)) - 1;
    if (n.kind == NumKind::Float && n.infnan == InfNan::IEEE && default_bias) { // the torch names
        if (n.ebits == 8 && n.mbits == 23) return "float32";
        if (n.ebits == 5 && n.mbits == 10) return "float16";
        if (n.ebits == 8 && n.mbits == 7) return "bfloat16";
    }
    std::string s = "e" + std::to_string(n.ebits) + "m" + std::to_string(n.mbits);
    if (!default_bias) s += "b" + std::to_string(n.bias);
    if (n.kind == NumKind::Float) s += n.infnan == InfNan::FN ? "fn" : n.infnan == InfNan::FNUZ ? "fnuz" : "";
    return s;
}

// The datatype's canonical spec ("e2m1fnuz_e8m0_t32"); parse_datatype of it gives the same fields.
inline std::string spec_string(const DataType& dt) {
    std::string s = number_name(dt.num);
    if (!dt.scale.present) return s;
    s += "_" + number_name(dt.scale.scale);
    if (dt.scale.has_zero) s += "_" + number_name(dt.scale.zero);
    if (dt.scale.tile_kind != TileKind::Tensor) {
        s += "_t" + std::to_string(dt.scale.tile);
        if (dt.scale.dim >= 0) s += "d" + std::to_string(dt.scale.dim);
    }
    return s;
}

// "mxfp4e2 = e2m1fnuz_e8m0_t32 (max 6, tile 32 along dim -1)", for logs.
inline std::string describe(const DataType& dt) {
    std::string s = std::string(dt.name) + " = " + spec_string(dt) + " (";
    s += strfmt("%s max %g", dt.num.kind == NumKind::Float ? "float" : "integer", (double)dt.num.maxval);
    if (!dt.scale.present) s += ", unscaled";
    else if (dt.scale.tile_kind == TileKind::Tensor) s += ", one scale per tensor";
    else if (dt.scale.tile_kind == TileKind::Channel) s += strfmt(", one scale per channel along dim %d", dt.scale.dim);
    else s += strfmt(", one scale per %d values along dim %d", dt.scale.tile, dt.scale.dim);
    return s + ")";
}

inline RoundMode parse_round_mode(const std::string& s) {
    const std::string t = detail::lower(s);
    if (t == "nearest") return RoundMode::Nearest;
    if (t == "even") return RoundMode::Even;
    if (t == "zero") return RoundMode::Zero;
    if (t == "stochastic") return RoundMode::Stochastic;
    detail::fail("", "round mode " + detail::quoted(s) + ": expected nearest, even, zero or stochastic");
}
inline const char* round_mode_name(RoundMode m) {
    return m == RoundMode::Nearest ? "nearest" : m == RoundMode::Even ? "even" : m == RoundMode::Zero ? "zero" : "stochastic";
}

inline ScaleMode parse_scale_mode(const std::string& s) {
    const std::string t = detail::lower(s);
    if (t == "max") return ScaleMode::Max;
    if (t == "midmax" || t == "auto") return ScaleMode::MidMax;
    detail::fail("", "scale mode " + detail::quoted(s) + ": expected max or midmax (alias auto)");
}
inline const char* scale_mode_name(ScaleMode m) { return m == ScaleMode::Max ? "max" : "midmax"; }

// "M:N" (keep M of every N; N a power of two in 2..1024, 1 <= M < N), or "" / "0" = off.
inline void parse_sparsity(const std::string& s, int* m, int* n) {
    *m = *n = 0;
    if (s.empty() || s == "0") return;
    const std::string ctx = "sparsity " + detail::quoted(s) + ": ";
    const size_t colon = s.find(':');
    if (colon == std::string::npos || !detail::all_digits(s.substr(0, colon)) || !detail::all_digits(s.substr(colon + 1)) ||
        colon > 5 || s.size() - colon - 1 > 5)
        detail::fail(ctx, "expected M:N, e.g. 2:4");
    const int M = std::stoi(s.substr(0, colon)), N = std::stoi(s.substr(colon + 1));
    if (N < 2 || N > 1024 || (N & (N - 1)) != 0) detail::fail(ctx, "N = " + std::to_string(N) + " is not a power of two in 2..1024");
    if (M < 1 || M >= N) detail::fail(ctx, "M = " + std::to_string(M) + " must be in 1..N-1");
    *m = M;
    *n = N;
}

// Checks options against a datatype: sparsity groups must fit inside the tiles.
inline void check_options(const DataType& dt, const VcastOptions& o) {
    const std::string ctx = "datatype " + detail::quoted(dt.name) + ": ";
    if (o.sparse_n == 0 && o.sparse_m == 0) return;
    if (o.sparse_n < 2 || o.sparse_n > 1024 || (o.sparse_n & (o.sparse_n - 1)) != 0 || o.sparse_m < 1 || o.sparse_m >= o.sparse_n)
        detail::fail(ctx, strfmt("sparsity %d:%d: need N a power of two in 2..1024 and 1 <= M < N", o.sparse_m, o.sparse_n));
    if (dt.scale.present && dt.scale.tile_kind == TileKind::Tile && o.sparse_n > dt.scale.tile)
        detail::fail(ctx, strfmt("sparsity %d:%d: groups of %d do not fit in tiles of %d", o.sparse_m, o.sparse_n,
                                 o.sparse_n, dt.scale.tile));
}

// The CPU reference for a row-major rows x cols matrix (the trainer's 2-D operands): tiles and
// channels run along the last dimension (dim -1 or 1: within a row) or dim 0 (within a column);
// a tensor scale (and an unscaled cast) covers the whole matrix, with sparsity groups along rows.
// Element (r, c) draws its stochastic-rounding bits from index r * cols + c. Returns the scales
// in order (row-major over (line, tile) for dim -1/1, column-major for dim 0). in may equal out.
inline std::vector<TileScale> vcast_matrix(const float* in, float* out, int rows, int cols, const DataType& dt,
                                           const VcastOptions& o, uint64_t seed) {
    check_options(dt, o);
    const std::string ctx = "datatype " + detail::quoted(dt.name) + ": ";
    const bool tiled = dt.scale.present && dt.scale.tile_kind != TileKind::Tensor;
    const int dim = tiled ? dt.scale.dim : -1;
    if (dim > 1) detail::fail(ctx, strfmt("tile dimension %d does not exist in a matrix", dim));
    const bool along_cols = dim == 0; // the lines are columns
    const int lines = along_cols ? cols : rows;
    const int len = along_cols ? rows : cols;
    const int64_t stride = along_cols ? cols : 1;
    const int64_t line_step = along_cols ? 1 : cols;
    const int tile = !tiled ? len : dt.scale.tile_kind == TileKind::Channel ? len : dt.scale.tile;
    if (len % tile != 0) detail::fail(ctx, strfmt("a line of %d values is not a multiple of the tile size %d", len, tile));
    if (vcast_sparsity_on(o) && len % o.sparse_n != 0)
        detail::fail(ctx, strfmt("a line of %d values is not a multiple of the sparsity group %d", len, o.sparse_n));
    std::vector<TileScale> scales;
    if (!tiled) { // one scale for everything (none, or a tensor scale)
        TileStats st;
        for (int l = 0; l < lines; l++) st = vcast_stats_merge(st, vcast_tile_stats(in + l * line_step, len, stride, o));
        const TileScale ts = vcast_select_scale(dt, st, o.scale);
        for (int l = 0; l < lines; l++)
            vcast_tile_apply(in + l * line_step, out + l * line_step, len, stride, dt, ts, o, seed,
                             (uint64_t)(l * line_step), stride);
        scales.push_back(ts);
        return scales;
    }
    for (int l = 0; l < lines; l++)
        for (int t0 = 0; t0 < len; t0 += tile) {
            const int64_t at = l * line_step + t0 * stride;
            scales.push_back(vcast_tile(in + at, out + at, tile, stride, dt, o, seed, (uint64_t)at, stride));
        }
    return scales;
}

} // namespace vcast
} // namespace llmc
