#!/usr/bin/env bash
# quickstart.sh [trainer flags...]: on a fresh GPU machine, set up and train GPT-2 d12 on tiny-shakespeare.
#   1. installs numpy + tiktoken if missing (pip), 2. tokenizes tiny-shakespeare into llm.c shards,
#   3. builds train_gpt_$RECIPE (default bf16), 4. trains with the embedded defaults (1000 steps,
#   the project's loss protocol) plus any flags given here, e.g. `-x 200 -o log_d12`.
set -euo pipefail
cd "$(dirname "$0")/.."
RECIPE=${RECIPE:-bf16}
recipes=$(make -s print-recipes)
if [[ " $recipes " != *" $RECIPE "* ]]; then
    echo "error: RECIPE=$RECIPE is not a recipe; the recipes: $recipes" >&2
    exit 1
fi
python3 -c "import numpy, tiktoken" 2>/dev/null || python3 -m pip install -q numpy tiktoken
if [[ ! -f dev/data/tinyshakespeare/tiny_shakespeare_train.bin || ! -f dev/data/gpt2_tokenizer.bin ]]; then
    python3 dev/data/tinyshakespeare.py
fi
make -j"$(nproc)" "train_gpt_$RECIPE"
exec "./train_gpt_$RECIPE" "$@"
