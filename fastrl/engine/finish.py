"""The finish rules of a round, decided in tensors: how many of each row's candidate tokens are emitted, and why
the row stops, if it does.

A row emits its candidate tokens in order and stops at the first one that ends the request. The rules, checked
on each token in this order (the first that holds names the reason):

    ERROR    the token's log-prob is not finite (NaN or infinite logits: this token and any after mean nothing)
    STOP     the token is one of the request's stop ids (its stop_token_ids, and EOS unless ignore_eos)
    LENGTH   the request now has max_new_tokens generated tokens
    CONTEXT  the request now has max_model_len tokens

`tests/engine/test_finish_rules.py` checks them against the same rules applied one token at a time, on random
cases.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.engine.request import FinishReason

# Finish codes as the round reads them back: 0 = still running.
FINISH_CODES: dict[int, FinishReason] = {
    1: FinishReason.ERROR,
    2: FinishReason.STOP,
    3: FinishReason.LENGTH,
    4: FinishReason.CONTEXT,
}


@dataclass(frozen=True)
class Finish:
    """Per row: tokens emitted ([B] long, 1 <= emitted <= candidates) and the finish code ([B] long, 0 = running;
    see FINISH_CODES)."""

    emitted: Tensor
    code: Tensor


def finish_rows(
    tokens: Tensor,
    logprobs: Tensor,
    candidates: Tensor,
    tokens_before: Tensor,
    stop: Tensor,
    length_limit: Tensor,
    max_model_len: int,
) -> Finish:
    """Apply the finish rules (see the module docstring) to every row at once; no host synchronisation.

    tokens/logprobs [B,K]: each row's candidate tokens in order; candidates [B] (>= 1): how many of the K are real;
    tokens_before [B]: the request's tokens (prompt + generated) before this round; stop [B,K] bool: whether each
    candidate is one of its row's stop ids; length_limit [B]: prompt length + max_new_tokens (the total at which
    LENGTH holds).
    # [B,K], [B,K], [B], [B], [B,K], [B] -> Finish of [B], [B]
    """
    k = tokens.shape[1]
    count = torch.arange(1, k + 1, device=tokens.device)  # tokens emitted once candidate j is: j + 1
    total = tokens_before.unsqueeze(1) + count  # [B,K] the request's tokens after candidate j
    error = ~torch.isfinite(logprobs)
    length = total >= length_limit.unsqueeze(1)
    context = total >= max_model_len
    # The reason a candidate ends its row (0 = it does not), in the rules' order of precedence.
    code = torch.where(error, 1, torch.where(stop, 2, torch.where(length, 3, torch.where(context, 4, 0))))
    code = code.masked_fill(count > candidates.unsqueeze(1), 0)
    ends = code > 0
    first = torch.where(ends.any(dim=1), ends.to(torch.uint8).argmax(dim=1), candidates - 1)  # [B]
    return Finish(emitted=first + 1, code=code.gather(1, first.unsqueeze(1)).squeeze(1))
