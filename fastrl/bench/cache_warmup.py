"""What a plain round costs right after other rounds, by its position after them: the processor's caches warming up.

A plain round that follows rounds of another engine at a larger batch (as a calibration's sizes take turns), or a
round of another arm in the same engine (a bandit's plain anchor among speculative rounds), finds less of the policy
in the CPU's caches than a round after plain rounds of its own. This times it: cycles of ``--before`` rounds of the
other kind, then ``--positions`` plain rounds of the timed engine; each position's median round time is printed over
the last position's (the steady state). The calibration's warm-up (``calibration.WARMUP_ROUNDS``) and its cold plain
rounds (``RoundTimes.cold_penalty``) follow these figures.

  python -m fastrl.bench.cache_warmup --after batch --other-batch 64 --batch-size 1
  python -m fastrl.bench.cache_warmup --after arm --arm 3_1_4 --batch-size 1,16
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

import torch

from fastrl.bench.cli_args import at_least, int_list, strategy_name
from fastrl.engine.calibration import ScriptedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import DISABLE, Strategy

PROMPT_TOKENS = 200
"""Prompt tokens of every row (random tokens)."""


@dataclass(frozen=True)
class WarmupSetting:
    """What one measurement runs: plain rounds at ``batch_size`` after ``before`` rounds of ``arm`` in the same
    engine (``other_batch`` None) or of plain rounds of another engine at ``other_batch`` rows."""

    batch_size: int
    arm: Strategy
    other_batch: int | None
    before: int
    positions: int
    cycles: int


def _engine(
    policy: CausalLM, drafter: EagleDrafter, batch_size: int, arm: Strategy, context: int
) -> tuple[Engine, ScriptedSelector]:
    """An engine of ``batch_size`` rows of random prompts (prefilled), and its selector, scripted among ``arm`` and
    plain."""
    selector = ScriptedSelector([arm, DISABLE])
    selector.next = DISABLE
    config = EngineConfig(max_batch_size=batch_size, max_model_len=context)
    engine = Engine(policy, config, drafter=drafter, selector=selector)
    rng = random.Random(batch_size)
    params = SamplingParams(max_new_tokens=context - PROMPT_TOKENS - 1, temperature=1.0, ignore_eos=True, seed=1)
    for _ in range(batch_size):
        engine.add_request([rng.randrange(3, policy.config.vocab_size) for _ in range(PROMPT_TOKENS)], params)
    engine.step()
    return engine, selector


def tokens_needed(setting: WarmupSetting) -> int:
    """Most tokens a row of the timed engine takes (every round of the other arm may emit its longest path)."""
    other = 0 if setting.other_batch is not None else setting.before * setting.arm.max_accept_length
    return PROMPT_TOKENS + setting.cycles * (setting.positions + other) + 2


def warmup_ratios(policy: CausalLM, drafter: EagleDrafter, setting: WarmupSetting) -> list[float]:
    """Median plain round time at each position after the other rounds, over the last position's.  # [positions]"""
    context = tokens_needed(setting)
    timed, script = _engine(policy, drafter, setting.batch_size, setting.arm, context)
    other = None if setting.other_batch is None else _engine(policy, drafter, setting.other_batch, DISABLE, context)[0]
    by_position: list[list[float]] = [[] for _ in range(setting.positions)]
    for _ in range(setting.cycles):
        for _ in range(setting.before):
            if other is not None:
                other.step()
            else:
                script.next = setting.arm
                timed.step()
        script.next = DISABLE
        for times in by_position:
            timed.step()
            times.append(timed.round_stats[-1].wall_time_s)
    steady = statistics.median(by_position[-1])
    return [statistics.median(times) / steady for times in by_position]


def main(argv: list[str] | None = None) -> None:
    """Print, per batch size, the plain rounds' times by position after the other rounds, over the steady state."""
    from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
    from fastrl.models.checkpoint import load_model, read_config
    from fastrl.speculative.drafter_checkpoint import load_drafter

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--after", choices=["batch", "arm"], default="batch", help="what the plain rounds follow")
    parser.add_argument("--batch-size", type=int_list(1), default=[1], help="comma-separated batch sizes timed")
    parser.add_argument("--other-batch", type=at_least(1), default=64, help="--after batch: the other engine's rows")
    parser.add_argument("--arm", type=strategy_name, default="3_1_4", help="--after arm: the arm before them")
    parser.add_argument("--before", type=at_least(1), default=3, help="rounds of the other kind per cycle")
    parser.add_argument("--positions", type=at_least(2), default=16, help="plain rounds timed per cycle")
    parser.add_argument("--cycles", type=at_least(1), default=25)
    args = parser.parse_args(argv)
    arm = Strategy.parse(args.arm)
    if arm.is_disabled:
        parser.error("argument --arm: the rounds before the plain ones are another arm's, not disable")
    positions = read_config(bundled_model_dir()).max_position_embeddings
    torch.set_num_threads(1)
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    for batch in args.batch_size:
        other = args.other_batch if args.after == "batch" else None
        setting = WarmupSetting(batch, arm, other, args.before, args.positions, args.cycles)
        if tokens_needed(setting) > positions:
            parser.error(
                f"{args.cycles} cycles of {args.positions} positions take {tokens_needed(setting)} tokens a row, "
                f"past the bundled model's {positions} positions: fewer --cycles or --positions"
            )
        ratios = warmup_ratios(policy, drafter, setting)
        what = f"{args.before} rounds at batch {other}" if other is not None else f"{args.before} {arm} rounds"
        print(f"batch {batch} after {what}: " + " ".join(f"{r:.2f}" for r in ratios), flush=True)


if __name__ == "__main__":
    main()
