// The FP8 recipe's options (no CUDA): delayed scaling's amax history and scale margin, the layers kept
// in BF16, and the telemetry interval.
#pragma once
#include "llmc/recipe_options.h"

struct Fp8Options : LayersKeptInBf16, TelemetryInterval {
    int amax_history = 1024; // -fh: delayed scaling's amax history length, in optimizer steps
    int scale_margin = 0;    // -fm: scale = FP8_MAX / max(amax history) / 2^margin
};

inline void append_recipe_flags(llmc::FlagTable& t, Fp8Options& o) {
    using K = llmc::FlagKind;
    t.push_back({"-fh", K::Int, &o.amax_history, "amax history length of delayed scaling, in steps"});
    t.push_back({"-fm", K::Int, &o.scale_margin, "scale margin: scale = FP8_MAX / amax / 2^margin"});
    append_bf16_layer_flags(t, o);
    append_telemetry_flag(t, o);
}

inline void check_recipe_options(const Fp8Options& o, bool has_output_dir) {
    if (o.amax_history < 1 || o.amax_history > 65536)
        llmc::input_error("-fh %d: the amax history length must be between 1 and 65536 steps", o.amax_history);
    if (o.scale_margin < 0 || o.scale_margin > 32)
        llmc::input_error("-fm %d: the scale margin must be between 0 and 32", o.scale_margin);
    check_bf16_layers(o);
    check_telemetry(o, has_output_dir);
}
