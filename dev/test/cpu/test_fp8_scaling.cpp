// Tests for llmc/formats/fp8_scaling.h: the delayed-scaling formula and the amax history, on the CPU (the
// GPU runs the same functions; build/test_fp8 checks the kernels against them).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "llmc/formats/fp8_scaling.h"

using llmc::fp8_delayed_scale;
using llmc::fp8_history_push;

TEST_CASE("fp8 scaling: scale = FP8_MAX / amax / 2^margin") {
    CHECK(fp8_delayed_scale(4.0f, 448.0f, 0, 1.0f) == 112.0f);
    CHECK(fp8_delayed_scale(4.0f, 448.0f, 1, 1.0f) == 56.0f);
    CHECK(fp8_delayed_scale(4.0f, 448.0f, 3, 1.0f) == 14.0f);
    CHECK(fp8_delayed_scale(0.5f, 57344.0f, 0, 1.0f) == 114688.0f);
    // not a power of two: exactly the IEEE quotient
    CHECK(fp8_delayed_scale(3.0f, 448.0f, 0, 1.0f) == 448.0f / 3.0f);
    // an amax that says nothing keeps the previous scale
    const float prev = 7.5f;
    CHECK(fp8_delayed_scale(0.0f, 448.0f, 0, prev) == prev);
    CHECK(fp8_delayed_scale(-1.0f, 448.0f, 0, prev) == prev);
    CHECK(fp8_delayed_scale(std::numeric_limits<float>::quiet_NaN(), 448.0f, 0, prev) == prev);
    CHECK(fp8_delayed_scale(std::numeric_limits<float>::infinity(), 448.0f, 0, prev) == prev);
    // a scale that would overflow float keeps the previous one
    CHECK(fp8_delayed_scale(1e-40f, 448.0f, 0, prev) == prev);
}

TEST_CASE("fp8 scaling: the history is a ring buffer; the scale follows its maximum") {
    const int H = 3;
    std::vector<float> hist(H, 0.0f);
    float amax = 0.0f, scale = 1.0f, inv = 1.0f;
    const float steps[] = {2.0f, 8.0f, 1.0f, 1.0f, 1.0f, 0.5f};
    // after each push the scale comes from the max of the last H amaxes
    const float want_max[] = {2.0f, 8.0f, 8.0f, 8.0f, 1.0f, 1.0f};
    for (int s = 0; s < 6; s++) {
        amax = steps[s];
        fp8_history_push(hist.data(), H, s, &amax, &scale, &inv, 448.0f, 0);
        CHECK(amax == 0.0f); // reset for the next step
        CHECK(hist[s % H] == steps[s]);
        CHECK(scale == 448.0f / want_max[s]);
        CHECK(inv == 1.0f / scale);
    }
    // NaN and inf amaxes are stored but ignored by the max
    amax = std::numeric_limits<float>::quiet_NaN();
    fp8_history_push(hist.data(), H, 6, &amax, &scale, &inv, 448.0f, 0);
    CHECK(std::isnan(hist[0]));
    CHECK(scale == 448.0f / 1.0f);
    // a window of zeros keeps the scale
    std::vector<float> zeros(H, 0.0f);
    float z = 0.0f, sc = 3.0f, iv = 1.0f / 3.0f;
    fp8_history_push(zeros.data(), H, 0, &z, &sc, &iv, 448.0f, 0);
    CHECK(sc == 3.0f);
}

TEST_CASE("fp8 scaling: amax bits order like the floats, NaN above inf") {
    CHECK(llmc::amax_bits(-3.0f) == llmc::amax_bits(3.0f));
    CHECK(llmc::amax_bits(3.0f) > llmc::amax_bits(2.9f));
    CHECK(llmc::amax_bits(std::numeric_limits<float>::infinity()) > llmc::amax_bits(3.4e38f));
    CHECK(llmc::amax_bits(std::numeric_limits<float>::quiet_NaN()) > llmc::amax_bits(std::numeric_limits<float>::infinity()));
    CHECK(llmc::amax_bits(-0.0f) == 0u);
}
