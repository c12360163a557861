#!/usr/bin/env bash
# Frozen vs co-trained drafter while the policy drifts: the same GRPO run (same seeds, so identical rollouts by
# exactness) twice, at 10x the default learning rate, with a fixed strategy; KL to the initial policy is tracked on
# every step's fresh rollouts. Then plot.py draws accept length and KL per step and prints the table.
#   recipes/cotrain_drift/run.sh [OUT_DIR] [extra fastrl train overrides...]
# Defaults: 16 steps x 8 prompts x 4 samples per arm, about 20 minutes for both arms on a 2-core CPU (12 steps: 14 min).
set -euo pipefail
out=${1:-runs/cotrain_drift}
shift || true
common=(strategy=static strategy.name=5_1_6 rl.lr=3e-4 rl.steps=16 rl.prompts_per_step=8 rl.track_drift=true
        rl.checkpoint_every=0 logger=none "$@")
python -m fastrl.cli train "${common[@]}" drafter=frozen hydra.run.dir="$out/frozen"
python -m fastrl.cli train "${common[@]}" drafter=cotrained drafter.updates_per_rollout=4 hydra.run.dir="$out/cotrained"
python "$(dirname "$0")/plot.py" "$out"
