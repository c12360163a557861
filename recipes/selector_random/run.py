"""Sweep the simulator's random cases (`fastrl.adaptive.random_cases`): the bandit against the per-bucket oracle,
the best static strategy and plain decoding, per case and seed, then the summary.

    python recipes/selector_random/run.py --cases 0-80 --seeds 0,1,2 --out runs/selector_random.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

from tqdm import tqdm

from fastrl.adaptive.random_cases import run_case
from fastrl.bench.cli_args import index_range, int_list, new_file


def main(argv: list[str] | None = None) -> None:
    """Run the sweep the arguments ask for and print its summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=index_range, default=range(0, 80), help="LOW-HIGH (HIGH excluded), or one case")
    parser.add_argument("--seeds", type=int_list(0), default=[0, 1, 2], help="comma-separated simulator seeds")
    parser.add_argument("--out", type=new_file, default=None, help="write one JSON line per case and seed here")
    args = parser.parse_args(argv)
    seeds = args.seeds
    results = []
    with tqdm(total=len(args.cases) * len(seeds), desc="cases", unit="run") as bar:
        for k in args.cases:
            for seed in seeds:
                results.append(run_case(k, seed))
                if args.out is not None:
                    with args.out.open("a") as file:
                        file.write(json.dumps(dataclasses.asdict(results[-1])) + "\n")
                bar.update(1)
    for key in ("vs_oracle", "vs_best_static", "vs_plain"):
        values = [getattr(r, key) for r in results]
        below = sum(v < 0.97 for v in values)
        print(f"{key}: min {min(values):.3f}, mean {statistics.mean(values):.4f}, {below} of {len(values)} below 0.97")
    worst = sorted(results, key=lambda r: r.vs_best_static)[:5]
    listed = ", ".join(f"{r.case}/{r.seed} {r.vs_best_static:.3f}" for r in worst)
    print(f"worst against the best static strategy: {listed}")


if __name__ == "__main__":
    main()
