// boundaries.h: the named forward-pass boundaries where a precision recipe may act outside the
// linear layers, and the identity policy that every recipe but Q1.15 uses.
//
// The model's kernels (encoder, LayerNorm, attention, GELU, classifier, AdamW) are templates over a
// boundary policy `Bd`, a type with these members; train_gpt.cu instantiates them with the recipe's
// `RecipeBoundaries`. Each hook maps the float value that is about to be stored (or read) at that
// boundary to the value the recipe wants there. All hooks are __host__ __device__, so the CPU tests
// and the host-side sampler apply the same functions.
//
//   embedding(x)         the token + position embedding sum, as stored in the residual stream
//   residual(x)          every residual add (residual + branch_scale * branch), as stored
//   norm_output(x)       every LayerNorm output (ln1, ln2, lnf)
//   attention_scores(x)  the raw score q.k (a GEMM output, before 1/sqrt(head size)) as softmax reads it
//   softmax_output(x)    each attention probability, as stored (and read by att @ v and the backward)
//   attention_output(x)  the output of att @ v (a GEMM output), as stored before its projection
//   gelu_input(x)        the pre-GELU activation as the GELU reads it
//   gelu_output(x)       the GELU output, as stored
//   logits(x)            an LM-head output (a GEMM output) as the classifier reads it
//   branch_output(br, x) the output of a residual branch's last linear (br: ATTENTION_BRANCH, the
//                        attention projection, or MLP_BRANCH, the MLP projection; GEMM outputs) as
//                        the residual add reads it. Only that kernel reads these two tensors, so
//                        it applies the hook, and under ACTIVE boundaries it also stores the values
//                        back into the tensor (which then holds what a post-GEMM pass would leave
//                        there; the recipe's linear_forward does not quantize these two itself)
//   constrain_weight(x)  a parameter after init, load or the optimizer step (master and model copy)
// Constants:
//   ACTIVE                       false: every hook is the identity (kernels skip the extra work)
//   ATTENTION_RESIDUAL_SCALE     residual2 = residual + s * attention branch (the gradient scales too)
//   MLP_RESIDUAL_SCALE           residual3 = residual2 + s * MLP branch
//   LOGIT_SCALE                  the classifier's softmax reads s * logits(x) (the gradient scales too)
//   CONSTRAINS_WEIGHTS           constrain_weight is not the identity
//   ATTENTION_SCORE_BOUND        0, or a bound on |attention_scores(x)| for every x (Q1.15: 0.999 times
//                                the boundary's range): the flash attention's statistics pass then
//                                needs no running row maximum (flash_attention_tiles.cuh, fixed_row_max)
// Type:
//   Values                       the same hooks, bit for bit, without any telemetry the policy keeps
//                                (Q1.15 counts what passes its hooks): for a kernel that passes a value
//                                through a hook again after it was counted once (the flash attention's
//                                second forward pass and its backward recompute the probabilities)
//   Tally                        a thread's own running count, in registers, of the attention scores
//                                and probabilities it passes through the counting hooks, for the
//                                kernels that pass dozens of values per thread and tile (the flash
//                                attention's counting instantiation): t.score(x) counts x as
//                                attention_scores(x) would, t.prob(p) as softmax_output(p) would (the
//                                values themselves come from the hooks of Values), and t.commit(),
//                                called by every thread of the block once at the end, adds the counts
//                                to the policy's counters (a warp-wide reduction, then a few atomics per
//                                warp, instead of a warp vote and atomics per value). IdentityBoundaries'
//                                Tally counts nothing.
// Query:
//   observing()                  (host and device) whether the hooks count what passes them right now
//                                (a telemetry step); false for Values. A launcher whose kernels apply a
//                                hook to every element (the flash attention) launches them with Values
//                                when this is false, so that the kernels of an ordinary step carry no
//                                counting code: a count is a warp-wide vote and atomics, which inside an
//                                element loop put a branch and a reconvergence point around every
//                                element and raise the register pressure of the whole loop.
// The backward pass treats every hook as the identity (straight-through), apart from the scales.
// The recipe's own linear layers handle their GEMM outputs themselves (linear_forward).
#pragma once

// the two residual branches of a block: which one a residual add adds
enum ResidualBranch { ATTENTION_BRANCH = 0, MLP_BRANCH = 1 };

#if defined(__CUDACC__)
#define LLMC_BD __host__ __device__ __forceinline__
#else
#define LLMC_BD inline
#endif

struct NoTally {
    LLMC_BD void score(float) {}
    LLMC_BD void prob(float) {}
    LLMC_BD void commit() {}
};

struct IdentityBoundaries {
    using Values = IdentityBoundaries;
    using Tally = NoTally;
    static constexpr bool ACTIVE = false;
    static constexpr bool CONSTRAINS_WEIGHTS = false;
    static constexpr float ATTENTION_RESIDUAL_SCALE = 1.0f;
    static constexpr float MLP_RESIDUAL_SCALE = 1.0f;
    static constexpr float LOGIT_SCALE = 1.0f;
    static constexpr float ATTENTION_SCORE_BOUND = 0.0f;
    LLMC_BD static float embedding(float x) { return x; }
    LLMC_BD static float residual(float x) { return x; }
    LLMC_BD static float norm_output(float x) { return x; }
    LLMC_BD static float attention_scores(float x) { return x; }
    LLMC_BD static float softmax_output(float x) { return x; }
    LLMC_BD static float attention_output(float x) { return x; }
    LLMC_BD static float gelu_input(float x) { return x; }
    LLMC_BD static float gelu_output(float x) { return x; }
    LLMC_BD static float logits(float x) { return x; }
    LLMC_BD static float branch_output(int, float x) { return x; }
    LLMC_BD static float constrain_weight(float x) { return x; }
    LLMC_BD static bool observing() { return false; }
};
