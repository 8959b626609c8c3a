// Tests for llmc/formats/fp8_scaling.h: the delayed-scaling formula and the amax history, and for
// llmc/formats/fp8_block_scaling.h: block scales and the reference block quantizers, on the CPU (the GPU runs
// the same functions; build/test_fp8 checks the kernels against them).
#include <doctest/doctest.h>
#include "dev/test/cpu/test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "llmc/formats/fp8_block_scaling.h"
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

TEST_CASE("fp8 scaling: a scale from a bound is the largest power of two that keeps bound * s <= FP8_MAX") {
    using namespace llmc;
    // dloss of the loss protocol's step (1 / 8192), of d12's B = 64 steps (1 / 524288), and others, both formats
    for (float fp8_max : {FP8_E5M2_MAX, FP8_E4M3_MAX}) {
        for (float bound : {1.0f / 8192, 1.0f / 524288, 1e-3f, 0.7f, 1.0f, 3.0f, 57344.0f, 1e6f, 1e-30f,
                            1.75f * std::ldexp(1.0f, -15), 3.5f, 448.0f / 3.0f}) {
            const float s = fp8_bound_scale(bound, fp8_max);
            CAPTURE(bound);
            CAPTURE(fp8_max);
            REQUIRE(s > 0.0f);
            CHECK((float_bits(s) & 0x007FFFFFu) == 0u);                     // a power of two
            CHECK((double)s * bound <= fp8_max);                              // nothing saturates
            CHECK(2.0 * s * bound > fp8_max);                                 // and no smaller than it needs to be
            CHECK(fp8_inverse(s) * s == 1.0f);                                // 1 / s exact
        }
    }
    CHECK(fp8_bound_scale(1.75f * std::ldexp(1.0f, -15), FP8_E5M2_MAX) == std::ldexp(1.0f, 30)); // bound * s = 57344 exactly
    // no scale: a bound that is not positive and finite, or one so small that s would not be finite
    for (float bad : {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN, 1e-40f})
        CHECK(fp8_bound_scale(bad, FP8_E5M2_MAX) == 0.0f);
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

// ---- block scaling (formats/fp8_block_scaling.h): the reference quantizers the GPU kernels must match ----

namespace {
float decode_code(uint8_t q, bool e5m2) { return e5m2 ? llmc::fp8e5m2_decode(q) : llmc::fp8e4m3_decode(q); }
// a pseudo-random value in [-1, 1) times 2^(e), e in [-8, 8): blocks of very different magnitudes
float test_value(size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ 0x9e3779b9u;
    h ^= h >> 15; h *= 0x85ebca6bu; h ^= h >> 13;
    const float u = (float)(h & 0xFFFF) / 32768.0f - 1.0f;
    return u * std::ldexp(1.0f, (int)((h >> 16) % 16) - 8);
}
} // namespace

TEST_CASE("fp8 block scaling: the scale of a block, and its edge cases") {
    using llmc::fp8_block_scale;
    CHECK(fp8_block_scale(4.0f, 448.0f, false) == 112.0f);
    CHECK(fp8_block_scale(3.0f, 448.0f, false) == 448.0f / 3.0f);
    // power of two: rounded down, so the block's amax lands in (FP8_MAX / 2, FP8_MAX]
    CHECK(fp8_block_scale(3.0f, 448.0f, true) == 128.0f);
    CHECK(fp8_block_scale(4.0f, 448.0f, true) == 64.0f);
    CHECK(fp8_block_scale(1.0f, 57344.0f, true) == 32768.0f);
    for (float amax : {1e-30f, 0.37f, 1.0f, 5.5f, 448.0f, 1e5f, 3e38f}) {
        const float s = fp8_block_scale(amax, 448.0f, true);
        CHECK(llmc::float_bits(s) % (1u << 23) == 0); // a power of two
        CHECK(amax * s <= 448.0f);
        CHECK(amax * s > 224.0f);
    }
    // every positive normal BF16 amax whose quotient fits (a block of BF16 values has a BF16 amax), E4M3 and E5M2:
    // amax * s never passes FP8_MAX, and s is the rounded quotient or the float just below it, the largest with
    // that property
    int past_max = 0, lowered = 0;
    for (float fp8_max : {448.0f, 57344.0f}) {
        for (uint32_t b = 0x0080; b < 0x7F80; b++) {
            const float amax = llmc::bits_float(b << 16);
            const float q = fp8_max / amax;
            if (!(q <= 3.4028235e38f)) continue;
            const float s = fp8_block_scale(amax, fp8_max, false);
            past_max += amax * s > fp8_max;
            const bool is_lower = s != q;
            lowered += is_lower;
            if (is_lower && (llmc::float_bits(s) + 1u != llmc::float_bits(q) || !(amax * q > fp8_max))) past_max++;
        }
    }
    CHECK(past_max == 0);
    MESSAGE("quotients lowered by one float so that the block's amax does not saturate: " << lowered);
    // zeros, inf and NaN blocks: scale 1; an overflowing quotient: 2^127
    CHECK(fp8_block_scale(0.0f, 448.0f, false) == 1.0f);
    CHECK(fp8_block_scale(std::numeric_limits<float>::infinity(), 448.0f, false) == 1.0f);
    CHECK(fp8_block_scale(std::numeric_limits<float>::quiet_NaN(), 448.0f, true) == 1.0f);
    CHECK(fp8_block_scale(1e-44f, 448.0f, false) == std::ldexp(1.0f, 127));
    CHECK(fp8_block_scale(1e-44f, 448.0f, true) == std::ldexp(1.0f, 127));
}

TEST_CASE("fp8 block scaling: the layouts of the scale arrays") {
    using namespace llmc;
    // 1 x 128: the row index runs fastest
    CHECK(fp8_vec128_scale_index(5, 0, 64) == 5);
    CHECK(fp8_vec128_scale_index(5, 2, 64) == 133);
    CHECK(fp8_vec128_scale_count(64, 300) == 3 * 64); // 300 = 2 x 128 + a tail of 44
    // 128 x 128: the K-block index runs fastest, rows of a multiple of 4
    CHECK(fp8_blk128_ld(768) == 8);   // 6 blocks -> 8
    CHECK(fp8_blk128_ld(3072) == 24);
    CHECK(fp8_blk128_scale_index(2, 3, 768) == 19);
    CHECK(fp8_blk128_scale_count(3072, 768) == 24 * 8);
    CHECK(fp8_blk128_scale_count(100, 100) == 4 * 4);
}

TEST_CASE("fp8 block scaling: 1 x 128 blocks, K a multiple of 128 or not, zero and spiky blocks") {
    for (bool e5m2 : {false, true}) {
        for (bool pow2 : {false, true}) {
            for (int k : {128, 256, 300, 100, 1}) {
                const int rows = 8;
                const float fp8_max = e5m2 ? llmc::FP8_E5M2_MAX : llmc::FP8_E4M3_MAX;
                std::vector<float> x((size_t)rows * k);
                for (size_t i = 0; i < x.size(); i++) x[i] = test_value(i);
                for (int c = 0; c < k; c++) x[(size_t)2 * k + c] = 0.0f;            // row 2: all zeros
                x[(size_t)3 * k + k / 2] = 30000.0f;                                // row 3: one huge value in a block
                for (int c = 0; c < k; c++) x[(size_t)4 * k + c] = (c % 128 == 7) ? 1e-6f : 0.0f; // tiny values only
                std::vector<uint8_t> q(x.size());
                std::vector<float> inv(llmc::fp8_vec128_scale_count(rows, k)), amax(inv.size());
                llmc::fp8_quantize_1x128_ref(x.data(), rows, k, e5m2, pow2, q.data(), inv.data(), amax.data());
                int fails = 0;
                for (int r = 0; r < rows && fails < 5; r++) {
                    for (int c = 0; c < k && fails < 5; c++) {
                        const int kb = c / 128;
                        const size_t si = llmc::fp8_vec128_scale_index(r, kb, rows);
                        // the block's amax: its own values (the tail block's too), nothing past the row's end
                        float want_amax = 0.0f;
                        for (int j = kb * 128; j < std::min(k, kb * 128 + 128); j++) want_amax = std::max(want_amax, std::fabs(x[(size_t)r * k + j]));
                        EXPECT_IN_LOOP(amax[si] == want_amax, "row " << r << " col " << c);
                        const float s = llmc::fp8_block_scale(want_amax, fp8_max, pow2);
                        EXPECT_IN_LOOP(inv[si] == 1.0f / s, "row " << r << " block " << kb);
                        const float v = x[(size_t)r * k + c];
                        EXPECT_IN_LOOP(q[(size_t)r * k + c] == llmc::fp8_block_encode(v * s, e5m2), "row " << r << " col " << c);
                        // the block's largest value is the format's largest (or within rounding of half of it with -fp2)
                        if (std::fabs(v) == want_amax && want_amax > 0.0f) {
                            const float back = std::fabs(decode_code(q[(size_t)r * k + c], e5m2));
                            EXPECT_IN_LOOP((pow2 ? back > fp8_max / 2 * 0.9f && back <= fp8_max : back == fp8_max),
                                           "amax of row " << r << " block " << kb << " decodes to " << back);
                        }
                    }
                }
                CHECK(fails == 0);
                // the zero row: codes 0, factors 1
                for (int c = 0; c < k; c++) CHECK(q[(size_t)2 * k + c] == 0);
                for (int kb = 0; kb < llmc::fp8_blocks(k); kb++) CHECK(inv[llmc::fp8_vec128_scale_index(2, kb, rows)] == 1.0f);
                // the huge value takes its block's scale alone: the other blocks of row 3 keep theirs
                const int huge_block = (k / 2) / 128;
                CHECK(amax[llmc::fp8_vec128_scale_index(3, huge_block, rows)] == 30000.0f);
                for (int kb = 0; kb < llmc::fp8_blocks(k); kb++)
                    if (kb != huge_block) CHECK(amax[llmc::fp8_vec128_scale_index(3, kb, rows)] < 256.0f);
                // tiny values are scaled up to full range, not flushed
                for (int c = 0; c < k; c++)
                    if (c % 128 == 7) CHECK(q[(size_t)4 * k + c] != 0);
            }
        }
    }
}

TEST_CASE("fp8 block scaling: 1 x 128 blocks along the columns, transposed (the wgrad operands)") {
    const int rows = 300, k = 40; // 300 tokens: two blocks of 128 and a tail of 44
    std::vector<float> x((size_t)rows * k);
    for (size_t i = 0; i < x.size(); i++) x[i] = test_value(i + 77);
    std::vector<uint8_t> qt(x.size());
    std::vector<float> inv(llmc::fp8_vec128_scale_count(k, rows));
    llmc::fp8_quantize_1x128_t_ref(x.data(), rows, k, false, false, qt.data(), inv.data());
    int fails = 0;
    for (int c = 0; c < k && fails < 5; c++) {
        for (int nb = 0; nb < llmc::fp8_blocks(rows); nb++) {
            float amax = 0.0f;
            for (int r = nb * 128; r < std::min(rows, nb * 128 + 128); r++) amax = std::max(amax, std::fabs(x[(size_t)r * k + c]));
            const float s = llmc::fp8_block_scale(amax, 448.0f, false);
            EXPECT_IN_LOOP(inv[llmc::fp8_vec128_scale_index(c, nb, k)] == 1.0f / s, "channel " << c << " block " << nb);
            for (int r = nb * 128; r < std::min(rows, nb * 128 + 128); r++)
                EXPECT_IN_LOOP(qt[(size_t)c * rows + r] == llmc::fp8_block_encode(x[(size_t)r * k + c] * s, false), "c " << c << " r " << r);
        }
    }
    CHECK(fails == 0);
}

TEST_CASE("fp8 block scaling: 128 x 128 weight blocks, W and W^T with the same scales") {
    for (bool pow2 : {false, true}) {
        for (auto shape : std::vector<std::pair<int, int>>{{256, 384}, {300, 200}, {128, 128}, {50, 130}}) {
            const int rows = shape.first, k = shape.second;
            std::vector<float> w((size_t)rows * k);
            for (size_t i = 0; i < w.size(); i++) w[i] = test_value(i + 5) * 0.02f;
            // block (0, 0) all zeros; block (last, last) one huge value
            for (int r = 0; r < std::min(rows, 128); r++)
                for (int c = 0; c < std::min(k, 128); c++) w[(size_t)r * k + c] = 0.0f;
            w[w.size() - 1] = 1000.0f;
            std::vector<uint8_t> q(w.size()), qt(w.size());
            std::vector<float> inv(llmc::fp8_blk128_scale_count(rows, k), -1.0f), inv_t(llmc::fp8_blk128_scale_count(k, rows), -1.0f);
            llmc::fp8_quantize_128x128_ref(w.data(), rows, k, false, pow2, q.data(), qt.data(), inv.data(), inv_t.data());
            int fails = 0;
            for (int rb = 0; rb < llmc::fp8_blocks(rows); rb++) {
                for (int kb = 0; kb < llmc::fp8_blocks(k); kb++) {
                    float amax = 0.0f;
                    for (int r = rb * 128; r < std::min(rows, rb * 128 + 128); r++)
                        for (int c = kb * 128; c < std::min(k, kb * 128 + 128); c++) amax = std::max(amax, std::fabs(w[(size_t)r * k + c]));
                    const float s = llmc::fp8_block_scale(amax, 448.0f, pow2);
                    EXPECT_IN_LOOP(inv[llmc::fp8_blk128_scale_index(rb, kb, k)] == 1.0f / s, "block " << rb << "," << kb);
                    EXPECT_IN_LOOP(inv_t[llmc::fp8_blk128_scale_index(kb, rb, rows)] == 1.0f / s, "block^T " << kb << "," << rb);
                }
            }
            for (int r = 0; r < rows && fails < 5; r++)
                for (int c = 0; c < k && fails < 5; c++) EXPECT_IN_LOOP(qt[(size_t)c * rows + r] == q[(size_t)r * k + c], r << "," << c);
            CHECK(fails == 0);
            if (llmc::fp8_blocks(rows) * llmc::fp8_blocks(k) > 1) { // (one block: it holds the huge value too)
                CHECK(inv[0] == 1.0f); // the zero block
                CHECK(q[0] == 0);
            }
            const int last = llmc::fp8_blocks(rows) - 1, lastk = llmc::fp8_blocks(k) - 1;
            CHECK(inv[llmc::fp8_blk128_scale_index(last, lastk, k)] == 1.0f / llmc::fp8_block_scale(1000.0f, 448.0f, pow2));
        }
    }
}
