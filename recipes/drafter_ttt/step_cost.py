"""Cost of one drafter training step by training-time-test depth, on the bundled model (one torch thread): the same
batch of the policy's own rollouts, every depth timed in turn within each repeat, medians printed as ratios to
ttt_steps=1 (EAGLE-1's loss).

  python recipes/drafter_ttt/step_cost.py --steps 1 3 5 7 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastrl.assets_path import bundled_model_dir
from fastrl.bench.cli_args import at_least
from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig, make_batches
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.offline import task_prompts
from fastrl.cotrain.rollout_plan import RolloutPlan
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.speculative.drafter import EagleDrafter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", nargs="+", type=at_least(1), default=[1, 3, 5, 7])
    parser.add_argument("--repeats", type=at_least(1), default=5)
    parser.add_argument("--tokens", type=at_least(1), default=4096, help="max_tokens_per_batch (co-training's default)")
    args = parser.parse_args(argv)
    twice = [k for i, k in enumerate(args.steps) if k in args.steps[:i]]
    if twice:
        parser.error(f"--steps: {twice[0]} is given twice")
    torch.set_num_threads(1)
    policy = load_model(bundled_model_dir()).eval()
    plan = RolloutPlan(task_prompts(load_tokenizer(bundled_model_dir()), 64, 3000), [1.0], 1, 1024, 3000)
    seqs = policy_features(policy, plan.generate(policy, range(len(plan)), 64, "cpu"))
    batch = make_batches(seqs, args.tokens)[0]
    trainers = {}
    for k in args.steps:
        torch.manual_seed(0)
        trainers[k] = DrafterTrainer(EagleDrafter(policy.config), policy, DrafterTrainerConfig(ttt_steps=k))
        trainers[k].train_step(batch)  # warm-up
    times: dict[int, list[float]] = {k: [] for k in args.steps}
    for _ in range(args.repeats):
        for k, trainer in trainers.items():
            start = time.perf_counter()
            trainer.train_step(batch)
            times[k].append(time.perf_counter() - start)
    base = statistics.median(times[args.steps[0]])
    entries = sum(s.num_targets for s in batch)
    print(f"one step on {len(batch)} sequences, {entries} entries with a target (max_tokens_per_batch={args.tokens})")
    print(f"| ttt_steps | median step (ms) | vs ttt_steps={args.steps[0]} |")
    for k in args.steps:
        median = statistics.median(times[k])
        print(f"| {k} | {median * 1000:.0f} | {median / base:.2f}× |")


if __name__ == "__main__":
    main()
