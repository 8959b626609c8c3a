// Tests for llmc/spike_guard.h: the windows that judge loss and gradient-norm spikes, the decisions
// (non-finite values always skip, spikes only once the window is full), the checkpoint section's round
// trip, and the LLMC_TEST_NAN_AT parser.
#include <doctest/doctest.h>
#include "dev/test/cpu/test_util.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "llmc/spike_guard.h"

using namespace llmc;
using test_util::contains;
using test_util::error_of;

namespace {
// a guard whose windows hold n accepted steps: loss 3 + 0.01 (i % 2), norm 1 + 0.1 (i % 2)
// (mean 3.005 / 1.05, population std 0.005 / 0.05 for an even n)
SpikeGuard guard_with(int n, float loss_z = 0.0f, float grad_z = 0.0f) {
    SpikeGuard g;
    g.loss_z = loss_z;
    g.grad_z = grad_z;
    for (int i = 0; i < n; i++) {
        const double l = 3.0 + 0.01 * (i % 2), x = 1.0 + 0.1 * (i % 2);
        const SkipDecision d = g.judge(l, x);
        REQUIRE(!d.skip());
        g.record(d, l, x);
    }
    return g;
}
} // namespace

TEST_CASE("spike window: mean, population standard deviation and z") {
    SpikeWindow w;
    CHECK(w.mean() == 0.0);
    CHECK(w.stddev() == 0.0);
    for (double v : {2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0}) w.push(v);
    CHECK(w.count == 8);
    CHECK(w.mean() == doctest::Approx(5.0));
    CHECK(w.stddev() == doctest::Approx(2.0)); // the textbook example: population std 2
    CHECK(std::isnan(w.z(9.0)));              // not full: no judgement
    // full: the window of the last kSpikeWindow values only
    SpikeWindow f;
    for (int i = 0; i < kSpikeWindow; i++) f.push(i % 2 ? 12.0 : 10.0);
    REQUIRE(f.full());
    CHECK(f.mean() == doctest::Approx(11.0));
    CHECK(f.stddev() == doctest::Approx(1.0));
    CHECK(f.z(14.0) == doctest::Approx(3.0));
    CHECK(f.z(8.0) == doctest::Approx(-3.0));
    // the oldest value leaves as a new one comes: 64 values of 100 replace the 10s and 12s in the oldest slots
    for (int i = 0; i < kSpikeWindow / 2; i++) f.push(100.0);
    CHECK(f.count == kSpikeWindow);
    CHECK(f.next == kSpikeWindow / 2);
    CHECK(f.mean() == doctest::Approx((100.0 * 64 + 11.0 * 64) / 128));
    // all values equal: std 0 judges nothing
    SpikeWindow c;
    for (int i = 0; i < kSpikeWindow; i++) c.push(3.0);
    CHECK(c.z(1e6) == 0.0);
}

TEST_CASE("spike guard: spikes are judged only once the window is full") {
    // one step short of full: a huge loss and norm pass
    SpikeGuard g = guard_with(kSpikeWindow - 1, 0.1f, 0.1f);
    SkipDecision d = g.judge(1000.0, 1000.0);
    CHECK(!d.skip());
    g.record(d, 3.0, 1.0);
    REQUIRE(g.loss.full());
    // full: the same values are spikes, the loss judged first
    d = g.judge(1000.0, 1000.0);
    CHECK(d.reason == SKIP_LOSS_SPIKE);
    CHECK(d.z > 1000.0);
    d = g.judge(3.0, 1000.0);
    CHECK(d.reason == SKIP_GRAD_SPIKE);
    // at the threshold exactly: kept (skipped only when more than Z above)
    SpikeGuard h = guard_with(kSpikeWindow, 2.0f, 0.0f);
    const double at = h.loss.mean() + 2.0 * h.loss.stddev();
    CHECK(h.loss.z(at) == doctest::Approx(2.0));
    CHECK(h.judge(at - 1e-9, 1.0).reason == SKIP_NONE);
    CHECK(h.judge(at + 1e-6, 1.0).reason == SKIP_LOSS_SPIKE);
    // below the mean is never a spike, however far
    CHECK(h.judge(0.0, 1.0).reason == SKIP_NONE);
}

TEST_CASE("spike guard: thresholds 0 are off, and a skipped step stays out of the window") {
    SpikeGuard off = guard_with(kSpikeWindow);
    CHECK(off.judge(1e9, 1e9).reason == SKIP_NONE);
    SpikeGuard g = guard_with(kSpikeWindow, 3.0f, 3.0f);
    const SpikeWindow before = g.loss;
    const SkipDecision d = g.judge(50.0, 1.0);
    REQUIRE(d.reason == SKIP_LOSS_SPIKE);
    g.record(d, 50.0, 1.0);
    CHECK(g.skipped[SKIP_LOSS_SPIKE] == 1);
    CHECK(g.total_skipped() == 1);
    CHECK(std::memcmp(g.loss.values, before.values, sizeof(before.values)) == 0);
    CHECK(g.loss.next == before.next);
    CHECK(g.nonfinite_in_a_row == 0);
    // an accepted step joins both windows
    const SkipDecision ok = g.judge(3.0, 1.0);
    REQUIRE(!ok.skip());
    g.record(ok, 3.0, 1.0);
    CHECK(g.loss.next == (before.next + 1) % kSpikeWindow);
    CHECK(g.norm.values[before.next] == 1.0);
}

TEST_CASE("spike guard: NaN and Inf always skip, whatever -sl / -sg say, and never enter the windows") {
    for (int filled : {0, 5, kSpikeWindow}) {
        CAPTURE(filled);
        SpikeGuard g = guard_with(filled); // thresholds off
        const SpikeWindow loss_before = g.loss, norm_before = g.norm;
        CHECK(g.judge(NAN, 1.0).reason == SKIP_NAN_LOSS);
        CHECK(g.judge(INFINITY, 1.0).reason == SKIP_NAN_LOSS);
        CHECK(g.judge(-INFINITY, 1.0).reason == SKIP_NAN_LOSS);
        CHECK(g.judge(NAN, NAN).reason == SKIP_NAN_LOSS); // the loss is judged first
        CHECK(g.judge(3.0, NAN).reason == SKIP_NAN_GRAD);
        CHECK(g.judge(3.0, INFINITY).reason == SKIP_NAN_GRAD);
        CHECK(std::isnan(g.judge(NAN, 1.0).z));
        g.record(g.judge(NAN, 1.0), NAN, 1.0);
        g.record(g.judge(3.0, INFINITY), 3.0, INFINITY);
        CHECK(g.skipped[SKIP_NAN_LOSS] == 1);
        CHECK(g.skipped[SKIP_NAN_GRAD] == 1);
        CHECK(g.loss.count == loss_before.count);
        CHECK(g.norm.count == norm_before.count);
        CHECK(std::memcmp(g.norm.values, norm_before.values, sizeof(norm_before.values)) == 0);
        CHECK(std::isfinite(g.loss.mean()));
        CHECK(g.nonfinite_in_a_row == 2);
    }
}

TEST_CASE("spike guard: a run of non-finite steps stops the run, a finite step ends the run of them") {
    SpikeGuard g;
    for (int i = 0; i < kMaxNonFiniteInARow - 1; i++) g.record(g.judge(NAN, NAN), NAN, NAN);
    CHECK(!g.stuck());
    SpikeGuard h = g;
    h.record(h.judge(3.0, 1.0), 3.0, 1.0);
    CHECK(h.nonfinite_in_a_row == 0);
    g.record(g.judge(3.0, NAN), 3.0, NAN);
    CHECK(g.stuck());
    // a spike is not a non-finite step
    SpikeGuard s = guard_with(kSpikeWindow, 0.5f);
    s.nonfinite_in_a_row = 3;
    s.record(s.judge(100.0, 1.0), 100.0, 1.0);
    CHECK(s.nonfinite_in_a_row == 0);
}

TEST_CASE("spike guard: the checkpoint section round-trips the state bit for bit and refuses corrupt bytes") {
    SpikeGuard g = guard_with(kSpikeWindow + 7, 2.5f, 4.0f);
    g.record(g.judge(NAN, 1.0), NAN, 1.0);
    g.skipped[SKIP_GRAD_SPIKE] = 3;
    const std::vector<uint8_t> bytes = g.to_bytes();
    CHECK(bytes.size() == SpikeGuard::state_bytes());
    SpikeGuard r;
    r.loss_z = 1.0f; // the thresholds are the run's, not the checkpoint's
    r.from_bytes(bytes.data(), bytes.size(), "state.bin");
    CHECK(r.loss_z == 1.0f);
    CHECK(r.to_bytes() == bytes);
    CHECK(r.loss.next == g.loss.next);
    CHECK(r.skipped[SKIP_NAN_LOSS] == 1);
    CHECK(r.nonfinite_in_a_row == 1);
    // the same decisions from here on, under the same thresholds
    r.loss_z = g.loss_z;
    for (double x : {3.0, 3.02, 2.9, 3.5}) CHECK(r.judge(x, 1.2).reason == g.judge(x, 1.2).reason);
    CHECK(r.judge(3.5, 1.0).reason == SKIP_LOSS_SPIKE);
    CHECK(r.loss.z(3.02) == g.loss.z(3.02));
    // a wrong size, another window, an impossible ring, a NaN in the window: refused, the guard unchanged
    std::string e = error_of([&] { r.from_bytes(bytes.data(), bytes.size() - 1, "state.bin"); });
    CHECK(contains(e, "state.bin"));
    CHECK(contains(e, "spike_window"));
    std::vector<uint8_t> bad = bytes;
    const int32_t other_window = 64;
    std::memcpy(bad.data() + 4, &other_window, 4);
    CHECK(contains(error_of([&] { r.from_bytes(bad.data(), bad.size(), "state.bin"); }), "window of 64"));
    bad = bytes;
    const int32_t count = kSpikeWindow + 1;
    std::memcpy(bad.data() + 8, &count, 4);
    CHECK(contains(error_of([&] { r.from_bytes(bad.data(), bad.size(), "state.bin"); }), "impossible window"));
    bad = bytes;
    const double nan = NAN;
    std::memcpy(bad.data() + 16, &nan, 8);
    CHECK(contains(error_of([&] { r.from_bytes(bad.data(), bad.size(), "state.bin"); }), "non-finite"));
    CHECK(r.to_bytes() == bytes);
    // an empty guard (an old checkpoint: clear_state)
    r.clear_state();
    CHECK(r.loss.count == 0);
    CHECK(r.total_skipped() == 0);
    CHECK(r.to_bytes() == SpikeGuard().to_bytes());
}

TEST_CASE("LLMC_TEST_NAN_AT: loss:STEP and grad:STEP lists, anything else refused naming the item") {
    CHECK(!parse_test_nan_at(nullptr).active());
    CHECK(!parse_test_nan_at("").active());
    const NanInjections n = parse_test_nan_at("loss:5,grad:9,grad:0");
    REQUIRE(n.at.size() == 3);
    CHECK(n.due(NAN_IN_LOSS, 5));
    CHECK(!n.due(NAN_IN_GRAD, 5));
    CHECK(n.due(NAN_IN_GRAD, 9));
    CHECK(n.due(NAN_IN_GRAD, 0));
    CHECK(!n.due(NAN_IN_LOSS, 9));
    for (const char* bad : {"loss", "loss:", "loss:-1", "loss:5x", "weights:3", "loss:5,", ",loss:5", "loss:1234567890",
                            "LOSS:5", "loss: 5", "grad:5;loss:6"}) {
        CAPTURE(bad);
        const std::string e = error_of([&] { parse_test_nan_at(bad); });
        CHECK(contains(e, "LLMC_TEST_NAN_AT must be"));
        CHECK(contains(e, bad));
    }
}

TEST_CASE("-sl / -sg thresholds: finite and >= 0") {
    check_skip_threshold("-sl", 0.0f);
    check_skip_threshold("-sg", 6.5f);
    CHECK(contains(error_of([] { check_skip_threshold("-sl", -1.0f); }), "-sl -1: the z-score threshold"));
    CHECK(contains(error_of([] { check_skip_threshold("-sg", INFINITY); }), "-sg inf"));
}
