// test_tolerances.h: how far test_gpt_vcast may be from the float64 PyTorch reference
// (dev/reference/gpt_reference.py). Relative L2 errors for tensors, absolute differences for losses.
//
// vcast with its defaults (MXFP8: E4M3 weights and activations, E5M2 gradients, one power-of-two scale per 32
// values): per-block scales put every block near the top of its range, so the errors are about those of
// FP8-hybrid's per-tensor scaling (one E4M3 rounding 3.6% RMS, E5M2 7.2%; the forward near 5-10%, the gradients
// near 10-15%), except that a power-of-two scale leaves a block up to a factor 2 below the top of the range,
// which costs up to one more bit on the logits. The bounds are about twice the expected errors.
#pragma once

static const float TOL_LOGITS = 2e-1f;  // relative L2
static const float TOL_LOSS = 5e-2f;    // absolute
static const float TOL_GRAD = 2.5e-1f;  // relative L2, each of the 16 tensors
static const float TOL_LOSSES = 5e-2f;  // absolute, each of the 10 steps
static const float TOL_NORM = 1e-1f;    // relative, each step's gradient norm
// One multiple-choice ending's mean loss over its 3-24 tokens (test_gpt.cu, check hellaswag), absolute: 3x
// TOL_LOSS: short endings weigh single roundings of the cast datatypes more than the batch loss does, still far
// below the order-1 error of a wrong position or mask.
static const float TOL_ENDING_LOSS = 1.5e-1f;

// -r 0 against -r 1 after resuming the same checkpoint, absolute, each step: the fc GEMM epilogue's GELU and the
// GELU kernel differ in the last bits of a few outputs; that stays at a BF16 rounding of the loss over 3 steps.
static const float TOL_KEPT_VS_RECOMPUTED = 2e-3f;
