#!/usr/bin/env bash
# resume_loop.sh: run a training command to the end, resuming from its newest checkpoint after a crash.
#   bash scripts/resume_loop.sh TRAINER [flags...]          e.g. ./train_gpt_bf16 -o log_x -n 5000 ...
#   bash scripts/resume_loop.sh scripts/launch.sh 8 ./train_gpt_bf16 [flags...]
# Runs `TRAINER flags... -y 1`: -y 1 resumes from the newest complete checkpoint in -o (or starts the run
# when -o has none), and coming last it wins over any -y in the flags. When the command exits 0 the loop
# exits 0. When it exits non-zero (a crashed GPU, a lost node, an NCCL timeout), the loop waits
# RESTART_DELAY seconds (default 10) and runs it again, at most MAX_RESTARTS times (default 20); then it
# gives up with the last exit status. Every restart loses at most the steps since the last checkpoint
# (-n), so the run needs -o and -n.
# A bad flag or input fails the same way on every attempt, and fast: when the first attempt fails within
# STARTUP_SECONDS (default 60) the loop does not restart (STARTUP_SECONDS=0 always restarts; MAX_RESTARTS=0
# never does). -ow 1 cannot be combined with the -y 1 added here (the trainer refuses it); delete the old
# run's -o directory instead.
# Ctrl-C or SIGTERM stops the loop as well as the trainer.
set -u
if [[ $# -lt 1 ]]; then
    echo "usage: $0 TRAINER [flags...]   (runs TRAINER flags... -y 1 until it exits 0)" >&2
    exit 2
fi
MAX_RESTARTS=${MAX_RESTARTS:-20}
RESTART_DELAY=${RESTART_DELAY:-10}
STARTUP_SECONDS=${STARTUP_SECONDS:-60}
if [[ ! "$MAX_RESTARTS" =~ ^[0-9]+$ || ! "$RESTART_DELAY" =~ ^[0-9]+$ || ! "$STARTUP_SECONDS" =~ ^[0-9]+$ ]]; then
    echo "error: MAX_RESTARTS ($MAX_RESTARTS), RESTART_DELAY ($RESTART_DELAY) and STARTUP_SECONDS ($STARTUP_SECONDS)" \
         "must be whole numbers" >&2
    exit 2
fi
# (bash runs a trap once the foreground command has returned, so the trainer sees the signal first)
trap 'echo "resume_loop: interrupted; not restarting" >&2; exit 130' INT
trap 'echo "resume_loop: terminated; not restarting" >&2; exit 143' TERM

restarts=0
while :; do
    started=$SECONDS
    "$@" -y 1
    status=$?
    [[ $status -eq 0 ]] && exit 0
    if [[ $restarts -eq 0 && $((SECONDS - started)) -lt $STARTUP_SECONDS ]]; then
        echo "resume_loop: exit status $status within $STARTUP_SECONDS s of the first start: a bad flag or input," \
             "not a crash; not restarting" >&2
        exit "$status"
    fi
    if [[ $restarts -ge $MAX_RESTARTS ]]; then
        echo "resume_loop: exit status $status after $restarts restart(s) (MAX_RESTARTS=$MAX_RESTARTS); giving up" >&2
        exit "$status"
    fi
    restarts=$((restarts + 1))
    echo "resume_loop: exit status $status; restart $restarts of $MAX_RESTARTS in $RESTART_DELAY s (resuming with -y 1)" >&2
    sleep "$RESTART_DELAY"
done
