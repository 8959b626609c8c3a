// recipes/bf16/recipe.h: the BF16 precision recipe, the baseline every other recipe is compared with.
//
// BF16 is the identity recipe: every transformer linear is the plain linear layer of recipe_api.h
// (BF16 operands, FP32 accumulation; FP32 operands in the PRECISION=FP32 reference build). It keeps
// no state, so its checkpoint section is empty, and takes no flags of its own (options.h).
#pragma once
#include "llmc/recipe_api.h"
#include "options.h"
#include "llmc/profiler.h"

#define RECIPE_NAME "bf16"
using RecipeOptions = Bf16Options; // its flags (options.h)
using RecipeBoundaries = IdentityBoundaries; // no boundaries outside the linears (boundaries.h)

struct Recipe {
    RecipeOptions options;
    LinearScratch scratch;
};

inline void recipe_init(Recipe& r, const RecipeOptions& o, const ModelShape& shape, int B, int T,
                        const RecipeContext& = RecipeContext()) {
    (void)B; (void)T;
    r.options = o;
    linear_scratch_init(r.scratch, shape.channels);
}
inline std::string recipe_describe(const Recipe&) { return "bf16: BF16 GEMMs, FP32 accumulation"; }
inline void recipe_weights_changed(Recipe&, const LinearWeights&, cudaStream_t) {}
inline void recipe_step_end(Recipe&, cudaStream_t) {}
// nothing random, nothing that the processes of a data-parallel run must combine
inline void recipe_begin_micro_step(Recipe&, int) {}
inline RecipeMaxState recipe_cross_process_max(Recipe&) { return RecipeMaxState(); }

// LLMC_PROFILE=2 names each GEMM (profiler.h)
static const char* const BF16_FINE_FWD[NUM_LINEAR_KINDS] = {"  gemm qkv fwd", "  gemm attproj fwd",
                                                             "  gemm fc fwd (+GELU)", "  gemm fcproj fwd"};
static const char* const BF16_FINE_WGRAD[NUM_LINEAR_KINDS] = {"  gemm qkv wgrad+bias", "  gemm attproj wgrad+bias",
                                                               "  gemm fc wgrad+bias", "  gemm fcproj wgrad+bias"};
static const char* const BF16_FINE_DGRAD[NUM_LINEAR_KINDS] = {"  gemm qkv dgrad", "  gemm attproj dgrad",
                                                               "  gemm fc dgrad", "  gemm fcproj dgrad (+DGELU)"};

inline void linear_forward(Recipe&, LinearId id, floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, bool, cudaStream_t stream) {
    PHASE_FINE(BF16_FINE_FWD[id.kind]);
    plain_linear_forward(out, inp, weight, bias, N, C, OC, stream);
}
inline void linear_forward_gelu(Recipe&, LinearId id, floatX* gelu_out, floatX* pre_gelu, const floatX* inp,
                                const floatX* weight, const floatX* bias, int N, int C, int OC, bool, cudaStream_t stream) {
    PHASE_FINE(BF16_FINE_FWD[id.kind]);
    plain_linear_forward_gelu(gelu_out, pre_gelu, inp, weight, bias, N, C, OC, stream);
}
inline void linear_backward(Recipe& r, LinearId id, floatX* dinp, float* dweight, float* dbias, const floatX* dout,
                            const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC,
                            cudaStream_t stream) {
    PHASE_FINE(BF16_FINE_WGRAD[id.kind]);
    plain_linear_backward_dw_bias(dweight, dbias, dout, inp, r.scratch, N, C, OC, stream);
    PHASE_FINE(BF16_FINE_DGRAD[id.kind]);
    plain_linear_backward_dx(dinp, dout, weight, pre_gelu, N, C, OC, stream);
}

inline bool recipe_needs_input_in_backward(const Recipe&, LinearId, int) { return true; }

inline void recipe_save(const Recipe&, StateWriter&) {}
inline void recipe_load(Recipe&, StateReader&) {}
inline bool recipe_begin_step(Recipe&, int) { return false; }
inline void recipe_log_telemetry(Recipe&, FILE*, int) {}
