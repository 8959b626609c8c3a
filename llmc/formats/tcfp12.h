// formats/tcfp12.h: the TCFP-12 weight format: every weight matrix W is split into two
// FP8 E4M3 tensors,
//     W  ~=  deq(W_hi) + deq(W_lo),     deq(X) = E4M3 value of X's code * X's power-of-two scale,
// so that two FP8 tensor-core GEMMs (A*W_hi + A*W_lo) see about 8 significant bits of W instead of
// E4M3's 4. This file is the format and its CPU reference; the GPU split kernel calls the same
// __host__ __device__ functions, so the two agree bit for bit (see "Bit-exactness" below).
//
// Header-only, no CUDA headers needed (plain g++ -std=c++17 compiles it). It builds on the exact
// codecs of formats/number_formats.h (E4M3 encode/decode with nearest-even or stochastic rounding, E8M0).
//
// ==================================================================================================
// The split of one scale group (the whole tensor, or one block of B = 32/64/128 values of a row)
// ==================================================================================================
//   W_eff = W + EF                   (EF: the error-feedback buffer; 0 without error feedback)
//   s_hi  = 2^ceil(log2(amax / 448)) amax = max |W_eff| over the group (PDDS: an EMA, see below)
//   W_hi  = E4M3_rne(W_eff / s_hi)   saturating (|x| > 448 -> 448; only PDDS can get there)
//   R     = W_eff - deq(W_hi)        the residual (exact in float32: see "Exactness")
//   s_lo  = 2^ceil(log2(max|R| / 448))      (PDDS: predicted from s_hi, see below)
//   W_lo  = E4M3(R / s_lo)           nearest-even, or stochastic with SRR; saturating
//   EF'   = R - deq(W_lo) = W_eff - deq(W_hi) - deq(W_lo)      (the next step's EF buffer)
// s = 2^ceil(log2(amax/448)) is the smallest power of two with amax <= 448 s, so the largest value
// of the group lands in (224, 448] after scaling: the top binade of E4M3 is used and nothing clips.
//
// Scales are stored as E8M0 codes (one byte, 2^(code - 127)). Codes are kept in [1, 253]: scale and
// inverse scale are then both normal float32 powers of two (a float32 subnormal scale would be
// flushed to zero by --use_fast_math device code). An all-zero group gets code 1 (2^-126) for W_hi.
//
// Zero-residual sentinel: when every W_lo code of a group is +-0 (the group is exactly representable
// by W_hi alone, e.g. all-zero), its W_lo scale code is 0xFF (kTcfp12ZeroResidual) and the dual
// GEMM may skip the group's W_lo entirely. 0xFF is E8M0's NaN code, the one code that is never a
// scale; tcfp12_scale() maps it to 0.0f, so deq(W_lo) = 0 for such a group whatever its codes.
// (The seed stores int8 exponents with -128 as the sentinel; in E8M0 terms that is 0xFF here.)
//
// Options (the specification's; tcfp12_validate() enforces its exclusions):
//   * EF   (default): the FP32 buffer EF' above is kept per weight and added before the next split.
//          Then sum_t deq_t = T*W + EF_0 - EF_T for a fixed W, so the time-averaged effective
//          weight converges to W at rate |EF|/T (first-order sigma-delta). Note: EF' is computed
//          from W_eff = W + EF, the weight that was actually split, so that the
//          identity deq(W_hi) + deq(W_lo) + EF' = W_eff holds exactly.
//   * SRR: W_lo is rounded stochastically (E[deq(W_lo)] = R exactly, so each split is unbiased)
//          and there is no EF buffer. Random bits per element: tcfp12_srr_bits(seed, flat index).
//   * PDDS (predictive dual-track delayed scaling), per scale group, with a float state `ema`:
//          ema' = amax                                  if ema has no history (ema <= 0 or NaN)
//          ema' = 0.999 * ema + (1 - 0.999) * amax      otherwise (amax = this split's max |W_eff|)
//          s_hi = 2^ceil(log2(ema' / 448))              (W_hi may saturate when amax > ema')
//          s_lo = s_hi * 2^(b - 12), b = floor(log2(min(ema' / s_hi, 448))) (>= -6)
//          i.e. s_lo is the fresh scale of the largest residual that nearest-even rounding can leave
//          on values <= ema': half an E4M3 ulp of binade b, 2^(b-4) s_hi. No residual amax needed.
//          Whatever saturates (W_hi above 448 s_hi, W_lo above 448 s_lo) goes into EF', which is
//          why PDDS needs error feedback and excludes SRR (the seed: "error feedback
//          self-correction, no extra headroom factor needed").
//   * ABD: drops W_lo from the dgrad GEMM. It does not change the split (kept here so that the
//          options are validated in one place).
//
// Layout (tcfp12_split_matrix): W is (rows x cols) row-major, as the trainer stores a weight
// (OC x C: a row is an output channel, cols the GEMM's K dimension in the forward pass y = x W^T).
// W_hi and W_lo codes: the same (rows x cols) row-major layout. Per-tensor mode: one scale group,
// scale arrays of length 1. Per-block mode (B = 32, 64, 128; cols % B == 0): group (r, j) is
// W[r][j*B .. j*B + B - 1], B consecutive values of row r; the scale arrays are (rows x cols/B)
// row-major, group (r, j) at index r * (cols/B) + j. The PDDS state has one float per group, in
// the same layout; the EF buffer is (rows x cols) like W.
//
// Exactness: scales are powers of two, so W_eff * (1/s) and code * s are exact float products
// (barring float32 subnormals). R = W_eff - deq(W_hi) and EF' = R - deq(W_lo) are exact too: each
// subtracts from x its E4M3 rounding q, and q = 0 or x/2 <= q <= 2x (Sterbenz's lemma) holds for
// every nearest-even rounding that does not clip. Hence deq(W_hi) + deq(W_lo) + EF' == W_eff
// exactly, and the only rounding of the split besides the two E4M3 casts is W + EF -> W_eff.
// (Clipping, i.e. PDDS with |W_eff| far above 448 s_hi, or a stochastic round-up from far below the
// smallest subnormal can make the subtraction round; it then rounds as float32 always does.)
//
// Bit-exactness with device code built with --use_fast_math: every product above is exact, so
// FMA contraction cannot change a result; the PDDS EMA is written with an explicit fused
// multiply-add and an explicitly rounded product; nothing divides. The one difference left is
// flush-to-zero of float32 subnormals (magnitudes below 2^-126, in the scaled values, products or
// residuals), which real weights never reach.
#pragma once
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include "number_formats.h"

namespace llmc {

constexpr float kTcfp12Max = kFP8E4M3Max;        // 448: both halves are E4M3
constexpr uint8_t kTcfp12ZeroResidual = 0xFFu;   // W_lo scale code of a group whose W_lo is all zero
constexpr int kTcfp12ScaleCodeMin = 1;           // 2^-126: smallest scale (normal float32)
constexpr int kTcfp12ScaleCodeMax = 253;         // 2^126: 1/scale stays a normal float32
constexpr float kTcfp12PddsDecay = 0.999f;       // PDDS EMA decay (~693-step half-life)
constexpr float kTcfp12PddsGain = 1.0f - 0.999f; // exact in float32 (Sterbenz), so decay + gain == 1


// Running max of |x| that ignores NaN (a NaN compares false), like CUDA's fmaxf. A NaN weight
// therefore does not poison its group's scale: it becomes a NaN code itself (E4M3 0x7F), which
// the GEMM turns into a NaN output and the trainer's loss check catches.
LLMC_HD inline float tcfp12_amax_update(float m, float x) {
    const float a = abs_bits(x);
    return a > m ? a : m;
}

// ---------------------------------------------------------------------------------------------
// Scales

// E8M0 code of s = 2^ceil(log2(amax / 448)), the smallest power of two with amax <= 448 * s,
// clamped to [kTcfp12ScaleCodeMin, kTcfp12ScaleCodeMax]. Exact, without a division: write
// amax = m * 2^e (m in [1, 2), e8m0_encode_floor gives 2^e). Since 448 = 1.75 * 2^8,
// amax <= 448 * 2^k  <=>  m * 2^e <= 1.75 * 2^(k+8)  <=>  k >= e - 8 if m <= 1.75, else k >= e - 7.
// amax = 0 (and float32 subnormals) give the smallest code; +inf (and NaN) the largest.
LLMC_HD inline uint8_t tcfp12_scale_code(float amax) {
    if (!(abs_bits(amax) <= 3.4028235e38f)) return (uint8_t)kTcfp12ScaleCodeMax;
    const int floor_code = (int)e8m0_encode_floor(amax); // e + 127; 0 below 2^-126
    int code = floor_code - 8;
    if (floor_code >= 1 && floor_code <= 254 && amax > 1.75f * e8m0_decode((uint8_t)floor_code)) code += 1;
    if (code < kTcfp12ScaleCodeMin) code = kTcfp12ScaleCodeMin;
    if (code > kTcfp12ScaleCodeMax) code = kTcfp12ScaleCodeMax;
    return (uint8_t)code;
}

// The value of a scale code: 2^(code - 127), and 0 for the zero-residual sentinel.
LLMC_HD inline float tcfp12_scale(uint8_t code) {
    return code == kTcfp12ZeroResidual ? 0.0f : e8m0_decode(code);
}

// 1 / scale, an exact power of two (code in [kTcfp12ScaleCodeMin, kTcfp12ScaleCodeMax]).
LLMC_HD inline float tcfp12_inv_scale(uint8_t code) { return pow2_normal(127 - (int)code); }

// ---------------------------------------------------------------------------------------------
// PDDS (predictive dual-track delayed scaling)

// One EMA step of a group's W_hi amax. No history (ema <= 0 or NaN): start at this split's amax.
LLMC_HD inline float tcfp12_pdds_ema_update(float ema, float amax) {
    if (!(ema > 0.0f)) return amax;
    return rn_fma(kTcfp12PddsDecay, ema, rn_mul(kTcfp12PddsGain, amax));
}

// The W_lo scale code that PDDS predicts from the W_hi scale code and the EMA amax it came from.
// Values v <= ema land at |v| / s_hi <= t = min(ema / s_hi, 448), in E4M3 binade b = floor(log2 t)
// or below (b >= -6: the subnormals share binade -6's quantum 2^-9). Nearest-even rounding leaves
// at most half an ulp there, 2^(b-3) / 2 = 2^(b-4) (times s_hi), and the fresh scale of a residual
// amax 2^(b-4) s_hi is 2^(b-4-8) s_hi (2^j <= 1.75 * 2^(k+8) <=> k >= j - 8). So:
//     lo_code = hi_code + b - 12, clamped.
// With ema = ema' of this split and amax <= ema', W_lo never saturates; b = 8 (t >= 256) gives
// s_hi / 16, b = 7 (t in (224, 256)) gives s_hi / 32.
LLMC_HD inline uint8_t tcfp12_pdds_lo_code(uint8_t hi_code, float ema) {
    float t = rn_mul(ema, tcfp12_inv_scale(hi_code)); // exact (power-of-two scale)
    if (!(t <= kTcfp12Max)) t = kTcfp12Max;                 // also catches inf
    int b = (int)e8m0_encode_floor(t) - 127;                 // floor(log2 t); t = 0 -> -127
    if (b < -6) b = -6;
    int code = (int)hi_code + b - 12;
    if (code < kTcfp12ScaleCodeMin) code = kTcfp12ScaleCodeMin;
    if (code > kTcfp12ScaleCodeMax) code = kTcfp12ScaleCodeMax;
    return (uint8_t)code;
}

// ---------------------------------------------------------------------------------------------
// Elements: what a fused GPU split kernel composes (with block reductions for the two amaxes).

// Random bits for SRR: a stateless counter-based hash of (seed, flat element index), so a split is
// reproducible and the GPU kernel draws exactly the bits of the CPU reference. The 64-bit key
// seed:index goes through the splitmix64 finalizer (a bijection with full avalanche); the top 32
// bits are returned.
LLMC_HD inline uint32_t tcfp12_srr_bits(uint32_t seed, uint32_t index) {
    uint64_t z = (((uint64_t)seed << 32) | index) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint32_t)(z >> 32);
}

// W_hi code of one element: nearest-even E4M3 of W_eff / s_hi, saturating.
LLMC_HD inline uint8_t tcfp12_encode_hi(float w_eff, uint8_t hi_code) {
    return fp8e4m3_encode(w_eff * tcfp12_inv_scale(hi_code), Overflow::Saturate);
}

// W_lo code of one residual: E4M3 of R / s_lo, saturating; stochastic (from rbits) under SRR.
LLMC_HD inline uint8_t tcfp12_encode_lo(float r, uint8_t lo_code, bool stochastic, uint32_t rbits) {
    return fp8e4m3_encode(r * tcfp12_inv_scale(lo_code), Overflow::Saturate,
                          stochastic ? Rounding::Stochastic : Rounding::NearestEven, rbits);
}

// deq of one code: its E4M3 value times the scale (0 under the zero-residual sentinel).
LLMC_HD inline float tcfp12_decode(uint8_t code, uint8_t scale_code) {
    return fp8e4m3_decode(code) * tcfp12_scale(scale_code);
}

// The effective weight deq(W_hi) + deq(W_lo) of one element. Both products are exact, so the only
// rounding is the final addition (what an FP32-accumulating dual GEMM also does).
LLMC_HD inline float tcfp12_dequant(uint8_t hi, uint8_t hi_code, uint8_t lo, uint8_t lo_code) {
    return tcfp12_decode(hi, hi_code) + tcfp12_decode(lo, lo_code);
}

// Is this E4M3 code +-0?
LLMC_HD inline bool tcfp12_code_is_zero(uint8_t code) { return (code & 0x7Fu) == 0u; }

// ---------------------------------------------------------------------------------------------
// One scale group

struct Tcfp12GroupStats {
    float amax = 0.0f;     // max |W_eff| (NaN ignored): PDDS's EMA input
    float lo_amax = 0.0f;  // max |R| (computed in every mode; PDDS does not need it: telemetry)
    int hi_saturated = 0;  // elements with |W_eff| / s_hi > 448 (clipped; only under PDDS)
    int lo_saturated = 0;  // elements with |R| / s_lo > 448 (clipped; only under PDDS)
    int lo_nonzero = 0;    // W_lo codes that are not +-0 (0: the group got the sentinel)
};

// Split one scale group of n values (a block of 32/64/128, or a whole tensor on the CPU).
//   w        the n weights
//   ef_in    the EF buffer to add first (nullptr: none)
//   ef_out   where EF' goes (nullptr: not kept). May alias ef_in: every pass reads element i
//            before the last pass writes it.
//   srr      round W_lo stochastically with tcfp12_srr_bits(srr_seed, srr_index0 + i)
//            (srr_index0 = the flat index of w[0] in its matrix, so that the bits do not depend on
//            how the matrix is cut into groups)
//   pdds_ema nullptr: fresh scales from this group's amaxes. Else the group's PDDS state, updated
//            in place (see tcfp12_pdds_ema_update / tcfp12_pdds_lo_code).
//   hi, lo   n E4M3 codes each; hi_scale, lo_scale: the group's two E8M0 codes (lo_scale may be
//            the zero-residual sentinel)
// This function implements the mechanics of every option; which combinations are allowed is
// tcfp12_validate's business (tcfp12_split_matrix enforces it).
LLMC_HD inline Tcfp12GroupStats tcfp12_split_group(const float* w, const float* ef_in, int64_t n,
                                                   bool srr, uint32_t srr_seed, uint32_t srr_index0,
                                                   float* pdds_ema, uint8_t* hi, uint8_t* lo,
                                                   uint8_t* hi_scale, uint8_t* lo_scale,
                                                   float* ef_out) {
    Tcfp12GroupStats st;
    // pass 1: amax of W_eff = W + EF
    for (int64_t i = 0; i < n; i++) {
        const float we = ef_in ? w[i] + ef_in[i] : w[i];
        st.amax = tcfp12_amax_update(st.amax, we);
    }
    // the W_hi scale: fresh, or from the PDDS EMA (which then also predicts the W_lo scale)
    uint8_t hi_code, lo_code = 0;
    if (pdds_ema) {
        const float ema = tcfp12_pdds_ema_update(*pdds_ema, st.amax);
        *pdds_ema = ema;
        hi_code = tcfp12_scale_code(ema);
        lo_code = tcfp12_pdds_lo_code(hi_code, ema);
    } else {
        hi_code = tcfp12_scale_code(st.amax);
    }
    const float inv_hi = tcfp12_inv_scale(hi_code);
    // pass 2: W_hi codes and the residual's amax (the fresh W_lo scale needs it before any W_lo code)
    for (int64_t i = 0; i < n; i++) {
        const float we = ef_in ? w[i] + ef_in[i] : w[i];
        const uint8_t c = tcfp12_encode_hi(we, hi_code);
        hi[i] = c;
        if (!(abs_bits(we * inv_hi) <= kTcfp12Max) && we == we) st.hi_saturated++;
        st.lo_amax = tcfp12_amax_update(st.lo_amax, we - tcfp12_decode(c, hi_code));
    }
    if (!pdds_ema) lo_code = tcfp12_scale_code(st.lo_amax);
    const float inv_lo = tcfp12_inv_scale(lo_code);
    // pass 3: W_lo codes and EF' = R - deq(W_lo)
    for (int64_t i = 0; i < n; i++) {
        const float we = ef_in ? w[i] + ef_in[i] : w[i];
        const float r = we - tcfp12_decode(hi[i], hi_code);
        const uint32_t bits = srr ? tcfp12_srr_bits(srr_seed, srr_index0 + (uint32_t)i) : 0u;
        const uint8_t c = tcfp12_encode_lo(r, lo_code, srr, bits);
        lo[i] = c;
        if (!(abs_bits(r * inv_lo) <= kTcfp12Max) && r == r) st.lo_saturated++;
        if (!tcfp12_code_is_zero(c)) st.lo_nonzero++;
        if (ef_out) ef_out[i] = r - tcfp12_decode(c, lo_code);
    }
    // all of W_lo is zero: the sentinel (deq(W_lo) = 0 either way, so EF' above is unchanged)
    *hi_scale = hi_code;
    *lo_scale = st.lo_nonzero == 0 ? kTcfp12ZeroResidual : lo_code;
    return st;
}

// deq(W_hi) + deq(W_lo) of one group of n elements.
LLMC_HD inline void tcfp12_dequantize_group(const uint8_t* hi, const uint8_t* lo, int64_t n,
                                            uint8_t hi_scale, uint8_t lo_scale, float* out) {
    for (int64_t i = 0; i < n; i++) out[i] = tcfp12_dequant(hi[i], hi_scale, lo[i], lo_scale);
}

// ---------------------------------------------------------------------------------------------
// Options (host only)

// The command-line flags of the options, for messages (the CLI defines the flags themselves).
constexpr const char* kTcfp12FlagBlock = "-tb";  // 0 (per tensor), 32, 64, 128
constexpr const char* kTcfp12FlagEF = "-tef";    // 0 / 1; unset: on unless SRR
constexpr const char* kTcfp12FlagSRR = "-tsrr";  // 0 / 1
constexpr const char* kTcfp12FlagPDDS = "-tpdds"; // 0 / 1
constexpr const char* kTcfp12FlagABD = "-tabd";  // 0 / 1

struct Tcfp12Options {
    int block_size = 0;      // 0: one scale pair per tensor; 32/64/128: per block of a row
    int error_feedback = -1; // -1: not given (on, unless SRR replaces it); 0: off; 1: on
    int srr = 0;             // stochastic rounding of W_lo instead of the EF buffer
    int pdds = 0;            // EMA W_hi amax, predicted W_lo scale
    int abd = 0;             // dgrad with W_hi alone (does not change the split)
};

// Whether the split keeps an EF buffer under these (valid) options.
inline bool tcfp12_uses_ef(const Tcfp12Options& o) {
    return o.error_feedback == 1 || (o.error_feedback == -1 && !o.srr);
}

// "" if the options are valid, else one line naming the flags at fault and what to do.
inline std::string tcfp12_validate(const Tcfp12Options& o) {
    const std::string blk = kTcfp12FlagBlock, ef = kTcfp12FlagEF, srr = kTcfp12FlagSRR,
                      pdds = kTcfp12FlagPDDS, abd = kTcfp12FlagABD;
    if (o.block_size != 0 && o.block_size != 32 && o.block_size != 64 && o.block_size != 128)
        return blk + " " + std::to_string(o.block_size) +
               ": the TCFP-12 block size must be 0 (one scale per tensor), 32, 64 or 128";
    if (o.error_feedback < -1 || o.error_feedback > 1)
        return ef + " " + std::to_string(o.error_feedback) + ": error feedback must be 0 or 1";
    if (o.srr != 0 && o.srr != 1) return srr + " " + std::to_string(o.srr) + ": must be 0 or 1";
    if (o.pdds != 0 && o.pdds != 1) return pdds + " " + std::to_string(o.pdds) + ": must be 0 or 1";
    if (o.abd != 0 && o.abd != 1) return abd + " " + std::to_string(o.abd) + ": must be 0 or 1";
    if (o.srr && o.pdds)
        return srr + " 1 (SRR) and " + pdds + " 1 (PDDS) are mutually exclusive: PDDS lets W_hi and W_lo "
               "saturate and relies on the error-feedback buffer to carry what was clipped, and SRR "
               "has no such buffer; drop one of them";
    if (o.srr && o.error_feedback == 1)
        return srr + " 1 (SRR) replaces the error-feedback buffer, so it cannot be combined with " + ef +
               " 1; leave " + ef + " unset (or 0) with " + srr + " 1";
    if (o.pdds && o.error_feedback == 0)
        return pdds + " 1 (PDDS) needs error feedback to correct what its delayed scales clip, but " + ef +
               " 0 turns it off; leave " + ef + " unset (or 1) with " + pdds + " 1";
    return "";
}

// A short description for logs, e.g. "TCFP-12 block 128, EF, PDDS".
inline std::string tcfp12_describe(const Tcfp12Options& o) {
    std::string s = o.block_size ? "TCFP-12 block " + std::to_string(o.block_size) : "TCFP-12 per tensor";
    if (tcfp12_uses_ef(o)) s += ", EF";
    if (o.srr) s += ", SRR";
    if (o.pdds) s += ", PDDS";
    if (o.abd) s += ", ABD";
    return s;
}

// ---------------------------------------------------------------------------------------------
// CPU reference for a whole matrix (host only): the tests' and the GPU tests' ground truth.

struct Tcfp12Matrix {
    int rows = 0, cols = 0, block_size = 0; // block_size 0: per tensor
    std::vector<uint8_t> hi, lo;             // rows * cols E4M3 codes, row-major like W
    std::vector<uint8_t> hi_scale, lo_scale; // one E8M0 code per group (see the layout at the top)
    // totals over the groups (telemetry)
    int64_t hi_saturated = 0, lo_saturated = 0;
    int64_t lo_nonzero = 0;       // W_lo codes that are not +-0
    int64_t zero_residual_groups = 0; // groups with the sentinel
    float amax = 0.0f;            // max |W_eff| over the matrix
};

// Number of scale groups of a (rows x cols) matrix: 1 per tensor, rows * cols / B per block.
inline int64_t tcfp12_num_groups(int rows, int cols, int block_size) {
    return block_size == 0 ? 1 : (int64_t)rows * (cols / block_size);
}

// Split W (rows x cols, row-major) under the options. ef: the EF buffer (rows * cols floats,
// updated in place), required iff tcfp12_uses_ef(opt), else must be nullptr. pdds_ema: one float
// per group (0 = no history), updated in place, required iff opt.pdds. srr_seed: the SRR bits'
// seed (ignored without SRR). Throws std::invalid_argument on invalid options, shapes or buffers.
inline Tcfp12Matrix tcfp12_split_matrix(const float* w, int rows, int cols, const Tcfp12Options& opt,
                                        float* ef, float* pdds_ema, uint32_t srr_seed = 0) {
    const std::string err = tcfp12_validate(opt);
    if (!err.empty()) throw std::invalid_argument(err);
    if (rows < 1 || cols < 1)
        throw std::invalid_argument("tcfp12_split_matrix: empty matrix (" + std::to_string(rows) + " x " +
                                    std::to_string(cols) + ")");
    if (opt.block_size != 0 && cols % opt.block_size != 0)
        throw std::invalid_argument("tcfp12_split_matrix: " + std::to_string(cols) +
                                    " columns are not a multiple of the block size " +
                                    std::to_string(opt.block_size));
    if (tcfp12_uses_ef(opt) != (ef != nullptr))
        throw std::invalid_argument(ef ? "tcfp12_split_matrix: an EF buffer was given but these options keep none"
                                       : "tcfp12_split_matrix: these options need an EF buffer");
    if ((opt.pdds != 0) != (pdds_ema != nullptr))
        throw std::invalid_argument(pdds_ema ? "tcfp12_split_matrix: a PDDS state was given without PDDS"
                                             : "tcfp12_split_matrix: PDDS needs its per-group EMA state");
    Tcfp12Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.block_size = opt.block_size;
    const int64_t total = (int64_t)rows * cols;
    const int64_t groups = tcfp12_num_groups(rows, cols, opt.block_size);
    const int64_t group_len = opt.block_size == 0 ? total : opt.block_size;
    m.hi.resize(total);
    m.lo.resize(total);
    m.hi_scale.resize(groups);
    m.lo_scale.resize(groups);
    for (int64_t g = 0; g < groups; g++) {
        // groups tile the row-major matrix in order: group g starts at flat index g * group_len
        const int64_t off = g * group_len;
        const Tcfp12GroupStats st = tcfp12_split_group(
            w + off, ef ? ef + off : nullptr, group_len, opt.srr != 0, srr_seed, (uint32_t)off,
            pdds_ema ? pdds_ema + g : nullptr, m.hi.data() + off, m.lo.data() + off, &m.hi_scale[g],
            &m.lo_scale[g], ef ? ef + off : nullptr);
        m.hi_saturated += st.hi_saturated;
        m.lo_saturated += st.lo_saturated;
        m.lo_nonzero += st.lo_nonzero;
        m.zero_residual_groups += m.lo_scale[g] == kTcfp12ZeroResidual ? 1 : 0;
        m.amax = tcfp12_amax_update(m.amax, st.amax);
    }
    return m;
}

// deq(W_hi) + deq(W_lo) of a split matrix (rows * cols floats, row-major). hi_only: deq(W_hi)
// alone (what the dgrad GEMM sees under ABD).
inline std::vector<float> tcfp12_dequantize_matrix(const Tcfp12Matrix& m, bool hi_only = false) {
    const int64_t total = (int64_t)m.rows * m.cols;
    const int64_t group_len = m.block_size == 0 ? total : m.block_size;
    std::vector<float> out(total);
    for (int64_t i = 0; i < total; i++) {
        const int64_t g = i / group_len;
        out[i] = hi_only ? tcfp12_decode(m.hi[i], m.hi_scale[g])
                         : tcfp12_dequant(m.hi[i], m.hi_scale[g], m.lo[i], m.lo_scale[g]);
    }
    return out;
}

} // namespace llmc
