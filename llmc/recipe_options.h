// recipe_options.h: the command-line options of the precision recipes (no CUDA: cli.h includes it).
#pragma once

// cli.h fills these from -fh -fm -sqf -sql -lq; a recipe ignores what it does not use.
struct RecipeOptions {
    int amax_history = 1024;     // -fh: delayed scaling's amax history length, in optimizer steps
    int scale_margin = 0;        // -fm: scale = FP8_MAX / max(amax history) / 2^margin
    int skip_first = 0;          // -sqf: keep the first N transformer layers in BF16
    int skip_last = 0;           // -sql: keep the last N transformer layers in BF16
    int telemetry_every = 0;     // -lq: quantization telemetry in main.log every N steps (0 = off)
};

// Layers [skip_first, L - skip_last) are quantized; the others run the plain BF16 linear.
inline bool layer_is_quantized(const RecipeOptions& o, int layer, int num_layers) {
    return layer >= o.skip_first && layer < num_layers - o.skip_last;
}
