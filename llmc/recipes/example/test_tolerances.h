// recipes/example/test_tolerances.h: how far test_gpt_example may be from the float64 PyTorch reference, whose
// weights are not rounded. Relative L2 errors for tensors, absolute differences for losses.
#pragma once

// One E4M3 rounding is off by at most 2^-4 relative, about 2^-4/sqrt(3) = 3.6% RMS, and every forward GEMM sees
// a rounded weight: the logits land near the 5% that FP8-hybrid's forward shows with both operands rounded, less
// here with one. The gradients pass through the same rounded weights on their way down (dx = dy Wq), a few
// percent per layer. The bounds are those of the FP8 recipe: loose enough for an FP8 weight, tight enough that a
// wrong scale (errors of order 1) or a transposed copy fails.
static const float TOL_LOGITS = 1e-1f;
static const float TOL_LOSS = 5e-2f;
static const float TOL_GRAD = 2.5e-1f;
static const float TOL_LOSSES = 5e-2f;
static const float TOL_NORM = 1e-1f;
// One multiple-choice ending's mean loss over its 3-24 tokens (test_gpt.cu, check hellaswag), absolute: the bound
// of the batch loss holds for it too.
static const float TOL_ENDING_LOSS = 5e-2f;
static const float TOL_KEPT_VS_RECOMPUTED = 2e-3f;
