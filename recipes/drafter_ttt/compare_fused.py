"""EAGLE-3's fused input measured: one drafter reads the last policy layer (as shipped), one a learned fusion of a
low, a middle and the last layer; same rollouts, epochs, seed and loss (ttt_steps=3); held-out greedy chain accept
length at bs=1, in one run.

  python recipes/drafter_ttt/compare_fused.py --prompts 512 --epochs 3

Accept length is computed on held-out T=0 rollouts by `greedy_chain_accept_length`; for both arms it is printed
beside the engine's own `7_1_8` measure (bs=1) of the first `--check` prompts (the engine feeds a fused drafter its
fused features). Writes JSON (``--out``, a new file: an existing one is refused, as is any bad flag, before any
work).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from fastrl.atomic_files import write_atomic
from fastrl.bench.cli_args import at_least, new_file, positive_float
from fastrl.commands.engine_setup import resolve_model_dir
from fastrl.cotrain.accept_eval import measure_accept_length
from fastrl.cotrain.chain_accept import greedy_chain_accept_length
from fastrl.cotrain.drafter_trainer import DrafterTrainer, DrafterTrainerConfig, make_batches
from fastrl.cotrain.features import policy_features
from fastrl.cotrain.offline import task_prompts
from fastrl.cotrain.rollout_plan import RolloutPlan
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter, check_extra_layers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=at_least(1), default=512)
    parser.add_argument("--epochs", type=at_least(1), default=3)
    parser.add_argument("--lr", type=positive_float, default=2e-3)
    parser.add_argument("--ttt-steps", type=at_least(1), default=3)
    parser.add_argument("--layers", type=at_least(0), nargs="+", default=[0, 2])  # decoder layers fused before the last
    parser.add_argument("--held-out", type=at_least(1), default=64)
    parser.add_argument("--check", type=at_least(0), default=16)  # prompts the engine also measures (both arms)
    parser.add_argument("--depths", type=at_least(1), nargs="+", default=[3, 7, 11])
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--out", type=new_file, default="runs/drafter_ttt/compare_fused.json")
    args = parser.parse_args(argv)
    model_dir = resolve_model_dir("")
    num_layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    layers = tuple(args.layers)
    try:
        check_extra_layers(layers, num_layers)
    except ValueError as err:
        parser.error(f"--layers {' '.join(map(str, layers))}: {err}")
    if args.check > args.held_out:
        parser.error(f"--check {args.check} must be <= --held-out {args.held_out} (it measures held-out prompts)")
    torch.set_num_threads(1)
    policy, tokenizer = load_model(model_dir).eval(), load_tokenizer(model_dir)
    plan = RolloutPlan(task_prompts(tokenizer, args.prompts, args.seed + 1000), [1.0], 1, 1024, args.seed + 1000)
    train_ids = plan.generate(policy, range(len(plan)), 64, "cpu")
    held_prompts = task_prompts(tokenizer, args.held_out, args.seed + 2000)  # a seed no training run uses
    held_plan = RolloutPlan(held_prompts, [0.0], 1, 1024, args.seed + 2000)
    held_ids = held_plan.generate(policy, range(len(held_plan)), 64, "cpu")
    lengths = [len(p) for p in held_prompts]
    arms = {"last": (), "fused": layers}
    train = {name: policy_features(policy, train_ids, extra_layers=extra) for name, extra in arms.items()}
    held = {name: policy_features(policy, held_ids, extra_layers=extra) for name, extra in arms.items()}
    tokens = sum(s.num_targets for s in train["last"])
    print(f"{len(train_ids)} rollouts, {tokens} training tokens; fused layers {list(layers)} + final norm")
    base = DrafterTrainerConfig(lr=args.lr, warmup_steps=20, seed=args.seed, ttt_steps=args.ttt_steps)
    base = dataclasses.replace(
        base, total_steps=len(make_batches(train["last"], base.max_tokens_per_batch)) * args.epochs
    )
    rows = []
    for name, extra in arms.items():
        torch.manual_seed(args.seed)
        drafter = FusedEagleDrafter(policy.config, extra) if extra else EagleDrafter(policy.config)
        trainer = DrafterTrainer(drafter, policy, base)
        start = time.time()
        for _ in range(args.epochs):
            trainer.train_epoch(train[name])
        row = {"arm": name, "train_seconds": round(time.time() - start, 1)}
        row["held_top1"] = round(trainer.evaluate(held[name]).top1, 4)
        for depth in args.depths:
            row[f"chain{depth} T=0"] = round(greedy_chain_accept_length(drafter, policy, held[name], lengths, depth), 3)
        if args.check:
            check = args.check
            inputs = [
                GenerateInput(p, SamplingParams(max_new_tokens=1024, temperature=0.0)) for p in held_prompts[:check]
            ]
            engine = measure_accept_length(policy, drafter, inputs, "7_1_8", EngineConfig(max_batch_size=1))
            sim = greedy_chain_accept_length(drafter, policy, held[name][:check], lengths[:check], 7)
            row["check 7_1_8 engine/sim"] = f"{engine:.3f}/{sim:.3f}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"args": vars(args), "tokens": tokens, "rows": rows}
    write_atomic(args.out, json.dumps(result, indent=2, default=str) + "\n")
    keys = [k for k in rows[0] if k != "arm"]
    print("| arm | " + " | ".join(keys) + " |")
    for row in rows:
        print(f"| {row['arm']} | " + " | ".join(str(row.get(k, "")) for k in keys) + " |")


if __name__ == "__main__":
    main()
