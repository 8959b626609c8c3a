// The vcast recipe's options (no CUDA): a TensorCast-style datatype (llmc/formats/vcast.h) per role, the
// cast options, the layers kept in BF16, and the telemetry interval.
#pragma once
#include <string>
#include "llmc/recipe_options.h"
#include "llmc/formats/vcast.h"

struct VcastRecipeOptions : LayersKeptInBf16, TelemetryInterval {
    std::string vcast_weights = "mxfp8e4";     // -qw
    std::string vcast_activations = "mxfp8e4"; // -qa
    std::string vcast_gradients = "mxfp8e5";   // -qg
    std::string vcast_round = "even";          // -qr: weights and activations (nearest|even|zero|stochastic)
    std::string vcast_grad_round = "even";     // -qgr: gradients
    std::string vcast_scale_mode = "max";      // -qs: max | midmax
    std::string vcast_sparsity = "";           // -qsp: M:N sparsity of the weights ("" = off)
};

inline void append_recipe_flags(llmc::FlagTable& t, VcastRecipeOptions& o) {
    using K = llmc::FlagKind;
    t.push_back({"-qw", K::Str, &o.vcast_weights, "datatype of the weights (TensorCast spec or name: mxfp4e2, e5m6, bfp16, ...)"});
    t.push_back({"-qa", K::Str, &o.vcast_activations, "datatype of the activations"});
    t.push_back({"-qg", K::Str, &o.vcast_gradients, "datatype of the output gradients"});
    t.push_back({"-qr", K::Str, &o.vcast_round, "rounding of weights and activations: nearest | even | zero | stochastic"});
    t.push_back({"-qgr", K::Str, &o.vcast_grad_round, "rounding of the gradients"});
    t.push_back({"-qs", K::Str, &o.vcast_scale_mode, "scale selection: max | midmax"});
    t.push_back({"-qsp", K::Str, &o.vcast_sparsity, "M:N sparsity of the weights, e.g. 2:4 (\"\" = off)"});
    append_bf16_layer_flags(t, o);
    append_telemetry_flag(t, o);
}

inline void check_recipe_options(const VcastRecipeOptions& o, bool has_output_dir) {
    check_bf16_layers(o);
    namespace vc = llmc::vcast;
    try {
        const auto w = vc::parse_datatype(o.vcast_weights);
        vc::parse_datatype(o.vcast_activations);
        vc::parse_datatype(o.vcast_gradients);
        vc::parse_round_mode(o.vcast_round);
        vc::parse_round_mode(o.vcast_grad_round);
        vc::VcastOptions v;
        v.scale = vc::parse_scale_mode(o.vcast_scale_mode);
        vc::parse_sparsity(o.vcast_sparsity, &v.sparse_m, &v.sparse_n);
        vc::check_options(w, v);
    } catch (const llmc::InputError& e) {
        llmc::input_error("%s (flags -qw -qa -qg -qr -qgr -qs -qsp)", e.what());
    }
    check_telemetry(o, has_output_dir);
}
