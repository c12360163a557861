"""PNG plots of the adaptive policy's behaviour, for people who do not use W&B."""

from __future__ import annotations

from pathlib import Path

from fastrl.strategy.round_stats import RoundStats


def plot_rounds(
    stats: list[RoundStats],
    bucket_of: list[int],
    bucket_labels: list[str],
    path: str | Path,
    title: str = "adaptive speculation",
) -> Path:
    """Four panels over decode rounds: chosen strategy, accept length, goodput, batch size; plus arm pulls per
    bucket. `bucket_of[i]` is the bucket index of round i."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = sorted({str(s.strategy) for s in stats}, key=lambda x: (x != "disable", x))
    index = {n: i for i, n in enumerate(names)}
    rounds = list(range(len(stats)))
    fig, axes = plt.subplots(5, 1, figsize=(10, 13), constrained_layout=True)
    axes[0].scatter(rounds, [index[str(s.strategy)] for s in stats], s=4, c=bucket_of, cmap="viridis")
    axes[0].set_yticks(range(len(names)), names)
    axes[0].set_ylabel("chosen strategy")
    axes[1].plot(rounds, [s.mean_accept_length for s in stats], lw=0.6)
    axes[1].set_ylabel("accept length")
    axes[2].plot(rounds, [s.goodput for s in stats], lw=0.6)
    axes[2].set_ylabel("goodput (tok/s)")
    axes[3].plot(rounds, [s.batch_size for s in stats], lw=0.8)
    axes[3].set_ylabel("batch size")
    axes[3].set_xlabel("decode round")
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        pulls = [
            sum(1 for s, b in zip(stats, bucket_of, strict=True) if b == k and str(s.strategy) == name)
            for k in range(len(bucket_labels))
        ]
        axes[4].bar([k + j * width for k in range(len(bucket_labels))], pulls, width=width, label=name)
    axes[4].set_xticks([k + 0.4 - width / 2 for k in range(len(bucket_labels))], bucket_labels)
    axes[4].set_xlabel("batch-size bucket")
    axes[4].set_ylabel("pulls")
    if names:  # a run without decode rounds (every request ended at its first token) has no arm to name
        axes[4].legend(fontsize=7, ncols=min(4, len(names)))
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
