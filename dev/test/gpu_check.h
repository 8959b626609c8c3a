// gpu_check.h: the pass/fail bookkeeping of the standalone GPU tests (test_attention, test_fp8):
// one "[PASS] ..." or "[FAIL] ..." line per check, counted for the final "N passed, N failed" line
// that dev/test/run_tests.sh reads.
#pragma once
#include <cstdarg>
#include <cstdio>

static int g_passed = 0, g_failed = 0;

static void check(bool ok, const char* fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("[%s] %s\n", ok ? "PASS" : "FAIL", msg);
    fflush(stdout);
    (ok ? g_passed : g_failed)++;
}
