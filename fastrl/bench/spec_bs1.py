"""Batch-size-1 decoding: plain vs static speculative strategies vs HF generate vs HF prompt-lookup decoding."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from fastrl.adaptive.fixed import FixedSelector
from fastrl.bench.round_costs import measure_round_costs
from fastrl.bench.timing import EngineRun, time_median
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import Strategy


@dataclass
class Bs1Row:
    """One method at batch size 1 over the same prompts: tokens/s, speedup over plain, accept length and the
    achieved fraction of the physical limit (speculative rows)."""

    method: str
    temperature: float
    tok_s: float
    speedup: float
    accept_length: float | None = None
    physical_limit: float | None = None

    @property
    def fraction_of_limit(self) -> float | None:
        if self.physical_limit is None:
            return None
        return self.speedup / self.physical_limit


def _run_engine(
    policy: CausalLM,
    drafter: EagleDrafter | None,
    strategy: str,
    inputs: list[GenerateInput],
    max_model_len: int | None = None,
) -> EngineRun:
    device = str(next(policy.parameters()).device)  # the engine runs where the benchmarked policy lives
    config = EngineConfig(max_batch_size=1, max_model_len=max_model_len, device=device)
    engine = Engine(policy, config, drafter=drafter, selector=FixedSelector(strategy))
    return EngineRun(engine, engine.generate(inputs))


def bench_bs1(
    policy: CausalLM,
    drafter: EagleDrafter,
    hf_model: torch.nn.Module,
    prompts: list[list[int]],
    strategies: list[str],
    max_new_tokens: int,
    repeats: int,
    temperatures: list[float],
    pad_id: int,
    max_model_len: int | None = None,
) -> list[Bs1Row]:
    """Each prompt decoded alone (the long-tail regime); outputs of all fastrl rows are identical by construction,
    so every method does the same work. HF rows run greedy only (their sampler differs). `max_model_len` bounds the
    KV cache (None: the model's whole context)."""
    rows: list[Bs1Row] = []
    context = sum(len(p) for p in prompts) // len(prompts) + max_new_tokens // 2
    for temperature in temperatures:
        inputs = [
            GenerateInput(p, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=i))
            for i, p in enumerate(prompts)
        ]
        plain = time_median(partial(_run_engine, policy, None, "disable", inputs, max_model_len), repeats)
        reference = [o.token_ids for o in plain.result.outputs]
        tokens = sum(len(t) for t in reference)
        rows.append(Bs1Row("fastrl plain", temperature, tokens / plain.median_s, 1.0))
        for name in strategies:
            strategy = Strategy.parse(name)
            timing = time_median(partial(_run_engine, policy, drafter, name, inputs, max_model_len), repeats)
            run = timing.result
            engine = run.engine
            if [o.token_ids for o in run.outputs] != reference:
                raise RuntimeError(f"strategy {name} changed the output: exactness is broken")
            rounds = max(1, len(engine.round_stats))
            accept = sum(s.mean_accept_length for s in engine.round_stats) / rounds
            if strategy.stops_early:  # costed as the fixed chain of its mean drafted depth
                depth = sum(s.stopped_depth or 0 for s in engine.round_stats) / rounds
                strategy = strategy.truncated(min(strategy.steps, max(1, round(depth))))
            costs = measure_round_costs(policy, drafter, strategy, context)
            speedup = plain.median_s / timing.median_s
            rows.append(
                Bs1Row(
                    f"fastrl {name}",
                    temperature,
                    tokens / timing.median_s,
                    speedup,
                    accept,
                    costs.physical_limit(strategy, accept),
                )
            )
        if temperature == 0.0:
            rows += hf_rows(hf_model, prompts, max_new_tokens, repeats, pad_id, tokens / plain.median_s)
    return rows


def hf_rows(hf_model, prompts, max_new_tokens, repeats, pad_id, plain_tok_s) -> list[Bs1Row]:
    """HF generate and HF prompt-lookup decoding, greedy, each prompt alone."""

    def run(lookup: int | None) -> int:
        produced = 0
        for p in prompts:
            ids = torch.tensor([p], device=hf_model.device)
            extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
            with torch.inference_mode():
                out = hf_model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=pad_id,
                    **extra,
                )
            produced += out.shape[1] - len(p)
        return produced

    rows = []
    for name, lookup in (("HF generate", None), ("HF prompt lookup", 10)):
        timing = time_median(partial(run, lookup), repeats)
        tok_s = timing.result / timing.median_s
        rows.append(Bs1Row(name, 0.0, tok_s, tok_s / plain_tok_s))
    return rows
