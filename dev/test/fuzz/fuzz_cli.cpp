// fuzz_cli.cpp: the command line (llmc/cli.h: parse_args, validate_config, parse_model_descriptor,
// check_seq_len; llmc/process_group.h: resolve_processes, split_host_port; the recipe's
// check_recipe_options) on arbitrary bytes, as the trainer's main() calls them.
//
// The input is split at NUL bytes into strings. The first byte picks the recipe flag table (0: none, as
// a parser of the trainer's flags alone; 1..7: bf16, fp8, nvfp4, q115, tcfp12, vcast, example). A
// string "%NAME=VALUE" becomes the environment variable NAME of a fake environment (the launchers'
// LLMC_WORLD_SIZE, SLURM_PROCID, ...); every other string is an argument. -h and --help print the
// usage and exit(0), which is their job, so inputs with them are skipped.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "llmc/cli.h"
#include "llmc/process_group.h"
#include "llmc/recipes/bf16/options.h"
#include "llmc/recipes/example/options.h"
#include "llmc/recipes/fp8/options.h"
#include "llmc/recipes/nvfp4/options.h"
#include "llmc/recipes/q115/options.h"
#include "llmc/recipes/tcfp12/options.h"
#include "llmc/recipes/vcast/options.h"

namespace {

std::map<std::string, std::string> g_env;

const char* fake_getenv(const char* name) {
    auto it = g_env.find(name);
    return it == g_env.end() ? nullptr : it->second.c_str();
}

// main()'s first block: parse, resolve the processes, validate, the recipe's own checks
template <class Options>
void run_cli(const char* recipe, std::vector<char*>& argv) {
    Options options;
    llmc::RecipeFlags flags{recipe ? recipe : "", {}};
    if (recipe) append_recipe_flags(flags.rows, options);
    llmc::TrainConfig cfg = llmc::parse_args((int)argv.size() - 1, argv.data(), flags);
    llmc::resolve_processes(cfg, fake_getenv);
    llmc::validate_config(cfg);
    if (recipe) check_recipe_options(options, !cfg.output_dir.empty());
    // the next checks of main() that need no file: the model descriptor, -t against it, -ps's HOST:PORT
    llmc::ModelShape shape;
    if (llmc::parse_model_descriptor(cfg.model, &shape)) llmc::check_seq_len(cfg, shape);
    if (!cfg.init_server.empty()) {
        std::string host;
        int port = 0;
        llmc::split_host_port(cfg.init_server, &host, &port);
        if (port < 1 || port > 65535) std::abort();
    }
    // what validate_config promises the rest of the trainer
    const long long micro = (long long)cfg.B * cfg.T * cfg.num_processes;
    if (cfg.grad_accum_steps < 1 || (cfg.total_batch_size != -1 && micro * cfg.grad_accum_steps != cfg.total_batch_size))
        std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const int table = data[0] % 8;
    std::vector<std::string> args = {"train_gpt_fuzz"};
    g_env.clear();
    std::string cur;
    auto finish = [&] {
        if (cur.size() > 1 && cur[0] == '%' && cur.find('=') != std::string::npos) {
            const size_t eq = cur.find('=');
            g_env[cur.substr(1, eq - 1)] = cur.substr(eq + 1);
        } else {
            if (cur == "-h" || cur == "--help") return false;
            args.push_back(cur);
        }
        cur.clear();
        return true;
    };
    for (size_t i = 1; i < size; i++) {
        if (data[i] == 0) {
            if (!finish()) return 0;
        } else {
            cur += (char)data[i];
        }
    }
    if (!cur.empty() && !finish()) return 0;
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    try {
        switch (table) {
            case 0: run_cli<Bf16Options>(nullptr, argv); break;
            case 1: run_cli<Bf16Options>("bf16", argv); break;
            case 2: run_cli<Fp8Options>("fp8", argv); break;
            case 3: run_cli<Nvfp4Options>("nvfp4", argv); break;
            case 4: run_cli<Q115Options>("q115", argv); break;
            case 5: run_cli<Tcfp12RecipeOptions>("tcfp12", argv); break;
            case 6: run_cli<VcastRecipeOptions>("vcast", argv); break;
            default: run_cli<ExampleOptions>("example", argv); break;
        }
    } catch (const llmc::InputError&) {
    }
    return 0;
}
