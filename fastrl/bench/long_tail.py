"""A long-tail rollout batch: 64 task requests sampled at T=1 (lengths heavy-tailed), wall time per strategy."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.calibration import calibrate_engine
from fastrl.adaptive.factory import build_selector
from fastrl.bench.timing import EngineRun, Timing
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine, GenerateInput
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.telemetry.round_summary import summarize_rounds


@dataclass
class LongTailRow:
    """Wall time of the whole batch under one strategy selector, and its speedup over plain; the engine's round
    statistics and strategy selector are kept for arm tables, plots and cost fitting."""

    selector: str
    wall_s: float
    speedup: float
    rounds: int
    mean_accept_length: float
    round_stats: list = field(default_factory=list, repr=False)
    strategy_selector: object = field(default=None, repr=False)


def bench_long_tail(
    policy: CausalLM,
    drafter: EagleDrafter,
    prompts: list[list[int]],
    selectors: list[str],
    max_new_tokens: int,
    repeats: int,
    batch_size: int = 64,
    bandit: BanditConfig | None = None,
    max_model_len: int | None = None,
) -> list[LongTailRow]:
    """Run the same batch under each strategy selector ('disable' first is the baseline), the selectors taking turns
    in every repeat (so that a slow spell of a shared machine hits them alike); outputs must agree.
    `max_model_len` bounds the KV cache (None: the model's whole context)."""
    inputs = [
        GenerateInput(p, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=i))
        for i, p in enumerate(prompts)
    ]
    names = ["disable"] + [p for p in selectors if p != "disable"]
    if "bandit" in names:  # calibrate once, untimed: every timed engine then reads the cached calibration
        _engine(policy, drafter, "bandit", batch_size, bandit, max_model_len)
    run = {name: partial(_run, policy, drafter, name, inputs, batch_size, bandit, max_model_len) for name in names}
    timings = time_interleaved(run, repeats)
    reference = None
    rows: list[LongTailRow] = []
    for name in names:
        timing = timings[name]
        engine = timing.result.engine
        tokens = [o.token_ids for o in timing.result.outputs]
        if reference is None:
            reference = tokens
        elif tokens != reference:
            raise RuntimeError(f"selector {name} changed the output: exactness is broken")
        summary = summarize_rounds(engine.round_stats)
        base = rows[0].wall_s if rows else timing.median_s
        rows.append(
            LongTailRow(
                name,
                timing.median_s,
                base / timing.median_s,
                summary.rounds,
                summary.mean_accept_length,
                engine.round_stats,
                engine.selector,
            )
        )
    return rows


def _engine(
    policy: CausalLM,
    drafter: EagleDrafter,
    name: str,
    batch_size: int,
    bandit: BanditConfig | None,
    max_model_len: int | None,
) -> Engine:
    device = str(next(policy.parameters()).device)
    engine = Engine(
        policy,
        EngineConfig(max_batch_size=batch_size, max_model_len=max_model_len, device=device),
        drafter=None if name == "disable" else drafter,
        selector=build_selector(name, bandit=bandit),
    )
    calibrate_engine(engine)  # the bandit's round costs, as engine start gives them (from the cache once measured)
    return engine


def _run(
    policy: CausalLM,
    drafter: EagleDrafter,
    name: str,
    inputs: list[GenerateInput],
    batch_size: int,
    bandit: BanditConfig | None,
    max_model_len: int | None,
) -> EngineRun:
    engine = _engine(policy, drafter, name, batch_size, bandit, max_model_len)
    return EngineRun(engine, engine.generate(inputs))


def time_interleaved(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, Timing]:
    """Each callable ``repeats`` times, taking turns in every repeat; the median wall time of each, its last result."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    results: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: Timing(statistics.median(t), t, results[name]) for name, t in times.items()}


def cost_measurements(rows: list[LongTailRow]) -> list[dict]:
    """Every measured round as {strategy, batch_size, seconds}: what `python -m fastrl.adaptive.sim --costs` fits."""
    return [
        {"strategy": str(s.strategy), "batch_size": s.batch_size, "seconds": s.wall_time_s}
        for row in rows
        for s in row.round_stats
    ]
