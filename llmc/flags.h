// flags.h: a row of the trainer's flag table (no CUDA). cli.h holds the rows of the trainer's own flags; a
// recipe's options header (llmc/recipes/<name>/options.h) appends the rows of its flags, which point into
// the recipe's options struct. The parser and -h walk the rows, so a flag cannot be parsed without being
// documented, and -h prints each default from the field the row points to.
#pragma once
#include <vector>

namespace llmc {

enum class FlagKind { Str, Int, Int64, Float, U64 };

struct Flag {
    const char* name; // "-fh"
    FlagKind kind;    // the target's type: std::string, int, long long, float, uint64_t
    void* target;     // the field this flag writes
    const char* help;
};

using FlagTable = std::vector<Flag>;

} // namespace llmc
