"""Per-token log-probs of responses under the training policy, computed exactly as the rollout sampler does.

The sampler reports, for each generated token, ``log_softmax(process_logits(logits))[token]``: temperature T,
then top-k and top-p (removed tokens -inf), and for T = 0 (greedy) the raw logits, i.e. the T = 1 unfiltered
distribution (see fastrl.sampling.sampler.sample). `response_logprobs` applies the same `process_logits` with
each sequence's own settings to a cache-free causal forward over prompt + response, so its values are
comparable to the rollout's token for token (greedy rollouts included: both sides use T = 1 log-probs there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fastrl.models.decoder import CausalLM
from fastrl.sampling.params import SamplingParams
from fastrl.sampling.processing import process_logits


@dataclass
class PackedSequences:
    """Prompt + response sequences, right-padded, and the per-row sampling settings of their responses.

    input_ids:      [B,S] prompt then response tokens, padded with `pad_id`
    positions:      [B,S] 0..S-1 (right padding never influences a real token under a causal mask)
    prompt_lengths: [B]
    response_ids:   [B,T] response tokens, padded
    response_mask:  [B,T] bool, True on real response tokens
    temperature/top_k/top_p: [B] the processing each response was sampled with
    any_filter:     host flag, True when some row uses top-k or top-p
    """

    input_ids: Tensor
    positions: Tensor
    prompt_lengths: Tensor
    response_ids: Tensor
    response_mask: Tensor
    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    any_filter: bool

    @property
    def num_tokens(self) -> int:
        """Response tokens in the batch."""
        return int(self.response_mask.sum())

    def select(self, rows: Tensor) -> PackedSequences:
        """The sub-batch of `rows`, trimmed to its longest sequence.  # [b] int64 -> b rows"""
        lengths = self.prompt_lengths[rows] + self.response_mask[rows].sum(dim=1)
        width = int(lengths.max())
        resp_width = int(self.response_mask[rows].sum(dim=1).max())
        return PackedSequences(
            input_ids=self.input_ids[rows, :width],
            positions=self.positions[rows, :width],
            prompt_lengths=self.prompt_lengths[rows],
            response_ids=self.response_ids[rows, :resp_width],
            response_mask=self.response_mask[rows, :resp_width],
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            any_filter=self.any_filter,
        )


def pack_sequences(
    prompts: list[list[int]],
    responses: list[list[int]],
    params: list[SamplingParams],
    pad_id: int = 0,
    device: torch.device | str = "cpu",
) -> PackedSequences:
    """Right-pad prompt + response pairs into one batch.  # B pairs -> [B,S] ids, [B,T] response mask"""
    if not len(prompts) == len(responses) == len(params) or not prompts:
        raise ValueError(
            f"need equal, non-zero numbers of prompts, responses and params, got "
            f"{len(prompts)}, {len(responses)}, {len(params)}"
        )
    if any(len(p) == 0 for p in prompts) or any(len(r) == 0 for r in responses):
        raise ValueError("every prompt and every response needs at least one token")
    batch = len(prompts)
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    resp_width = max(len(r) for r in responses)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    resp = torch.full((batch, resp_width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, resp_width), dtype=torch.bool)
    for row, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[row, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        resp[row, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[row, : len(r)] = True
    return PackedSequences(
        input_ids=ids.to(device),
        positions=torch.arange(width).unsqueeze(0).expand(batch, -1).to(device),
        prompt_lengths=torch.tensor([len(p) for p in prompts], dtype=torch.long, device=device),
        response_ids=resp.to(device),
        response_mask=mask.to(device),
        temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
        top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        any_filter=any(p.top_k > 0 or p.top_p < 1 for p in params),
    )


def response_logprobs(policy: CausalLM, batch: PackedSequences) -> Tensor:
    """Log-prob of every response token under `policy` with the sampler's logit processing; 0 on padding.
    Differentiable (call under torch.no_grad() for reference values). The LM head runs only on the hidden
    states that predict response tokens.

    # batch of B sequences -> [B,T] float32 (float64 for a float64 policy)
    """
    out = policy(batch.input_ids, batch.positions, compute_logits=False)  # hidden [B,S,H]
    rows, cols = batch.response_mask.nonzero(as_tuple=True)  # [N], [N]
    source = batch.prompt_lengths[rows] - 1 + cols  # [N] the position whose output predicts the token
    logits = policy.logits(out.hidden[rows, source])  # [N,V]
    processed = process_logits(
        logits, batch.temperature[rows], batch.top_k[rows], batch.top_p[rows], apply_filters=batch.any_filter
    )
    tokens = batch.response_ids[rows, cols]  # [N]
    values = torch.log_softmax(processed, dim=-1).gather(1, tokens[:, None]).squeeze(1)  # [N]
    zeros = torch.zeros(batch.response_mask.shape, dtype=values.dtype, device=values.device)
    return zeros.index_put((rows, cols), values)


def plan_micro_batches(lengths: list[int], order: list[int], max_tokens: int) -> list[list[int]]:
    """Split `order` (indices into `lengths`, kept in order) into consecutive micro-batches whose padded size
    (rows x longest sequence) stays within `max_tokens`; a sequence longer than the budget goes alone."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i])
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, width = [], lengths[i]
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


def batched_logprobs(policy: CausalLM, batch: PackedSequences, max_tokens: int) -> Tensor:
    """`response_logprobs` over the whole batch in micro-batches of at most `max_tokens` padded tokens, without
    gradient.  # batch of B sequences -> [B,T] float32 (float64 for a float64 policy)"""
    lengths = (batch.prompt_lengths + batch.response_mask.sum(dim=1)).tolist()
    dtype = torch.promote_types(torch.float32, next(policy.parameters()).dtype)
    result = torch.zeros(batch.response_mask.shape, dtype=dtype, device=batch.response_mask.device)
    with torch.no_grad():
        for rows in plan_micro_batches(lengths, list(range(len(lengths))), max_tokens):
            index = torch.tensor(rows, dtype=torch.long, device=result.device)
            part = response_logprobs(policy, batch.select(index))
            result[index, : part.shape[1]] = part
    return result
