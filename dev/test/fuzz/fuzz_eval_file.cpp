// fuzz_eval_file.cpp: read_eval_file (llmc/eval_file.h), the check of a multiple-choice eval file (HellaSwag),
// on arbitrary bytes. What it accepts must be what the reader promises: labels among the endings, no empty
// context or ending, every token id below the vocabulary, every context + ending within T.
#include "llmc/eval_file.h"
#include "dev/test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz_util::write_input("eval.bin", data, size);
    constexpr int kVocab = 50257, kT = 64;
    try {
        for (const llmc::EvalExample& ex : llmc::read_eval_file(path, kVocab, kT)) {
            if (ex.label < 0 || ex.label >= (int)ex.endings.size() || ex.context.empty()) std::abort();
            for (const auto& e : ex.endings) {
                if (e.empty() || ex.context.size() + e.size() > (size_t)kT) std::abort();
                for (uint16_t t : e) if (t >= kVocab) std::abort();
            }
            for (uint16_t t : ex.context) if (t >= kVocab) std::abort();
        }
    } catch (const llmc::InputError&) {
    }
    return 0;
}
