#!/usr/bin/env bash
# launch.sh: a data-parallel run on this node, one process per GPU, without MPI.
#   scripts/launch.sh N ./train_gpt_bf16 [trainer flags...]
# Starts N copies of the trainer with LLMC_WORLD_SIZE=N, LLMC_RANK=r and LLMC_LOCAL_RANK=r (process r
# uses GPU r), and, unless the flags already carry -pf or -ps, -pf <a fresh directory> through which
# the processes exchange the NCCL id. Process 0 prints to this terminal and writes main.log; the
# output of process r > 0 goes to <that directory>/process_<r>.log, and is printed if it fails.
# The first process to exit with an error stops the others (SIGTERM, then SIGKILL after 10 s) and
# its exit status becomes the launcher's. Ctrl-C stops them all.
# Across nodes use mpirun, srun (scripts/slurm_gpt2_124M.sbatch) or -pn/-pr with -ps on each node.
set -u
if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 NUM_PROCESSES TRAINER [flags...]   e.g. $0 2 ./train_gpt_bf16 -e d12 -b 32" >&2
    exit 2
fi
n=$1; shift
trainer=$1; shift
if [[ ! -x "$trainer" ]]; then echo "error: $trainer is not an executable (build it with make)" >&2; exit 2; fi
if command -v nvidia-smi > /dev/null; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [[ "$gpus" -gt 0 && "$n" -gt "$gpus" ]]; then
        echo "error: $n processes but this node has $gpus GPU(s); one process per GPU" >&2; exit 2
    fi
fi
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/llmc_launch.XXXXXX")
id_flags=(-pf "$run_dir")
for a in "$@"; do [[ "$a" == -pf || "$a" == -ps ]] && id_flags=(); done
# never NVLink multicast (on a shared machine it can take the GPUs out of service)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

pids=()
for ((r = 0; r < n; r++)); do
    if [[ $r -eq 0 ]]; then
        LLMC_WORLD_SIZE=$n LLMC_RANK=$r LLMC_LOCAL_RANK=$r "$trainer" "$@" "${id_flags[@]}" &
    else
        LLMC_WORLD_SIZE=$n LLMC_RANK=$r LLMC_LOCAL_RANK=$r "$trainer" "$@" "${id_flags[@]}" > "$run_dir/process_$r.log" 2>&1 &
    fi
    pids+=($!)
done

stop_all() { # $1: signal
    for p in "${pids[@]}"; do kill -"$1" "$p" 2>/dev/null; done
}
trap 'echo "launch.sh: interrupted; stopping the processes" >&2; stop_all TERM; sleep 2; stop_all KILL; exit 130' INT TERM

status=0
left=$n
while [[ $left -gt 0 ]]; do
    wait -n -p done_pid; rc=$?
    [[ -z "${done_pid:-}" ]] && break
    left=$((left - 1))
    rank=-1
    for ((r = 0; r < n; r++)); do [[ "${pids[$r]}" == "$done_pid" ]] && rank=$r; done
    if [[ $rc -ne 0 ]]; then
        echo "launch.sh: process $rank exited with status $rc; stopping the others" >&2
        if [[ $rank -gt 0 && -f "$run_dir/process_$rank.log" ]]; then
            echo "---- last lines of process $rank ----" >&2; tail -n 20 "$run_dir/process_$rank.log" >&2
        fi
        stop_all TERM
        for ((i = 0; i < 100; i++)); do
            alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
            [[ $alive -eq 0 ]] && break
            sleep 0.1
        done
        stop_all KILL
        status=$rc
        break
    fi
done
wait 2>/dev/null
[[ $status -eq 0 ]] && rm -rf "$run_dir"
exit $status
