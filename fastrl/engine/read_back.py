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
    """A round's results in one device-to-host copy (tokens, log-probs, accepted drafts, emitted counts, finish
    codes), then split on the host.

    # tokens/logprobs [B,K], accepted [B], finish of [B] -> lists (float64 holds token ids and float32 log-probs
    # exactly)
    """
    k = tokens.shape[1]
    columns = [tokens, logprobs, accepted.unsqueeze(1), finish.emitted.unsqueeze(1), finish.code.unsqueeze(1)]
    host = torch.cat([c.to(torch.float64) for c in columns], dim=1).cpu()  # THE host read
    token_rows = host[:, :k].long().tolist()
    logprob_rows = host[:, k : 2 * k].tolist()
    accepted_rows, emitted, codes = host[:, 2 * k :].long().t().tolist()
    if k > 1:  # cut each row where it finishes
        token_rows = [row[:n] for row, n in zip(token_rows, emitted, strict=True)]
        logprob_rows = [row[:n] for row, n in zip(logprob_rows, emitted, strict=True)]
    return RoundRead(token_rows, logprob_rows, codes, accepted_rows)
