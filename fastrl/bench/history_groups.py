"""GRPO groups at batch size 1: each prompt's n samples decoded one after another, so every sample after the first
can draft from its siblings (history arms) as well as from the EAGLE drafter. Plain, EAGLE, history, hybrid and
bandit rows side by side on the same requests; at T=0 also HF generate and HF prompt-lookup decoding."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.factory import build_selector
from fastrl.bench.spec_bs1 import hf_rows
from fastrl.bench.timing import EngineRun, time_median
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.round_stats import RoundTotals


@dataclass
class GroupRow:
    """One method over the same grouped requests at batch size 1."""

    method: str
    temperature: float
    tok_s: float
    speedup: float
    accept_length: float | None = None
    draft_share: float | None = None  # fraction of round time spent drafting (EAGLE steps and history lookups)


def group_inputs(prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float) -> list[GenerateInput]:
    """Every prompt n times, siblings adjacent, seeds distinct."""
    return [
        GenerateInput(p, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=i * n + j))
        for i, p in enumerate(prompts)
        for j in range(n)
    ]


def bench_groups_bs1(
    policy: CausalLM,
    drafter: EagleDrafter,
    hf_model: torch.nn.Module | None,
    prompts: list[list[int]],
    n: int,
    selectors: list[str],
    bandit_strategies: list[str],
    max_new_tokens: int,
    repeats: int,
    temperatures: list[float],
    pad_id: int,
) -> list[GroupRow]:
    """Rows per temperature: plain first, then each selector (a strategy string, or 'bandit' over
    `bandit_strategies`); outputs must equal plain. HF rows at T=0 when `hf_model` is given."""
    rows: list[GroupRow] = []
    bandit = BanditConfig(strategies=list(bandit_strategies), epsilon=0.1, min_pulls=3)
    for temperature in temperatures:
        inputs = group_inputs(prompts, n, max_new_tokens, temperature)
        plain = time_median(partial(_run, policy, None, "disable", inputs, bandit), repeats)
        reference = [o.token_ids for o in plain.result.outputs]
        tokens = sum(len(t) for t in reference)
        plain_tok_s = tokens / plain.median_s
        rows.append(GroupRow("fastrl plain", temperature, plain_tok_s, 1.0, 1.0, 0.0))
        for name in selectors:
            timing = time_median(partial(_run, policy, drafter, name, inputs, bandit), repeats)
            if [o.token_ids for o in timing.result.outputs] != reference:
                raise RuntimeError(f"selector {name} changed the output: exactness is broken")
            totals = RoundTotals.of(timing.result.engine.round_stats)
            share = totals.draft_time_s / totals.wall_time_s if totals.wall_time_s else 0.0
            speedup = plain.median_s / timing.median_s
            rows.append(
                GroupRow(
                    f"fastrl {name}", temperature, tokens / timing.median_s, speedup, totals.mean_accept_length, share
                )
            )
        if temperature == 0.0 and hf_model is not None:
            requests = [i.prompt_ids for i in inputs]
            for r in hf_rows(hf_model, requests, max_new_tokens, repeats, pad_id, plain_tok_s):
                rows.append(GroupRow(r.method, 0.0, r.tok_s, r.speedup))
    return rows


def _run(
    policy: CausalLM, drafter: EagleDrafter | None, name: str, inputs: list[GenerateInput], bandit: BanditConfig
) -> EngineRun:
    selector = build_selector(name, bandit=bandit)
    uses_drafter = any(s.uses_drafter for s in selector.strategies)
    device = str(next(policy.parameters()).device)
    engine = Engine(
        policy,
        EngineConfig(max_batch_size=1, device=device),
        drafter=drafter if uses_drafter else None,
        selector=selector,
    )
    return EngineRun(engine, engine.generate(inputs))
