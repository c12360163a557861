"""Compare `fastrl train` runs: rollout time, accept length, step time and reward per RL step, as one PNG and a
markdown table (docs/results.md is written from these).

    python recipes/results/compare.py --run plain=runs/train/A --run fastrl=runs/train/B --out runs/compare

A duplicate label, a damaged metrics.jsonl or an --out that is a directory is refused before any plotting; an
existing OUT.png or OUT.md is replaced only with --overwrite (docs/results.md regenerates its figure so).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fastrl.atomic_files import atomic_path, write_atomic
from fastrl.commands.output_guard import check_output
from fastrl.commands.run_dir import metrics_steps

KEYS = ("step", "rollout_time_s", "mean_accept_length", "step_time_s", "reward_mean", "response_tokens")
"""What this comparison reads of every step of a run's metrics.jsonl."""


def load(run_dir: Path) -> list[dict]:
    """The per-step metrics of a run (``metrics_steps``: one error naming the file and line)."""
    return metrics_steps(run_dir, KEYS)


def run_arg(text: str) -> tuple[str, Path]:
    """An argparse ``type``: ``LABEL=RUN_DIR`` (a non-empty label and an existing directory)."""
    label, eq, path = text.partition("=")
    if not eq or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=RUN_DIR (e.g. plain=runs/train/A), got {text!r}")
    if not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {path} is {'a file' if Path(path).exists() else 'missing'}")
    return label, Path(path)


def ratio(base: float, value: float) -> str:
    return f"{base / value:.2f}x" if value > 0 else "n/a"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", action="append", type=run_arg, required=True, help="LABEL=RUN_DIR (first one is the baseline)"
    )
    parser.add_argument("--out", required=True, help="output prefix (its suffix replaced by .png and .md)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT.png / OUT.md")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {}
    for label, run_dir in args.run:
        if label in runs:
            parser.error(f"--run: label {label!r} is given twice")
        try:
            runs[label] = load(run_dir)
        except ValueError as err:
            parser.error(f"--run {label}: {err}")
    if args.out.endswith(("/", "\\")) or Path(args.out).is_dir():
        parser.error(f"--out {args.out} is a directory; give a file prefix such as {Path(args.out) / 'compare'}")
    out = Path(args.out)
    outputs = {}
    for suffix in (".png", ".md"):
        path = out.with_suffix(suffix)
        if (path.exists() or path.is_symlink()) and not args.overwrite:
            parser.error(f"--out {args.out}: {path} exists; choose a new prefix, or pass --overwrite to replace it")
        try:
            outputs[suffix] = check_output("--out", str(path), {}).path
        except ValueError as err:
            parser.error(str(err).replace("--out=", "--out ", 1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    panels = [
        ("rollout_time_s", "rollout time per RL step (s)"),
        ("mean_accept_length", "mean accept length"),
        ("step_time_s", "whole RL step (s)"),
        ("reward_mean", "reward"),
    ]
    for a, (key, title) in zip(ax.flat, panels, strict=True):
        for label, rows in runs.items():
            a.plot([r["step"] for r in rows], [r[key] for r in rows], marker="o", ms=3, label=label)
        a.set_title(title)
        a.set_xlabel("RL step")
        a.legend()
    with atomic_path(outputs[".png"]) as tmp:
        fig.savefig(tmp, dpi=100, format="png")

    base_label, base = next(iter(runs.items()))
    lines = [
        "| run | steps | median rollout s | rollout speedup | median step s | step speedup | mean accept len "
        "| mean reward |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base_roll = statistics.median(r["rollout_time_s"] for r in base)
    base_step = statistics.median(r["step_time_s"] for r in base)
    for label, rows in runs.items():
        roll = statistics.median(r["rollout_time_s"] for r in rows)
        step = statistics.median(r["step_time_s"] for r in rows)
        lines.append(
            f"| {label} | {len(rows)} | {roll:.2f} | {ratio(base_roll, roll)} | {step:.2f} | "
            f"{ratio(base_step, step)} | "
            f"{statistics.mean(r['mean_accept_length'] for r in rows):.2f} | "
            f"{statistics.mean(r['reward_mean'] for r in rows):.3f} |"
        )
    lines.append("")
    for label, rows in runs.items():
        n = min(len(rows), len(base))
        same = [r["reward_mean"] for r in rows[:n]] == [r["reward_mean"] for r in base[:n]]
        tokens = [r["response_tokens"] for r in rows[:n]] == [r["response_tokens"] for r in base[:n]]
        lines.append(
            f"- `{label}` vs `{base_label}`, first {n} steps: rewards identical {same}, "
            f"response token counts identical {tokens}"
        )
    write_atomic(outputs[".md"], "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
