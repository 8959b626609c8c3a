// bench_timer.h: the timing loop the dev/bench kernel benches share.
#pragma once
#include "llmc/cuda_common.h"

// Mean milliseconds of one call of fn: `warmup` untimed calls, then `reps` calls between two CUDA
// events on the default stream (fn must launch there).
template <typename F>
static float mean_ms(F fn, int reps, int warmup = 3) {
    for (int i = 0; i < warmup; i++) fn();
    cudaEvent_t t0, t1;
    cudaCheck(cudaEventCreate(&t0));
    cudaCheck(cudaEventCreate(&t1));
    cudaCheck(cudaEventRecord(t0));
    for (int i = 0; i < reps; i++) fn();
    cudaCheck(cudaEventRecord(t1));
    cudaCheck(cudaEventSynchronize(t1));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, t0, t1));
    cudaCheck(cudaEventDestroy(t0));
    cudaCheck(cudaEventDestroy(t1));
    return ms / reps;
}
