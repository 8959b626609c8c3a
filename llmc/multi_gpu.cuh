// multi_gpu.cuh: data parallelism over NCCL, one process per GPU.
//
// What crosses between processes, all of it on one NCCL stream of this process, ordered against
// the compute stream by events (a collective waits for the compute that produced its input, and
// the compute that reads its output waits for it):
//   - the gradients, block by block as the backward pass finishes each layer (train_gpt.cu):
//     all-reduced (-z 0), or reduce-scattered so that each process holds the sum of its own pieces
//     (-z 1, ZeRO-1, zero.h); NCCL runs them while the backward pass of the earlier layers goes on;
//   - under ZeRO-1, after the optimizer step, the updated parameters (all-gather of the pieces);
//   - the squared gradient norm (ZeRO-1: each process has the norm of its pieces), the loss sums,
//     the validation loss, a recipe's state that must agree (FP8's amax: maximum), and barriers.
// In-place forms throughout: a reduce-scatter leaves process r's sum at its own piece of the
// block, an all-gather reads each process's piece from where it sits in the full buffer.
//
// Faults. A process that dies or hangs leaves the others waiting inside a collective for ever, so
// a watchdog thread follows every collective this process starts: once the NCCL stream reaches it
// (its inputs are ready here), it must finish within the timeout (-pt; barriers around checkpoints
// get longer), else the watchdog prints which collective and step timed out, aborts the NCCL
// communicator and ends the process with exit status 3. It also ends it at once on an error NCCL
// reports asynchronously (a peer's connection closing, for one). The launcher scripts/launch.sh
// stops the remaining processes as soon as one exits with an error.
//
// NVLink multicast (NVLS) stays off: the trainer sets NCCL_NVLS_ENABLE=0 unless the environment
// already says otherwise, and never asks for multicast memory.
#pragma once
#include <nccl.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "cuda_common.h"
#include "process_group.h"

#define ncclCheck(call) nccl_check_impl((call), #call, __FILE__, __LINE__)
inline void nccl_check_impl(ncclResult_t r, const char* what, const char* file, int line) {
    if (r == ncclSuccess) return;
    fprintf(stderr, "error: NCCL: %s failed: %s (%s:%d)\n", what, ncclGetErrorString(r), file, line);
    const char* last = ncclGetLastError(nullptr);
    if (last && last[0]) fprintf(stderr, "       %s\n", last);
    fflush(stderr);
    _exit(3);
}

#if defined(ENABLE_FP32)
#define NCCL_FLOATX ncclFloat
#else
#define NCCL_FLOATX ncclBfloat16
#endif

struct MultiGpu {
    bool active = false;          // NCCL in use (several processes, or -pf/-ps given with one)
    int rank = 0, world = 1;
    int zero_stage = 0;           // 1: the optimizer state is sharded (zero.h)
    double timeout_s = 30.0;
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t compute_done = nullptr, nccl_done = nullptr;
    float* scratch = nullptr;     // a few device floats for host values
    int step = 0;                 // for the watchdog's message

    // the watchdog: collectives in flight, oldest first
    struct Pending {
        cudaEvent_t reached, finished;
        std::string what;
        int step;
        double timeout_s;
        bool reached_seen;
        std::chrono::steady_clock::time_point reached_at;
    };
    std::mutex mutex;
    std::deque<Pending> pending;
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> spare_events;
    std::atomic<bool> stopping{false};
    std::atomic<double> host_deadline{0.0};  // seconds since epoch_; 0 = none (NCCL's own set-up)
    const char* host_phase = "";
    std::chrono::steady_clock::time_point epoch_;
    std::thread watchdog;
    int gpu = 0;
    // an early return from main (an error) must not leave the watchdog running
    ~MultiGpu() {
        stopping = true;
        if (watchdog.joinable()) watchdog.join();
    }
};

// ---- the watchdog ---------------------------------------------------------------------------

[[noreturn]] inline void multi_gpu_fail(MultiGpu* mg, const std::string& why) {
    fprintf(stderr, "error: process %d of %d: %s\n", mg->rank, mg->world, why.c_str());
    fflush(stderr);
    fflush(stdout);
    // ncclCommAbort makes NCCL's kernels let go; give it a few seconds, then leave regardless
    if (mg->comm) {
        ncclComm_t comm = mg->comm;
        std::atomic<bool> aborted{false};
        std::thread t([comm, &aborted] { ncclCommAbort(comm); aborted = true; });
        for (int i = 0; i < 50 && !aborted; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        t.detach();
    }
    _exit(3);
}

inline double multi_gpu_now(const MultiGpu* mg) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - mg->epoch_).count();
}

inline void multi_gpu_watch(MultiGpu* mg) {
    cudaSetDevice(mg->gpu);
    while (!mg->stopping) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const double deadline = mg->host_deadline.load();
        if (deadline > 0 && multi_gpu_now(mg) > deadline)
            multi_gpu_fail(mg, llmc::strfmt("%s did not finish within %.0f s: another process is missing, died or hangs",
                                      mg->host_phase, mg->timeout_s));
        if (mg->comm) {
            ncclResult_t async = ncclSuccess;
            if (ncclCommGetAsyncError(mg->comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
                multi_gpu_fail(mg, llmc::strfmt("NCCL reported %s (another process died or lost its connection)",
                                          ncclGetErrorString(async)));
        }
        std::lock_guard<std::mutex> lock(mg->mutex);
        while (!mg->pending.empty()) {
            MultiGpu::Pending& p = mg->pending.front();
            cudaError_t done = cudaEventQuery(p.finished);
            if (done == cudaSuccess) {
                mg->spare_events.push_back({p.reached, p.finished});
                mg->pending.pop_front();
                continue;
            }
            if (done != cudaErrorNotReady)
                multi_gpu_fail(mg, llmc::strfmt("CUDA error while waiting for %s: %s", p.what.c_str(), cudaGetErrorString(done)));
            if (!p.reached_seen && cudaEventQuery(p.reached) == cudaSuccess) {
                p.reached_seen = true;
                p.reached_at = std::chrono::steady_clock::now();
            }
            if (p.reached_seen) {
                const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.reached_at).count();
                if (waited > p.timeout_s)
                    multi_gpu_fail(mg, llmc::strfmt("%s (step %d) did not finish within %.0f s of this process reaching it: "
                                              "another process died or hangs (-pt sets the limit)",
                                              p.what.c_str(), p.step, p.timeout_s));
            }
            break; // the NCCL stream runs in order: nothing after the oldest has finished
        }
    }
}

// Bracket every collective: begin before the NCCL calls, end after them (one or a group).
inline void multi_gpu_begin(MultiGpu* mg) {
    std::pair<cudaEvent_t, cudaEvent_t> ev;
    {
        std::lock_guard<std::mutex> lock(mg->mutex);
        if (!mg->spare_events.empty()) { ev = mg->spare_events.back(); mg->spare_events.pop_back(); }
        else ev = {nullptr, nullptr};
    }
    if (!ev.first) {
        cudaCheck(cudaEventCreateWithFlags(&ev.first, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&ev.second, cudaEventDisableTiming));
    }
    cudaCheck(cudaEventRecord(ev.first, mg->stream));
    std::lock_guard<std::mutex> lock(mg->mutex);
    mg->pending.push_back({ev.first, ev.second, "", mg->step, mg->timeout_s, false, {}});
}
inline void multi_gpu_end(MultiGpu* mg, const std::string& what, double timeout_s = 0.0) {
    std::lock_guard<std::mutex> lock(mg->mutex);
    MultiGpu::Pending& p = mg->pending.back();
    p.what = what;
    if (timeout_s > 0) p.timeout_s = timeout_s;
    cudaCheck(cudaEventRecord(p.finished, mg->stream));
}

// ---- set-up ---------------------------------------------------------------------------------

// Joins the run's NCCL communicator (cfg has the ranks; gpu is already current). With one process
// and no -pf/-ps there is nothing to join: mg stays inactive and every collective below is a no-op.
inline void multi_gpu_init(MultiGpu* mg, const llmc::TrainConfig& cfg, int gpu) {
    mg->rank = cfg.process_rank;
    mg->world = cfg.num_processes;
    mg->gpu = gpu;
    mg->timeout_s = cfg.comm_timeout;
    mg->active = cfg.num_processes > 1 || !llmc::init_method_of(cfg).empty();
    mg->zero_stage = mg->active ? cfg.zero_stage : 0;
    if (!mg->active) return;
    setenv("NCCL_NVLS_ENABLE", "0", 0); // never NVLink multicast (a shared machine's GPUs can hang on it)
    mg->epoch_ = std::chrono::steady_clock::now();
    mg->watchdog = std::thread(multi_gpu_watch, mg);
    // the id: rank 0's, handed over by file or socket; the others may start later (a launcher, a
    // scheduler), so the wait for them is four times -pt
    llmc::ProcessId id{};
    if (mg->rank == 0) {
        ncclUniqueId nid;
        ncclCheck(ncclGetUniqueId(&nid));
        memcpy(id.data(), &nid, sizeof(nid));
    }
    const int join_timeout = 4 * cfg.comm_timeout; // (120 s by default)
    id = llmc::exchange_process_id(cfg, id, join_timeout);
    ncclUniqueId nid;
    memcpy(&nid, id.data(), sizeof(nid));
    mg->host_phase = "joining the NCCL communicator";
    mg->host_deadline = multi_gpu_now(mg) + join_timeout;
    ncclCheck(ncclCommInitRank(&mg->comm, mg->world, nid, mg->rank));
    mg->host_deadline = 0.0;
    // (every process has joined, so every process has read the id: the next run must not find it)
    if (mg->rank == 0 && llmc::init_method_of(cfg) == "fs") llmc::remove_fs_id(cfg.init_dir, mg->world);
    cudaCheck(cudaStreamCreateWithFlags(&mg->stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&mg->compute_done, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&mg->nccl_done, cudaEventDisableTiming));
    mg->scratch = (float*)cuda_malloc_or_die(4 * sizeof(float), "multi-GPU scratch");
}

inline void multi_gpu_finish(MultiGpu* mg) {
    if (!mg->active) return;
    cudaCheck(cudaStreamSynchronize(mg->stream));
    mg->stopping = true;
    if (mg->watchdog.joinable()) mg->watchdog.join();
    ncclCommDestroy(mg->comm);
    mg->comm = nullptr;
}

// ---- ordering between the streams -----------------------------------------------------------

// the NCCL stream waits for what the compute stream has enqueued so far
inline void multi_gpu_after_compute(MultiGpu* mg, cudaStream_t compute) {
    cudaCheck(cudaEventRecord(mg->compute_done, compute));
    cudaCheck(cudaStreamWaitEvent(mg->stream, mg->compute_done, 0));
}
// the compute stream waits for what the NCCL stream has enqueued so far
inline void multi_gpu_before_compute(MultiGpu* mg, cudaStream_t compute) {
    if (!mg->active) return;
    cudaCheck(cudaEventRecord(mg->nccl_done, mg->stream));
    cudaCheck(cudaStreamWaitEvent(compute, mg->nccl_done, 0));
}

// ---- collectives (no-ops when inactive) -----------------------------------------------------

// One collective on the NCCL stream: ordered after the compute enqueued so far, watched by the timeout
// (multi_gpu_begin / multi_gpu_end, which name `what` if it hangs), and the compute enqueued next waits
// for it. `enqueue` makes the NCCL call(s) on mg->stream.
template <typename Enqueue>
inline void multi_gpu_collective(MultiGpu* mg, cudaStream_t compute, const char* what, Enqueue enqueue) {
    multi_gpu_after_compute(mg, compute);
    multi_gpu_begin(mg);
    enqueue();
    multi_gpu_end(mg, what);
    multi_gpu_before_compute(mg, compute);
}

// sum of n floats over the processes, in place
inline void multi_gpu_all_reduce_sum(MultiGpu* mg, float* x, size_t n, cudaStream_t compute, const char* what) {
    if (!mg->active) return;
    multi_gpu_collective(mg, compute, what, [&] { ncclCheck(ncclAllReduce(x, x, n, ncclFloat, ncclSum, mg->comm, mg->stream)); });
}

// maximum of n uint32 (the bits of non-negative floats order like the floats), in place
inline void multi_gpu_all_reduce_max_u32(MultiGpu* mg, uint32_t* x, size_t n, cudaStream_t compute, const char* what) {
    if (!mg->active || n == 0) return;
    multi_gpu_collective(mg, compute, what, [&] { ncclCheck(ncclAllReduce(x, x, n, ncclUint32, ncclMax, mg->comm, mg->stream)); });
}

// sum of n doubles over the processes, in place
inline void multi_gpu_all_reduce_sum_f64(MultiGpu* mg, double* x, size_t n, cudaStream_t compute, const char* what) {
    if (!mg->active || n == 0) return;
    multi_gpu_collective(mg, compute, what, [&] { ncclCheck(ncclAllReduce(x, x, n, ncclDouble, ncclSum, mg->comm, mg->stream)); });
}

// in place, for each of `count` buffers of `world` pieces (piece r of buffer i: piece_bytes[i] bytes at
// bufs[i] + r * piece_bytes[i]): every process's own piece to every process, as one NCCL group
inline void multi_gpu_all_gather_pieces(MultiGpu* mg, uint8_t* const* bufs, const size_t* piece_bytes, int count,
                                        cudaStream_t compute, const char* what) {
    if (!mg->active || count == 0) return;
    multi_gpu_collective(mg, compute, what, [&] {
        ncclCheck(ncclGroupStart());
        for (int i = 0; i < count; i++)
            ncclCheck(ncclAllGather(bufs[i] + (size_t)mg->rank * piece_bytes[i], bufs[i], piece_bytes[i], ncclUint8, mg->comm, mg->stream));
        ncclCheck(ncclGroupEnd());
    });
}

// process 0's n uint32 at x to every process (in order on the compute stream)
inline void multi_gpu_broadcast_u32(MultiGpu* mg, uint32_t* x, size_t n, cudaStream_t compute, const char* what) {
    if (!mg->active || n == 0) return;
    multi_gpu_collective(mg, compute, what, [&] { ncclCheck(ncclBroadcast(x, x, n, ncclUint32, 0, mg->comm, mg->stream)); });
}

// the mean of a host value over the processes (synchronizes)
inline double multi_gpu_mean(MultiGpu* mg, double x, cudaStream_t compute, const char* what) {
    if (!mg->active) return x;
    float v = (float)x;
    cudaCheck(cudaMemcpyAsync(mg->scratch, &v, sizeof(float), cudaMemcpyHostToDevice, compute));
    multi_gpu_all_reduce_sum(mg, mg->scratch, 1, compute, what);
    cudaCheck(cudaMemcpyAsync(&v, mg->scratch, sizeof(float), cudaMemcpyDeviceToHost, compute));
    cudaCheck(cudaStreamSynchronize(compute));
    return v / mg->world;
}

// the sum over the processes of n host doubles (n <= 2: they travel through the scratch), in place (synchronizes);
// integers up to 2^53 add exactly
inline void multi_gpu_sum_host(MultiGpu* mg, double* x, size_t n, cudaStream_t compute, const char* what) {
    if (!mg->active || n == 0) return;
    if (n > 4 * sizeof(float) / sizeof(double)) { fprintf(stderr, "error: multi_gpu_sum_host: %zu values, at most 2\n", n); exit(1); }
    double* dev = reinterpret_cast<double*>(mg->scratch);
    cudaCheck(cudaMemcpyAsync(dev, x, n * sizeof(double), cudaMemcpyHostToDevice, compute));
    multi_gpu_all_reduce_sum_f64(mg, dev, n, compute, what);
    cudaCheck(cudaMemcpyAsync(x, dev, n * sizeof(double), cudaMemcpyDeviceToHost, compute));
    cudaCheck(cudaStreamSynchronize(compute));
}

// every process reaches this point before any leaves it (synchronizes); timeout_s: how long the
// others may take to get here (a checkpoint being written, say)
inline void multi_gpu_barrier(MultiGpu* mg, cudaStream_t compute, const char* what, double timeout_s) {
    if (!mg->active) return;
    cudaCheck(cudaStreamSynchronize(compute));
    multi_gpu_begin(mg);
    ncclCheck(ncclAllReduce(mg->scratch, mg->scratch, 1, ncclFloat, ncclSum, mg->comm, mg->stream));
    multi_gpu_end(mg, what, timeout_s);
    cudaCheck(cudaStreamSynchronize(mg->stream));
}
