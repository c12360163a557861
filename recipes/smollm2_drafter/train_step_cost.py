"""One drafter training step on SmolLM2 (the EAGLE loss, forward and backward) with the full vocabulary and with
the shipped drafter's draft vocabulary, measured side by side (interleaved repeats, medians). The token term of
the loss uses the LM head's draft-vocabulary rows only, so co-training and train-drafter pay K/V of the head (and
the full head on at most TRAIN_TOP1_TARGETS targets, for top-1 against the policy's own top-1), as a step does.

    python recipes/smollm2_drafter/train_step_cost.py [--repeats 6] [--sequences 4] [--length 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from shipped import load_shipped

from fastrl.bench.cli_args import at_least
from fastrl.cotrain.drafter_trainer import TRAIN_TOP1_TARGETS
from fastrl.cotrain.eagle_loss import eagle_loss
from fastrl.cotrain.feature_sequence import FeatureBatch, FeatureSequence


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=at_least(1), default=6)
    parser.add_argument("--sequences", type=at_least(1), default=4)
    parser.add_argument("--length", type=at_least(2), default=128)
    args = parser.parse_args(argv)
    policy, drafter = load_shipped()
    drafter = drafter.float().train()
    draft_vocab = drafter.draft_vocab
    gen = torch.Generator().manual_seed(0)
    vocab, hidden = policy.config.vocab_size, policy.config.hidden_size
    seqs = [
        FeatureSequence(
            torch.randint(0, vocab, (args.length,), generator=gen), torch.randn(args.length, hidden, generator=gen), 1
        )
        for _ in range(args.sequences)
    ]
    batch = FeatureBatch.collate(seqs, target_size=hidden)
    times: dict[str, list[float]] = {"full vocabulary": [], f"draft vocabulary ({draft_vocab.numel()})": []}
    for _ in range(args.repeats):
        for name, ids in zip(times, (None, draft_vocab), strict=True):
            drafter.set_draft_vocab(ids)
            drafter.zero_grad()
            start = time.perf_counter()
            eagle_loss(drafter, policy, batch, top1_targets=TRAIN_TOP1_TARGETS).total.backward()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(v) for name, v in times.items()}
    for name, value in medians.items():
        print(f"{name}: {value * 1e3:.0f} ms per step ({args.sequences * args.length} positions, one thread)")
    full, reduced = medians.values()
    print(f"the draft vocabulary makes a training step {full / reduced:.2f}x cheaper")


if __name__ == "__main__":
    main()
