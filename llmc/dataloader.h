// dataloader.h: reads llm.c token shards and serves (inputs, targets) micro-batches.
//
// Shard file layout (little-endian):
//   bytes [0, 1024):     256 int32 header: [0] magic 20240520, [1] version 1, [2] token count N,
//                        the rest unused (zero)
//   bytes [1024, 1024 + 2N): N uint16 GPT-2 token ids
// The file must be exactly 1024 + 2N bytes; anything else means it is truncated or not a shard.
//
// Batching. With micro-batch B x T, P data-parallel processes and A accumulation micro-steps per
// optimizer step, one optimizer step of all processes together consumes D = B*T*P*A tokens (the
// total batch, -d), plus one more for the last target. A shard of N tokens is cut into
// chunks = (N - 1) / D whole chunks; chunk c covers tokens [c*D, c*D + D + 1) and is read as P*A
// slices of B*T: micro-step m of process r reads slice s = m*P + r,
//   [c*D + s*B*T, c*D + s*B*T + B*T + 1):  inputs = slice[0 .. B*T), targets = slice[1 .. B*T + 1)
// So the data of an optimizer step depends on D alone, not on how it is split between processes
// and micro-steps: P = 2, A = 1 reads exactly what P = 1, A = 2 reads (slice s is micro-step s of
// the one process), which is what makes a multi-GPU run comparable step for step with a one-GPU run
// of the same -d. Neighbouring chunks share one boundary token (the last target of one is the first
// input of the next), and the tail of a shard that does not fill a chunk is never used.
//
// Order. Without shuffling, epoch after epoch: shard 0 chunk 0, 1, ..., shard 1 chunk 0, ...
// With shuffling, every epoch has its own permutation of the shards and, within each shard, its
// own permutation of the chunks. The permutations depend only on (seed, epoch, shard index), so
// every process agrees on them, and a resumed run sees the same batches as an uninterrupted one.
// The position of the next optimizer step is (epoch, shard_pos, chunk_pos): positions in the
// epoch's shard order and in that shard's chunk order. At a step boundary (where checkpoints are
// taken) that triple is the whole dataloader state.
#pragma once
#include <glob.h>
#include <sys/stat.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include "common.h"
#include "rand.h"

namespace llmc {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int64_t kShardHeaderBytes = 256 * 4;

// Where to point the user when a shard is missing or malformed.
constexpr const char* kShardHint =
    "make shards with dev/data/tinyshakespeare.py or dev/data/fineweb.py";

struct ShardInfo {
    std::string path;
    int64_t num_tokens;
};

// Little-endian decoding from raw bytes, independent of the host's byte order.
inline int32_t read_le_i32(const unsigned char* p) {
    uint32_t v = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    int32_t out;
    std::memcpy(&out, &v, 4);
    return out;
}

// Expands a glob pattern into its matching paths, sorted by byte value (glob(3) sorts by the
// locale's collation, which could differ between machines; the shard order must not).
// flag_name only names the flag in the error, e.g. "-i".
inline std::vector<std::string> expand_glob(const std::string& pattern, const char* flag_name) {
    std::vector<std::string> out;
    glob_t g;
    std::memset(&g, 0, sizeof(g));
    int rc = glob(pattern.c_str(), 0, nullptr, &g);
    if (rc == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) out.push_back(g.gl_pathv[i]);
    }
    globfree(&g);
    if (rc == GLOB_NOSPACE) input_error("%s '%s': out of memory while expanding the pattern", flag_name, pattern.c_str());
    if (out.empty())
        input_error("no file matches %s '%s'; check the path, or %s", flag_name, pattern.c_str(), kShardHint);
    std::sort(out.begin(), out.end());
    return out;
}

// Reads and checks one shard's header and size. Throws InputError naming the file.
inline ShardInfo read_shard_header(const std::string& path) {
    const char* p = path.c_str();
    struct stat sb;
    if (stat(p, &sb) != 0) input_error("cannot open token shard %s: %s; %s", p, std::strerror(errno), kShardHint);
    if (S_ISDIR(sb.st_mode)) input_error("token shard %s is a directory, not a file; %s", p, kShardHint);
    const int64_t file_bytes = (int64_t)sb.st_size;
    if (file_bytes < kShardHeaderBytes)
        input_error("token shard %s is %lld bytes, shorter than the %lld-byte header: not a token shard; %s", p,
                    (long long)file_bytes, (long long)kShardHeaderBytes, kShardHint);
    FILE* f = std::fopen(p, "rb");
    if (!f) input_error("cannot open token shard %s: %s", p, std::strerror(errno));
    unsigned char header[kShardHeaderBytes];
    size_t got = std::fread(header, 1, (size_t)kShardHeaderBytes, f);
    std::fclose(f);
    if (got != (size_t)kShardHeaderBytes) input_error("cannot read the header of token shard %s", p);
    const int32_t magic = read_le_i32(header + 0);
    const int32_t version = read_le_i32(header + 4);
    const int32_t ntok = read_le_i32(header + 8);
    if (magic != kShardMagic)
        input_error("%s is not a token shard (magic %d, expected %d); %s", p, magic, kShardMagic, kShardHint);
    if (version != kShardVersion)
        input_error("token shard %s has version %d, expected %d; remake it (%s)", p, version, kShardVersion, kShardHint);
    if (ntok < 0) input_error("token shard %s claims %d tokens; the file is corrupt; %s", p, ntok, kShardHint);
    const int64_t expected = kShardHeaderBytes + 2 * (int64_t)ntok;
    if (file_bytes != expected)
        input_error("token shard %s is %lld bytes but its header says %d tokens (%lld bytes): truncated or corrupt; %s",
                    p, (long long)file_bytes, ntok, (long long)expected, kShardHint);
    ShardInfo info;
    info.path = path;
    info.num_tokens = ntok;
    return info;
}

// Plain-old-data position of the next batch; a checkpoint stores it as raw bytes.
struct DataLoaderState {
    uint64_t epoch = 0;      // completed passes over all shards
    uint64_t shard_pos = 0;  // index into this epoch's shard order
    uint64_t chunk_pos = 0;  // index into this shard's chunk order for this epoch
};

class DataLoader {
public:
    // pattern: glob of shard files (flag_name, e.g. "-i", names it in errors); B, T: micro-batch;
    // process_rank / num_processes: which slices of each chunk this process reads; shuffle: per-epoch
    // shard and chunk permutations from (seed, epoch, shard); vocab_size: every token must be below it;
    // micro_steps: accumulation micro-steps per optimizer step (a chunk is one optimizer step).
    // Checks every shard's header now and loads (and checks the tokens of) the first shard.
    DataLoader(const std::string& pattern, const char* flag_name, int B, int T, int process_rank,
               int num_processes, bool shuffle, uint64_t seed, int vocab_size, int micro_steps = 1)
        : pattern_(pattern), flag_name_(flag_name ? flag_name : "?"), rank_(process_rank),
          processes_(num_processes), micro_steps_(micro_steps), shuffle_(shuffle), seed_(seed), vocab_size_(vocab_size) {
        if (B <= 0 || T <= 0) input_error("%s: batch size -b %d and sequence length -t %d must be > 0", flag_name_.c_str(), B, T);
        if (num_processes <= 0 || process_rank < 0 || process_rank >= num_processes)
            input_error("%s: process rank %d is not in [0, %d)", flag_name_.c_str(), process_rank, num_processes);
        if (vocab_size <= 0) input_error("%s: vocab size %d must be > 0", flag_name_.c_str(), vocab_size);
        if (micro_steps <= 0) input_error("%s: %d micro-steps per step must be > 0", flag_name_.c_str(), micro_steps);
        local_tokens_ = (int64_t)B * T;
        global_tokens_ = local_tokens_ * num_processes * micro_steps;
        std::vector<std::string> paths = expand_glob(pattern, flag_name_.c_str());
        for (size_t i = 0; i < paths.size(); i++) {
            ShardInfo info = read_shard_header(paths[i]);
            // (N - 1) / D: every chunk needs D = B*T*P*A inputs plus one extra token for the last target
            int64_t chunks = info.num_tokens > 0 ? (info.num_tokens - 1) / global_tokens_ : 0;
            if (chunks == 0) {
                if (micro_steps == 1)
                    input_error("shard %s has %lld tokens, fewer than one batch needs (B*T*P+1 = %lld with P = %d "
                                "processes); lower -b/-t%s", info.path.c_str(), (long long)info.num_tokens,
                                (long long)(global_tokens_ + 1), num_processes, num_processes > 1 ? " or -pn" : "");
                input_error("shard %s has %lld tokens, fewer than one optimizer step needs (-d + 1 = %lld); lower -d",
                            info.path.c_str(), (long long)info.num_tokens, (long long)(global_tokens_ + 1));
            }
            shards_.push_back(info);
            shard_chunks_.push_back(chunks);
            total_tokens_ += info.num_tokens;
            batches_per_epoch_ += chunks;
        }
        reset();
    }

    // Back to the first batch of epoch 0.
    void reset() { restore(DataLoaderState()); }

    // Writes B*T inputs and B*T targets (the same tokens shifted by one), then advances.
    void next_batch(int32_t* inputs, int32_t* targets) {
        prepare();
        const int64_t chunk = chunk_order_[(size_t)pos_.chunk_pos];
        const int64_t slice = (int64_t)micro_ * processes_ + rank_;
        const int64_t start = chunk * global_tokens_ + slice * local_tokens_;
        const uint16_t* src = tokens_.data() + start;
        for (int64_t i = 0; i < local_tokens_; i++) {
            inputs[i] = (int32_t)src[i];
            targets[i] = (int32_t)src[i + 1];
        }
        // Advance: next micro-step of the chunk, else next chunk, else next shard, else next epoch.
        // The next shard is loaded lazily by the next call, so the final batch of a run does not read
        // a shard nobody will use.
        if (++micro_ < micro_steps_) return;
        micro_ = 0;
        pos_.chunk_pos++;
        if (pos_.chunk_pos >= (uint64_t)shard_chunks_[loaded_shard_]) {
            pos_.chunk_pos = 0;
            pos_.shard_pos++;
            if (pos_.shard_pos >= shards_.size()) {
                pos_.shard_pos = 0;
                pos_.epoch++;
            }
        }
    }

    // Position of the next optimizer step (call it between steps: mid-step it would lose the micro-step).
    DataLoaderState state() const {
        if (micro_ != 0) input_error("%s: the data position was asked for in the middle of an optimizer step", flag_name_.c_str());
        return pos_;
    }

    // The data slice the next batch comes from (micro-step * processes + rank): what the recipes mix
    // into their random streams, so that a slice draws the same bits however the step is split.
    int next_slice() const { return micro_ * processes_ + rank_; }

    // Continue from a saved position (the same shards, B, T and processes are assumed; the
    // checkpoint code checks those). Loads the shard that position points into.
    void restore(const DataLoaderState& s) {
        check_position(s);
        pos_ = s;
        micro_ = 0;
        shard_order_ = shard_order_for(s.epoch);
        shard_order_epoch_ = s.epoch;
        have_shard_order_ = true;
        prepare();
    }

    // Throws unless `s` is a position in these shards (what restore needs; reads no tokens).
    void check_position(const DataLoaderState& s) const {
        if (s.shard_pos >= shards_.size())
            input_error("data position (epoch %llu, shard %llu, chunk %llu) is out of range: %s '%s' has %zu shard(s); "
                        "resume with the same data",
                        (unsigned long long)s.epoch, (unsigned long long)s.shard_pos, (unsigned long long)s.chunk_pos,
                        flag_name_.c_str(), pattern_.c_str(), shards_.size());
        // the shard index the position points to depends on the epoch's shard order
        std::vector<size_t> order = shard_order_for(s.epoch);
        size_t shard = order[(size_t)s.shard_pos];
        if (s.chunk_pos >= (uint64_t)shard_chunks_[shard])
            input_error("data position (epoch %llu, shard %llu, chunk %llu) is out of range: shard %s has %lld chunk(s) "
                        "of %lld tokens; resume with the same data, -b, -t, -d and process count",
                        (unsigned long long)s.epoch, (unsigned long long)s.shard_pos, (unsigned long long)s.chunk_pos,
                        shards_[shard].path.c_str(), (long long)shard_chunks_[shard], (long long)global_tokens_);
    }

    // Checks the token ids of every shard now, on up to `threads` host threads, where all shards together
    // hold at most `max_tokens` (a larger data set is checked shard by shard as training reaches it, and a
    // bad token there stops the run with one line, its newest checkpoint kept). Throws for the first bad
    // shard in shard order.
    bool check_all_tokens(int64_t max_tokens, int threads) {
        if (total_tokens_ > max_tokens) return false;
        std::vector<std::string> errors(shards_.size());
        std::atomic<size_t> next{0};
        auto worker = [&]() {
            std::vector<unsigned char> piece(4u << 20);
            for (size_t i; (i = next.fetch_add(1)) < shards_.size();) {
                try { scan_shard_tokens(shards_[i], piece); }
                catch (const InputError& e) { errors[i] = e.what(); }
            }
        };
        std::vector<std::thread> pool;
        const int n = (int)std::max<size_t>(1, std::min<size_t>((size_t)std::max(threads, 1), shards_.size()));
        for (int t = 1; t < n; t++) pool.emplace_back(worker);
        worker();
        for (std::thread& t : pool) t.join();
        for (const std::string& e : errors)
            if (!e.empty()) throw InputError(e);
        return true;
    }

    // chunks per epoch: optimizer steps (batches, for an evaluation loader with micro_steps 1)
    int64_t batches_per_epoch() const { return batches_per_epoch_; }
    int64_t total_tokens() const { return total_tokens_; }
    size_t num_shards() const { return shards_.size(); }

private:
    // The epoch's shard order: identity, or a Fisher–Yates permutation seeded from (seed, epoch).
    // Tag 0 is the shard order; tag 1 + i is the chunk order of shard i, so no two streams share a seed.
    std::vector<size_t> shard_order_for(uint64_t epoch) const {
        std::vector<size_t> order(shards_.size());
        for (size_t i = 0; i < order.size(); i++) order[i] = i;
        if (shuffle_) {
            Rng rng(mix64(mix64(seed_, epoch), 0));
            fisher_yates_shuffle(order.data(), order.size(), rng);
        }
        return order;
    }

    std::vector<int64_t> chunk_order_for(uint64_t epoch, size_t shard) const {
        std::vector<int64_t> order((size_t)shard_chunks_[shard]);
        for (size_t i = 0; i < order.size(); i++) order[i] = (int64_t)i;
        if (shuffle_) {
            Rng rng(mix64(mix64(seed_, epoch), 1 + (uint64_t)shard));
            fisher_yates_shuffle(order.data(), order.size(), rng);
        }
        return order;
    }

    // Makes sure the shard order, the loaded tokens and the chunk order match pos_.
    void prepare() {
        if (!have_shard_order_ || shard_order_epoch_ != pos_.epoch) {
            shard_order_ = shard_order_for(pos_.epoch);
            shard_order_epoch_ = pos_.epoch;
            have_shard_order_ = true;
        }
        const size_t shard = shard_order_[(size_t)pos_.shard_pos];
        if (!have_tokens_ || loaded_shard_ != shard) load_shard(shard);   // cached: one shard stays loaded
        if (!have_chunk_order_ || chunk_order_epoch_ != pos_.epoch || chunk_order_shard_ != shard) {
            chunk_order_ = chunk_order_for(pos_.epoch, shard);
            chunk_order_epoch_ = pos_.epoch;
            chunk_order_shard_ = shard;
            have_chunk_order_ = true;
        }
    }

    // Reads a shard's tokens piece by piece and checks each id against the vocab (nothing kept).
    void scan_shard_tokens(const ShardInfo& info, std::vector<unsigned char>& piece) const {
        const char* p = info.path.c_str();
        FILE* f = std::fopen(p, "rb");
        if (!f) input_error("cannot open token shard %s: %s", p, std::strerror(errno));
        bool ok = std::fseek(f, (long)kShardHeaderBytes, SEEK_SET) == 0;
        size_t at = 0;  // tokens checked so far
        const size_t total = (size_t)info.num_tokens;
        while (ok && at < total) {
            const size_t want = std::min(piece.size() / 2, total - at);
            ok = std::fread(piece.data(), 1, 2 * want, f) == 2 * want;
            if (ok) {
                try { decode_tokens(piece.data(), want, at, p, nullptr); }
                catch (const InputError&) { std::fclose(f); throw; }
            }
            at += want;
        }
        std::fclose(f);
        if (!ok) input_error("cannot read the tokens of shard %s (truncated?); %s", p, kShardHint);
    }

    // Decodes n little-endian uint16 token ids (the shard's from position `first` on) into out (if given),
    // checking each against the vocab.
    void decode_tokens(const unsigned char* raw, size_t n, size_t first, const char* path, uint16_t* out) const {
        for (size_t i = 0; i < n; i++) {
            const uint16_t t = (uint16_t)(raw[2 * i] | (raw[2 * i + 1] << 8));
            if ((int)t >= vocab_size_)
                input_error("token id %u at position %zu in %s is >= vocab size %d; the shard was not made with the "
                            "GPT-2 tokenizer", (unsigned)t, first + i, path, vocab_size_);
            if (out) out[i] = t;
        }
    }

    // Reads a whole shard into tokens_ and checks every token id against the vocab.
    void load_shard(size_t shard) {
        const ShardInfo& info = shards_[shard];
        const char* p = info.path.c_str();
        // the file could have been replaced since the constructor looked at it
        ShardInfo now = read_shard_header(info.path);
        if (now.num_tokens != info.num_tokens)
            input_error("token shard %s changed while training (%lld tokens, was %lld); restart the run", p,
                        (long long)now.num_tokens, (long long)info.num_tokens);
        have_tokens_ = false;
        std::vector<unsigned char> raw((size_t)info.num_tokens * 2);
        FILE* f = std::fopen(p, "rb");
        if (!f) input_error("cannot open token shard %s: %s", p, std::strerror(errno));
        bool ok = std::fseek(f, (long)kShardHeaderBytes, SEEK_SET) == 0 &&
                  std::fread(raw.data(), 1, raw.size(), f) == raw.size();
        std::fclose(f);
        if (!ok) input_error("cannot read the tokens of shard %s (truncated?); %s", p, kShardHint);
        tokens_.resize((size_t)info.num_tokens);
        decode_tokens(raw.data(), tokens_.size(), 0, p, tokens_.data());
        loaded_shard_ = shard;
        have_tokens_ = true;
    }

    // configuration
    std::string pattern_;
    std::string flag_name_;
    int rank_;
    int processes_;
    int micro_steps_;
    bool shuffle_;
    uint64_t seed_;
    int vocab_size_;
    int64_t local_tokens_ = 0;    // B*T: one process's inputs per batch
    int64_t global_tokens_ = 0;   // D = B*T*P*A: all processes' inputs per optimizer step = one chunk
    // shards
    std::vector<ShardInfo> shards_;
    std::vector<int64_t> shard_chunks_;
    int64_t total_tokens_ = 0;
    int64_t batches_per_epoch_ = 0;
    // position and its derived caches
    DataLoaderState pos_;
    int micro_ = 0;               // micro-step within the current chunk
    std::vector<size_t> shard_order_;
    uint64_t shard_order_epoch_ = 0;
    bool have_shard_order_ = false;
    std::vector<int64_t> chunk_order_;
    uint64_t chunk_order_epoch_ = 0;
    size_t chunk_order_shard_ = 0;
    bool have_chunk_order_ = false;
    std::vector<uint16_t> tokens_;
    size_t loaded_shard_ = 0;
    bool have_tokens_ = false;
};

} // namespace llmc
