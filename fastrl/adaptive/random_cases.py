"""Random cost models and GRPO workloads for the simulator: the cases no hand-made workload covers.

Case ``k`` draws, from a generator seeded by ``k``, a cost model (a forward of 2-50 ms that stays flat up to a
saturation of 16-512 tokens, a drafter step of 0.2-10 ms, a speculation overhead) and a workload of one or two
acceptance phases (top-1 hit 0.2-0.9, depth and width decays, per-request jitter) over 6 rollouts of 8-64 requests.
Memory-bound cost models (a large saturation: a 32-node tree costs what a 16-node one does) and weak top-1 drafters
whose wide trees still accept deep are where a selector that learned from its cheap arms can lock out its best one;
``recipes/selector_random/run.py`` sweeps them and tests/adaptive/test_random_cases.py holds the cases that did.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastrl.adaptive.acceptance import AcceptanceProfile
from fastrl.adaptive.bandit import BanditSelector
from fastrl.adaptive.bandit_config import BanditConfig
from fastrl.adaptive.cost_model import CostModel, CostParams
from fastrl.adaptive.sim import DEFAULT_SIM_STRATEGIES, SimSettings, compare, simulated_calibration
from fastrl.adaptive.workload import Phase, Workload
from fastrl.strategy.strategy import Strategy


def random_case(k: int) -> tuple[CostParams, Workload]:
    """The cost model and workload of case ``k`` (the same for the same ``k``)."""
    r = np.random.default_rng([1234, k])
    params = CostParams(
        forward_s=float(r.uniform(0.002, 0.05)),
        saturation_tokens=int(r.choice([16, 64, 128, 512])),
        draft_step_s=float(r.uniform(0.0002, 0.01)),
        draft_saturation_tokens=int(r.choice([32, 128, 512])),
        spec_overhead_s=float(r.uniform(0, 0.005)),
    )
    phases = []
    for i in range(int(r.integers(1, 3))):
        acceptance = AcceptanceProfile(
            top1_hit=float(r.uniform(0.2, 0.9)),
            depth_decay=float(r.uniform(0.85, 1.0)),
            width_decay=float(r.uniform(0.5, 0.95)),
            request_jitter=float(r.uniform(0, 0.15)),
        )
        phases.append(Phase(i * 3, acceptance))
    workload = Workload(
        f"random-{k}",
        tuple(phases),
        num_rollouts=6,
        requests_per_rollout=int(r.choice([8, 16, 32, 64])),
        median_length=int(r.integers(50, 300)),
        length_sigma=float(r.uniform(0.3, 1.2)),
    )
    return params, workload


@dataclass(frozen=True)
class CaseResult:
    """The bandit's goodput on one case and seed against the per-bucket oracle, the best static strategy and plain."""

    case: int
    seed: int
    vs_oracle: float
    vs_best_static: float
    vs_plain: float


def run_case(k: int, seed: int) -> CaseResult:
    """The bandit (default arms of the simulator, calibrated as an engine would be) on case ``k`` at ``seed``."""
    params, workload = random_case(k)
    names = list(DEFAULT_SIM_STRATEGIES)
    settings = SimSettings(cost=CostModel(params=params), strategies=tuple(map(Strategy.parse, names)), seed=seed)
    calibration = simulated_calibration(settings, workload.requests_per_rollout)
    bandit = {"bandit": lambda: BanditSelector(BanditConfig(strategies=names), calibration=calibration)}
    comparison = compare(workload, settings, bandit)
    goodput = comparison.results["bandit"].goodput
    return CaseResult(
        k,
        seed,
        goodput / comparison.oracle.goodput,
        goodput / comparison.best_static.goodput,
        goodput / comparison.plain.goodput,
    )
