// The TCFP-12 recipe's options (no CUDA): the split's options (llmc/formats/tcfp12.h), which the flags
// write directly and the split kernels read, the weight gradient's precision, the W_hi GEMMs'
// accumulation, the layers kept in BF16, and the telemetry interval.
#pragma once
#include <string>
#include "llmc/recipe_options.h"
#include "llmc/formats/tcfp12.h"

struct Tcfp12RecipeOptions : LayersKeptInBf16, TelemetryInterval {
    llmc::Tcfp12Options split; // -tb -tef -tsrr -tpdds -tabd
    int tcfp_fp8_wgrad = 0;    // -tfw: weight gradient on FP8 tensor cores (0: BF16)
    int tcfp_fast_accum = 0;   // -tfa: Hopper's fast FP8 accumulation for the W_hi GEMMs too (W_lo's always)
};

inline void append_recipe_flags(llmc::FlagTable& t, Tcfp12RecipeOptions& o) {
    using K = llmc::FlagKind;
    t.push_back({"-tb", K::Int, &o.split.block_size, "scale block of the weight split: 0 (per tensor), 32, 64, 128"});
    t.push_back({"-tef", K::Int, &o.split.error_feedback, "1 = error feedback buffer (-1: on unless -tsrr 1)"});
    t.push_back({"-tsrr", K::Int, &o.split.srr, "1 = stochastic rounding of W_lo instead of error feedback"});
    t.push_back({"-tpdds", K::Int, &o.split.pdds, "1 = predictive dual-track delayed scaling (EMA W_hi scale)"});
    t.push_back({"-tabd", K::Int, &o.split.abd, "1 = input gradient with W_hi alone (asymmetric backward)"});
    t.push_back({"-tfw", K::Int, &o.tcfp_fp8_wgrad, "1 = weight gradient on FP8 tensor cores (0 = BF16)"});
    t.push_back({"-tfa", K::Int, &o.tcfp_fast_accum, "1 = fast FP8 accumulation in the W_hi GEMMs too (W_lo's always)"});
    append_bf16_layer_flags(t, o);
    append_telemetry_flag(t, o);
}

inline void check_recipe_options(const Tcfp12RecipeOptions& o, bool has_output_dir) {
    check_bf16_layers(o);
    const std::string split_error = llmc::tcfp12_validate(o.split); // the split's exclusions
    if (!split_error.empty()) llmc::input_error("%s", split_error.c_str());
    check_switch("-tfw", o.tcfp_fp8_wgrad);
    check_switch("-tfa", o.tcfp_fast_accum);
    check_telemetry(o, has_output_dir);
}

// its environment switches (read again when the recipe sets itself up on the GPU)
inline void check_recipe_environment(const Tcfp12RecipeOptions&) {
    check_env_choice("LLMC_TCFP12_SPECULATE", {"0", "1"}, "0 (an amax pass before every quantization) or 1 (speculative fresh scales)");
    check_env_choice("LLMC_TCFP12_CONCAT", {"0", "1"}, "0 (two GEMMs) or 1 (one K-concatenated GEMM)");
}
