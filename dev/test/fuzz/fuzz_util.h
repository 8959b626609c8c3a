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
#include <vector>

namespace fuzz_util {

// The files the harness wrote, removed with the directory when it exits normally (libFuzzer exits after
// -max_total_time or -runs; after a crash they stay behind, under run.sh's directory that it removes).
// (Both live on the heap and are never destroyed: remove_scratch runs at exit, after static objects may be.)
inline std::vector<std::string>& written_files() {
    static std::vector<std::string>* files = new std::vector<std::string>();
    return *files;
}

inline std::string scratch_dir();

inline void remove_scratch() {
    for (const std::string& f : written_files()) std::remove(f.c_str());
    rmdir(scratch_dir().c_str());
}

inline std::string scratch_dir() {
    static const std::string* dir = new std::string([] {
        const char* env = std::getenv("TMPDIR");
        struct stat sb;
        std::string base = env && env[0] ? env : stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
        std::string tmpl = base + "/llmc_fuzz_XXXXXX";
        if (!mkdtemp(&tmpl[0])) {
            std::perror(("fuzz: cannot make a scratch directory under " + base).c_str());
            std::abort();
        }
        std::atexit(remove_scratch);
        return tmpl;
    }());
    return *dir;
}

// Writes the input to NAME in the scratch directory (replacing what an earlier input left) and
// returns its path.
inline std::string write_input(const char* name, const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/" + name;
    bool known = false;
    for (const std::string& f : written_files()) known = known || f == path;
    if (!known) written_files().push_back(path);
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
        std::perror(("fuzz: cannot write " + path).c_str());
        std::abort();
    }
    return path;
}

} // namespace fuzz_util
