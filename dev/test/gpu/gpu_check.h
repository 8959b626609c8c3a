// gpu_check.h: what the standalone GPU tests (test_attention, test_fp8, test_nvfp4, test_vcast)
// share: the pass/fail bookkeeping (one "[PASS] ..." or "[FAIL] ..." line per check, counted for the
// final "N passed, N failed" line that dev/test/run_tests.sh reads), host <-> device copies and the
// BF16 conversions.
#pragma once
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "llmc/cuda_common.h"

static int g_passed = 0, g_failed = 0;

static void check(bool ok, const char* fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("[%s] %s\n", ok ? "PASS" : "FAIL", msg);
    fflush(stdout);
    (ok ? g_passed : g_failed)++;
}

// Whether a CUDA device is present; without one the test prints the line run_tests.sh counts as
// skipped (the caller then exits with 77)
static bool gpu_present() {
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
        printf("skipped: no CUDA device\n");
        return false;
    }
    return true;
}

// a device copy of a host vector (at least one element allocated)
template <typename T>
static T* to_device(const std::vector<T>& h) {
    T* d = nullptr;
    cudaCheck(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
// n elements back from the device, after everything queued has finished
template <typename T>
static std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaDeviceSynchronize());
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// median GPU time in ms of `iters` runs of f (after `warmup` runs), timed with CUDA events on stream 0
template <typename F>
static double median_ms(F&& f, int warmup = 3, int iters = 20) {
    for (int i = 0; i < warmup; i++) f();
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    std::vector<float> ms(iters);
    for (int i = 0; i < iters; i++) {
        cudaCheck(cudaEventRecord(e0, 0));
        f();
        cudaCheck(cudaEventRecord(e1, 0));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    cudaCheck(cudaEventDestroy(e0));
    cudaCheck(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
}

#if !defined(ENABLE_FP32)
static inline float bf2f(floatX b) { return __bfloat162float(b); }
static inline floatX f2bf(float f) { return __float2bfloat16(f); }
static inline uint16_t bfbits(floatX b) { uint16_t u; memcpy(&u, &b, 2); return u; }
#endif

// n values uniform in [lo, hi), rounded to the storage type
static inline std::vector<floatX> random_floatx(size_t n, std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<floatX> v(n);
    for (auto& x : v) x = (floatX)u(rng);
    return v;
}
