"""Two drafters of the bundled model side by side in one run: bs=1 on held-out task prompts, T=0 and T=1, each
static strategy timed against plain decoding (medians over repeats), accept length, tokens checked identical.

  python recipes/drafter_ttt/side_by_side.py fastrl/assets/arith-tiny-drafter runs/drafter_ttt/retrained

Prints a table and writes JSON (--out, a new file: an existing one is refused before any work). Timings share this
busy CPU with other work: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_model_dir
from fastrl.atomic_files import write_atomic
from fastrl.bench.cli_args import at_least, existing_dir, new_file, strategy_name
from fastrl.bench.timing import time_median
from fastrl.cotrain.offline import task_prompts
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.decoder import CausalLM
from fastrl.models.tokenizer import load_tokenizer
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.speculative.drafter_checkpoint import load_drafter, read_checked_drafter
from fastrl.strategy.round_stats import RoundTotals


def decode(
    policy: CausalLM, drafter: EagleDrafter | None, strategy: str, inputs: list[GenerateInput]
) -> tuple[list[list[int]], float]:
    """Every input alone (bs=1) with a fixed strategy: (output token ids, mean accept length)."""
    engine = Engine(policy, EngineConfig(max_batch_size=1), drafter=drafter, selector=FixedSelector(strategy))
    outputs = engine.generate(inputs)
    return [o.token_ids for o in outputs], RoundTotals.of(engine.round_stats).mean_accept_length


def duplicate(values: list) -> object | None:
    """The first value given twice in ``values``, or None."""
    return next((v for i, v in enumerate(values) if v in values[:i]), None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="+", type=existing_dir)
    parser.add_argument("--prompts", type=at_least(1), default=8)
    parser.add_argument("--seed", type=at_least(0), default=2000)  # held out: no training run draws prompts with it
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument(
        "--strategies", nargs="+", type=strategy_name, default=["3_1_4", "5_1_6", "7_1_8", "6_2_12", "8_4_32"]
    )
    parser.add_argument("--out", type=new_file, default="runs/drafter_ttt/side_by_side.json")
    args = parser.parse_args(argv)
    for flag, values in (("drafters", [d.resolve() for d in args.drafters]), ("--strategies", args.strategies)):
        if duplicate(values) is not None:
            parser.error(f"{flag}: {duplicate(values)} is given twice")
    for path in args.drafters:
        try:
            read_checked_drafter(path)
        except ValueError as err:
            parser.error(f"drafter {path}: {err}")
    args.drafters = [str(d) for d in args.drafters]
    torch.set_num_threads(1)
    policy = load_model(bundled_model_dir()).eval()
    try:
        drafters = {path: load_drafter(path, policy)[0] for path in args.drafters}
    except ValueError as err:
        parser.error(str(err))
    prompts = task_prompts(load_tokenizer(bundled_model_dir()), args.prompts, args.seed)
    rows = []
    for temperature in (0.0, 1.0):
        inputs = [
            GenerateInput(p, SamplingParams(max_new_tokens=1024, temperature=temperature, seed=i))
            for i, p in enumerate(prompts)
        ]
        plain = time_median(partial(decode, policy, None, "disable", inputs), args.repeats)
        reference = plain.result[0]
        for strategy in args.strategies:
            for path, drafter in drafters.items():
                timing = time_median(partial(decode, policy, drafter, strategy, inputs), args.repeats)
                tokens, accept = timing.result
                if tokens != reference:
                    raise RuntimeError(f"{path} {strategy} T={temperature}: output differs from plain decoding")
                row = {
                    "drafter": path,
                    "strategy": strategy,
                    "temperature": temperature,
                    "accept_length": round(accept, 3),
                    "speedup": round(plain.median_s / timing.median_s, 3),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_atomic(args.out, json.dumps({"args": vars(args), "rows": rows}, indent=2, default=str) + "\n")
    print("| T | strategy | " + " | ".join(f"{p}: accept, speedup" for p in args.drafters) + " |")
    for temperature in (0.0, 1.0):
        for strategy in args.strategies:
            cells = [
                f"{r['accept_length']:.2f}, {r['speedup']:.2f}×"
                for p in args.drafters
                for r in rows
                if r["drafter"] == p and r["strategy"] == strategy and r["temperature"] == temperature
            ]
            print(f"| {temperature:g} | {strategy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
