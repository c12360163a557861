"""What a plain round costs in a speculative engine beside a drafter-free engine's.

A bandit's plain rounds (its anchors, and every round where plain is the best arm) run in an engine that has a
drafter: the policy's forward also keeps the drafter's input features and the round queues them for the drafter's
next catch-up. This times that price: two engines over the same requests (bundled model and drafter, T=1, random
prompts), one without a drafter and one with it whose selector always picks plain, stepping alternately; the ratio of
their CPU times is taken round by round (pairs close in time see the same load) and the median printed. ``--arm``
names the speculative arm the engine holds besides plain (one with a history part also keeps the history index,
which every round extends with each row's tokens).

  python -m fastrl.bench.plain_overhead --batch-size 1
  python -m fastrl.bench.plain_overhead --batch-size 16,64 --arm 3_1_4+suffix_8
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.bench.cli_args import at_least, int_list
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.strategy import DISABLE, Strategy

CHAIN = Strategy(3, 1, 4)
"""The arm held by default: a drafter chain (3_1_4)."""


class PlainAmongDrafterArms:
    """A selector whose arms include a drafter strategy (so the engine loads the drafter and feeds it) and that
    always chooses plain decoding."""

    def __init__(self, drafter_arm: Strategy) -> None:
        self._arms = [drafter_arm, DISABLE]

    @property
    def strategies(self) -> list[Strategy]:
        return list(self._arms)

    def choose(self, batch_size: int) -> Strategy:
        return DISABLE

    def observe(self, stats: RoundStats) -> None:
        """Learns nothing."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""


def engine_context(rounds: int, prompt_len: int = 40) -> int:
    """The max_model_len of `paired_ratios`' engines: their prompts, `rounds` tokens and a few more."""
    return prompt_len + rounds + 8


def paired_ratios(
    policy: CausalLM,
    drafter: EagleDrafter,
    batch_size: int,
    rounds: int,
    repeats: int,
    prompt_len: int = 40,
    arm: Strategy = CHAIN,
) -> list[float]:
    """Per round, CPU seconds of the plain round of an engine holding ``arm`` (its drafter, its history index) over
    the drafter-free engine's, `repeats` pairs of fresh engines of `rounds` rounds each (the first 10 of each left
    out as warm-up)."""

    def engine(with_drafter: bool) -> Engine:
        selector = PlainAmongDrafterArms(arm) if with_drafter else FixedSelector(DISABLE)
        config = EngineConfig(max_batch_size=batch_size, max_model_len=engine_context(rounds, prompt_len))
        made = Engine(policy, config, drafter=drafter if with_drafter else None, selector=selector)
        rng = random.Random(0)
        params = SamplingParams(max_new_tokens=rounds + 4, temperature=1.0, ignore_eos=True, seed=1)
        for _ in range(batch_size):
            made.add_request([rng.randrange(3, policy.config.vocab_size) for _ in range(prompt_len)], params)
        made.step()  # prefill
        return made

    ratios = []
    for _ in range(repeats):
        free, fed = engine(False), engine(True)
        for i in range(rounds):
            t0 = time.process_time()
            free.step()
            t1 = time.process_time()
            fed.step()
            t2 = time.process_time()
            if i >= 10:
                ratios.append((t2 - t1) / max(t1 - t0, 1e-9))
    return ratios


def main(argv: list[str] | None = None) -> None:
    """Print the median ratio of a plain round with a drafter loaded to one without, at each batch size."""
    from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
    from fastrl.commands.engine_setup import check_kv_memory
    from fastrl.models.checkpoint import load_model, read_config
    from fastrl.speculative.drafter_checkpoint import load_drafter

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--batch-size", type=int_list(1), default=[1], help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=at_least(11), default=400, help="rounds per engine (the first 10 warm up)")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--arm", type=_drafter_arm, default="3_1_4", help="arm held besides plain, S_K_N[+suffix_M]")
    args = parser.parse_args(argv)
    config = read_config(bundled_model_dir())
    context = engine_context(args.rounds)
    if context > config.max_position_embeddings:
        parser.error(
            f"argument --rounds: {args.rounds} rounds pass the bundled model's {config.max_position_embeddings} "
            f"positions (the rows would stop and later rounds time idle steps); give at most "
            f"{args.rounds - (context - config.max_position_embeddings)}"
        )
    try:  # two engines of this context at the largest batch
        check_kv_memory("--batch-size", config, max(args.batch_size), torch.float32, "cpu", 2 * context)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(1)
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    for batch in args.batch_size:
        ratios = paired_ratios(policy, drafter, batch, args.rounds, args.repeats, arm=args.arm)
        print(
            f"batch {batch}: plain round of an engine holding {args.arm} / without a drafter, median "
            f"{statistics.median(ratios):.4f} over {len(ratios)} pairs",
            flush=True,
        )


def _drafter_arm(text: str) -> Strategy:
    """A strategy that uses the drafter (``argparse`` type)."""
    try:
        arm = Strategy.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if not arm.uses_drafter:
        raise argparse.ArgumentTypeError(f"{text}: the arm must use the drafter (S_K_N, or S_K_N+suffix_M)")
    return arm


if __name__ == "__main__":
    main()
