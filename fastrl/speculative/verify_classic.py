"""Classic speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for a chain of K drafts.

The drafts x_0..x_{K-1} were sampled from the drafter's distributions q_k, independently of the verifier's
randomness. Draft k is accepted with probability min(1, p_k(x_k) / q_k(x_k)); at the first rejection the emitted
token is drawn from normalise((p_k - q_k)+); if all K drafts pass, a bonus token is drawn from p_K. The emitted
sequence is then distributed exactly as sampling from p token by token.

All functions are pure and batched over B chains, with no host synchronisation. The randomness comes from the
counter-based noise of ``fastrl.sampling.noise`` keyed by (seed, absolute position, stream), so a verification
is reproducible and independent of the sampler's main Gumbel stream (and of the drafter, which uses it).

Edge cases: q(x) = 0 where p(x) > 0 accepts (the ratio is infinite); p(x) = q(x) = 0 rejects; if the residual
(p - q)+ has no mass (p <= q everywhere), the emitted token is drawn from p. No division is done, so no NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastrl.sampling.noise import CLASSIC_ACCEPT_STREAM, CLASSIC_RESAMPLE_STREAM, gumbel_noise, uniform_noise


@dataclass(frozen=True)
class ClassicVerifyResult:
    """Outcome of verifying B draft chains of length K.

    Attributes:
        accepted: [B] int64 in [0, K], number of leading drafts accepted.
        next_tokens: [B] int64, the token emitted after the accepted drafts (resampled or bonus).
        tokens: [B, K+1] int64, the emitted tokens (accepted drafts then next token), padded with -1;
            row b holds accepted[b] + 1 tokens.
    """

    accepted: torch.Tensor
    next_tokens: torch.Tensor
    tokens: torch.Tensor


def count_accepted(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """Number of leading drafts accepted: draft k passes when ``u_k * q_k(x_k) < p_k(x_k)``.

    Args:
        target_probs: [B, K+1, V] (or [B, K, V]) target probabilities at each draft position.
        draft_probs: [B, K, V] drafter probabilities the drafts were sampled from.
        draft_tokens: [B, K] int64 drafts.
        uniforms: [B, K] uniforms in (0, 1).
    """
    # [B,K+1,V], [B,K,V], [B,K], [B,K] -> [B] int64
    k = draft_tokens.shape[1]
    index = draft_tokens[:, :, None]
    p = target_probs[:, :k].gather(2, index).squeeze(2).to(torch.float64)
    q = draft_probs.gather(2, index).squeeze(2).to(torch.float64)
    accepted = uniforms.to(torch.float64) * q < p
    return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)


def emission_weights(target_probs: torch.Tensor, draft_probs: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """Unnormalised distribution of the token emitted after ``accepted`` accepted drafts.

    ``(p_n - q_n)+`` at the first rejected position n < K, or p_n itself when that residual has no mass;
    ``p_K`` (the bonus distribution) when all K drafts were accepted.
    """
    # [B,K+1,V], [B,K,V], [B] -> [B,V] float32
    b, k_plus_1, vocab = target_probs.shape
    if draft_probs.shape[1] != k_plus_1 - 1:
        raise ValueError(f"target_probs needs K+1 = {draft_probs.shape[1] + 1} positions, got {k_plus_1}")
    # q at position K is zero, so the bonus case is the residual formula with nothing subtracted.
    q_padded = torch.cat([draft_probs, draft_probs.new_zeros(b, 1, vocab)], dim=1)
    at = accepted[:, None, None].expand(b, 1, vocab)
    p_n = target_probs.gather(1, at).squeeze(1).to(torch.float32)
    q_n = q_padded.gather(1, at).squeeze(1).to(torch.float32)
    residual = (p_n - q_n).clamp(min=0)
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    return torch.where(has_mass, residual, p_n)


def verify_classic(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> ClassicVerifyResult:
    """Verify B draft chains with noise keyed by (seed, position).

    Args:
        target_probs: [B, K+1, V] target probabilities at the K draft positions and the bonus position
            (``target_probs[:, k]`` is the distribution of the token at ``positions + k``).
        draft_probs: [B, K, V] drafter probabilities the drafts were sampled from.
        draft_tokens: [B, K] int64 drafts.
        seeds: [B] int64 request seeds.
        positions: [B] int64 absolute position of draft token 0.

    The accept uniform of draft k is ``uniform_noise(seed, positions + k, stream=CLASSIC_ACCEPT_STREAM)``; the
    emitted token at position ``positions + n`` is ``argmax(log(weights) + gumbel_noise(seed, positions + n,
    stream=CLASSIC_RESAMPLE_STREAM))``.
    """
    # [B,K+1,V], [B,K,V], [B,K], [B], [B] -> accepted [B], next_tokens [B], tokens [B,K+1]
    b, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    device = target_probs.device
    offsets = torch.arange(k, device=device, dtype=torch.int64)
    draft_positions = (positions.to(device)[:, None] + offsets[None, :]).reshape(-1)
    uniforms = uniform_noise(
        seeds.to(device).repeat_interleave(k), draft_positions, 1, device=device, stream=CLASSIC_ACCEPT_STREAM
    ).view(b, k)
    n = count_accepted(target_probs, draft_probs, draft_tokens.to(device), uniforms)
    weights = emission_weights(target_probs, draft_probs, n)
    noise = gumbel_noise(seeds, positions.to(device) + n, vocab, device=device, stream=CLASSIC_RESAMPLE_STREAM)
    next_tokens = (weights.log() + noise).argmax(dim=-1)
    slots = torch.arange(k + 1, device=device, dtype=torch.int64)[None, :]
    drafts_padded = torch.cat([draft_tokens.to(device), next_tokens[:, None]], dim=1)
    tokens = torch.where(slots < n[:, None], drafts_padded, torch.full_like(drafts_padded, -1))
    tokens = torch.where(slots == n[:, None], next_tokens[:, None], tokens)
    return ClassicVerifyResult(accepted=n, next_tokens=next_tokens, tokens=tokens)
