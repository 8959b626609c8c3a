// test_util.h: small helpers shared by the CPU unit tests.
#pragma once
#include <doctest/doctest.h>
#include <functional>
#include <string>
#include "llmc/common.h"

// Check a condition inside a big loop without paying for a doctest assertion per iteration: a
// failure is reported (FAIL_CHECK, the test goes on) and counted in the caller's `int fails`, so
// the loop can stop after a few.
#define EXPECT_IN_LOOP(cond, ...)                                                                 \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            ++fails;                                                                              \
            FAIL_CHECK(__VA_ARGS__);                                                              \
        }                                                                                         \
    } while (0)

namespace test_util {

// The message of the InputError that f throws; fails the test if it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const llmc::InputError& e) {
        return e.what();
    }
    FAIL_CHECK("expected an llmc::InputError, nothing was thrown");
    return "<no error>";
}

inline bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

} // namespace test_util
