// spike_guard.h: which optimizer updates the trainer skips. A step whose loss or global gradient norm
// is not finite (NaN or Inf) never updates anything; with -sl Z (-sg Z) a step whose loss (gradient
// norm) lies more than Z standard deviations above the mean of the last kSpikeWindow accepted steps'
// losses (norms) is skipped too. Host code only, no CUDA: the CPU tests check it as the trainer runs it.
//
// The window rule. Each series (loss, norm) keeps the values of the last kSpikeWindow steps whose update
// was applied, in a ring; a skipped step's values never enter it, so one spike does not widen the band
// that judges the next. A spike is judged only once the window is full (kSpikeWindow accepted steps):
// before that, z is NaN and nothing is skipped for being large (non-finite values are skipped from the
// first step on). The mean and the (population) standard deviation are summed afresh over the ring in
// slot order for every judgement, in double precision: the same values in the same slots give the same
// z, bit for bit, which a resumed run relies on (the ring and its position are in the checkpoint).
// z = (x - mean) / std; a window of identical values (std 0) judges nothing (z = 0), since any
// threshold would then skip every larger step forever.
//
// Data parallel: the trainer judges the all-reduced loss and the global gradient norm, which are the
// same on every process, so every process keeps the same window and takes the same decision.
//
// The test switch LLMC_TEST_NAN_AT (parse_test_nan_at below) makes the trainer inject a NaN into the
// loss or the gradient at given steps, to test all this end to end (dev/test/gpu/nan_skip.sh).
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "common.h"

namespace llmc {

constexpr int kSpikeWindow = 128;        // accepted steps a spike is judged against (llm.c's window)
constexpr int kMaxNonFiniteInARow = 16;  // non-finite steps in a row after which the run stops

// The last kSpikeWindow values of one series (the loss or the gradient norm of accepted steps).
struct SpikeWindow {
    double values[kSpikeWindow] = {};
    int32_t count = 0; // values held, at most kSpikeWindow
    int32_t next = 0;  // the slot the next value goes to (the oldest once full)

    bool full() const { return count == kSpikeWindow; }
    void push(double x) {
        values[next] = x;
        next = (next + 1) % kSpikeWindow;
        if (count < kSpikeWindow) count++;
    }
    // over the values held (slots 0 .. count-1: the ring fills from slot 0); 0 when empty
    double mean() const {
        if (count == 0) return 0.0;
        double sum = 0.0;
        for (int i = 0; i < count; i++) sum += values[i];
        return sum / count;
    }
    double stddev() const {
        if (count == 0) return 0.0;
        const double m = mean();
        double sum = 0.0;
        for (int i = 0; i < count; i++) sum += (values[i] - m) * (values[i] - m);
        return std::sqrt(sum / count);
    }
    // how many standard deviations x lies above the mean: NaN until the window is full, 0 when its
    // values are all equal
    double z(double x) const {
        if (!full()) return NAN;
        const double s = stddev();
        if (!(s > 0.0)) return 0.0;
        return (x - mean()) / s;
    }
};

enum SkipReason { SKIP_NONE = 0, SKIP_NAN_LOSS, SKIP_NAN_GRAD, SKIP_LOSS_SPIKE, SKIP_GRAD_SPIKE, NUM_SKIP_REASONS };
// as main.log writes them (s:STEP skip:REASON ...); nan-* stands for NaN and Inf alike
static const char* const SKIP_REASON_NAMES[NUM_SKIP_REASONS] = {"none", "nan-loss", "nan-grad", "loss-spike", "grad-spike"};

struct SkipDecision {
    SkipReason reason = SKIP_NONE;
    double z = NAN; // the z of the series that decided a spike (NaN otherwise)
    bool skip() const { return reason != SKIP_NONE; }
};

// The thresholds (-sl, -sg; 0 = off) and the state: both windows, the skipped steps by reason and the
// current run of non-finite steps. The state goes into the checkpoint (to_bytes / from_bytes).
struct SpikeGuard {
    float loss_z = 0.0f, grad_z = 0.0f;
    SpikeWindow loss, norm;
    int64_t skipped[NUM_SKIP_REASONS] = {};
    int32_t nonfinite_in_a_row = 0;

    // The decision for a step: a non-finite loss first, then a non-finite norm, then a loss spike, then
    // a gradient-norm spike.
    SkipDecision judge(double step_loss, double step_norm) const {
        SkipDecision d;
        if (!std::isfinite(step_loss)) { d.reason = SKIP_NAN_LOSS; return d; }
        if (!std::isfinite(step_norm)) { d.reason = SKIP_NAN_GRAD; return d; }
        const double zl = loss.z(step_loss), zg = norm.z(step_norm);
        if (loss_z > 0.0f && zl > loss_z) { d.reason = SKIP_LOSS_SPIKE; d.z = zl; return d; }
        if (grad_z > 0.0f && zg > grad_z) { d.reason = SKIP_GRAD_SPIKE; d.z = zg; return d; }
        return d;
    }
    // after the step: an accepted step's values join the windows, a skipped one is counted
    void record(const SkipDecision& d, double step_loss, double step_norm) {
        if (d.skip()) {
            skipped[d.reason]++;
        } else {
            loss.push(step_loss);
            norm.push(step_norm);
        }
        const bool nonfinite = d.reason == SKIP_NAN_LOSS || d.reason == SKIP_NAN_GRAD;
        nonfinite_in_a_row = nonfinite ? nonfinite_in_a_row + 1 : 0;
    }
    int64_t total_skipped() const {
        int64_t n = 0;
        for (int i = 1; i < NUM_SKIP_REASONS; i++) n += skipped[i];
        return n;
    }
    // the run cannot go on: its loss or norm has not been finite for kMaxNonFiniteInARow steps
    bool stuck() const { return nonfinite_in_a_row >= kMaxNonFiniteInARow; }

    // The checkpoint section (kSpikeSection), little-endian as the machine writes it:
    //   int32 format (1), int32 kSpikeWindow, then per series (loss, norm): int32 count, int32 next,
    //   kSpikeWindow doubles; then int64 skipped[NUM_SKIP_REASONS], int32 nonfinite_in_a_row
    static constexpr const char* kSection = "spike_window";
    static constexpr int32_t kFormat = 1;
    static size_t state_bytes() {
        return 2 * sizeof(int32_t) + 2 * (2 * sizeof(int32_t) + kSpikeWindow * sizeof(double)) +
               NUM_SKIP_REASONS * sizeof(int64_t) + sizeof(int32_t);
    }
    std::vector<uint8_t> to_bytes() const {
        std::vector<uint8_t> out(state_bytes());
        uint8_t* p = out.data();
        auto put = [&](const void* src, size_t n) { std::memcpy(p, src, n); p += n; };
        const int32_t header[2] = {kFormat, kSpikeWindow};
        put(header, sizeof(header));
        for (const SpikeWindow* w : {&loss, &norm}) {
            put(&w->count, sizeof(w->count));
            put(&w->next, sizeof(w->next));
            put(w->values, sizeof(w->values));
        }
        put(skipped, sizeof(skipped));
        put(&nonfinite_in_a_row, sizeof(nonfinite_in_a_row));
        return out;
    }
    // Restores the state (not the thresholds). Throws InputError, naming `where`, when the bytes are not
    // a state this build wrote; the guard is unchanged then.
    void from_bytes(const void* data, size_t bytes, const std::string& where) {
        if (bytes != state_bytes())
            input_error("%s: section '%s' holds %zu bytes, not the %zu of a spike window; the file is corrupt",
                        where.c_str(), kSection, bytes, state_bytes());
        const uint8_t* p = (const uint8_t*)data;
        auto get = [&](void* dst, size_t n) { std::memcpy(dst, p, n); p += n; };
        int32_t header[2];
        get(header, sizeof(header));
        if (header[0] != kFormat || header[1] != kSpikeWindow)
            input_error("%s: section '%s' is of format %d with a window of %d steps; this build reads format %d with %d",
                        where.c_str(), kSection, header[0], header[1], kFormat, kSpikeWindow);
        SpikeGuard g;
        for (SpikeWindow* w : {&g.loss, &g.norm}) {
            get(&w->count, sizeof(w->count));
            get(&w->next, sizeof(w->next));
            get(w->values, sizeof(w->values));
            const bool ring_ok = w->count >= 0 && w->count <= kSpikeWindow && w->next >= 0 && w->next < kSpikeWindow &&
                                 (w->count == kSpikeWindow || w->next == w->count);
            bool values_ok = true;
            for (int i = 0; i < w->count; i++) values_ok = values_ok && std::isfinite(w->values[i]);
            if (!ring_ok || !values_ok)
                input_error("%s: section '%s' holds an impossible window (count %d, next %d%s); the file is corrupt",
                            where.c_str(), kSection, w->count, w->next, values_ok ? "" : ", a non-finite value");
        }
        get(g.skipped, sizeof(g.skipped));
        get(&g.nonfinite_in_a_row, sizeof(g.nonfinite_in_a_row));
        bool counts_ok = g.skipped[SKIP_NONE] == 0 && g.nonfinite_in_a_row >= 0;
        for (int i = 1; i < NUM_SKIP_REASONS; i++) counts_ok = counts_ok && g.skipped[i] >= 0;
        if (!counts_ok) input_error("%s: section '%s' holds negative skip counts; the file is corrupt", where.c_str(), kSection);
        loss = g.loss;
        norm = g.norm;
        std::memcpy(skipped, g.skipped, sizeof(skipped));
        nonfinite_in_a_row = g.nonfinite_in_a_row;
    }
    // the state of a run that has not taken a step (an old checkpoint without the section)
    void clear_state() {
        loss = SpikeWindow();
        norm = SpikeWindow();
        for (int64_t& n : skipped) n = 0;
        nonfinite_in_a_row = 0;
    }
};

// -sl / -sg: a finite z-score threshold >= 0 (0 = off)
inline void check_skip_threshold(const char* flag, float z) {
    if (!std::isfinite(z) || z < 0.0f)
        input_error("%s %g: the z-score threshold must be a finite number >= 0 (0 = off)", flag, (double)z);
}

// ---------------------------------------------------------------------------------------------
// LLMC_TEST_NAN_AT (a test switch, doc/testing.md): a comma-separated list of KIND:STEP, KIND being
// `loss` (the step's loss becomes NaN) or `grad` (a NaN enters the step's backward pass, so the gradients
// and the gradient norm are NaN); STEP counts optimizer steps from 0, as main.log's s:STEP does.
enum NanTarget { NAN_IN_LOSS = 0, NAN_IN_GRAD = 1 };
struct NanInjection {
    NanTarget target;
    int step;
};
struct NanInjections {
    std::vector<NanInjection> at;
    bool active() const { return !at.empty(); }
    bool due(NanTarget target, int step) const {
        for (const NanInjection& i : at)
            if (i.target == target && i.step == step) return true;
        return false;
    }
};

// null or "": none. Throws InputError naming the variable and the bad item.
inline NanInjections parse_test_nan_at(const char* text) {
    NanInjections out;
    if (!text || !*text) return out;
    const std::string all = text;
    const char* usage = "a comma-separated list of loss:STEP or grad:STEP (STEP an optimizer step >= 0), e.g. loss:5,grad:9";
    size_t start = 0;
    while (true) {
        const size_t comma = all.find(',', start);
        const std::string item = all.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const size_t colon = item.find(':');
        const std::string kind = colon == std::string::npos ? item : item.substr(0, colon);
        const std::string step = colon == std::string::npos ? "" : item.substr(colon + 1);
        NanInjection inj{NAN_IN_LOSS, 0};
        bool ok = (kind == "loss" || kind == "grad") && !step.empty() && step.size() <= 9;
        for (char c : step) ok = ok && c >= '0' && c <= '9';
        if (!ok) input_error("LLMC_TEST_NAN_AT must be %s; got '%s' (the item '%s')", usage, text, item.c_str());
        inj.target = kind == "loss" ? NAN_IN_LOSS : NAN_IN_GRAD;
        inj.step = (int)std::strtol(step.c_str(), nullptr, 10);
        out.at.push_back(inj);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

} // namespace llmc
