// Multiple-choice eval files (llmc/eval_file.h): a file written here by the format's definition reads back
// exactly, and every kind of damage is one InputError naming the file and the example.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dev/test/cpu/test_util.h"
#include "llmc/eval_file.h"

using test_util::contains;
using test_util::error_of;

namespace {

struct Example {
    uint16_t label;
    std::vector<uint16_t> context;
    std::vector<std::vector<uint16_t>> endings;
};

// one example's uint16 run, as the format defines it
std::vector<uint16_t> example_run(uint16_t index, const Example& ex) {
    std::vector<uint16_t> body = {ex.label, (uint16_t)ex.endings.size(), (uint16_t)ex.context.size()};
    body.insert(body.end(), ex.context.begin(), ex.context.end());
    for (const auto& e : ex.endings) {
        body.push_back((uint16_t)e.size());
        body.insert(body.end(), e.begin(), e.end());
    }
    std::vector<uint16_t> run = {65535, (uint16_t)(2 * (3 + body.size())), index};
    run.insert(run.end(), body.begin(), body.end());
    return run;
}

std::vector<unsigned char> file_bytes(const std::vector<Example>& examples, int32_t magic = 20240522) {
    std::vector<std::vector<uint16_t>> runs;
    int32_t longest = 0;
    for (size_t i = 0; i < examples.size(); i++) {
        runs.push_back(example_run((uint16_t)i, examples[i]));
        longest = std::max<int32_t>(longest, (int32_t)(2 * runs.back().size()));
    }
    std::vector<int32_t> header(256, 0);
    header[0] = magic; header[1] = 1; header[2] = (int32_t)examples.size(); header[3] = longest;
    std::vector<unsigned char> b((unsigned char*)header.data(), (unsigned char*)header.data() + 1024);
    for (const auto& r : runs) b.insert(b.end(), (const unsigned char*)r.data(), (const unsigned char*)(r.data() + r.size()));
    return b;
}

struct TempFile {
    std::string path;
    TempFile() {
        char tmpl[] = "/tmp/llmc_eval_XXXXXX";
        int fd = mkstemp(tmpl);
        REQUIRE(fd >= 0);
        close(fd);
        path = tmpl;
    }
    ~TempFile() { unlink(path.c_str()); }
    void write(const std::vector<unsigned char>& b) const {
        FILE* f = std::fopen(path.c_str(), "wb");
        REQUIRE(f);
        std::fwrite(b.data(), 1, b.size(), f);
        std::fclose(f);
    }
};

std::vector<Example> three_examples() {
    return {{2, {10, 11, 12}, {{20}, {21, 22}, {23}, {24, 25, 26}}},
            {0, {1}, {{2, 3}, {4}, {5}, {6}}},
            {3, {7, 8, 9, 10, 11}, {{50256}, {1}, {2}, {3, 4}}}};
}

} // namespace

TEST_CASE("eval file: a file written by the format's definition reads back exactly") {
    TempFile f;
    const std::vector<Example> want = three_examples();
    f.write(file_bytes(want));
    const std::vector<llmc::EvalExample> got = llmc::read_eval_file(f.path, 50257, 64);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); i++) {
        CAPTURE(i);
        CHECK(got[i].label == want[i].label);
        CHECK(got[i].context == want[i].context);
        CHECK(got[i].endings == want[i].endings);
    }
}

TEST_CASE("eval file: damage is refused, naming the file and the example") {
    TempFile f;
    const std::vector<unsigned char> good = file_bytes(three_examples());
    auto refused = [&](const std::vector<unsigned char>& b, int vocab = 50257, int T = 64) {
        f.write(b);
        std::string msg = error_of([&] { llmc::read_eval_file(f.path, vocab, T); });
        CHECK(contains(msg, f.path));
        return msg;
    };
    CHECK(contains(refused(file_bytes(three_examples(), 12345)), "not an eval file (magic 12345"));
    CHECK(contains(refused(std::vector<unsigned char>(good.begin(), good.begin() + 500)), "shorter than its 1024-byte header"));
    CHECK(contains(refused(std::vector<unsigned char>(good.begin(), good.end() - 2)), "example 2"));
    std::vector<unsigned char> extra = good;
    extra.push_back(0); extra.push_back(0);
    CHECK(contains(refused(extra), "bytes after its 3 examples"));
    // a token id at the vocabulary's edge: 50256 is fine for V = 50257, not for V = 50000
    CHECK(contains(refused(good, 50000), "example 2: token id 50256 in its ending is >= vocab size 50000"));
    // context + ending longer than T
    CHECK(contains(refused(good, 50257, 5), "example 0: its context and ending 3 are 6 tokens, longer than -t 5"));
    CHECK_NOTHROW(llmc::read_eval_file((f.write(good), f.path), 50257, 8));
    // a label that is not one of the endings
    std::vector<Example> ex = three_examples();
    ex[1].label = 4;
    CHECK(contains(refused(file_bytes(ex)), "example 1: label 4, but it has 4 endings"));
    // an empty ending; an index out of order; a header claiming more examples than the bytes hold
    ex = three_examples();
    ex[2].endings[1].clear();
    CHECK(contains(refused(file_bytes(ex)), "example 2: an empty ending"));
    std::vector<unsigned char> b = good;
    b[1024 + 4] = 7;  // example 0's index
    CHECK(contains(refused(b), "example 0: it says it is example 7"));
    b = good;
    int32_t huge = 1 << 30;
    std::memcpy(&b[8], &huge, 4);
    CHECK(contains(refused(b), "claims 1073741824 examples"));
    // every single flipped byte of the examples is refused or reads back as different data, never a crash
    for (size_t i = 1024; i < good.size(); i++) {
        std::vector<unsigned char> flip = good;
        flip[i] ^= 0x41;
        f.write(flip);
        try { (void)llmc::read_eval_file(f.path, 50257, 64); }
        catch (const llmc::InputError&) {}
    }
    // not a regular file
    CHECK(contains(error_of([] { llmc::read_eval_file("/tmp", 50257, 64); }), "not a regular file"));
}
