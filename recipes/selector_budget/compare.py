"""The bandit at several exploration budgets on the simulator's test grid (the cases of tests/adaptive/test_sim.py:
six GPU-like cases, then the CPU-measured and H100-fitted cost models on every standard workload): per case bandit /
per-bucket oracle and bandit / best static strategy, then the minimum and mean of each.

    python recipes/selector_budget/compare.py 0.05,0.02,0.01
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests package holds the grid

from fastrl.adaptive.bandit import BanditSelector  # noqa: E402
from fastrl.adaptive.bandit_config import BanditConfig  # noqa: E402
from fastrl.adaptive.sim import compare, simulated_calibration  # noqa: E402
from tests.adaptive.test_sim import CASES, COSTS, WORKLOADS, settings_for  # noqa: E402


def _bandit(names: list[str], budget: float, calibration):
    return lambda: BanditSelector(BanditConfig(strategies=names, explore_budget=budget), calibration=calibration)


def budget_list(text: str) -> list[float]:
    """An argparse ``type``: distinct exploration budgets (finite numbers >= 0) separated by commas."""
    try:
        budgets = [float(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated numbers, got {text!r}") from None
    bad = [b for b in budgets if not 0 <= b < math.inf]
    if bad:
        raise argparse.ArgumentTypeError(f"each must be a finite number >= 0, got {bad[0]} in {text!r}")
    if len(set(budgets)) < len(budgets):
        raise argparse.ArgumentTypeError(f"a budget is given twice in {text!r}")
    return budgets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "budgets", nargs="?", type=budget_list, default="0.05,0.02,0.01", help="comma-separated exploration budgets"
    )
    run(parser.parse_args(argv).budgets)


def run(budgets: list[float]) -> None:
    cases = [(w, s, "gpu-default") for w, s in CASES]
    cases += [(w, 0, c) for c in ("cpu-measured", "h100-fitted") for w in WORKLOADS]
    ratios: dict[float, list[tuple[float, float]]] = {b: [] for b in budgets}
    for workload, seed, costs in cases:
        settings = settings_for(seed, COSTS[costs]())
        calibration = simulated_calibration(settings, WORKLOADS[workload].requests_per_rollout)
        names = [str(s) for s in settings.strategies]
        selectors = {b: _bandit(names, b, calibration) for b in budgets}
        result = compare(WORKLOADS[workload], settings, selectors)
        line = f"{workload:>18} seed {seed} {costs:>12}"
        for b in budgets:
            goodput = result.results[b].goodput
            ratios[b].append((goodput / result.oracle.goodput, goodput / result.best_static.goodput))
            line += f" | {b}: {ratios[b][-1][0]:.3f} {ratios[b][-1][1]:.3f}"
        print(line, flush=True)
    for b in budgets:
        oracle, static = [r[0] for r in ratios[b]], [r[1] for r in ratios[b]]
        print(
            f"explore_budget {b}: vs oracle min {min(oracle):.3f} mean {sum(oracle) / len(oracle):.3f}; "
            f"vs best static min {min(static):.3f} mean {sum(static) / len(static):.3f}"
        )


if __name__ == "__main__":
    main()
