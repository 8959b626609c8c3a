// The FP8 recipe's options (no CUDA): the scaling mode, delayed scaling's amax history and scale margin,
// block scaling's gradient format and power-of-two scales, the layers kept in BF16, and the telemetry
// interval.
#pragma once
#include <string>
#include "llmc/checkpoint.h"
#include "llmc/recipe_options.h"

// -fs: how a quantized tensor gets its scale (doc/recipes/fp8.md)
//   delayed  one scale per tensor, from the amax history of earlier steps (formats/fp8_scaling.h)
//   current  one scale per tensor, from the amax of the tensor being quantized, used at once
//   block    one scale per 1 x 128 block of activations and gradients (along K) and per 128 x 128
//            block of weights (formats/fp8_block_scaling.h)
enum Fp8ScalingMode { FP8_SCALING_DELAYED = 0, FP8_SCALING_CURRENT = 1, FP8_SCALING_BLOCK = 2 };
inline const char* fp8_scaling_name(int mode) {
    return mode == FP8_SCALING_CURRENT ? "current" : mode == FP8_SCALING_BLOCK ? "block" : "delayed";
}

struct Fp8Options : LayersKeptInBf16, TelemetryInterval {
    std::string scaling = "delayed"; // -fs: delayed, current or block
    int amax_history = 1024; // -fh: delayed scaling's amax history length, in optimizer steps
    int scale_margin = 0;    // -fm: scale = FP8_MAX / max(amax history) / 2^margin (delayed and current)
    std::string block_grad_format = "e4m3"; // -fbg: the gradients' format under block scaling (e4m3 or e5m2)
    int pow2_scales = 0;     // -fp2: 1 = block scales rounded down to powers of two
    int head = 0;            // -flh: 1 = the LM head's forward and input-gradient GEMMs in FP8
};

// -fs as its enum (check_recipe_options has refused anything else)
inline int fp8_scaling_mode(const Fp8Options& o) {
    return o.scaling == "current" ? FP8_SCALING_CURRENT : o.scaling == "block" ? FP8_SCALING_BLOCK : FP8_SCALING_DELAYED;
}
// whether block scaling quantizes the gradients as E5M2 (-fbg e5m2); the other modes always do
inline bool fp8_block_grads_e5m2(const Fp8Options& o) { return o.block_grad_format == "e5m2"; }

inline void append_recipe_flags(llmc::FlagTable& t, Fp8Options& o) {
    using K = llmc::FlagKind;
    t.push_back({"-fs", K::Str, &o.scaling, "scaling: delayed (amax history), current (the tensor's own amax) or block (1x128 / 128x128; Hopper, CUDA 12.9+)"});
    t.push_back({"-fh", K::Int, &o.amax_history, "-fs delayed: the amax history length, in steps"});
    t.push_back({"-fm", K::Int, &o.scale_margin, "-fs delayed, current: scale margin, scale = FP8_MAX / amax / 2^margin"});
    t.push_back({"-fbg", K::Str, &o.block_grad_format, "-fs block: the gradients' format, e4m3 or e5m2"});
    t.push_back({"-fp2", K::Int, &o.pow2_scales, "-fs block: 1 = scales rounded down to powers of two"});
    t.push_back({"-flh", K::Int, &o.head, "1 = the LM head's forward and input-gradient GEMMs in FP8 (any -fs)"});
    append_bf16_layer_flags(t, o);
    append_telemetry_flag(t, o);
}

inline void check_recipe_options(const Fp8Options& o, bool has_output_dir) {
    if (o.scaling != "delayed" && o.scaling != "current" && o.scaling != "block")
        llmc::input_error("-fs %s: the scaling must be delayed, current or block", o.scaling.c_str());
    if (o.block_grad_format != "e4m3" && o.block_grad_format != "e5m2")
        llmc::input_error("-fbg %s: the gradients' format must be e4m3 or e5m2", o.block_grad_format.c_str());
    check_switch("-fp2", o.pow2_scales);
    check_switch("-flh", o.head);
    if (fp8_scaling_mode(o) != FP8_SCALING_BLOCK && (o.block_grad_format != "e4m3" || o.pow2_scales != 0))
        llmc::input_error("-fbg and -fp2 are block scaling's (-fs block); this run has -fs %s", o.scaling.c_str());
    // (a flag a mode does not read is refused, not ignored: a run asking for it would not get what it asked)
    if (fp8_scaling_mode(o) != FP8_SCALING_DELAYED && o.amax_history != Fp8Options().amax_history)
        llmc::input_error("-fh %d: the amax history is delayed scaling's (-fs delayed); this run has -fs %s", o.amax_history,
                          o.scaling.c_str());
    if (fp8_scaling_mode(o) == FP8_SCALING_BLOCK && o.scale_margin != 0)
        llmc::input_error("-fm %d: the scale margin is delayed and current scaling's; block scales map each block's "
                          "amax to FP8_MAX (this run has -fs block)", o.scale_margin);
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

// The scaling settings a checkpoint records in section fp8_scaling: -fs, -fbg, -fp2. Checkpoints of delayed
// scaling have no such section (they are byte for byte what they were before the other modes existed), so
// its absence means delayed scaling.
inline void fp8_scaling_record(const Fp8Options& o, int32_t (&rec)[3]) {
    rec[0] = fp8_scaling_mode(o);
    rec[1] = fp8_block_grads_e5m2(o) ? 1 : 0;
    rec[2] = o.pow2_scales;
}
inline bool fp8_records_scaling(const Fp8Options& o) { return fp8_scaling_mode(o) != FP8_SCALING_DELAYED; }

// The settings its checkpoint records (section fp8_options: -fh -fm -sqf -sql; section fp8_scaling: -fs
// -fbg -fp2) must be this run's: its amax histories and scales mean nothing under others. (-cr 1 resumes
// it anyway, with the recipe state started afresh: train_gpt.cu's check_checkpoint.)
inline void check_recipe_checkpoint(const Fp8Options& options, int /*num_layers*/, const llmc::StateReader& r) {
    if (!r.has("fp8_options")) return;
    Fp8Options o = options;
    resolve_fp8_defaults(o);
    int32_t saved_scaling[3] = {FP8_SCALING_DELAYED, 0, 0}, my_scaling[3];
    if (r.has("fp8_scaling")) r.read("fp8_scaling", saved_scaling, sizeof(saved_scaling));
    fp8_scaling_record(o, my_scaling);
    if (std::memcmp(saved_scaling, my_scaling, sizeof(saved_scaling)) != 0)
        llmc::input_error("the checkpoint was written with -fs %s -fbg %s -fp2 %d, this run has -fs %s -fbg %s -fp2 %d; "
                          "resume with the checkpoint's settings, or with -cr 1 to start the FP8 scaling state afresh",
                          fp8_scaling_name(saved_scaling[0]), saved_scaling[1] ? "e5m2" : "e4m3", saved_scaling[2],
                          fp8_scaling_name(my_scaling[0]), my_scaling[1] ? "e5m2" : "e4m3", my_scaling[2]);
    int32_t saved[4];
    r.read("fp8_options", saved, sizeof(saved));
    const int32_t mine[4] = {o.amax_history, o.scale_margin, o.skip_first, o.skip_last};
    if (std::memcmp(saved, mine, sizeof(saved)) != 0)
        llmc::input_error("the checkpoint was written with -fh %d -fm %d -sqf %d -sql %d, this run has -fh %d -fm %d -sqf %d "
                          "-sql %d; resume with the checkpoint's settings, or with -cr 1 to start the FP8 scaling state afresh", saved[0], saved[1], saved[2], saved[3], mine[0],
                          mine[1], mine[2], mine[3]);
}
