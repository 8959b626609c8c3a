// recipes/bf16/recipe.h: the BF16 precision recipe, the baseline every other recipe is compared with.
//
// BF16 is the identity recipe: every transformer linear is the plain linear layer of recipe_api.h
// (BF16 operands, FP32 accumulation; FP32 operands in the PRECISION=FP32 reference build), which the
// API's defaults give (recipe_quantizes: false). It keeps no state, so its checkpoint section is empty,
// and takes no flags of its own (options.h).
#pragma once
#include "llmc/recipe_api.h"
#include "options.h"

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
