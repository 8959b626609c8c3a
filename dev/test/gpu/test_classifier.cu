// test_classifier.cu: the fused softmax + cross-entropy kernel (llmc/fused_classifier.cuh) against float64 on
// the CPU, for training (the losses, and the logits overwritten by their gradient, 0 in the padded columns) and
// for evaluation (the losses; the logits left as they were, or mapped by an active boundary); vocabularies from
// 1,000 to 70,000, GPT-2's padded one among them. Both forms of the kernel where the row fits the staged one:
// each against float64, and the two bit for bit against each other. Then their time at one d12 micro-step chunk
// (8192 rows of 50,304 logits), with the bandwidth they reach (each logit read once from DRAM and written once).
// With dlogit codes asked for (the FP8 LM head's input gradient), the codes must be the CPU codec's E5M2
// encoding of each stored BF16 dlogit times the scale, bit for bit, in both forms, and the rest unchanged.
// (Holding the row in registers, one read of it instead of two, gives the same bits but needs 63 registers x
// 1024 threads, which leaves one CTA an SM where the two-pass kernel has two; the staged form holds the row in
// shared memory instead, two CTAs an SM.)
#include "dev/test/gpu/gpu_check.h"
#include "llmc/fused_classifier.cuh"
#include "llmc/formats/number_formats.h"
#include <cmath>

// an active boundary on the logits: the softmax reads 4 * clamp(x, -2, 2)
struct ClampedLogits : IdentityBoundaries {
    using Values = ClampedLogits;
    static constexpr bool ACTIVE = true;
    static constexpr float LOGIT_SCALE = 4.0f;
    LLMC_BD static float logits(float x) { return fminf(fmaxf(x, -2.0f), 2.0f); }
};

template <class Bd>
static double ref_logit(float x) {
    return (double)Bd::LOGIT_SCALE * (double)Bd::logits(x);
}

// One form's results (x: the logits after the kernel, loss) against float64: lse, loss, and the gradient (or the
// mapped logits)
template <class Bd>
static void check_against_float64(const std::vector<floatX>& logits, const std::vector<int>& targets, const std::vector<floatX>& x,
                                  const std::vector<float>& loss, int BT, int V, int Vp, float dloss, bool write,
                                  const char* what) {
    double max_loss_err = 0.0, err2 = 0.0, ref2 = 0.0;
    size_t pad_nonzero = 0;
    for (int r = 0; r < BT; r++) {
        const floatX* row = logits.data() + (size_t)r * Vp;
        double m = -INFINITY;
        for (int i = 0; i < V; i++) m = std::max(m, ref_logit<Bd>(bf2f(row[i])));
        double s = 0.0;
        for (int i = 0; i < V; i++) s += std::exp(ref_logit<Bd>(bf2f(row[i])) - m);
        const double lse = m + std::log(s);
        const double want_loss = lse - ref_logit<Bd>(bf2f(row[targets[r]]));
        max_loss_err = std::max(max_loss_err, std::fabs(loss[r] - want_loss) / std::max(1.0, std::fabs(want_loss)));
        for (int i = 0; i < Vp; i++) {
            const float gotv = bf2f(x[(size_t)r * Vp + i]);
            double want;
            if (!write) want = Bd::ACTIVE ? (double)Bd::logits(bf2f(row[i])) : (double)bf2f(row[i]); // (every column)
            else if (i >= V) { pad_nonzero += gotv != 0.0f; continue; }
            else want = (std::exp(ref_logit<Bd>(bf2f(row[i])) - lse) - (i == targets[r] ? 1.0 : 0.0)) * dloss * Bd::LOGIT_SCALE;
            err2 += (gotv - want) * (gotv - want);
            ref2 += want * want;
        }
    }
    const double rel = std::sqrt(err2 / std::max(ref2, 1e-300));
    check(max_loss_err < 2e-5 && rel < 4e-3 && pad_nonzero == 0,
          "%s: vs float64 loss rel error %.2e (tol 2e-5), %s rel L2 %.2e (tol 4e-3, BF16), padded columns' gradient 0 (%zu not)",
          what, max_loss_err, write ? "dlogits" : "logits", rel, pad_nonzero);
}

template <class Bd>
static void test_shape(int BT, int V, int Vp, std::mt19937& rng, const char* bd_name) {
    const size_t n = (size_t)BT * Vp;
    std::vector<floatX> logits = random_floatx(n, rng, -8.0f, 8.0f);
    std::uniform_int_distribution<int> pick(0, V - 1);
    std::vector<int> targets(BT);
    for (int r = 0; r < BT; r++) targets[r] = r == 0 ? 0 : r == 1 ? V - 1 : pick(rng);
    const float dloss = 1.0f / BT;
    floatX* d_x = to_device(logits);
    int* d_t = to_device(targets);
    float* d_loss = to_device(std::vector<float>(BT, 0.0f));
    const bool staged = classifier_row_fits_staged(Vp);
    for (int write : {1, 0}) {
        // the unstaged form, then (where the row fits) the staged one, which must give the same bits
        auto run = [&](ClassifierForm form, std::vector<floatX>& x, std::vector<float>& loss) {
            cudaCheck(cudaMemcpy(d_x, logits.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemset(d_loss, 0xFF, BT * sizeof(float)));
            fused_classifier<Bd>(d_x, d_loss, d_t, dloss, BT, V, Vp, write, 0, form);
            x = to_host(d_x, n);
            loss = to_host(d_loss, BT);
        };
        char what[160];
        snprintf(what, sizeof(what), "%s BT=%d V=%d Vp=%d %s", bd_name, BT, V, Vp, write ? "training" : "evaluation");
        std::vector<floatX> x, x_staged;
        std::vector<float> loss, loss_staged;
        run(ClassifierForm::UNSTAGED, x, loss);
        check_against_float64<Bd>(logits, targets, x, loss, BT, V, Vp, dloss, write, what);
        if (!staged) continue;
        run(ClassifierForm::STAGED, x_staged, loss_staged);
        check(memcmp(x_staged.data(), x.data(), n * sizeof(floatX)) == 0 && memcmp(loss_staged.data(), loss.data(), BT * sizeof(float)) == 0,
              "%s: the staged form's losses and %s bit for bit the unstaged form's", what, write ? "dlogits" : "logits");
    }
    // the dlogits' E5M2 codes as well: the scale a power of two with |dlogit| <= dloss LOGIT_SCALE below E5M2's
    // largest value (as the FP8 recipe picks it), and one that saturates the largest dlogits
    uint8_t* d_codes = nullptr;
    cudaCheck(cudaMalloc(&d_codes, n));
    const float bound = dloss * Bd::LOGIT_SCALE;
    for (float code_scale : {std::ldexp(1.0f, (int)std::floor(std::log2(57344.0f / bound))), 4.0f * 57344.0f / bound}) {
        for (ClassifierForm form : {ClassifierForm::UNSTAGED, ClassifierForm::STAGED}) {
            if (form == ClassifierForm::STAGED && !staged) continue;
            cudaCheck(cudaMemcpy(d_x, logits.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemset(d_codes, 0x7F, n));
            fused_classifier<Bd>(d_x, d_loss, d_t, dloss, BT, V, Vp, true, 0, form, d_codes, code_scale);
            const std::vector<floatX> x = to_host(d_x, n);
            std::vector<uint8_t> codes(n);
            cudaCheck(cudaMemcpy(codes.data(), d_codes, n, cudaMemcpyDeviceToHost));
            size_t bad = 0, saturated = 0, first_bad = n;
            for (size_t i = 0; i < n; i++) {
                const float v = bf2f(x[i]) * code_scale;
                const uint8_t want = llmc::fp8e5m2_encode(v, llmc::Overflow::Saturate);
                saturated += std::fabs(v) > 57344.0f;
                if (codes[i] != want) { bad++; first_bad = std::min(first_bad, i); }
            }
            // (without codes, the same run's dlogits: the unstaged form's, which the staged form matches bit for bit)
            std::vector<floatX> x_plain;
            std::vector<float> loss_plain;
            cudaCheck(cudaMemcpy(d_x, logits.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
            fused_classifier<Bd>(d_x, d_loss, d_t, dloss, BT, V, Vp, true, 0, form);
            x_plain = to_host(d_x, n);
            check(bad == 0 && memcmp(x_plain.data(), x.data(), n * sizeof(floatX)) == 0,
                  "%s BT=%d V=%d Vp=%d %s, scale %g: E5M2 codes of the dlogits bit for bit the CPU codec's (%zu differ, first at %zu; "
                  "%zu saturated), the dlogits themselves as without codes", bd_name, BT, V, Vp,
                  form == ClassifierForm::STAGED ? "staged" : "unstaged", code_scale, bad, first_bad, saturated);
        }
    }
    cudaCheck(cudaFree(d_codes));
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_t));
    cudaCheck(cudaFree(d_loss));
}

static void time_chunk(int BT, int V, int Vp, std::mt19937& rng) {
    const size_t n = (size_t)BT * Vp;
    floatX* d_x = to_device(random_floatx(n, rng, -8.0f, 8.0f));
    std::vector<int> targets(BT);
    for (int r = 0; r < BT; r++) targets[r] = (r * 7919) % V;
    int* d_t = to_device(targets);
    float* d_loss = to_device(std::vector<float>(BT, 0.0f));
    // (each run overwrites the logits with their gradient, which the next run reads as logits: same cost)
    const double gb = 2.0 * n * sizeof(floatX) / 1e9; // read once from DRAM (the unstaged form's later passes mostly from L2), written once
    for (ClassifierForm form : {ClassifierForm::UNSTAGED, ClassifierForm::STAGED}) {
        const double ms = median_ms([&] { fused_classifier(d_x, d_loss, d_t, 1.0f / BT, BT, V, Vp, true, 0, form); });
        printf("  timing BT=%d Vp=%d, %s: %.4f ms (%.0f GB/s)\n", BT, Vp, form == ClassifierForm::STAGED ? "staged" : "unstaged",
               ms, gb / ms * 1e3);
    }
    cudaCheck(cudaFree(d_x));
    cudaCheck(cudaFree(d_t));
    cudaCheck(cudaFree(d_loss));
}

int main() {
    if (!gpu_present()) return 77;
    std::mt19937 rng(20261128);
    struct Shape { int BT, V, Vp; };
    // (16-byte vectors a thread of the 1024: 1, 1, 2, 4, 7 (GPT-2's vocabulary), 8, 9)
    const Shape shapes[] = {{64, 1000, 1024}, {16, 8000, 8064}, {16, 12000, 12032}, {16, 30000, 30080},
                            {37, 50257, 50304}, {8, 65500, 65536}, {8, 70000, 70016}};
    for (const Shape& s : shapes) test_shape<IdentityBoundaries>(s.BT, s.V, s.Vp, rng, "plain");
    for (const Shape& s : {shapes[0], shapes[2], shapes[3], shapes[4]}) test_shape<ClampedLogits>(s.BT, s.V, s.Vp, rng, "clamped logits x4");
    printf("timing (median of 20):\n");
    time_chunk(8192, 50257, 50304, rng); // one of d12's 8 chunks of a B = 64 micro-step
    printf("classifier tests: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
