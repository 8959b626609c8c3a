// formats/number_formats.h: exact encoders/decoders for the low-precision number formats that the
// precision recipes share: FP8 E4M3 and E5M2, FP4 E2M1, the block-scale formats UE4M3 and E8M0,
// and the fixed-point formats Q1.15 and Q1.31.
//
// Header-only; every function is usable from host code (g++ -std=c++17, no CUDA headers needed)
// and from device code (nvcc). Encoders take a float32 and return the code in the low bits of an
// unsigned integer; decoders return the exact float32 value of a code. All three small float
// formats go through ONE generic minifloat encoder/decoder (minifloat_encode / minifloat_decode),
// parameterized by a MinifloatFormat (exponent bits, mantissa bits, bias, special-value policy),
// so the later virtual-cast recipe can reuse it for arbitrary eXmY formats. The NVFP4 kernels'
// hot codecs (E2M1 encode/decode, UE4M3 round-to-nearest encode and decode) have fast paths
// written on the float's bits; the CPU tests check each against the generic codec.
//
// ==================================================================================================
// Documented choices (the docs copy this block)
// ==================================================================================================
// Formats, per the OCP 8-bit floating point specification (OFP8) and the OCP Microscaling (MX)
// specification:
//   E4M3 ("fn"): bias 7, no infinities, NaN = S.1111.111 (0x7F, 0xFF); max normal 448 (0x7E),
//                min normal 2^-6, subnormals k * 2^-9 (k = 1..7); -0 = 0x80.
//   E5M2:        bias 15, IEEE-like: +-inf = 0x7C/0xFC, NaN = 0x7D-0x7F/0xFD-0xFF; max normal
//                57344 (0x7B), min normal 2^-14, subnormals k * 2^-16 (k = 1..3); -0 = 0x80.
//   E2M1:        bias 1, +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no inf/NaN; code in the low nibble,
//                sign = bit 3 (so -0 = 0x8).
//   UE4M3:       the E4M3 code with the sign bit 0 (NVFP4 block scales): values 0..448, 0x7F NaN.
//                Decoding ignores bit 7 (a code 0x80|c decodes like c).
//   E8M0:        2^(code - 127) for code 0..254 (2^-127 .. 2^127), 0xFF = NaN, no zero, no sign.
//
// Rounding (every float encoder):
//   * NearestEven: round to the nearest representable value, ties to the even code (even last
//     mantissa bit). Subnormal inputs and outputs are exact (half the smallest subnormal is a tie
//     and rounds to 0, anything above it rounds to the smallest subnormal).
//   * Stochastic (SR): with the caller's 32 random bits r, |x| rounds away from zero iff
//     r < F, where F = floor(2^32 * (|x| - lo) / (hi - lo)) is the discarded fraction of the
//     destination ulp in 0.32 fixed point (lo, hi = the neighbours of |x| with the destination
//     format's exponent range unbounded above). So P(round up) = F / 2^32 for uniform r.
//     Resolution: 2^-32 of an ulp. F is EXACT (so SR is exactly unbiased) whenever the input has
//     no significant bit below 2^-32 ulp, which holds for every |x| >= min_subnormal * 2^-9
//     (E4M3: 2^-18, E5M2: 2^-25, E2M1: 2^-10). Below that, F is truncated: P(up) is low by less
//     than 2^-32 (absolute). Representable values are returned exactly for every r (F = 0), and
//     only the two neighbours lo, hi can ever be produced (before the overflow rule below).
//
// Overflow (rounding with an unbounded exponent, then: a result above max "overflows"):
//   * E4M3, RNE: the unbounded-exponent neighbour above 448 is 480 (mantissa odd), so |x| <= 464
//     (the midpoint, a tie -> even 448) gives 448 and |x| > 464 overflows.
//   * E5M2, RNE: the neighbour above 57344 is 65536 (= 2^16, mantissa even), so |x| < 61440 gives
//     57344 and |x| >= 61440 (the midpoint ties to 65536) overflows, as IEEE 754 does.
//   * SR: |x| in (max, next) overflows with probability F / 2^32 (rounds down to max otherwise);
//     |x| >= next always overflows.
//   * Overflow::Saturate: overflow -> +-max; +-inf input -> +-max (E4M3 and E5M2 alike).
//   * Overflow::NonSaturate: overflow and +-inf -> NaN (E4M3, no infinities; canonical 0x7F) or
//     +-inf (E5M2, 0x7C/0xFC), as OCP's non-saturating mode.
//   * E2M1 has neither inf nor NaN: it always saturates (|x| > 6 or inf -> +-6), whatever Overflow.
//   * UE4M3 always saturates (-> 448); negative inputs (and -0, -inf) give +0 (code 0x00).
// NaN input:
//   * E4M3 / UE4M3 -> 0x7F, E5M2 -> 0x7E (quiet NaN: exponent all ones, mantissa MSB set). The
//     sign of a NaN is dropped: every NaN this file produces is the positive canonical code.
//   * E2M1 -> +6 (0x7). OCP MX leaves NaN -> E2M1 implementation-defined; +MAXNORM is what
//     NVIDIA's conversions (cvt ... .satfinite e2m1, cuda_fp4.h) do.
//   * E8M0 -> 0xFF (its NaN).
//
// E8M0 encoders (always saturating; the sign of the input is ignored: they encode |x|):
//   e8m0_encode_floor:   2^floor(log2|x|)   (the MX spec's scale derivation rounds down)
//   e8m0_encode_ceil:    2^ceil(log2|x|)    (the smallest power of two >= |x|)
//   e8m0_encode_nearest: the power of two nearest to |x| in absolute difference; ties
//                        (|x| = 1.5 * 2^k) round UP to 2^(k+1).
//   Results below 2^-127 (including 0 and float32 subnormals that round below it) clip to code 0
//   (2^-127); results above 2^127 and +-inf saturate to 0xFE (2^127); NaN -> 0xFF.
//
// Q1.15 / Q1.31 (SF16): encode clamps x to [-0.999, +0.999] (Q115_OVERFLOW_THRESHOLD,
//   also for Q1.31), scales by 2^15 (2^31), rounds to nearest integer with ties to EVEN, and
//   decode multiplies the integer by 2^-15 (2^-31). The SF16 specification says "round to nearest",
//   and the implementation it describes (float_to_q115 with __float2int_rn) rounds ties to even, which is what this file does (device: __float2int_rn;
//   host: std::nearbyint in the default rounding mode). 0.999f * 32768 = 32735.232... -> code 32735,
//   so simulate_q115 never returns more than 32735/32768 in magnitude (codes +-32736..32767 and
//   -32768 are decodable but never produced). 0.999f * 2^31 is already an integer
//   (2145336192), so Q1.31's clamp value is exact. NaN -> code 0 from q115_encode/q131_encode,
//   but the simulate functions keep a NaN a NaN (so it still reaches the loss check):
//   simulate_q131 returns the input itself, simulate_q115 the NaN 0x7FFFFFFF (Q115_NAN_BITS, what
//   the device's NaN-propagating min/max give; the host returns the same bits). +-inf clamps to +-0.999. -0 and negatives that round to 0 give +0 (an integer code has
//   no -0). q131_decode(k) rounds k to float32 (RNE) when |k| has more than 24 significant bits;
//   codes produced by q131_encode are always exact.
//
// Float32 subnormals: decoding a format whose values fall below 2^-126 (E8M0's 2^-127, or a
//   custom eXmY with 8 exponent bits) returns a float32 subnormal, which device code compiled with
//   --use_fast_math (flush-to-zero) will flush in later arithmetic. The FP8/FP4 formats never
//   need float32 subnormals. The encoders read the input's bits, so they are exact under FTZ too.
//
// Where the FP8 specification the recipes were written from differs from OCP (this file follows OCP):
//   * It flushes |x| < 1e-7 to code 0x00 before anything else. OCP rounds every finite
//     value; tiny negative values round to -0 (0x80), and under SR a tiny value still has its
//     (small) probability of becoming the smallest subnormal. Here: no flush, sign kept.
//   * It keeps +-inf as +-inf for E5M2 even in its "clamp" path; OCP's saturating mode maps
//     +-inf to +-57344. Here: Saturate -> +-max, NonSaturate -> +-inf.
//   * It maps +-inf to +-448 for E4M3 unconditionally; that is OCP's saturating mode only.
//     OCP's non-saturating mode gives NaN (E4M3 has no infinity). Here: both, per Overflow.
//   * It encodes NaN as 0x7F for E5M2 as well. 0x7F is a valid E5M2 NaN, so that is no
//     conflict; this file's canonical E5M2 NaN is 0x7E (see above).
//   * It also lists the "fnuz" variants (E4M3FNUZ bias 8, E5M2FNUZ bias 16, no -0, 0x80 =
//     NaN). They are not OCP formats and are not provided here.
//   * The FP8/FP4 recipe specification gives the formats' maxima (448, 57344) and the E2M1 value
//     set; these agree with OCP. Its NVFP4 "FP8 E4M3" block scales are non-negative, i.e. UE4M3 above.
// ==================================================================================================
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

#ifndef LLMC_HD
#ifdef __CUDACC__
#define LLMC_HD __host__ __device__
#else
#define LLMC_HD
#endif
#endif

// Full unrolling of the small fixed-length loops of the block codecs on the device (their arrays
// then live in registers); nothing on the host.
#ifdef __CUDA_ARCH__
#define LLMC_UNROLL _Pragma("unroll")
#else
#define LLMC_UNROLL
#endif

namespace llmc {

// ---------------------------------------------------------------------------------------------
// Bit casts between float and its IEEE binary32 encoding.

LLMC_HD inline uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
#endif
}

LLMC_HD inline float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// ---------------------------------------------------------------------------------------------
// Correctly rounded binary32 arithmetic, the same bits on host and device. Device code here is
// built with --use_fast_math, under which '/' is an approximation and a * b + c may be contracted
// into one FMA; the __f*_rn intrinsics are neither. On the host these are the plain operators
// (x86-64 SSE with the default flags does not contract; a host build with -mfma needs
// -ffp-contract=off). Codecs and quantizers that must match a CPU reference use these.

LLMC_HD inline float rn_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
LLMC_HD inline float rn_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
LLMC_HD inline float rn_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
LLMC_HD inline float rn_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
LLMC_HD inline float rn_fma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return std::fma(a, b, c);
#endif
}

// 2^k as a float, for -126 <= k <= 127 (a normal float32, built from its bits).
LLMC_HD inline float pow2_normal(int k) { return bits_float((uint32_t)(k + 127) << 23); }

// ---------------------------------------------------------------------------------------------
// Rounding and overflow modes.

enum class Rounding : uint8_t {
    NearestEven, // round to nearest, ties to even
    Stochastic,  // round up with probability (x - lo) / (hi - lo), from 32 caller-given random bits
};

enum class Overflow : uint8_t {
    Saturate,    // overflow and +-inf -> +-max finite
    NonSaturate, // overflow and +-inf -> +-inf where the format has it, else NaN
};

// ---------------------------------------------------------------------------------------------
// Generic small float ("minifloat") format: [sign] exponent mantissa, with an implicit leading 1
// for exponent fields > 0, subnormals (no implicit 1, exponent 1 - bias) for exponent field 0.

enum class Specials : uint8_t {
    IEEE,       // top exponent field: mantissa 0 = inf, else NaN (E5M2, FP16, BF16)
    NanOnly,    // no inf; only the all-ones magnitude (S.1..1.1..1) is NaN (OCP E4M3 "fn")
    FiniteOnly, // no inf, no NaN: every code is a number (E2M1, the MX FP6 types)
};

// Supported: 1 <= exp_bits <= 8, 0 <= man_bits <= 23 (1 <= man_bits for IEEE), 1 <= bias <= 127
// (min normal >= 2^-126) and a largest finite value below 2^128 (representable in float32).
struct MinifloatFormat {
    int exp_bits;
    int man_bits;
    int bias;
    Specials specials;
    bool is_signed; // false: no sign bit (UE4M3); negative inputs encode to +0

    LLMC_HD constexpr int mag_bits() const { return exp_bits + man_bits; }
    LLMC_HD constexpr int total_bits() const { return mag_bits() + (is_signed ? 1 : 0); }
    LLMC_HD constexpr uint32_t sign_mask() const { return is_signed ? 1u << mag_bits() : 0u; }
    LLMC_HD constexpr uint32_t all_ones_mag() const { return (1u << mag_bits()) - 1u; }
    // exponent of the smallest normal (also the exponent of the subnormal range)
    LLMC_HD constexpr int emin() const { return 1 - bias; }
    // magnitude code of the largest finite value
    LLMC_HD constexpr uint32_t max_code() const {
        return specials == Specials::IEEE      ? (((1u << exp_bits) - 1u) << man_bits) - 1u
               : specials == Specials::NanOnly ? all_ones_mag() - 1u
                                               : all_ones_mag();
    }
    // magnitude code of +inf (IEEE only)
    LLMC_HD constexpr uint32_t inf_code() const { return ((1u << exp_bits) - 1u) << man_bits; }
    // the code that a NaN input encodes to: the positive canonical NaN (IEEE: quiet NaN with only
    // the mantissa MSB set; NanOnly: all ones); FiniteOnly formats have no NaN: +max.
    LLMC_HD constexpr uint32_t nan_code() const {
        return specials == Specials::IEEE      ? inf_code() | (1u << (man_bits - 1))
               : specials == Specials::NanOnly ? all_ones_mag()
                                               : max_code();
    }
    // exponent (unbiased) of the largest finite value
    LLMC_HD constexpr int emax() const { return (int)(max_code() >> man_bits) - bias; }
    // the largest finite value, as a double (for host-side constants and tests)
    LLMC_HD constexpr double max_finite() const {
        double m = 1.0 + (double)(max_code() & ((1u << man_bits) - 1u)) / (double)(1u << man_bits);
        int e = emax();
        for (; e > 0; --e) m *= 2.0;
        for (; e < 0; ++e) m *= 0.5;
        return m;
    }
};

constexpr MinifloatFormat kFP8E4M3{4, 3, 7, Specials::NanOnly, true};
constexpr MinifloatFormat kFP8E5M2{5, 2, 15, Specials::IEEE, true};
constexpr MinifloatFormat kFP4E2M1{2, 1, 1, Specials::FiniteOnly, true};
constexpr MinifloatFormat kUE4M3{4, 3, 7, Specials::NanOnly, false};

constexpr float kFP8E4M3Max = 448.0f;
constexpr float kFP8E5M2Max = 57344.0f;
constexpr float kFP4E2M1Max = 6.0f;
static_assert(kFP8E4M3.max_finite() == 448.0, "E4M3 max");
static_assert(kFP8E5M2.max_finite() == 57344.0, "E5M2 max");
static_assert(kFP4E2M1.max_finite() == 6.0, "E2M1 max");

// Encode x into format f. Returns the code in the low f.total_bits() bits.
//
// Method: write |x| = sig * 2^(e - 23) (sig the 24-bit float32 significand, e its exponent).
// In the destination, values near |x| are multiples of the quantum 2^(max(e, emin) - M), so the
// integer part q = sig >> shift counts quanta and the bits shifted out are the fraction to round.
// The magnitude code is then ((max(e, emin) - emin) << M) + q (+1 if rounded up): for a normal
// result q carries the implicit 1 at bit M, which adds the missing 1 to the exponent field; for
// a subnormal result the exponent field is 0; and a carry out of the mantissa on rounding up
// moves into the exponent field by itself. Codes above max_code() are overflow.
LLMC_HD inline uint32_t minifloat_encode(float x, MinifloatFormat f, Overflow overflow,
                                         Rounding rounding = Rounding::NearestEven,
                                         uint32_t rbits = 0) {
    const uint32_t u = float_bits(x);
    const uint32_t a = u & 0x7FFFFFFFu; // |x|
    const bool negative = (u >> 31) != 0;
    if (a > 0x7F800000u) return f.nan_code();     // NaN
    if (negative && !f.is_signed) return 0u;      // unsigned format: negatives clamp to +0
    const uint32_t sign = negative ? f.sign_mask() : 0u;

    uint32_t mag;
    if (a == 0x7F800000u) {
        mag = f.max_code() + 1u;                  // +-inf: always overflow
    } else {
        const int fexp = (int)(a >> 23);
        const uint32_t sig = (a & 0x7FFFFFu) | (fexp != 0 ? 0x800000u : 0u);
        const int e = (fexp != 0 ? fexp : 1) - 127; // float32 subnormals: exponent -126, no implicit 1
        const int emin = f.emin();
        const int denorm = emin > e ? emin - e : 0; // extra shift when the result is subnormal
        const int shift = 23 - f.man_bits + denorm; // >= 0
        uint32_t q;    // whole quanta
        uint32_t frac; // the discarded fraction of a quantum, in 0.32 fixed point (see top)
        if (shift == 0) {
            q = sig;
            frac = 0u;
        } else if (shift < 32) {
            q = sig >> shift;
            frac = sig << (32 - shift); // the bits of q fall off the top
        } else {
            q = 0u;                     // sig < 2^24 < 2^shift
            frac = shift < 56 ? sig >> (shift - 32) : 0u; // exact for shift == 32, truncated above
        }
        uint32_t up;
        if (rounding == Rounding::Stochastic) {
            up = rbits < frac ? 1u : 0u;
        } else {
            up = (frac > 0x80000000u || (frac == 0x80000000u && (q & 1u) != 0u)) ? 1u : 0u;
        }
        mag = ((uint32_t)(e + denorm - emin) << f.man_bits) + q + up;
    }
    if (mag > f.max_code()) {
        if (overflow == Overflow::Saturate || f.specials == Specials::FiniteOnly) {
            mag = f.max_code();
        } else if (f.specials == Specials::IEEE) {
            mag = f.inf_code();
        } else {
            return f.nan_code();                  // canonical NaN carries no sign
        }
    }
    return sign | mag;
}

// Decode the low f.total_bits() bits of code (higher bits are ignored) to its exact float value.
LLMC_HD inline float minifloat_decode(uint32_t code, MinifloatFormat f) {
    const int m_bits = f.man_bits;
    const uint32_t mag = code & f.all_ones_mag();
    const uint32_t ef = mag >> m_bits;                 // exponent field
    const uint32_t man = mag & ((1u << m_bits) - 1u);  // mantissa field
    const uint32_t sign = (code & f.sign_mask()) != 0u ? 0x80000000u : 0u;
    if (f.specials == Specials::IEEE && ef == (1u << f.exp_bits) - 1u)
        return bits_float(man != 0u ? 0x7FC00000u : (sign | 0x7F800000u));
    if (f.specials == Specials::NanOnly && mag == f.all_ones_mag()) return bits_float(0x7FC00000u);
    if (ef != 0u) // normal: rebias the exponent, left-align the mantissa
        return bits_float(sign | ((ef + 127u - (uint32_t)f.bias) << 23) | (man << (23 - m_bits)));
    // subnormal (or zero): man * 2^(emin - M); both scalings are exact
    const float v = (float)man * pow2_normal(f.emin()) * pow2_normal(-m_bits);
    return bits_float(sign | float_bits(v));
}

// Round to nearest even in the VALUE domain, saturating: the float value
// minifloat_decode(minifloat_encode(x, f, Overflow::Saturate, Rounding::NearestEven)) for every
// x that is not NaN (NaN is returned as it is), in a handful of instructions instead of the
// bit-level encoder and decoder. The virtual-cast kernels' hot loop (recipes/vcast/vcast_kernels.cuh); the CPU
// test checks it against the pair for every float32 sign, exponent and top 11 mantissa bits,
// with the low 12 bits all the patterns that matter to rounding.
//
// Method: near |x| the values of f are the multiples of the quantum 2^(E - M), E = floor(log2 |x|)
// clamped to [emin, emax] (a value below 2^emin is a multiple of the subnormal quantum; above the
// largest binade the quantum stays that of the largest). |x| / quantum is an exact float (a power
// of two scaling of a normal float that stays normal, or zero), rint rounds it to an integer with
// ties to even, and an even integer is an even code (its last bit is the code's mantissa LSB,
// the implicit 1 above it or not); the product back is exact, and a carry out of the mantissa
// lands on the next binade's first value, as the encoder's carry does. fminf saturates (inf
// included: inf / quantum = inf). Needs 2^(E - M) and 2^(M - E) normal for every E in
// [emin, emax] (minifloat_round_even_ok): every format with at most 8 exponent bits and a
// moderate bias, e.g. all FP8 / FP6 / FP4 element formats.
LLMC_HD constexpr bool minifloat_round_even_ok(MinifloatFormat f) {
    return f.emin() - f.man_bits >= -126 && f.man_bits - f.emin() <= 127 && f.emax() - f.man_bits <= 127 &&
           f.man_bits - f.emax() >= -126;
}
LLMC_HD inline float rn_rint(float x) {
#ifdef __CUDA_ARCH__
    return rintf(x);
#else
    return std::nearbyint(x); // the default rounding mode: to nearest, ties to even
#endif
}
LLMC_HD inline float minifloat_round_even(float x, MinifloatFormat f) {
    const uint32_t u = float_bits(x), abits = u & 0x7FFFFFFFu;
    if (abits > 0x7F800000u) return x;                // NaN
    if ((u >> 31) != 0u && !f.is_signed) return 0.0f; // unsigned: negatives clamp to +0
    const int e = (int)(abits >> 23) - 127;           // -127 for zero and float32 subnormals
    const int emin = f.emin(), emax = f.emax();
    const int E = e < emin ? emin : (e > emax ? emax : e);
    const float k = rn_rint(rn_mul(bits_float(abits), pow2_normal(f.man_bits - E)));
    const float v = fminf(rn_mul(k, pow2_normal(E - f.man_bits)), (float)f.max_finite());
    return bits_float(float_bits(v) | (u & 0x80000000u));
}

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 / E5M2

LLMC_HD inline uint8_t fp8e4m3_encode(float x, Overflow overflow,
                                      Rounding rounding = Rounding::NearestEven,
                                      uint32_t rbits = 0) {
    return (uint8_t)minifloat_encode(x, kFP8E4M3, overflow, rounding, rbits);
}
LLMC_HD inline float fp8e4m3_decode(uint8_t code) { return minifloat_decode(code, kFP8E4M3); }

LLMC_HD inline uint8_t fp8e5m2_encode(float x, Overflow overflow,
                                      Rounding rounding = Rounding::NearestEven,
                                      uint32_t rbits = 0) {
    return (uint8_t)minifloat_encode(x, kFP8E5M2, overflow, rounding, rbits);
}
LLMC_HD inline float fp8e5m2_decode(uint8_t code) { return minifloat_decode(code, kFP8E5M2); }

// ---------------------------------------------------------------------------------------------
// FP4 E2M1 (always saturating; code in the low nibble; decode ignores the high nibble)

// Round to nearest even, branch-free. Below 1 the quantum is 0.5 and the midpoints are 0.25 and
// 0.75 (ties go to the even codes 0 and 2): the magnitude code is (a > 0.25) + (a >= 0.75). From 1
// up the values are 2^e (1 + m / 2): adding 2^21 - 1 plus the kept mantissa LSB rounds the float's
// bits to one mantissa bit (ties to even; a carry moves into the exponent), and the top bits less
// 126 << 1 are the code (1.0 -> 2, 6.0 -> 7); everything above 5 (inf too) saturates to 7. NaN gives
// +6 (code 0x7), as the generic encoder does. The NVFP4 kernels encode every element two or three
// times (Four Over Six), so this is their hot loop; the CPU tests check it against minifloat_encode
// over a dense sample of all float32 values.
LLMC_HD inline uint8_t fp4e2m1_encode_nearest(float x) {
    const uint32_t u = float_bits(x), abits = u & 0x7FFFFFFFu;
    const float a = bits_float(abits);
    const uint32_t below_one = (uint32_t)(a > 0.25f) + (uint32_t)(a >= 0.75f);
    const uint32_t rounded = ((abits + 0x1FFFFFu + ((abits >> 22) & 1u)) >> 22) - (126u << 1); // (wraps below 1: unused)
    const uint32_t mag = a < 1.0f ? below_one : (rounded < 7u ? rounded : 7u);
    return (uint8_t)((abits > 0x7F800000u ? 0u : (u >> 28) & 0x8u) | mag);
}

// Stochastic rounding with the generic encoder's rule (minifloat_encode): |x| = (q + f) quanta, q
// whole and f in [0, 1); round up (away from zero) iff rbits < floor(2^32 f). The quantum is 0.5
// below 2, 1 in [2, 4) and 2 in [4, 8), so t = |x| / quantum is an exact power-of-two scaling and
// t < 4. For t >= 1 the bits of t below 2^-23 are zero, so v = t * 2^30 converts to an integer exactly:
// q = v >> 30 and the fraction's 32 bits are v << 2. For t < 1, v = t * 2^32 (truncated, as the
// generic encoder truncates a fraction that reaches below 2^-32) is the fraction itself. |x| >= 6
// (inf too) gives 6, as rounding from the top interval [6, 8) saturates there; NaN gives +6 (0x7);
// a zero keeps its sign. Branch-free: |x| is clamped to 7 first (NaN too), so every conversion is
// in range, and the saturating cases are selected at the end. The NVFP4 gradients' hot loop: the
// generic encoder's per-field arithmetic cost about 40 instructions an element; the CPU tests check
// this one against it for every float32 sign, exponent and top 12 mantissa bits (4 patterns of the
// low 11) and the random words at each decision boundary.
LLMC_HD inline uint8_t fp4e2m1_encode_stochastic(float x, uint32_t rbits) {
    const uint32_t u = float_bits(x), abits = u & 0x7FFFFFFFu;
    const bool nan = abits > 0x7F800000u;
    const float a = nan ? 7.0f : fminf(bits_float(abits), 7.0f);
    const float t = a < 2.0f ? rn_mul(a, 2.0f) : (a < 4.0f ? a : rn_mul(a, 0.5f));
    const bool below_one = t < 1.0f;
    const uint32_t v = (uint32_t)rn_mul(t, below_one ? 4294967296.0f : 1073741824.0f); // exact (see above)
    const uint32_t q = below_one ? 0u : v >> 30, frac = below_one ? v : v << 2;
    const uint32_t base = q + (a < 2.0f ? 0u : (a < 4.0f ? 2u : 4u)); // the code of the value below
    const uint32_t up = base + (rbits < frac ? 1u : 0u);
    const uint32_t mag = a >= 6.0f ? 7u : (up > 7u ? 7u : up);
    return (uint8_t)((nan ? 0u : (u >> 28) & 0x8u) | mag);
}

LLMC_HD inline uint8_t fp4e2m1_encode(float x, Rounding rounding = Rounding::NearestEven,
                                      uint32_t rbits = 0) {
    if (rounding == Rounding::NearestEven) return fp4e2m1_encode_nearest(x);
    return fp4e2m1_encode_stochastic(x, rbits);
}
// The value's float32 bits built directly (no int-to-float conversion, a slow instruction on GPUs):
// magnitude m >= 2 is 2^((m >> 1) - 1) * (1 + (m & 1) / 2), i.e. exponent field 126 + (m >> 1) and
// mantissa MSB m & 1; m = 1 is 0.5, m = 0 is 0; bit 3 is the sign.
LLMC_HD inline float fp4e2m1_decode(uint8_t code) {
    const uint32_t mag = code & 0x7u;
    const uint32_t bits = mag >= 2u ? ((126u + (mag >> 1)) << 23) | ((mag & 1u) << 22) : (mag != 0u ? 0x3F000000u : 0u);
    return bits_float(bits | ((uint32_t)(code & 0x8u) << 28));
}

// ---------------------------------------------------------------------------------------------
// UE4M3 block scales (always saturating; negatives -> 0; decode ignores bit 7)

// Round to nearest even, saturating, by the float's bits (minifloat_encode's result for every input,
// which the CPU tests check over a dense sample of float32): NaN -> 0x7F; negatives and zeros -> 0;
// 448 and above (inf too) -> 0x7E, since nothing below 448 rounds above it; below 2^-6 the quantum
// is 2^-9, so the code is rint(x * 2^9) (exact scaling; 8 is the code of 2^-6 itself); otherwise
// adding 2^19 - 1 plus the kept mantissa LSB rounds the float's bits to 3 mantissa bits (a carry
// moves into the exponent), and the top bits less (127 - 7) << 3 are the code. The NVFP4 kernels
// compute two block scales per 16 values with it; the generic encoder takes ~60 instructions.
LLMC_HD inline uint8_t ue4m3_encode_nearest(float x) {
    const uint32_t u = float_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint8_t)kUE4M3.nan_code();
    if ((u >> 31) != 0u) return 0u;
    if (x >= 448.0f) return 0x7Eu;
    if (x < 0x1p-6f) return (uint8_t)rn_rint(rn_mul(x, 512.0f));
    return (uint8_t)(((u + 0x7FFFFu + ((u >> 20) & 1u)) >> 20) - ((127u - 7u) << 3));
}
LLMC_HD inline uint8_t ue4m3_encode(float x, Rounding rounding = Rounding::NearestEven,
                                    uint32_t rbits = 0) {
    if (rounding == Rounding::NearestEven) return ue4m3_encode_nearest(x);
    return (uint8_t)minifloat_encode(x, kUE4M3, Overflow::Saturate, rounding, rbits);
}
// The value of a code (bit 7 ignored; 0x7F is NaN), by its bits: exponent field ef >= 1 is
// 2^(ef - 7) (1 + m / 8); ef = 0 is m 2^-9, built as the ef = 1 value less 2^-6 (exact: both are
// multiples of 2^-9 below 2^-5). Equals minifloat_decode(code, kUE4M3) for all 256 codes (CPU test).
LLMC_HD inline float ue4m3_decode(uint8_t code) {
    const uint32_t mag = code & 0x7Fu, ef = mag >> 3;
    const float v = bits_float(((ef != 0u ? ef : 1u) + 120u) << 23 | (mag & 7u) << 20);
    if (mag == 0x7Fu) return bits_float(0x7FC00000u);
    return ef != 0u ? v : rn_sub(v, 0x1p-6f);
}

// ---------------------------------------------------------------------------------------------
// E8M0 scales: 2^(code - 127), 0xFF = NaN. float32's exponent field has the same bias (127), so
// for a normal float the floor encoding is just its exponent field.

LLMC_HD inline float e8m0_decode(uint8_t code) {
    if (code == 0xFFu) return bits_float(0x7FC00000u);
    if (code == 0u) return bits_float(0x00400000u); // 2^-127, a float32 subnormal
    return bits_float((uint32_t)code << 23);
}

// 2^floor(log2|x|), clipped to [2^-127, 2^127].
LLMC_HD inline uint8_t e8m0_encode_floor(float x) {
    const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0xFFu;
    const uint32_t ef = a >> 23; // 0 for zero and subnormals (< 2^-126): all clip to code 0
    return (uint8_t)(ef > 254u ? 254u : ef);
}

// 2^ceil(log2|x|), clipped to [2^-127, 2^127].
LLMC_HD inline uint8_t e8m0_encode_ceil(float x) {
    const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0xFFu;
    uint32_t c;
    if ((a >> 23) == 0u) c = a > 0x00400000u ? 1u : 0u; // subnormal: (2^-127, 2^-126) -> 2^-126
    else c = (a >> 23) + ((a & 0x7FFFFFu) != 0u ? 1u : 0u);
    return (uint8_t)(c > 254u ? 254u : c);
}

// The power of two nearest |x|, ties (1.5 * 2^k) up; clipped to [2^-127, 2^127].
LLMC_HD inline uint8_t e8m0_encode_nearest(float x) {
    const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0xFFu;
    uint32_t c;
    if ((a >> 23) == 0u) c = a >= 0x00600000u ? 1u : 0u; // 1.5 * 2^-127 and up -> 2^-126
    else c = (a >> 23) + ((a & 0x7FFFFFu) >= 0x400000u ? 1u : 0u);
    return (uint8_t)(c > 254u ? 254u : c);
}

// ---------------------------------------------------------------------------------------------
// Q1.15 and Q1.31 fixed point (SF16): clamp to +-Q115_OVERFLOW_THRESHOLD, scale, round to
// nearest with ties to even, scale back.

constexpr float Q115_OVERFLOW_THRESHOLD = 0.999f;

// Round to the nearest integer, ties to even. |y| must be below 2^31.
LLMC_HD inline int32_t round_to_int_even(float y) {
#ifdef __CUDA_ARCH__
    return __float2int_rn(y);
#else
    return (int32_t)std::nearbyint(y); // default rounding mode: to nearest, ties to even
#endif
}

LLMC_HD inline bool is_nan_bits(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
LLMC_HD inline bool is_finite_bits(float x) { return (float_bits(x) & 0x7FFFFFFFu) < 0x7F800000u; }
// |x| by clearing the sign bit (no libm call; NaN stays NaN)
LLMC_HD inline float abs_bits(float x) { return bits_float(float_bits(x) & 0x7FFFFFFFu); }

LLMC_HD inline float q_clamp(float x) {
    const float t = Q115_OVERFLOW_THRESHOLD;
    return x > t ? t : (x < -t ? -t : x);
}

LLMC_HD inline int16_t q115_encode(float x) {
    if (is_nan_bits(x)) return 0;
    return (int16_t)round_to_int_even(q_clamp(x) * 32768.0f);
}
LLMC_HD inline float q115_decode(int16_t k) { return (float)k * (1.0f / 32768.0f); }
// The simulate functions compute decode(encode(x)) without leaving FP32 and without a branch: the
// flash attention applies them to every score and probability (several times per score), in loops
// the compiler can only interleave when they are straight-line code (an early return for NaN made
// every element a branch with its own reconvergence point: about 25 instructions and no overlap
// between elements). A float -> int -> float round trip would also run on the conversion units, a
// quarter of the FP32 rate.
//
// Rounding by one addition: floats in [2^k, 2^(k+1)) are spaced 2^(k-23). For a value v with
// v + M inside one such binade, v + M is computed exactly and rounded once, to the nearest multiple
// of 2^(k-23) with ties to even (M a multiple of 2^(k-22), so the even multiples of the spacing are
// those whose last mantissa bit is 0), and (v + M) - M is then exact: v rounded to a multiple of
// 2^(k-23), ties to even, which is rint(v * 2^(23-k)) * 2^(k-23) bit for bit.
//   Q1.15: c = x clamped to [-0.999, 0.999]; c + 384 lies in (383, 385), inside [256, 512) where the
//          spacing is 2^-15. A negative c that rounds to zero gives 384 - 384 = +0, the codec's +0
//          (an integer code has no -0), so the sign needs no handling.
//   Q1.31: only below 2^-8 (above, every float is a multiple of 2^-31 already), on the magnitude:
//          a + 2^-8 lies in [2^-8, 2^-7), spacing 2^-31; the sign is put back after, and a final
//          + 0 turns the -0 of a negative that rounds to 0 (and of -0 itself) into +0.
// A NaN: simulate_q115 clamps with NaN-propagating min/max (FMNMX.NAN on the device), so it stays a
// NaN (0x7FFFFFFF) without a select; simulate_q131 selects the input through at the end. Device code
// uses the _rn intrinsics so that nothing is contracted or reordered (also under --use_fast_math,
// whose flush-to-zero gives the same result here: a subnormal rounds to 0 either way). Both are
// checked against decode(encode(x)) on the CPU for every BF16 value, a stride through all floats and
// the neighbourhood of every tie (dev/test/test_number_formats.cpp).
LLMC_HD inline float add_then_subtract(float v, float big) {   // (v + big) - big, each rounded once
#ifdef __CUDA_ARCH__
    return __fsub_rn(__fadd_rn(v, big), big);
#else
    volatile float sum = v + big; // (volatile: no excess precision or reassociation on the host)
    return sum - big;
#endif
}
// The NaN the Q1.15 simulate functions return for a NaN input: 0x7FFFFFFF, the one NVIDIA's
// NaN-propagating min/max (and every FP32 operation on a NaN) produce, also on the host, so that the
// host and the device give the same bits (the payload of the input is not kept).
constexpr uint32_t Q115_NAN_BITS = 0x7FFFFFFFu;
// x clamped to [-0.999, 0.999] by min and max (a NaN becomes a number: callers select it through)
LLMC_HD inline float q_clamp_minmax(float x) {
    const float t = Q115_OVERFLOW_THRESHOLD;
#ifdef __CUDA_ARCH__
    return fminf(fmaxf(x, -t), t);
#else
    return std::fmin(std::fmax(x, -t), t);
#endif
}
// the NaN test of simulate_q131: one unordered comparison on the device, the bits on the host
LLMC_HD inline bool is_nan_value(float x) {
#ifdef __CUDA_ARCH__
    return isnan(x);
#else
    return is_nan_bits(x);
#endif
}
// x clamped to [-0.999, 0.999], a NaN to Q115_NAN_BITS: on the device one NaN-propagating max and
// one min (FMNMX.NAN), so that the NaN needs no comparison and select of its own (the NaN stays a
// NaN through the additions of add_then_subtract)
LLMC_HD inline float q_clamp_keep_nan(float x) {
#ifdef __CUDA_ARCH__
    const float t = Q115_OVERFLOW_THRESHOLD;
    float y, r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(-t));
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(y), "f"(t));
    return r;
#else
    return is_nan_bits(x) ? bits_float(Q115_NAN_BITS) : q_clamp_minmax(x);
#endif
}
// only the upper clamp, for x >= -0.999 (or NaN): the lower one cannot act there
LLMC_HD inline float q_clamp_above_keep_nan(float x) {
    const float t = Q115_OVERFLOW_THRESHOLD;
#ifdef __CUDA_ARCH__
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(t));
    return r;
#else
    return is_nan_bits(x) ? bits_float(Q115_NAN_BITS) : std::fmin(x, t);
#endif
}
// 4 instructions on the device: max, min, add, subtract
LLMC_HD inline float simulate_q115(float x) {
    return add_then_subtract(q_clamp_keep_nan(x), 384.0f);   // |c * 2^15| <= 32735.2
}
// simulate_q115 of a probability, or of any x >= -0.999 (and NaN): the same bits as simulate_q115
// there, in 3 instructions (the softmax output, one per attention score and pass; checked on the
// CPU against simulate_q115 for every BF16 value and a stride through all floats >= -0.999)
LLMC_HD inline float simulate_q115_of_probability(float x) {
    return add_then_subtract(q_clamp_above_keep_nan(x), 384.0f);
}

LLMC_HD inline int32_t q131_encode(float x) {
    if (is_nan_bits(x)) return 0;
    return round_to_int_even(q_clamp(x) * 2147483648.0f);
}
LLMC_HD inline float q131_decode(int32_t k) { return (float)k * (1.0f / 2147483648.0f); }
// (|c| >= 2^-8: a float there is a multiple of 2^-31 already; below, it rounds to one)
LLMC_HD inline float simulate_q131(float x) {
    const float c = abs_bits(q_clamp_minmax(x));
    const float r = c < 0.00390625f ? add_then_subtract(c, 0.00390625f) : c;
    const float signed_r = bits_float(float_bits(r) | (float_bits(x) & 0x80000000u));
#ifdef __CUDA_ARCH__
    const float q = __fadd_rn(signed_r, 0.0f);
#else
    const float q = signed_r + 0.0f;
#endif
    return is_nan_value(x) ? x : q;
}

// simulate_q115(simulate_q131(x)): a GEMM output through the FP32 register, then the SF16 store.
// For a BF16 value (every GEMM output here is stored in BF16 first) it equals simulate_q115(x)
// bit for bit: simulate_q131 is the identity from |x| >= 2^-24 up (a BF16 value there is a multiple
// of 2^-31) and below that both roads give +0 (checked for every BF16 value in
// dev/test/test_number_formats.cpp). The recipe's hooks rely on that and apply simulate_q115 alone
// (llmc/recipes/q115/recipe.h); this function is the general composition, for other floats.
LLMC_HD inline float simulate_q115_of_q131(float x) { return simulate_q115(simulate_q131(x)); }

} // namespace llmc
