// hellaswag.h: multiple-choice evaluation (HellaSwag, -h 1) of a model through its forward pass, as llm.c
// scores it: the examples of an eval file (eval_file.h) packed into batches of B rows, one row per ending, and
// each ending scored by the mean cross-entropy of its tokens given the context (acc_norm, as llm.c and
// lm-evaluation-harness report HellaSwag). Host only: the model is a function that fills the per-position
// losses of a batch (train_gpt.cu: gpt_forward_token_losses), so the packing, the masks, the choice and the
// split over processes are tested on the CPU (dev/test/cpu/test_hellaswag.cpp) and the whole against the
// PyTorch reference (test_gpt.cu, check hellaswag).
//
// A row of the batch, for an ending of an example with context c[0..n) and ending e[0..m):
//   inputs   c0 c1 ... c(n-1) e0 e1 ... e(m-1) 0 0 ...          (n + m <= T, checked when the file is read)
//   targets  c1 ...   e0      e1 ...   e(m-1)  0 0 ...
// position t predicts token t+1, so the ending's tokens are the targets of positions n-1 .. n+m-2, and its
// score is the mean of the losses there. The model is causal: the padding after n + m never reaches those
// positions, and a row never sees another row.
//
// Packing. Examples go into batches in file order, as many whole examples as fit in B rows: with HellaSwag's
// four endings, B/4 examples a batch (llm.c's packing), the B % 4 rows left over are padding (all zeros) and
// -b must be at least 4 (the most endings of any example: an example never straddles two batches).
// Processes. The batches are the same whatever the number of processes; process r scores batches
// r, r + P, r + 2P, ... and the counts of correct answers are summed over the processes. An example's losses
// depend only on its batch (a recipe may scale a tensor by the whole batch's amax), so every example gets the
// same losses and the same choice under any number of processes (given the same GEMM algorithms: -ga 0, or
// the ones -ga 1 timed alike on every GPU).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "eval_file.h"

namespace llmc {

// Examples [first, first + count) of the file, their endings in order on rows 0, 1, ...
struct EvalBatch {
    int first = 0;
    int count = 0;
    int rows = 0;  // endings in the batch (rows rows .. B-1 are padding)
};

// What one process found: examples scored and how many were right
struct EvalCounts {
    int64_t correct = 0;
    int64_t examples = 0;
};

// One example as this process scored it (ending_loss empty: another process's example)
struct EvalScore {
    std::vector<double> ending_loss;  // mean cross-entropy of each ending's tokens
    int choice = -1;                  // the ending of the lowest mean loss
};

// Packs the examples into batches of B rows (see the top). Throws InputError when an example has more
// endings than B rows.
inline std::vector<EvalBatch> pack_eval_batches(const std::vector<EvalExample>& examples, int B) {
    std::vector<EvalBatch> batches;
    for (size_t i = 0; i < examples.size(); i++) {
        const int endings = (int)examples[i].endings.size();
        if (endings > B)
            input_error("-h 1: example %zu of the eval file has %d endings, one row each, but a batch has -b %d rows; "
                        "use -b %d or more", i, endings, B, endings);
        if (batches.empty() || batches.back().rows + endings > B) batches.push_back(EvalBatch{(int)i, 0, 0});
        batches.back().count++;
        batches.back().rows += endings;
    }
    return batches;
}

// Fills the B*T inputs and targets of a batch (the rows above; padding is token 0).
inline void fill_eval_batch(const std::vector<EvalExample>& examples, const EvalBatch& batch, int B, int T,
                            int* inputs, int* targets) {
    std::fill(inputs, inputs + (size_t)B * T, 0);
    std::fill(targets, targets + (size_t)B * T, 0);
    int row = 0;
    for (int i = batch.first; i < batch.first + batch.count; i++) {
        const EvalExample& ex = examples[(size_t)i];
        for (const std::vector<uint16_t>& ending : ex.endings) {
            int* in = inputs + (size_t)row * T;
            int* tg = targets + (size_t)row * T;
            const size_t n = ex.context.size(), m = ending.size();
            for (size_t t = 0; t < n; t++) in[t] = ex.context[t];
            for (size_t t = 0; t < m; t++) in[n + t] = ending[t];
            for (size_t t = 0; t + 1 < n + m; t++) tg[t] = in[t + 1];
            row++;
        }
    }
}

// The mean of a row's losses at the positions that predict the ending's tokens: n-1 .. n+m-2 (see the top).
inline double ending_mean_loss(const float* row_losses, size_t context_len, size_t ending_len) {
    double sum = 0.0;
    for (size_t t = 0; t < ending_len; t++) sum += (double)row_losses[context_len - 1 + t];
    return sum / (double)ending_len;
}

// The ending of the lowest mean loss; the first of equal ones (as llm.c)
inline int choose_ending(const std::vector<double>& ending_loss) {
    int best = 0;
    for (int e = 1; e < (int)ending_loss.size(); e++)
        if (ending_loss[(size_t)e] < ending_loss[(size_t)best]) best = e;
    return best;
}

// Scores this process's share of the batches (batch k belongs to process k % world). forward(inputs,
// targets, losses) runs the model on a B*T batch and fills losses[B*T] with the cross-entropy of each
// position's target. scores, when given, gets one entry per example of the file (filled for this process's).
template <class Forward>
inline EvalCounts score_eval_examples(const std::vector<EvalExample>& examples, const std::vector<EvalBatch>& batches,
                                      int B, int T, int rank, int world, Forward&& forward,
                                      std::vector<EvalScore>* scores = nullptr) {
    EvalCounts counts;
    if (scores) scores->assign(examples.size(), EvalScore());
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    std::vector<float> losses((size_t)B * T);
    for (size_t k = (size_t)rank; k < batches.size(); k += (size_t)world) {
        const EvalBatch& batch = batches[k];
        fill_eval_batch(examples, batch, B, T, inputs.data(), targets.data());
        forward(inputs.data(), targets.data(), losses.data());
        int row = 0;
        for (int i = batch.first; i < batch.first + batch.count; i++) {
            const EvalExample& ex = examples[(size_t)i];
            EvalScore score;
            for (const std::vector<uint16_t>& ending : ex.endings)
                score.ending_loss.push_back(ending_mean_loss(losses.data() + (size_t)row++ * T, ex.context.size(), ending.size()));
            score.choice = choose_ending(score.ending_loss);
            counts.examples++;
            counts.correct += score.choice == ex.label;
            if (scores) (*scores)[(size_t)i] = std::move(score);
        }
    }
    return counts;
}

// The trainer's check of -h 1 before the GPU: the file read and validated (eval_file.h) and packed for -b.
inline std::vector<EvalExample> load_hellaswag(const std::string& path, int vocab_size, int T, int B,
                                               std::vector<EvalBatch>* batches) {
    std::vector<EvalExample> examples;
    try {
        examples = read_eval_file(path, vocab_size, T);
    } catch (const InputError& e) {
        input_error("-h 1: %s (-hf names the file)", e.what());
    }
    *batches = pack_eval_batches(examples, B);
    return examples;
}

} // namespace llmc
