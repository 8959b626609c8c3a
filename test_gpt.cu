// test_gpt.cu: the trainer against the PyTorch reference (dev/reference/gpt_reference.py).
//
//   python3 dev/reference/gpt_reference.py --write-reference --out dev/reference/out
//   ./test_gpt_bf16 dev/reference/out                    every check, in order
//   ./test_gpt_bf16 dev/reference/out --only resume      the named checks only (comma-separated; --list names them)
//   ./test_gpt_q115 dev/reference/out_q115 dev/reference/out   (Q1.15: its own reference, then the plain one)
//
// The reference (float64 on the CPU, a seeded d12 with perturbed norms and biases, B=4, T=64) gives the
// parameters, one batch, its logits, loss, every parameter gradient, and the losses of 10 AdamW steps, each on a
// fresh batch; and a small multiple-choice eval file with the mean loss of each of its endings (HellaSwag's
// scoring). This test loads the same parameters into one model and runs the checks below (main's CHECKS), each
// a function named check_<name>. Relative L2 errors ||ours - ref|| / ||ref|| and absolute loss differences are
// bounded by the recipe's tolerances, llmc/recipes/<recipe>/test_tolerances.h (the FP32 build uses the BF16
// recipe's, under ENABLE_FP32), each with the error model that justifies it.
//
// The checks share the model, and run in a fixed order: one that comes later starts from the state the earlier
// ones left behind (the recipe's state, FP8's amax histories for instance, is not reset between them), so a run
// with --only gives the same verdicts but may differ in the last bits of what it prints.
//
// The Q1.15 build (test_gpt_q115) is compared with the reference written with --boundaries q115 (every forward
// boundary through simulate_q115 in float64), and has two checks of its own: check_q115_boundaries (after a
// forward pass every boundary tensor holds only Q1.15 values) and check_q115_vs_bf16 (one step's deviation from
// the plain reference, given as the second argument, is what the float64 Q1.15 reference predicts).
#define TESTING
#include "train_gpt.cu"
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <chrono>
#include <future>
#include <set>
#include <sstream>

// the recipe's tolerances (TOL_LOGITS, TOL_LOSS, TOL_GRAD, TOL_LOSSES, TOL_NORM, TOL_ENDING_LOSS,
// TOL_KEPT_VS_RECOMPUTED), beside the recipe: the Makefile names llmc/recipes/<name>/test_tolerances.h (the FP32
// build: the BF16 recipe's, whose header holds the FP32 bounds under ENABLE_FP32)
#ifndef RECIPE_TOLERANCES
#error "build with make test_gpt_<recipe>, which names the recipe's test_tolerances.h in RECIPE_TOLERANCES"
#endif
#include RECIPE_TOLERANCES

static int g_passed = 0, g_failed = 0;
static void check(bool ok, const std::string& what) {
    printf("[%s] %s\n", ok ? "PASS" : "FAIL", what.c_str());
    if (ok) g_passed++; else g_failed++;
}

struct Reference {
    int B, T, V, Vp, nsteps, num_params;
    int boundaries; // 0: plain, 1: Q1.15 true-forward
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    std::vector<int> inputs, targets;
    std::vector<int> step_inputs, step_targets; // nsteps batches of B*T: step k trains on batch k
    std::vector<float> logits, grads, losses, grad_norms;
    float loss;
};

static void read_exact(FILE* f, void* dst, size_t bytes, const std::string& path) {
    if (fread(dst, 1, bytes, f) != bytes) { fprintf(stderr, "error: %s is truncated\n", path.c_str()); exit(1); }
}

static Reference load_reference_state(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open %s; write it with: python3 dev/reference/gpt_reference.py --write-reference --out DIR\n", path.c_str());
        exit(1);
    }
    int header[256];
    read_exact(f, header, sizeof(header), path);
    if (header[0] != 20241123 || header[1] != 2) {
        fprintf(stderr, "error: %s is not a version-2 reference state (magic %d, version %d); rewrite it with "
                "dev/reference/gpt_reference.py --write-reference\n", path.c_str(), header[0], header[1]);
        exit(1);
    }
    Reference r;
    r.B = header[2]; r.T = header[3]; r.V = header[4]; r.Vp = header[5]; r.nsteps = header[6]; r.num_params = header[7];
    r.boundaries = header[8];
    float hyper[16];
    read_exact(f, hyper, sizeof(hyper), path);
    r.lr = hyper[0]; r.beta1 = hyper[1]; r.beta2 = hyper[2]; r.eps = hyper[3]; r.weight_decay = hyper[4]; r.grad_clip = hyper[5];
    const size_t BT = (size_t)r.B * r.T;
    r.inputs.resize(BT); r.targets.resize(BT);
    r.logits.resize(BT * r.Vp); r.grads.resize(r.num_params);
    r.losses.resize(r.nsteps); r.grad_norms.resize(r.nsteps);
    read_exact(f, r.inputs.data(), BT * 4, path);
    read_exact(f, r.targets.data(), BT * 4, path);
    read_exact(f, r.logits.data(), r.logits.size() * 4, path);
    read_exact(f, &r.loss, 4, path);
    read_exact(f, r.grads.data(), r.grads.size() * 4, path);
    read_exact(f, r.losses.data(), r.nsteps * 4, path);
    read_exact(f, r.grad_norms.data(), r.nsteps * 4, path);
    r.step_inputs.resize((size_t)r.nsteps * BT); r.step_targets.resize((size_t)r.nsteps * BT);
    read_exact(f, r.step_inputs.data(), r.step_inputs.size() * 4, path);
    read_exact(f, r.step_targets.data(), r.step_targets.size() * 4, path);
    if (fgetc(f) != EOF) { fprintf(stderr, "error: %s is longer than its header says\n", path.c_str()); exit(1); }
    fclose(f);
    return r;
}

struct Diff { double rel_l2, max_abs; };
template <typename T>
static Diff compare(const T* ours, const float* ref, size_t n) {
    double num = 0.0, den = 0.0, max_abs = 0.0;
    for (size_t i = 0; i < n; i++) {
        double o = (double)(float)ours[i], r = ref[i];
        double d = o - r;
        if (!std::isfinite(o)) { num = INFINITY; }
        num += d * d; den += r * r;
        max_abs = std::max(max_abs, std::fabs(d));
    }
    return Diff{den > 0 ? std::sqrt(num / den) : std::sqrt(num), max_abs};
}

static std::vector<float> device_floats(const float* d, size_t n) {
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
template <typename T>
static std::vector<uint8_t> device_bytes(const T* d, size_t n) {
    std::vector<uint8_t> h(n * sizeof(T));
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

template <class T>
static std::vector<T> device_vector(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
template <class T>
static bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// the k-th batch of the resume test: the reference batch with its tokens rotated by k
static std::vector<int> rotated(const std::vector<int>& x, int k) {
    std::vector<int> y(x.size());
    for (size_t i = 0; i < x.size(); i++) y[i] = x[(i + k) % x.size()];
    return y;
}

// the boundaries the reference must have been written with (--boundaries)
#if defined(ENABLE_Q115) && SF16_TRUE_FORWARD
static const int EXPECTED_REFERENCE_BOUNDARIES = 1;
static const char* REFERENCE_FLAG = "--boundaries q115";
#else
static const int EXPECTED_REFERENCE_BOUNDARIES = 0;
static const char* REFERENCE_FLAG = "(no --boundaries)";
#endif

#if defined(ENABLE_Q115)
// The specification's reality check on one device tensor: every element is a Q1.15 value. An FP32 tensor (the
// residual stream) must hold simulate_q115(v) exactly: k/32768 with |k| <= 32735 (|v| <= 0.999). A
// BF16 tensor holds BF16(simulate_q115(x)): k/32768 with |k| <= 32768, equal to its own
// BF16(simulate_q115(v)) (1.0 is where the clamp value 32735/32768 rounds to in BF16). Returns
// whether all elements pass; `at_one` counts the elements at +-1.0 (BF16) or +-32735/32768 (FP32).
template <typename T>
static bool q115_tensor_holds_q115(const T* dev, size_t n, size_t* bad, size_t* at_one, float* bad_value) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    *bad = 0; *at_one = 0;
    for (size_t i = 0; i < n; i++) {
        const float v = (float)h[i];
        const double k = (double)v * 32768.0;
        bool ok = std::isfinite(v) && k == std::nearbyint(k);
        if constexpr (sizeof(T) == 4) {
            ok = ok && simulate_q115(v) == v;
            if (std::fabs(v) == simulate_q115(1.0f)) (*at_one)++;
        } else {
            ok = ok && std::fabs(v) <= 1.0f && (float)(floatX)simulate_q115(v) == v;
            if (std::fabs(v) == 1.0f) (*at_one)++;
        }
        if (!ok && (*bad)++ == 0) *bad_value = v;
    }
    return *bad == 0;
}
template <typename T>
static void check_q115_boundary(const char* name, const T* dev, size_t n) {
    size_t bad = 0, at_one = 0;
    float bad_value = 0.0f;
    const bool ok = q115_tensor_holds_q115(dev, n, &bad, &at_one, &bad_value);
    check(ok, strfmt("Q1.15 boundary %-9s (%s): all %zu values are Q1.15 (%zu at the clamp%s)%s", name,
                     sizeof(T) == 4 ? "FP32" : "BF16", n, at_one, sizeof(T) == 4 ? " +-32735/32768" : ", stored as +-1.0",
                     ok ? "" : strfmt("; %zu are not, e.g. %a", bad, bad_value).c_str()));
}
#endif

// The recipe's options every model of the checks is built with: its defaults, or the flags given with
// --recipe "FLAGS" (e.g. test_gpt_fp8 --recipe "-fs block"), parsed through the recipe's own flag table and
// checked as the trainer checks them. One binary then checks each of a recipe's modes against the same
// reference and tolerances (test_tolerances.h bounds every mode of its recipe).
static RecipeOptions g_recipe_options;
static void parse_recipe_flags(const std::string& text) {
    llmc::FlagTable table;
    append_recipe_flags(table, g_recipe_options);
    std::stringstream words(text);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    for (size_t i = 0; i < w.size(); i++) {
        const llmc::Flag* row = nullptr;
        for (const llmc::Flag& f : table) row = w[i] == f.name ? &f : row;
        if (!row) input_error("--recipe: '%s' is not a flag of the %s recipe", w[i].c_str(), RECIPE_NAME);
        if (i + 1 >= w.size()) input_error("--recipe: %s needs a value", w[i].c_str());
        llmc::cli_detail::set_flag(*row, w[++i].c_str());
    }
    check_recipe_options(g_recipe_options, false);
    check_recipe_environment(g_recipe_options);
}

// What the checks share: the reference, the one model they train, and what earlier checks computed
struct TestContext {
    std::string dir;          // the reference (argv[1])
    std::string plain_dir;    // Q1.15: the plain reference (argv[2]), or empty
    std::string ckdir;        // scratch directory for the checkpoints
    ModelFileInfo info;
    Reference ref;
    std::vector<float> init_params;
    GPT model;
    int B = 0, T = 0;
    size_t BT = 0;
    bool have_forward = false, have_grads = false;
    float forward_loss = 0.0f;    // the loss of the evaluation forward pass on the reference batch
    std::vector<float> grads;     // the gradients of the reference batch
    // the checkpoint checks' own small model (checkpoint_model below)
    ModelShape ck_shape;
    GPT ck_model;
    std::vector<float> ck_init;
    bool have_ck_model = false;
};

// the seed of the checkpoint checks' optimizer steps: a non-trivial one exercises stochastic rounding
static const uint64_t CHECKPOINT_SEED = 1234;

// the model back at the reference's parameters with fresh AdamW moments
static void reset_model(TestContext& c) {
    gpt_set_params(&c.model, c.init_params);
    cudaCheck(cudaMemset(c.model.m_memory, 0, c.model.num_params * sizeof(float)));
    cudaCheck(cudaMemset(c.model.v_memory, 0, c.model.num_params * sizeof(float)));
    c.model.adam_steps = 0;
}

// The checkpoint checks (resume, zero1) compare runs with each other, bit for bit, and never with the reference,
// so they use a small model of their own: 4 layers of 256 channels (4 heads of 64, the head size of the d12
// reference), the reference's vocabulary and maxT, GPT-2's init from CHECKPOINT_SEED. A checkpoint of it is about
// 0.2 GB where d12's is 1.7 GB, and these checks write, fsync, read back and checksum several: their time is
// mostly that size. Built on first use; returned at its initial parameters with fresh AdamW moments.
static GPT& checkpoint_model(TestContext& c) {
    if (!c.have_ck_model) {
        c.ck_shape = c.info.shape;
        c.ck_shape.num_layers = 4;
        c.ck_shape.channels = 256;
        c.ck_shape.num_heads = 4;
        gpt_build(&c.ck_model, c.ck_shape);
        gpt_allocate(&c.ck_model, c.B, c.T, 1, g_recipe_options);
        c.ck_init = gpt_random_init(&c.ck_model, CHECKPOINT_SEED);
        c.have_ck_model = true;
    }
    gpt_set_params(&c.ck_model, c.ck_init);
    cudaCheck(cudaMemset(c.ck_model.m_memory, 0, c.ck_model.num_params * sizeof(float)));
    cudaCheck(cudaMemset(c.ck_model.v_memory, 0, c.ck_model.num_params * sizeof(float)));
    c.ck_model.adam_steps = 0;
    return c.ck_model;
}

static void run_forward(TestContext& c) {
    c.forward_loss = gpt_forward_loss(&c.model, c.ref.inputs.data(), c.ref.targets.data(), c.B, c.T, false);
    c.have_forward = true;
}

static void run_gradients(TestContext& c) {
    gpt_zero_grad(&c.model);
    gpt_forward(&c.model, c.ref.inputs.data(), c.ref.targets.data(), c.B, c.T, true, 1.0f / c.BT);
    gpt_backward(&c.model, c.B, c.T);
    c.grads = device_floats(c.model.grads_memory, c.model.num_params);
    c.have_grads = true;
}

// forward: the logits (evaluation mode keeps them) within TOL_LOGITS and the loss within TOL_LOSS of the reference
static void check_forward(TestContext& c) {
    const Reference& ref = c.ref;
    run_forward(c);
    const float loss = c.forward_loss;
    std::vector<floatX> logits(c.BT * ref.Vp);
    cudaCheck(cudaMemcpy(logits.data(), c.model.acts.logits, logits.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    Diff dl = compare(logits.data(), ref.logits.data(), logits.size());
    check(dl.rel_l2 <= TOL_LOGITS, strfmt("logits: rel L2 %.3e (tol %.2g), max abs %.3e", dl.rel_l2, TOL_LOGITS, dl.max_abs));
    check(std::fabs(loss - ref.loss) <= TOL_LOSS, strfmt("loss: %.6f vs reference %.6f (|diff| %.3e, tol %.0e)", loss, ref.loss, std::fabs(loss - ref.loss), TOL_LOSS));
}

#if defined(ENABLE_Q115)
// Q1.15 only: after a forward pass every boundary tensor holds only Q1.15 values (every element; the tensors that
// pass stored, every layer's where kept, and the probabilities of each layer's flash attention re-run to write
// them, which must reproduce the stored output bit for bit), and the check rejects a tensor that is not quantized
static void check_q115_boundaries(TestContext& c) {
    if (!c.have_forward) run_forward(c);
    const GPT& model = c.model;
    const int B = c.B, T = c.T, Vp = c.ref.Vp;
    const size_t BT = c.BT;
    {
        const ModelShape& sh = model.shape;
        const size_t L = sh.num_layers, C = sh.channels, NH = sh.num_heads;
        const Activations& a = model.acts;
        check_q115_boundary("encoded", a.encoded, BT * C);
        check_q115_boundary("ln1", a.ln1, L * BT * C);
        check_q115_boundary("qkv", a.qkv, L * BT * 3 * C);
        if (model.flash_attention) {
            // the fused attention keeps no probabilities: each layer's attention forward is run again on
            // its stored qkv, writing every stored probability (the kernels are deterministic: the
            // re-run's output must equal the layer's stored output bit for bit)
            const size_t n_att = (size_t)B * NH * T * T;
            floatX* att = (floatX*)cuda_malloc_or_die(L * n_att * sizeof(floatX), "test: probabilities");
            floatX* out = (floatX*)cuda_malloc_or_die(BT * C * sizeof(floatX), "test: attention output");
            float* lse = (float*)cuda_malloc_or_die((size_t)B * NH * T * sizeof(float), "test: lse");
            cudaCheck(cudaMemset(att, 0, L * n_att * sizeof(floatX)));
            cudaCheck(cudaDeviceSynchronize());   // the forward pass (on the model's stream) is done
            size_t differ = 0;
            std::vector<floatX> h_out(BT * C), h_atty(BT * C);
            for (size_t l = 0; l < L; l++) {
                flash_attention_forward<Boundaries>(out, lse, a.qkv + l * BT * 3 * C, B, T, (int)NH, (int)(C / NH), 0,
                                                    att + l * n_att);
                cudaCheck(cudaMemcpy(h_out.data(), out, BT * C * sizeof(floatX), cudaMemcpyDeviceToHost));
                cudaCheck(cudaMemcpy(h_atty.data(), a.atty + l * BT * C, BT * C * sizeof(floatX), cudaMemcpyDeviceToHost));
                differ += memcmp(h_out.data(), h_atty.data(), BT * C * sizeof(floatX)) != 0;
            }
            check(differ == 0, strfmt("flash attention re-run with its probabilities written: the output equals the "
                                      "stored atty in %zu of %zu layers", L - differ, L));
            check_q115_boundary("att", att, L * n_att);
            cudaCheck(cudaFree(att)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(lse));
        } else {
            check_q115_boundary("att", a.att, L * (size_t)B * NH * T * T);
        }
        check_q115_boundary("atty", a.atty, L * BT * C);
        check_q115_boundary("residual2", a.residual2, L * BT * C);
        check_q115_boundary("ln2", a.ln2, L * BT * C);
        check_q115_boundary("fch", a.fch, L * BT * 4 * C);
        check_q115_boundary("fch_gelu", a.fch_gelu, BT * 4 * C);
        check_q115_boundary("fcproj", a.btc_scratch, BT * C);
        check_q115_boundary("residual3", a.residual3, L * BT * C);
        check_q115_boundary("lnf", a.lnf, BT * C);
        check_q115_boundary("logits", a.logits, BT * (size_t)Vp);
        size_t bad = 0, at_one = 0;
        float bad_value = 0.0f;
        const bool passes = q115_tensor_holds_q115(model.params.t[P_QKVW], model.param_sizes[P_QKVW], &bad, &at_one, &bad_value);
        check(!passes, strfmt("the reality check rejects a tensor that is not quantized (qkv weights: %zu of %zu values "
                              "are not Q1.15)", bad, model.param_sizes[P_QKVW]));
    }
}
#endif

// gradients: each of the 16 parameter tensors' gradient within TOL_GRAD (relative L2) of the reference's
static void check_gradients(TestContext& c) {
    run_gradients(c);
    size_t off = 0;
    double worst = 0.0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = c.model.param_sizes[i];
        Diff d = compare(c.grads.data() + off, c.ref.grads.data() + off, n);
        worst = std::max(worst, d.rel_l2);
        check(d.rel_l2 <= TOL_GRAD, strfmt("grad %-9s rel L2 %.3e (tol %.2g), max abs %.3e", PARAM_NAMES[i], d.rel_l2, TOL_GRAD, d.max_abs));
        off += n;
    }
    printf("largest gradient rel L2 error: %.3e\n", worst);
}

// ln_slots: the LayerNorm outputs' slots (assign_ln_slots): a layer has a slot of its own exactly where its
// backward reads the output (the recipe's BF16 weight gradient), the others share one. With the first and last
// layers kept in BF16 (-sqf 1 -sql 1) a quantizing recipe mixes both kinds; one training step of that model gives
// the gradients of the same model with -r 2 (every slot shared, every read output recomputed in backward) bit for
// bit: a layer that read another layer's output would not
static void check_ln_slots(TestContext& c) {
    const ModelFileInfo& info = c.info;
    const Reference& ref = c.ref;
    const std::vector<float>& init_params = c.init_params;
    GPT& model = c.model;
    const int B = c.B, T = c.T;
    const size_t BT = c.BT;
    {
        const int L = info.shape.num_layers;
        auto slots_ok = [&](const GPT& m, const char* what) {
            const Activations& a = m.acts;
            bool ok = (int)a.ln1_slot.size() == L && (int)a.ln2_slot.size() == L;
            std::vector<int> owners1(L + 1, 0), owners2(L + 1, 0);
            int reading = 0;
            for (int l = 0; ok && l < L; l++) {
                const bool reads1 = m.recompute < 2 && recipe_needs_input_in_backward(m.recipe, {l, LIN_QKV}, (int)BT);
                const bool reads2 = m.recompute < 2 && recipe_needs_input_in_backward(m.recipe, {l, LIN_FC}, (int)BT);
                reading += reads1;
                const int s1 = a.ln1_slot[l], s2 = a.ln2_slot[l];
                ok = s1 >= 0 && s1 <= L && s2 >= 0 && s2 <= L && (s1 == a.ln_shared_slot) == !reads1 &&
                     (s2 == a.ln_shared_slot) == !reads2 && (!reads1 || ++owners1[s1] == 1) && (!reads2 || ++owners2[s2] == 1);
            }
            check(ok, strfmt("ln1/ln2 slots (%s): own slots for the %d layers whose backward reads the LayerNorm output, "
                             "one shared slot (%d) for the others", what, reading, m.acts.ln_shared_slot));
        };
        slots_ok(model, "the recipe's defaults, -r 1");
        RecipeOptions mixed = g_recipe_options;
        [](auto& o) { // (a recipe without -sqf / -sql, bf16's or q115's, has every layer alike)
            if constexpr (std::is_base_of_v<LayersKeptInBf16, std::decay_t<decltype(o)>>) { o.skip_first = 1; o.skip_last = 1; }
        }(mixed);
        GPT kept_ln, shared_ln;
        gpt_build(&kept_ln, info.shape);
        gpt_build(&shared_ln, info.shape);
        gpt_allocate(&kept_ln, B, T, 1, mixed);
        gpt_allocate(&shared_ln, B, T, 2, mixed);
        slots_ok(kept_ln, "-sqf 1 -sql 1, -r 1");
        slots_ok(shared_ln, "-sqf 1 -sql 1, -r 2");
        std::vector<float> g_mixed[2];
        GPT* pair[2] = {&kept_ln, &shared_ln};
        for (int k = 0; k < 2; k++) {
            gpt_set_params(pair[k], init_params);
            gpt_zero_grad(pair[k]);
            gpt_forward(pair[k], ref.inputs.data(), ref.targets.data(), B, T, true, 1.0f / BT);
            gpt_backward(pair[k], B, T);
            g_mixed[k] = device_floats(pair[k]->grads_memory, pair[k]->num_params);
        }
        check(same_bits(g_mixed[0], g_mixed[1]),
              "-sqf 1 -sql 1: the gradients with the kept LayerNorm outputs (-r 1) equal those with every one recomputed (-r 2) bit for bit");
        gpt_free(&kept_ln);
        gpt_free(&shared_ln);
    }
}

#if defined(ENABLE_Q115)
// Q1.15 only: one training step against BF16: the loss's and the gradients' deviation from the plain reference
// (argv[2]) is the one the float64 Q1.15 reference predicts
static void check_q115_vs_bf16(TestContext& c) {
    if (c.plain_dir.empty()) {
        printf("(no plain reference given as the second argument: the deviation from BF16 is not checked)\n");
        return;
    }
    if (!c.have_forward) run_forward(c);
    if (!c.have_grads) run_gradients(c);
    const Reference& ref = c.ref;
    const Reference plain = load_reference_state(c.plain_dir + "/ref_state.bin");
    if (plain.boundaries != 0 || plain.num_params != ref.num_params || plain.inputs != ref.inputs) {
        fprintf(stderr, "error: %s is not the plain reference of the same model and batch\n", c.plain_dir.c_str());
        exit(1);
    }
    const double dev_ours = std::fabs(c.forward_loss - plain.loss), dev_ref = std::fabs(ref.loss - plain.loss);
    check(std::fabs(dev_ours - dev_ref) <= TOL_LOSS,
          strfmt("one step vs BF16: loss deviates by %.4f (ours) vs %.4f (float64 Q1.15 reference), |diff| %.2e (tol %.0e)",
                 dev_ours, dev_ref, std::fabs(dev_ours - dev_ref), TOL_LOSS));
    const double g_ours = compare(c.grads.data(), plain.grads.data(), c.grads.size()).rel_l2;
    const double g_ref = compare(ref.grads.data(), plain.grads.data(), c.grads.size()).rel_l2;
    check(g_ours >= 0.5 * g_ref && g_ours <= 2.0 * g_ref + TOL_GRAD,
          strfmt("one step vs BF16: all gradients deviate by rel L2 %.3e (ours) vs %.3e (float64 Q1.15 reference)",
                 g_ours, g_ref));
}
#endif

static OptimizerSettings reference_optimizer(const Reference& ref) {
    return OptimizerSettings{ref.lr, ref.beta1, ref.beta2, ref.eps, ref.weight_decay, ref.grad_clip, 0};
}

// trajectory: 10 AdamW steps (constant lr, clipping as the reference), a fresh batch each, from the reference's
// parameters: every step's loss within TOL_LOSSES and its gradient norm within TOL_NORM (relative)
static void check_trajectory(TestContext& c) {
    const Reference& ref = c.ref;
    GPT& model = c.model;
    const int B = c.B, T = c.T;
    const size_t BT = c.BT;
    reset_model(c);
    const OptimizerSettings opt = reference_optimizer(ref);
    printf("step   ours        reference   |diff|     norm ours   norm ref\n");
    float max_loss_diff = 0.0f, max_norm_rel = 0.0f;
    for (int s = 0; s < ref.nsteps; s++) {
        gpt_zero_grad(&model);
        const int* x = ref.step_inputs.data() + (size_t)s * BT;
        const int* y = ref.step_targets.data() + (size_t)s * BT;
        float l = gpt_forward_loss(&model, x, y, B, T, true, 1.0f / BT);
        gpt_backward(&model, B, T);
        float norm = gpt_update(&model, opt);
        cudaCheck(cudaDeviceSynchronize());
        printf("%4d   %.6f   %.6f   %.2e   %.6f    %.6f\n", s, l, ref.losses[s], std::fabs(l - ref.losses[s]), norm, ref.grad_norms[s]);
        max_loss_diff = std::max(max_loss_diff, std::fabs(l - ref.losses[s]));
        max_norm_rel = std::max(max_norm_rel, std::fabs(norm - ref.grad_norms[s]) / ref.grad_norms[s]);
    }
    check(max_loss_diff <= TOL_LOSSES, strfmt("10-step losses: max |diff| %.3e (tol %.2g)", max_loss_diff, TOL_LOSSES));
    check(max_norm_rel <= TOL_NORM, strfmt("10-step grad norms: max rel diff %.3e (tol %.2g)", max_norm_rel, TOL_NORM));
}

// resume (on checkpoint_model's small model): 3 steps, save, 3 more; a model resumed from the checkpoint (with another -r) logs the same losses and
// ends with the same parameters, master weights, moments and state file (recipe state included) bit for bit;
// -r -1 picks the recompute setting the model's memory allows and logs the losses within TOL_KEPT_VS_RECOMPUTED;
// a checkpoint of another shape, seed, -t or optimizer sharding is refused with a message naming the flag
static void check_resume(TestContext& c) {
    const Reference& ref = c.ref;
    GPT& model = checkpoint_model(c);
    const ModelShape& shape = c.ck_shape;
    const int B = c.B, T = c.T;
    const size_t BT = c.BT;
    const std::string& ckdir = c.ckdir;
    const int total = 6, save_at = 3;
    DataLoaderState data_state; data_state.epoch = 2; data_state.shard_pos = 1; data_state.chunk_pos = 7;
    OptimizerSettings opt = reference_optimizer(ref);
    opt.seed = CHECKPOINT_SEED;
    auto run_steps = [&](GPT* m, int from, int to, std::vector<float>* losses) {
        for (int s = from; s < to; s++) {
            std::vector<int> x = rotated(ref.inputs, s), y = rotated(ref.targets, s);
            // (as the trainer: a recipe seeds its random streams from the step and the data slice)
            recipe_begin_step(m->recipe, s);
            recipe_begin_micro_step(m->recipe, 0);
            gpt_zero_grad(m);
            losses->push_back(gpt_forward_loss(m, x.data(), y.data(), B, T, true, 1.0f / BT));
            gpt_backward(m, B, T);
            gpt_update(m, opt);
        }
        cudaCheck(cudaDeviceSynchronize());
    };
    std::vector<float> losses_a;
    run_steps(&model, 0, save_at, &losses_a);
    try { save_checkpoint(&model, ckdir, save_at, data_state, opt.seed, 0, 1); }
    catch (const InputError& e) { check(false, strfmt("save_checkpoint: %s", e.what())); }
    // The refusals (checked at the end) read this checkpoint, which nothing changes from now on, and no GPU: each
    // reads and checksums the whole state file, so they run on a thread of their own beside the GPU work. A checkpoint of another shape is refused before its state file is read.
    struct Refusals { bool shape = false, seed = false, seq_len = false, sharding = false; };
    std::future<Refusals> refusals = std::async(std::launch::async, [&]() {
        Refusals got;
        ModelShape other = shape;
        other.num_layers += 1;
        try { check_checkpoint(ckdir, save_at, other, B, T, opt.seed, 0, 1); } catch (const InputError& e) { got.shape = strstr(e.what(), "shape") != nullptr; }
        try { check_checkpoint(ckdir, save_at, shape, B, T, opt.seed + 1, 0, 1); } catch (const InputError& e) { got.seed = strstr(e.what(), "-sd") != nullptr; }
        try { check_checkpoint(ckdir, save_at, shape, B, T + 1, opt.seed, 0, 1); } catch (const InputError& e) { got.seq_len = strstr(e.what(), "-t") != nullptr; }
        try { check_checkpoint(ckdir, save_at, shape, B, T, opt.seed, 0, 1, false, 2); } catch (const InputError& e) { got.sharding = strstr(e.what(), "-z 0") != nullptr; }
        return got;
    });
    // (so does reading the -r the checkpoint records, checked below)
    std::future<int> recorded_recompute = std::async(std::launch::async, [&]() { return checkpoint_recompute(ckdir, save_at, 0); });
    run_steps(&model, save_at, total, &losses_a);

    GPT resumed;
    gpt_build(&resumed, shape);
    gpt_allocate(&resumed, B, T, 2, g_recipe_options); // a different recompute setting must not change the numbers
    DataLoaderState restored_state;
    bool loaded = false;
    try {
        check(find_latest_checkpoint(ckdir) == save_at, "find_latest_checkpoint finds the saved step");
        check_checkpoint(ckdir, save_at, shape, B, T, opt.seed, 0, 1);
        load_checkpoint(&resumed, ckdir, save_at, &restored_state, 0);
        loaded = true;
    } catch (const InputError& e) { check(false, strfmt("load_checkpoint: %s", e.what())); }
    if (loaded) {
        check(memcmp(&restored_state, &data_state, sizeof(data_state)) == 0, "data loader position restored");
        check(resumed.adam_steps == save_at, "AdamW step count restored");
        std::vector<float> tail;
        run_steps(&resumed, save_at, total, &tail);
        bool same_losses = tail.size() == (size_t)(total - save_at);
        for (size_t i = 0; same_losses && i < tail.size(); i++) same_losses = memcmp(&tail[i], &losses_a[save_at + i], 4) == 0;
        check(same_losses, "resumed losses are bit-identical");
        const size_t N = model.num_params;
        check(device_bytes(model.params_memory, N) == device_bytes(resumed.params_memory, N), "resumed parameters are bit-identical");
        check(device_bytes(model.master_memory, N) == device_bytes(resumed.master_memory, N), "resumed master weights are bit-identical");
        check(device_bytes(model.m_memory, N) == device_bytes(resumed.m_memory, N) &&
              device_bytes(model.v_memory, N) == device_bytes(resumed.v_memory, N), "resumed AdamW moments are bit-identical");
        // the whole state file, recipe state included (FP8: scales, amax histories), byte for byte
        const std::string dir_a = ckdir + "/a", dir_b = ckdir + "/b";
        try {
            ensure_output_dir(dir_a);
            ensure_output_dir(dir_b);
            save_checkpoint(&model, dir_a, total, data_state, opt.seed, 0, 1);
            save_checkpoint(&resumed, dir_b, total, data_state, opt.seed, 0, 1);
            // every section byte for byte, except the record of -r (1 against the resumed model's 2)
            StateReader ra, rb;
            std::future<void> opened_b = std::async(std::launch::async, [&]() { rb.open(state_path(dir_b, total, 0)); });
            ra.open(state_path(dir_a, total, 0));
            opened_b.get();
            bool same_sections = ra.section_names() == rb.section_names();
            for (const std::string& name : ra.section_names()) {
                if (!same_sections || name == "recompute") continue;
                std::vector<unsigned char> ba(ra.size_of(name)), bb(rb.size_of(name));
                ra.read(name, ba.data(), ba.size());
                if (bb.size() == ba.size()) rb.read(name, bb.data(), bb.size());
                if (ba != bb) { printf("  section '%s' differs\n", name.c_str()); same_sections = false; }
            }
            int32_t rec_a = -1, rec_b = -1;
            if (ra.has("recompute")) ra.read("recompute", &rec_a, sizeof(rec_a));
            if (rb.has("recompute")) rb.read("recompute", &rec_b, sizeof(rec_b));
            check(same_sections && rec_a == 1 && rec_b == 2,
                  strfmt("resumed state files (optimizer and '%s' recipe state) are byte-identical section by section; "
                         "each records its own -r (%d, %d)", RECIPE_NAME, rec_a, rec_b));
        } catch (const InputError& e) { check(false, strfmt("save_checkpoint: %s", e.what())); }
        // (the two copies are not read again: their space goes back now)
        std::string remove_copies = "rm -rf '" + dir_a + "' '" + dir_b + "'";
        if (system(remove_copies.c_str()) != 0) fprintf(stderr, "warning: could not remove %s and %s\n", dir_a.c_str(), dir_b.c_str());
        // -r -1 (auto, the trainer's default): this small model's GELU outputs fit, so none is
        // recomputed. Kept (the fc GEMM epilogue's GELU) and recomputed (the GELU kernel's) outputs
        // differ in the last bits, so the losses after resuming from the -r 1 checkpoint are close
        // to the -r 1 model's, not equal; the checkpoint records -r 1 for a -r -1 resume.
        GPT kept;
        gpt_build(&kept, shape);
        gpt_allocate(&kept, B, T, -1, g_recipe_options);
        // (a recipe that reads no GELU output in backward, FP8 with its own x^T, keeps one buffer: -r 1)
        bool gelu_read_in_backward = false;
        for (int l = 0; l < shape.num_layers; l++)
            gelu_read_in_backward = gelu_read_in_backward || recipe_needs_input_in_backward(kept.recipe, {l, LIN_FCPROJ}, B * T);
        const int auto_want = gelu_read_in_backward ? 0 : 1;
        check(kept.recompute == auto_want && kept.recompute_auto,
              strfmt("-r -1 keeps every GELU output of a small model where backward reads them, else one buffer (want -r %d, chose -r %d)",
                     auto_want, kept.recompute));
        try {
            check(recorded_recompute.get() == 1, "the checkpoint records the -r it was written with (1)");
            load_checkpoint(&kept, ckdir, save_at, &restored_state, 0);
            std::vector<float> tail_kept;
            run_steps(&kept, save_at, total, &tail_kept);
            double worst = tail_kept.size() == (size_t)(total - save_at) ? 0.0 : INFINITY;
            for (size_t i = 0; i < tail_kept.size(); i++) worst = std::max(worst, (double)std::fabs(tail_kept[i] - losses_a[save_at + i]));
            check(worst <= TOL_KEPT_VS_RECOMPUTED,
                  strfmt("no recompute (-r 0) logs the losses of -r 1 within %.0e after resuming (max |diff| %.2e)",
                         TOL_KEPT_VS_RECOMPUTED, worst));
        } catch (const InputError& e) { check(false, strfmt("load_checkpoint (-r -1): %s", e.what())); }
    }
    const Refusals refused = refusals.get();
    check(refused.shape, "a checkpoint of another shape is refused with a message naming the shape");
    check(refused.seed, "resuming with another seed is refused with a message naming -sd");
    check(refused.seq_len, "resuming with another -t is refused with a message naming -t");
    check(refused.sharding, "resuming a whole optimizer state as a ZeRO-1 shard is refused with a message naming -z");
}

// zero1 (on checkpoint_model's small model): ZeRO-1 on one GPU: two models that each own half of every parameter block (zero.h), given the summed
// gradients a reduce-scatter would leave them, take the optimizer step of their pieces bit-identically to the
// model that owns everything (moments, master weights, parameters with stochastic rounding) for 3 steps, the norms
// of their pieces add up to the whole norm, and a shard's checkpoint round-trips bit for bit and is refused as a
// whole state (-z 0)
static void check_zero1(TestContext& c) {
    const Reference& ref = c.ref;
    GPT& model = checkpoint_model(c);
    const ModelShape& shape = c.ck_shape;
    const std::vector<float>& init_params = c.ck_init;
    const int B = c.B, T = c.T;
    const size_t BT = c.BT;
    DataLoaderState data_state; data_state.epoch = 2; data_state.shard_pos = 1; data_state.chunk_pos = 7;
    OptimizerSettings opt = reference_optimizer(ref);
    opt.seed = CHECKPOINT_SEED;
    {
        const int P = 2;
        GPT shards[P];
        for (int r = 0; r < P; r++) {
            gpt_build(&shards[r], shape, r, P);
            gpt_allocate(&shards[r], B, T, 1, g_recipe_options);
            gpt_set_params(&shards[r], init_params);
        }
        check(shards[0].shard.shard_elements * P == model.num_params, "ZeRO-1: each of 2 processes owns half of the optimizer state");
        OptimizerSettings zopt = opt;
        zopt.grad_clip = 0.0f; // (the clip scale reads the norm over every process: not available without NCCL)
        const size_t N = model.num_params;
        bool same_pieces = true, same_state = true;
        double worst_norm = 0.0;
        for (int s = 0; s < 3; s++) {
            const int* x = ref.step_inputs.data() + (size_t)s * BT;
            const int* y = ref.step_targets.data() + (size_t)s * BT;
            gpt_zero_grad(&model);
            gpt_forward_loss(&model, x, y, B, T, true, 1.0f / BT);
            gpt_backward(&model, B, T);
            for (int r = 0; r < P; r++)
                cudaCheck(cudaMemcpy(shards[r].grads_memory, model.grads_memory, N * sizeof(float), cudaMemcpyDeviceToDevice));
            const double norm = gpt_update(&model, zopt);
            double sum_sq = 0.0;
            for (int r = 0; r < P; r++) { double n = gpt_update(&shards[r], zopt); sum_sq += n * n; }
            worst_norm = std::max(worst_norm, std::fabs(std::sqrt(sum_sq) - norm) / norm);
            cudaCheck(cudaDeviceSynchronize());
            // the parameters every step (the next step's all-gather is built from them); the master weights and
            // moments after the last one (recurrences: a difference at any step is still there at the end)
            const bool last = s == 2;
            const std::vector<floatX> full = device_vector(model.params_memory, N);
            const std::vector<float> full_master = last ? device_vector(model.master_memory, N) : std::vector<float>();
            const std::vector<float> full_m = last ? device_vector(model.m_memory, N) : std::vector<float>();
            const std::vector<float> full_v = last ? device_vector(model.v_memory, N) : std::vector<float>();
            std::vector<floatX> gathered(N);
            for (int r = 0; r < P; r++) {
                const ShardLayout& lay = shards[r].shard;
                const std::vector<floatX> mine = device_vector(shards[r].params_memory, N);
                // piece by piece (each is contiguous in the full buffers: zero.h); an element only where they differ
                for (size_t ti = 0; ti < lay.tensors.size(); ti++) {
                    const ShardedTensor& t = lay.tensors[ti];
                    for (size_t b = 0; b < t.rows; b++) {
                        const size_t f0 = t.full_index(b * t.piece);
                        if (same_pieces && memcmp(&mine[f0], &full[f0], t.piece * sizeof(floatX)) != 0) {
                            size_t i = 0;
                            while (memcmp(&mine[f0 + i], &full[f0 + i], sizeof(floatX)) == 0) i++;
                            const size_t j = b * t.piece + i, f = f0 + i;
                            float master_mine = 0.0f, master_full = 0.0f;
                            cudaCheck(cudaMemcpy(&master_mine, shards[r].master_memory + t.shard_offset + j, sizeof(float), cudaMemcpyDeviceToHost));
                            cudaCheck(cudaMemcpy(&master_full, model.master_memory + f, sizeof(float), cudaMemcpyDeviceToHost));
                            printf("  first difference: step %d, process %d, tensor %s, shard index %zu (full %zu): %.9g vs %.9g, "
                                   "master %.9g vs %.9g\n", s, r, PARAM_NAMES[ti], j, f, (float)mine[f], (float)full[f],
                                   master_mine, master_full);
                            same_pieces = false;
                        }
                        std::copy_n(&mine[f0], t.piece, &gathered[f0]);
                    }
                }
                const size_t NS = lay.shard_elements;
                same_state = same_state && (!last || same_bits(device_vector(shards[r].master_memory, NS), lay.extract(full_master.data())) &&
                             same_bits(device_vector(shards[r].m_memory, NS), lay.extract(full_m.data())) &&
                             same_bits(device_vector(shards[r].v_memory, NS), lay.extract(full_v.data())));
            }
            // the all-gather: every process's pieces to everyone
            for (int r = 0; r < P; r++)
                cudaCheck(cudaMemcpy(shards[r].params_memory, gathered.data(), N * sizeof(floatX), cudaMemcpyHostToDevice));
        }
        check(same_pieces, "ZeRO-1: the parameters each process updates are bit-identical to the unsharded step's (3 steps)");
        check(same_state, "ZeRO-1: each process's master weights and AdamW moments are its pieces of the unsharded ones, bit for bit (after 3 steps)");
        check(worst_norm <= 1e-5, strfmt("ZeRO-1: the norms of the pieces add up to the whole gradient norm (rel diff %.2e)", worst_norm));
        // a shard's checkpoint: written and read back bit-identically, and refused as a whole state
        const std::string zdir = c.ckdir + "/zero";
        bool round_trip = false, refused_whole = false;
        try {
            ensure_output_dir(zdir);
            save_checkpoint(&shards[1], zdir, 3, data_state, opt.seed, 1, 2);
            save_checkpoint(&shards[0], zdir, 3, data_state, opt.seed, 0, 2); // (rank 0 last: it marks the checkpoint done)
            GPT back;
            gpt_build(&back, shape, 1, 2);
            gpt_allocate(&back, B, T, 1, g_recipe_options);
            check_checkpoint(zdir, 3, shape, B, T, opt.seed, 1, 2, false, 2);
            DataLoaderState st;
            load_checkpoint(&back, zdir, 3, &st, 1);
            const size_t NS = back.shard.shard_elements;
            round_trip = device_bytes(back.master_memory, NS) == device_bytes(shards[1].master_memory, NS) &&
                         device_bytes(back.v_memory, NS) == device_bytes(shards[1].v_memory, NS);
            try { check_checkpoint(zdir, 3, shape, B, T, opt.seed, 1, 2, false, 1); }
            catch (const InputError& e) { refused_whole = strstr(e.what(), "-z 1") != nullptr; }
        } catch (const InputError& e) { check(false, strfmt("ZeRO-1 checkpoint: %s", e.what())); }
        check(round_trip, "ZeRO-1: a process's shard of the optimizer state survives save and load bit for bit");
        check(refused_whole, "ZeRO-1: resuming a sharded checkpoint with -z 0 is refused with a message naming -z");
    }
}

// skip (two fresh models of checkpoint_model's shape): a step whose backward pass meets a NaN (injected where
// LLMC_TEST_NAN_AT=grad puts it) has a non-finite gradient norm; its skipped update (gpt_skip_update) leaves the
// parameters, master weights, AdamW moments and step count as they were, bit for bit; and the run then goes on
// exactly as a run that never took that step: two more steps give bit-identical losses, parameters, master
// weights and moments (so the recipe's state kept nothing of the skipped step: FP8's NaN amaxes would have moved
// the scales the last step quantizes with). And the spike windows' checkpoint section round-trips; a state file
// without it loads with empty windows.
static void check_skip(TestContext& c) {
    const Reference& ref = c.ref;
    checkpoint_model(c); // (its shape and initial parameters)
    const int B = c.B, T = c.T;
    const size_t BT = c.BT;
    OptimizerSettings opt = reference_optimizer(ref);
    opt.seed = CHECKPOINT_SEED;
    GPT skipping, plain;
    for (GPT* m : {&skipping, &plain}) {
        gpt_build(m, c.ck_shape);
        gpt_allocate(m, B, T, 1);
        gpt_set_params(m, c.ck_init);
    }
    // one step on the reference batch rotated by `batch`, numbered `step` for the recipe's random streams, as the
    // trainer takes it; with a NaN in the backward pass's input, skipped
    auto train_step = [&](GPT* m, int step, int batch, bool nan, float* norm) {
        std::vector<int> x = rotated(ref.inputs, batch), y = rotated(ref.targets, batch);
        recipe_begin_step(m->recipe, step);
        recipe_begin_micro_step(m->recipe, 0);
        gpt_zero_grad(m);
        const float loss = gpt_forward_loss(m, x.data(), y.data(), B, T, true, 1.0f / BT);
        if (nan) inject_nan(m->acts.dbtc, m->stream);
        gpt_backward(m, B, T);
        *norm = gpt_grad_norm(m);
        if (nan) gpt_skip_update(m);
        else gpt_apply_update(m, opt, *norm);
        cudaCheck(cudaDeviceSynchronize());
        return loss;
    };
    const size_t N = skipping.num_params;
    auto state_of = [&](const GPT& m) {
        return std::vector<std::vector<uint8_t>>{device_bytes(m.params_memory, N), device_bytes(m.master_memory, N),
                                                 device_bytes(m.m_memory, N), device_bytes(m.v_memory, N)};
    };
    float norm = 0.0f, norm_plain = 0.0f;
    train_step(&skipping, 0, 0, false, &norm);
    train_step(&plain, 0, 0, false, &norm_plain);
    const auto before = state_of(skipping);
    train_step(&skipping, 1, 1, true, &norm);
    check(!std::isfinite(norm), strfmt("a NaN in the backward pass gives a non-finite gradient norm (%g)", norm));
    check(state_of(skipping) == before && skipping.adam_steps == 1,
          "a skipped update leaves the parameters, master weights, AdamW moments and step count bit for bit");
    bool same_losses = true;
    for (int s = 2; s < 4; s++) {
        const float a = train_step(&skipping, s, s, false, &norm), b = train_step(&plain, s, s, false, &norm_plain);
        same_losses = same_losses && memcmp(&a, &b, sizeof(a)) == 0 && memcmp(&norm, &norm_plain, sizeof(norm)) == 0;
    }
    check(same_losses, "after the skipped step, two steps log the losses and norms of a run without it, bit for bit");
    check(state_of(skipping) == state_of(plain),
          "after the skipped step and two more, parameters, master weights and moments equal a run without it, bit for bit");
    // the windows in the checkpoint: read back as written; a state file without them (written before they were
    // kept) loads with empty windows and no skips counted
    SpikeGuard guard;
    for (int i = 0; i < kSpikeWindow + 3; i++) guard.record(guard.judge(3.0 + 0.01 * (i % 7), 1.0 + 0.1 * (i % 3)), 3.0 + 0.01 * (i % 7), 1.0 + 0.1 * (i % 3));
    guard.record(guard.judge(NAN, 1.0), NAN, 1.0);
    const std::string dir = c.ckdir + "/skip";
    DataLoaderState data_state, restored;
    SpikeGuard with_window, without_window = guard;
    try {
        ensure_output_dir(dir);
        save_checkpoint(&skipping, dir, 4, data_state, opt.seed, 0, 1, 1, &guard);
        save_checkpoint(&skipping, dir, 5, data_state, opt.seed, 0, 1, 1, nullptr);
        check_checkpoint(dir, 4, c.ck_shape, B, T, opt.seed, 0, 1);
        load_checkpoint(&plain, dir, 4, &restored, 0, &with_window);
        load_checkpoint(&plain, dir, 5, &restored, 0, &without_window);
    } catch (const InputError& e) { check(false, strfmt("skip: checkpoint: %s", e.what())); }
    check(with_window.to_bytes() == guard.to_bytes() && with_window.skipped[SKIP_NAN_LOSS] == 1,
          "the spike windows and skip counts survive save and load bit for bit");
    check(without_window.loss.count == 0 && without_window.norm.count == 0 && without_window.total_skipped() == 0,
          "a state file without the spike windows loads with empty windows");
}

// The reference's multiple-choice examples (ref_hellaswag.bin, llm.c's eval file format) and the float64 mean loss
// of each ending at the reference's parameters, and each example's choice (ref_hellaswag_scores.bin; both written
// by gpt_reference.py). Returns an empty string, or what is wrong.
struct EvalReference {
    std::vector<EvalExample> examples;
    std::vector<std::vector<double>> losses;  // per example, per ending
    std::vector<int> choices;
};
static std::string load_eval_reference(const std::string& dir, int V, int T, EvalReference* er) {
    const std::string hint = "; rewrite the reference with dev/reference/gpt_reference.py --write-reference";
    try { er->examples = read_eval_file(dir + "/ref_hellaswag.bin", V, T); }
    catch (const InputError& e) { return e.what() + hint; }
    const std::string path = dir + "/ref_hellaswag_scores.bin";
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return "cannot open " + path + hint;
    int header[256] = {0};
    size_t endings = 0;
    for (const EvalExample& ex : er->examples) endings += ex.endings.size();
    std::vector<double> losses(endings);
    er->choices.assign(er->examples.size(), -1);
    const bool ok = fread(header, 4, 256, f) == 256 && header[0] == 20241124 && header[1] == 1 &&
                    header[2] == (int)er->examples.size() && header[3] == (int)endings &&
                    header[4] == EXPECTED_REFERENCE_BOUNDARIES && fread(losses.data(), 8, endings, f) == endings &&
                    fread(er->choices.data(), 4, er->choices.size(), f) == er->choices.size() && fgetc(f) == EOF;
    fclose(f);
    if (!ok) return path + " is not the scores of ref_hellaswag.bin under this build's boundaries" + hint;
    size_t k = 0;
    for (const EvalExample& ex : er->examples) {
        er->losses.emplace_back(losses.begin() + k, losses.begin() + k + ex.endings.size());
        k += ex.endings.size();
    }
    return "";
}

// hellaswag: the trainer's HellaSwag scoring (llmc/hellaswag.h on gpt_forward_token_losses) of the reference's
// examples at the reference's parameters. Every ending's mean loss within TOL_ENDING_LOSS of the float64 one, and
// the same choice wherever the reference's best ending leads the second by more than 2 TOL_ENDING_LOSS (where each
// of the two may be off by TOL_ENDING_LOSS the order may flip; a recipe whose bound is wider than every lead says
// so, and its choices are not compared); the correct count is that of the choices. Then the same examples split
// over three processes: each scored once, with the same losses bit for bit (an example's batch does not depend on
// the number of processes); and in batches of 10 rows (two examples of four endings and padding, or other mixes)
// on a model of that size: within TOL_ENDING_LOSS again.
static void check_hellaswag(TestContext& c) {
    gpt_set_params(&c.model, c.init_params);
    EvalReference er;
    const std::string why = load_eval_reference(c.dir, c.info.shape.vocab_size, c.T, &er);
    if (!why.empty()) { check(false, "hellaswag: " + why); return; }
    const size_t N = er.examples.size();
    auto compare_with_reference = [&](const std::vector<EvalScore>& scores, const EvalCounts& counts, int B) {
        double worst = 0.0, sum_diff = 0.0;
        size_t endings = 0, decisive = 0, same_decisive = 0, same_all = 0;
        int64_t correct = 0;
        for (size_t i = 0; i < N; i++) {
            const std::vector<double>& want = er.losses[i];
            if (scores[i].ending_loss.size() != want.size()) { worst = INFINITY; continue; }
            for (size_t e = 0; e < want.size(); e++) {
                const double d = std::fabs(scores[i].ending_loss[e] - want[e]);
                worst = std::max(worst, std::isfinite(d) ? d : INFINITY);
                sum_diff += d;
                endings++;
            }
            std::vector<double> sorted = want;
            std::sort(sorted.begin(), sorted.end());
            const bool is_decisive = sorted[1] - sorted[0] > 2.0 * TOL_ENDING_LOSS;
            decisive += is_decisive;
            same_decisive += is_decisive && scores[i].choice == er.choices[i];
            same_all += scores[i].choice == er.choices[i];
            correct += scores[i].choice == er.examples[i].label;
        }
        check(worst <= TOL_ENDING_LOSS, strfmt("hellaswag (B=%d): %zu endings' mean losses within %.1e of the reference: max "
                                               "|diff| %.3e, mean %.3e", B, endings, TOL_ENDING_LOSS, worst,
                                               sum_diff / std::max<size_t>(endings, 1)));
        if (decisive > 0)
            check(same_decisive == decisive,
                  strfmt("hellaswag (B=%d): the reference's choice in %zu of the %zu examples whose best ending leads by more "
                         "than %.1e (%zu of all %zu)", B, same_decisive, decisive, 2.0 * TOL_ENDING_LOSS, same_all, N));
        else
            printf("[NOTE] hellaswag (B=%d): no example's best ending leads by more than %.1e (2 TOL_ENDING_LOSS), so this "
                   "recipe's choices are not compared (the reference's in %zu of %zu)\n", B, 2.0 * TOL_ENDING_LOSS, same_all, N);
        check(counts.examples == (int64_t)N && counts.correct == correct,
              strfmt("hellaswag (B=%d): %lld of %lld examples correct, as the choices say (%lld)", B, (long long)counts.correct,
                     (long long)counts.examples, (long long)correct));
    };
    auto forward_of = [](GPT* m, int B, int T) {
        return [m, B, T](const int* in, const int* tg, float* losses) { gpt_forward_token_losses(m, in, tg, B, T, losses); };
    };
    // one process, the test's batches of B = 4 rows
    const std::vector<EvalBatch> batches = pack_eval_batches(er.examples, c.B);
    std::vector<EvalScore> scores;
    const EvalCounts counts = score_eval_examples(er.examples, batches, c.B, c.T, 0, 1, forward_of(&c.model, c.B, c.T), &scores);
    compare_with_reference(scores, counts, c.B);
    // three processes, each its share
    std::vector<int> times_scored(N, 0);
    bool same_bits_as_one = true;
    EvalCounts sum;
    for (int rank = 0; rank < 3; rank++) {
        std::vector<EvalScore> mine;
        const EvalCounts part = score_eval_examples(er.examples, batches, c.B, c.T, rank, 3, forward_of(&c.model, c.B, c.T), &mine);
        sum.correct += part.correct;
        sum.examples += part.examples;
        for (size_t i = 0; i < N; i++) {
            if (mine[i].ending_loss.empty()) continue;
            times_scored[i]++;
            same_bits_as_one = same_bits_as_one && mine[i].ending_loss == scores[i].ending_loss && mine[i].choice == scores[i].choice;
        }
    }
    const bool once = std::all_of(times_scored.begin(), times_scored.end(), [](int n) { return n == 1; });
    check(once && same_bits_as_one && sum.correct == counts.correct && sum.examples == counts.examples,
          strfmt("hellaswag: split over 3 processes, every example is scored once with the losses of one process bit for bit "
                 "(%lld of %lld correct, summed)", (long long)sum.correct, (long long)sum.examples));
    // batches of 10 rows
    const int B10 = 10;
    GPT wide;
    gpt_build(&wide, c.info.shape);
    gpt_allocate(&wide, B10, c.T, 1);
    gpt_set_params(&wide, c.init_params);
    std::vector<EvalScore> scores10;
    const EvalCounts counts10 = score_eval_examples(er.examples, pack_eval_batches(er.examples, B10), B10, c.T, 0, 1,
                                                    forward_of(&wide, B10, c.T), &scores10);
    compare_with_reference(scores10, counts10, B10);
    gpt_free(&wide);
}

// The checks in the order they run (see the top of the file)
struct NamedCheck { const char* name; void (*run)(TestContext&); };
static const NamedCheck CHECKS[] = {
    {"forward", check_forward},
    {"hellaswag", check_hellaswag},
#if defined(ENABLE_Q115)
    {"q115_boundaries", check_q115_boundaries},
#endif
    {"gradients", check_gradients},
    {"ln_slots", check_ln_slots},
#if defined(ENABLE_Q115)
    {"q115_vs_bf16", check_q115_vs_bf16},
#endif
    {"trajectory", check_trajectory},
    {"resume", check_resume},
    {"zero1", check_zero1},
    {"skip", check_skip},
};

// A scratch directory for the checkpoints: a whole one of checkpoint_model is about 0.2 GB (BF16 model file, FP32
// master weights and moments), and at most three are there at once. Every checkpoint write fsyncs (checkpoint.h):
// on a disk that costs seconds per gigabyte, in memory nothing. So $TEST_GPT_TMPDIR if set, else /dev/shm where
// it has 4 GiB free (room for several of these tests at once), else /tmp.
static std::string make_checkpoint_dir() {
    std::vector<std::string> places;
    if (const char* env = getenv("TEST_GPT_TMPDIR")) places.push_back(env);
    struct statvfs fs;
    if (statvfs("/dev/shm", &fs) == 0 && (double)fs.f_bavail * fs.f_frsize >= 4.0 * (1ull << 30)) places.push_back("/dev/shm");
    places.push_back("/tmp");
    for (const std::string& place : places) {
        std::string tmpl = place + "/test_gpt_ckpt_XXXXXX";
        if (mkdtemp(tmpl.data())) return tmpl;
    }
    perror("mkdtemp");
    exit(1);
}

static void usage_names() {
    fprintf(stderr, "checks:");
    for (const NamedCheck& k : CHECKS) fprintf(stderr, " %s", k.name);
    fprintf(stderr, "\n");
}

int main(int argc, char** argv) {
    // arguments: REF [PLAIN_REF] [--only NAME[,NAME...]] [--recipe "FLAGS"] [--list]
    std::vector<std::string> positional;
    std::set<std::string> only;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--list") { for (const NamedCheck& k : CHECKS) printf("%s\n", k.name); return 0; }
        if (a == "--recipe") {
            if (i + 1 >= argc) { fprintf(stderr, "error: --recipe needs the recipe's flags in one argument, e.g. \"-fs block\"\n"); return 2; }
            try { parse_recipe_flags(argv[++i]); }
            catch (const InputError& e) { fprintf(stderr, "error: %s\n", e.what()); return 2; }
            continue;
        }
        if (a == "--only") {
            if (i + 1 >= argc) { fprintf(stderr, "error: --only needs a comma-separated list of checks\n"); usage_names(); return 2; }
            std::stringstream names(argv[++i]);
            for (std::string n; std::getline(names, n, ',');) {
                bool known = false;
                for (const NamedCheck& k : CHECKS) known = known || n == k.name;
                if (!known) { fprintf(stderr, "error: --only: no check named '%s' in this build\n", n.c_str()); usage_names(); return 2; }
                only.insert(n);
            }
        } else if (a.rfind("--", 0) == 0) {
            fprintf(stderr, "usage: %s [REF_DIR [PLAIN_REF_DIR]] [--only NAME[,NAME...]] [--recipe \"FLAGS\"] [--list]\n", argv[0]);
            usage_names();
            return 2;
        } else {
            positional.push_back(a);
        }
    }
    TestContext c;
    c.dir = positional.size() > 0 ? positional[0] : "dev/reference/out";
    c.plain_dir = positional.size() > 1 ? positional[1] : "";
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("test_gpt: recipe %s, precision %s, device %s, reference %s\n", RECIPE_NAME, PRECISION_NAME, prop.name, c.dir.c_str());
    matmul_init();

    const std::string model_file = c.dir + "/ref_model.bin";
    try { c.info = read_model_header(model_file); }
    catch (const InputError& e) { fprintf(stderr, "error: %s\n", e.what()); return 1; }
    c.ref = load_reference_state(c.dir + "/ref_state.bin");
    if (c.ref.boundaries != EXPECTED_REFERENCE_BOUNDARIES) {
        fprintf(stderr, "error: %s/ref_state.bin was written with boundaries %d; this build needs the reference written "
                "with %s\n", c.dir.c_str(), c.ref.boundaries, REFERENCE_FLAG);
        return 1;
    }
    gpt_build(&c.model, c.info.shape);
    if ((size_t)c.ref.num_params != c.model.num_params || c.ref.Vp != c.info.shape.padded_vocab_size) {
        fprintf(stderr, "error: reference state and model file disagree\n");
        return 1;
    }
    c.B = c.ref.B; c.T = c.ref.T;
    c.BT = (size_t)c.B * c.T;
    gpt_allocate(&c.model, c.B, c.T, 1, g_recipe_options);
    printf("test_gpt: %s\n", recipe_describe(c.model.recipe).c_str());
#if defined(ENABLE_CUDNN) && !defined(ENABLE_FP32)
    // (train_gpt_<recipe>_cudnn / USE_CUDNN=1: every check then covers cuDNN's attention)
    check(c.model.cudnn_attention || Boundaries::ACTIVE, "the model's attention runs on cuDNN (a cuDNN build)");
#endif
    c.init_params = read_params_fp32(model_file, c.info, c.model.num_params);
    gpt_set_params(&c.model, c.init_params);
    c.ckdir = make_checkpoint_dir();

    for (const NamedCheck& k : CHECKS) {
        if (!only.empty() && !only.count(k.name)) continue;
        printf("== %s\n", k.name);
        const auto started = std::chrono::steady_clock::now();
        k.run(c);
        printf("(%s: %.1f s)\n", k.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }

    std::string cleanup = "rm -rf '" + c.ckdir + "'";
    if (system(cleanup.c_str()) != 0) fprintf(stderr, "warning: could not remove %s\n", c.ckdir.c_str());

    matmul_free();
    printf("test_gpt_%s: %d passed, %d failed\n", RECIPE_NAME, g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
