// tokenizer.h: decodes GPT-2 token ids to text, for printing samples.
//
// Reads llm.c's tokenizer file (written by dev/data/tinyshakespeare.py as dev/data/gpt2_tokenizer.bin):
//   256 uint32 header (little-endian): [0] magic 20240328, [1] version 1 or 2, [2] vocab size V,
//                                      [3] end-of-text token id (version 2 only; version 1 means 50256)
//   then for each token id 0 .. V-1 in order: one uint8 length L (> 0) followed by L raw bytes.
// A token's bytes are a piece of UTF-8 text, not always a whole character: byte-level BPE can split
// one multi-byte character over two tokens. Concatenating the pieces of a sequence gives the text.
// Encoding is not needed on the GPU side (the data scripts tokenize with tiktoken), so only
// decoding lives here.
#pragma once
#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>
#include "common.h"

namespace llmc {

constexpr uint32_t kTokenizerMagic = 20240328;
constexpr uint32_t kTokenizerHeaderBytes = 256 * 4;
constexpr const char* kTokenizerHint = "make it with dev/data/tinyshakespeare.py";
// The largest tokenizer file load() reads. GPT-2's is under 1 MB; the cap keeps a wrong -tk (a
// dataset, a device such as /dev/zero) from being read into memory whole.
constexpr size_t kTokenizerMaxBytes = 64u << 20;

class Tokenizer {
public:
    // Loads and checks a tokenizer file. Throws InputError naming the file, and nothing else (the
    // trainer turns it into a warning and prints token ids); on error the tokenizer keeps whatever it
    // had before. Every allocation is bounded by the file's size, itself at most kTokenizerMaxBytes.
    void load(const std::string& path) {
        try {
            load_checked(path);
        } catch (const std::bad_alloc&) {
            input_error("not enough memory to load tokenizer file %s", path.c_str());
        }
    }

    bool loaded() const { return loaded_; }
    uint32_t vocab_size() const { return (uint32_t)pieces_.size(); }
    uint32_t eot_token() const { return eot_; }

    // The raw bytes of token `id`; "<?>" for an id outside the vocab (e.g. a padded-vocab logit
    // that was sampled, or decoding before load()).
    const std::string& decode(uint32_t id) const {
        static const std::string unknown = "<?>";
        if (id >= pieces_.size()) return unknown;
        return pieces_[id];
    }

private:
    void load_checked(const std::string& path) {
        const char* p = path.c_str();
        std::vector<unsigned char> buf;
        read_whole_file(path, &buf);
        if (buf.size() < kTokenizerHeaderBytes)
            input_error("tokenizer file %s is %zu bytes, shorter than its %u-byte header; %s", p, buf.size(),
                        kTokenizerHeaderBytes, kTokenizerHint);
        const uint32_t magic = le_u32(&buf[0]);
        const uint32_t version = le_u32(&buf[4]);
        const uint32_t vocab = le_u32(&buf[8]);
        if (magic != kTokenizerMagic)
            input_error("%s is not a GPT-2 tokenizer file (magic %u, expected %u); %s", p, magic, kTokenizerMagic,
                        kTokenizerHint);
        if (version != 1 && version != 2)
            input_error("tokenizer file %s has version %u, expected 1 or 2; %s", p, version, kTokenizerHint);
        if (vocab == 0) input_error("tokenizer file %s has vocab size 0; the file is corrupt; %s", p, kTokenizerHint);
        // version 1 files predate the EOT field; GPT-2's <|endoftext|> is id 50256
        const uint32_t eot = version == 2 ? le_u32(&buf[12]) : 50256u;
        if (eot >= vocab)
            input_error("tokenizer file %s: end-of-text id %u is not below its vocab size %u; the file is corrupt; %s", p,
                        eot, vocab, kTokenizerHint);
        // The header's vocab is not trusted for sizing: each token takes at least 2 bytes (its length and
        // one byte), so the file holds at most body/2 of them and the loop below stops with an error
        // (truncated, or a length 0) before it pushes more. A huge claimed vocab reserves no more.
        const size_t body_bytes = buf.size() - kTokenizerHeaderBytes;
        std::vector<std::string> pieces;
        pieces.reserve(std::min<size_t>(vocab, body_bytes / 2));
        size_t at = kTokenizerHeaderBytes;
        for (uint32_t id = 0; id < vocab; id++) {
            if (at >= buf.size())
                input_error("tokenizer file %s is truncated: it ends before token %u of %u; %s", p, id, vocab,
                            kTokenizerHint);
            const size_t len = buf[at++];
            if (len == 0)
                input_error("tokenizer file %s: token %u has length 0; the file is corrupt; %s", p, id, kTokenizerHint);
            if (at + len > buf.size())
                input_error("tokenizer file %s is truncated: token %u of %u needs %zu bytes, %zu are left; %s", p, id,
                            vocab, len, buf.size() - at, kTokenizerHint);
            pieces.push_back(std::string((const char*)&buf[at], len));
            at += len;
        }
        if (at != buf.size())
            input_error("tokenizer file %s has %zu bytes after its last token; the file is corrupt; %s", p,
                        buf.size() - at, kTokenizerHint);
        // commit only after everything checked out
        pieces_.swap(pieces);
        eot_ = eot;
        loaded_ = true;
    }

    static uint32_t le_u32(const unsigned char* b) {
        return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
    }

    // Reads a regular file of at most kTokenizerMaxBytes. A directory, device or pipe is refused before
    // it is opened (opening a pipe could block, reading /dev/zero never ends).
    static void read_whole_file(const std::string& path, std::vector<unsigned char>* out) {
        const char* p = path.c_str();
        struct stat sb;
        if (stat(p, &sb) != 0)
            input_error("cannot open tokenizer file %s: %s; %s (or pass -tk)", p, std::strerror(errno), kTokenizerHint);
        if (!S_ISREG(sb.st_mode))
            input_error("tokenizer file %s is not a regular file (a directory or device?); %s (or pass -tk)", p,
                        kTokenizerHint);
        if ((unsigned long long)sb.st_size > kTokenizerMaxBytes)
            input_error("tokenizer file %s is %lld bytes, more than the %zu a tokenizer file may have; is -tk the right "
                        "file? %s", p, (long long)sb.st_size, kTokenizerMaxBytes, kTokenizerHint);
        FILE* f = std::fopen(p, "rb");
        if (!f) input_error("cannot open tokenizer file %s: %s; %s (or pass -tk)", p, std::strerror(errno), kTokenizerHint);
        unsigned char block[65536];
        size_t n;
        // (the cap holds even for a file that grows while it is read)
        while (out->size() <= kTokenizerMaxBytes && (n = std::fread(block, 1, sizeof(block), f)) > 0)
            out->insert(out->end(), block, block + n);
        bool err = std::ferror(f) != 0;
        std::fclose(f);
        if (err) input_error("cannot read tokenizer file %s: %s; %s", p, std::strerror(errno), kTokenizerHint);
        if (out->size() > kTokenizerMaxBytes)
            input_error("tokenizer file %s grew past %zu bytes while it was read; %s", p, kTokenizerMaxBytes,
                        kTokenizerHint);
    }

    std::vector<std::string> pieces_;
    uint32_t eot_ = 50256;
    bool loaded_ = false;
};

// Makes a decoded piece safe to print to a terminal: control bytes (0x00-0x1f except '\n' and
// '\t', and 0x7f) become "\xNN" so a sampled token cannot move the cursor, clear the screen or
// ring the bell. Bytes >= 0x80 pass through untouched: they are UTF-8, and a character split over
// two tokens reassembles when the pieces are printed one after the other.
inline std::string printable(const std::string& piece) {
    static const char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(piece.size());
    for (size_t i = 0; i < piece.size(); i++) {
        const unsigned char c = (unsigned char)piece[i];
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else {
            out += (char)c;
        }
    }
    return out;
}

} // namespace llmc
