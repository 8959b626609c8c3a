// kernel_trace.cpp: a CUPTI injection library that records when every kernel, memcpy and memset of a program
// ran on the GPU, in the stream, as the program runs it (not one launch at a time, as ncu times them). It is
// for the question ncu cannot answer: how much of a training step the GPU spends between kernels.
//
// Build: make build/libkernel_trace.so
// Use:   CUDA_INJECTION64_PATH=$PWD/build/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv ./train_gpt_fp8 ...
//        python3 dev/bench/trace_gaps.py trace.csv
// The CUDA driver loads the library named by CUDA_INJECTION64_PATH when it initializes and calls its
// InitializeInjection(). That turns on CUPTI's activity records; CUPTI hands them over in buffers, and at
// exit the records are written as CSV: kind, start and end (ns, GPU clock), stream, name. Costs: a record per
// activity (a few hundred bytes) and CUPTI's own timestamps, about a microsecond a launch at most.
#include <cupti.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Activity {
    char kind; // 'K' kernel, 'C' memcpy, 'S' memset
    uint64_t start, end;
    uint32_t stream;
    std::string name;
};

std::mutex g_mutex;
std::vector<Activity> g_activities;
std::atomic<bool> g_failed{false};
constexpr size_t BUFFER_BYTES = 8 << 20;

void check_cupti(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return;
    const char* msg = nullptr;
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg ? msg : "?");
    g_failed = true;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(aligned_alloc(8, BUFFER_BYTES));
    *size = *buffer ? BUFFER_BYTES : 0; // (no buffer: CUPTI drops the records and counts them)
    *max_records = 0;                   // as many as fit
    if (*buffer == nullptr) {
        fprintf(stderr, "kernel_trace: out of host memory for a record buffer; the trace will miss activities\n");
        g_failed = true;
    }
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid_bytes) {
    std::vector<Activity> got;
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            got.push_back({'K', k->start, k->end, k->streamId, k->name ? k->name : "?"});
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
            got.push_back({'C', m->start, m->end, m->streamId, "memcpy"});
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
            got.push_back({'S', m->start, m->end, m->streamId, "memset"});
            break;
        }
        default: break;
        }
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped);
    if (dropped) {
        fprintf(stderr, "kernel_trace: CUPTI dropped %zu records\n", dropped);
        g_failed = true;
    }
    free(buffer);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_activities.insert(g_activities.end(), got.begin(), got.end());
}

void write_trace() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const char* path = getenv("KERNEL_TRACE_OUT");
    if (path == nullptr) path = "kernel_trace.csv";
    std::lock_guard<std::mutex> lock(g_mutex);
    // written to a temporary name first, so that a reader never sees half a file
    const std::string tmp = std::string(path) + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (f == nullptr) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", tmp.c_str());
        return;
    }
    fprintf(f, "kind,start_ns,end_ns,stream,name\n");
    for (const Activity& a : g_activities) {
        std::string quoted; // (the name as a CSV field: in quotes, its own quotes doubled)
        for (char c : a.name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
        fprintf(f, "%c,%llu,%llu,%u,\"%s\"\n", a.kind, (unsigned long long)a.start, (unsigned long long)a.end, a.stream,
                quoted.c_str());
    }
    const bool ok = fclose(f) == 0 && rename(tmp.c_str(), path) == 0;
    fprintf(stderr, "kernel_trace: %zu activities %s %s%s\n", g_activities.size(), ok ? "written to" : "NOT written to",
            path, g_failed ? " (incomplete: see the errors above)" : "");
}

} // namespace

extern "C" int InitializeInjection(void) {
    check_cupti(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
    check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling memcpy records");
    check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
    atexit(write_trace);
    return 1;
}
