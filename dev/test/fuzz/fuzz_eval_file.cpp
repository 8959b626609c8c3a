// fuzz_eval_file.cpp: read_eval_file (llmc/eval_file.h), the check of a multiple-choice eval file (HellaSwag),
// on arbitrary bytes. What it accepts must be what the reader promises: labels among the endings, no empty
// context or ending, every token id below the vocabulary, every context + ending within T. What it accepts is
// then packed and scored as the trainer's -h 1 does (llmc/hellaswag.h, a stand-in model): every example in
// exactly one batch, no row beyond B, every ending scored.
#include "llmc/eval_file.h"
#include "llmc/hellaswag.h"
#include "dev/test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz_util::write_input("eval.bin", data, size);
    constexpr int kVocab = 50257, kT = 64;
    try {
        const std::vector<llmc::EvalExample> examples = llmc::read_eval_file(path, kVocab, kT);
        for (const llmc::EvalExample& ex : examples) {
            if (ex.label < 0 || ex.label >= (int)ex.endings.size() || ex.context.empty()) std::abort();
            for (const auto& e : ex.endings) {
                if (e.empty() || ex.context.size() + e.size() > (size_t)kT) std::abort();
                for (uint16_t t : e) if (t >= kVocab) std::abort();
            }
            for (uint16_t t : ex.context) if (t >= kVocab) std::abort();
        }
        constexpr int kB = 16;  // (read_eval_file allows up to 16 endings, so every example fits a batch)
        const std::vector<llmc::EvalBatch> batches = llmc::pack_eval_batches(examples, kB);
        size_t next = 0;
        for (const llmc::EvalBatch& b : batches) {
            if (b.first != (int)next || b.count < 1 || b.rows > kB) std::abort();
            next += (size_t)b.count;
        }
        if (next != examples.size()) std::abort();
        size_t endings = 0;
        auto forward = [&](const int* inputs, const int* targets, float* losses) {
            for (int i = 0; i < kB * kT; i++) {
                if (inputs[i] < 0 || inputs[i] >= kVocab || targets[i] < 0 || targets[i] >= kVocab) std::abort();
                losses[i] = (float)targets[i];
            }
        };
        std::vector<llmc::EvalScore> scores;
        const llmc::EvalCounts counts = llmc::score_eval_examples(examples, batches, kB, kT, 0, 1, forward, &scores);
        for (const llmc::EvalScore& sc : scores) endings += sc.ending_loss.size();
        size_t want = 0;
        for (const llmc::EvalExample& ex : examples) want += ex.endings.size();
        if (counts.examples != (int64_t)examples.size() || endings != want) std::abort();
    } catch (const llmc::InputError&) {
    }
    return 0;
}
