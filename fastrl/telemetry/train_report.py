"""The end-of-run report of `fastrl train`: one PNG with reward, rollout/tail time, accept length, drafter version
and held-out top-1, co-training loss and response lengths over RL steps."""

from __future__ import annotations

from pathlib import Path

from fastrl.rl.metrics import StepMetrics


def plot_train_report(history: list[StepMetrics], lengths: list[int], path: str | Path, title: str) -> Path:
    """Six panels over steps; `lengths` are every response length of the run (histogram)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [m.step for m in history]
    fig, ax = plt.subplots(3, 2, figsize=(12, 10), constrained_layout=True)
    ax[0, 0].plot(steps, [m.reward_mean for m in history], marker="o", label="reward")
    ax[0, 0].plot(steps, [m.accuracy for m in history], marker=".", label="accuracy")
    ax[0, 0].set_title("reward")
    ax[0, 0].legend()
    ax[0, 1].plot(steps, [m.rollout_time_s for m in history], marker="o", label="rollout")
    ax[0, 1].plot(steps, [m.tail_time_s for m in history], marker=".", label="tail")
    ax[0, 1].plot(steps, [m.step_time_s for m in history], marker="x", label="whole step")
    ax[0, 1].set_title("time per RL step (s)")
    ax[0, 1].legend()
    ax[1, 0].plot(steps, [m.mean_accept_length for m in history], marker="o", label="accept length")
    ax[1, 0].set_title("mean accept length (tokens / round)")
    drift = [(m.step, m.drift_kl) for m in history if m.drift_kl is not None]
    if drift:
        twin = ax[1, 0].twinx()
        twin.plot([s for s, _ in drift], [k for _, k in drift], marker=".", color="C4", label="KL to initial policy")
        twin.set_ylabel("KL to initial policy (nats / token)")
        twin.legend(loc="lower right", fontsize=8)
        ax[1, 0].set_title("mean accept length (tokens / round) and policy drift")
    ax[1, 1].step(steps, [m.drafter_version for m in history], where="post", color="gray", label="version")
    ax[1, 1].set_ylabel("drafter version")
    heldout = [(m.step, m.drafter_heldout_top1_before, m.drafter_heldout_top1) for m in history]
    heldout = [h for h in heldout if h[1] is not None]
    if heldout:
        twin = ax[1, 1].twinx()
        xs = [s for s, _, _ in heldout]
        twin.plot(xs, [b for _, b, _ in heldout], marker=".", ls="--", color="C2", label="held-out top-1 before")
        twin.plot(xs, [a for _, _, a in heldout], marker="o", color="C3", label="held-out top-1 after update")
        twin.set_ylabel("held-out top-1")
        twin.legend(loc="lower right", fontsize=8)
    ax[1, 1].set_title("drafter version and held-out top-1 (before / after each rollout's update)")
    losses = [(m.step, m.drafter_loss, m.drafter_top1) for m in history if m.drafter_loss is not None]
    if losses:
        ax[2, 0].plot([s for s, _, _ in losses], [loss for _, loss, _ in losses], marker="o", label="loss")
        twin = ax[2, 0].twinx()
        twin.plot([s for s, _, _ in losses], [t for _, _, t in losses], marker=".", color="C1", label="top-1")
        twin.set_ylabel("top-1")
    ax[2, 0].set_title("drafter co-training")
    ax[2, 1].hist(lengths, bins=40)
    ax[2, 1].set_yscale("log")
    ax[2, 1].set_title("response length (tokens)")
    for a in ax[-1]:
        a.set_xlabel("RL step" if a is not ax[2, 1] else "tokens")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
