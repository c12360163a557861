"""What feeding a fused drafter costs the engine: the shipped drafter against the same weights as a
FusedEagleDrafter reading layers 0 and 2 with the identity fuse (so drafts, rounds and tokens are identical and only
the input plumbing differs: the policy's extra layer outputs, their concat, DrafterFeed [.., 3H], the fuse matmul).
Runs alternate between the two, CPU seconds of this one-thread process, medians.

  OMP_NUM_THREADS=1 python recipes/drafter_ttt/fused_round_cost.py --repeats 7
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
from fastrl.bench.cli_args import at_least
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.checkpoint import load_model
from fastrl.models.tokenizer import load_tokenizer
from fastrl.rl.tasks.task import ArithChainTask
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter_checkpoint import load_drafter
from fastrl.speculative.fused_drafter import FusedEagleDrafter
from fastrl.strategy.strategy import Strategy


def arm(text: str) -> tuple[str, int]:
    """An argparse ``type``: ``STRATEGY:BATCH`` (a strategy string and a batch size >= 1)."""
    strategy, colon, batch = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"{text!r}: expected STRATEGY:BATCH, e.g. 7_1_8:1")
    try:
        Strategy.parse(strategy)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    try:
        size = int(batch)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: batch size {batch!r} is not an integer") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: batch size must be >= 1, got {size}")
    return strategy, size


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=at_least(1), default=7)
    parser.add_argument("--prompts", type=at_least(1), default=8)
    parser.add_argument("--new-tokens", type=at_least(1), default=400)
    arms = [("7_1_8", 1), ("disable", 1), ("5_2_8", 8)]
    parser.add_argument(
        "--arms", nargs="+", type=arm, default=arms, help="STRATEGY:BATCH ... (default: 7_1_8:1 disable:1 5_2_8:8)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    policy = load_model(bundled_model_dir()).eval()
    tokenizer = load_tokenizer(bundled_model_dir())
    shipped = load_drafter(bundled_drafter_dir(), policy)[0]
    fused = FusedEagleDrafter(policy.config, (0, 2))
    fused.load_state_dict({**shipped.state_dict(), "fuse.weight": fused.fuse.weight})
    rng = random.Random(7)
    prompts = [tokenizer(ArithChainTask().sample_problem(rng).prompt)["input_ids"] for _ in range(args.prompts)]
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    print("| strategy | bs | last layer (CPU s) | fused (CPU s) | fused / last |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for strategy, batch in args.arms:
        label = f"{strategy}:{batch}"
        times: dict[str, list[float]] = {"last": [], "fused": []}
        tokens: dict[str, list[list[int]]] = {}
        for rep in range(args.repeats):
            order = [("last", shipped), ("fused", fused)]
            for name, drafter in order if rep % 2 == 0 else order[::-1]:
                config = EngineConfig(max_batch_size=batch)
                engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
                start = time.process_time()
                tokens[name] = [o.token_ids for o in engine.generate(inputs)]
                times[name].append(time.process_time() - start)
        if tokens["last"] != tokens["fused"]:
            raise RuntimeError(f"{label}: the identity fuse changed the tokens")
        last, fused_s = (sorted(times[k])[len(times[k]) // 2] for k in ("last", "fused"))
        print(f"| {strategy} | {batch} | {last:.2f} | {fused_s:.2f} | {fused_s / last:.3f} |", flush=True)


if __name__ == "__main__":
    main()
