// profiler.h: per-phase GPU time of a training step, from CUDA events.
//
// Enabled with the environment variable LLMC_PROFILE=1 (off by default: an event per phase costs a
// little); LLMC_PROFILE=2 also records the fine phases (PHASE_FINE: each GEMM of the BF16 linears by
// layer kind and direction), which split the coarse phase they sit in. step_begin() starts a training step; PHASE("name") records an event on the stream; the time between one phase's event
// and the next is charged to the first. At the end of a step, profile_step_end() synchronizes once
// and adds the intervals into per-name totals; profile_report() prints the table (ms per step and
// share of the step).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>
#include <cuda_runtime.h>

struct PhaseProfiler {
    bool enabled = false;
    bool fine = false;                       // LLMC_PROFILE=2: PHASE_FINE records too
    bool recording = false;                  // only inside training steps (not validation, sampling)
    cudaStream_t stream = 0;
    std::vector<cudaEvent_t> pool;           // reused events
    std::vector<const char*> names;          // phase of each recorded event, this step
    std::map<std::string, double> total_ms;  // accumulated over steps
    std::vector<std::string> order;          // first-seen order, for the report
    int steps = 0;

    void init(cudaStream_t s) {
        const char* env = getenv("LLMC_PROFILE");
        enabled = env && (env[0] == '1' || env[0] == '2');
        fine = env && env[0] == '2';
        stream = s;
    }
    void step_begin() { recording = enabled; }
    void begin(const char* name) {
        if (!recording) return;
        if (names.size() == pool.size()) {
            cudaEvent_t e;
            cudaEventCreate(&e);
            pool.push_back(e);
        }
        cudaEventRecord(pool[names.size()], stream);
        names.push_back(name);
    }
    void step_end() {
        if (!enabled || names.empty()) return;
        begin("(end)");
        cudaEventSynchronize(pool[names.size() - 1]);
        for (size_t i = 0; i + 1 < names.size(); i++) {
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, pool[i], pool[i + 1]);
            if (!total_ms.count(names[i])) order.push_back(names[i]);
            total_ms[names[i]] += ms;
        }
        names.clear();
        steps++;
        recording = false;
    }
    void reset() { total_ms.clear(); order.clear(); steps = 0; names.clear(); }
    void report() const {
        if (!enabled || steps == 0) return;
        double sum = 0.0;
        for (auto& kv : total_ms) sum += kv.second;
        printf("per-phase GPU time (LLMC_PROFILE=1), mean over %d steps:\n", steps);
        printf("  %-28s %10s %7s\n", "phase", "ms/step", "share");
        for (const std::string& n : order) {
            double ms = total_ms.at(n) / steps;
            printf("  %-28s %10.3f %6.1f%%\n", n.c_str(), ms, 100.0 * total_ms.at(n) / sum);
        }
        printf("  %-28s %10.3f\n", "total", sum / steps);
    }
};

static PhaseProfiler g_profiler;
#define PHASE(name) g_profiler.begin(name)
#define PHASE_FINE(name) do { if (g_profiler.fine) g_profiler.begin(name); } while (0)
