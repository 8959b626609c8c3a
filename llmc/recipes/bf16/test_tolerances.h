// test_tolerances.h: how far test_gpt_bf16 (and test_gpt_fp32, under ENABLE_FP32) may be from the float64
// PyTorch reference (dev/reference/gpt_reference.py). Relative L2 errors ||ours - ref|| / ||ref|| for tensors,
// absolute differences for losses.
#pragma once

#if defined(ENABLE_FP32)
// True FP32 everywhere (no TF32, no fast math): the only error is FP32 rounding, 2^-24 per operation,
// accumulated over GEMMs of up to K = 3072 terms and 12 layers: around 1e-6 relative. The bounds leave a factor
// of about ten above that and are still far below anything a real mistake produces.
static const float TOL_LOGITS = 1e-5f;  // relative L2
static const float TOL_LOSS = 1e-5f;    // absolute
static const float TOL_GRAD = 1e-4f;    // relative L2, each of the 16 tensors
static const float TOL_LOSSES = 1e-4f;  // absolute, each of the 10 steps
static const float TOL_NORM = 1e-4f;    // relative, each step's gradient norm
static const float TOL_ENDING_LOSS = 1e-5f; // absolute, one multiple-choice ending's mean loss (test_gpt.cu)
#else
// Parameters and activations stored in BF16: 8 mantissa bits, one rounding off by up to 2^-9 relative, about
// 2^-9/sqrt(3) = 0.11% RMS per stored value; the forward stacks a few such roundings per layer, so the logits land
// near 1% and the gradients, a backward pass deeper, a few percent for the worst tensor. The bounds are about
// twice that; a transposed operand, a missing bias or a wrong scale gives errors of order 1.
static const float TOL_LOGITS = 2e-2f;
static const float TOL_LOSS = 1e-2f;
static const float TOL_GRAD = 5e-2f;
static const float TOL_LOSSES = 2e-2f;
static const float TOL_NORM = 2e-2f;
static const float TOL_ENDING_LOSS = 1e-2f;
#endif

// The losses of a model that keeps its GELU outputs against one that recomputes them (-r 0 against -r 1, after
// resuming the same checkpoint), absolute, each step: the fc GEMM epilogue's GELU and the GELU kernel differ in the
// last bits of a few outputs, and those differences stay at the level of a BF16 rounding of the loss over 3 steps.
static const float TOL_KEPT_VS_RECOMPUTED = 2e-3f;
