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
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "common.h"

namespace llmc {

constexpr uint32_t kTokenizerMagic = 20240328;
constexpr uint32_t kTokenizerHeaderBytes = 256 * 4;
constexpr const char* kTokenizerHint = "make it with dev/data/tinyshakespeare.py";

class Tokenizer {
public:
    // Loads and checks a tokenizer file. Throws InputError naming the file; on error the tokenizer
    // keeps whatever it had before.
    void load(const std::string& path) {
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
        std::vector<std::string> pieces;
        pieces.reserve(vocab);
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
    static uint32_t le_u32(const unsigned char* b) {
        return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
    }

    static void read_whole_file(const std::string& path, std::vector<unsigned char>* out) {
        FILE* f = std::fopen(path.c_str(), "rb");
        if (!f) input_error("cannot open tokenizer file %s: %s; %s (or pass -tk)", path.c_str(), std::strerror(errno), kTokenizerHint);
        unsigned char block[65536];
        size_t n;
        while ((n = std::fread(block, 1, sizeof(block), f)) > 0) out->insert(out->end(), block, block + n);
        bool err = std::ferror(f) != 0;
        std::fclose(f);
        if (err) input_error("cannot read tokenizer file %s (is it a directory?); %s", path.c_str(), kTokenizerHint);
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
