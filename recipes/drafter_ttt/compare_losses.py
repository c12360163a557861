"""Side-by-side drafter losses on the bundled model: the same rollouts, the same epochs, one drafter per arm, then
held-out accept length at bs=1, T=0 and T=1, in one run.

  python recipes/drafter_ttt/compare_losses.py --arms ttt1 ttt3 ttt5 ttt3-nofeat --prompts 512 --epochs 3

An arm is ``ttt<K>`` (training-time test of K steps, feature term on) with ``-nofeat`` for no feature-regression
term; ``--init shipped`` starts every arm from the shipped drafter instead of a fresh one (seeded alike), and the
arm ``shipped`` measures it untouched. Prints a table and writes JSON (``--out``, a new file: an existing one is
refused, as is any bad flag, before any work).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time

import torch

from fastrl.atomic_files import write_atomic
from fastrl.bench.cli_args import at_least, new_file, positive_float, strategy_name
from fastrl.commands.engine_setup import resolve_drafter, resolve_model_dir
from fastrl.cotrain.accept_eval import measure_accept_length
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


def arm_config(arm: str, base: DrafterTrainerConfig) -> DrafterTrainerConfig:
    """`ttt<K>[-nofeat]` -> the trainer config of that arm.  ValueError on any other name."""
    name, _, suffix = arm.partition("-")
    if not name.startswith("ttt") or not name[3:].isdigit() or int(name[3:]) < 1 or suffix not in ("", "nofeat"):
        raise ValueError(f"arm {arm!r}: expected ttt<K> or ttt<K>-nofeat (K >= 1), or shipped")
    return dataclasses.replace(base, ttt_steps=int(name[3:]), feature_weight=0.0 if suffix else 1.0)


def arm_name(text: str) -> str:
    """An argparse ``type``: ``shipped`` or an arm ``arm_config`` knows."""
    if text != "shipped":
        try:
            arm_config(text, DrafterTrainerConfig())
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", type=arm_name, default=["ttt1", "ttt3", "ttt5", "ttt3-nofeat"])
    parser.add_argument("--init", choices=["fresh", "shipped"], default="fresh")
    parser.add_argument("--prompts", type=at_least(1), default=512)
    parser.add_argument("--epochs", type=at_least(1), default=3)
    parser.add_argument("--lr", type=positive_float, default=2e-3)
    parser.add_argument("--requests", type=at_least(1), default=16)
    parser.add_argument("--strategies", nargs="+", type=strategy_name, default=["7_1_8", "8_4_32"])
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--out", type=new_file, default="runs/drafter_ttt/compare.json")
    args = parser.parse_args(argv)
    for flag, values in (("--arms", args.arms), ("--strategies", args.strategies)):
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            parser.error(f"{flag}: {twice[0]} is given twice")
    torch.set_num_threads(1)
    model_dir = resolve_model_dir("")
    policy, tokenizer = load_model(model_dir).eval(), load_tokenizer(model_dir)
    shipped = resolve_drafter("", model_dir, policy, needed=True)
    start = time.time()
    plan = RolloutPlan(task_prompts(tokenizer, args.prompts, args.seed + 1000), [1.0], 1, 1024, args.seed + 1000)
    train = policy_features(policy, plan.generate(policy, range(len(plan)), 64, "cpu"))
    print(f"{len(train)} rollouts, {sum(s.num_targets for s in train)} training tokens ({time.time() - start:.0f} s)")
    prompts = task_prompts(tokenizer, args.requests, args.seed + 2000)  # held out: a seed no training run uses
    base = DrafterTrainerConfig(lr=args.lr, warmup_steps=20, seed=args.seed)
    base = dataclasses.replace(base, total_steps=len(make_batches(train, base.max_tokens_per_batch)) * args.epochs)
    rows = []
    for arm in args.arms:
        torch.manual_seed(args.seed)
        fresh = args.init == "fresh" and arm != "shipped"
        drafter = EagleDrafter(policy.config) if fresh else copy.deepcopy(shipped)
        seconds = 0.0
        if arm != "shipped":
            trainer = DrafterTrainer(drafter, policy, arm_config(arm, base))
            start = time.time()
            for _ in range(args.epochs):
                trainer.train_epoch(train)
            seconds = time.time() - start
        row = {"arm": arm, "init": "fresh" if fresh else "shipped", "train_seconds": round(seconds, 1)}
        for temperature in (0.0, 1.0):
            inputs = [
                GenerateInput(p, SamplingParams(max_new_tokens=1024, temperature=temperature, seed=i))
                for i, p in enumerate(prompts)
            ]
            for strategy in args.strategies:
                length = measure_accept_length(policy, drafter, inputs, strategy, EngineConfig(max_batch_size=1))
                row[f"{strategy} T={temperature:g}"] = round(length, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_atomic(args.out, json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str) + "\n")
    keys = [k for k in rows[0] if k not in ("arm", "init")]
    print("| arm | " + " | ".join(keys) + " |")
    for row in rows:
        print(f"| {row['arm']} | " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
