"""Cost models fitted to measured round costs, for the simulator: the H100 figures of docs/gpu/h100_results.json.

The H100 run measured plain decoding throughput at batch sizes 1-256 (``plain_vs_hf``), CUDA-event times of one
verify forward over K tokens and one drafter step at batch 1 (``bs1.costs_ms``) and whole speculative rounds at
batch 1 (``bs1.rows``: tokens per second and accept length). The fit: a policy forward over ``T`` tokens costs the
plain round of batch ``T`` (interpolated in tokens; linear beyond the largest batch measured), a verify forward
over ``b * N`` tokens that times the measured verify(N) / plain ratio at batch 1, each drafter step the measured
step scaled like the policy forward over ``b * topk`` tokens, and a speculative round a host overhead linear in its
steps, least-squares fitted to the greedy batch-1 rounds. Assumptions, not measurements, beyond batch 1: it
reproduces the measured 256-request long-tail ratio of ``5_1_6`` (0.28) within a few percent.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fastrl.adaptive.cost_model import CostModel
from fastrl.strategy.strategy import DISABLE, Strategy

H100_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _forward_ms(tokens_per_batch: dict[int, float], tokens: float) -> float:
    """Plain-round milliseconds of a forward over ``tokens`` tokens (linear in tokens between and beyond)."""
    sizes = sorted(tokens_per_batch)
    times = [tokens_per_batch[b] for b in sizes]
    if tokens >= sizes[-1]:
        slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
        return times[-1] + slope * (tokens - sizes[-1])
    return float(np.interp(tokens, sizes, times))


def h100_cost_model(path: str | Path, strategies: list[Strategy], sizes: tuple[int, ...] = H100_SIZES) -> CostModel:
    """The fitted H100 round costs of ``strategies`` (EAGLE arms and ``disable``) at ``sizes``."""
    data = json.loads(Path(path).read_text())
    plain_ms = {int(b): 1000.0 * int(b) / row["fastrl_tok_s"] for b, row in data["plain_vs_hf"]["value"].items()}
    costs = data["bs1"]["value"]["costs_ms"]
    verify_ratio = {int(k): v / costs["t_plain_ms"] for k, v in costs["t_verify_ms"].items()}
    ks = sorted(verify_ratio)
    rows = data["bs1"]["value"]["rows"]
    steps, overhead = [], []
    for name, row in rows.items():
        if not name.startswith("T=0.0 fastrl ") or name.endswith("plain") or "accept_length" not in row:
            continue
        strategy = Strategy.parse(name.removeprefix("T=0.0 fastrl "))
        round_ms = 1000.0 * row["accept_length"] / row["tok_s"]
        verify_ms = costs["t_verify_ms"][str(_nearest(ks, strategy.num_draft_tokens))]
        parts = verify_ms + strategy.steps * costs["t_draft_ms"]
        steps.append(strategy.steps)
        overhead.append(round_ms - parts)
    slope, base = np.polyfit(steps, overhead, 1)
    points = []
    for strategy in strategies:
        for b in sizes:
            if strategy.is_disabled:
                ms = _forward_ms(plain_ms, b)
            else:
                n = strategy.num_draft_tokens
                ratio = float(np.interp(n, ks, [verify_ratio[k] for k in ks]))
                draft = costs["t_draft_ms"] * _forward_ms(plain_ms, b * strategy.topk) / plain_ms[1]
                ms = ratio * _forward_ms(plain_ms, b * n) + strategy.steps * (draft + slope) + base
            points.append((strategy, b, float(ms) / 1000.0))
    return CostModel.fit(points)


def _nearest(values: list[int], target: int) -> int:
    return min(values, key=lambda v: abs(v - target))


def plain_and_arms(names: list[str]) -> list[Strategy]:
    """The parsed arms, ``disable`` included."""
    arms = [Strategy.parse(n) for n in names]
    return arms if DISABLE in arms else [*arms, DISABLE]
