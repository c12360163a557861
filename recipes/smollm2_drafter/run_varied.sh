#!/usr/bin/env bash
# The shipped SmolLM2-135M drafter continued on varied prompts (varied_prompts.py: a dozen kinds of request over the
# tokenizer's ~15,000 words, where make_prompts.py's templates held ~50 topics): one greedy and one T=1 response of
# up to 256 tokens for each of COUNT - 48 prompts (48 held out), last-layer input, training-time test of 3 steps,
# lr 1e-3, one epoch. Rerun the same command to resume an interrupted run.
#   bash recipes/smollm2_drafter/run_varied.sh [OUT_DIR] [COUNT] [SEED] [INIT_DRAFTER] [THREADS]
# INIT_DRAFTER defaults to the shipped drafter. Compare on the hand-written prompts (recipe README), then ship with
# ship.py.
set -euo pipefail
OUT=${1:-runs/smollm2_varied}
COUNT=${2:-600}
SEED=${3:-3}
INIT=${4:-fastrl/assets/smollm2-drafter}
THREADS=${5:-1}
PY=${PYTHON:-python}
mkdir -p "$OUT"
$PY recipes/smollm2_drafter/varied_prompts.py "$OUT/prompts.jsonl" "$COUNT" "$SEED"
$PY -m fastrl.cli train-drafter model=smollm2 prompts="$OUT/prompts.jsonl" eval_prompts=48 num_prompts=$((COUNT - 48)) \
  rollout_temperatures='[0.0,1.0]' samples_per_prompt=1 temperature=1.0 max_new_tokens=256 gen_batch_size=64 \
  shard_requests=128 epochs=1 accept_requests=16 accept_strategies='[3_1_4,5_1_6]' threads="$THREADS" \
  init_drafter="$INIT" trainer.ttt_steps=3 trainer.max_tokens_per_batch=1024 trainer.warmup_steps=20 trainer.lr=1e-3 \
  output="$OUT/drafter" stream_dir="$OUT/stream"
echo "compare with the shipped drafter, then: $PY recipes/smollm2_drafter/ship.py $OUT/drafter fastrl/assets/smollm2-drafter --overwrite"
