"""The end-of-run report of `fastrl train`: one PNG over RL steps with reward, time per step, rollout speed against
plain decoding, the strategy chosen per batch-size bucket, accept length (with the drafter versions and the policy's
drift that drive it), the drafter's held-out top-1, its co-training loss, and the response lengths."""

from __future__ import annotations

from pathlib import Path

from fastrl.rl.metrics import StepMetrics
from fastrl.telemetry.report_panels import accept_panel, choice_panel, legend, speed_panel


def plot_train_report(
    history: list[StepMetrics], lengths: list[int], path: str | Path, title: str, length_steps: list[int] | None = None
) -> Path:
    """Eight panels over steps; `lengths` are the response lengths of the steps `length_steps` (those this process
    ran; None: all of `history`'s), in a histogram that says which steps it covers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [m.step for m in history]
    fig, ax = plt.subplots(4, 2, figsize=(13, 15), constrained_layout=True)
    _reward_panel(ax[0, 0], history)
    ax[0, 1].plot(steps, [m.rollout_time_s for m in history], marker="o", label="rollout")
    plain = [(m.step, m.plain_time_estimate_s) for m in history if m.plain_time_estimate_s is not None]
    if plain:
        ax[0, 1].plot(*zip(*plain, strict=True), marker="s", ls="--", label="rollout, plain decoding (est.)")
    ax[0, 1].plot(steps, [m.tail_time_s for m in history], marker=".", label="rollout tail")
    ax[0, 1].plot(steps, [m.step_time_s for m in history], marker="x", label="whole step")
    ax[0, 1].set_title("time per RL step (s)")
    ax[0, 1].legend(fontsize=8)
    speed_panel(ax[1, 0], history)
    choice_panel(ax[1, 1], history)
    accept_panel(ax[2, 0], history)
    _drafter_panel(ax[2, 1], history)
    _cotrain_panel(ax[3, 0], history)
    covered = length_steps if length_steps is not None else steps
    if lengths or not history:
        _length_panel(ax[3, 1], lengths, covered)
    else:
        _length_stats_panel(ax[3, 1], history)
    for a in (ax[3, 0], ax[2, 0], ax[2, 1], ax[1, 0], ax[1, 1], ax[0, 0], ax[0, 1]):
        a.set_xlabel("RL step")
    fig.suptitle(title)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _length_panel(ax, lengths: list[int], covered: list[int]) -> None:
    """The response lengths of the steps ``covered``, as a histogram."""
    span = f"step {covered[0]}" if len(covered) == 1 else f"steps {covered[0]}-{covered[-1]}" if covered else "no step"
    ax.hist(lengths, bins=40, label=f"{len(lengths)} responses of {span}")
    ax.set_yscale("log")
    ax.set_title("response length (tokens)")
    ax.set_xlabel("tokens")
    ax.legend(fontsize=8)


def _length_stats_panel(ax, history: list[StepMetrics]) -> None:
    """Without the responses' lengths (a report drawn from metrics.jsonl): each step's mean, median, p90 and
    longest response."""
    steps = [m.step for m in history]
    for name, values, marker in (
        ("max", [m.response_len_max for m in history], "^"),
        ("p90", [m.response_len_p90 for m in history], "."),
        ("median", [m.response_len_p50 for m in history], "x"),
        ("mean", [m.response_len_mean for m in history], "o"),
    ):
        ax.plot(steps, values, marker=marker, label=name)
    ax.set_title("response length per step (tokens)")
    ax.set_xlabel("RL step")
    ax.legend(fontsize=8, title="per step, from metrics.jsonl", title_fontsize=8)


def _reward_panel(ax, history: list[StepMetrics]) -> None:
    """Reward and accuracy; one line when they are equal at every step (an all-or-nothing reward)."""
    steps = [m.step for m in history]
    rewards = [m.reward_mean for m in history]
    accuracy = [m.accuracy for m in history]
    if rewards == accuracy:
        ax.plot(steps, rewards, marker="o", label="reward = accuracy (the reward is 1 or 0 per sample)")
    else:
        ax.plot(steps, rewards, marker="o", label="reward")
        ax.plot(steps, accuracy, marker=".", label="accuracy")
    ax.set_title("reward")
    ax.legend(fontsize=8)


def _drafter_panel(ax, history: list[StepMetrics]) -> None:
    """Drafter version (steps) and, on a twin axis, its held-out top-1 before and after each rollout's update."""
    steps = [m.step for m in history]
    ax.step(steps, [m.drafter_version for m in history], where="post", color="gray", label="drafter version")
    ax.set_ylabel("drafter version")
    twin = ax.twinx()
    heldout = [(m.step, m.drafter_heldout_top1_before, m.drafter_heldout_top1) for m in history]
    heldout = [h for h in heldout if h[1] is not None]
    if heldout:
        xs = [s for s, _, _ in heldout]
        twin.plot(xs, [b for _, b, _ in heldout], marker=".", ls="--", color="C2", label="held-out top-1 before update")
        twin.plot(xs, [a for _, _, a in heldout], marker="o", color="C3", label="held-out top-1 after update")
        twin.set_ylabel("held-out top-1")
    legend(ax, twin, loc="lower right")
    ax.set_title("drafter version and held-out top-1 (before / after each rollout's update)")


def _cotrain_panel(ax, history: list[StepMetrics]) -> None:
    """The drafter's co-training loss and top-1 (twin axis) per step."""
    losses = [(m.step, m.drafter_loss, m.drafter_top1) for m in history if m.drafter_loss is not None]
    twin = ax.twinx()
    if losses:
        ax.plot([s for s, _, _ in losses], [loss for _, loss, _ in losses], marker="o", label="co-training loss")
        twin.plot([s for s, _, _ in losses], [t for _, _, t in losses], marker=".", color="C1", label="training top-1")
        twin.set_ylabel("top-1")
    ax.set_ylabel("loss")
    legend(ax, twin)
    ax.set_title("drafter co-training" + ("" if losses else " (none: frozen or no drafter)"))
