"""Bookkeeping of what each request's drafter still has to read (see fastrl.spec.drafting)."""

from __future__ import annotations

import torch
from torch import Tensor

from fastrl.engine.request import Request
from fastrl.spec.drafting import DrafterInput


def queue_for_drafter(request: Request, tokens: list[int], features: Tensor) -> None:
    """Record drafter entries: token i read with feature row i (the hidden state that produced it).  # [k,H]"""
    request.pending_tokens.extend(tokens)
    request.pending_features.append(features)


def take_drafter_input(requests: list[Request], hidden_size: int, device: torch.device) -> DrafterInput:
    """Collect and clear the pending entries of every request, left-aligned.  # -> [B,K], [B,K,H], [B]"""
    counts = [len(r.pending_tokens) for r in requests]
    if min(counts) < 1:
        raise RuntimeError("a request reached a speculative round with nothing for its drafter to read")
    width = max(counts)
    dtype = requests[0].pending_features[0].dtype
    tokens = torch.zeros(len(requests), width, dtype=torch.long, device=device)
    features = torch.zeros(len(requests), width, hidden_size, dtype=dtype, device=device)
    for row, request in enumerate(requests):
        c = counts[row]
        tokens[row, :c] = torch.tensor(request.pending_tokens, dtype=torch.long, device=device)
        features[row, :c] = torch.cat(request.pending_features, dim=0)
        request.pending_tokens = []
        request.pending_features = []
    return DrafterInput(tokens, features, torch.tensor(counts, dtype=torch.long, device=device))
