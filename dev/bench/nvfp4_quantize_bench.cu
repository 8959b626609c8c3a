// nvfp4_quantize_bench.cu: times the NVFP4 quantize kernels of llmc/recipes/nvfp4/nvfp4_kernels.cuh on one
// d12-sized activation (65536 x 768 and 65536 x 3072 BF16), one variant at a time, so that the cost
// of each option (Four Over Six, stochastic rounding, the Hadamard transform, the second direction)
// is visible. Prints ms per call and the effective bandwidth (bytes read + written / time).
//
//   make build/nvfp4_quantize_bench && ./build/nvfp4_quantize_bench [VARIANT [COLS [REPS]]]
// VARIANT: run only the variants whose name contains it (e.g. "(dy)"); COLS: only that width; REPS:
// timed calls per variant (default 20). With REPS 0 each variant launches once, untimed (for ncu).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "llmc/recipes/nvfp4/nvfp4_kernels.cuh"
#include "dev/bench/bench_timer.h"

int main(int argc, char** argv) {
    const char* only = argc > 1 ? argv[1] : nullptr;
    const int only_cols = argc > 2 ? atoi(argv[2]) : 0;
    const int reps = argc > 3 ? atoi(argv[3]) : 20;
    const int rows = 65536;
    for (int cols : {768, 3072}) {
        if (only_cols != 0 && cols != only_cols) continue;
        const size_t n = (size_t)rows * cols;
        std::vector<floatX> h(n);
        uint64_t z = 1;
        for (size_t i = 0; i < n; i++) {
            z = llmc::nvfp4_mix64(z);
            h[i] = (floatX)(((float)(z >> 40) / (float)(1 << 24) - 0.5f) * 4.0f);
        }
        floatX *x, *a, *b;
        cudaCheck(cudaMalloc(&x, n * sizeof(floatX)));
        cudaCheck(cudaMalloc(&a, n * sizeof(floatX)));
        cudaCheck(cudaMalloc(&b, n * sizeof(floatX)));
        cudaCheck(cudaMemcpy(x, h.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
        uint32_t* amax;
        cudaCheck(cudaMalloc(&amax, 16));
        nvfp4_amax(x, rows, cols, amax, amax + 1, true, 0x1234, 0);
        struct Variant { const char* name; bool rows, cols, rht, sr, fos; };
        const Variant variants[] = {
            {"rows RNE", true, false, false, false, false},
            {"rows RNE 4/6", true, false, false, false, true},
            {"rows SR", true, false, false, true, false},
            {"rows SR 4/6", true, false, false, true, true},
            {"cols RNE", false, true, false, false, false},
            {"cols RHT RNE 4/6", false, true, true, false, true},
            {"cols RHT SR 4/6", false, true, true, true, true},
            {"rows+cols RHT SR 4/6 (dy)", true, true, true, true, true},
        };
        auto time_it = [](auto launch, int reps) { return mean_ms(launch, reps, 1); };
        if (reps > 0) {
            const float amax_ms = time_it([&] { nvfp4_amax(x, rows, cols, amax, amax + 1, true, 0x1234, 0); }, reps);
            printf("%d x %d: amax (plain + rotated) %.3f ms (%.0f GB/s)\n", rows, cols, amax_ms, n * 2 / amax_ms / 1e6);
        }
        for (const Variant& v : variants) {
            if (only != nullptr && strstr(v.name, only) == nullptr) continue;
            Nvfp4Direction rd, cd;
            if (v.rows) { rd.out = a; rd.amax = amax; rd.stochastic = v.sr; rd.seed = 7; }
            if (v.cols) { cd.out = b; cd.amax = amax + 1; cd.rht = v.rht; cd.stochastic = v.sr; cd.seed = 8; }
            if (reps <= 0) { // one untimed launch
                nvfp4_quantize(x, rows, cols, rd, cd, v.fos, 0x1234, 0);
                cudaCheck(cudaDeviceSynchronize());
                printf("  %-28s launched once\n", v.name);
                continue;
            }
            const float ms = time_it([&] { nvfp4_quantize(x, rows, cols, rd, cd, v.fos, 0x1234, 0); }, reps);
            const double bytes = n * 2.0 * (1 + (v.rows ? 1 : 0) + (v.cols ? 1 : 0));
            printf("  %-28s %.3f ms (%.0f GB/s)\n", v.name, ms, bytes / ms / 1e6);
        }
        cudaFree(x); cudaFree(a); cudaFree(b); cudaFree(amax);
    }
    return 0;
}
