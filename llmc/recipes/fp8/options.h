// The FP8 recipe's options (no CUDA): delayed scaling's amax history and scale margin, the layers kept
// in BF16, and the telemetry interval.
#pragma once
#include "llmc/checkpoint.h"
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

// its environment switches (read again when the recipe sets itself up on the GPU)
inline void check_recipe_environment(const Fp8Options&) {
    check_env_choice("LLMC_FP8_FUSED_GEMM", {"0", "1"}, "0 (cuBLASLt and the passes) or 1 (the fused MLP GEMMs)");
}

// -sqf / -sql as the recipe resolves them: no layer kept in BF16 unless asked
inline void resolve_fp8_defaults(Fp8Options& o) { resolve_skip_defaults(o, 0, 0); }

// The settings its checkpoint records (section fp8_options: -fh -fm -sqf -sql) must be this run's: its amax
// histories and scales mean nothing under others.
inline void check_recipe_checkpoint(const Fp8Options& options, int /*num_layers*/, const llmc::StateReader& r) {
    if (!r.has("fp8_options")) return;
    Fp8Options o = options;
    resolve_fp8_defaults(o);
    int32_t saved[4];
    r.read("fp8_options", saved, sizeof(saved));
    const int32_t mine[4] = {o.amax_history, o.scale_margin, o.skip_first, o.skip_last};
    if (std::memcmp(saved, mine, sizeof(saved)) != 0)
        llmc::input_error("the checkpoint was written with -fh %d -fm %d -sqf %d -sql %d, this run has -fh %d -fm %d -sqf %d "
                          "-sql %d; resume with the checkpoint's settings", saved[0], saved[1], saved[2], saved[3], mine[0],
                          mine[1], mine[2], mine[3]);
}
