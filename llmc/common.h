// common.h: small host-side helpers shared by every part of the trainer.
//
// Errors caused by the user's input (a bad flag, a corrupt shard, a checkpoint of the wrong
// shape, an unwritable directory) are thrown as llmc::InputError with one line that names the
// file or flag and says what to do. main() catches it, prints "error: <message>" and exits 1.
// Throwing (rather than exit()) lets the CPU unit tests assert on the exact message.
#pragma once
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace llmc {

struct InputError : std::runtime_error {
    explicit InputError(const std::string& msg) : std::runtime_error(msg) {}
};

// printf-style formatting into a std::string
inline std::string vstrfmt(const char* fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(nullptr, 0, fmt, ap);
    std::string s(n > 0 ? (size_t)n : 0, '\0');
    if (n > 0) vsnprintf(&s[0], (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}
inline std::string strfmt(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    return s;
}

// throw an InputError with a printf-style message
[[noreturn]] inline void input_error(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vstrfmt(fmt, ap);
    va_end(ap);
    throw InputError(s);
}

} // namespace llmc
