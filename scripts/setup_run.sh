# setup_run.sh: what the run scripts (scripts/run_*.sh) share; they source it first. It stops a script at its
# first failing command, moves to the checkout's root, and sets
#   launch     the launcher in front of the trainer: scripts/launch.sh NPROC for NPROC (default 1) processes,
#              one GPU each, or nothing for one
#   hellaswag  (-h 1) where HellaSwag's eval file is (python3 dev/data/hellaswag.py writes it), else nothing
# A script then builds its trainer and ends in
#   exec bash scripts/resume_loop.sh "${launch[@]}" ./TRAINER ITS_FLAGS... "${hellaswag[@]}" "$@"
# so that a crashed run is resumed (-y 1) from its newest checkpoint, and the caller's flags come last and
# override the script's (-h 0 too).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NPROC=${NPROC:-1}
launch=()
if [[ "$NPROC" -gt 1 ]]; then launch=(bash scripts/launch.sh "$NPROC"); fi
hellaswag=()
if [[ -f dev/data/hellaswag/hellaswag_val.bin ]]; then hellaswag=(-h 1); fi
