// checkpoint.h: model files, optimizer state files and the checkpoint directory (host only, no CUDA).
//
// Model file: llm.c's format, so checkpoints load in llm.c and llm.c's GPT-2 files load here.
//   1024-byte header of 256 int32: [0]=20240326 magic, [1]=version (3 = fp32 params, 5 = bf16 params),
//   [2]=maxT, [3]=V, [4]=L, [5]=NH, [6]=C, [7]=Vp, rest zero; then every parameter as one array in
//   llm.c's tensor order.
//
// State file: everything else needed to resume (optimizer moments, master weights, data loader
// position, RNG state, ...). It is our own format, sectioned so new state can be added without
// breaking old readers, and checksummed because a silently corrupt optimizer state would ruin a run
// without any visible error. Layout (little-endian, as the hosts we run on):
//   offset  0  uint32  magic 20241122
//           4  uint32  version 2 (version 1, still read, differs only in its checksum: FNV-1a 64)
//           8  int64   step
//          16  int32   process_rank
//          20  int32   num_processes
//          24  char[32] recipe name, zero-padded
//          56  uint32  num_sections
//          60  uint32  reserved (0)
//   then num_sections times: char[32] name (zero-padded), uint64 byte length, the bytes
//   then uint64 XXH64 (seed 0) of every byte before it.
//
// Every file is written atomically (PATH.tmp, fsync, rename), so a crash mid-write never leaves a
// half-written file under the real name. A checkpoint of step S is complete only once DONE_S exists;
// it is written last, after the model file and every rank's state file.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"     // ModelShape
#include "common.h"  // InputError, input_error, strfmt

namespace llmc {

constexpr int32_t kModelMagic = 20240326;
constexpr int32_t kModelVersionFp32 = 3;
constexpr int32_t kModelVersionBf16 = 5;
constexpr size_t kModelHeaderBytes = 1024;  // 256 int32

constexpr uint32_t kStateMagic = 20241122;
constexpr uint32_t kStateVersion = 2;          // written; 1 and 2 are read
constexpr uint32_t kStateVersionFnv = 1;       // the first version: an FNV-1a checksum
constexpr size_t kStateHeaderBytes = 64;
constexpr size_t kStateNameBytes = 32;          // recipe and section names
constexpr size_t kStateSectionHeaderBytes = 40; // name + uint64 length

struct ModelFileInfo {
    ModelShape shape;
    int version = 0;  // kModelVersionFp32 or kModelVersionBf16
};

// Parameter count of a GPT-2/3 model: token embedding (Vp*C), position embedding (maxT*C), per layer
// 2 LayerNorms (4C) + qkv (3C*C + 3C) + attention projection (C*C + C) + MLP (4C*C + 4C + 4C*C + C)
// = 12C^2 + 13C, and the final LayerNorm (2C).
inline size_t num_parameters(const ModelShape& s) {
    size_t C = (size_t)s.channels, L = (size_t)s.num_layers;
    return (size_t)s.padded_vocab_size * C + (size_t)s.max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

namespace ckpt_detail {

inline size_t bytes_per_param(int version) {
    if (version == kModelVersionFp32) return 4;
    if (version == kModelVersionBf16) return 2;
    throw std::invalid_argument(strfmt("model file version %d is neither 3 (fp32) nor 5 (bf16)", version));
}

struct Chunk {
    const void* data;
    size_t bytes;
};

// fsync the directory holding `path` so the rename itself survives a power loss. Best effort: some
// file systems refuse fsync on a directory, and the data is already safe in the file.
inline void fsync_parent_dir(const std::string& path) {
    size_t slash = path.find_last_of('/');
    std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)::fsync(fd);
        ::close(fd);
    }
}

// The temporary name a file is written under: PATH.tmp.PID, one per process, so that two writers never
// share one (the output directory's lock already keeps a second trainer out).
inline std::string temp_path(const std::string& path) { return path + strfmt(".tmp.%d", (int)::getpid()); }

// Write the chunks, in order, to temp_path(path), flush them to disk, then rename over `path`. Either the
// whole new file appears under `path` or (on any failure) `path` is left as it was and no temporary remains.
inline void write_file_atomic(const std::string& path, const std::vector<Chunk>& chunks) {
    std::string tmp = temp_path(path);
    errno = 0;
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) input_error("cannot write %s: %s", path.c_str(), std::strerror(errno));
    int err = 0;
    for (const Chunk& c : chunks) {
        errno = 0;
        if (c.bytes > 0 && std::fwrite(c.data, 1, c.bytes, f) != c.bytes) {
            err = errno ? errno : EIO;
            break;
        }
    }
    errno = 0;
    if (!err && std::fflush(f) != 0) err = errno ? errno : EIO;
    if (!err && ::fsync(fileno(f)) != 0) err = errno ? errno : EIO;
    errno = 0;
    if (std::fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (!err && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno ? errno : EIO;
    if (err) {
        ::unlink(tmp.c_str());
        input_error("cannot write %s: %s", path.c_str(), std::strerror(err));
    }
    fsync_parent_dir(path);
}

// The state file's checksum guards against torn or bit-rotted files, not against deliberate tampering.
//
// FNV-1a 64 (version 1): one xor and one multiply per byte, each depending on the one before, so it runs
// at about a byte per four cycles: seconds per gigabyte, and a large model's state is tens of gigabytes.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;
inline uint64_t fnv1a(uint64_t h, const void* data, size_t bytes) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= kFnvPrime;
    }
    return h;
}

// XXH64 (version 2), the xxHash family's 64-bit hash, fed in pieces. It reads 32-byte stripes as four
// independent 64-bit lanes, so the four multiply chains overlap and it keeps up with memory. Per lane:
// acc = rotl(acc + word * P2, 31) * P1. After the stripes, the lanes are folded into one value, the
// remaining 0-31 bytes are mixed in 8, 4 and 1 at a time, and a final avalanche spreads every bit.
// Same value as the reference implementation's XXH64(data, length, seed 0), whatever the pieces.
class Xxh64 {
public:
    void update(const void* data, size_t bytes) {
        const unsigned char* p = static_cast<const unsigned char*>(data);
        total_ += bytes;
        if (held_ > 0) {  // complete the stripe begun by an earlier piece
            size_t take = std::min(bytes, sizeof(stripe_) - held_);
            std::memcpy(stripe_ + held_, p, take);
            held_ += take; p += take; bytes -= take;
            if (held_ < sizeof(stripe_)) return;
            consume_stripe(stripe_);
            held_ = 0;
        }
        for (; bytes >= sizeof(stripe_); p += sizeof(stripe_), bytes -= sizeof(stripe_)) consume_stripe(p);
        std::memcpy(stripe_, p, bytes);
        held_ = bytes;
    }

    uint64_t digest() const {
        uint64_t h;
        if (total_ >= sizeof(stripe_)) {
            h = rotl(lane_[0], 1) + rotl(lane_[1], 7) + rotl(lane_[2], 12) + rotl(lane_[3], 18);
            for (uint64_t v : lane_) h = (h ^ round(0, v)) * kP1 + kP4;
        } else {
            h = kP5;  // (seed 0 + P5)
        }
        h += total_;
        const unsigned char* p = stripe_;
        size_t left = held_;
        for (; left >= 8; p += 8, left -= 8) h = rotl(h ^ round(0, load64(p)), 27) * kP1 + kP4;
        if (left >= 4) {
            uint32_t w;
            std::memcpy(&w, p, 4);
            h = rotl(h ^ (uint64_t)w * kP1, 23) * kP2 + kP3;
            p += 4; left -= 4;
        }
        for (; left > 0; p++, left--) h = rotl(h ^ (uint64_t)*p * kP5, 11) * kP1;
        h ^= h >> 33; h *= kP2;
        h ^= h >> 29; h *= kP3;
        h ^= h >> 32;
        return h;
    }

private:
    static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL, kP3 = 0x165667B19E3779F9ULL,
                              kP4 = 0x85EBCA77C2B2AE63ULL, kP5 = 0x27D4EB2F165667C5ULL;
    static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
    static uint64_t round(uint64_t acc, uint64_t word) { return rotl(acc + word * kP2, 31) * kP1; }
    static uint64_t load64(const unsigned char* p) {
        uint64_t w;
        std::memcpy(&w, p, 8);  // little-endian, as the hosts we run on
        return w;
    }
    void consume_stripe(const unsigned char* p) {
        for (int i = 0; i < 4; i++) lane_[i] = round(lane_[i], load64(p + 8 * i));
    }
    // the lanes' starting values for seed 0
    uint64_t lane_[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
    unsigned char stripe_[32];
    size_t held_ = 0;
    uint64_t total_ = 0;
};

// A byte buffer that resize() leaves uninitialized (std::vector would zero it first: one more pass over a
// state file of gigabytes that the read overwrites at once).
class ByteBuffer {
public:
    void resize(size_t n) { data_.reset(n ? new unsigned char[n] : nullptr); size_ = n; }
    void clear() { resize(0); }
    unsigned char* data() { return data_.get(); }
    const unsigned char* data() const { return data_.get(); }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    unsigned char& operator[](size_t i) { return data_[i]; }
    const unsigned char& operator[](size_t i) const { return data_[i]; }
private:
    std::unique_ptr<unsigned char[]> data_;
    size_t size_ = 0;
};

inline uint64_t xxh64(const void* data, size_t bytes) {
    Xxh64 h;
    h.update(data, bytes);
    return h.digest();
}

inline void put_name(unsigned char* dst, const std::string& name) {
    std::memset(dst, 0, kStateNameBytes);
    std::memcpy(dst, name.data(), name.size());
}

inline std::string get_name(const unsigned char* src) {
    const char* s = reinterpret_cast<const char*>(src);
    size_t n = 0;
    while (n < kStateNameBytes && s[n] != '\0') n++;
    return std::string(s, n);
}

inline bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Parse a non-empty run of decimal digits that fits in an int; false otherwise.
inline bool parse_step_digits(const std::string& s, int* out) {
    if (s.empty() || s.size() > 9) return false;  // 9 digits always fit in an int
    int v = 0;
    for (char ch : s) {
        if (ch < '0' || ch > '9') return false;
        v = v * 10 + (ch - '0');
    }
    *out = v;
    return true;
}

inline bool strip_prefix(std::string& s, const char* prefix) {
    size_t n = std::strlen(prefix);
    if (s.compare(0, n, prefix) != 0) return false;
    s.erase(0, n);
    return true;
}

inline bool strip_suffix(std::string& s, const char* suffix) {
    size_t n = std::strlen(suffix);
    if (s.size() < n || s.compare(s.size() - n, n, suffix) != 0) return false;
    s.erase(s.size() - n);
    return true;
}

// The step of a completed DONE marker "DONE_<step>" (no .tmp), or -1.
inline int done_marker_step(const std::string& filename) {
    std::string s = filename;
    int step;
    if (strip_prefix(s, "DONE_") && parse_step_digits(s, &step)) return step;
    return -1;
}

// Strips a temporary name's ".tmp" or ".tmp.PID" ending; false if there is none.
inline bool strip_temp_suffix(std::string& s) {
    if (strip_suffix(s, ".tmp")) return true;
    const size_t at = s.rfind(".tmp.");
    if (at == std::string::npos) return false;
    int pid;
    if (!parse_step_digits(s.substr(at + 5), &pid)) return false;
    s.erase(at);
    return true;
}

// The step of any file this module writes into a checkpoint directory (model, state, DONE marker,
// or a leftover temporary of one of them), or -1 for anything else (main.log, the user's own files).
inline int checkpoint_file_step(const std::string& filename) {
    std::string s = filename;
    strip_temp_suffix(s);
    int step, rank;
    if (strip_prefix(s, "DONE_")) return parse_step_digits(s, &step) ? step : -1;
    if (strip_prefix(s, "model_")) return strip_suffix(s, ".bin") && parse_step_digits(s, &step) ? step : -1;
    if (strip_prefix(s, "state_") && strip_suffix(s, ".bin")) {
        size_t us = s.find('_');
        if (us == std::string::npos) return -1;
        if (parse_step_digits(s.substr(0, us), &step) && parse_step_digits(s.substr(us + 1), &rank)) return step;
    }
    return -1;
}

// Names of the entries of `dir`. A missing directory has no entries; any other failure is an error.
inline std::vector<std::string> list_dir(const std::string& dir, bool* missing) {
    std::vector<std::string> names;
    *missing = false;
    DIR* d = ::opendir(dir.c_str());
    if (!d) {
        if (errno == ENOENT) {
            *missing = true;
            return names;
        }
        input_error("cannot read checkpoint directory %s: %s", dir.c_str(), std::strerror(errno));
    }
    while (struct dirent* e = ::readdir(d)) names.push_back(e->d_name);
    ::closedir(d);
    return names;
}

// Steps that have a DONE marker, newest first.
inline std::vector<int> done_steps(const std::string& dir) {
    bool missing;
    std::vector<int> steps;
    for (const std::string& name : list_dir(dir, &missing)) {
        int step = done_marker_step(name);
        if (step >= 0) steps.push_back(step);
    }
    std::sort(steps.rbegin(), steps.rend());
    return steps;
}

// Deletes the named checkpoint files of `dir`, DONE markers first: if the process is killed halfway, no
// marker is left pointing at deleted files.
inline void delete_checkpoint_files(const std::string& dir, const std::vector<std::string>& names, const char* failure) {
    for (bool markers : {true, false})
        for (const std::string& name : names) {
            if ((done_marker_step(name) >= 0) != markers) continue;
            const std::string path = dir + "/" + name;
            if (::unlink(path.c_str()) != 0 && errno != ENOENT)
                input_error("%s %s: %s", failure, path.c_str(), std::strerror(errno));
        }
}

} // namespace ckpt_detail

// ---------------------------------------------------------------------------------------------
// model file
// ---------------------------------------------------------------------------------------------

inline ModelFileInfo read_model_header(const std::string& path) {
    const char* p = path.c_str();
    struct stat path_st;
    if (::stat(p, &path_st) == 0 && S_ISDIR(path_st.st_mode)) input_error("%s is a directory, not a model file", p);
    FILE* f = std::fopen(p, "rb");
    if (!f) input_error("cannot open model file %s: %s", p, std::strerror(errno));
    int32_t h[kModelHeaderBytes / 4];
    size_t got = std::fread(h, 1, sizeof(h), f);
    struct stat st;
    bool have_size = ::fstat(fileno(f), &st) == 0;
    std::fclose(f);
    if (got != sizeof(h))
        input_error("%s is too short to be an llm.c model file (%zu bytes, the header alone is %zu)", p, got,
                    kModelHeaderBytes);
    if (h[0] != kModelMagic)
        input_error("%s is not an llm.c model file (magic number %d, expected %d)", p, h[0], kModelMagic);
    if (h[1] != kModelVersionFp32 && h[1] != kModelVersionBf16)
        input_error("%s has unsupported model file version %d (supported: 3 = fp32 parameters, 5 = bf16 parameters)",
                    p, h[1]);

    ModelFileInfo info;
    info.version = h[1];
    ModelShape& s = info.shape;
    s.max_seq_len = h[2];
    s.vocab_size = h[3];
    s.num_layers = h[4];
    s.num_heads = h[5];
    s.channels = h[6];
    s.padded_vocab_size = h[7];
    std::string shape_str = strfmt("maxT=%d V=%d L=%d NH=%d C=%d Vp=%d", s.max_seq_len, s.vocab_size, s.num_layers,
                                   s.num_heads, s.channels, s.padded_vocab_size);
    if (s.max_seq_len <= 0 || s.vocab_size <= 0 || s.num_layers <= 0 || s.num_heads <= 0 || s.channels <= 0 ||
        s.padded_vocab_size <= 0)
        input_error("%s has an invalid shape in its header (%s)", p, shape_str.c_str());
    if (s.channels % s.num_heads != 0)
        input_error("%s has an invalid shape: C=%d is not divisible by NH=%d", p, s.channels, s.num_heads);
    if (s.padded_vocab_size < s.vocab_size)
        input_error("%s has an invalid shape: padded vocab Vp=%d is smaller than vocab V=%d", p, s.padded_vocab_size,
                    s.vocab_size);
    // A garbage header could describe a model so large that the byte count overflows; estimate in
    // floating point first (2^60 bytes is far beyond any real file).
    double approx = ((double)s.padded_vocab_size + s.max_seq_len) * s.channels +
                    (double)s.num_layers * (12.0 * s.channels * s.channels + 13.0 * s.channels);
    if (approx * 4 > 1e18) input_error("%s has an implausible shape in its header (%s)", p, shape_str.c_str());

    if (!have_size) input_error("cannot determine the size of %s: %s", p, std::strerror(errno));
    size_t expected = kModelHeaderBytes + num_parameters(s) * ckpt_detail::bytes_per_param(info.version);
    if ((unsigned long long)st.st_size != (unsigned long long)expected)
        input_error("%s is truncated or has the wrong shape: its header (%s, %s) needs %zu bytes but the file has %lld",
                    p, shape_str.c_str(), info.version == kModelVersionFp32 ? "fp32" : "bf16", expected,
                    (long long)st.st_size);
    return info;
}

// Read all parameters (num_parameters * 4 bytes for version 3, * 2 for version 5) into dst.
inline void read_model_params(const std::string& path, const ModelFileInfo& info, void* dst, size_t bytes) {
    size_t expected = num_parameters(info.shape) * ckpt_detail::bytes_per_param(info.version);
    if (bytes != expected)
        throw std::invalid_argument(strfmt("read_model_params(%s): buffer is %zu bytes, the parameters are %zu",
                                           path.c_str(), bytes, expected));
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) input_error("cannot open model file %s: %s", path.c_str(), std::strerror(errno));
    errno = 0;
    bool ok = std::fseek(f, (long)kModelHeaderBytes, SEEK_SET) == 0 && std::fread(dst, 1, bytes, f) == bytes;
    int err = errno;
    std::fclose(f);
    if (!ok)
        input_error("cannot read the parameters of %s (%s); was the file changed while loading?", path.c_str(),
                    err ? std::strerror(err) : "unexpected end of file");
}

// Writes a model file; returns the XXH64 of all its bytes (a checkpoint records it in its state file, since
// llm.c's format has no room for one).
inline uint64_t write_model_file(const std::string& path, const ModelShape& shape, int version, const void* params,
                                 size_t bytes) {
    size_t expected = num_parameters(shape) * ckpt_detail::bytes_per_param(version);
    if (bytes != expected)
        throw std::invalid_argument(strfmt("write_model_file(%s): %zu bytes of parameters given, the shape needs %zu",
                                           path.c_str(), bytes, expected));
    int32_t h[kModelHeaderBytes / 4] = {0};
    h[0] = kModelMagic;
    h[1] = version;
    h[2] = shape.max_seq_len;
    h[3] = shape.vocab_size;
    h[4] = shape.num_layers;
    h[5] = shape.num_heads;
    h[6] = shape.channels;
    h[7] = shape.padded_vocab_size;
    ckpt_detail::write_file_atomic(path, {{h, sizeof(h)}, {params, bytes}});
    ckpt_detail::Xxh64 hash;
    hash.update(h, sizeof(h));
    hash.update(params, bytes);
    return hash.digest();
}

// The XXH64 of a whole file, read in pieces.
inline uint64_t file_xxh64(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) input_error("cannot open %s: %s", path.c_str(), std::strerror(errno));
    ckpt_detail::Xxh64 hash;
    std::vector<unsigned char> piece(8u << 20);
    size_t got;
    while ((got = std::fread(piece.data(), 1, piece.size(), f)) > 0) hash.update(piece.data(), got);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) input_error("cannot read %s", path.c_str());
    return hash.digest();
}

// ---------------------------------------------------------------------------------------------
// state file
// ---------------------------------------------------------------------------------------------

// Collects named byte ranges and writes them as one state file. Only pointers are stored: the data
// must stay alive and unchanged until write_atomic returns.
class StateWriter {
public:
    StateWriter(int64_t step, int rank, int nprocs, const std::string& recipe)
        : step_(step), rank_(rank), nprocs_(nprocs), recipe_(recipe) {
        if (recipe.size() > kStateNameBytes)
            throw std::invalid_argument("StateWriter: recipe name longer than 32 bytes: " + recipe);
    }

    void add(const std::string& name, const void* data, size_t bytes) {
        if (name.empty() || name.size() > kStateNameBytes)
            throw std::invalid_argument("StateWriter: section name must be 1 to 32 bytes: '" + name + "'");
        for (const Section& s : sections_)
            if (s.name == name) throw std::invalid_argument("StateWriter: duplicate section '" + name + "'");
        sections_.push_back({name, data, bytes});
    }

    // The same for data that will not outlive the call (a recipe's state copied from the GPU): the
    // writer keeps its own copy.
    void add_copy(const std::string& name, const void* data, size_t bytes) {
        owned_.emplace_back((const unsigned char*)data, (const unsigned char*)data + bytes);
        add(name, owned_.back().data(), bytes);
    }

    void write_atomic(const std::string& path) const {
        unsigned char header[kStateHeaderBytes] = {0};
        uint32_t magic = kStateMagic, version = kStateVersion, count = (uint32_t)sections_.size();
        int32_t rank = rank_, nprocs = nprocs_;
        std::memcpy(header + 0, &magic, 4);
        std::memcpy(header + 4, &version, 4);
        std::memcpy(header + 8, &step_, 8);
        std::memcpy(header + 16, &rank, 4);
        std::memcpy(header + 20, &nprocs, 4);
        ckpt_detail::put_name(header + 24, recipe_);
        std::memcpy(header + 56, &count, 4);

        // section headers live here so the chunk pointers stay valid while writing
        std::vector<unsigned char> sec_headers(sections_.size() * kStateSectionHeaderBytes);
        std::vector<ckpt_detail::Chunk> chunks = {{header, sizeof(header)}};
        for (size_t i = 0; i < sections_.size(); i++) {
            unsigned char* sh = &sec_headers[i * kStateSectionHeaderBytes];
            ckpt_detail::put_name(sh, sections_[i].name);
            uint64_t len = sections_[i].bytes;
            std::memcpy(sh + kStateNameBytes, &len, 8);
            chunks.push_back({sh, kStateSectionHeaderBytes});
            chunks.push_back({sections_[i].data, sections_[i].bytes});
        }
        ckpt_detail::Xxh64 hash;
        for (const ckpt_detail::Chunk& c : chunks) hash.update(c.data, c.bytes);
        const uint64_t sum = hash.digest();
        chunks.push_back({&sum, 8});
        ckpt_detail::write_file_atomic(path, chunks);
    }

private:
    struct Section {
        std::string name;
        const void* data;
        size_t bytes;
    };
    int64_t step_;
    int rank_, nprocs_;
    std::string recipe_;
    std::vector<Section> sections_;
    std::deque<std::vector<unsigned char>> owned_; // add_copy's buffers (a deque never moves them)
};

// Reads a whole state file into memory and verifies it before anything is handed out.
class StateReader {
public:
    void open(const std::string& path) {
        path_ = path;
        sections_.clear();
        buf_.clear();
        const char* p = path.c_str();
        FILE* f = std::fopen(p, "rb");
        if (!f) input_error("cannot open state file %s: %s", p, std::strerror(errno));
        struct stat st;
        if (::fstat(fileno(f), &st) != 0) {
            int err = errno;
            std::fclose(f);
            input_error("cannot read state file %s: %s", p, std::strerror(err));
        }
        buf_.resize((size_t)st.st_size);
        errno = 0;
        size_t got = buf_.empty() ? 0 : std::fread(buf_.data(), 1, buf_.size(), f);
        int err = errno;
        std::fclose(f);
        if (got != buf_.size())
            input_error("cannot read state file %s: %s", p, err ? std::strerror(err) : "unexpected end of file");

        if (buf_.size() < kStateHeaderBytes + 8)
            input_error("%s is too short to be a state file (%zu bytes)", p, buf_.size());
        uint32_t magic, version, count;
        std::memcpy(&magic, &buf_[0], 4);
        if (magic != kStateMagic) input_error("%s is not a state file (magic number %u, expected %u)", p, magic, kStateMagic);
        // The version says which checksum to verify; the checksum then comes before every other field, so
        // a flipped bit in a length is reported as corruption. A version neither writer used is corruption
        // as likely as a newer format.
        std::memcpy(&version, &buf_[4], 4);
        if (version != kStateVersion && version != kStateVersionFnv)
            input_error("%s is corrupt or of a newer format (state file version %u; this build reads versions %u and %u)",
                        p, version, kStateVersionFnv, kStateVersion);
        uint64_t stored;
        std::memcpy(&stored, &buf_[buf_.size() - 8], 8);
        const uint64_t sum = version == kStateVersionFnv ? ckpt_detail::fnv1a(ckpt_detail::kFnvOffset, buf_.data(), buf_.size() - 8)
                                                         : ckpt_detail::xxh64(buf_.data(), buf_.size() - 8);
        if (sum != stored) input_error("%s is corrupt (checksum mismatch)", p);
        int32_t rank, nprocs;
        std::memcpy(&step_, &buf_[8], 8);
        std::memcpy(&rank, &buf_[16], 4);
        std::memcpy(&nprocs, &buf_[20], 4);
        rank_ = rank;
        nprocs_ = nprocs;
        recipe_ = ckpt_detail::get_name(&buf_[24]);
        std::memcpy(&count, &buf_[56], 4);

        size_t pos = kStateHeaderBytes, end = buf_.size() - 8;
        for (uint32_t i = 0; i < count; i++) {
            if (end - pos < kStateSectionHeaderBytes) input_error("%s is corrupt (section table runs past the end)", p);
            Section s;
            s.name = ckpt_detail::get_name(&buf_[pos]);
            uint64_t len;
            std::memcpy(&len, &buf_[pos + kStateNameBytes], 8);
            pos += kStateSectionHeaderBytes;
            if (len > end - pos) input_error("%s is corrupt (section '%s' runs past the end)", p, s.name.c_str());
            s.offset = pos;
            s.bytes = (size_t)len;
            pos += (size_t)len;
            if (has(s.name)) input_error("%s is corrupt (section '%s' appears twice)", p, s.name.c_str());
            sections_.push_back(s);
        }
        if (pos != end) input_error("%s is corrupt (%zu unexpected bytes after the last section)", p, end - pos);
    }

    int64_t step() const { return step_; }
    int rank() const { return rank_; }
    int num_processes() const { return nprocs_; }
    const std::string& recipe() const { return recipe_; }

    bool has(const std::string& name) const { return find(name) != nullptr; }

    size_t size_of(const std::string& name) const { return get(name).bytes; }

    std::vector<std::string> section_names() const {
        std::vector<std::string> names;
        for (const Section& s : sections_) names.push_back(s.name);
        return names;
    }

    void read(const std::string& name, void* dst, size_t bytes) const {
        const Section& s = get(name);
        if (s.bytes != bytes)
            input_error("%s: section '%s' holds %zu bytes but %zu were expected (written for a different model or recipe?)",
                        path_.c_str(), name.c_str(), s.bytes, bytes);
        if (bytes > 0) std::memcpy(dst, &buf_[s.offset], bytes);
    }

private:
    struct Section {
        std::string name;
        size_t offset;
        size_t bytes;
    };
    const Section* find(const std::string& name) const {
        for (const Section& s : sections_)
            if (s.name == name) return &s;
        return nullptr;
    }
    const Section& get(const std::string& name) const {
        const Section* s = find(name);
        if (!s) input_error("%s has no section '%s' (written by a different recipe or version?)", path_.c_str(), name.c_str());
        return *s;
    }

    std::string path_;
    ckpt_detail::ByteBuffer buf_;
    std::vector<Section> sections_;
    int64_t step_ = 0;
    int rank_ = 0, nprocs_ = 0;
    std::string recipe_;
};

// ---------------------------------------------------------------------------------------------
// checkpoint directory
// ---------------------------------------------------------------------------------------------

inline std::string model_path(const std::string& dir, int step) { return dir + strfmt("/model_%08d.bin", step); }

inline std::string state_path(const std::string& dir, int step, int rank) {
    return dir + strfmt("/state_%08d_%05d.bin", step, rank);
}

inline std::string done_path(const std::string& dir, int step) { return dir + strfmt("/DONE_%08d", step); }

// Mark checkpoint `step` complete. Refuses unless the model file and every rank's state file are
// there (the number of ranks is read from rank 0's state header) and, given the checksum the writer
// computed, the model file on disk still has it; so a DONE marker always means "this step can be resumed
// from". (Each process verifies its own state file's checksum after writing it: save_checkpoint.)
inline void write_done_marker(const std::string& dir, int step, const uint64_t* model_xxh64 = nullptr) {
    std::string model = model_path(dir, step), state0 = state_path(dir, step, 0);
    if (!ckpt_detail::file_exists(model))
        input_error("cannot mark checkpoint %d complete: %s is missing", step, model.c_str());
    if (model_xxh64 && file_xxh64(model) != *model_xxh64)
        input_error("cannot mark checkpoint %d complete: %s on disk differs from what was written (a failing disk, or "
                    "another writer)", step, model.c_str());
    FILE* f = std::fopen(state0.c_str(), "rb");
    if (!f) input_error("cannot mark checkpoint %d complete: %s is missing", step, state0.c_str());
    unsigned char header[kStateHeaderBytes];
    size_t got = std::fread(header, 1, sizeof(header), f);
    std::fclose(f);
    uint32_t magic = 0;
    int32_t nprocs = 0;
    if (got == sizeof(header)) {
        std::memcpy(&magic, header, 4);
        std::memcpy(&nprocs, header + 20, 4);
    }
    if (got != sizeof(header) || magic != kStateMagic || nprocs < 1)
        input_error("cannot mark checkpoint %d complete: %s is not a valid state file", step, state0.c_str());
    for (int r = 1; r < nprocs; r++) {
        std::string sp = state_path(dir, step, r);
        if (!ckpt_detail::file_exists(sp))
            input_error("cannot mark checkpoint %d complete: %s is missing", step, sp.c_str());
    }
    ckpt_detail::write_file_atomic(done_path(dir, step), {});
}

// The newest step with a DONE marker, or -1 if there is none or `dir` does not exist. Checkpoints
// without a marker were interrupted mid-write and are never resumed from. A marked one whose files have
// gone since is still the newest: resuming it fails with a clear message (check_checkpoint_files) rather
// than silently resuming an older one.
inline int find_latest_checkpoint(const std::string& dir) {
    const std::vector<int> steps = ckpt_detail::done_steps(dir);
    return steps.empty() ? -1 : steps.front();
}

// The files of a checkpoint marked complete that one process reads: the model file and its state file.
inline void check_checkpoint_files(const std::string& dir, int step, int rank) {
    for (const std::string& path : {model_path(dir, step), state_path(dir, step, rank)}) {
        if (!ckpt_detail::file_exists(path))
            input_error("checkpoint %d in %s is marked complete (%s) but %s is missing; put it back, or delete the "
                        "marker to resume from the checkpoint before it", step, dir.c_str(), done_path(dir, step).c_str(),
                        path.c_str());
    }
}

// Keep the newest `keep_last` complete checkpoints; delete every checkpoint file (model, state, DONE,
// leftover .tmp) of any older step, complete or not. Steps newer than the cutoff are never touched,
// even if incomplete: one may be being written right now. keep_last <= 0 keeps everything.
inline void prune_checkpoints(const std::string& dir, int keep_last) {
    if (keep_last <= 0) return;
    std::vector<int> complete = ckpt_detail::done_steps(dir);
    if ((int)complete.size() <= keep_last) return;
    int cutoff = complete[(size_t)keep_last - 1];  // the oldest step we keep

    bool missing;
    std::vector<std::string> doomed;
    for (const std::string& name : ckpt_detail::list_dir(dir, &missing)) {
        int step = ckpt_detail::checkpoint_file_step(name);
        if (step >= 0 && step < cutoff) doomed.push_back(name);
    }
    ckpt_detail::delete_checkpoint_files(dir, doomed, "cannot delete old checkpoint file");
}

// ---------------------------------------------------------------------------------------------
// the output directory: one run per directory, one trainer at a time
// ---------------------------------------------------------------------------------------------

// What `dir` holds of a run: main.log and the checkpoint files (model, state, DONE markers, leftover
// temporaries). A missing directory holds nothing.
struct RunFiles {
    bool has_log = false;
    std::vector<std::string> checkpoint_files;  // names, not paths
    bool empty() const { return !has_log && checkpoint_files.empty(); }
};

inline RunFiles run_files(const std::string& dir) {
    RunFiles run;
    bool missing;
    for (const std::string& name : ckpt_detail::list_dir(dir, &missing)) {
        if (name == "main.log") run.has_log = true;
        else if (ckpt_detail::checkpoint_file_step(name) >= 0) run.checkpoint_files.push_back(name);
    }
    std::sort(run.checkpoint_files.begin(), run.checkpoint_files.end());
    return run;
}

// Deletes a run's main.log and checkpoint files (DONE markers first, so that no marker is left pointing
// at deleted files); the user's other files stay.
inline void remove_run_files(const std::string& dir) {
    const RunFiles run = run_files(dir);
    ckpt_detail::delete_checkpoint_files(dir, run.checkpoint_files, "-ow 1: cannot delete");
    const std::string log = dir + "/main.log";
    if (run.has_log && ::unlink(log.c_str()) != 0 && errno != ENOENT)
        input_error("-ow 1: cannot delete %s: %s", log.c_str(), std::strerror(errno));
}

// An exclusive lock on the output directory (flock on DIR/.lock), held until the process ends, however
// it ends (the kernel drops it with the last descriptor, also after kill -9). The file names its holder, so
// a second trainer on the same -o is refused at once, naming the first. (Only process 0 of a run takes it:
// the others write their state files into the same directory.)
class OutputDirLock {
public:
    OutputDirLock() = default;
    OutputDirLock(const OutputDirLock&) = delete;
    OutputDirLock& operator=(const OutputDirLock&) = delete;
    ~OutputDirLock() { release(); }

    bool held() const { return fd_ >= 0; }

    void acquire(const std::string& dir) {
        release();
        const std::string path = dir + "/.lock";
        const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) input_error("-o %s: cannot open its lock file %s: %s", dir.c_str(), path.c_str(), std::strerror(errno));
        if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            char holder[256] = {0};
            const ssize_t got = ::pread(fd, holder, sizeof(holder) - 1, 0);
            ::close(fd);
            std::string who = got > 0 ? std::string(holder, (size_t)got) : std::string("another process");
            while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) who.pop_back();
            if (err == EWOULDBLOCK)
                input_error("-o %s is in use by another trainer (%s); wait for it to end or choose another -o", dir.c_str(),
                            who.c_str());
            input_error("-o %s: cannot lock %s: %s", dir.c_str(), path.c_str(), std::strerror(err));
        }
        char host[128] = {0};
        if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown host");
        const std::string me = strfmt("pid %d on %s\n", (int)::getpid(), host);
        if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != (ssize_t)me.size()) {
            // (the lock holds without its note; a refused trainer then names "another process")
        }
        fd_ = fd;
    }

    void release() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
};

// The checks of -o that create nothing: a path that exists must be a directory (or a link to one).
inline void check_output_dir_path(const std::string& dir) {
    const char* d = dir.c_str();
    if (dir.empty()) input_error("-o: the output directory name is empty");
    struct stat st, lst;
    if (::lstat(d, &lst) != 0) return;  // not there yet: made once every check has passed
    if (S_ISLNK(lst.st_mode) && ::stat(d, &st) != 0)
        input_error("-o %s is a symbolic link to something that does not exist (%s)", d, std::strerror(errno));
    if (::stat(d, &st) == 0 && !S_ISDIR(st.st_mode)) input_error("-o %s exists and is not a directory", d);
}

// mkdir -p `dir`, then prove it is writable by creating and removing a probe file: better to fail
// now than after hours of training when the first checkpoint is due. Returns the directories it made,
// outermost first (RemoveIfUnused takes them away again if the run does not start).
inline std::vector<std::string> ensure_output_dir(const std::string& dir) {
    const char* d = dir.c_str();
    check_output_dir_path(dir);
    std::vector<std::string> made;
    for (size_t i = 1; i <= dir.size(); i++) {
        if (i < dir.size() && dir[i] != '/') continue;
        std::string prefix = dir.substr(0, i);
        if (::mkdir(prefix.c_str(), 0755) == 0) made.push_back(prefix);
        else if (errno != EEXIST)
            input_error("-o %s is not writable: cannot create %s: %s", d, prefix.c_str(), std::strerror(errno));
    }
    struct stat st;
    if (::stat(d, &st) != 0) input_error("-o %s is not writable: %s", d, std::strerror(errno));
    if (!S_ISDIR(st.st_mode)) input_error("-o %s exists and is not a directory", d);
    std::string probe = dir + strfmt("/.write_probe_%d", (int)::getpid());
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) input_error("-o %s is not writable: %s", d, std::strerror(errno));
    ::close(fd);
    ::unlink(probe.c_str());
    return made;
}

// The directories a start made (ensure_output_dir), taken away again (innermost first, with the lock file
// in them) unless keep() was called: a run that stops before it starts leaves no stray directories.
class RemoveIfUnused {
public:
    explicit RemoveIfUnused(std::vector<std::string> dirs = {}) : dirs_(std::move(dirs)) {}
    RemoveIfUnused(const RemoveIfUnused&) = delete;
    RemoveIfUnused& operator=(const RemoveIfUnused&) = delete;
    RemoveIfUnused(RemoveIfUnused&& o) noexcept : dirs_(std::move(o.dirs_)) { o.dirs_.clear(); }
    RemoveIfUnused& operator=(RemoveIfUnused&& o) noexcept { std::swap(dirs_, o.dirs_); return *this; }
    void keep() { dirs_.clear(); }
    ~RemoveIfUnused() {
        for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
            ::unlink((*it + "/.lock").c_str());
            ::rmdir(it->c_str());
        }
    }
private:
    std::vector<std::string> dirs_;
};

} // namespace llmc
