// The Q1.15 recipe's options (no CUDA): the telemetry interval of its boundaries. (-Q 115 is the trainer's
// flag; recipe_init sees it as RecipeContext::self_check.)
#pragma once
#include "llmc/recipe_options.h"

struct Q115Options : TelemetryInterval {};

inline void append_recipe_flags(llmc::FlagTable& t, Q115Options& o) { append_telemetry_flag(t, o); }

inline void check_recipe_options(const Q115Options& o, bool has_output_dir) { check_telemetry(o, has_output_dir); }

// its environment switches (read again when the recipe sets itself up on the GPU)
inline void check_recipe_environment(const Q115Options&) {
    check_env_choice("LLMC_Q115_FUSED_GEMM", {"0", "1"}, "0 (cuBLASLt and a post-GEMM pass) or 1 (the fused Hopper GEMM)");
}
