// cli.h: the trainer's command line: its flags, their defaults, parsing and validation. The recipe's
// flags are rows the trainer passes in (RecipeFlags): each recipe declares and checks its own
// (llmc/recipes/<name>/options.h), so a binary takes the flags of its recipe and no other's.
//
// Flags follow llm.c's train_gpt2.cu (-i -j -o -e -b -t -d -l -u -k -q -c -x -v -m -s -g -r -n -nk -y)
// plus a few of our own (-sd seed, -gc gradient clip, -tk tokenizer file, -Q recipe check).
// Parsing and validation never touch the GPU: a bad flag reads the same on a machine without one.
#pragma once
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "common.h"
#include "flags.h"
#include "spike_guard.h"

// the model a binary trains without -e (train_gpt3q115cu is built with "gpt3:c768")
#ifndef LLMC_DEFAULT_MODEL
#define LLMC_DEFAULT_MODEL "d12"
#endif

namespace llmc {

// The shape of a GPT model. Vocab 50257 padded to a multiple of 128 (50304) for the matmuls.
struct ModelShape {
    int max_seq_len = 1024;      // maxT
    int vocab_size = 50257;      // V
    int padded_vocab_size = 50304; // Vp
    int num_layers = 12;         // L
    int num_heads = 12;          // NH
    int channels = 768;          // C
};

// Limits on the sizes of a step. validate_config checks each flag against its limit before any product
// of them is formed, then each product against its own, so no size arithmetic can overflow:
//   B, T <= 2^20 each; B*T <= 2^28, since the trainer indexes a micro-batch's token buffers with 32-bit
//   ints (3*B*T+1 of them for the embedding backward); processes <= 2^16; tokens per optimizer step
//   (B*T*processes*accumulation, -d) <= 2^40, so the data loader's offsets (chunk * -d) fit in 64 bits;
//   gradient accumulation steps <= 2^20.
// Real runs are far below all of these (GPU memory refuses long before); they exist to turn an absurd
// value into a clear error instead of a wrapped number.
constexpr int kMaxMicroBatch = 1 << 20;               // -b
constexpr int kMaxSeqLen = 1 << 20;                   // -t (the model's own maximum is checked later)
constexpr long long kMaxMicroBatchTokens = 1LL << 28; // B*T
constexpr int kMaxProcesses = 1 << 16;                // -pn
constexpr long long kMaxBatchTokens = 1LL << 40;      // B*T*processes, and -d
constexpr int kMaxGradAccumSteps = 1 << 20;           // -d / (B*T*processes)
// -pt: the id exchange waits in poll(), whose timeout is an int of milliseconds (2^31 ms is 24 days)
constexpr int kMaxCommTimeout = 7 * 24 * 3600;

// Everything the trainer can be told. Defaults are the project's loss protocol
// (d12 on tiny-shakespeare, doc/protocol.md), so `./train_gpt_bf16` alone trains it.
struct TrainConfig {
    // data and model
    std::string train_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"; // -i (glob)
    std::string val_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin";     // -j (glob; "" = no validation)
    std::string model = LLMC_DEFAULT_MODEL; // -e: descriptor (d12, gpt2:d24, gpt3:c768, ...) or llm.c checkpoint path
    std::string output_dir = "";          // -o: main.log and checkpoints go here ("" = none)
    std::string tokenizer_path = "dev/data/gpt2_tokenizer.bin"; // -tk: for decoding samples
    std::string recipe_check = "";        // -Q: fail unless this binary is that recipe ("" = no check)
    // batch
    int B = 8;                            // -b: micro-batch size (sequences)
    int T = 1024;                         // -t: sequence length
    long long total_batch_size = -1;      // -d: tokens per optimizer step (-1 = B*T*processes, no accumulation)
    // optimizer and schedule
    float learning_rate = 6e-4f;          // -l
    int warmup_iterations = 50;           // -u
    std::string lr_schedule = "cosine";   // -k: cosine | linear | constant | wsd
    float final_lr_fraction = 0.1f;       // -q: final lr = lr * q
    float weight_decay = 0.1f;            // -c: AdamW decoupled weight decay (2-D tensors only)
    float grad_clip = 1.0f;               // -gc: clip the global gradient norm to this (0 = off)
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f; // AdamW (fixed, as llm.c)
    float skip_loss_z = 0.0f;             // -sl: skip the update of a step whose loss is this many std above the window's mean (0 = off)
    float skip_grad_z = 0.0f;             // -sg: the same for the gradient norm (llmc/spike_guard.h)
    int max_steps = 1000;                 // -x: optimizer steps (-1 = one epoch of the training data)
    uint64_t seed = 0;                    // -sd: init, shuffling and stochastic rounding
    // evaluation, sampling, logging
    int val_every = 50;                   // -v: validate every N steps (0 = never)
    int val_max_steps = -1;               // -m: batches per validation (-1 = the whole split)
    int hellaswag = 0;                    // -h: 1 = HellaSwag accuracy at every validation step (a bare -h prints the help)
    std::string hellaswag_path = "dev/data/hellaswag/hellaswag_val.bin"; // -hf: its eval file (dev/data/hellaswag.py)
    int sample_every = 200;               // -s: sample every N steps (0 = never)
    int gen_tokens = 64;                  // -g: tokens per sample
    // memory
    int recompute = -1;                   // -r: -1 auto (0 if it fits, else 1), 0 none, 1 recompute GELU, 2 GELU + LayerNorm in backward
    int gemm_autotune = 1;                // -ga: 1 = time cuBLASLt's candidate algorithms per GEMM shape, keep the fastest
    // checkpoints
    int checkpoint_every = 0;             // -n: write a checkpoint every N steps (0 = only at the end if -o)
    int checkpoint_keep = 0;              // -nk: keep the newest K checkpoints (0 = keep all)
    int resume = 0;                       // -y: 1 = resume from the newest complete checkpoint in -o
    int overwrite = 0;                    // -ow: 1 = a new run (-y 0) deletes the run -o holds (main.log, checkpoints)
    int convert_recipe = 0;               // -cr: 1 = resume another recipe's checkpoint under this one
    // several processes, one GPU each (llmc/process_group.h): -pn and -pr, or what a launcher puts in
    // the environment (scripts/launch.sh, mpirun, srun); the NCCL id goes through -pf or -ps
    int num_processes = 0;                // -pn: processes in the run (0 = from the environment, else 1)
    int process_rank = -1;                // -pr: this process's rank (-1 = from the environment, else 0)
    int gpus_per_node = 0;                // -pg: GPUs per node: GPU = rank % pg (0 = the launcher's local rank)
    std::string init_method = "";         // -pi: how the NCCL id travels: fs | tcp ("" = from -pf / -ps)
    std::string init_dir = "";            // -pf: fs: a directory every process sees, fresh for each run
    std::string init_server = "";         // -ps: tcp: HOST:PORT where rank 0 listens
    int zero_stage = 1;                   // -z: 0 = all-reduce the gradients, 1 = ZeRO-1 (sharded optimizer state)
    int comm_timeout = 30;                // -pt: seconds a collective may wait for another process
    // derived (filled by validate_config; not flags)
    int grad_accum_steps = 1;
};

// The flags of the binary's recipe: its name and the rows of its options (llmc/recipes/<name>/options.h:
// append_recipe_flags), which parse_args fills and usage() prints under a heading naming the recipe.
// For usage(), the rows point at a default-constructed options struct (it prints their values as the
// defaults). Empty: a parser of the trainer's own flags alone.
struct RecipeFlags {
    std::string recipe;   // "fp8": the binary is train_gpt_fp8
    std::vector<Flag> rows;
};

// ---- implemented below ----
// parse_args: fills a TrainConfig, and the recipe's options through its rows, from argv. "--help", and a
// bare "-h" (the last argument, or one not followed by an integer), print usage(recipe) to stdout and exit 0
// (before any value is parsed, so the rows still hold the defaults); "-h 1" turns HellaSwag on, as llm.c's
// -h does. An unknown flag (another recipe's too), a flag without a value, or a value that does not parse
// throws InputError naming the flag.
// validate_config: range checks that need no files (B>0, T>0, -k known, -d divisible by B*T*processes, ...);
// fills grad_accum_steps. Throws InputError. (The recipe checks its own flags: check_recipe_options in
// its options.h, which the trainer calls next.)
// parse_model_descriptor: "d6|d12|d24|d36|d48", "gpt2:dN" (same), "gpt3:cC"; returns false if `s` is not
// a descriptor (then it is taken as a checkpoint path); throws InputError for a malformed descriptor.
// check_seq_len: -t must fit the model, which is only known once -e is resolved (descriptor or file).
// describe_models: the table of every descriptor with its shape and parameter count (part of usage()).
inline TrainConfig parse_args(int argc, char** argv, const RecipeFlags& recipe = RecipeFlags());
inline void validate_config(TrainConfig& cfg);
inline bool parse_model_descriptor(const std::string& s, ModelShape* shape);
inline void check_seq_len(const TrainConfig& cfg, const ModelShape& shape);
inline std::string describe_models();
inline std::string usage(const RecipeFlags& recipe_defaults = RecipeFlags());

// ============================================================================================
// implementation
// ============================================================================================

namespace cli_detail {

// One row per flag of the trainer (flags.h). parse_args and usage() both walk this table, so a flag
// cannot be parsed without being documented, and the printed default is read from a
// default-constructed TrainConfig, so the help text cannot drift from the real defaults.
inline std::vector<Flag> flag_table(TrainConfig& c) {
    using K = FlagKind;
    return {
        {"-i", K::Str, &c.train_pattern, "training token shards (glob pattern)"},
        {"-j", K::Str, &c.val_pattern, "validation token shards (glob pattern; \"\" = no validation)"},
        {"-e", K::Str, &c.model, "model: a descriptor from the table below, or an llm.c model file to start from"},
        {"-o", K::Str, &c.output_dir, "output directory for main.log and checkpoints (\"\" = write nothing)"},
        {"-tk", K::Str, &c.tokenizer_path, "GPT-2 tokenizer file, used to decode samples"},
        {"-Q", K::Str, &c.recipe_check, "fail unless this binary's recipe is NAME (q115 also answers to 115 and then checks its device boundaries) (\"\" = no check)"},
        {"-b", K::Int, &c.B, "micro-batch size, in sequences"},
        {"-t", K::Int, &c.T, "sequence length, in tokens"},
        {"-d", K::Int64, &c.total_batch_size, "tokens per optimizer step; must be a multiple of B*T*processes (-1 = B*T*processes)"},
        {"-l", K::Float, &c.learning_rate, "peak learning rate"},
        {"-u", K::Int, &c.warmup_iterations, "linear warmup steps"},
        {"-k", K::Str, &c.lr_schedule, "learning rate schedule after warmup: cosine | linear | constant | wsd"},
        {"-q", K::Float, &c.final_lr_fraction, "final learning rate as a fraction of -l, in [0, 1]"},
        {"-c", K::Float, &c.weight_decay, "AdamW weight decay (applied to 2-D weights only)"},
        {"-gc", K::Float, &c.grad_clip, "clip the global gradient norm to this (0 = off)"},
        {"-sl", K::Float, &c.skip_loss_z, "skip the update of a step whose loss lies more than this many standard deviations above the mean of the last 128 accepted steps (0 = off; a NaN/Inf loss or gradient norm always skips)"},
        {"-sg", K::Float, &c.skip_grad_z, "the same for the global gradient norm (0 = off)"},
        {"-x", K::Int, &c.max_steps, "optimizer steps (-1 = one epoch of the training data)"},
        {"-sd", K::U64, &c.seed, "random seed for init, data shuffling and stochastic rounding"},
        {"-v", K::Int, &c.val_every, "validate every N steps (0 = never)"},
        {"-m", K::Int, &c.val_max_steps, "batches per validation (-1 = the whole split)"},
        {"-h", K::Int, &c.hellaswag, "1 = HellaSwag accuracy (acc_norm) at every validation step, from -hf (needs -v > 0, -b >= 4); a bare -h prints this help"},
        {"-hf", K::Str, &c.hellaswag_path, "HellaSwag eval file for -h 1 (dev/data/hellaswag.py writes it)"},
        {"-s", K::Int, &c.sample_every, "generate a sample every N steps (0 = never)"},
        {"-g", K::Int, &c.gen_tokens, "tokens per sample"},
        {"-r", K::Int, &c.recompute, "recompute in backward to save memory: -1 auto (0 when it fits, else 1), 0 none, 1 GELU, 2 GELU + LayerNorm"},
        {"-ga", K::Int, &c.gemm_autotune, "1 = time cuBLASLt's candidate algorithms at each GEMM shape's first use and keep the fastest; 0 = the heuristic's first (fresh runs bit-reproducible)"},
        {"-n", K::Int, &c.checkpoint_every, "write a checkpoint every N steps (0 = only at the end; needs -o)"},
        {"-nk", K::Int, &c.checkpoint_keep, "keep only the newest K checkpoints (0 = keep all)"},
        {"-y", K::Int, &c.resume, "1 = resume from the newest complete checkpoint in -o"},
        {"-ow", K::Int, &c.overwrite, "1 = start afresh in an -o that holds a run, deleting its main.log and checkpoints"},
        {"-cr", K::Int, &c.convert_recipe, "1 = resume a checkpoint of another recipe, or of this one under other recipe settings (its recipe state starts afresh)"},
        {"-pn", K::Int, &c.num_processes, "processes (one GPU each) in a data-parallel run (0 = from the launcher's environment, else 1)"},
        {"-pr", K::Int, &c.process_rank, "this process's rank in [0, -pn) (-1 = from the launcher's environment)"},
        {"-pg", K::Int, &c.gpus_per_node, "GPUs per node: this process uses GPU rank % pg (0 = the launcher's local rank)"},
        {"-pi", K::Str, &c.init_method, "how the processes exchange the NCCL id: fs (-pf) or tcp (-ps) (\"\" = whichever is given)"},
        {"-pf", K::Str, &c.init_dir, "fs: a directory all processes see, fresh for each run"},
        {"-ps", K::Str, &c.init_server, "tcp: HOST:PORT where rank 0 listens for the others"},
        {"-z", K::Int, &c.zero_stage, "with several processes: 0 = all-reduce the gradients, 1 = ZeRO-1 (optimizer state sharded)"},
        {"-pt", K::Int, &c.comm_timeout, "seconds a collective may wait for another process before the run stops with an error"},
    };
}

inline const char* kind_placeholder(FlagKind k) {
    switch (k) {
        case FlagKind::Str: return "<str>";
        case FlagKind::Int: return "<int>";
        case FlagKind::Int64: return "<int>";
        case FlagKind::Float: return "<float>";
        case FlagKind::U64: return "<uint>";
    }
    return "";
}

inline std::string format_value(const Flag& f) {
    switch (f.kind) {
        case FlagKind::Str: return "\"" + *static_cast<const std::string*>(f.target) + "\"";
        case FlagKind::Int: return strfmt("%d", *static_cast<const int*>(f.target));
        case FlagKind::Int64: return strfmt("%lld", *static_cast<const long long*>(f.target));
        case FlagKind::Float: return strfmt("%g", (double)*static_cast<const float*>(f.target));
        case FlagKind::U64: return strfmt("%llu", (unsigned long long)*static_cast<const uint64_t*>(f.target));
    }
    return "";
}

// strtoll/strtof skip leading whitespace and stop at the first bad character; we want the whole
// value to be a number, so "4x", " 4" and "" are all rejected.
inline bool starts_cleanly(const char* text) {
    return text[0] != '\0' && !std::isspace((unsigned char)text[0]);
}

inline long long parse_integer(const char* flag, const char* text, long long lo, long long hi) {
    if (!starts_cleanly(text)) input_error("%s: expected an integer, got '%s'", flag, text);
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0') input_error("%s: expected an integer, got '%s'", flag, text);
    if (errno == ERANGE || v < lo || v > hi)
        input_error("%s: %s is out of range (must be between %lld and %lld)", flag, text, lo, hi);
    return v;
}

inline uint64_t parse_unsigned(const char* flag, const char* text) {
    // strtoull accepts "-1" and wraps it to 2^64-1; a seed should be written as what it is.
    if (!starts_cleanly(text) || text[0] == '-')
        input_error("%s: expected a non-negative integer, got '%s'", flag, text);
    errno = 0;
    char* end = nullptr;
    unsigned long long v = std::strtoull(text, &end, 10);
    if (end == text || *end != '\0') input_error("%s: expected a non-negative integer, got '%s'", flag, text);
    if (errno == ERANGE) input_error("%s: %s is out of range (must fit in 64 bits)", flag, text);
    return (uint64_t)v;
}

inline float parse_float(const char* flag, const char* text) {
    if (!starts_cleanly(text)) input_error("%s: expected a number, got '%s'", flag, text);
    errno = 0;
    char* end = nullptr;
    float v = std::strtof(text, &end);
    if (end == text || *end != '\0') input_error("%s: expected a number, got '%s'", flag, text);
    // strtof also accepts "nan" and "inf"; no flag of ours means anything with those.
    if (errno == ERANGE) input_error("%s: %s is out of range for a float", flag, text);
    if (!std::isfinite(v)) input_error("%s: expected a finite number, got '%s'", flag, text);
    return v;
}

inline void set_flag(const Flag& f, const char* text) {
    switch (f.kind) {
        case FlagKind::Str: *static_cast<std::string*>(f.target) = text; break;
        case FlagKind::Int: *static_cast<int*>(f.target) = (int)parse_integer(f.name, text, INT32_MIN, INT32_MAX); break;
        case FlagKind::Int64: *static_cast<long long*>(f.target) = parse_integer(f.name, text, INT64_MIN, INT64_MAX); break;
        case FlagKind::Float: *static_cast<float*>(f.target) = parse_float(f.name, text); break;
        case FlagKind::U64: *static_cast<uint64_t*>(f.target) = parse_unsigned(f.name, text); break;
    }
}

// The named model sizes. GPT-2's are the released checkpoints (d12 = 124M ... d48 = 1558M) plus a
// small d6 for quick runs; GPT-3's are the sizes of Table 2.1 of the GPT-3 paper, keyed by width.
struct ModelPreset {
    const char* name;
    int L, C, NH, maxT;
    const char* note;
};

inline const std::vector<ModelPreset>& gpt2_presets() {
    static const std::vector<ModelPreset> p = {
        {"d6", 6, 384, 6, 1024, "small, for quick tests"},
        {"d12", 12, 768, 12, 1024, "GPT-2 124M"},
        {"d24", 24, 1024, 16, 1024, "GPT-2 350M"},
        {"d36", 36, 1280, 20, 1024, "GPT-2 774M"},
        {"d48", 48, 1600, 25, 1024, "GPT-2 1558M"},
    };
    return p;
}

inline const std::vector<ModelPreset>& gpt3_presets() {
    static const std::vector<ModelPreset> p = {
        {"c768", 12, 768, 12, 2048, "GPT-3 Small 125M"},
        {"c1024", 24, 1024, 16, 2048, "GPT-3 Medium 350M"},
        {"c1536", 24, 1536, 12, 2048, "GPT-3 Large 760M"},
        {"c2048", 24, 2048, 16, 2048, "GPT-3 XL 1.3B"},
        {"c2560", 32, 2560, 20, 2048, "GPT-3 2.7B"},
        {"c4096", 32, 4096, 32, 2048, "GPT-3 6.7B"},
        {"c5120", 40, 5120, 40, 2048, "GPT-3 13B"},
        {"c12288", 96, 12288, 96, 2048, "GPT-3 175B"},
    };
    return p;
}

inline ModelShape preset_shape(const ModelPreset& p) {
    ModelShape s;  // vocab 50257 padded to 50304 for both families
    s.max_seq_len = p.maxT;
    s.num_layers = p.L;
    s.channels = p.C;
    s.num_heads = p.NH;
    return s;
}

inline const ModelPreset* find_preset(const std::vector<ModelPreset>& table, const std::string& name) {
    for (const ModelPreset& p : table)
        if (name == p.name) return &p;
    return nullptr;
}

inline bool is_d_number(const std::string& s) {
    if (s.size() < 2 || s[0] != 'd') return false;
    for (size_t i = 1; i < s.size(); i++)
        if (!std::isdigit((unsigned char)s[i])) return false;
    return true;
}

inline std::string valid_descriptors() {
    std::string out;
    for (const ModelPreset& p : gpt2_presets()) out += std::string(out.empty() ? "" : " ") + p.name;
    out += " (also as gpt2:dN)";
    for (const ModelPreset& p : gpt3_presets()) out += std::string(" gpt3:") + p.name;
    return out;
}

// same formula as checkpoint.h's num_parameters (kept here so cli.h stands alone):
// token + position embeddings, L blocks of (12C^2 + 13C), final LayerNorm.
inline unsigned long long shape_params(const ModelShape& s) {
    unsigned long long C = (unsigned long long)s.channels, L = (unsigned long long)s.num_layers;
    return (unsigned long long)s.padded_vocab_size * C + (unsigned long long)s.max_seq_len * C +
           L * (12 * C * C + 13 * C) + 2 * C;
}

inline std::string with_commas(unsigned long long v) {
    std::string digits = strfmt("%llu", v), out;
    for (size_t i = 0; i < digits.size(); i++) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

} // namespace cli_detail

inline TrainConfig parse_args(int argc, char** argv, const RecipeFlags& recipe) {
    TrainConfig cfg;
    // Help wins over everything else on the line, so "-b 4x -h" still shows the help. -h is also llm.c's
    // HellaSwag switch: followed by an integer ("-h 1", "-h 0") it is that flag, parsed below.
    auto is_integer = [](const char* s) {
        size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
        if (s[i] == '\0') return false;
        for (; s[i] != '\0'; i++)
            if (!std::isdigit((unsigned char)s[i])) return false;
        return true;
    };
    for (int i = 1; i < argc; i++) {
        const bool bare_h = std::strcmp(argv[i], "-h") == 0 && (i + 1 >= argc || !is_integer(argv[i + 1]));
        if (bare_h || std::strcmp(argv[i], "--help") == 0) {
            std::fputs(usage(recipe).c_str(), stdout);
            std::fflush(stdout);
            std::exit(0);
        }
    }
    std::vector<Flag> flags = cli_detail::flag_table(cfg);
    flags.insert(flags.end(), recipe.rows.begin(), recipe.rows.end());
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        const Flag* flag = nullptr;
        for (const Flag& f : flags)
            if (std::strcmp(arg, f.name) == 0) flag = &f;
        if (!flag) {
            // (another recipe's flag lands here too: each binary knows only its own recipe's)
            if (arg[0] == '-' && !recipe.recipe.empty())
                input_error("unknown flag '%s': not a flag of the %s recipe (train_gpt_%s -h lists them)", arg,
                            recipe.recipe.c_str(), recipe.recipe.c_str());
            if (arg[0] == '-') input_error("unknown flag '%s' (run with -h to list the flags)", arg);
            input_error("unexpected argument '%s': flags are given as -X value (run with -h to list them)", arg);
        }
        // The value is always the next argument, even if it starts with '-': "-x -1" is a value.
        if (i + 1 >= argc)
            input_error("%s: missing value (expected %s)", arg, cli_detail::kind_placeholder(flag->kind));
        cli_detail::set_flag(*flag, argv[++i]);
    }
    return cfg;
}

inline void validate_config(TrainConfig& cfg) {
    // (-pn 0 and -pr -1 mean "from the environment": resolve_processes() fills them before this)
    if (cfg.num_processes == 0) cfg.num_processes = 1;
    if (cfg.process_rank == -1) cfg.process_rank = 0;
    if (cfg.num_processes > kMaxProcesses)
        input_error("-pn %d: at most %d processes take part in a run", cfg.num_processes, kMaxProcesses);
    if (cfg.num_processes < 1 || cfg.process_rank < 0 || cfg.process_rank >= cfg.num_processes)
        input_error("-pr %d: the process rank must be in [0, %d) for -pn %d; check the launcher's settings",
                    cfg.process_rank, cfg.num_processes, cfg.num_processes);
    if (cfg.gpus_per_node < 0) input_error("-pg %d: must be >= 0 (0 = the launcher's local rank)", cfg.gpus_per_node);
    if (cfg.zero_stage != 0 && cfg.zero_stage != 1)
        input_error("-z %d: the ZeRO stage must be 0 (all-reduce) or 1 (sharded optimizer state)", cfg.zero_stage);
    if (cfg.comm_timeout < 1 || cfg.comm_timeout > kMaxCommTimeout)
        input_error("-pt %d: the collective timeout must be between 1 and %d seconds (a week)", cfg.comm_timeout,
                    kMaxCommTimeout);
    if (!cfg.init_method.empty() && cfg.init_method != "fs" && cfg.init_method != "tcp")
        input_error("-pi %s: unknown init method; use fs (with -pf DIR) or tcp (with -ps HOST:PORT)", cfg.init_method.c_str());
    if (cfg.init_method == "fs" && cfg.init_dir.empty())
        input_error("-pi fs: the NCCL id goes through a shared directory; pass it with -pf DIR");
    if (cfg.init_method == "tcp" && cfg.init_server.empty())
        input_error("-pi tcp: rank 0 listens at HOST:PORT; pass it with -ps");
    if (cfg.num_processes > 1 && cfg.init_method.empty() && cfg.init_dir.empty() && cfg.init_server.empty())
        input_error("-pn %d: several processes exchange the NCCL id through a shared directory (-pf DIR) or rank 0's "
                    "address (-ps HOST:PORT); scripts/launch.sh passes one for you", cfg.num_processes);
    if (cfg.train_pattern.empty()) input_error("-i: a training data pattern is required");
    if (cfg.model.empty()) input_error("-e: a model descriptor or checkpoint file is required");
    if (cfg.B < 1 || cfg.B > kMaxMicroBatch)
        input_error("-b %d: the micro-batch size must be between 1 and %d", cfg.B, kMaxMicroBatch);
    if (cfg.T < 1 || cfg.T > kMaxSeqLen)
        input_error("-t %d: the sequence length must be between 1 and %d", cfg.T, kMaxSeqLen);

    // Every product below is of factors already bounded above, so it fits in 64 bits before it is
    // compared with its own limit (B*T <= 2^40, B*T*P <= 2^56).
    const long long tokens_per_process = (long long)cfg.B * cfg.T;
    if (tokens_per_process > kMaxMicroBatchTokens)
        input_error("-b %d -t %d: a micro-batch of B*T = %lld tokens is more than the %lld one process can hold; "
                    "lower -b or -t", cfg.B, cfg.T, tokens_per_process, kMaxMicroBatchTokens);
    // tokens consumed by one forward/backward across all processes
    const long long tokens_per_micro = tokens_per_process * cfg.num_processes;
    if (tokens_per_micro > kMaxBatchTokens)
        input_error("-b %d -t %d -pn %d: B*T*processes = %lld tokens per micro-step is more than the %lld tokens an "
                    "optimizer step may have; lower -b, -t or the process count",
                    cfg.B, cfg.T, cfg.num_processes, tokens_per_micro, kMaxBatchTokens);
    if (cfg.total_batch_size == -1) {
        cfg.grad_accum_steps = 1;
    } else {
        if (cfg.total_batch_size <= 0 || cfg.total_batch_size > kMaxBatchTokens)
            input_error("-d %lld: the total batch size must be between 1 and %lld tokens, or -1 for B*T*processes",
                        cfg.total_batch_size, kMaxBatchTokens);
        // both at most kMaxBatchTokens: the quotient and the suggestion below stay far from overflow
        const long long accum = cfg.total_batch_size / tokens_per_micro;
        if (cfg.total_batch_size % tokens_per_micro != 0) {
            // suggest the nearest multiple (never zero, never past the limits) so the user can copy it straight back in
            long long k = (cfg.total_batch_size + tokens_per_micro / 2) / tokens_per_micro;
            if (k < 1) k = 1;
            if (k > kMaxGradAccumSteps) k = kMaxGradAccumSteps;
            if (k * tokens_per_micro > kMaxBatchTokens) k = accum;
            input_error("-d %lld: the total batch size must be a multiple of B*T*processes = %d*%d*%d = %lld; try -d %lld",
                        cfg.total_batch_size, cfg.B, cfg.T, cfg.num_processes, tokens_per_micro, k * tokens_per_micro);
        }
        if (accum > kMaxGradAccumSteps)
            input_error("-d %lld: that is %lld gradient accumulation steps of B*T*processes = %lld tokens per optimizer "
                        "step, more than the %d allowed; use a smaller -d or a larger -b",
                        cfg.total_batch_size, accum, tokens_per_micro, kMaxGradAccumSteps);
        cfg.grad_accum_steps = (int)accum;
    }

    if (cfg.learning_rate < 0) input_error("-l %g: the learning rate must be >= 0", (double)cfg.learning_rate);
    if (cfg.warmup_iterations < 0) input_error("-u %d: warmup steps must be >= 0", cfg.warmup_iterations);
    if (cfg.lr_schedule != "cosine" && cfg.lr_schedule != "linear" && cfg.lr_schedule != "constant" &&
        cfg.lr_schedule != "wsd")
        input_error("-k %s: unknown learning rate schedule; use one of cosine, linear, constant, wsd",
                    cfg.lr_schedule.c_str());
    if (cfg.final_lr_fraction < 0 || cfg.final_lr_fraction > 1)
        input_error("-q %g: the final learning rate fraction must be between 0 and 1", (double)cfg.final_lr_fraction);
    if (cfg.weight_decay < 0) input_error("-c %g: weight decay must be >= 0", (double)cfg.weight_decay);
    if (cfg.grad_clip < 0) input_error("-gc %g: the gradient clip must be >= 0 (0 turns it off)", (double)cfg.grad_clip);
    check_skip_threshold("-sl", cfg.skip_loss_z);
    check_skip_threshold("-sg", cfg.skip_grad_z);
    if (cfg.max_steps != -1 && cfg.max_steps < 1)
        input_error("-x %d: the number of steps must be at least 1, or -1 for one epoch", cfg.max_steps);
    if (cfg.val_every < 0) input_error("-v %d: must be >= 0 (0 = never validate)", cfg.val_every);
    if (cfg.val_max_steps != -1 && cfg.val_max_steps < 1)
        input_error("-m %d: validation batches must be at least 1, or -1 for the whole split", cfg.val_max_steps);
    if (cfg.hellaswag != 0 && cfg.hellaswag != 1) input_error("-h %d: HellaSwag is 0 (off) or 1 (on)", cfg.hellaswag);
    if (cfg.hellaswag == 1 && cfg.val_every == 0)
        input_error("-h 1: HellaSwag is scored at the validation steps, and -v 0 has none; pass -v N");
    if (cfg.hellaswag == 1 && cfg.hellaswag_path.empty()) input_error("-h 1: -hf names no eval file");
    if (cfg.sample_every < 0) input_error("-s %d: must be >= 0 (0 = never sample)", cfg.sample_every);
    if (cfg.gen_tokens < 0) input_error("-g %d: tokens per sample must be >= 0", cfg.gen_tokens);
    if (cfg.recompute < -1 || cfg.recompute > 2)
        input_error("-r %d: recompute must be -1 (auto), 0 (none), 1 (GELU) or 2 (GELU + LayerNorm)", cfg.recompute);
    if (cfg.gemm_autotune != 0 && cfg.gemm_autotune != 1) input_error("-ga %d: must be 0 or 1", cfg.gemm_autotune);
    if (cfg.checkpoint_every < 0) input_error("-n %d: must be >= 0 (0 = checkpoint only at the end)", cfg.checkpoint_every);
    if (cfg.checkpoint_keep < 0) input_error("-nk %d: must be >= 0 (0 = keep every checkpoint)", cfg.checkpoint_keep);
    if (cfg.resume != 0 && cfg.resume != 1) input_error("-y %d: resume must be 0 or 1", cfg.resume);
    if (cfg.convert_recipe != 0 && cfg.convert_recipe != 1) input_error("-cr %d: must be 0 or 1", cfg.convert_recipe);
    if (cfg.resume == 1 && cfg.output_dir.empty())
        input_error("-y 1: resuming needs the checkpoint directory; pass it with -o DIR");
    if (cfg.overwrite != 0 && cfg.overwrite != 1) input_error("-ow %d: must be 0 or 1", cfg.overwrite);
    if (cfg.overwrite == 1 && cfg.resume == 1)
        input_error("-ow 1 -y 1: resuming keeps the run in -o, -ow 1 deletes it; pass one of them");
}

inline bool parse_model_descriptor(const std::string& s, ModelShape* shape) {
    using namespace cli_detail;
    const ModelPreset* p = nullptr;
    bool looks_like_descriptor = false;
    if (s.compare(0, 5, "gpt2:") == 0) {
        looks_like_descriptor = true;
        p = find_preset(gpt2_presets(), s.substr(5));
    } else if (s.compare(0, 5, "gpt3:") == 0) {
        looks_like_descriptor = true;
        p = find_preset(gpt3_presets(), s.substr(5));
    } else if (is_d_number(s)) {
        // only the whole-string form "d<digits>" counts, so a file named "d12.bin" is still a path
        looks_like_descriptor = true;
        p = find_preset(gpt2_presets(), s);
    }
    if (!looks_like_descriptor) return false;
    if (!p) input_error("-e %s: unknown model descriptor; valid ones are %s", s.c_str(), valid_descriptors().c_str());
    if (shape) *shape = preset_shape(*p);
    return true;
}

inline void check_seq_len(const TrainConfig& cfg, const ModelShape& shape) {
    if (cfg.T > shape.max_seq_len)
        input_error("-t %d is longer than the model's maximum sequence length %d", cfg.T, shape.max_seq_len);
}

inline std::string describe_models() {
    using namespace cli_detail;
    std::string out = "models for -e (or give the path of an llm.c model file):\n";
    out += strfmt("  %-13s %4s %6s %4s %5s %5s %16s\n", "descriptor", "L", "C", "NH", "head", "maxT", "parameters");
    auto row = [&](const std::string& name, const ModelPreset& p) {
        ModelShape s = preset_shape(p);
        out += strfmt("  %-13s %4d %6d %4d %5d %5d %16s  %s\n", name.c_str(), p.L, p.C, p.NH, p.C / p.NH, p.maxT,
                      with_commas(shape_params(s)).c_str(), p.note);
    };
    for (const ModelPreset& p : gpt2_presets()) row(p.name, p);
    for (const ModelPreset& p : gpt3_presets()) row(std::string("gpt3:") + p.name, p);
    out += "  (gpt2:dN is the same as dN; all use vocab 50257, padded to 50304)\n";
    return out;
}

inline std::string usage(const RecipeFlags& recipe_defaults) {
    TrainConfig defaults;
    auto rows = [](const std::vector<Flag>& flags) {
        std::string out;
        for (const Flag& f : flags) {
            std::string lhs = std::string(f.name) + " " + cli_detail::kind_placeholder(f.kind);
            out += strfmt("  %-15s  %s (default %s)\n", lhs.c_str(), f.help, cli_detail::format_value(f).c_str());
        }
        return out;
    };
    std::string out = "usage: <trainer binary> [-flag value ...]   (every flag takes exactly one value)\n"
                      "  --help, -h       print this help (-h without a value; -h 1 is HellaSwag, below)\n";
    out += rows(cli_detail::flag_table(defaults));
    if (!recipe_defaults.recipe.empty()) {
        const char* name = recipe_defaults.recipe.c_str();
        if (recipe_defaults.rows.empty())
            out += strfmt("\nthe %s recipe (train_gpt_%s) has no flags of its own\n", name, name);
        else
            out += strfmt("\nflags of the %s recipe (train_gpt_%s; the other recipes' binaries refuse them):\n", name, name) +
                   rows(recipe_defaults.rows);
    }
    out += "\nenvironment variables (read at start):\n"
           "  LLMC_PROFILE=1|2              per-phase GPU time at the end of the run (2: each GEMM of the BF16 linears too)\n"
           "  LLMC_TCFP12_CONCAT=0|1        tcfp12: force the two FP8 GEMMs (0) or the one K-concatenated block-scaled GEMM\n"
           "                                (1, where built) instead of the per-shape timing (doc/recipes/tcfp12.md)\n"
           "  LLMC_FP8_FUSED_GEMM=0|1       fp8: the MLP's fused FP8 GEMMs on Hopper (1, the default) or cuBLASLt and the\n"
           "                                quantize passes (0; doc/recipes/fp8.md)\n"
           "  LLMC_NVFP4_EMULATE=1          nvfp4: the emulation even where FP4 tensor cores exist (doc/recipes/nvfp4.md)\n"
           "  LLMC_CUDNN_DETERMINISTIC=0    cuDNN attention builds: cuDNN's non-deterministic backward\n"
           "  LLMC_TEST_NAN_AT=loss:S,grad:S  tests only: a NaN in the loss / the gradients at optimizer step S (doc/testing.md)\n";
    out += "\n";
    out += describe_models();
    return out;
}

} // namespace llmc
