#!/usr/bin/env bash
# The shipped SmolLM2-135M drafter: run_long.sh's drafter continued for one epoch on as much new data (1,200 other
# prompts of make_prompts.py, seed 2; one greedy and one T=1 response of up to 256 tokens each: 2,272 rollouts,
# 441,236 tokens), last-layer input, training-time test of 3 steps, lr 1e-3 (2 h 10 min on one CPU thread beside
# another run). Rerun the same command to resume an interrupted run.
#   bash recipes/smollm2_drafter/run_continue.sh [OUT_DIR] [INIT_DRAFTER]
# INIT_DRAFTER defaults to run_long.sh's output; the shipped drafter continued the bf16 copy shipped before it
# (git show ccb9b7c:fastrl/assets/smollm2-drafter/...). Add 'extra_layers=[1,14]' for EAGLE-3's fused input: with
# the same data it did not beat the last layer here (docs/benchmarks.md, SmolLM2 round 16).
set -euo pipefail
OUT=${1:-runs/smollm2_drafter_continue}
INIT=${2:-runs/smollm2_drafter_long/drafter}
PY=${PYTHON:-python}
mkdir -p "$OUT"
$PY recipes/smollm2_drafter/make_prompts.py "$OUT/prompts.jsonl" 1200 2
$PY -m fastrl.cli train-drafter model=smollm2 prompts="$OUT/prompts.jsonl" eval_prompts=64 num_prompts=1136 \
  rollout_temperatures='[0.0,1.0]' samples_per_prompt=1 temperature=1.0 max_new_tokens=256 gen_batch_size=64 \
  shard_requests=128 epochs=1 accept_requests=16 accept_strategies='[3_1_4,5_1_6,7_1_8]' threads=1 \
  init_drafter="$INIT" trainer.ttt_steps=3 trainer.max_tokens_per_batch=1024 trainer.warmup_steps=20 trainer.lr=1e-3 \
  output="$OUT/drafter" stream_dir="$OUT/stream"
echo "compare with the shipped drafter, then: $PY recipes/smollm2_drafter/ship.py $OUT/drafter fastrl/assets/smollm2-drafter --overwrite"
