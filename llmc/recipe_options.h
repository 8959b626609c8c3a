// recipe_options.h: what the precision recipes share of their options (no CUDA): the flags that more than
// one recipe has (-sqf -sql, -lq), which a recipe's options struct (llmc/recipes/<name>/options.h) derives
// from, and RecipeContext, what recipe_init gets from the run besides the flags.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <algorithm>
#include "common.h"
#include "flags.h"

// -sqf / -sql: the transformer layers a quantizing recipe keeps in BF16 (the plain linear)
struct LayersKeptInBf16 {
    int skip_first = -1; // -sqf: keep the first N transformer layers in BF16 (-1: the recipe's default)
    int skip_last = -1;  // -sql: keep the last N transformer layers in BF16 (-1: the recipe's default)
};

inline void append_bf16_layer_flags(llmc::FlagTable& t, LayersKeptInBf16& o) {
    using K = llmc::FlagKind;
    t.push_back({"-sqf", K::Int, &o.skip_first, "keep the first N transformer layers in BF16 (-1 = the recipe's default)"});
    t.push_back({"-sql", K::Int, &o.skip_last, "keep the last N transformer layers in BF16 (-1 = the recipe's default)"});
}

inline void check_bf16_layers(const LayersKeptInBf16& o) {
    if (o.skip_first < -1) llmc::input_error("-sqf %d: must be >= 0 (or -1, the recipe's default)", o.skip_first);
    if (o.skip_last < -1) llmc::input_error("-sql %d: must be >= 0 (or -1, the recipe's default)", o.skip_last);
}

// A recipe's recipe_init replaces -1 (the flags' default) by its own default number of layers to
// keep in BF16.
inline void resolve_skip_defaults(LayersKeptInBf16& o, int default_first, int default_last) {
    if (o.skip_first < 0) o.skip_first = default_first;
    if (o.skip_last < 0) o.skip_last = default_last;
}

// Layers [skip_first, L - skip_last) are quantized; the others run the plain BF16 linear.
inline bool layer_is_quantized(const LayersKeptInBf16& o, int layer, int num_layers) {
    return layer >= o.skip_first && layer < num_layers - o.skip_last;
}

// -sqf / -sql against the model, before the GPU: layers that exist, and at least one left to quantize (a
// recipe whose every layer stays BF16 is the BF16 recipe under another name, which a user never means).
// Options without -sqf / -sql have nothing to check.
template <class Options>
inline void check_bf16_layers_for_model(const Options& options, int num_layers) {
    if constexpr (std::is_base_of_v<LayersKeptInBf16, Options>) {
        const LayersKeptInBf16& o = options;
        const int first = std::max(o.skip_first, 0), last = std::max(o.skip_last, 0);
        if (first + last >= num_layers)
            llmc::input_error("-sqf %d -sql %d keep %d layers in BF16 (-1 counts as 0 here), but the model has %d, so "
                              "no layer would be quantized; lower them, or train with train_gpt_bf16", o.skip_first,
                              o.skip_last, first + last, num_layers);
    } else {
        (void)options; (void)num_layers;
    }
}

// An environment switch of a recipe or of the trainer, checked before the GPU: unset, or one of `allowed`;
// anything else stops the run with one line ("NAME must be <meaning>, got 'VALUE'").
inline void check_env_choice(const char* name, std::initializer_list<const char*> allowed, const char* meaning) {
    const char* v = std::getenv(name);
    if (!v) return;
    for (const char* a : allowed)
        if (std::strcmp(v, a) == 0) return;
    llmc::input_error("%s must be %s, got '%s'", name, meaning, v);
}

// A checkpoint's recipe state against this run's options, before the GPU (a recipe whose state depends on
// its options overloads this for its options type, with llmc::StateReader; the template checks nothing).
template <class Options, class Reader>
inline void check_recipe_checkpoint(const Options&, int /*num_layers*/, const Reader&) {}

// A recipe's own environment switches (its options.h overloads this for its options type; the template is
// for recipes without any).
template <class Options>
inline void check_recipe_environment(const Options&) {}

// -lq: the recipe's quantization telemetry, lines in main.log
struct TelemetryInterval {
    int telemetry_every = 0; // -lq: every N steps (0 = off)
};

inline void append_telemetry_flag(llmc::FlagTable& t, TelemetryInterval& o) {
    t.push_back({"-lq", llmc::FlagKind::Int, &o.telemetry_every, "quantization telemetry in main.log every N steps (0 = off)"});
}

// has_output_dir: whether the run writes main.log (-o)
inline void check_telemetry(const TelemetryInterval& o, bool has_output_dir) {
    if (o.telemetry_every < 0) llmc::input_error("-lq %d: must be >= 0 (0 = off)", o.telemetry_every);
    if (o.telemetry_every > 0 && !has_output_dir)
        llmc::input_error("-lq %d: the telemetry goes to main.log, so it needs -o", o.telemetry_every);
}

// A flag that is a switch: 0 or 1
inline void check_switch(const char* flag, int value) {
    if (value != 0 && value != 1) llmc::input_error("%s %d: must be 0 or 1", flag, value);
}

// What recipe_init gets from the run that is not one of the recipe's flags.
struct RecipeContext {
    uint64_t seed = 0;   // -sd: the run's seed (stochastic rounding streams, Hadamard signs)
    int self_check = 0;  // -Q given: the recipe checks its device code against the CPU codec at start (q115)
    // ZeRO-1's owners of the optimizer state (zero.h), which gpt_allocate copies from the model's shard
    // layout: this process's place among them and their number (1 unless -z 1 over several processes).
    // TCFP-12 cuts its EF buffer the same way.
    int state_owner = 0;
    int state_owners = 1;
    // the most rows the model runs its LM head over at once (its classifier chunk; 0: not given)
    int head_rows = 0;
};

// The context of a run with seed -sd and recipe check -Q ("" = none)
inline RecipeContext recipe_context_of_run(uint64_t seed, const std::string& recipe_check) {
    RecipeContext c;
    c.seed = seed;
    c.self_check = recipe_check.empty() ? 0 : 1;
    return c;
}
