// test_tolerances.h: how far test_gpt_q115 may be from the float64 PyTorch reference written with
// --boundaries q115 (every forward boundary through simulate_q115 in float64). Relative L2 errors for tensors,
// absolute differences for losses.
//
// The reference applies the same Q1.15 boundaries, so what is left is BF16 storage between them: 8 mantissa bits,
// about 0.11% RMS per stored value, stacked over the layers to about 1% on the logits and a few percent on the worst
// gradient tensor, plus the clamp value 32735/32768, which BF16 stores as 1.0. The bounds are BF16's
// (llmc/recipes/bf16/test_tolerances.h), about twice the expected errors.
#pragma once

static const float TOL_LOGITS = 2e-2f;  // relative L2
static const float TOL_LOSS = 1e-2f;    // absolute; also the one-step deviation from BF16 (check_q115_vs_bf16)
static const float TOL_GRAD = 5e-2f;    // relative L2, each of the 16 tensors
static const float TOL_LOSSES = 2e-2f;  // absolute, each of the 10 steps
static const float TOL_NORM = 2e-2f;    // relative, each step's gradient norm
// One multiple-choice ending's mean loss over its 3-24 tokens (test_gpt.cu, check hellaswag), absolute: the bound
// of the batch loss holds for it too.
static const float TOL_ENDING_LOSS = 1e-2f;

// -r 0 against -r 1 after resuming the same checkpoint, absolute, each step: the fc GEMM epilogue's GELU and the
// GELU kernel differ in the last bits of a few outputs; that stays at a BF16 rounding of the loss over 3 steps.
static const float TOL_KEPT_VS_RECOMPUTED = 2e-3f;
