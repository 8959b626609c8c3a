// test_tolerances.h: how far test_gpt_fp8 may be from the float64 PyTorch reference
// (dev/reference/gpt_reference.py). Relative L2 errors for tensors, absolute differences for losses.
//
// FP8-hybrid: E4M3 weights and activations in the forward, E5M2 gradients in the backward. One E4M3 rounding is
// off by at most 2^-4 relative (E5M2: 2^-3), about 2^-4/sqrt(3) = 3.6% (7.2%) RMS; a GEMM's output inherits
// roughly the combined RMS of its two operands, so the forward (E4M3 x E4M3) lands near 5% and the gradients
// (E5M2 x E4M3, several layers deep) near 10%. The bounds are about twice that: loose enough for FP8, tight
// enough that a wrong scale, a transposed operand or a missing amax (errors of order 1) fails.
// The same bounds for every scaling mode (test_gpt_fp8 --recipe "-fs current" / "-fs block", run_tests.sh's
// gpt_fp8_current and gpt_fp8_block): current scaling rounds to the same formats with scales at least as good
// as delayed scaling's (its own amax, no stale history), and block scaling with E4M3 gradients has one mantissa
// bit more than E5M2 and a scale per block, so both land at or below the delayed mode's errors; a block scale
// read from the wrong place still gives errors of order 1.
#pragma once

static const float TOL_LOGITS = 1e-1f;  // relative L2
static const float TOL_LOSS = 5e-2f;    // absolute
static const float TOL_GRAD = 2.5e-1f;  // relative L2, each of the 16 tensors
static const float TOL_LOSSES = 5e-2f;  // absolute, each of the 10 steps
static const float TOL_NORM = 1e-1f;    // relative, each step's gradient norm
// One multiple-choice ending's mean loss over its 3-24 tokens (test_gpt.cu, check hellaswag), absolute: 3x
// TOL_LOSS: short endings weigh single E4M3/E5M2 roundings more than the batch loss does, still far below the
// order-1 error of a wrong position or mask.
static const float TOL_ENDING_LOSS = 1.5e-1f;

// -r 0 against -r 1 after resuming the same checkpoint, absolute, each step: the fc GEMM epilogue's GELU and the
// GELU kernel differ in the last bits of a few outputs; that stays at a BF16 rounding of the loss over 3 steps.
static const float TOL_KEPT_VS_RECOMPUTED = 2e-3f;
