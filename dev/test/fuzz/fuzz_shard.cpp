// fuzz_shard.cpp: the token shard reader (llmc/dataloader.h) on arbitrary bytes as the one shard of -i:
// its header check (read_shard_header) and the token check of the first load, then a few batches, as
// the trainer's DataLoader does. The micro-batch shape varies with the input's size so that short and
// long shards both get past the "fewer than one batch" check: B in 1..2, T in 1..4, 1..2 processes,
// 1..2 micro-steps. Every batch must hold token ids below the vocab.
#include <vector>

#include "llmc/dataloader.h"
#include "dev/test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz_util::write_input("shard.bin", data, size);
    const int B = 1 + (int)(size % 2), T = 1 + (int)(size / 2 % 4);
    const int processes = 1 + (int)(size / 8 % 2), micro_steps = 1 + (int)(size / 16 % 2);
    const int vocab = 50257;
    try {
        llmc::DataLoader loader(path, "-i", B, T, processes - 1, processes, size % 3 == 0, /*seed=*/size, vocab,
                                micro_steps);
        std::vector<int32_t> inputs((size_t)B * T), targets((size_t)B * T);
        for (int step = 0; step < 3 * micro_steps; step++) {
            loader.next_batch(inputs.data(), targets.data());
            for (size_t i = 0; i < inputs.size(); i++)
                if (inputs[i] < 0 || inputs[i] >= vocab || targets[i] < 0 || targets[i] >= vocab) std::abort();
        }
        loader.restore(loader.state());
    } catch (const llmc::InputError&) {
    }
    return 0;
}
