"""Summing the co-training slices of one rollout into its DrafterTrainingStats."""

from __future__ import annotations

from fastrl.cotrain.cotrainer import SliceMetrics
from fastrl.rollout.types import DrafterTrainingStats
from fastrl.rollout.worker_cotrain import RoundReport


def summarize_slices(slices: list[tuple[str, SliceMetrics]]) -> DrafterTrainingStats:
    """Steps, tokens and seconds summed over (worker id, slice) pairs; loss and top-1 token-weighted over the
    slices that trained; one failure line per failed slice (``"worker-1: ValueError: ..."``)."""
    trained = [m for _, m in slices if m.steps > 0 and m.error is None]
    tokens = sum(m.tokens for m in trained)
    loss = sum((m.loss or 0.0) * m.tokens for m in trained) / tokens if tokens else None
    top1 = sum((m.top1 or 0.0) * m.tokens for m in trained) / tokens if tokens else None
    return DrafterTrainingStats(
        steps=sum(m.steps for m in trained),
        tokens=tokens,
        loss=loss,
        top1=top1,
        seconds=sum(m.seconds for _, m in slices),
        failures=[f"{worker}: {m.error}" for worker, m in slices if m.error is not None],
    )


def combine_rounds(reports: list[RoundReport], slices: list[tuple[str, SliceMetrics]]) -> DrafterTrainingStats:
    """The rollout's co-training from each worker's round report, summed in worker-slot order (so the figures do
    not depend on how steps were split into slices); seconds and slice failures from ``slices``. The held-out
    top-1 is the live drafter's (``heldout_top1_before``); the caller fills ``heldout_top1`` after a push."""
    steps = sum(r.steps for r in reports)
    tokens = sum(r.tokens for r in reports)
    loss_sum = top1_sum = 0.0
    heldout_tokens, heldout_sum = 0, 0.0
    for r in reports:
        loss_sum += r.loss_sum
        top1_sum += r.top1_sum
        heldout_tokens += r.heldout_tokens
        heldout_sum += r.heldout_top1_sum
    failures = [f"{worker}: {m.error}" for worker, m in slices if m.error is not None]
    failures += [f for r in reports for f in r.failures if f not in failures]
    before = heldout_sum / heldout_tokens if heldout_tokens else None
    return DrafterTrainingStats(
        steps=steps,
        tokens=tokens,
        loss=loss_sum / tokens if tokens else None,
        top1=top1_sum / tokens if tokens else None,
        seconds=sum(m.seconds for _, m in slices) + sum(r.seconds for r in reports),
        failures=failures,
        heldout_top1_before=before,
        heldout_top1=before,
        heldout_tokens=heldout_tokens,
    )


def heldout_mean(pairs: list[tuple[int, float]]) -> float | None:
    """Token-weighted top-1 over (tokens, summed top-1) pairs, in order; None without tokens."""
    tokens = sum(t for t, _ in pairs)
    total = 0.0
    for _, s in pairs:
        total += s
    return total / tokens if tokens else None
