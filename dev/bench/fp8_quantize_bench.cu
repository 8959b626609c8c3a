// fp8_quantize_bench.cu: times the FP8 quantize kernels of llmc/formats/fp8_quantize.cuh at the shapes of one
// micro-step (default d12's: B = 64, T = 1024, so 65536 rows, and C = 768: widths C, 3C, 4C), the way
// recipes/fp8/recipe.h calls them, the block quantizer of -fs block (formats/fp8_block_quantize.cuh), and a
// device-to-device copy of the same input as the bandwidth yardstick.
// Prints ms per call and the effective bandwidth (bytes read + written / time).
//
//   make build/fp8_quantize_bench && ./build/fp8_quantize_bench [rows] [C]
//   e.g. d48 at B = 16: ./build/fp8_quantize_bench 16384 1600
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "llmc/formats/fp8_quantize.cuh"
#include "llmc/formats/fp8_block_quantize.cuh"
#include "dev/bench/bench_timer.h"

int main(int argc, char** argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 65536;
    const int C = argc > 2 ? atoi(argv[2]) : 768;
    if (rows <= 0 || C <= 0 || C % 16 != 0) {
        fprintf(stderr, "usage: %s [rows > 0] [C > 0, a multiple of 16]\n", argv[0]);
        return 1;
    }
    const int max_cols = 4 * C;
    const size_t n_max = (size_t)rows * max_cols;
    std::vector<floatX> h(n_max);
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n_max; i++) {
        z ^= z << 13; z ^= z >> 7; z ^= z << 17;
        h[i] = (floatX)(((float)(z >> 40) / (float)(1 << 24) - 0.5f) * 6.0f);
    }
    floatX *x, *pre, *copy;
    uint8_t *q, *qt;
    float *scale, *sums, *partials;
    uint32_t* amax;
    unsigned long long* counts;
    cudaCheck(cudaMalloc(&x, n_max * sizeof(floatX)));
    cudaCheck(cudaMalloc(&pre, n_max * sizeof(floatX)));
    cudaCheck(cudaMalloc(&copy, n_max * sizeof(floatX)));
    cudaCheck(cudaMalloc(&q, n_max));
    cudaCheck(cudaMalloc(&qt, n_max));
    cudaCheck(cudaMalloc(&scale, sizeof(float)));
    cudaCheck(cudaMalloc(&sums, max_cols * sizeof(float)));
    cudaCheck(cudaMalloc(&partials, (size_t)ceil_div(rows, FP8_TILE) * max_cols * sizeof(float)));
    cudaCheck(cudaMalloc(&amax, sizeof(uint32_t)));
    float *block_inv, *block_inv_t; // (the 1 x 128 factors of the widest tensor in either layout)
    cudaCheck(cudaMalloc(&block_inv, llmc::fp8_vec128_scale_count(rows, max_cols) * sizeof(float)));
    cudaCheck(cudaMalloc(&block_inv_t, llmc::fp8_vec128_scale_count(max_cols, rows) * sizeof(float)));
    cudaCheck(cudaMalloc(&counts, 3 * sizeof(unsigned long long)));
    cudaCheck(cudaMemcpy(x, h.data(), n_max * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(pre, h.data() + 1, (n_max - 1) * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemset(sums, 0, max_cols * sizeof(float)));
    const float s = 40.0f;
    cudaCheck(cudaMemcpy(scale, &s, sizeof(float), cudaMemcpyHostToDevice));
    auto time_it = [](auto launch) { return mean_ms(launch, 20); };
    Fp8Stats counted;
    counted.counts = counts;
    printf("FP8 quantize kernels, %d rows (ms per call, GB/s = bytes read + written / time)\n", rows);
    for (int cols : {C, 3 * C, 4 * C}) {
        const double n = (double)rows * cols;
        auto report = [&](const char* what, double bytes, float ms) {
            printf("  %-46s %5d cols  %8.4f ms  %7.0f GB/s\n", what, cols, ms, bytes / ms / 1e6);
        };
        report("copy (cudaMemcpy, BF16 -> BF16)", 4 * n, time_it([&] {
                   cudaCheck(cudaMemcpyAsync(copy, x, (size_t)n * sizeof(floatX), cudaMemcpyDeviceToDevice));
               }));
        report("amax (tensor_amax)", 2 * n, time_it([&] { tensor_amax(amax, x, (long long)n, 0); }));
        report("x: E4M3 + transposed", 4 * n, time_it([&] {
                   fp8_quantize_transpose<Fp8Kind::E4M3>(q, qt, x, rows, cols, scale, amax, Fp8Stats(), 0);
               }));
        report("x: E4M3 + transposed, telemetry counts", 4 * n, time_it([&] {
                   fp8_quantize_transpose<Fp8Kind::E4M3>(q, qt, x, rows, cols, scale, amax, counted, 0);
               }));
        report("x: E4M3 row-major only (evaluation)", 3 * n, time_it([&] {
                   fp8_quantize<Fp8Kind::E4M3>(q, x, (long long)n, scale, nullptr, Fp8Stats(), 0);
               }));
        report("gelu(x): E4M3 + transposed", 4 * n, time_it([&] {
                   fp8_quantize_transpose<Fp8Kind::E4M3>(q, qt, x, rows, cols, scale, amax, Fp8Stats(), 0, nullptr, nullptr,
                                                         nullptr, true);
               }));
        report("dy: E5M2 + transposed + column sums", 4 * n, time_it([&] {
                   fp8_quantize_transpose<Fp8Kind::E5M2>(q, qt, x, rows, cols, scale, amax, Fp8Stats(), 0, sums, partials);
               }));
        report("dy: E5M2 + transposed + column sums + GELU'", 6 * n, time_it([&] {
                   fp8_quantize_transpose<Fp8Kind::E5M2>(q, qt, x, rows, cols, scale, amax, Fp8Stats(), 0, sums, partials,
                                                         pre);
               }));
        report("codes transpose (fp8_transpose)", 2 * n, time_it([&] { fp8_transpose(qt, q, rows, cols, 0); }));
        // -fs block: 1 x 128 blocks along the rows and, transposed, along the columns, from one read
        Fp8BlockOutput both;
        both.rows = q; both.rows_inv = block_inv; both.cols = qt; both.cols_inv = block_inv_t;
        report("block: x E4M3, rows + transposed (1 x 128)", 4 * n, time_it([&] {
                   fp8_block_quantize<Fp8Kind::E4M3>(x, rows, cols, false, false, both, amax, Fp8Stats(), 0);
               }));
        report("block: dy E5M2, rows + transposed (1 x 128)", 4 * n, time_it([&] {
                   fp8_block_quantize<Fp8Kind::E5M2>(x, rows, cols, false, false, both, amax, Fp8Stats(), 0);
               }));
    }
    return 0;
}
