// nvfp4_stress.cu: the NVFP4 amax and quantize kernels (both directions, RHT, with and without stochastic
// rounding and Four Over Six, telemetry every 8th round) on 8192-row tensors whose 16-value blocks lie
// 2^-145 .. 2^30 apart, with 5% zeros and 5% values down to the float denormals; stops at the first CUDA
// error. A fault finder, not a numerics test (build/test_nvfp4 checks the bits against the CPU reference).
//   make build/nvfp4_stress && ./build/nvfp4_stress [cols = 768] [rounds = 100]
// A fault finder for launch failures of NVFP4 runs (doc/recipes/nvfp4.md, "Known limits"): it rules the
// quantize kernels in or out; run it under compute-sanitizer memcheck too.
#include "llmc/cuda_common.h"
#include "llmc/recipes/nvfp4/nvfp4_kernels.cuh"
#include <random>
#include <vector>
#include <cstdio>
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16); }
int main(int argc, char** argv) {
    const int rows = 8192, cols = argc > 1 ? atoi(argv[1]) : 768, rounds = argc > 2 ? atoi(argv[2]) : 100;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    std::vector<uint16_t> h((size_t)rows * cols);
    floatX *dx, *o1, *o2;
    cudaCheck(cudaMalloc(&dx, h.size() * 2)); cudaCheck(cudaMalloc(&o1, h.size() * 2)); cudaCheck(cudaMalloc(&o2, h.size() * 2));
    uint32_t* amax; cudaCheck(cudaMalloc(&amax, 64));
    float* alpha; cudaCheck(cudaMalloc(&alpha, 64));
    double* stats; cudaCheck(cudaMalloc(&stats, 64)); cudaCheck(cudaMemset(stats, 0, 64));
    const uint16_t signs = llmc::nvfp4_rht_signs(77);
    for (int r = 0; r < rounds; r++) {
        const int mode = r % 4;
        for (size_t b = 0; b < h.size() / 16; b++) {
            float base = ldexpf(1.0f, -(int)(ud(rng) * (mode == 0 ? 30 : mode == 1 ? 130 : mode == 2 ? 145 : 60)));
            if (mode == 3 && ud(rng) < 0.01f) base *= 1e30f;
            for (int i = 0; i < 16; i++) {
                float v = base * nd(rng);
                const float u = ud(rng);
                if (u < 0.05f) v = 0.0f;
                else if (u < 0.10f) v = ldexpf(nd(rng), -(int)(ud(rng) * 149)); // down to BF16/FP32 denormals
                h[b * 16 + i] = f2bf(v);
            }
        }
        cudaCheck(cudaMemcpy(dx, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
        for (int opt = 0; opt < 4; opt++) {
            const bool sr = opt & 1, fos = (opt & 2) != 0;
            nvfp4_amax(dx, rows, cols, amax, amax + 1, true, signs, 0);
            Nvfp4Direction rd, cd;
            rd.out = o1; rd.amax = amax; rd.stochastic = sr; rd.seed = 11 + r; rd.alpha = alpha; rd.other_amax = amax + 1;
            rd.stats = (r % 8 == 0) ? stats : nullptr;
            cd.out = o2; cd.amax = amax + 1; cd.rht = true; cd.stochastic = sr; cd.seed = 17 + r; cd.alpha = alpha + 4;
            cd.other_amax = amax; cd.stats = rd.stats;
            nvfp4_quantize(dx, rows, cols, rd, cd, fos, signs, 0);
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) { printf("round %d mode %d sr %d fos %d: %s\n", r, mode, sr, fos, cudaGetErrorString(e)); return 1; }
        }
    }
    printf("nvfp4_stress: %d rounds x 4 option sets at %d x %d, no error\n", rounds, rows, cols);
    return 0;
}
