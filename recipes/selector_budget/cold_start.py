"""Where a fresh bandit settles: several cold runs of one engine over the same prompts, each printing how many rounds
every arm ran and why (exploit, explore, anchor, ...), with the bandit's final prediction for each arm pulled.

A bandit that starts from nothing learns its acceptance from the first requests it meets; at batch 1 those are one
request's rows, so the first prompt can decide a short run. Timing noise changes the decisions from run to run, so
one run says little: run several.

    python recipes/selector_budget/cold_start.py --model smollm2 \
        --prompts-file recipes/smollm2_drafter/heldout_prompts.jsonl --requests 6 --runs 4
"""

from __future__ import annotations

import argparse
import collections

import torch

from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.bench.cli_args import at_least, existing_dir, existing_file, sampling_temperature
from fastrl.bench.long_tail import _engine
from fastrl.bench.script_models import load_script_models
from fastrl.bench.workload import bench_prompts
from fastrl.sampling.params import SamplingParams

ARMS = "12_1_13@0.3,7_1_8,5_1_6,3_1_4,8_4_32,suffix_8,3_1_4+suffix_8,disable"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="named model (smollm2) or checkpoint dir (default: bundled)")
    parser.add_argument(
        "--drafter", type=existing_dir, default=None, help="drafter directory (default: the one shipped with the model)"
    )
    parser.add_argument(
        "--prompts-file",
        type=existing_file,
        default=None,
        help="prompts JSONL, text through the chat template of a chat model (default: tasks)",
    )
    parser.add_argument("--requests", type=at_least(1), default=6)
    parser.add_argument("--batch-size", type=at_least(1), default=1)
    parser.add_argument("--max-new-tokens", type=at_least(1), default=96)
    parser.add_argument("--temperature", type=sampling_temperature, default=0.0)
    parser.add_argument("--runs", type=at_least(1), default=4)
    parser.add_argument("--arms", default=ARMS, help="the bandit's strategies, comma-separated")
    args = parser.parse_args(argv)
    try:
        config = BanditConfig(strategies=args.arms.split(","))
    except ValueError as err:
        parser.error(f"--arms {args.arms}: {err}")
    torch.set_num_threads(1)
    try:
        policy, drafter, prompts = load_script_models(
            args.model,
            str(args.drafter or ""),
            args.prompts_file,
            lambda tokenizer: bench_prompts(tokenizer, "auto", args.requests, 2),
        )
    except ValueError as err:
        parser.error(str(err))
    prompts = prompts[: args.requests]
    context = min(policy.config.max_position_embeddings, max(map(len, prompts)) + args.max_new_tokens + 1)
    for run in range(args.runs):
        engine = _engine(policy, drafter, "bandit", args.batch_size, config, context)
        selector = engine.selector
        assert isinstance(selector, BanditSelector)
        for i, prompt in enumerate(prompts):
            engine.add_request(
                prompt, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=i)
            )
        reasons: collections.Counter = collections.Counter()
        while engine.has_unfinished():
            before = len(engine.round_stats)
            engine.step()
            if len(engine.round_stats) > before:
                reasons[(str(engine.round_stats[-1].strategy), selector.last_reason)] += 1
        rounds = collections.Counter(str(s.strategy) for s in engine.round_stats)
        print(f"run {run + 1}: {len(engine.round_stats)} rounds, {dict(rounds.most_common())}")
        print(f"  why: {dict(reasons.most_common())}")
        for arm in selector.strategies:
            if rounds[str(arm)]:
                value, seconds = selector.predict(arm, args.batch_size), selector.times.seconds(arm, args.batch_size)
                tokens = selector.acceptance.tokens_per_row(arm)
                print(f"  {str(arm):>16}: predicted {value:6.2f} tok/s ({tokens:.3f} a row, {1e3 * seconds:.1f} ms)")


if __name__ == "__main__":
    main()
