"""The speed panels of `fastrl train`'s report: rollout speed against plain decoding, the strategy the selector
chose per batch-size bucket, and the accept length with what drives it (drafter version, policy drift)."""

from __future__ import annotations

from typing import Any

from fastrl.rl.metrics import StepMetrics


def legend(*axes: Any, loc: str = "best") -> None:
    """One legend for the lines of ``axes`` (a panel and its twin axes)."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        axes[0].legend(handles, labels, loc=loc, fontsize=8)


def speed_panel(ax: Any, history: list[StepMetrics]) -> None:
    """Rollout tokens/s per step and, on a twin axis, the estimated speedup over plain decoding (1.0 = as fast as
    plain decoding) where the strategy selector estimated it."""
    steps = [m.step for m in history]
    ax.plot(steps, [m.rollout_tokens_per_s for m in history], marker="o", color="C0", label="rollout tokens/s")
    ax.set_ylabel("tokens / s")
    estimated = [(m.step, m.estimated_speedup) for m in history if m.estimated_speedup is not None]
    twin = ax.twinx()
    if estimated:
        twin.plot(*zip(*estimated, strict=True), marker="s", color="C3", label="est. speedup vs plain decoding")
        twin.axhline(1.0, color="gray", ls=":", lw=1, label="plain decoding (1.0x)")
        twin.set_ylabel("speedup (x)")
        ax.set_title("rollout speed and estimated speedup over plain decoding")
    else:
        twin.set_yticks([])
        ax.set_title("rollout speed (no plain-decoding estimate: the selector made none)")
    legend(ax, twin)


def choice_panel(ax: Any, history: list[StepMetrics]) -> None:
    """One row per batch-size bucket, one mark per step, coloured by the strategy chosen most there."""
    buckets: list[str] = []
    for m in history:
        buckets += [b for b in m.strategy_choices if b not in buckets]
    strategies = sorted({s for m in history for s in m.strategy_choices.values()}, key=lambda s: (s != "disable", s))
    for j, strategy in enumerate(strategies):
        points = [(m.step, buckets.index(b)) for m in history for b, s in m.strategy_choices.items() if s == strategy]
        ax.scatter(*zip(*points, strict=True), s=60, marker="s", color=f"C{j % 10}", label=strategy)
    ax.set_yticks(range(len(buckets)), buckets)
    ax.set_ylim(-0.5, len(buckets) + 0.2)
    ax.set_ylabel("batch-size bucket")
    ax.set_title("strategy chosen most per batch-size bucket")
    if strategies:
        ax.legend(fontsize=8, ncols=min(5, len(strategies)), loc="upper center")


def accept_panel(ax: Any, history: list[StepMetrics]) -> None:
    """Accept length per step, with the drafter's version pushes marked and the policy's drift (KL to the initial
    policy) on a twin axis: the accept length follows how well the drafter predicts the current policy."""
    steps = [m.step for m in history]
    ax.plot(steps, [m.mean_accept_length for m in history], marker="o", color="C0", label="accept length")
    ax.axhline(1.0, color="gray", ls=":", lw=1, label="plain decoding (1.0)")
    pushes = [
        m.step for m, before in zip(history[1:], history, strict=False) if m.drafter_version != before.drafter_version
    ]
    for k, step in enumerate(pushes):
        ax.axvline(step, color="C7", lw=0.6, alpha=0.6, label=None if k else "a new drafter version")
    ax.set_ylabel("tokens / request / round")
    drift = [(m.step, m.drift_kl) for m in history if m.drift_kl is not None]
    twin = ax.twinx()
    if drift:
        twin.plot(*zip(*drift, strict=True), marker=".", color="C4", label="policy drift (KL to initial policy)")
        twin.set_ylabel("KL (nats / token)")
    else:
        twin.set_yticks([])
    ax.set_title("accept length: what the drafter predicts of the current policy")
    top = max([m.mean_accept_length for m in history] + [1.0])
    ax.set_ylim(1.0 - 0.3 * max(top - 1.0, 0.5), top + 0.1 * max(top - 1.0, 0.5))  # room below 1.0 for the note
    ax.text(
        0.01,
        0.03,
        "rises when a new drafter version is trained on fresh rollouts; falls as the policy drifts from what the\n"
        "drafter learned (drift shown with rl.track_drift=true); the batch-size mix and chosen strategies move it too",
        transform=ax.transAxes,
        fontsize=7,
        color="dimgray",
    )
    legend(ax, twin, loc="upper right")
