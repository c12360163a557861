"""Compare `fastrl train` runs: rollout time, accept length, step time and reward per RL step, as one PNG and a
markdown table (docs/results.md is written from these).

    python recipes/results/compare.py --run plain=runs/train/A --run fastrl=runs/train/B --out docs/results
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(run_dir: Path) -> list[dict]:
    """The per-step metrics of a run."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} not found: is {run_dir} a `fastrl train` run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="label=run_dir (first one is the baseline)")
    parser.add_argument("--out", required=True, help="output prefix (PNG and .md are written)")
    args = parser.parse_args()
    runs = {}
    for item in args.run:
        label, _, path = item.partition("=")
        runs[label] = load(Path(path))

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
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=100)

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
            f"| {label} | {len(rows)} | {roll:.2f} | {base_roll / roll:.2f}x | {step:.2f} | {base_step / step:.2f}x | "
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
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
