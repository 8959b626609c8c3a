// Tests for llmc/cli.h: flag parsing, validation, model descriptors and the help text.
#include <doctest/doctest.h>
#include "dev/test/cpu/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"  // num_parameters
#include "llmc/cli.h"
#include "llmc/recipes/bf16/options.h"
#include "llmc/recipes/fp8/options.h"
#include "llmc/recipes/nvfp4/options.h"
#include "llmc/recipes/q115/options.h"
#include "llmc/recipes/tcfp12/options.h"
#include "llmc/recipes/vcast/options.h"
#include "llmc/recipes/example/options.h"

using llmc::ModelShape;
using llmc::TrainConfig;

using test_util::contains;
using test_util::error_of;

namespace {

// parse_args on a command line given as strings; argv[0] is added here.
TrainConfig parse(const std::vector<std::string>& args) {
    std::vector<std::string> storage = {"train_gpt2"};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : storage) argv.push_back(&s[0]);
    argv.push_back(nullptr);
    return llmc::parse_args((int)storage.size(), argv.data());
}

TrainConfig validated(const std::vector<std::string>& args, int nprocs = 1) {
    TrainConfig c = parse(args);
    c.num_processes = nprocs;
    if (nprocs > 1) c.init_dir = "/tmp"; // (several processes need a way to exchange the NCCL id)
    llmc::validate_config(c);
    return c;
}

const std::vector<std::string> kAllFlags = {"-i", "-j", "-e", "-o", "-tk", "-Q", "-b", "-t", "-d",
                                            "-l", "-u", "-k", "-q", "-c", "-gc", "-x", "-sd", "-v",
                                            "-m", "-s", "-g", "-r", "-n", "-nk", "-y", "-pn", "-pr", "-pg",
                                            "-pi", "-pf", "-ps", "-z", "-pt"};

bool same_shape(const ModelShape& a, const ModelShape& b) {
    return a.max_seq_len == b.max_seq_len && a.vocab_size == b.vocab_size &&
           a.padded_vocab_size == b.padded_vocab_size && a.num_layers == b.num_layers &&
           a.num_heads == b.num_heads && a.channels == b.channels;
}

} // namespace

TEST_CASE("cli: no flags gives the defaults") {
    TrainConfig c = parse({});
    TrainConfig d;
    CHECK(c.train_pattern == d.train_pattern);
    CHECK(c.model == "d12");
    CHECK(c.B == 8);
    CHECK(c.T == 1024);
    CHECK(c.total_batch_size == -1);
    CHECK(c.learning_rate == doctest::Approx(6e-4));
    CHECK(c.lr_schedule == "cosine");
    CHECK(c.max_steps == 1000);
    CHECK(c.resume == 0);
    CHECK(c.gemm_autotune == 1);
    CHECK(c.recompute == -1); // auto: no recompute where the GELU outputs fit
}

TEST_CASE("cli: every flag parses into its field") {
    TrainConfig c = parse({"-i", "train_*.bin", "-j", "val_*.bin", "-e", "gpt3:c768", "-o", "out/run1",
                           "-tk", "tok.bin", "-Q", "bf16", "-b", "4", "-t", "512", "-d", "524288",
                           "-l", "0.0018", "-u", "700", "-k", "wsd", "-q", "0.05", "-c", "0.01",
                           "-gc", "0.5", "-x", "18000", "-sd", "18446744073709551615", "-v", "250",
                           "-m", "20", "-s", "0", "-g", "128", "-r", "2", "-n", "5000", "-nk", "3", "-y", "1", "-ga", "0"});
    CHECK(c.train_pattern == "train_*.bin");
    CHECK(c.val_pattern == "val_*.bin");
    CHECK(c.model == "gpt3:c768");
    CHECK(c.output_dir == "out/run1");
    CHECK(c.tokenizer_path == "tok.bin");
    CHECK(c.recipe_check == "bf16");
    CHECK(c.B == 4);
    CHECK(c.T == 512);
    CHECK(c.total_batch_size == 524288);
    CHECK(c.learning_rate == doctest::Approx(0.0018));
    CHECK(c.warmup_iterations == 700);
    CHECK(c.lr_schedule == "wsd");
    CHECK(c.final_lr_fraction == doctest::Approx(0.05));
    CHECK(c.weight_decay == doctest::Approx(0.01));
    CHECK(c.grad_clip == doctest::Approx(0.5));
    CHECK(c.max_steps == 18000);
    CHECK(c.seed == 18446744073709551615ULL);
    CHECK(c.val_every == 250);
    CHECK(c.val_max_steps == 20);
    CHECK(c.sample_every == 0);
    CHECK(c.gen_tokens == 128);
    CHECK(c.recompute == 2);
    CHECK(c.gemm_autotune == 0);
    CHECK(c.checkpoint_every == 5000);
    CHECK(c.checkpoint_keep == 3);
    CHECK(c.resume == 1);
}

TEST_CASE("cli: -Q asks the recipe for its self-check; without -e the model is the build's default") {
    TrainConfig c = parse({"-Q", "115", "-sd", "42"});
    CHECK(c.recipe_check == "115");
    validate_config(c);
    CHECK(recipe_context_of_run(c.seed, c.recipe_check).self_check == 1);
    CHECK(recipe_context_of_run(c.seed, c.recipe_check).seed == 42); // the run's seed goes to the recipe
    TrainConfig d = parse({});
    validate_config(d);
    CHECK(recipe_context_of_run(d.seed, d.recipe_check).self_check == 0);
    CHECK(d.model == "d12"); // LLMC_DEFAULT_MODEL (train_gpt3q115cu: gpt3:c768)
}

namespace {

// The flags of recipe NAME over options o, as its trainer passes them to parse_args
template <class Options>
llmc::RecipeFlags recipe_flags(const char* name, Options& o) {
    llmc::RecipeFlags f{name, {}};
    append_recipe_flags(f.rows, o);
    return f;
}

// parse_args of the trainer of recipe NAME, filling o; then validate_config and the recipe's own check
template <class Options>
TrainConfig parse_recipe(const char* name, Options& o, const std::vector<std::string>& args) {
    std::vector<std::string> storage = {std::string("train_gpt_") + name};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : storage) argv.push_back(&s[0]);
    argv.push_back(nullptr);
    return llmc::parse_args((int)storage.size(), argv.data(), recipe_flags(name, o));
}

template <class Options>
TrainConfig checked_recipe(const char* name, Options& o, const std::vector<std::string>& args) {
    TrainConfig c = parse_recipe(name, o, args);
    llmc::validate_config(c);
    check_recipe_options(o, !c.output_dir.empty());
    return c;
}

// the error of the recipe's parse and checks of args (the test fails if there is none)
template <class Options>
std::string recipe_error(const char* name, const std::vector<std::string>& args) {
    Options o;
    return error_of([&] { checked_recipe(name, o, args); });
}

// every recipe's flags, by name (a default-constructed options struct of each)
struct AllRecipes {
    Bf16Options bf16;
    Fp8Options fp8;
    Nvfp4Options nvfp4;
    Q115Options q115;
    Tcfp12RecipeOptions tcfp12;
    VcastRecipeOptions vcast;
    ExampleOptions example;
    std::vector<llmc::RecipeFlags> flags() {
        return {recipe_flags("bf16", bf16), recipe_flags("fp8", fp8), recipe_flags("nvfp4", nvfp4),
                recipe_flags("q115", q115), recipe_flags("tcfp12", tcfp12), recipe_flags("vcast", vcast),
                recipe_flags("example", example)};
    }
};

bool has_flag(const llmc::RecipeFlags& f, const std::string& name) {
    for (const llmc::Flag& row : f.rows)
        if (name == row.name) return true;
    return false;
}

} // namespace

TEST_CASE("cli: each recipe's flags: a binary takes its recipe's and refuses the others' in one line") {
    AllRecipes all;
    const std::vector<llmc::RecipeFlags> recipes = all.flags();
    std::vector<std::string> every_recipe_flag;
    for (const llmc::RecipeFlags& r : recipes)
        for (const llmc::Flag& row : r.rows) every_recipe_flag.push_back(row.name);
    CHECK(every_recipe_flag.size() > 20);
    for (const llmc::RecipeFlags& r : recipes) {
        for (const std::string& flag : every_recipe_flag) {
            CAPTURE(r.recipe);
            CAPTURE(flag);
            // a recipe flag is none of the trainer's own
            for (const std::string& own : kAllFlags) CHECK(flag != own);
            AllRecipes fresh;
            llmc::RecipeFlags mine;
            for (llmc::RecipeFlags& f : fresh.flags())
                if (f.recipe == r.recipe) mine = f;
            auto run = [&] {
                std::vector<std::string> storage = {"train_gpt_" + r.recipe, flag, "1"};
                std::vector<char*> argv;
                for (std::string& s : storage) argv.push_back(&s[0]);
                argv.push_back(nullptr);
                llmc::parse_args((int)storage.size(), argv.data(), mine);
            };
            if (has_flag(r, flag)) {
                CHECK_NOTHROW(run()); // parsed (its value is checked later, by the recipe)
            } else {
                const std::string msg = error_of(run);
                CHECK(msg == "unknown flag '" + flag + "': not a flag of the " + r.recipe + " recipe (train_gpt_" +
                                 r.recipe + " -h lists them)");
                CHECK(msg.find('\n') == std::string::npos);
            }
        }
    }
    // the recipes' flags as each binary has them
    CHECK(has_flag(recipes[0], "-sqf") == false); // bf16 keeps every layer in BF16 already: no flags
    CHECK(recipes[0].rows.empty());
    for (int k : {1, 2, 4, 5})
        for (const char* shared : {"-sqf", "-sql", "-lq"}) CHECK(has_flag(recipes[k], shared)); // the quantizing recipes
    CHECK(has_flag(recipes[3], "-lq"));  // q115: its boundaries' telemetry
    CHECK_FALSE(has_flag(recipes[3], "-sqf"));
    CHECK(has_flag(recipes[1], "-fh"));
    CHECK_FALSE(has_flag(recipes[2], "-fh"));
    CHECK(has_flag(recipes[4], "-tb"));
    CHECK(has_flag(recipes[5], "-qw"));
    // without a recipe (the trainer's own flags alone) an unknown flag reads as before
    CHECK(contains(error_of([] { parse({"-fh", "1"}); }), "unknown flag '-fh' (run with -h"));
}

TEST_CASE("cli: the fp8 flags parse into Fp8Options and are range-checked by the recipe") {
    Fp8Options o;
    TrainConfig c = checked_recipe("fp8", o, {"-fh", "16", "-fm", "2", "-sqf", "1", "-sql", "3", "-lq", "50", "-o", "out", "-cr", "1"});
    CHECK(o.amax_history == 16);
    CHECK(o.scale_margin == 2);
    CHECK(o.skip_first == 1);
    CHECK(o.skip_last == 3);
    CHECK(o.telemetry_every == 50);
    CHECK(c.convert_recipe == 1);
    Fp8Options d;
    CHECK(d.amax_history == 1024);
    CHECK(d.scale_margin == 0);
    CHECK(d.telemetry_every == 0);
    CHECK(d.skip_first == -1); // -1: each recipe's own default
    CHECK(d.skip_last == -1);
    Fp8Options r = d;
    resolve_skip_defaults(r, 0, 2);
    CHECK(r.skip_first == 0);
    CHECK(r.skip_last == 2);
    resolve_skip_defaults(o, 0, 2); // explicit values stay
    CHECK(o.skip_last == 3);
    for (auto bad : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"-fh", "0"}, "-fh 0"}, {{"-fh", "65537"}, "-fh 65537"}, {{"-fm", "-1"}, "-fm -1"}, {{"-sqf", "-2"}, "-sqf -2"},
             {{"-sql", "-2"}, "-sql -2"}, {{"-lq", "-1"}, "-lq -1"}, {{"-lq", "5"}, "needs -o"}, {{"-cr", "2"}, "-cr 2"}}) {
        const std::string msg = recipe_error<Fp8Options>("fp8", bad.first);
        CHECK_MESSAGE(contains(msg, bad.second), msg);
    }
    CHECK(layer_is_quantized(o, 0, 12) == false); // -sqf 1
    CHECK(layer_is_quantized(o, 1, 12) == true);
    CHECK(layer_is_quantized(o, 8, 12) == true);
    CHECK(layer_is_quantized(o, 9, 12) == false); // -sql 3: layers 9, 10, 11
}

TEST_CASE("cli: the fp8 scaling flags: -fs delayed by default, -fbg and -fp2 only with -fs block, -fh only with delayed, -fm not with block") {
    Fp8Options d;
    CHECK(d.scaling == "delayed");
    CHECK(fp8_scaling_mode(d) == FP8_SCALING_DELAYED);
    CHECK(d.block_grad_format == "e4m3");
    CHECK(d.pow2_scales == 0);
    Fp8Options c;
    CHECK_NOTHROW(checked_recipe("fp8", c, {"-fs", "current"}));
    CHECK(fp8_scaling_mode(c) == FP8_SCALING_CURRENT);
    Fp8Options b;
    CHECK_NOTHROW(checked_recipe("fp8", b, {"-fs", "block", "-fbg", "e5m2", "-fp2", "1"}));
    CHECK(fp8_scaling_mode(b) == FP8_SCALING_BLOCK);
    CHECK(fp8_block_grads_e5m2(b));
    CHECK(b.pow2_scales == 1);
    for (auto bad : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"-fs", "tensor"}, "-fs tensor"}, {{"-fs", "block", "-fbg", "e3m4"}, "-fbg e3m4"},
             {{"-fs", "block", "-fp2", "2"}, "-fp2 2"}, {{"-fbg", "e5m2"}, "-fs block"}, {{"-fs", "current", "-fp2", "1"}, "-fs block"},
             {{"-fs", "current", "-fh", "16"}, "-fh 16: the amax history is delayed scaling's"},
             {{"-fs", "block", "-fh", "16"}, "this run has -fs block"}, {{"-fs", "block", "-fm", "2"}, "-fm 2: the scale margin"}}) {
        const std::string msg = recipe_error<Fp8Options>("fp8", bad.first);
        CHECK_MESSAGE(contains(msg, bad.second), msg);
    }
    // what each mode does read
    Fp8Options m;
    CHECK_NOTHROW(checked_recipe("fp8", m, {"-fs", "current", "-fm", "2"}));
    Fp8Options h;
    CHECK_NOTHROW(checked_recipe("fp8", h, {"-fs", "delayed", "-fh", "16", "-fm", "1"}));
}

TEST_CASE("cli: -flh, the FP8 LM head: off by default, a switch, with every scaling mode") {
    Fp8Options d;
    CHECK(d.head == 0);
    for (const char* mode : {"delayed", "current", "block"}) {
        Fp8Options o;
        CHECK_NOTHROW(checked_recipe("fp8", o, {"-fs", mode, "-flh", "1"}));
        CHECK(o.head == 1);
    }
    const std::string msg = recipe_error<Fp8Options>("fp8", {"-flh", "2"});
    CHECK_MESSAGE(contains(msg, "-flh 2: must be 0 or 1"), msg);
}

TEST_CASE("cli: the nvfp4 flags: RHT, stochastic rounding and Four Over Six on by default, switches") {
    Nvfp4Options d;
    CHECK(d.fp4_rht == 1);
    CHECK(d.fp4_stochastic == 1);
    CHECK(d.fp4_four_over_six == 1);
    Nvfp4Options f;
    CHECK_NOTHROW(checked_recipe("nvfp4", f, {"-rht", "0", "-sr", "0", "-fos", "0", "-sd", "42"}));
    CHECK(f.fp4_rht == 0);
    CHECK(f.fp4_stochastic == 0);
    CHECK(f.fp4_four_over_six == 0);
    for (auto bad : std::vector<std::vector<std::string>>{{"-rht", "2"}, {"-sr", "-1"}, {"-fos", "7"}, {"-sqf", "-2"}, {"-lq", "5"}})
        CHECK(contains(recipe_error<Nvfp4Options>("nvfp4", bad), bad[0]));
}

TEST_CASE("cli: the vcast flags: MXFP8 by default, datatypes and cast options checked by the recipe") {
    VcastRecipeOptions d;
    CHECK(d.vcast_weights == "mxfp8e4"); // MXFP8: E4M3 forward, E5M2 gradients
    CHECK(d.vcast_gradients == "mxfp8e5");
    VcastRecipeOptions v;
    CHECK_NOTHROW(checked_recipe("vcast", v, {"-qw", "mxfp4e2", "-qa", "e5m6_e8m0_t32", "-qg", "bfp16", "-qr", "stochastic", "-qsp", "2:4"}));
    CHECK(v.vcast_weights == "mxfp4e2");
    CHECK(v.vcast_sparsity == "2:4");
    for (auto bad_vcast : std::vector<std::vector<std::string>>{{"-qw", "mxfp9e9"}, {"-qa", "e9m2"}, {"-qg", "int1"},
                                                                 {"-qr", "up"}, {"-qs", "min"}, {"-qsp", "3:5"},
                                                                 {"-qw", "bfp16", "-qsp", "4:16"}}) {
        const std::string msg = recipe_error<VcastRecipeOptions>("vcast", bad_vcast);
        CHECK_MESSAGE(contains(msg, "-qw -qa -qg"), msg);
    }
}

TEST_CASE("cli: the tcfp12 flags write the split's options, checked with its exclusions") {
    Tcfp12RecipeOptions d;
    CHECK(d.split.block_size == 0); // per tensor, EF unless SRR, BF16 wgrad
    CHECK(d.split.error_feedback == -1);
    CHECK(d.tcfp_fp8_wgrad == 0);
    CHECK(llmc::tcfp12_uses_ef(d.split));
    Tcfp12RecipeOptions t;
    CHECK_NOTHROW(checked_recipe("tcfp12", t, {"-tb", "64", "-tpdds", "1", "-tabd", "1", "-tfw", "1"}));
    CHECK(t.split.block_size == 64);
    CHECK(t.split.pdds == 1);
    CHECK(t.split.abd == 1);
    CHECK(t.tcfp_fp8_wgrad == 1);
    Tcfp12RecipeOptions ts;
    CHECK_NOTHROW(checked_recipe("tcfp12", ts, {"-tsrr", "1"}));
    CHECK_FALSE(llmc::tcfp12_uses_ef(ts.split)); // SRR replaces the EF buffer
    for (auto bad_tcfp : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"-tsrr", "1", "-tpdds", "1"}, "mutually exclusive"}, {{"-tsrr", "1", "-tef", "1"}, "-tef"},
             {{"-tpdds", "1", "-tef", "0"}, "-tpdds"}, {{"-tb", "48"}, "-tb 48"}, {{"-tabd", "2"}, "-tabd"},
             {{"-tfw", "2"}, "-tfw"}, {{"-tfa", "-1"}, "-tfa"}}) {
        const std::string msg = recipe_error<Tcfp12RecipeOptions>("tcfp12", bad_tcfp.first);
        CHECK_MESSAGE(contains(msg, bad_tcfp.second), msg);
    }
}

TEST_CASE("cli: q115 takes -lq alone; bf16 takes no recipe flag") {
    Q115Options q;
    CHECK_NOTHROW(checked_recipe("q115", q, {"-lq", "1", "-o", "out", "-Q", "115"}));
    CHECK(q.telemetry_every == 1);
    CHECK(contains(recipe_error<Q115Options>("q115", {"-lq", "1"}), "needs -o"));
    CHECK(contains(recipe_error<Q115Options>("q115", {"-sqf", "1"}), "not a flag of the q115 recipe"));
    CHECK(contains(recipe_error<Bf16Options>("bf16", {"-lq", "1"}), "not a flag of the bf16 recipe"));
    Bf16Options b;
    CHECK_NOTHROW(checked_recipe("bf16", b, {"-b", "4"}));
}

TEST_CASE("cli: the example recipe's -wf takes e4m3 or e5m2, and it keeps layers in BF16 like the others") {
    ExampleOptions o;
    CHECK(o.weight_format == "e4m3");
    CHECK_NOTHROW(checked_recipe("example", o, {"-wf", "e5m2", "-sqf", "1"}));
    CHECK(o.weight_format == "e5m2");
    CHECK(o.skip_first == 1);
    CHECK(contains(recipe_error<ExampleOptions>("example", {"-wf", "e3m4"}), "-wf e3m4: the weight format must be e4m3 or e5m2"));
    CHECK(contains(recipe_error<ExampleOptions>("example", {"-fh", "1"}), "not a flag of the example recipe"));
}

TEST_CASE("cli: values may start with '-', empty strings are allowed, the last repeat wins") {
    TrainConfig c = parse({"-x", "-1", "-d", "-1", "-m", "-1", "-j", "", "-b", "2", "-b", "16"});
    CHECK(c.max_steps == -1);
    CHECK(c.total_batch_size == -1);
    CHECK(c.val_max_steps == -1);
    CHECK(c.val_pattern == "");
    CHECK(c.B == 16);
    CHECK(parse({"-l", "1e-3"}).learning_rate == doctest::Approx(1e-3));
    CHECK(parse({"-d", "9000000000"}).total_batch_size == 9000000000LL);  // 64-bit
}

TEST_CASE("cli: a value that does not fully parse is rejected, naming the flag and value") {
    struct Bad {
        const char* flag;
        const char* value;
        const char* expect;
    };
    const Bad cases[] = {
        {"-b", "4x", "-b: expected an integer, got '4x'"},
        {"-b", "", "-b: expected an integer, got ''"},
        {"-b", " 4", "expected an integer"},
        {"-b", "99999999999", "out of range"},
        {"-t", "1.5", "-t: expected an integer, got '1.5'"},
        {"-d", "1e6", "-d: expected an integer"},
        {"-d", "99999999999999999999", "out of range"},
        {"-u", "abc", "-u: expected an integer"},
        {"-x", "-", "-x: expected an integer"},
        {"-nk", "2.0", "-nk: expected an integer"},
        {"-l", "abc", "-l: expected a number, got 'abc'"},
        {"-l", "3e-4x", "-l: expected a number"},
        {"-l", "nan", "-l: expected a finite number"},
        {"-q", "inf", "-q: expected a finite number"},
        {"-c", "1e39", "-c: 1e39 is out of range"},
        {"-gc", "", "-gc: expected a number"},
        {"-sd", "-1", "-sd: expected a non-negative integer"},
        {"-sd", "42a", "-sd: expected a non-negative integer"},
        {"-sd", "99999999999999999999", "-sd: 99999999999999999999 is out of range"},
    };
    for (const Bad& b : cases) {
        CAPTURE(b.flag);
        CAPTURE(b.value);
        std::string msg = error_of([&] { parse({b.flag, b.value}); });
        CHECK(contains(msg, b.expect));
        CHECK(contains(msg, b.flag));
    }
}

TEST_CASE("cli: unknown flags, stray arguments and missing values") {
    std::string msg = error_of([] { parse({"-zz", "3"}); });
    CHECK(contains(msg, "unknown flag '-zz'"));
    msg = error_of([] { parse({"-b", "4", "--batch", "4"}); });
    CHECK(contains(msg, "'--batch'"));
    msg = error_of([] { parse({"model.bin"}); });
    CHECK(contains(msg, "unexpected argument 'model.bin'"));
    for (const std::string& flag : kAllFlags) {
        CAPTURE(flag);
        msg = error_of([&] { parse({"-b", "4", flag}); });
        CHECK(contains(msg, flag + ": missing value"));
    }
}

TEST_CASE("cli: usage lists every flag with its default") {
    std::string u = llmc::usage();
    for (const std::string& flag : kAllFlags) {
        CAPTURE(flag);
        size_t at = u.find("\n  " + flag + " ");
        REQUIRE(at != std::string::npos);
        std::string line = u.substr(at + 1, u.find('\n', at + 1) - at - 1);
        CHECK(contains(line, "(default "));
    }
    CHECK(contains(u, "--help, -h"));
    for (const char* env : {"LLMC_PROFILE=", "LLMC_TCFP12_CONCAT=", "LLMC_FP8_FUSED_GEMM=", "LLMC_NVFP4_EMULATE=", "LLMC_CUDNN_DETERMINISTIC="})
        CHECK(contains(u, env));   // the environment variables the trainers read
    CHECK(contains(u, "(default 8)"));        // -b
    CHECK(contains(u, "(default 0.0006)"));   // -l
    CHECK(contains(u, "(default \"cosine\")"));
    CHECK(contains(u, "124,475,904"));        // the model table is included
}

TEST_CASE("cli: usage lists the recipe's flags under a heading naming it, with their defaults") {
    Fp8Options fp8;
    const std::string u = llmc::usage(recipe_flags("fp8", fp8));
    const size_t heading = u.find("flags of the fp8 recipe (train_gpt_fp8");
    REQUIRE(heading != std::string::npos);
    for (const char* flag : {"-fh", "-fm", "-sqf", "-sql", "-lq"}) {
        CAPTURE(flag);
        const size_t at = u.find(std::string("\n  ") + flag + " ");
        REQUIRE(at != std::string::npos);
        CHECK(at > heading);
        CHECK(contains(u.substr(at + 1, u.find('\n', at + 1) - at - 1), "(default "));
    }
    CHECK(contains(u, "(default 1024)")); // -fh
    CHECK_FALSE(contains(u, "\n  -tb "));  // another recipe's
    CHECK_FALSE(contains(llmc::usage(), "\n  -fh ")); // the trainer's own flags alone
    Bf16Options bf16;
    CHECK(contains(llmc::usage(recipe_flags("bf16", bf16)), "the bf16 recipe (train_gpt_bf16) has no flags of its own"));
}

TEST_CASE("cli: -h and --help print the usage and exit 0") {
    // help wins even over a bad value; -h is the help where no integer follows it (-h 1 is HellaSwag)
    const std::vector<std::vector<std::string>> lines = {{"-b", "4x", "-h"}, {"-b", "4x", "--help"},
                                                         {"-h", "-b", "4"}, {"-h", "on"}, {"-h", "1", "--help"}};
    for (const std::vector<std::string>& line : lines) {
        std::string h;
        for (const std::string& arg : line) h += arg + " ";
        CAPTURE(h);
        int fds[2];
        REQUIRE(pipe(fds) == 0);
        std::fflush(stdout);  // the child must not re-flush our buffered output
        pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            dup2(fds[1], 1);
            close(fds[0]);
            close(fds[1]);
            parse(line);
            _exit(99);
        }
        close(fds[1]);
        std::string out;
        char buf[4096];
        ssize_t n;
        while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, (size_t)n);
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
        CHECK(out == llmc::usage());
    }
}

TEST_CASE("cli: validate_config fills grad_accum_steps") {
    CHECK(validated({}).grad_accum_steps == 1);
    CHECK(validated({"-b", "8", "-t", "1024", "-d", "65536"}).grad_accum_steps == 8);
    CHECK(validated({"-b", "8", "-t", "1024", "-d", "65536"}, 2).grad_accum_steps == 4);
    CHECK(validated({"-b", "4", "-t", "64", "-d", "256"}).grad_accum_steps == 1);
    CHECK(validated({"-d", "-1"}, 4).grad_accum_steps == 1);
}

TEST_CASE("cli: validate_config rejects a total batch that does not divide") {
    std::string msg = error_of([] { validated({"-b", "8", "-t", "1024", "-d", "100000"}); });
    CHECK(contains(msg, "-d 100000"));
    CHECK(contains(msg, "8*1024*1 = 8192"));
    CHECK(contains(msg, "try -d 98304"));
    // with 3 processes the unit is 24576; the suggestion is the nearest multiple
    msg = error_of([] { validated({"-b", "8", "-t", "1024", "-d", "65536"}, 3); });
    CHECK(contains(msg, "8*1024*3 = 24576"));
    CHECK(contains(msg, "try -d 73728"));
    // smaller than one micro-batch: suggest one micro-batch, never 0
    msg = error_of([] { validated({"-b", "8", "-t", "1024", "-d", "100"}); });
    CHECK(contains(msg, "try -d 8192"));
    CHECK(contains(error_of([] { validated({"-d", "0"}); }), "-d 0"));
    CHECK(contains(error_of([] { validated({"-d", "-5"}); }), "-d -5"));
}

TEST_CASE("cli: validate_config bounds every size and product, naming the flags, with no overflow") {
    auto msg_of = [](const std::vector<std::string>& args) {
        return error_of([&] {
            TrainConfig c = parse(args);
            llmc::validate_config(c);
        });
    };
    // B*T*processes once wrapped int64 to 0 here, and the divisibility check divided by it
    std::string msg = msg_of({"-b", "1073741824", "-t", "1073741824", "-pn", "16", "-pr", "0", "-pf", "/tmp", "-d", "5"});
    CHECK(contains(msg, "-b 1073741824: the micro-batch size must be between 1 and 1048576"));
    CHECK(contains(msg_of({"-t", "2147483647"}), "-t 2147483647: the sequence length must be between 1 and 1048576"));
    CHECK(contains(msg_of({"-pn", "2147483647", "-pr", "0", "-pf", "/tmp"}), "-pn 2147483647: at most 65536"));
    // each factor in range, their product not
    msg = msg_of({"-b", "1048576", "-t", "1048576"});
    CHECK(contains(msg, "-b 1048576 -t 1048576: a micro-batch of B*T = 1099511627776 tokens"));
    msg = msg_of({"-b", "16384", "-t", "16384", "-pn", "65536", "-pr", "0", "-pf", "/tmp"});
    CHECK(contains(msg, "-b 16384 -t 16384 -pn 65536: B*T*processes = 17592186044416 tokens"));
    // -d: bounded, and its suggestion is never negative nor past the limits
    CHECK(contains(msg_of({"-d", "9223372036854775807"}), "-d 9223372036854775807: the total batch size must be between 1 and 1099511627776"));
    CHECK(contains(msg_of({"-d", "-9223372036854775807"}), "-d -9223372036854775807"));
    msg = msg_of({"-b", "8", "-t", "1024", "-d", "1099511627775"});
    CHECK(contains(msg, "try -d "));
    CHECK(!contains(msg, "try -d -"));
    msg = msg_of({"-b", "1", "-t", "1", "-d", "1099511627776"});
    CHECK(contains(msg, "-d 1099511627776: that is 1099511627776 gradient accumulation steps"));
    CHECK(contains(msg, "more than the 1048576 allowed"));
    // a suggestion made while the accumulation is past its limit is clamped to the limit
    msg = msg_of({"-b", "1", "-t", "3", "-d", "4000000"});
    CHECK(contains(msg, "try -d 3145728"));
    // the largest of everything that is allowed still validates
    TrainConfig c = parse({"-b", "16384", "-t", "16384", "-pn", "4096", "-pr", "4095", "-pf", "/tmp", "-d", "1099511627776"});
    llmc::validate_config(c);
    CHECK(c.grad_accum_steps == 1);
    c = parse({"-b", "1", "-t", "1", "-d", "1048576"});
    llmc::validate_config(c);
    CHECK(c.grad_accum_steps == 1048576);
    // -pt becomes milliseconds in an int for poll()
    CHECK(contains(msg_of({"-pt", "2147483647"}), "-pt 2147483647: the collective timeout must be between 1 and 604800"));
    c = parse({"-pt", "604800"});
    llmc::validate_config(c);
}

TEST_CASE("cli: validate_config range checks name the flag") {
    struct Bad {
        std::vector<std::string> args;
        const char* expect;
    };
    const std::vector<Bad> cases = {
        {{"-b", "0"}, "-b 0"},
        {{"-b", "-3"}, "-b -3"},
        {{"-t", "0"}, "-t 0"},
        {{"-l", "-0.001"}, "-l -0.001"},
        {{"-u", "-1"}, "-u -1"},
        {{"-k", "step"}, "-k step"},
        {{"-q", "1.5"}, "between 0 and 1"},
        {{"-q", "-0.1"}, "between 0 and 1"},
        {{"-c", "-0.1"}, "-c -0.1"},
        {{"-gc", "-1"}, "-gc -1"},
        {{"-x", "0"}, "-x 0"},
        {{"-x", "-2"}, "-x -2"},
        {{"-v", "-1"}, "-v -1"},
        {{"-m", "0"}, "-m 0"},
        {{"-m", "-2"}, "-m -2"},
        {{"-s", "-1"}, "-s -1"},
        {{"-g", "-1"}, "-g -1"},
        {{"-r", "3"}, "-r 3"},
        {{"-r", "-2"}, "-r -2"},
        {{"-n", "-1"}, "-n -1"},
        {{"-nk", "-1"}, "-nk -1"},
        {{"-y", "2"}, "-y 2"},
        {{"-ga", "2"}, "-ga 2"},
        {{"-y", "1"}, "-o"},  // resuming needs the checkpoint directory
        {{"-i", ""}, "-i"},
        {{"-e", ""}, "-e"},
    };
    for (const Bad& b : cases) {
        CAPTURE(b.args[0]);
        CAPTURE(b.args[1]);
        CHECK(contains(error_of([&] { validated(b.args); }), b.expect));
    }
    // the edges that are allowed
    CHECK_NOTHROW(validated({"-q", "0"}));
    CHECK_NOTHROW(validated({"-q", "1"}));
    CHECK_NOTHROW(validated({"-x", "-1", "-m", "-1", "-l", "0", "-gc", "0", "-c", "0", "-v", "0", "-s", "0", "-r", "0"}));
    CHECK_NOTHROW(validated({"-r", "-1"}));
    CHECK_NOTHROW(validated({"-y", "1", "-o", "out"}));
    for (const char* k : {"cosine", "linear", "constant", "wsd"}) CHECK_NOTHROW(validated({"-k", k}));
}

TEST_CASE("cli: model descriptors give their shapes") {
    struct Expect {
        const char* name;
        int L, C, NH, maxT;
    };
    const Expect table[] = {
        {"d6", 6, 384, 6, 1024},          {"d12", 12, 768, 12, 1024},       {"d24", 24, 1024, 16, 1024},
        {"d36", 36, 1280, 20, 1024},      {"d48", 48, 1600, 25, 1024},      {"gpt3:c768", 12, 768, 12, 2048},
        {"gpt3:c1024", 24, 1024, 16, 2048}, {"gpt3:c1536", 24, 1536, 12, 2048}, {"gpt3:c2048", 24, 2048, 16, 2048},
        {"gpt3:c2560", 32, 2560, 20, 2048}, {"gpt3:c4096", 32, 4096, 32, 2048}, {"gpt3:c5120", 40, 5120, 40, 2048},
        {"gpt3:c12288", 96, 12288, 96, 2048},
    };
    for (const Expect& e : table) {
        CAPTURE(e.name);
        ModelShape s;
        s.num_layers = -1;  // make sure every field is written
        REQUIRE(llmc::parse_model_descriptor(e.name, &s));
        CHECK(s.num_layers == e.L);
        CHECK(s.channels == e.C);
        CHECK(s.num_heads == e.NH);
        CHECK(s.max_seq_len == e.maxT);
        CHECK(s.vocab_size == 50257);
        CHECK(s.padded_vocab_size == 50304);
    }
    ModelShape c1536;
    llmc::parse_model_descriptor("gpt3:c1536", &c1536);
    CHECK(c1536.channels / c1536.num_heads == 128);
    // gpt2:dN is the same model as dN
    for (const char* d : {"d6", "d12", "d24", "d36", "d48"}) {
        ModelShape a, b;
        REQUIRE(llmc::parse_model_descriptor(d, &a));
        REQUIRE(llmc::parse_model_descriptor(std::string("gpt2:") + d, &b));
        CHECK(same_shape(a, b));
    }
}

TEST_CASE("cli: parameter counts of the descriptors") {
    ModelShape s;
    REQUIRE(llmc::parse_model_descriptor("d12", &s));
    CHECK(llmc::num_parameters(s) == 124475904u);
    REQUIRE(llmc::parse_model_descriptor("gpt3:c768", &s));
    CHECK(llmc::num_parameters(s) == 125262336u);
    REQUIRE(llmc::parse_model_descriptor("d48", &s));
    CHECK(llmc::num_parameters(s) == 1557686400u);
    std::string table = llmc::describe_models();
    CHECK(contains(table, "124,475,904"));
    CHECK(contains(table, "125,262,336"));
    for (const char* name : {"d6 ", "d12 ", "d24 ", "d36 ", "d48 ", "gpt3:c768 ", "gpt3:c1024 ", "gpt3:c1536 ",
                             "gpt3:c2048 ", "gpt3:c2560 ", "gpt3:c4096 ", "gpt3:c5120 ", "gpt3:c12288 "})
        CHECK(contains(table, name));
}

TEST_CASE("cli: strings that are not descriptors are checkpoint paths") {
    for (const char* path : {"model.bin", "d12.bin", "d12x", "runs/d12", "/tmp/gpt2_124M.bin", "dx", "d", "gpt2",
                             "gpt3c768"}) {
        CAPTURE(path);
        ModelShape s;
        s.num_layers = 777;
        CHECK_FALSE(llmc::parse_model_descriptor(path, &s));
        CHECK(s.num_layers == 777);  // untouched
    }
}

TEST_CASE("cli: unknown descriptors list the valid ones") {
    for (const char* bad : {"d13", "d0", "gpt2:d13", "gpt2:c768", "gpt3:c999", "gpt3:d12", "gpt3:", "gpt2:"}) {
        CAPTURE(bad);
        ModelShape s;
        std::string msg = error_of([&] { llmc::parse_model_descriptor(bad, &s); });
        CHECK(contains(msg, std::string("-e ") + bad + ":"));
        CHECK(contains(msg, "d12"));
        CHECK(contains(msg, "gpt3:c768"));
        CHECK(contains(msg, "gpt3:c12288"));
    }
}

TEST_CASE("cli: check_seq_len") {
    ModelShape d12, c768;
    llmc::parse_model_descriptor("d12", &d12);
    llmc::parse_model_descriptor("gpt3:c768", &c768);
    TrainConfig c = parse({"-t", "2048"});
    CHECK(error_of([&] { llmc::check_seq_len(c, d12); }) ==
          "-t 2048 is longer than the model's maximum sequence length 1024");
    CHECK_NOTHROW(llmc::check_seq_len(c, c768));
    CHECK_NOTHROW(llmc::check_seq_len(parse({"-t", "1024"}), d12));
}

TEST_CASE("cli: -h 1 turns HellaSwag on, -hf names its file; checked against -v") {
    const TrainConfig d = parse({});
    CHECK(d.hellaswag == 0);
    CHECK(d.hellaswag_path == "dev/data/hellaswag/hellaswag_val.bin");  // where dev/data/hellaswag.py writes it
    const TrainConfig c = parse({"-b", "4", "-h", "1", "-hf", "eval/hs.bin"});
    CHECK(c.hellaswag == 1);
    CHECK(c.hellaswag_path == "eval/hs.bin");
    CHECK(parse({"-h", "0"}).hellaswag == 0);
    CHECK_NOTHROW(validated({"-h", "1", "-v", "250"}));
    CHECK_NOTHROW(validated({"-h", "0", "-v", "0"}));
    CHECK(contains(error_of([] { validated({"-h", "2"}); }), "-h 2: HellaSwag is 0 (off) or 1 (on)"));
    CHECK(contains(error_of([] { validated({"-h", "-1"}); }), "-h -1: HellaSwag is 0 (off) or 1 (on)"));
    CHECK(contains(error_of([] { validated({"-h", "1", "-v", "0"}); }), "-h 1: HellaSwag is scored at the validation steps"));
    CHECK(contains(error_of([] { validated({"-h", "1", "-hf", ""}); }), "-h 1: -hf names no eval file"));
    CHECK(contains(error_of([] { parse({"-hf"}); }), "-hf: missing value"));
    // both rows are in the usage with their defaults, and the top line says where the help went
    const std::string u = llmc::usage();
    CHECK(contains(u, "\n  -h <int>  "));
    CHECK(contains(u, "(default 0)\n  -hf <str>"));
    CHECK(contains(u, "(default \"dev/data/hellaswag/hellaswag_val.bin\")"));
    CHECK(contains(u, "  --help, -h       print this help (-h without a value; -h 1 is HellaSwag, below)"));
}
