// eval_file.h: multiple-choice evaluation files (HellaSwag: dev/data/hellaswag.py), llm.c's format, read
// whole and checked before the GPU is touched (host only, no CUDA).
//
// Layout (little-endian):
//   256 int32 header: [0] magic 20240522, [1] version 1, [2] number of examples N, [3] bytes of the longest
//   example; then N examples, each a run of uint16:
//     65535 (start of an example), the example's bytes (these three values included), its index (0, 1, ...),
//     the label (index of the right ending), the number of endings E,
//     the context's token count, its tokens, then E times: the ending's token count, its tokens.
// An ending is scored by the mean cross-entropy of its tokens, each predicted from the context and the ending's
// tokens before it: inputs are context + ending, and position (context length + i - 1) predicts ending token i.
// So a context and an ending together must fit in the sequence length T.
#pragma once
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace llmc {

constexpr int32_t kEvalMagic = 20240522;
constexpr int32_t kEvalVersion = 1;
constexpr int64_t kEvalHeaderBytes = 256 * 4;
constexpr uint16_t kEvalStartOfExample = 65535;
constexpr int kEvalMaxEndings = 16;
// HellaSwag's validation split is about 6 MB; anything above this is not an eval file of this kind
constexpr int64_t kEvalMaxFileBytes = 1ll << 30;
constexpr const char* kEvalHint = "make it with dev/data/hellaswag.py";

struct EvalExample {
    int label = 0;
    std::vector<uint16_t> context;
    std::vector<std::vector<uint16_t>> endings;
};

// Reads and checks the whole file: every field, every token id below vocab_size, every context + ending within
// max_tokens (the run's T). Throws InputError naming the file and what is wrong.
inline std::vector<EvalExample> read_eval_file(const std::string& path, int vocab_size, int max_tokens) {
    const char* p = path.c_str();
    struct stat st;
    if (::stat(p, &st) != 0) input_error("cannot open eval file %s: %s; %s", p, std::strerror(errno), kEvalHint);
    if (!S_ISREG(st.st_mode)) input_error("eval file %s is not a regular file", p);
    const int64_t size = (int64_t)st.st_size;
    if (size < kEvalHeaderBytes)
        input_error("eval file %s is %lld bytes, shorter than its %lld-byte header; %s", p, (long long)size,
                    (long long)kEvalHeaderBytes, kEvalHint);
    if (size > kEvalMaxFileBytes)
        input_error("eval file %s is %lld bytes, more than an eval file of this kind can be (%lld)", p, (long long)size,
                    (long long)kEvalMaxFileBytes);
    if ((size - kEvalHeaderBytes) % 2 != 0) input_error("eval file %s: an odd number of bytes after the header; %s", p, kEvalHint);
    std::vector<unsigned char> bytes((size_t)size);
    FILE* f = std::fopen(p, "rb");
    if (!f) input_error("cannot open eval file %s: %s", p, std::strerror(errno));
    const bool read_ok = std::fread(bytes.data(), 1, bytes.size(), f) == bytes.size();
    std::fclose(f);
    if (!read_ok) input_error("cannot read eval file %s (changed while reading?)", p);

    auto i32 = [&](int k) {
        int32_t v;
        std::memcpy(&v, &bytes[(size_t)k * 4], 4);
        return v;
    };
    if (i32(0) != kEvalMagic)
        input_error("%s is not an eval file (magic %d, expected %d); %s", p, i32(0), kEvalMagic, kEvalHint);
    if (i32(1) != kEvalVersion) input_error("eval file %s has version %d, expected %d; %s", p, i32(1), kEvalVersion, kEvalHint);
    const int32_t count = i32(2), longest = i32(3);
    const int64_t words = (size - kEvalHeaderBytes) / 2;
    // (an example is at least 8 values: start, bytes, index, label, endings, a context token, one ending of one)
    if (count <= 0 || count > words / 8)
        input_error("eval file %s claims %d examples, which its %lld bytes cannot hold; %s", p, count, (long long)size, kEvalHint);
    auto word = [&](int64_t k) {
        uint16_t v;
        std::memcpy(&v, &bytes[(size_t)(kEvalHeaderBytes + 2 * k)], 2);
        return v;
    };

    std::vector<EvalExample> examples((size_t)count);
    int64_t at = 0;
    for (int32_t i = 0; i < count; i++) {
        auto bad = [&](const std::string& what) {
            input_error("eval file %s, example %d: %s; the file is corrupt or not of this format; %s", p, i, what.c_str(), kEvalHint);
        };
        if (words - at < 6) bad("the file ends inside it");
        if (word(at) != kEvalStartOfExample) bad(strfmt("no start marker (%u)", (unsigned)word(at)));
        const int64_t n = word(at + 1) / 2, end = at + n;
        if (word(at + 1) % 2 != 0 || n < 8 || end > words) bad(strfmt("its size (%u bytes) does not fit the file", (unsigned)word(at + 1)));
        if (word(at + 1) > longest) bad(strfmt("%u bytes, more than the header's longest (%d)", (unsigned)word(at + 1), longest));
        if (word(at + 2) != (uint16_t)i) bad(strfmt("it says it is example %u", (unsigned)word(at + 2)));
        EvalExample& ex = examples[(size_t)i];
        ex.label = word(at + 3);
        const int num_endings = word(at + 4);
        if (num_endings < 2 || num_endings > kEvalMaxEndings) bad(strfmt("%d endings (2 to %d make sense)", num_endings, kEvalMaxEndings));
        if (ex.label >= num_endings) bad(strfmt("label %d, but it has %d endings", ex.label, num_endings));
        int64_t k = at + 5;
        auto take_tokens = [&](std::vector<uint16_t>& out, const char* what) {
            if (k >= end) bad(strfmt("its %s's length is past its end", what));
            const int64_t len = word(k++);
            if (len == 0) bad(strfmt("an empty %s", what));
            if (len > end - k) bad(strfmt("its %s (%lld tokens) runs past its end", what, (long long)len));
            out.resize((size_t)len);
            for (int64_t t = 0; t < len; t++) {
                out[(size_t)t] = word(k + t);
                if ((int)out[(size_t)t] >= vocab_size)
                    bad(strfmt("token id %u in its %s is >= vocab size %d", (unsigned)out[(size_t)t], what, vocab_size));
            }
            k += len;
        };
        take_tokens(ex.context, "context");
        ex.endings.resize((size_t)num_endings);
        for (int e = 0; e < num_endings; e++) {
            take_tokens(ex.endings[(size_t)e], "ending");
            const size_t total = ex.context.size() + ex.endings[(size_t)e].size();
            if (total > (size_t)max_tokens)
                input_error("eval file %s, example %d: its context and ending %d are %zu tokens, longer than -t %d; "
                            "raise -t or use a file of shorter examples", p, i, e, total, max_tokens);
        }
        if (k != end) bad(strfmt("%lld values after its last ending", (long long)(end - k)));
        at = end;
    }
    if (at != words) input_error("eval file %s: %lld bytes after its %d examples; %s", p, (long long)(2 * (words - at)), count, kEvalHint);
    return examples;
}

} // namespace llmc
