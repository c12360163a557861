"""What bounding the drafter's unread entries (``EngineConfig.drafter_backlog``) saves and costs.

Each limit runs its own engine (bundled model and drafter, T=1, the same requests of random prompts, EOS ignored):
plain rounds until ``--switch`` rounds in, then ``3_1_4`` to the end (``--switch`` past the last round: plain
throughout, where every read the limit forced is a cost no drafter round repays). Printed per limit: the feed's
tensors at the end (MiB), the wall time, the catch-ups the limit forced inside plain rounds and those of the drafter
rounds; the limits alternate over ``--repeats`` and medians are printed. Outputs must agree across limits.

  python -m fastrl.bench.drafter_backlog --rows 64 --tokens 700 --switch 600 --backlogs none,default,128
  python -m fastrl.bench.drafter_backlog --rows 64 --tokens 700 --switch 100000 --backlogs none,default,128
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass

import torch

from fastrl.bench.cli_args import at_least
from fastrl.engine.calibration import ScriptedSelector
from fastrl.engine.config import EngineConfig
from fastrl.engine.engine import Engine
from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.speculative.drafter import EagleDrafter
from fastrl.strategy.strategy import DISABLE, Strategy

ARM = Strategy(3, 1, 4)
"""The drafter arm the engines switch to."""
UNBOUNDED = 10**9
"""The limit "none" stands for: more entries than any context."""


@dataclass(frozen=True)
class BacklogRun:
    """One engine's run under one limit."""

    label: str
    limit: int
    feed_mib: float
    wall_s: float
    forced_catch_up_s: float
    """Catch-ups the limit forced inside plain rounds."""
    drafter_catch_up_s: float
    """Catch-ups of the drafter rounds (what plain rounds left the drafter)."""
    outputs: tuple[tuple[int, ...], ...]


def backlog_run(
    policy: CausalLM, drafter: EagleDrafter, label: str, rows: int, tokens: int, switch: int, dtype: str
) -> BacklogRun:
    """Generate ``rows`` requests of ``tokens`` new tokens each under the limit ``label`` names (none, default or
    a number), plain rounds first, ``ARM`` from round ``switch`` on."""
    limits: dict[str, int | None] = {"none": UNBOUNDED, "default": None}
    backlog = limits[label] if label in limits else int(label)
    selector = ScriptedSelector([ARM, DISABLE])
    selector.next = DISABLE
    config = EngineConfig(max_batch_size=rows, dtype=dtype, drafter_backlog=backlog)
    engine = Engine(policy, config, drafter=drafter, selector=selector)
    rng = random.Random(0)
    vocab = policy.config.vocab_size
    ids = []
    for i in range(rows):
        prompt = [rng.randrange(3, vocab) for _ in range(60)]
        params = SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True)
        ids.append(engine.add_request(prompt, params))
    finished, step = {}, 0
    start = time.perf_counter()
    while engine.has_unfinished():
        if step == switch:
            selector.next = ARM
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        step += 1
    wall = time.perf_counter() - start
    feed = engine.runner.feed
    nbytes = feed.features.numel() * feed.features.element_size() + feed.tokens.numel() * feed.tokens.element_size()
    rounds = engine.round_stats
    return BacklogRun(
        label,
        feed.max_width if feed.max_width is not None else UNBOUNDED,
        nbytes / 2**20,
        wall,
        sum(s.catch_up_time_s for s in rounds if s.strategy.is_disabled),
        sum(s.catch_up_time_s for s in rounds if not s.strategy.is_disabled),
        tuple(tuple(finished[i].token_ids) for i in ids),
    )


def backlog_label(text: str) -> str:
    """none, default or an integer >= 1 (``argparse`` type of one entry)."""
    if text in ("none", "default") or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not none, default or an integer >= 1")


def main(argv: list[str] | None = None) -> None:
    """Print the feed's memory, the wall time and the catch-ups per drafter backlog limit."""
    from fastrl.assets_path import bundled_drafter_dir, bundled_model_dir
    from fastrl.models.checkpoint import load_model
    from fastrl.speculative.drafter_checkpoint import load_drafter

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--rows", type=at_least(1), default=64, help="requests, all decoded at once")
    parser.add_argument("--tokens", type=at_least(1), default=700, help="new tokens per request (EOS ignored)")
    parser.add_argument("--switch", type=at_least(0), default=600, help="the round 3_1_4 starts at")
    parser.add_argument("--backlogs", default="none,default,128", help="comma-separated: none, default or N")
    parser.add_argument("--repeats", type=at_least(1), default=1)
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    args = parser.parse_args(argv)
    try:
        labels = [backlog_label(x) for x in args.backlogs.split(",")]
    except argparse.ArgumentTypeError as err:
        parser.error(f"argument --backlogs: {err}")
    torch.set_num_threads(1)
    policy = load_model(bundled_model_dir()).eval()
    drafter = load_drafter(bundled_drafter_dir(), policy)[0]
    if 60 + args.tokens + 8 > policy.config.max_position_embeddings:
        parser.error(f"argument --tokens: 60 prompt tokens + {args.tokens} pass the bundled model's context")
    runs: dict[str, list[BacklogRun]] = {label: [] for label in labels}
    for _ in range(args.repeats):
        for label in labels:
            runs[label].append(backlog_run(policy, drafter, label, args.rows, args.tokens, args.switch, args.dtype))
    reference = runs[labels[0]][0].outputs
    for label in labels:
        if any(run.outputs != reference for run in runs[label]):
            raise RuntimeError(f"drafter_backlog={label} changed the tokens: exactness is broken")
        last = runs[label][-1]
        wall = statistics.median(r.wall_s for r in runs[label])
        forced = statistics.median(r.forced_catch_up_s for r in runs[label])
        drafted = statistics.median(r.drafter_catch_up_s for r in runs[label])
        limit = "none" if last.limit == UNBOUNDED else last.limit
        print(
            f"backlog {label:>7} (limit {limit}): feed {last.feed_mib:6.0f} MiB, wall {wall:6.2f} s, catch-ups forced "
            f"in plain rounds {forced:5.2f} s, in drafter rounds {drafted:5.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
