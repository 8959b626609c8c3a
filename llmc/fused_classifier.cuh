// fused_classifier.cuh: softmax + cross-entropy + dlogits in one kernel; probabilities are never stored.
// For each position (row) with target y over the first V of Vp logit columns:
//   lse = log sum_i exp(logit_i),  loss = lse - logit_y
//   dlogit_i = (exp(logit_i - lse) - [i == y]) * dloss    for i < V,   0 for the padded columns
// dlogits overwrite the logits in place (the buffer is not needed afterwards). One block per row.
// On request (codes, for a recipe that runs the LM head's input-gradient GEMM in FP8: recipe_api.h's
// HeadGradCodes) the kernel also writes each stored dlogit as an E5M2 code of dlogit * code_scale, rounded
// to nearest even and saturating (cvt.rn.satfinite, as formats/fp8_quantize.cuh's quantizers), into a row-major
// (rows x Vp) byte array: exactly what that quantizer makes of the stored BF16 dlogits, without a pass of
// its own.
// Boundaries (boundaries.h): the softmax reads z_i = Bd::LOGIT_SCALE * Bd::logits(logit_i) in place of
// logit_i, and dlogit_i gets the factor LOGIT_SCALE (the hook itself is straight-through). Without
// dlogits and with active boundaries, Bd::logits(logit_i) is written back, so that the stored logits
// are the boundary's values (for evaluation, tests and sampling).
#pragma once
#include <type_traits>
#include "cuda_common.h"
#include "boundaries.h"
#include "formats/fp8_quantize.cuh" // fp8_pack2: the codes the quantize pass would make

// Each thread reads 16 bytes (8 BF16 / 4 FP32 logits) at a time; Vp is a multiple of 128, so every
// row starts 16-byte aligned. Columns >= V are padding: skipped in the softmax, given gradient 0.
template <class Bd>
__device__ __forceinline__ float classifier_logit(float x) {
    if constexpr (Bd::ACTIVE) return Bd::LOGIT_SCALE * Bd::logits(x);
    else return x;
}

// Two forms of one kernel (one block of 1024 threads a row; thread t takes the row's 16-byte vectors t,
// t + 1024, ...): three passes over the row, each in the same order: its maximum m, then
// s = sum_i e^(z_i - m) and lse = m + ln s, then the gradient, which overwrites the row.
//   STAGED:  each thread first copies its vectors into shared memory (cp.async, all of them in flight at
//            once) and the passes read them from there: the row comes from DRAM once, and no pass waits on
//            one global load after another. Two CTAs an SM need 2 x (row + ~1 KB) of shared memory and at
//            most 32 registers a thread (__launch_bounds__ below).
//   unstaged: the passes read the row from global memory (the later ones mostly from L2), for rows too long
//            for that (CLASSIFIER_STAGED_MAX_BYTES).
// The two compute the same values in the same order, so they agree bit for bit (build/test_classifier).
// Every thread reads back only the vectors it copied itself, so the staged form needs no barrier for them.
// The kernel is bound by its instructions as much as by its bytes (50,257 exponentials a row, twice), so
// each exponential is e^(z - c) = 2^(z log2(e) - c log2(e)): one FMA and one MUFU.EX2 (classifier_exp). The
// maximum is taken first, in a pass of its own, rather than online (which rescales the running sum, with
// a branch, whenever the maximum grows). Only the vector holding column V - 1 and the padding vectors
// after it test each column against V.
constexpr int CLASSIFIER_THREADS = 1024;
constexpr int CLASSIFIER_STAGED_MAX_BYTES = 112 * 1024; // two CTAs of an SM's 228 KB (GPT-2's row: 100,608)
constexpr float CLASSIFIER_LOG2E = 1.4426950408889634f;

// e^(z - c), c_log2 = c log2(e): one FMA and one MUFU.EX2. The FP32 reference build (ENABLE_FP32, compiled without
// fast math) keeps expf's accuracy instead.
__device__ __forceinline__ float classifier_exp(float z, float c, float c_log2) {
#if defined(ENABLE_FP32)
    (void)c_log2;
    return expf(z - c);
#else
    (void)c;
    return fast_exp2(fmaf(z, CLASSIFIER_LOG2E, -c_log2));
#endif
}

template <class Bd, bool STAGED, bool CODES>
__global__ void __launch_bounds__(CLASSIFIER_THREADS, 2)
fused_classifier_kernel(floatX* logits, float* losses, const int* targets, float dloss, int V, int Vp, bool write_dlogits,
                        uint8_t* codes, float code_scale) {
    constexpr int PER = 16 / sizeof(floatX);
    static_assert(!CODES || PER == 8, "the E5M2 codes are written 8 bytes at a time: BF16 logits only");
    extern __shared__ uint4 staged_row[]; // (STAGED: the row's vectors)
    long long row = blockIdx.x;
    floatX* x = logits + row * Vp;
    const int num_vec = Vp / PER;
    const int full_vec = V / PER; // vectors 0 .. full_vec - 1 hold real columns only
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
    // the PER values z = classifier_logit(logit) of vector j
    auto values = [&](int j, float (&z)[PER]) {
        uint4 packed = vec(j);
        const floatX* v = reinterpret_cast<const floatX*>(&packed);
#pragma unroll
        for (int k = 0; k < PER; k++) z[k] = classifier_logit<Bd>((float)v[k]);
    };
    // each pass calls `each` on this thread's vectors, with a compile-time flag: whether vector j needs its
    // columns tested against V
    auto for_my_vectors = [&](auto each) {
        for (int j = threadIdx.x; j < num_vec; j += blockDim.x) {
            if (j < full_vec) each(j, std::false_type());
            else each(j, std::true_type());
        }
    };
    // pass 1: the maximum over the real columns
    float m = -INFINITY;
    for_my_vectors([&](int j, auto tested) {
        float z[PER];
        values(j, z);
#pragma unroll
        for (int k = 0; k < PER; k++)
            if (!decltype(tested)::value || j * PER + k < V) m = fmaxf(m, z[k]);
    });
    const float block_m = block_max(m);
    // pass 2: the sum of exponentials, in units of e^block_m (a row of -inf: s = 0, lse = -inf)
    const float m_safe = block_m == -INFINITY ? 0.0f : block_m;
    const float m_log2 = m_safe * CLASSIFIER_LOG2E;
    float s = 0.0f;
    for_my_vectors([&](int j, auto tested) {
        float z[PER];
        values(j, z);
#pragma unroll
        for (int k = 0; k < PER; k++)
            if (!decltype(tested)::value || j * PER + k < V) s += classifier_exp(z[k], m_safe, m_log2);
    });
    const float block_s = block_sum(s);
    const float lse = block_m + logf(block_s);
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
    // pass 3: gradient, written in place: (e^(z - lse) - [i == y]) * dloss * LOGIT_SCALE, 0 past V
    const float lse_log2 = lse * CLASSIFIER_LOG2E;
    const float grad_scale = dloss * Bd::LOGIT_SCALE;
    const int y_vec = y / PER;
    for_my_vectors([&](int j, auto tested) {
        float z[PER];
        values(j, z);
        const int y_k = j == y_vec ? y - j * PER : -1; // the target's place in this vector, if here
        uint4 packed;
        floatX* v = reinterpret_cast<floatX*>(&packed);
#pragma unroll
        for (int k = 0; k < PER; k++) {
            float g = 0.0f;
            if (!decltype(tested)::value || j * PER + k < V)
                g = (classifier_exp(z[k], lse, lse_log2) - (k == y_k ? 1.0f : 0.0f)) * grad_scale;
            v[k] = (floatX)g;
        }
        reinterpret_cast<uint4*>(x)[j] = packed;
        if constexpr (CODES) {
            uint32_t word[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                auto pack = [&](int k) { return (uint32_t)fp8_pack2<Fp8Kind::E5M2>((float)v[k] * code_scale, (float)v[k + 1] * code_scale); };
                word[h] = pack(4 * h) | (pack(4 * h + 2) << 16);
            }
            reinterpret_cast<uint2*>(codes + row * Vp)[j] = make_uint2(word[0], word[1]);
        }
    });
}

// Which form runs: the staged one where the row fits (AUTO), or either one (tests, timing)
enum class ClassifierForm { AUTO, STAGED, UNSTAGED };
inline bool classifier_row_fits_staged(int Vp) { return (size_t)Vp * sizeof(floatX) <= (size_t)CLASSIFIER_STAGED_MAX_BYTES; }

// codes (may be null): the dlogits' E5M2 codes (rows BT x Vp, of dlogit * code_scale; written only with the
// dlogits, in BF16 builds)
template <class Bd = IdentityBoundaries>
inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                             int BT, int V, int Vp, bool write_dlogits, cudaStream_t stream,
                             ClassifierForm form = ClassifierForm::AUTO, uint8_t* codes = nullptr, float code_scale = 1.0f) {
    if (Vp % (16 / sizeof(floatX)) != 0) {
        fprintf(stderr, "error: the padded vocabulary %d must be a multiple of %d\n", Vp, (int)(16 / sizeof(floatX)));
        exit(1);
    }
    if constexpr (!std::is_same<Bd, typename Bd::Values>::value) {
        // a counting policy counts only in a telemetry step; otherwise the kernel without the
        // counting code (boundaries.h, observing())
        if (!Bd::observing()) {
            fused_classifier<typename Bd::Values>(logits, losses, targets, dloss, BT, V, Vp, write_dlogits, stream, form,
                                                  codes, code_scale);
            return;
        }
    }
    const bool fits = classifier_row_fits_staged(Vp);
    if (form == ClassifierForm::STAGED && !fits) {
        fprintf(stderr, "error: the classifier's staged form holds rows of at most %d bytes (Vp = %d)\n", CLASSIFIER_STAGED_MAX_BYTES, Vp);
        exit(1);
    }
    if (!write_dlogits) codes = nullptr;
    if (codes != nullptr && sizeof(floatX) != 2) {
        fprintf(stderr, "error: the classifier writes dlogit codes in BF16 builds only\n");
        exit(1);
    }
    auto launch = [&](auto staged, auto with_codes) {
        constexpr bool STAGED = decltype(staged)::value, CODES = decltype(with_codes)::value && sizeof(floatX) == 2;
        auto kernel = fused_classifier_kernel<Bd, STAGED, CODES>;
        if constexpr (STAGED) allow_dynamic_smem<fused_classifier_kernel<Bd, STAGED, CODES>>(CLASSIFIER_STAGED_MAX_BYTES);
        kernel<<<BT, CLASSIFIER_THREADS, STAGED ? (size_t)Vp * sizeof(floatX) : 0, stream>>>(
            logits, losses, targets, dloss, V, Vp, write_dlogits, codes, code_scale);
    };
    const bool staged = fits && form != ClassifierForm::UNSTAGED;
    if (staged && codes) launch(std::true_type(), std::true_type());
    else if (staged) launch(std::true_type(), std::false_type());
    else if (codes) launch(std::false_type(), std::true_type());
    else launch(std::false_type(), std::false_type());
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
