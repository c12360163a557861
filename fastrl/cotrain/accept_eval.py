"""Measure a drafter where it matters: mean accept length of real speculative rounds."""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.adaptive.fixed import FixedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.round_stats import RoundTotals


@dataclass
class AcceptResult:
    """One strategy's held-out figures: ``mean_accept_length``, the tokens a round added per request (accepted
    drafts + 1, cut where the request finished: `RoundTotals.mean_accept_length`), and ``mean_accepted_drafts``,
    the drafts the policy accepted per request and round, uncut (what the bandit's prior reads)."""

    strategy: str
    temperature: float
    mean_accept_length: float
    mean_accepted_drafts: float


def measure_rounds(
    policy: CausalLM, drafter: EagleDrafter, inputs: list[GenerateInput], strategy: str, config: EngineConfig
) -> RoundTotals:
    """Run `inputs` with a fixed strategy in an engine of `config` (its max_batch_size is the batch size); the
    decode rounds' totals."""
    engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
    engine.generate(inputs)
    return RoundTotals.of(engine.round_stats)


def measure_accept_length(
    policy: CausalLM, drafter: EagleDrafter, inputs: list[GenerateInput], strategy: str, config: EngineConfig
) -> float:
    """``measure_rounds``' row-weighted mean accept length over all rounds."""
    return measure_rounds(policy, drafter, inputs, strategy, config).mean_accept_length


def accept_text(length: float) -> str:
    """An accept length as printed: 0 is what a measure without any decode round gives (every held-out response
    ended at its first token), said so rather than shown below the floor of 1."""
    return f"{length:.2f}" if length > 0 else "not measured (no decode round)"
