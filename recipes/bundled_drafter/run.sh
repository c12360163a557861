#!/usr/bin/env bash
# Train the EAGLE drafter shipped with the bundled model (fastrl/assets/arith-tiny-drafter), all five stages of its
# lineage (docs/benchmarks.md "Drafter training"): rollouts sampled from the policy, its hidden states taken, the
# drafter fitted, accept lengths measured after every epoch. Rerun, a finished stage is skipped and an interrupted
# one resumes from its stream; outputs under runs/.
#   1. EAGLE-1 loss (trainer.ttt_steps=1), 4,096 T=1 prompts x 8 epochs (~567k tokens an epoch)
#   2. training-time test (ttt_steps=3) on 1,024 prompts at T=0 and T=1 (~300k tokens), one epoch
#   3. the same on 4,096 fresh prompts at T=0 and T=1 (~1.2M tokens), one epoch
#   4. the same on 8,192 fresh prompts at T=0 and T=1 (~2.4M tokens), one epoch
#   5. EAGLE-3's fused input (decoder layers 0 and 2 + the last; the fuse starts as the identity, so training starts
#      from stage 4's drafter) on stage 4's rollouts again, one epoch: the shipped drafter
# Extra arguments go to every stage (e.g. threads=2). On this 2-core CPU: hours for stage 1, ~45, ~40, ~50 and ~45 min after.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=runs/bundled_drafter
done_stage() {  # a stage whose drafter is written is not run again (train-drafter refuses a finished output)
  if [ -f "$out/$1/drafter_config.json" ]; then echo "$out/$1: done, skipped"; return 0; fi
  return 1
}
done_stage stage1 || fastrl train-drafter output=$out/stage1 \
  num_prompts=4096 eval_prompts=128 epochs=8 gen_batch_size=64 max_new_tokens=1024 \
  trainer.lr=2e-3 trainer.max_tokens_per_batch=8192 trainer.feature_noise=0.05 trainer.ttt_steps=1 \
  accept_strategies=[3_1_4,5_1_6,7_1_8,6_2_12,8_4_32] accept_requests=16 "$@"
done_stage stage2 || fastrl train-drafter init_drafter=$out/stage1 output=$out/stage2 num_prompts=1024 \
  eval_prompts=64 'rollout_temperatures=[0.0,1.0]' epochs=1 shard_requests=512 seed=7 trainer.ttt_steps=3 \
  trainer.lr=5e-4 trainer.warmup_steps=10 'accept_strategies=[7_1_8,3_1_4,8_4_32]' "$@"
done_stage stage3 || fastrl train-drafter init_drafter=$out/stage2 output=$out/stage3 num_prompts=4096 \
  eval_prompts=64 'rollout_temperatures=[0.0,1.0]' epochs=1 shard_requests=512 gen_batch_size=128 seed=31 \
  trainer.ttt_steps=3 trainer.lr=5e-4 trainer.warmup_steps=10 'accept_strategies=[7_1_8,11_1_12,8_4_32]' "$@"
done_stage stage4 || fastrl train-drafter init_drafter=$out/stage3 output=$out/stage4 num_prompts=8192 \
  eval_prompts=64 'rollout_temperatures=[0.0,1.0]' epochs=1 shard_requests=512 gen_batch_size=128 seed=47 \
  trainer.ttt_steps=3 trainer.lr=5e-4 trainer.warmup_steps=10 'accept_strategies=[7_1_8,11_1_12,8_4_32]' "$@"
mkdir -p $out/stage5.stream && cp -n $out/stage4.stream/shard_*.json $out/stage5.stream/  # the same rollouts
done_stage stage5 || fastrl train-drafter init_drafter=$out/stage4 output=$out/stage5 stream_dir=$out/stage5.stream 'extra_layers=[0,2]' \
  num_prompts=8192 eval_prompts=64 'rollout_temperatures=[0.0,1.0]' epochs=1 shard_requests=512 gen_batch_size=128 \
  seed=47 trainer.ttt_steps=3 trainer.lr=5e-4 trainer.warmup_steps=10 'accept_strategies=[7_1_8,11_1_12,8_4_32]' "$@"
echo "shipped drafter: $out/stage5 (copy it to fastrl/assets/arith-tiny-drafter)"
