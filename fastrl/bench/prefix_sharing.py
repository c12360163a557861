"""Prefill time with and without prefix sharing on GRPO-shaped batches (prompts x n samples), side by side."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from fastrl.bench.timing import time_median
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams


@dataclass
class PrefixSharingRow:
    """One group size: median wall time of admitting and prefilling the whole batch (one sampled token each)."""

    samples_per_prompt: int
    prompts: int
    prompt_tokens: int
    unshared_s: float
    shared_s: float
    rows_computed: int

    @property
    def speedup(self) -> float:
        return self.unshared_s / self.shared_s


def bench_prefix_sharing(
    model: CausalLM, prompts: list[list[int]], group_sizes: list[int], repeats: int, device: str = "cpu"
) -> list[PrefixSharingRow]:
    """For each n in `group_sizes`: every prompt n times (GRPO's rollout batch), prefilled in one admission with
    sharing off, then on. Each request samples one token, so the time is the prefill's."""
    rows = []
    for n in group_sizes:
        inputs = [
            GenerateInput(p, SamplingParams(max_new_tokens=1, temperature=1.0, seed=i * n + j))
            for i, p in enumerate(prompts)
            for j in range(n)
        ]
        times, computed, outputs = {}, 0, {}
        for sharing in (False, True):
            config = EngineConfig(max_batch_size=len(inputs), device=device, prefix_sharing=sharing)
            timing = time_median(partial(_prefill, model, config, inputs), repeats, device)
            times[sharing] = timing.median_s
            engine, outs = timing.result
            outputs[sharing] = [o.token_ids for o in outs]
            computed = engine.prefill_rows.computed
        if outputs[False] != outputs[True]:
            raise RuntimeError("prefix sharing changed the sampled tokens: exactness is broken")
        tokens = sum(len(p) for p in prompts) * n
        rows.append(PrefixSharingRow(n, len(prompts), tokens, times[False], times[True], computed))
    return rows


def _prefill(model: CausalLM, config: EngineConfig, inputs: list[GenerateInput]):
    engine = Engine(model, config)
    return engine, engine.generate(inputs)
