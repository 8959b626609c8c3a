// test_data.cpp: unit tests for the host-side data path: rand.h, dataloader.h, tokenizer.h, schedulers.h.
// Every test writes its files under a fresh mkdtemp() directory that is removed afterwards.
#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/rand.h"
#include "llmc/schedulers.h"
#include "llmc/tokenizer.h"

using namespace llmc;

namespace {

// ---------------------------------------------------------------------------------------------
// helpers

// A fresh temporary directory; removes the files made through it (and itself) when it goes away.
struct TempDir {
    std::string dir;
    std::vector<std::string> files;
    TempDir() {
        char tmpl[] = "/tmp/llmc_test_data_XXXXXX";
        char* d = mkdtemp(tmpl);
        REQUIRE(d != nullptr);
        dir = d;
    }
    ~TempDir() {
        for (size_t i = 0; i < files.size(); i++) {
            struct stat sb;
            if (stat(files[i].c_str(), &sb) == 0 && S_ISDIR(sb.st_mode)) rmdir(files[i].c_str());
            else unlink(files[i].c_str());
        }
        rmdir(dir.c_str());
    }
    std::string path(const std::string& name) {
        std::string p = dir + "/" + name;
        if (std::find(files.begin(), files.end(), p) == files.end()) files.push_back(p);
        return p;
    }
};

void put_le32(std::vector<unsigned char>* b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; i++) (*b)[at + i] = (unsigned char)(v >> (8 * i));
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    if (!bytes.empty()) REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    std::fclose(f);
}

// Builds a shard's bytes. header_count < 0 means "the real token count".
std::vector<unsigned char> shard_bytes(const std::vector<uint16_t>& toks, int32_t magic = 20240520,
                                       int32_t version = 1, int64_t header_count = -1) {
    std::vector<unsigned char> b(1024 + 2 * toks.size(), 0);
    put_le32(&b, 0, (uint32_t)magic);
    put_le32(&b, 4, (uint32_t)version);
    put_le32(&b, 8, (uint32_t)(header_count < 0 ? (int64_t)toks.size() : header_count));
    for (size_t i = 0; i < toks.size(); i++) {
        b[1024 + 2 * i] = (unsigned char)(toks[i] & 0xff);
        b[1024 + 2 * i + 1] = (unsigned char)(toks[i] >> 8);
    }
    return b;
}

void write_shard(const std::string& path, const std::vector<uint16_t>& toks) { write_bytes(path, shard_bytes(toks)); }

// tokens base, base+1, ..., base+n-1: a token's value says exactly where it came from
std::vector<uint16_t> iota_tokens(size_t n, uint16_t base) {
    std::vector<uint16_t> t(n);
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(base + i);
    return t;
}

// Runs f and returns the InputError's message ("<no InputError>" if it did not throw one).
template <typename F>
std::string input_error_of(F f) {
    try {
        f();
    } catch (const InputError& e) {
        return e.what();
    }
    return "<no InputError>";
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

struct Batch {
    std::vector<int32_t> x, y;
    bool operator==(const Batch& o) const { return x == o.x && y == o.y; }
};

Batch next(DataLoader& dl, int B, int T) {
    Batch b;
    b.x.resize((size_t)B * T);
    b.y.resize((size_t)B * T);
    dl.next_batch(b.x.data(), b.y.data());
    return b;
}

// The expected batch: inputs toks[start .. start+B*T), targets one further.
Batch slice(const std::vector<uint16_t>& toks, size_t start, int B, int T) {
    Batch b;
    for (size_t i = 0; i < (size_t)B * T; i++) {
        b.x.push_back(toks[start + i]);
        b.y.push_back(toks[start + i + 1]);
    }
    return b;
}

std::vector<unsigned char> tokenizer_bytes(uint32_t version, uint32_t eot, const std::vector<std::string>& pieces,
                                           uint32_t magic = 20240328) {
    std::vector<unsigned char> b(1024, 0);
    put_le32(&b, 0, magic);
    put_le32(&b, 4, version);
    put_le32(&b, 8, (uint32_t)pieces.size());
    put_le32(&b, 12, eot);
    for (size_t i = 0; i < pieces.size(); i++) {
        b.push_back((unsigned char)pieces[i].size());
        b.insert(b.end(), pieces[i].begin(), pieces[i].end());
    }
    return b;
}

} // namespace

// =============================================================================================
// rand.h

TEST_CASE("rng: splitmix64 and xoshiro256** match their published reference outputs") {
    // splitmix64 from state 0
    uint64_t x = 0;
    CHECK(splitmix64_next(&x) == 0xE220A8397B1DCDAFULL);
    CHECK(splitmix64_next(&x) == 0x6E789E6AA1B965F4ULL);
    CHECK(splitmix64_next(&x) == 0x06C45D188009454FULL);
    // xoshiro256** from state {1, 2, 3, 4}: the first outputs are 11520, 0, 1509978240, 1215971899390074240
    Rng r;
    RngState s = {{1, 2, 3, 4}};
    r.set_state(s);
    CHECK(r.next_u64() == 11520ULL);
    CHECK(r.next_u64() == 0ULL);
    CHECK(r.next_u64() == 1509978240ULL);
    CHECK(r.next_u64() == 1215971899390074240ULL);
}

TEST_CASE("rng: equal seeds give equal streams, different seeds differ, state round-trips") {
    Rng a(42), b(42), c(43);
    std::vector<uint64_t> va, vb, vc;
    for (int i = 0; i < 100; i++) {
        va.push_back(a.next_u64());
        vb.push_back(b.next_u64());
        vc.push_back(c.next_u64());
    }
    CHECK(va == vb);
    CHECK(va != vc);

    // save mid-stream, draw, restore, draw again: identical (also for normals and floats)
    RngState saved = a.get_state();
    std::vector<double> first;
    for (int i = 0; i < 10; i++) first.push_back(a.next_normal() + a.next_float01() + (double)a.next_u32());
    Rng d(999);
    d.set_state(saved);
    for (int i = 0; i < 10; i++) CHECK(d.next_normal() + d.next_float01() + (double)d.next_u32() == first[(size_t)i]);

    // reseed resets the stream
    a.reseed(42);
    CHECK(a.next_u64() == va[0]);

    // all-zero state is rejected as corrupt input
    RngState zero = {{0, 0, 0, 0}};
    CHECK(contains(input_error_of([&] { d.set_state(zero); }), "all zeros"));
}

TEST_CASE("rng: mix64 is deterministic and order-sensitive") {
    CHECK(mix64(1, 2) == mix64(1, 2));
    CHECK(mix64(1, 2) != mix64(2, 1));
    CHECK(mix64(0, 0) != mix64(0, 1));
    CHECK(mix64(0, 1) != mix64(1, 0));
    std::set<uint64_t> seen;
    for (uint64_t a = 0; a < 32; a++)
        for (uint64_t b = 0; b < 32; b++) seen.insert(mix64(a, b));
    CHECK(seen.size() == 32 * 32);
}

TEST_CASE("rng: uniform outputs are in range with the right mean") {
    Rng r(7);
    const int n = 200000;
    double sum = 0;
    float lo = 1, hi = 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float u = r.next_float01();
        // in [0, 1) and on the 24-bit grid (u * 2^24 is an integer)
        if (!(u >= 0.0f && u < 1.0f) || std::floor(u * 16777216.0f) != u * 16777216.0f) bad++;
        lo = std::min(lo, u);
        hi = std::max(hi, u);
        sum += u;
    }
    // mean of U[0,1) is 1/2 with std 1/sqrt(12 n) ~ 0.00065; allow 6 sigma
    CHECK(bad == 0);
    CHECK(std::fabs(sum / n - 0.5) < 0.004);
    CHECK(lo < 0.001f);
    CHECK(hi > 0.999f);

    int hist[7] = {};
    bool in_range = true;
    for (int i = 0; i < 70000; i++) {
        uint64_t k = r.next_below(7);
        if (k >= 7) in_range = false;
        else hist[k]++;
    }
    CHECK(in_range);
    for (int k = 0; k < 7; k++) CHECK(std::abs(hist[k] - 10000) < 500);   // std ~ 93
    CHECK(r.next_below(1) == 0);
    CHECK(r.next_below(0) == 0);
}

TEST_CASE("rng: normals have mean 0 and std 1 (next_normal and fill_normal)") {
    const int n = 400000;
    Rng r(123);
    double s1 = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double z = r.next_normal();
        s1 += z;
        s2 += z * z;
    }
    double mean = s1 / n, var = s2 / n - mean * mean;
    // standard error of the mean 1/sqrt(n) = 0.0016, of the variance sqrt(2/n) = 0.0022; 5 sigma
    CHECK(std::fabs(mean) < 0.008);
    CHECK(std::fabs(var - 1.0) < 0.012);

    std::vector<float> v((size_t)n + 1);   // odd length exercises the tail element
    Rng r2(5);
    r2.fill_normal(v.data(), v.size(), 2.0f, 0.5f);
    s1 = s2 = 0;
    int beyond_3sigma = 0;
    for (size_t i = 0; i < v.size(); i++) {
        s1 += v[i];
        s2 += (double)v[i] * v[i];
        if (std::fabs(v[i] - 2.0f) > 1.5f) beyond_3sigma++;
    }
    mean = s1 / v.size();
    double std_ = std::sqrt(s2 / v.size() - mean * mean);
    CHECK(std::fabs(mean - 2.0) < 0.005);
    CHECK(std::fabs(std_ - 0.5) < 0.004);
    // P(|z| > 3) = 0.0027 -> ~1080 expected; a Gaussian tail, not a uniform or clipped one
    CHECK(beyond_3sigma > 800);
    CHECK(beyond_3sigma < 1400);

    // fill_normal is deterministic
    std::vector<float> w(v.size());
    Rng r3(5);
    r3.fill_normal(w.data(), w.size(), 2.0f, 0.5f);
    CHECK(v == w);
}

TEST_CASE("rng: Fisher-Yates gives each of the 24 orders of 4 items equally often") {
    Rng r(2024);
    std::map<std::vector<int>, int> counts;
    int pos_counts[4][4] = {};
    const int trials = 240000;
    for (int t = 0; t < trials; t++) {
        std::vector<int> a = {0, 1, 2, 3};
        fisher_yates_shuffle(a.data(), a.size(), r);
        counts[a]++;
        for (int i = 0; i < 4; i++) pos_counts[a[(size_t)i]][i]++;
    }
    CHECK(counts.size() == 24);
    // each order: expected 10000, std sqrt(10000 * 23/24) ~ 98; chi-square with 23 dof
    double chi2 = 0;
    for (std::map<std::vector<int>, int>::iterator it = counts.begin(); it != counts.end(); ++it) {
        CHECK(std::abs(it->second - 10000) < 500);
        chi2 += (it->second - 10000.0) * (it->second - 10000.0) / 10000.0;
    }
    CHECK(chi2 < 60.0);   // P(chi2_23 > 60) < 1e-4
    // each item lands in each position a quarter of the time
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) CHECK(std::abs(pos_counts[i][j] - trials / 4) < 1000);

    // shuffling 0 or 1 items is a no-op, and the result is always a permutation
    int one = 5;
    fisher_yates_shuffle(&one, 1, r);
    CHECK(one == 5);
    fisher_yates_shuffle((int*)nullptr, 0, r);
    std::vector<int> big(1000);
    for (int i = 0; i < 1000; i++) big[(size_t)i] = i;
    fisher_yates_shuffle(big.data(), big.size(), r);
    std::vector<int> sorted = big;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < 1000; i++) CHECK(sorted[(size_t)i] == i);
    CHECK(big != sorted);
}

// =============================================================================================
// dataloader.h: headers and globs

TEST_CASE("shards: expand_glob sorts matches and names the flag and pattern when none match") {
    TempDir td;
    write_shard(td.path("b_001.bin"), iota_tokens(10, 0));
    write_shard(td.path("a_000.bin"), iota_tokens(10, 0));
    write_shard(td.path("b_000.bin"), iota_tokens(10, 0));
    std::vector<std::string> m = expand_glob(td.dir + "/*.bin", "-i");
    REQUIRE(m.size() == 3);
    CHECK(m[0] == td.dir + "/a_000.bin");
    CHECK(m[1] == td.dir + "/b_000.bin");
    CHECK(m[2] == td.dir + "/b_001.bin");
    CHECK(expand_glob(td.dir + "/b_*", "-i").size() == 2);
    CHECK(expand_glob(td.dir + "/a_000.bin", "-i").size() == 1);   // a plain path is its own glob

    std::string pat = td.dir + "/nothing_*.bin";
    std::string msg = input_error_of([&] { expand_glob(pat, "-j"); });
    CHECK(contains(msg, "no file matches -j '" + pat + "'"));
}

TEST_CASE("shards: read_shard_header accepts a good shard") {
    TempDir td;
    std::string p = td.path("ok.bin");
    write_shard(p, iota_tokens(77, 3));
    ShardInfo info = read_shard_header(p);
    CHECK(info.path == p);
    CHECK(info.num_tokens == 77);
    // an empty shard is a valid file (the data loader rejects it for having no batch)
    std::string e = td.path("empty.bin");
    write_shard(e, std::vector<uint16_t>());
    CHECK(read_shard_header(e).num_tokens == 0);
}

TEST_CASE("shards: each malformed header gives an InputError naming the file and the problem") {
    TempDir td;
    std::vector<uint16_t> toks = iota_tokens(100, 0);

    std::string missing = td.dir + "/missing.bin";
    std::string msg = input_error_of([&] { read_shard_header(missing); });
    CHECK(contains(msg, missing));
    CHECK(contains(msg, "cannot open"));

    std::string dir = td.path("adir.bin");
    REQUIRE(mkdir(dir.c_str(), 0700) == 0);
    msg = input_error_of([&] { read_shard_header(dir); });
    CHECK(contains(msg, dir));
    CHECK(contains(msg, "directory"));

    std::string shortf = td.path("short.bin");
    write_bytes(shortf, std::vector<unsigned char>(100, 0));
    msg = input_error_of([&] { read_shard_header(shortf); });
    CHECK(contains(msg, shortf));
    CHECK(contains(msg, "shorter than the 1024-byte header"));

    std::string magic = td.path("magic.bin");
    write_bytes(magic, shard_bytes(toks, 12345));
    msg = input_error_of([&] { read_shard_header(magic); });
    CHECK(contains(msg, magic));
    CHECK(contains(msg, "not a token shard"));
    CHECK(contains(msg, "dev/data/"));

    std::string ver = td.path("version.bin");
    write_bytes(ver, shard_bytes(toks, 20240520, 2));
    msg = input_error_of([&] { read_shard_header(ver); });
    CHECK(contains(msg, ver));
    CHECK(contains(msg, "version 2"));

    std::string trunc = td.path("trunc.bin");
    std::vector<unsigned char> b = shard_bytes(toks);
    b.resize(b.size() - 3);
    write_bytes(trunc, b);
    msg = input_error_of([&] { read_shard_header(trunc); });
    CHECK(contains(msg, trunc));
    CHECK(contains(msg, "truncated"));

    std::string longer = td.path("longer.bin");
    write_bytes(longer, shard_bytes(toks, 20240520, 1, 90));   // header says 90, file has 100
    msg = input_error_of([&] { read_shard_header(longer); });
    CHECK(contains(msg, longer));
    CHECK(contains(msg, "header says 90 tokens"));

    std::string neg = td.path("neg.bin");
    write_bytes(neg, shard_bytes(toks, 20240520, 1, 0xFFFFFFFFLL));   // -1 as int32
    msg = input_error_of([&] { read_shard_header(neg); });
    CHECK(contains(msg, neg));
    CHECK(contains(msg, "corrupt"));

    // the data loader passes the same errors through, for any matched shard (not just the first)
    write_shard(td.path("x_000.bin"), toks);
    write_bytes(td.path("x_001.bin"), shard_bytes(toks, 999));
    msg = input_error_of([&] { DataLoader dl(td.dir + "/x_*.bin", "-i", 1, 4, 0, 1, false, 0, 50257); });
    CHECK(contains(msg, td.dir + "/x_001.bin"));
    CHECK(contains(msg, "not a token shard"));
}

TEST_CASE("shards: a token >= vocab size is reported with its position, value and file") {
    TempDir td;
    std::vector<uint16_t> toks = iota_tokens(500, 0);
    toks[123] = 60000;
    std::string p = td.path("badtok.bin");
    write_shard(p, toks);
    std::string msg = input_error_of([&] { DataLoader dl(p, "-i", 2, 8, 0, 1, false, 0, 50257); });
    CHECK(msg == "token id 60000 at position 123 in " + p +
                     " is >= vocab size 50257; the shard was not made with the GPT-2 tokenizer");
    // the same shard is fine with a vocab that covers it
    DataLoader ok(p, "-i", 2, 8, 0, 1, false, 0, 65536);
    CHECK(ok.total_tokens() == 500);

    // a bad token in a later shard surfaces when that shard is loaded
    write_shard(td.path("s_000.bin"), iota_tokens(33, 0));
    write_shard(td.path("s_001.bin"), toks);
    DataLoader dl(td.dir + "/s_*.bin", "-i", 1, 8, 0, 1, false, 0, 50257);
    Batch b;
    b.x.resize(8);
    b.y.resize(8);
    for (int i = 0; i < 4; i++) dl.next_batch(b.x.data(), b.y.data());   // (33-1)/8 = 4 chunks in shard 0
    msg = input_error_of([&] { dl.next_batch(b.x.data(), b.y.data()); });
    CHECK(contains(msg, "token id 60000 at position 123 in " + td.dir + "/s_001.bin"));
}

TEST_CASE("shards: a shard too small for one batch is an error that says what to lower") {
    TempDir td;
    std::string p = td.path("tiny.bin");
    write_shard(p, iota_tokens(64, 0));
    // B*T*P + 1 = 2*16*2 + 1 = 65 > 64
    std::string msg = input_error_of([&] { DataLoader dl(p, "-i", 2, 16, 0, 2, false, 0, 50257); });
    CHECK(msg == "shard " + p + " has 64 tokens, fewer than one batch needs (B*T*P+1 = 65 with P = 2 processes); "
                 "lower -b/-t or -pn");
    // with one process it fits: (64 - 1) / 32 = 1 chunk
    DataLoader dl(p, "-i", 2, 16, 0, 1, false, 0, 50257);
    CHECK(dl.batches_per_epoch() == 1);
}

// =============================================================================================
// dataloader.h: batches

TEST_CASE("dataloader: without shuffle, batches are consecutive slices across shards and epochs") {
    TempDir td;
    const int B = 2, T = 4;   // 8 tokens per batch
    std::vector<uint16_t> s0 = iota_tokens(30, 0);      // (30-1)/8 = 3 chunks, tail 29.. unused
    std::vector<uint16_t> s1 = iota_tokens(17, 1000);   // (17-1)/8 = 2 chunks, exactly fits
    write_shard(td.path("d_000.bin"), s0);
    write_shard(td.path("d_001.bin"), s1);
    DataLoader dl(td.dir + "/d_*.bin", "-i", B, T, 0, 1, false, 0, 50257);
    CHECK(dl.num_shards() == 2);
    CHECK(dl.batches_per_epoch() == 5);
    CHECK(dl.total_tokens() == 47);

    for (int epoch = 0; epoch < 3; epoch++) {
        for (int c = 0; c < 3; c++) {
            DataLoaderState st = dl.state();
            CHECK(st.epoch == (uint64_t)epoch);
            CHECK(st.shard_pos == 0);
            CHECK(st.chunk_pos == (uint64_t)c);
            CHECK(next(dl, B, T) == slice(s0, (size_t)c * 8, B, T));
        }
        for (int c = 0; c < 2; c++) {
            CHECK(dl.state().shard_pos == 1);
            CHECK(next(dl, B, T) == slice(s1, (size_t)c * 8, B, T));
        }
    }
    // the first batch explicitly: inputs 0..7, targets 1..8
    dl.reset();
    DataLoaderState z = dl.state();
    CHECK(z.epoch == 0);
    CHECK(z.shard_pos == 0);
    CHECK(z.chunk_pos == 0);
    Batch b = next(dl, B, T);
    CHECK(b.x == std::vector<int32_t>({0, 1, 2, 3, 4, 5, 6, 7}));
    CHECK(b.y == std::vector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST_CASE("dataloader: with 2 processes each rank reads its own half of every chunk") {
    TempDir td;
    const int B = 2, T = 3, P = 2;   // global chunk = 12 tokens, each rank 6
    std::vector<uint16_t> s0 = iota_tokens(40, 100);   // (40-1)/12 = 3 chunks
    std::string p = td.path("r.bin");
    write_shard(p, s0);
    DataLoader r0(p, "-i", B, T, 0, P, false, 0, 50257);
    DataLoader r1(p, "-i", B, T, 1, P, false, 0, 50257);
    CHECK(r0.batches_per_epoch() == 3);
    for (int step = 0; step < 7; step++) {   // more than two epochs
        size_t c = (size_t)(step % 3);
        CHECK(next(r0, B, T) == slice(s0, c * 12, B, T));
        CHECK(next(r1, B, T) == slice(s0, c * 12 + 6, B, T));
    }
    CHECK(contains(input_error_of([&] { DataLoader bad(p, "-i", B, T, 2, P, false, 0, 50257); }), "rank 2"));
}

// Reads one epoch from `dl` (rank 0 of P, shards with tokens shard_base[k] + i) and returns the
// (shard, chunk) sequence, decoded from each batch's first input token.
static std::vector<std::pair<int, int>> epoch_order(DataLoader& dl, int B, int T, int P,
                                                    const std::vector<int>& shard_base) {
    std::vector<std::pair<int, int>> order;
    for (int64_t i = 0; i < dl.batches_per_epoch(); i++) {
        Batch b = next(dl, B, T);
        int shard = -1;
        for (size_t k = 0; k < shard_base.size(); k++)
            if (b.x[0] >= shard_base[k]) shard = (int)k;
        int off = b.x[0] - shard_base[(size_t)shard];
        REQUIRE(off % (B * T * P) == 0);
        order.push_back(std::make_pair(shard, off / (B * T * P)));
        // the batch is still a contiguous slice
        for (size_t j = 0; j < b.x.size(); j++) {
            REQUIRE(b.x[j] == b.x[0] + (int)j);
            REQUIRE(b.y[j] == b.x[j] + 1);
        }
    }
    return order;
}

TEST_CASE("dataloader: shuffle permutes shards and chunks per epoch, reproducibly from the seed") {
    TempDir td;
    const int B = 1, T = 4, P = 1;
    // 5 shards of 10..14 chunks each; shard k holds tokens k*1000 + i
    std::vector<int> base;
    std::set<std::pair<int, int>> all;
    for (int k = 0; k < 5; k++) {
        int chunks = 10 + k;
        base.push_back(k * 1000);
        write_shard(td.path("sh_00" + std::to_string(k) + ".bin"), iota_tokens((size_t)chunks * 4 + 1, (uint16_t)(k * 1000)));
        for (int c = 0; c < chunks; c++) all.insert(std::make_pair(k, c));
    }
    std::string pat = td.dir + "/sh_*.bin";
    DataLoader a(pat, "-i", B, T, 0, P, true, 1234, 50257);
    DataLoader a2(pat, "-i", B, T, 0, P, true, 1234, 50257);
    DataLoader other(pat, "-i", B, T, 0, P, true, 1235, 50257);
    DataLoader plain(pat, "-i", B, T, 0, P, false, 1234, 50257);
    CHECK(a.batches_per_epoch() == 60);

    std::vector<std::vector<std::pair<int, int>>> epochs;
    bool shard_order_changed = false;
    for (int e = 0; e < 4; e++) {
        std::vector<std::pair<int, int>> o = epoch_order(a, B, T, P, base);
        // every chunk of every shard exactly once
        std::set<std::pair<int, int>> seen(o.begin(), o.end());
        CHECK(seen.size() == o.size());
        CHECK(seen == all);
        // shards are visited whole, one after the other
        std::vector<int> shard_seq;
        for (size_t i = 0; i < o.size(); i++)
            if (shard_seq.empty() || shard_seq.back() != o[i].first) shard_seq.push_back(o[i].first);
        CHECK(shard_seq.size() == 5);
        if (shard_seq != std::vector<int>({0, 1, 2, 3, 4})) shard_order_changed = true;
        // identical for an equal seed, different for another seed and from the unshuffled order
        CHECK(epoch_order(a2, B, T, P, base) == o);
        CHECK(epoch_order(other, B, T, P, base) != o);
        std::vector<std::pair<int, int>> po = epoch_order(plain, B, T, P, base);
        CHECK(po != o);
        CHECK(std::is_sorted(po.begin(), po.end()));
        epochs.push_back(o);
    }
    CHECK(shard_order_changed);
    for (size_t i = 0; i < epochs.size(); i++)
        for (size_t j = i + 1; j < epochs.size(); j++) CHECK(epochs[i] != epochs[j]);
}

TEST_CASE("dataloader: with shuffle all ranks agree on the chunk order") {
    TempDir td;
    const int B = 2, T = 2, P = 3;   // global chunk 12 tokens, rank slice 4
    std::vector<uint16_t> s = iota_tokens(12 * 20 + 1, 0);
    std::string p = td.path("ranks.bin");
    write_shard(p, s);
    std::vector<DataLoader*> dls;
    for (int r = 0; r < P; r++) dls.push_back(new DataLoader(p, "-i", B, T, r, P, true, 77, 50257));
    std::set<int> chunks;
    for (int i = 0; i < 20; i++) {
        Batch b0 = next(*dls[0], B, T);
        size_t start = (size_t)b0.x[0];
        REQUIRE(start % 12 == 0);
        chunks.insert((int)start / 12);
        CHECK(b0 == slice(s, start, B, T));
        for (int r = 1; r < P; r++) CHECK(next(*dls[(size_t)r], B, T) == slice(s, start + 4 * (size_t)r, B, T));
    }
    CHECK(chunks.size() == 20);
    for (size_t r = 0; r < dls.size(); r++) delete dls[r];
}

TEST_CASE("dataloader: state()/restore() resumes bit-identically across shard and epoch boundaries") {
    TempDir td;
    const int B = 2, T = 4;
    write_shard(td.path("q_000.bin"), iota_tokens(8 * 3 + 1, 0));      // 3 chunks
    write_shard(td.path("q_001.bin"), iota_tokens(8 * 4 + 5, 2000));   // 4 chunks
    write_shard(td.path("q_002.bin"), iota_tokens(8 * 2 + 1, 4000));   // 2 chunks
    std::string pat = td.dir + "/q_*.bin";

    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        CAPTURE(shuffle);
        // the uninterrupted run: 40 batches (more than 4 epochs of 9)
        DataLoader ref(pat, "-i", B, T, 0, 1, shuffle != 0, 99, 50257);
        std::vector<Batch> want;
        std::vector<DataLoaderState> states;
        for (int i = 0; i < 40; i++) {
            states.push_back(ref.state());
            want.push_back(next(ref, B, T));
        }
        // resuming from every saved position (including each shard and epoch boundary) in a
        // fresh loader gives exactly the batches that followed
        for (int k = 0; k < 40; k += 1) {
            DataLoader dl(pat, "-i", B, T, 0, 1, shuffle != 0, 99, 50257);
            dl.restore(states[(size_t)k]);
            DataLoaderState st = dl.state();
            CHECK(st.epoch == states[(size_t)k].epoch);
            CHECK(st.shard_pos == states[(size_t)k].shard_pos);
            CHECK(st.chunk_pos == states[(size_t)k].chunk_pos);
            for (int i = k; i < std::min(40, k + 12); i++) REQUIRE(next(dl, B, T) == want[(size_t)i]);
        }
        // restoring in the same loader (backwards) works too, and reset() goes back to the start
        DataLoader dl(pat, "-i", B, T, 0, 1, shuffle != 0, 99, 50257);
        dl.restore(states[30]);
        CHECK(next(dl, B, T) == want[30]);
        dl.restore(states[5]);
        CHECK(next(dl, B, T) == want[5]);
        dl.reset();
        CHECK(next(dl, B, T) == want[0]);
    }

    // the epoch and shard boundaries were really crossed: 9 batches per epoch
    DataLoader dl(pat, "-i", B, T, 0, 1, false, 0, 50257);
    for (int i = 0; i < 9; i++) next(dl, B, T);
    CHECK(dl.state().epoch == 1);
    CHECK(dl.state().shard_pos == 0);
    CHECK(dl.state().chunk_pos == 0);

    // out-of-range positions are input errors
    DataLoaderState bad;
    bad.shard_pos = 3;
    std::string msg = input_error_of([&] { dl.restore(bad); });
    CHECK(contains(msg, "out of range"));
    CHECK(contains(msg, pat));
    bad.shard_pos = 2;   // the unshuffled shard 2 has 2 chunks
    bad.chunk_pos = 2;
    msg = input_error_of([&] { dl.restore(bad); });
    CHECK(contains(msg, "out of range"));
    CHECK(contains(msg, td.dir + "/q_002.bin"));
}

// =============================================================================================
// tokenizer.h

TEST_CASE("tokenizer: a written file decodes back to its pieces") {
    TempDir td;
    std::vector<std::string> pieces = {"a", "bc", "\n", " hello", std::string("\xe2\x82", 2), "<|endoftext|>"};
    std::string p = td.path("tok.bin");
    write_bytes(p, tokenizer_bytes(2, 5, pieces));
    Tokenizer tok;
    CHECK(!tok.loaded());
    CHECK(tok.decode(0) == "<?>");
    tok.load(p);
    CHECK(tok.loaded());
    CHECK(tok.vocab_size() == 6);
    CHECK(tok.eot_token() == 5);
    for (uint32_t i = 0; i < pieces.size(); i++) CHECK(tok.decode(i) == pieces[i]);
    CHECK(tok.decode(6) == "<?>");
    CHECK(tok.decode(50303) == "<?>");

    // version 1: no EOT field, GPT-2's 50256 is implied
    std::vector<std::string> big(50257);
    for (size_t i = 0; i < big.size(); i++) big[i] = std::string(1, (char)('a' + i % 26));
    big[50256] = "<|endoftext|>";
    std::string p1 = td.path("tok_v1.bin");
    write_bytes(p1, tokenizer_bytes(1, 0, big));
    Tokenizer t1;
    t1.load(p1);
    CHECK(t1.vocab_size() == 50257);
    CHECK(t1.eot_token() == 50256);
    CHECK(t1.decode(50256) == "<|endoftext|>");
    CHECK(t1.decode(27) == "b");
}

TEST_CASE("tokenizer: malformed files give an InputError naming the file and the problem") {
    TempDir td;
    std::vector<std::string> pieces = {"a", "bc", "def"};
    Tokenizer tok;

    std::string missing = td.dir + "/none.bin";
    std::string msg = input_error_of([&] { tok.load(missing); });
    CHECK(contains(msg, missing));
    CHECK(contains(msg, "cannot open"));

    std::string trunc = td.path("trunc.bin");
    std::vector<unsigned char> b = tokenizer_bytes(2, 2, pieces);
    b.resize(b.size() - 2);   // cuts into "def"
    write_bytes(trunc, b);
    msg = input_error_of([&] { tok.load(trunc); });
    CHECK(contains(msg, trunc));
    CHECK(contains(msg, "truncated"));
    CHECK(contains(msg, "token 2"));

    std::string trunc2 = td.path("trunc2.bin");
    b = tokenizer_bytes(2, 2, pieces);
    b.resize(b.size() - 4);   // ends exactly before token 2's length byte
    write_bytes(trunc2, b);
    msg = input_error_of([&] { tok.load(trunc2); });
    CHECK(contains(msg, trunc2));
    CHECK(contains(msg, "truncated"));

    std::string shortf = td.path("short.bin");
    write_bytes(shortf, std::vector<unsigned char>(10, 0));
    msg = input_error_of([&] { tok.load(shortf); });
    CHECK(contains(msg, shortf));
    CHECK(contains(msg, "shorter than"));

    std::string magic = td.path("magic.bin");
    write_bytes(magic, tokenizer_bytes(2, 2, pieces, 20240520));   // a token shard's magic
    msg = input_error_of([&] { tok.load(magic); });
    CHECK(contains(msg, magic));
    CHECK(contains(msg, "not a GPT-2 tokenizer file"));

    std::string ver = td.path("ver.bin");
    write_bytes(ver, tokenizer_bytes(3, 2, pieces));
    msg = input_error_of([&] { tok.load(ver); });
    CHECK(contains(msg, ver));
    CHECK(contains(msg, "version 3"));

    std::string eot = td.path("eot.bin");
    write_bytes(eot, tokenizer_bytes(2, 3, pieces));
    msg = input_error_of([&] { tok.load(eot); });
    CHECK(contains(msg, eot));
    CHECK(contains(msg, "end-of-text id 3"));

    std::string zero = td.path("zero.bin");
    std::vector<std::string> with_empty = {"a", "", "c"};
    write_bytes(zero, tokenizer_bytes(2, 0, with_empty));
    msg = input_error_of([&] { tok.load(zero); });
    CHECK(contains(msg, zero));
    CHECK(contains(msg, "token 1 has length 0"));

    std::string extra = td.path("extra.bin");
    b = tokenizer_bytes(2, 2, pieces);
    b.push_back(7);
    write_bytes(extra, b);
    msg = input_error_of([&] { tok.load(extra); });
    CHECK(contains(msg, extra));
    CHECK(contains(msg, "after its last token"));

    // a failed load leaves the tokenizer as it was
    CHECK(!tok.loaded());
    std::string good = td.path("good.bin");
    write_bytes(good, tokenizer_bytes(2, 2, pieces));
    tok.load(good);
    input_error_of([&] { tok.load(trunc); });
    CHECK(tok.loaded());
    CHECK(tok.decode(2) == "def");
}

TEST_CASE("tokenizer: printable escapes control bytes only") {
    CHECK(printable("hello\n\tworld") == "hello\n\tworld");
    CHECK(printable(std::string("a\rb\x1b[2J\x7f", 8)) == "a\\x0db\\x1b[2J\\x7f");
    CHECK(printable(std::string("\0", 1)) == "\\x00");
    CHECK(printable("\xc3\xa9") == "\xc3\xa9");   // UTF-8 passes through
    CHECK(printable("") == "");
}

// =============================================================================================
// schedulers.h

TEST_CASE("schedule: warmup is the same linear ramp for every kind") {
    const LRSchedule::Kind kinds[] = {LRSchedule::COSINE, LRSchedule::LINEAR, LRSchedule::CONSTANT, LRSchedule::WSD};
    for (int k = 0; k < 4; k++) {
        LRSchedule s{kinds[k], 1.0f, 10, 110, 0.1f};
        CAPTURE(k);
        CHECK(s.lr_at(0) == doctest::Approx(0.1).epsilon(1e-6));
        CHECK(s.lr_at(4) == doctest::Approx(0.5).epsilon(1e-6));
        CHECK(s.lr_at(9) == doctest::Approx(1.0).epsilon(1e-6));
        CHECK(s.lr_at(10) == doctest::Approx(1.0).epsilon(1e-6));   // first post-warmup step: p = 0
    }
    // base lr scales everything; no warmup starts at base
    LRSchedule s{LRSchedule::COSINE, 6e-4f, 0, 100, 0.1f};
    CHECK(s.lr_at(0) == doctest::Approx(6e-4).epsilon(1e-6));
}

TEST_CASE("schedule: cosine, linear, constant and wsd at their boundary points") {
    const double kPi = 3.14159265358979323846;
    const double min_lr = 0.1;
    LRSchedule cos_s{LRSchedule::COSINE, 1.0f, 10, 110, 0.1f};
    // p = (step - 10) / 100
    CHECK(cos_s.lr_at(35) == doctest::Approx(min_lr + 0.5 * (1 + std::cos(kPi * 0.25)) * 0.9).epsilon(1e-6));
    CHECK(cos_s.lr_at(60) == doctest::Approx(0.55).epsilon(1e-6));   // halfway: midpoint
    CHECK(cos_s.lr_at(109) == doctest::Approx(min_lr + 0.5 * (1 + std::cos(kPi * 0.99)) * 0.9).epsilon(1e-6));
    CHECK(cos_s.lr_at(110) == doctest::Approx(0.1).epsilon(1e-6));
    CHECK(cos_s.lr_at(500) == doctest::Approx(0.1).epsilon(1e-6));   // clamped past the end

    LRSchedule lin{LRSchedule::LINEAR, 1.0f, 10, 110, 0.1f};
    CHECK(lin.lr_at(35) == doctest::Approx(0.775).epsilon(1e-6));
    CHECK(lin.lr_at(60) == doctest::Approx(0.55).epsilon(1e-6));
    CHECK(lin.lr_at(110) == doctest::Approx(0.1).epsilon(1e-6));
    CHECK(lin.lr_at(1000) == doctest::Approx(0.1).epsilon(1e-6));

    LRSchedule cst{LRSchedule::CONSTANT, 1.0f, 10, 110, 0.1f};
    CHECK(cst.lr_at(10) == 1.0f);
    CHECK(cst.lr_at(109) == 1.0f);
    CHECK(cst.lr_at(5000) == 1.0f);

    // wsd: total 110 -> decay window is the last 22 steps, [88, 110)
    LRSchedule wsd{LRSchedule::WSD, 1.0f, 10, 110, 0.1f};
    CHECK(wsd.lr_at(50) == 1.0f);
    CHECK(wsd.lr_at(87) == 1.0f);
    CHECK(wsd.lr_at(88) == doctest::Approx(1.0).epsilon(1e-6));   // q = 0
    CHECK(wsd.lr_at(93) == doctest::Approx(0.1 + 0.9 * (1 - std::sqrt(5.0 / 22.0))).epsilon(1e-6));   // q = 5/22
    CHECK(wsd.lr_at(99) == doctest::Approx(0.1 + 0.9 * (1 - std::sqrt(0.5))).epsilon(1e-6));   // q = 11/22
    CHECK(wsd.lr_at(110) == doctest::Approx(0.1).epsilon(1e-6));
    CHECK(wsd.lr_at(200) == doctest::Approx(0.1).epsilon(1e-6));

    // degenerate lengths: total <= warmup means "already at the end" once warmup is over
    LRSchedule d{LRSchedule::COSINE, 1.0f, 10, 5, 0.1f};
    CHECK(d.lr_at(3) == doctest::Approx(0.4).epsilon(1e-6));
    CHECK(d.lr_at(10) == doctest::Approx(0.1).epsilon(1e-6));
    // wsd whose window would start inside warmup starts it at the end of warmup
    LRSchedule w2{LRSchedule::WSD, 1.0f, 95, 100, 0.0f};
    CHECK(w2.lr_at(93) == doctest::Approx(94.0 / 95.0).epsilon(1e-6));
    CHECK(w2.lr_at(94) == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(w2.lr_at(95) == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(w2.lr_at(96) == doctest::Approx(1.0 - std::sqrt(0.2)).epsilon(1e-6));
}

TEST_CASE("schedule: parse_schedule_kind") {
    CHECK(parse_schedule_kind("cosine") == LRSchedule::COSINE);
    CHECK(parse_schedule_kind("linear") == LRSchedule::LINEAR);
    CHECK(parse_schedule_kind("constant") == LRSchedule::CONSTANT);
    CHECK(parse_schedule_kind("wsd") == LRSchedule::WSD);
    CHECK(std::string(schedule_kind_name(LRSchedule::WSD)) == "wsd");
    CHECK(input_error_of([] { parse_schedule_kind("Cosine"); }) ==
          "-k: unknown schedule 'Cosine' (cosine, linear, constant, wsd)");
    CHECK(input_error_of([] { parse_schedule_kind(""); }) == "-k: unknown schedule '' (cosine, linear, constant, wsd)");
}

// =============================================================================================
// the real files, when dev/data/tinyshakespeare.py has been run (skipped quietly otherwise)

TEST_CASE("real data: tiny-shakespeare shards and the GPT-2 tokenizer file, if present") {
    const std::string val = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin";
    const std::string train = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin";
    const std::string tokf = "dev/data/gpt2_tokenizer.bin";
    struct stat sb;
    if (stat(val.c_str(), &sb) != 0 || stat(train.c_str(), &sb) != 0 || stat(tokf.c_str(), &sb) != 0) {
        MESSAGE("tiny-shakespeare data not found (run python3 dev/data/tinyshakespeare.py); skipping");
        return;
    }
    ShardInfo v = read_shard_header(val);
    ShardInfo t = read_shard_header(train);
    CHECK(v.num_tokens == 32768);
    CHECK(v.num_tokens + t.num_tokens > 300000);
    CHECK(v.num_tokens + t.num_tokens < 400000);

    Tokenizer tok;
    tok.load(tokf);
    CHECK(tok.vocab_size() == 50257);
    CHECK(tok.eot_token() == 50256);
    CHECK(tok.decode(50256) == "<|endoftext|>");

    DataLoader dl(val, "-j", 4, 64, 0, 1, false, 0, 50257);
    Batch b = next(dl, 4, 64);
    CHECK(b.x[0] == 50256);   // every text starts with <|endoftext|>
    std::string text;
    for (size_t i = 0; i < b.x.size(); i++) text += tok.decode((uint32_t)b.x[i]);
    CHECK(contains(text, "First Citizen"));
}

TEST_CASE("dataloader: a step's data depends on -d alone, not on how processes and micro-steps split it") {
    TempDir td;
    const int B = 2, T = 3;          // slices of 6 tokens
    std::vector<uint16_t> s = iota_tokens(6 * 4 * 9 + 1, 0);   // 9 chunks of D = 24 tokens
    std::string p = td.path("split.bin");
    write_shard(p, s);
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        CAPTURE(shuffle);
        // one process taking 4 micro-steps per step: slices 0, 1, 2, 3 of each chunk
        DataLoader one(p, "-i", B, T, 0, 1, shuffle != 0, 5, 50257, 4);
        // two processes taking 2 micro-steps each (slice = micro * 2 + rank), and four taking one
        std::vector<std::unique_ptr<DataLoader>> two, four;
        for (int r = 0; r < 2; r++) two.emplace_back(new DataLoader(p, "-i", B, T, r, 2, shuffle != 0, 5, 50257, 2));
        for (int r = 0; r < 4; r++) four.emplace_back(new DataLoader(p, "-i", B, T, r, 4, shuffle != 0, 5, 50257, 1));
        CHECK(one.batches_per_epoch() == 9);
        CHECK(two[0]->batches_per_epoch() == 9);
        CHECK(four[3]->batches_per_epoch() == 9);
        for (int step = 0; step < 20; step++) {   // past two epochs
            std::vector<Batch> want;
            for (int m = 0; m < 4; m++) {
                CHECK(one.next_slice() == m);
                want.push_back(next(one, B, T));
            }
            for (int m = 0; m < 2; m++)
                for (int r = 0; r < 2; r++) {
                    CHECK(two[(size_t)r]->next_slice() == m * 2 + r);
                    CHECK(next(*two[(size_t)r], B, T) == want[(size_t)(m * 2 + r)]);
                }
            for (int r = 0; r < 4; r++) CHECK(next(*four[(size_t)r], B, T) == want[(size_t)r]);
            // the four slices of a step are one contiguous chunk
            CHECK(want[0].x[0] % 24 == 0);
            for (int m = 1; m < 4; m++) CHECK(want[(size_t)m].x[0] == want[0].x[0] + 6 * m);
            CHECK(one.state().chunk_pos == two[1]->state().chunk_pos);
        }
    }
    // the position is a step boundary's: asked for mid-step, it is an error, not a silent loss
    DataLoader mid(p, "-i", B, T, 0, 1, false, 5, 50257, 4);
    next(mid, B, T);
    CHECK(contains(input_error_of([&] { mid.state(); }), "in the middle of an optimizer step"));
    // a shard shorter than one optimizer step names -d
    std::string small = td.path("small.bin");
    write_shard(small, iota_tokens(30, 0));
    CHECK(contains(input_error_of([&] { DataLoader d(small, "-i", B, T, 0, 1, false, 5, 50257, 8); }),
                              "fewer than one optimizer step needs (-d + 1 = 49); lower -d"));
}

TEST_CASE("shards: every shard's token ids are checked at start-up, on several threads") {
    TempDir td;
    for (int i = 0; i < 5; i++) {
        std::vector<uint16_t> tokens = iota_tokens(1000, 0);
        if (i == 3) tokens[777] = 60000;
        write_shard(td.path("s" + std::to_string(i) + ".bin"), tokens);
    }
    // the constructor reads only the first shard of the order: s3's bad token is not seen yet
    DataLoader dl(td.path("s*.bin"), "-i", 2, 16, 0, 1, false, 0, 50257);
    CHECK_FALSE(dl.check_all_tokens(4000, 4));  // more tokens than the limit: left for later
    for (int threads : {1, 3, 8}) {
        CAPTURE(threads);
        std::string msg = input_error_of([&] { dl.check_all_tokens(1 << 20, threads); });
        CHECK(msg.find("token id 60000 at position 777 in " + td.path("s3.bin")) != std::string::npos);
    }
    // a shard reached in training with a bad token is the same error (the trainer stops with it)
    DataLoader clean(td.path("s[0124].bin"), "-i", 2, 16, 0, 1, false, 0, 50257);
    CHECK(clean.check_all_tokens(1 << 20, 2));
    // a saved position is checked without loading anything
    DataLoaderState far;
    far.shard_pos = 9;
    CHECK(input_error_of([&] { clean.check_position(far); }).find("out of range") != std::string::npos);
    far.shard_pos = 1;
    clean.check_position(far);
}
