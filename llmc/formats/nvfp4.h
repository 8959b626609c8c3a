// formats/nvfp4.h: NVFP4 quantization, the reference numerics of the NVFP4 recipe: two-level block scaling, 1x16 and 16x16 blocks, Four Over Six, and the
// 16-point random Hadamard transform.
//
// Everything that works on one element, one 16-value block or one 16x16 tile is LLMC_HD (host and
// device; plain g++ -std=c++17 needs no CUDA header), so a GPU kernel calls the very functions the CPU
// tests check and gets the same bits. The whole-matrix functions at the end are the host-only CPU
// reference (std::vector). The E2M1 and UE4M3 codecs are llmc/formats/number_formats.h's; nothing here
// rounds to E2M1 or E4M3 by itself.
//
// ==================================================================================================
// The format
// ==================================================================================================
// A tensor x is stored as 4-bit E2M1 codes q (values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}), one UE4M3 block
// scale s per block (E4M3 with the sign bit 0: 0, 2^-9 .. 448) and one FP32 global scale g per tensor:
//
//     x  ~=  e2m1(q) * ue4m3(s) * g
//
//   global scale  g = amax / (448 * 6)            amax = max |x| over the tensor
//   block scale   s = ue4m3_encode((block_amax / 6) / g)          (round to nearest even)
//   element       q = fp4e2m1_encode(x * r),  r = 1 / (ue4m3_decode(s) * g)   (nearest even, or stochastic)
//   dequantize    x' = (e2m1(q) * ue4m3(s)) * g
//
// g maps the tensor's largest value to the top of the two-level range: the block holding amax gets
// s = 448 and its largest value y = 6. A block with a smaller amax gets a smaller s, so each block
// uses the whole E2M1 range [-6, 6] (up to the 3-bit mantissa rounding of s).
//
// Arithmetic (bit-exact host vs device): every float operation above is one IEEE binary32 operation
// rounded to nearest even, in exactly the order written: t = (block_amax / 6) / g; d = s * g;
// r = 1 / d; y = x * r; x' = (e2m1 * s) * g, where e2m1 * s is exact (2 and 4 significant bits, within
// range). The element's quotient is x times the block's reciprocal, one multiplication, not x / d: that is
// how Transformer Engine's NVFP4 quantizers form it (one reciprocal per block), and a correctly rounded
// division per element (a subroutine with a slow path on the GPU) cost the emulation about a tenth of its
// quantize kernels' instructions. y can differ from RN(x / d) by one unit in the last place, which moves
// an element across an E2M1 rounding boundary only when x / d lies within that unit of it.
// On the device the helpers rn_mul/add/sub/div (formats/number_formats.h) use the __f*_rn intrinsics, which --use_fast_math
// does not approximate and the compiler never fuses into FMAs; on the host they are plain operators
// (x86-64 SSE, no FP contraction with the default flags; a host build with -mfma needs
// -ffp-contract=off to stay bit-exact). Results agree whenever no float32 subnormal is involved;
// global scales are kept normal (see below), and every quantity that could be subnormal (a subnormal
// input element, a dequantized value below 2^-126) only ever rounds to the same E2M1 code or a
// negligibly different squared error.
//
// ==================================================================================================
// Documented choices (the spec leaves these open; doc/formats.md summarizes them)
// ==================================================================================================
// Global scale (nvfp4_global_scale):
//   * amax = 0 (an all-zero tensor): g = 1. Any positive g works, since every block scale is then 0.
//   * amax NaN or +-inf: g = NaN. Every block scale becomes the NaN code 0x7F and every dequantized
//     value NaN, so a non-finite tensor poisons its GEMM (and the trainer's loss check) instead of
//     being silently clipped.
//   * tiny amax: g is clamped from below to 2^-96 (kNvfp4MinGlobal), i.e. amax < 2688 * 2^-96
//     (about 3.4e-26) behaves as if it were 2688 * 2^-96. Block scales then come out smaller than 448
//     (no saturation, only precision lost to E4M3's bottom range), and g, s * g and every dequantized
//     value stay normal floats, so device code with flush-to-zero computes the same bits.
//   * the sign of amax is ignored (|amax| is used).
// Block amax (nvfp4_amax_merge): max |x| with NaN sticky: a block holding a NaN has amax NaN. The
//   merge is commutative and associative, so a warp reduction in any order gives the same value.
// Block scale (nvfp4_scale_code):
//   * NaN or +-inf block amax, or NaN g: the scale is the NaN code 0x7F; the block's codes are all
//     0x7 (E2M1 has no NaN; formats/number_formats.h encodes NaN as +6) and the block dequantizes to NaN.
//   * t = block_amax / 6 / g rounds to 0 (t <= 2^-10, half of E4M3's smallest subnormal; a tie rounds
//     to the even code 0): the scale code is 0 and every element of the block is encoded as a zero
//     with the element's sign (code 0x0 or 0x8), dequantizing to +-0. Dividing by a zero scale is
//     never done. With the formula's g this happens for blocks whose amax is below amax/458752.
//   * t in E4M3's subnormal range (2^-10 < t < 2^-6): s has 1 to 3 significant bits, so it can be
//     up to 50% below t (elements then saturate at +-6) or above t (elements lose precision).
//   * t > 448: s saturates at 448 (t <= 464 also rounds to 448 by RNE) and elements saturate at +-6.
//     With the formula's g, t <= 448 up to rounding; a larger t means the caller's amax was below
//     the tensor's true amax.
// Elements (nvfp4_encode): E2M1 saturates at +-6 (|y| > 6 gives +-6); a zero keeps its sign (-0 is
//   code 0x8). Stochastic rounding uses the caller's 32 random bits r per element with
//   formats/number_formats.h's rule (round away from zero iff r < floor(2^32 * (|y| - lo) / (hi - lo))), so
//   E[x'] = y * s * g exactly: unbiased up to the rounding of y.
// Four Over Six (nvfp4_four_over_six_*): per block (or 16x16 tile) two candidate scales, the block
//   max mapped to 6 (the plain scale, t6 = block_amax / 6 / g) and to 4 (t4 = block_amax / 4 / g).
//   Each candidate quantizes the block with round-to-nearest-even and its error is
//       E = sum over the block of (x' - x)^2     in float32, in a fixed order (below)
//   The 4 candidate is kept iff E4 < E6 (ties, and equal scale codes, keep the 6 candidate, which is
//   the plain NVFP4 result). The choice is always made with RNE errors, also when the block is then
//   encoded with stochastic rounding: the scale is a deterministic function of the block, so SR stays
//   exactly unbiased given the scale (picking the lower error of two random roundings would not be).
//   The summation order is fixed so a GPU can reproduce it bit for bit:
//     * 1x16 block: the butterfly of a 16-lane xor-shuffle reduction (offsets 8, 4, 2, 1):
//       e[i] + e[i + 8], then + the partner 4 away, 2 away, 1 away (nvfp4_sum16).
//     * 16x16 tile: sum over r <= c in row-major order of p(r, c), with p(r, r) = e[r][r] and
//       p(r, c) = e[r][c] + e[c][r]. Transposing the tile leaves every p, and so the sum, bit-for-bit
//       unchanged (float addition is commutative), so W and W^T make the same choice.
//   With the formula's g, t4 can exceed 448 (blocks with block_amax > 2/3 amax): the 4 candidate's
//   scale saturates at 448 and it is evaluated as it is (it then rarely wins). Errors are computed in
//   the tensor's units, so values above ~1e19 overflow the square to inf (both candidates inf: 6).
// Blocks (layouts, see Nvfp4Matrix): 1x16 blocks run along the columns of a row-major (rows x cols)
//   matrix, i.e. along K of an (M x K) GEMM operand (activations, gradients); 16x16 tiles (weights)
//   share one scale per tile. Columns (and, for tiles, rows) that are not multiples of 16 are padded
//   with zeros: the padding never changes an amax, quantizes to code 0, and the code/scale arrays
//   cover the padded shape.
// Random Hadamard transform: Q = (1/4) H D, H the 16x16 Sylvester-Hadamard matrix
//   H[i][j] = (-1)^popcount(i & j), D = diag(d) with d_i = -1 iff bit i of a 16-bit sign mask is set.
//   The mask is the top 16 bits of one splitmix64 output (nvfp4_mix64(seed)). Q^T Q = I, so rotating
//   both operands of a GEMM along K in 16-chunks leaves the product unchanged up to rounding.
// ==================================================================================================
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "number_formats.h"

namespace llmc {

constexpr int kNvfp4Block = 16;                 // values per block (and the tile edge, the RHT size)
constexpr float kNvfp4ScaleMax = 448.0f;        // largest UE4M3 block scale
constexpr float kNvfp4GlobalDivisor = 2688.0f;  // 448 * 6: g = amax / 2688
constexpr float kNvfp4MinGlobal = 0x1p-96f;     // smallest global scale (see the top of the file)
constexpr uint8_t kNvfp4ScaleNaN = 0x7F;        // the UE4M3 NaN code: a non-finite block
static_assert(kNvfp4GlobalDivisor == kNvfp4ScaleMax * kFP4E2M1Max, "448 * 6");


// ---------------------------------------------------------------------------------------------
// Amax and the global scale

// Merge two partial amaxes (each >= 0, or NaN). NaN is sticky; otherwise the larger one.
LLMC_HD inline float nvfp4_amax_merge(float a, float b) {
    if (is_nan_bits(a)) return a;
    if (is_nan_bits(b)) return b;
    return a > b ? a : b;
}

// The running amax m updated with one element x: max(m, |x|), NaN sticky.
LLMC_HD inline float nvfp4_amax_add(float m, float x) { return nvfp4_amax_merge(m, abs_bits(x)); }

// The per-tensor FP32 global (decode) scale g = amax / 2688, with the documented special cases:
// amax == 0 -> 1, amax NaN/inf -> NaN, g below 2^-96 -> 2^-96.
LLMC_HD inline float nvfp4_global_scale(float amax) {
    const float a = abs_bits(amax);
    if (!is_finite_bits(a)) return bits_float(0x7FC00000u);
    if (a == 0.0f) return 1.0f;
    const float g = rn_div(a, kNvfp4GlobalDivisor);
    return g < kNvfp4MinGlobal ? kNvfp4MinGlobal : g;
}

// ---------------------------------------------------------------------------------------------
// One block scale, one element

// The UE4M3 code of the block scale that maps block_amax to mapped_max (6: plain NVFP4; 4: Four Over
// Six's second candidate): ue4m3_encode((block_amax / mapped_max) / global), round to nearest even,
// saturating at 448. Non-finite block_amax or global -> the NaN code 0x7F. global must be what
// nvfp4_global_scale returns (a positive normal float, or NaN).
LLMC_HD inline uint8_t nvfp4_scale_code(float block_amax, float global, float mapped_max = 6.0f) {
    if (!is_finite_bits(block_amax) || !is_finite_bits(global)) return kNvfp4ScaleNaN;
    const float t = rn_div(rn_div(block_amax, mapped_max), global);
    return ue4m3_encode(t);
}

// The reciprocal of a block's divisor, r = 1 / (s * g), s = ue4m3_decode(scale_code) > 0 (or NaN): the
// block's elements are quantized from x * r (the top of the file). s * g is a normal float (g >= 2^-96,
// s >= 2^-9, s * g <= block_amax / 6 up to the rounding of s), so r is a finite normal float too.
LLMC_HD inline float nvfp4_block_reciprocal(float s, float global) { return rn_div(1.0f, rn_mul(s, global)); }

// The E2M1 code (low nibble) of x in a block with scale code scale_code: fp4e2m1_encode(x * r) with
// r = nvfp4_block_reciprocal(ue4m3_decode(scale_code), g). A zero scale gives a signed zero code (0x0 or
// 0x8); a NaN scale gives 0x7. rbits: the 32 random bits for Rounding::Stochastic (ignored for NearestEven).
LLMC_HD inline uint8_t nvfp4_encode(float x, uint8_t scale_code, float global,
                                    Rounding rounding = Rounding::NearestEven, uint32_t rbits = 0) {
    const float s = ue4m3_decode(scale_code);
    if (s == 0.0f) return (float_bits(x) >> 31) != 0u ? 0x8u : 0x0u;
    const float y = rn_mul(x, nvfp4_block_reciprocal(s, global));
    return fp4e2m1_encode(y, rounding, rbits);
}

// The dequantized value of one element: (e2m1(code) * s) * g. The first product is exact.
LLMC_HD inline float nvfp4_decode(uint8_t code, uint8_t scale_code, float global) {
    return rn_mul(rn_mul(fp4e2m1_decode(code), ue4m3_decode(scale_code)), global);
}

// The squared dequantization error of x quantized with round-to-nearest-even under scale_code:
// (x' - x)^2 in float. Four Over Six's per-element error term.
LLMC_HD inline float nvfp4_sq_error(float x, uint8_t scale_code, float global) {
    const uint8_t q = nvfp4_encode(x, scale_code, global);
    const float d = rn_sub(nvfp4_decode(q, scale_code, global), x);
    return rn_mul(d, d);
}

// Sum of 16 floats in the order of a 16-lane xor-shuffle reduction with offsets 8, 4, 2, 1.
LLMC_HD inline float nvfp4_sum16(const float* e) {
    float s[8];
    for (int i = 0; i < 8; i++) s[i] = rn_add(e[i], e[i + 8]);
    for (int i = 0; i < 4; i++) s[i] = rn_add(s[i], s[i + 4]);
    for (int i = 0; i < 2; i++) s[i] = rn_add(s[i], s[i + 2]);
    return rn_add(s[0], s[1]);
}

// ---------------------------------------------------------------------------------------------
// 1x16 blocks (activations, gradients): 16 consecutive values along K

// max |x[i]| over the block, NaN sticky.
LLMC_HD inline float nvfp4_block16_amax(const float* x) {
    float m = 0.0f;
    for (int i = 0; i < kNvfp4Block; i++) m = nvfp4_amax_add(m, x[i]);
    return m;
}

// Encode a block's 16 values under scale_code: codes[i] = nvfp4_encode(x[i], scale_code, global,
// rounding, rbits[i]) (rbits may be null for round-to-nearest-even), with the reciprocal r formed
// once for the block.
LLMC_HD inline void nvfp4_block16_encode(const float* x, uint8_t scale_code, float global, Rounding rounding,
                                         const uint32_t* rbits, uint8_t* codes) {
    const float s = ue4m3_decode(scale_code);
    if (s == 0.0f) {
        for (int i = 0; i < kNvfp4Block; i++) codes[i] = (float_bits(x[i]) >> 31) != 0u ? 0x8u : 0x0u;
        return;
    }
    const float r = nvfp4_block_reciprocal(s, global);
    for (int i = 0; i < kNvfp4Block; i++)
        codes[i] = fp4e2m1_encode(rn_mul(x[i], r), rbits != nullptr ? rounding : Rounding::NearestEven,
                                  rbits != nullptr ? rbits[i] : 0u);
}

// Sum over the block of the squared errors of the round-to-nearest-even codes (nvfp4_sum16's
// order); the codes are left in codes[16] (Four Over Six reuses the winner's).
LLMC_HD inline float nvfp4_block16_encode_error(const float* x, uint8_t scale_code, float global, uint8_t* codes) {
    nvfp4_block16_encode(x, scale_code, global, Rounding::NearestEven, nullptr, codes);
    float e[kNvfp4Block];
    for (int i = 0; i < kNvfp4Block; i++) {
        const float d = rn_sub(nvfp4_decode(codes[i], scale_code, global), x[i]);
        e[i] = rn_mul(d, d);
    }
    return nvfp4_sum16(e);
}

// Sum over the block of the RNE squared errors under scale_code (nvfp4_sum16's order).
LLMC_HD inline float nvfp4_block16_error(const float* x, uint8_t scale_code, float global) {
    uint8_t codes[kNvfp4Block];
    return nvfp4_block16_encode_error(x, scale_code, global, codes);
}

// Four Over Six's choice of scale code for a block with amax block_amax (see the top of the file).
LLMC_HD inline uint8_t nvfp4_four_over_six_block16(const float* x, float block_amax, float global) {
    const uint8_t c6 = nvfp4_scale_code(block_amax, global, 6.0f);
    const uint8_t c4 = nvfp4_scale_code(block_amax, global, 4.0f);
    if (c4 == c6) return c6;
    const float e6 = nvfp4_block16_error(x, c6, global);
    const float e4 = nvfp4_block16_error(x, c4, global);
    return e4 < e6 ? c4 : c6;
}

// Quantize one block of 16 values: x[16] in, codes[16] (one E2M1 code per byte, low nibble) and the
// block's UE4M3 scale code out. rbits: 16 random words for Rounding::Stochastic, one per element;
// nullptr means round-to-nearest-even whatever `rounding` says. (Four Over Six as in
// nvfp4_four_over_six_block16; with round-to-nearest-even the winner's codes are kept, not redone.)
LLMC_HD inline void nvfp4_quantize_block16(const float* x, float global, Rounding rounding,
                                           const uint32_t* rbits, bool four_over_six,
                                           uint8_t* codes, uint8_t* scale_code) {
    const float amax = nvfp4_block16_amax(x);
    const uint8_t c6 = nvfp4_scale_code(amax, global, 6.0f);
    const uint8_t c4 = four_over_six ? nvfp4_scale_code(amax, global, 4.0f) : c6;
    if (c4 == c6) {
        nvfp4_block16_encode(x, c6, global, rounding, rbits, codes);
        *scale_code = c6;
        return;
    }
    uint8_t codes4[kNvfp4Block];
    const float e6 = nvfp4_block16_encode_error(x, c6, global, codes);
    const float e4 = nvfp4_block16_encode_error(x, c4, global, codes4);
    const uint8_t sc = e4 < e6 ? c4 : c6;
    if (rbits != nullptr) nvfp4_block16_encode(x, sc, global, rounding, rbits, codes);
    else if (sc == c4)
        for (int i = 0; i < kNvfp4Block; i++) codes[i] = codes4[i];
    *scale_code = sc;
}

// Dequantize one block: out[i] = nvfp4_decode(codes[i], scale_code, global).
LLMC_HD inline void nvfp4_dequantize_block16(const uint8_t* codes, uint8_t scale_code, float global,
                                             float* out) {
    for (int i = 0; i < kNvfp4Block; i++) out[i] = nvfp4_decode(codes[i], scale_code, global);
}

// ---------------------------------------------------------------------------------------------
// 16x16 tiles (weights): one scale for 256 values. x points at the tile's top-left element of a
// row-major matrix with leading dimension ldx (elements between rows); codes likewise with ldc.

LLMC_HD inline float nvfp4_tile16x16_amax(const float* x, int ldx) {
    float m = 0.0f;
    for (int r = 0; r < kNvfp4Block; r++)
        for (int c = 0; c < kNvfp4Block; c++) m = nvfp4_amax_add(m, x[(size_t)r * ldx + c]);
    return m;
}

// Sum of the tile's RNE squared errors in the transpose-invariant order (see the top of the file):
// for r = 0..15, c = r..15: += e[r][r] (diagonal) or (e[r][c] + e[c][r]).
LLMC_HD inline float nvfp4_tile16x16_error(const float* x, int ldx, uint8_t scale_code, float global) {
    float sum = 0.0f;
    for (int r = 0; r < kNvfp4Block; r++) {
        for (int c = r; c < kNvfp4Block; c++) {
            float p = nvfp4_sq_error(x[(size_t)r * ldx + c], scale_code, global);
            if (c != r) p = rn_add(p, nvfp4_sq_error(x[(size_t)c * ldx + r], scale_code, global));
            sum = rn_add(sum, p);
        }
    }
    return sum;
}

LLMC_HD inline uint8_t nvfp4_four_over_six_tile16x16(const float* x, int ldx, float tile_amax,
                                                     float global) {
    const uint8_t c6 = nvfp4_scale_code(tile_amax, global, 6.0f);
    const uint8_t c4 = nvfp4_scale_code(tile_amax, global, 4.0f);
    if (c4 == c6) return c6;
    const float e6 = nvfp4_tile16x16_error(x, ldx, c6, global);
    const float e4 = nvfp4_tile16x16_error(x, ldx, c4, global);
    return e4 < e6 ? c4 : c6;
}

// Quantize one 16x16 tile. rbits: 256 random words in row-major tile order (rbits[r * 16 + c]) for
// Rounding::Stochastic, or nullptr for round-to-nearest-even.
LLMC_HD inline void nvfp4_quantize_tile16x16(const float* x, int ldx, float global, Rounding rounding,
                                             const uint32_t* rbits, bool four_over_six,
                                             uint8_t* codes, int ldc, uint8_t* scale_code) {
    const float amax = nvfp4_tile16x16_amax(x, ldx);
    const uint8_t sc = four_over_six ? nvfp4_four_over_six_tile16x16(x, ldx, amax, global)
                                     : nvfp4_scale_code(amax, global, 6.0f);
    const Rounding rnd = rbits != nullptr ? rounding : Rounding::NearestEven;
    for (int r = 0; r < kNvfp4Block; r++)
        for (int c = 0; c < kNvfp4Block; c++)
            codes[(size_t)r * ldc + c] = nvfp4_encode(x[(size_t)r * ldx + c], sc, global, rnd,
                                                      rbits != nullptr ? rbits[r * kNvfp4Block + c] : 0u);
    *scale_code = sc;
}

// ---------------------------------------------------------------------------------------------
// Packing: two E2M1 codes per byte, element 2i in the low nibble and element 2i + 1 in the high one
// (the order of the packed FP4 operands of the FP4 tensor-core GEMMs).

LLMC_HD inline uint8_t nvfp4_pack2(uint8_t even, uint8_t odd) {
    return (uint8_t)((even & 0xFu) | ((odd & 0xFu) << 4));
}
LLMC_HD inline uint8_t nvfp4_unpack_even(uint8_t byte) { return (uint8_t)(byte & 0xFu); }
LLMC_HD inline uint8_t nvfp4_unpack_odd(uint8_t byte) { return (uint8_t)(byte >> 4); }

// ---------------------------------------------------------------------------------------------
// The native operands of block-scaled FP4 GEMMs (cuBLASLt's CUDA_R_4F_E2M1 with VEC16_UE4M3 scales,
// Blackwell's FP4 tensor cores). Both operands are K-major: an operand is a (rows x K) matrix whose
// rows run along the GEMM's reduction dimension K.
//   codes:  rows * K / 2 bytes, row-major, two codes per byte in nvfp4_pack2 order (element k of a
//           row in the low nibble when k is even).
//   scales: the UE4M3 code of each (row, 16-block of K), i.e. a (rows x K/16) scale matrix, in the
//           tiled layout of cuBLAS's "1D block scaling factors": the matrix is padded with zeros to
//           multiples of 128 rows and 4 columns and cut into 128 x 4 tiles of 512 bytes each. The
//           tiles are stored tile-row by tile-row (rows 0..127: the tile of columns 0..3, then of
//           columns 4..7, ...). Inside a tile, rows r, r + 32, r + 64, r + 96 share one 16-byte line:
//           row r (0..127) and column c (0..3) of the tile sit at byte 16 * (r % 32) + 4 * (r / 32) + c.
// The 16x16 weight tiles need nothing special here: a tile's one scale is every 1x16 block's scale of
// its 16 rows, in W and in W^T alike.

LLMC_HD inline int nvfp4_round_up(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// Bytes of the tiled scale array of a (rows x scale_cols) scale matrix (scale_cols = K / 16).
LLMC_HD inline size_t nvfp4_tiled_scale_bytes(int rows, int scale_cols) {
    return (size_t)nvfp4_round_up(rows, 128) * (size_t)nvfp4_round_up(scale_cols, 4);
}

// Byte offset of scale (row, scale_col) in the tiled layout of a matrix with scale_cols columns.
LLMC_HD inline size_t nvfp4_tiled_scale_offset(int row, int scale_col, int scale_cols) {
    const size_t tiles_per_row = (size_t)nvfp4_round_up(scale_cols, 4) / 4;
    const size_t tile = (size_t)(row / 128) * tiles_per_row + (size_t)(scale_col / 4);
    const int r = row % 128;
    return tile * 512 + (size_t)(r % 32) * 16 + (size_t)(r / 32) * 4 + (size_t)(scale_col % 4);
}

// ---------------------------------------------------------------------------------------------
// Random bits: splitmix64 (Steele, Lea, Flood), written here because llmc/rand.h is host-only.

// The first output of splitmix64 started at state z: add the golden-ratio increment, then the
// bijective finalizer. Equals llmc/rand.h's splitmix64_next(&z) for the same z.
LLMC_HD inline uint64_t nvfp4_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Counter-based stochastic-rounding bits: 32 bits for element `index` under `seed`, one half of the
// 64-bit word mix64(mix64(seed) ^ (index / 2)): the top half for an even index, the bottom half for an
// odd one, so that two neighbouring elements share one mix64 (every output bit of splitmix64's
// finalizer depends on every input bit, the bottom half as much as the top). Stateless, so a kernel
// thread computes its elements' bits directly. The key mix64(seed) is the same for every element of a
// tensor: a kernel forms it once (nvfp4_sr_key) and takes a block's 16 words with nvfp4_sr_bits16.
LLMC_HD inline uint64_t nvfp4_sr_key(uint64_t seed) { return nvfp4_mix64(seed); }
LLMC_HD inline uint32_t nvfp4_sr_bits_keyed(uint64_t key, uint64_t index) {
    const uint64_t w = nvfp4_mix64(key ^ (index >> 1));
    return (index & 1u) != 0u ? (uint32_t)w : (uint32_t)(w >> 32);
}
LLMC_HD inline uint32_t nvfp4_sr_bits(uint64_t seed, uint64_t index) {
    return nvfp4_sr_bits_keyed(nvfp4_sr_key(seed), index);
}
// The bits of the 16 elements index0 .. index0 + 15: bits[i] = nvfp4_sr_bits_keyed(key, index0 + i), with
// 8 mix64 where index0 is even (a block's first element: every block starts at a multiple of 16)
LLMC_HD inline void nvfp4_sr_bits16(uint64_t key, uint64_t index0, uint32_t* bits) {
    if ((index0 & 1u) != 0u) {
        for (int i = 0; i < kNvfp4Block; i++) bits[i] = nvfp4_sr_bits_keyed(key, index0 + i);
        return;
    }
    for (int i = 0; i < kNvfp4Block; i += 2) {
        const uint64_t w = nvfp4_mix64(key ^ ((index0 + i) >> 1));
        bits[i] = (uint32_t)(w >> 32);
        bits[i + 1] = (uint32_t)w;
    }
}

// ---------------------------------------------------------------------------------------------
// The emulation's hot path: a 1x16 block's dequantized values, without its codes.
//
// The Hopper emulation writes e2m1(q) * ue4m3(s) per element and never looks at the codes. These
// functions compute those products in the value domain, with fewer instructions than encoding codes
// and decoding them again:
//   * the E2M1 rounding as float arithmetic on |y| (nvfp4_e2m1_nearest_magnitude,
//     nvfp4_e2m1_stochastic_magnitude), the sign put back from x at the end;
//   * Four Over Six's errors from magnitudes: x' has x's sign (or is a zero), so
//     (x' - x)^2 = (|x'| - |x|)^2 bit for bit (round-to-nearest is symmetric under negation);
//   * the stochastic-rounding bits of two elements per splitmix64 word, made as they are used.
// Each result equals nvfp4_quantize_block16's codes decoded as fp4e2m1_decode(q) * ue4m3_decode(s),
// bit for bit, the sign of a zero included. Non-finite blocks and tensors (rare) go through
// nvfp4_quantize_block16 itself. The CPU tests compare these with the code path over dense samples
// of float32 and random blocks; build/test_nvfp4 compares the GPU kernels with the CPU reference.

// |y| rounded to the nearest E2M1 magnitude (ties to even), saturating at 6; a >= 0 and not NaN (inf
// gives 6). The quantum is 0.5 below 2, 1 in [2, 4) and 2 from 4. Adding and then subtracting
// 1.5 * 2^23 * quantum rounds a to a multiple of the quantum, ties to the even multiple, and in every
// interval an even multiple is an even E2M1 code (0, 1, 2, 3, 4 halves are codes 0-4; 2, 3 are 4, 5;
// 4, 6 are 6, 7). Clamping to 8 first keeps the sum exact; 7 and 8 round to 8 and saturate to 6, as
// E2M1 takes everything above 5 to 6.
LLMC_HD inline float nvfp4_e2m1_nearest_magnitude(float a) {
    const float c = a < 8.0f ? a : 8.0f;
    const float magic = c < 2.0f ? 0x1.8p22f : (c < 4.0f ? 0x1.8p23f : 0x1.8p24f);
    const float r = rn_sub(rn_add(c, magic), magic);
    return r < 6.0f ? r : 6.0f;
}

// |y| rounded stochastically to an E2M1 magnitude with fp4e2m1_encode_stochastic's rule (round up iff
// rbits < floor(2^32 f), f the fraction of |y| in quanta), saturating at 6; a >= 0 and not NaN. t = a
// in quanta is an exact power-of-two scaling below 4, v its fixed-point bits as there, and the whole
// quanta n (0 to 4) become a float through the exponent field of 2^23 (exact, no conversion).
LLMC_HD inline float nvfp4_e2m1_stochastic_magnitude(float a, uint32_t rbits) {
    const float c = a < 7.0f ? a : 7.0f;
    const float quantum = c < 2.0f ? 0.5f : (c < 4.0f ? 1.0f : 2.0f);
    const float t = c < 2.0f ? rn_mul(c, 2.0f) : (c < 4.0f ? c : rn_mul(c, 0.5f));
    const bool below_one = t < 1.0f;
    const uint32_t v = (uint32_t)rn_mul(t, below_one ? 4294967296.0f : 1073741824.0f);
    const uint32_t whole = below_one ? 0u : v >> 30, frac = below_one ? v : v << 2;
    const uint32_t n = whole + (rbits < frac ? 1u : 0u);
    const float m = rn_mul(rn_sub(bits_float(0x4B000000u | n), 0x1p23f), quantum);
    return m < 6.0f ? m : 6.0f;
}

// x's sign on a magnitude m >= 0 (+0 included)
LLMC_HD inline float nvfp4_with_sign_of(float x, float m) {
    return bits_float(float_bits(m) | (float_bits(x) & 0x80000000u));
}

// |x| as the GPU's operand modifier takes it (FMUL and FADD read |x| for free; the bit mask of abs_bits
// would be one more instruction per element). The same bits as abs_bits for every non-NaN x.
LLMC_HD inline float nvfp4_abs(float x) {
#ifdef __CUDA_ARCH__
    return fabsf(x);
#else
    return abs_bits(x);
#endif
}

// One candidate scale of a block: its code, value s and the reciprocal r = 1 / (s * g) that quantizes
// the elements, or r = 0 for a zero scale (the elements then round to zeros, as nvfp4_encode's signed
// zero codes).
struct Nvfp4BlockScale {
    uint8_t code;
    float s, r;
};
LLMC_HD inline Nvfp4BlockScale nvfp4_block_scale(uint8_t code, float global) {
    const float s = ue4m3_decode(code);
    return {code, s, s == 0.0f ? 0.0f : nvfp4_block_reciprocal(s, global)};
}

// Four Over Six's error of one candidate (nvfp4_block16_encode_error's sum, nvfp4_sum16's order) from
// the magnitudes: d = (m * s) * g - |x| per element, d^2 summed as e[i] + e[i + 8], then 4, 2, 1 apart.
LLMC_HD inline float nvfp4_block16_magnitude_error(const float* x, Nvfp4BlockScale c, float global) {
    float p[8];
    for (int i = 0; i < 8; i++) {
        float e[2];
        for (int h = 0; h < 2; h++) {
            const float a = nvfp4_abs(x[i + 8 * h]);
            const float m = nvfp4_e2m1_nearest_magnitude(rn_mul(a, c.r));
            const float d = rn_sub(rn_mul(rn_mul(m, c.s), global), a);
            e[h] = rn_mul(d, d);
        }
        p[i] = rn_add(e[0], e[1]);
    }
    for (int i = 0; i < 4; i++) p[i] = rn_add(p[i], p[i + 4]);
    for (int i = 0; i < 2; i++) p[i] = rn_add(p[i], p[i + 2]);
    return rn_add(p[0], p[1]);
}

// The rare blocks of nvfp4_block16_values (a NaN or inf in the block or the tensor) through the code
// path. Not inlined, to keep it out of the kernels' hot code, and its block passed and returned by value:
// a pointer to the caller's array would put that array in local memory on the hot path too (every
// element stored to the stack and loaded back, traffic that ncu showed as the L2 running at 97%).
struct Nvfp4Values16 {
    float v[kNvfp4Block];
};
#if defined(__CUDACC__)
#define LLMC_NVFP4_COLD __noinline__
#else
#define LLMC_NVFP4_COLD __attribute__((noinline))
#endif
LLMC_HD inline LLMC_NVFP4_COLD Nvfp4Values16 nvfp4_block16_values_by_codes(Nvfp4Values16 x, float global, bool stochastic,
                                                                           uint64_t key, uint64_t index0, bool four_over_six,
                                                                           uint8_t* scale_code) {
    uint32_t bits[kNvfp4Block];
    if (stochastic) nvfp4_sr_bits16(key, index0, bits);
    uint8_t codes[kNvfp4Block];
    nvfp4_quantize_block16(x.v, global, stochastic ? Rounding::Stochastic : Rounding::NearestEven,
                           stochastic ? bits : nullptr, four_over_six, codes, scale_code);
    Nvfp4Values16 out;
    for (int i = 0; i < kNvfp4Block; i++) out.v[i] = rn_mul(fp4e2m1_decode(codes[i]), ue4m3_decode(*scale_code));
    return out;
}

// One 1x16 block: out[i] = fp4e2m1_decode(q_i) * ue4m3_decode(s) of nvfp4_quantize_block16(x, global,
// ...) with rbits[i] = nvfp4_sr_bits_keyed(key, index0 + i) for stochastic rounding (key =
// nvfp4_sr_key(seed); unused for round-to-nearest-even). Returns the scale code s. out may be x.
LLMC_HD inline uint8_t nvfp4_block16_values(const float* x, float global, bool stochastic, uint64_t key,
                                            uint64_t index0, bool four_over_six, float* out) {
    uint32_t amax_bits = 0u;
    for (int i = 0; i < kNvfp4Block; i++) {
        const uint32_t b = float_bits(x[i]) & 0x7FFFFFFFu;
        amax_bits = b > amax_bits ? b : amax_bits;
    }
    if (amax_bits >= 0x7F800000u || !is_finite_bits(global) || (stochastic && (index0 & 1u) != 0u)) {
        // NaN or inf in the block or the tensor (and an odd first index, which no kernel makes)
        Nvfp4Values16 in;
        for (int i = 0; i < kNvfp4Block; i++) in.v[i] = x[i];
        uint8_t sc;
        const Nvfp4Values16 q = nvfp4_block16_values_by_codes(in, global, stochastic, key, index0, four_over_six, &sc);
        for (int i = 0; i < kNvfp4Block; i++) out[i] = q.v[i];
        return sc;
    }
    const float amax = bits_float(amax_bits);
    Nvfp4BlockScale c = nvfp4_block_scale(nvfp4_scale_code(amax, global, 6.0f), global);
    if (four_over_six) {
        const uint8_t code4 = nvfp4_scale_code(amax, global, 4.0f);
        if (code4 != c.code) {
            const Nvfp4BlockScale c4 = nvfp4_block_scale(code4, global);
            if (nvfp4_block16_magnitude_error(x, c4, global) < nvfp4_block16_magnitude_error(x, c, global)) c = c4;
        }
    }
    if (stochastic) {
        for (int i = 0; i < kNvfp4Block; i += 2) {
            const uint64_t w = nvfp4_mix64(key ^ ((index0 + (uint64_t)i) >> 1));
            const float m0 = nvfp4_e2m1_stochastic_magnitude(rn_mul(nvfp4_abs(x[i]), c.r), (uint32_t)(w >> 32));
            const float m1 = nvfp4_e2m1_stochastic_magnitude(rn_mul(nvfp4_abs(x[i + 1]), c.r), (uint32_t)w);
            out[i] = nvfp4_with_sign_of(x[i], rn_mul(m0, c.s));
            out[i + 1] = nvfp4_with_sign_of(x[i + 1], rn_mul(m1, c.s));
        }
    } else {
        for (int i = 0; i < kNvfp4Block; i++)
            out[i] = nvfp4_with_sign_of(x[i], rn_mul(nvfp4_e2m1_nearest_magnitude(rn_mul(nvfp4_abs(x[i]), c.r)), c.s));
    }
    return c.code;
}

// ---------------------------------------------------------------------------------------------
// Random Hadamard transform (16 points): y = Q x with Q = (1/4) H D (see the top of the file).

// The 16 signs as a mask: bit i set means d_i = -1. Any mask (also 0: D = I) gives an orthonormal Q.
LLMC_HD inline uint16_t nvfp4_rht_signs(uint64_t seed) { return (uint16_t)(nvfp4_mix64(seed) >> 48); }

// H[i][j] = (-1)^popcount(i & j), the Sylvester construction H_2n = [[H_n, H_n], [H_n, -H_n]].
LLMC_HD inline float nvfp4_hadamard16(int i, int j) {
    int v = i & j, parity = 0;
    for (; v != 0; v >>= 1) parity ^= v & 1;
    return parity != 0 ? -1.0f : 1.0f;
}

// v <- H v (unnormalized) by the fast Walsh-Hadamard butterfly: 4 stages of (a, b) -> (a + b, a - b)
// on pairs h = 1, 2, 4, 8 apart; 64 additions instead of 256 multiply-adds.
LLMC_HD inline void nvfp4_fwht16(float* v) {
    for (int h = 1; h < kNvfp4Block; h <<= 1) {
        for (int i = 0; i < kNvfp4Block; i += 2 * h) {
            for (int j = i; j < i + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = rn_add(a, b);
                v[j + h] = rn_sub(a, b);
            }
        }
    }
}

// d_i * v_i: flips the sign bit, exact.
LLMC_HD inline void nvfp4_apply_signs16(float* v, uint16_t signs) {
    for (int i = 0; i < kNvfp4Block; i++)
        if ((signs >> i) & 1u) v[i] = bits_float(float_bits(v[i]) ^ 0x80000000u);
}

// Forward: v <- (1/4) H (D v). The 1/4 is exact (a power of two) for normal results.
LLMC_HD inline void nvfp4_rht16(float* v, uint16_t signs) {
    nvfp4_apply_signs16(v, signs);
    nvfp4_fwht16(v);
    for (int i = 0; i < kNvfp4Block; i++) v[i] = rn_mul(v[i], 0.25f);
}

// Inverse (= transpose, Q is orthonormal and H symmetric): v <- D ((1/4) H v).
LLMC_HD inline void nvfp4_rht16_inverse(float* v, uint16_t signs) {
    nvfp4_fwht16(v);
    for (int i = 0; i < kNvfp4Block; i++) v[i] = rn_mul(v[i], 0.25f);
    nvfp4_apply_signs16(v, signs);
}

// ==============================================================================================
// CPU reference for whole matrices (host only)
// ==============================================================================================

enum class Nvfp4Layout : uint8_t {
    Rows1x16,   // one scale per 16 consecutive values of a row (activations, gradients; K = cols)
    Tiles16x16, // one scale per 16x16 tile (weights: W and W^T share the quantization)
};

struct Nvfp4Config {
    Nvfp4Layout layout = Nvfp4Layout::Rows1x16;
    Rounding rounding = Rounding::NearestEven; // Stochastic for gradients
    bool four_over_six = false;
    uint64_t sr_seed = 0; // Stochastic: element (r, c) uses nvfp4_sr_bits(sr_seed, r * cols_pad + c)
};

// A quantized (rows x cols) row-major matrix.
//   cols_pad = cols rounded up to 16; rows_pad = rows (Rows1x16) or rows rounded up to 16 (Tiles16x16).
//   codes:  rows_pad * cols_pad bytes, row-major, one E2M1 code per byte in the low nibble (high
//           nibble 0); the padding holds code 0. nvfp4_pack_codes packs them two per byte.
//   scales: scale_rows() * scale_cols() UE4M3 codes, row-major: Rows1x16: scales[r * (cols_pad/16)
//           + c/16] is the scale of element (r, c); Tiles16x16: scales[(r/16) * (cols_pad/16) + c/16].
//   global: the FP32 global scale, from amax (the matrix's amax unless the caller gave one).
struct Nvfp4Matrix {
    Nvfp4Layout layout = Nvfp4Layout::Rows1x16;
    int rows = 0, cols = 0;
    int rows_pad = 0, cols_pad = 0;
    float amax = 0.0f;
    float global = 1.0f;
    std::vector<uint8_t> codes;
    std::vector<uint8_t> scales;

    int scale_rows() const { return layout == Nvfp4Layout::Rows1x16 ? rows_pad : rows_pad / kNvfp4Block; }
    int scale_cols() const { return cols_pad / kNvfp4Block; }
    uint8_t code(int r, int c) const { return codes[(size_t)r * cols_pad + c]; }
    uint8_t scale_of(int r, int c) const {
        const int sr = layout == Nvfp4Layout::Rows1x16 ? r : r / kNvfp4Block;
        return scales[(size_t)sr * scale_cols() + c / kNvfp4Block];
    }
    float value(int r, int c) const { return nvfp4_decode(code(r, c), scale_of(r, c), global); }
};

inline int nvfp4_round_up16(int n) { return (n + kNvfp4Block - 1) / kNvfp4Block * kNvfp4Block; }

// max |x| over a (rows x cols) row-major matrix, NaN sticky.
inline float nvfp4_matrix_amax(const float* x, int rows, int cols) {
    if (rows < 0 || cols < 0) throw std::invalid_argument("nvfp4_matrix_amax: negative shape");
    float m = 0.0f;
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++) m = nvfp4_amax_add(m, x[i]);
    return m;
}

// Quantize with the global scale of a given amax (e.g. one a GPU reduction computed).
inline Nvfp4Matrix nvfp4_quantize_matrix_with_amax(const float* x, int rows, int cols,
                                                   const Nvfp4Config& cfg, float amax) {
    if (rows < 0 || cols < 0) throw std::invalid_argument("nvfp4_quantize_matrix: negative shape");
    Nvfp4Matrix q;
    q.layout = cfg.layout;
    q.rows = rows;
    q.cols = cols;
    q.cols_pad = nvfp4_round_up16(cols);
    q.rows_pad = cfg.layout == Nvfp4Layout::Rows1x16 ? rows : nvfp4_round_up16(rows);
    q.amax = amax;
    q.global = nvfp4_global_scale(amax);
    const size_t n = (size_t)q.rows_pad * q.cols_pad;
    q.codes.assign(n, 0);
    q.scales.assign((size_t)q.scale_rows() * q.scale_cols(), 0);

    // zero-padded copy, so every block is a full 16 (or 16x16)
    std::vector<float> xp(n, 0.0f);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) xp[(size_t)r * q.cols_pad + c] = x[(size_t)r * cols + c];

    const bool sr = cfg.rounding == Rounding::Stochastic;
    if (cfg.layout == Nvfp4Layout::Rows1x16) {
        uint32_t bits[kNvfp4Block];
        for (int r = 0; r < q.rows_pad; r++) {
            for (int b = 0; b < q.scale_cols(); b++) {
                const size_t off = (size_t)r * q.cols_pad + (size_t)b * kNvfp4Block;
                if (sr)
                    for (int i = 0; i < kNvfp4Block; i++) bits[i] = nvfp4_sr_bits(cfg.sr_seed, off + i);
                nvfp4_quantize_block16(&xp[off], q.global, cfg.rounding, sr ? bits : nullptr,
                                       cfg.four_over_six, &q.codes[off],
                                       &q.scales[(size_t)r * q.scale_cols() + b]);
            }
        }
    } else {
        std::vector<uint32_t> bits(sr ? kNvfp4Block * kNvfp4Block : 0);
        for (int tr = 0; tr < q.scale_rows(); tr++) {
            for (int tc = 0; tc < q.scale_cols(); tc++) {
                const size_t off = (size_t)tr * kNvfp4Block * q.cols_pad + (size_t)tc * kNvfp4Block;
                if (sr)
                    for (int r = 0; r < kNvfp4Block; r++)
                        for (int c = 0; c < kNvfp4Block; c++)
                            bits[r * kNvfp4Block + c] =
                                nvfp4_sr_bits(cfg.sr_seed, off + (size_t)r * q.cols_pad + c);
                nvfp4_quantize_tile16x16(&xp[off], q.cols_pad, q.global, cfg.rounding,
                                         sr ? bits.data() : nullptr, cfg.four_over_six, &q.codes[off],
                                         q.cols_pad, &q.scales[(size_t)tr * q.scale_cols() + tc]);
            }
        }
    }
    return q;
}

// Quantize a (rows x cols) row-major matrix with the global scale of its own amax.
inline Nvfp4Matrix nvfp4_quantize_matrix(const float* x, int rows, int cols, const Nvfp4Config& cfg) {
    return nvfp4_quantize_matrix_with_amax(x, rows, cols, cfg, nvfp4_matrix_amax(x, rows, cols));
}

// The dequantized (rows x cols) row-major matrix (the padding is dropped).
inline std::vector<float> nvfp4_dequantize_matrix(const Nvfp4Matrix& q) {
    std::vector<float> out((size_t)q.rows * q.cols);
    for (int r = 0; r < q.rows; r++)
        for (int c = 0; c < q.cols; c++) out[(size_t)r * q.cols + c] = q.value(r, c);
    return out;
}

// Two codes per byte (nvfp4_pack2 order); an odd count leaves the last high nibble 0.
inline std::vector<uint8_t> nvfp4_pack_codes(const std::vector<uint8_t>& codes) {
    std::vector<uint8_t> packed((codes.size() + 1) / 2, 0);
    for (size_t i = 0; i < codes.size(); i++)
        packed[i / 2] |= (uint8_t)((codes[i] & 0xFu) << ((i & 1u) ? 4 : 0));
    return packed;
}

inline std::vector<uint8_t> nvfp4_unpack_codes(const std::vector<uint8_t>& packed, size_t count) {
    if (count > 2 * packed.size()) throw std::invalid_argument("nvfp4_unpack_codes: count too large");
    std::vector<uint8_t> codes(count);
    for (size_t i = 0; i < count; i++)
        codes[i] = (i & 1u) ? nvfp4_unpack_odd(packed[i / 2]) : nvfp4_unpack_even(packed[i / 2]);
    return codes;
}

// A quantized matrix as the K-major operand of a native FP4 GEMM (the layout above): the matrix
// itself (K = its columns, rows = its rows) or, for 16x16 weight tiles only, its transpose (W^T: K =
// the rows of W). The padding of the matrix is part of the operand (zero codes and scales).
struct Nvfp4NativeOperand {
    int rows = 0, k = 0;
    std::vector<uint8_t> codes;  // rows * k / 2
    std::vector<uint8_t> scales; // nvfp4_tiled_scale_bytes(rows, k / 16), padding 0
    uint8_t code(int row, int kk) const {
        const uint8_t b = codes[((size_t)row * k + kk) / 2];
        return (kk & 1) ? nvfp4_unpack_odd(b) : nvfp4_unpack_even(b);
    }
    uint8_t scale(int row, int kk) const { return scales[nvfp4_tiled_scale_offset(row, kk / kNvfp4Block, k / kNvfp4Block)]; }
};

inline Nvfp4NativeOperand nvfp4_native_operand(const Nvfp4Matrix& q, bool transpose) {
    if (transpose && q.layout != Nvfp4Layout::Tiles16x16)
        throw std::invalid_argument("nvfp4_native_operand: only 16x16 tiles are blocks along both dimensions");
    Nvfp4NativeOperand op;
    op.rows = transpose ? q.cols_pad : q.rows_pad;
    op.k = transpose ? q.rows_pad : q.cols_pad;
    op.codes.assign((size_t)op.rows * op.k / 2, 0);
    op.scales.assign(nvfp4_tiled_scale_bytes(op.rows, op.k / kNvfp4Block), 0);
    for (int i = 0; i < op.rows; i++) {
        for (int kk = 0; kk < op.k; kk++) {
            const uint8_t c = transpose ? q.code(kk, i) : q.code(i, kk);
            op.codes[((size_t)i * op.k + kk) / 2] |= (uint8_t)((c & 0xFu) << ((kk & 1) ? 4 : 0));
        }
        for (int b = 0; b < op.k / kNvfp4Block; b++)
            op.scales[nvfp4_tiled_scale_offset(i, b, op.k / kNvfp4Block)] =
                transpose ? q.scale_of(b * kNvfp4Block, i) : q.scale_of(i, b * kNvfp4Block);
    }
    return op;
}

// Rotate every row of a (rows x cols) row-major matrix along its columns, chunk by chunk of 16:
// x[r, 16k .. 16k+15] <- Q x[r, 16k .. 16k+15] (or Q^T with inverse). cols must be a multiple of 16
// (pad K with zeros first: both operands padded alike leave the product unchanged).
inline void nvfp4_rht_rows(float* x, int rows, int cols, uint16_t signs, bool inverse = false) {
    if (rows < 0 || cols < 0 || cols % kNvfp4Block != 0)
        throw std::invalid_argument("nvfp4_rht_rows: cols must be a non-negative multiple of 16");
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c += kNvfp4Block) {
            float* v = x + (size_t)r * cols + c;
            if (inverse) nvfp4_rht16_inverse(v, signs);
            else nvfp4_rht16(v, signs);
        }
    }
}

} // namespace llmc
