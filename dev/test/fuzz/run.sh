#!/usr/bin/env bash
# run.sh [SECONDS]: builds the libFuzzer harnesses (make fuzz) and runs each for SECONDS (default 60) on a
# scratch copy of its seed corpus, dev/test/fuzz/corpus/<name>/ (what libFuzzer adds to the copy is thrown
# away; the repository's corpus is never written). Prints, per harness, the executions and "0 findings" or
# the path of the input that crashed it (kept under build/fuzz/findings/<name>/); exits 1 on any finding,
# and when clang++ with libFuzzer is missing. FUZZ_CXX picks the compiler (default clang++).
# Reproduce a finding: build/fuzz/fuzz_<name> build/fuzz/findings/<name>/crash-...
set -u
cd "$(dirname "$0")/../../.."
per_harness=${1:-60}
if ! [[ "$per_harness" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: bash dev/test/fuzz/run.sh [SECONDS per harness, default 60]" >&2
    exit 2
fi
cxx=${FUZZ_CXX:-clang++}
work=$(mktemp -d "${TMPDIR:-/tmp}/llmc_fuzz_run_XXXXXX") || exit 1
# the harnesses write each input to a file: in memory (/dev/shm) where there is one, it is many times faster
scratch=$work
[[ -d /dev/shm && -w /dev/shm ]] && scratch=$(mktemp -d /dev/shm/llmc_fuzz_run_XXXXXX)
trap 'rm -rf "$work" "$scratch"' EXIT

# libFuzzer comes with clang (the compiler-rt runtime): probe for it with a one-line harness
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$work/probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$work/probe.cpp" -o "$work/probe" > "$work/probe.log" 2>&1; then
    echo "fuzz: $cxx with libFuzzer is missing ($(head -n 1 "$work/probe.log")); install clang (Debian: apt-get install clang libclang-rt-dev)"
    exit 1
fi
echo "== building the fuzz harnesses (make fuzz)"
if ! make --no-print-directory FUZZ_CXX="$cxx" fuzz > "$work/build.log" 2>&1; then
    tail -n 30 "$work/build.log"
    echo "fuzz: make fuzz failed"
    exit 1
fi

findings=0
for src in dev/test/fuzz/fuzz_*.cpp; do
    name=$(basename "$src" .cpp); name=${name#fuzz_}
    bin=build/fuzz/fuzz_$name
    corpus=$work/corpus/$name
    found=build/fuzz/findings/$name
    mkdir -p "$corpus" "$found" "$scratch/tmp_$name"
    [[ -d dev/test/fuzz/corpus/$name ]] && cp dev/test/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null
    touch "$work/start_$name"
    # -timeout: one input taking 10 s is a finding (a hang); -rss_limit_mb: so is using 2 GB
    TMPDIR="$scratch/tmp_$name" "$bin" -max_total_time="$per_harness" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$found/" "$corpus" > "$work/$name.log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$name.log" | grep -o '[0-9]*$' | tail -n 1)
    # the inputs libFuzzer saved in this run (crash-, leak-, timeout-, oom-<sha1>; the same input again overwrites)
    new=$(find "$found" -maxdepth 1 -type f -newer "$work/start_$name" ! -name '*.log' | sort)
    if [[ $rc -eq 0 && -z "$new" ]]; then
        printf '%-14s %10s executions in %ss, 0 findings\n' "$name" "${execs:-?}" "$per_harness"
    else
        findings=$((findings + 1))
        printf '%-14s %10s executions, FINDING (exit %d): %s\n' "$name" "${execs:-?}" "$rc" \
            "$(echo $new)"
        grep -m 3 -E 'ERROR|runtime error|deadly signal|uncaught|Timeout|out-of-memory' "$work/$name.log" | sed 's/^/    /'
        cp "$work/$name.log" "$found/$name.log" && echo "    full log: $found/$name.log"
    fi
done
echo "fuzz: $findings harness(es) with findings"
[[ $findings -eq 0 ]]
