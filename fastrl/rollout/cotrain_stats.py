"""Summing the co-training slices of one rollout into its DrafterTrainingStats."""

from __future__ import annotations

from fastrl.cotrain.cotrainer import SliceMetrics
from fastrl.rollout.types import DrafterTrainingStats


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
