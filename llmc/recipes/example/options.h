// recipes/example/options.h: the example recipe's flags (no CUDA, so the CPU tests can parse them).
// A recipe's options are a plain struct, the rows it adds to the trainer's flag table, and a check that
// refuses a bad value with one clear line before the GPU is touched.
#pragma once
#include <string>
#include "llmc/recipe_options.h"

struct ExampleOptions : LayersKeptInBf16 {
    std::string weight_format = "e4m3"; // -wf: the FP8 format the weights are rounded to (e4m3 | e5m2)
};

inline void append_recipe_flags(llmc::FlagTable& t, ExampleOptions& o) {
    t.push_back({"-wf", llmc::FlagKind::Str, &o.weight_format, "the FP8 format the weights are rounded to: e4m3 | e5m2"});
    append_bf16_layer_flags(t, o);
}

inline void check_recipe_options(const ExampleOptions& o, bool /*has_output_dir*/) {
    if (o.weight_format != "e4m3" && o.weight_format != "e5m2")
        llmc::input_error("-wf %s: the weight format must be e4m3 or e5m2", o.weight_format.c_str());
    check_bf16_layers(o);
}
