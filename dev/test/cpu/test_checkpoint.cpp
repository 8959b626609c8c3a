// Tests for llmc/checkpoint.h: model files, state files, atomic writes and the checkpoint directory.
#include <doctest/doctest.h>
#include "dev/test/cpu/test_util.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/checkpoint.h"
#include "llmc/recipes/fp8/options.h"

using llmc::ModelShape;

using test_util::contains;
using test_util::error_of;

namespace {

// A fresh directory under /tmp, removed with everything in it when the test ends.
struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/llmc_test_XXXXXX";
        const char* p = mkdtemp(tmpl);
        REQUIRE(p != nullptr);
        path = p;
    }
    ~TempDir() {
        nftw(path.c_str(),
             [](const char* fpath, const struct stat*, int, struct FTW*) { return ::remove(fpath); }, 16,
             FTW_DEPTH | FTW_PHYS);
    }
    std::string operator/(const std::string& name) const { return path + "/" + name; }
};

bool exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
    std::vector<unsigned char> out;
    FILE* f = std::fopen(path.c_str(), "rb");
    REQUIRE(f != nullptr);
    unsigned char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.insert(out.end(), buf, buf + n);
    std::fclose(f);
    return out;
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    if (!bytes.empty()) REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    std::fclose(f);
}

void touch(const std::string& path) { write_bytes(path, {}); }

std::vector<std::string> list(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    REQUIRE(d != nullptr);
    while (struct dirent* e = readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

bool has_tmp_file(const std::string& dir) {
    for (const std::string& n : list(dir))
        if (contains(n, ".tmp")) return true;
    return false;
}

// A model small enough to write hundreds of times: 64*8 + 16*8 + 2*(12*64 + 13*8) + 16 = 2400 params.
ModelShape tiny_shape() {
    ModelShape s;
    s.max_seq_len = 16;
    s.vocab_size = 50;
    s.padded_vocab_size = 64;
    s.num_layers = 2;
    s.num_heads = 2;
    s.channels = 8;
    return s;
}

std::vector<float> ramp(size_t n, float scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = scale * (float)i - 3.0f;
    return v;
}

// set header int32 number `index` of a model file
void poke_header(const std::string& path, int index, int32_t value) {
    std::vector<unsigned char> b = read_bytes(path);
    std::memcpy(&b[(size_t)index * 4], &value, 4);
    write_bytes(path, b);
}

// Write a complete checkpoint of `step` (model + state of each rank + DONE marker) into dir.
void write_checkpoint(const std::string& dir, int step, int nprocs = 1, bool done = true) {
    ModelShape s = tiny_shape();
    std::vector<float> params = ramp(llmc::num_parameters(s), 0.5f);
    llmc::write_model_file(llmc::model_path(dir, step), s, 3, params.data(), params.size() * 4);
    for (int r = 0; r < nprocs; r++) {
        llmc::StateWriter w(step, r, nprocs, "fp32");
        w.add("m", params.data(), 64);
        w.write_atomic(llmc::state_path(dir, step, r));
    }
    if (done) llmc::write_done_marker(dir, step);
}

} // namespace

TEST_CASE("checkpoint: num_parameters") {
    ModelShape d12;  // the defaults are GPT-2 124M
    CHECK(llmc::num_parameters(d12) == 124475904u);
    CHECK(llmc::num_parameters(tiny_shape()) == 2400u);
}

TEST_CASE("checkpoint: model file round trip, fp32 and bf16") {
    TempDir dir;
    ModelShape s = tiny_shape();
    size_t n = llmc::num_parameters(s);

    std::string p32 = dir / "m32.bin";
    std::vector<float> params = ramp(n, 0.25f);
    llmc::write_model_file(p32, s, 3, params.data(), n * 4);
    CHECK(read_bytes(p32).size() == 1024 + n * 4);
    llmc::ModelFileInfo info = llmc::read_model_header(p32);
    CHECK(info.version == 3);
    CHECK(info.shape.max_seq_len == 16);
    CHECK(info.shape.vocab_size == 50);
    CHECK(info.shape.padded_vocab_size == 64);
    CHECK(info.shape.num_layers == 2);
    CHECK(info.shape.num_heads == 2);
    CHECK(info.shape.channels == 8);
    std::vector<float> back(n);
    llmc::read_model_params(p32, info, back.data(), n * 4);
    CHECK(back == params);
    // the header is llm.c's: magic, version, maxT, V, L, NH, C, Vp, then zeros
    std::vector<unsigned char> raw = read_bytes(p32);
    int32_t h[256];
    std::memcpy(h, raw.data(), 1024);
    CHECK(h[0] == 20240326);
    CHECK(h[1] == 3);
    CHECK(h[2] == 16);
    CHECK(h[3] == 50);
    CHECK(h[4] == 2);
    CHECK(h[5] == 2);
    CHECK(h[6] == 8);
    CHECK(h[7] == 64);
    CHECK(std::all_of(h + 8, h + 256, [](int32_t x) { return x == 0; }));

    std::string p16 = dir / "m16.bin";
    std::vector<uint16_t> half(n);
    for (size_t i = 0; i < n; i++) half[i] = (uint16_t)(i * 7919u);
    llmc::write_model_file(p16, s, 5, half.data(), n * 2);
    CHECK(read_bytes(p16).size() == 1024 + n * 2);
    info = llmc::read_model_header(p16);
    CHECK(info.version == 5);
    std::vector<uint16_t> half_back(n);
    llmc::read_model_params(p16, info, half_back.data(), n * 2);
    CHECK(half_back == half);

    CHECK_FALSE(has_tmp_file(dir.path));
    // a buffer of the wrong size is a caller bug, not bad input
    CHECK_THROWS_AS(llmc::read_model_params(p16, info, half_back.data(), n * 4), std::invalid_argument);
    CHECK_THROWS_AS(llmc::write_model_file(p16, s, 5, half.data(), n * 4), std::invalid_argument);
    CHECK_THROWS_AS(llmc::write_model_file(p16, s, 4, half.data(), n * 4), std::invalid_argument);
}

TEST_CASE("checkpoint: corrupt model files are rejected, naming the file") {
    TempDir dir;
    ModelShape s = tiny_shape();
    size_t n = llmc::num_parameters(s);
    std::vector<float> params = ramp(n, 1.0f);
    std::string p = dir / "model.bin";
    auto fresh = [&] { llmc::write_model_file(p, s, 3, params.data(), n * 4); };
    auto err = [&] { return error_of([&] { llmc::read_model_header(p); }); };

    fresh();
    REQUIRE(truncate(p.c_str(), (off_t)(1024 + n * 4 - 1)) == 0);  // one byte short
    std::string msg = err();
    CHECK(contains(msg, p));
    CHECK(contains(msg, "truncated or has the wrong shape"));

    fresh();
    std::vector<unsigned char> b = read_bytes(p);
    b.push_back(0);  // one byte too many
    write_bytes(p, b);
    CHECK(contains(err(), "truncated or has the wrong shape"));

    fresh();
    poke_header(p, 0, 20240327);
    msg = err();
    CHECK(contains(msg, p));
    CHECK(contains(msg, "not an llm.c model file"));

    fresh();
    poke_header(p, 1, 4);
    msg = err();
    CHECK(contains(msg, p));
    CHECK(contains(msg, "unsupported model file version 4"));

    fresh();
    poke_header(p, 1, 5);  // claims bf16 but holds fp32 data: twice too long
    CHECK(contains(err(), "truncated or has the wrong shape"));

    fresh();
    poke_header(p, 4, 3);  // L=3 instead of 2
    msg = err();
    CHECK(contains(msg, p));
    CHECK(contains(msg, "truncated or has the wrong shape"));
    CHECK(contains(msg, "L=3"));

    fresh();
    poke_header(p, 7, 40);  // Vp < V
    msg = err();
    CHECK(contains(msg, p));
    CHECK(contains(msg, "Vp=40"));

    fresh();
    poke_header(p, 5, 3);  // C=8 not divisible by NH=3
    CHECK(contains(err(), "not divisible"));

    fresh();
    poke_header(p, 6, 0);
    CHECK(contains(err(), "invalid shape"));

    fresh();
    poke_header(p, 6, 2000000000);  // absurd, must not overflow into a "matching" size
    CHECK(contains(err(), p));

    write_bytes(p, std::vector<unsigned char>(100, 0));
    msg = err();
    CHECK(contains(msg, p));
    CHECK(contains(msg, "too short"));

    msg = error_of([&] { llmc::read_model_header(dir / "missing.bin"); });
    CHECK(contains(msg, dir / "missing.bin"));
    CHECK(contains(msg, "No such file"));
}

TEST_CASE("checkpoint: atomic writes leave no temp file and never clobber on failure") {
    TempDir dir;
    ModelShape s = tiny_shape();
    size_t n = llmc::num_parameters(s);
    std::vector<float> a = ramp(n, 1.0f), b = ramp(n, 2.0f);

    // a path under a directory that does not exist: fails cleanly, names the file
    std::string nowhere = dir / "no/such/dir/model.bin";
    std::string msg = error_of([&] { llmc::write_model_file(nowhere, s, 3, a.data(), n * 4); });
    CHECK(contains(msg, "cannot write " + nowhere));
    CHECK(contains(msg, "No such file"));
    msg = error_of([&] { llmc::write_model_file("/proc/llmc_model.bin", s, 3, a.data(), n * 4); });
    CHECK(contains(msg, "cannot write /proc/llmc_model.bin"));

    // the temp name is occupied by a directory, so the temp file cannot be created (works as root too):
    // the existing destination keeps its old contents
    std::string p = dir / "model.bin";
    llmc::write_model_file(p, s, 3, a.data(), n * 4);
    std::vector<unsigned char> before = read_bytes(p);
    const std::string tmp = llmc::ckpt_detail::temp_path(p);
    REQUIRE(mkdir(tmp.c_str(), 0755) == 0);
    msg = error_of([&] { llmc::write_model_file(p, s, 3, b.data(), n * 4); });
    CHECK(contains(msg, "cannot write " + p));
    CHECK(read_bytes(p) == before);
    rmdir(tmp.c_str());

    // the destination is a non-empty directory, so the final rename fails: the temp file is removed
    std::string d = dir / "occupied";
    REQUIRE(mkdir(d.c_str(), 0755) == 0);
    touch(d + "/keep");
    msg = error_of([&] { llmc::write_model_file(d, s, 3, b.data(), n * 4); });
    CHECK(contains(msg, "cannot write " + d));
    CHECK_FALSE(exists(llmc::ckpt_detail::temp_path(d)));
    CHECK(exists(d + "/keep"));

    // state files go through the same path
    llmc::StateWriter w(1, 0, 1, "x");
    w.add("a", a.data(), 16);
    msg = error_of([&] { w.write_atomic(nowhere); });
    CHECK(contains(msg, "cannot write " + nowhere));

    // success overwrites and leaves nothing behind
    llmc::write_model_file(p, s, 3, b.data(), n * 4);
    std::vector<float> back(n);
    llmc::read_model_params(p, llmc::read_model_header(p), back.data(), n * 4);
    CHECK(back == b);
    CHECK_FALSE(has_tmp_file(dir.path));
}

TEST_CASE("checkpoint: state file round trip") {
    TempDir dir;
    std::vector<float> m = ramp(100, 0.1f), v = ramp(37, 3.0f);
    uint64_t rng[2] = {0x0123456789abcdefULL, 42};
    std::string long_name(32, 'z');  // a name may use all 32 bytes
    int32_t tag = -7;

    llmc::StateWriter w(123456789012LL, 3, 4, "bf16_recipe");
    w.add("adam_m", m.data(), m.size() * 4);
    w.add("adam_v", v.data(), v.size() * 4);
    w.add("rng", rng, sizeof(rng));
    w.add("empty", nullptr, 0);
    w.add(long_name, &tag, 4);
    std::string p = dir / "state.bin";
    w.write_atomic(p);
    CHECK_FALSE(has_tmp_file(dir.path));
    // 64 header + 5 section headers + data + checksum
    CHECK(read_bytes(p).size() == 64 + 5 * 40 + 400 + 148 + 16 + 0 + 4 + 8);

    llmc::StateReader r;
    r.open(p);
    CHECK(r.step() == 123456789012LL);
    CHECK(r.rank() == 3);
    CHECK(r.num_processes() == 4);
    CHECK(r.recipe() == "bf16_recipe");
    CHECK(r.has("adam_m"));
    CHECK(r.has("empty"));
    CHECK(r.has(long_name));
    CHECK_FALSE(r.has("adam"));
    CHECK(r.size_of("adam_m") == 400);
    CHECK(r.size_of("adam_v") == 148);
    CHECK(r.size_of("empty") == 0);
    std::vector<float> m2(100), v2(37);
    uint64_t rng2[2];
    int32_t tag2 = 0;
    r.read("adam_m", m2.data(), 400);
    r.read("adam_v", v2.data(), 148);
    r.read("rng", rng2, sizeof(rng2));
    r.read("empty", nullptr, 0);
    r.read(long_name, &tag2, 4);
    CHECK(m2 == m);
    CHECK(v2 == v);
    CHECK(rng2[0] == rng[0]);
    CHECK(rng2[1] == rng[1]);
    CHECK(tag2 == -7);

    // a writer with no sections is valid too
    llmc::StateWriter w0(0, 0, 1, "");
    w0.write_atomic(dir / "empty_state.bin");
    llmc::StateReader r0;
    r0.open(dir / "empty_state.bin");
    CHECK(r0.recipe() == "");
    CHECK_FALSE(r0.has("m"));
}

TEST_CASE("checkpoint: the state file checksum is XXH64, whatever the pieces it is fed in") {
    // XXH64 with seed 0 of these inputs, as the reference implementation (the xxhash package) computes it
    std::string digits;
    for (int i = 0; i < 7; i++) digits += "0123456789";
    std::string bytes;
    for (int i = 0; i < 3; i++) for (int b = 0; b < 256; b++) bytes.push_back((char)b);
    bytes += "xyz";
    const struct { std::string text; uint64_t want; } cases[] = {
        {"", 0xef46db3751d8e999ULL}, {"a", 0xd24ec4f1a98c6e5bULL}, {"abc", 0x44bc2cf5ad770999ULL},
        {digits, 0x4916a0f3f0e1c781ULL}, {bytes, 0xe921a1b45bd779f8ULL}};
    for (const auto& c : cases) {
        CAPTURE(c.text.size());
        CHECK(llmc::ckpt_detail::xxh64(c.text.data(), c.text.size()) == c.want);
        // fed in pieces of every size from 1 to 40 bytes: the same value
        for (size_t piece = 1; piece <= 40; piece++) {
            llmc::ckpt_detail::Xxh64 h;
            for (size_t at = 0; at < c.text.size(); at += piece) h.update(c.text.data() + at, std::min(piece, c.text.size() - at));
            CHECK(h.digest() == c.want);
        }
    }
}

TEST_CASE("checkpoint: a version 1 state file (FNV-1a checksum) still reads") {
    TempDir dir;
    std::vector<float> m = ramp(30, 0.25f);
    llmc::StateWriter w(12, 0, 1, "bf16");
    w.add("m", m.data(), m.size() * 4);
    std::string p = dir / "state.bin";
    w.write_atomic(p);
    std::vector<unsigned char> b = read_bytes(p);
    uint32_t version;
    std::memcpy(&version, &b[4], 4);
    CHECK(version == 2);
    // rewrite it as version 1 wrote it: the version field 1 and FNV-1a 64 of every byte before the checksum
    version = 1;
    std::memcpy(&b[4], &version, 4);
    uint64_t fnv = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i + 8 < b.size(); i++) fnv = (fnv ^ b[i]) * 0x100000001b3ULL;
    std::memcpy(&b[b.size() - 8], &fnv, 8);
    write_bytes(p, b);
    llmc::StateReader r;
    r.open(p);
    std::vector<float> back(30);
    r.read("m", back.data(), back.size() * 4);
    CHECK(back == m);
    CHECK(r.step() == 12);
    // and its XXH64 instead of FNV-1a is a checksum mismatch
    uint64_t xx = llmc::ckpt_detail::xxh64(b.data(), b.size() - 8);
    std::memcpy(&b[b.size() - 8], &xx, 8);
    write_bytes(p, b);
    CHECK(contains(error_of([&] { r.open(p); }), "checksum mismatch"));
}

TEST_CASE("checkpoint: state writer rejects bad names") {
    llmc::StateWriter w(1, 0, 1, "r");
    int x = 0;
    w.add("a", &x, 4);
    CHECK_THROWS_AS(w.add("a", &x, 4), std::invalid_argument);
    CHECK_THROWS_AS(w.add("", &x, 4), std::invalid_argument);
    CHECK_THROWS_AS(w.add(std::string(33, 'n'), &x, 4), std::invalid_argument);
    CHECK_THROWS_AS(llmc::StateWriter(1, 0, 1, std::string(33, 'r')), std::invalid_argument);
}

TEST_CASE("checkpoint: a flipped byte anywhere in a state file is detected") {
    TempDir dir;
    std::vector<float> m = ramp(20, 0.5f);
    int64_t pos = 99;
    llmc::StateWriter w(500, 1, 2, "fp32");
    w.add("m", m.data(), m.size() * 4);
    w.add("loader_pos", &pos, 8);
    std::string good = dir / "good.bin", bad = dir / "bad.bin";
    w.write_atomic(good);
    std::vector<unsigned char> bytes = read_bytes(good);
    for (size_t i = 0; i < bytes.size(); i++) {
        CAPTURE(i);
        std::vector<unsigned char> b = bytes;
        b[i] ^= 0x10;
        write_bytes(bad, b);
        llmc::StateReader r;
        std::string msg = error_of([&] { r.open(bad); });
        CHECK(contains(msg, bad));
        // the magic is checked first, so a flip there reads as "not a state file"; the version next (it
        // picks the checksum), so a flip there reads as corrupt or newer
        CHECK(contains(msg, i < 4 ? "is not a state file" : i < 8 ? "is corrupt or of a newer format" : "is corrupt (checksum mismatch)"));
    }
    // truncation is corruption too
    for (size_t cut : {bytes.size() - 1, bytes.size() - 9, (size_t)100}) {
        CAPTURE(cut);
        write_bytes(bad, std::vector<unsigned char>(bytes.begin(), bytes.begin() + (long)cut));
        llmc::StateReader r;
        CHECK(contains(error_of([&] { r.open(bad); }), "checksum mismatch"));
    }
    write_bytes(bad, std::vector<unsigned char>(bytes.begin(), bytes.begin() + 20));
    llmc::StateReader r;
    CHECK(contains(error_of([&] { r.open(bad); }), "too short"));
    // a model file is not a state file
    ModelShape s = tiny_shape();
    std::vector<float> params = ramp(llmc::num_parameters(s), 1.0f);
    llmc::write_model_file(dir / "model.bin", s, 3, params.data(), params.size() * 4);
    CHECK(contains(error_of([&] { r.open(dir / "model.bin"); }), "is not a state file"));
    CHECK(contains(error_of([&] { r.open(dir / "absent.bin"); }), dir / "absent.bin"));
    // the good file still reads
    llmc::StateReader ok;
    ok.open(good);
    CHECK(ok.step() == 500);
}

TEST_CASE("checkpoint: missing sections and size mismatches") {
    TempDir dir;
    std::vector<float> m = ramp(10, 1.0f);
    llmc::StateWriter w(7, 0, 1, "fp32");
    w.add("adam_m", m.data(), 40);
    std::string p = dir / "state.bin";
    w.write_atomic(p);
    llmc::StateReader r;
    r.open(p);
    std::vector<float> buf(20);
    std::string msg = error_of([&] { r.read("adam_v", buf.data(), 40); });
    CHECK(contains(msg, p));
    CHECK(contains(msg, "no section 'adam_v'"));
    msg = error_of([&] { r.size_of("master"); });
    CHECK(contains(msg, "no section 'master'"));
    msg = error_of([&] { r.read("adam_m", buf.data(), 80); });
    CHECK(contains(msg, p));
    CHECK(contains(msg, "'adam_m'"));
    CHECK(contains(msg, "40 bytes"));
    CHECK(contains(msg, "80"));
}

TEST_CASE("checkpoint: file names in the checkpoint directory") {
    CHECK(llmc::model_path("out", 5) == "out/model_00000005.bin");
    CHECK(llmc::state_path("out", 5, 2) == "out/state_00000005_00002.bin");
    CHECK(llmc::done_path("out", 5) == "out/DONE_00000005");
    CHECK(llmc::model_path("out", 123456789) == "out/model_123456789.bin");
}

TEST_CASE("checkpoint: DONE markers and finding the latest checkpoint") {
    TempDir dir;
    const std::string& d = dir.path;
    CHECK(llmc::find_latest_checkpoint(d) == -1);
    CHECK(llmc::find_latest_checkpoint(dir / "does_not_exist") == -1);

    write_checkpoint(d, 10);
    CHECK(exists(llmc::done_path(d, 10)));
    CHECK(read_bytes(llmc::done_path(d, 10)).empty());
    CHECK(llmc::find_latest_checkpoint(d) == 10);

    // an interrupted checkpoint (no marker) and stray temp files are ignored
    write_checkpoint(d, 20, 1, /*done=*/false);
    touch(dir / "model_00000030.bin.tmp");
    touch(dir / "DONE_00000040.tmp");
    touch(dir / "DONE_notanumber");
    touch(dir / "main.log");
    CHECK(llmc::find_latest_checkpoint(d) == 10);

    // a marker whose model file has gone is still the newest, and resuming it is refused, naming the file
    // and the marker (not an older checkpoint resumed without a word)
    write_checkpoint(d, 50);
    CHECK(llmc::find_latest_checkpoint(d) == 50);
    llmc::check_checkpoint_files(d, 50, 0);
    REQUIRE(unlink(llmc::model_path(d, 50).c_str()) == 0);
    CHECK(llmc::find_latest_checkpoint(d) == 50);
    std::string gone = error_of([&] { llmc::check_checkpoint_files(d, 50, 0); });
    CHECK(contains(gone, llmc::model_path(d, 50)));
    CHECK(contains(gone, llmc::done_path(d, 50)));
    CHECK(contains(error_of([&] { llmc::check_checkpoint_files(d, 10, 1); }), llmc::state_path(d, 10, 1)));
    REQUIRE(unlink(llmc::done_path(d, 50).c_str()) == 0);
    CHECK(llmc::find_latest_checkpoint(d) == 10);

    // the marker is refused until every file of the step is there
    std::string msg = error_of([&] { llmc::write_done_marker(d, 60); });
    CHECK(contains(msg, llmc::model_path(d, 60)));
    ModelShape s = tiny_shape();
    std::vector<float> params = ramp(llmc::num_parameters(s), 1.0f);
    llmc::write_model_file(llmc::model_path(d, 60), s, 3, params.data(), params.size() * 4);
    msg = error_of([&] { llmc::write_done_marker(d, 60); });
    CHECK(contains(msg, llmc::state_path(d, 60, 0)));
    llmc::StateWriter w0(60, 0, 2, "fp32");
    w0.write_atomic(llmc::state_path(d, 60, 0));
    msg = error_of([&] { llmc::write_done_marker(d, 60); });
    CHECK(contains(msg, llmc::state_path(d, 60, 1)));  // rank 0 says there are 2 ranks
    CHECK_FALSE(exists(llmc::done_path(d, 60)));
    llmc::StateWriter w1(60, 1, 2, "fp32");
    w1.write_atomic(llmc::state_path(d, 60, 1));
    llmc::write_done_marker(d, 60);
    CHECK(llmc::find_latest_checkpoint(d) == 60);
    CHECK_FALSE(exists(llmc::done_path(d, 60) + ".tmp"));
}

TEST_CASE("checkpoint: the model file's checksum and the DONE marker") {
    TempDir dir;
    const std::string& d = dir.path;
    ModelShape s = tiny_shape();
    std::vector<float> params = ramp(llmc::num_parameters(s), 0.25f);
    const uint64_t sum = llmc::write_model_file(llmc::model_path(d, 7), s, 3, params.data(), params.size() * 4);
    CHECK(sum == llmc::file_xxh64(llmc::model_path(d, 7)));
    std::vector<unsigned char> bytes = read_bytes(llmc::model_path(d, 7));
    CHECK(sum == llmc::ckpt_detail::xxh64(bytes.data(), bytes.size()));
    llmc::StateWriter w(7, 0, 1, "fp32");
    w.write_atomic(llmc::state_path(d, 7, 0));
    // a model file changed on disk after it was written: no marker
    uint64_t other = sum ^ 1;
    CHECK(contains(error_of([&] { llmc::write_done_marker(d, 7, &other); }), "differs from what was written"));
    CHECK_FALSE(exists(llmc::done_path(d, 7)));
    llmc::write_done_marker(d, 7, &sum);
    CHECK(exists(llmc::done_path(d, 7)));
}

TEST_CASE("checkpoint: temporary names are per process and count as checkpoint files") {
    const std::string t = llmc::ckpt_detail::temp_path("out/model_00000010.bin");
    CHECK(t == "out/model_00000010.bin.tmp." + std::to_string(getpid()));
    CHECK(llmc::ckpt_detail::checkpoint_file_step("model_00000010.bin.tmp.123") == 10);
    CHECK(llmc::ckpt_detail::checkpoint_file_step("state_00000020_00001.bin.tmp.9") == 20);
    CHECK(llmc::ckpt_detail::checkpoint_file_step("DONE_00000030.tmp.77") == 30);
    CHECK(llmc::ckpt_detail::checkpoint_file_step("DONE_00000030.tmp") == 30);
    CHECK(llmc::ckpt_detail::checkpoint_file_step("model_00000010.bin.tmp.x1") == -1);
    CHECK(llmc::ckpt_detail::checkpoint_file_step("notes.tmp.12") == -1);
    CHECK(llmc::ckpt_detail::done_marker_step("DONE_00000030.tmp.77") == -1);  // never a marker
}

TEST_CASE("checkpoint: the output directory's run, its removal, and its lock") {
    TempDir dir;
    const std::string& d = dir.path;
    CHECK(llmc::run_files(d).empty());
    CHECK(llmc::run_files(dir / "absent").empty());
    touch(dir / "notes.txt");
    touch(dir / ".lock");
    CHECK(llmc::run_files(d).empty());  // the user's files and the lock are not a run
    touch(dir / "main.log");
    CHECK(llmc::run_files(d).has_log);
    write_checkpoint(d, 10);
    touch(dir / "model_00000020.bin.tmp.99");
    llmc::RunFiles run = llmc::run_files(d);
    CHECK(run.checkpoint_files.size() == 4);  // model, state, DONE of step 10, the leftover temporary
    llmc::remove_run_files(d);
    CHECK(llmc::run_files(d).empty());
    CHECK(exists(dir / "notes.txt"));

    // the lock: a second holder is refused, naming the first; released, it can be taken again
    {
        llmc::OutputDirLock first, second;
        first.acquire(d);
        CHECK(first.held());
        std::string msg = error_of([&] { second.acquire(d); });
        CHECK(contains(msg, "in use by another trainer"));
        CHECK(contains(msg, "pid " + std::to_string(getpid())));
        CHECK_FALSE(second.held());
        first.release();
        second.acquire(d);
        CHECK(second.held());
    }
    llmc::OutputDirLock again;
    again.acquire(d);  // (the destructors released it)
    CHECK(contains(error_of([&] { llmc::OutputDirLock l; l.acquire(dir / "absent"); }), "lock file"));
}

TEST_CASE("checkpoint: the directories a start made go again unless the run starts") {
    TempDir dir;
    {
        llmc::RemoveIfUnused made(llmc::ensure_output_dir(dir / "a/b/c"));
        llmc::OutputDirLock lock;
        lock.acquire(dir / "a/b/c");
        CHECK(exists(dir / "a/b/c/.lock"));
    }
    CHECK_FALSE(exists(dir / "a"));
    {
        llmc::RemoveIfUnused made(llmc::ensure_output_dir(dir / "a/b"));
        made.keep();
    }
    CHECK(exists(dir / "a/b"));
    CHECK(llmc::ensure_output_dir(dir / "a/b").empty());  // nothing new made
    {
        llmc::RemoveIfUnused made(llmc::ensure_output_dir(dir / "a/b/c"));
        touch(dir / "a/b/c/main.log");  // not empty: left alone
    }
    CHECK(exists(dir / "a/b/c/main.log"));
}

TEST_CASE("checkpoint: -o checks that create nothing") {
    TempDir dir;
    llmc::check_output_dir_path(dir / "not_yet");  // fine: made later
    CHECK_FALSE(exists(dir / "not_yet"));
    touch(dir / "file");
    CHECK(contains(error_of([&] { llmc::check_output_dir_path(dir / "file"); }), "is not a directory"));
    REQUIRE(symlink((dir / "nowhere").c_str(), (dir / "dangling").c_str()) == 0);
    CHECK(contains(error_of([&] { llmc::check_output_dir_path(dir / "dangling"); }), "symbolic link"));
    REQUIRE(symlink(dir.path.c_str(), (dir / "link").c_str()) == 0);
    llmc::check_output_dir_path(dir / "link");  // a link to a directory is fine
    CHECK(contains(error_of([&] { llmc::read_model_header(dir.path); }), "is a directory"));
}

TEST_CASE("checkpoint: pruning keeps the newest complete checkpoints") {
    TempDir dir;
    const std::string& d = dir.path;
    write_checkpoint(d, 5, 1, /*done=*/false);  // an old interrupted one
    for (int step : {10, 20, 30, 40}) write_checkpoint(d, step, 2);
    write_checkpoint(d, 50, 1, /*done=*/false);  // the newest, still being written
    touch(dir / "model_00000020.bin.tmp");
    touch(dir / "main.log");
    touch(dir / "notes_00000001.txt");

    std::vector<std::string> all = list(d);
    llmc::prune_checkpoints(d, 0);  // 0 = keep everything
    CHECK(list(d) == all);
    llmc::prune_checkpoints(d, 4);  // exactly as many as there are
    CHECK(list(d) == all);
    llmc::prune_checkpoints(d, 9);
    CHECK(list(d) == all);

    llmc::prune_checkpoints(d, 2);
    std::vector<std::string> expect = {
        "DONE_00000030", "DONE_00000040", "main.log", "model_00000030.bin", "model_00000040.bin",
        "model_00000050.bin", "notes_00000001.txt", "state_00000030_00000.bin", "state_00000030_00001.bin",
        "state_00000040_00000.bin", "state_00000040_00001.bin", "state_00000050_00000.bin",
    };
    CHECK(list(d) == expect);
    CHECK(llmc::find_latest_checkpoint(d) == 40);

    llmc::prune_checkpoints(d, 1);
    CHECK_FALSE(exists(llmc::model_path(d, 30)));
    CHECK_FALSE(exists(llmc::done_path(d, 30)));
    CHECK(exists(llmc::model_path(d, 40)));
    CHECK(exists(llmc::model_path(d, 50)));  // newer than the cutoff: never touched
    CHECK(exists(dir / "main.log"));
    CHECK(llmc::find_latest_checkpoint(d) == 40);
}

TEST_CASE("checkpoint: ensure_output_dir") {
    TempDir dir;
    std::string nested = dir / "a/b/c";
    llmc::ensure_output_dir(nested);
    struct stat st;
    REQUIRE(stat(nested.c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK(list(nested).empty());  // the probe file is gone
    llmc::ensure_output_dir(nested);  // existing is fine
    llmc::ensure_output_dir(nested + "/");

    touch(dir / "file");
    std::string msg = error_of([&] { llmc::ensure_output_dir(dir / "file"); });
    CHECK(contains(msg, "-o " + (dir / "file")));
    CHECK(contains(msg, "not a directory"));
    msg = error_of([&] { llmc::ensure_output_dir(dir / "file/sub"); });
    CHECK(contains(msg, "-o " + (dir / "file/sub") + " is not writable"));

    msg = error_of([] { llmc::ensure_output_dir("/proc/llmc_out/run"); });
    CHECK(contains(msg, "-o /proc/llmc_out/run is not writable"));
    msg = error_of([] { llmc::ensure_output_dir("/proc/self"); });  // exists, but nothing can be created in it
    CHECK(contains(msg, "-o /proc/self is not writable"));
    CHECK(contains(error_of([] { llmc::ensure_output_dir(""); }), "-o"));
}

// The FP8 recipe's checkpoint records its scaling settings (section fp8_scaling, absent under delayed
// scaling); check_recipe_checkpoint refuses a run with other ones (train_gpt.cu's check_checkpoint lets -cr 1
// through, with the recipe state started afresh).
TEST_CASE("checkpoint: the fp8 recipe refuses another scaling mode") {
    TempDir dir;
    auto write_state = [&](const Fp8Options& written) {
        Fp8Options o = written;
        resolve_fp8_defaults(o);
        llmc::StateWriter w(5, 0, 1, "fp8");
        int32_t opts[4] = {o.amax_history, o.scale_margin, o.skip_first, o.skip_last};
        w.add_copy("fp8_options", opts, sizeof(opts));
        if (fp8_records_scaling(o)) {
            int32_t rec[3];
            fp8_scaling_record(o, rec);
            w.add_copy("fp8_scaling", rec, sizeof(rec));
        }
        const std::string p = dir / "state.bin";
        w.write_atomic(p);
        return p;
    };
    auto check = [&](const Fp8Options& written, const Fp8Options& run) {
        llmc::StateReader r;
        r.open(write_state(written));
        try {
            check_recipe_checkpoint(run, 12, r);
        } catch (const llmc::InputError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    Fp8Options delayed, current, block, block_e5m2, block_pow2;
    current.scaling = "current";
    block.scaling = block_e5m2.scaling = block_pow2.scaling = "block";
    block_e5m2.block_grad_format = "e5m2";
    block_pow2.pow2_scales = 1;
    const std::vector<Fp8Options> all = {delayed, current, block, block_e5m2, block_pow2};
    for (size_t i = 0; i < all.size(); i++) {
        for (size_t j = 0; j < all.size(); j++) {
            const std::string msg = check(all[i], all[j]);
            if (i == j) CHECK_MESSAGE(msg.empty(), msg);
            else CHECK_MESSAGE((contains(msg, "-fs ") && contains(msg, "-cr 1")), msg);
        }
    }
    // a delayed-scaling checkpoint has no fp8_scaling section
    llmc::StateReader r;
    r.open(write_state(delayed));
    CHECK_FALSE(r.has("fp8_scaling"));
}
