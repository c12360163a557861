"""What the bandit costs per round beside the model's forwards.

A run's rounds (the bundled model's task prompts at T=1, the long-tail batch or the batch-1 suite) are replayed
through a copy of its bandit taken before the run: a policy forward before each choice, as in an engine (by then the
selector's arrays and code are out of the CPU's caches), then ``choose`` and ``observe`` timed; and back to back,
without forwards. Replayed choices must equal the run's (the selector's choices depend on its inputs only). A second
run with a bandit deciding every round (``decide_every_s=0``) is recorded and replayed the same way.

  python -m fastrl.bench.selector_cost --requests 16 --batch-size 1
  python -m fastrl.bench.selector_cost --requests 64
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from fastrl.adaptive.bandit import BanditSelector
from fastrl.bench.cli_args import at_least, strategy_list
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.strategy.round_stats import RoundStats


@dataclass(frozen=True)
class SelectorCost:
    """One recorded run's rounds replayed: median (over repeats) selector time per round beside forwards and back to
    back, and how many rounds the selector decided (not held by a stretch)."""

    label: str
    rounds: int
    decisions: int
    beside_forwards_us: float
    back_to_back_us: float
    share_of_rounds: float
    """Selector time beside forwards over the rounds' own wall time in the run."""


def record(engine: Engine, inputs: list[GenerateInput]) -> tuple[BanditSelector, list[RoundStats]]:
    """A copy of ``engine``'s bandit as it is now, then the rounds of generating ``inputs`` on ``engine``."""
    if not isinstance(engine.selector, BanditSelector):
        raise ValueError(f"selector_cost times the bandit, the engine's selector is {type(engine.selector).__name__}")
    before = copy.deepcopy(engine.selector)
    start = len(engine.round_stats)
    engine.generate(inputs)
    return before, list(engine.round_stats[start:])


def replay(selector: BanditSelector, rounds: list[RoundStats], forward: Callable[[], None] | None) -> tuple[float, int]:
    """Seconds ``selector`` spends choosing and observing ``rounds`` (``forward()`` before each choice, untimed), and
    how many rounds it decided; raises when a choice differs from the recorded round's strategy."""
    spent, decided = 0.0, 0
    for index, stats in enumerate(rounds):
        if forward is not None:
            forward()
        start = time.perf_counter()
        chosen = selector.choose(stats.batch_size)
        selector.observe(stats)
        spent += time.perf_counter() - start
        if chosen != stats.strategy:
            raise RuntimeError(f"round {index}: the replay chose {chosen}, the run {stats.strategy}")
        decided += selector.last_reason != "held"
    return spent, decided


def selector_cost(
    label: str, before: BanditSelector, rounds: list[RoundStats], forward: Callable[[], None], repeats: int
) -> SelectorCost:
    """``rounds`` replayed ``repeats`` times through copies of ``before``, beside forwards and back to back."""
    beside, alone, decided = [], [], 0
    for _ in range(repeats):
        spent, decided = replay(copy.deepcopy(before), rounds, forward)
        beside.append(spent)
        alone.append(replay(copy.deepcopy(before), rounds, None)[0])
    seconds, count = statistics.median(beside), len(rounds)
    run_seconds = sum(s.wall_time_s for s in rounds)
    return SelectorCost(
        label, count, decided, seconds / count * 1e6, statistics.median(alone) / count * 1e6, seconds / run_seconds
    )


def main(argv: list[str] | None = None) -> None:
    """Print the selector's cost per round on the bundled model's long-tail batch or batch-1 suite."""
    import argparse

    import torch

    from fastrl.adaptive.bandit_config import BanditConfig
    from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
    from fastrl.bench.long_tail import _engine, check_slots
    from fastrl.bench.workload import bench_prompts
    from fastrl.models.checkpoint import load_model
    from fastrl.models.tokenizer import load_tokenizer
    from fastrl.sampling.params import SamplingParams
    from fastrl.speculative.drafter_checkpoint import load_drafter

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--requests", type=at_least(1), default=64)
    parser.add_argument("--batch-size", type=at_least(0), default=0, help="most requests at once (0: all; 1: batch 1)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=1024)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument(
        "--arms",
        type=strategy_list,
        default="12_1_13@0.3,7_1_8,5_1_6,3_1_4,8_4_32,suffix_8,3_1_4+suffix_8,disable",
        help="the bandit's arms, comma-separated",
    )
    args = parser.parse_args(argv)
    try:
        check_slots(args, bundled_model_dir(), "cpu", 1)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(1)
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    prompts = bench_prompts(load_tokenizer(bundled_model_dir()), "auto", args.requests, 2)[: args.requests]
    context = min(policy.config.max_position_embeddings, max(map(len, prompts)) + args.max_new_tokens + 1)
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    step = torch.tensor([[1]]), torch.tensor([[len(prompts[0])]])

    def forward() -> None:  # one plain decode-sized forward of the policy: what precedes a choice in an engine
        with torch.no_grad():
            policy(*step)

    configured = BanditConfig(strategies=args.arms)
    cases = [("as configured", configured), ("deciding every round", replace(configured, decide_every_s=0.0))]
    for label, bandit in cases:
        engine = _engine(policy, drafter, "bandit", args.batch_size or args.requests, bandit, context)
        before, rounds = record(engine, inputs)
        row = selector_cost(label, before, rounds, forward, args.repeats)
        print(
            f"{row.label:>22}: {row.beside_forwards_us:5.0f} us a round beside forwards "
            f"({row.share_of_rounds:6.2%} of the rounds' time), {row.back_to_back_us:5.0f} us back to back; "
            f"{row.decisions} of {row.rounds} rounds decided"
        )


if __name__ == "__main__":
    main()
