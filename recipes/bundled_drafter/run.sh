#!/usr/bin/env bash
# Train the EAGLE drafter shipped with the bundled model (fastrl/assets/arith-tiny-drafter).
# Samples rollouts from the policy at T=1, takes its hidden states, fits the drafter, measures accept lengths.
# trainer.ttt_steps=1 reproduces the shipped (EAGLE-1 loss) drafter; drop it for the training-time test
# (ttt_steps=3, the default since docs/benchmarks.md "Drafter training"; ~3.2x the cost of a step).
set -euo pipefail
cd "$(dirname "$0")/../.."
fastrl train-drafter \
  output=fastrl/assets/arith-tiny-drafter \
  num_prompts=4096 eval_prompts=128 epochs=8 gen_batch_size=64 max_new_tokens=1024 \
  trainer.lr=2e-3 trainer.max_tokens_per_batch=8192 trainer.feature_noise=0.05 trainer.ttt_steps=1 \
  accept_strategies=[3_1_4,5_1_6,7_1_8,6_2_12,8_4_32] accept_requests=16 "$@"
