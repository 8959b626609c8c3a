// rand.h: the trainer's deterministic host random number generator.
//
// Used for weight init, data shuffling, sampling and stochastic-rounding seeds. Everything here
// is defined bit-for-bit by this file (no std::*_distribution, whose output differs between
// standard libraries), so a given seed gives the same numbers with g++, clang and nvcc.
//
// Generator: xoshiro256** (Blackman & Vigna): 256 bits of state, period 2^256 - 1, passes
// BigCrush. Its state is seeded by running splitmix64 over the 64-bit seed, which spreads even
// tiny seeds (0, 1, 2...) over the whole state and never yields the forbidden all-zero state.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include "common.h"

namespace llmc {

// One step of splitmix64: advances *x by the golden-ratio increment and returns a well-mixed
// 64-bit value of it (the finalizer is a bijection, so distinct states give distinct outputs).
inline uint64_t splitmix64_next(uint64_t* x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// Stateless hash of two 64-bit values, for deriving independent sub-seeds, e.g.
// mix64(mix64(seed, epoch), shard). Not symmetric: mix64(a, b) != mix64(b, a) in general.
inline uint64_t mix64(uint64_t a, uint64_t b) {
    uint64_t x = a;
    uint64_t h = splitmix64_next(&x);      // scramble a
    x = h ^ b;
    return splitmix64_next(&x);            // then fold b in and scramble again
}

// The generator's complete state: plain-old-data, so a checkpoint can store it as raw bytes.
struct RngState {
    uint64_t s[4];
};

class Rng {
public:
    explicit Rng(uint64_t seed = 0) { reseed(seed); }

    // Fill the 4 state words with consecutive splitmix64 outputs of `seed`.
    void reseed(uint64_t seed) {
        uint64_t x = seed;
        for (int i = 0; i < 4; i++) st_.s[i] = splitmix64_next(&x);
    }

    RngState get_state() const { return st_; }

    // An all-zero state is a fixed point of xoshiro (it would output 0 forever); it can only come
    // from a corrupt checkpoint, so it is reported as the user's input error.
    void set_state(const RngState& s) {
        if ((s.s[0] | s.s[1] | s.s[2] | s.s[3]) == 0)
            input_error("RNG state is all zeros; the checkpoint it came from is corrupt");
        st_ = s;
    }

    // xoshiro256**: output = rotl(s1 * 5, 7) * 9, then the linear xorshift update of the state.
    uint64_t next_u64() {
        uint64_t* s = st_.s;
        const uint64_t result = rotl(s[1] * 5, 7) * 9;
        const uint64_t t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = rotl(s[3], 45);
        return result;
    }

    // The high bits of xoshiro256** are its best ones, so narrower outputs take the top bits.
    uint32_t next_u32() { return (uint32_t)(next_u64() >> 32); }

    // Uniform in [0, 1) on a grid of 2^-24: the top 24 bits as an integer k, times 2^-24.
    // Every value is exactly representable as a float (24-bit mantissa), so no rounding up to 1.
    float next_float01() { return (float)(next_u64() >> 40) * (1.0f / 16777216.0f); }

    // Uniform in [0, 1) on a grid of 2^-53 (exact in a double).
    double next_double01() { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

    // Unbiased integer in [0, n), n > 0. Plain `x % n` favours small results when 2^64 is not a
    // multiple of n; we reject the lowest (2^64 mod n) values of x so that the accepted range is
    // an exact multiple of n. (-n) % n computes 2^64 mod n in unsigned arithmetic. The rejection
    // chance is < n / 2^64, so in practice one draw.
    uint64_t next_below(uint64_t n) {
        if (n <= 1) return 0;
        const uint64_t threshold = (0 - n) % n;
        for (;;) {
            uint64_t x = next_u64();
            if (x >= threshold) return x % n;
        }
    }

    // Standard normal by Box–Muller: with u1 in (0, 1] and u2 in [0, 1),
    //   r = sqrt(-2 ln u1), z0 = r cos(2 pi u2), z1 = r sin(2 pi u2)
    // are two independent N(0, 1) samples. next_normal() returns z0 and discards z1, so each call
    // consumes exactly two u64 draws and the result depends on nothing but the state (no cached
    // spare value that would have to go into the checkpoint).
    double next_normal() {
        double z0, z1;
        box_muller(&z0, &z1);
        return z0;
    }

    // out[i] = mean + std * N(0,1) for i < n. Uses both Box–Muller outputs per pair of draws
    // (z0 for even i, z1 for odd i); for odd n the last z1 is discarded.
    void fill_normal(float* out, size_t n, float mean, float std) {
        size_t i = 0;
        for (; i + 1 < n; i += 2) {
            double z0, z1;
            box_muller(&z0, &z1);
            out[i] = (float)(mean + std * z0);
            out[i + 1] = (float)(mean + std * z1);
        }
        if (i < n) out[i] = (float)(mean + std * next_normal());
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

    void box_muller(double* z0, double* z1) {
        // 1 - u maps [0, 1) to (0, 1], so the log is always finite.
        const double u1 = 1.0 - next_double01();
        const double u2 = next_double01();
        const double two_pi = 6.283185307179586476925286766559;
        const double r = std::sqrt(-2.0 * std::log(u1));
        *z0 = r * std::cos(two_pi * u2);
        *z1 = r * std::sin(two_pi * u2);
    }

    RngState st_;
};

// In-place Fisher–Yates (Durstenfeld) shuffle: for i from n-1 down to 1, swap a[i] with a[j],
// j uniform in [0, i]. Each of the n! orders comes out with probability 1/n! given a uniform
// next_below. Written out here because std::shuffle's algorithm is implementation-defined, so it
// would give different orders with different standard libraries.
template <typename T>
inline void fisher_yates_shuffle(T* a, size_t n, Rng& rng) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng.next_below((uint64_t)i);   // j in [0, i-1]
        T tmp = a[i - 1];
        a[i - 1] = a[j];
        a[j] = tmp;
    }
}

} // namespace llmc
