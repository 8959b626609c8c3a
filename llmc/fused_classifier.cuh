// fused_classifier.cuh: softmax + cross-entropy + dlogits in one kernel; probabilities are never stored.
// For each position (row) with target y over the first V of Vp logit columns:
//   lse = log sum_i exp(logit_i),  loss = lse - logit_y
//   dlogit_i = (exp(logit_i - lse) - [i == y]) * dloss    for i < V,   0 for the padded columns
// dlogits overwrite the logits in place (the buffer is not needed afterwards). One block per row.
// Boundaries (boundaries.h): the softmax reads z_i = Bd::LOGIT_SCALE * Bd::logits(logit_i) in place of
// logit_i, and dlogit_i gets the factor LOGIT_SCALE (the hook itself is straight-through). Without
// dlogits and with active boundaries, Bd::logits(logit_i) is written back, so that the stored logits
// are the boundary's values (for evaluation, tests and sampling).
#pragma once
#include <type_traits>
#include "cuda_common.h"
#include "boundaries.h"

// Each thread reads 16 bytes (8 BF16 / 4 FP32 logits) at a time; Vp is a multiple of 128, so every
// row starts 16-byte aligned. Columns >= V are padding: skipped in the softmax, given gradient 0.
template <class Bd>
__device__ __forceinline__ float classifier_logit(float x) {
    if constexpr (Bd::ACTIVE) return Bd::LOGIT_SCALE * Bd::logits(x);
    else return x;
}

// Two forms of one kernel (one block of 1024 threads a row; thread t takes the row's 16-byte vectors t,
// t + 1024, ...): the softmax pass reads the row, the gradient pass reads it again and overwrites it.
//   STAGED:  each thread first copies its vectors into shared memory (cp.async, all of them in flight at
//            once) and both passes read them from there: the row comes from DRAM once, and the first pass
//            does not wait on one global load after another. Two CTAs an SM need 2 x (row + ~1 KB) of
//            shared memory and at most 32 registers a thread (__launch_bounds__ below).
//   unstaged: both passes read the row from global memory (the second mostly from L2), for rows too long
//            for that (CLASSIFIER_STAGED_MAX_BYTES).
// The two compute the same values in the same order, so they agree bit for bit (build/test_classifier).
// Every thread reads back only the vectors it copied itself, so the staged form needs no barrier for them.
constexpr int CLASSIFIER_THREADS = 1024;
constexpr int CLASSIFIER_STAGED_MAX_BYTES = 112 * 1024; // two CTAs of an SM's 228 KB (GPT-2's row: 100,608)

template <class Bd, bool STAGED>
__global__ void __launch_bounds__(CLASSIFIER_THREADS, 2)
fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp, bool write_dlogits) {
    constexpr int PER = 16 / sizeof(floatX);
    extern __shared__ uint4 staged_row[]; // (STAGED: the row's vectors)
    long long row = blockIdx.x;
    floatX* x = logits + row * Vp;
    const int num_vec = Vp / PER;
    const uint4* row_vec = reinterpret_cast<const uint4*>(x);
    if constexpr (STAGED) {
        for (int j = threadIdx.x; j < num_vec; j += blockDim.x) cp_async16(staged_row + j, row_vec + j, true);
        cp_async_commit();
        cp_async_wait<0>();
    }
    auto vec = [&](int j) -> uint4 {
        if constexpr (STAGED) return staged_row[j];
        else return row_vec[j];
    };
    // pass 1: online max and sum of exponentials (each thread its own, then merged)
    float m = -INFINITY, s = 0.0f;
    for (int j = threadIdx.x; j < num_vec; j += blockDim.x) {
        uint4 packed = vec(j);
        const floatX* v = reinterpret_cast<const floatX*>(&packed);
#pragma unroll
        for (int k = 0; k < PER; k++) {
            if (j * PER + k >= V) break;
            float val = classifier_logit<Bd>((float)v[k]);
            if (val > m) { s = s * expf(m - val) + 1.0f; m = val; }
            else s += expf(val - m);
        }
    }
    float block_m = block_max(m);
    s = (m == -INFINITY) ? 0.0f : s * expf(m - block_m);
    float block_s = block_sum(s);
    float lse = block_m + logf(block_s);
    int y = targets[row];
    if (threadIdx.x == 0) losses[row] = lse - classifier_logit<Bd>((float)x[y]);
    if (!write_dlogits) {
        if constexpr (Bd::ACTIVE) {
            __syncthreads(); // everyone has read x[y]
            for (int j = threadIdx.x; j < num_vec; j += blockDim.x) {
                uint4 packed = vec(j);
                floatX* v = reinterpret_cast<floatX*>(&packed);
#pragma unroll
                for (int k = 0; k < PER; k++) v[k] = (floatX)Bd::logits((float)v[k]);
                reinterpret_cast<uint4*>(x)[j] = packed;
            }
        }
        return;
    }
    __syncthreads(); // everyone has read x[y] before it is overwritten
    // pass 2: gradient, written in place
    for (int j = threadIdx.x; j < num_vec; j += blockDim.x) {
        uint4 packed = vec(j);
        floatX* v = reinterpret_cast<floatX*>(&packed);
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int i = j * PER + k;
            float g = 0.0f;
            if (i < V) g = (expf(classifier_logit<Bd>((float)v[k]) - lse) - (i == y ? 1.0f : 0.0f)) * (dloss * Bd::LOGIT_SCALE);
            v[k] = (floatX)g;
        }
        reinterpret_cast<uint4*>(x)[j] = packed;
    }
}

// Which form runs: the staged one where the row fits (AUTO), or either one (tests, timing)
enum class ClassifierForm { AUTO, STAGED, UNSTAGED };
inline bool classifier_row_fits_staged(int Vp) { return (size_t)Vp * sizeof(floatX) <= (size_t)CLASSIFIER_STAGED_MAX_BYTES; }

template <class Bd = IdentityBoundaries>
inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                             int BT, int V, int Vp, bool write_dlogits, cudaStream_t stream,
                             ClassifierForm form = ClassifierForm::AUTO) {
    if (Vp % (16 / sizeof(floatX)) != 0) {
        fprintf(stderr, "error: the padded vocabulary %d must be a multiple of %d\n", Vp, (int)(16 / sizeof(floatX)));
        exit(1);
    }
    if constexpr (!std::is_same<Bd, typename Bd::Values>::value) {
        // a counting policy counts only in a telemetry step; otherwise the kernel without the
        // counting code (boundaries.h, observing())
        if (!Bd::observing()) {
            fused_classifier<typename Bd::Values>(logits, losses, targets, dloss, BT, V, Vp, write_dlogits, stream, form);
            return;
        }
    }
    const bool fits = classifier_row_fits_staged(Vp);
    if (form == ClassifierForm::STAGED && !fits) {
        fprintf(stderr, "error: the classifier's staged form holds rows of at most %d bytes (Vp = %d)\n", CLASSIFIER_STAGED_MAX_BYTES, Vp);
        exit(1);
    }
    if (fits && form != ClassifierForm::UNSTAGED) {
        allow_dynamic_smem<fused_classifier_kernel<Bd, true>>(CLASSIFIER_STAGED_MAX_BYTES);
        fused_classifier_kernel<Bd, true><<<BT, CLASSIFIER_THREADS, (size_t)Vp * sizeof(floatX), stream>>>(
            logits, losses, targets, dloss, V, Vp, write_dlogits);
    } else {
        fused_classifier_kernel<Bd, false><<<BT, CLASSIFIER_THREADS, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    }
    cudaCheckLaunch();
}

// *loss_sum += sum of the n per-position losses (one block: a fixed summation order, deterministic).
// Keeping the running sum on the device lets a training step synchronize once, not per micro-step.
__global__ void loss_sum_kernel(float* loss_sum, const float* losses, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += losses[i];
    s = block_sum(s);
    if (threadIdx.x == 0) *loss_sum += s;
}
inline void accumulate_loss(float* loss_sum, const float* losses, int n, cudaStream_t stream) {
    loss_sum_kernel<<<1, 1024, 0, stream>>>(loss_sum, losses, n);
    cudaCheckLaunch();
}
