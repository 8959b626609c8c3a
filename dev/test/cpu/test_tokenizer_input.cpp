// test_tokenizer_input.cpp: Tokenizer::load on inputs that are not tokenizer files at all: a header
// claiming more tokens than the file can hold, devices, directories, pipes and oversized files. Each
// is one InputError naming the file, never an allocation failure or an endless read.
#include <doctest/doctest.h>
#include "dev/test/cpu/test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llmc/tokenizer.h"

using test_util::contains;
using test_util::error_of;

namespace {

// a fresh directory under /tmp, removed with what was made in it
struct ScratchDir {
    std::string dir;
    std::vector<std::string> made;
    ScratchDir() {
        char tmpl[] = "/tmp/llmc_test_tok_XXXXXX";
        REQUIRE(mkdtemp(tmpl) != nullptr);
        dir = tmpl;
    }
    ~ScratchDir() {
        for (const std::string& p : made) std::remove(p.c_str());
        rmdir(dir.c_str());
    }
    std::string path(const char* name) {
        made.push_back(dir + "/" + name);
        return made.back();
    }
};

// a tokenizer header (magic, version 2, vocab, eot) followed by `body`
std::vector<unsigned char> header_then(uint32_t vocab, uint32_t eot, const std::vector<unsigned char>& body) {
    std::vector<unsigned char> b(1024, 0);
    const uint32_t fields[4] = {20240328u, 2u, vocab, eot};
    for (int f = 0; f < 4; f++)
        for (int i = 0; i < 4; i++) b[4 * f + i] = (unsigned char)(fields[f] >> (8 * i));
    b.insert(b.end(), body.begin(), body.end());
    return b;
}

void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    if (!bytes.empty()) REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    std::fclose(f);
}

} // namespace

TEST_CASE("tokenizer: a header claiming a huge vocab is refused without allocating for it") {
    ScratchDir td;
    llmc::Tokenizer tok;
    // 4 billion tokens claimed, two present: reserving for the claim once threw std::bad_alloc
    std::string huge = td.path("huge.bin");
    write_file(huge, header_then(0xffffffffu, 0u, {1, 'a', 1, 'b'}));
    std::string msg = error_of([&] { tok.load(huge); });
    CHECK(contains(msg, huge));
    CHECK(contains(msg, "truncated: it ends before token 2 of 4294967295"));
    // a header alone, with a vocab it cannot hold
    std::string bare = td.path("bare.bin");
    write_file(bare, header_then(50257u, 50256u, {}));
    msg = error_of([&] { tok.load(bare); });
    CHECK(contains(msg, "truncated: it ends before token 0 of 50257"));
    CHECK(!tok.loaded());
}

TEST_CASE("tokenizer: only a regular file of a tokenizer's size is read") {
    ScratchDir td;
    llmc::Tokenizer tok;
    // a device: reading /dev/zero would never end
    std::string msg = error_of([&] { tok.load("/dev/zero"); });
    CHECK(contains(msg, "tokenizer file /dev/zero is not a regular file"));
    // a directory
    msg = error_of([&] { tok.load(td.dir); });
    CHECK(contains(msg, "tokenizer file " + td.dir + " is not a regular file"));
    // a pipe: opening it would block until a writer came
    std::string fifo = td.path("fifo");
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    msg = error_of([&] { tok.load(fifo); });
    CHECK(contains(msg, "is not a regular file"));
    // larger than any tokenizer file (sparse: no disk is written)
    std::string big = td.path("big.bin");
    FILE* f = std::fopen(big.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fclose(f);
    REQUIRE(truncate(big.c_str(), (off_t)llmc::kTokenizerMaxBytes + 1) == 0);
    msg = error_of([&] { tok.load(big); });
    CHECK(contains(msg, big));
    CHECK(contains(msg, "more than the 67108864 a tokenizer file may have"));
    CHECK(!tok.loaded());
}
