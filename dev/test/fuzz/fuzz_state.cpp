// fuzz_state.cpp: StateReader::open (llmc/checkpoint.h), the reader of a checkpoint's state file, on
// arbitrary bytes. Random bytes almost never pass the checksum, which is checked before the section
// table is parsed, so the first input byte picks a mode:
//   even: the rest of the input is the file, as it is;
//   odd:  the rest of the input is the file with its last 8 bytes replaced by the checksum the file's
//         version asks for (XXH64 for version 2, FNV-1a for version 1), so the section table behind
//         the checksum is fuzzed too.
// Every section of a file that opens must then read back whole.
#include <cstring>
#include <vector>

#include "llmc/checkpoint.h"
#include "dev/test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    std::vector<uint8_t> file(data + 1, data + size);
    if ((data[0] & 1) && file.size() >= 16) {
        uint32_t version;
        std::memcpy(&version, &file[4], 4);
        const size_t body = file.size() - 8;
        const uint64_t sum = version == llmc::kStateVersionFnv
                                 ? llmc::ckpt_detail::fnv1a(llmc::ckpt_detail::kFnvOffset, file.data(), body)
                                 : llmc::ckpt_detail::xxh64(file.data(), body);
        std::memcpy(&file[body], &sum, 8);
    }
    const std::string path = fuzz_util::write_input("state.bin", file.data(), file.size());
    try {
        llmc::StateReader reader;
        reader.open(path);
        size_t total = 0;
        for (const std::string& name : reader.section_names()) {
            std::vector<unsigned char> bytes(reader.size_of(name));
            reader.read(name, bytes.data(), bytes.size());
            total += bytes.size();
        }
        if (total > file.size()) std::abort(); // sections claim more bytes than the file has
    } catch (const llmc::InputError&) {
    }
    return 0;
}
