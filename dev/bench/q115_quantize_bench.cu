// q115_quantize_bench.cu: the Q1.15 recipe's post-GEMM passes (llmc/recipes/q115/recipe.h) against copies that move
// the same bytes, at d12's shapes (65536 rows: B = 64, T = 1024). The passes quantize a linear's BF16 output in
// place (qkv: 2304 columns; read 2 bytes, write 2 per element) and quantize the fc output and apply the GELU
// (3072 columns; read 2, write 4). If a pass runs near its copy, only fewer bytes can make it faster; if not,
// fewer instructions can. Prints ms per call, the effective bandwidth and the ratio to the copy.
//
//   make build/q115_quantize_bench && ./build/q115_quantize_bench
#define SF16_TRUE_FORWARD 1
#include <cstdio>
#include <vector>
#include "llmc/recipes/q115/recipe.h"
#include "dev/bench/bench_timer.h"

// the roofline of each pass: the same loads and stores, 16 bytes per access, no arithmetic
__global__ void copy_in_place_kernel(floatX* x, long long n_vec) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vec) return;
    uint4 v = reinterpret_cast<const uint4*>(x)[i];
    v.x ^= 0x80008000u; // (a sign flip, so that the store cannot be skipped)
    reinterpret_cast<uint4*>(x)[i] = v;
}
__global__ void copy_read_one_write_two_kernel(floatX* a, floatX* b, long long n_vec) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_vec) return;
    uint4 v = reinterpret_cast<const uint4*>(b)[i];
    v.x ^= 0x80008000u;
    reinterpret_cast<uint4*>(b)[i] = v;
    reinterpret_cast<uint4*>(a)[i] = v;
}

int main() {
    const long long rows = 65536;
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    printf("q115_quantize_bench on %s: mean ms of 50 calls, GB/s = bytes read + written / time\n", prop.name);
    printf("%-44s %9s %9s %9s\n", "kernel", "ms", "GB/s", "vs copy");
    for (int cols : {2304, 3072}) {
        const long long n = rows * cols, n_vec = n / 8;
        std::vector<floatX> h(n);
        uint64_t z = 7;
        for (long long i = 0; i < n; i++) {
            z = z * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = (floatX)(((float)(z >> 40) / (float)(1 << 24) - 0.5f) * 2.5f); // [-1.25, 1.25): some clamp
        }
        floatX *x, *g;
        cudaCheck(cudaMalloc(&x, n * sizeof(floatX)));
        cudaCheck(cudaMalloc(&g, n * sizeof(floatX)));
        const int block = 256;
        const unsigned grid = (unsigned)ceil_div(n_vec, (long long)block);
        auto reset = [&] { cudaCheck(cudaMemcpy(x, h.data(), n * sizeof(floatX), cudaMemcpyHostToDevice)); };
        auto report = [&](const char* name, float ms, double bytes, float copy_ms) {
            printf("%-44s %9.4f %9.1f %9.3f\n", name, ms, bytes / ms / 1e6, copy_ms > 0 ? ms / copy_ms : 1.0);
        };
        char name[96];
        if (cols == 2304) {
            const double bytes = 4.0 * n;
            reset();
            const float copy = mean_ms([&] { copy_in_place_kernel<<<grid, block>>>(x, n_vec); }, 50);
            snprintf(name, sizeof name, "copy in place (%lld x %d)", rows, cols);
            report(name, copy, bytes, 0);
            reset();
            const float q = mean_ms([&] { q115_matmul_output_kernel<false><<<grid, block>>>(x, n_vec, QB_QKV); }, 50);
            report("  q115_matmul_output_kernel (qkv)", q, bytes, copy);
        } else {
            const double bytes = 6.0 * n;
            reset();
            const float copy = mean_ms([&] { copy_read_one_write_two_kernel<<<grid, block>>>(g, x, n_vec); }, 50);
            snprintf(name, sizeof name, "copy, read 1 write 2 (%lld x %d)", rows, cols);
            report(name, copy, bytes, 0);
            reset();
            const float q = mean_ms([&] { q115_fc_gelu_kernel<false><<<grid, block>>>(g, x, n_vec); }, 50);
            report("  q115_fc_gelu_kernel", q, bytes, copy);
            reset();
            const float bf = mean_ms([&] { gelu_forward<IdentityBoundaries>(g, x, n, 0); }, 50);
            report("  (BF16 gelu_forward: read 1 write 1)", bf, 4.0 * n, copy);
        }
        cudaCheck(cudaFree(x));
        cudaCheck(cudaFree(g));
    }
    return 0;
}
