// HellaSwag scoring's host side (llmc/hellaswag.h): the packing of examples into batches, the rows and their
// targets, the masked mean, the choice, and the split over processes, with stand-in models whose losses are
// known. (The model's own losses against PyTorch: test_gpt.cu, check hellaswag.)
#include <unistd.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "dev/test/cpu/test_util.h"
#include "llmc/hellaswag.h"

using llmc::EvalBatch;
using llmc::EvalCounts;
using llmc::EvalExample;
using llmc::EvalScore;
using test_util::contains;
using test_util::error_of;

namespace {

EvalExample example(int label, std::vector<uint16_t> context, std::vector<std::vector<uint16_t>> endings) {
    EvalExample ex;
    ex.label = label;
    ex.context = std::move(context);
    ex.endings = std::move(endings);
    return ex;
}

// n examples of four endings of varied lengths; ending e of example i is made of tokens 100 + 10 * e + i % 7 ..,
// so its mean token id ranks the endings, and the label is the ending with the smallest for every third example
std::vector<EvalExample> four_ending_examples(int n) {
    std::vector<EvalExample> out;
    for (int i = 0; i < n; i++) {
        std::vector<uint16_t> ctx((size_t)(1 + i % 5));
        std::iota(ctx.begin(), ctx.end(), (uint16_t)(1000 + i));
        std::vector<std::vector<uint16_t>> endings;
        const int smallest = i % 4;  // the ending of the smallest tokens
        for (int e = 0; e < 4; e++) {
            const int rank = (e - smallest + 4) % 4;
            std::vector<uint16_t> end((size_t)(1 + (i + e) % 3), (uint16_t)(100 + 10 * rank + i % 7));
            endings.push_back(end);
        }
        out.push_back(example(i % 3 == 0 ? smallest : (smallest + 1) % 4, ctx, endings));
    }
    return out;
}

// A stand-in model whose loss at a position is its target token / 100 (so an ending's mean loss is its mean
// token id / 100), plus `batch_noise` times the sum of the batch's inputs (a batch-wide effect, as a recipe that
// scales by the batch's amax has)
struct TokenLossModel {
    int B, T;
    double batch_noise = 0.0;
    int calls = 0;
    void operator()(const int* inputs, const int* targets, float* losses) {
        calls++;
        double sum = 0.0;
        for (int i = 0; i < B * T; i++) sum += inputs[i];
        for (int i = 0; i < B * T; i++) losses[i] = (float)(targets[i] / 100.0 + batch_noise * sum);
    }
};

double mean_token(const std::vector<uint16_t>& toks) {
    double s = 0.0;
    for (uint16_t t : toks) s += t;
    return s / (double)toks.size();
}

} // namespace

TEST_CASE("hellaswag: examples are packed whole, in order, as many as fit in B rows") {
    const std::vector<EvalExample> ex = four_ending_examples(7);
    auto shape = [](const std::vector<EvalBatch>& bs) {
        std::vector<int> counts;
        for (const EvalBatch& b : bs) counts.push_back(b.count);
        return counts;
    };
    // llm.c's packing: B/4 examples a batch, the B % 4 rows left over are padding
    CHECK(shape(llmc::pack_eval_batches(ex, 4)) == std::vector<int>{1, 1, 1, 1, 1, 1, 1});
    CHECK(shape(llmc::pack_eval_batches(ex, 8)) == std::vector<int>{2, 2, 2, 1});
    const std::vector<EvalBatch> b10 = llmc::pack_eval_batches(ex, 10);
    CHECK(shape(b10) == std::vector<int>{2, 2, 2, 1});
    CHECK(b10[0].rows == 8);
    CHECK(b10[3].first == 6);
    CHECK(b10[3].rows == 4);
    CHECK(shape(llmc::pack_eval_batches(ex, 64)) == std::vector<int>{7});
    // examples of other numbers of endings: greedy, never split
    const std::vector<EvalExample> mixed = {example(0, {1}, {{2}, {3}}), example(0, {1}, {{2}, {3}, {4}}),
                                            example(0, {1}, {{2}, {3}, {4}, {5}}), example(1, {1}, {{2}, {3}})};
    const std::vector<EvalBatch> b5 = llmc::pack_eval_batches(mixed, 5);
    CHECK(shape(b5) == std::vector<int>{2, 1, 1});
    CHECK(b5[0].rows == 5);
    CHECK(b5[2].first == 3);
    // fewer rows than an example's endings: one clear error naming -b
    CHECK(contains(error_of([&] { llmc::pack_eval_batches(ex, 3); }),
                   "-h 1: example 0 of the eval file has 4 endings, one row each, but a batch has -b 3 rows; use -b 4 or more"));
}

TEST_CASE("hellaswag: a row is context + ending, its targets the next tokens, padding zero") {
    const std::vector<EvalExample> ex = {example(1, {11, 12, 13}, {{21}, {22, 23}}), example(0, {31}, {{41, 42, 43}, {44}})};
    const int B = 5, T = 6;
    std::vector<int> in((size_t)B * T, -1), tg((size_t)B * T, -1);
    llmc::fill_eval_batch(ex, EvalBatch{0, 2, 4}, B, T, in.data(), tg.data());
    const std::vector<int> want_in = {11, 12, 13, 21, 0, 0,
                                      11, 12, 13, 22, 23, 0,
                                      31, 41, 42, 43, 0, 0,
                                      31, 44, 0, 0, 0, 0,
                                      0, 0, 0, 0, 0, 0};
    const std::vector<int> want_tg = {12, 13, 21, 0, 0, 0,
                                      12, 13, 22, 23, 0, 0,
                                      41, 42, 43, 0, 0, 0,
                                      44, 0, 0, 0, 0, 0,
                                      0, 0, 0, 0, 0, 0};
    CHECK(in == want_in);
    CHECK(tg == want_tg);
    // a context and an ending that fill T exactly: the last input is the ending's last token, its last target
    // (position T-2) too
    const std::vector<EvalExample> full = {example(0, {1, 2, 3}, {{4, 5, 6}, {7}})};
    llmc::fill_eval_batch(full, EvalBatch{0, 1, 2}, 2, 6, in.data(), tg.data());
    CHECK(in[5] == 6);
    CHECK(tg[4] == 6);
    CHECK(tg[5] == 0);
}

TEST_CASE("hellaswag: an ending's score is the mean loss at the positions that predict its tokens") {
    // losses 0, 1, 2, ...: context of 3 and ending of 2 -> positions 2 and 3
    std::vector<float> row(10);
    std::iota(row.begin(), row.end(), 0.0f);
    CHECK(llmc::ending_mean_loss(row.data(), 3, 2) == doctest::Approx(2.5));
    CHECK(llmc::ending_mean_loss(row.data(), 1, 1) == 0.0);
    CHECK(llmc::ending_mean_loss(row.data(), 4, 6) == doctest::Approx(5.5));
    // the choice: the lowest mean, the first of equal ones
    CHECK(llmc::choose_ending({3.0, 1.5, 2.0, 1.5}) == 1);
    CHECK(llmc::choose_ending({0.5, 1.0}) == 0);
    CHECK(llmc::choose_ending({2.0, 2.0, 2.0, 1.0}) == 3);
}

TEST_CASE("hellaswag: scores and counts of a stand-in model with known losses") {
    const std::vector<EvalExample> ex = four_ending_examples(23);
    for (int B : {4, 6, 8, 13, 64}) {
        CAPTURE(B);
        const int T = 16;
        const std::vector<EvalBatch> batches = llmc::pack_eval_batches(ex, B);
        TokenLossModel model{B, T};
        std::vector<EvalScore> scores;
        const EvalCounts counts = llmc::score_eval_examples(ex, batches, B, T, 0, 1, model, &scores);
        CHECK(model.calls == (int)batches.size());
        CHECK(counts.examples == 23);
        int64_t correct = 0;
        for (size_t i = 0; i < ex.size(); i++) {
            CAPTURE(i);
            REQUIRE(scores[i].ending_loss.size() == 4);
            for (size_t e = 0; e < 4; e++) CHECK(scores[i].ending_loss[e] == doctest::Approx(mean_token(ex[i].endings[e]) / 100.0));
            CHECK(scores[i].choice == (int)(i % 4));  // the ending of the smallest tokens
            correct += (int)(i % 4) == ex[i].label;
        }
        CHECK(counts.correct == correct);
        CHECK(correct == 8);  // examples 0, 3, ..., 21 have that ending as their label
    }
}

TEST_CASE("hellaswag: every number of processes scores each example once, with the same losses") {
    const std::vector<EvalExample> ex = four_ending_examples(37);
    const int B = 8, T = 12;
    const std::vector<EvalBatch> batches = llmc::pack_eval_batches(ex, B);
    // the stand-in's losses depend on the whole batch: only the same batches give the same losses
    TokenLossModel one{B, T, 1e-4};
    std::vector<EvalScore> whole;
    const EvalCounts all = llmc::score_eval_examples(ex, batches, B, T, 0, 1, one, &whole);
    for (int world : {2, 3, 8, 25}) {
        CAPTURE(world);
        EvalCounts sum;
        std::vector<int> times_scored(ex.size(), 0);
        bool same = true;
        for (int rank = 0; rank < world; rank++) {
            TokenLossModel model{B, T, 1e-4};
            std::vector<EvalScore> mine;
            const EvalCounts c = llmc::score_eval_examples(ex, batches, B, T, rank, world, model, &mine);
            sum.correct += c.correct;
            sum.examples += c.examples;
            for (size_t i = 0; i < ex.size(); i++) {
                if (mine[i].ending_loss.empty()) continue;
                times_scored[i]++;
                same = same && mine[i].ending_loss == whole[i].ending_loss && mine[i].choice == whole[i].choice;
            }
        }
        CHECK(sum.examples == all.examples);
        CHECK(sum.correct == all.correct);
        CHECK(same);
        CHECK(std::all_of(times_scored.begin(), times_scored.end(), [](int n) { return n == 1; }));
    }
}

TEST_CASE("hellaswag: load_hellaswag refuses a bad file or -b before the GPU, naming -h 1 and -hf") {
    char tmpl[] = "/tmp/llmc_hellaswag_XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    const std::string path = tmpl;
    // one example, context {5}, endings {6} {7, 8}, label 1, as the format defines it
    const std::vector<uint16_t> run = {65535, 2 * 12, 0, 1, 2, 1, 5, 1, 6, 2, 7, 8};
    auto write = [&](int32_t magic) {
        std::vector<int32_t> header(256, 0);
        header[0] = magic; header[1] = 1; header[2] = 1; header[3] = 2 * (int32_t)run.size();
        FILE* f = std::fopen(path.c_str(), "wb");
        REQUIRE(f);
        std::fwrite(header.data(), 4, header.size(), f);
        std::fwrite(run.data(), 2, run.size(), f);
        std::fclose(f);
    };
    std::vector<EvalBatch> batches;
    write(20240522);
    const std::vector<EvalExample> ex = llmc::load_hellaswag(path, 50257, 8, 4, &batches);
    REQUIRE(ex.size() == 1);
    CHECK(ex[0].endings[1] == std::vector<uint16_t>{7, 8});
    CHECK(batches.size() == 1);
    const std::string bad_b = error_of([&] { llmc::load_hellaswag(path, 50257, 8, 1, &batches); });
    CHECK(contains(bad_b, "-h 1: example 0 of the eval file has 2 endings"));
    const std::string long_ex = error_of([&] { llmc::load_hellaswag(path, 50257, 2, 4, &batches); });
    CHECK(contains(long_ex, "-h 1: eval file " + path + ", example 0: its context and ending 1 are 3 tokens, longer than -t 2"));
    CHECK(contains(long_ex, "(-hf names the file)"));
    write(12345);
    CHECK(contains(error_of([&] { llmc::load_hellaswag(path, 50257, 8, 4, &batches); }), "-h 1: " + path + " is not an eval file"));
    unlink(path.c_str());
    CHECK(contains(error_of([&] { llmc::load_hellaswag(path, 50257, 8, 4, &batches); }), "-h 1: cannot open eval file " + path));
}
