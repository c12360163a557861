"""Replay GRPO rollouts against a cost model and an acceptance model, for any ``StrategySelector``.

Every selector sees the same response lengths and per-request acceptance (common random numbers, seeded per rollout);
acceptance draws and timing noise come from a per-run stream. ``python -m fastrl.adaptive.sim`` prints the table of
the bandit and the EMA controller against the per-bucket oracle, the best single static strategy and plain
decoding on the standard workloads.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from copy import deepcopy
from dataclasses import dataclass, field, replace

import numpy as np

from fastrl.adaptive.buckets import DEFAULT_BS_THRESHOLDS, BatchBuckets
from fastrl.adaptive.cost_model import CostModel
from fastrl.adaptive.oracle import OracleSelector, Table, candidate_arms, expected_times, search_table
from fastrl.adaptive.round_times import calibration_sizes
from fastrl.adaptive.workload import Workload
from fastrl.strategy.round_stats import RoundStats
from fastrl.strategy.selector import StrategySelector
from fastrl.strategy.strategy import DISABLE, Strategy, parse_strategy_space

DEFAULT_SIM_STRATEGIES = ("8_4_32", "8_4_16", "8_4_8", "3_1_4", "disable")
ORACLE_MARGIN = 0.15
"""The per-bucket oracle's search tries, per cell, the arms whose analytic time is within this of the cell's best
(its misses came within 6%: one request alone at the tail, jitter averaged before inverting)."""


@dataclass
class BucketTotals:
    """Tokens, simulated seconds and rounds spent in one batch-size bucket."""

    tokens: int = 0
    time_s: float = 0.0
    rounds: int = 0

    @property
    def goodput(self) -> float:
        """Tokens per simulated second (0.0 when the bucket was never visited)."""
        return self.tokens / self.time_s if self.time_s > 0 else 0.0


@dataclass
class SimResult:
    """One selector's run over one workload."""

    selector: str
    workload: str
    buckets: list[BucketTotals]
    choices: list[Strategy] = field(default_factory=list)
    """Every round's strategy (only with ``SimSettings.record_choices``)."""
    batch_sizes: list[int] = field(default_factory=list)
    """Every round's batch size (only with ``SimSettings.record_choices``)."""
    rollout_starts: list[int] = field(default_factory=list)
    """Index into ``choices`` of each rollout's first round (only with ``SimSettings.record_choices``)."""
    plain_estimate_s: float = 0.0
    """What the selector estimated plain decoding would have taken for the run's tokens (0.0 for selectors that
    make no estimate, see ``BanditSelector.plain_time_estimate``)."""
    plain_truth_s: float = 0.0
    """What plain decoding would have taken for the same rounds' tokens under the load of the moment (no noise)."""

    @property
    def tokens(self) -> int:
        """Tokens emitted over the run."""
        return sum(b.tokens for b in self.buckets)

    @property
    def time_s(self) -> float:
        """Simulated seconds over the run."""
        return sum(b.time_s for b in self.buckets)

    @property
    def rounds(self) -> int:
        """Decode rounds over the run."""
        return sum(b.rounds for b in self.buckets)

    @property
    def goodput(self) -> float:
        """Cumulative tokens per simulated second."""
        return self.tokens / self.time_s


@dataclass(frozen=True)
class SimSettings:
    """What the simulator holds fixed across the selectors it compares."""

    cost: CostModel
    strategies: tuple[Strategy, ...]
    buckets: BatchBuckets = BatchBuckets(DEFAULT_BS_THRESHOLDS)
    seed: int = 0
    time_noise: float = 0.05
    """Relative (log-normal) noise on each round's wall time, as measured timings have."""
    calibration_error: float = 0.0
    """Relative (log-normal) error of each arm's calibrated time at each calibration size, beside the rounds' noise:
    a calibration's prompts are not the rollouts' (contexts, ragged rows, caches), and on this CPU its ratio of an
    arm to plain was off by 7-20% (3_1_4 at batch 64: 3.07x calibrated, 2.7x in the long-tail rollouts)."""
    record_choices: bool = False
    load: tuple[float, ...] = ()
    """A machine whose load changes: every round's cost, every arm alike, is multiplied by ``load[i]`` during the
    ``i``-th stretch of ``load_period`` emitted tokens (cycling; empty: no load). Stretches of work, not of rounds or
    time: every selector meets the same load at the same point of the workload, as with common random numbers."""
    load_period: int = 2000

    def load_factor(self, tokens_done: int) -> float:
        """The load's multiplier of every arm's round cost once the run has emitted ``tokens_done`` tokens."""
        return self.load[(tokens_done // self.load_period) % len(self.load)] if self.load else 1.0


def rollout_lengths(workload: Workload, seed: int) -> list[np.ndarray]:
    """Response lengths of every rollout (the same for every selector). [num_rollouts][requests_per_rollout]"""
    return [workload.sample_lengths(np.random.default_rng([seed, r, 1])) for r in range(workload.num_rollouts)]


def simulate(selector: StrategySelector, workload: Workload, settings: SimSettings, name: str = "") -> SimResult:
    """Run ``selector`` over every rollout of ``workload``; return per-bucket totals."""
    buckets = settings.buckets
    result = SimResult(name or type(selector).__name__, workload.name, [BucketTotals() for _ in range(len(buckets))])
    noise_rng = np.random.default_rng([settings.seed, 2])
    accept_rng = np.random.default_rng([settings.seed, 3])
    for rollout, lengths in enumerate(rollout_lengths(workload, settings.seed)):
        phase_index = workload.phase_index(rollout)
        profile = workload.phases[phase_index].acceptance
        if isinstance(selector, OracleSelector):
            selector.set_phase(phase_index)
        hits = profile.sample_request_hits(np.random.default_rng([settings.seed, rollout, 4]), len(lengths))
        remaining = lengths.copy()
        if settings.record_choices:
            result.rollout_starts.append(len(result.choices))
        while True:
            running = np.flatnonzero(remaining > 0)
            batch = len(running)
            if batch == 0:
                break
            strategy = selector.choose(batch)
            accepted = profile.sample_accepted(strategy, hits[running], accept_rng)
            emitted = np.minimum(accepted + 1, remaining[running])
            remaining[running] -= emitted
            load = settings.load_factor(result.tokens)
            wall = settings.cost.round_time(strategy, batch) * load
            if settings.time_noise > 0:
                wall *= float(np.exp(settings.time_noise * noise_rng.standard_normal()))
            drafted = 0 if strategy.is_disabled else strategy.max_tree_nodes - 1
            stats = RoundStats(strategy, batch, [drafted] * batch, accepted.tolist(), emitted.tolist(), wall)
            estimate = getattr(selector, "plain_time_estimate", None)
            if estimate is not None:
                result.plain_estimate_s += estimate(stats)
                plain = settings.cost.round_time(DISABLE, batch) * load * float(emitted.sum()) / batch
                result.plain_truth_s += wall if strategy.is_disabled else plain
            selector.observe(stats)
            totals = result.buckets[buckets.index(batch)]
            totals.tokens += int(emitted.sum())
            totals.time_s += wall
            totals.rounds += 1
            if settings.record_choices:
                result.choices.append(strategy)
                result.batch_sizes.append(batch)
    return result


def simulated_calibration(settings: SimSettings, max_batch_size: int, rounds: int = 3) -> CostModel:
    """What an engine's calibration would measure on ``settings.cost``: ``rounds`` noisy rounds of every arm at
    each calibration batch size, each arm and size off by ``settings.calibration_error``."""
    rng = np.random.default_rng([settings.seed, 5])
    points = []
    for size in calibration_sizes(max_batch_size):
        for arm in dict.fromkeys([*settings.strategies, DISABLE]):
            off = (
                float(np.exp(settings.calibration_error * rng.standard_normal())) if settings.calibration_error else 1.0
            )
            for _ in range(rounds):
                noise = float(np.exp(settings.time_noise * rng.standard_normal()))
                points.append((arm, size, settings.cost.round_time(arm, size) * off * noise))
    return CostModel.fit(points)


def oracle_runs(
    workload: Workload, settings: SimSettings, statics: dict[str, SimResult], margin: float = ORACLE_MARGIN
) -> tuple[SimResult, SimResult]:
    """The per-bucket oracle's run and the per-batch-size oracle's on ``workload`` under ``settings``; ``statics``:
    runs of fixed strategies already simulated under ``settings`` (by name), the search's other starts.

    Per bucket: a coordinate search (``oracle.search_table``) of fixed per-bucket tables, each run by ``simulate``
    under ``settings`` (the run's common random numbers), from the best of the analytic table and the statics'.
    Per batch size: the analytic table, or the per-bucket oracle where that runs faster (a per-bucket table is a
    per-batch-size one, and a fixed strategy is a per-bucket table: their runs are the same rounds)."""
    strategies = list(settings.strategies)
    lengths = rollout_lengths(workload, settings.seed)
    cells = [(p, b) for p in range(len(workload.phases)) for b in range(len(settings.buckets))]
    runs: dict[frozenset, SimResult] = {
        frozenset(dict.fromkeys(cells, Strategy.parse(name)).items()): result for name, result in statics.items()
    }

    def run_time(table: Table) -> float:
        key = frozenset(table.items())
        if key not in runs:
            runs[key] = simulate(OracleSelector(table, settings.buckets), workload, settings, "oracle/bucket")
        return runs[key].time_s

    times = expected_times(workload, strategies, settings.buckets, settings.cost, lengths)
    analytic = {cell: min(by_arm, key=by_arm.__getitem__) for cell, by_arm in times.items()}
    starts = [analytic, *(dict.fromkeys(cells, Strategy.parse(name)) for name in statics)]
    table, _ = search_table(starts, candidate_arms(times, margin), run_time)
    oracle = replace(deepcopy(runs[frozenset(table.items())]), selector="oracle/bucket")
    per_batch = BatchBuckets(tuple(range(1, workload.requests_per_rollout + 1)))
    fine_times = expected_times(workload, strategies, per_batch, settings.cost, lengths)
    fine = {cell: min(by_arm, key=by_arm.__getitem__) for cell, by_arm in fine_times.items()}
    fine_run = simulate(OracleSelector(fine, per_batch), workload, settings, "oracle/batch-size")
    if oracle.time_s < fine_run.time_s:
        fine_run = replace(deepcopy(oracle), selector="oracle/batch-size")
    return oracle, fine_run


@dataclass
class Comparison:
    """Every selector's result on one workload, with the references the adaptive selectors are judged against."""

    workload: str
    results: dict[str, SimResult]
    oracle: SimResult
    """The per-bucket oracle: the reference the adaptive selectors are judged against (at least as fast as every
    fixed per-bucket choice its search tried, every static strategy among them)."""
    oracle_per_batch: SimResult
    """The oracle with one bucket per batch size (analytic, or the per-bucket one where faster: an estimate of what
    finer buckets could gain)."""
    plain: SimResult
    statics: dict[str, SimResult]

    @property
    def best_static(self) -> SimResult:
        """The single strategy with the best cumulative goodput."""
        return max(self.statics.values(), key=lambda r: r.goodput)


def compare(
    workload: Workload, settings: SimSettings, selectors: dict[str, Callable[[], StrategySelector]]
) -> Comparison:
    """Simulate the oracle, every static strategy (plain included) and each of ``selectors`` on ``workload``."""
    from fastrl.adaptive.fixed import FixedSelector

    statics = {str(s): simulate(FixedSelector(s), workload, settings, str(s)) for s in settings.strategies}
    plain = statics.get(str(DISABLE)) or simulate(FixedSelector(DISABLE), workload, settings, "disable")
    oracle, oracle_per_batch = oracle_runs(workload, settings, statics)
    results = {name: simulate(make(), workload, settings, name) for name, make in selectors.items()}
    return Comparison(workload.name, results, oracle, oracle_per_batch, plain, statics)


def format_comparison(comparison: Comparison, labels: list[str]) -> str:
    """A text table: goodput, time, ratios to the oracle and plain, and per-bucket goodput relative to plain."""
    best = comparison.best_static
    rows = [
        ("oracle/bucket", comparison.oracle),
        ("oracle/batch-size", comparison.oracle_per_batch),
        (f"static {best.selector}", best),
        ("plain", comparison.plain),
    ]
    rows = list(comparison.results.items()) + rows
    head = f"{'selector':<22}{'tok/s':>9}{'time s':>9}{'vs oracle':>10}{'vs plain':>9}"
    head += "".join(f"{'bs ' + label:>9}" for label in labels)
    lines = [f"workload: {comparison.workload}", head]
    for name, result in rows:
        line = f"{name:<22}{result.goodput:>9.0f}{result.time_s:>9.2f}"
        line += f"{result.goodput / comparison.oracle.goodput:>10.3f}{result.goodput / comparison.plain.goodput:>9.2f}"
        for mine, base in zip(result.buckets, comparison.plain.buckets, strict=True):
            line += f"{mine.goodput / base.goodput:>9.2f}" if base.goodput > 0 else f"{'-':>9}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the simulation table for the standard workloads."""
    from fastrl.adaptive.bandit import BanditConfig, BanditSelector
    from fastrl.adaptive.ema import EmaConfig, EmaSelector
    from fastrl.adaptive.workload import standard_workloads
    from fastrl.bench.cli_args import at_least, strategy_list

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=at_least(0), default=0)
    parser.add_argument("--rollouts", type=at_least(2), default=6)
    parser.add_argument(
        "--strategies", type=strategy_list, default=list(DEFAULT_SIM_STRATEGIES), help="comma-separated arms"
    )
    parser.add_argument("--costs", default="", help="measured round times (JSON from `fastrl bench`) to fit")
    args = parser.parse_args(argv)
    names = args.strategies
    history = [n for n in names if Strategy.parse(n).is_history]
    if history:
        parser.error(
            f"--strategies {','.join(history)}: history arms cannot be simulated (the acceptance model is EAGLE's; "
            "measure them with `fastrl bench`)"
        )
    cost = CostModel.default_gpu()
    if args.costs:
        try:
            cost = CostModel.from_json(args.costs)
        except OSError as err:
            parser.error(f"--costs {args.costs}: {err.strerror}")
        except ValueError as err:
            parser.error(f"--costs: {err}")
        measured = cost.measured_strategies
        names = [n for n in names if Strategy.parse(n) in measured]
        if not names:
            timed = ", ".join(map(str, measured))
            parser.error(f"--costs {args.costs} times none of --strategies {args.strategies} (it times {timed})")
        if not cost.has_strategy(DISABLE):
            parser.error(
                f"--costs {args.costs} has no 'disable' timings: the simulator needs plain decoding's round times "
                "(the reference of every ratio, and an arm of every calibration)"
            )
    settings = SimSettings(cost=cost, strategies=tuple(parse_strategy_space(names)), seed=args.seed)
    tiers = [t for t in EmaConfig().candidate_steps if cost.has_strategy(Strategy(t, 1, t + 1))]
    source = f"fitted to {args.costs}" if args.costs else str(settings.cost.params)
    print(f"cost model: {source}; arms {names}; per-bucket columns: goodput relative to plain decoding")
    for workload in standard_workloads(args.rollouts):
        calibration = simulated_calibration(settings, workload.requests_per_rollout)
        selectors: dict[str, Callable[[], StrategySelector]] = {
            "bandit": lambda c=calibration: BanditSelector(BanditConfig(strategies=names), calibration=c),
        }
        if tiers:
            selectors["ema [" + ",".join(map(str, tiers)) + "]"] = lambda: EmaSelector(EmaConfig(candidate_steps=tiers))
        print()
        print(format_comparison(compare(workload, settings, selectors), settings.buckets.labels()))


if __name__ == "__main__":
    main()
