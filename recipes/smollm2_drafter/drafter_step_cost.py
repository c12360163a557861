"""One drafter step on SmolLM2 at batch size 1, with the full vocabulary (49,152-row LM head) and with the shipped
reduced draft vocabulary, measured side by side (interleaved repeats, medians), next to one policy forward.

    python recipes/smollm2_drafter/drafter_step_cost.py [--repeats 8] [--calls 50]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from shipped import load_shipped

from fastrl.bench.cli_args import at_least
from fastrl.speculative.drafter import EagleDrafter


def drafter_step(drafter: EagleDrafter, policy, cache, position: int) -> torch.Tensor:
    """One chain step: the drafter layer on (token, feature), then its draft logits and pick.  # -> [1]"""
    hidden = policy.config.hidden_size
    pos = torch.tensor([[position]])
    out = drafter(policy, torch.tensor([[42]]), torch.zeros(1, 1, hidden), pos, cache, torch.tensor([0]), pos, None)
    return drafter.draft_logits(policy, out[:, 0]).argmax(-1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=at_least(1), default=8)
    parser.add_argument("--calls", type=at_least(1), default=50)
    args = parser.parse_args(argv)
    policy, reduced = load_shipped()
    full = copy.deepcopy(reduced)
    full.set_draft_vocab(None)
    cache = reduced.new_cache(1, 256, torch.float32, "cpu")
    times: dict[str, list[float]] = {"full": [], "reduced": []}
    with torch.inference_mode():
        for _ in range(args.repeats):
            for name, drafter in (("full", full), ("reduced", reduced)):
                drafter_step(drafter, policy, cache, 100)
                start = time.perf_counter()
                for _ in range(args.calls):
                    drafter_step(drafter, policy, cache, 100)
                times[name].append((time.perf_counter() - start) / args.calls)
        start = time.perf_counter()
        for _ in range(10):
            policy(torch.tensor([[42]]), torch.tensor([[100]]))
        forward = (time.perf_counter() - start) / 10
    full_s, reduced_s = statistics.median(times["full"]), statistics.median(times["reduced"])
    print(f"draft vocabulary: {reduced.draft_vocab.numel()} of {policy.config.vocab_size} tokens")
    print(f"drafter step, full vocabulary: {full_s * 1e3:.2f} ms")
    print(f"drafter step, reduced:         {reduced_s * 1e3:.2f} ms  ({full_s / reduced_s:.2f}x cheaper)")
    print(f"policy forward, 1 token:       {forward * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
