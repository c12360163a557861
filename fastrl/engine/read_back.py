"""A round's one host read: its results come back in one device-to-host copy and are split into plain lists."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.engine.finish import Finish


@dataclass
class RoundRead:
    """A round's results on the host: per row the emitted tokens and log-probs (cut at finish), the finish code,
    and the accepted drafts."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish: list[int]
    accepted: list[int]


def read_back(tokens: Tensor, logprobs: Tensor, accepted: Tensor, finish: Finish) -> RoundRead:
    """A round's results in one device-to-host copy, split on the host (`pack`, then `unpack`).

    # tokens/logprobs [B,K], accepted [B], finish of [B] -> lists
    """
    return unpack(pack(tokens, logprobs, accepted, finish).cpu(), tokens.shape[1])


def pack(tokens: Tensor, logprobs: Tensor, accepted: Tensor, finish: Finish) -> Tensor:
    """A round's results side by side, for one copy to the host: tokens, log-probs, accepted drafts, emitted
    counts and finish codes (float64 holds token ids and float32 log-probs exactly).

    # tokens/logprobs [B,K], accepted [B], finish of [B] -> [B,2K+3] float64
    """
    columns = [tokens, logprobs, accepted.unsqueeze(1), finish.emitted.unsqueeze(1), finish.code.unsqueeze(1)]
    return torch.cat([c.to(torch.float64) for c in columns], dim=1)


def unpack(host: Tensor, k: int) -> RoundRead:
    """A packed round (`pack`), on the host, as lists: each row's tokens and log-probs cut where it finishes.

    # [B,2K+3] float64 -> lists
    """
    token_rows = host[:, :k].long().tolist()
    logprob_rows = host[:, k : 2 * k].tolist()
    accepted_rows, emitted, codes = host[:, 2 * k :].long().t().tolist()
    if k > 1:  # cut each row where it finishes
        token_rows = [row[:n] for row, n in zip(token_rows, emitted, strict=True)]
        logprob_rows = [row[:n] for row, n in zip(logprob_rows, emitted, strict=True)]
    return RoundRead(token_rows, logprob_rows, codes, accepted_rows)
