// fuzz_util.h: what the libFuzzer harnesses share. Each harness feeds arbitrary bytes to one host-side
// parser and catches llmc::InputError, the parser's intended way to refuse; anything else (another
// exception, an abort, a sanitizer report, a timeout) reaches libFuzzer and is a finding.
//
// The parsers read files, so the bytes are written to a file first, in a scratch directory of this
// process: under $TMPDIR when set (run.sh points it at a directory it removes afterwards), else
// /dev/shm (memory, no disk writes), else /tmp.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fuzz_util {

inline std::string scratch_dir() {
    static const std::string dir = [] {
        const char* env = std::getenv("TMPDIR");
        struct stat sb;
        std::string base = env && env[0] ? env : stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
        std::string tmpl = base + "/llmc_fuzz_XXXXXX";
        if (!mkdtemp(&tmpl[0])) {
            std::perror(("fuzz: cannot make a scratch directory under " + base).c_str());
            std::abort();
        }
        return tmpl;
    }();
    return dir;
}

// Writes the input to NAME in the scratch directory (replacing what an earlier input left) and
// returns its path.
inline std::string write_input(const char* name, const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
        std::perror(("fuzz: cannot write " + path).c_str());
        std::abort();
    }
    return path;
}

} // namespace fuzz_util
