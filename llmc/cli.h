// cli.h: the trainer's command line: every flag, its default, parsing and validation.
//
// Flags follow llm.c's train_gpt2.cu (-i -j -o -e -b -t -d -l -u -k -q -c -x -v -m -s -g -r -n -nk -y)
// plus a few of our own (-sd seed, -gc gradient clip, -tk tokenizer file, -Q recipe check).
// Parsing and validation never touch the GPU: a bad flag reads the same on a machine without one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "common.h"

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

// Everything the trainer can be told. Defaults are the project's loss protocol
// (d12 on tiny-shakespeare, doc/protocol.md), so `./train_gpt_bf16` alone trains it.
struct TrainConfig {
    // data and model
    std::string train_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"; // -i (glob)
    std::string val_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin";     // -j (glob; "" = no validation)
    std::string model = "d12";            // -e: descriptor (d12, gpt2:d24, gpt3:c768, ...) or llm.c checkpoint path
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
    int max_steps = 1000;                 // -x: optimizer steps (-1 = one epoch of the training data)
    uint64_t seed = 0;                    // -sd: init, shuffling and stochastic rounding
    // evaluation, sampling, logging
    int val_every = 50;                   // -v: validate every N steps (0 = never)
    int val_max_steps = -1;               // -m: batches per validation (-1 = the whole split)
    int sample_every = 200;               // -s: sample every N steps (0 = never)
    int gen_tokens = 64;                  // -g: tokens per sample
    // memory
    int recompute = 1;                    // -r: 0 none, 1 recompute GELU, 2 GELU + LayerNorm in backward
    // checkpoints
    int checkpoint_every = 0;             // -n: write a checkpoint every N steps (0 = only at the end if -o)
    int checkpoint_keep = 0;              // -nk: keep the newest K checkpoints (0 = keep all)
    int resume = 0;                       // -y: 1 = resume from the newest complete checkpoint in -o
    // derived (filled by validate_config; not flags)
    int num_processes = 1;
    int process_rank = 0;
    int grad_accum_steps = 1;
};

// ---- implemented below ----
// parse_args: fills a TrainConfig from argv. "-h"/"--help" prints usage() to stdout and exits 0.
// An unknown flag, a flag without a value, or a value that does not parse throws InputError naming the flag.
// validate_config: range checks that need no files (B>0, T>0, -k known, -d divisible by B*T*processes, ...);
// fills grad_accum_steps. Throws InputError.
// parse_model_descriptor: "d6|d12|d24|d36|d48", "gpt2:dN" (same), "gpt3:cC"; returns false if `s` is not
// a descriptor (then it is taken as a checkpoint path); throws InputError for a malformed descriptor.
TrainConfig parse_args(int argc, char** argv);
void validate_config(TrainConfig& cfg);
bool parse_model_descriptor(const std::string& s, ModelShape* shape);
std::string usage();

} // namespace llmc
