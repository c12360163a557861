"""Plot and tabulate a cotrain_drift run: accept length of the frozen and the co-trained drafter per step, the
policy's KL to its initial weights, and the co-trained drafter's held-out top-1.

    python recipes/cotrain_drift/plot.py runs/cotrain_drift      (writes drift.png and drift.json there)

Both runs' metrics are read and checked before anything is drawn; an existing drift.png or drift.json is replaced
only with --overwrite, through a rename.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastrl.atomic_files import atomic_path, write_atomic
from fastrl.bench.cli_args import existing_dir
from fastrl.commands.run_dir import metrics_steps

KEYS = ("step", "reward_mean", "loss", "mean_accept_length")
"""What the plot reads of every step of a run's metrics.jsonl."""


def load(path: Path) -> list[dict]:
    """The steps of ``path/metrics.jsonl`` (``metrics_steps``: one error naming the file and line)."""
    return metrics_steps(path, KEYS)


def window_means(values: list[float], size: int) -> list[float]:
    return [sum(values[i : i + size]) / len(values[i : i + size]) for i in range(0, len(values), size)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python recipes/cotrain_drift/plot.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "out",
        nargs="?",
        type=existing_dir,
        default="runs/cotrain_drift",
        help="the run's OUT_DIR (frozen/, cotrained/)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing drift.png / drift.json")
    args = parser.parse_args(argv)
    out = args.out
    try:
        frozen, cotrained = load(out / "frozen"), load(out / "cotrained")
    except ValueError as err:
        parser.error(str(err))
    existing = [out / name for name in ("drift.png", "drift.json") if (out / name).exists()]
    if existing and not args.overwrite:
        parser.error(f"{existing[0]} exists; pass --overwrite to replace it")
    plot(out, frozen, cotrained)


def plot(out: Path, frozen: list[dict], cotrained: list[dict]) -> None:
    """Write drift.json and drift.png of the two runs' steps into ``out`` and print the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    write_atomic(out / "drift.json", json.dumps(table, indent=2) + "\n")
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
    with atomic_path(out / "drift.png") as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
