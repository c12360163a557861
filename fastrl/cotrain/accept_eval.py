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
    """Mean emitted tokens per request per round (accepted drafts + 1) for one strategy."""

    strategy: str
    temperature: float
    mean_accept_length: float


def measure_accept_length(
    policy: CausalLM, drafter: EagleDrafter, inputs: list[GenerateInput], strategy: str, config: EngineConfig
) -> float:
    """Run `inputs` with a fixed strategy in an engine of `config` (its max_batch_size is the batch size);
    token-weighted mean accept length over all rows of all rounds."""
    engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
    engine.generate(inputs)
    return RoundTotals.of(engine.round_stats).mean_accept_length


def accept_text(length: float) -> str:
    """An accept length as printed: 0 is what a measure without any decode round gives (every held-out response
    ended at its first token), said so rather than shown below the floor of 1."""
    return f"{length:.2f}" if length > 0 else "not measured (no decode round)"
