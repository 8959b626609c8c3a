// The BF16 recipe's options (no CUDA): none. It has no state and quantizes nothing, so it takes no flag
// of its own.
#pragma once
#include "llmc/recipe_options.h"

struct Bf16Options {};

inline void append_recipe_flags(llmc::FlagTable&, Bf16Options&) {}
inline void check_recipe_options(const Bf16Options&, bool /*has_output_dir*/) {}
