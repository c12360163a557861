"""GRPO as pure tensor functions: group-normalised advantages, the clipped policy-gradient loss, the k3 KL.

Aggregation (DAPO-style token mean): every per-token term is summed over all response tokens of all sequences
and divided by one `normalizer`, by default the number of response tokens in the batch. Long responses therefore
weigh in proportion to their length rather than being averaged per sequence first. When a batch is split into
micro-batches for gradient accumulation, each micro-batch passes the token count of the whole (mini-)batch as
`normalizer`, so the accumulated gradient equals that of the un-split batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

KL_LOG_RATIO_CLAMP = 20.0  # |log(pi_ref / pi)| is clamped here before exp (k3 stays finite)


def group_advantages(rewards: Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Advantages of `n` samples per prompt: (r - mean_group) / (std_group + eps), or r - mean_group when
    `scale_by_std` is False. std is the unbiased sample standard deviation (as in TRL and verl), so n >= 2.
    A group whose rewards are all equal gets exactly zero advantage (no signal, and no float noise amplified
    by 1 / eps).

    # rewards [G,n] -> advantages [G,n] float32
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, n] with n >= 2, got {tuple(rewards.shape)}")
    r = rewards.to(torch.float32)
    centered = r - r.mean(dim=1, keepdim=True)
    if scale_by_std:
        centered = centered / (r.std(dim=1, keepdim=True) + eps)
    constant = (r == r[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centered), centered)


def token_mean(values: Tensor, mask: Tensor, normalizer: float | Tensor | None = None) -> Tensor:
    """Sum of `values` over the masked tokens divided by `normalizer` (default: the number of masked tokens).
    Unmasked entries are ignored even when they are inf or nan.

    # values [B,T], mask [B,T] bool -> []
    """
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    if normalizer is None:
        normalizer = mask.sum().clamp(min=1)
    return total / normalizer


@dataclass
class PolicyLoss:
    """The clipped surrogate loss (carries the gradient) and detached diagnostics.

    loss: [] token mean of -min(ratio * A, clip(ratio) * A).
    clip_fraction: [] fraction of response tokens whose clipped term was selected (no gradient there).
    ratio_mean: [] token mean of the importance ratio (1 on the first, on-policy pass).
    """

    loss: Tensor
    clip_fraction: Tensor
    ratio_mean: Tensor


def clipped_policy_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float,
    clip_eps_high: float | None = None,
    normalizer: float | Tensor | None = None,
) -> PolicyLoss:
    """PPO-clip objective per token with sequence-level advantages, aggregated by `token_mean`.

    ratio = exp(logp_new - logp_old) per token; the per-token loss is -min(ratio * A, clip(ratio, 1 - clip_eps,
    1 + clip_eps_high) * A) (clip_eps_high defaults to clip_eps; DAPO's clip-higher sets it larger). Where the
    clipped term is selected its gradient is zero: a token whose ratio already moved beyond the clip range in
    the direction the advantage pushes receives no further update.

    # logp_new/logp_old [B,T], advantages [B], mask [B,T] bool -> PolicyLoss of scalars
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = logp_new - logp_old
    # -inf - -inf (a token both policies' top-k / top-p exclude; never a sampled one) counts as ratio 1
    log_ratio = torch.where(mask & ~log_ratio.isnan(), log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(log_ratio)
    adv = advantages.to(ratio.dtype)[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = token_mean(per_token, mask, normalizer)
    with torch.no_grad():
        clip_fraction = token_mean((clipped < unclipped).to(ratio.dtype), mask)
        ratio_mean = token_mean(ratio, mask)
    return PolicyLoss(loss=loss, clip_fraction=clip_fraction, ratio_mean=ratio_mean)


def kl_k3(logp_new: Tensor, logp_ref: Tensor, mask: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) on tokens sampled from pi: exp(d) - d - 1 with
    d = logp_ref - logp_new (>= 0, unbiased, zero with zero gradient when the policies agree), d clamped to
    +-KL_LOG_RATIO_CLAMP. Tokens outside `mask` give 0, and so do tokens that either policy's top-k / top-p
    filter excludes (log-prob -inf): the estimator has no finite value there, and without this rule one such
    token would dominate the mean with exp(clamp) while carrying no gradient.

    # logp_new/logp_ref [B,T], mask [B,T] bool -> [B,T]
    """
    valid = both_finite(logp_new, logp_ref, mask)
    d = torch.where(valid, logp_ref - logp_new, torch.zeros_like(logp_new))
    d = d.clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return torch.exp(d) - d - 1.0


def both_finite(logp_a: Tensor, logp_b: Tensor, mask: Tensor) -> Tensor:
    """The tokens of `mask` where both log-probs are finite (neither policy's top-k / top-p filter excludes the
    token): the KL estimators' support.

    # logp_a/logp_b [B,T], mask [B,T] bool -> [B,T] bool
    """
    return mask & torch.isfinite(logp_a) & torch.isfinite(logp_b)


def drift_kl(logp_policy: Tensor, logp_ref: Tensor, mask: Tensor) -> float:
    """Token mean of logp_policy - logp_ref over the responses (k1 estimate of KL(pi || pi_ref) on tokens sampled
    from pi), over the tokens both policies can sample (`both_finite`): a token that the reference's top-k / top-p
    filter excludes has an infinite log ratio and would make the whole figure inf. 0.0 when no token qualifies.

    # logp_policy/logp_ref [B,T], mask [B,T] bool -> float
    """
    valid = both_finite(logp_policy, logp_ref, mask)
    ratio = torch.where(valid, logp_policy - logp_ref, torch.zeros_like(logp_policy))
    return float(ratio.sum() / valid.sum().clamp(min=1))
