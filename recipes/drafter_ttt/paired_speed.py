"""Speedup of fixed strategies over plain decoding, paired: every repeat times plain and each strategy back to back
(order rotated), and the ratio is taken within the repeat, so load changes on a shared CPU move both sides of a
ratio alike. bs=1, tokens checked identical to plain. Held-out task prompts of the bundled model by default; a named
model (`--model smollm2`) with a prompts file (`--prompts-file`, `fastrl generate`'s format, text through the chat
template) and that model's shipped drafter unless `--drafter` names another.

  python recipes/drafter_ttt/paired_speed.py --temperature 1 --strategies 3_1_4 7_1_8 8_4_32 --repeats 3 [--drafter DIR]
  python recipes/drafter_ttt/paired_speed.py --model smollm2 \
      --prompts-file recipes/smollm2_drafter/heldout_prompts.jsonl --temperature 0 --max-new-tokens 128 \
      --strategies 3_1_4 5_1_6 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from fastrl.bench.cli_args import at_least, existing_dir, existing_file, sampling_temperature, strategy_name
from fastrl.bench.script_models import load_script_models
from fastrl.cotrain.offline import task_prompts
from fastrl.engine.engine import GenerateInput
from fastrl.sampling.params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from side_by_side import decode, duplicate  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=at_least(1), default=16)
    parser.add_argument("--seed", type=at_least(0), default=2000)  # held out: no training run draws prompts with it
    parser.add_argument("--temperature", type=sampling_temperature, default=1.0)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--strategies", nargs="+", type=strategy_name, default=["3_1_4", "7_1_8", "8_4_32"])
    parser.add_argument(
        "--clock",
        choices=["wall", "process"],
        default="wall",
        help="wall time, or CPU seconds of this one-thread process (steadier when other jobs share the CPU)",
    )
    parser.add_argument(
        "--drafter", type=existing_dir, default=None, help="drafter directory (default: the one shipped with the model)"
    )
    parser.add_argument("--model", default="", help="a named model or checkpoint directory (default: the bundled one)")
    parser.add_argument(
        "--prompts-file",
        type=existing_file,
        default=None,
        help="prompts JSONL (default: --prompts held-out task prompts)",
    )
    parser.add_argument("--max-new-tokens", type=at_least(1), default=1024)
    args = parser.parse_args(argv)
    if "disable" in args.strategies:
        parser.error("--strategies: disable is plain decoding, which every run times as the reference; leave it out")
    if duplicate(args.strategies) is not None:
        parser.error(f"--strategies: {duplicate(args.strategies)} is given twice")
    torch.set_num_threads(1)
    try:
        policy, drafter, prompts = load_script_models(
            args.model,
            str(args.drafter or ""),
            args.prompts_file,
            lambda tokenizer: task_prompts(tokenizer, args.prompts, args.seed),
        )
    except ValueError as err:
        parser.error(str(err))
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=i))
        for i, p in enumerate(prompts)
    ]
    arms = ["disable"] + list(args.strategies)
    ratios: dict[str, list[float]] = {s: [] for s in args.strategies}
    accept: dict[str, float] = {}
    reference = None
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    for r in range(args.repeats):
        seconds = {}
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
            start = clock()
            tokens, length = decode(policy, None if arm == "disable" else drafter, arm, inputs)
            seconds[arm] = clock() - start
            reference = reference or (tokens if arm == "disable" else None)
            if reference is not None and tokens != reference:
                raise RuntimeError(f"{arm}: output differs from plain decoding")
            accept[arm] = length
        for s in args.strategies:
            ratios[s].append(seconds["disable"] / seconds[s])
    for s in args.strategies:
        spread = ", ".join(f"{x:.2f}" for x in sorted(ratios[s]))
        print(
            f"T={args.temperature:g} {s} ({args.clock} clock): accept {accept[s]:.2f}, "
            f"speedup median {statistics.median(ratios[s]):.2f}x (repeats: {spread})"
        )


if __name__ == "__main__":
    main()
