// test_gpt.cu: the trainer against the PyTorch reference (dev/reference/gpt_reference.py).
//
//   python3 dev/reference/gpt_reference.py --write-reference --out dev/reference/out
//   ./test_gpt_fp32 dev/reference/out      (FP32 build: tight tolerances)
//   ./test_gpt_bf16 dev/reference/out      (BF16 build: BF16 tolerances)
//
// The reference (float64 on the CPU, a seeded d12 with perturbed norms and biases, B=4, T=64) gives
// the parameters, one batch, its logits, loss, every parameter gradient, and the losses of 10
// AdamW steps, each on a fresh batch (step 0 on that batch). This test loads the same parameters
// and checks, in order:
//   1. logits and loss of the forward pass,
//   2. each of the 16 gradient tensors (relative L2 error, per-tensor tolerance below),
//   3. the 10-step loss trajectory and gradient norms,
//   4. that save -> resume continues bit-identically (parameters, master weights, moments, losses).
// Tolerances (relative L2 error ||ours - ref|| / ||ref||, or absolute for losses) are written here and
// in doc/testing.md. The FP32 build computes in true FP32 (no TF32), so its errors are rounding noise;
// the BF16 build stores parameters and activations in BF16 (8 mantissa bits, ~0.4% per value).
//
// The Q1.15 build (test_gpt_q115) is compared with the reference written with --boundaries q115
// (every forward boundary through simulate_q115 in float64), and additionally checks
//   5. the seed's reality check: after a forward pass every boundary tensor holds only Q1.15 values
//      (each element of each tensor, not a sample), and the check rejects a tensor that does not,
//   6. the deviation of one training step from BF16 (given the plain reference as a second
//      argument): the loss and gradients differ from the BF16 reference by what the float64 Q1.15
//      reference predicts.
#define TESTING
#include "train_gpt.cu"
#include <sys/stat.h>
#include <unistd.h>

#if defined(ENABLE_FP32)
static const float TOL_LOGITS = 1e-5f;   // relative L2
static const float TOL_LOSS = 1e-5f;     // absolute
static const float TOL_GRAD = 1e-4f;     // relative L2, every tensor
static const float TOL_LOSSES = 1e-4f;   // absolute, each of the 10 steps (issue #2)
static const float TOL_NORM = 1e-4f;     // relative
#elif defined(RECIPE_FP8) || defined(RECIPE_TCFP12)
// FP8-hybrid against the FP32 reference, and TCFP-12, which quantizes x (E4M3) and dy (E5M2) the
// same way while its weights (W_hi + W_lo) hold the BF16 weight to about 2^-8 (measured on an H100,
// 2026-11-23: logits 5.5e-2, gradients up to 0.109, losses within 4.3e-3, norms within 0.76%). One E4M3 rounding is off by at most 2^-4 relative (E5M2:
// 2^-3), about 2^-4/sqrt(3) = 3.6% (7.2%) RMS; a GEMM's output inherits roughly the combined RMS of
// its two operands, so the forward (E4M3 x E4M3) lands near 5% and the gradients (E5M2 x E4M3, then
// several layers deep) near 10%. The bounds below are about twice that: loose enough for FP8, tight
// enough that a wrong scale, a transposed operand or a missing amax (errors of order 1) fails.
static const float TOL_LOGITS = 1e-1f;
static const float TOL_LOSS = 5e-2f;
static const float TOL_GRAD = 2.5e-1f;
static const float TOL_LOSSES = 5e-2f;
static const float TOL_NORM = 1e-1f;
#elif defined(RECIPE_VCAST)
// vcast with its defaults (MXFP8: E4M3 weights and activations, E5M2 gradients, one power-of-two
// scale per 32 values) against the FP32 reference: per-block scales put every block at the top of
// its range, so the errors are about those of FP8-hybrid's per-tensor scaling. Measured on an H100
// (2026-11-22): logits 0.099, gradients up to 0.147, losses within 6.5e-3, grad norms within 1.6%.
static const float TOL_LOGITS = 2e-1f;
static const float TOL_LOSS = 5e-2f;
static const float TOL_GRAD = 2.5e-1f;
static const float TOL_LOSSES = 5e-2f;
static const float TOL_NORM = 1e-1f;
#elif defined(RECIPE_NVFP4)
// NVFP4 against the FP32 reference. E2M1 has one mantissa bit: one rounding is off by up to 1/6 of
// the block's range, about 10% RMS relative per operand on normal data, and the reference model's
// small random-init logits amplify that. d12 keeps its last 2 layers in BF16 (the recipe's default).
// Measured on an H100 (2026-11-22): logits 0.325, gradients up to 0.446, losses within 8.3e-3, grad
// norms within 4.5%. The bounds are about 1.5-2.5x that: loose enough for FP4, tight enough that a
// lost global scale (alpha), a transposed block layout or a rotation without its inverse fails.
static const float TOL_LOGITS = 5e-1f;
static const float TOL_LOSS = 2e-2f;
static const float TOL_GRAD = 7e-1f;
static const float TOL_LOSSES = 2e-2f;
static const float TOL_NORM = 1e-1f;
#else
// BF16, and Q1.15 against the float64 Q1.15 reference (its BF16 storage rounds the clamp value
// 32735/32768 to 1.0; measured on an H100, 2026-11-23: logits 8.5e-3, loss 2.4e-5, gradients <= 1.07e-2,
// losses 4.2e-4, norms 2.0e-3)
static const float TOL_LOGITS = 2e-2f;   // measured 1.14e-2 on an H200 (doc/testing.md)
static const float TOL_LOSS = 1e-2f;
static const float TOL_GRAD = 5e-2f;
static const float TOL_LOSSES = 2e-2f;   // issue #2
static const float TOL_NORM = 2e-2f;
#endif
// The losses of a model that keeps its GELU outputs against one that recomputes them (-r 0 against -r 1,
// after resuming the same checkpoint), absolute, each step: the fc GEMM epilogue's GELU and the GELU
// kernel differ in the last bits of a few outputs. Under NVFP4 a last-bit change can move an element
// across an E2M1 rounding boundary, a whole quantum (up to a sixth of its block's range), so the two runs
// drift apart like two runs with different rounding: measured 4.8e-3 on an H100 (2026-11-26, the SR bits
// of nvfp4_sr_bits16), below 2e-3 with the bits before. The bound is half of TOL_LOSSES there.
#if defined(RECIPE_NVFP4)
static const float TOL_KEPT_VS_RECOMPUTED = 1e-2f;
#else
static const float TOL_KEPT_VS_RECOMPUTED = 2e-3f;
#endif

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
// The seed's reality check on one device tensor: every element is a Q1.15 value. An FP32 tensor (the
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

int main(int argc, char** argv) {
    const std::string dir = argc > 1 ? argv[1] : "dev/reference/out";
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("test_gpt: recipe %s, precision %s, device %s, reference %s\n", RECIPE_NAME, PRECISION_NAME, prop.name, dir.c_str());
    matmul_init();

    const std::string model_file = dir + "/ref_model.bin";
    ModelFileInfo info;
    try { info = read_model_header(model_file); }
    catch (const InputError& e) { fprintf(stderr, "error: %s\n", e.what()); return 1; }
    Reference ref = load_reference_state(dir + "/ref_state.bin");
    if (ref.boundaries != EXPECTED_REFERENCE_BOUNDARIES) {
        fprintf(stderr, "error: %s/ref_state.bin was written with boundaries %d; this build needs the reference written "
                "with %s\n", dir.c_str(), ref.boundaries, REFERENCE_FLAG);
        return 1;
    }
    GPT model;
    gpt_build(&model, info.shape);
    if ((size_t)ref.num_params != model.num_params || ref.Vp != info.shape.padded_vocab_size) {
        fprintf(stderr, "error: reference state and model file disagree\n");
        return 1;
    }
    const int B = ref.B, T = ref.T, Vp = ref.Vp;
    const size_t BT = (size_t)B * T;
    gpt_allocate(&model, B, T, 1);
#if defined(ENABLE_CUDNN) && !defined(ENABLE_FP32)
    // (train_gpt_<recipe>_cudnn / USE_CUDNN=1: everything below then checks cuDNN's attention)
    check(model.cudnn_attention || Boundaries::ACTIVE, "the model's attention runs on cuDNN (a cuDNN build)");
#endif
    const std::vector<float> init_params = read_params_fp32(model_file, info, model.num_params);
    gpt_set_params(&model, init_params);

    // 1. forward: logits (eval mode keeps them) and loss
    float loss = gpt_forward_loss(&model, ref.inputs.data(), ref.targets.data(), B, T, false);
    std::vector<floatX> logits(BT * Vp);
    cudaCheck(cudaMemcpy(logits.data(), model.acts.logits, logits.size() * sizeof(floatX), cudaMemcpyDeviceToHost));
    Diff dl = compare(logits.data(), ref.logits.data(), logits.size());
    check(dl.rel_l2 <= TOL_LOGITS, strfmt("logits: rel L2 %.3e (tol %.2g), max abs %.3e", dl.rel_l2, TOL_LOGITS, dl.max_abs));
    check(std::fabs(loss - ref.loss) <= TOL_LOSS, strfmt("loss: %.6f vs reference %.6f (|diff| %.3e, tol %.0e)", loss, ref.loss, std::fabs(loss - ref.loss), TOL_LOSS));

#if defined(ENABLE_Q115)
    // 5. the reality check, on the tensors this forward pass stored (every layer's, where kept; the
    // GELU output and the projection output of the last layer), and a tensor that must fail it
    {
        const ModelShape& sh = model.shape;
        const size_t L = sh.num_layers, C = sh.channels, NH = sh.num_heads;
        Activations& a = model.acts;
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
#endif

    // 2. gradients of every tensor
    gpt_zero_grad(&model);
    gpt_forward(&model, ref.inputs.data(), ref.targets.data(), B, T, true, 1.0f / BT);
    gpt_backward(&model, B, T);
    std::vector<float> grads = device_floats(model.grads_memory, model.num_params);
    size_t off = 0;
    double worst = 0.0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = model.param_sizes[i];
        Diff d = compare(grads.data() + off, ref.grads.data() + off, n);
        worst = std::max(worst, d.rel_l2);
        check(d.rel_l2 <= TOL_GRAD, strfmt("grad %-9s rel L2 %.3e (tol %.2g), max abs %.3e", PARAM_NAMES[i], d.rel_l2, TOL_GRAD, d.max_abs));
        off += n;
    }
    printf("largest gradient rel L2 error: %.3e\n", worst);

    // 2b. the LayerNorm outputs' slots (assign_ln_slots): a layer has a slot of its own exactly where its
    // backward reads the output (the recipe's BF16 weight gradient), the others share one. With the first
    // and last layers kept in BF16 (-sqf 1 -sql 1) a quantizing recipe mixes both kinds; one training step
    // of that model gives the gradients of the same model with -r 2 (every slot shared, every read output
    // recomputed in backward) bit for bit: a layer that read another layer's output would not
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
        RecipeOptions mixed;
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
#if defined(ENABLE_Q115)
    // 6. one training step against BF16: the deviation from the plain reference (argv[2]) is the one the
    // float64 Q1.15 reference predicts
    if (argc > 2) {
        const Reference plain = load_reference_state(std::string(argv[2]) + "/ref_state.bin");
        if (plain.boundaries != 0 || plain.num_params != ref.num_params || plain.inputs != ref.inputs) {
            fprintf(stderr, "error: %s is not the plain reference of the same model and batch\n", argv[2]);
            return 1;
        }
        const double dev_ours = std::fabs(loss - plain.loss), dev_ref = std::fabs(ref.loss - plain.loss);
        check(std::fabs(dev_ours - dev_ref) <= TOL_LOSS,
              strfmt("one step vs BF16: loss deviates by %.4f (ours) vs %.4f (float64 Q1.15 reference), |diff| %.2e (tol %.0e)",
                     dev_ours, dev_ref, std::fabs(dev_ours - dev_ref), TOL_LOSS));
        const double g_ours = compare(grads.data(), plain.grads.data(), grads.size()).rel_l2;
        const double g_ref = compare(ref.grads.data(), plain.grads.data(), grads.size()).rel_l2;
        check(g_ours >= 0.5 * g_ref && g_ours <= 2.0 * g_ref + TOL_GRAD,
              strfmt("one step vs BF16: all gradients deviate by rel L2 %.3e (ours) vs %.3e (float64 Q1.15 reference)",
                     g_ours, g_ref));
    } else {
        printf("(no plain reference given as the second argument: the deviation from BF16 is not checked)\n");
    }
#endif

    // 3. the 10-step trajectory, a fresh batch per step (AdamW, constant lr, clipping as the reference)
    gpt_set_params(&model, init_params);
    cudaCheck(cudaMemset(model.m_memory, 0, model.num_params * sizeof(float)));
    cudaCheck(cudaMemset(model.v_memory, 0, model.num_params * sizeof(float)));
    model.adam_steps = 0;
    OptimizerSettings opt{ref.lr, ref.beta1, ref.beta2, ref.eps, ref.weight_decay, ref.grad_clip, 0};
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

    // 4. save -> resume is bit-identical
    char tmpl[] = "/tmp/test_gpt_ckpt_XXXXXX";
    if (!mkdtemp(tmpl)) { perror("mkdtemp"); return 1; }
    const std::string ckdir = tmpl;
    const int total = 6, save_at = 3;
    DataLoaderState data_state; data_state.epoch = 2; data_state.shard_pos = 1; data_state.chunk_pos = 7;
    opt.seed = 1234; // exercise stochastic rounding with a non-trivial seed
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
    gpt_set_params(&model, init_params);
    cudaCheck(cudaMemset(model.m_memory, 0, model.num_params * sizeof(float)));
    cudaCheck(cudaMemset(model.v_memory, 0, model.num_params * sizeof(float)));
    model.adam_steps = 0;
    std::vector<float> losses_a, losses_b;
    run_steps(&model, 0, save_at, &losses_a);
    try { save_checkpoint(&model, ckdir, save_at, data_state, opt.seed, 0, 1); }
    catch (const InputError& e) { check(false, strfmt("save_checkpoint: %s", e.what())); }
    run_steps(&model, save_at, total, &losses_a);

    GPT resumed;
    gpt_build(&resumed, info.shape);
    gpt_allocate(&resumed, B, T, 2); // a different recompute setting must not change the numbers
    DataLoaderState restored_state;
    bool loaded = false;
    try {
        check(find_latest_checkpoint(ckdir) == save_at, "find_latest_checkpoint finds the saved step");
        check_checkpoint(ckdir, save_at, info.shape, B, T, opt.seed, 0, 1);
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
            ra.open(state_path(dir_a, total, 0));
            rb.open(state_path(dir_b, total, 0));
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
        // -r -1 (auto, the trainer's default): this small model's GELU outputs fit, so none is
        // recomputed. Kept (the fc GEMM epilogue's GELU) and recomputed (the GELU kernel's) outputs
        // differ in the last bits, so the losses after resuming from the -r 1 checkpoint are close
        // to the -r 1 model's, not equal; the checkpoint records -r 1 for a -r -1 resume.
        GPT kept;
        gpt_build(&kept, info.shape);
        gpt_allocate(&kept, B, T, -1);
        // (a recipe that reads no GELU output in backward, FP8 with its own x^T, keeps one buffer: -r 1)
        bool gelu_read_in_backward = false;
        for (int l = 0; l < info.shape.num_layers; l++)
            gelu_read_in_backward = gelu_read_in_backward || recipe_needs_input_in_backward(kept.recipe, {l, LIN_FCPROJ}, B * T);
        const int auto_want = gelu_read_in_backward ? 0 : 1;
        check(kept.recompute == auto_want && kept.recompute_auto,
              strfmt("-r -1 keeps every GELU output of a small model where backward reads them, else one buffer (want -r %d, chose -r %d)",
                     auto_want, kept.recompute));
        try {
            check(checkpoint_recompute(ckdir, save_at, 0) == 1, "the checkpoint records the -r it was written with (1)");
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
    // a checkpoint of another shape is refused
    ModelShape other = info.shape;
    other.num_layers += 1;
    bool refused = false;
    try { check_checkpoint(ckdir, save_at, other, B, T, opt.seed, 0, 1); } catch (const InputError& e) { refused = strstr(e.what(), "shape") != nullptr; }
    check(refused, "a checkpoint of another shape is refused with a message naming the shape");
    refused = false;
    try { check_checkpoint(ckdir, save_at, info.shape, B, T, opt.seed + 1, 0, 1); } catch (const InputError& e) { refused = strstr(e.what(), "-sd") != nullptr; }
    check(refused, "resuming with another seed is refused with a message naming -sd");
    refused = false;
    try { check_checkpoint(ckdir, save_at, info.shape, B, T + 1, opt.seed, 0, 1); } catch (const InputError& e) { refused = strstr(e.what(), "-t") != nullptr; }
    check(refused, "resuming with another -t is refused with a message naming -t");
    refused = false;
    try { check_checkpoint(ckdir, save_at, info.shape, B, T, opt.seed, 0, 1, false, 2); } catch (const InputError& e) { refused = strstr(e.what(), "-z 0") != nullptr; }
    check(refused, "resuming a whole optimizer state as a ZeRO-1 shard is refused with a message naming -z");

    // 6. ZeRO-1 on one GPU: two models that each own half of every parameter block (zero.h), given
    // the summed gradients a reduce-scatter would leave them, take the optimizer step of their pieces
    // bit-identically to the model that owns everything (moments, master weights, parameters with
    // stochastic rounding), and the norms of their pieces add up to the whole norm
    {
        gpt_set_params(&model, init_params);
        cudaCheck(cudaMemset(model.m_memory, 0, model.num_params * sizeof(float)));
        cudaCheck(cudaMemset(model.v_memory, 0, model.num_params * sizeof(float)));
        model.adam_steps = 0;
        const int P = 2;
        GPT shards[P];
        for (int r = 0; r < P; r++) {
            gpt_build(&shards[r], info.shape, r, P);
            gpt_allocate(&shards[r], B, T, 1);
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
            const std::vector<floatX> full = device_vector(model.params_memory, N);
            const std::vector<float> full_master = device_vector(model.master_memory, N);
            const std::vector<float> full_m = device_vector(model.m_memory, N), full_v = device_vector(model.v_memory, N);
            std::vector<floatX> gathered(N);
            for (int r = 0; r < P; r++) {
                const ShardLayout& lay = shards[r].shard;
                const std::vector<floatX> mine = device_vector(shards[r].params_memory, N);
                const std::vector<float> master_r = device_vector(shards[r].master_memory, lay.shard_elements);
                for (size_t ti = 0; ti < lay.tensors.size(); ti++) {
                    const ShardedTensor& t = lay.tensors[ti];
                    for (size_t j = 0; j < t.shard_size(); j++) {
                        const size_t f = t.full_index(j);
                        if (memcmp(&mine[f], &full[f], sizeof(floatX)) != 0 && same_pieces) {
                            printf("  first difference: step %d, process %d, tensor %s, shard index %zu (full %zu): %.9g vs %.9g, "
                                   "master %.9g vs %.9g\n", s, r, PARAM_NAMES[ti], j, f, (float)mine[f], (float)full[f],
                                   master_r[t.shard_offset + j], full_master[f]);
                            same_pieces = false;
                        }
                        gathered[f] = mine[f];
                    }
                }
                const size_t NS = lay.shard_elements;
                same_state = same_state && same_bits(device_vector(shards[r].master_memory, NS), lay.extract(full_master.data())) &&
                             same_bits(device_vector(shards[r].m_memory, NS), lay.extract(full_m.data())) &&
                             same_bits(device_vector(shards[r].v_memory, NS), lay.extract(full_v.data()));
            }
            // the all-gather: every process's pieces to everyone
            for (int r = 0; r < P; r++)
                cudaCheck(cudaMemcpy(shards[r].params_memory, gathered.data(), N * sizeof(floatX), cudaMemcpyHostToDevice));
        }
        check(same_pieces, "ZeRO-1: the parameters each process updates are bit-identical to the unsharded step's (3 steps)");
        check(same_state, "ZeRO-1: each process's master weights and AdamW moments are its pieces of the unsharded ones, bit for bit");
        check(worst_norm <= 1e-5, strfmt("ZeRO-1: the norms of the pieces add up to the whole gradient norm (rel diff %.2e)", worst_norm));
        // a shard's checkpoint: written and read back bit-identically, and refused as a whole state
        const std::string zdir = ckdir + "/zero";
        bool round_trip = false, refused_whole = false;
        try {
            ensure_output_dir(zdir);
            save_checkpoint(&shards[1], zdir, 3, data_state, opt.seed, 1, 2);
            save_checkpoint(&shards[0], zdir, 3, data_state, opt.seed, 0, 2); // (rank 0 last: it marks the checkpoint done)
            GPT back;
            gpt_build(&back, info.shape, 1, 2);
            gpt_allocate(&back, B, T, 1);
            check_checkpoint(zdir, 3, info.shape, B, T, opt.seed, 1, 2, false, 2);
            DataLoaderState st;
            load_checkpoint(&back, zdir, 3, &st, 1);
            const size_t NS = back.shard.shard_elements;
            round_trip = device_bytes(back.master_memory, NS) == device_bytes(shards[1].master_memory, NS) &&
                         device_bytes(back.v_memory, NS) == device_bytes(shards[1].v_memory, NS);
            try { check_checkpoint(zdir, 3, info.shape, B, T, opt.seed, 1, 2, false, 1); }
            catch (const InputError& e) { refused_whole = strstr(e.what(), "-z 1") != nullptr; }
        } catch (const InputError& e) { check(false, strfmt("ZeRO-1 checkpoint: %s", e.what())); }
        check(round_trip, "ZeRO-1: a process's shard of the optimizer state survives save and load bit for bit");
        check(refused_whole, "ZeRO-1: resuming a sharded checkpoint with -z 0 is refused with a message naming -z");
    }

    std::string cleanup = "rm -rf '" + ckdir + "'";
    if (system(cleanup.c_str()) != 0) fprintf(stderr, "warning: could not remove %s\n", ckdir.c_str());

    matmul_free();
    printf("test_gpt_%s: %d passed, %d failed\n", RECIPE_NAME, g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
