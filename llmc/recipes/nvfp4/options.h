// The NVFP4 recipe's options (no CUDA): its three techniques, each on by default, the layers kept in
// BF16, and the telemetry interval.
#pragma once
#include "llmc/recipe_options.h"

struct Nvfp4Options : LayersKeptInBf16, TelemetryInterval {
    int fp4_rht = 1;           // -rht: random Hadamard transform of the wgrad operands
    int fp4_stochastic = 1;    // -sr: stochastic rounding of the gradients
    int fp4_four_over_six = 1; // -fos: Four Over Six block scales
};

inline void append_recipe_flags(llmc::FlagTable& t, Nvfp4Options& o) {
    using K = llmc::FlagKind;
    t.push_back({"-rht", K::Int, &o.fp4_rht, "1 = random Hadamard transform of the weight-gradient operands"});
    t.push_back({"-sr", K::Int, &o.fp4_stochastic, "1 = stochastic rounding of the gradients"});
    t.push_back({"-fos", K::Int, &o.fp4_four_over_six, "1 = Four Over Six block scales (block max to 4 or 6, the lower error)"});
    append_bf16_layer_flags(t, o);
    append_telemetry_flag(t, o);
}

inline void check_recipe_options(const Nvfp4Options& o, bool has_output_dir) {
    check_bf16_layers(o);
    check_switch("-rht", o.fp4_rht);
    check_switch("-sr", o.fp4_stochastic);
    check_switch("-fos", o.fp4_four_over_six);
    check_telemetry(o, has_output_dir);
}

// its environment switches (read again when the recipe sets itself up on the GPU)
inline void check_recipe_environment(const Nvfp4Options&) {
    check_env_choice("LLMC_NVFP4_EMULATE", {"0", "1"}, "0 (native FP4 GEMMs where the GPU has them) or 1 (the emulation everywhere)");
}
