"""Bookkeeping of what each request's drafter still has to read (see fastrl.speculative.drafting)."""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.engine.request import Request
from fastrl.speculative.drafting import DrafterInput


def queue_for_drafter(request: Request, tokens: list[int], features: Tensor) -> None:
    """Record drafter entries: token i read with feature row i (the hidden state that produced it).  # [k,H]"""
    request.pending_tokens.extend(tokens)
    request.pending_features.append(features)


def take_drafter_input(requests: list[Request], hidden_size: int, device: torch.device) -> DrafterInput:
    """Collect and clear the pending entries of every request, left-aligned.  # -> [B,K], [B,K,H], [B]

    One concatenation and one scatter for the whole batch (no per-request tensor work: at large batch that would
    be most of a GPU round's host time).
    """
    counts = [len(r.pending_tokens) for r in requests]
    if min(counts) < 1:
        raise RuntimeError("a request reached a speculative round with nothing for its drafter to read")
    b, width = len(requests), max(counts)
    flat_tokens = [t for r in requests for t in r.pending_tokens]
    flat_features = torch.cat([f for r in requests for f in r.pending_features], dim=0)  # [sum(counts),H]
    rows = [row for row, c in enumerate(counts) for _ in range(c)]
    cols = [col for c in counts for col in range(c)]
    index = torch.tensor([rows, cols], dtype=torch.long, device=device)
    tokens = torch.zeros(b, width, dtype=torch.long, device=device)
    tokens[index[0], index[1]] = torch.tensor(flat_tokens, dtype=torch.long, device=device)
    features = torch.zeros(b, width, hidden_size, dtype=flat_features.dtype, device=device)
    features[index[0], index[1]] = flat_features.to(device)
    for request in requests:
        request.pending_tokens = []
        request.pending_features = []
    return DrafterInput(tokens, features, torch.tensor(counts, dtype=torch.long, device=device))
