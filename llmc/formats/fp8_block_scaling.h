// formats/fp8_block_scaling.h: FP8 block scaling (the FP8 recipe's -fs block, DeepSeek-V3 style): one FP32
// scale per block of values instead of one per tensor.
//
//   activations, gradients  one scale per 1 x 128 block: 128 consecutive values of a row along the GEMM's
//                           reduction dimension K
//   weights                 one scale per 128 x 128 block, so that W and W^T have the same blocks and the
//                           same scales (the dgrad GEMM reads W^T with its K = W's rows)
//
// A block's scale s maps its largest magnitude onto the format's largest finite value:
//     s = FP8_MAX / amax(block),   q = fp8(x * s)   (round to nearest even, saturating)
// (s one float lower where the rounded quotient would carry amax * s past FP8_MAX, so that nothing saturates)
// and the GEMM multiplies each block's partial products by 1/s (the dequantization factor, what cuBLASLt
// reads). With -fp2 1 the scale is rounded down to a power of two (its mantissa bits cleared), so that
// 1/s is exact and x * s is exact in FP32 before the rounding to FP8; the block's amax then maps to
// somewhere in (FP8_MAX / 2, FP8_MAX]. The scale is computed afresh from the block being quantized
// (nothing is delayed), by the kernel that quantizes it, so no amax pass and no history.
//
// Edge cases, defined here once for the CPU reference and the GPU kernels:
//   * A block of zeros (amax = 0) gets s = 1: its codes are zeros and its factor 1.
//   * A block holding inf or NaN (amax not finite) gets s = 1: inf saturates to +-FP8_MAX, NaN stays NaN, as
//     per-tensor scaling would store them.
//   * A tiny amax whose quotient overflows FP32 gets s = 2^127 (the largest power of two), whatever -fp2 says.
//     (Such an amax is a BF16 subnormal. The GPU build's --use_fast_math flushes subnormal inputs of the
//     multiplication x * s to zero, so there such a block's codes are zeros where this reference scales them
//     up; the tests compare the two on normal values.)
//   * K not a multiple of 128: the last block of a row (or the last 128 x 128 block of a weight's row or
//     column of blocks) holds the K % 128 (or rows % 128) values that remain, and its scale comes from those
//     values alone; positions past the matrix are not part of any block. The block-scaled GEMM itself wants
//     K % 128 == 0 (recipes/fp8/recipe.h runs the plain linear for other shapes), but the quantizers and
//     their scales are defined for any shape.
//
// Scale layouts (what cuBLASLt's block-scaled FP8 GEMMs read, per operand of rows x K, K-major codes):
//   1 x 128   (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F): scales[kb * rows + r], the row index fastest;
//             rows % 4 == 0 keeps every column of the array 16-byte aligned
//   128 x 128 (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F): scales[rb * ld + kb] with the K-block index
//             fastest and ld = ceil(K / 128) rounded up to a multiple of 4; ceil(rows / 128) rounded up to a
//             multiple of 4 rows of ld are allocated (the padding is never read as a scale of a block)
// build/test_fp8 checks both layouts against a float64 product of the dequantized operands.
//
// Host and device code (no CUDA headers needed): the GPU kernels (formats/fp8_block_quantize.cuh) call the
// same scale function, and build/test_cpu checks the reference quantizers below.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>
#include "number_formats.h"
#include "fp8_scaling.h"

namespace llmc {

static const int FP8_BLOCK = 128; // values per block side

LLMC_HD inline int fp8_blocks(int n) { return (n + FP8_BLOCK - 1) / FP8_BLOCK; }
LLMC_HD inline int fp8_round_up4(int n) { return (n + 3) / 4 * 4; }

// The scale of a block whose largest magnitude is amax (the edge cases above)
LLMC_HD inline float fp8_block_scale(float amax, float fp8_max, bool pow2) {
    if (!(amax > 0.0f) || !(amax <= 3.4028235e38f)) return 1.0f; // zeros, inf, NaN
    float s = rn_div(fp8_max, amax);
    if (!(s <= 3.4028235e38f)) return bits_float(0x7F000000u); // 2^127
    // (the quotient rounded to nearest can be one ulp high, and amax * s then lands one ulp past fp8_max: the
    // block's largest values would saturate. One float lower maps amax to fp8_max or just below, so no value
    // of the block saturates; x * s rounds monotonically, |x| <= amax keeps |x * s| <= amax * s.)
    if (amax * s > fp8_max) s = bits_float(float_bits(s) - 1u);
    if (pow2) s = bits_float(float_bits(s) & 0xFF800000u);    // (s is a normal float: fp8_max / amax >= 2^-119)
    return s;
}

// ---- scale layouts ------------------------------------------------------------------------------------
// 1 x 128 blocks of a (rows x k) operand
LLMC_HD inline size_t fp8_vec128_scale_index(int r, int kb, int rows) { return (size_t)kb * rows + r; }
LLMC_HD inline size_t fp8_vec128_scale_count(int rows, int k) { return (size_t)fp8_blocks(k) * rows; }
// 128 x 128 blocks of a (rows x k) operand
LLMC_HD inline int fp8_blk128_ld(int k) { return fp8_round_up4(fp8_blocks(k)); }
LLMC_HD inline size_t fp8_blk128_scale_index(int rb, int kb, int k) { return (size_t)rb * fp8_blk128_ld(k) + kb; }
LLMC_HD inline size_t fp8_blk128_scale_count(int rows, int k) { return (size_t)fp8_round_up4(fp8_blocks(rows)) * fp8_blk128_ld(k); }

// ---- CPU reference quantizers ---------------------------------------------------------------------------
// (the GPU kernels must match them bit for bit: build/test_fp8)
inline uint8_t fp8_block_encode(float x, bool e5m2) {
    return (uint8_t)(e5m2 ? fp8e5m2_encode(x, Overflow::Saturate) : fp8e4m3_encode(x, Overflow::Saturate));
}

// 1 x 128 blocks along the rows of in (rows x k, row-major): codes (rows x k) and the dequantization factors
// 1/s in the 1 x 128 layout (fp8_vec128_scale_count(rows, k) floats). block_amax (may be null): each block's
// amax, at the same index.
inline void fp8_quantize_1x128_ref(const float* in, int rows, int k, bool e5m2, bool pow2, uint8_t* codes, float* inv_scales,
                                   float* block_amax = nullptr) {
    const float fp8_max = e5m2 ? FP8_E5M2_MAX : FP8_E4M3_MAX;
    for (int r = 0; r < rows; r++) {
        for (int kb = 0; kb < fp8_blocks(k); kb++) {
            const int c0 = kb * FP8_BLOCK, c1 = c0 + FP8_BLOCK < k ? c0 + FP8_BLOCK : k;
            uint32_t amax = 0;
            for (int c = c0; c < c1; c++) {
                const uint32_t b = amax_bits(in[(size_t)r * k + c]);
                amax = b > amax ? b : amax;
            }
            const float s = fp8_block_scale(bits_float(amax), fp8_max, pow2);
            for (int c = c0; c < c1; c++) codes[(size_t)r * k + c] = fp8_block_encode(in[(size_t)r * k + c] * s, e5m2);
            inv_scales[fp8_vec128_scale_index(r, kb, rows)] = fp8_inverse(s);
            if (block_amax) block_amax[fp8_vec128_scale_index(r, kb, rows)] = bits_float(amax);
        }
    }
}

// 1 x 128 blocks along the columns of in (rows x k, row-major), written transposed: codes_t (k x rows), whose
// row c holds column c of in, quantized in blocks of 128 rows; inv_scales in the 1 x 128 layout of that
// (k x rows) operand. What the weight gradient reads: x^T and dy^T with their blocks along the tokens.
inline void fp8_quantize_1x128_t_ref(const float* in, int rows, int k, bool e5m2, bool pow2, uint8_t* codes_t,
                                     float* inv_scales) {
    std::vector<float> t((size_t)rows * k);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < k; c++) t[(size_t)c * rows + r] = in[(size_t)r * k + c];
    fp8_quantize_1x128_ref(t.data(), k, rows, e5m2, pow2, codes_t, inv_scales);
}

// 128 x 128 blocks of a weight w (rows x k, row-major): codes (rows x k), codes_t (k x rows, may be null), and
// the factors of both in the 128 x 128 layout: inv_scales for the (rows x k) operand, inv_scales_t (may be
// null) for the (k x rows) one, the same values transposed.
inline void fp8_quantize_128x128_ref(const float* w, int rows, int k, bool e5m2, bool pow2, uint8_t* codes, uint8_t* codes_t,
                                     float* inv_scales, float* inv_scales_t) {
    const float fp8_max = e5m2 ? FP8_E5M2_MAX : FP8_E4M3_MAX;
    for (int rb = 0; rb < fp8_blocks(rows); rb++) {
        for (int kb = 0; kb < fp8_blocks(k); kb++) {
            const int r0 = rb * FP8_BLOCK, r1 = r0 + FP8_BLOCK < rows ? r0 + FP8_BLOCK : rows;
            const int c0 = kb * FP8_BLOCK, c1 = c0 + FP8_BLOCK < k ? c0 + FP8_BLOCK : k;
            uint32_t amax = 0;
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) {
                    const uint32_t b = amax_bits(w[(size_t)r * k + c]);
                    amax = b > amax ? b : amax;
                }
            const float s = fp8_block_scale(bits_float(amax), fp8_max, pow2);
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) {
                    const uint8_t q = fp8_block_encode(w[(size_t)r * k + c] * s, e5m2);
                    codes[(size_t)r * k + c] = q;
                    if (codes_t) codes_t[(size_t)c * rows + r] = q;
                }
            inv_scales[fp8_blk128_scale_index(rb, kb, k)] = fp8_inverse(s);
            if (inv_scales_t) inv_scales_t[fp8_blk128_scale_index(kb, rb, rows)] = fp8_inverse(s);
        }
    }
}

} // namespace llmc
