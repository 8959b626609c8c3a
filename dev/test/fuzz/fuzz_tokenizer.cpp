// fuzz_tokenizer.cpp: Tokenizer::load (llmc/tokenizer.h) on arbitrary bytes as the -tk file. A loaded
// tokenizer must also decode every id without reading outside its pieces.
#include "llmc/tokenizer.h"
#include "dev/test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz_util::write_input("tokenizer.bin", data, size);
    llmc::Tokenizer tok;
    try {
        tok.load(path);
    } catch (const llmc::InputError&) {
        return 0;
    }
    size_t total = 0;
    for (uint32_t id = 0; id <= tok.vocab_size(); id++) total += llmc::printable(tok.decode(id)).size();
    if (tok.eot_token() >= tok.vocab_size() || total == 0) std::abort(); // a loaded file has pieces and a valid EOT
    return 0;
}
