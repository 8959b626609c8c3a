// fuzz_model_header.cpp: read_model_header (llmc/checkpoint.h), the check of an llm.c model file given
// with -e, on arbitrary bytes. A header it accepts must describe a file whose size matches exactly.
#include "llmc/checkpoint.h"
#include "dev/test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzz_util::write_input("model.bin", data, size);
    try {
        llmc::ModelFileInfo info = llmc::read_model_header(path);
        const size_t bytes = llmc::num_parameters(info.shape) * (info.version == llmc::kModelVersionFp32 ? 4 : 2);
        if (llmc::kModelHeaderBytes + bytes != size) std::abort(); // accepted a file of the wrong size
    } catch (const llmc::InputError&) {
    }
    return 0;
}
