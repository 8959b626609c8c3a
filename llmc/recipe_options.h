// recipe_options.h: the command-line options of the precision recipes (no CUDA: cli.h includes it).
#pragma once
#include <string>
#include "formats/tcfp12.h"

// cli.h fills these from -fh -fm -sqf -sql -lq -rht -sr -fos -q* -t* (and -sd); a recipe ignores
// what it does not use.
struct RecipeOptions {
    int amax_history = 1024;     // -fh: delayed scaling's amax history length, in optimizer steps
    int scale_margin = 0;        // -fm: scale = FP8_MAX / max(amax history) / 2^margin
    int skip_first = -1;         // -sqf: keep the first N transformer layers in BF16 (-1: the recipe's default)
    int skip_last = -1;          // -sql: keep the last N transformer layers in BF16 (-1: the recipe's default)
    int telemetry_every = 0;     // -lq: quantization telemetry in main.log every N steps (0 = off)
    int fp4_rht = 1;             // -rht: nvfp4: random Hadamard transform of the wgrad operands
    int fp4_stochastic = 1;      // -sr: nvfp4: stochastic rounding of the gradients
    int fp4_four_over_six = 1;   // -fos: nvfp4: Four Over Six block scales
    int self_check = 0;          // set by -Q: the recipe checks its device code against the CPU codec at start (q115)
    unsigned long long seed = 0; // -sd: the run's seed (stochastic rounding streams, Hadamard signs)
    // vcast: TensorCast-style datatypes (llmc/formats/vcast.h) per role, and the cast options
    std::string vcast_weights = "mxfp8e4";     // -qw
    std::string vcast_activations = "mxfp8e4"; // -qa
    std::string vcast_gradients = "mxfp8e5";   // -qg
    std::string vcast_round = "even";          // -qr: weights and activations (nearest|even|zero|stochastic)
    std::string vcast_grad_round = "even";     // -qgr: gradients
    std::string vcast_scale_mode = "max";      // -qs: max | midmax
    std::string vcast_sparsity = "";           // -qsp: M:N sparsity of the weights ("" = off)
    // tcfp12 (llmc/formats/tcfp12.h): the split's options, and the weight gradient's precision
    int tcfp_block = 0;          // -tb: 0 (one scale pair per tensor), 32, 64, 128
    int tcfp_ef = -1;            // -tef: error feedback (-1: on unless SRR)
    int tcfp_srr = 0;            // -tsrr: stochastic rounding of W_lo instead of the EF buffer
    int tcfp_pdds = 0;           // -tpdds: predictive dual-track delayed scaling
    int tcfp_abd = 0;            // -tabd: dgrad with W_hi alone
    int tcfp_fp8_wgrad = 0;      // -tfw: weight gradient on FP8 tensor cores (0: BF16, the seed's hp_grad_weight)
    int tcfp_fast_accum = 0;     // -tfa: Hopper's fast FP8 accumulation for the W_hi GEMMs too (W_lo's always)
    // not flags: ZeRO-1's owners of the optimizer state (zero.h), which gpt_allocate copies from the
    // model's shard layout: this process's place among them and their number (1 unless -z 1 over
    // several processes). TCFP-12 cuts its EF buffer the same way.
    int state_owner = 0;
    int state_owners = 1;
};

// A recipe's recipe_init replaces -1 (the flags' default) by its own default number of layers to
// keep in BF16.
inline void resolve_skip_defaults(RecipeOptions& o, int default_first, int default_last) {
    if (o.skip_first < 0) o.skip_first = default_first;
    if (o.skip_last < 0) o.skip_last = default_last;
}

// Layers [skip_first, L - skip_last) are quantized; the others run the plain BF16 linear.
inline bool layer_is_quantized(const RecipeOptions& o, int layer, int num_layers) {
    return layer >= o.skip_first && layer < num_layers - o.skip_last;
}

// The TCFP-12 split's options (formats/tcfp12.h) from the flags
inline llmc::Tcfp12Options tcfp12_options_of(const RecipeOptions& o) {
    llmc::Tcfp12Options t;
    t.block_size = o.tcfp_block;
    t.error_feedback = o.tcfp_ef;
    t.srr = o.tcfp_srr;
    t.pdds = o.tcfp_pdds;
    t.abd = o.tcfp_abd;
    return t;
}
