#!/usr/bin/env bash
# Co-training from a deliberately weak drafter (issue 23, item 5): a drafter trained on a few percent of the shipped
# drafter's data, then the same GRPO run (same seeds, so identical rollouts by exactness) three times with one fixed
# strategy and drift tracked: the weak drafter frozen, the weak drafter co-trained, the shipped (strong) drafter
# frozen as the reference. plot.py tabulates weak frozen vs weak co-trained per step (with KL); the strong arm's
# accept length per step is printed beside them.
#   recipes/cotrain_drift/weak_start.sh [OUT_DIR] [extra fastrl train overrides...]
set -euo pipefail
out=${1:-runs/cotrain_weak}
shift || true
# The shipped drafter saw 4,096 prompts x 8 epochs; the weak one 128 prompts (3%) x 2 epochs.
python -m fastrl.cli train-drafter output="$out/weak_drafter" num_prompts=128 eval_prompts=16 epochs=2 seed=11 \
  'accept_strategies=[5_1_6]' overwrite=true
common=(strategy=static strategy.name=5_1_6 rl.steps=12 rl.prompts_per_step=8 rl.track_drift=true
        rl.checkpoint_every=0 logger=none report=false "$@")
python -m fastrl.cli train "${common[@]}" drafter=frozen drafter.path="$out/weak_drafter" hydra.run.dir="$out/frozen"
python -m fastrl.cli train "${common[@]}" drafter=cotrained drafter.path="$out/weak_drafter" \
  drafter.updates_per_rollout=4 drafter.trainer.lr=1e-3 hydra.run.dir="$out/cotrained"
python -m fastrl.cli train "${common[@]}" drafter=frozen hydra.run.dir="$out/strong"
python "$(dirname "$0")/plot.py" "$out"
python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
arms = {a: [json.loads(x) for x in (out / a / "metrics.jsonl").read_text().splitlines() if x.strip()]
        for a in ("frozen", "cotrained", "strong")}
print("| step | KL | weak frozen | weak co-trained | strong frozen |")
for rows in zip(*arms.values()):
    f, c, s = rows
    print(f"| {f['step']} | {f.get('drift_kl') or 0:.4f} | {f['mean_accept_length']:.3f} | "
          f"{c['mean_accept_length']:.3f} | {s['mean_accept_length']:.3f} |")
PY
