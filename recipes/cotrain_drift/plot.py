"""Plot and tabulate a cotrain_drift run: accept length of the frozen and the co-trained drafter per step, the
policy's KL to its initial weights, and the co-trained drafter's held-out top-1.

    python recipes/cotrain_drift/plot.py runs/cotrain_drift      (writes drift.png and drift.json there)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def window_means(values: list[float], size: int) -> list[float]:
    return [sum(values[i : i + size]) / len(values[i : i + size]) for i in range(0, len(values), size)]


def main(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frozen, cotrained = load(out / "frozen"), load(out / "cotrained")
    n = min(len(frozen), len(cotrained))
    frozen, cotrained = frozen[:n], cotrained[:n]
    same = all(
        f["reward_mean"] == c["reward_mean"] and f["loss"] == c["loss"] for f, c in zip(frozen, cotrained, strict=True)
    )
    steps = [m["step"] for m in frozen]
    accept_f = [m["mean_accept_length"] for m in frozen]
    accept_c = [m["mean_accept_length"] for m in cotrained]
    kl = [m.get("drift_kl") for m in frozen]
    size = max(1, n // 4)
    table = {
        "steps": n,
        "same_rollouts_and_losses": same,
        "window": size,
        "frozen_accept": window_means(accept_f, size),
        "cotrained_accept": window_means(accept_c, size),
        "ratio": [c / f for c, f in zip(window_means(accept_c, size), window_means(accept_f, size), strict=True)],
        "drift_kl": window_means([k or 0.0 for k in kl], size),
        "heldout_top1_after": [m.get("drafter_heldout_top1") for m in cotrained],
    }
    (out / "drift.json").write_text(json.dumps(table, indent=2) + "\n")
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    ax[0].plot(steps, accept_f, marker=".", label="frozen drafter")
    ax[0].plot(steps, accept_c, marker="o", label="co-trained drafter")
    ax[0].set_xlabel("RL step")
    ax[0].set_ylabel("mean accept length (tokens / round)")
    ax[0].legend(loc="upper left")
    twin = ax[0].twinx()
    twin.plot(steps, [k if k is not None else float("nan") for k in kl], color="C4", ls="--", label="KL to initial")
    twin.set_ylabel("KL(policy || initial policy), nats / token")
    twin.legend(loc="lower right")
    ax[0].set_title("accept length and policy drift")
    top1 = [(m["step"], m.get("drafter_heldout_top1_before"), m.get("drafter_heldout_top1")) for m in cotrained]
    top1 = [t for t in top1 if t[1] is not None]
    if top1:
        ax[1].plot([s for s, _, _ in top1], [b for _, b, _ in top1], ls="--", marker=".", label="before update")
        ax[1].plot([s for s, _, _ in top1], [a for _, _, a in top1], marker="o", label="after update")
        ax[1].legend()
    ax[1].set_title("co-trained drafter: held-out top-1")
    ax[1].set_xlabel("RL step")
    fig.savefig(out / "drift.png", dpi=100)
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/cotrain_drift"))
