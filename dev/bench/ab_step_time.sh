#!/usr/bin/env bash
# ab_step_time.sh: two builds of a trainer, A (before a change) and B (after), timed on one GPU in
# alternation (A, B, A, B per size), so that clock and thermal drift land on both alike. Each run trains
# on a synthetic shard of uniform random tokens with the trainer's defaults and prints the trainer's
# "average step" line (the mean over all steps but the first, which holds the GEMM autotuning).
#   usage: bash dev/bench/ab_step_time.sh A_BINARY B_BINARY "SIZE:B:T:STEPS ..." [ROUNDS]
#   e.g.   bash dev/bench/ab_step_time.sh old/train_gpt_bf16 ./train_gpt_bf16 "d24:64:1024:6 gpt3:c768:64:2048:8" 2
# Total batch 524,288 tokens (the speed protocol's). Logs in $AB_LOGS (default /tmp/ab_logs), one per run.
# This is for a quick before/after; the protocol's numbers against the peer come from dev/bench/bench.py.
set -u -o pipefail
if [[ $# -lt 3 || ! -x "$1" || ! -x "$2" ]]; then
    echo "usage: $0 A_BINARY B_BINARY \"SIZE:B:T:STEPS ...\" [ROUNDS]   (both binaries must exist)" >&2
    exit 1
fi
A=$1; Bin=$2; SPECS=$3; ROUNDS=${4:-1}
LOGS=${AB_LOGS:-/tmp/ab_logs}; mkdir -p "$LOGS"
here=$(cd "$(dirname "$0")" && pwd)
shard="$LOGS/synthetic.bin"
[[ -f "$shard" ]] || python3 -c "import sys; sys.path.insert(0, '$here'); import bench; bench.write_shard('$shard', 4200000)" || exit 1
status=0
for spec in $SPECS; do
    IFS=':' read -r size b t steps <<<"$spec"
    # (gpt3:c768 holds a colon: the last three fields are B, T and steps)
    if [[ "$size" == gpt3 ]]; then IFS=':' read -r s1 s2 b t steps <<<"$spec"; size="$s1:$s2"; fi
    for ((round = 1; round <= ROUNDS; round++)); do
        for which in A B; do
            bin=$A; [[ $which == B ]] && bin=$Bin
            log="$LOGS/${size//:/_}_${which}_r${round}.log"
            timeout 300 "$bin" -e "$size" -i "$shard" -j "" -b "$b" -t "$t" -d 524288 -x "$steps" -v 0 -s 0 -o "" \
                > "$log" 2>&1 || { echo "$size $which round $round: exit $? ($log)"; tail -3 "$log"; status=1; }
            printf '%-10s B=%-3s T=%-5s %s round %d (%s): %s\n' "$size" "$b" "$t" "$which" "$round" "$bin" \
                "$(grep -E '^average step' "$log" | tail -n 1)"
        done
    done
done
exit $status
